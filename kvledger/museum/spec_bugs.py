"""Speculative-decoding bugs, re-enacted outside the reference code: each ``wrap`` takes the reference
method and returns the historical one that replaces it for the duration of an exhibit's ``with`` block
(:func:`kvledger.museum.exhibit.patched`). The registry entries are in :mod:`kvledger.museum.catalogue`;
the generic scheduler machine draws the speculative configurations and acceptance counts that find them.
"""

from __future__ import annotations

from typing import Any

from kvledger.reference.scheduler.spec_config import SpeculativeConfig
from kvledger.reference.scheduler.speculative import SpecDecoding


# --------------------------------------------------------------------------------------------- N18
def n18_row_headroom_ignores_the_draft_tree(original: Any) -> Any:
    def row_headroom(self: SpeculativeConfig, page_size: int, overlap: bool) -> int:
        """Before PR #26972: the request-to-token row kept SGLang's fixed ``4 + num_draft_tokens`` positions
        beyond the context, whatever the page size and topk; spec v2's tree drafting at page > 1 reserves
        ``topk`` partly filled pages per step (twice with overlap), more than that."""
        return 4 + self.num_draft_tokens

    return row_headroom


# --------------------------------------------------------------------------------------------- B16-spec
def b16_spec_track_step_not_clamped(original: Any) -> Any:
    def track_seqlen(
        self: SpecDecoding, start: int, accepted_end: int, drafted_end: int, interval: int
    ) -> int | None:
        """Before PR #35821 clamped it: the speculative decode's tracking step was taken on the drafted
        positions, so a multiple of ``mamba_track_interval`` reached only by rejected drafts was recorded as
        the tracked length, beyond what the request committed (and the state there is a rejected draft's)."""
        last = drafted_end - drafted_end % interval
        return last if last > start else None

    return track_seqlen
