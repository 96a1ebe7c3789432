"""What an engine's loader returns: the release it imported and the classes its builders and attach use.

One record for every engine (``engines/sglang/loader.py``, ``engines/vllm/loader.py``); each engine's
subclass adds what only it has (SGLang: which trees the release ships).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineModules:
    """An imported engine release: its version and location, the import time, the stand-in modules it
    needed on CPU, and its classes by name (``modules.KVCacheManager`` reads ``classes``)."""

    version: str
    location: str
    import_seconds: float
    standins: list[str]
    classes: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["classes"][name]
        except KeyError:
            raise AttributeError(name) from None
