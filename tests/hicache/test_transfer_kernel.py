"""``kernels.transfer_slots``: the host tier's copies between two pools' tensors, bit-exact, checked."""

from __future__ import annotations

import pytest
import torch

from kvledger import kernels


def _idx(*ids: int) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64)


def test_copies_raw_bits_between_two_tensors() -> None:
    src = torch.randn(2, 6, 3, 4)
    src[1, 2, 0, 0] = float("nan")
    src[0, 4, 1, 1] = -0.0
    dst = torch.zeros(2, 9, 3, 4)
    kernels.transfer_slots(src, _idx(2, 4, 0), dst, _idx(7, 1, 3))
    bits = torch.int32
    assert torch.equal(dst[:, [7, 1, 3]].view(bits), src[:, [2, 4, 0]].view(bits))
    assert torch.equal(dst[:, [0, 2, 4, 5, 6, 8]], torch.zeros(2, 6, 3, 4))  # nothing else written
    assert torch.equal(
        kernels.fingerprint_slots(dst, _idx(7, 1, 3)), kernels.fingerprint_slots(src, _idx(2, 4, 0))
    )
    kernels.transfer_slots(src, _idx(), dst, _idx())  # empty: a no-op


@pytest.mark.parametrize(
    ("src_idx", "dst", "dst_idx", "error", "match"),
    [
        (_idx(1, 2), torch.zeros(2, 5, 4), _idx(1), ValueError, "2 source slots for 1 targets"),
        (_idx(1, 2), torch.zeros(2, 5, 4), _idx(3, 3), ValueError, "repeated"),
        (_idx(1), torch.zeros(2, 5, 4), _idx(5), ValueError, "outside"),
        (_idx(9), torch.zeros(2, 5, 4), _idx(1), ValueError, "outside"),
        (_idx(1), torch.zeros(3, 5, 4), _idx(1), ValueError, "beyond the slot dim"),
        (_idx(1), torch.zeros(2, 5, 4, dtype=torch.float16), _idx(1), TypeError, "no implicit cast"),
    ],
)
def test_bad_transfers_are_refused_before_anything_is_written(
    src_idx: torch.Tensor, dst: torch.Tensor, dst_idx: torch.Tensor, error: type, match: str
) -> None:
    src = torch.ones(2, 4, 4)
    before = dst.clone()
    with pytest.raises(error, match=match):
        kernels.transfer_slots(src, src_idx, dst, dst_idx)
    assert torch.equal(dst, before)
