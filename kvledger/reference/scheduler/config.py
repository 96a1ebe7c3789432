"""Scheduler knobs, with SGLang's names and defaults where they exist."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvledger.contracts.errors import InvalidArgument
from kvledger.contracts.mamba_track import FLA_CHUNK_SIZE, mamba_cache_chunk_size, ping_pong_size
from kvledger.reference.config_fields import Count, Size, check_fields
from kvledger.reference.scheduler.spec_config import SpeculativeConfig

CowReleasePolicy = Literal["if_not_appended", "keep"]
"""What happens to the copy-on-write Mamba slot of the request that stopped an admission round.

* ``if_not_appended`` (SGLang PR #21404, the default): free it only if the request was not appended to
  the batch; an appended request keeps it as its working slot.
* ``keep`` (late 2025): the waiting request keeps it into the next round (a legitimate holder that
  SGLang's idle check did not count: the seed false positive). Under Mamba V2 on a tiny pool the copies
  that waiting requests keep compete with the tracking slots every admission needs; a later match taking
  a slot promised to an earlier request deadlocked the scheduler (found by the V2 oracle and the museum's
  scheduler machine). A round now stops before matching a request whose whole Mamba demand is no longer
  unpromised (``PrefillAdder.room_to_match``). The museum's machine still draws V2 with
  ``if_not_appended`` only.

PR #16067's policy (free it whenever ``add_one_req`` did not return CONTINUE, even when the request was
appended; reverted by #18910) is a bug: it is not a policy here but the museum's exhibit ``#16067``
(``kvledger.museum``), which replaces ``Scheduler._cleanup_stopper`` from outside.
"""

MambaSchedulerStrategy = Literal["no_buffer", "extra_buffer"]
"""SGLang's ``mamba_scheduler_strategy`` for the Mamba radix cache (spec/mamba-v2.md).

* ``no_buffer`` (V1): page size 1; the tree caches the state at the end of each chunk and of the
  prompt (a fork of the working slot) and, at finish, adopts the working slot.
* ``extra_buffer`` (V2, SGLang PR #14792): any page size and the overlap scheduler; each admitted
  request also holds ``k`` ping-pong tracking slots (2 with overlap, 1 without) into which the forward
  captures the state every ``mamba_track_interval`` decoded tokens and once per extend of at least one
  chunk (at the branching point when the match reported one inside the extend); the tree takes a
  tracked state by donation, and only the tracked length is cached.
"""


@dataclass(frozen=True)
class SchedulerConfig:
    page_size: Size = 1
    max_running_requests: Size = 64
    max_prefill_tokens: Size = 16384
    chunked_prefill_size: Size | None = 8192  # None: no chunking
    max_context_len: Size = 4096
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.14
    new_token_ratio_decay: float = (0.7 - 0.14) / 600
    clip_max_new_tokens: Size = 4096
    retract_decode_steps: Count = 20
    overlap: bool = False
    eos_token_id: int | None = None
    cow_release_policy: CowReleasePolicy = "if_not_appended"
    check_every_step: bool = True  # the busy identity after every step (contracts on)
    # Ended requests kept in full in ``Scheduler.requests`` (for inspection, tests and oracles); older
    # ones are dropped so a long run's memory stays flat. Their outcome stays in ``Scheduler.stats``.
    finished_window: Count = 1024
    mamba_scheduler_strategy: MambaSchedulerStrategy = "no_buffer"
    mamba_track_interval: Size = 256  # V2: decode captures a state when the length reaches a multiple
    mamba_chunk_size: Size | None = (
        None  # V2: the kernel's chunk (None: FLA's 64); see mamba_cache_chunk_size
    )
    # Speculative decoding (EAGLE/MTP; None: one token per decode step): spec/speculative.md.
    speculative: SpeculativeConfig | None = None

    @property
    def max_allocated_len(self) -> int:
        """The longest ``kv_allocated_len`` a request may reach: the context length, plus the speculative
        over-allocation's row headroom (I-REQ-LADDER's bound; the rows must be this wide, I-SPEC-ROW)."""
        spec = self.speculative
        extra = 0 if spec is None else spec.row_headroom(self.page_size, self.overlap)
        return self.max_context_len + extra

    @property
    def extra_buffer(self) -> bool:
        return self.mamba_scheduler_strategy == "extra_buffer"

    @property
    def mamba_cache_chunk_size(self) -> int:
        """V2's capture grid in prefill: the kernel chunk or the page, whichever is larger."""
        return mamba_cache_chunk_size(self.mamba_chunk_size, self.page_size)

    @property
    def mamba_ping_pong_size(self) -> int:
        """Tracking slots per admitted request: 0 in V1; in V2 2 with overlap, 1 without."""
        return ping_pong_size(self.extra_buffer, self.overlap)

    def __post_init__(self) -> None:
        check_fields(self)  # every field of its annotated type (ints are not bools or floats), sizes bounded
        if self.page_size < 1:
            raise InvalidArgument(f"page_size must be >= 1, got {self.page_size}")
        if self.max_running_requests < 1 or self.max_prefill_tokens < 1 or self.max_context_len < 1:
            raise InvalidArgument("max_running_requests, max_prefill_tokens and max_context_len must be >= 1")
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < self.page_size:
            raise InvalidArgument(
                f"chunked_prefill_size {self.chunked_prefill_size} must be >= page_size {self.page_size}"
            )
        if self.finished_window < 0:
            raise InvalidArgument(f"finished_window must be >= 0, got {self.finished_window}")
        if self.cow_release_policy not in ("if_not_appended", "keep"):
            raise InvalidArgument(f"unknown cow_release_policy {self.cow_release_policy!r}")
        if not 0.0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1.0:
            raise InvalidArgument("need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1")
        if self.new_token_ratio_decay < 0 or self.clip_max_new_tokens < 1 or self.retract_decode_steps < 0:
            raise InvalidArgument(
                "need new_token_ratio_decay >= 0, clip_max_new_tokens >= 1 and retract_decode_steps >= 0"
            )
        if self.eos_token_id is not None and self.eos_token_id < 0:
            raise InvalidArgument(f"eos_token_id must be a token id >= 0, got {self.eos_token_id}")
        if self.mamba_scheduler_strategy not in ("no_buffer", "extra_buffer"):
            raise InvalidArgument(
                f"unknown mamba_scheduler_strategy {self.mamba_scheduler_strategy!r}:"
                " use 'no_buffer' (V1) or 'extra_buffer' (V2)"
            )
        if self.extra_buffer:
            self._check_extra_buffer()
        if self.extra_buffer and self.overlap and self.speculative is not None:
            steps = self.speculative.max_accept + 1
            if self.mamba_track_interval < 2 * steps:
                # Two consecutive verifies advance up to 2 * (max_accept + 1) tokens; with overlap the second
                # is launched before the first's capture flips the ping-pong index, so both may not capture.
                raise InvalidArgument(
                    f"mamba_track_interval {self.mamba_track_interval} with the overlap scheduler and"
                    f" speculative decoding of up to {steps} tokens a step: two consecutive verifies could"
                    f" both capture into one tracking half; use >= {2 * steps}"
                )

    def _check_extra_buffer(self) -> None:
        """SGLang's checks for extra_buffer (``_validate_mamba_extra_buffer``), and one of kvledger's."""
        ps, interval, chunk = self.page_size, self.mamba_track_interval, self.mamba_chunk_size
        if interval < 1 or interval % ps:
            raise InvalidArgument(
                f"mamba_track_interval {interval} must be a positive multiple of page_size {ps}"
            )
        base = FLA_CHUNK_SIZE if chunk is None else chunk
        if base < 1 or max(base, ps) % min(base, ps):
            raise InvalidArgument(
                f"mamba_chunk_size {base} and page_size {ps}: one must divide the other"
            )
        grid = self.mamba_cache_chunk_size
        if self.chunked_prefill_size is not None and self.chunked_prefill_size < grid:
            raise InvalidArgument(
                f"chunked_prefill_size {self.chunked_prefill_size} is below mamba_cache_chunk_size {grid}:"
                " a chunked prefill would never capture a state"
            )
        if self.overlap and interval < 2:
            # With overlap, batch N+1 is launched before batch N's results flip the ping-pong index, so a
            # capture on two consecutive decode steps would write the half that holds the last state.
            raise InvalidArgument(
                "mamba_track_interval 1 with the overlap scheduler: consecutive decode captures would"
                " overwrite the tracked half before its result flips the ping-pong index; use >= 2"
            )
