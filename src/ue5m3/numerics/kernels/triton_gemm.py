"""The probe-matched GEMM in Triton: the GPU twin of ``ue5m3_probe_gemm_payload`` (``csrc/accumulate.c``).

Two kernels, with no [slices, M, N] intermediate and no host read:

* ``_prepare_kernel`` (one memory-bound pass per operand) rewrites each K-slice of a row of A (column of B) as FP16
  values on a common exponent: a' = 2 * payload * scale * 2^(MB - F), F the largest block-scale exponent among the
  slice's nonzero values and MB the scale format's mantissa bits. Every a' is an integer of at most 8 bits times
  2^-d (d = F minus the value's own scale exponent), so it is exact in FP16 while d <= 24. Beside it go, per row
  (column) and slice, the shift F - MB - 1 that maps a' back to encoded units and two bounds: L1 = sum |a'| and
  M = max |a'|, each times 2^dmax.
* ``_probe_kernel``, per output tile and K-slice:

  - **fast path**: one FP16 tensor-core dot over the whole slice with FP32 accumulation. Its products are multiples
    of 2^-(dA + dB) and the bounds guarantee that every partial sum is below 2^23 of those quanta (L1_A * M_B or
    M_A * L1_B under 2^23, checked once per tile from the row and column maxima), so the accumulation is exact in
    any order and under any hardware alignment that keeps 24 bits below the largest term: the dot *is* the exact
    slice sum, which then needs no rounding. Two power-of-two multiplications (exact: shifts are kept within
    [-30, 50]) return it to encoded units.
  - **exact path**, for a tile-slice the bounds do not cover (block scales far apart inside a slice, huge or tiny
    scales): each block's payload dot on the tensor cores (exact: a block sum stays below 2^13 quarters), both
    block scales applied in FP64 (at most 20 significant bits) and the block terms summed by a TwoSum chain,
    exactly as ``exact.twosum_chain_to_fp32``, then rounded once to FP32 (RNE); 32 rows at a time, through the
    tile's own place in the output as scratch, so that its FP64 tiles fit in registers.
  - the slice sum joins the accumulator in K order with a round-toward-zero FP32 addition (the hardware's
    ``add.rz.f32`` on the GPU; TwoSum and a one-ulp step toward zero in the interpreter, the same IEEE result) or
    an RNE one.

  Then the 1/grid lattice snap (ties to even, the sign of zero kept as ``torch.round``) and alpha, in FP32.

Both paths give the CPU reference's bits; ``paths=`` returns which one each tile-slice took (tests, benchmarks).
Launched with FP fusion off. Runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (FP16 dots: the
interpreter computes BF16 dots wrongly), which is how ``tests/test_triton_gemm.py`` checks it bit for bit;
``tests/test_triton_compile.py`` compiles it for sm_90 and sm_100 (the inline ``add.rz.f32`` included).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import Launch, run
from ue5m3.numerics.kernels.launch import triton_device_reason as usable

__all__ = [
    "probe_gemm_payload",
    "probe_gemm_launches",
    "mma_sim_payload",
    "usable",
    "FAST_BOUND",
    "MAX_SHIFT",
    "MIN_SHIFT",
]

FAST_BOUND = 2.0**23  # partial sums below 2^23 quanta: exact in FP32 with a factor-2 margin for the bounds' roundings
MIN_SHIFT, MAX_SHIFT = -30, 50  # shifts back to encoded units: results stay FP32-normal and exact
MAX_DEPTH = 24  # 2^-24 is FP16's smallest quantum: a' with d <= 24 is exact in FP16


@triton.jit
def _pow2(k):
    """2^k for integer k in [-126, 127] as FP32, from its exponent bits (exact)."""
    return ((k + 127).to(tl.int32) << 23).to(tl.float32, bitcast=True)


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
def _add_rtz_hardware(a, b):
    """The same IEEE operation as one PTX instruction (GPU only: the interpreter runs no inline assembly)."""
    return tl.inline_asm_elementwise("add.rz.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)


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
def _prepare_kernel(
    payload_ptr,
    scale_ptr,
    out_ptr,
    shift_ptr,
    l1_ptr,
    max_ptr,
    n_vectors,
    stride_vector,
    stride_k,
    scale_stride_vector,
    scale_stride_k,
    scale_vector_block,
    stat_stride_vector,
    stat_stride_slice,
    BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
    MBITS: tl.constexpr,
    VECTORS: tl.constexpr,
    DEPTH_LIMIT: tl.constexpr,
    SHIFT_LOW: tl.constexpr,
    SHIFT_HIGH: tl.constexpr,
):
    """One K-slice of VECTORS rows of A (columns of B): the FP16 values a', the shift and the two bounds."""
    vectors = tl.program_id(0) * VECTORS + tl.arange(0, VECTORS)
    kk = tl.program_id(1) * WIDTH + tl.arange(0, WIDTH)
    ok = (vectors < n_vectors)[:, None]
    where = vectors[:, None].to(tl.int64) * stride_vector + kk[None, :].to(tl.int64) * stride_k
    payload = tl.load(payload_ptr + where, mask=ok, other=0.0)
    scale_at = (vectors // scale_vector_block)[:, None].to(tl.int64) * scale_stride_vector
    scale = tl.load(scale_ptr + scale_at + (kk // BLOCK)[None, :].to(tl.int64) * scale_stride_k, mask=ok, other=0.0)
    nonzero = (payload != 0.0) & (scale > 0.0)
    exponent = ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 s); <= -127 for tiny scales
    top = tl.max(tl.where(nonzero, exponent, -1000), axis=1)
    top = tl.where(top > -1000, top, 0)  # an all-zero slice: any exponent will do
    depth = tl.max(tl.where(nonzero, top[:, None] - exponent, 0), axis=1)
    factor = MBITS - top
    clamped = tl.minimum(tl.maximum(factor, -126), 127)
    # 2 * payload * scale * 2^(MB - F): an integer of at most 8 bits times 2^-d, exact in FP32 and, for d <= 24, FP16
    value = tl.where(nonzero, (payload * 2.0) * (scale * _pow2(clamped)[:, None]), 0.0)
    shift = top - MBITS - 1
    covered = (depth <= DEPTH_LIMIT) & (shift >= SHIFT_LOW) & (shift <= SHIFT_HIGH) & (factor == clamped)
    widen = _pow2(tl.minimum(depth, DEPTH_LIMIT))
    l1 = tl.where(covered, tl.sum(tl.abs(value), axis=1) * widen, float("inf"))
    largest = tl.where(covered, tl.max(tl.abs(value), axis=1) * widen, float("inf"))
    tl.store(out_ptr + where, value.to(tl.float16), mask=ok)
    stat = vectors.to(tl.int64) * stat_stride_vector + tl.program_id(1) * stat_stride_slice
    row_ok = vectors < n_vectors
    tl.store(shift_ptr + stat, shift, mask=row_ok)
    tl.store(l1_ptr + stat, l1, mask=row_ok)
    tl.store(max_ptr + stat, largest, mask=row_ok)


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
    k,
    s,
    scale_cols,
    BLOCK: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
):
    """The slice [s, s + WIDTH) of the outputs (rows, cols), each the RNE-to-FP32 of its exact sum: each block's
    payload dot on the tensor cores (exact: a block sum stays below 2^13 quarters), both block scales applied in
    FP64 (at most 20 significant bits) and the block terms summed by a TwoSum chain, exactly as
    ``exact.twosum_chain_to_fp32`` (exact while the terms span at most 106 bits, the CPU path's chain beyond)."""
    row_ok, col_ok = rows < m, cols < n
    sub = tl.arange(0, BLOCK)
    sa_cols = k // BLOCK
    hi = tl.zeros([rows.shape[0], cols.shape[0]], dtype=tl.float64)
    lo = tl.zeros([rows.shape[0], cols.shape[0]], dtype=tl.float64)
    for jj in range(s, s + WIDTH, BLOCK):
        kk = jj + sub
        pa = tl.load(pa_ptr + rows[:, None].to(tl.int64) * k + kk[None, :], mask=row_ok[:, None], other=0.0)
        pb = tl.load(pb_ptr + kk[:, None].to(tl.int64) * n + cols[None, :], mask=col_ok[None, :], other=0.0)
        block_sum = tl.dot(pa.to(tl.float16), pb.to(tl.float16), out_dtype=tl.float32)  # exact
        scale_a = tl.load(sa_ptr + rows.to(tl.int64) * sa_cols + jj // BLOCK, mask=row_ok, other=0.0)
        scale_b = tl.load(sb_ptr + (jj // BLOCK) * scale_cols + cols // COLUMN_BLOCK, mask=col_ok, other=0.0)
        both = scale_a.to(tl.float64)[:, None] * scale_b.to(tl.float64)[None, :]  # exact: 8 bits
        term = block_sum.to(tl.float64) * both  # the block's exact partial sum (at most 20 bits)
        if jj == s:
            hi = term
        else:
            hi, err = _two_sum(hi, term)
            lo = lo + err
    hi, lo = _two_sum(hi, lo)
    return _round_fp64_to_fp32_exact(hi, lo)  # the one RNE rounding of the slice's exact sum


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
    a16_ptr,
    b16_ptr,
    shift_a_ptr,
    l1_a_ptr,
    max_a_ptr,
    shift_b_ptr,
    l1_b_ptr,
    max_b_ptr,
    paths_ptr,
    grid,
    bound,
    BLOCK: tl.constexpr,
    COLUMN_BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
    RTZ: tl.constexpr,
    HARDWARE_RTZ: tl.constexpr,
    SNAP: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    SUB: tl.constexpr,
):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    row_ok, col_ok = rows < m, cols < n
    span = tl.arange(0, WIDTH)
    slices = k // WIDTH
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for s in range(0, k, WIDTH):
        j = s // WIDTH
        stat_a = rows.to(tl.int64) * slices + j
        stat_b = j * n + cols.to(tl.int64)
        # the tile's bounds: the largest row bound times the largest column bound covers every output
        l1_a = tl.max(tl.load(l1_a_ptr + stat_a, mask=row_ok, other=0.0))
        max_a = tl.max(tl.load(max_a_ptr + stat_a, mask=row_ok, other=0.0))
        l1_b = tl.max(tl.load(l1_b_ptr + stat_b, mask=col_ok, other=0.0))
        max_b = tl.max(tl.load(max_b_ptr + stat_b, mask=col_ok, other=0.0))
        fast = (l1_a * max_b < bound) | (max_a * l1_b < bound)  # NaN (inf * 0) takes the exact path
        if fast:
            kk = s + span
            a16 = tl.load(a16_ptr + rows[:, None].to(tl.int64) * k + kk[None, :], mask=row_ok[:, None], other=0.0)
            b16 = tl.load(b16_ptr + kk[:, None].to(tl.int64) * n + cols[None, :], mask=col_ok[None, :], other=0.0)
            exact = tl.dot(a16, b16, out_dtype=tl.float32)  # every partial sum exact (the bounds above)
            shift_a = tl.load(shift_a_ptr + stat_a, mask=row_ok, other=0)
            shift_b = tl.load(shift_b_ptr + stat_b, mask=col_ok, other=0)
            p = (exact * _pow2(shift_a)[:, None]) * _pow2(shift_b)[None, :]  # exact: powers of two, normal range
        else:
            # the exact path, SUB rows at a time (FP64 tiles of the whole output tile would not fit in registers):
            # each chunk's slice sums go to the tile's own place in the output as scratch, read back whole below
            for r0 in tl.static_range(0, BM, SUB):
                sub_rows = tl.program_id(0) * BM + r0 + tl.arange(0, SUB)
                p_sub = _exact_slice_sum(
                    pa_ptr, sa_ptr, pb_ptr, sb_ptr, sub_rows, cols, m, n, k, s, scale_cols, BLOCK, COLUMN_BLOCK, WIDTH
                )
                out_at = c_ptr + sub_rows[:, None].to(tl.int64) * n + cols[None, :]
                tl.store(out_at, p_sub, mask=(sub_rows < m)[:, None] & col_ok[None, :])
            tl.debug_barrier()  # every thread of the program sees the chunks the others stored
            out_at = c_ptr + rows[:, None].to(tl.int64) * n + cols[None, :]
            p = tl.load(out_at, mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        tile = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)).to(tl.int64) * slices + j
        tl.store(paths_ptr + tile, (1 - fast.to(tl.int32)).to(tl.uint8))
        if RTZ:
            if HARDWARE_RTZ:
                acc = _add_rtz_hardware(acc, p)
            else:
                acc = _add_rtz(acc, p)
        else:
            acc = acc + p
    if SNAP:  # torch.round(acc * grid) / grid: half to even (floor form, exact for every FP32), zero keeps y's sign
        y = acc * grid
        lower = tl.floor(y)
        delta = y - lower
        odd = (lower - 2.0 * tl.floor(lower * 0.5)) == 1.0
        up = (delta > 0.5) | ((delta == 0.5) & odd)
        r = lower + up.to(tl.float32)
        r = tl.where(r == 0.0, y * 0.0, r)  # -0.3 rounds to -0.0 as torch.round does
        acc = tl.math.div_rn(r, tl.full([BM, BN], grid, tl.float32))  # exact: a power of 2
    out = acc * tl.load(alpha_ptr)
    tl.store(c_ptr + rows[:, None].to(tl.int64) * n + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


TILE = 32  # output rows and columns per program of the mma_sim kernel
PROBE_TILE = 64  # output rows and columns per program of the probe_matched kernel in the interpreter
PROBE_TILE_GPU = 128  # on a GPU (untuned: no GPU has run it yet; the GPU check times it)
PREPARE_VECTORS = 32  # rows (columns) per program of the preparation pass


def _allocate(
    payload_a, scales_a, payload_b, scales_b, block: int, width: int, alpha, tile: int = TILE
) -> tuple[tuple, tuple, torch.Tensor]:
    """The checks and the leading kernel arguments both GEMM kernels share: (pa, sa, pb, sb, alpha, out, m, n, k,
    B's scale columns) with the FP32 copies and the output allocated, the launch grid and the output."""
    reason = usable(payload_a.device)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run here: {reason}")
    pa, sa, pb, sb = (t.to(torch.float32).contiguous() for t in (payload_a, scales_a, payload_b, scales_b))
    (m, k), n = pa.shape, pb.shape[1]
    if pb.shape[0] != k or block % 16 or k % width:
        raise ValueError(f"the Triton GEMMs need A [M, K], B [K, N], blocks of 16s and K a multiple of {width}")
    alpha = torch.as_tensor(alpha, dtype=torch.float32).reshape(1).to(pa.device)  # stays on the device
    out = torch.empty(m, n, dtype=torch.float32, device=pa.device)
    grid = (triton.cdiv(m, tile), triton.cdiv(n, tile))
    return (pa, sa, pb, sb, alpha, out, m, n, k, sb.shape[1]), grid, out


def _prepare(
    payload: torch.Tensor, scales: torch.Tensor, *, operand: str, block: int, column_block: int, width: int, mbits: int
) -> tuple[tuple[torch.Tensor, ...], Launch]:
    """The preparation pass of one operand, allocated: (FP16 values shaped like the payload, shifts int32, L1
    bounds, max bounds), the last three [rows, slices] for A and [slices, columns] for B, and its launch."""
    rows, cols = payload.shape
    device = payload.device
    values = torch.empty(rows, cols, dtype=torch.float16, device=device)
    if operand == "A":  # vectors are rows, K runs along columns
        n_vectors, k = rows, cols
        strides = (cols, 1, scales.shape[1], 1, 1)
        stat_shape, stat_strides = (rows, k // width), (k // width, 1)
    else:  # vectors are columns, K runs along rows; 2D tiles share a scale between column_block columns
        n_vectors, k = cols, rows
        strides = (1, cols, 1, scales.shape[1], column_block)
        stat_shape, stat_strides = (k // width, cols), (1, cols)
    shift = torch.empty(stat_shape, dtype=torch.int32, device=device)
    l1 = torch.empty(stat_shape, dtype=torch.float32, device=device)
    largest = torch.empty(stat_shape, dtype=torch.float32, device=device)
    launch = Launch(
        _prepare_kernel,
        (triton.cdiv(n_vectors, PREPARE_VECTORS), k // width),
        (payload, scales, values, shift, l1, largest, n_vectors, *strides, *stat_strides),
        dict(
            BLOCK=block,
            WIDTH=width,
            MBITS=mbits,
            VECTORS=PREPARE_VECTORS,
            DEPTH_LIMIT=MAX_DEPTH,
            SHIFT_LOW=MIN_SHIFT,
            SHIFT_HIGH=MAX_SHIFT,
            enable_fp_fusion=False,
        ),
    )
    return (values, shift, l1, largest), launch


def probe_gemm_launches(
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
    scale_mantissa_bits: tuple[int, int] = (3, 3),
    tile: int | None = None,
    fast_bound: float = FAST_BOUND,
) -> tuple[list[Launch], torch.Tensor, torch.Tensor]:
    """Everything :func:`probe_gemm_payload` allocates, and its launches in order: (launches, output, taken).

    ``scale_mantissa_bits`` are the two scale formats' (the fast path takes at most 6 each: 2 * 6 * (2^7 - 1) is
    exact in FP16; wider scale formats take the exact path everywhere). ``tile`` (output rows and columns per
    program; 128 on a GPU, 64 in the interpreter) and ``fast_bound`` (for tests: the bound on partial sums in quanta
    below which the fast path runs) change the speed, never the bits."""
    if width % 16 or width % block:
        raise ValueError(f"probe_gemm_payload needs a slice width of 16s holding whole blocks, got {width}")
    device = payload_a.device
    tile = tile or (PROBE_TILE if device.type == "cpu" else PROBE_TILE_GPU)
    args, launch_grid, out = _allocate(payload_a, scales_a, payload_b, scales_b, block, width, alpha, tile)
    pa, sa, pb, sb = args[:4]
    k = pa.shape[1]
    prepared_a, prepare_a = _prepare(
        pa, sa, operand="A", block=block, column_block=1, width=width, mbits=scale_mantissa_bits[0]
    )
    prepared_b, prepare_b = _prepare(
        pb, sb, operand="B", block=block, column_block=column_block, width=width, mbits=scale_mantissa_bits[1]
    )
    taken = torch.empty(*launch_grid, max(k // width, 1), dtype=torch.uint8, device=device)
    probe = Launch(
        _probe_kernel,
        launch_grid,
        (
            *args,
            prepared_a[0],
            prepared_b[0],
            *prepared_a[1:],
            *prepared_b[1:],
            taken,
            float(grid or 1),
            fast_bound if all(0 <= b <= 6 for b in scale_mantissa_bits) else 0.0,
        ),
        dict(
            BLOCK=block,
            COLUMN_BLOCK=column_block,
            WIDTH=width,
            RTZ=bool(rtz),
            HARDWARE_RTZ=device.type == "cuda",
            SNAP=grid is not None,
            BM=tile,
            BN=tile,
            SUB=min(tile, 32),
            num_warps=8 if tile >= 128 else 4,
            enable_fp_fusion=False,
        ),
    )
    return [prepare_a, prepare_b, probe], out, taken


def probe_gemm_payload(
    payload_a: torch.Tensor,
    scales_a: torch.Tensor,
    payload_b: torch.Tensor,
    scales_b: torch.Tensor,
    *,
    paths: bool = False,
    **settings,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The probe_matched GEMM from payloads and block scales, like the CPU ``probe_gemm_payload``, but complete by
    itself: a tile-slice either takes the exact tensor-core fast path or forms its slice sum by the TwoSum chain, so
    no span check and no recomputation are needed, and nothing is read back to the host (``alpha`` may be a device
    tensor). ``settings`` are :func:`probe_gemm_launches`'s. With ``paths=True`` also returns which path each
    tile-slice took: uint8 [row tiles, column tiles, slices], 1 where it took the exact path. On ``meta`` tensors
    (inside :func:`~ue5m3.numerics.kernels.launch.planning`) it allocates and launches nothing."""
    launches, out, taken = probe_gemm_launches(payload_a, scales_a, payload_b, scales_b, **settings)
    run(launches, out.device)
    return (out, taken) if paths else out


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
