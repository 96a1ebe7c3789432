"""Which failure a hunt reports when Hypothesis finds several at once (``hunt.primary_failure``).

Hypothesis shrinks every distinct failure and raises them together; on a busy machine its shrink budget
runs out at different points, so "the smallest example" is not a stable choice. The hunt reports the
failure that names a registered invariant (the cause), never a plain ``assert`` the damage set off later.
"""

from __future__ import annotations

import sys

from kvledger.contracts.errors import ContractViolation
from kvledger.museum.hunt import invariant_of, primary_failure

if sys.version_info >= (3, 11):
    from builtins import ExceptionGroup
else:  # Hypothesis raises the backport's on Python 3.10 (its own dependency)
    from exceptiongroup import ExceptionGroup


def failure(exc: BaseException, statements: int) -> BaseException:
    """``exc`` as Hypothesis leaves it: the failing example's statements in its notes."""
    exc.__notes__ = [f"state.step(n={i})" for i in range(statements)]
    return exc


def test_a_named_violation_wins_over_a_shorter_plain_assert() -> None:
    plain = failure(AssertionError(), 2)
    named = failure(ContractViolation("[mamba] I-HANDLE-OWNED: the handle names a free slot"), 9)
    chosen = primary_failure(ExceptionGroup("2 distinct failures", [plain, named]))
    assert chosen is named and invariant_of(chosen) == "I-HANDLE-OWNED"


def test_among_named_violations_the_shortest_example_wins() -> None:
    long = failure(ContractViolation("I-COUNT: 1 tokens unaccounted"), 12)
    short = failure(ContractViolation("I-EXCLUSIVE: slot 3 held twice"), 4)
    assert primary_failure(ExceptionGroup("2", [long, short])) is short


def test_only_plain_failures_still_report_one() -> None:
    first, second = failure(AssertionError("a"), 3), failure(KeyError("b"), 3)
    assert primary_failure(ExceptionGroup("2", [first, second])) is first  # a tie: the first reported
    assert invariant_of(first) == "AssertionError"  # and it says it names no invariant


def test_a_single_failure_is_itself() -> None:
    single = ContractViolation("I-COUNT")
    assert primary_failure(single) is single


def test_an_invariant_the_hunted_exhibit_lists_wins_over_a_shorter_other_one() -> None:
    """N6a's deep hunt (issue 42): the failure found while generating names I-DRAIN, which the exhibit
    lists; the I-LIVENESS met while shrinking is found, and shrunk shorter, only as far as the clock
    lets the shrink run. Preferring the listed invariant makes the verdict a function of the seed."""
    drain = failure(ContractViolation("I-DRAIN: the prefill's waiting queue holds a metadata slot"), 14)
    liveness = failure(ContractViolation("I-LIVENESS: not drained after 420 steps"), 6)
    group = ExceptionGroup("2 distinct failures", [liveness, drain])
    assert primary_failure(group, ("I-DRAIN",)) is drain
    assert primary_failure(group) is liveness  # a clean hunt expects nothing: the shortest, as before
