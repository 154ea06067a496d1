"""The Triton probe-matched GEMM against the torch path, bit for bit, under the Triton interpreter on the CPU."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on CPU tensors

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (the GPU extra)")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("these tests run the kernels under TRITON_INTERPRET=1", allow_module_level=True)

from ue5m3.numerics import gemm  # noqa: E402
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
