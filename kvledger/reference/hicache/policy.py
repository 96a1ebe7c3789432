"""SGLang's three write policies (``--hicache-write-policy``), as data.

* ``write_through``: a node is backed up to the host as soon as it is cached (hit count >= 1);
* ``write_through_selective``: once it was hit twice (SGLang sets ``write_through_threshold`` to 2);
* ``write_back``: only when its device KV is evicted (the backup is the eviction's last step before the
  device slots are freed).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvledger.contracts.errors import InvalidArgument

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")


@dataclass(frozen=True)
class WritePolicy:
    """When a cached node's KV is copied to the host tier."""

    name: str = "write_through"

    def __post_init__(self) -> None:
        if self.name not in WRITE_POLICIES:
            raise InvalidArgument(f"hicache write policy must be one of {WRITE_POLICIES}, got {self.name!r}")

    @property
    def write_through_threshold(self) -> int | None:
        """Hits after which a node is backed up at insert or match (None: never, write-back)."""
        return {"write_through": 1, "write_through_selective": 2}.get(self.name)

    @property
    def is_write_back(self) -> bool:
        return self.name == "write_back"
