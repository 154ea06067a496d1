"""The probe_matched GEMM's exact path: a kernel of its own over the output tiles the fast kernel flagged
(:mod:`ue5m3.numerics.kernels.triton_gemm` launches both), so its FP64 state never sets the fast kernel's registers.

In sub-tiles small enough for that state to stay in registers (every program of an unflagged tile returns at once),
each slice the bounds cover is the fast kernel's dot; each other slice is each block's payload dot on the tensor
cores, both block scales applied in FP64 and the block terms summed by a TwoSum chain, exactly as
``exact.twosum_chain_to_fp32``, then rounded once to FP32 (RNE).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import check_triton_version
from ue5m3.numerics.kernels.triton_probe_parts import accumulate, fast_slice, offsets, store_output

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = ["_probe_exact_kernel"]  # private-looking: its compiled name, in benchmarks/records/compiled_kernels.json


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
def _exact_slice_sum(
    pa_ptr,
    sa_ptr,
    pb_ptr,
    sb_ptr,
    rows,
    cols,
    m,
    n,
    j,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    BLOCK: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
    INDEX64: tl.constexpr,
):
    """Slice j of the outputs (rows, cols), each the RNE-to-FP32 of its exact sum: each block's payload dot on the
    tensor cores (exact: a block sum stays below 2^13 quarters), both block scales applied in FP64 (at most 20
    significant bits) and the block terms summed by a TwoSum chain, exactly as ``exact.twosum_chain_to_fp32``
    (exact while the terms span at most 106 bits, the CPU path's chain beyond)."""
    row_ok, col_ok = rows < m, cols < n
    sub = tl.arange(0, BLOCK)
    hi = tl.zeros([rows.shape[0], cols.shape[0]], dtype=tl.float64)
    lo = tl.zeros([rows.shape[0], cols.shape[0]], dtype=tl.float64)
    for q in tl.static_range(WIDTH // BLOCK):
        kk = j * WIDTH + q * BLOCK + sub
        block = j * (WIDTH // BLOCK) + q
        pa = tl.load(pa_ptr + offsets(rows, kk, stride_am, stride_ak, INDEX64), mask=row_ok[:, None], other=0.0)
        pb = tl.load(pb_ptr + offsets(kk, cols, stride_bk, stride_bn, INDEX64), mask=col_ok[None, :], other=0.0)
        block_sum = tl.dot(pa.to(tl.float16), pb.to(tl.float16), out_dtype=tl.float32)  # exact
        scale_a = tl.load(sa_ptr + rows * stride_sam + block * stride_sak, mask=row_ok, other=0.0)
        scale_b = tl.load(sb_ptr + block * stride_sbk + (cols // COLUMN_BLOCK) * stride_sbn, mask=col_ok, other=0.0)
        both = scale_a.to(tl.float64)[:, None] * scale_b.to(tl.float64)[None, :]  # exact: 8 bits
        term = block_sum.to(tl.float64) * both  # the block's exact partial sum (at most 20 bits)
        if q == 0:
            hi = term
        else:
            hi, err = _two_sum(hi, term)
            lo = lo + err
    hi, lo = _two_sum(hi, lo)
    return _round_fp64_to_fp32_exact(hi, lo)  # the one RNE rounding of the slice's exact sum


@triton.jit
def _probe_exact_kernel(
    pa_ptr,
    sa_ptr,
    pb_ptr,
    sb_ptr,
    a16_ptr,
    b16_ptr,
    shift_a_ptr,
    shift_b_ptr,
    alpha_ptr,
    c_ptr,
    taken_ptr,
    flagged_ptr,
    m,
    n,
    k,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_sam,
    stride_sak,
    stride_sbk,
    stride_sbn,
    grid,
    BLOCK: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
    RTZ: tl.constexpr,
    HARDWARE_RTZ: tl.constexpr,
    SNAP: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    EM: tl.constexpr,
    EN: tl.constexpr,
    INDEX64: tl.constexpr,
):
    """An EM x EN part of a flagged output tile (other programs return at once): each slice by the fast kernel's dot
    where the bounds cover it, by the exact block chain where they do not."""
    tile_m, tile_n = tl.program_id(0) // (BM // EM), tl.program_id(1) // (BN // EN)
    slices = k // WIDTH
    tile = tile_m * tl.cdiv(n, BN) + tile_n
    if tl.load(flagged_ptr + tile) != 0:
        rows = tl.program_id(0) * EM + tl.arange(0, EM)
        cols = tl.program_id(1) * EN + tl.arange(0, EN)
        acc = tl.zeros([EM, EN], dtype=tl.float32)
        for j in range(0, slices):
            if tl.load(taken_ptr + tile * slices + j) != 0:
                p = _exact_slice_sum(
                    pa_ptr,
                    sa_ptr,
                    pb_ptr,
                    sb_ptr,
                    rows,
                    cols,
                    m,
                    n,
                    j,
                    stride_am,
                    stride_ak,
                    stride_bk,
                    stride_bn,
                    stride_sam,
                    stride_sak,
                    stride_sbk,
                    stride_sbn,
                    BLOCK,
                    COLUMN_BLOCK,
                    WIDTH,
                    INDEX64,
                )
            else:
                p = fast_slice(a16_ptr, b16_ptr, shift_a_ptr, shift_b_ptr, rows, cols, m, n, k, j, WIDTH, INDEX64)
            acc = accumulate(acc, p, RTZ, HARDWARE_RTZ)
        store_output(c_ptr, acc, rows, cols, m, n, alpha_ptr, grid, SNAP, INDEX64)
