"""The docs stage of ``scripts/test.sh`` can fail: its ``mkdocs build`` aborts on a warning.

``--strict`` turns warnings into a failure, but ``--quiet`` hides warnings from the logger strict mode
counts, so ``mkdocs build --strict --quiet`` passes a site with broken links (issue 42: CI's stage was
green while ``mkdocs build --strict`` aborted). The test runs the stage's own command, as test.sh
writes it, on a tiny site with one planted warning and expects the failure; and the site hook's
undocumented-variable check is a warning of that logger.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.script_module import load_script

REPO = Path(__file__).resolve().parents[2]


def docs_stage_command() -> list[str]:
    """The arguments of the docs stage's ``mkdocs`` call in scripts/test.sh."""
    script = (REPO / "scripts" / "test.sh").read_text(encoding="utf-8")
    lines = [line for line in script.splitlines() if "bin/mkdocs build" in line and not line.lstrip().startswith("#")]
    assert len(lines) == 1, f"expected one mkdocs build in scripts/test.sh, found {lines}"
    words = shlex.split(lines[0])
    return words[words.index("build") - 1 :]  # from .venv/bin/mkdocs on


def test_the_docs_stage_builds_strictly_and_shows_its_warnings() -> None:
    command = docs_stage_command()
    assert "--strict" in command
    assert "--quiet" not in command and "-q" not in command


def test_the_docs_stage_fails_on_a_planted_warning(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# A page\n\n[a link to nowhere](missing.md)\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text("site_name: planted\n", encoding="utf-8")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    command = [str(mkdocs), *docs_stage_command()[1:], "--site-dir", str(tmp_path / "site")]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, f"the docs stage passed a site with a broken link:\n{done.stdout}{done.stderr}"
    assert "missing.md" in done.stdout + done.stderr


def test_an_undocumented_environment_variable_is_a_build_warning(caplog: pytest.LogCaptureFixture) -> None:
    hooks = load_script(REPO / "scripts" / "mkdocs_hooks.py", "_site_hooks_gate")
    with caplog.at_level(logging.WARNING):
        hooks.with_cli_help("a page that documents no variable\n")
    assert any("does not document" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
