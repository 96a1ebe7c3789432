"""The slot fingerprint: its constants and its torch formulation.

Definition (the Triton kernel reproduces it bit-exactly; tests pin it against pure Python ints)::

    bits(e)  = the element's raw bits as an unsigned integer of its own width (fp32 -> 32 bits,
               bf16/fp16 -> 16 bits, ...), zero-extended to 64 bits
    pos(e)   = l * F + f for the element at layer l and flattened feature offset f of the slot
    h(e)     = fmix64(bits(e) XOR ((pos(e) + 1) * PHI))
    fp(slot) = sum of h(e) over all L * F elements, modulo 2**64, as a signed int64

``fmix64`` is MurmurHash3's 64-bit finaliser (``x ^= x >> 33; x *= M1; x ^= x >> 33; x *= M2;
x ^= x >> 33``, logical shifts). For a fixed position, ``h`` is a bijection of the bits (XOR with a
constant, odd multiplications and xor-shifts are all invertible mod 2**64), so changing any single
element always changes the sum: bit flips, NaN payloads and -0.0 vs 0.0 are guaranteed to be
seen. Mixing the position in before the finaliser makes a swap of two different elements change
the sum except with probability about 2**-64.

Why this shape: every step is int64 wrap-around arithmetic that torch (CPU and CUDA), the Triton
compiler and the Triton interpreter (numpy) all perform identically, and addition mod 2**64 is
associative and commutative, so the order of the reduction (per program, then across programs)
cannot change the result. Logical shifts are written as an arithmetic shift followed by a mask,
because ``>>`` on signed int64 is arithmetic in all three, and an unmasked arithmetic xor-shift
would not be invertible. Constants are given as signed int64 so that no backend promotes to uint64.
The fingerprint does not depend on the slot's index, so a copied slot has its source's fingerprint.
"""

from __future__ import annotations

import numpy as np
import torch

# 0x9E3779B97F4A7C15 (golden ratio), 0xFF51AFD7ED558CCD and 0xC4CEB9FE1A85EC53 (MurmurHash3
# fmix64), each as the signed int64 with the same bits.
PHI = -7046029254386353131
M1 = -49064778989728563
M2 = -4265267296055464877
SHIFT = 33
LOW_MASK = (1 << (64 - SHIFT)) - 1  # keeps the bits a logical right shift by SHIFT would keep


def width_mask(element_size: int) -> int:
    """The mask that zero-extends a sign-extended element of ``element_size`` bytes (-1: none)."""
    return -1 if element_size == 8 else (1 << (8 * element_size)) - 1


def element_hash(bits: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``h`` from the module docstring, elementwise on int64 tensors (wrap-around arithmetic)."""
    x = bits ^ ((pos + 1) * PHI)
    x = x ^ ((x >> SHIFT) & LOW_MASK)
    x = x * M1
    x = x ^ ((x >> SHIFT) & LOW_MASK)
    x = x * M2
    return x ^ ((x >> SHIFT) & LOW_MASK)


def element_hash_np(bits: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """:func:`element_hash` on int64 numpy arrays (the same wrap-around arithmetic, for host slots)."""
    x = bits ^ ((pos + 1) * np.int64(PHI))
    x ^= (x >> SHIFT) & LOW_MASK
    x *= np.int64(M1)
    x ^= (x >> SHIFT) & LOW_MASK
    x *= np.int64(M2)
    x ^= (x >> SHIFT) & LOW_MASK
    return x
