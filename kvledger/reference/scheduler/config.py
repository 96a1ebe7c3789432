"""Scheduler knobs, with SGLang's names and defaults where they exist."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvledger.contracts.errors import InvalidArgument

CowReleasePolicy = Literal["if_not_appended", "keep", "on_failure"]
"""What happens to the copy-on-write Mamba slot of the request that stopped an admission round.

* ``if_not_appended`` (SGLang PR #21404, the default): free it only if the request was not appended to
  the batch; an appended request keeps it as its working slot.
* ``keep`` (late 2025): the waiting request keeps it into the next round (a legitimate holder that
  SGLang's idle check did not count: the seed false positive).
* ``on_failure`` (PR #16067, reverted by #18910): free it whenever ``add_one_req`` did not return
  CONTINUE, even when the request was appended. A bug, kept so a test can show the ledger catching it.
"""


@dataclass(frozen=True)
class SchedulerConfig:
    page_size: int = 1
    max_running_requests: int = 64
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = 8192  # None: no chunking
    max_context_len: int = 4096
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.14
    new_token_ratio_decay: float = (0.7 - 0.14) / 600
    clip_max_new_tokens: int = 4096
    retract_decode_steps: int = 20
    overlap: bool = False
    eos_token_id: int | None = None
    cow_release_policy: CowReleasePolicy = "if_not_appended"
    check_every_step: bool = True  # the busy identity after every step (contracts on)
    # Ended requests kept in full in ``Scheduler.requests`` (for inspection, tests and oracles); older
    # ones are dropped so a long run's memory stays flat. Their outcome stays in ``Scheduler.stats``.
    finished_window: int = 1024

    def __post_init__(self) -> None:
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
        if self.cow_release_policy not in ("if_not_appended", "keep", "on_failure"):
            raise InvalidArgument(f"unknown cow_release_policy {self.cow_release_policy!r}")
        if not 0.0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1.0:
            raise InvalidArgument("need 0 <= min_new_token_ratio <= init_new_token_ratio <= 1")
