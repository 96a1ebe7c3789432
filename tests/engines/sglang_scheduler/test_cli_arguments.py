"""Bad input to the SGLang scheduler CLI is a usage error before anything is imported or run."""

from __future__ import annotations

import pytest

from kvledger.engines.sglang.scheduler.__main__ import main


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["hunt", "--release", "0.4.0"], "invalid choice"),
        (["hunt", "--release", "0.5.9", "--seeds", "0"], "must be >= 1"),
        (["hunt", "--release", "0.5.9", "--ops", "-3"], "must be >= 1"),
        (["hunt", "--release", "0.5.9", "--first-seed", "-1"], "must be >= 0"),
        (["machine", "--release", "0.5.9", "--examples", "0"], "must be >= 1"),
        (["hunt", "--release", "0.5.23", "--aborts", "1.5"], "must be a probability in [0, 1]"),
        (["hunt", "--release", "0.5.23", "--aborts", "-0.1"], "must be a probability in [0, 1]"),
        (["hunt", "--release", "0.5.23", "--aborts", "often"], "expected a number"),
        (["hunt", "--release", "0.5.9", "--pd", "prefill"], "--pd builds 0.5.23"),
        (["hunt", "--release", "0.5.23", "--pd", "both"], "invalid choice"),
    ],
)
def test_a_bad_argument_is_a_usage_error_naming_it(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert says in capsys.readouterr().err
