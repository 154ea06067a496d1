"""Tests for block quantization (numerics spec section 3): UE5M3, NVFP4 (Transformer Engine) and MXFP4.

Oracles: slow scalar references written here with numpy float32 scalars in exactly the spec's operation order
(section 3.1 steps 1-7 and section 3.2), torchao's ``nvfp4_quantize`` and ``to_mx``, and the spec's worked
cases. Every comparison is bit-exact unless a comment says otherwise. Oracle tests run on both backends (the
torch reference and the fused C kernel that ``backend="auto"`` picks when it compiles).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchao.prototype.mx_formats.config import ScaleCalculationMode
from torchao.prototype.mx_formats.mx_tensor import to_mx
from torchao.prototype.mx_formats.nvfp4_tensor import nvfp4_quantize

from helpers.bits import assert_same_f32_bits
from helpers.format_oracles import rne_scalar, spec_magnitudes
from ue5m3.numerics import formats
from ue5m3.numerics.checks import DeferredChecks
from ue5m3.numerics.formats import UE8M0
from ue5m3.numerics.kernels import cpu as cpu_kernel
from ue5m3.numerics.quantize import quantize
from ue5m3.numerics.quantized import pack_fp4, unpack_fp4
from ue5m3.numerics.schemes import SCHEMES, BlockScheme, DequantizeOrder, ScaleOrder, ScaleRule, get_scheme

F32 = np.float32
FP32_MAX = F32(np.finfo(np.float32).max)
U = 61440.0  # UE5M3 max finite
NAMED = ("ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4")
TENSOR_SCALED = ("ue5m3_b16", "ue5m3_b32", "nvfp4")


def _reference(scheme, value):
    """A tensor reference for schemes that use one (the MX rules refuse one: it would be ignored)."""
    return value if get_scheme(scheme).uses_tensor_amax else None


E2M1_VALUES = {float(v) for v in spec_magnitudes("e2m1")} | {-float(v) for v in spec_magnitudes("e2m1")}

BACKENDS = [
    pytest.param("torch", id="torch"),
    pytest.param(
        "cpu_kernel",
        id="cpu_kernel",
        marks=pytest.mark.skipif(not cpu_kernel.available(), reason="no C compiler for the CPU kernel"),
    ),
]


def np_of(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# ----- slow scalar references ---------------------------------------------------------------------------


def _e2m1(v: np.float32) -> np.float32:
    """RNE onto E2M1 with saturation; the sign (also of zero) is kept."""
    return np.copysign(F32(float(rne_scalar(Fraction(float(v)), "e2m1"))), v)


@dataclasses.dataclass
class Reference:
    scales: np.ndarray  # (rows, n_blocks) scale values after repair
    decode_scales: np.ndarray  # (rows, n_blocks) S
    payload: np.ndarray  # (rows, cols)
    dequantized: np.ndarray  # (rows, cols)
    zero_rounded: int
    saturated: int


def _global_scale(target: float, g: np.float32) -> np.float32:
    """Step 1 / S_enc: (T * F) / g in FP32, capped at FP32 max, 1 when g == 0 (or the quotient underflows)."""
    if g == 0:
        return F32(1)
    with np.errstate(over="ignore"):
        big = (F32(target) * F32(6)) / F32(g)
    big = min(big, FP32_MAX)
    return F32(1) if big == 0 else F32(big)


def ue5m3_reference(x: np.ndarray, block: int, target: float, g: float, rounding=None) -> Reference:
    """The paper's UE5M3 quantizer, spec section 3.1 steps 1-7, one float32 scalar operation at a time."""
    rows, cols = x.shape
    g = F32(g)
    big_g = _global_scale(target, g)  # step 1
    inv_g = F32(1) / big_g  # the FP32 reciprocal, the decode multiplier
    inv6 = F32(1) / F32(6)  # the FP32 constant 1/6
    g_over_6 = big_g * inv6  # step 3: first G times 1/6 ...
    nb = cols // block
    out = Reference(np.zeros((rows, nb), F32), np.zeros((rows, nb), F32), np.zeros_like(x), np.zeros_like(x), 0, 0)
    with np.errstate(over="ignore"):
        for r in range(rows):
            for b in range(nb):
                blk = x[r, b * block : (b + 1) * block]
                a = max(abs(v) for v in blk)  # step 2
                u = a * g_over_6  # ... then times a_B
                out.saturated += bool(u > F32(U))
                u = min(u, F32(U))  # step 4
                code = F32(float(rne_scalar(Fraction(float(u)), "ue5m3")))
                if code == 0:  # step 5: zero-scale repair
                    out.zero_rounded += 1
                    code = F32(1)
                s = code * inv_g  # step 6
                # FP32 reciprocal, capped at FP32 max (as TE's encode multiplier) so that x * m stays finite
                mult = min(F32(1) / s, FP32_MAX)
                for j, v in enumerate(blk):
                    p = _e2m1(np.clip(v * mult, F32(-6), F32(6)))  # step 7 (clip = saturation, same result)
                    out.payload[r, b * block + j] = p
                    out.dequantized[r, b * block + j] = (p * code) * inv_g  # the paper's kernel: encoded * (1/G)
                out.scales[r, b], out.decode_scales[r, b] = code, s
    return out


def nvfp4_reference(x: np.ndarray, amax: float, order: str = "te") -> Reference:
    """NVFP4 as Transformer Engine computes it (spec section 3.2), float32 scalars; ``order`` of the scale."""
    rows, cols = x.shape
    amax = F32(amax)
    s_enc = _global_scale(448.0, amax)
    s_dec = F32(1) / s_enc
    inv6 = F32(1) / F32(6)
    factor_inv = F32(1) / (F32(6) * F32(448))  # TE's constexpr 1.0f / (6.0f * E4M3_MAX)
    nb = cols // 16
    out = Reference(np.zeros((rows, nb), F32), np.zeros((rows, nb), F32), np.zeros_like(x), np.zeros_like(x), 0, 0)
    with np.errstate(over="ignore"):
        for r in range(rows):
            for b in range(nb):
                blk = x[r, b * 16 : (b + 1) * 16]
                a = max(abs(v) for v in blk)
                if order == "te":
                    u = a * (s_enc * inv6)
                elif order == "te_legacy":
                    u = (a / F32(6)) * s_enc
                else:  # torchao: (amax_blk / 6) / (amax / 2688)
                    per_tensor = amax / F32(2688) if amax != 0 else F32(1)
                    u = (a / F32(6)) / per_tensor
                out.saturated += bool(u > F32(448))
                s = F32(float(rne_scalar(Fraction(float(min(u, F32(448)))), "e4m3")))  # satfinite, one RNE
                out.zero_rounded += bool(s == 0)
                dec = s * s_dec
                enc = min(F32(1) / dec, FP32_MAX) if dec != 0 else FP32_MAX
                for j, v in enumerate(blk):
                    p = _e2m1(np.clip(v * enc, F32(-6), F32(6)))
                    out.payload[r, b * 16 + j] = p
                    # TE's dequantize kernel: final_scale = (s * amax) * factor_inv; out = q * final_scale
                    out.dequantized[r, b * 16 + j] = p * ((s * amax) * factor_inv)
                out.scales[r, b], out.decode_scales[r, b] = s, dec
    return out


def assert_matches_reference(q, ref: Reference):
    assert_same_f32_bits(q.scales, ref.scales, "scales")
    assert_same_f32_bits(q.decode_scales, ref.decode_scales, "decode scales")
    assert_same_f32_bits(q.payload, ref.payload, "payload")
    assert_same_f32_bits(q.dequantize(), ref.dequantized, "dequantized")
    assert int(q.zero_rounded_blocks) == ref.zero_rounded
    assert int(q.saturated_blocks) == ref.saturated


def hard_tensor(seed: int, rows: int = 6, cols: int = 64) -> np.ndarray:
    """Rows of very different magnitudes, exact E2M1 midpoints, a zero block, signed zeros, powers of two."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-40, 40, (rows, 1)))
    x[0, :16] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 2) * np.repeat([1.0, -1.0], 8)
    x[1, :16] = 0.0
    x[1, 16:20] = -0.0
    x[2, 16:32] = np.exp2(rng.integers(-10, 10, 16)) * rng.choice([-1, 1], 16)
    x[3, :16] *= 1e-9  # a block far below the rest of its row
    return x.astype(F32)


STALENESS = [None, 1.0, 0.5, 0.1, 1e-3, 1e-12, 3.0, 1e4, 1e12, "random-a", "random-b", "random-c"]


def stale_reference(x: np.ndarray, staleness) -> float | None:
    """The tensor reference for a staleness factor (None: current amax); "random-*": log-uniform in e^+-25."""
    if staleness is None:
        return None
    if isinstance(staleness, str):
        staleness = float(np.exp(np.random.default_rng(zlib.crc32(staleness.encode())).uniform(-25, 25)))
    return float(F32(float(np.abs(x).max()) * staleness))


# ----- shape contract -----------------------------------------------------------------------------------

LAYOUTS = {
    # id: (shape, kwargs, scale-shape function of (shape, B))
    "last-axis": ((4, 64), {}, lambda s, b: (s[0], s[1] // b)),
    "axis0": ((64, 4), {"axis": 0}, lambda s, b: (s[0] // b, s[1])),
    "3d-axis1": ((2, 64, 3), {"axis": 1}, lambda s, b: (s[0], s[1] // b, s[2])),
    "3d-last": ((3, 2, 64), {"axis": -1}, lambda s, b: (s[0], s[1], s[2] // b)),
    "2d-tiles": ((64, 96), {"two_d": True}, lambda s, b: (s[0] // b, s[1] // b)),
}


def test_named_schemes_are_the_four_of_the_spec_the_4over6_variants_and_the_format_studys():
    four_over_six = {f"nvfp4_4over6_{s}" for s in ("mae", "mse", "abs_max")} | {
        "ue5m3_b16_4over6_mae",
        "ue5m3_b16_4over6_mse",
    }
    study = {"ue5m3_b16_all_finite", "ue5m3_b16_alto", "mxfp4_rceil", "mxfp4_b16", "mxfp4_b16_rceil"}
    assert set(SCHEMES) == set(NAMED) | four_over_six | study
    assert [SCHEMES[n].scale.max_finite for n in ("ue5m3_b16", "ue5m3_b16_all_finite", "ue5m3_b16_alto")] == [
        61440.0,
        122880.0,
        114688.0,
    ]  # the three top-code conventions of numerics spec section 1, otherwise the proposed scheme
    assert {(SCHEMES[n].block_size, SCHEMES[n].scale_rule.value) for n in study if n.startswith("mxfp4")} == {
        (32, "mx_rceil"),
        (16, "mx_floor"),
        (16, "mx_rceil"),
    }
    assert {SCHEMES[n].scale_rule for n in four_over_six} == {ScaleRule.FOUR_OVER_SIX}
    assert {SCHEMES[n].target for n in four_over_six} == {256.0}
    assert [get_scheme(n).block_size for n in NAMED] == [16, 32, 16, 32]
    assert [get_scheme(n).scale.name for n in NAMED] == ["ue5m3", "ue5m3", "e4m3", "ue8m0"]
    assert [get_scheme(n).target for n in NAMED] == [448.0, 448.0, 448.0, None]


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("scheme", NAMED)
def test_public_api_shapes_follow_the_input_with_blocked_axes_divided(scheme, layout):
    shape, kwargs, scale_shape = LAYOUTS[layout]
    b = get_scheme(scheme).block_size
    x = torch.from_numpy(np.random.default_rng(0).standard_normal(shape).astype(F32))
    q = quantize(x, scheme, **kwargs)
    deq = q.dequantize()
    assert deq.dtype == torch.float32 and deq.shape == x.shape
    assert q.payload.shape == x.shape and q.payload.dtype == torch.float32
    assert set(q.payload.unique().tolist()) <= E2M1_VALUES
    assert q.payload_codes.shape == x.shape and q.payload_codes.dtype == torch.uint8
    assert torch.equal(formats.decode(q.payload_codes.long(), "e2m1"), q.payload)
    expected = scale_shape(shape, b)
    assert tuple(q.scales.shape) == tuple(q.scale_codes.shape) == tuple(q.decode_scales.shape) == expected
    assert torch.equal(formats.decode(q.scale_codes, q.scheme.scale), q.scales)
    # dequantized: UE5M3 (payload * code) * (1/G); NVFP4 TE's payload * ((s * amax) * fp32(1/2688))
    s = q.scales
    if kwargs.get("two_d"):
        s_full = s.repeat_interleave(b, 0).repeat_interleave(b, 1)
    else:
        s_full = s.repeat_interleave(b, dim=kwargs.get("axis", -1))
    if scheme == "nvfp4":
        expected_deq = q.payload * ((s_full * q.tensor_amax) * (torch.tensor(1.0) / torch.tensor(2688.0)))
    else:
        expected_deq = (q.payload * s_full) * q.global_decode_scale
    assert_same_f32_bits(deq, expected_deq, "dequantize")
    assert q.diagnostics()["blocks"] == math.prod(expected)


# ----- scalar references --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("staleness", STALENESS, ids=lambda s: f"g={s}")
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32"])
def test_ue5m3_quantizer_matches_the_scalar_spec_reference(scheme, staleness, backend):
    x = hard_tensor(seed=zlib.crc32(f"{scheme}{staleness}".encode()))
    tensor_amax = stale_reference(x, staleness)
    g = float(np.abs(x).max()) if tensor_amax is None else tensor_amax
    q = quantize(torch.from_numpy(x), scheme, tensor_amax=tensor_amax, backend=backend)
    assert float(q.tensor_amax) == g
    assert_matches_reference(q, ue5m3_reference(x, get_scheme(scheme).block_size, 448.0, g))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("target", [2048.0, 256.0, 1e-3])
def test_ue5m3_quantizer_matches_the_scalar_spec_reference_for_other_targets(target, backend):
    x = hard_tensor(seed=int(target * 1000) % 2**32)
    g = float(np.abs(x).max()) * 0.25
    q = quantize(torch.from_numpy(x), "ue5m3_b16", tensor_amax=g, target=target, backend=backend)
    assert_matches_reference(q, ue5m3_reference(x, 16, target, g))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("staleness", STALENESS, ids=lambda s: f"g={s}")
def test_nvfp4_matches_the_scalar_te_reference(staleness, backend):
    x = hard_tensor(seed=zlib.crc32(f"nvfp4{staleness}".encode()))
    tensor_amax = stale_reference(x, staleness)
    g = float(np.abs(x).max()) if tensor_amax is None else tensor_amax
    q = quantize(torch.from_numpy(x), "nvfp4", tensor_amax=tensor_amax, backend=backend)
    assert_matches_reference(q, nvfp4_reference(x, g))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("order", ["te_legacy", "torchao"])
def test_nvfp4_scale_order_variants_match_their_scalar_references(order, backend):
    x = hard_tensor(seed=17)
    scheme = dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder(order))
    g = float(np.abs(x).max())
    assert_matches_reference(quantize(torch.from_numpy(x), scheme, backend=backend), nvfp4_reference(x, g, order))


def test_nvfp4_dequantizes_in_te_kernel_order_and_offers_the_te_tests_order():
    """TE's dequantize_nvfp4.cuh: q * ((s * amax) * factor_inv); TE's PyTorch tests: (q * s) * (amax / 2688)."""
    x = hard_tensor(seed=5)
    amax = F32(np.abs(x).max())
    q = quantize(torch.from_numpy(x), "nvfp4")
    s = np.repeat(np_of(q.scales), 16, axis=1)
    factor_inv = F32(1) / (F32(6) * F32(448))
    with np.errstate(under="ignore"):
        kernel = np_of(q.payload) * ((s * amax) * factor_inv)
        tests_order = (np_of(q.payload) * s) * (amax / F32(2688))
    assert_same_f32_bits(q.dequantize(), kernel, "TE kernel dequantization")
    scheme = dataclasses.replace(get_scheme("nvfp4"), dequantize_order=DequantizeOrder.TE_TESTS)
    assert_same_f32_bits(quantize(torch.from_numpy(x), scheme).dequantize(), tests_order, "TE tests dequantization")
    # the two orders and the old ((q * s) * amax) / 2688 do differ on ordinary values
    with np.errstate(under="ignore"):
        old = ((np_of(q.payload) * s) * amax) / F32(2688)
    bits = {name: v.view(np.int32) for name, v in (("kernel", kernel), ("tests", tests_order), ("old", old))}
    assert not np.array_equal(bits["kernel"], bits["tests"])
    assert not np.array_equal(bits["old"], bits["kernel"]) and not np.array_equal(bits["old"], bits["tests"])


@pytest.mark.parametrize("order", list(DequantizeOrder))
@pytest.mark.parametrize("amax", [1.27e35, 2e35, 7.6e35, 1e36, 1e38, float(FP32_MAX)])
def test_nvfp4_dequantization_is_finite_for_huge_finite_tensor_amax(amax, order):
    """((q*s)*g)/2688 overflowed once g > FP32max/2688; TE's kernel order once g > FP32max/448. Every order here
    stays finite, and where TE's FP32 arithmetic is finite the result is TE's."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 64)) * 0.1).astype(F32)
    x[0, 0] = F32(amax)
    x[1, 17] = F32(-amax * 0.7)
    scheme = dataclasses.replace(get_scheme("nvfp4"), dequantize_order=order)
    deq = quantize(torch.from_numpy(x), scheme).dequantize()
    assert torch.isfinite(deq).all()
    assert float(deq[0, 0]) == pytest.approx(float(F32(amax)), rel=0.02)


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("value", [float(FP32_MAX), float(FP32_MAX) * 0.99, 3e38, 1.27e35])
@pytest.mark.parametrize("stale", [None, 1.0, 0.1])
def test_dequantization_is_finite_near_fp32_max_with_current_or_stale_references(scheme, value, stale):
    """A block scale that rounds up (or a stale reference) can put the quantized value above FP32 max: it
    saturates there instead of becoming inf."""
    x = torch.zeros(2, 32)
    x[0, 0], x[1, 5], x[0, 7] = value, -value * 0.5, 1.0
    reference = None if stale is None else value * stale
    for backend in ("torch", "cpu_kernel") if cpu_kernel.available() else ("torch",):
        q = quantize(x, scheme, tensor_amax=_reference(scheme, reference), backend=backend)
        assert torch.isfinite(q.dequantize()).all()
        if scheme.startswith("ue5m3"):  # 137x headroom: the value survives (E4M3 and UE8M0 saturate lower)
            assert float(q.dequantize()[0, 0]) == pytest.approx(value, rel=0.13)


def test_te_kernel_dequantization_equals_te_where_te_is_finite_and_is_wide_range_exact_beyond():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((2, 32)) * 1e34).astype(F32)  # amax ~ 3e34: (s * amax) stays finite in FP32
    q = quantize(torch.from_numpy(x), "nvfp4")
    s = np.repeat(np_of(q.scales), 16, axis=1)
    amax = F32(np.abs(x).max())
    factor_inv = F32(1) / F32(2688)
    assert_same_f32_bits(q.dequantize(), np_of(q.payload) * ((s * amax) * factor_inv), "finite range")
    big = x * F32(1e4)  # amax ~ 3e38: s * amax overflows FP32; the same roundings 2^64 lower, scaled back
    qb = quantize(torch.from_numpy(big), "nvfp4")
    sb, ab = np.repeat(np_of(qb.scales), 16, axis=1), F32(np.abs(big).max())
    low = (sb * (ab * F32(2.0**-64))) * factor_inv
    assert_same_f32_bits(qb.dequantize(), np_of(qb.payload) * (low * F32(2.0**64)), "wide range")


# ----- tricky cases from the spec ------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_38912_midpoint_rounds_to_40960_in_te_order_not_36864(backend):
    value, reference = F32(7.209771652307365e-15), F32(8.30072435974513e-17)
    big_g = (F32(448) * F32(6)) / reference
    u_te = value * (big_g * (F32(1) / F32(6)))
    u_reassociated = (value * big_g) / F32(6)
    assert u_te == F32(38912)  # exactly the midpoint of 36,864 and 40,960
    assert u_reassociated < F32(38912)
    assert rne_scalar(Fraction(float(u_reassociated)), "ue5m3") == 36864
    x = torch.zeros(16)
    x[3] = float(value)
    q = quantize(x, "ue5m3_b16", tensor_amax=float(reference), backend=backend)
    assert q.scales.tolist() == [40960.0]


def _reciprocal_vs_division_case():
    """A block whose payload input x * (1/S) lands on an E2M1 midpoint while x / S does not.

    Found by scanning E2M1 midpoints times S for one reference g and scale code; asserted, not assumed.
    """
    g = F32(0.06901384)
    big_g = _global_scale(448.0, g)
    inv_g = F32(1) / big_g
    code = F32(1.875)
    s = code * inv_g
    a = F32(code / (big_g * (F32(1) / F32(6))))  # block amax whose ideal code rounds to 1.875
    assert rne_scalar(Fraction(float(a * (big_g * (F32(1) / F32(6))))), "ue5m3") == Fraction(15, 8)
    m = F32(1) / s
    for mid in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0):
        base = F32(mid) * s
        for cand in (base, np.nextafter(base, F32(0)), np.nextafter(base, F32(np.inf))):
            by_mult, by_div = _e2m1(cand * m), _e2m1(cand / s)
            if by_mult != by_div and cand < a:
                return g, a, cand, by_mult, by_div
    raise AssertionError("no case found")


@pytest.mark.parametrize("backend", BACKENDS)
def test_payload_is_reciprocal_then_multiply_not_division(backend):
    g, a, x_val, by_mult, by_div = _reciprocal_vs_division_case()
    x = torch.zeros(16)
    x[0], x[1] = float(a), float(x_val)
    q = quantize(x, "ue5m3_b16", tensor_amax=float(g), backend=backend)
    assert q.scales.tolist() == [1.875]
    assert q.payload[1].item() == float(by_mult) != float(by_div)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32"])
def test_all_zero_tensor_gives_zeros_and_unit_scales_counted_as_zero_rounded(scheme, backend):
    x = torch.zeros(4, 64)
    q = quantize(x, scheme, backend=backend)
    n_blocks = 4 * 64 // get_scheme(scheme).block_size
    assert torch.equal(q.dequantize(), x) and torch.equal(q.payload, x)
    assert q.scales.eq(1.0).all()
    assert q.scale_codes.eq(15 << 3).all()  # 1.0 = exponent field 15, fraction 0
    assert int(q.zero_rounded_blocks) == n_blocks and int(q.saturated_blocks) == 0
    assert float(q.global_scale) == 1.0


@pytest.mark.parametrize(
    "backend",
    BACKENDS,
)
def test_all_zero_tensor_reports_a_positive_zero_tensor_amax(backend):
    q = quantize(torch.zeros(2, 32), "ue5m3_b16", backend=backend)
    assert not torch.signbit(q.tensor_amax)
    assert math.copysign(1.0, q.diagnostics()["tensor_amax"]) == 1.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_nvfp4_zero_block_keeps_scale_zero_and_dequantizes_to_zero(backend):
    x = torch.zeros(2, 32)
    x[0, :16] = torch.linspace(-3, 3, 16)
    q = quantize(x, "nvfp4", backend=backend)
    assert q.scales[0, 1].item() == 0.0 and q.scales[1].eq(0).all()
    assert q.dequantize()[0, 16:].eq(0).all() and q.dequantize()[1].eq(0).all()
    assert torch.isfinite(q.dequantize()).all()
    z = quantize(torch.zeros(2, 32), "nvfp4", backend=backend)
    assert z.scales.eq(0).all() and z.dequantize().eq(0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_scales_at_or_below_2_to_minus_18_round_to_zero_and_are_repaired_to_one(backend):
    # g = 1 and T = 512, so u = a_B * 512 exactly for power-of-two multiples a_B (asserted).
    assert _global_scale(512.0, F32(1)) * (F32(1) / F32(6)) == F32(512)
    amaxes = [1.0, 2.0**-27, 1.5 * 2.0**-27, 2.0**-26, 2.0**-40]
    # u:      512,  2^-18 (tie -> even 0), 1.5 * 2^-18 (-> 2^-17), 2^-17, 2^-31 (-> 0)
    x = torch.zeros(len(amaxes), 16)
    x[:, 0] = torch.tensor(amaxes)
    x[:, 1] = -x[:, 0] / 3
    q = quantize(x, "ue5m3_b16", tensor_amax=1.0, target=512.0, backend=backend)
    assert q.scales[:, 0].tolist() == [512.0, 1.0, 2.0**-17, 2.0**-17, 1.0]
    assert int(q.zero_rounded_blocks) == 2
    for row in (1, 4):  # repaired blocks: S = 1 * (1/G), payload x * G rounds to zero and decodes to zero
        assert q.payload[row].eq(0).all() and q.dequantize()[row].eq(0).all()
        assert q.decode_scales[row, 0].item() == float(F32(1) / _global_scale(512.0, F32(1)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_1e_40_stays_finite_and_saturates_the_scale_at_61440(backend):
    x = torch.zeros(16)
    x[0], x[1] = 1e-40, 1e-20
    q = quantize(x, "ue5m3_b16", tensor_amax=1e-40, backend=backend)
    assert torch.isfinite(q.dequantize()).all() and torch.isfinite(q.decode_scales).all()
    assert q.scales.tolist() == [U]
    assert int(q.saturated_blocks) == 1
    assert q.payload[1].item() == 6.0  # the saturated block's payload saturates at +-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stale", [4.0, 3e-7, 1.5e5])
def test_10x_stale_growth_at_448_does_not_saturate_and_reproduces_the_value_within_4_percent(stale, backend):
    x = torch.zeros(2, 16)
    x[0, 0] = stale  # the block the reference was taken from
    x[1, 0] = 10 * stale  # "a value of 40" for the reference 4
    x[1, 1:] = torch.linspace(-stale, stale, 15)
    q = quantize(x, "ue5m3_b16", tensor_amax=stale, backend=backend)
    assert int(q.saturated_blocks) == 0
    deq = q.dequantize()[1, 0].item()
    assert abs(deq - 10 * stale) <= 0.04 * 10 * stale  # the spec's claim: within 4%


RHO = [0.5, 1.0, 15.0, 29.5, 30.0, 30.5, 60.0, 120.0, 137.0, 137.25, 240.0, 960.0, 1024.0]
TARGETS = [64.0, 256.0, 448.0, 1024.0, 2048.0, 4096.0, 61440.0, 65536.0]


@pytest.mark.parametrize(
    ("g", "backend"),
    [(2.0**-3, "torch"), (1.0, "torch"), (2.0**10, "torch"), pytest.param(1.0, "cpu_kernel", marks=BACKENDS[1].marks)],
)
def test_saturation_proposition_every_block_unsaturated_iff_t_times_rho_at_most_u(g, backend):
    """Spec 3.1: stale reference g, current values up to rho*g: no block saturates iff T*rho <= U.

    g is a power of two and T, rho have few significant bits, so u = a_B * (G * (1/6)) equals T*rho exactly
    in FP32 (asserted); the grid includes the equality cases T*rho == U (2048*30, 1024*60, 256*240, ...).
    """
    equality_cases = 0
    for target in TARGETS:
        big_g = _global_scale(target, F32(g))
        assert big_g * (F32(1) / F32(6)) == F32(target / g), "G * (1/6) is exactly T/g"
        for rho in RHO:
            # Four blocks: the largest |value| is rho * g (the current tensor amax), the others smaller.
            x = torch.from_numpy(np.repeat(np.array([rho * g, -0.5 * rho * g, 0.25 * rho * g, 0.0], F32), 16))
            q = quantize(x, "ue5m3_b16", tensor_amax=g, target=target, backend=backend)
            unsaturated = Fraction(target) * Fraction(rho) <= Fraction(U)
            equality_cases += Fraction(target) * Fraction(rho) == Fraction(U)
            assert (int(q.saturated_blocks) == 0) == unsaturated, (target, rho)
            if unsaturated:  # the ideal scale is exactly T * rho; the scale is its RNE onto UE5M3
                assert q.scales[0].item() == float(rne_scalar(Fraction(target * rho), "ue5m3"))
    assert equality_cases >= 4


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("target", "largest", "smallest"), [(448.0, 13714.0, 1.71e-6), (2048.0, 2999.0, 3.73e-7)])
def test_worked_example_reference_100_covers_the_quoted_block_amax_range(target, largest, smallest, backend):
    """Spec section 1: g = 100; a block at g gets code T; the covered block amax runs from ~1.7e-6 (T = 448) /
    3.7e-7 (T = 2048) to 13,714 / 3,000 before the scale saturates."""
    x = torch.zeros(4, 16)
    x[0, 0], x[1, 0], x[2, 0], x[3, 0] = 100.0, largest, largest * 1.01, smallest
    q = quantize(x, "ue5m3_b16", tensor_amax=100.0, target=target, backend=backend)
    scales = q.scales[:, 0].tolist()
    assert scales[0] == target
    assert scales[2] == U and int(q.saturated_blocks) == 1  # only the block above the quoted maximum
    assert scales[3] == formats.UE5M3.min_subnormal and int(q.zero_rounded_blocks) == 0


# ----- NVFP4 and MXFP4 against torchao ------------------------------------------------------------------


def _torchao_friendly(seed: int, rows: int = 32, cols: int = 128) -> torch.Tensor:
    """Random rows scaled down by at most 2^-4, so every block scale stays far above 2^-6 (asserted by the
    test): torchao clamps smaller scales up to 2^-6, which TE does not do, so there the two legitimately differ."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g)
    x = x * torch.exp2(torch.rand(rows, 1, generator=g) * -4)
    return x * torch.exp2(torch.randint(-20, 20, (1,), generator=g).float())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_nvfp4_torchao_order_matches_torchao_bit_exactly(seed, backend):
    x = _torchao_friendly(seed)
    amax = x.abs().max()
    scheme = dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder.TORCHAO)
    q = quantize(x, scheme, backend=backend)
    assert bool((q.scales >= 2.0**-6).all()), "precondition: no block scale below torchao's clamp"
    scales, packed = nvfp4_quantize(x, block_size=16, per_tensor_scale=amax / 2688)
    assert torch.equal(scales.to(torch.float32), q.scales)
    assert torch.equal(packed.view(torch.uint8), q.packed())


@pytest.mark.parametrize("backend", BACKENDS)
def test_nvfp4_block_scale_order_pins_the_spec_midpoint_case(backend):
    x = torch.zeros(2, 16)
    x[0, 0], x[1, 0] = 7516.161, 44.04001
    te = quantize(x, "nvfp4", backend=backend)
    ao = quantize(x, dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder.TORCHAO), backend=backend)
    assert te.scales[1].tolist() == [2.75]
    assert ao.scales[1].tolist() == [2.5]
    torchao_scales, _ = nvfp4_quantize(x, block_size=16, per_tensor_scale=x.abs().max() / 2688)
    assert torchao_scales.to(torch.float32)[1].tolist() == [2.5]


def _te_vs_legacy_case() -> tuple[np.float32, np.float32]:
    """(tensor amax, block amax) at which TE's and older TE's FP32 scale orders round to different E4M3 values.

    A small deterministic search: block amax a within a few ulps of (E4M3 midpoint) * 6 / S_enc.
    """
    rng = np.random.default_rng(2024)
    mags = spec_magnitudes("e4m3")
    inv6 = F32(1) / F32(6)
    for _ in range(5000):
        amax = F32(np.exp2(rng.uniform(-20, 20)))
        i = int(rng.integers(8, len(mags) - 1))
        mid = (mags[i] + mags[i + 1]) / 2
        s_enc = _global_scale(448.0, amax)
        a0 = F32(float(mid) * 6 / float(s_enc))
        for k in range(-3, 4):
            a = a0
            for _ in range(abs(k)):
                a = np.nextafter(a, F32(np.inf) if k > 0 else F32(0))
            if a > amax:
                continue
            te = rne_scalar(Fraction(float(a * (s_enc * inv6))), "e4m3")
            legacy = rne_scalar(Fraction(float((a / F32(6)) * s_enc)), "e4m3")
            if te != legacy:
                return amax, a
    raise AssertionError("no TE / TE_LEGACY midpoint case found")


@pytest.mark.parametrize("backend", BACKENDS)
def test_te_legacy_order_exists_and_differs_from_te_at_a_midpoint(backend):
    amax, a = _te_vs_legacy_case()
    x = np.zeros((2, 16), F32)
    x[0, 0], x[1, 0] = amax, a
    legacy_scheme = dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder.TE_LEGACY)
    te = quantize(torch.from_numpy(x), "nvfp4", backend=backend)
    legacy = quantize(torch.from_numpy(x), legacy_scheme, backend=backend)
    assert te.scales[1].item() != legacy.scales[1].item()
    assert_matches_reference(te, nvfp4_reference(x, float(amax), "te"))
    assert_matches_reference(legacy, nvfp4_reference(x, float(amax), "te_legacy"))


def _mx_hard_tensor(seed: int) -> torch.Tensor:
    """Random blocks over a huge range, zero blocks, amax at exact powers of two and just below/above them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(24, 128, generator=g) * torch.exp2(torch.randint(-60, 60, (24, 1), generator=g).float())
    x[0, :32] = 0.0
    x[1, 32:64] = -0.0
    for row, k in ((2, 0), (3, 5), (4, -7), (5, 40)):
        x[row, :32] = torch.rand(32, generator=g) * 2.0**k
        x[row, 7] = -(2.0**k)  # block amax exactly 2^k, attained by a negative element
        x[row, 32:64] = torch.rand(32, generator=g) * 2.0**k
        x[row, 40] = math.nextafter(2.0**k, 0)  # just below a power of two
        x[row, 64:96] = torch.rand(32, generator=g) * 2.0**k
        x[row, 70] = math.nextafter(2.0**k, math.inf)
    x[6, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0] * 4)  # midpoints under scale 2^0
    return x


MX_CEIL = BlockScheme(name="mxfp4_ceil", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_CEIL)
MX_RCEIL = BlockScheme(name="mxfp4_rceil", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_RCEIL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("scheme", "mode"),
    [
        ("mxfp4", ScaleCalculationMode.FLOOR),
        (MX_CEIL, ScaleCalculationMode.CEIL),
        (MX_RCEIL, ScaleCalculationMode.RCEIL),
    ],
    ids=["floor", "ceil", "rceil"],
)
@pytest.mark.parametrize("seed", range(3))
def test_mxfp4_matches_torchao_to_mx_bit_exactly(scheme, mode, seed, backend):
    x = _mx_hard_tensor(seed)
    q = quantize(x, scheme, backend=backend)
    scales, packed = to_mx(x, torch.float4_e2m1fn_x2, 32, mode)
    assert torch.equal(scales.view(torch.uint8).to(torch.int64), q.scale_codes)
    assert torch.equal(packed.view(torch.uint8), q.packed())
    assert q.scale_codes[0, 0].item() == 0 and q.dequantize()[0, :32].eq(0).all()  # zero block: code 0
    if mode is not ScaleCalculationMode.RCEIL:
        assert q.scales[2, 0].item() == 2.0**-2  # amax exactly 2^0: floor(log2 amax) - 2


def _te_float_to_e8m0(value: np.float32) -> int:
    """Transcription of Transformer Engine's software ``float_to_e8m0`` (round the exponent up, satfinite)."""
    if value == 0:
        return 0
    bits = int(np.array(value, dtype=np.float32).view(np.uint32))
    exponent, mantissa = bits >> 23, bits & 0x7FFFFF
    if (mantissa > 0 and exponent != 0xFE) and not (exponent == 0 and mantissa <= 0x400000):
        exponent += 1
    return exponent


@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp4_rceil_matches_transformer_engines_float_to_e8m0_of_amax_times_one_sixth(backend):
    rng = np.random.default_rng(9)
    magnitudes = np.exp2(rng.uniform(-140, 120, 64 * 32)).astype(F32).reshape(64, 32)
    magnitudes[:3] = 0
    magnitudes[1, 0] = F32(6.0)  # amax/6 exactly 1: no round-up
    magnitudes[2, 0] = F32(2.0**-125)  # descale 2^-125/6 rounds to an FP32 subnormal below 2^-127: code 0
    q = quantize(torch.from_numpy(magnitudes), MX_RCEIL, backend=backend)
    inv6 = F32(1) / F32(6)
    expected = [_te_float_to_e8m0(F32(np.abs(row).max()) * inv6) for row in magnitudes]
    assert q.scale_codes[:, 0].tolist() == expected
    assert expected[1] == 127 and expected[2] == 0


# ----- 2D tiles -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme", NAMED)
def test_2d_tiles_of_a_weight_and_its_transpose_give_transposed_values(scheme, backend):
    g = torch.Generator().manual_seed(9)
    w = torch.randn(64, 96, generator=g) * torch.exp2(torch.randint(-8, 8, (64, 96), generator=g).float())
    q, qt = quantize(w, scheme, two_d=True, backend=backend), quantize(w.T, scheme, two_d=True, backend=backend)
    assert_same_f32_bits(qt.dequantize(), q.dequantize().T, "dequantized transpose")
    assert torch.equal(qt.scales, q.scales.T)
    assert torch.equal(qt.payload, q.payload.T)
    b = get_scheme(scheme).block_size
    tile_amax = w.abs().reshape(64 // b, b, 96 // b, b).amax(dim=(1, 3))
    assert torch.equal(q.block_amax.squeeze(-1), tile_amax)


@pytest.mark.parametrize("backend", BACKENDS)
def test_2d_ue5m3_tiles_match_the_scalar_reference_on_flattened_tiles(backend):
    rng = np.random.default_rng(10)
    w = (rng.standard_normal((32, 48)) * np.exp2(rng.integers(-6, 6, (32, 48)))).astype(F32)
    q = quantize(torch.from_numpy(w), "ue5m3_b16", two_d=True, backend=backend)
    tiles = w.reshape(2, 16, 3, 16).transpose(0, 2, 1, 3).reshape(6, 256)  # one row per tile, row-major
    ref = ue5m3_reference(tiles, 256, 448.0, float(np.abs(w).max()))
    assert_same_f32_bits(q.scales.reshape(6, 1), ref.scales, "tile scales")
    assert_same_f32_bits(q.payload.reshape(2, 16, 3, 16).permute(0, 2, 1, 3).reshape(6, 256), ref.payload)


# ----- packed storage -----------------------------------------------------------------------------------


def test_unpack_then_pack_round_trips_all_256_byte_values():
    packed = torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 16)
    codes = unpack_fp4(packed)
    assert codes.shape == (16, 32) and codes.dtype == torch.uint8
    assert torch.equal(pack_fp4(codes), packed)
    flat = torch.arange(256).tolist()
    assert codes.reshape(-1).tolist() == [v for b in flat for v in (b & 0xF, b >> 4)]


def test_pack_then_unpack_round_trips_every_code_pair_with_element_2i_in_the_low_nibble():
    lo, hi = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    codes = torch.stack([lo.reshape(-1), hi.reshape(-1)], dim=-1).reshape(1, -1)  # (1, 512): lo0 hi0 lo1 hi1...
    packed = pack_fp4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (1, 256)
    assert packed.reshape(-1).tolist() == [
        int(a) | (int(b) << 4) for a, b in zip(lo.reshape(-1), hi.reshape(-1), strict=True)
    ]
    assert torch.equal(unpack_fp4(packed), codes.to(torch.uint8))


def test_packing_rejects_malformed_codes():
    with pytest.raises(ValueError):
        pack_fp4(torch.tensor([1, 16]))
    with pytest.raises(ValueError):
        pack_fp4(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError):
        pack_fp4(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        unpack_fp4(torch.tensor([1, 2]))


def test_packed_payload_decodes_to_the_payload():
    x = torch.from_numpy(hard_tensor(seed=3))
    q = quantize(x, "ue5m3_b16")
    codes = unpack_fp4(q.packed())
    assert torch.equal(formats.decode(codes.long(), "e2m1"), q.payload)


_QUANTIZED_FIELDS = ("payload_blocks", "scale_values", "decode_scales_blocks", "block_amax", "tensor_amax")


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize(("two_d", "axis"), [(False, 0), (False, -1), (True, -1)])
@pytest.mark.parametrize("stale", [False, True])
def test_packed_storage_unpacks_to_the_same_bits(scheme, two_d, axis, stale):
    """Ragged shapes, zero blocks, signed zeros, 60 decades of magnitude, a stale reference far below the data."""
    x = torch.randn(40, 72, generator=torch.Generator().manual_seed(5)) * torch.logspace(-30, 30, 72)
    x[3], x[:, 5], x[7, :16] = 0.0, -0.0, 0.0
    ref = torch.tensor(1e-3) if stale and SCHEMES[scheme].target is not None else None
    q = quantize(x, scheme, two_d=two_d, axis=axis, tensor_amax=ref, rounding="sr", generator=torch.Generator())
    packed = q.pack()
    assert packed.payload_codes.dtype == torch.uint8 and packed.scale_codes.dtype == torch.uint8
    u = packed.with_tensors(tuple(t.clone() for t in packed.tensors())).unpack()
    for field in _QUANTIZED_FIELDS:
        assert_same_f32_bits(getattr(u, field), getattr(q, field), field)
    assert torch.equal(u.zero_rounded_blocks, q.zero_rounded_blocks)
    assert torch.equal(u.underflowed_blocks, q.underflowed_blocks)
    assert_same_f32_bits(u.dequantize(), q.dequantize(), "dequantized")


def test_packed_storage_takes_0_8125_bytes_per_element_for_16_element_blocks():
    q = quantize(torch.randn(64, 256), "nvfp4")
    fixed = 3 * 4 + 3 * 8  # the 0-dim references and counters
    assert q.pack().nbytes - fixed == 64 * 256 * (0.5 + 1 / 16 + 4 / 16)


def test_packing_and_unpacking_run_on_the_meta_device_without_host_reads():
    x = torch.empty(64, 256, device="meta")
    ref = torch.ones((), device="meta")
    q = quantize(x, "ue5m3_b16", tensor_amax=ref, backend="torch", checks=DeferredChecks()).pack().unpack()
    assert q.payload_blocks.device.type == "meta" and q.payload.shape == (64, 256)


# ----- stochastic rounding through quantize ------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["sf", "sr_te", "sr"])
def test_stochastic_quantization_is_reproducible_from_bits_or_seed(mode, backend):
    x = torch.from_numpy(hard_tensor(seed=4))
    bits = formats.random_bits_for(x.shape, mode, torch.Generator().manual_seed(21))
    a = quantize(x, "ue5m3_b16", rounding=mode, random_bits=bits, backend=backend)
    b = quantize(x, "ue5m3_b16", rounding=mode, random_bits=bits.clone(), backend=backend)
    c = quantize(x, "ue5m3_b16", rounding=mode, generator=torch.Generator().manual_seed(21), backend=backend)
    for other in (b, c):
        assert_same_f32_bits(other.payload, a.payload, "payload")
        assert_same_f32_bits(other.dequantize(), a.dequantize(), "dequantized")
    # Scales never use stochastic rounding: identical to RNE quantization's scales.
    assert torch.equal(a.scales, quantize(x, "ue5m3_b16", backend=backend).scales)
    d = quantize(x, "ue5m3_b16", rounding=mode, generator=torch.Generator().manual_seed(22), backend=backend)
    assert not torch.equal(a.payload, d.payload)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sf_payloads_follow_the_exact_8bit_rule_for_every_draw(backend):
    rng = np.random.default_rng(8)
    block = (rng.standard_normal(32) * 2).astype(F32)
    block[0], block[16] = 3.0, -2.5  # block amax 3 and 2.5
    g = 3.0
    x = torch.from_numpy(np.tile(block, (256, 1)))  # row r is quantized with draw r for every element
    bits = torch.arange(256).unsqueeze(1).expand(256, 32)
    q = quantize(x, "ue5m3_b16", tensor_amax=g, rounding="sf", random_bits=bits, backend=backend)
    s = np_of(q.decode_scales[0])  # (2,) identical for every row
    assert np.array_equal(np_of(q.decode_scales), np.tile(s, (256, 1)))
    payload_input = np.clip(block.reshape(2, 16) * (F32(1) / s)[:, None], -6, 6).ravel()
    mags = spec_magnitudes("e2m1")
    for j, v in enumerate(payload_input.tolist()):
        m = Fraction(abs(v))
        low = max(t for t in mags if t <= m)
        high = min((t for t in mags if t >= m), default=mags[-1])
        delta = (m - low) / (high - low) if high > low else Fraction(0)
        expected = [float(high if delta + Fraction(2 * r + 1, 512) >= 1 else low) for r in range(256)]
        assert np.abs(np_of(q.payload[:, j])).tolist() == expected, v
        assert np.all(np.signbit(np_of(q.payload[:, j])) == np.signbit(v))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sf_payloads_are_unbiased_statistically(backend):
    gen = torch.Generator().manual_seed(31)
    block = torch.rand(16, generator=gen) * 4 - 2
    block[0] = 3.0  # fixes the block amax
    draws = 2000
    x = block.repeat(draws, 1)  # every row is the same block: same scale, independent draws
    q = quantize(x, "ue5m3_b16", tensor_amax=3.0, rounding="sf", generator=gen, backend=backend)
    s = q.decode_scales[0, 0]
    assert q.decode_scales.eq(s).all()
    payload_input = block * torch.reciprocal(s)
    mean = q.payload.double().mean(0)
    lo_hi_spacing = torch.where(payload_input.abs() < 2, 0.5, torch.where(payload_input.abs() < 4, 1.0, 2.0))
    # E[payload] is within spacing/512 of the input (8-bit rule); the sample mean within 6 standard errors of it.
    stderr = lo_hi_spacing.double() * 0.5 / math.sqrt(draws)
    assert torch.all((mean - payload_input.double()).abs() <= 6 * stderr + lo_hi_spacing / 512)
    rne_error = (quantize(block.unsqueeze(0), "ue5m3_b16", tensor_amax=3.0).payload[0] - payload_input).abs()
    assert (mean - payload_input).abs().mean() < rne_error.mean()


# ----- targets ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scheme", TENSOR_SCALED)
def test_target_override_behaves_like_with_target(scheme, backend):
    x = torch.from_numpy(hard_tensor(seed=12))
    a = quantize(x, scheme, target=2048, backend=backend)
    b = quantize(x, get_scheme(scheme).with_target(2048), backend=backend)
    assert a.scheme == b.scheme and a.scheme.target == 2048
    for field in ("payload", "scales", "decode_scales"):
        assert_same_f32_bits(getattr(a, field), getattr(b, field), field)
    assert_same_f32_bits(a.dequantize(), b.dequantize(), "dequantized")
    assert not torch.equal(a.scales, quantize(x, scheme, backend=backend).scales)  # the target is used
    if get_scheme(scheme).scale.name == "ue5m3":
        # A block whose amax equals the reference gets code T (spec section 1 worked example).
        block = torch.full((get_scheme(scheme).block_size,), 100.0)
        assert quantize(block, scheme, target=2048, backend=backend).scales.tolist() == [2048.0]


def test_target_override_is_rejected_like_with_target_for_mx():
    with pytest.raises(ValueError, match="takes no target"):
        get_scheme("mxfp4").with_target(2048)
    with pytest.raises(ValueError, match="takes no target"):
        quantize(torch.ones(32), "mxfp4", target=2048)


# ----- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("scheme", NAMED)
def test_non_finite_input_raises_naming_the_tensor(scheme, bad, backend):
    x = torch.ones(2, 64)
    x[1, 5] = bad
    for tensor_amax in (None, 1.0):
        with pytest.raises(ValueError, match="'layers.3.dY'"):
            quantize(x, scheme, tensor_amax=tensor_amax, name="layers.3.dY", backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("scheme", "shape", "kwargs"),
    [
        ("nvfp4", (33, 40), {}),
        ("nvfp4", (40, 33), {"axis": 0}),
        ("nvfp4", (33, 47), {"two_d": True}),
        ("ue5m3_b16", (5, 3, 21), {"axis": 1}),
        ("ue5m3_b32", (7, 33), {"two_d": True}),
        ("mxfp4", (3, 70), {}),
    ],
)
def test_ragged_shapes_are_zero_padded_to_whole_blocks_as_transformer_engine_does(scheme, shape, kwargs, backend):
    """TE's reference pads rows/columns with zeros before the block amax (global amax from the unpadded tensor,
    which zeros do not change), quantizes, crops the data and keeps the padded scale grid."""
    x = torch.from_numpy(np.random.default_rng(len(shape)).standard_normal(shape).astype(F32))
    b = get_scheme(scheme).block_size
    padded_shape = list(shape)
    axes = [0, 1] if kwargs.get("two_d") else [kwargs.get("axis", -1) % len(shape)]
    for a in axes:
        padded_shape[a] = -(-shape[a] // b) * b
    padded = torch.zeros(padded_shape)
    padded[tuple(slice(0, n) for n in shape)] = x
    q, qp = quantize(x, scheme, backend=backend, **kwargs), quantize(padded, scheme, backend=backend, **kwargs)
    crop = tuple(slice(0, n) for n in shape)
    assert q.payload.shape == x.shape and q.dequantize().shape == x.shape
    assert torch.equal(q.scales, qp.scales) and torch.equal(q.tensor_amax, qp.tensor_amax)
    assert_same_f32_bits(q.payload, qp.payload[crop], "payload")
    assert_same_f32_bits(q.dequantize(), qp.dequantize()[crop], "dequantized")
    if scheme == "nvfp4" and not kwargs:  # and against the scalar TE transcription on the padded tensor
        ref = nvfp4_reference(np_of(padded), float(np.abs(np_of(x)).max()))
        assert_same_f32_bits(q.scales, ref.scales, "scales")
        assert_same_f32_bits(q.payload, ref.payload[crop], "payload")


def test_2d_tiles_need_a_2d_tensor():
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.ones(2, 32, 32), "ue5m3_b16", two_d=True)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_tensor_amax_must_be_finite_and_non_negative(bad):
    with pytest.raises(ValueError, match="tensor_amax"):
        quantize(torch.ones(16), "ue5m3_b16", tensor_amax=bad)


def test_unknown_scheme_raises_listing_the_known_schemes():
    with pytest.raises(ValueError, match="ue5m3_b64") as info:
        quantize(torch.ones(16), "ue5m3_b64")
    for name in NAMED:
        assert name in str(info.value)


def test_unknown_rounding_and_malformed_random_bits_raise():
    with pytest.raises(ValueError):
        quantize(torch.ones(16), "ue5m3_b16", rounding="nearest")
    with pytest.raises(ValueError, match="shape"):
        quantize(torch.ones(16), "ue5m3_b16", rounding="sf", random_bits=torch.zeros(8, dtype=torch.int64))
    with pytest.raises(ValueError, match="deterministic"):
        quantize(torch.ones(16), "ue5m3_b16", random_bits=torch.zeros(16, dtype=torch.int64))


# ----- properties ---------------------------------------------------------------------------------------

# Properties run on the torch reference backend: the fused kernel costs milliseconds per call on small tensors
# (thread start-up) and is held bit-identical to it by the oracle tests above and tests/test_cpu_kernel.py.
PROPERTY = settings(max_examples=30, deadline=None)
SCHEME_PARAMS = [pytest.param(n, id=n) for n in NAMED]
MIDPOINTS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0]


@st.composite
def blocks_of(draw, scheme: str, lo_exp: int = -20, hi_exp: int = 20) -> np.ndarray:
    """(2, 4B) float32 arrays: zeros, and magnitudes in [2^lo_exp, 2^hi_exp] of either sign.

    Hypothesis draws the shape of the data (seed, exponent range, zero fraction) and a few pinned values
    (arbitrary floats and E2M1 midpoints times powers of two); numpy fills in the rest.
    """
    b = get_scheme(scheme).block_size
    shape = (2, 4 * b)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    e_lo = draw(st.integers(lo_exp, hi_exp))
    e_hi = draw(st.integers(e_lo, hi_exp))
    mag = np.clip(np.exp2(rng.uniform(e_lo, e_hi + 1, shape)), 2.0**lo_exp, 2.0**hi_exp)
    x = (mag * rng.choice([-1.0, 1.0], shape)).astype(F32)
    x[rng.random(shape) < draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))] = 0.0
    pinned_float = st.floats(min_value=2.0**lo_exp, max_value=2.0**hi_exp, width=32)
    pinned_mid = st.builds(lambda m, k: m * 2.0**k, st.sampled_from(MIDPOINTS), st.integers(lo_exp + 3, hi_exp - 3))
    pins = draw(
        st.lists(st.tuples(st.integers(0, x.size - 1), st.one_of(pinned_float, pinned_mid), st.booleans()), max_size=8)
    )
    for index, value, negative in pins:
        x.flat[index] = -value if negative else value
    return x


@pytest.mark.parametrize("scheme", SCHEME_PARAMS)
@PROPERTY
@given(data=st.data())
def test_dequantized_magnitudes_are_bounded_by_six_times_the_block_scale(scheme, data):
    x = torch.from_numpy(data.draw(blocks_of(scheme)))
    g = data.draw(st.sampled_from([None, 1e-3, 1.0, 1e4]))
    q = quantize(x, scheme, tensor_amax=_reference(scheme, g), backend="torch")
    b = get_scheme(scheme).block_size
    deq = q.dequantize().reshape(2, 4, b).abs()
    if scheme == "nvfp4":  # TE's dequantization: payload * ((s * amax) * (1/2688)), monotone in the payload
        bound = 6 * ((q.scales.reshape(2, 4, 1) * q.tensor_amax) * (torch.tensor(1.0) / torch.tensor(2688.0)))
    elif q.scheme.scale_rule is ScaleRule.TENSOR_SCALED:  # the paper's (payload * code) * (1/G)
        bound = (6 * q.scales.reshape(2, 4, 1)) * q.global_decode_scale
    else:
        bound = 6 * q.decode_scales.reshape(2, 4, 1)
    assert torch.all(deq <= bound)
    assert torch.all(torch.isfinite(q.dequantize()))
    assert set(q.payload.unique().tolist()) <= E2M1_VALUES


@pytest.mark.parametrize("scheme", SCHEME_PARAMS)
@PROPERTY
@given(data=st.data())
def test_quantization_is_sign_symmetric_under_rne(scheme, data):
    x = torch.from_numpy(data.draw(blocks_of(scheme)))
    a, b = quantize(x, scheme, backend="torch"), quantize(-x, scheme, backend="torch")
    assert_same_f32_bits(b.dequantize(), -a.dequantize(), "dequantized")
    assert_same_f32_bits(b.payload, -a.payload, "payload")
    assert torch.equal(a.scales, b.scales)


@pytest.mark.parametrize("scheme", SCHEME_PARAMS)
@PROPERTY
@given(data=st.data())
def test_blocks_are_independent_when_the_tensor_amax_is_fixed(scheme, data):
    x = data.draw(blocks_of(scheme))
    b = get_scheme(scheme).block_size
    row, blk = data.draw(st.integers(0, 1)), data.draw(st.integers(0, 3))
    y = x.copy()
    y[row, blk * b : (blk + 1) * b] = data.draw(blocks_of(scheme)).ravel()[:b]
    g = 2.0**20
    qx = quantize(torch.from_numpy(x), scheme, tensor_amax=_reference(scheme, g), backend="torch")
    qy = quantize(torch.from_numpy(y), scheme, tensor_amax=_reference(scheme, g), backend="torch")
    keep = np.ones((2, 4), bool)
    keep[row, blk] = False
    keep_elems = np.repeat(keep, b, axis=1)
    assert_same_f32_bits(np_of(qx.dequantize())[keep_elems], np_of(qy.dequantize())[keep_elems], "other blocks")
    assert torch.equal(qx.scales[torch.from_numpy(keep)], qy.scales[torch.from_numpy(keep)])


@pytest.mark.parametrize("scheme", SCHEME_PARAMS)
@PROPERTY
@given(data=st.data())
def test_quantization_commutes_with_power_of_two_scaling_of_x_and_reference(scheme, data):
    x = data.draw(blocks_of(scheme))
    k = data.draw(st.integers(-20, 20))
    g = float(np.abs(x).max()) * data.draw(st.sampled_from([1.0, 0.25, 8.0]))
    if g == 0:
        g = 1.0
    xs = np.ldexp(x, k).astype(F32)
    q = quantize(torch.from_numpy(x), scheme, tensor_amax=_reference(scheme, g), backend="torch")
    qs = quantize(torch.from_numpy(xs), scheme, tensor_amax=_reference(scheme, math.ldexp(g, k)), backend="torch")
    assert_same_f32_bits(qs.payload, q.payload, "payload")
    assert_same_f32_bits(qs.dequantize(), np.ldexp(np_of(q.dequantize()), k).astype(F32), "dequantized")
    assert int(qs.zero_rounded_blocks) == int(q.zero_rounded_blocks)
    assert int(qs.saturated_blocks) == int(q.saturated_blocks)


# ----- edges: empty tensors, underflowing blocks, references a scheme cannot use ------------------------


@pytest.mark.parametrize("scheme", NAMED)
@pytest.mark.parametrize(("shape", "two_d", "axis"), [((0, 32), False, -1), ((4, 0), False, -1), ((0,), False, 0),
                                                      ((0, 16), True, -1), ((32, 0), False, 0)])  # fmt: skip
def test_empty_tensors_quantize_and_dequantize_to_empty_tensors(scheme, shape, two_d, axis):
    q = quantize(torch.empty(shape), scheme, two_d=two_d, axis=axis)
    assert q.dequantize().shape == shape and q.payload.shape == shape
    assert int(q.zero_rounded_blocks) == int(q.underflowed_blocks) == 0
    assert q.pack().unpack().dequantize().shape == shape


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_blocks_that_underflow_the_scale_range_are_counted(backend):
    """NVFP4 of a tensor at 1e-40 (FP32 subnormals): the scales are nonzero but every element rounds to zero. The
    same block beside larger values gets a zero scale instead: counted as zero-rounded, never twice. The torch path
    counts from the payload, the C kernel (``auto`` here) as it writes it; the packed form keeps the count."""
    tiny = torch.full((4, 32), 1e-40)
    q = quantize(tiny, "nvfp4", backend=backend)
    assert (int(q.underflowed_blocks), int(q.zero_rounded_blocks)) == (8, 0)
    assert int(q.pack().unpack().underflowed_blocks) == 8
    assert torch.all(q.dequantize() == 0)
    mixed = torch.randn(4, 32)
    mixed[1, :16] = 1e-40
    q = quantize(mixed, "nvfp4", backend=backend)
    assert (int(q.underflowed_blocks), int(q.zero_rounded_blocks)) == (0, 1)
    assert int(quantize(torch.randn(4, 32), "nvfp4", backend=backend).underflowed_blocks) == 0
    mixed[1, :16] = 0.0  # an all-zero block loses nothing
    assert int(quantize(mixed, "nvfp4", backend=backend).underflowed_blocks) == 0


def test_a_tensor_reference_for_a_scheme_without_a_tensor_scale_is_refused():
    with pytest.raises(ValueError, match=r"tensor 'w'.*'mxfp4'.*no tensor scale"):
        quantize(torch.randn(4, 32), "mxfp4", tensor_amax=torch.tensor(3.0), name="w")
