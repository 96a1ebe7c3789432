"""The size bounds of ``kvledger/reference/config_fields.py``: every size field names itself and its bound
when refused, and what cannot be allocated is a typed error, not a RuntimeError or a killed process."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvledger.contracts.errors import InvalidArgument, SizeOutOfRange
from kvledger.reference.config_fields import MAX_SIZE, Bounds, allocating, check_fields, check_fits_memory
from kvledger.reference.disagg import ChannelConfig, PDSpec
from kvledger.reference.engine import EngineSpec
from kvledger.reference.scheduler import SchedulerConfig

CONFIGS = (EngineSpec, SchedulerConfig, ChannelConfig, PDSpec)


def _size_fields(cls: type) -> list[tuple[str, Bounds]]:
    from kvledger.reference.config_fields import _bounds, _hints

    return [(f.name, b) for f in dataclasses.fields(cls) if (b := _bounds(_hints(cls)[f.name])) is not None]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_size_field_is_refused_one_past_its_bound_naming_it(cls: type) -> None:
    fields = _size_fields(cls)
    assert fields, f"{cls.__name__} declares no bounded size"
    for name, bounds in fields:
        assert bounds.high == MAX_SIZE
        with pytest.raises(SizeOutOfRange, match=rf"{cls.__name__}\.{name} must be at most {MAX_SIZE}"):
            cls(**{name: MAX_SIZE + 1})
        with pytest.raises(InvalidArgument, match=rf"{cls.__name__}\.{name} must be"):
            cls(**{name: bounds.low - 1})


def test_the_issue_s_sizes_are_bounded() -> None:
    """Issue 22: 2**70 was accepted for these."""
    for make in (
        lambda: EngineSpec(mamba_chunk_size=2**70),
        lambda: EngineSpec(mamba_track_interval=2**70),
        lambda: ChannelConfig(latency=2**70),
        lambda: PDSpec(reserved_decode_tokens=2**70),
    ):
        with pytest.raises(SizeOutOfRange):
            make()


def test_a_dataclass_without_bounds_is_only_type_checked() -> None:
    @dataclasses.dataclass
    class Plain:
        n: int = 2**70

    check_fields(Plain())  # no Bounds: any int


def test_allocating_types_allocation_failures_and_passes_other_errors_through() -> None:
    with pytest.raises(SizeOutOfRange, match="pool: its tensors cannot be allocated"), allocating("pool"):
        torch.zeros((2**31 - 1, 2**31 - 1, 4))  # "Storage size calculation overflowed"
    with pytest.raises(SizeOutOfRange, match="not enough memory"), allocating("pool"):
        raise MemoryError
    with pytest.raises(RuntimeError, match="unrelated"), allocating("pool"):
        raise RuntimeError("unrelated")


def test_what_the_machine_cannot_hold_is_refused_before_allocating() -> None:
    with pytest.raises(SizeOutOfRange, match="needs at least"):
        check_fits_memory(2**70, "a pool")
    check_fits_memory(1, "a pool")
