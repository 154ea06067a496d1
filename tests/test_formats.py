"""Tests for small floating-point formats and exact rounding onto them (numerics spec sections 1-2).

Oracles: the spec's format table restated in ``helpers/format_oracles.py`` (exact value tables and an exact float64
rounding reference), ml_dtypes casts (RNE) and gfloat (RNE and RTZ). Every comparison is bit-exact (atol = rtol = 0)
unless a comment says otherwise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
from fractions import Fraction

import gfloat
import ml_dtypes
import numpy as np
import pytest
import torch
from gfloat.formats import (
    format_info_ocp_e2m1,
    format_info_ocp_e2m3,
    format_info_ocp_e3m2,
    format_info_ocp_e4m3,
    format_info_ocp_e5m2,
    format_info_ocp_e8m0,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.bits import assert_same_f32_bits
from helpers.format_oracles import (
    ALL_FORMAT_NAMES,
    SIGNED_FORMAT_NAMES,
    SPEC_FIELDS,
    UNSIGNED_FORMAT_NAMES,
    grid_neighbours,
    neighbours_f64,
    oracle_inputs,
    reference_round,
    spec_code_values,
    spec_magnitudes,
    spec_magnitudes_f64,
    spec_non_finite_codes,
)
from ue5m3.numerics import formats
from ue5m3.numerics.formats import Rounding

DETERMINISTIC = ("rne", "rtz")
STOCHASTIC = ("sf", "sr_te", "sr")
ALL_MODES = DETERMINISTIC + STOCHASTIC


def fmt_params(names=ALL_FORMAT_NAMES):
    return [pytest.param(formats.FORMATS[n], id=n) for n in names]


def as_t(a) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.asarray(a, dtype=np.float32)))


def rounded(x, fmt, mode="rne", **kw) -> np.ndarray:
    return formats.round(as_t(x), fmt, mode, **kw).numpy()


# ----- descriptor facts ---------------------------------------------------------------------------------

# name: (max finite, min normal, min subnormal, positive finite codes) from the spec table and its notes.
SPEC_FACTS = {
    "e2m1": (6.0, 1.0, 0.5, 7),
    "e2m3": (7.5, 1.0, 0.125, 31),
    "e3m2": (28.0, 0.25, 0.0625, 31),
    "e4m3": (448.0, 2.0**-6, 2.0**-9, 126),
    "e5m2": (57344.0, 2.0**-14, 2.0**-16, 123),
    "ue5m3": (61440.0, 2.0**-14, 2.0**-17, 247),
    "ue5m3_all_finite": (122880.0, 2.0**-14, 2.0**-17, 255),
    "ue5m3_alto": (114688.0, 2.0**-14, 2.0**-17, 254),
    "ue8m0": (2.0**127, 2.0**-127, None, 255),
}

GFLOAT_INFO = {
    "e2m1": format_info_ocp_e2m1,
    "e2m3": format_info_ocp_e2m3,
    "e3m2": format_info_ocp_e3m2,
    "e4m3": format_info_ocp_e4m3,
    "e5m2": format_info_ocp_e5m2,
    "ue8m0": format_info_ocp_e8m0,
    **{
        name: gfloat.FormatInfo(
            name,
            k=8,
            precision=4,
            bias=15,
            is_signed=False,
            domain=gfloat.Domain.Finite,
            has_nz=False,
            num_high_nans=nans,
            has_subnormals=True,
            is_twos_complement=False,
        )
        for name, nans in (("ue5m3", 8), ("ue5m3_all_finite", 0), ("ue5m3_alto", 1))
    },
}


def test_format_registry_holds_exactly_the_spec_formats_with_spec_fields():
    assert set(formats.FORMATS) == set(SPEC_FIELDS) == set(SPEC_FACTS)
    for name, fmt in formats.FORMATS.items():
        spec = SPEC_FIELDS[name]
        got = (fmt.exponent_bits, fmt.mantissa_bits, fmt.bias, fmt.signed, fmt.subnormals, fmt.reserved_top_codes)
        assert got == (
            spec.exponent_bits,
            spec.mantissa_bits,
            spec.bias,
            spec.signed,
            spec.subnormals,
            spec.reserved_top_codes,
        ), name


@pytest.mark.parametrize("fmt", fmt_params())
def test_descriptor_facts_match_the_spec_table(fmt):
    max_finite, min_normal, min_subnormal, positive = SPEC_FACTS[fmt.name]
    assert fmt.max_finite == max_finite
    assert fmt.min_normal == min_normal
    assert fmt.min_subnormal == min_subnormal
    assert fmt.positive_finite_count == positive
    values = fmt.finite_values()
    assert int((values > 0).sum()) == positive
    assert float(values.max()) == max_finite


@pytest.mark.parametrize("fmt", fmt_params())
def test_descriptor_facts_match_gfloat(fmt):
    info = GFLOAT_INFO[fmt.name]
    assert fmt.max_finite == info.max
    assert fmt.min_normal == info.smallest_normal
    if fmt.min_subnormal is not None:
        assert fmt.min_subnormal == info.smallest_subnormal
    finite = [gfloat.decode_float(info, c).fval for c in range(1 << info.k)]
    positive = {v for v in finite if math.isfinite(v) and v > 0}
    assert fmt.positive_finite_count == len(positive)


def test_ue5m3_has_248_finite_codes_including_zero():
    values = formats.UE5M3.finite_values()
    assert values.numel() == 248
    assert float(values[0]) == 0.0
    assert formats.UE5M3.finite_codes().tolist() == list(range(248))


def test_range_facts_quoted_by_the_paper_hold_exactly():
    ue, e4 = formats.UE5M3, formats.E4M3
    assert Fraction(ue.max_finite) / Fraction(e4.max_finite) == Fraction(61440, 448)
    assert round(ue.max_finite / e4.max_finite, 2) == 137.14
    assert Fraction(e4.min_subnormal) / Fraction(ue.min_subnormal) == 256
    assert (ue.positive_finite_count, e4.positive_finite_count) == (247, 126)
    assert ue.max_finite / 2048 == 30.0
    assert round(2048 / 448, 2) == 4.57
    # Both keep 3 fraction bits: the spacing inside a shared binade is identical.
    ue_values, e4_values = ue.finite_values().tolist(), e4.finite_values().tolist()
    for lo in (2.0**-6, 1.0, 128.0):  # every full binade of E4M3 (its top binade lacks the NaN code 480)
        ue_binade = [v for v in ue_values if lo <= v < 2 * lo]
        e4_binade = [v for v in e4_values if lo <= v < 2 * lo]
        assert ue_binade == e4_binade and len(ue_binade) == 8


def test_ue5m3_top_code_conventions_share_bias_and_bottom_of_range():
    variants = (formats.UE5M3, formats.UE5M3_ALL_FINITE, formats.UE5M3_ALTO)
    assert [v.max_finite for v in variants] == [61440.0, 122880.0, 114688.0]
    for v in variants:
        assert (v.bias, v.min_normal, v.min_subnormal) == (15, 2.0**-14, 2.0**-17)


def test_worked_range_example_with_reference_100():
    """Spec section 1: g = 100; the block-amax range a UE5M3 scale covers for T = 448 and T = 2048."""
    g, ue = 100.0, formats.UE5M3
    for target, smallest, largest in ((448.0, 1.7e-6, 13714.0), (2048.0, 3.7e-7, 3000.0)):
        assert math.isclose(ue.min_subnormal * g / target, smallest, rel_tol=0.01)  # quoted to 2 digits
        assert math.isclose(ue.max_finite * g / target, largest, rel_tol=1e-4)  # 13,714.29 quoted as 13,714


# ----- every code ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", fmt_params())
def test_exact_value_of_every_code_matches_the_spec_field_layout(fmt):
    table = spec_code_values(fmt.name)
    assert sorted(fmt.finite_codes().tolist()) == sorted(table)
    for code, value in table.items():
        assert fmt.exact_value(code) == value, code


@pytest.mark.parametrize("fmt", fmt_params())
def test_decode_of_every_finite_code_equals_its_exact_value(fmt):
    codes = fmt.finite_codes()
    for dtype in (torch.float64, torch.float32):
        decoded = formats.decode(codes, fmt, dtype=dtype)
        assert decoded.dtype == dtype
        expected = [fmt.exact_value(c) for c in codes.tolist()]
        assert [Fraction(v) for v in decoded.tolist()] == expected
    # The sign of zero is part of the code.
    if fmt.signed:
        neg_zero = 1 << (fmt.bits - 1)
        assert math.copysign(1.0, formats.decode(torch.tensor([neg_zero]), fmt).item()) == -1.0


@pytest.mark.parametrize("fmt", fmt_params())
def test_encode_inverts_decode_on_every_finite_code(fmt):
    """encode(decode(c)) == c for every finite code, in every rounding mode (values are on the grid).

    Zero: +0.0 encodes to code 0 and, for signed formats, -0.0 to the sign-bit code, so the -0 code round-trips
    to itself as well (the sign of zero is kept, spec section 2 step 1).
    """
    codes = fmt.finite_codes()
    values = formats.decode(codes, fmt)
    for mode in ALL_MODES:
        gen = torch.Generator().manual_seed(1)
        assert torch.equal(formats.encode(values, fmt, mode, generator=gen), codes), mode
    zero_codes = formats.encode(torch.tensor([0.0, -0.0]), fmt).tolist()
    # Unsigned formats map -0.0 to code 0; UE8M0 has no zero and saturates 0 up to its code 0 (2^-127).
    assert zero_codes == ([0, 1 << (fmt.bits - 1)] if fmt.signed else [0, 0])


@pytest.mark.parametrize("fmt", fmt_params())
def test_decode_raises_on_every_non_finite_code(fmt):
    reserved = spec_non_finite_codes(fmt.name)
    assert len(reserved) == fmt.reserved_top_codes * (2 if fmt.signed else 1)
    for code in reserved:
        with pytest.raises(ValueError, match="finite"):
            formats.decode(torch.tensor([code]), fmt)
        with pytest.raises(ValueError):
            fmt.exact_value(code)
    with pytest.raises(ValueError):
        formats.decode(torch.tensor([-1]), fmt)
    with pytest.raises(TypeError):
        formats.decode(torch.tensor([1.0]), fmt)


@pytest.mark.parametrize(
    "fmt",
    [pytest.param(formats.FORMATS[n], id=n) for n in ALL_FORMAT_NAMES],
)
def test_decode_raises_on_codes_wider_than_the_format(fmt):
    for code in (1 << fmt.bits, (1 << fmt.bits) + 1, 1 << 16):
        with pytest.raises(ValueError):
            formats.decode(torch.tensor([code]), fmt)


# ----- oracles ------------------------------------------------------------------------------------------

ML_DTYPES = {
    # name: (ml_dtypes type, clamp before the cast: ml_dtypes gives NaN (E4M3) or Inf (E5M2) on overflow)
    "e2m1": (ml_dtypes.float4_e2m1fn, None),
    "e2m3": (ml_dtypes.float6_e2m3fn, None),
    "e3m2": (ml_dtypes.float6_e3m2fn, None),
    "e4m3": (ml_dtypes.float8_e4m3fn, 448.0),
    "e5m2": (ml_dtypes.float8_e5m2, 57344.0),
}


@pytest.mark.parametrize("fmt", fmt_params(tuple(ML_DTYPES)))
def test_rne_matches_ml_dtypes_cast(fmt):
    dtype, clamp = ML_DTYPES[fmt.name]
    x = oracle_inputs(fmt.name, seed=1)
    xc = x if clamp is None else np.clip(x, -clamp, clamp)
    expected = xc.astype(dtype).astype(np.float32)
    assert_same_f32_bits(rounded(x, fmt), expected, inputs=x)


def _rne_marks(name, mode):
    return []


@pytest.mark.parametrize(
    ("fmt", "mode"),
    [
        pytest.param(formats.FORMATS[n], m, id=f"{n}-{m}", marks=_rne_marks(n, m))
        for n in ALL_FORMAT_NAMES
        for m in DETERMINISTIC
    ],
)
def test_round_matches_gfloat(fmt, mode):
    x = oracle_inputs(fmt.name, seed=2)
    rnd = gfloat.RoundMode.TiesToEven if mode == "rne" else gfloat.RoundMode.TowardZero
    expected = gfloat.round_ndarray(GFLOAT_INFO[fmt.name], x.astype(np.float64), rnd, sat=True)
    assert_same_f32_bits(rounded(x, fmt, mode), expected.astype(np.float32), inputs=x)


@pytest.mark.parametrize(
    ("fmt", "mode"),
    [
        pytest.param(formats.FORMATS[n], m, id=f"{n}-{m}", marks=_rne_marks(n, m))
        for n in ALL_FORMAT_NAMES
        for m in DETERMINISTIC
    ],
)
def test_round_matches_exact_float64_reference(fmt, mode):
    x = oracle_inputs(fmt.name, seed=3)
    if not fmt.has_zero:  # formats without zero also saturate at the bottom: add inputs below min
        x = np.concatenate([x, np.float32([0.0, 1e-45, 1e-40, 2.0**-128])])
    assert_same_f32_bits(rounded(x, fmt, mode), reference_round(x, fmt.name, mode), inputs=x)


def test_ue8m0_rne_ties_go_to_the_even_exponent_code():
    # 1.5 * 2^e lies halfway between 2^e (code e + 127) and 2^(e+1): RNE picks the even code.
    x = [0.75, 1.5, 3.0, 6.0, 1.5 * 2.0**-127, 1.5 * 2.0**126]
    assert rounded(x, "ue8m0").tolist() == [0.5, 2.0, 2.0, 8.0, 2.0**-127, 2.0**127]


def test_fp64_input_is_rounded_in_fp64():
    # 1.25 + 2^-30 is above the E2M1 midpoint 1.25 in FP64 but becomes the tie 1.25 (-> 1.0) if cast to FP32.
    x = torch.tensor([1.25 + 2.0**-30, 1.25], dtype=torch.float64)
    out = formats.round(x, "e2m1")
    assert out.dtype == torch.float64
    assert out.tolist() == [1.5, 1.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_inputs_are_rounded_in_fp32(dtype):
    x = torch.tensor([0.25, 0.75, 1.25, 2.5, 5.0, 7.0], dtype=dtype)
    out = formats.round(x, "e2m1")
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0, 1.0, 1.0, 2.0, 4.0, 6.0]


# ----- goldens ------------------------------------------------------------------------------------------


def test_e2m1_rne_golden_values_keep_the_sign_of_zero():
    x = [-100, -0.75, -0.25, 0, 0.25, 0.5, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 100]
    expected = [-6, -1, -0.0, 0, 0, 0.5, 1, 1, 2, 2, 4, 4, 6]
    assert_same_f32_bits(rounded(x, "e2m1"), expected)
    assert np.signbit(rounded(x, "e2m1")[2])


def test_e2m1_saturates_instead_of_overflowing():
    x = [5.5, 7.0, 100.0, -100.0, -7.0, float(np.finfo(np.float32).max)]
    for mode in ALL_MODES:
        gen = torch.Generator().manual_seed(0)
        out = formats.round(as_t(x), "e2m1", mode, generator=gen).tolist()
        assert out[1:] == [6.0, 6.0, -6.0, -6.0, 6.0], mode
    assert rounded([5.5], "e2m1").tolist() == [6.0]  # above the 4|6 midpoint 5


def test_ue5m3_rne_golden_values():
    x = [0, 2.0**-18, 2.0**-17, 2.0**-14, 61440, 100000]
    assert rounded(x, "ue5m3").tolist() == [0, 0, 2.0**-17, 2.0**-14, 61440, 61440]


def test_sf_golden_at_0_75_rounds_up_from_r_128():
    x = as_t([0.75, 0.75])
    out = formats.round(x, "e2m1", "sf", random_bits=torch.tensor([127, 128]))
    assert out.tolist() == [0.5, 1.0]


@pytest.mark.parametrize(("value", "ups"), [(0.75, 128), (0.625, 64)])
def test_sf_golden_round_up_counts_over_all_256_draws(value, ups):
    out = formats.round(torch.full((256,), value), "e2m1", "sf", random_bits=torch.arange(256))
    lo, hi = grid_neighbours(Fraction(value), "e2m1")
    assert int((out == float(hi)).sum()) == ups
    assert int((out == float(lo)).sum()) == 256 - ups


# ----- stochastic rounding: exact counts over every draw ------------------------------------------------


def _intervals(name: str) -> list[tuple[Fraction, Fraction]]:
    """A few adjacent (lo, hi) value pairs: subnormal, low normal, mid-range, top of range."""
    mags = spec_magnitudes(name)
    picks = {1, len(mags) // 2, len(mags) // 2 + 1, len(mags) - 2}
    return [(mags[i], mags[i + 1]) for i in sorted(picks) if 0 <= i < len(mags) - 1]


@functools.cache
def _deltas_inputs(name: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Float32 inputs strictly inside intervals [lo, hi) of adjacent values, with many deltas.

    Returns (x, lo, hi, num, den): the exact delta = (x - lo) / (hi - lo) is num / den with den a power of two
    (x is a float32 and lo, hi are dyadic), small enough that the integer arithmetic below is exact in int64.
    """
    rng = np.random.default_rng(seed)
    sf_thresholds = (2 * rng.choice(256, 16, replace=False) + 1) / 512  # delta where SF's count steps
    te_thresholds = rng.choice(256, 16, replace=False) / 256  # delta where SR_TE's count steps
    edges = [1 / 1024, 1 / 512 - 2**-20, 1 / 512, 3 / 512, 511 / 512 + 2**-12]
    grid = np.concatenate(
        [
            np.arange(0, 64) / 64,
            sf_thresholds,
            sf_thresholds - 2**-20,
            te_thresholds,
            te_thresholds - 2**-20,
            np.array(edges),
            rng.uniform(0, 1, 24),
        ]
    )
    xs, los, his, nums, dens = [], [], [], [], []
    for lo, hi in _intervals(name):
        x = (float(lo) + grid * float(hi - lo)).astype(np.float32)
        x = np.unique(x[(x >= float(lo)) & (x < float(hi))])
        for v in x.tolist():
            delta = (Fraction(v) - lo) / (hi - lo)
            assert delta.denominator < 2**40
            xs.append(v)
            los.append(float(lo))
            his.append(float(hi))
            nums.append(delta.numerator)
            dens.append(delta.denominator)
    return (
        np.array(xs, dtype=np.float32),
        np.array(los),
        np.array(his),
        np.array(nums, dtype=np.int64),
        np.array(dens, dtype=np.int64),
    )


def _all_draws(x: np.ndarray, fmt, mode: str) -> torch.Tensor:
    """Round every element of x under all 256 draws r (rows)."""
    xt = as_t(x).expand(256, -1)
    bits = torch.arange(256).unsqueeze(1).expand(256, x.size)
    return formats.round(xt, fmt, mode, random_bits=bits)


def _count_ups(out: torch.Tensor, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    o = out.double().numpy()
    ups, downs = (o == hi).sum(0), (o == lo).sum(0)
    assert np.all(ups + downs == 256), "every draw lands on lo or hi"
    return ups


# The spec's rules with delta = num/den, multiplied through by 512 * den (exact integers):
#   SF:    delta + (2r + 1)/512 >= 1   <=>  512 num + (2r + 1) den >= 512 den
#   SR_TE: delta + r/256 >= 1          <=>  256 num + r den >= 256 den
EXACT_RULES = {
    "sf": lambda num, den, r: 512 * num + (2 * r + 1) * den >= 512 * den,
    "sr_te": lambda num, den, r: 256 * num + r * den >= 256 * den,
}


@pytest.mark.parametrize("fmt", fmt_params())
@pytest.mark.parametrize("mode", ["sf", "sr_te"])
def test_8bit_stochastic_round_up_count_equals_the_exact_rule(fmt, mode):
    x, lo, hi, num, den = _deltas_inputs(fmt.name, seed=4)
    out = _all_draws(x, fmt, mode)
    r = np.arange(256)[:, None]
    expected = EXACT_RULES[mode](num[None, :], den[None, :], r)  # (256, n): enumerate every draw
    assert np.array_equal(_count_ups(out, lo, hi), expected.sum(0))
    # Not just the count: exactly the draws the rule names round up.
    assert np.array_equal(out.double().numpy() == hi, expected)
    if fmt.signed:  # negative inputs round away from zero with the same draws
        assert torch.equal(_all_draws(-x[::7], fmt, mode), -out[:, ::7])


@pytest.mark.parametrize("fmt", fmt_params())
def test_sf_expectation_is_delta_rounded_to_1_over_256_and_unbiased_within_1_over_512(fmt):
    x, lo, hi, num, den = _deltas_inputs(fmt.name, seed=5)
    ups = _count_ups(_all_draws(x, fmt, "sf"), lo, hi)
    # P(up) = ups/256 = delta rounded to the nearest 1/256, ties up: ups = floor(256 delta + 1/2).
    assert np.array_equal(ups, (512 * num + den) // (2 * den))
    # E[round(x)] - x = (hi - lo) (ups/256 - delta), and |ups/256 - delta| <= 1/512 <=> |512 num - 2 ups den| <= den.
    assert np.all(np.abs(512 * num - 2 * ups * den) <= den)
    assert np.all(ups[512 * num < den] == 0)  # delta < 1/512 never rounds up
    assert np.any(512 * num < den) and np.any((512 * num >= den) & (ups == 1))


def test_sr_rounds_up_iff_r_is_below_delta_times_2_to_53():
    # x = 1 + 0.5 * delta on E2M1's [1, 1.5] interval with delta = 3/8: threshold r < 3 * 2^50.
    x = torch.full((4,), 1.1875, dtype=torch.float64)
    threshold = 3 * 2**50
    bits = torch.tensor([0, threshold - 1, threshold, 2**53 - 1])
    assert formats.round(x, "e2m1", "sr", random_bits=bits).tolist() == [1.5, 1.5, 1.0, 1.0]


@pytest.mark.parametrize("fmt", fmt_params(("e2m1", "e4m3", "ue5m3")))
def test_sr_mean_matches_the_exact_value_statistically(fmt):
    x, lo, hi, num, den = _deltas_inputs(fmt.name, seed=6)
    x, lo, hi, p = x[::20], lo[::20], hi[::20], num[::20] / den[::20]
    draws = 4000
    gen = torch.Generator().manual_seed(7)
    out = formats.round(as_t(x).expand(draws, -1), fmt, "sr", generator=gen).double().numpy()
    p_hat = (out == hi).mean(0)
    assert np.all((out == hi) | (out == lo))
    # Binomial proportion: within 6 standard errors (fixed seed, so deterministic); p = 0 is exact.
    stderr = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(p_hat - p) <= 6 * stderr)
    assert np.all(p_hat[p == 0] == 0)


@pytest.mark.parametrize("mode", STOCHASTIC)
def test_mean_of_50_stochastic_draws_has_lower_rmse_than_rne(mode):
    """Transformer Engine's statistical SR check, on E2M1 payload-range values."""
    gen = torch.Generator().manual_seed(8)
    x = (torch.rand(4096, generator=gen) * 2 - 1) * 6
    rne = formats.round(x, "e2m1")
    mean = formats.round(x.expand(50, -1), "e2m1", mode, generator=gen).mean(0)
    rmse = lambda y: float(((y - x) ** 2).mean().sqrt())  # noqa: E731
    assert rmse(mean) < rmse(rne)


@pytest.mark.parametrize("mode", STOCHASTIC)
def test_generator_seed_reproduces_the_random_bits(mode):
    x = torch.linspace(-5.9, 5.9, 301)
    a = formats.round(x, "e2m1", mode, generator=torch.Generator().manual_seed(11))
    b = formats.round(x, "e2m1", mode, generator=torch.Generator().manual_seed(11))
    bits = formats.random_bits_for(x.shape, mode, torch.Generator().manual_seed(11))
    c = formats.round(x, "e2m1", mode, random_bits=bits)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert bits.dtype == torch.int64
    assert 0 <= int(bits.min()) and int(bits.max()) < 2 ** Rounding(mode).random_bit_count
    d = formats.round(x, "e2m1", mode, generator=torch.Generator().manual_seed(12))
    assert not torch.equal(a, d)


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_deterministic_modes_draw_no_random_bits(mode):
    assert formats.random_bits_for((3,), mode) is None
    assert Rounding(mode).random_bit_count == 0


@pytest.mark.parametrize("mode", STOCHASTIC)
def test_zero_elements_consume_random_bits_and_stay_zero(mode):
    n = Rounding(mode).random_bit_count
    x = torch.tensor([0.0, 0.75, -0.0, 0.75])  # 0.75: delta = 1/2 between 0.5 and 1
    down, up = (2**n - 1, 0) if mode == "sr" else (0, 2**n - 1)  # SR: up iff r < delta 2^53; else r large
    # Element 1 gets a draw that rounds down, element 3 one that rounds up: draws are positional, and the
    # zeros at 0 and 2 take the opposite draws without moving.
    bits = torch.tensor([up, down, down, up])
    out = formats.round(x, "e2m1", mode, random_bits=bits)
    assert_same_f32_bits(out.numpy(), [0.0, 0.5, -0.0, 1.0])
    # With a generator the zeros take their draws too: same as drawing bits for the full shape.
    x = torch.tensor([0.0] * 5 + [0.75] * 200)
    drawn = formats.round(x, "e2m1", mode, generator=torch.Generator().manual_seed(3))
    explicit = formats.round(
        x, "e2m1", mode, random_bits=formats.random_bits_for(x.shape, mode, torch.Generator().manual_seed(3))
    )
    assert torch.equal(drawn, explicit)
    assert drawn[:5].eq(0).all()


# ----- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", fmt_params(UNSIGNED_FORMAT_NAMES))
def test_unsigned_format_rejects_negative_input_naming_the_tensor(fmt):
    with pytest.raises(ValueError, match=r"'dY'.*negative|negative.*'dY'"):
        formats.round_to_format(torch.tensor([1.0, -2.0]), fmt, name="dY")
    # -0.0 is not negative: it rounds to +0 (unsigned formats have no sign).
    if fmt.has_zero:
        assert_same_f32_bits(formats.round(torch.tensor([-0.0]), fmt).numpy(), [0.0])


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("fmt", fmt_params(("e2m1", "ue5m3")))
def test_non_finite_input_raises_naming_the_tensor(fmt, bad):
    with pytest.raises(ValueError, match="'act'"):
        formats.round_to_format(torch.tensor([1.0, bad]), fmt, name="act")
    with pytest.raises(ValueError, match="non-finite"):
        formats.encode(torch.tensor([bad]), fmt)


@pytest.mark.parametrize("mode", STOCHASTIC)
def test_malformed_random_bits_raise(mode):
    x = torch.tensor([1.0, 2.0])
    n = Rounding(mode).random_bit_count
    with pytest.raises(ValueError, match="shape"):
        formats.round(x, "e2m1", mode, random_bits=torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="lie in"):
        formats.round(x, "e2m1", mode, random_bits=torch.tensor([0, 2**n]))
    with pytest.raises(ValueError, match="lie in"):
        formats.round(x, "e2m1", mode, random_bits=torch.tensor([-1, 0]))
    for dtype in (torch.float32, torch.bool):
        with pytest.raises(TypeError, match="integer"):
            formats.round(x, "e2m1", mode, random_bits=torch.zeros(2, dtype=dtype))


@pytest.mark.parametrize("mode", DETERMINISTIC)
def test_deterministic_mode_rejects_random_bits(mode):
    with pytest.raises(ValueError, match="deterministic"):
        formats.round(torch.tensor([1.0]), "e2m1", mode, random_bits=torch.tensor([0]))


def test_unknown_format_name_raises_listing_the_known_formats():
    with pytest.raises(ValueError, match="e9m9") as info:
        formats.round(torch.tensor([1.0]), "e9m9")
    for name in formats.FORMATS:
        assert name in str(info.value)
    with pytest.raises(TypeError):
        formats.get(3)
    assert formats.get("UE5M3") is formats.UE5M3


def test_unknown_rounding_mode_raises():
    with pytest.raises(ValueError, match="nearest"):
        formats.round(torch.tensor([1.0]), "e2m1", "nearest")


# ----- properties ---------------------------------------------------------------------------------------

PROPERTY = settings(max_examples=25, deadline=None)


def _special_values(name: str) -> list[float]:
    table = spec_magnitudes_f64(name)
    mids = (table[:-1] + table[1:]) / 2
    return sorted(
        {float(v) for v in np.concatenate([table, mids, [table[-1] * 1.5]]).astype(np.float32) if np.isfinite(v)}
    )


def format_floats(name: str) -> st.SearchStrategy[float]:
    """float32 values: anything finite, the format's range, and its values and midpoints (both signs)."""
    top = min(float(spec_magnitudes_f64(name)[-1]) * 4, float(np.finfo(np.float32).max))
    base = st.one_of(
        st.floats(width=32, allow_nan=False, allow_infinity=False),
        st.floats(min_value=-top, max_value=top, width=32),
        st.sampled_from(_special_values(name)).flatmap(lambda v: st.sampled_from([v, -v])),
    )
    return base if SPEC_FIELDS[name].signed else base.map(abs)


def format_arrays(name: str) -> st.SearchStrategy[np.ndarray]:
    return st.lists(format_floats(name), min_size=1, max_size=48).map(lambda v: np.array(v, dtype=np.float32))


def _round_all_modes(x: np.ndarray, fmt, seed: int):
    """{mode: (rounded, random_bits)} with the bits drawn from ``seed``."""
    out = {}
    for mode in ALL_MODES:
        bits = formats.random_bits_for(x.shape, mode, torch.Generator().manual_seed(seed))
        out[mode] = (formats.round(as_t(x), fmt, mode, random_bits=bits).numpy(), bits)
    return out


@pytest.mark.parametrize("fmt", fmt_params())
@PROPERTY
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_rounding_is_idempotent(fmt, data, seed):
    x = data.draw(format_arrays(fmt.name))
    once = _round_all_modes(x, fmt, seed)
    # Rounding a representable value again, in any mode and with any draws, returns it unchanged.
    values = np.concatenate([v for v, _ in once.values()])
    for twice, _ in _round_all_modes(values, fmt, seed + 1).values():
        assert_same_f32_bits(twice, values)


@pytest.mark.parametrize("fmt", fmt_params())
@pytest.mark.parametrize("mode", DETERMINISTIC)
@PROPERTY
@given(data=st.data())
def test_deterministic_rounding_is_monotone(fmt, mode, data):
    x = np.sort(data.draw(format_arrays(fmt.name)))
    out = rounded(x, fmt, mode)
    assert np.all(np.diff(out.astype(np.float64)) >= 0)


@pytest.mark.parametrize("fmt", fmt_params(SIGNED_FORMAT_NAMES))
@PROPERTY
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_signed_rounding_is_sign_symmetric_in_every_mode(fmt, data, seed):
    x = data.draw(format_arrays(fmt.name))
    pos, neg = _round_all_modes(x, fmt, seed), _round_all_modes(-x, fmt, seed)
    for mode in ALL_MODES:
        assert_same_f32_bits(neg[mode][0], -pos[mode][0])


@pytest.mark.parametrize("fmt", fmt_params())
@PROPERTY
@given(data=st.data(), seed=st.integers(0, 2**31))
def test_rounding_saturates_at_max_finite_and_lands_on_a_nearest_value(fmt, data, seed):
    x = data.draw(format_arrays(fmt.name))
    table = spec_magnitudes_f64(fmt.name)
    for mode, (out, _) in _round_all_modes(x, fmt, seed).items():
        assert np.all(np.abs(out) <= fmt.max_finite), mode
        assert np.all(np.isfinite(out))
        lo, hi = neighbours_f64(x, fmt.name)
        assert np.all((np.abs(out) == lo) | (np.abs(out) == hi)), mode
        # The sign (also of zero) is kept by signed formats; unsigned results are never -0.0.
        assert np.array_equal(np.signbit(out), np.signbit(x) if fmt.signed else np.zeros(x.shape, bool))
        if mode == "rtz":
            inside = np.abs(x) >= table[0]  # formats without zero cannot round below their smallest value
            assert np.all(np.abs(out[inside]) <= np.abs(x[inside]))
        if mode == "rne":
            assert_same_f32_bits(out, reference_round(x, fmt.name, "rne"), inputs=x)


@pytest.mark.parametrize("fmt", fmt_params())
@pytest.mark.parametrize("mode", DETERMINISTIC)
@PROPERTY
@given(data=st.data())
def test_rounding_commutes_with_power_of_two_scaling_inside_the_normal_range(fmt, mode, data):
    lo = max(fmt.min_normal, 2.0**-126)  # stay in FP32's normal range so x * 2^k is exact
    x = data.draw(st.floats(min_value=lo, max_value=fmt.max_finite, width=32))
    lo_k = math.ceil(math.log2(lo / x))
    hi_k = math.floor(math.log2(fmt.max_finite / x))
    k = data.draw(st.integers(lo_k, hi_k))
    if fmt.mantissa_bits == 0 and mode == "rne":
        # With no fraction bits RNE ties go to the even *exponent*: only even shifts keep the parity.
        k -= k % 2
    y = np.float32(math.ldexp(x, k))
    if not (lo <= y <= fmt.max_finite):
        return
    if fmt.signed and data.draw(st.booleans()):
        x, y = -x, -y
    assert_same_f32_bits(rounded([y], fmt, mode), np.float32([math.ldexp(float(rounded([x], fmt, mode)[0]), k)]))


# ----- the reference implementations' FP32 forms of the 8-bit stochastic modes -------------------------------

_LIBM = ctypes.CDLL(ctypes.util.find_library("m"))
_LIBM.fmaf.restype = ctypes.c_float
_LIBM.fmaf.argtypes = [ctypes.c_float] * 3
F32 = np.float32


def _paper_sf_e2m1(x: float, r: int) -> float:
    """The paper's kernel (MrHuff/ue5m3-fp4 backends/triton/_rounding.py, StochasticFast) for E2M1, in FP32:
    exponent clamped at 1 - bias = 0, quantum exponent e - precision + 1, delta + (2r+1) * 2^-9 as one FP32 add."""
    m = F32(abs(x))
    if m == 0:
        return math.copysign(0.0, x)
    _, frexp_exponent = np.frexp(m)
    quantum = max(int(frexp_exponent) - 1, 0) - 1
    significand = F32(np.ldexp(m, -quantum))
    lower = F32(np.floor(significand))
    delta = F32(significand - lower)
    midpoint = F32(2 * r + 1) * F32(2.0**-9)
    up = F32(delta + midpoint) >= F32(1.0)
    return math.copysign(min(float(np.ldexp(F32(lower + F32(up)), quantum)), 6.0), x)


def _te_stochastic_round_fp4_e2m1(x: float, rbits8: int) -> float:
    """Transformer Engine's software SR (common/util/ptx.cuh stochastic_round_fp4_e2m1), with libm's fmaf."""
    u = F32(rbits8 & 0xFF) * F32(1.0 / 256.0)
    a = F32(abs(x))
    step = F32(2.0) if a >= 4 else (F32(1.0) if a >= 2 else F32(0.5))
    t = F32(_LIBM.fmaf(float(u), float(step), float(a)))
    step_t = F32(2.0) if t >= 4 else (F32(1.0) if t >= 2 else F32(0.5))
    inv_step_t = F32(0.5) if t >= 4 else (F32(1.0) if t >= 2 else F32(2.0))
    q = min(F32(np.floor(t * inv_step_t)) * step_t, F32(6.0))
    return math.copysign(float(q), x)


def _fine_inputs(seed: int, n: int = 3000) -> np.ndarray:
    """Payload inputs with many significant bits, weighted toward |x| < 0.25 where FP32 sums round."""
    rng = np.random.default_rng(seed)
    tiny = rng.uniform(0, 0.25, n) * np.exp2(-rng.integers(0, 24, n))
    wide = rng.uniform(0, 7, n)
    x = np.concatenate([tiny, wide, [1 / 1024 - 2.0**-31, 1 / 512 - 2.0**-40, 6.0, 6.5, 100.0]]).astype(F32)
    return x * np.where(rng.random(x.size) < 0.3, F32(-1), F32(1))


@pytest.mark.parametrize(
    ("mode", "reference"), [("sf", _paper_sf_e2m1), ("sr_te", _te_stochastic_round_fp4_e2m1)], ids=["sf", "sr_te"]
)
def test_8bit_stochastic_modes_compute_as_their_reference_kernels_in_fp32(mode, reference):
    x = _fine_inputs(7)
    rng = np.random.default_rng(8)
    r = rng.integers(0, 256, x.size)
    r[-5:] = 255
    out = formats.round_to_format(torch.from_numpy(x), "e2m1", mode, random_bits=torch.from_numpy(r))
    expected = np.array([reference(float(v), int(b)) for v, b in zip(x, r, strict=True)], dtype=F32)
    assert np.array_equal(out.numpy().view(np.int32), expected.view(np.int32))


@pytest.mark.parametrize("mode", ["sf", "sr_te"])
def test_fp32_forms_differ_from_exact_comparisons_near_the_threshold_for_small_inputs(mode):
    """The case that separates the readings: for |x| < 0.25 the FP32 sum (or fma) can reach the next grid point
    where exact arithmetic stays below it; the kernels' FP32 form is what the paper's numbers came from."""
    # on the 0.5 grid delta = 2x: sf needs delta just below 1/512, sr_te just below 1/256
    x = torch.tensor([(1 / 1024 if mode == "sf" else 1 / 512) - 2.0**-31], dtype=torch.float32)
    r = torch.tensor([255])
    out = formats.round_to_format(x, "e2m1", mode, random_bits=r)
    # sf: delta + 511/512 = 1 - 2^-30 rounds to 1.0f; sr_te: fma(255/256, 0.5, x) = 0.5 - 2^-31 rounds to 0.5f
    assert float(out) == 0.5
    num, den = Fraction(float(x)) * 2, 1
    assert not EXACT_RULES[mode](num.numerator, num.denominator * den, 255)  # exact arithmetic: stays at 0


def test_e2m1_codes_by_table_are_the_codes_of_every_e2m1_value():
    """The FP4 payload path (one table lookup) against decode: every E2M1 value, -0.0 included, in a
    non-contiguous 3-D tensor, gives its own code."""
    codes = formats.E2M1.finite_codes()
    values = formats.decode(codes, formats.E2M1)
    grid = values.repeat(6, 2).reshape(6, 2, 16).transpose(0, 2)  # [16, 2, 6], not contiguous
    got = formats.e2m1_codes(grid)
    assert got.dtype == torch.uint8 and got.shape == grid.shape
    assert torch.equal(got, codes.repeat(6, 2).reshape(6, 2, 16).transpose(0, 2).to(torch.uint8))
    assert torch.equal(formats.codes_of_values(grid, formats.E2M1), got.to(torch.int64))
