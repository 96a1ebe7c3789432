"""#12432 put back into the release that fixed it (0.5.5.post2), by a scoped patch outside SGLang.

The fix is one argument: ``process_prefill_chunk`` frees the chunked request's row with
``free_mamba_cache=False``. Re-enacted by dropping that argument while ``process_prefill_chunk`` runs
(the request pool's ``free`` then takes its default and frees the row's Mamba slot too, as in
0.5.5.post1); everything else is the fixed release. The attach must name it as it names the original.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def put_back_12432(scheduler: Any) -> None:
    """Make ``scheduler.process_prefill_chunk`` free the chunked request's Mamba slot with its row."""
    original: Callable[[], None] = scheduler.process_prefill_chunk
    pool = scheduler.req_to_token_pool

    def process_prefill_chunk() -> None:
        free = pool.free  # the watch's wrapper when attached

        def free_with_state(free_index: Any, *args: Any, free_mamba_cache: bool = True) -> Any:
            return free(free_index, *args)  # the argument the fix added is dropped

        pool.free = free_with_state
        try:
            original()
        finally:
            pool.free = free

    scheduler.process_prefill_chunk = process_prefill_chunk
