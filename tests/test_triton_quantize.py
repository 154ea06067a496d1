"""The Triton quantize kernel against the torch reference, bit for bit, under the Triton interpreter on the CPU."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import dataclasses

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("these tests run the kernels under TRITON_INTERPRET=1", allow_module_level=True)

from helpers.bits import assert_same_quantized  # noqa: E402
from ue5m3.numerics.formats import UE8M0  # noqa: E402
from ue5m3.numerics.philox import ElementIndex, RandomStream  # noqa: E402
from ue5m3.numerics.quantize import AxisQuantization, quantize, quantize_both_axes  # noqa: E402
from ue5m3.numerics.schemes import BlockScheme, ScaleOrder, ScaleRule, get_scheme  # noqa: E402

pytestmark = [
    pytest.mark.triton,
    # the interpreter evaluates with numpy: 1/0 for a zero NVFP4 block scale (then capped at FP32 max, as on the
    # GPU) and huge stale references warn there
    pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning", "ignore:overflow encountered:RuntimeWarning"),
]

SCHEMES = {
    "ue5m3_b16": get_scheme("ue5m3_b16"),
    "ue5m3_b32": get_scheme("ue5m3_b32"),
    "nvfp4": get_scheme("nvfp4"),
    "nvfp4_legacy": dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder.TE_LEGACY),
    "nvfp4_torchao": dataclasses.replace(get_scheme("nvfp4"), scale_order=ScaleOrder.TORCHAO),
    "mxfp4": get_scheme("mxfp4"),
    "mx_ceil": BlockScheme(name="mx_ceil", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_CEIL),
    "mx_rceil": BlockScheme(name="mx_rceil", scale=UE8M0, block_size=32, target=None, scale_rule=ScaleRule.MX_RCEIL),
    "nvfp4_4over6_mse": get_scheme("nvfp4_4over6_mse"),
    "nvfp4_4over6_mae": get_scheme("nvfp4_4over6_mae"),
    "nvfp4_4over6_abs_max": get_scheme("nvfp4_4over6_abs_max"),
    "ue5m3_b16_4over6_mae": get_scheme("ue5m3_b16_4over6_mae"),
    "ue5m3_all_finite_t8192": get_scheme("ue5m3_b16_all_finite").with_target(8192.0),  # the format study's
    "ue5m3_alto_t8192": get_scheme("ue5m3_b16_alto").with_target(8192.0),
    "mxfp4_b16": get_scheme("mxfp4_b16"),
    "mxfp4_b16_rceil": get_scheme("mxfp4_b16_rceil"),
}
LAYOUTS = {
    "1d-last": ((8, 64), {}),
    "axis0": ((64, 6), {"axis": 0}),
    "axis0-in-place": ((64, 96), {"axis": 0}),  # whole blocks both ways: read in place by the two-axis kernel
    "2d": ((32, 32), {"two_d": True}),
    "ragged": ((5, 40), {}),
}
STREAM = RandomStream(seed=11, module="layers.0.mlp.down_proj", role="dgrad_upstream_gradient", step=3, microbatch=1)


def _hard(shape, seed):
    """Gaussian values with exact E2M1 midpoints, zeros, a zero block and wide magnitudes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-8, 8, shape, generator=g).float())
    flat = x.view(-1)
    flat[:16] = 0.0
    flat[16:24] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25]) * flat[24:32].abs().max() / 6
    return x


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("rounding", ["rne", "rtz", "sf", "sr_te", "sr"])
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_triton_kernel_equals_the_torch_reference(scheme, rounding, layout):
    shape, kwargs = LAYOUTS[layout]
    x = _hard(shape, seed=len(scheme) + len(rounding))
    stream = STREAM if rounding in ("sf", "sr_te", "sr") else None
    ref = quantize(x, SCHEMES[scheme], rounding=rounding, stream=stream, backend="torch", **kwargs)
    got = quantize(x, SCHEMES[scheme], rounding=rounding, stream=stream, backend="triton", **kwargs)
    assert_same_quantized(got, ref)


@pytest.mark.parametrize("reference", [1e-30, 1e-3, 1e4, 1e30])
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4"])
def test_held_references_saturation_and_zero_repair_match(scheme, reference):
    x = _hard((8, 64), seed=5)
    ref = quantize(x, scheme, tensor_amax=reference, rounding="sf", stream=STREAM, backend="torch")
    got = quantize(x, scheme, tensor_amax=reference, rounding="sf", stream=STREAM, backend="triton")
    assert_same_quantized(got, ref)


def test_explicit_bits_and_shards_draw_what_the_reference_draws():
    x = _hard((16, 64), seed=6)
    bits = torch.randint(0, 256, x.shape, generator=torch.Generator().manual_seed(1))
    ref = quantize(x, "ue5m3_b16", rounding="sf", random_bits=bits, backend="torch")
    assert_same_quantized(quantize(x, "ue5m3_b16", rounding="sf", random_bits=bits, backend="triton"), ref)
    shard = ElementIndex((32, 64), (16, 0))
    ref = quantize(x, "ue5m3_b16", rounding="sr_te", stream=STREAM, index=shard, backend="torch")
    assert_same_quantized(quantize(x, "ue5m3_b16", rounding="sr_te", stream=STREAM, index=shard, backend="triton"), ref)


def test_triton_backend_refuses_what_it_does_not_cover():
    from ue5m3.numerics.formats import E4M3

    wide = BlockScheme(name="e4m3_payload", scale=get_scheme("ue5m3_b16").scale, block_size=16, target=448.0)
    wide = dataclasses.replace(wide, element=E4M3)
    with pytest.raises(ValueError, match="backend='triton' cannot quantize 'w'.*E2M1"):
        quantize(torch.ones(2, 16), wide, backend="triton", name="w")


# ----- both axes from one read ------------------------------------------------------------------------------------

OTHER_STREAM = RandomStream(seed=11, module="layers.0.mlp.down_proj", role="wgrad_upstream_gradient", step=3)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize(("last_rounding", "first_rounding"), [("rne", "rne"), ("sf", "sr_te"), ("sr", "rtz")])
@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32", "nvfp4", "nvfp4_torchao", "mxfp4", "mx_rceil"])
def test_both_axes_from_one_read_equal_the_two_reference_calls(scheme, last_rounding, first_rounding, transposed):
    """Each axis with its own rounding, Philox stream and shard index; 96 x 160 is not a multiple of the kernel's
    64 x 64 tile, so its edges are masked."""
    x = _hard((96, 160), seed=len(scheme))
    shard = ElementIndex((192, 160), (96, 0))
    tshard = ElementIndex((160, 192), (0, 96)) if transposed else shard
    last = AxisQuantization(rounding=last_rounding, stream=STREAM, index=shard, name="dy")
    first = AxisQuantization(rounding=first_rounding, stream=OTHER_STREAM, index=tshard, name="dyt")
    got_last, got_first = quantize_both_axes(x, SCHEMES[scheme], last, first, transposed=transposed, backend="triton")
    ref_last = quantize(x, SCHEMES[scheme], rounding=last_rounding, stream=STREAM, index=shard, backend="torch")
    operand = x.t() if transposed else x
    ref_first = quantize(
        operand,
        SCHEMES[scheme],
        axis=-1 if transposed else 0,
        rounding=first_rounding,
        stream=OTHER_STREAM,
        index=tshard,
        backend="torch",
    )
    assert_same_quantized(got_last, ref_last)
    assert_same_quantized(got_first, ref_first)
    assert got_first.shape == ref_first.shape and got_first.layout == ref_first.layout


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4"])
def test_both_axes_take_their_own_targets_and_held_references(scheme):
    x = _hard((64, 128), seed=3)
    held = torch.tensor(3.0 * float(x.abs().max()))
    last = AxisQuantization(tensor_amax=held, name="x")
    first = AxisQuantization(target=2048.0, rounding="sf", stream=STREAM, name="xt")
    got_last, got_first = quantize_both_axes(x, scheme, last, first, transposed=True, backend="triton")
    assert_same_quantized(got_last, quantize(x, scheme, tensor_amax=held, backend="torch"))
    ref_first = quantize(x.t(), scheme, target=2048.0, rounding="sf", stream=STREAM, backend="torch")
    assert_same_quantized(got_first, ref_first)
    assert got_first.scheme.target == 2048.0 and float(got_last.tensor_amax) == float(held)


def test_both_axes_of_a_ragged_tensor_are_the_two_calls():
    """Not whole blocks both ways: the two quantize calls run (same results, no fused kernel)."""
    x = _hard((40, 72), seed=4)
    got_last, got_first = quantize_both_axes(x, "ue5m3_b16", AxisQuantization(), AxisQuantization(), backend="triton")
    assert_same_quantized(got_last, quantize(x, "ue5m3_b16", backend="torch"))
    assert_same_quantized(got_first, quantize(x, "ue5m3_b16", axis=0, backend="torch"))


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "mxfp4", "nvfp4_4over6_mse"])
def test_the_gpu_tiles_and_64_bit_offsets_give_the_same_bits(scheme, monkeypatch):
    """The two-axis kernel at the tiles a GPU runs (32 x 32, no spills) and both kernels with 64-bit offsets (forced
    here; a launch takes them only for tensors past 2^31 elements): the reference's bits."""
    from ue5m3.numerics.kernels import triton_quantize

    x = _hard((96, 160), seed=7)
    last = AxisQuantization(rounding="sf", stream=STREAM, name="x")
    first = AxisQuantization(rounding="sr_te", stream=OTHER_STREAM, name="xt")
    ref_last = quantize(x, SCHEMES[scheme], rounding="sf", stream=STREAM, backend="torch")
    ref_first = quantize(x.t(), SCHEMES[scheme], rounding="sr_te", stream=OTHER_STREAM, backend="torch")
    ref_2d = quantize(x, SCHEMES[scheme], two_d=True, backend="torch")
    for tiles, limit in ((triton_quantize.TWO_AXIS_TILES["gpu"], triton_quantize.INT32_LIMIT), ((64, 64, 4), 100)):
        monkeypatch.setitem(triton_quantize.TWO_AXIS_TILES, "interpreter", tiles)
        monkeypatch.setattr(triton_quantize, "INT32_LIMIT", limit)
        got_last, got_first = quantize_both_axes(x, SCHEMES[scheme], last, first, transposed=True, backend="triton")
        assert_same_quantized(got_last, ref_last)
        assert_same_quantized(got_first, ref_first)
        assert_same_quantized(quantize(x, SCHEMES[scheme], two_d=True, backend="triton"), ref_2d)
