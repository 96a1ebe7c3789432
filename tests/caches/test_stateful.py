"""Hypothesis state machines: both caches, page 1 and page > 1, refine the abstract model.

The machines are in ``kvledger/museum/machines/cache.py`` and ``cache_base.py`` (in the package, so
``kvledger hunt`` runs them too; their docstrings list the rules and checks); the model they refine is
``kvledger/museum/machines/cache_model.py``. Each class here narrows one to a cache kind and a page-size
range, so every kind gets its own budget under the ``ci`` profile.
"""

from __future__ import annotations

from kvledger.museum.machines.cache import CacheMachine, MambaCacheMachine
from kvledger.museum.machines.cache_base import RadixCacheMachine


class PlainPage1(RadixCacheMachine):
    PAGE_SIZES = (1,)


class PlainPaged(RadixCacheMachine):
    PAGE_SIZES = (2, 4)


class MambaMachine(MambaCacheMachine):
    """The Mamba radix cache (V1): copy-on-write, checkpoints, tombstone locks (B14) and revival."""


class MambaV2Machine(CacheMachine):
    """Mamba V2 (``extra_buffer``): branching points on every match, and the V2 checkpoint."""

    KINDS = ("mamba_v2",)


class MambaPage1(MambaMachine):
    PAGE_SIZES = (1,)


class MambaPaged(MambaMachine):
    PAGE_SIZES = (2,)


class MambaV2Page1(MambaV2Machine):
    PAGE_SIZES = (1,)


class MambaV2Paged(MambaV2Machine):
    PAGE_SIZES = (4, 16)


TestPlainPage1 = PlainPage1.TestCase
TestPlainPaged = PlainPaged.TestCase
TestMambaPage1 = MambaPage1.TestCase
TestMambaPaged = MambaPaged.TestCase
TestMambaV2Page1 = MambaV2Page1.TestCase
TestMambaV2Paged = MambaV2Paged.TestCase
