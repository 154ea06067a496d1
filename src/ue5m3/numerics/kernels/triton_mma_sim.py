"""The mma_sim GEMM in Triton: Blackwell's block-scaled MMA as MMA-Sim computes it (``gemm.mma_sim_step``), one kernel
giving the torch path's bits (``tests/test_triton_gemm.py`` checks them under ``TRITON_INTERPRET=1``;
``tests/test_triton_compile.py`` compiles it for sm_90 and sm_100).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import Launch, check_triton_version, run
from ue5m3.numerics.kernels.launch import triton_device_reason as usable

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = ["mma_sim_payload", "TILE"]


TILE = 32  # output rows and columns per program of the mma_sim kernel


def _allocate(
    payload_a, scales_a, payload_b, scales_b, block: int, width: int, alpha
) -> tuple[tuple, tuple, torch.Tensor]:
    """The checks and the leading arguments of the mma_sim kernel: (pa, sa, pb, sb, alpha, out, m, n, k, B's scale
    columns) with the FP32 copies and the output allocated, the launch grid and the output."""
    reason = usable(payload_a.device)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run here: {reason}")
    pa, sa, pb, sb = (t.to(torch.float32).contiguous() for t in (payload_a, scales_a, payload_b, scales_b))
    (m, k), n = pa.shape, pb.shape[1]
    if pb.shape[0] != k or block % 16 or k % width:
        raise ValueError(f"the Triton GEMMs need A [M, K], B [K, N], blocks of 16s and K a multiple of {width}")
    alpha = torch.as_tensor(alpha, dtype=torch.float32).reshape(1).to(pa.device)  # stays on the device
    out = torch.empty(m, n, dtype=torch.float32, device=pa.device)
    return (pa, sa, pb, sb, alpha, out, m, n, k, sb.shape[1]), (triton.cdiv(m, TILE), triton.cdiv(n, TILE)), out


@triton.jit
def _exponent64(x):
    """floor(log2 |x|) of nonzero finite FP64 values, from the exponent bits (all our values are FP64-normal)."""
    return ((x.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023


@triton.jit
def _pow2_64(k):
    return ((k + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def _mma_sim_kernel(
    pa_ptr,
    sa_ptr,
    pb_ptr,
    sb_ptr,
    alpha_ptr,
    c_ptr,
    m,
    n,
    k,
    scale_cols,
    BLOCK: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
    MIN_EXP_A: tl.constexpr,
    MIN_EXP_B: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    """MMA-Sim's Blackwell block-scaled MMA (k = 64, 35 fraction bits), as ``gemm.mma_sim_step``: four 16-element
    sub-block terms at their scale-exponent sums and the FP32 accumulator aligned to the largest exponent, each
    truncated toward zero 35 bits below it, summed exactly, truncated to FP32 (inf from 2^128). A zero C, a group
    whose products are all zero and a group with a zero scale take e_zero = -139 (``mmasim`` 2.1.1)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok, col_ok = rows < m, cols < n
    sub = tl.arange(0, 16)
    sa_cols = k // BLOCK
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for s in range(0, k, 64):
        acc64 = acc.to(tl.float64)
        biased = (acc.to(tl.int32, bitcast=True) >> 23) & 0xFF
        top = tl.where(biased == 0, -126, biased - 127).to(tl.int64)  # subnormal C: -126
        top = tl.where(acc == 0.0, -139, top)  # zero C: e_zero
        t0 = tl.zeros([BM, BN], dtype=tl.float64)
        t1 = tl.zeros([BM, BN], dtype=tl.float64)
        t2 = tl.zeros([BM, BN], dtype=tl.float64)
        t3 = tl.zeros([BM, BN], dtype=tl.float64)
        for q in tl.static_range(4):
            kk = s + 16 * q + sub
            pa = tl.load(pa_ptr + rows[:, None].to(tl.int64) * k + kk[None, :], mask=row_ok[:, None], other=0.0)
            pb = tl.load(pb_ptr + kk[:, None].to(tl.int64) * n + cols[None, :], mask=col_ok[None, :], other=0.0)
            block_sum = tl.dot(pa.to(tl.float16), pb.to(tl.float16), out_dtype=tl.float32)  # exact
            # the sum of |products| is zero iff every product is (exact too): such a group takes e_zero
            magnitude = tl.dot(tl.abs(pa).to(tl.float16), tl.abs(pb).to(tl.float16), out_dtype=tl.float32)
            j = (s + 16 * q) // BLOCK
            scale_a = tl.load(sa_ptr + rows.to(tl.int64) * sa_cols + j, mask=row_ok, other=1.0).to(tl.float64)
            scale_b = tl.load(sb_ptr + j * scale_cols + cols // COLUMN_BLOCK, mask=col_ok, other=1.0).to(tl.float64)
            ea = tl.maximum(_exponent64(scale_a), MIN_EXP_A)
            eb = tl.maximum(_exponent64(scale_b), MIN_EXP_B)
            zero = (scale_a == 0)[:, None] | (scale_b == 0)[None, :] | (magnitude == 0.0)
            top = tl.maximum(top, tl.where(zero, -139, ea[:, None] + eb[None, :]))
            term = block_sum.to(tl.float64) * (scale_a[:, None] * scale_b[None, :])
            if q == 0:
                t0 = term
            elif q == 1:
                t1 = term
            elif q == 2:
                t2 = term
            else:
                t3 = term
        inv_quantum = _pow2_64(35 - top)
        quantum = _pow2_64(top - 35)
        # truncation toward zero onto the quantum: every term is below 2^48 quanta, exact as int64
        total = (acc64 * inv_quantum).to(tl.int64).to(tl.float64) * quantum
        total += (t0 * inv_quantum).to(tl.int64).to(tl.float64) * quantum
        total += (t1 * inv_quantum).to(tl.int64).to(tl.float64) * quantum
        total += (t2 * inv_quantum).to(tl.int64).to(tl.float64) * quantum
        total += (t3 * inv_quantum).to(tl.int64).to(tl.float64) * quantum
        total = total + 0.0  # an exact zero is +0.0
        r = total.to(tl.float32)  # RNE, then one step toward zero where it overshot: RTZ
        over = tl.abs(r.to(tl.float64)) > tl.abs(total)
        r = tl.where(over, (r.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True), r)
        r = r + 0.0  # a sum that truncates to zero is +0.0 (MMA-Sim's "-0.0 to +0.0")
        huge = tl.abs(total) >= 340282366920938463463374607431768211456.0  # 2^128
        acc = tl.where(huge, tl.where(total > 0, float("inf"), float("-inf")), r)
    out = acc * tl.load(alpha_ptr)
    tl.store(c_ptr + rows[:, None].to(tl.int64) * n + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


def mma_sim_payload(
    payload_a: torch.Tensor,
    scales_a: torch.Tensor,
    payload_b: torch.Tensor,
    scales_b: torch.Tensor,
    *,
    block: int,
    column_block: int,
    min_exponent_a: int,
    min_exponent_b: int,
    alpha: torch.Tensor | float,
) -> torch.Tensor:
    """The mma_sim GEMM (``gemm.matmul(..., "mma_sim")``) as one Triton kernel: the torch path's bits (on ``meta``
    tensors, inside planning, the allocations only)."""
    args, launch_grid, out = _allocate(payload_a, scales_a, payload_b, scales_b, block, 64, alpha)
    constants = dict(
        BLOCK=block,
        COLUMN_BLOCK=column_block,
        MIN_EXP_A=min_exponent_a,
        MIN_EXP_B=min_exponent_b,
        BM=TILE,
        BN=TILE,
        enable_fp_fusion=False,
    )
    run([Launch(_mma_sim_kernel, launch_grid, args, constants)], out.device)
    return out
