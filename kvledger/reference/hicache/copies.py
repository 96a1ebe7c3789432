"""A host copy of a cached segment, and the host tier's index of copies whose device KV was evicted.

A :class:`HostCopy` is what SGLang's ``TreeNode.host_value`` is: host slots holding the KV of one segment
of a cached prefix (the tokens ``key[start:]`` after the prefix ``key[:start]``), with its own owner in the
host pool's ledger. Its residency is SGLang's three states of a node: *both* (the device node it backs up
is in the tree), *host* (the device KV was evicted: only the copy is left) and, while a load-back reads
it, *pinned* (``loading > 0``; still host residency until the load commits).

kvledger's tree deletes a node whose device KV is evicted (the full component owns every node's KV), so a
host-only segment lives in :class:`HostIndex`, keyed by the prefix it continues: a match walks the device
tree, then the index from where the device match ended. That is SGLang's evicted node, kept outside the
device tree instead of as a value-less node in it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from kvledger.contracts.owners import Owner
from kvledger.reference.radix.tree_node import TreeNode

BOTH = "both"
HOST = "host"
DEVICE = "device"


def path_key(node: TreeNode) -> tuple[int, ...]:
    """The tokens from the root to the end of ``node``."""
    parts: list[tuple[int, ...]] = []
    n: TreeNode | None = node
    while n is not None:
        parts.append(n.key)
        n = n.parent
    return tuple(t for part in reversed(parts) for t in part)


@dataclass(eq=False)
class HostCopy:
    """Host slots ``ids`` holding the KV of tokens ``key[start:]`` (one slot per token), owned by ``owner``.

    Invariant: ``len(ids) == len(key) - start > 0``; ``node`` is the live tree node ending at ``key`` when
    the residency is *both*, None when it is *host*."""

    key: tuple[int, ...]
    start: int
    ids: torch.Tensor
    owner: Owner
    node: TreeNode | None = None
    loading: int = 0
    last_access: int = 0

    @property
    def residency(self) -> str:
        return BOTH if self.node is not None else HOST

    @property
    def segment(self) -> tuple[int, ...]:
        return self.key[self.start :]

    def __len__(self) -> int:
        return len(self.key) - self.start

    def __repr__(self) -> str:
        return (
            f"HostCopy({self.residency}, tokens [{self.start}, {len(self.key)}), slots"
            f" {self.ids.tolist()[:4]}{'...' if len(self) > 4 else ''}, loading={self.loading})"
        )


@dataclass
class HostHit:
    """What a match found on the host beyond the device match: ``(copy, offset, tokens)`` in path order
    (the tokens ``copy.segment[offset:offset + tokens]``)."""

    device_len: int
    parts: list[tuple[HostCopy, int, int]] = field(default_factory=list)

    @property
    def host_len(self) -> int:
        """SGLang's ``host_hit_length``: the tokens a load-back would bring to the device."""
        return sum(n for _, _, n in self.parts)

    def copies(self) -> list[HostCopy]:
        return [c for c, _, _ in self.parts]

    def host_ids(self) -> torch.Tensor:
        chunks = [c.ids[off : off + n] for c, off, n in self.parts]
        return torch.cat(chunks) if chunks else torch.empty((0,), dtype=torch.int64)


class HostIndex:
    """Host-only copies, keyed by the prefix each continues (``key[:start]``)."""

    def __init__(self) -> None:
        self._after: dict[tuple[int, ...], list[HostCopy]] = {}

    def add(self, copy: HostCopy) -> None:
        self._after.setdefault(copy.key[: copy.start], []).append(copy)

    def remove(self, copy: HostCopy) -> None:
        prefix = copy.key[: copy.start]
        lst = self._after[prefix]
        lst.remove(copy)
        if not lst:
            del self._after[prefix]

    def __iter__(self) -> Iterator[HostCopy]:
        for lst in self._after.values():
            yield from lst

    def continues(self, copy: HostCopy) -> bool:
        """Whether another host-only copy continues ``copy`` (it is not a leaf of the host tier)."""
        return copy.key in self._after

    def walk(self, key: Sequence[int], start: int, page: int) -> list[tuple[HostCopy, int, int]]:
        """The host-only copies that continue ``key[:start]`` along ``key``: ``(copy, offset, tokens)``,
        whole copies, then at most one cut to the longest page-aligned common prefix. The first may begin
        inside a copy (a shorter prefix of an evicted segment is back on the device)."""
        parts: list[tuple[HostCopy, int, int]] = []
        pos = start
        prefix = tuple(key[:start])
        candidates = [(c, 0) for c in self._after.get(prefix, ())] or self._inside(prefix)
        while candidates:
            best: tuple[HostCopy, int, int] | None = None
            for copy, off in candidates:
                n = _common(copy.segment[off:], key, pos)
                n -= n % page
                if n and (best is None or n > best[2]):
                    best = (copy, off, n)
            if best is None:
                break
            parts.append(best)
            copy, off, n = best
            if off + n < len(copy):
                break
            pos += n
            candidates = [(c, 0) for c in self._after.get(copy.key, ())]
        return parts

    def _inside(self, prefix: tuple[int, ...]) -> list[tuple[HostCopy, int]]:
        """Copies whose segment strictly contains the end of ``prefix`` (O(host-only copies))."""
        end = len(prefix)
        return [(c, end - c.start) for c in self if c.start < end < len(c.key) and c.key[:end] == prefix]


def _common(seg: tuple[int, ...], key: Sequence[int], pos: int) -> int:
    n = 0
    limit = min(len(seg), len(key) - pos)
    while n < limit and seg[n] == key[pos + n]:
        n += 1
    return n
