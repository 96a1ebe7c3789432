"""The house counts (issue 36) never rise: ``Any`` in the reference, reach-through to another object's
private names, files over 800 lines and functions over 80 (``scripts/house_counts.py``, its baseline in
``tests/house_baseline.json``). A change that lowers a count records the new baseline with
``scripts/house_counts.py --write tests/house_baseline.json``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
house = load_script(ROOT / "scripts" / "house_counts.py", "house_counts")


def test_no_house_count_rose_above_the_baseline() -> None:
    baseline = json.loads((ROOT / "tests" / "house_baseline.json").read_text())
    assert house.regressions(house.counts(), baseline) == []


def test_the_counters_see_what_they_count() -> None:
    tree = ast.parse(
        "from typing import Any\nimport typing\n"
        "def f(x: Any, y: typing.Any) -> None:\n"
        "    self._a = x._b\n    cls._c = 1\n    y.__dict__\n    z._d()\n    super()._e()\n    sup()._f\n"
    )
    assert house.any_names(tree) == 2
    # x._b, z._d and sup()._f; self, cls, super() (the object's own base) and dunders are not
    assert house.private_reach_through(tree) == 3
    body = "\n".join(["    pass"] * house.MAX_FUNCTION_LINES)
    assert house.long_functions(ast.parse(f"def long():\n{body}\n"), "m.py") == ["m.py::long"]
    assert house.long_functions(ast.parse("def short():\n    pass\n"), "m.py") == []


def test_a_rise_and_a_new_long_file_are_both_named() -> None:
    baseline = {
        "any_in_reference": 5,
        "private_reach_through": 3,
        "files_over_800_lines": ["a.py"],
        "functions_over_80_lines": [],
    }
    now = dict(baseline, any_in_reference=6, files_over_800_lines=["a.py", "b.py"])
    assert house.regressions(now, baseline) == [
        "any_in_reference: 6 > baseline 5",
        "files_over_800_lines: new ['b.py']",
    ]
    assert house.regressions(dict(baseline, private_reach_through=1), baseline) == []
