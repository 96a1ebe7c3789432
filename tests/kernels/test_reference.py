"""Semantics of the torch reference kernels (the contract the Triton kernels are checked against).

Oracles here are independent of the implementation: per-pair Python loops for copies and stores,
and a pure-Python-int evaluation of the documented fingerprint formula.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import kvledger.kernels as K
from kvledger.contracts.errors import ContractViolation
from kvledger.contracts.oracle import check_same_bits
from kvledger.kernels import reference as R
from kvledger.kernels._checks import nan_rule

from ._helpers import as_bits, bits_equal, random_bits, random_values

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
ALL_DTYPES = [*FLOATS, torch.float64, torch.int32, torch.int64, torch.int16, torch.int8]
IDX = [torch.int32, torch.int64]

shapes = st.tuples(
    st.integers(1, 3),
    st.integers(1, 8),
    st.lists(st.integers(1, 5), min_size=0, max_size=2).map(tuple),
)


# ----------------------------------------------------------------------------- fingerprint oracle

MASK64 = (1 << 64) - 1


def _fmix64(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK64
    return x ^ (x >> 33)


def _oracle_fingerprint(state: torch.Tensor, slot: int) -> int:
    """The documented definition, evaluated with Python's unbounded ints (no wrap-around tricks)."""
    width = 8 * state.element_size()
    bits = as_bits(state[:, slot]).reshape(state.shape[0], -1)
    total = 0
    pos = 0
    for row in bits.tolist():
        for b in row:
            key = ((pos + 1) * 0x9E3779B97F4A7C15) & MASK64
            total = (total + _fmix64((b & ((1 << width) - 1)) ^ key)) & MASK64
            pos += 1
    return total - (1 << 64) if total >= 1 << 63 else total


@settings(deadline=None)
@given(shape=shapes, dtype=st.sampled_from(ALL_DTYPES), seed=st.integers(0, 2**31))
def test_fingerprint_matches_pure_python_definition(shape, dtype, seed):
    layers, slots, tail = shape
    state = random_bits((layers, slots, *tail), dtype, seed)
    got = R.fingerprint_slots(state, torch.arange(slots))
    assert got.dtype == torch.int64 and got.shape == (slots,)
    assert got.tolist() == [_oracle_fingerprint(state, s) for s in range(slots)]


def _fp(state: torch.Tensor, slot: int) -> int:
    return int(R.fingerprint_slots(state, torch.tensor([slot]))[0])


@settings(deadline=None)
@given(
    shape=shapes,
    dtype=st.sampled_from(ALL_DTYPES),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_fingerprint_changes_on_any_single_bit_flip(shape, dtype, seed, data):
    layers, slots, tail = shape
    state = random_bits((layers, slots, *tail), dtype, seed)
    slot = data.draw(st.integers(0, slots - 1))
    flat = as_bits(state[:, slot]).reshape(-1)  # a copy: the slot is not contiguous over layers
    elem = data.draw(st.integers(0, flat.numel() - 1))
    bit = data.draw(st.integers(0, 8 * state.element_size() - 1))
    before = _fp(state, slot)
    flipped = flat.clone()
    flipped[elem] = flipped[elem] ^ torch.tensor(1, dtype=flat.dtype).bitwise_left_shift(bit)
    state[:, slot] = flipped.view(state.dtype).reshape(state[:, slot].shape)
    assert _fp(state, slot) != before


@settings(deadline=None)
@given(shape=shapes, dtype=st.sampled_from(ALL_DTYPES), seed=st.integers(0, 2**31), data=st.data())
def test_fingerprint_changes_when_two_different_elements_swap(shape, dtype, seed, data):
    layers, slots, tail = shape
    state = random_bits((layers, slots, *tail), dtype, seed)
    slot = data.draw(st.integers(0, slots - 1))
    flat = as_bits(state[:, slot]).reshape(-1).clone()
    assume(flat.numel() >= 2)
    i = data.draw(st.integers(0, flat.numel() - 1))
    j = data.draw(st.integers(0, flat.numel() - 1).filter(lambda j: j != i))
    assume(int(flat[i]) != int(flat[j]))
    before = _fp(state, slot)
    flat[[i, j]] = flat[[j, i]]
    state[:, slot] = flat.view(state.dtype).reshape(state[:, slot].shape)
    assert _fp(state, slot) != before


@pytest.mark.parametrize("dtype", [*FLOATS, torch.float64])
def test_fingerprint_distinguishes_nan_payloads_and_signed_zero(dtype):
    a = torch.zeros(2, 3, 4, dtype=dtype)
    b = a.clone()
    b[1, 1, 2] = -0.0
    assert _fp(a, 1) != _fp(b, 1)
    assert bool(torch.equal(a, b))  # the point: value equality cannot see it, the fingerprint does
    a[1, 1, 2] = math.nan
    b_bits = as_bits(a).clone()
    b_bits[1, 1, 2] = b_bits[1, 1, 2] + 1  # canonical quiet NaN + 1: still a NaN, another payload
    b = b_bits.view(dtype)
    assert torch.isnan(b[1, 1, 2])
    assert _fp(a, 1) != _fp(b, 1)


def test_fingerprint_is_position_sensitive_across_layers():
    state = torch.zeros(2, 2, 3)
    state[0, 0, 1] = 1.0
    moved = torch.zeros(2, 2, 3)
    moved[1, 0, 1] = 1.0
    assert _fp(state, 0) != _fp(moved, 0)


@settings(deadline=None)
@given(shape=shapes, dtype=st.sampled_from(ALL_DTYPES), seed=st.integers(0, 2**31))
def test_copy_preserves_fingerprint_and_untouched_slots(shape, dtype, seed):
    layers, slots, tail = shape
    assume(slots >= 2)
    state = random_bits((layers, slots, *tail), dtype, seed)
    before = R.fingerprint_slots(state, torch.arange(slots))
    R.copy_slots(state, torch.tensor([0]), torch.tensor([slots - 1]))
    after = R.fingerprint_slots(state, torch.arange(slots))
    assert int(after[slots - 1]) == int(before[0])
    assert torch.equal(after[:-1], before[:-1])


# --------------------------------------------------------------------------------------- copies


@st.composite
def copy_cases(draw, dtypes=ALL_DTYPES):
    layers, slots, tail = draw(shapes)
    perm = draw(st.permutations(range(slots)))
    n = draw(st.integers(0, slots // 2))
    dst = perm[:n]
    sources = perm[n:]
    src = [draw(st.sampled_from(sources)) for _ in range(n)] if sources else []
    return (layers, slots, tail), draw(st.sampled_from(dtypes)), src, dst, draw(st.sampled_from(IDX))


@settings(deadline=None)
@given(case=copy_cases(), seed=st.integers(0, 2**31))
def test_copy_slots_matches_loop_oracle(case, seed):
    (layers, slots, tail), dtype, src, dst, idx_dtype = case
    state = random_bits((layers, slots, *tail), dtype, seed)
    expected = state.clone()
    for s, d in zip(src, dst, strict=True):
        for layer in range(layers):
            expected[layer, d] = state[layer, s]
    R.copy_slots(state, torch.tensor(src, dtype=idx_dtype), torch.tensor(dst, dtype=idx_dtype))
    assert bits_equal(state, expected)


@pytest.mark.parametrize(
    ("src", "dst", "match"),
    [
        ([0, 1], [2], "length"),
        ([0, 1], [2, 2], "repeated"),
        ([0, 1], [1, 2], "overlap"),
        ([0], [0], "overlap"),
        ([0], [8], "outside"),
        ([-1], [2], "outside"),
    ],
)
def test_copy_slots_rejects_racy_or_out_of_range_arguments(src, dst, match):
    state = torch.arange(2 * 8 * 3, dtype=torch.float32).view(2, 8, 3)
    before = state.clone()
    with pytest.raises(ValueError, match=match):
        R.copy_slots(state, torch.tensor(src), torch.tensor(dst))
    with pytest.raises(ValueError, match=match):
        K.copy_slots(state, torch.tensor(src), torch.tensor(dst))
    assert torch.equal(state, before)


@pytest.mark.parametrize(
    "bad_index",
    [torch.tensor([0.0]), torch.tensor([[0]]), torch.tensor([0], dtype=torch.int16)],
)
def test_index_tensors_must_be_1d_int32_or_int64(bad_index):
    state = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError):
        R.zero_slots(state, bad_index)
    with pytest.raises(ValueError):
        R.copy_slots(state, bad_index, torch.tensor([3]))


# ------------------------------------------------------------------------------- zero and poison


@settings(deadline=None)
@given(case=copy_cases(dtypes=[*FLOATS, torch.int32, torch.int64, torch.int8]), seed=st.integers(0, 2**31))
def test_zero_and_poison_touch_exactly_the_given_slots(case, seed):
    (layers, slots, tail), dtype, _, chosen, idx_dtype = case
    state = random_values((layers, slots, *tail), dtype, seed)
    others = [s for s in range(slots) if s not in chosen]
    idx = torch.tensor(chosen, dtype=idx_dtype)
    untouched = state[:, others].clone()

    R.poison_slots(state, idx)
    assert R.poisoned_mask(state, idx).all()
    assert R.any_poisoned(state, idx).all()
    assert not R.any_poisoned(state, torch.tensor(others, dtype=torch.int64)).any()
    assert bits_equal(state[:, others], untouched)
    if chosen and dtype.is_floating_point:
        assert torch.isnan(state[:, chosen].float()).all()
    elif chosen:
        assert (state[:, chosen] == torch.iinfo(dtype).min).all()

    R.zero_slots(state, idx)
    assert not R.any_poisoned(state, idx).any()
    assert (as_bits(state[:, chosen]) == 0).all()  # all-zero bits: +0.0, not -0.0
    assert bits_equal(state[:, others], untouched)


@pytest.mark.parametrize("dtype", [*FLOATS, torch.int32])
def test_partially_poisoned_slot_is_any_but_not_all(dtype):
    state = torch.ones(3, 4, 2, 3, dtype=dtype)
    slots = torch.tensor([0, 1, 2, 3])
    R.poison_slots(state, torch.tensor([1, 2]))
    state[2, 1, 1, 2] = 7  # one clean element in the last layer of slot 1
    state[1, 3, 0, 0] = K.poison_value(dtype)  # one poisoned element in slot 3
    assert R.poisoned_mask(state, slots).tolist() == [False, False, True, False]
    assert R.any_poisoned(state, slots).tolist() == [False, True, True, True]


@pytest.mark.parametrize("dtype", FLOATS)
def test_any_nan_payload_counts_as_poison(dtype):
    state = torch.zeros(1, 2, 4, dtype=dtype)
    bits = as_bits(state)
    bits[0, 1] = as_bits(torch.full((4,), math.nan, dtype=dtype)) + 1  # non-canonical NaNs
    assert torch.isnan(state[0, 1]).all()
    assert R.poisoned_mask(state, torch.tensor([0, 1])).tolist() == [False, True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_bit_rule_agrees_with_isnan(dtype):
    """The kernels' bit test for NaN, checked on random patterns (<= 16-bit formats self-verify)."""
    abs_mask, nan_above = nan_rule(dtype)
    values = random_bits((200_000,), dtype, 3)
    assert torch.isnan(values).any() and not torch.isnan(values).all()
    assert torch.equal(torch.isnan(values), (as_bits(values).to(torch.int64) & abs_mask) > nan_above)


def test_nan_rule_rejects_fnuz_fp8():
    with pytest.raises(TypeError):
        K.poison_value(torch.float8_e4m3fnuz)


def test_poison_value_per_dtype():
    assert math.isnan(K.poison_value(torch.bfloat16))
    assert K.poison_value(torch.int32) == -(2**31)
    assert K.poison_value(torch.int8) == -128
    for dtype in (torch.uint8, torch.bool):
        with pytest.raises(TypeError):
            K.poison_value(dtype)
    with pytest.raises(TypeError):
        R.poison_slots(torch.zeros(1, 2, 3, dtype=torch.uint8), torch.tensor([0]))


def test_fill_requires_distinct_slots():
    state = torch.zeros(1, 4, 2)
    with pytest.raises(ValueError, match="repeated"):
        R.zero_slots(state, torch.tensor([1, 1]))


# ---------------------------------------------------------------------------------------- store_kv


@settings(deadline=None)
@given(
    layers=st.integers(1, 3),
    slots=st.integers(1, 10),
    heads=st.integers(1, 3),
    dims=st.tuples(st.integers(1, 6), st.integers(1, 6)),
    dtype=st.sampled_from(FLOATS),
    idx_dtype=st.sampled_from(IDX),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_store_kv_matches_loop_oracle(layers, slots, heads, dims, dtype, idx_dtype, seed, data):
    dk, dv = dims
    perm = data.draw(st.permutations(range(slots)))
    loc = perm[: data.draw(st.integers(0, slots))]
    layer = data.draw(st.integers(0, layers - 1))
    kb = random_bits((layers, slots, heads, dk), dtype, seed)
    vb = random_bits((layers, slots, heads, dv), dtype, seed + 1)
    k = random_bits((len(loc), heads, dk), dtype, seed + 2)
    v = random_bits((len(loc), heads, dv), dtype, seed + 3)
    ek, ev = kb.clone(), vb.clone()
    for t, s in enumerate(loc):
        ek[layer, s] = k[t]
        ev[layer, s] = v[t]
    R.store_kv(kb, vb, layer, torch.tensor(loc, dtype=idx_dtype), k, v)
    assert bits_equal(kb, ek) and bits_equal(vb, ev)


def test_store_kv_rejects_bad_arguments():
    kb, vb = torch.zeros(2, 6, 2, 4), torch.zeros(2, 6, 2, 4)
    k = torch.ones(2, 2, 4)
    loc = torch.tensor([1, 3])
    with pytest.raises(ValueError, match="cast"):
        R.store_kv(kb, vb, 0, loc, k.half(), k)
    with pytest.raises(ValueError, match="repeated"):
        R.store_kv(kb, vb, 0, torch.tensor([3, 3]), k, k)
    with pytest.raises(ValueError, match="layer"):
        R.store_kv(kb, vb, 2, loc, k, k)
    with pytest.raises(ValueError, match="layer"):
        R.store_kv(kb, vb, -1, loc, k, k)
    with pytest.raises(ValueError, match="shape"):
        R.store_kv(kb, vb, 0, loc, k[:, :1], k)
    with pytest.raises(ValueError, match="outside"):
        R.store_kv(kb, vb, 0, torch.tensor([1, 6]), k, k)
    assert not kb.any() and not vb.any()


# ----------------------------------------------------------------------------- layouts and empties


def test_empty_indices_are_noops():
    state = random_values((2, 5, 3), torch.float32, 0)
    before = state.clone()
    empty = torch.empty(0, dtype=torch.int64)
    for fn in (R.zero_slots, R.poison_slots, K.zero_slots, K.poison_slots):
        fn(state, empty)
    R.copy_slots(state, empty, empty)
    K.copy_slots(state, empty, empty)
    assert torch.equal(state, before)
    for mask_fn in (R.poisoned_mask, R.any_poisoned, K.poisoned_mask, K.any_poisoned):
        out = mask_fn(state, empty)
        assert out.dtype == torch.bool and out.shape == (0,)
    fps = R.fingerprint_slots(state, empty)
    assert fps.dtype == torch.int64 and fps.shape == (0,)
    kb = torch.zeros(2, 5, 1, 2)
    R.store_kv(kb, kb.clone(), 1, empty, torch.empty(0, 1, 2), torch.empty(0, 1, 2))
    assert not kb.any()


def test_slice_of_a_bigger_buffer_is_written_in_place():
    big = torch.zeros(2, 10, 3, 4)
    window = big[:, 4:8]  # layer stride 120, slot stride 12: not contiguous overall
    assert not window.is_contiguous()
    R.poison_slots(window, torch.tensor([1]))
    assert torch.isnan(big[:, 5]).all() and not torch.isnan(big[:, [4, 6, 7]]).any()
    assert R.poisoned_mask(window, torch.tensor([0, 1])).tolist() == [False, True]


def test_feature_tail_that_cannot_flatten_in_place_is_rejected():
    state = torch.zeros(2, 4, 3, 5).transpose(2, 3)
    with pytest.raises(ValueError, match="feature tail"):
        R.zero_slots(state, torch.tensor([0]))
    with pytest.raises(ValueError):
        R.zero_slots(torch.zeros(4), torch.tensor([0]))


# ------------------------------------------------------------------------------------- dispatcher


def test_backend_choice_follows_device_and_interpret_flag():
    cpu = torch.zeros(1)
    assert K.backend_for(cpu) == ("triton" if K.HAVE_TRITON and K.INTERPRET else "torch")
    if torch.cuda.is_available():
        assert K.backend_for(cpu.cuda()) == ("triton" if K.HAVE_TRITON else "torch")


@settings(deadline=None)
@given(case=copy_cases(dtypes=[torch.float32, torch.bfloat16, torch.int32]), seed=st.integers(0, 2**31))
def test_public_api_agrees_with_reference_on_cpu(case, seed):
    """On CPU without the interpreter this is the torch path; with it, a cheap extra cross-check."""
    (layers, slots, tail), dtype, src, dst, idx_dtype = case
    a = random_bits((layers, slots, *tail), dtype, seed)
    b = a.clone()
    s, d = torch.tensor(src, dtype=idx_dtype), torch.tensor(dst, dtype=idx_dtype)
    K.copy_slots(a, s, d)
    R.copy_slots(b, s, d)
    K.poison_slots(a, s.unique())
    R.poison_slots(b, s.unique())
    assert bits_equal(a, b)
    every = torch.arange(slots)
    assert torch.equal(K.fingerprint_slots(a, every), R.fingerprint_slots(b, every))
    assert torch.equal(K.poisoned_mask(a, every), R.poisoned_mask(b, every))
    assert torch.equal(K.any_poisoned(a, every), R.any_poisoned(b, every))


# ----------------------------------------------------------------------------- the comparison is not vacuous
@pytest.mark.fires("I-KERNEL-REF")
@pytest.mark.parametrize("what", ["a dropped slot", "a flipped NaN payload", "a wrong dtype"])
def test_kernel_ref_check_catches_a_kernel_that_differs(what: str) -> None:
    """The bit-for-bit comparison the Triton tests run (``check_same_bits``) names every kind of drift."""
    state = random_bits((2, 5, 3), torch.float32, 3)
    reference = state.clone()
    src, dst = torch.tensor([0, 1]), torch.tensor([3, 4])
    R.copy_slots(reference, src, dst)
    got = state.clone()
    if what == "a dropped slot":
        R.copy_slots(got, src[:1], dst[:1])
    elif what == "a flipped NaN payload":
        R.copy_slots(got, src, dst)
        got.view(torch.int32)[0, 3, 0] ^= 1  # one bit: a different value, or a NaN with another payload
    else:
        R.copy_slots(got, src, dst)
        got = got.to(torch.float64)
    check_same_bits("reference vs itself", reference, reference.clone())
    with pytest.raises(ContractViolation, match=r"I-KERNEL-REF: copy_slots: "):
        check_same_bits("copy_slots", got, reference)
