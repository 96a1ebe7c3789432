"""PD set-ups for tests: re-exported from ``kvledger.museum.machines.pd_setup`` (the PD machine uses them)."""

from __future__ import annotations

from kvledger.museum.machines.pd_setup import FAST_CHANNEL, build, expected, pd_spec, with_channel

__all__ = ["FAST_CHANNEL", "build", "expected", "pd_spec", "with_channel"]
