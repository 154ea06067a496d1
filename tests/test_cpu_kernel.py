"""The fused C kernel equals the torch reference bit for bit (payload, scales, diagnostics, signs of zero)."""

import dataclasses
import zlib

import pytest
import torch

from helpers.bits import assert_same_quantized
from ue5m3.numerics import formats, gemm
from ue5m3.numerics.formats import UE8M0, Rounding
from ue5m3.numerics.kernels import cpu as cpu_kernel
from ue5m3.numerics.quantize import quantize
from ue5m3.numerics.schemes import BlockScheme, ScaleOrder, ScaleRule, get_scheme

pytestmark = pytest.mark.skipif(not cpu_kernel.available(), reason="no C compiler to build the CPU kernel")

SCHEMES = [
    get_scheme("ue5m3_b16"),
    get_scheme("ue5m3_b32"),
    get_scheme("nvfp4"),
    get_scheme("mxfp4"),
    dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder.TE_LEGACY),
    dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder.TORCHAO),
    BlockScheme(name="mx_ceil", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_CEIL),
    get_scheme("ue5m3_b16").with_target(2048.0),
    get_scheme("nvfp4_4over6_mae"),
    get_scheme("nvfp4_4over6_mse"),
    get_scheme("nvfp4_4over6_abs_max"),
    get_scheme("ue5m3_b16_4over6_mse"),
    get_scheme("ue5m3_b16_all_finite").with_target(8192.0),  # the format study's: the larger max in reach
    get_scheme("ue5m3_b16_alto").with_target(8192.0),
    get_scheme("mxfp4_b16"),
    get_scheme("mxfp4_b16_rceil"),
]


def _hard_tensor(seed: int, rows: int = 64, cols: int = 128) -> torch.Tensor:
    """Gaussian rows of very different magnitudes, exact E2M1 midpoints, zero blocks and signed zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-30, 30, (rows, 1), generator=g).float())
    x[0, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 4) * torch.tensor([1.0, -1.0]).repeat(16)
    x[1, :32] = 0.0
    x[1, 32:48] = -0.0
    x[2, :16] = 1e-30
    return x


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"{s.name}-{s.scale_order}-{s.scale_rule}")
@pytest.mark.parametrize("rounding", list(Rounding))
@pytest.mark.parametrize("layout", ["rows", "axis0", "two_d"])
def test_native_kernel_equals_torch_reference(scheme, rounding, layout):
    x = _hard_tensor(seed=zlib.crc32(f"{scheme.name}{rounding.value}{layout}".encode()))
    kwargs = {"axis": 0} if layout == "axis0" else {"two_d": layout == "two_d"}
    if layout == "two_d" and x.shape[1] % scheme.block_size:
        pytest.skip("shape does not tile")
    bits = formats.random_bits_for(x.shape, rounding, torch.Generator().manual_seed(3))
    references = (None, float(x.abs().max()) / 100, float(x.abs().max()) * 1e6, 0.0)
    for tensor_amax in references if scheme.uses_tensor_amax else (None,):  # MX schemes refuse a reference
        common = dict(tensor_amax=tensor_amax, rounding=rounding, random_bits=bits, **kwargs)
        assert_same_quantized(
            quantize(x, scheme, backend="torch", **common), quantize(x, scheme, backend="cpu_kernel", **common)
        )


def test_native_kernel_e2m1_rne_steps_match_generic_rounding_on_a_dense_grid():
    # Every float32 in [-7, 7] at spacing 2^-12, plus the midpoints, through an identity scale (MX, amax 4).
    grid = torch.arange(-7 * 4096, 7 * 4096 + 1, dtype=torch.float32) / 4096
    x = grid.reshape(-1, 1).repeat(1, 32)
    x[:, 0] = 4.0  # every block's amax is 4 -> scale 2^0 under the OCP rule
    assert_same_quantized(quantize(x, "mxfp4", backend="torch"), quantize(x, "mxfp4", backend="cpu_kernel"))


def test_native_backend_refuses_cases_it_does_not_cover():
    scheme = BlockScheme(name="mx_round", scale=UE8M0, block_size=32, target=448.0, scale_rule=ScaleRule.MX_ROUND_LOG2)
    with pytest.raises(ValueError, match="mx_round_log2"):
        quantize(torch.ones(32), scheme, backend="cpu_kernel")
    # auto still works through the reference path
    assert quantize(torch.ones(32), scheme, backend="auto").dequantize().shape == (32,)


def test_kernel_library_is_cached_by_source_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("UE5M3_CACHE", str(tmp_path))
    cpu_kernel._library.cache_clear()
    try:
        cpu_kernel.load()
        built = list(tmp_path.glob("ue5m3_kernels-*.so"))
        assert len(built) == 1
    finally:
        cpu_kernel._library.cache_clear()


# ----- the probe-matched GEMM kernels ------------------------------------------------------------------------


def _gemm_operands(scheme: str, m: int, k: int, n: int, b_two_d: bool, seed: int, spread: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.exp2(spread * torch.randn(m, 1, generator=g))
    b = torch.randn(k, n, generator=g) * torch.exp2(spread * torch.randn(1, n, generator=g))
    a[0, :32] = 0  # zero blocks: NVFP4 scale 0, UE5M3 repaired to 1
    return quantize(a, scheme), quantize(b, scheme, axis=0, two_d=b_two_d)


@pytest.mark.skipif(not cpu_kernel.available(), reason="no C compiler for the CPU kernel")
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4"])
@pytest.mark.parametrize(("shape", "b_two_d"), [((13, 128, 21), False), ((8, 192, 40), True), ((7, 64, 33), True)])
@pytest.mark.parametrize("rounding", ["rtz", "rne"])
def test_probe_matched_kernels_equal_the_torch_path_bit_for_bit(scheme, shape, b_two_d, rounding):
    """The FP32 payload kernel (AVX2), the FP64 encoded kernel and the torch path: one result, including ragged
    2D tiles, zero blocks and rows routed to the exact path."""
    m, k, n = shape
    a_q, b_q = _gemm_operands(scheme, m, k, n, b_two_d, seed=k + n)
    kwargs = {"cross_slice_rounding": rounding, "final_grid": 1024 if rounding == "rtz" else None}
    reference = gemm.matmul(a_q, b_q, "probe_matched", backend="torch", **kwargs)
    got = gemm.matmul(a_q, b_q, "probe_matched", backend="cpu_kernel", **kwargs)
    assert torch.equal(got.view(torch.int32), reference.view(torch.int32))
    encoded = cpu_kernel.probe_gemm(
        a_q.encoded(),
        b_q.encoded(),
        width=64,
        rtz=rounding == "rtz",
        grid=kwargs["final_grid"],
        alpha=float(gemm.alpha(a_q, b_q)),
    )
    # scales vary per row and column only, so every slice sum here is exact in FP64: the kernels alone suffice
    assert torch.equal(encoded.view(torch.int32), reference.view(torch.int32))
    if cpu_kernel.has_payload_gemm():
        payload = cpu_kernel.probe_gemm_payload(
            a_q.payload,
            a_q.scales,
            b_q.payload,
            b_q.scales,
            block=a_q.scheme.block_size,
            column_block=a_q.scheme.block_size if b_two_d else 1,
            width=64,
            rtz=rounding == "rtz",
            grid=kwargs["final_grid"],
            alpha=float(gemm.alpha(a_q, b_q)),
        )
        assert torch.equal(payload.view(torch.int32), encoded.view(torch.int32))


def _whole_slice_gemm(pa, sa, pb, sb, rounding="rtz"):
    """The payload kernel with its count of whole-slice tiles, and the FP64 encoded kernel's bits beside it."""
    kwargs = {"width": 64, "rtz": rounding == "rtz", "grid": None, "alpha": 1.0}
    got, whole, total = cpu_kernel.probe_gemm_payload(
        pa, sa, pb, sb, block=16, column_block=1, count_whole=True, **kwargs
    )
    encoded_a = pa.double() * sa.double().repeat_interleave(16, 1)
    encoded_b = pb.double() * sb.double().repeat_interleave(16, 0)
    return got, cpu_kernel.probe_gemm(encoded_a, encoded_b, **kwargs), whole, total


def _payload_operands(m: int, k: int, n: int, a_exponent: int, b_exponent: int, seed: int):
    """E2M1 payloads with blocks-of-16 scales of 6 significant bits, the most the kernel takes (some zero). B's scale
    exponents lie in [b_exponent, b_exponent + 2]; A's in [a_exponent + 6r, a_exponent + 6r + 2] on row r, so a few
    rows reach the extreme while the rest give normal FP32 outputs (and every slice stays exact in FP64)."""
    g = torch.Generator().manual_seed(seed)
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

    def payload(*shape):
        signs = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
        return values[torch.randint(0, 8, shape, generator=g)] * signs

    def scales(exponents):
        significand = 1.0 + torch.randint(0, 32, exponents.shape, generator=g) / 32.0
        s = torch.ldexp(significand, exponents + torch.randint(0, 3, exponents.shape, generator=g))
        return torch.where(torch.rand(exponents.shape, generator=g) < 0.05, 0.0, s)

    a_rows = a_exponent + 6 * torch.arange(m)[:, None].expand(m, k // 16)
    return payload(m, k), scales(a_rows), payload(k, n), scales(torch.full((k // 16, n), b_exponent))


@pytest.mark.skipif(
    not cpu_kernel.available() or not cpu_kernel.has_payload_gemm(), reason="the payload kernel needs AVX2 + FMA"
)
@pytest.mark.parametrize(
    ("a_exponent", "b_exponent"),
    # smallest scale-exponent sums -137 (B packed fully encoded) and -138 (B's exponents kept apart), far below;
    # largest sums (+ 6 * 12 + 4) 115 and 116 on either side of the upper bound; ordinary scales
    [(-68, -69), (-69, -69), (-90, -95), (20, 19), (20, 20), (-40, 1)],
)
@pytest.mark.parametrize("rounding", ["rtz", "rne"])
def test_the_payload_kernel_is_exact_on_both_sides_of_its_fully_encoded_bound(a_exponent, b_exponent, rounding):
    """The AVX2 payload kernel packs B fully encoded when every sub-block sum stays exact in FP32 (scale exponents
    summing to -137 .. 115) and keeps B's scale exponents apart otherwise: the FP64 encoded kernel's bits either way,
    subnormal FP32 products and ragged tiles included."""
    m, k, n = 13, 128, 40
    pa, sa, pb, sb = _payload_operands(m, k, n, a_exponent, b_exponent, seed=a_exponent * 1000 + b_exponent)
    got, expected, _, _ = _whole_slice_gemm(pa, sa, pb, sb, rounding)
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert float((got != 0).float().mean()) > 0.5


@pytest.mark.skipif(
    not cpu_kernel.available() or not cpu_kernel.has_payload_gemm(), reason="the payload kernel needs AVX2 + FMA"
)
@pytest.mark.parametrize("gap", range(11))
def test_a_slice_is_summed_whole_in_fp32_only_where_every_partial_sum_is_exact(gap):
    """In the first slice, A's first block is 6 * 1.875 * 2^gap against B's 6 * 1.875, and the other three blocks of
    both are 0.5 * 1.125 (quantum 2^-4): after the first 16 products the sum is 2025 * 2^gap, and the next products
    are multiples of 2^-8, so the sum needs 19 + gap bits and FP32 holds it for gap <= 5 only. The kernel's bound
    (l1 and max over the quantum) takes the whole-slice path up to gap 5 and the sub-block path beyond, exact
    either way (a bound four times too loose gives wrong bits at gap 6); the second slice is whole in every case."""
    m, k, n = 7, 128, 17
    pa, pb = torch.full((m, k), 0.5), torch.full((k, n), 0.5)
    pa[:, :16], pb[:16] = 6.0, 6.0
    sa, sb = torch.full((m, k // 16), 1.125), torch.full((k // 16, n), 1.125)
    sa[:, 0], sb[0] = 1.875 * 2.0**gap, 1.875
    for rounding in ("rtz", "rne"):
        got, expected, whole, total = _whole_slice_gemm(pa, sa, pb, sb, rounding)
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (gap, rounding)
        assert whole == (total if gap <= 5 else total // 2), (gap, whole, total)


@pytest.mark.skipif(
    not cpu_kernel.available() or not cpu_kernel.has_payload_gemm(), reason="the payload kernel needs AVX2 + FMA"
)
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4", "mxfp4_b16"])
def test_whole_slice_and_sub_block_tiles_mix_in_one_gemm_with_the_torch_paths_bits(scheme):
    """Gaussian operands with a block of x2^12 in every 7th row and 5th column: tiles summed whole in FP32 and tiles
    summed by sub-blocks side by side in one GEMM, each output the torch path's bits."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(96, 256, generator=g), torch.randn(256, 80, generator=g)
    x[::7, 16:32] *= 2.0**12
    w[64:80, ::5] *= 2.0**12
    a_q, b_q = quantize(x, scheme), quantize(w, scheme, axis=0)
    reference = gemm.matmul(a_q, b_q, "probe_matched", backend="torch")
    got = gemm.matmul(a_q, b_q, "probe_matched", backend="cpu_kernel")
    assert torch.equal(got.view(torch.int32), reference.view(torch.int32))
    block = a_q.scheme.block_size
    _, whole, total = cpu_kernel.probe_gemm_payload(
        a_q.payload,
        a_q.scales,
        b_q.payload,
        b_q.scales,
        block=block,
        column_block=1,
        width=64,
        rtz=True,
        grid=1024,
        alpha=1.0,
        count_whole=True,
    )
    assert 0 < whole < total


@pytest.mark.skipif(not cpu_kernel.available(), reason="no C compiler for the CPU kernel")
def test_scales_wider_than_the_payload_kernel_takes_go_to_the_encoded_kernel_and_stay_exact():
    """A scale format of 8 significant bits makes a 16-element sub-block sum of up to 27 bits, which the FP32
    payload kernel cannot hold: the CPU path routes it to the FP64 encoded kernel, the torch path's bits."""
    wide = formats.FloatFormat(name="ue4m7", exponent_bits=4, mantissa_bits=7, bias=7, signed=False)
    scheme = BlockScheme(name="wide_scales", scale=wide, block_size=16, target=448.0 * 6.0 / 2.0)
    g = torch.Generator().manual_seed(7)
    a_q = quantize(torch.randn(24, 256, generator=g), scheme)
    b_q = quantize(torch.randn(256, 32, generator=g), scheme, axis=0)
    reference = gemm.matmul(a_q, b_q, "probe_matched", backend="torch")
    got = gemm.matmul(a_q, b_q, "probe_matched", backend="cpu_kernel")
    assert torch.equal(got.view(torch.int32), reference.view(torch.int32))


def test_the_kernels_e2m1_packing_is_the_torch_ops_bit_for_bit():
    """Every E2M1 value pair, signed zeros included, in both nibbles: QuantizedTensor.pack on the C kernel (the CPU
    default) and with torch ops give the same codes, and each unpacks the other's to the same FP32 bits."""
    values = formats.decode(torch.arange(16), "e2m1")  # code 8 is -0.0
    lo, hi = torch.meshgrid(values, values, indexing="ij")
    payload = torch.stack([lo.reshape(-1), hi.reshape(-1)], dim=-1).reshape(32, 16)  # 32 blocks of 16
    q = quantize(payload, "ue5m3_b16")
    q = dataclasses.replace(q, payload_blocks=payload.reshape(q.payload_blocks.shape))
    on_kernel, on_torch = q.pack(), q.pack(kernel=False)
    assert torch.equal(on_kernel.payload_codes, on_torch.payload_codes)
    assert torch.equal(cpu_kernel.pack_e2m1(payload), on_torch.payload_codes.reshape(32, 8))
    for packed in (on_kernel, on_torch):
        for kernel in (None, False):
            out = packed.unpack(kernel=kernel).payload_blocks
            assert torch.equal(out.view(torch.int32), q.payload_blocks.view(torch.int32))
    with pytest.raises(ValueError, match="even last dimension"):
        cpu_kernel.pack_e2m1(torch.zeros(3))


@pytest.mark.parametrize("fmt", [formats.UE5M3, formats.UE5M3_ALL_FINITE, formats.E4M3, formats.E2M3, formats.E3M2])
def test_the_kernels_scale_codes_are_codes_of_values_for_every_code_of_the_format(fmt):
    """Every value of each format the C encoder takes (subnormals, zero, signed zero, the largest codes): the same
    codes as the torch ops; a format it does not take (UE8M0: 2^-127 is no normal FP32 number) is refused."""
    assert cpu_kernel.takes_scale_codes(fmt)
    codes = torch.arange(1 << fmt.bits)
    magnitudes = codes & ((1 << (fmt.bits - 1)) - 1) if fmt.signed else codes
    codes = codes[magnitudes <= fmt.max_magnitude_code]  # the finite codes
    values = formats.decode(codes, fmt).reshape(-1, 1)  # a column: the encoder reads any shape
    expected = formats.codes_of_values(values, fmt).to(torch.uint8)
    assert torch.equal(cpu_kernel.scale_codes(values, fmt), expected)
    assert torch.equal(expected.reshape(-1).to(torch.int64), codes)
    assert not cpu_kernel.takes_scale_codes(UE8M0)
    with pytest.raises(ValueError, match="scale_codes takes"):
        cpu_kernel.scale_codes(values, UE8M0)


def test_the_kernels_dead_zone_counts_are_the_torch_ops_counts():
    """The scale telemetry's dead zone of a stochastic rounding: elements at exactly a quarter of the scaled unit,
    just inside and outside it, zeros, a zero decode scale (its reciprocal capped at FP32 max) and a huge one."""
    from ue5m3.numerics import philox

    g = torch.Generator().manual_seed(9)
    x = torch.randn(64, 64, generator=g) * torch.exp2(torch.randint(-30, 10, (64, 4), generator=g)).repeat_interleave(
        16, 1
    )
    x[0, :4] = 0.0
    stream = philox.RandomStream(3, "m", "wgrad_upstream_gradient", 1, 0)
    q = quantize(x, "ue5m3_b16", rounding="sf", stream=stream)
    decode = q.decode_scales_blocks.clone()
    blocks = q.layout.to_blocks(x).clone()
    blocks[1, 0, :3] = decode[1, 0] * torch.tensor([0.25, 0.2499999, 0.2500001])  # the boundary, on the scaled value
    decode[2, 0], decode[3, 0] = 0.0, 3.0e38
    scaled = blocks * torch.clamp(torch.reciprocal(decode), max=torch.finfo(torch.float32).max)
    dead = (scaled.abs() <= 0.25) & (blocks != 0)
    expected = (int(dead.sum()), int((dead & (q.payload_blocks != 0)).sum()))
    assert expected[0] > expected[1] > 0
    assert cpu_kernel.dead_zone_counts(blocks, decode, q.payload_blocks) == expected


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: f"{s.name}-{s.scale_order}-{s.scale_rule}")
@pytest.mark.parametrize("g", [0.0, 2.0**-149, 1e-30, 3.0e-6, 1.0, 447.0, 6.5e4, 3.0e38, torch.finfo().max])
def test_the_host_tensor_factors_are_the_0_dim_tensor_ops_bit_for_bit(scheme, g):
    """The CPU kernel's tensor scale (G, 1/G, torchao's divisor) formed on the host: the FP32 bits of the 0-dim
    tensor ops, at zero, subnormal, tiny and huge references (G overflowing to the cap, 1/G subnormal)."""
    from ue5m3.numerics.scale_rules import host_tensor_factors, tensor_factors

    on_host = torch.tensor(host_tensor_factors(scheme, g), dtype=torch.float32)
    on_tensors = torch.stack(tensor_factors(scheme, torch.tensor(g, dtype=torch.float32)))
    assert torch.equal(on_host.view(torch.int32), on_tensors.view(torch.int32))


@pytest.mark.parametrize("g_a", [0.0, 1e-30, 3.0, 3.0e38])
@pytest.mark.parametrize("g_b", [0.0, 2.5e-3, 7.0e30])
def test_the_host_gemm_alpha_is_the_0_dim_tensor_ops_bit_for_bit(g_a, g_b):
    """alpha of two CPU operands formed on the host: the FP32 bits of the tensor ops (kept for other devices), at
    zero references, under- and overflowing products, and an operand without a tensor scale (MXFP4)."""
    g = torch.Generator().manual_seed(5)
    for scheme_b in ("ue5m3_b16", "mxfp4"):
        a_q = quantize(torch.randn(4, 32, generator=g), "ue5m3_b16", tensor_amax=g_a)
        held = {"tensor_amax": g_b} if get_scheme(scheme_b).uses_tensor_amax else {}
        b_q = quantize(torch.randn(32, 4, generator=g), scheme_b, axis=0, **held)
        g_a_t, d_a = gemm._operand_factor(a_q)
        g_b_t, d_b = gemm._operand_factor(b_q)
        expected = (g_a_t * g_b_t) / (d_a * d_b)
        assert torch.equal(gemm.alpha(a_q, b_q, host=True).view(torch.int32), expected.view(torch.int32))
        assert torch.equal(gemm.alpha(a_q, b_q).view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("scheme", SCHEMES[:8], ids=lambda s: f"{s.name}-{s.scale_order}-{s.scale_rule}")
@pytest.mark.parametrize("b_two_d", [False, True])
def test_the_kernels_slice_span_check_is_the_torch_spans_largest_per_row_and_column(scheme, b_two_d):
    """The probe-matched GEMM's exactness check: per A row and B column the C pass gives the largest slice span of
    gemm._span_bits (zero blocks, rows 60 decades apart, ragged columns of 2D tiles), and the scale extremes are the
    largest and smallest positive scale."""
    a = _hard_tensor(seed=11, rows=24, cols=256)
    b = _hard_tensor(seed=12, rows=256, cols=72 if b_two_d else 40)
    b[:, 3] = 0.0
    a_q = quantize(a, scheme, axis=-1)
    if b_two_d and scheme.block_size != 16:
        pytest.skip("2D tiles of 16 only")
    b_q = quantize(b, scheme, axis=0, two_d=b_two_d)
    block, n = scheme.block_size, b.shape[1]
    for width in {64, 128} - ({64} if block > 64 else set()):
        want_a = gemm._span_bits(a_q, "A", block, width, n).amax(1)
        want_b = gemm._span_bits(b_q, "B", block, width, n).amax(0)
        assert torch.equal(gemm._span_max(a_q, "A", block, width, n), want_a.to(torch.int32))
        assert torch.equal(gemm._span_max(b_q, "B", block, width, n), want_b.to(torch.int32))
    scales = torch.cat([a_q.scale_values.flatten(), b_q.scale_values.flatten()])
    positive = scales[scales > 0]
    assert cpu_kernel.scale_extremes(a_q.scale_values, b_q.scale_values) == (
        float(positive.max()),
        float(positive.min()),
    )
    assert cpu_kernel.scale_extremes(torch.zeros(4)) == (0.0, 0.0)


@pytest.mark.parametrize(
    "scheme",
    [get_scheme("ue5m3_b16"), get_scheme("nvfp4"), get_scheme("mxfp4"), get_scheme("nvfp4_4over6_mse")],
    ids=lambda s: s.name,
)
@pytest.mark.parametrize("rounding", ["rne", "sf", "sr_te", "sr"])
def test_the_kernel_reads_a_transposed_operands_blocks_in_place_to_the_same_bits(scheme, rounding):
    """dY^T and W^T along tokens: the blocks of a transposed view are read in place (strided), the Philox stream's
    bits drawn at the same global indices; equal to the torch path and to the contiguous copy's quantization."""
    from ue5m3.numerics import philox

    x = _hard_tensor(seed=21, rows=96, cols=64)
    stream = (
        philox.RandomStream(7, "layers.0.mlp.up_proj", "wgrad_upstream_gradient", 3, 1) if rounding != "rne" else None
    )
    common = dict(rounding=rounding, stream=stream, axis=-1, name="dy_t")
    on_kernel = quantize(x.t(), scheme, backend="cpu_kernel", **common)
    assert_same_quantized(quantize(x.t(), scheme, backend="torch", **common), on_kernel)
    assert_same_quantized(quantize(x.t().contiguous(), scheme, backend="cpu_kernel", **common), on_kernel)


def _wide_span_operands(scheme: str, m: int, k: int, n: int, b_two_d: bool, spread: float, seed: int):
    """Operands whose block magnitudes vary by 2^(spread * N(0, 1)) block by block, so that many slices span more
    than FP64's 53 bits (and, for E8M0 scales at large spreads, more than the TwoSum chain's 106), with zero blocks."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.exp2(spread * torch.randn(m, k // 16, generator=g)).repeat_interleave(
        16, 1
    )
    b = torch.randn(k, n, generator=g) * torch.exp2(spread * torch.randn(k // 16, n, generator=g)).repeat_interleave(
        16, 0
    )
    a[1, 16:48] = 0.0
    b[:32, 2] = 0.0
    return quantize(a, scheme), quantize(b, scheme, axis=0, two_d=b_two_d)


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4", "mxfp4_b16"])
@pytest.mark.parametrize(("shape", "b_two_d"), [((9, 128, 21), False), ((8, 192, 40), True), ((5, 64, 33), True)])
@pytest.mark.parametrize("spread", [6.0, 30.0])
@pytest.mark.parametrize(("rounding", "grid"), [("rtz", 1024), ("rne", None)])
def test_the_kernels_exact_outputs_are_the_torch_exact_paths_bits_for_any_span(
    scheme, shape, b_two_d, spread, rounding, grid
):
    """ue5m3_probe_exact_outputs on every row, then on every column, gives the torch path's result (its FP64 slice
    sums where exact, its TwoSum chain and round-to-odd elsewhere) bit for bit, and so does the kernel path with the
    span check choosing the outputs; outputs it is not asked for are left alone."""
    m, k, n = shape
    a_q, b_q = _wide_span_operands(scheme, m, k, n, b_two_d, spread, seed=m + k + n)
    kwargs = {"cross_slice_rounding": rounding, "final_grid": grid}
    reference = gemm.matmul(a_q, b_q, "probe_matched", backend="torch", **kwargs).view(torch.int32)
    alpha = float(gemm.alpha(a_q, b_q))
    layout = {"block": a_q.scheme.block_size, "column_block": a_q.scheme.block_size if b_two_d else 1}
    every = {"rows": torch.arange(m), "cols": torch.arange(0)}, {"rows": torch.arange(0), "cols": torch.arange(n)}
    for outputs in every:
        out = torch.full((m, n), float("nan"))
        cpu_kernel.probe_exact_outputs(
            out,
            a_q.payload,
            a_q.scales,
            b_q.payload,
            b_q.scales,
            width=64,
            rtz=rounding == "rtz",
            grid=grid,
            alpha=alpha,
            **layout,
            **outputs,
        )
        assert torch.equal(out.view(torch.int32), reference)
    some = torch.full((m, n), float("nan"))
    cpu_kernel.probe_exact_outputs(
        some,
        a_q.payload,
        a_q.scales,
        b_q.payload,
        b_q.scales,
        rows=torch.tensor([m - 1]),
        cols=torch.tensor([0]),
        width=64,
        rtz=rounding == "rtz",
        grid=grid,
        alpha=alpha,
        **layout,
    )
    asked = torch.zeros(m, n, dtype=torch.bool)
    asked[m - 1], asked[:, 0] = True, True
    assert torch.equal(some.view(torch.int32)[asked], reference[asked]) and some[~asked].isnan().all()
    got = gemm.matmul(a_q, b_q, "probe_matched", backend="cpu_kernel", **kwargs)
    assert torch.equal(got.view(torch.int32), reference)


def test_the_kernels_exact_outputs_refuse_indices_and_shapes_they_cannot_take():
    a_q, b_q = _wide_span_operands("ue5m3_b16", 4, 64, 5, False, 6.0, seed=1)
    args = (a_q.payload, a_q.scales, b_q.payload, b_q.scales)
    layout = {"block": 16, "column_block": 1, "width": 64, "rtz": True, "grid": None, "alpha": 1.0}
    with pytest.raises(ValueError, match=r"rows must index \[0, 4\)"):
        cpu_kernel.probe_exact_outputs(torch.empty(4, 5), *args, rows=torch.tensor([4]), cols=torch.arange(0), **layout)
    with pytest.raises(ValueError, match=r"cols must index \[0, 5\)"):
        cpu_kernel.probe_exact_outputs(
            torch.empty(4, 5), *args, rows=torch.arange(0), cols=torch.tensor([-1]), **layout
        )
    with pytest.raises(ValueError, match="out \\[M, N\\]"):
        cpu_kernel.probe_exact_outputs(torch.empty(5, 4), *args, rows=torch.arange(0), cols=torch.arange(0), **layout)


def _exact_probe_matched(pa, sa, pb, sb, *, block, width, rounding, grid, alpha):
    """The probe-matched output in exact rational arithmetic: each slice's exact sum rounded once to FP32, combined
    in K order (RTZ or RNE), snapped to the 1/grid lattice, times alpha in FP32."""
    from fractions import Fraction

    from helpers.rational import fp32, snap

    (m, k), n = pa.shape, pb.shape[1]
    a = [[Fraction(float(pa[i, kk])) * Fraction(float(sa[i, kk // block])) for kk in range(k)] for i in range(m)]
    b = [[Fraction(float(pb[kk, j])) * Fraction(float(sb[kk // block, j])) for kk in range(k)] for j in range(n)]
    out = torch.empty(m, n)
    for i in range(m):
        for j in range(n):
            acc = Fraction(0)
            for s0 in range(0, k, width):
                acc = fp32(acc + fp32(sum(a[i][kk] * b[j][kk] for kk in range(s0, s0 + width))), rounding)
            out[i, j] = float(fp32(snap(acc, grid) * Fraction(alpha)))
    return out


@pytest.mark.parametrize(("rounding", "grid"), [("rtz", None), ("rne", None), ("rtz", 1024)])
def test_the_kernels_exact_outputs_round_each_slice_sum_once_in_exact_arithmetic(rounding, grid):
    """Slices whose exact sum lies just off an FP32 tie (the FP64 sum lands on the tie, the rest is in the TwoSum
    error), and random slices spanning up to about 90 bits: every output is the exact rational reference's."""
    block, k, n = 16, 128, 3
    pa, pb = torch.zeros(3, k), torch.zeros(k, n)
    sa, sb = torch.ones(3, k // block), torch.full((k // block, n), 4.0)  # one product per block: partial = +-sa
    ties = [  # (A scales of blocks 0-2, signs): 1 + 2^-24 + 2^-90, 1 + 2^-24 - 2^-90, 1 - 2^-25 - 2^-90
        ([1.0, 2.0**-24, 2.0**-90], [1, 1, 1]),
        ([1.0, 2.0**-24, 2.0**-90], [1, 1, -1]),
        ([1.0, 2.0**-25, 2.0**-90], [1, -1, -1]),
    ]
    for row, (scales, signs) in enumerate(ties):
        for blk, (scale, sign) in enumerate(zip(scales, signs, strict=True)):
            sa[row, blk], pa[row, blk * block] = scale, 0.5 * sign
    pb[::block] = 0.5
    g = torch.Generator().manual_seed(7)
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

    def payload(*shape):
        return values[torch.randint(0, 8, shape, generator=g)] * torch.where(
            torch.rand(*shape, generator=g) < 0.5, -1, 1
        )

    def scales(*shape):
        significand = 1.0 + torch.randint(0, 8, shape, generator=g) / 8.0
        return torch.ldexp(significand, torch.randint(-22, 22, shape, generator=g))

    pa, sa = torch.cat([pa, payload(6, k)]), torch.cat([sa, scales(6, k // block)])
    pb, sb = torch.cat([pb, payload(k, 4)], 1), torch.cat([sb, scales(k // block, 4)], 1)
    m, n = pa.shape[0], pb.shape[1]
    want = _exact_probe_matched(pa, sa, pb, sb, block=block, width=64, rounding=rounding, grid=grid, alpha=0.75)
    out = torch.empty(m, n)
    cpu_kernel.probe_exact_outputs(
        out,
        pa,
        sa,
        pb,
        sb,
        rows=torch.arange(m),
        cols=torch.arange(0),
        block=block,
        column_block=1,
        width=64,
        rtz=rounding == "rtz",
        grid=grid,
        alpha=0.75,
    )
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))
    if grid is None:  # the ties, unsnapped: each rounds away from where the FP64 sum alone would take it
        assert out[0, 0] == 0.75 * (1 + 2.0**-23) and out[2, 0] == 0.75 * (1 - 2.0**-24)
