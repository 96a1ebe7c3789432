"""Check the built documentation site in a real browser (headless Chromium from the OS packages).

Builds the site (``mkdocs build --strict``, unless ``--no-build``), serves it on 127.0.0.1, loads every
HTML page of ``site/`` (the spec pages, the generated invariant table, the lifecycle diagrams, every
museum exhibit, the API reference) and fails when

* the page logs a console error or throws (a failed request shows up here too),
* a request gets an HTTP error, or the page asks for anything outside the local server (the site must
  read offline; the one exception is the Mermaid runtime the theme loads from a CDN, answered from a
  local copy, see below),
* an internal link does not resolve: every ``href`` to this site must name an existing page or file,
  and its ``#anchor``, if any, an element id on the target page,
* a Mermaid diagram was not drawn: every ``mermaid`` block of the page's HTML must end up as a drawn
  SVG that is not Mermaid's error picture,
* the pages checked are not every HTML page of ``site/``, or a page a person is shown (the model, the
  invariant table, the lifecycle diagrams, one exhibit) is missing.

Screenshots go to ``--out`` (default ``site-check/``, ignored by git) with a ``summary.json``: the first
screen and the whole page of the model page, the invariant table (and its first table), the lifecycle
diagrams (each diagram too) and one exhibit page; ``--all-screenshots`` takes every page.

CI runs it through ``scripts/site_check.sh``, which installs what is missing first: Debian's
``chromium`` (apt-get) and playwright's Python package (the ``site-check`` extra). Playwright drives
the system's ``/usr/bin/chromium`` (``executable_path``); it never downloads a browser. The theme
draws Mermaid diagrams with ``mermaid.min.js`` fetched from unpkg at view time; this script reads the
major version from the theme's bundle and answers that request from ``.cache/mermaid/<major>/`` (ignored
by git), filled on first use with ``npm pack mermaid@<major>`` from the npm registry, or from
``--mermaid FILE``.

Usage: ``.venv/bin/python scripts/check_site.py [--no-build] [--out DIR] [--page /spec/model/]``
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlparse

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MERMAID_CDN = re.compile(r"^https://unpkg\.com/mermaid@(\d+)/dist/mermaid\.min\.js$")
MERMAID_IN_BUNDLE = re.compile(r"https://unpkg\.com/mermaid@(\d+)/dist/mermaid\.min\.js")
# The pages a person is shown (screenshots): they must exist, or the check fails. One exhibit page is
# added: the first page under museum/ other than its index.
SHOWCASE = ("/spec/model/", "/spec/invariants/", "/lifecycles/")
MUSEUM = "/museum/"
# Material attaches each drawn diagram in a closed shadow root; open it so the check can see the SVG.
OPEN_SHADOW_ROOTS = """
const attach = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) { return attach.call(this, {...init, mode: "open"}); };
"""
DIAGRAMS_STATE = """
() => {
  const hosts = [...document.querySelectorAll("div.mermaid")];
  return {
    pending: document.querySelectorAll("pre.mermaid").length,
    drawn: hosts.map(h => {
      const svg = h.shadowRoot && h.shadowRoot.querySelector("svg");
      if (!svg) return "no svg";
      const text = svg.textContent || "";
      if (svg.getAttribute("aria-roledescription") === "error" || /Syntax error/.test(text)) return "error";
      return "ok";
    }),
  };
}
"""


# ------------------------------------------------------------------------------------ static parts


class _Scan(HTMLParser):
    """Ids, link targets and the number of Mermaid blocks in one HTML file."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []
        self.mermaid_blocks = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(str(a[key]))
        if tag == "a" and a.get("href"):
            self.hrefs.append(str(a["href"]))
        if tag == "pre" and "mermaid" in (a.get("class") or "").split():
            self.mermaid_blocks += 1


@functools.cache
def scan(path: Path) -> _Scan:
    parser = _Scan()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def site_file(site: Path, url_path: str) -> Path | None:
    """The file the local server answers ``url_path`` with, or None."""
    target = site / unquote(url_path).lstrip("/")
    if target.is_dir():
        target = target / "index.html"
    return target if target.is_file() else None


def pages_of(site: Path) -> list[str]:
    """URL paths of every HTML page of the built site."""
    paths = []
    for html in sorted(site.rglob("*.html")):
        rel = html.relative_to(site).as_posix()
        paths.append("/" + (rel[: -len("index.html")] if rel.endswith("index.html") else rel))
    return paths


def page_links(site: Path, origin: str, path: str) -> list[str]:
    """The ``<a href>`` targets written in the HTML of page ``path``, made absolute as a browser would."""
    source = site_file(site, path)
    return [urljoin(origin + path, href) for href in scan(source).hrefs] if source else []


def check_link(site: Path, origin: str, href: str) -> str | None:
    """Why an internal link is broken, or None (external links are not followed)."""
    url, fragment = urldefrag(href)
    parsed = urlparse(url)
    if f"{parsed.scheme}://{parsed.netloc}" != origin:
        return None
    target = site_file(site, parsed.path)
    if target is None:
        return "no such page or file"
    if fragment and target.suffix == ".html" and unquote(fragment) not in scan(target).ids:
        return f"no element #{fragment} on {parsed.path}"
    return None


def broken_links(site: Path, origin: str, hrefs: list[str]) -> tuple[int, list[str]]:
    """How many distinct internal links ``hrefs`` holds, and each broken one with the reason."""
    internal = sorted({href for href in hrefs if href.startswith(origin)})
    broken = []
    for href in internal:
        problem = check_link(site, origin, href)
        if problem:
            broken.append(f"{href}: {problem}")
    return len(internal), broken


def showcase(paths: list[str]) -> tuple[list[str], list[str]]:
    """The pages to screenshot for a person, and those of them the site lacks."""
    exhibits = [p for p in paths if p.startswith(MUSEUM) and p != MUSEUM]
    wanted = [*SHOWCASE, exhibits[0] if exhibits else f"{MUSEUM}<an exhibit>/"]
    return [p for p in wanted if p in paths], [p for p in wanted if p not in paths]


# ------------------------------------------------------------------------------------------ mermaid


def mermaid_majors(site: Path) -> set[str]:
    """The major versions of Mermaid the theme's scripts load from the CDN (none: no copy needed)."""
    majors: set[str] = set()
    for script in (site / "assets").rglob("*.js"):
        majors.update(MERMAID_IN_BUNDLE.findall(script.read_text(encoding="utf-8", errors="replace")))
    return majors


def mermaid_copy(major: str, given: Path | None) -> Path:
    """A local ``mermaid.min.js`` of the major version the theme asks for."""
    if given is not None:
        return given
    cached = ROOT / ".cache" / "mermaid" / major / "mermaid.min.js"
    if cached.is_file():
        return cached
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("site check: no npm to fetch the Mermaid runtime: install npm, or pass --mermaid FILE")
    print(f"site check: fetching mermaid@{major} (npm pack, about 3 MB) into .cache/mermaid/", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(  # one retry: without the registry, fail in seconds rather than a minute
            [npm, "pack", f"mermaid@{major}", "--loglevel=error", "--fetch-retries=1"],
            cwd=tmp,
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            said = [line for line in run.stderr.splitlines() if line.strip() and "complete log" not in line]
            last = (said or ["no message"])[-1]
            raise SystemExit(f"site check: npm pack mermaid@{major} failed (no access to the npm registry?): {last}")
        tarball = next(Path(tmp).glob("mermaid-*.tgz"))
        with tarfile.open(tarball) as tar:
            member = tar.extractfile("package/dist/mermaid.min.js")
            if member is None:
                raise SystemExit(f"{tarball.name} has no dist/mermaid.min.js")
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_bytes(member.read())
    return cached


# --------------------------------------------------------------------------------------------- run


@dataclass
class PageReport:
    path: str
    console_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    broken_links: list[str] = field(default_factory=list)
    links_checked: int = 0
    diagrams_expected: int = 0
    diagrams_drawn: int = 0
    diagram_problems: list[str] = field(default_factory=list)
    screenshot: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.console_errors or self.failed_requests or self.outside_requests or self.broken_links
        ) and not self.diagram_problems


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def shot_name(path: str) -> str:
    return path.strip("/").replace("/", "__") or "home"


def check_page(
    context: Any, site: Path, origin: str, path: str, out: Path, mermaid: Path | None, screenshots: bool
) -> PageReport:
    report = PageReport(path)
    source = site_file(site, path)
    report.diagrams_expected = scan(source).mermaid_blocks if source else 0
    page = context.new_page()

    def on_request(route: Any) -> None:
        url = route.request.url
        cdn = MERMAID_CDN.match(url)
        if url.startswith(origin):
            route.continue_()
        elif cdn:
            route.fulfill(path=str(mermaid_copy(cdn.group(1), mermaid)), content_type="text/javascript")
        else:
            report.outside_requests.append(url)
            route.abort()

    def on_console(message: Any) -> None:
        if message.type == "error":
            report.console_errors.append(message.text)

    def on_request_failed(request: Any) -> None:
        if request.url.startswith(origin):  # an outside request was aborted on purpose (listed above)
            report.failed_requests.append(f"{request.url}: {request.failure}")

    def on_response(response: Any) -> None:
        if response.status >= 400:
            report.failed_requests.append(f"{response.status} {response.url}")

    page.route("**/*", on_request)
    page.on("console", on_console)
    page.on("pageerror", lambda error: report.console_errors.append(f"uncaught: {error}"))
    page.on("requestfailed", on_request_failed)
    page.on("response", on_response)
    started = time.monotonic()
    page.goto(origin + path, wait_until="load")
    page.wait_for_load_state("networkidle")
    if report.diagrams_expected:
        deadline = time.monotonic() + 20
        state = page.evaluate(DIAGRAMS_STATE)
        while (state["pending"] or len(state["drawn"]) < report.diagrams_expected) and time.monotonic() < deadline:
            page.wait_for_timeout(200)
            state = page.evaluate(DIAGRAMS_STATE)
        report.diagrams_drawn = state["drawn"].count("ok")
        if report.diagrams_drawn != report.diagrams_expected:
            report.diagram_problems.append(
                f"{report.diagrams_drawn} of {report.diagrams_expected} drawn "
                f"(left as text: {state['pending']}; {state['drawn']})"
            )
    hrefs: list[str] = page.eval_on_selector_all("a[href]", "els => els.map(a => a.href)")
    report.links_checked, report.broken_links = broken_links(site, origin, hrefs)
    if screenshots:  # the page as it opens and whole, then (scrolling) its first table and each diagram
        name = shot_name(path)
        page.screenshot(path=str(out / f"{name}.png"))
        page.screenshot(path=str(out / f"{name}.full.png"), full_page=True)
        report.screenshot = f"{name}.png"
        tables = page.locator("article table")
        # One screen from the table's head, below the theme's fixed header: a long table's whole picture
        # is unreadable.
        if tables.count():
            tables.first.evaluate("el => { el.scrollIntoView({block: 'start'}); window.scrollBy(0, -64); }")
            page.wait_for_timeout(400)  # the theme's header swaps the site name for the page title on scroll
            page.screenshot(path=str(out / f"{name}.table-1.png"))
        for i, host in enumerate(page.locator("div.mermaid").all()):
            host.screenshot(path=str(out / f"{name}.diagram-{i + 1}.png"))
    report.seconds = round(time.monotonic() - started, 2)
    page.close()
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--site", type=Path, default=ROOT / "site", help="the built site (default: site/)")
    ap.add_argument("--out", type=Path, default=ROOT / "site-check", help="screenshots and summary.json")
    ap.add_argument("--no-build", action="store_true", help="check the site as it is, without building it")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="the browser (default: /usr/bin/chromium)")
    ap.add_argument("--mermaid", type=Path, help="a local mermaid.min.js (default: .cache/mermaid/, via npm)")
    ap.add_argument("--page", action="append", default=[], help="check only this URL path (repeatable)")
    ap.add_argument("--all-screenshots", action="store_true", help="screenshot every page, not only the showcase")
    args = ap.parse_args(argv)

    if not args.no_build:
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"], cwd=ROOT, check=True)
    try:
        from playwright.sync_api import sync_playwright  # the optional [site-check] dependency
    except ImportError:
        raise SystemExit("site check: playwright missing: .venv/bin/pip install -e '.[site-check]'") from None
    if not Path(args.chromium).is_file():
        raise SystemExit(f"site check: no browser at {args.chromium}: apt-get install chromium (as root)")

    all_pages = pages_of(args.site)
    if not all_pages:
        raise SystemExit(f"site check: no HTML page in {args.site}: build the site first")
    paths = args.page or all_pages
    shown, missing = showcase(all_pages)
    for major in sorted(mermaid_majors(args.site)):  # before the browser starts: fail early, offline after
        mermaid_copy(major, args.mermaid)
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in [*args.out.glob("*.png"), args.out / "summary.json"]:  # only this run's pictures
        stale.unlink(missing_ok=True)

    server, origin = serve(args.site)
    reports: list[PageReport] = []
    started = time.monotonic()
    try:
        with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="kvledger-site-check-") as profile:
            context = pw.chromium.launch_persistent_context(
                profile,
                executable_path=args.chromium,
                headless=True,
                args=CHROMIUM_FLAGS,
                viewport={"width": 1400, "height": 900},
            )
            context.add_init_script(OPEN_SHADOW_ROOTS)
            for path in paths:
                shots = args.all_screenshots or path in shown
                reports.append(check_page(context, args.site, origin, path, args.out, args.mermaid, shots))
                r = reports[-1]
                print(
                    f"{'ok  ' if r.ok else 'FAIL'} {path:48} links {r.links_checked:4}  diagrams "
                    f"{r.diagrams_drawn}/{r.diagrams_expected}  errors {len(r.console_errors)}  {r.seconds:.1f} s",
                    flush=True,
                )
            context.close()
    finally:
        server.shutdown()

    # Coverage: every HTML file of the site was loaded (unless --page narrowed it), and the pages a person
    # is shown exist. A page left out would otherwise pass unnoticed.
    html_files = len(list(args.site.rglob("*.html")))
    site_problems = [f"the site has no page {p}" for p in missing]
    if not args.page and len(reports) != html_files:
        site_problems.append(f"{len(reports)} pages checked, but {args.site} holds {html_files} HTML files")
    failed = [r for r in reports if not r.ok]
    summary = {
        "ok": not failed and not site_problems,
        "pages": len(reports),
        "html_files": html_files,
        "failed_pages": len(failed),
        "site_problems": site_problems,
        "links_checked": sum(r.links_checked for r in reports),
        "broken_links": sum(len(r.broken_links) for r in reports),
        "console_errors": sum(len(r.console_errors) for r in reports),
        "failed_requests": sum(len(r.failed_requests) for r in reports),
        "outside_requests": sum(len(r.outside_requests) for r in reports),
        "diagrams_expected": sum(r.diagrams_expected for r in reports),
        "diagrams_drawn": sum(r.diagrams_drawn for r in reports),
        "seconds": round(time.monotonic() - started, 1),
        "screenshots": {r.path: r.screenshot for r in reports if r.screenshot},
        "reports": [asdict(r) for r in reports],
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    for r in failed:
        print(f"\n{r.path}:")
        for kind in ("console_errors", "failed_requests", "outside_requests", "broken_links", "diagram_problems"):
            for item in getattr(r, kind):
                print(f"  {kind}: {item}")
    for problem in site_problems:
        print(f"\nsite: {problem}")
    print(
        f"\n{summary['pages']} pages of {html_files} HTML files, {summary['links_checked']} internal links checked, "
        f"{summary['broken_links']} broken, {summary['console_errors']} console errors, "
        f"{summary['diagrams_drawn']}/{summary['diagrams_expected']} diagrams drawn, {summary['seconds']} s; "
        f"screenshots of {', '.join(p for p in shown if p in paths) or 'no page'} in {args.out}"
    )
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
