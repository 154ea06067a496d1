"""The Triton probe-matched GEMM against the torch path, bit for bit, under the Triton interpreter on the CPU."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("these tests run the kernels under TRITON_INTERPRET=1", allow_module_level=True)

from helpers.bits import same_bits  # noqa: E402
from ue5m3.numerics import fast_path, gemm  # noqa: E402
from ue5m3.numerics.quantize import quantize  # noqa: E402

pytestmark = pytest.mark.triton


def _operands(scheme, m, k, n, b_two_d, seed, spread=2.0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g) * torch.exp2(spread * torch.randn(m, 1, generator=g))
    b = torch.randn(k, n, generator=g) * torch.exp2(spread * torch.randn(1, n, generator=g))
    a[0, :32] = 0  # zero blocks
    return quantize(a, scheme), quantize(b, scheme, axis=0, two_d=b_two_d)


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4"])
@pytest.mark.parametrize(("shape", "b_two_d"), [((20, 128, 36), False), ((33, 64, 40), True)])
@pytest.mark.parametrize(("rounding", "grid"), [("rtz", 1024), ("rtz", None), ("rne", 4096)])
def test_triton_probe_matched_equals_the_torch_path(scheme, shape, b_two_d, rounding, grid):
    a_q, b_q = _operands(scheme, *shape, b_two_d, seed=sum(shape))
    kwargs = {"cross_slice_rounding": rounding, "final_grid": grid}
    ref = gemm.matmul(a_q, b_q, "probe_matched", backend="torch", **kwargs)
    got = gemm.matmul(a_q, b_q, "probe_matched", backend="triton", **kwargs)
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


def test_triton_path_recomputes_span_overflow_rows_exactly():
    """Blocks 2^24 apart inside one slice: FP64 cannot hold the slice sum, the row goes to the exact path."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(3, 64, generator=g)
    a[:, :16] *= 2.0**12
    a[:, 48:] *= 2.0**-14
    b = torch.randn(64, 16, generator=g)
    b[:16] *= 2.0**-14
    b[48:] *= 2.0**12
    a_q, b_q = quantize(a, "ue5m3_b16"), quantize(b, "ue5m3_b16", axis=0)
    for rounding in ("rtz", "rne"):
        ref = gemm.matmul(a_q, b_q, "probe_matched", backend="torch", cross_slice_rounding=rounding, final_grid=None)
        got = gemm.matmul(a_q, b_q, "probe_matched", backend="triton", cross_slice_rounding=rounding, final_grid=None)
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


def test_triton_gemm_refuses_blocks_it_does_not_take():
    a_q = quantize(torch.randn(4, 64), "ue5m3_b16")
    b_q = quantize(torch.randn(64, 4), "ue5m3_b16", axis=0)
    from ue5m3.numerics.kernels import triton_gemm

    with pytest.raises(ValueError, match="blocks of 16s"):
        triton_gemm.probe_gemm_payload(
            a_q.payload,
            a_q.scales,
            b_q.payload,
            b_q.scales,
            block=8,
            column_block=1,
            width=64,
            rtz=True,
            grid=None,
            alpha=1.0,
        )


@pytest.mark.parametrize("scheme", ["mxfp4", "ue5m3_b16"])
def test_triton_path_equals_the_cpu_chain_even_beyond_106_bit_spans(scheme):
    """MXFP4 blocks 2^100 apart inside a slice: neither path is exact, both run the same TwoSum chain on the same
    block terms, so the bits still agree."""
    g = torch.Generator().manual_seed(9)
    a = torch.randn(2, 64, generator=g)
    a[:, :32] *= 2.0**50
    a[:, 32:] *= 2.0**-50
    b = torch.randn(64, 16, generator=g)
    b[:32] *= 2.0**50
    b[32:] *= 2.0**-50
    a_q, b_q = quantize(a, scheme), quantize(b, scheme, axis=0)
    for rounding in ("rtz", "rne"):
        kwargs = {"cross_slice_rounding": rounding, "final_grid": None}
        ref = gemm.matmul(a_q, b_q, "probe_matched", backend="cpu_kernel", **kwargs)
        got = gemm.matmul(a_q, b_q, "probe_matched", backend="triton", **kwargs)
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4"])
@pytest.mark.parametrize(("shape", "b_two_d", "spread"), [((20, 128, 36), False, 2.0), ((33, 64, 40), True, 12.0)])
def test_triton_mma_sim_equals_the_torch_path(scheme, shape, b_two_d, spread):
    """Scale-exponent alignment, 16-element sub-blocks inside 32-element blocks, zero blocks and wide spreads."""
    a_q, b_q = _operands(scheme, *shape, b_two_d, seed=sum(shape) + 1, spread=spread)
    ref = gemm.matmul(a_q, b_q, "mma_sim", backend="torch")
    got = gemm.matmul(a_q, b_q, "mma_sim", backend="triton")
    assert torch.equal(got.view(torch.int32), ref.view(torch.int32))


def test_triton_mma_sim_keeps_a_zero_sum_sub_block_in_the_alignment():
    """A sub-block cancelling to zero at scale 2^20 truncates a 2^-22 block beside it (MMA-Sim's reading)."""
    a = torch.zeros(1, 64)
    a[0, 0], a[0, 1], a[0, 30] = 2.0**20, -(2.0**20), 6 * 2.0**20
    a[0, 32], a[0, 62] = 2.0**-22, 6 * 2.0**-22
    b = torch.zeros(64, 1)
    b[0, 0], b[1, 0], b[31, 0], b[32, 0], b[63, 0] = 1.0, 1.0, 6.0, 1.0, 6.0
    a_q, b_q = quantize(a, "mxfp4"), quantize(b, "mxfp4", axis=0)
    ref = gemm.matmul(a_q, b_q, "mma_sim", backend="torch")
    got = gemm.matmul(a_q, b_q, "mma_sim", backend="triton")
    assert float(ref) == 0.0 and torch.equal(got.view(torch.int32), ref.view(torch.int32))


def test_triton_mma_sim_gives_an_all_zero_product_group_no_alignment():
    """mmasim 2.1.1's e_zero: a block of zero products at scale 2^20 leaves a 2^-22 block beside it whole, and a
    zero accumulator below UE8M0's smallest scales (exponent sums down to -254) takes -139."""
    a = torch.zeros(2, 128)
    a[:, 30], a[:, 32], a[:, 62] = 6 * 2.0**20, 2.0**-22, 6 * 2.0**-22  # block 0: only the spare, which meets b's 0
    a[1, 64:96], a[1, 94] = 2.0**-127, 6 * 2.0**-127
    b = torch.zeros(128, 1)
    b[0:30, 0], b[32, 0], b[63, 0] = 1.0, 1.0, 6.0
    b[64:96, 0], b[95, 0] = 2.0**-120, 6 * 2.0**-120
    a_q, b_q = quantize(a, "mxfp4"), quantize(b, "mxfp4", axis=0)
    ref = gemm.matmul(a_q, b_q, "mma_sim", backend="torch")
    got = gemm.matmul(a_q, b_q, "mma_sim", backend="triton")
    assert float(ref[0]) == 2.0**-22 and torch.equal(got.view(torch.int32), ref.view(torch.int32))


# ----- the fast path (one exact tensor-core dot per slice) and the exact path ------------------------------------


def _paths(a_q, b_q, **kwargs):
    """The Triton probe_matched result and the path each tile-slice took (1 = exact path)."""
    from ue5m3.numerics.kernels import triton_gemm

    block = a_q.scheme.block_size
    return triton_gemm.probe_gemm_payload(
        a_q.payload,
        a_q.scales,
        b_q.payload,
        b_q.scales,
        block=block,
        column_block=block if b_q.layout.two_d else 1,
        width=kwargs.pop("width", 64),
        rtz=kwargs.pop("rtz", True),
        grid=kwargs.pop("grid", 1024),
        alpha=gemm.alpha(a_q, b_q),
        scale_mantissa_bits=(a_q.scheme.scale.mantissa_bits, b_q.scheme.scale.mantissa_bits),
        paths=True,
        **kwargs,
    )


def _reference(a_q, b_q, width=64, rtz=True, grid=1024):
    rounding = "rtz" if rtz else "rne"
    return gemm.matmul(
        a_q, b_q, "probe_matched", slice_width=width, cross_slice_rounding=rounding, final_grid=grid, backend="torch"
    )


def _blockwise(m, k, spread, seed, block=16):
    """Gaussian values whose 16-element blocks are scaled by 2^(spread * N(0, 1)): how far apart a slice's block
    scales lie."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.exp2(spread * torch.randn(m, k // block, generator=g))
    return torch.randn(m, k, generator=g) * scales.repeat_interleave(block, 1)


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "ue5m3_b32", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("b_two_d", [False, True])
def test_typical_operands_take_the_fast_path_and_keep_the_bits(scheme, b_two_d):
    """Gaussian activations with 1% outlier channels (x20) against Gaussian weights: every tile-slice is one exact
    FP16 dot, and the result is the reference's bit for bit."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(96, 512, generator=g)
    x[:, torch.randperm(512, generator=g)[:5]] *= 20
    w = torch.randn(512, 80, generator=g) * 0.02
    a_q, b_q = quantize(x, scheme), quantize(w, scheme, axis=0, two_d=b_two_d)
    for rtz, grid in ((True, 1024), (False, None)):
        out, taken = _paths(a_q, b_q, rtz=rtz, grid=grid)
        assert int(taken.sum()) == 0
        assert same_bits(out, _reference(a_q, b_q, rtz=rtz, grid=grid))


@pytest.mark.parametrize("scheme", ["ue5m3_b16", "nvfp4", "mxfp4"])
def test_block_scales_far_apart_take_the_exact_path_and_keep_the_bits(scheme):
    a_q = quantize(_blockwise(40, 256, 4.0, seed=1), scheme)
    b_q = quantize(_blockwise(36, 256, 4.0, seed=2).t().contiguous(), scheme, axis=0)
    out, taken = _paths(a_q, b_q)
    assert bool(taken.all())
    assert same_bits(out, _reference(a_q, b_q))


def test_one_gemm_mixes_both_paths_in_k_order():
    """Slices alternate between the paths within one accumulation (per tile-slice decisions, K order kept)."""
    x = _blockwise(70, 512, 0.0, seed=4)
    x[:, 128:192] *= torch.tensor([2.0**12, 1.0, 2.0**-12, 1.0]).repeat_interleave(16)  # one wide slice
    x[:, 320:384] *= torch.tensor([1.0, 2.0**-20, 1.0, 2.0**9]).repeat_interleave(16)
    w = _blockwise(60, 512, 0.0, seed=5).t().contiguous()
    a_q, b_q = quantize(x, "ue5m3_b16"), quantize(w, "ue5m3_b16", axis=0)
    out, taken = _paths(a_q, b_q)
    assert taken[:, :, [2, 5]].all() and int(taken.sum()) == taken[:, :, [2, 5]].numel()
    assert same_bits(out, _reference(a_q, b_q))


def test_the_bound_is_what_keeps_the_fast_path_exact():
    """The same operands with the bound lifted: the FP16 dot is no longer exact and the bits change. So the equality
    tests above can fail, and the exact path is taken exactly where it is needed."""
    a_q = quantize(_blockwise(64, 256, 3.0, seed=6), "ue5m3_b16")
    b_q = quantize(_blockwise(64, 256, 3.0, seed=7).t().contiguous(), "ue5m3_b16", axis=0)
    reference = _reference(a_q, b_q, grid=None)
    guarded, taken = _paths(a_q, b_q, grid=None)
    forced, forced_taken = _paths(a_q, b_q, grid=None, fast_bound=float("inf"))
    assert bool(taken.any()) and int(forced_taken.sum()) == 0
    assert same_bits(guarded, reference)
    assert not same_bits(forced, reference)


def test_tile_size_changes_the_paths_never_the_bits():
    a_q = quantize(_blockwise(150, 192, 1.0, seed=8), "nvfp4")
    b_q = quantize(_blockwise(140, 192, 1.0, seed=9).t().contiguous(), "nvfp4", axis=0, two_d=True)
    small, _ = _paths(a_q, b_q, tile=64)
    large, _ = _paths(a_q, b_q, tile=128)
    assert same_bits(small, large) and same_bits(small, _reference(a_q, b_q))


@pytest.mark.parametrize("path_bound", [2.0**23, 0.0], ids=["fast", "exact"])
def test_the_snap_keeps_the_sign_of_a_negative_value_in_the_dead_zone(path_bound):
    """torch.round(-0.3) is -0.0: an accumulator in (-1/2048, 0) snaps to -0.0 (then times alpha), on both paths."""
    a = torch.zeros(2, 64)
    a[0, 0], a[1, 0], a[0, 16] = -1.0, 1.0, 2.0**20  # the large value meets zeros in B: tiny encoded products
    b = torch.zeros(64, 2)
    b[0], b[32] = 1.0, 2.0**20
    a_q, b_q = quantize(a, "ue5m3_b16"), quantize(b, "ue5m3_b16", axis=0)
    reference = _reference(a_q, b_q)
    assert torch.signbit(reference[0]).all() and not torch.signbit(reference[1]).any() and (reference == 0).all()
    out, _ = _paths(a_q, b_q, fast_bound=path_bound)
    assert same_bits(out, reference)


def test_all_zero_operands_and_slices():
    a = _blockwise(40, 192, 0.0, seed=10)
    a[:5] = 0
    a[:, 64:128] = 0
    b = _blockwise(30, 192, 0.0, seed=11).t().contiguous()
    b[:, :3] = 0
    a_q, b_q = quantize(a, "ue5m3_b16"), quantize(b, "ue5m3_b16", axis=0)
    out, taken = _paths(a_q, b_q)
    assert same_bits(out, _reference(a_q, b_q))
    zero_a, zero_b = quantize(torch.zeros(8, 64), "ue5m3_b16"), quantize(torch.zeros(64, 8), "ue5m3_b16", axis=0)
    assert same_bits(_paths(zero_a, zero_b)[0], _reference(zero_a, zero_b))


# ----- the shipped GPU tiles, 64-bit offsets and a prepared B, in the interpreter --------------------------------


@pytest.mark.parametrize("capability", [90, 100])
def test_the_gpu_tiles_give_the_reference_bits(capability):
    """The tiles a GPU runs (fast tiles of 128 x 64, exact sub-tiles of 32 x 64 inside them, the grouped launch
    order) with both paths in one GEMM, ragged edges included: the reference's bits."""
    from ue5m3.numerics.kernels import triton_gemm

    x = _blockwise(150, 256, 0.0, seed=12)
    x[:40, 64:128] *= torch.tensor([2.0**12, 1.0, 2.0**-12, 1.0]).repeat_interleave(16)  # an exact slice, one tile
    a_q = quantize(x, "ue5m3_b16")
    b_q = quantize(_blockwise(140, 256, 1.0, seed=13).t().contiguous(), "ue5m3_b16", axis=0, two_d=True)
    out, taken = _paths(a_q, b_q, tiles=triton_gemm.PROBE_TILES[capability])
    assert taken.shape[:2] == (2, 3) and bool(taken[0, :, 1].all()) and int(taken.sum()) == 3
    assert same_bits(out, _reference(a_q, b_q))


def test_64_bit_offsets_give_the_same_bits(monkeypatch):
    """Offsets are 32-bit where every tensor allows it; the 64-bit kernels (forced here) compute the same."""
    from ue5m3.numerics.kernels import triton_gemm

    a_q = quantize(_blockwise(40, 192, 3.0, seed=14), "nvfp4")
    b_q = quantize(_blockwise(36, 192, 3.0, seed=15).t().contiguous(), "nvfp4", axis=0)
    narrow, taken = _paths(a_q, b_q)
    monkeypatch.setattr(triton_gemm, "INT32_LIMIT", 100)
    launches, _, _ = triton_gemm.probe_gemm_launches(
        a_q.payload,
        a_q.scales,
        b_q.payload,
        b_q.scales,
        block=16,
        column_block=1,
        width=64,
        rtz=True,
        grid=1024,
        alpha=1.0,
    )
    assert all(launch.constants["INDEX64"] for launch in launches)
    wide, wide_taken = _paths(a_q, b_q)
    assert bool(taken.any()) and torch.equal(taken, wide_taken)
    assert same_bits(narrow, wide) and same_bits(narrow, _reference(a_q, b_q))


def test_a_prepared_b_gives_the_same_bits_and_a_mismatched_one_is_refused():
    a_q = quantize(_blockwise(40, 192, 2.0, seed=16), "ue5m3_b16")
    b_q = quantize(_blockwise(36, 192, 2.0, seed=17).t().contiguous(), "ue5m3_b16", axis=0, two_d=True)
    prepared = gemm.prepare_operand(b_q, backend="triton")
    got = gemm.matmul(a_q, b_q, "probe_matched", backend="triton", prepared_b=prepared)
    assert same_bits(got, _reference(a_q, b_q))
    with pytest.raises(ValueError, match="prepared_b was prepared"):
        gemm.matmul(a_q, b_q, "probe_matched", slice_width=32, backend="triton", prepared_b=prepared)
    assert gemm.prepare_operand(b_q, backend="torch") is None and gemm.prepare_operand(b_q, "mma_sim") is None


# ----- the fast-path rule restated in torch (fast_path.probe_paths), against the kernels' own flags -----------------


@pytest.mark.parametrize(("scheme", "b_two_d"), [("ue5m3_b16", True), ("nvfp4", False), ("ue5m3_b32", False)])
def test_probe_paths_are_the_kernels_paths(scheme, b_two_d):
    """Which tile-slices take the exact path, from torch alone on the CPU, equals the kernels' ``paths=True`` flags:
    Gaussian operands, rows whose block scales lie 2^(2 N(0, 1)) apart, an outlier channel at x1000 and zero
    blocks, at the interpreter's 64 x 64 tiles and the GPU's 128 x 64, ragged edges included."""
    from ue5m3.numerics.kernels import triton_gemm

    g = torch.Generator().manual_seed(21)
    x = torch.randn(150, 128, generator=g)
    x[:40] = _blockwise(40, 128, 2.0, seed=22)  # the first row tile: blocks far apart
    x[64:, 100] *= 1000.0  # an outlier channel in slice 1 of the other rows
    x[:20, :64] = 0.0
    a_q = quantize(x, scheme)
    b_q = quantize(torch.randn(128, 72, generator=g), scheme, axis=0, two_d=b_two_d)
    for tiles in (triton_gemm.INTERPRETER_TILES, triton_gemm.PROBE_TILES[90]):
        _, taken = _paths(a_q, b_q, tiles=tiles)
        paths = fast_path.probe_paths(a_q, b_q, block_m=tiles.block_m, block_n=tiles.block_n)
        assert paths.shape == taken.shape and torch.equal(paths, taken.bool())
        assert 0 < int(paths.sum()) < paths.numel()
    gpu = triton_gemm.PROBE_TILES[90]
    assert all((t.block_m, t.block_n) == (gpu.block_m, gpu.block_n) for t in triton_gemm.PROBE_TILES.values())
    assert torch.equal(fast_path.probe_paths(a_q, b_q), fast_path.probe_paths(a_q, b_q, block_m=128, block_n=64))
