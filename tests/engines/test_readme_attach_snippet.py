"""The README's attach snippet runs as written (issue 37: it left out ``load()`` and said nothing about
auditing): the code block is read from the README and executed, and the watch it built is the one
checked here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _snippet() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    found = [b for b in blocks if "from kvledger.engines.sglang.attach import watch" in b]
    assert len(found) == 1, "the README has one attach snippet"
    return found[0]


def test_the_readme_attach_snippet_runs_as_written(sgl: Any) -> None:
    code = _snippet()
    assert "load()" in code and "retire(" in code and "check_idle()" in code
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md (attach snippet)", "exec"), scope)  # the user's code, verbatim
    w, alloc = scope["w"], scope["alloc"]
    assert w.kv is not None and w.calls >= 2  # the alloc and the free went through the watch
    assert "alloc" not in vars(alloc)  # detached at the end
    assert alloc.available_size() == alloc.size
