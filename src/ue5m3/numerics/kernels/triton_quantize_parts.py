"""The building blocks both block-quantization kernels share (:mod:`ue5m3.numerics.kernels.triton_quantize`'s
one-axis and both-axes kernels): 32- or 64-bit indices, the scale rules (the ideal scale in each tensor-scaled
order, RNE onto the scale format with zero-scale repair, OCP floor, ceil and RCEIL, 4/6 selection by its error),
Philox4x32-10 bits at each element's global index, E2M1 rounding in every mode, and the stored block diagnostics.
The same FP32 operations in the same order as the torch reference and the C kernel.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ue5m3.numerics.kernels.launch import check_triton_version

check_triton_version(triton.__version__)  # refused at import: a Triton the kernels are not tested with

__all__ = [
    "FP32_MAX",
    "pow2",
    "as_index",
    "round_scale_rne",
    "philox_bits",
    "tile_bits",
    "round_e2m1",
    "scales_of",
    "ideal_scale",
    "format_scale",
    "candidate_error",
    "four_over_six_scales",
    "store_blocks",
]

FP32_MAX = tl.constexpr(3.4028234663852886e38)  # a constexpr global: kernels may read only those


@triton.jit
def pow2(k):
    """2^k for integer k in [-126, 127] as FP32, from its exponent bits (exact)."""
    return ((k + 127).to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def as_index(v, INDEX64: tl.constexpr):
    """Indices as the offsets' integer type: 64-bit only where the launch found a tensor too large for 32 bits."""
    if INDEX64:
        return v.to(tl.int64)
    else:
        return v


@triton.jit
def round_scale_rne(v, mbits, emin, maxf):
    """RNE of non-negative v onto a format with mbits fraction bits and minimum exponent emin, saturated."""
    v = tl.minimum(v, maxf)
    e = ((v.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    e = tl.maximum(e, emin)
    q = e - mbits
    s = v * pow2(-q)
    lower = s.to(tl.int32).to(tl.float32)  # s >= 0: truncation is floor
    delta = s - lower
    odd = (s.to(tl.int32) & 1) == 1
    up = (delta > 0.5) | ((delta == 0.5) & odd)
    out = (lower + up.to(tl.float32)) * pow2(q)
    return tl.minimum(out, maxf)


@triton.jit
def philox_bits(index, seed, step, microbatch, BIT_COUNT: tl.constexpr):
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
def tile_bits(r, c, base, stride_row, stride_col, seed, step, microbatch, MODE: tl.constexpr, BIT_COUNT: tl.constexpr):
    """The random integers of the tile (rows r, columns c) of a stochastic ``MODE`` (zeros otherwise): element (r, c)
    draws at global index base + r * stride_row + c * stride_col."""
    bits = tl.zeros([r.shape[0], c.shape[0]], dtype=tl.int64)
    if MODE >= 2:
        index = base + r[:, None].to(tl.int64) * stride_row + c[None, :].to(tl.int64) * stride_col
        bits = philox_bits(index, seed, step, microbatch, BIT_COUNT)
    return bits


@triton.jit
def round_e2m1(v, r, MODE: tl.constexpr):
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
def scales_of(
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
        ideal = ideal_scale(amax, global_scale, per_tensor, inv_f, ORDER)
        scale, flag = format_scale(ideal, scale_max, SCALE_MBITS, SCALE_EMIN, ZERO_REPAIR)
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
        scale = tl.where(e >= -126, pow2(tl.maximum(e, -126)), subnormal)
    decode = scale * global_decode_scale
    mult = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), decode), FP32_MAX)
    return scale, flag, decode, mult


@triton.jit
def ideal_scale(amax, global_scale, per_tensor, inv_f, ORDER: tl.constexpr):
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
def format_scale(ideal, scale_max, SCALE_MBITS: tl.constexpr, SCALE_EMIN: tl.constexpr, ZERO_REPAIR: tl.constexpr):
    """(scale, flags) of ideal tensor-scaled block scales: capped, RNE onto the format, zero repaired."""
    flag = tl.where(ideal > scale_max, 2, 0)
    scale = round_scale_rne(ideal, SCALE_MBITS, SCALE_EMIN, scale_max)
    zero = scale == 0.0
    flag = tl.where(zero, flag | 1, flag)
    if ZERO_REPAIR:
        scale = tl.where(zero, 1.0, scale)
    return scale, flag


@triton.jit
def candidate_error(
    blocks, scale, global_decode_scale, g, target_f, lane, SELECTION: tl.constexpr, AXIS: tl.constexpr, L: tl.constexpr
):
    """4/6's block error of candidate scales ``scale`` (the block shape without ``AXIS``) over ``blocks``: the RNE
    payload dequantized as ((p * S) * g) / (T * F), minus x, summed along ``AXIS`` in the order of
    ``scale_rules.block_error_sum`` (``lane``: each element's position in its block, broadcast like ``blocks``).
    A masked sum of one or two nonzero terms and zeros is those terms' one FP32 sum, so each lane is exact."""
    mult = tl.minimum(tl.math.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale * global_decode_scale), FP32_MAX)
    s = tl.expand_dims(scale, AXIS)
    payload = round_e2m1(blocks * tl.expand_dims(mult, AXIS), tl.zeros(blocks.shape, dtype=tl.int64), 0)
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
def four_over_six_scales(
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
    ideal = ideal_scale(amax, global_scale, per_tensor, inv_f, ORDER)
    six, flag6 = format_scale(ideal, scale_max, SCALE_MBITS, SCALE_EMIN, ZERO_REPAIR)
    four, flag4 = format_scale(ideal * 1.5, scale_max, SCALE_MBITS, SCALE_EMIN, ZERO_REPAIR)
    error6 = candidate_error(blocks, six, global_decode_scale, g, target_f, lane, SELECTION, AXIS, L)
    error4 = candidate_error(blocks, four, global_decode_scale, g, target_f, lane, SELECTION, AXIS, L)
    take_four = error4 < error6
    scale = tl.where(take_four, four, six)
    flag = tl.where(take_four, flag4, flag6)
    decode = scale * global_decode_scale
    mult = tl.minimum(tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), decode), FP32_MAX)
    return scale, flag, decode, mult


@triton.jit
def store_blocks(amax_ptr, scale_ptr, decode_ptr, flags_ptr, at, ok, amax, scale, decode, flag):
    """The per-block outputs at offsets ``at`` where ``ok``."""
    tl.store(amax_ptr + at, amax, mask=ok)
    tl.store(scale_ptr + at, scale, mask=ok)
    tl.store(decode_ptr + at, decode, mask=ok)
    tl.store(flags_ptr + at, flag.to(tl.uint8), mask=ok)
