"""The numerics tests' oracles (numerics spec sections 1-3), derived from the spec's format table, never from
:mod:`ue5m3.numerics.formats`:

* :data:`SPEC_FIELDS` restates each format's spec-level bit fields;
* :func:`spec_magnitudes` enumerates the exact value of every magnitude code from those fields;
* :func:`reference_round` rounds float32 inputs onto a format exactly (RNE with ties to the even code, or RTZ),
  saturating at the max finite value;
* :func:`rne_scalar` is the same rule for one value held as a :class:`fractions.Fraction` (used by the slow
  scalar quantizer references in ``test_quantize.py``);
* :func:`oracle_inputs` are the float32 inputs that stress rounding onto a format.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

FP32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class SpecFields:
    """One row of the spec's format table (numerics spec section 1)."""

    exponent_bits: int
    mantissa_bits: int
    bias: int
    signed: bool
    subnormals: bool
    reserved_top_codes: int  # highest magnitude codes that are Inf/NaN


SPEC_FIELDS: dict[str, SpecFields] = {
    "e2m1": SpecFields(2, 1, 1, True, True, 0),
    "e2m3": SpecFields(2, 3, 1, True, True, 0),
    "e3m2": SpecFields(3, 2, 3, True, True, 0),
    "e4m3": SpecFields(4, 3, 7, True, True, 1),  # only S.1111.111 is NaN
    "e5m2": SpecFields(5, 2, 15, True, True, 4),  # IEEE-style: exponent field 31 is Inf/NaN
    "ue5m3": SpecFields(5, 3, 15, False, True, 8),  # exponent field 31 (0xF8-0xFF) reserved
    "ue5m3_all_finite": SpecFields(5, 3, 15, False, True, 0),  # the authors' TE fork
    "ue5m3_alto": SpecFields(5, 3, 15, False, True, 1),  # AMD ALTO: 0xFF = NaN
    "ue8m0": SpecFields(8, 0, 127, False, False, 1),  # powers of two, 0xFF = NaN
}

ALL_FORMAT_NAMES = tuple(SPEC_FIELDS)
SIGNED_FORMAT_NAMES = tuple(n for n, f in SPEC_FIELDS.items() if f.signed)
UNSIGNED_FORMAT_NAMES = tuple(n for n, f in SPEC_FIELDS.items() if not f.signed)


@functools.cache
def spec_magnitudes(name: str) -> tuple[Fraction, ...]:
    """Exact value of every finite magnitude code (index = magnitude code), from the spec's field layout."""
    f = SPEC_FIELDS[name]
    values = []
    count = (1 << (f.exponent_bits + f.mantissa_bits)) - f.reserved_top_codes
    for code in range(count):
        field, frac = divmod(code, 1 << f.mantissa_bits)
        if f.subnormals and field == 0:
            value = Fraction(frac, 1 << f.mantissa_bits) * Fraction(2) ** (1 - f.bias)
        else:
            value = (1 + Fraction(frac, 1 << f.mantissa_bits)) * Fraction(2) ** (field - f.bias)
        values.append(value)
    assert values == sorted(values), "magnitude codes are ordered by value"
    return tuple(values)


@functools.cache
def spec_magnitudes_f64(name: str) -> np.ndarray:
    """:func:`spec_magnitudes` as float64 (every value of these formats is exact in float64)."""
    return np.array([float(v) for v in spec_magnitudes(name)], dtype=np.float64)


def spec_code_values(name: str) -> dict[int, Fraction]:
    """Exact value of every finite code, including negative codes (sign in the top bit) of signed formats."""
    f = SPEC_FIELDS[name]
    mags = spec_magnitudes(name)
    table = dict(enumerate(mags))
    if f.signed:
        sign = 1 << (f.exponent_bits + f.mantissa_bits)
        table.update({sign | code: -v for code, v in enumerate(mags)})
    return table


def spec_non_finite_codes(name: str) -> list[int]:
    """Codes inside the format's bit width that are not finite (reserved Inf/NaN codes)."""
    f = SPEC_FIELDS[name]
    n_mag = 1 << (f.exponent_bits + f.mantissa_bits)
    reserved = list(range(n_mag - f.reserved_top_codes, n_mag))
    if f.signed:
        reserved += [n_mag | c for c in reserved]
    return reserved


def _choose(lo_idx: np.ndarray, m: np.ndarray, table: np.ndarray, mode: str) -> np.ndarray:
    """Pick between table[lo_idx] and table[lo_idx + 1] for magnitudes m with table[lo_idx] <= m."""
    hi_idx = np.minimum(lo_idx + 1, len(table) - 1)
    lo, hi = table[lo_idx], table[hi_idx]
    if mode == "rtz":
        return np.where(m >= hi, hi, lo)
    if mode != "rne":
        raise ValueError(f"reference_round supports 'rne' and 'rtz', got {mode!r}")
    # Exact in float64: m is a float32 value and lo, hi are adjacent format values with lo >= m/2 (or lo = 0),
    # so m - lo and hi - m need at most 26 significant bits.
    d_lo, d_hi = m - lo, hi - m
    up = (d_hi < d_lo) | ((d_hi == d_lo) & (hi_idx % 2 == 0))
    return np.where(up, hi, lo)


def reference_round(x: np.ndarray, name: str, mode: str = "rne") -> np.ndarray:
    """Exact RNE/RTZ of float32 values onto ``name``, saturating; float32 result with the input's sign.

    Ties go to the even code (for every format here the magnitude code is the index into the value table, so
    this is ties-to-even on the significand, and on the exponent for UE8M0). Magnitudes below the smallest
    value of a format without zero (UE8M0) go to that smallest value. Sign of zero is kept.
    """
    x = np.asarray(x, dtype=np.float32)
    table = spec_magnitudes_f64(name)
    m = np.abs(x.astype(np.float64))
    m_clamped = np.minimum(m, table[-1])
    lo_idx = np.clip(np.searchsorted(table, m_clamped, side="right") - 1, 0, len(table) - 1)
    below = m_clamped < table[0]
    out = np.where(below, table[0], _choose(lo_idx, m_clamped, table, mode))
    out = out.astype(np.float32)
    if SPEC_FIELDS[name].signed:
        out = np.copysign(out, x)
    return out


def rne_scalar(value: Fraction | float, name: str) -> Fraction:
    """Exact RNE (ties to the even code) of one value onto ``name``, saturating at +-max finite."""
    value = Fraction(value)
    mags = spec_magnitudes(name)
    m = min(abs(value), mags[-1])
    i = bisect.bisect_right(mags, m) - 1
    if i < 0:
        result = mags[0]
    elif i == len(mags) - 1 or m == mags[i]:
        result = mags[i]
    else:
        d_lo, d_hi = m - mags[i], mags[i + 1] - m
        up = d_hi < d_lo or (d_hi == d_lo and (i + 1) % 2 == 0)
        result = mags[i + 1] if up else mags[i]
    return -result if value < 0 else result


def grid_neighbours(value: Fraction, name: str) -> tuple[Fraction, Fraction]:
    """(largest format value <= |value|, smallest format value >= |value|), both clamped into the table."""
    mags = spec_magnitudes(name)
    m = min(abs(Fraction(value)), mags[-1])
    i = bisect.bisect_right(mags, m) - 1
    if i < 0:
        return mags[0], mags[0]
    if mags[i] == m:
        return m, m
    return mags[i], mags[i + 1]


def neighbours_f64(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`grid_neighbours` for float32 data: (value <= |x|, value >= |x|) as float64."""
    table = spec_magnitudes_f64(name)
    m = np.minimum(np.abs(np.asarray(x, dtype=np.float64)), table[-1])
    lo_idx = np.clip(np.searchsorted(table, m, side="right") - 1, 0, len(table) - 1)
    hi_idx = np.where(table[lo_idx] == m, lo_idx, np.minimum(lo_idx + 1, len(table) - 1))
    lo = np.where(m < table[0], table[0], table[lo_idx])
    return lo, table[hi_idx]


def oracle_inputs(name: str, seed: int = 0, n_random: int = 3000) -> np.ndarray:
    """Float32 inputs that stress rounding onto ``name``.

    Every representable value, every midpoint between adjacent values, the float32 neighbours (nextafter) of
    both, values above max finite (including the tie with the virtual next value), values far below the
    smallest positive value, float32 subnormals and log-uniform random values across the whole range; both
    signs for signed formats. Formats without zero (UE8M0) only get inputs >= their smallest value.
    """
    f = SPEC_FIELDS[name]
    table = spec_magnitudes_f64(name)
    top, bottom = table[-1], table[0] if table[0] > 0 else table[1]
    mids = (table[:-1] + table[1:]) / 2
    spacing_top = table[-1] - table[-2]
    special = [
        top + spacing_top / 2,
        top + spacing_top,
        top * 1.01,
        top * 2,
        top * 64,
        1e30,
        FP32_MAX,
        bottom / 2,
        bottom / 4,
        bottom * 0.75,
        bottom * 1.25,
        1e-40,
        1.4e-45,
        1e-30,
        0.0,
    ]
    core = np.concatenate([table, mids, np.array(special)])
    core = core[np.abs(core) <= FP32_MAX].astype(np.float32)
    with np.errstate(over="ignore"):
        up = np.nextafter(core, np.float32(np.inf))
    down = np.nextafter(core, np.float32(0))
    rng = np.random.default_rng(seed)
    log_lo, log_hi = math.log2(bottom) - 3, math.log2(min(top * 4, FP32_MAX))
    rand = np.exp2(rng.uniform(log_lo, log_hi, n_random)).astype(np.float32)
    x = np.concatenate([core, up, down, rand])
    x = x[np.isfinite(x)]
    if not f.subnormals:
        x = x[x >= np.float32(table[0])]
    if f.signed:
        x = np.concatenate([x, -x])
    return x.astype(np.float32)
