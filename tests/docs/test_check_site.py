"""The browser check of the documentation site (scripts/check_site.py, run by scripts/site_check.sh).

The browser run itself is a CI stage, not a test (it needs Chromium and builds the whole site). These
tests pin what decides its verdict without a browser: the link and anchor logic on a tiny generated site
with planted faults, the page inventory the coverage check compares with, the pages a person is shown,
and the stage's refusal, in one line, when Chromium cannot be installed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.script_module import load_script

REPO = Path(__file__).resolve().parent.parent.parent
ORIGIN = "http://127.0.0.1:8123"


check_site = load_script(REPO / "scripts" / "check_site.py", "_check_site")


def _page(body: str, ids: tuple[str, ...] = ()) -> str:
    anchors = "".join(f'<h2 id="{i}">{i}</h2>' for i in ids)
    return f"<!doctype html><html><body>{anchors}{body}</body></html>"


def _tiny_site(root: Path, home_links: str) -> Path:
    """A site shaped like mkdocs' output: directory pages, a 404 page, an asset, a museum exhibit."""
    site = root / "site"
    for rel, html in {
        "index.html": _page(home_links),
        "404.html": _page('<a href="/">home</a>'),
        "spec/model/index.html": _page('<a href="../invariants/#i-count">I-COUNT</a>', ids=("pools",)),
        "spec/invariants/index.html": _page('<a href="../model/">model</a>', ids=("i-count", "i-partition")),
        "museum/index.html": _page('<a href="b1/">B1</a>'),
        "museum/b1/index.html": _page('<a href="../../spec/invariants/#i-partition">I-PARTITION</a>'),
    }.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(html, encoding="utf-8")
    (site / "assets").mkdir()
    (site / "assets" / "extra.css").write_text("body {}", encoding="utf-8")
    return site


GOOD_LINKS = (
    '<a href="spec/model/">model</a> <a href="spec/model/#pools">pools</a> '
    '<a href="spec/invariants/#i-count">I-COUNT</a> <a href="assets/extra.css">css</a> '
    '<a href="#">top</a> <a href="https://example.org/elsewhere">outside, not followed</a>'
)


def _site_report(site: Path) -> dict[str, list[str]]:
    """Every page's broken links, as the browser run judges the hrefs it reads from each page."""
    return {
        path: check_site.broken_links(site, ORIGIN, check_site.page_links(site, ORIGIN, path))[1]
        for path in check_site.pages_of(site)
    }


def test_a_clean_site_has_no_broken_link(tmp_path: Path) -> None:
    site = _tiny_site(tmp_path, GOOD_LINKS)
    report = _site_report(site)
    assert report == {path: [] for path in report}
    checked, _ = check_site.broken_links(site, ORIGIN, check_site.page_links(site, ORIGIN, "/"))
    assert checked == 5  # the five internal targets of the home page; the outside link is not counted


def test_a_planted_broken_link_and_a_missing_anchor_are_named(tmp_path: Path) -> None:
    planted = (
        GOOD_LINKS + ' <a href="spec/nowhere/">gone</a> <a href="spec/model/#no-such-anchor">gone too</a>'
    )
    site = _tiny_site(tmp_path, planted)
    report = _site_report(site)
    assert report["/"] == [
        f"{ORIGIN}/spec/model/#no-such-anchor: no element #no-such-anchor on /spec/model/",
        f"{ORIGIN}/spec/nowhere/: no such page or file",
    ]
    assert all(not broken for path, broken in report.items() if path != "/")


def test_an_anchor_on_a_non_html_file_is_not_judged_and_a_missing_file_is(tmp_path: Path) -> None:
    site = _tiny_site(tmp_path, "")
    assert check_site.check_link(site, ORIGIN, f"{ORIGIN}/assets/extra.css#x") is None
    assert check_site.check_link(site, ORIGIN, f"{ORIGIN}/assets/missing.css") == "no such page or file"
    assert check_site.check_link(site, "http://other:1", f"{ORIGIN}/spec/nowhere/") is None  # not this site's


def test_the_inventory_is_every_html_file_and_the_showcase_needs_an_exhibit(tmp_path: Path) -> None:
    site = _tiny_site(tmp_path, GOOD_LINKS)
    pages = check_site.pages_of(site)
    assert pages == ["/404.html", "/", "/museum/b1/", "/museum/", "/spec/invariants/", "/spec/model/"]
    assert len(pages) == len(list(site.rglob("*.html")))
    shown, missing = check_site.showcase(pages)
    assert shown == ["/spec/model/", "/spec/invariants/", "/museum/b1/"]
    assert missing == ["/lifecycles/"]
    shown, missing = check_site.showcase([p for p in pages if p != "/museum/b1/"])
    assert "/museum/b1/" not in shown and "/museum/<an exhibit>/" in missing


def test_the_mermaid_major_is_read_from_the_theme_bundle(tmp_path: Path) -> None:
    site = _tiny_site(tmp_path, "")
    assert check_site.mermaid_majors(site) == set()
    bundle = site / "assets" / "javascripts" / "bundle.abc.min.js"
    bundle.parent.mkdir(parents=True)
    bundle.write_text('var u="https://unpkg.com/mermaid@11/dist/mermaid.min.js";', encoding="utf-8")
    assert check_site.mermaid_majors(site) == {"11"}


def _stage(tmp_path: Path, *args: str, apt_get: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CHROMIUM": str(tmp_path / "no-chromium"), "APT_GET": apt_get}
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "site_check.sh"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_stage_fails_in_one_line_when_chromium_cannot_be_installed(tmp_path: Path) -> None:
    run = _stage(tmp_path, apt_get=str(tmp_path / "no-apt-get"))
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith("site check: cannot install Chromium: no ")
    assert "no-apt-get" in run.stderr and "no-chromium" in run.stderr


def test_the_stage_rejects_an_unknown_argument(tmp_path: Path) -> None:
    run = _stage(tmp_path, "--fast", apt_get="apt-get")
    assert run.returncode == 2
    assert "unknown argument --fast" in run.stderr
