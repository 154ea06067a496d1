"""Block quantization as one Triton kernel: the GPU backend of :func:`ue5m3.numerics.quantize.quantize`.

The same FP32 operations in the same order as the torch reference and the C kernel (``csrc/block_quantize.c``),
on the same block view ``(n_blocks, L)``: block amax, the scheme's scale rule (tensor-scaled in any of the three
orders, OCP floor, ceil, RCEIL, 4/6 selection), RNE onto the scale format, zero-scale repair, the decoded scale, the
payload multiplier by IEEE division (``div_rn``), E2M1 rounding in every mode, and the diagnostics flags. Stochastic
modes draw Philox4x32-10 bits in the kernel (``tl.philox``, the generator of :mod:`ue5m3.numerics.philox`) at each
element's global index; explicit bits are read instead when given. Launched with FP fusion off, so no multiply
and add contract into an fma the reference does not compute (sr_te's fma is explicit).

A second kernel, :func:`quantize_both_axes`, reads a 2-D tensor once and writes its quantizations along both axes
(the copy along the first axis already transposed), each with its own tensor scale, rounding and stream: the FP4
linear's X and dY copies. Both kernels share the scale, Philox and E2M1 helpers.

Runs on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (how ``tests/test_triton_quantize.py``
checks it bit for bit against the torch reference on a machine without a GPU); ``tests/test_triton_compile.py``
compiles it for sm_90 and sm_100.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import Launch, check_triton_version, run
from ue5m3.numerics.kernels.launch import triton_device_reason as usable

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = ["quantize_blocks", "quantize_both_axes", "AxisRequest", "usable"]

_ROUNDING_IDS = {"rne": 0, "rtz": 1, "sf": 2, "sr_te": 3, "sr": 4}
_ORDER_IDS = {"te": 0, "te_legacy": 1, "torchao": 2}
_RULE_IDS = {"tensor_scaled": 0, "mx_floor": 1, "mx_ceil": 2, "mx_rceil": 3, "four_over_six": 4}
_SELECTION_IDS = {None: 0, "mae": 0, "mse": 1, "abs_max": 2}
_BIT_COUNTS = {"rne": 0, "rtz": 0, "sf": 8, "sr_te": 8, "sr": 53}
FP32_MAX = tl.constexpr(3.4028234663852886e38)  # a constexpr global: kernels may read only those
INV_SIX = 0.1666666716337204  # fp32(1/6), the FP32 constant 1/F
INT32_LIMIT = 2**31 - 1  # offsets within a tensor of at most this many elements fit 32 bits


@triton.jit
def _pow2(k):
    """2^k for integer k in [-126, 127] as FP32, from its exponent bits (exact)."""
    return ((k + 127).to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _index(v, INDEX64: tl.constexpr):
    """Indices as the offsets' integer type: 64-bit only where the launch found a tensor too large for 32 bits."""
    if INDEX64:
        return v.to(tl.int64)
    else:
        return v


@triton.jit
def _round_scale_rne(v, mbits, emin, maxf):
    """RNE of non-negative v onto a format with mbits fraction bits and minimum exponent emin, saturated."""
    v = tl.minimum(v, maxf)
    e = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, emin)
    q = e - mbits
    s = v * _pow2(-q)
    lower = s.to(tl.int32).to(tl.float32)  # s >= 0: truncation is floor
    delta = s - lower
    odd = (s.to(tl.int32) & 1) == 1
    up = (delta > 0.5) | ((delta == 0.5) & odd)
    out = (lower + up.to(tl.float32)) * _pow2(q)
    return tl.minimum(out, maxf)


@triton.jit
def _philox_bits(index, seed, step, microbatch, BIT_COUNT: tl.constexpr):
    """An element's random integer at global ``index`` (int64): Philox4x32-10 keyed by ``seed`` with counter
    (index / elements per counter, its high word, step, microbatch), as :func:`ue5m3.numerics.philox.random_bits`."""
    if BIT_COUNT <= 32:  # 4 elements per counter
        group = index // 4
        lane = index % 4
    else:  # 2 elements per counter
        group = index // 2
        lane = index % 2
    zero = tl.zeros(group.shape, dtype=tl.uint32)
    w0, w1, w2, w3 = tl.philox(seed, group.to(tl.uint32), (group >> 32).to(tl.uint32), zero + step, zero + microbatch)
    if BIT_COUNT <= 32:
        word = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
        r = (word >> (32 - BIT_COUNT)).to(tl.int64)
    else:
        high = tl.where(lane == 0, w0, w2).to(tl.uint64)
        low = tl.where(lane == 0, w1, w3).to(tl.uint64)
        r = ((high << (BIT_COUNT - 32)) | (low >> (64 - BIT_COUNT))).to(tl.int64)
    return r


@triton.jit
def _tile_bits(r, c, base, stride_row, stride_col, seed, step, microbatch, MODE: tl.constexpr, BIT_COUNT: tl.constexpr):
    """The random integers of the tile (rows r, columns c) of a stochastic ``MODE`` (zeros otherwise): element (r, c)
    draws at global index base + r * stride_row + c * stride_col."""
    bits = tl.zeros([r.shape[0], c.shape[0]], dtype=tl.int64)
    if MODE >= 2:
        index = base + r[:, None].to(tl.int64) * stride_row + c[None, :].to(tl.int64) * stride_col
        bits = _philox_bits(index, seed, step, microbatch, BIT_COUNT)
    return bits


@triton.jit
def _round_e2m1(v, r, MODE: tl.constexpr):
    """E2M1 payload of the scaled values ``v`` (clamped to [-6, 6] first) in rounding ``MODE`` with random integers
    ``r`` (ignored by RNE and RTZ)."""
    v = tl.minimum(tl.maximum(v, -6.0), 6.0)
    sign = v.to(tl.uint32, bitcast=True) & 0x80000000
    m = (v.to(tl.uint32, bitcast=True) & 0x7FFFFFFF).to(tl.float32, bitcast=True)
    grid_step = tl.where(m >= 4.0, 2.0, tl.where(m >= 2.0, 1.0, 0.5))  # E2M1 spacing at m
    inv = tl.where(m >= 4.0, 0.5, tl.where(m >= 2.0, 1.0, 2.0))
    if MODE == 3:  # Transformer Engine's stochastic_round_fp4_e2m1
        t = tl.fma(r.to(tl.float32) * (1.0 / 256.0), grid_step, m)
        step_t = tl.where(t >= 4.0, 2.0, tl.where(t >= 2.0, 1.0, 0.5))
        inv_t = tl.where(t >= 4.0, 0.5, tl.where(t >= 2.0, 1.0, 2.0))
        out = (t * inv_t).to(tl.int32).to(tl.float32) * step_t
    else:
        s = m * inv
        lower = s.to(tl.int32).to(tl.float32)
        delta = s - lower
        if MODE == 0:
            odd = (s.to(tl.int32) & 1) == 1
            up = (delta > 0.5) | ((delta == 0.5) & odd)
        elif MODE == 1:
            up = delta < 0.0
        elif MODE == 2:  # SF: one FP32 addition, as the paper's kernel
            up = (delta + (2 * r + 1).to(tl.float32) * (1.0 / 512.0)) >= 1.0
        else:  # SR: Bernoulli(delta) with 53 bits: r < delta * 2^53 (exact in FP32) <=> r < ceil(delta * 2^53)
            up = r < tl.math.ceil(delta * 9007199254740992.0).to(tl.int64)  # for integers r, with no FP64
        out = (lower + up.to(tl.float32)) * grid_step
    out = tl.minimum(out, 6.0)
    return (out.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _scales_of(
    amax,
    scalars_ptr,
    scale_max,
    inv_f,
    RULE: tl.constexpr,
    ORDER: tl.constexpr,
    SCALE_MBITS: tl.constexpr,
    SCALE_EMIN: tl.constexpr,
    SCALE_EMAX: tl.constexpr,
    ZERO_REPAIR: tl.constexpr,
):
    """(scale, flags, decoded scale, payload multiplier) of the block maxima ``amax`` (any shape) under the scheme's
    rule and the tensor scale at ``scalars_ptr`` (G, 1/G and torchao's per-tensor divisor, 0-dim FP32 device values:
    nothing read on the host). Flags: 1 rounded to zero before repair, 2 saturated the scale format. The multiplier
    is the IEEE reciprocal of the decoded scale, capped at FP32 max (a zero scale's)."""
    global_scale = tl.load(scalars_ptr)
    global_decode_scale = tl.load(scalars_ptr + 1)
    per_tensor = tl.load(scalars_ptr + 2)
    flag = tl.zeros(amax.shape, dtype=tl.int32)
    if RULE == 0:
        ideal = _ideal_scale(amax, global_scale, per_tensor, inv_f, ORDER)
        scale, flag = _format_scale(ideal, scale_max, SCALE_MBITS, SCALE_EMIN, ZERO_REPAIR)
    else:
        if RULE == 3:  # RCEIL: the exponent of amax * fp32(1/6), rounded up from its bits
            db = (amax * inv_f).to(tl.int32, bitcast=True)
            biased = (db >> 23) & 0xFF
            mantissa = db & 0x7FFFFF
            up = tl.where(biased == 0, mantissa > 0x400000, mantissa != 0)
            e = biased + up.to(tl.int32) - 127
        else:
            ab = amax.to(tl.int32, bitcast=True)
            e = ((ab >> 23) & 0xFF) - 127
            if RULE == 2:
                e = e + ((ab & 0x7FFFFF) != 0).to(tl.int32)
            e = e - 2  # E2M1 max exponent
        flag = tl.where(e > SCALE_EMAX, flag | 2, flag)
        e = tl.minimum(tl.maximum(e, SCALE_EMIN), SCALE_EMAX)
        # 2^e down to 2^-127 (an FP32 subnormal for the UE8M0 minimum)
        subnormal = tl.full(amax.shape, 1 << 22, tl.int32).to(tl.float32, bitcast=True)
        scale = tl.where(e >= -126, _pow2(tl.maximum(e, -126)), subnormal)
    decode = scale * global_decode_scale
    mult = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), decode), FP32_MAX)
    return scale, flag, decode, mult


@triton.jit
def _ideal_scale(amax, global_scale, per_tensor, inv_f, ORDER: tl.constexpr):
    """The ideal tensor-scaled block scale in the scheme's FP32 order: TE's a_B * (G * (1/F)), the legacy
    (a_B / F) * G, or torchao's (a_B / F) / per_tensor."""
    six = tl.full(amax.shape, 6.0, tl.float32)
    if ORDER == 0:
        ideal = amax * (global_scale * inv_f)
    elif ORDER == 1:
        ideal = tl.math.div_rn(amax, six) * global_scale
    else:
        ideal = tl.math.div_rn(tl.math.div_rn(amax, six), tl.full(amax.shape, per_tensor, tl.float32))
    return ideal


@triton.jit
def _format_scale(ideal, scale_max, SCALE_MBITS: tl.constexpr, SCALE_EMIN: tl.constexpr, ZERO_REPAIR: tl.constexpr):
    """(scale, flags) of ideal tensor-scaled block scales: capped, RNE onto the format, zero repaired."""
    flag = tl.where(ideal > scale_max, 2, 0)
    scale = _round_scale_rne(ideal, SCALE_MBITS, SCALE_EMIN, scale_max)
    zero = scale == 0.0
    flag = tl.where(zero, flag | 1, flag)
    if ZERO_REPAIR:
        scale = tl.where(zero, 1.0, scale)
    return scale, flag


@triton.jit
def _candidate_error(
    blocks, scale, global_decode_scale, g, target_f, lane, SELECTION: tl.constexpr, AXIS: tl.constexpr, L: tl.constexpr
):
    """4/6's block error of candidate scales ``scale`` (the block shape without ``AXIS``) over ``blocks``: the RNE
    payload dequantized as ((p * S) * g) / (T * F), minus x, summed along ``AXIS`` in the order of
    ``scale_rules.block_error_sum`` (``lane``: each element's position in its block, broadcast like ``blocks``).
    A masked sum of one or two nonzero terms and zeros is those terms' one FP32 sum, so each lane is exact."""
    mult = tl.minimum(tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale * global_decode_scale), FP32_MAX)
    s = tl.expand_dims(scale, AXIS)
    payload = _round_e2m1(blocks * tl.expand_dims(mult, AXIS), tl.zeros(blocks.shape, dtype=tl.int64), 0)
    d = tl.math.div_rn((payload * s) * g, tl.full(blocks.shape, target_f, tl.float32)) - blocks
    if SELECTION == 2:
        return tl.max(tl.abs(d), axis=AXIS)
    if SELECTION == 1:
        e = d * d
    else:
        e = tl.abs(d)
    if L == 16:
        total = tl.sum(tl.where((lane == 0) | (lane == 8), e, 0.0), axis=AXIS)
        for k in tl.static_range(1, 8):
            total = total + tl.sum(tl.where((lane == k) | (lane == k + 8), e, 0.0), axis=AXIS)
    else:  # 256 (a 16x16 tile; the one-axis kernel, AXIS = 1): 32 vectors of 8 lanes, four accumulators
        rows: tl.constexpr = e.shape[0]
        e3 = tl.reshape(e, [rows, 8, 32])  # (block, i, 8k + lane): vector 4i + k
        i_index = tl.arange(0, 8)[None, :, None]
        acc = tl.sum(tl.where(i_index == 0, e3, 0.0), axis=1)
        for i in tl.static_range(1, 8):
            acc = acc + tl.sum(tl.where(i_index == i, e3, 0.0), axis=1)
        a4 = tl.reshape(acc, [rows, 4, 8])
        k_index = tl.arange(0, 4)[None, :, None]
        lanes = tl.sum(tl.where(k_index == 0, a4, 0.0), axis=1)
        for k in tl.static_range(1, 4):
            lanes = lanes + tl.sum(tl.where(k_index == k, a4, 0.0), axis=1)
        l_index = tl.arange(0, 8)[None, :]
        total = tl.sum(tl.where(l_index == 0, lanes, 0.0), axis=1)
        for k in tl.static_range(1, 8):
            total = total + tl.sum(tl.where(l_index == k, lanes, 0.0), axis=1)
    return total


@triton.jit
def _four_over_six_scales(
    blocks,
    amax,
    lane,
    scalars_ptr,
    scale_max,
    inv_f,
    ORDER: tl.constexpr,
    SCALE_MBITS: tl.constexpr,
    SCALE_EMIN: tl.constexpr,
    ZERO_REPAIR: tl.constexpr,
    SELECTION: tl.constexpr,
    AXIS: tl.constexpr,
    L: tl.constexpr,
):
    """4/6 (``scale_rules.four_over_six``): the 6-candidate (the scheme's order) and the 4-candidate (its ideal
    times 1.5), the second kept where its block error is strictly lower; ``_scales_of``'s outputs. The scalars at
    ``scalars_ptr`` also hold g and T * F (entries 3 and 4)."""
    global_scale = tl.load(scalars_ptr)
    global_decode_scale = tl.load(scalars_ptr + 1)
    per_tensor = tl.load(scalars_ptr + 2)
    g = tl.load(scalars_ptr + 3)
    target_f = tl.load(scalars_ptr + 4)
    ideal = _ideal_scale(amax, global_scale, per_tensor, inv_f, ORDER)
    six, flag6 = _format_scale(ideal, scale_max, SCALE_MBITS, SCALE_EMIN, ZERO_REPAIR)
    four, flag4 = _format_scale(ideal * 1.5, scale_max, SCALE_MBITS, SCALE_EMIN, ZERO_REPAIR)
    error6 = _candidate_error(blocks, six, global_decode_scale, g, target_f, lane, SELECTION, AXIS, L)
    error4 = _candidate_error(blocks, four, global_decode_scale, g, target_f, lane, SELECTION, AXIS, L)
    take_four = error4 < error6
    scale = tl.where(take_four, four, six)
    flag = tl.where(take_four, flag4, flag6)
    decode = scale * global_decode_scale
    mult = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), decode), FP32_MAX)
    return scale, flag, decode, mult


@triton.jit
def _store_blocks(amax_ptr, scale_ptr, decode_ptr, flags_ptr, at, ok, amax, scale, decode, flag):
    """The per-block outputs at offsets ``at`` where ``ok``."""
    tl.store(amax_ptr + at, amax, mask=ok)
    tl.store(scale_ptr + at, scale, mask=ok)
    tl.store(decode_ptr + at, decode, mask=ok)
    tl.store(flags_ptr + at, flag.to(tl.uint8), mask=ok)


@triton.jit
def _quantize_kernel(
    x_ptr,
    bits_ptr,
    base_ptr,
    payload_ptr,
    amax_ptr,
    scale_ptr,
    decode_ptr,
    flags_ptr,
    n_blocks,
    scalars_ptr,
    scale_max,
    inv_f,
    seed,
    step,
    microbatch,
    inner_len,
    inner_stride,
    outer_stride,
    L: tl.constexpr,
    L_POW2: tl.constexpr,
    BLOCKS: tl.constexpr,
    RULE: tl.constexpr,
    ORDER: tl.constexpr,
    MODE: tl.constexpr,
    SCALE_MBITS: tl.constexpr,
    SCALE_EMIN: tl.constexpr,
    SCALE_EMAX: tl.constexpr,
    ZERO_REPAIR: tl.constexpr,
    EXPLICIT_BITS: tl.constexpr,
    BIT_COUNT: tl.constexpr,
    SELECTION: tl.constexpr,
    INDEX64: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCKS + tl.arange(0, BLOCKS)
    cols = tl.arange(0, L_POW2)
    row_ok = rows < n_blocks
    mask = row_ok[:, None] & (cols[None, :] < L)
    offsets = _index(rows, INDEX64)[:, None] * L + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    amax = tl.max(tl.abs(x), axis=1)
    if RULE == 4:
        scale, flag, decode, mult = _four_over_six_scales(
            x,
            amax,
            cols[None, :],
            scalars_ptr,
            scale_max,
            inv_f,
            ORDER,
            SCALE_MBITS,
            SCALE_EMIN,
            ZERO_REPAIR,
            SELECTION,
            1,
            L,
        )
    else:
        scale, flag, decode, mult = _scales_of(
            amax, scalars_ptr, scale_max, inv_f, RULE, ORDER, SCALE_MBITS, SCALE_EMIN, SCALE_EMAX, ZERO_REPAIR
        )
    _store_blocks(amax_ptr, scale_ptr, decode_ptr, flags_ptr, rows, row_ok, amax, scale, decode, flag)
    r = tl.zeros([BLOCKS, L_POW2], dtype=tl.int64)
    if MODE >= 2:
        if EXPLICIT_BITS:
            r = tl.load(bits_ptr + offsets, mask=mask, other=0)
        else:
            base = tl.load(base_ptr + rows, mask=row_ok, other=0)
            p = cols[None, :].to(tl.int64)
            index = base[:, None] + (p // inner_len) * outer_stride + (p % inner_len) * inner_stride
            r = _philox_bits(index, seed, step, microbatch, BIT_COUNT)
    payload = _round_e2m1(x * mult[:, None], r, MODE)
    tl.store(payload_ptr + offsets, payload, mask=mask)


@triton.jit
def _quantize_both_axes_kernel(
    x_ptr,
    rows,
    cols,
    scale_max,
    inv_f,
    last_scalars_ptr,
    last_payload_ptr,
    last_amax_ptr,
    last_scale_ptr,
    last_decode_ptr,
    last_flags_ptr,
    last_seed,
    last_step,
    last_microbatch,
    last_base,
    last_stride_row,
    last_stride_col,
    first_scalars_ptr,
    first_payload_ptr,
    first_amax_ptr,
    first_scale_ptr,
    first_decode_ptr,
    first_flags_ptr,
    first_seed,
    first_step,
    first_microbatch,
    first_base,
    first_stride_row,
    first_stride_col,
    L: tl.constexpr,
    TILE_ROWS: tl.constexpr,
    TILE_COLS: tl.constexpr,
    RULE: tl.constexpr,
    ORDER: tl.constexpr,
    SCALE_MBITS: tl.constexpr,
    SCALE_EMIN: tl.constexpr,
    SCALE_EMAX: tl.constexpr,
    ZERO_REPAIR: tl.constexpr,
    LAST: tl.constexpr,
    LAST_MODE: tl.constexpr,
    LAST_BITS: tl.constexpr,
    FIRST: tl.constexpr,
    FIRST_MODE: tl.constexpr,
    FIRST_BITS: tl.constexpr,
    SELECTION: tl.constexpr,
    INDEX64: tl.constexpr,
):
    """One read of a [TILE_ROWS, TILE_COLS] tile of x [rows, cols] (both multiples of L), two quantizations:

    * LAST: blocks of L along the last axis (each row's): the payload in x's layout [rows, cols] and per block
      [rows, cols / L] -- ``quantize(x, axis=-1)``;
    * FIRST: blocks of L along the first axis (each column's): the payload in the transposed layout [cols, rows]
      (the block view of ``quantize(x, axis=0)`` and of ``quantize(x.t(), axis=-1)``) and per block [cols, rows / L].

    Each has its own tensor scale (``*_scalars``: G, 1/G, torchao's divisor), rounding and Philox stream; element
    (r, c) draws at global index base + r * stride_row + c * stride_col."""
    r = tl.program_id(0) * TILE_ROWS + tl.arange(0, TILE_ROWS)
    c = tl.program_id(1) * TILE_COLS + tl.arange(0, TILE_COLS)
    mask = (r < rows)[:, None] & (c < cols)[None, :]
    x = tl.load(x_ptr + _index(r, INDEX64)[:, None] * cols + c[None, :], mask=mask, other=0.0)
    if LAST:
        blocks = tl.reshape(x, [TILE_ROWS, TILE_COLS // L, L])
        amax = tl.max(tl.abs(blocks), axis=2)  # [TILE_ROWS, TILE_COLS / L]
        if RULE == 4:
            scale, flag, decode, mult = _four_over_six_scales(
                blocks,
                amax,
                tl.arange(0, L)[None, None, :],
                last_scalars_ptr,
                scale_max,
                inv_f,
                ORDER,
                SCALE_MBITS,
                SCALE_EMIN,
                ZERO_REPAIR,
                SELECTION,
                2,
                L,
            )
        else:
            scale, flag, decode, mult = _scales_of(
                amax, last_scalars_ptr, scale_max, inv_f, RULE, ORDER, SCALE_MBITS, SCALE_EMIN, SCALE_EMAX, ZERO_REPAIR
            )
        stream = (last_seed, last_step, last_microbatch)
        bits = _tile_bits(r, c, last_base, last_stride_row, last_stride_col, *stream, LAST_MODE, LAST_BITS)
        scaled = blocks * mult[:, :, None]
        payload = _round_e2m1(scaled, tl.reshape(bits, [TILE_ROWS, TILE_COLS // L, L]), LAST_MODE)
        tl.store(
            last_payload_ptr + _index(r, INDEX64)[:, None] * cols + c[None, :],
            tl.reshape(payload, [TILE_ROWS, TILE_COLS]),
            mask=mask,
        )
        block_cols = tl.program_id(1) * (TILE_COLS // L) + tl.arange(0, TILE_COLS // L)
        per_block = _index(r, INDEX64)[:, None] * (cols // L) + block_cols[None, :]
        block_ok = (r < rows)[:, None] & (block_cols * L < cols)[None, :]
        outputs = (last_amax_ptr, last_scale_ptr, last_decode_ptr, last_flags_ptr)
        _store_blocks(*outputs, per_block, block_ok, amax, scale, decode, flag)
    if FIRST:
        blocks = tl.reshape(x, [TILE_ROWS // L, L, TILE_COLS])
        amax = tl.max(tl.abs(blocks), axis=1)  # [TILE_ROWS / L, TILE_COLS]
        if RULE == 4:
            scale, flag, decode, mult = _four_over_six_scales(
                blocks,
                amax,
                tl.arange(0, L)[None, :, None],
                first_scalars_ptr,
                scale_max,
                inv_f,
                ORDER,
                SCALE_MBITS,
                SCALE_EMIN,
                ZERO_REPAIR,
                SELECTION,
                1,
                L,
            )
        else:
            scale, flag, decode, mult = _scales_of(
                amax, first_scalars_ptr, scale_max, inv_f, RULE, ORDER, SCALE_MBITS, SCALE_EMIN, SCALE_EMAX, ZERO_REPAIR
            )
        stream = (first_seed, first_step, first_microbatch)
        bits = _tile_bits(r, c, first_base, first_stride_row, first_stride_col, *stream, FIRST_MODE, FIRST_BITS)
        scaled = blocks * mult[:, None, :]
        payload = _round_e2m1(scaled, tl.reshape(bits, [TILE_ROWS // L, L, TILE_COLS]), FIRST_MODE)
        tl.store(  # element (r, c) at [c, r] of the transposed layout
            first_payload_ptr + _index(c, INDEX64)[None, :] * rows + r[:, None],
            tl.reshape(payload, [TILE_ROWS, TILE_COLS]),
            mask=mask,
        )
        block_rows = tl.program_id(0) * (TILE_ROWS // L) + tl.arange(0, TILE_ROWS // L)
        per_block = _index(c, INDEX64)[None, :] * (rows // L) + block_rows[:, None]
        block_ok = (block_rows * L < rows)[:, None] & (c < cols)[None, :]
        outputs = (first_amax_ptr, first_scale_ptr, first_decode_ptr, first_flags_ptr)
        _store_blocks(*outputs, per_block, block_ok, amax, scale, decode, flag)


def quantize_blocks(
    blocks: torch.Tensor,
    *,
    rule: str,
    order: str,
    global_scale: torch.Tensor | float,
    global_decode_scale: torch.Tensor | float,
    per_tensor: torch.Tensor | float,
    scale_max: float,
    scale_mantissa_bits: int,
    scale_min_exponent: int,
    scale_max_exponent: int,
    zero_scale_repair: bool,
    rounding: str,
    random_bits: torch.Tensor | None,
    philox: tuple | None = None,
    selection: str | None = None,
    tensor_amax: torch.Tensor | float = 0.0,
    target_f: float = 1.0,
) -> dict[str, torch.Tensor]:
    """The Triton twin of :func:`ue5m3.numerics.kernels.cpu.quantize_blocks` (same arguments and outputs); on ``meta``
    tensors (inside planning) the same allocations and no launch."""
    if rule == "four_over_six" and blocks.shape[-1] not in (16, 256):
        raise ValueError(f"the Triton kernel's 4/6 rule takes blocks of 16 or 256 elements, got {blocks.shape[-1]}")
    if blocks.dtype != torch.float32 or blocks.ndim != 2:
        raise ValueError("the Triton kernel takes a 2-D FP32 tensor of blocks")
    reason = usable(blocks.device)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run here: {reason}")
    blocks = blocks.contiguous()
    n_blocks, length = blocks.shape
    device = blocks.device
    payload = torch.empty_like(blocks)
    per_block = {
        k: torch.empty(n_blocks, dtype=torch.float32, device=device) for k in ("block_amax", "scales", "decode")
    }
    flags = torch.empty(n_blocks, dtype=torch.uint8, device=device)
    stream, base, inner_len, inner_stride, outer_stride = philox or (None, None, 1, 1, 0)
    explicit = random_bits is not None
    bits = random_bits.to(torch.int64).contiguous() if explicit else torch.zeros(1, dtype=torch.int64, device=device)
    base = (
        base.to(torch.int64).to(device).contiguous()
        if base is not None
        else torch.zeros(1, dtype=torch.int64, device=device)
    )
    k0, k1 = stream.key if stream is not None else (0, 0)
    scalars = torch.stack(
        [
            torch.as_tensor(v, dtype=torch.float32, device=device).reshape(())
            for v in (global_scale, global_decode_scale, per_tensor, tensor_amax, target_f)
        ]
    )  # device-side: nothing is read back to the host
    blocks_per_program = max(1, 1024 // max(triton.next_power_of_2(length), 1))
    launch = Launch(
        _quantize_kernel,
        (triton.cdiv(n_blocks, blocks_per_program),),
        (
            blocks,
            bits,
            base,
            payload,
            per_block["block_amax"],
            per_block["scales"],
            per_block["decode"],
            flags,
            n_blocks,
            scalars,
            scale_max,
            INV_SIX,
            k0 | (k1 << 32),
            stream.step if stream is not None else 0,
            stream.microbatch if stream is not None else 0,
            max(int(inner_len), 1),
            int(inner_stride),
            int(outer_stride),
        ),
        dict(
            L=length,
            L_POW2=triton.next_power_of_2(length),
            BLOCKS=blocks_per_program,
            RULE=_RULE_IDS[rule],
            ORDER=_ORDER_IDS[order],
            MODE=_ROUNDING_IDS[rounding],
            SCALE_MBITS=scale_mantissa_bits,
            SCALE_EMIN=scale_min_exponent,
            SCALE_EMAX=scale_max_exponent,
            ZERO_REPAIR=bool(zero_scale_repair),
            EXPLICIT_BITS=explicit,
            BIT_COUNT=_BIT_COUNTS[rounding],
            SELECTION=_SELECTION_IDS[selection],
            INDEX64=triton.cdiv(n_blocks, blocks_per_program) * blocks_per_program * length > INT32_LIMIT,
            enable_fp_fusion=False,
        ),
    )
    run([launch], device)
    return {"payload": payload, "flags": flags, **per_block}


@dataclass(frozen=True)
class AxisRequest:
    """One of the two quantizations :func:`quantize_both_axes` computes: its tensor scale (0-dim device tensors: G,
    1/G, torchao's divisor), its rounding, and for stochastic roundings its Philox stream with the global index of
    element (r, c) of x: ``base + r * stride_row + c * stride_col``."""

    global_scale: torch.Tensor
    global_decode_scale: torch.Tensor
    per_tensor: torch.Tensor
    rounding: str
    stream: object | None = None  # a ue5m3.numerics.philox.RandomStream
    base: int = 0
    stride_row: int = 0
    stride_col: int = 0
    tensor_amax: torch.Tensor | float = 0.0  # g and T * F: read by the 4/6 rule only
    target_f: float = 1.0


# rows, columns (multiples of every block size) and warps per program of the two-axis kernel: on a GPU, chosen from
# what ptxas reports (no spills: docs/performance.md, "Kernels as compiled"); in the interpreter, large for speed
TWO_AXIS_TILES = {"gpu": (32, 32, 4), "interpreter": (64, 64, 4)}


def quantize_both_axes(
    x: torch.Tensor,
    *,
    block: int,
    rule: str,
    order: str,
    scale_max: float,
    scale_mantissa_bits: int,
    scale_min_exponent: int,
    scale_max_exponent: int,
    zero_scale_repair: bool,
    last: AxisRequest | None,
    first: AxisRequest | None,
    selection: str | None = None,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor] | None]:
    """Block quantization of a 2-D FP32 ``x`` [rows, cols] (both multiples of ``block``) along its last axis
    (``last``) and along its first axis (``first``) from one read of x; either may be None (not computed).

    Returns, per requested axis, the outputs of :func:`quantize_blocks` on that axis's block view: ``last`` on
    [rows * cols / block, block] (rows of x), ``first`` on [cols * rows / block, block], the blocks of x's columns,
    i.e. of x.t()'s rows (the transposed copy a backward GEMM reads, written directly)."""
    if x.dtype != torch.float32 or x.ndim != 2:
        raise ValueError("the two-axis kernel takes a 2-D FP32 tensor")
    reason = usable(x.device)
    if reason is not None:
        raise ValueError(f"backend='triton' cannot run here: {reason}")
    rows, cols = x.shape
    tile_rows, tile_cols, warps = TWO_AXIS_TILES["interpreter" if x.device.type == "cpu" else "gpu"]
    if rows % block or cols % block or tile_rows % block:
        raise ValueError(f"the two-axis kernel needs both dimensions multiples of the block ({block}): {rows}x{cols}")
    x = x.contiguous()
    device = x.device

    def outputs(request: AxisRequest | None, blocks: int) -> dict[str, torch.Tensor] | None:
        if request is None:
            return None
        out = {k: torch.empty(blocks, dtype=torch.float32, device=device) for k in ("block_amax", "scales", "decode")}
        out["flags"] = torch.empty(blocks, dtype=torch.uint8, device=device)
        out["payload"] = torch.empty(blocks, block, dtype=torch.float32, device=device)
        return out

    def arguments(request: AxisRequest | None, out: dict | None) -> list:
        if request is None:  # placeholders of the right kinds; the kernel never touches them
            dummy = torch.zeros(5, dtype=torch.float32, device=device)
            return [dummy, dummy, dummy, dummy, dummy, dummy, 0, 0, 0, 0, 0, 0]
        scalars = torch.stack(
            [
                torch.as_tensor(v, dtype=torch.float32, device=device).reshape(())
                for v in (
                    request.global_scale,
                    request.global_decode_scale,
                    request.per_tensor,
                    request.tensor_amax,
                    request.target_f,
                )
            ]
        )
        stream = request.stream
        k0, k1 = stream.key if stream is not None else (0, 0)
        return [
            scalars,
            out["payload"],
            out["block_amax"],
            out["scales"],
            out["decode"],
            out["flags"],
            k0 | (k1 << 32),
            stream.step if stream is not None else 0,
            stream.microbatch if stream is not None else 0,
            int(request.base),
            int(request.stride_row),
            int(request.stride_col),
        ]

    last_out, first_out = outputs(last, rows * cols // block), outputs(first, rows * cols // block)
    launch = Launch(
        _quantize_both_axes_kernel,
        (triton.cdiv(rows, tile_rows), triton.cdiv(cols, tile_cols)),
        (x, rows, cols, scale_max, INV_SIX, *arguments(last, last_out), *arguments(first, first_out)),
        dict(
            L=block,
            TILE_ROWS=tile_rows,
            TILE_COLS=tile_cols,
            RULE=_RULE_IDS[rule],
            ORDER=_ORDER_IDS[order],
            SCALE_MBITS=scale_mantissa_bits,
            SCALE_EMIN=scale_min_exponent,
            SCALE_EMAX=scale_max_exponent,
            ZERO_REPAIR=bool(zero_scale_repair),
            LAST=last is not None,
            LAST_MODE=_ROUNDING_IDS[last.rounding] if last is not None else 0,
            LAST_BITS=_BIT_COUNTS[last.rounding] if last is not None else 0,
            FIRST=first is not None,
            FIRST_MODE=_ROUNDING_IDS[first.rounding] if first is not None else 0,
            FIRST_BITS=_BIT_COUNTS[first.rounding] if first is not None else 0,
            SELECTION=_SELECTION_IDS[selection],
            INDEX64=triton.cdiv(rows, tile_rows) * tile_rows * triton.cdiv(cols, tile_cols) * tile_cols > INT32_LIMIT,
            num_warps=warps,
            enable_fp_fusion=False,
        ),
    )
    run([launch] if last is not None or first is not None else [], device)
    return last_out, first_out
