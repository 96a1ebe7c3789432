"""MkDocs hooks (mkdocs.yml ``hooks:``): the site's spec and museum pages, generated at build time.

``spec/`` stays the single source of the spec: its Markdown files are served as they are, under
``spec/`` on the site, so the relative links between them keep working. From them the hook also
assembles one page, ``spec/transitions.md``: every section of the spec whose level-2 heading is about
transitions (the single-instance table, PD's, Mamba V2's), each under a link to its source. The
invariant table (``spec/invariants.md``, generated from the registry and kept in sync by the
traceability check) gets an anchor per ID, and every mention of a registered ID on the site's pages
(the API reference aside) links to its row, where its checks and firing tests are listed.

The museum (``kvledger.museum``, issue 9) gets one page per exhibit, generated from its registry
``EXHIBITS``, when the package exists; without it the site simply has no museum section.

The page on debug builds (``docs/debug-builds.md``) gets the CLI's own ``--help`` text where it says
``<!-- kvledger-help: simulate -->``, and the build fails when ``kvledger/`` reads a ``KVLEDGER_...``
environment variable that the page does not document.

The nav in mkdocs.yml lists the hand-written pages; this hook inserts the "Spec" section after the
home page and the "Museum" section before the API reference.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import posixpath
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = logging.getLogger("mkdocs.hooks.kvledger")

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec"
SITE_SPEC = "spec"  # where the spec's pages live on the site
TRANSITIONS = "transitions.md"

# Nav order and short titles of the spec pages; a spec file not listed here is appended, titled by its
# first heading, so a new spec page shows up without editing this hook.
SPEC_ORDER: tuple[tuple[str, str], ...] = (
    ("architecture.md", "The architecture"),
    ("model.md", "The model"),
    ("invariants.md", "Invariants"),
    (TRANSITIONS, "Transitions"),
    ("pd.md", "PD disaggregation"),
    ("mamba-v2.md", "Mamba V1 and V2"),
    ("mamba-cache-vs-sglang.md", "Mamba cache vs SGLang"),
    ("event-log.md", "The event log"),
)
# Hand-written pages that belong to the spec section (docs/), placed after the model.
SPEC_EXTRA_PAGES: tuple[tuple[str, str], ...] = (("lifecycles.md", "Lifecycle diagrams"),)

_H1 = re.compile(r"^# (.+)$", re.MULTILINE)
_H2 = re.compile(r"^## (.+)$", re.MULTILINE)
_INVARIANT_ROW = re.compile(r"^\| \*\*(I-[A-Z0-9-]+)\*\* \|", re.MULTILINE)


def anchor(invariant_id: str) -> str:
    """The anchor of an invariant's row on the invariant page (``I-COUNT`` -> ``i-count``)."""
    return invariant_id.lower()


# --------------------------------------------------------------------------------------------- spec


def spec_files() -> dict[str, str]:
    """``name -> text`` of every Markdown file in spec/."""
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(SPEC.glob("*.md"))}


@dataclass(frozen=True)
class Section:
    source: str  # spec file name
    heading: str
    body: str


def transition_sections(specs: dict[str, str]) -> list[Section]:
    """The level-2 sections of the spec whose heading names transitions, in nav order."""
    order = [name for name, _ in SPEC_ORDER] + sorted(specs)
    found: list[Section] = []
    for name in dict.fromkeys(order):
        text = specs.get(name)
        if text is None or name == TRANSITIONS:
            continue
        heads = list(_H2.finditer(text))
        for i, head in enumerate(heads):
            if "transition" not in head.group(1).lower():
                continue
            end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
            found.append(Section(name, head.group(1).strip(), text[head.end() : end].strip()))
    return found


def title_of(text: str, fallback: str) -> str:
    m = _H1.search(text)
    return m.group(1).strip().strip("`") if m else fallback


def transitions_page(specs: dict[str, str]) -> str:
    sections = transition_sections(specs)
    out = [
        "# Transitions and what each moves",
        "",
        "Every transition table of the spec on one page, assembled when the site is built from the sections",
        "of `spec/` that describe transitions; each section links to its source, which is the one to edit.",
        "Accounts and owners: [the model](model.md); the diagrams: [lifecycles](../lifecycles.md).",
        "",
    ]
    short = dict(SPEC_ORDER)
    for s in sections:
        page_title = short.get(s.source) or title_of(specs[s.source], s.source)
        out += [f"## {page_title}: {s.heading}", "", f"*From [spec/{s.source}]({s.source}), the text to edit.*", ""]
        # Demote the section's own subheadings below the new level-2 heading.
        out += [re.sub(r"^(#{3,5}) ", r"#\1 ", s.body, flags=re.MULTILINE), ""]
    return "\n".join(out)


def spec_pages(specs: dict[str, str]) -> dict[str, str]:
    """``name -> content`` of the spec pages on the site: spec/ as it is, plus the transitions page."""
    pages = dict(specs)
    if TRANSITIONS not in pages and transition_sections(specs):
        pages[TRANSITIONS] = transitions_page(specs)
    return pages


def spec_nav(pages: dict[str, str]) -> list[Any]:
    known = dict(SPEC_ORDER)
    nav: list[Any] = []
    for name, title in SPEC_ORDER:
        if name in pages:
            nav.append({title: f"{SITE_SPEC}/{name}"})
        if name == "model.md":
            nav += [{t: p} for p, t in SPEC_EXTRA_PAGES]
    for name, text in pages.items():
        if name not in known:
            nav.append({title_of(text, name): f"{SITE_SPEC}/{name}"})
    return nav


_CODE_SPAN = re.compile(r"(`+).+?\1")
_ID_MENTION = re.compile(r"(?<![\w/#`*\[>-])(I-[A-Z0-9]+(?:-[A-Z0-9]+)*)(?![\w-])")


def registered_ids() -> set[str]:
    from kvledger.contracts.invariants import all_invariants

    return {inv.id for inv in all_invariants()}


def with_invariant_links(markdown: str, page_uri: str, known: set[str]) -> str:
    """Link each mention of a registered invariant ID in prose and tables to its row of the invariant
    table. Code (spans, fenced and indented blocks), headings and existing links are left alone."""
    target = posixpath.relpath(f"{SITE_SPEC}/invariants.md", posixpath.dirname(page_uri) or ".")

    def link(m: re.Match[str]) -> str:
        found = m.group(1)
        return f"[{found}]({target}#{anchor(found)})" if found in known else found

    def in_prose(text: str) -> str:
        pieces, last = [], 0
        for span in _CODE_SPAN.finditer(text):
            pieces += [_ID_MENTION.sub(link, text[last : span.start()]), span.group(0)]
            last = span.end()
        return "".join([*pieces, _ID_MENTION.sub(link, text[last:])])

    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        skip = fenced or line.startswith(("    ", "\t", "#", "<!--"))
        out.append(line if skip else in_prose(line))
    return "\n".join(out)


def with_invariant_anchors(markdown: str) -> str:
    """Give each row of the invariant table an anchor named after its ID. The ID may wrap at a hyphen,
    but never right after its ``I-`` (the first segment stays whole)."""

    def row(m: re.Match[str]) -> str:
        head, sep, rest = m.group(1).partition("-")[2].partition("-")
        first = f"I-{head}"
        return f'| <span id="{anchor(m.group(1))}"></span>**<span class="kvl-id">{first}</span>{sep}{rest}** |'

    return _INVARIANT_ROW.sub(row, markdown)


# ------------------------------------------------------------------------------------------- museum


def museum_exhibits() -> list[Any] | None:
    """The museum's registry, or None when the package does not exist (yet) on this branch."""
    if importlib.util.find_spec("kvledger.museum") is None:
        return None
    museum = importlib.import_module("kvledger.museum")
    return list(museum.EXHIBITS)


def exhibit_slug(exhibit: Any) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(exhibit.id).lower()).strip("-")


def _invariant_links(ids: tuple[str, ...] | list[str], depth: str) -> str:
    return ", ".join(f"[`{i}`]({depth}spec/invariants.md#{anchor(i)})" for i in ids) or "none"


_THREAD = re.compile(r"\b([\w.-]+/[\w.-]+)#(\d+)\b")


def linked_threads(text: str) -> str:
    """``owner/repo#123`` as a link to that GitHub thread (GitHub redirects an issue number to its PR)."""
    return _THREAD.sub(lambda m: f"[{m.group(0)}](https://github.com/{m.group(1)}/issues/{m.group(2)})", text)


def exhibit_page(exhibit: Any) -> str:
    def field(name: str, default: Any = "") -> Any:
        return getattr(exhibit, name, default) or default

    rows = [
        ("upstream", linked_threads(str(field("upstream", "n/a")))),
        ("breaks", _invariant_links(tuple(field("breaks", ())), "../")),
        ("scope", field("scope", "in scope")),
    ]
    if field("replaces"):
        rows.append(("re-enacted by replacing", f"`{field('replaces')}`"))
    if field("machine") and getattr(exhibit, "huntable", True):
        rows.append(("found by", f"the generic `{field('machine')}` machine (`kvledger hunt --exhibit {exhibit.id}`)"))
    out = [f"# {exhibit.id}: {field('title', exhibit.id)}", "", f"| exhibit | `{exhibit.id}` |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in rows]
    out += ["", "## Mechanism", "", field("mechanism", "(not described)"), ""]
    if field("why_out_of_scope"):
        out += ["## Why it is not re-enacted", "", field("why_out_of_scope"), ""]
    if field("replaces"):
        out += [
            "The re-enactment replaces that one method from outside the reference code (a scoped patch installed",
            "by the museum's registry, `kvledger/museum/`); the reference code has no fault branch for it.",
            "",
        ]
    return "\n".join(out)


def museum_index(exhibits: list[Any]) -> str:
    out = [
        "# The museum of historical bugs",
        "",
        "One page per exhibit of `kvledger.museum.EXHIBITS`, generated when the site is built. Each exhibit",
        "puts one historical memory-accounting bug back by replacing one method, and names the invariants",
        "it breaks; `kvledger hunt` runs the generic state machines against it.",
        "",
        "| exhibit | title | breaks | scope |",
        "|---|---|---|---|",
    ]
    for e in exhibits:
        title = str(getattr(e, "title", "")).replace("|", "\\|")
        breaks = _invariant_links(tuple(getattr(e, "breaks", ())), "../")
        out.append(f"| [{e.id}]({exhibit_slug(e)}.md) | {title} | {breaks} | {getattr(e, 'scope', '')} |")
    return "\n".join(out) + "\n"


def museum_pages(exhibits: list[Any]) -> dict[str, str]:
    pages = {"index.md": museum_index(exhibits)}
    pages.update({f"{exhibit_slug(e)}.md": exhibit_page(e) for e in exhibits})
    return pages


def museum_nav(exhibits: list[Any]) -> list[Any]:
    return ["museum/index.md"] + [{f"{e.id}": f"museum/{exhibit_slug(e)}.md"} for e in exhibits]


# ------------------------------------------------------------------------------------ debug builds

DEBUG_PAGE = "debug-builds.md"
_HELP = re.compile(r"^<!-- kvledger-help: ([a-z ]+) -->$", re.MULTILINE)
_ENV_VAR = re.compile(r"\bKVLEDGER_[A-Z_]+\b")


def cli_help(command: str) -> str:
    """``kvledger COMMAND --help`` as the CLI prints it (80 columns), in a text block."""
    env = dict(os.environ, COLUMNS="80")
    args = [sys.executable, "-m", "kvledger", *command.split(), "--help"]
    done = subprocess.run(args, capture_output=True, text=True, check=False, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise PluginError(f"{DEBUG_PAGE}: `kvledger {command} --help` failed: {done.stderr.strip()[-500:]}")
    text = done.stdout
    return "```text\n$ kvledger " + command + " --help\n" + text.rstrip() + "\n```"


def env_vars_in_code() -> set[str]:
    """Every ``KVLEDGER_...`` name the package's code mentions."""
    found: set[str] = set()
    for path in (ROOT / "kvledger").rglob("*.py"):
        found.update(_ENV_VAR.findall(path.read_text(encoding="utf-8")))
    return found


def with_cli_help(markdown: str) -> str:
    undocumented = sorted(env_vars_in_code() - set(_ENV_VAR.findall(markdown)))
    if undocumented:
        log.warning("%s does not document %s, read in kvledger/", DEBUG_PAGE, ", ".join(undocumented))
    return _HELP.sub(lambda m: cli_help(m.group(1).strip()), markdown)


# -------------------------------------------------------------------------------------------- hooks

_generated: dict[str, str] = {}  # site path -> Markdown, filled by on_config


def _insert_after(nav: list[Any], match: str, entry: Any) -> None:
    for i, item in enumerate(nav):
        if item == match or (isinstance(item, dict) and match in item.values()):
            nav.insert(i + 1, entry)
            return
    nav.append(entry)


def _insert_before(nav: list[Any], section: str, entry: Any) -> None:
    for i, item in enumerate(nav):
        if isinstance(item, dict) and section in item:
            nav.insert(i, entry)
            return
    nav.append(entry)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    _generated.clear()
    pages = spec_pages(spec_files())
    _generated.update({f"{SITE_SPEC}/{name}": text for name, text in pages.items()})
    nav = config.nav if config.nav is not None else []
    _insert_after(nav, "index.md", {"Spec": spec_nav(pages)})
    exhibits = museum_exhibits()
    if exhibits:
        _generated.update({f"museum/{name}": text for name, text in museum_pages(exhibits).items()})
        _insert_before(nav, "API reference", {"Museum": museum_nav(exhibits)})
    config.nav = nav
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for src_uri, content in _generated.items():
        files.append(File.generated(config, src_uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    uri = page.file.src_uri
    if uri == f"{SITE_SPEC}/invariants.md":
        page.meta.setdefault("hide", ["toc"])  # the table needs the width
        markdown = with_invariant_anchors(markdown)
    if uri == DEBUG_PAGE:
        markdown = with_cli_help(markdown)
    if not uri.startswith("api/"):
        markdown = with_invariant_links(markdown, uri, registered_ids())
    return markdown
