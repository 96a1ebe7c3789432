"""The sweep's vocabulary: what a case is, the classes of bad input, the public surface, and one run.

The public surface is found by introspection: every class and function a package of the reference
implementation exports (``__all__`` of ``kvledger.reference.pools``, ``.radix``, ``.scheduler``, the
engine builder, and the PD package once it exists), minus the ones :data:`NOT_SWEPT` names with a
reason (results, enums, protocols, errors). For each swept class, its members are ``__init__`` and every
public method, static or class method and property. A member the table has no row for fails
``test_every_public_member_has_a_row``, so a new public method cannot land unswept.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from kvledger.contracts import errors, switch
from kvledger.contracts.errors import KVLedgerError
from tests.sweep import snapshot
from tests.sweep.scenes import SCENES, Scene

# ---------------------------------------------------------------------- the classes of bad input
WRONG_TYPE = "wrong type"
OUT_OF_RANGE = "out of range"
NEGATIVE = "negative"
DUPLICATE = "duplicate"
FOREIGN = "foreign id or handle"
DOUBLE = "double operation"
WRONG_STATE = "wrong state"
DEGENERATE = "degenerate size"
CATEGORIES = (WRONG_TYPE, OUT_OF_RANGE, NEGATIVE, DUPLICATE, FOREIGN, DOUBLE, WRONG_STATE, DEGENERATE)


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad call: ``call(scene)`` must raise ``error`` (a KVLedgerError subclass, by name) and change
    nothing. ``needs_owners``: only a level that knows who holds each id can tell (``owners`` and up,
    spec/checking-levels.md); at ``release`` the row is not claimed. Nothing is forced on: every row runs
    at the level of the process (``KVLEDGER_CHECKS``)."""

    member: str  # "Class.method", "Class.__init__" or "function"
    category: str
    label: str
    scene: str
    call: Callable[[Scene], object]
    error: str = "KVLedgerError"
    needs_owners: bool = False
    setup: Callable[[Scene], object] | None = None  # puts the scene in the state the call is bad in

    @property
    def id(self) -> str:
        return f"{self.member}: {self.label}"


Call = Callable[[Scene], object]


@dataclasses.dataclass(frozen=True)
class Row:
    """A bad call not yet bound to a member and a scene: one list of rows serves every class that has
    the method (the pools' ``alloc``, the trees' ``insert``), each bound by :meth:`case`."""

    category: str
    label: str
    error: str
    call: Call
    needs_owners: bool = False
    setup: Call | None = None

    def case(self, member: str, scene: str, suffix: str = "") -> Case:
        label = self.label + suffix
        return Case(member, self.category, label, scene, self.call, self.error, self.needs_owners, self.setup)


def method_cases(cls: str, scene: str, rows: dict[str, list[Row]], suffix: str = "") -> list[Case]:
    """``cls.method`` cases for each method's rows, on ``scene`` (a constructor's on the empty scene)."""
    return [
        row.case(f"{cls}.{method}", "empty" if method == "__init__" else scene, suffix)
        for method, method_rows in rows.items()
        for row in method_rows
    ]


@dataclasses.dataclass(frozen=True)
class Query:
    """A member that takes no argument and reads (or is allowed in every state): calling it on its busy
    scene must succeed and change nothing observable."""

    member: str
    scene: str
    call: Callable[[Scene], object]
    reason: str = "a read"


def error_class(name: str) -> type[KVLedgerError]:
    """The typed error a case expects, by name (falls back to the base class on older code)."""
    found = getattr(errors, name, None)
    if found is None:
        from kvledger.reference import scheduler

        found = getattr(scheduler, name, None) or getattr(scheduler.scheduler, name, None)
    if isinstance(found, type) and issubclass(found, KVLedgerError):
        return found
    return KVLedgerError


# ---------------------------------------------------------------------- the public surface
PACKAGES = (
    "kvledger.reference.pools",
    "kvledger.reference.radix",
    "kvledger.reference.scheduler",
    "kvledger.reference.engine",
    "kvledger.reference.disagg",
    "kvledger.audit",
)

NOT_SWEPT: dict[str, str] = {
    # results and handles: returned by the swept objects, no behaviour of their own
    "InsertResult": "a result record",
    "MatchResult": "a result record",
    "LockRef": "a handle returned by inc_lock_ref (swept as an argument of dec_lock_ref)",
    "TreeNode": "a node of a cache (swept as an argument of inc_lock_ref)",
    "ScheduleBatch": "a batch record (swept as an argument of process_batch_result)",
    "Req": "a request record (swept as an argument of retract)",
    "SchedulerStats": "counters",
    "AddReqResult": "an enum",
    "ReqState": "an enum",
    "ModelRunner": "a typing.Protocol",
    "UnknownRequest": "an error class",
    # collaborators the scheduler builds and drives itself, reached only through Scheduler
    "PrefillAdder": "built per admission round by Scheduler.get_new_batch_prefill; not an entry point",
    "HashTokenRunner": "the scheduler's deterministic runner, driven only by Scheduler._launch",
    "hash_next_token": "a pure function of a token list (the hash runner's arithmetic)",
    "TinyHybridConfig": "model configuration (the model's own area)",
    "TinyHybridRunner": "the model runner (the model's own area)",
    "TinyHybridWeights": "model weights (the model's own area)",
    "TreeKind": "a type alias",
    "ModelKind": "a type alias",
    "EngineParts": "a result record of build_parts (swept through build_engine and build_pd)",
    # PD: records, enums and counters
    "PDReq": "a request record (swept through PDSystem.add_request/abort)",
    "PDStats": "counters",
    "Component": "an enum",
    "Fault": "an enum",
    "Poll": "an enum",
    "AuditReport": "a result record of audit_lines/audit_file",
}


def _exports(module_name: str) -> list[tuple[str, Any]]:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError:
        return []  # the PD package before it lands
    names = getattr(module, "__all__", None)
    if names is None:  # a module without __all__: its own public classes and functions
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and (inspect.isclass(v) or inspect.isfunction(v))
            and getattr(v, "__module__", None) == module_name
        ]
    return [(n, getattr(module, n)) for n in names]


def swept_objects() -> dict[str, Any]:
    """Name -> class or function, for everything the packages export and NOT_SWEPT does not exclude."""
    out: dict[str, Any] = {}
    for module_name in PACKAGES:
        for name, obj in _exports(module_name):
            if name in NOT_SWEPT or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                continue
            out[name] = obj
    return out


def members_of(name: str, obj: Any) -> list[str]:
    """``Class.__init__`` and every public method, static/class method and property; or the function."""
    if not inspect.isclass(obj):
        return [name]
    out = [f"{name}.__init__"]
    swept = tuple(o for o in swept_objects().values() if inspect.isclass(o) and o is not obj)
    for attr in sorted(dir(obj)):
        if attr.startswith("_") or _inherited_from(obj, attr, swept):
            continue
        static = inspect.getattr_static(obj, attr)
        if isinstance(static, (staticmethod, classmethod, property)) or inspect.isfunction(static):
            out.append(f"{name}.{attr}")
    return out


def _inherited_from(cls: type, attr: str, swept: tuple[type, ...]) -> bool:
    """Whether ``cls`` inherits ``attr`` unchanged from another swept class (whose rows cover it)."""
    for klass in cls.__mro__:
        if attr in vars(klass):
            return klass is not cls and klass in swept
    return False


def public_members() -> list[str]:
    return [m for name, obj in swept_objects().items() for m in members_of(name, obj)]


def takes_arguments(member: str) -> bool:
    """Whether a member has a parameter besides ``self`` (a property takes none)."""
    objs = swept_objects()
    cls_name, _, attr = member.partition(".")
    obj = objs[cls_name]
    if not attr:
        target = obj
    else:
        static = inspect.getattr_static(obj, attr)
        if isinstance(static, property):
            return False
        target = getattr(obj, attr)
    params = [p for p in inspect.signature(target).parameters.values() if p.name not in ("self", "cls")]
    return bool(params)


# ---------------------------------------------------------------------- one run
@dataclasses.dataclass
class Outcome:
    case: Case
    raised: BaseException | None
    changed: list[str]
    audit_error: BaseException | None = None

    @property
    def kind(self) -> str:
        """``typed``, ``untyped`` (any other exception, a ContractViolation included) or ``accepted``."""
        if self.raised is None:
            return "accepted"
        return "typed" if isinstance(self.raised, KVLedgerError) else "untyped"

    @property
    def expected_class(self) -> bool:
        return isinstance(self.raised, error_class(self.case.error))

    @property
    def clean(self) -> bool:
        return self.kind == "typed" and not self.changed and self.audit_error is None

    def describe(self) -> str:
        what = "returned normally" if self.raised is None else f"{type(self.raised).__name__}: {self.raised}"
        parts = [f"{self.case.id} [{self.case.category}] {what}"]
        if self.changed:
            parts.append(f"changed: {', '.join(self.changed)}")
        if self.audit_error is not None:
            parts.append(f"audit: {type(self.audit_error).__name__}: {self.audit_error}")
        return "; ".join(parts)


def build_scene(scene: str) -> Scene:
    """A fresh scene, its pools and caches built at the process's checking level."""
    return SCENES[scene]()


def claimed(case: Case) -> bool:
    """Whether the process's checking level promises to refuse ``case`` (README, spec/checking-levels.md):
    every row from ``owners`` up; at ``release``, the rows that need no owner."""
    return switch.LEVEL.tracks_owners or not case.needs_owners


def audit(scene: Scene) -> None:
    """Full recounts of every pool and cache the scene holds (a rejected call must leave them sound)."""
    seen: set[int] = set()
    stack = list(scene.roots)
    while stack:
        obj = stack.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        check = getattr(obj, "audit", None)
        if callable(check):
            check()
        stack.extend(child for _, child in snapshot._children(obj))


def run_case(case: Case) -> Outcome:
    scene = build_scene(case.scene)
    if case.setup is not None:
        case.setup(scene)
    before = snapshot.take(*scene.roots)
    raised: BaseException | None = None
    try:
        case.call(scene)
    except Exception as exc:
        raised = exc
    after = snapshot.take(*scene.roots)
    audit_error: BaseException | None = None
    try:
        audit(scene)
    except Exception as exc:
        audit_error = exc
    return Outcome(case, raised, snapshot.differences(before, after), audit_error)


def run_query(query: Query) -> tuple[BaseException | None, list[str]]:
    scene = build_scene(query.scene)
    before = snapshot.take(*scene.roots)
    try:
        query.call(scene)
    except Exception as exc:
        return exc, []
    return None, snapshot.differences(before, snapshot.take(*scene.roots))
