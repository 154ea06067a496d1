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
* ``_probe_exact_kernel`` (in :mod:`ue5m3.numerics.kernels.triton_probe_exact`; the building blocks both kernels
  share are in :mod:`ue5m3.numerics.kernels.triton_probe_parts`), over the flagged tiles only (in sub-tiles small
  enough for its FP64 state to stay in registers; every other program returns at once): each slice the bounds cover
  by the same dot, each other slice by each block's payload dot on the tensor cores (exact: a block sum stays below
  2^13 quarters), both block scales applied in FP64 (at most 20 significant bits) and the block terms summed by a
  TwoSum chain, exactly as ``exact.twosum_chain_to_fp32``, then rounded once to FP32 (RNE).

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
from ue5m3.numerics.kernels.triton_probe_exact import _probe_exact_kernel
from ue5m3.numerics.kernels.triton_probe_parts import accumulate, fast_slice, offsets, pow2, store_output, tile_of

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = [
    "probe_gemm_payload",
    "probe_gemm_launches",
    "prepare_operand",
    "Prepared",
    "ProbeTiles",
    "PROBE_TILES",
    "probe_tiles",
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
        payload = tl.load(payload_ptr + offsets(vectors, kk, stride_vector, stride_k, INDEX64), mask=ok, other=0.0)
        scale_at = offsets(vectors // scale_vector_block, kk // BLOCK, scale_stride_vector, scale_stride_k, INDEX64)
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
        value = tl.where(nonzero, (payload * 2.0) * (scale * pow2(clamped)[:, None]), 0.0)
        shift = top - MBITS - 1
        covered = (depth <= DEPTH_LIMIT) & (shift >= SHIFT_LOW) & (shift <= SHIFT_HIGH) & (factor == clamped)
        widen = pow2(tl.minimum(depth, DEPTH_LIMIT))
        l1 = tl.where(covered, tl.sum(tl.abs(value), axis=1) * widen, float("inf"))
        largest = tl.where(covered, tl.max(tl.abs(value), axis=1) * widen, float("inf"))
        out_at = offsets(vectors, kk, out_stride_vector, out_stride_k, INDEX64)
        tl.store(out_ptr + out_at, value.to(tl.float16), mask=ok)
        tl.store(shift_ptr + vectors * stat_stride_vector + j * stat_stride_slice, shift, mask=row_ok)
        tile_l1 = tl.maximum(tile_l1, tl.max(tl.where(row_ok, l1, 0.0)))
        tile_max = tl.maximum(tile_max, tl.max(tl.where(row_ok, largest, 0.0)))
    at = tile * tile_stride_tile + j * tile_stride_slice
    tl.store(l1_ptr + at, tile_l1)
    tl.store(max_ptr + at, tile_max)


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
    tile_m, tile_n = tile_of(tl.program_id(0), m, n, BM, BN, GROUP_M)
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
            p = fast_slice(a16_ptr, b16_ptr, shift_a_ptr, shift_b_ptr, rows, cols, m, n, k, j, WIDTH, INDEX64)
            acc = accumulate(acc, p, RTZ, HARDWARE_RTZ)
        store_output(c_ptr, acc, rows, cols, m, n, alpha_ptr, grid, SNAP, INDEX64)


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
