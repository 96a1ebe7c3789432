"""Draws that reach the edges of the machines' capacities: exactly at, one below and one above a boundary.

A sizing error of a page's worth of tokens (a reservation rounded the wrong way, a ``>`` for a ``>=``)
bites only when a request sits right at a limit; uniform draws of prompt lengths and pool sizes land
there rarely. An *edge draw* names a boundary and an offset: ``None`` (about two thirds of draws: the
value drawn uniformly stands) or ``(pick, offset)``, ``pick`` taken modulo the boundaries the machine
lists at the moment of the rule (its pool sizes, page multiples, slot counts, row width, the free and
reclaimable room now), ``offset`` in ``{-1, 0, +1}``. The draw is plain data, so a hunt's printed rule
call replays it; the boundary it resolves to is the machine's state, not a constant of the draw.

The machines know no exhibit: the boundaries are the capacities every engine has.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

OFFSETS = (-1, 0, 1)
Edge = tuple[int, int] | None
# ``st.none()`` three times: about two draws in three keep the uniform value (Hypothesis draws a branch of
# ``one_of`` uniformly), so an edge is frequent without crowding out the rest of the range.
edge_draws: st.SearchStrategy[Edge] = (
    st.none() | st.none() | st.none() | st.tuples(st.integers(0, 63), st.sampled_from(OFFSETS))
)


def at_edge(boundaries: Sequence[int], edge: Edge) -> int | None:
    """The value an edge draw names among ``boundaries`` (None: no edge drawn, or no boundary listed)."""
    if edge is None or not boundaries:
        return None
    pick, offset = edge
    return boundaries[pick % len(boundaries)] + offset


def fit(tokens: Sequence[int], length: int, filler: Sequence[int]) -> list[int]:
    """``tokens`` cut to ``length``, or extended to it by repeating ``filler`` (at least one token)."""
    out = list(tokens[:length])
    fill = list(filler) or [0]
    i = 0
    while len(out) < length:
        out.append(fill[i % len(fill)])
        i += 1
    return out


def multiples(unit: int, up_to: int, count: int = 3) -> list[int]:
    """The first ``count`` multiples of ``unit`` not above ``up_to`` (page and capture-grid boundaries)."""
    return [unit * k for k in range(1, count + 1) if unit * k <= up_to]
