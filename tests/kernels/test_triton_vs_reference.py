"""I-KERNEL-REF: each Triton kernel against the torch reference, bit for bit, on Hypothesis-drawn cases.

Runs where the Triton path is live: under ``TRITON_INTERPRET=1`` (set before import, in its own
process: ``TRITON_INTERPRET=1 pytest -m interp tests/kernels``) on CPU tensors, or compiled on a
CUDA device. Interpreter cost is about 1-3 ms per program instance, so cases stay small: at most
5 slots x 3 layers (or 12 tokens) per launch with one feature block, and max_examples around 20.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvledger.kernels as K
from kvledger.contracts.oracle import check_same_bits
from kvledger.kernels import reference as R
from kvledger.kernels._checks import poison_bits

from ._helpers import bits_equal, random_bits, random_values

pytestmark = pytest.mark.interp

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

if K.backend_for(torch.empty(0, device=DEVICE)) != "triton":
    pytest.skip(
        "Triton path inactive: needs TRITON_INTERPRET=1 set before import, or a CUDA device",
        allow_module_level=True,
    )

from kvledger.kernels import triton_impl as T  # noqa: E402  (only importable once triton is known)

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
IDX = [torch.int32, torch.int64]
FAST = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Feature tails include non-powers of two and the empty tail (F = 1); F <= 49 < MIN_BLOCK.
tails = st.lists(st.integers(1, 7), min_size=0, max_size=2).map(tuple)


@pytest.fixture(scope="module")
def device() -> torch.device:
    return DEVICE


@st.composite
def slot_cases(draw, dtypes):
    """(shape, dtype, index dtype, a permutation of the slots, n) with n * L <= 15 programs."""
    layers = draw(st.integers(1, 3))
    slots = draw(st.integers(1, 12))
    perm = draw(st.permutations(range(slots)))
    n = draw(st.integers(0, min(5, slots)))
    return (layers, slots, *draw(tails)), draw(st.sampled_from(dtypes)), draw(st.sampled_from(IDX)), perm, n


def _idx(values, dtype, device):
    return torch.tensor(list(values), dtype=dtype, device=device)


@FAST
@given(case=slot_cases([*FLOATS, torch.int32]), seed=st.integers(0, 2**31), data=st.data())
def test_copy_slots(device, case, seed, data):
    shape, dtype, idx_dtype, perm, n = case
    n = min(n, shape[1] // 2)
    dst = perm[:n]
    rest = perm[n:]
    src = [data.draw(st.sampled_from(rest)) for _ in range(n)]  # repeats allowed: fork one state
    a = random_bits(shape, dtype, seed).to(device)
    b = a.clone()
    K.copy_slots(a, _idx(src, idx_dtype, device), _idx(dst, idx_dtype, device))
    R.copy_slots(b, _idx(src, idx_dtype, device), _idx(dst, idx_dtype, device))
    check_same_bits("copy_slots", a, b)


@FAST
@given(case=slot_cases([*FLOATS, torch.int32]), seed=st.integers(0, 2**31), poison=st.booleans())
def test_zero_and_poison_slots(device, case, seed, poison):
    shape, dtype, idx_dtype, perm, n = case
    a = random_bits(shape, dtype, seed).to(device)
    b = a.clone()
    idx = _idx(perm[:n], idx_dtype, device)
    if poison:
        K.poison_slots(a, idx)
        R.poison_slots(b, idx)
    else:
        K.zero_slots(a, idx)
        R.zero_slots(b, idx)
    check_same_bits("poison_slots" if poison else "zero_slots", a, b)


@FAST
@given(
    case=slot_cases([*FLOATS, torch.float64, torch.float8_e4m3fn, torch.int32, torch.int8]),
    seed=st.integers(0, 2**31),
    raw=st.booleans(),
    data=st.data(),
)
def test_poison_detection(device, case, seed, raw, data):
    shape, dtype, idx_dtype, perm, n = case
    # raw: random bit patterns, so NaNs of every payload and sign (the kernel tests NaN on bits)
    state = random_bits(shape, dtype, seed) if raw else random_values(shape, dtype, seed)
    query = list(perm[:n])
    if n >= 2 and data.draw(st.booleans()):
        query[-1] = query[0]  # reads may repeat a slot
    # Some queried slots fully poisoned, some with single poisoned elements or infinities (not NaN).
    full = sorted({s for s in query if data.draw(st.booleans())})
    R.poison_slots(state, torch.tensor(full, dtype=torch.int64))
    for slot in data.draw(st.lists(st.sampled_from(perm), max_size=3)):
        layer = data.draw(st.integers(0, shape[0] - 1))
        state[layer, slot].view(-1)[0] = K.poison_value(dtype)
    if dtype.is_floating_point:
        for slot in data.draw(st.lists(st.sampled_from(perm), max_size=2)):
            state[0, slot].view(-1)[-1] = data.draw(st.sampled_from([math.inf, -math.inf]))
    for slot in data.draw(st.lists(st.sampled_from(perm), max_size=2)):
        state[shape[0] - 1, slot].view(-1)[-1] = 1  # un-poison one element of a poisoned slot
    state = state.to(device)
    idx = _idx(query, idx_dtype, device)
    assert torch.equal(K.poisoned_mask(state, idx).cpu(), R.poisoned_mask(state, idx).cpu())
    assert torch.equal(K.any_poisoned(state, idx).cpu(), R.any_poisoned(state, idx).cpu())


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32]
)
def test_poison_detection_every_width(device, dtype):
    """Deterministic: each element width's sign/zero extension path, one full and one partial slot."""
    state = random_values((2, 4, 3), dtype, 5)
    R.poison_slots(state, torch.tensor([1, 2]))
    state[1, 2, 1] = 3
    state = state.to(device)
    idx = _idx([0, 1, 2, 3], torch.int32, device)
    assert K.poisoned_mask(state, idx).tolist() == [False, True, False, False]
    assert K.any_poisoned(state, idx).tolist() == [False, True, True, False]


@FAST
@given(
    case=slot_cases([*FLOATS, torch.float8_e4m3fn, torch.int32, torch.int64]),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_fingerprint_slots(device, case, seed, data):
    shape, dtype, idx_dtype, perm, n = case
    state = random_bits(shape, dtype, seed).to(device)
    query = data.draw(st.lists(st.sampled_from(perm), min_size=n, max_size=n))
    idx = _idx(query, idx_dtype, device)
    got = K.fingerprint_slots(state, idx)
    assert got.dtype == torch.int64 and got.device == state.device
    assert torch.equal(got.cpu(), R.fingerprint_slots(state.cpu(), idx.cpu()))


@FAST
@given(
    layers=st.integers(1, 3),
    slots=st.integers(1, 12),
    heads=st.integers(1, 3),
    dims=st.tuples(st.integers(1, 7), st.integers(1, 7)),
    dtype=st.sampled_from(FLOATS),
    idx_dtype=st.sampled_from(IDX),
    strided_k=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_store_kv(device, layers, slots, heads, dims, dtype, idx_dtype, strided_k, seed, data):
    dk, dv = dims
    loc = data.draw(st.permutations(range(slots)))[: data.draw(st.integers(0, slots))]
    layer = data.draw(st.integers(0, layers - 1))
    kb = random_bits((layers, slots, heads, dk), dtype, seed).to(device)
    vb = random_bits((layers, slots, heads, dv), dtype, seed + 1).to(device)
    if strided_k:  # k sliced out of a fused qkv projection output: row stride larger than H * D
        fused = random_bits((len(loc), heads * dk + 5), dtype, seed + 2).to(device)
        k = fused[:, 2 : 2 + heads * dk].view(len(loc), heads, dk)
    else:
        k = random_bits((len(loc), heads, dk), dtype, seed + 2).to(device)
    v = random_bits((len(loc), heads, dv), dtype, seed + 3).to(device)
    kr, vr = kb.clone(), vb.clone()
    loc_t = _idx(loc, idx_dtype, device)
    K.store_kv(kb, vb, layer, loc_t, k, v)
    R.store_kv(kr, vr, layer, loc_t, k, v)
    check_same_bits("store_kv (K)", kb, kr)
    check_same_bits("store_kv (V)", vb, vr)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layers=st.integers(1, 2),
    slots=st.integers(3, 6),
    features=st.integers(9, 31),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**31),
)
def test_multi_block_masking(device, layers, slots, features, dtype, seed):
    """Block 8 splits F into 2-4 blocks (the last one partial): exercises the masks and the folds."""
    state = random_values((layers, slots, features), dtype, seed).to(device)  # no NaN: poison is exact
    ref = state.clone()
    src, dst = _idx([0], torch.int64, device), _idx([2], torch.int32, device)
    T.copy_slots(state, src, dst, block=8)
    R.copy_slots(ref, src, dst)
    check_same_bits("copy_slots, block 8", state, ref)
    one = _idx([1], torch.int64, device)
    T.fill_slots(state, one, poison_bits(dtype), block=8)
    R.poison_slots(ref, one)
    check_same_bits("fill_slots (poison), block 8", state, ref)
    state[layers - 1, 1, features - 1] = 0.0  # the one clean element sits in the last partial block
    ref[layers - 1, 1, features - 1] = 0.0
    both = _idx([1, 2], torch.int64, device)
    all_p, any_p = T.match_slots(state, both, block=8)
    assert all_p.tolist() == R.poisoned_mask(ref, both).tolist() == [False, False]
    assert any_p.tolist() == R.any_poisoned(ref, both).tolist() == [True, False]
    assert torch.equal(
        T.fingerprint_slots(state, both, block=8).cpu(), R.fingerprint_slots(ref.cpu(), both.cpu())
    )


def test_empty_and_single_index(device):
    state = random_bits((2, 4, 3), torch.float32, 7).to(device)
    before = state.clone()
    empty = torch.empty(0, dtype=torch.int64, device=device)
    K.copy_slots(state, empty, empty)
    K.zero_slots(state, empty)
    K.poison_slots(state, empty)
    assert bits_equal(state, before)
    assert K.poisoned_mask(state, empty).shape == (0,)
    assert K.any_poisoned(state, empty).shape == (0,)
    assert K.fingerprint_slots(state, empty).shape == (0,)
    one = torch.tensor([3], dtype=torch.int32, device=device)
    assert torch.equal(K.fingerprint_slots(state, one).cpu(), R.fingerprint_slots(state.cpu(), one.cpu()))


def test_host_checks_reject_before_launch(device):
    """Out-of-range indices must never reach a kernel: the interpreter would read garbage silently."""
    state = torch.zeros(2, 4, 3, device=device)
    with pytest.raises(ValueError, match="outside"):
        K.fingerprint_slots(state, torch.tensor([4], device=device))
    with pytest.raises(ValueError, match="overlap"):
        K.copy_slots(state, torch.tensor([0, 1], device=device), torch.tensor([1, 2], device=device))
    with pytest.raises(ValueError, match="repeated"):
        K.poison_slots(state, torch.tensor([1, 1], device=device))
    assert not state.any()


def test_non_contiguous_slot_window(device):
    big = random_bits((2, 10, 3, 5), torch.float16, 11).to(device)
    ref = big.clone()
    K.copy_slots(big[:, 2:9], _idx([0, 1], torch.int64, device), _idx([5, 6], torch.int64, device))
    R.copy_slots(ref[:, 2:9], _idx([0, 1], torch.int64, device), _idx([5, 6], torch.int64, device))
    check_same_bits("copy_slots on a slot window", big, ref)
