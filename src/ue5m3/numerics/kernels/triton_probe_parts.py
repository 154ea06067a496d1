"""The building blocks both probe_matched GEMM kernels share (the fast kernel of
:mod:`ue5m3.numerics.kernels.triton_gemm`, the exact one of :mod:`ue5m3.numerics.kernels.triton_probe_exact`): 32- or
64-bit offsets, the round-toward-zero FP32 addition (in software, or the hardware's ``add.rz.f32`` on NVIDIA CUDA),
the accumulation in K order, the 1/grid snap and store, a fast slice from the prepared FP16 operands, and the grouped
tile order.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import check_triton_version

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = ["pow2", "offsets", "add_rtz", "add_rtz_hardware", "accumulate", "store_output", "fast_slice", "tile_of"]


@triton.jit
def pow2(k):
    """2^k for integer k in [-126, 127] as FP32, from its exponent bits (exact)."""
    return ((k + 127).to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def offsets(r, c, stride_r, stride_c, INDEX64: tl.constexpr):
    """Offsets of the [len(r), len(c)] block at rows r, columns c: 32-bit unless INDEX64 (the launch checks that
    every offset a 32-bit kernel forms fits)."""
    if INDEX64:
        return r[:, None].to(tl.int64) * stride_r + c[None, :].to(tl.int64) * stride_c
    else:
        return r[:, None] * stride_r + c[None, :] * stride_c


@triton.jit
def add_rtz(a, b):
    """FP32 a + b rounded toward zero: the RNE sum, stepped one ulp toward zero where its exact error says it
    overshot (the error's sign differs from the sum's)."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    opposite = (err.to(tl.int32, bitcast=True) ^ s.to(tl.int32, bitcast=True)) < 0
    stepped = (s.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True)
    return tl.where((err != 0.0) & opposite, stepped, s)


@triton.jit
def add_rtz_hardware(a, b):
    """The same IEEE operation as one PTX instruction (NVIDIA only: the interpreter runs no inline assembly)."""
    return tl.inline_asm_elementwise("add.rz.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def accumulate(acc, p, RTZ: tl.constexpr, HARDWARE_RTZ: tl.constexpr):
    """acc + p in FP32, rounded toward zero (RTZ) or to nearest."""
    if RTZ:
        if HARDWARE_RTZ:
            out = add_rtz_hardware(acc, p)
        else:
            out = add_rtz(acc, p)
    else:
        out = acc + p
    return out


@triton.jit
def store_output(c_ptr, acc, rows, cols, m, n, alpha_ptr, grid, SNAP: tl.constexpr, INDEX64: tl.constexpr):
    """The 1/grid snap of the encoded accumulator (torch.round(acc * grid) / grid: half to even in the floor form,
    exact for every FP32; zero keeps y's sign), times alpha, stored at (rows, cols) of C [m, n]."""
    if SNAP:
        y = acc * grid
        lower = tl.floor(y)
        delta = y - lower
        odd = (lower - 2.0 * tl.floor(lower * 0.5)) == 1.0
        up = (delta > 0.5) | ((delta == 0.5) & odd)
        r = lower + up.to(tl.float32)
        r = tl.where(r == 0.0, y * 0.0, r)  # -0.3 rounds to -0.0 as torch.round does
        acc = tl.math.div_rn(r, tl.full(acc.shape, grid, tl.float32))  # exact: a power of 2
    out = acc * tl.load(alpha_ptr)
    tl.store(c_ptr + offsets(rows, cols, n, 1, INDEX64), out, mask=(rows < m)[:, None] & (cols < n)[None, :])


@triton.jit
def fast_slice(
    a16_ptr, b16_ptr, shift_a_ptr, shift_b_ptr, rows, cols, m, n, k, j, WIDTH: tl.constexpr, INDEX64: tl.constexpr
):
    """Slice j's exact sums at (rows, cols) from the prepared operands: one FP16 tensor-core dot (exact by the
    bounds), returned to encoded units by two power-of-two multiplications."""
    kk = j * WIDTH + tl.arange(0, WIDTH)
    row_ok, col_ok = rows < m, cols < n
    a16 = tl.load(a16_ptr + offsets(rows, kk, k, 1, INDEX64), mask=row_ok[:, None], other=0.0)
    b16 = tl.load(b16_ptr + offsets(kk, cols, n, 1, INDEX64), mask=col_ok[None, :], other=0.0)
    exact = tl.dot(a16, b16, out_dtype=tl.float32)  # every partial sum exact (the bounds)
    shift_a = tl.load(shift_a_ptr + rows * (k // WIDTH) + j, mask=row_ok, other=0)
    shift_b = tl.load(shift_b_ptr + j * n + cols, mask=col_ok, other=0)
    return (exact * pow2(shift_a)[:, None]) * pow2(shift_b)[None, :]  # exact: powers of two, normal range


@triton.jit
def tile_of(pid, m, n, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid`` in grouped order: GROUP_M row tiles sweep the column tiles
    together, so each column tile of B is read from L2 by the group."""
    tiles_m, tiles_n = tl.cdiv(m, BM), tl.cdiv(n, BN)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m
