"""The probe-matched GEMM in Triton: the GPU twin of ``ue5m3_probe_gemm_payload`` (``csrc/accumulate.c``).

Three kernels, with no [slices, M, N] intermediate and no host read:

* ``_prepare_kernel`` (one memory-bound pass per operand) rewrites each K-slice of a row of A (column of B) as FP16
  values on a common exponent: a' = 2 * payload * scale * 2^(MB - F), F the largest block-scale exponent among the
  slice's nonzero values and MB the scale format's mantissa bits. Every a' is an integer of at most 8 bits times
  2^-d (d = F minus the value's own scale exponent), so it is exact in FP16 while d <= 24. Beside it go, per row
  (column) and slice, the shift F - MB - 1 that maps a' back to encoded units, and per output tile of rows
  (columns) and slice two bounds: the largest L1 = sum |a'| and the largest M = max |a'| of the tile's rows, each
  times 2^dmax.
* ``_probe_fast_kernel``, per output tile: first the tile's path per K-slice from the bounds (4 scalars a slice):
  the fast path where L1_A * M_B or M_A * L1_B is below 2^23, the exact path elsewhere. A tile whose every slice is
  fast is computed here, one FP16 tensor-core dot per slice with FP32 accumulation: its products are multiples of
  2^-(dA + dB) and every partial sum is below 2^23 of those quanta, so the accumulation is exact in any order and
  under any hardware alignment that keeps 24 bits below the largest term: the dot *is* the exact slice sum, which
  then needs no rounding. Two power-of-two multiplications (exact: shifts are kept within [-30, 50]) return it to
  encoded units. The kernel holds no FP64 value and nothing of the exact path, so its registers are the fast path's
  alone (``tests/test_triton_compile.py`` checks: no spills, no FP64, tensor-core MMAs). A tile with an exact
  slice is flagged and left to the next kernel.
* ``_probe_exact_kernel``, over the flagged tiles only (in sub-tiles small enough for its FP64 state to stay in
  registers; every other program returns at once): each slice the bounds cover by the same dot, each other slice
  by each block's payload dot on the tensor cores (exact: a block sum stays below 2^13 quarters), both block scales
  applied in FP64 (at most 20 significant bits) and the block terms summed by a TwoSum chain, exactly as
  ``exact.twosum_chain_to_fp32``, then rounded once to FP32 (RNE).

In both, the slice sum joins the accumulator in K order with a round-toward-zero FP32 addition (the hardware's
``add.rz.f32`` on NVIDIA GPUs; TwoSum and a one-ulp step toward zero elsewhere, the same IEEE result) or an RNE one,
then the 1/grid lattice snap (ties to even, the sign of zero kept as ``torch.round``) and alpha, in FP32.

Every path gives the CPU reference's bits; ``paths=`` returns which one each tile-slice took (tests, benchmarks).
Offsets are 32-bit wherever every tensor's padded extent allows it (checked at launch), 64-bit otherwise. Tile sizes
and warps per architecture are :data:`PROBE_TILES`, chosen from what ptxas reports (docs/performance.md). Launched
with FP fusion off. Runs on CUDA tensors, on CPU tensors under ``TRITON_INTERPRET=1`` (FP16 dots: the interpreter
computes BF16 dots wrongly), which is how ``tests/test_triton_gemm.py`` checks it bit for bit, and on ``meta``
tensors inside planning (allocations only); ``tests/test_triton_compile.py`` compiles it for sm_90 and sm_100.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import Launch, check_triton_version, hardware_rtz, run
from ue5m3.numerics.kernels.launch import triton_device_reason as usable

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = [
    "probe_gemm_payload",
    "probe_gemm_launches",
    "prepare_operand",
    "Prepared",
    "ProbeTiles",
    "PROBE_TILES",
    "probe_tiles",
    "mma_sim_payload",
    "usable",
    "FAST_BOUND",
    "MAX_SHIFT",
    "MIN_SHIFT",
]

FAST_BOUND = 2.0**23  # partial sums below 2^23 quanta: exact in FP32 with a factor-2 margin for the bounds' roundings
MIN_SHIFT, MAX_SHIFT = -30, 50  # shifts back to encoded units: results stay FP32-normal and exact
MAX_DEPTH = 24  # 2^-24 is FP16's smallest quantum: a' with d <= 24 is exact in FP16
INT32_LIMIT = 2**31 - 1
PREPARE_CHUNK = 32  # vectors the preparation pass holds at once (its registers)


@dataclass(frozen=True)
class ProbeTiles:
    """Tile sizes and warps of the probe_matched kernels on one architecture (they change the speed, never the
    bits)."""

    block_m: int  # output rows per program of the fast kernel, and rows of A per program of its preparation
    block_n: int  # output columns per program of the fast kernel, and columns of B per program of its preparation
    warps: int  # of the fast kernel
    stages: int  # software-pipelining stages of the fast kernel's K loop
    group_m: int  # row tiles per group of the fast kernel's launch order (B's columns stay in L2 across a group)
    exact_m: int  # output rows per program of the exact kernel (divides block_m)
    exact_n: int  # output columns per program of the exact kernel (divides block_n)
    exact_warps: int
    prepare_warps: int


# Per compute capability (major * 10 + minor) of NVIDIA GPUs, chosen from the compiler's report (registers, stack,
# shared memory: docs/performance.md, "Kernels as compiled"); the interpreter's, small for speed.
PROBE_TILES = {
    90: ProbeTiles(128, 64, 8, 3, 8, 32, 64, 4, 4),
    100: ProbeTiles(128, 64, 8, 3, 8, 32, 64, 4, 4),
}
INTERPRETER_TILES = ProbeTiles(64, 64, 4, 1, 1, 32, 64, 4, 4)


def probe_tiles(device: torch.device) -> ProbeTiles:
    """The tiles for ``device``: its architecture's on CUDA (Hopper's below Blackwell, Blackwell's from it), the
    interpreter's on the CPU, Hopper's on ``meta`` (a plan: the tiles change only the tiny ``taken`` flags)."""
    if device.type == "cpu":
        return INTERPRETER_TILES
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return PROBE_TILES[100 if major * 10 + minor >= 100 else 90]
    return PROBE_TILES[90]


@triton.jit
def _pow2(k):
    """2^k for integer k in [-126, 127] as FP32, from its exponent bits (exact)."""
    return ((k + 127).to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _offsets(r, c, stride_r, stride_c, INDEX64: tl.constexpr):
    """Offsets of the [len(r), len(c)] block at rows r, columns c: 32-bit unless INDEX64 (the launch checks that
    every offset a 32-bit kernel forms fits)."""
    if INDEX64:
        return r[:, None].to(tl.int64) * stride_r + c[None, :].to(tl.int64) * stride_c
    else:
        return r[:, None] * stride_r + c[None, :] * stride_c


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
    """The same IEEE operation as one PTX instruction (NVIDIA only: the interpreter runs no inline assembly)."""
    return tl.inline_asm_elementwise("add.rz.f32 $0, $1, $2;", "=f,f,f", [a, b], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def _accumulate(acc, p, RTZ: tl.constexpr, HARDWARE_RTZ: tl.constexpr):
    """acc + p in FP32, rounded toward zero (RTZ) or to nearest."""
    if RTZ:
        if HARDWARE_RTZ:
            out = _add_rtz_hardware(acc, p)
        else:
            out = _add_rtz(acc, p)
    else:
        out = acc + p
    return out


@triton.jit
def _store_output(c_ptr, acc, rows, cols, m, n, alpha_ptr, grid, SNAP: tl.constexpr, INDEX64: tl.constexpr):
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
    tl.store(c_ptr + _offsets(rows, cols, n, 1, INDEX64), out, mask=(rows < m)[:, None] & (cols < n)[None, :])


@triton.jit
def _fast_slice(
    a16_ptr, b16_ptr, shift_a_ptr, shift_b_ptr, rows, cols, m, n, k, j, WIDTH: tl.constexpr, INDEX64: tl.constexpr
):
    """Slice j's exact sums at (rows, cols) from the prepared operands: one FP16 tensor-core dot (exact by the
    bounds), returned to encoded units by two power-of-two multiplications."""
    kk = j * WIDTH + tl.arange(0, WIDTH)
    row_ok, col_ok = rows < m, cols < n
    a16 = tl.load(a16_ptr + _offsets(rows, kk, k, 1, INDEX64), mask=row_ok[:, None], other=0.0)
    b16 = tl.load(b16_ptr + _offsets(kk, cols, n, 1, INDEX64), mask=col_ok[None, :], other=0.0)
    exact = tl.dot(a16, b16, out_dtype=tl.float32)  # every partial sum exact (the bounds)
    shift_a = tl.load(shift_a_ptr + rows * (k // WIDTH) + j, mask=row_ok, other=0)
    shift_b = tl.load(shift_b_ptr + j * n + cols, mask=col_ok, other=0)
    return (exact * _pow2(shift_a)[:, None]) * _pow2(shift_b)[None, :]  # exact: powers of two, normal range


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
    out_stride_vector,
    out_stride_k,
    stat_stride_vector,
    stat_stride_slice,
    tile_stride_tile,
    tile_stride_slice,
    BLOCK: tl.constexpr,
    WIDTH: tl.constexpr,
    MBITS: tl.constexpr,
    VECTORS: tl.constexpr,
    CHUNK: tl.constexpr,
    DEPTH_LIMIT: tl.constexpr,
    SHIFT_LOW: tl.constexpr,
    SHIFT_HIGH: tl.constexpr,
    INDEX64: tl.constexpr,
):
    """One K-slice of VECTORS rows of A (columns of B), one output tile's worth, CHUNK vectors at a time: the FP16
    values a', each vector's shift and the tile's two bounds (its largest row bounds: with the other operand's
    largest column bounds they cover every output of the tile; vectors past the end hold zeros, bounds 0)."""
    tile, j = tl.program_id(0), tl.program_id(1)
    kk = j * WIDTH + tl.arange(0, WIDTH)
    tile_l1 = 0.0
    tile_max = 0.0
    for c in tl.static_range(VECTORS // CHUNK):
        vectors = tile * VECTORS + c * CHUNK + tl.arange(0, CHUNK)
        row_ok = vectors < n_vectors
        ok = row_ok[:, None]
        payload = tl.load(payload_ptr + _offsets(vectors, kk, stride_vector, stride_k, INDEX64), mask=ok, other=0.0)
        scale_at = _offsets(vectors // scale_vector_block, kk // BLOCK, scale_stride_vector, scale_stride_k, INDEX64)
        scale = tl.load(scale_ptr + scale_at, mask=ok, other=0.0)
        nonzero = (payload != 0.0) & (scale > 0.0)
        exponent = ((scale.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127  # floor(log2 s); <= -127 for tiny scales
        top = tl.max(tl.where(nonzero, exponent, -1000), axis=1)
        top = tl.where(top > -1000, top, 0)  # an all-zero slice: any exponent will do
        depth = tl.max(tl.where(nonzero, top[:, None] - exponent, 0), axis=1)
        factor = MBITS - top
        clamped = tl.minimum(tl.maximum(factor, -126), 127)
        # 2 * payload * scale * 2^(MB - F): an integer of at most 8 bits times 2^-d, exact in FP32 and, for d <= 24,
        # in FP16
        value = tl.where(nonzero, (payload * 2.0) * (scale * _pow2(clamped)[:, None]), 0.0)
        shift = top - MBITS - 1
        covered = (depth <= DEPTH_LIMIT) & (shift >= SHIFT_LOW) & (shift <= SHIFT_HIGH) & (factor == clamped)
        widen = _pow2(tl.minimum(depth, DEPTH_LIMIT))
        l1 = tl.where(covered, tl.sum(tl.abs(value), axis=1) * widen, float("inf"))
        largest = tl.where(covered, tl.max(tl.abs(value), axis=1) * widen, float("inf"))
        out_at = _offsets(vectors, kk, out_stride_vector, out_stride_k, INDEX64)
        tl.store(out_ptr + out_at, value.to(tl.float16), mask=ok)
        tl.store(shift_ptr + vectors * stat_stride_vector + j * stat_stride_slice, shift, mask=row_ok)
        tile_l1 = tl.maximum(tile_l1, tl.max(tl.where(row_ok, l1, 0.0)))
        tile_max = tl.maximum(tile_max, tl.max(tl.where(row_ok, largest, 0.0)))
    at = tile * tile_stride_tile + j * tile_stride_slice
    tl.store(l1_ptr + at, tile_l1)
    tl.store(max_ptr + at, tile_max)


@triton.jit
def _tile_of(pid, m, n, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program ``pid`` in grouped order: GROUP_M row tiles sweep the column tiles
    together, so each column tile of B is read from L2 by the group."""
    tiles_m, tiles_n = tl.cdiv(m, BM), tl.cdiv(n, BN)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m


@triton.jit
def _probe_fast_kernel(
    a16_ptr,
    b16_ptr,
    shift_a_ptr,
    shift_b_ptr,
    l1_a_ptr,
    max_a_ptr,
    l1_b_ptr,
    max_b_ptr,
    alpha_ptr,
    c_ptr,
    taken_ptr,
    flagged_ptr,
    m,
    n,
    k,
    grid,
    bound,
    WIDTH: tl.constexpr,
    RTZ: tl.constexpr,
    HARDWARE_RTZ: tl.constexpr,
    SNAP: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    GROUP_M: tl.constexpr,
    INDEX64: tl.constexpr,
):
    """One output tile: its path per slice (``taken``, 1 = exact; ``flagged`` if any slice is exact), and, when every
    slice is fast, the tile itself."""
    tile_m, tile_n = _tile_of(tl.program_id(0), m, n, BM, BN, GROUP_M)
    tiles_n = tl.cdiv(n, BN)
    slices = k // WIDTH
    tile = tile_m * tiles_n + tile_n
    exact_slices = 0
    for j in range(0, slices):
        l1_a = tl.load(l1_a_ptr + tile_m * slices + j)
        max_a = tl.load(max_a_ptr + tile_m * slices + j)
        l1_b = tl.load(l1_b_ptr + j * tiles_n + tile_n)
        max_b = tl.load(max_b_ptr + j * tiles_n + tile_n)
        exact = ~((l1_a * max_b < bound) | (max_a * l1_b < bound))  # NaN (inf * 0) takes the exact path
        tl.store(taken_ptr + tile * slices + j, exact.to(tl.uint8))
        exact_slices += exact.to(tl.int32)
    tl.store(flagged_ptr + tile, (exact_slices > 0).to(tl.uint8))
    if exact_slices == 0:
        rows = tile_m * BM + tl.arange(0, BM)
        cols = tile_n * BN + tl.arange(0, BN)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for j in range(0, slices):
            p = _fast_slice(a16_ptr, b16_ptr, shift_a_ptr, shift_b_ptr, rows, cols, m, n, k, j, WIDTH, INDEX64)
            acc = _accumulate(acc, p, RTZ, HARDWARE_RTZ)
        _store_output(c_ptr, acc, rows, cols, m, n, alpha_ptr, grid, SNAP, INDEX64)


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
        pa = tl.load(pa_ptr + _offsets(rows, kk, stride_am, stride_ak, INDEX64), mask=row_ok[:, None], other=0.0)
        pb = tl.load(pb_ptr + _offsets(kk, cols, stride_bk, stride_bn, INDEX64), mask=col_ok[None, :], other=0.0)
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
                p = _fast_slice(a16_ptr, b16_ptr, shift_a_ptr, shift_b_ptr, rows, cols, m, n, k, j, WIDTH, INDEX64)
            acc = _accumulate(acc, p, RTZ, HARDWARE_RTZ)
        _store_output(c_ptr, acc, rows, cols, m, n, alpha_ptr, grid, SNAP, INDEX64)


def _needs_int64(*extents: tuple[tuple[int, ...], tuple[int, ...]]) -> bool:
    """Whether an offset into any of these (padded shape, strides) tensors could pass 2^31 - 1."""
    return any(
        sum((size - 1) * abs(stride) for size, stride in zip(shape, strides, strict=True)) > INT32_LIMIT
        for shape, strides in extents
    )


@dataclass(frozen=True)
class Prepared:
    """One operand of the probe_matched GEMM as its kernels read it (:func:`prepare_operand`): the FP16 values a' on
    their slices' common exponents ([rows, K] for A, [K, columns] for B, row-major), each vector's shift per slice
    (int32 [rows, slices] / [slices, columns]) and each tile's two bounds per slice (FP32 [row tiles, slices] /
    [slices, column tiles]) for tiles of ``tile`` vectors. A weight's is the same for every microbatch of a step."""

    values: torch.Tensor
    shift: torch.Tensor
    l1: torch.Tensor
    largest: torch.Tensor
    settings: tuple  # (operand, block, column_block, width, mbits, tile): what the GEMM must use it with

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.values, self.shift, self.l1, self.largest

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def prepare_operand(
    payload: torch.Tensor,
    scales: torch.Tensor,
    *,
    operand: str,
    block: int,
    column_block: int,
    width: int,
    mbits: int,
    tiles: ProbeTiles | None = None,
) -> tuple[Prepared, Launch]:
    """The preparation pass of one operand (A [rows, K] blocked along K, or B [K, columns] with scales shared by
    ``column_block`` columns for 2D tiles), allocated, and its launch (run it with
    :func:`~ue5m3.numerics.kernels.launch.run`). ``payload`` and ``scales`` are read in place, any strides."""
    tiles = tiles or probe_tiles(payload.device)
    rows, cols = payload.shape
    device = payload.device
    values = torch.empty(rows, cols, dtype=torch.float16, device=device)
    if operand == "A":  # vectors are rows, K runs along columns
        n_vectors, k, vectors = rows, cols, tiles.block_m
        tile_count = triton.cdiv(rows, vectors)
        strides = (*payload.stride(), *scales.stride(), 1, cols, 1)
        stat_shape, stat_strides = (rows, k // width), (k // width, 1)
        tile_shape, tile_strides = (tile_count, k // width), (k // width, 1)
    else:  # vectors are columns, K runs along rows; 2D tiles share a scale between column_block columns
        n_vectors, k, vectors = cols, rows, tiles.block_n
        tile_count = triton.cdiv(cols, vectors)
        strides = (*reversed(payload.stride()), *reversed(scales.stride()), column_block, 1, cols)
        stat_shape, stat_strides = (k // width, cols), (1, cols)
        tile_shape, tile_strides = (k // width, tile_count), (1, tile_count)
    shift = torch.empty(stat_shape, dtype=torch.int32, device=device)
    l1 = torch.empty(tile_shape, dtype=torch.float32, device=device)
    largest = torch.empty(tile_shape, dtype=torch.float32, device=device)
    padded = (tile_count * vectors, k)
    index64 = _needs_int64(
        (padded, strides[0:2]), (padded, strides[5:7]), ((tile_count * vectors // column_block, k), strides[2:4])
    )
    launch = Launch(
        _prepare_kernel,
        (tile_count, k // width),
        (payload, scales, values, shift, l1, largest, n_vectors, *strides, *stat_strides, *tile_strides),
        dict(
            BLOCK=block,
            WIDTH=width,
            MBITS=mbits,
            VECTORS=vectors,
            CHUNK=min(vectors, PREPARE_CHUNK),
            DEPTH_LIMIT=MAX_DEPTH,
            SHIFT_LOW=MIN_SHIFT,
            SHIFT_HIGH=MAX_SHIFT,
            INDEX64=index64,
            num_warps=tiles.prepare_warps,
            enable_fp_fusion=False,
        ),
    )
    return Prepared(values, shift, l1, largest, (operand, block, column_block, width, mbits, vectors)), launch


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
    tiles: ProbeTiles | None = None,
    fast_bound: float = FAST_BOUND,
    prepared_b: Prepared | None = None,
) -> tuple[list[Launch], torch.Tensor, torch.Tensor]:
    """Everything :func:`probe_gemm_payload` allocates, and its launches in order: (launches, output, taken).

    ``scale_mantissa_bits`` are the two scale formats' (the fast path takes at most 6 each: 2 * 6 * (2^7 - 1) is
    exact in FP16; wider scale formats take the exact path everywhere). ``tiles`` (every kernel's tiles;
    :func:`probe_tiles` by default), ``tile`` (for tests: output rows and columns per program of the fast kernel)
    and ``fast_bound`` (for tests: the bound on partial sums in quanta below which the fast path runs) change the
    speed, never the bits. ``prepared_b``: B already prepared (:func:`prepare_operand`, the same settings and
    tiles), e.g. a weight's for the whole step."""
    if width % 16 or width % block:
        raise ValueError(f"probe_gemm_payload needs a slice width of 16s holding whole blocks, got {width}")
    device = payload_a.device
    reason = usable(device)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run here: {reason}")
    tiles = tiles or probe_tiles(device)
    if tile is not None:
        tiles = dataclasses.replace(tiles, block_m=tile, block_n=tile, exact_m=min(tile, 32), exact_n=min(tile, 64))
    pa, sa, pb, sb = (t.to(torch.float32) for t in (payload_a, scales_a, payload_b, scales_b))  # read in place
    (m, k), n = pa.shape, pb.shape[1]
    if pb.shape[0] != k or block % 16 or k % width:
        raise ValueError(f"the Triton GEMMs need A [M, K], B [K, N], blocks of 16s and K a multiple of {width}")
    alpha = torch.as_tensor(alpha, dtype=torch.float32).reshape(1).to(device)  # stays on the device
    out = torch.empty(m, n, dtype=torch.float32, device=device)
    settings = dict(block=block, width=width, tiles=tiles)
    prepared_a, prepare_a = prepare_operand(
        pa, sa, operand="A", column_block=1, mbits=scale_mantissa_bits[0], **settings
    )
    launches = [prepare_a]
    if prepared_b is None:
        prepared_b, prepare_b = prepare_operand(
            pb, sb, operand="B", column_block=column_block, mbits=scale_mantissa_bits[1], **settings
        )
        launches.append(prepare_b)
    else:
        expected = ("B", block, column_block, width, scale_mantissa_bits[1], tiles.block_n)
        if prepared_b.settings != expected or tuple(prepared_b.values.shape) != (k, n):
            raise ValueError(
                f"prepared_b was prepared with {prepared_b.settings} for shape {tuple(prepared_b.values.shape)}; "
                f"this GEMM needs {expected} and {(k, n)}"
            )
    tiles_m, tiles_n, slices = triton.cdiv(m, tiles.block_m), triton.cdiv(n, tiles.block_n), k // width
    taken = torch.empty(tiles_m, tiles_n, max(slices, 1), dtype=torch.uint8, device=device)
    flagged = torch.empty(tiles_m, tiles_n, dtype=torch.uint8, device=device)
    padded_m, padded_n = tiles_m * tiles.block_m, tiles_n * tiles.block_n
    index64 = _needs_int64(
        ((padded_m, k), pa.stride()),
        ((k, padded_n), pb.stride()),
        ((padded_m, k), (k, 1)),
        ((k, padded_n), (n, 1)),
        ((padded_m, padded_n), (n, 1)),
        ((padded_m, k // block), sa.stride()),
        ((k // block, padded_n // column_block + 1), sb.stride()),
    )
    flags = dict(RTZ=bool(rtz), HARDWARE_RTZ=hardware_rtz(device), SNAP=grid is not None, INDEX64=index64)
    bound = fast_bound if all(0 <= b <= 6 for b in scale_mantissa_bits) else 0.0
    prepared = (prepared_a.values, prepared_b.values, prepared_a.shift, prepared_b.shift)
    fast = Launch(
        _probe_fast_kernel,
        (tiles_m * tiles_n,),
        (*prepared, prepared_a.l1, prepared_a.largest, prepared_b.l1, prepared_b.largest, alpha, out, taken, flagged)
        + (m, n, k, float(grid or 1), bound),
        dict(
            WIDTH=width,
            BM=tiles.block_m,
            BN=tiles.block_n,
            GROUP_M=tiles.group_m,
            num_warps=tiles.warps,
            num_stages=tiles.stages,
            enable_fp_fusion=False,
            **flags,
        ),
    )
    exact = Launch(
        _probe_exact_kernel,
        (triton.cdiv(m, tiles.exact_m), triton.cdiv(n, tiles.exact_n)),
        (
            pa,
            sa,
            pb,
            sb,
            *prepared,
            alpha,
            out,
            taken,
            flagged,
            m,
            n,
            k,
            *pa.stride(),
            *pb.stride(),
            *sa.stride(),
            *sb.stride(),
            float(grid or 1),
        ),
        dict(
            BLOCK=block,
            COLUMN_BLOCK=column_block,
            WIDTH=width,
            BM=tiles.block_m,
            BN=tiles.block_n,
            EM=tiles.exact_m,
            EN=tiles.exact_n,
            num_warps=tiles.exact_warps,
            enable_fp_fusion=False,
            **flags,
        ),
    )
    return [*launches, fast, exact], out, taken


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
