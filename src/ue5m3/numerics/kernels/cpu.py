"""Fused C kernels (E2M1 block quantization, the probe-matched GEMM), compiled on first use, loaded with ctypes.

The torch path (:mod:`ue5m3.numerics.encode` with :mod:`ue5m3.numerics.scale_rules`) is the reference; this kernel
does the same FP32 operations in the same order in one pass over memory (compiled with ``-fno-fast-math
-ffp-contract=off``) and is checked bit for bit against the reference by ``tests/test_cpu_kernel.py``.

The package ships the C sources only. The first :func:`load` of a process compiles them for this machine
(:mod:`ue5m3.numerics.kernels.build`: the ISA level of ``$UE5M3_KERNEL_ISA``, default ``native``) into the cache,
``$UE5M3_CACHE`` (default ``~/.cache/ue5m3``), or loads the library a first use there has already built (its name
is keyed by the sources, compiler, flags and CPU). Without a C compiler, :func:`available` is False and says why
once (a ``RuntimeWarning``, a log line under the ``ue5m3`` command), so ``backend="auto"`` uses the torch path,
whose results are identical, while ``quantize(..., backend="cpu_kernel")`` raises, naming the missing compiler
(:func:`unavailable_reason`).
"""

from __future__ import annotations

import ctypes
import warnings
from functools import cache
from importlib import resources

import torch

from ue5m3.numerics.kernels import build
from ue5m3.numerics.kernels.build import CompileError

__all__ = [
    "available",
    "unavailable_reason",
    "load",
    "quantize_blocks",
    "probe_gemm",
    "probe_gemm_payload",
    "probe_exact_outputs",
    "pack_e2m1",
    "dead_zone_counts",
    "scale_codes",
    "takes_scale_codes",
    "unpack_e2m1",
    "slice_span_max",
    "scale_extremes",
    "combine_extremes",
    "has_payload_gemm",
    "gemm_vector_bits",
    "CompileError",
]

_ROUNDING_IDS = {"rne": 0, "rtz": 1, "sf": 2, "sr_te": 3, "sr": 4}
_BIT_COUNTS = {"rne": 0, "rtz": 0, "sf": 8, "sr_te": 8, "sr": 53}
_ORDER_IDS = {"te": 0, "te_legacy": 1, "torchao": 2}
_RULE_IDS = {"tensor_scaled": 0, "mx_floor": 1, "mx_ceil": 2, "mx_rceil": 3, "four_over_six": 4}
_SELECTION_IDS = {None: 0, "mae": 0, "mse": 1, "abs_max": 2}
_told: set[str] = set()


def _sources() -> dict[str, bytes]:
    return {
        name: resources.files("ue5m3.numerics.kernels").joinpath(f"csrc/{name}").read_bytes()
        for name in build.SOURCES + build.HEADERS
    }


@cache
def _library(isa: str) -> ctypes.CDLL | CompileError:
    """The ``isa`` build, compiled into the cache on the first call of a process; the error when it cannot be."""
    try:
        cc = build.compiler()
        if cc is None:
            raise CompileError(
                f"{build.NO_COMPILER} to build the fused C kernel on first use: install gcc (or set CC) to use it, "
                "or use backend='torch' (backend='auto' does)"
            )
        lib = ctypes.CDLL(str(build.compile_library(_sources(), cc, build.cache_dir(), isa)))
    except CompileError as err:
        return err
    except OSError as err:  # a library that does not load (a truncated file in the cache, say)
        return CompileError(f"loading the fused C kernel failed: {err}")
    fn = lib.ue5m3_quantize_blocks
    p, i64, i32, u32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint32, ctypes.c_float
    fn.argtypes = [p, i64, i64, i64, i64, i64, i64, i32, i32, f32, f32, f32, f32, i32, i32, i32, i32, i32, p]
    fn.argtypes += [i32, u32, u32, u32, u32, i32, p, i64, i64, i64, p, p, p, p, p]
    fn.argtypes += [i32, f32, f32]  # 4/6: the selection, the tensor reference g and T * F
    fn.restype = None
    probe = lib.ue5m3_probe_gemm
    probe.argtypes = [p, p, i32, i64, i64, i64, i64, i32, f32, f32, p]
    probe.restype = ctypes.c_int
    payload = lib.ue5m3_probe_gemm_payload
    payload.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, i64, i32, f32, f32, p, p]
    payload.restype = ctypes.c_int
    exact = lib.ue5m3_probe_exact_outputs
    exact.argtypes = [p, p, p, p, i64, i64, i64, i64, i64, i64, i64, i32, f32, f32, p, i64, p, i64, p]
    exact.restype = None
    lib.ue5m3_dead_zone_counts.argtypes = [p, p, p, i64, i64, p]
    lib.ue5m3_dead_zone_counts.restype = None
    lib.ue5m3_scale_codes.argtypes = [p, i64, i32, i32, u32, p]
    lib.ue5m3_scale_codes.restype = None
    for name in ("ue5m3_pack_e2m1", "ue5m3_unpack_e2m1"):
        getattr(lib, name).argtypes = [p, i64, p]
        getattr(lib, name).restype = None
    spans = lib.ue5m3_slice_span_max
    spans.argtypes = [p, p, i64, i64, i64, i64, i64, i64, ctypes.c_double, i32, p]
    spans.restype = None
    lib.ue5m3_scale_extremes.argtypes = [p, i64, p]
    lib.ue5m3_scale_extremes.restype = None
    lib.ue5m3_has_payload_gemm.restype = ctypes.c_int
    lib.ue5m3_gemm_vector_bits.restype = ctypes.c_int
    lib.ue5m3_payload_tile_rows.restype = ctypes.c_int
    return lib


def load(isa: str | None = None) -> ctypes.CDLL:
    """The kernel library of ISA level ``isa`` (default: ``$UE5M3_KERNEL_ISA``, else ``native``), compiled into the
    cache on first use; one compilation attempt per level and process.

    Raises:
        CompileError: no C compiler (the message says so), a CPU without the level's instructions, or compilation
            failed (the compiler's message is included).
        ValueError: an unknown ISA level.
    """
    result = _library(build.kernel_isa() if isa is None else isa)
    if isinstance(result, CompileError):
        raise result
    return result


def unavailable_reason(isa: str | None = None) -> str | None:
    """Why the kernel cannot be used here (None if it can); compiles it on the first call."""
    try:
        load(isa)
    except CompileError as err:
        return str(err)
    return None


def available(isa: str | None = None) -> bool:
    """Whether the kernel can be used here (compiles it on first call); the first False of a process warns why."""
    reason = unavailable_reason(isa)
    if reason is not None and reason not in _told:
        _told.add(reason)
        warnings.warn(
            f"the fused C kernel cannot be used here, so backend='auto' computes with the torch path (identical "
            f"results) and backend='cpu_kernel' refuses: {reason}",
            RuntimeWarning,
            stacklevel=2,
        )
    return reason is None


def pack_e2m1(payload: torch.Tensor) -> torch.Tensor:
    """E2M1 values (FP32, CPU, an even last dimension) as codes two per byte along the last axis, element 2i in the
    low nibble: :meth:`QuantizedTensor.pack`'s torch ops in one pass, the same bits."""
    if payload.dtype != torch.float32 or payload.device.type != "cpu" or payload.shape[-1] % 2:
        raise ValueError("pack_e2m1 takes FP32 CPU E2M1 values with an even last dimension")
    payload = payload.contiguous()
    out = torch.empty(*payload.shape[:-1], payload.shape[-1] // 2, dtype=torch.uint8)
    load().ue5m3_pack_e2m1(payload.data_ptr(), out.numel(), out.data_ptr())
    return out


def takes_scale_codes(fmt) -> bool:
    """Whether :func:`scale_codes` encodes values of the :class:`~ue5m3.numerics.formats.FloatFormat` ``fmt``: one
    with subnormals, at most 8 bits and every value zero or a normal FP32 number (UE5M3, E4M3, UE4M3; not UE8M0)."""
    return fmt.subnormals and fmt.bits <= 8 and fmt.min_exponent - fmt.mantissa_bits >= -126


def scale_codes(values: torch.Tensor, fmt) -> torch.Tensor:
    """The uint8 codes of FP32 CPU ``values`` that ``fmt`` holds exactly (:func:`takes_scale_codes`):
    ``formats.codes_of_values(values, fmt).to(torch.uint8)`` in one pass, the same bits."""
    if values.dtype != torch.float32 or values.device.type != "cpu" or not takes_scale_codes(fmt):
        raise ValueError(f"scale_codes takes FP32 CPU values of a format with subnormals in 8 bits, got {fmt.name}")
    values = values.contiguous()
    out = torch.empty(values.shape, dtype=torch.uint8)
    sign_bit = 1 << (fmt.bits - 1) if fmt.signed else 0
    load().ue5m3_scale_codes(
        values.data_ptr(), values.numel(), fmt.mantissa_bits, fmt.min_exponent, sign_bit, out.data_ptr()
    )
    return out


def dead_zone_counts(blocks: torch.Tensor, decode_scales: torch.Tensor, payload: torch.Tensor) -> tuple[int, int]:
    """(elements of the FP32 CPU ``blocks`` (..., L) in round to nearest's dead zone, those of them ``payload`` kept
    nonzero), ``decode_scales`` (..., 1) being each block's: the dead-zone sums of ``telemetry.observe`` for a
    stochastic rounding in one pass, the same counts."""
    length = blocks.shape[-1]
    tensors = [t.to(torch.float32).reshape(-1, n).contiguous() for t, n in ((blocks, length), (decode_scales, 1))]
    payload = payload.to(torch.float32).reshape(-1, length).contiguous()
    if payload.shape != tensors[0].shape or tensors[1].shape[0] != payload.shape[0]:
        raise ValueError("dead_zone_counts takes blocks and a payload of one shape, and one decode scale per block")
    out = torch.zeros(2, dtype=torch.int64)
    load().ue5m3_dead_zone_counts(
        tensors[0].data_ptr(), tensors[1].data_ptr(), payload.data_ptr(), payload.shape[0], length, out.data_ptr()
    )
    dead, rescued = out.tolist()
    return dead, rescued


def unpack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """The E2M1 values (FP32) of codes packed by :func:`pack_e2m1`, twice as long along the last axis."""
    if codes.dtype != torch.uint8 or codes.device.type != "cpu":
        raise ValueError("unpack_e2m1 takes uint8 CPU codes")
    codes = codes.contiguous()
    out = torch.empty(*codes.shape[:-1], 2 * codes.shape[-1], dtype=torch.float32)
    load().ue5m3_unpack_e2m1(codes.data_ptr(), codes.numel(), out.data_ptr())
    return out


_MAX_GATHERED = 512  # csrc/block_quantize.c's MAX_GATHERED: longer blocks of a strided view are copied first


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def quantize_blocks(
    blocks: torch.Tensor,
    *,
    rule: str,
    order: str,
    global_scale: float,
    global_decode_scale: float,
    per_tensor: float,
    scale_max: float,
    scale_mantissa_bits: int,
    scale_min_exponent: int,
    scale_max_exponent: int,
    zero_scale_repair: bool,
    rounding: str,
    random_bits: torch.Tensor | None,
    philox: tuple | None = None,
    selection: str | None = None,
    tensor_amax: float = 0.0,
    target_f: float = 1.0,
) -> dict[str, torch.Tensor]:
    """Quantize FP32 blocks ``(n_blocks, L)``, or a strided block view ``(A, B, L)`` read in place (blocks in row-major
    order of its first two axes); returns the per-element outputs as ``(n_blocks, L)`` and the per-block ones.

    Stochastic modes take explicit ``random_bits`` (shaped like ``blocks``) or ``philox`` = (stream, block base
    indices [n_blocks] int64, inner length, inner stride, outer stride): the kernel then draws the stream's
    Philox bits at each element's global index itself (see ``csrc/philox.h``). The 4/6 rule also takes its
    ``selection``, the tensor reference ``tensor_amax`` and ``target_f`` = T * F (blocks of 16 or 256).
    """
    if blocks.dtype != torch.float32 or blocks.device.type != "cpu" or blocks.ndim not in (2, 3):
        raise ValueError("the CPU kernel takes a 2-D or 3-D FP32 CPU tensor of blocks")
    if blocks.ndim == 3 and blocks.shape[-1] > _MAX_GATHERED:
        blocks = blocks.reshape(-1, blocks.shape[-1])
    if blocks.ndim == 2:
        blocks = blocks.contiguous()
        view = (blocks.shape[0], 0, blocks.shape[1], 1)  # (inner blocks, stride_a, stride_b, stride_l)
    else:  # (A, B, L) read in place, e.g. the blocks along tokens of a transposed operand: no gathered copy
        view = (blocks.shape[1], *blocks.stride())
    length = blocks.shape[-1]
    nblocks = blocks.numel() // length if length else 0
    if rule == "four_over_six" and length not in (16, 256):
        raise ValueError(f"the CPU kernel's 4/6 rule takes blocks of 16 or 256 elements, got {length}")
    payload = torch.empty(nblocks, length, dtype=torch.float32)
    # each its own storage: a packed copy keeps the block maxima, and only them, alive
    per_block = {k: torch.empty(nblocks, dtype=torch.float32) for k in ("block_amax", "scales", "decode")}
    flags = torch.empty(nblocks, dtype=torch.uint8)
    if random_bits is not None:
        random_bits = random_bits.to(torch.int64).contiguous()
    stream, base, inner_len, inner_stride, outer_stride = philox or (None, None, 0, 0, 0)
    k0, k1 = stream.key if stream is not None else (0, 0)
    if base is not None:
        base = base.to(torch.int64).contiguous()
        if base.numel() != nblocks:
            raise ValueError(f"philox block bases: {base.numel()} for {nblocks} blocks")
    load().ue5m3_quantize_blocks(
        blocks.data_ptr(),
        nblocks,
        length,
        *view,
        _RULE_IDS[rule],
        _ORDER_IDS[order],
        global_scale,
        global_decode_scale,
        per_tensor,
        scale_max,
        scale_mantissa_bits,
        scale_min_exponent,
        scale_max_exponent,
        int(zero_scale_repair),
        _ROUNDING_IDS[rounding],
        _ptr(random_bits),
        int(stream is not None),
        k0,
        k1,
        stream.step if stream is not None else 0,
        stream.microbatch if stream is not None else 0,
        _BIT_COUNTS[rounding],
        _ptr(base),
        inner_len,
        inner_stride,
        outer_stride,
        payload.data_ptr(),
        per_block["block_amax"].data_ptr(),
        per_block["scales"].data_ptr(),
        per_block["decode"].data_ptr(),
        flags.data_ptr(),
        _SELECTION_IDS[selection],
        tensor_amax,
        target_f,
    )
    # the blocks per flag (bit 0 zero-rounded, 1 saturated, 2 underflowed) from one histogram of the flag bytes
    per_value = torch.bincount(flags, minlength=8).tolist() if nblocks else [0] * 8
    counts = {
        key: torch.tensor(sum(n for value, n in enumerate(per_value) if value >> bit & 1), dtype=torch.int64)
        for bit, key in enumerate(("zero_rounded_blocks", "saturated_blocks", "lost_blocks"))
    }
    return {"payload": payload, "flags": flags, **counts, **per_block}


def probe_gemm(
    enc_a: torch.Tensor,
    enc_b: torch.Tensor,
    *,
    width: int,
    rtz: bool,
    grid: int | None = None,
    alpha: float = 1.0,
) -> torch.Tensor:
    """Slice-wise GEMM of encoded operands (FP32 or FP64, the same dtype) whose slice sums are exact in FP64
    (caller-checked).

    Returns the FP32 result [M, N]: each slice sum rounded once to FP32, combined in K order, snapped to the 1/grid
    lattice (ties to even) and multiplied by ``alpha``, all in FP32 as the torch path does.
    """
    if enc_a.dtype != enc_b.dtype or enc_a.dtype not in (torch.float32, torch.float64):
        raise ValueError("probe_gemm takes FP32 or FP64 operands of one dtype")
    if enc_a.ndim != 2 or enc_b.ndim != 2 or enc_a.shape[1] != enc_b.shape[0]:
        raise ValueError("probe_gemm takes operands A [M, K] and B [K, N]")
    enc_a, enc_b = enc_a.contiguous(), enc_b.contiguous()
    (m, k), n = enc_a.shape, enc_b.shape[1]
    out = torch.empty(m, n, dtype=torch.float32)
    f64 = int(enc_a.dtype == torch.float64)
    status = load().ue5m3_probe_gemm(
        enc_a.data_ptr(),
        enc_b.data_ptr(),
        f64,
        m,
        n,
        k,
        width,
        int(rtz),
        float(grid or 0),
        float(alpha),
        out.data_ptr(),
    )
    if status:
        raise MemoryError("probe_gemm could not allocate its packed operands")
    return out


def slice_span_max(
    scales: torch.Tensor, amax: torch.Tensor, *, rows: int, row_div: int, per_slice: int, element_max: float, mbits: int
) -> torch.Tensor:
    """Per row of the GEMM operand (an A row, or a B column), the largest bit span over its K slices (int32
    [rows]): the maximum over slices of :func:`ue5m3.numerics.gemm._span_bits` in one pass. ``scales`` and
    ``amax`` are FP32 [grid rows, K blocks] views with the same strides; row r reads grid row r // ``row_div``."""
    if scales.shape != amax.shape or scales.stride() != amax.stride() or scales.ndim != 2:
        raise ValueError("slice_span_max takes scales and block maxima of one 2-D shape and strides")
    if scales.dtype != torch.float32 or amax.dtype != torch.float32 or scales.shape[1] % per_slice:
        raise ValueError("slice_span_max takes FP32 grids of whole slices")
    out = torch.empty(rows, dtype=torch.int32)
    load().ue5m3_slice_span_max(
        scales.data_ptr(),
        amax.data_ptr(),
        rows,
        scales.shape[1],
        scales.stride(0),
        scales.stride(1),
        row_div,
        per_slice,
        float(element_max),
        mbits,
        out.data_ptr(),
    )
    return out


def scale_extremes(*scales: torch.Tensor) -> tuple[float, float]:
    """The largest and the smallest positive value over FP32 block-scale tensors ((0, 0) where none is
    positive), read in one pass each."""
    out = torch.empty(2, dtype=torch.float32)
    extremes = []
    for s in scales:
        if s.dtype != torch.float32 or s.device.type != "cpu":
            raise ValueError("scale_extremes takes FP32 CPU scales")
        s = s.contiguous()
        load().ue5m3_scale_extremes(s.data_ptr(), s.numel(), out.data_ptr())
        extremes.append(tuple(out.tolist()))
    return combine_extremes(*extremes)


def combine_extremes(*extremes: tuple[float, float]) -> tuple[float, float]:
    """The (largest, smallest positive) over several :func:`scale_extremes` results ((0, 0) where none is
    positive)."""
    largest, smallest = 0.0, 0.0
    for high, low in extremes:
        largest = max(largest, high)
        smallest = low if smallest == 0.0 else (min(smallest, low) if low > 0 else smallest)
    return largest, smallest


def probe_exact_outputs(
    out: torch.Tensor,
    payload_a: torch.Tensor,
    scales_a: torch.Tensor,
    payload_b: torch.Tensor,
    scales_b: torch.Tensor,
    *,
    rows: torch.Tensor,
    cols: torch.Tensor,
    block: int,
    column_block: int,
    width: int,
    rtz: bool,
    grid: int | None,
    alpha: float,
) -> None:
    """Overwrite, in ``out`` [M, N], every column of the A ``rows`` and every row of the B ``cols`` with the exact
    probe-matched outputs (see ``ue5m3_probe_exact_outputs``: the torch path's TwoSum chain and round-to-odd, its
    bits for any exponent spans). A [M, K] with scales [M, K / block]; B [K, N] with scales [K / block,
    ceil(N / column_block)] (column_block: 1 for blocks along K, ``block`` for 2D tiles)."""
    tensors = [t.to(torch.float32).contiguous() for t in (payload_a, scales_a, payload_b, scales_b)]
    (m, k), n = tensors[0].shape, tensors[2].shape[1]
    if (
        tensors[2].shape[0] != k
        or k % width
        or width % block
        or out.shape != (m, n)
        or tensors[1].shape != (m, k // block)
    ):
        raise ValueError(
            "probe_exact_outputs needs A [M, K] with scales [M, K / block], B [K, N], out [M, N] and whole slices of "
            "whole blocks"
        )
    if out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError("probe_exact_outputs writes into a contiguous FP32 out")
    rows, cols = (t.to(torch.int64).contiguous() for t in (rows, cols))
    for name, index, size in (("rows", rows, m), ("cols", cols, n)):
        if index.numel() and not (0 <= int(index.min()) and int(index.max()) < size):
            raise ValueError(f"probe_exact_outputs: {name} must index [0, {size}), got {index.tolist()}")
    load().ue5m3_probe_exact_outputs(
        *(t.data_ptr() for t in tensors),
        m,
        n,
        k,
        block,
        column_block,
        tensors[3].shape[1],
        width,
        int(rtz),
        float(grid or 0),
        float(alpha),
        rows.data_ptr(),
        rows.numel(),
        cols.data_ptr(),
        cols.numel(),
        out.data_ptr(),
    )


def has_payload_gemm() -> bool:
    """Whether the FP32 payload path of the probe-matched GEMM was built (it needs AVX2 and FMA)."""
    return bool(load().ue5m3_has_payload_gemm())


def gemm_vector_bits() -> int:
    """The vector width the probe-matched GEMM's micro-kernels were built for: 512 (AVX-512 F, DQ and VL), 256
    (AVX2 and FMA) or 0 (portable C). The bits are the same at every width."""
    return int(load().ue5m3_gemm_vector_bits())


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
    alpha: float,
    count_whole: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, int, int]:
    """The probe-matched GEMM from payloads and block scales (see ``ue5m3_probe_gemm_payload``): A [M, K] with
    scales [M, K/block], B [K, N] with scales [K/block, ceil(N/column_block)]; the same bits as
    :func:`probe_gemm` on the encoded operands wherever the caller's span check holds. With ``count_whole``, also
    how many of the tiles' slices (6 or 8 rows by 16 columns) were summed whole in FP32 and of how many."""
    tensors = [t.to(torch.float32).contiguous() for t in (payload_a, scales_a, payload_b, scales_b)]
    (m, k), n = tensors[0].shape, tensors[2].shape[1]
    if tensors[2].shape[0] != k or block % 16 or width % 16 or k % width:
        raise ValueError(
            "probe_gemm_payload needs A [M, K], B [K, N], blocks and slices of multiples of 16 and whole slices"
        )
    out = torch.empty(m, n, dtype=torch.float32)
    whole = torch.zeros(1, dtype=torch.int64)
    status = load().ue5m3_probe_gemm_payload(
        *(t.data_ptr() for t in tensors),
        m,
        n,
        k,
        block,
        column_block,
        width,
        int(rtz),
        float(grid or 0),
        float(alpha),
        out.data_ptr(),
        whole.data_ptr() if count_whole else None,
    )
    if status:
        raise MemoryError("probe_gemm_payload could not allocate its packed operands")
    if count_whole:
        rows = load().ue5m3_payload_tile_rows()  # the micro-kernels' tiles: 6 (AVX2) or 8 (AVX-512) rows by 16
        return out, int(whole), -(-m // rows) * -(-n // 16) * (k // width)
    return out
