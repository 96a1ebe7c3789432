"""How a machine states a check: a ``ContractViolation`` that names the registered invariant it checks.

A machine's own checks (the tree against the abstract model, the counts after a rule, what a rule's call
returned) are invariants like the contracts inside the reference: when one fails, ``kvledger hunt``
reports the ID the message names (``hunt.invariant_of``), so a plain ``assert`` would surface as an
unnamed ``AssertionError``. Every check here puts the ID first and keeps the evidence (the values) after
it. The message may be a callable, formatted only when the check fails: the checks run after every rule,
and the hunt's speed is examples per second.

``python -m kvledger.contracts.invariants check`` fails on an ID written here that the registry does not
know, and ``tests/museum/test_machine_checks.py`` fails on a plain ``assert`` in the machines other than
a type-narrowing ``assert x is not None``.
"""

from __future__ import annotations

from collections.abc import Callable

from kvledger.contracts.errors import INVARIANT_ID, ContractViolation

Message = str | Callable[[], str]


def violation(invariant_id: str, message: Message) -> ContractViolation:
    """The violation a failed check raises: ``"I-...: <evidence>"``."""
    if not INVARIANT_ID.fullmatch(invariant_id):
        raise ValueError(f"{invariant_id!r} is not an invariant ID")
    text = message() if callable(message) else message
    return ContractViolation(f"{invariant_id}: {text}")


def model_check(condition: object, invariant_id: str, message: Message) -> None:
    """Raise a ``ContractViolation`` naming ``invariant_id`` unless ``condition`` holds."""
    if not condition:
        raise violation(invariant_id, message)
