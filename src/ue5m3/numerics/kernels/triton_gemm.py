"""The probe-matched GEMM as one Triton kernel: the GPU twin of ``ue5m3_probe_gemm_payload`` (``csrc/accumulate.c``).

Per output tile and K-slice, with no [slices, M, N] intermediate:

* each block's payload dot product (16 or 32 elements) on the tensor cores in FP16 with FP32 accumulation: E2M1
  payloads are exact in FP16, their products are multiples of 1/4 up to 36 and a block sum stays below 2^13
  quarters, so the MMA is exact whatever its internal order;
* both block scales applied exactly in FP64 (at most 20 significant bits) and the slice's block terms summed by a
  TwoSum chain, exact while they span at most 106 bits and otherwise the very chain the CPU path's exact
  recomputation runs, so the result is the CPU path's bit for bit with no span check and no host read;
* the slice sum rounded once to FP32, slices combined in K order with round-toward-zero FP32 additions (TwoSum and a
  one-ulp step toward zero) or RNE ones;
* the 1/grid lattice snap (ties to even) and alpha, in FP32.

Launched with FP fusion off. Runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (FP16 dots: the
interpreter computes BF16 dots wrongly), which is how ``tests/test_triton_gemm.py`` checks it bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ue5m3.numerics.backend import triton_device_reason as usable

__all__ = ["probe_gemm_payload", "mma_sim_payload", "usable"]


@triton.jit
def _add_rtz(a, b):
    """FP32 a + b rounded toward zero: the RNE sum, stepped one ulp toward zero where its exact error says it
    overshot (the error's sign differs from the sum's)."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    opposite = (err.to(tl.int32, bitcast=True) ^ s.to(tl.int32, bitcast=True)) < 0
    stepped = (s.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)
    return tl.where((err != 0.0) & opposite, stepped, s)


@triton.jit
def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@triton.jit
def _round_fp64_to_fp32_exact(hi, lo):
    """RNE to FP32 of the exact hi + lo (a normalised double-double): round to odd on 53 bits first (step hi one
    ulp toward lo where lo != 0 and hi's last bit is even), then the FP64 -> FP32 conversion (as ``exact.py``)."""
    bits = hi.to(tl.int64, bitcast=True)
    even = (bits & 1) == 0
    magnitude_up = (lo > 0) == (hi > 0)  # stepping toward lo grows |hi| iff they share a sign
    stepped = tl.where(magnitude_up, bits + 1, bits - 1).to(tl.float64, bitcast=True)
    return tl.where((lo != 0) & even, stepped, hi).to(tl.float32)


@triton.jit
def _probe_kernel(
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
    grid,
    BLOCK: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
    RTZ: tl.constexpr,
    SNAP: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok, col_ok = rows < m, cols < n
    sub = tl.arange(0, BLOCK)
    sa_cols = k // BLOCK
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for s in range(0, k, WIDTH):
        hi = tl.zeros([BM, BN], dtype=tl.float64)
        lo = tl.zeros([BM, BN], dtype=tl.float64)
        for j in range(s, s + WIDTH, BLOCK):
            kk = j + sub
            pa = tl.load(pa_ptr + rows[:, None].to(tl.int64) * k + kk[None, :], mask=row_ok[:, None], other=0.0)
            pb = tl.load(pb_ptr + kk[:, None].to(tl.int64) * n + cols[None, :], mask=col_ok[None, :], other=0.0)
            block_sum = tl.dot(pa.to(tl.float16), pb.to(tl.float16), out_dtype=tl.float32)  # exact
            scale_a = tl.load(sa_ptr + rows.to(tl.int64) * sa_cols + j // BLOCK, mask=row_ok, other=0.0)
            scale_b = tl.load(sb_ptr + (j // BLOCK) * scale_cols + cols // COLUMN_BLOCK, mask=col_ok, other=0.0)
            both = scale_a.to(tl.float64)[:, None] * scale_b.to(tl.float64)[None, :]  # exact: 8 bits
            term = block_sum.to(tl.float64) * both  # the block's exact partial sum (at most 20 bits)
            if j == s:
                hi = term
            else:  # TwoSum chain, exactly as ``exact.twosum_chain_to_fp32``: exact while terms span <= 106 bits
                hi, err = _two_sum(hi, term)
                lo = lo + err
        hi, lo = _two_sum(hi, lo)
        p = _round_fp64_to_fp32_exact(hi, lo)  # the one RNE rounding of the slice's exact sum
        if RTZ:
            acc = _add_rtz(acc, p)
        else:
            acc = acc + p
    if SNAP:  # torch.round(acc * grid) / grid: half to even (floor form, exact for every FP32)
        y = acc * grid
        lower = tl.floor(y)
        delta = y - lower
        odd = (lower - 2.0 * tl.floor(lower * 0.5)) == 1.0
        up = (delta > 0.5) | ((delta == 0.5) & odd)
        acc = tl.math.div_rn(lower + up.to(tl.float32), tl.full([BM, BN], grid, tl.float32))  # exact: power of 2
    out = acc * tl.load(alpha_ptr)
    tl.store(c_ptr + rows[:, None].to(tl.int64) * n + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


TILE = 32  # output rows and columns per program


def _launch(
    payload_a, scales_a, payload_b, scales_b, block: int, width: int, alpha
) -> tuple[tuple, tuple, torch.Tensor]:
    """The checks and the leading kernel arguments both GEMM kernels share: (pa, sa, pb, sb, alpha, out, m, n, k,
    B's scale columns), the launch grid and the output."""
    reason = usable(payload_a.device)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run here: {reason}")
    pa, sa, pb, sb = (t.to(torch.float32).contiguous() for t in (payload_a, scales_a, payload_b, scales_b))
    (m, k), n = pa.shape, pb.shape[1]
    if pb.shape[0] != k or block % 16 or k % width:
        raise ValueError(f"the Triton GEMMs need A [M, K], B [K, N], blocks of 16s and K a multiple of {width}")
    alpha = torch.as_tensor(alpha, dtype=torch.float32).reshape(1).to(pa.device)  # stays on the device
    out = torch.empty(m, n, dtype=torch.float32, device=pa.device)
    launch = (triton.cdiv(m, TILE), triton.cdiv(n, TILE))
    return (pa, sa, pb, sb, alpha, out, m, n, k, sb.shape[1]), launch, out


def probe_gemm_payload(
    payload_a: torch.Tensor,
    scales_a: torch.Tensor,
    payload_b: torch.Tensor,
    scales_b: torch.Tensor,
    *,
    block: int,
    column_block: int,
    width: int,
    rtz: bool,
    grid: int | None,
    alpha: torch.Tensor | float,
) -> torch.Tensor:
    """The probe_matched GEMM from payloads and block scales, like the CPU ``probe_gemm_payload``, but complete by
    itself: every slice sum is formed exactly by a TwoSum chain over its block terms, so no span
    check and no recomputation are needed, and nothing is read back to the host (``alpha`` may be a device tensor).
    """
    if width % 16 or width % block:
        raise ValueError(f"probe_gemm_payload needs a slice width of 16s holding whole blocks, got {width}")
    args, launch, out = _launch(payload_a, scales_a, payload_b, scales_b, block, width, alpha)
    _probe_kernel[launch](
        *args,
        float(grid or 1),
        BLOCK=block,
        COLUMN_BLOCK=column_block,
        WIDTH=width,
        RTZ=bool(rtz),
        SNAP=grid is not None,
        BM=TILE,
        BN=TILE,
        enable_fp_fusion=False,
    )
    return out


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
    truncated toward zero 35 bits below it, summed exactly, truncated to FP32 (inf from 2^128)."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok, col_ok = rows < m, cols < n
    sub = tl.arange(0, 16)
    sa_cols = k // BLOCK
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for s in range(0, k, 64):
        acc64 = acc.to(tl.float64)
        biased = (acc.to(tl.int32, bitcast=True) >> 23) & 0xFF
        top = tl.where(biased == 0, -126, biased - 127).to(tl.int64)  # zero and subnormal C: -126
        t0 = tl.zeros([BM, BN], dtype=tl.float64)
        t1 = tl.zeros([BM, BN], dtype=tl.float64)
        t2 = tl.zeros([BM, BN], dtype=tl.float64)
        t3 = tl.zeros([BM, BN], dtype=tl.float64)
        for q in tl.static_range(4):
            kk = s + 16 * q + sub
            pa = tl.load(pa_ptr + rows[:, None].to(tl.int64) * k + kk[None, :], mask=row_ok[:, None], other=0.0)
            pb = tl.load(pb_ptr + kk[:, None].to(tl.int64) * n + cols[None, :], mask=col_ok[None, :], other=0.0)
            block_sum = tl.dot(pa.to(tl.float16), pb.to(tl.float16), out_dtype=tl.float32)  # exact
            j = (s + 16 * q) // BLOCK
            scale_a = tl.load(sa_ptr + rows.to(tl.int64) * sa_cols + j, mask=row_ok, other=1.0).to(tl.float64)
            scale_b = tl.load(sb_ptr + j * scale_cols + cols // COLUMN_BLOCK, mask=col_ok, other=1.0).to(tl.float64)
            ea = tl.where(scale_a == 0, -126, tl.maximum(_exponent64(scale_a), MIN_EXP_A))
            eb = tl.where(scale_b == 0, -126, tl.maximum(_exponent64(scale_b), MIN_EXP_B))
            top = tl.maximum(top, ea[:, None] + eb[None, :])
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
    """The mma_sim GEMM (``gemm.matmul(..., "mma_sim")``) as one Triton kernel: the torch path's bits."""
    args, launch, out = _launch(payload_a, scales_a, payload_b, scales_b, block, 64, alpha)
    _mma_sim_kernel[launch](
        *args,
        BLOCK=block,
        COLUMN_BLOCK=column_block,
        MIN_EXP_A=min_exponent_a,
        MIN_EXP_B=min_exponent_b,
        BM=TILE,
        BN=TILE,
        enable_fp_fusion=False,
    )
    return out
