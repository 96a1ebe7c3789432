"""The abstract model the caches refine: which page-aligned token prefixes are cached, and which have a state.

A radix tree is one representation of a prefix-closed set of page-aligned prefixes (each with the KV
ids of its last page) plus, for the Mamba tree, a set of prefixes with a state (each with the tag the
machine wrote into the state when it was inserted). Matching, inserting and what eviction may do are
stated here over sets, without nodes, splits or lists; the cache machine (:mod:`.cache`) checks the real
caches against it after every step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kvledger.museum.machines.checks import violation

Prefix = tuple[int, ...]


@dataclass
class CacheModel:
    page_size: int
    pages: dict[Prefix, list[int]] = field(default_factory=dict)  # cached prefix -> ids of its last page
    states: dict[Prefix, int] = field(default_factory=dict)  # prefix with a state -> its tag

    def aligned(self, key: Sequence[int]) -> Prefix:
        n = len(key) - len(key) % self.page_size
        return tuple(key[:n])

    def longest(self, key: Sequence[int]) -> int:
        """The longest cached page-aligned prefix of ``key`` (the plain tree's match, never more)."""
        k = self.aligned(key)
        n = 0
        while n < len(k) and k[: n + self.page_size] in self.pages:
            n += self.page_size
        return n

    def longest_state(self, key: Sequence[int]) -> int:
        """The longest cached prefix of ``key`` that has a state (the Mamba tree's match), or 0."""
        k = self.aligned(key)
        best = 0
        n = self.page_size
        while n <= len(k) and k[:n] in self.pages:
            if k[:n] in self.states:
                best = n
            n += self.page_size
        return best

    def branching(self, key: Sequence[int], chunk: int) -> int | None:
        """Mamba V2: the matched KV length rounded down to ``chunk`` when the match went past the deepest
        state, if that is at least one chunk; else None."""
        matched = self.longest(key)
        if matched == self.longest_state(key) or matched < chunk:
            return None
        return matched // chunk * chunk

    def ids(self, key: Sequence[int], length: int) -> list[int]:
        """The KV ids a match of ``length`` tokens of ``key`` must return."""
        k = tuple(key)
        out: list[int] = []
        for n in range(self.page_size, length + 1, self.page_size):
            out.extend(self.pages[k[:n]])
        return out

    def insert(self, key: Sequence[int], value: Sequence[int], prefix_len: int) -> None:
        """Pages past ``prefix_len`` become cached with the caller's ids."""
        k = tuple(key)
        for n in range(prefix_len + self.page_size, len(k) + 1, self.page_size):
            self.pages[k[:n]] = list(value[n - self.page_size : n])

    def prefixes_of(self, path: Prefix) -> Iterable[Prefix]:
        return (path[:n] for n in range(self.page_size, len(path) + 1, self.page_size))

    def check_shrink(
        self,
        pages: dict[Prefix, list[int]],
        states: dict[Prefix, int],
        locked: Iterable[tuple[Prefix, bool]],
    ) -> None:
        """What any eviction (or a release that prunes a tombstone leaf) may do: only remove.

        Kept prefixes keep their ids, kept states their tags, no state appears, and every locked path
        (with its state, when the lock took it) survives (I-EVICT-LOCKED at the level of the model).
        """
        added = set(pages) - set(self.pages)
        if added:
            raise violation("I-MODEL-SHRINK", f"eviction added prefixes {sorted(added)[:3]}")
        for p, ids in pages.items():
            if ids != self.pages[p]:
                raise violation("I-MODEL-SHRINK", f"prefix {p} changed ids {self.pages[p]} -> {ids}")
        for p, tag in states.items():
            if self.states.get(p) != tag:
                raise violation("I-MODEL-SHRINK", f"state at {p} changed {self.states.get(p)} -> {tag}")
        for path, took_state in locked:
            for p in self.prefixes_of(path):
                if p not in pages:
                    raise violation("I-EVICT-LOCKED", f"locked prefix {p} was evicted")
            if took_state and path and path not in states:
                raise violation("I-EVICT-LOCKED", f"locked state at {path} was evicted")


def diff(tree: Mapping[Prefix, object], model: Mapping[Prefix, object]) -> str:
    """Where the tree's view and the model's differ, briefly: the evidence of an I-MODEL-TREE violation."""
    only_tree = sorted(set(tree) - set(model))[:3]
    only_model = sorted(set(model) - set(tree))[:3]
    changed = sorted(p for p in set(tree) & set(model) if tree[p] != model[p])[:3]
    return (
        f"only in the tree {only_tree}, only in the model {only_model},"
        f" different {[(p, tree[p], model[p]) for p in changed]}"
    )
