"""Exact arithmetic shared by the GEMM output models, the accumulation statistics and emulator identification.

Two kinds of primitives, each exact for every input it accepts:

* error-free transformations and directed roundings in FP32/FP64: TwoSum, FP32 addition rounded toward zero,
  RNE/RTZ narrowing of an exact FP64 or double-double value to FP32;
* a vectorised superaccumulator (``math.fsum`` for tensors): exact sums of FP64 terms over the last dim,
  correctly rounded once, per K-slice and in total;

plus the slice-combination rule of the probe-matched model (FP32 additions rounded to nearest or toward zero)
and the snap of an accumulator to a 1/d lattice, with the one check of a lattice denominator.
"""

from __future__ import annotations

import math

import torch

from ue5m3.numerics.formats import Rounding

__all__ = [
    "two_sum",
    "add_rtz",
    "add_rounded",
    "round_fp64_to_fp32_exact",
    "twosum_chain_to_fp32",
    "rtz_fp64_to_fp32",
    "exact_sum",
    "slice_partials",
    "snap",
    "check_grid",
    "is_grid",
]

_DIGIT = 26  # bits per superaccumulator digit: two digits fit FP64's 53-bit significand exactly
_PAD = 4  # zero digits kept below the lowest one: rounding reads four digits under the leading one


# ----- error-free transformations and directed rounding -------------------------------------------------


def add_rtz(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """FP32 addition rounded toward zero, exact for every pair of FP32 inputs.

    The RNE sum s and its exact error e come from TwoSum (valid in any binary precision); when e is nonzero
    and points back toward zero from s, s overshot the exact sum in magnitude, so step it one ulp toward zero.
    """
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    overshoot = (err != 0) & (torch.signbit(err) != torch.signbit(s))
    return torch.where(overshoot, torch.nextafter(s, torch.zeros_like(s)), s)


def two_sum(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def round_fp64_to_fp32_exact(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """RNE to FP32 of the exact value hi + lo (a normalised double-double, |lo| <= ulp(hi)/2).

    Round hi + lo to 53 bits with round-to-odd first (53 >= 24 + 2 makes the second rounding innocuous), then
    let the FP64 -> FP32 conversion round to nearest even.
    """
    bits = hi.view(torch.int64)
    even = (bits & 1) == 0
    toward = torch.where(lo > 0, torch.full_like(hi, math.inf), torch.full_like(hi, -math.inf))
    odd = torch.where((lo != 0) & even, torch.nextafter(hi, toward), hi)
    return odd.to(torch.float32)


def twosum_chain_to_fp32(terms: torch.Tensor) -> torch.Tensor:
    """RNE-to-FP32 of the exact sum over dim 0 of FP64 terms (exact while the terms span <= 106 bits)."""
    hi = terms[0]
    lo = torch.zeros_like(hi)
    for term in terms[1:]:
        hi, err = two_sum(hi, term)
        lo = lo + err
    hi, lo = two_sum(hi, lo)  # renormalise
    return round_fp64_to_fp32_exact(hi, lo)


def rtz_fp64_to_fp32(x: torch.Tensor) -> torch.Tensor:
    r = x.to(torch.float32)
    over = r.to(torch.float64).abs() > x.abs()
    return torch.where(over, torch.nextafter(r, torch.zeros_like(r)), r)


def add_rounded(acc: torch.Tensor, x: torch.Tensor, rounding: Rounding) -> torch.Tensor:
    """One FP32 accumulator update of the slice-combination rule: ``fl(acc + x)`` rounded toward zero (RTZ)
    or to nearest even (RNE, the plain FP32 addition)."""
    return add_rtz(acc, x) if rounding is Rounding.RTZ else acc + x


def is_grid(grid: object) -> bool:
    """Whether ``grid`` is a lattice denominator that snaps exactly: None (no snap) or a power of two >= 2."""
    return grid is None or (
        isinstance(grid, int) and not isinstance(grid, bool) and grid >= 2 and not grid & (grid - 1)
    )


def check_grid(grid: int | None, key: str) -> None:
    """Refuse a lattice denominator that :func:`is_grid` rejects.

    Raises:
        ValueError: naming ``key`` and the value.
    """
    if not is_grid(grid):
        raise ValueError(f"{key} must be a power of two >= 2 or None, got {grid!r}")


def snap(acc: torch.Tensor, grid: int | None) -> torch.Tensor:
    """Snap to the 1/grid lattice with ties to even (torch.round); multiplying and dividing by a power of two
    is exact."""
    return acc if grid is None else torch.round(acc * grid) / grid


# ----- the superaccumulator ------------------------------------------------------------------------------


def _digits(terms: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Exact unnormalised digits of the sums over the last dim: ([..., n] int64, base); digit i weighs
    2^(26 * (i + base)), the same base for every sum."""
    mantissa, exponent = torch.frexp(terms)  # terms = mantissa * 2^exponent, 1/2 <= |mantissa| < 1
    m = (mantissa * 2.0**53).to(torch.int64)  # signed integer, |m| < 2^53: terms = m * 2^(exponent - 53)
    lsb = exponent - 53
    bins = torch.div(lsb, _DIGIT, rounding_mode="floor")
    shift = (lsb - _DIGIT * bins).to(torch.int64)  # in [0, 26): m << shift spans three digits (< 2^78)
    base = int(bins.min()) - _PAD if terms.numel() else 0
    index = (bins - base).to(torch.int64)
    n_digits = (int(index.max()) if terms.numel() else 0) + 5  # three digits per term, two for carries
    mask = (1 << _DIGIT) - 1
    # m * 2^shift = d0 + d1 * 2^26 + d2 * 2^52 with d0, d1 in [0, 2^26): two's complement with arithmetic
    # shifts, so negative terms need no special case; the left shift may wrap, but only its low 26 bits count.
    pieces = ((m << shift) & mask, (m >> (_DIGIT - shift)) & mask, m >> (2 * _DIGIT - shift))
    acc = torch.zeros(*terms.shape[:-1], n_digits, dtype=torch.int64)
    for k, piece in enumerate(pieces):  # int64 sums stay exact: |piece| <= 2^26
        acc.scatter_add_(-1, index + k if k else index, piece)
    return acc, base


def _propagate(acc: torch.Tensor) -> torch.Tensor:
    """Carry propagation on digit-major [n, ...] digits: every digit but the top one in [0, 2^26).

    Vectorised passes (each shrinks carries by 26 bits; a carry ripple takes one pass per digit at worst).
    """
    while True:
        carry = acc[:-1] >> _DIGIT  # arithmetic shift: floor division, so negative digits borrow
        if not bool(carry.any()):
            return acc
        acc = torch.cat([acc[:-1] & ((1 << _DIGIT) - 1), acc[-1:]]) + torch.cat([torch.zeros_like(acc[:1]), carry])


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e in FP64 for integer e in [-1022, 1023], built from its bits (exact, unlike a library exp2)."""
    return torch.bitwise_left_shift(e + 1023, 52).view(torch.float64)


def _round_digits(acc: torch.Tensor, base: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo): a normalised double-double equal to the sum rounded to odd 78+ bits below its leading bit,
    so that one further rounding to FP64 or FP32 gives the correctly rounded sum."""
    acc = _propagate(acc.movedim(-1, 0))  # [n, ...]
    negative = acc[-1] < 0  # the top digit holds the sign after propagation
    acc = _propagate(torch.where(negative, -acc, acc))
    nonzero = acc != 0
    position = torch.arange(acc.shape[0]).reshape(-1, *([1] * (acc.dim() - 1)))
    lead = torch.where(nonzero, position, -1).amax(0).clamp(min=_PAD)  # zero sums read zero digits

    def digit(offset: int) -> torch.Tensor:
        return acc.gather(0, (lead - offset)[None])[0]

    top = digit(0) * (1 << _DIGIT) + digit(1)  # < 2^52: exact in FP64
    sticky = nonzero.cumsum(0).gather(0, (lead - 4)[None])[0] > 0  # any bit below the four digits read
    low = torch.bitwise_or(digit(2) * (1 << _DIGIT) + digit(3), sticky.to(torch.int64))  # round to odd
    # Scale by 2^e in two exact steps; every nonzero product is a multiple of 2^-1074, hence representable.
    scaled = []
    for value, offset in ((top, 1), (low, 3)):
        e = _DIGIT * (lead - offset + base)
        half = torch.div(e, 2, rounding_mode="floor")
        scaled.append(value.to(torch.float64) * _pow2(half) * _pow2(e - half))
    hi, lo = two_sum(*scaled)
    return torch.where(negative, -hi, hi), torch.where(negative, -lo, lo)


def exact_sum(terms: torch.Tensor, *, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Correctly rounded (RNE) sum over the last dim of FP64 terms, like a vectorised ``math.fsum``.

    Args:
        terms: finite FP64 tensor [..., K].
        dtype: ``torch.float64`` or ``torch.float32``, the format the exact sum is rounded to once.

    Returns:
        Tensor [...] of ``dtype``.

    Raises:
        TypeError: ``terms`` is not FP64 or ``dtype`` is neither FP64 nor FP32.
        ValueError: non-finite terms.
    """
    if terms.dtype != torch.float64:
        raise TypeError(f"exact_sum needs FP64 terms (exact products), got {terms.dtype}")
    if dtype not in (torch.float64, torch.float32):
        raise TypeError(f"dtype must be torch.float64 or torch.float32, got {dtype}")
    if not bool(torch.isfinite(terms).all()):
        raise ValueError("exact_sum needs finite terms; got NaN or infinity")
    hi, lo = _round_digits(*_digits(terms))
    return hi if dtype == torch.float64 else round_fp64_to_fp32_exact(hi, lo)


def slice_partials(products: torch.Tensor, *, width: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Slice results and exact totals of dot products in one superaccumulator pass.

    Args:
        products: exact FP64 products [..., K], K a multiple of ``width``.
        width: K-slice width (64 on Blackwell).

    Returns:
        (p, exact): p [..., K / width] FP32, each slice's exact sum rounded once to nearest even; exact [...]
        FP64, the whole sum rounded once.
    """
    k = products.shape[-1]
    if width < 1 or k % width:
        raise ValueError(f"K={k} must be a positive multiple of the slice width, got width={width!r}")
    if not bool(torch.isfinite(products).all()):
        raise ValueError("slice_partials needs finite products; got NaN or infinity")
    # [..., K] -> [..., S, width]: one digit vector per slice, all on the same bins, so they add up exactly
    digits, base = _digits(products.reshape(*products.shape[:-1], k // width, width))
    p = round_fp64_to_fp32_exact(*_round_digits(digits, base))
    exact, _ = _round_digits(digits.sum(-2), base)
    return p, exact
