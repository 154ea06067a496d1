/* Fused CPU kernel for block quantization with an E2M1 payload.
 *
 * Mirrors ue5m3.quantize (the torch reference path) operation for operation in IEEE FP32: compiled without
 * fast-math and with FP contraction off, so every product and sum is rounded exactly as the reference rounds
 * it. tests/test_cpu_kernel.py checks bit equality against the reference over every scheme, rounding mode
 * and the spec's tricky cases.
 *
 * Rounding onto a format with m fraction bits and minimum exponent emin: e = max(floor(log2 v), emin),
 * quantum 2^(e - m), s = v / quantum (exact power-of-two scaling), lower = floor(s), delta = s - lower.
 * Only formats whose quanta are normal FP32 powers of two are handled here (checked by the caller).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "philox.h"
#if defined(__AVX2__)
#include <immintrin.h>
#endif

enum { RNE = 0, RTZ = 1, SF = 2, SR_TE = 3, SR = 4 };
enum { ORDER_TE = 0, ORDER_TE_LEGACY = 1, ORDER_TORCHAO = 2 };
enum { RULE_TENSOR_SCALED = 0, RULE_MX_FLOOR = 1, RULE_MX_CEIL = 2, RULE_MX_RCEIL = 3, RULE_FOUR_OVER_SIX = 4 };
enum { SELECT_MAE = 0, SELECT_MSE = 1, SELECT_ABS_MAX = 2 };

static inline uint32_t bits_of(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float float_of(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }
/* 2^k for k in [-127, 127]; 2^-127 is an FP32 subnormal (the UE8M0 minimum). */
static inline float pow2(int k) { return k >= -126 ? float_of((uint32_t)(k + 127) << 23) : float_of(1u << 22); }

/* a if c else b, branch-free (bit masks), so loops that use it vectorise */
static inline float select_f(int c, float a, float b) {
    uint32_t mask = (uint32_t)-(int32_t)(c != 0);
    return float_of((bits_of(a) & mask) | (bits_of(b) & ~mask));
}

static inline int quantum_exponent(float v, int mbits, int emin) {
    int e = (int)((bits_of(v) >> 23) & 0xFF) - 127; /* FP32 subnormals and zero fall below emin */
    return (e < emin ? emin : e) - mbits;
}

/* Round a non-negative finite magnitude; r is the element's random integer (ignored by RNE/RTZ). */
static inline float round_magnitude(float v, int mbits, int emin, float maxf, int mode, uint64_t r) {
    if (v > maxf) v = maxf;
    int q = quantum_exponent(v, mbits, emin);
    if (mode == SR_TE) {
        /* Transformer Engine's stochastic_round_fp4_e2m1: t = fma(r/256, step, v), floored in units of step(t). */
        float t = fmaf((float)r * (1.0f / 256.0f), pow2(q), v);
        int qt = quantum_exponent(t, mbits, emin);
        float out = floorf(t * pow2(-qt)) * pow2(qt);
        return out > maxf ? maxf : out;
    }
    float s = v * pow2(-q);
    float lower = (float)(int32_t)s; /* s >= 0: truncation is floor */
    float delta = s - lower;
    int up;
    switch (mode) {
    case RNE: up = delta > 0.5f || (delta == 0.5f && (((int32_t)lower) & 1)); break;
    case RTZ: up = 0; break;
    case SF: up = delta + (float)(2 * r + 1) * (1.0f / 512.0f) >= 1.0f; break; /* one FP32 addition */
    default: up = (double)r < (double)delta * 9007199254740992.0; break; /* 2^53 */
    }
    float out = (lower + (float)up) * pow2(q);
    return out > maxf ? maxf : out;
}

/* The tensor-scaled block scale of an ideal scale u: capped at the format's max, RNE onto it, zero repaired. */
static float format_scale(float ideal, float target_scale_max, int scale_mbits, int scale_emin, int zero_repair,
                          uint8_t *flag) {
    *flag = 0;
    if (ideal > target_scale_max) *flag |= 2;
    float scale = round_magnitude(ideal, scale_mbits, scale_emin, target_scale_max, RNE, 0);
    if (scale == 0.0f) {
        *flag |= 1;
        if (zero_repair) scale = 1.0f;
    }
    return scale;
}

/* 4/6's error of one candidate scale: the RNE payload dequantized as ((p * S) * g) / (T * F), minus x; summed in the
 * order of torch's CPU sum of a contiguous row (ue5m3.numerics.scale_rules.block_error_sum): for 16 elements lanes
 * k and k + 8 first, then the eight lanes in order; for 256, four accumulators of eight 8-lane vectors each. */
static float candidate_error(const float *xb, int64_t L, float scale, float global_decode_scale, float g,
                             float target_f, int selection) {
    const float fp32_max = 3.4028234663852886e38f;
    float mult = 1.0f / (scale * global_decode_scale);
    if (mult > fp32_max) mult = fp32_max;
    float e[256];
    float worst = 0.0f;
    for (int64_t i = 0; i < L; ++i) {
        float v = xb[i] * mult;
        if (v > 6.0f) v = 6.0f;
        if (v < -6.0f) v = -6.0f;
        float mag = round_magnitude(float_of(bits_of(v) & 0x7FFFFFFFu), 1, 0, 6.0f, RNE, 0);
        float p = float_of(bits_of(mag) | (bits_of(v) & 0x80000000u));
        float d = ((p * scale) * g) / target_f - xb[i];
        float a = d < 0 ? -d : d;
        e[i] = selection == SELECT_MSE ? d * d : a;
        worst = a > worst ? a : worst;
    }
    if (selection == SELECT_ABS_MAX) return worst;
    float lanes[8];
    if (L == 16) {
        for (int k = 0; k < 8; ++k) lanes[k] = e[k] + e[k + 8];
    } else { /* 256 */
        float acc[4][8];
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < 8; ++l) {
                float t = e[k * 8 + l];
                for (int i = 1; i < 8; ++i) t = t + e[(4 * i + k) * 8 + l];
                acc[k][l] = t;
            }
        for (int l = 0; l < 8; ++l) lanes[l] = ((acc[0][l] + acc[1][l]) + acc[2][l]) + acc[3][l];
    }
    float total = lanes[0];
    for (int k = 1; k < 8; ++k) total = total + lanes[k];
    return total;
}

/* Quantize nblocks contiguous blocks of length L.
 *
 * x: input (nblocks * L); payload: E2M1 values out; block_amax, scale_values, decode_scales: per-block outputs;
 * flags: per block, bit 0 = scale rounded to zero before repair, bit 1 = ideal scale saturated, bit 2 = the block
 * underflowed (a nonzero amax and a nonzero scale, and every payload element zero: its values are lost).
 * Stochastic modes take explicit random_bits (nblocks * L) or, when that is NULL, draw Philox bits of `stream`
 * at each element's global index base[b] + (p / inner_len) * outer_stride + (p % inner_len) * inner_stride.
 */
#define GROUP 16

/* The largest |x| of a block (+0.0 for an all-zero one). Inputs are finite (the caller checks), so the order of the
 * comparisons does not matter: vmaxps(a, m) is a > m ? a : m, lane by lane, as the scalar loop. */
static inline float largest_magnitude(const float *restrict xb, int64_t L) {
#if defined(__AVX2__)
    if (L == 16) {
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
        __m256 m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb), magnitude),
                                 _mm256_and_ps(_mm256_loadu_ps(xb + 8), magnitude));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        return _mm_cvtss_f32(h) + 0.0f; /* +0.0 for an all-zero block, as the scalar loop */
    }
#endif
    float amax = 0.0f;
    for (int64_t i = 0; i < L; ++i) {
        float a = xb[i] < 0 ? -xb[i] : xb[i];
        amax = a > amax ? a : amax;
    }
    return amax;
}

static inline __attribute__((always_inline)) void quantize_block(
    const float *restrict xb, int64_t L, int rule, int order, float global_scale, float global_decode_scale,
    float per_tensor, float target_scale_max, int scale_mbits, int scale_emin, int scale_emax, int zero_repair,
    int mode, const int64_t *bits, const uint32_t *words, const philox_stream *stream, int64_t base,
    int64_t inner_len, int64_t inner_stride, int64_t outer_stride, float *restrict pb, float *amax_out,
    float *scale_out, float *decode_out, uint8_t *flag_out, int selection, float g, float target_f) {
    const float element_max = 6.0f;
    const float inv_f = 1.0f / 6.0f; /* the FP32 constant 1/F */
    const float fp32_max = 3.4028234663852886e38f;
    float amax = largest_magnitude(xb, L);
    float scale;
    uint8_t flag = 0;
    if (rule == RULE_TENSOR_SCALED || rule == RULE_FOUR_OVER_SIX) {
        float ideal;
        if (order == ORDER_TE) ideal = amax * (global_scale * inv_f);
        else if (order == ORDER_TE_LEGACY) ideal = (amax / element_max) * global_scale;
        else ideal = (amax / element_max) / per_tensor;
        scale = format_scale(ideal, target_scale_max, scale_mbits, scale_emin, zero_repair, &flag);
        if (rule == RULE_FOUR_OVER_SIX) {
            /* the 4-candidate: the 6-candidate's ideal times 1.5; kept where its error is strictly lower */
            uint8_t flag4;
            float four = format_scale(ideal * 1.5f, target_scale_max, scale_mbits, scale_emin, zero_repair, &flag4);
            float error4 = candidate_error(xb, L, four, global_decode_scale, g, target_f, selection);
            float error6 = candidate_error(xb, L, scale, global_decode_scale, g, target_f, selection);
            if (error4 < error6) {
                scale = four;
                flag = flag4;
            }
        }
    } else {
        int e;
        if (rule == RULE_MX_RCEIL) {
            /* exponent of amax * fp32(1/6) rounded up from its bits; subnormals only above 2^-127 */
            uint32_t db = bits_of(amax * inv_f);
            uint32_t biased = (db >> 23) & 0xFF, mantissa = db & 0x7FFFFF;
            e = (int)biased + (biased == 0 ? mantissa > 0x400000 : mantissa != 0) - 127;
        } else {
            uint32_t ab = bits_of(amax);
            e = (int)((ab >> 23) & 0xFF) - 127;
            if (rule == RULE_MX_CEIL && (ab & 0x7FFFFF)) e += 1;
            e -= 2; /* E2M1 max exponent */
        }
        if (e > scale_emax) { flag |= 2; e = scale_emax; }
        if (e < scale_emin) e = scale_emin;
        scale = pow2(e);
    }
    float decode = scale * global_decode_scale;
    float mult = 1.0f / decode;
    if (mult > fp32_max) mult = fp32_max;
    *amax_out = amax;
    *scale_out = scale;
    *decode_out = decode;
    *flag_out = flag;
    if (mode == RNE) {
        /* E2M1 RNE as a sum of steps at the midpoints; ">" where the tie goes down to the even code,
         * ">=" where it goes up. Equal to round_magnitude(.., RNE) for every input and vectorizable. */
        for (int64_t i = 0; i < L; ++i) {
            float v = xb[i] * mult;
            float m = float_of(bits_of(v) & 0x7FFFFFFFu);
            float r = 0.5f * (float)(m > 0.25f) + 0.5f * (float)(m >= 0.75f) + 0.5f * (float)(m > 1.25f) +
                      0.5f * (float)(m >= 1.75f) + (float)(m > 2.5f) + (float)(m >= 3.5f) +
                      2.0f * (float)(m > 5.0f);
            pb[i] = float_of(bits_of(r) | (bits_of(v) & 0x80000000u)); /* copysign, -0.0 included */
        }
        return;
    }
    if (words && stream->bit_count == 8 && (mode == SF || mode == SR_TE)) {
        /* Fast path: lane i of the block reads word i (4 elements per counter, consecutive indices); E2M1 grid
         * steps are 0.5 / 1 / 2 below 2 / 4 / 8, written as selects so the loop vectorises. The same operations
         * as round_magnitude(.., 1, 0, 6, mode, r). */
        if (mode == SF) {
            for (int64_t i = 0; i < L; ++i) {
                float v = xb[i] * mult;
                uint32_t sign = bits_of(v) & 0x80000000u;
                float m = float_of(bits_of(v) & 0x7FFFFFFFu);
                m = select_f(m > element_max, element_max, m);
                float r = (float)(int32_t)(words[i] >> 24);
                float step = select_f(m >= 4.0f, 2.0f, select_f(m >= 2.0f, 1.0f, 0.5f));
                float inv = select_f(m >= 4.0f, 0.5f, select_f(m >= 2.0f, 1.0f, 2.0f));
                float s = m * inv;
                float lower = (float)(int32_t)s; /* s >= 0: truncation is floor */
                float delta = s - lower;
                float up = (float)(delta + (2.0f * r + 1.0f) * (1.0f / 512.0f) >= 1.0f);
                float out = (lower + up) * step;
                out = select_f(out > element_max, element_max, out);
                pb[i] = float_of(bits_of(out) | sign);
            }
        } else {
            for (int64_t i = 0; i < L; ++i) {
                float v = xb[i] * mult;
                uint32_t sign = bits_of(v) & 0x80000000u;
                float m = float_of(bits_of(v) & 0x7FFFFFFFu);
                m = select_f(m > element_max, element_max, m);
                float r = (float)(int32_t)(words[i] >> 24);
                float step = select_f(m >= 4.0f, 2.0f, select_f(m >= 2.0f, 1.0f, 0.5f));
                float t = fmaf(r * (1.0f / 256.0f), step, m);
                float step_t = select_f(t >= 4.0f, 2.0f, select_f(t >= 2.0f, 1.0f, 0.5f));
                float inv_t = select_f(t >= 4.0f, 0.5f, select_f(t >= 2.0f, 1.0f, 2.0f));
                float out = (float)(int32_t)(t * inv_t) * step_t; /* t >= 0: truncation is floor */
                out = select_f(out > element_max, element_max, out);
                pb[i] = float_of(bits_of(out) | sign);
            }
        }
        return;
    }
    int per = stream ? philox_per_counter(stream->bit_count) : 1;
    for (int64_t i = 0; i < L; ++i) {
        float v = xb[i] * mult;
        if (v > element_max) v = element_max;
        if (v < -element_max) v = -element_max;
        uint64_t r = 0;
        if (bits) r = (uint64_t)bits[i];
        else if (words) r = philox_bits_of(words + 4 * (i / per), (int)(i % per), stream->bit_count);
        else if (stream)
            r = philox_element_bits(stream, (uint64_t)(base + (i / inner_len) * outer_stride + (i % inner_len) * inner_stride));
        float mag = round_magnitude(float_of(bits_of(v) & 0x7FFFFFFFu), 1, 0, element_max, mode, r);
        pb[i] = float_of(bits_of(mag) | (bits_of(v) & 0x80000000u));
    }
}

/* x is read as a strided block view (A, B, L): block b starts at (b / B) * stride_a + (b % B) * stride_b and its
 * elements lie stride_l apart (a transposed operand's blocks along tokens, read in place); stride_l == 1 and
 * stride_b == L with B == nblocks is the contiguous case. Blocks of a strided view are gathered first, so every
 * operation after the read is the contiguous one. */
#define MAX_GATHERED 512

void ue5m3_quantize_blocks(const float *x, int64_t nblocks, int64_t L, int64_t inner_blocks, int64_t stride_a,
                           int64_t stride_b, int64_t stride_l, int rule, int order, float global_scale,
                           float global_decode_scale, float per_tensor, float target_scale_max, int scale_mbits,
                           int scale_emin, int scale_emax, int zero_repair, int mode, const int64_t *random_bits,
                           int use_philox, uint32_t k0, uint32_t k1, uint32_t step, uint32_t microbatch,
                           int bit_count, const int64_t *block_base, int64_t inner_len, int64_t inner_stride,
                           int64_t outer_stride, float *payload, float *block_amax, float *scale_values,
                           float *decode_scales, uint8_t *flags, int selection, float tensor_amax, float target_f) {
    philox_stream stream = {k0, k1, step, microbatch, bit_count};
    const philox_stream *sp = use_philox && mode != RNE && mode != RTZ ? &stream : NULL;
    int per = sp ? philox_per_counter(bit_count) : 1;
    int64_t groups = (nblocks + GROUP - 1) / GROUP;
#pragma omp parallel for schedule(static) if (nblocks >= 2048)
    for (int64_t g = 0; g < groups; ++g) {
        int64_t b0 = g * GROUP, b1 = b0 + GROUP < nblocks ? b0 + GROUP : nblocks;
        uint32_t words[4 * PHILOX_MAX_COUNTERS];
        float gathered[MAX_GATHERED];
        /* Fast path: the group's elements have consecutive global indices starting on a counter boundary, so
         * one vectorised fill serves every block of the group. */
        int filled = 0;
        if (sp && inner_stride == 1 && inner_len >= L && L % per == 0 && block_base[b0] % per == 0 &&
            (b1 - b0) * L / per <= PHILOX_MAX_COUNTERS) {
            filled = 1;
            for (int64_t b = b0 + 1; b < b1 && filled; ++b) filled = block_base[b] == block_base[b0] + (b - b0) * L;
            if (filled) philox_fill(sp, (uint64_t)(block_base[b0] / per), (int)((b1 - b0) * L / per), words);
        }
        int64_t outer = b0 / inner_blocks, inner = b0 % inner_blocks; /* block b0's place in the view */
        for (int64_t b = b0; b < b1; ++b) {
            const float *xb = x + outer * stride_a + inner * stride_b;
            if (++inner == inner_blocks) {
                inner = 0;
                ++outer;
            }
            if (stride_l != 1) {
                for (int64_t i = 0; i < L; ++i) gathered[i] = xb[i * stride_l];
                xb = gathered;
            }
            /* a block whose elements' counters are not consecutive (a strided view's): its words from one vectorised
             * fill over its elements' global indices, in place of a scalar Philox evaluation per element */
            const uint32_t *block_words = filled ? words + 4 * ((b - b0) * L / per) : NULL;
            if (sp && !filled && L <= PHILOX_MAX_COUNTERS) {
                uint64_t index[PHILOX_MAX_COUNTERS];
                for (int64_t i = 0; i < L; ++i)
                    index[i] = (uint64_t)(block_base[b] + (i / inner_len) * outer_stride + (i % inner_len) * inner_stride);
                philox_fill_elements(sp, index, (int)L, words);
                block_words = words;
            }
            /* blocks of 16 (the recipes' usual length) get their own copy with the length a constant */
#define QUANTIZE_BLOCK(length)                                                                                  \
    quantize_block(xb, length, rule, order, global_scale, global_decode_scale, per_tensor, target_scale_max,      \
                   scale_mbits, scale_emin, scale_emax, zero_repair, mode, random_bits ? random_bits + b * L : NULL, \
                   block_words, sp, sp ? block_base[b] : 0, inner_len,                                             \
                   inner_stride, outer_stride, payload + b * L, block_amax + b, scale_values + b,                 \
                   decode_scales + b, flags + b, selection, tensor_amax, target_f)
            if (L == 16)
                QUANTIZE_BLOCK(16);
            else
                QUANTIZE_BLOCK(L);
#undef QUANTIZE_BLOCK
        }
        for (int64_t b = b0; b < b1; ++b) { /* bit 2 from the block just written (still in cache) */
            if (!(block_amax[b] > 0.0f && scale_values[b] > 0.0f)) continue;
            const uint32_t *pb = (const uint32_t *)(payload + b * L);
            uint32_t magnitudes = 0; /* any nonzero magnitude bit: +-0.0 are the only zeros */
            for (int64_t i = 0; i < L; ++i) magnitudes |= pb[i] & 0x7FFFFFFFu;
            if (!magnitudes) flags[b] |= 4;
        }
    }
}

/* Scale telemetry of a stochastically rounded quantization (ue5m3.layers.telemetry.observe) in one pass: the
 * elements of the FP32 blocks x (nblocks, L) in round to nearest's dead zone, |x * min(1 / decode, FP32 max)| <= 1/4
 * with x != 0 (the scaled value formed as the encoder forms it), into out[0], and how many of those the payload kept
 * nonzero into out[1]. */
void ue5m3_dead_zone_counts(const float *x, const float *decode_scales, const float *payload, int64_t nblocks,
                            int64_t L, int64_t *out) {
    int64_t dead = 0, rescued = 0;
    for (int64_t b = 0; b < nblocks; ++b) {
        float reciprocal = 1.0f / decode_scales[b];
        if (reciprocal > 3.40282346638528859812e+38f) reciprocal = 3.40282346638528859812e+38f;
        const float *xb = x + b * L, *pb = payload + b * L;
        for (int64_t i = 0; i < L; ++i) {
            const int in_zone = fabsf(xb[i] * reciprocal) <= 0.25f && xb[i] != 0.0f;
            dead += in_zone;
            rescued += in_zone & (pb[i] != 0.0f);
        }
    }
    out[0] = dead;
    out[1] = rescued;
}

/* E2M1 storage form (QuantizedTensor.pack / PackedQuantized.unpack): codes two per byte, element 2i in the low
 * nibble, sign in bit 3. The codes are formats.e2m1_codes' (a table on the truncated 2|v| of an E2M1 value, the sign
 * from its sign bit, -0.0 included); decoding is the E2M1 value table, code 8 being -0.0. */
static const uint8_t e2m1_code_of_twice[13] = {0, 1, 2, 3, 4, 0, 5, 0, 6, 0, 0, 0, 7};
static const float e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

static inline uint8_t e2m1_code(float v) {
    uint32_t b = bits_of(v);
    int twice = (int)(float_of(b & 0x7FFFFFFFu) * 2.0f); /* E2M1 values: 0..12, exact */
    return (uint8_t)(e2m1_code_of_twice[twice] | ((b >> 31) << 3));
}

void ue5m3_pack_e2m1(const float *payload, int64_t pairs, uint8_t *out) {
    for (int64_t p = 0; p < pairs; ++p)
        out[p] = (uint8_t)(e2m1_code(payload[2 * p]) | (e2m1_code(payload[2 * p + 1]) << 4));
}

/* The codes of FP32 values a scale format holds exactly (QuantizedTensor.pack's scale codes, formats.codes_of_values'
 * bits): for a value normal in the format, its exponent field (exponent - min_exponent + 1) over the top
 * mantissa_bits of its FP32 fraction; for one of its subnormals (and zero), field 0 over the integer significand
 * value * 2^(mantissa_bits - min_exponent); the sign bit where the format has one. The caller passes a format with
 * subnormals, at most 8 bits and min_exponent >= -126, so every value is zero or a normal FP32 number. */
void ue5m3_scale_codes(const float *values, int64_t n, int mantissa_bits, int min_exponent, uint32_t sign_bit,
                       uint8_t *out) {
    const int shift = 23 - mantissa_bits;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t bits;
        memcpy(&bits, &values[i], sizeof bits);
        const uint32_t magnitude = bits & 0x7FFFFFFFu;
        const int exponent = (int)(magnitude >> 23) - 127;
        uint32_t code = 0;
        if (magnitude != 0 && exponent >= min_exponent)
            code = ((uint32_t)(exponent - min_exponent + 1) << mantissa_bits) | ((magnitude & 0x7FFFFFu) >> shift);
        else if (magnitude != 0)
            code = ((magnitude & 0x7FFFFFu) | 0x800000u) >> (shift + min_exponent - exponent);
        if (bits >> 31) code |= sign_bit;
        out[i] = (uint8_t)code;
    }
}

void ue5m3_unpack_e2m1(const uint8_t *codes, int64_t pairs, float *out) {
    for (int64_t p = 0; p < pairs; ++p) {
        out[2 * p] = e2m1_values[codes[p] & 0x0F];
        out[2 * p + 1] = e2m1_values[codes[p] >> 4];
    }
}
