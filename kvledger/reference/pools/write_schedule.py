"""``WriteSchedule``: slot writes a pool has promised but not yet applied (pure bookkeeping, no tensors).

A write is ``dst <- src`` (copy slot ``src`` into slot ``dst``) or ``dst <- ZERO``. The schedule keeps
one rule that makes a batch order-free: **no destination is also a source**. Its owner (``MambaPool``)
applies the batch before adding a write whose destination a scheduled copy still reads
(:meth:`reads`), before releasing such a slot, and before anyone reads the bytes. Within that rule:

* a later write to a destination replaces the earlier one (it would be overwritten anyway);
* a copy from a slot whose own write is scheduled is recorded as what that write will put there: a
  zeroing, or a copy from the same source (which cannot change before the batch: writing or releasing
  a source applies the batch first).
"""

from __future__ import annotations

from collections import Counter

ZERO = -1  # the source of a scheduled zeroing


class WriteSchedule:
    __slots__ = ("_sources", "_writes")

    def __init__(self) -> None:
        self._writes: dict[int, int] = {}  # destination -> source slot, or ZERO
        self._sources: Counter[int] = Counter()  # slot -> scheduled copies that read it

    def __len__(self) -> int:
        return len(self._writes)

    def __bool__(self) -> bool:
        return bool(self._writes)

    def view(self) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
        """The schedule as it stands, sorted: ``(destination, source or ZERO)`` pairs and ``(slot, copies
        that read it)`` pairs (a read-only copy, for snapshots)."""
        return tuple(sorted(self._writes.items())), tuple(sorted(self._sources.items()))

    def reads(self, slot: int) -> bool:
        """Does a scheduled copy still have to read ``slot``?"""
        return slot in self._sources

    def write_to(self, slot: int) -> int | None:
        """The scheduled write into ``slot``: its source, ``ZERO``, or None."""
        return self._writes.get(slot)

    def will_hold(self, slot: int) -> int:
        """What a copy from ``slot`` would copy once the batch is applied: ``slot`` itself, or the source
        (or ``ZERO``) of the write scheduled into it."""
        return self._writes.get(slot, slot)

    def add(self, dst: int, src: int) -> None:
        """Schedule ``dst <- src``. The caller applies the batch first when :meth:`reads` ``(dst)``."""
        if dst in self._sources:
            raise ValueError(f"slot {dst} is read by a scheduled copy: apply the batch before writing it")
        if src != ZERO:
            src = self.will_hold(src)
        self.drop(dst)
        self._writes[dst] = src
        if src != ZERO:
            self._sources[src] += 1

    def drop(self, dst: int) -> None:
        """Forget the write scheduled into ``dst`` (released: its bytes are dead), if any."""
        src = self._writes.pop(dst, None)
        if src is not None and src != ZERO:
            self._sources[src] -= 1
            if not self._sources[src]:
                del self._sources[src]

    def take(self) -> tuple[list[int], list[int], list[int]]:
        """Empty the schedule: the slots to zero, and the copy sources and destinations, pairwise."""
        zero = [dst for dst, src in self._writes.items() if src == ZERO]
        copies = [(src, dst) for dst, src in self._writes.items() if src != ZERO]
        self._writes.clear()
        self._sources.clear()
        return zero, [s for s, _ in copies], [d for _, d in copies]

    def slots(self) -> set[int]:
        """Every slot a scheduled write targets or reads."""
        return set(self._writes) | set(self._sources)

    def inconsistency(self) -> str | None:
        """Why the bookkeeping is broken (a destination that is also a source, miscounted sources), or None."""
        if set(self._writes) & set(self._sources):
            return "a scheduled destination is also a scheduled source"
        if Counter(src for src in self._writes.values() if src != ZERO) != self._sources:
            return "scheduled sources miscounted"
        return None
