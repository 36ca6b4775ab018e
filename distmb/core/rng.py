"""Counter-based random numbers in Python: the twin of ``csrc/include/rng.h``.

A value is a pure function of its key (splitmix64's finaliser chained over the key's
parts), so it is the same on every device, thread count and call order. Two forms of the
same functions:

- on Python ``int`` (exact, unbounded integers masked to 64 bits): scalars computed once per
  call, such as the key of one iteration, and the reference the tensor form is tested
  against;
- on ``int64`` torch tensors on any device (:func:`finalize64_t`, :func:`mix64_t`,
  :func:`hash_chain_t`, :func:`hash_key_t`): a tensor holds the two's-complement bit
  pattern of the ``uint64`` value. Torch's int64 multiplication and addition wrap, ``^``
  is bitwise; its ``>>`` is arithmetic, so every right shift is masked to the logical
  shift.

``hash_key(seed, a, b, c)`` equals ``distmb::hash_key`` in ``csrc/include/rng.h`` bit for bit (the
C++ dropout masks use it; ``tests/test_push_select.py`` checks the tensor form against
them).
"""

from __future__ import annotations

import torch

#: 2**64 - 1: a Python int reduced to 64 bits.
MASK64 = (1 << 64) - 1
#: splitmix64's golden-ratio increment (``kSplitmixGolden``).
GOLDEN = 0x9E3779B97F4A7C15
#: splitmix64's finaliser multipliers.
MIX1, MIX2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
#: The finaliser's right shifts.
SHIFT1, SHIFT2, SHIFT3 = 30, 27, 31
#: Bits of a uniform's mantissa: ``to_unit_open`` keeps the hash's top 52 bits.
UNIT_BITS = 52


def finalize64(x: int) -> int:
    """splitmix64's finaliser on a Python int (taken modulo 2**64): a bijection of uint64."""
    x &= MASK64
    x = ((x ^ (x >> SHIFT1)) * MIX1) & MASK64
    x = ((x ^ (x >> SHIFT2)) * MIX2) & MASK64
    return x ^ (x >> SHIFT3)


def mix64(x: int) -> int:
    """One splitmix64 step from state ``x``: ``finalize64(x + GOLDEN)``."""
    return finalize64(x + GOLDEN)


def hash_chain(seed: int, *parts: int) -> int:
    """Hash of ``seed`` and one or more parts: ``mix64(... mix64(mix64(seed ^ mix64(a)) ^ b)
    ... ^ z)`` (every value taken modulo 2**64)."""
    first, *rest = parts
    x = (seed & MASK64) ^ mix64(first)
    for part in rest:
        x = mix64(x) ^ (part & MASK64)
    return mix64(x)


def hash_key(seed: int, a: int, b: int = 0, c: int = 0) -> int:
    """Hash of a key tuple (seed first), as the C++ ``hash_key``: ``hash_chain(seed, a, b, c)``."""
    return hash_chain(seed, a, b, c)


def to_signed(x: int) -> int:
    """The int64 whose two's-complement bit pattern is ``x mod 2**64`` (a torch scalar)."""
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


def _srl(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Logical right shift of the uint64 held in int64 ``x``."""
    return (x >> shift) & ((1 << (64 - shift)) - 1)


_MIX1_S, _MIX2_S, _GOLDEN_S = to_signed(MIX1), to_signed(MIX2), to_signed(GOLDEN)


def finalize64_t(x: torch.Tensor) -> torch.Tensor:
    """:func:`finalize64` of every entry of int64 ``x`` (any shape, any device), in place:
    ``x`` is overwritten and returned."""
    t = torch.empty_like(x)
    for shift, mult in ((SHIFT1, _MIX1_S), (SHIFT2, _MIX2_S), (SHIFT3, None)):
        torch.bitwise_right_shift(x, shift, out=t)
        t &= (1 << (64 - shift)) - 1  # the logical shift
        x ^= t
        if mult is not None:
            x *= mult
    return x


def mix64_t(x: torch.Tensor) -> torch.Tensor:
    """:func:`mix64` of every entry of int64 ``x`` (a new tensor)."""
    return finalize64_t(x + _GOLDEN_S)


def hash_chain_t(seed: int | torch.Tensor, *parts: int | torch.Tensor) -> torch.Tensor:
    """:func:`hash_chain` elementwise: ``seed`` and each part a Python int or an int64
    tensor (broadcast together; the first part a tensor, which gives the device)."""
    first, *rest = parts
    if not isinstance(first, torch.Tensor):
        raise TypeError("hash_chain_t: the first part must be a tensor")
    x = _xor(mix64_t(first), seed)
    for part in rest:
        x = _xor(finalize64_t(x + _GOLDEN_S), part)
    return finalize64_t(x + _GOLDEN_S)


def hash_key_t(
    seed: int | torch.Tensor,
    a: torch.Tensor,
    b: int | torch.Tensor = 0,
    c: int | torch.Tensor = 0,
) -> torch.Tensor:
    """:func:`hash_key` elementwise (``a`` an int64 tensor; the others Python ints or int64
    tensors, broadcast together)."""
    return hash_chain_t(seed, a, b, c)


def _xor(x: torch.Tensor, v: int | torch.Tensor) -> torch.Tensor:
    """``x ^ v``: in place for a Python int, broadcast into a new tensor for a tensor."""
    if isinstance(v, int):
        x ^= to_signed(v)
        return x
    return x ^ v


def to_unit_open(h: torch.Tensor) -> torch.Tensor:
    """float64 uniforms in the open interval (0, 1) from int64 hashes ``h``:
    ``(top 52 bits + 1/2) / 2**52``, so ``log`` of them is finite."""
    top = _srl(h, 64 - UNIT_BITS).to(torch.float64)
    return (top + 0.5) * (2.0**-UNIT_BITS)
