/* The probe-matched GEMM model of ue5m3.gemm as one fused CPU kernel.
 *
 * Slice sums are rounded once to FP32 (RNE conversion of an exact FP64 sum) and added to the accumulator
 * with FP32 additions rounded toward zero (rtz = 1) or to nearest even (rtz = 0). The RTZ addition is the TwoSum
 * construction of ue5m3.gemm.add_rtz: the RNE sum s and its exact error e; if e != 0 points back toward zero,
 * step s one ulp toward zero (for s != 0 that is the integer bit pattern minus one). Built without fast-math
 * and with FP contraction off, so every operation rounds exactly as the torch reference.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define UE5M3_AVX2 1
#else
#define UE5M3_AVX2 0
#endif
/* AVX-512 (F, DQ, VL) replaces the AVX2 micro-kernels with ones twice as wide; the driver and packing are shared. */
#if UE5M3_AVX2 && defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define UE5M3_AVX512 1
#else
#define UE5M3_AVX512 0
#endif

static inline uint32_t f2u(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float u2f(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }

/* The torch path's last two steps in FP32: snap to the 1/grid lattice with ties to even (grid > 0; multiplying and
 * dividing by a power of two is exact), then times alpha. */
static inline float finish(float v, float grid, float alpha) {
    if (grid > 0.0f) v = nearbyintf(v * grid) / grid;
    return v * alpha;
}

static inline float add_rtz(float a, float b) {
    float s = a + b;
    float bb = s - a;
    float err = (a - (s - bb)) + (b - bb);
    int overshoot = err != 0.0f && ((f2u(err) ^ f2u(s)) >> 31);
    return overshoot ? u2f(f2u(s) - 1u) : s;
}

#if UE5M3_AVX2
/* AVX2 + FMA path. Fused multiply-adds are exact here: every product of two encoded operands is exact in FP64
 * (at most 8 significant bits each) and the caller guarantees every partial sum of a slice is exact too, so
 * fma(a, b, s) = a * b + s with no rounding, whatever the order. 6 rows x 8 columns of FP64 slice sums live in 12
 * registers; A and B are packed into K-major micro-panels (zero-padded) so the inner loop streams them. */
#if UE5M3_AVX512
#define AMR 8 /* 8 independent FMA chains of 512-bit lanes, 24 of the 32 registers in the payload kernel */
#else
#define AMR 6
#endif
#define ANR 8

/* finish() on 8 lanes: the same FP32 multiply, round to nearest even, divide and multiply. */
static inline __m256 finish8(__m256 v, float grid, float alpha) {
    if (grid > 0.0f) {
        const __m256 g = _mm256_set1_ps(grid);
        v = _mm256_div_ps(_mm256_round_ps(_mm256_mul_ps(v, g), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), g);
    }
    return _mm256_mul_ps(v, _mm256_set1_ps(alpha));
}

static inline __m256 add_rtz8(__m256 a, __m256 b) {
    __m256 s = _mm256_add_ps(a, b);
    __m256 bb = _mm256_sub_ps(s, a);
    __m256 err = _mm256_add_ps(_mm256_sub_ps(a, _mm256_sub_ps(s, bb)), _mm256_sub_ps(b, bb));
    __m256 nonzero = _mm256_cmp_ps(err, _mm256_setzero_ps(), _CMP_NEQ_OQ);
    __m256i opposite = _mm256_srai_epi32(_mm256_castps_si256(_mm256_xor_ps(err, s)), 31); /* sign(err) != sign(s) */
    __m256 overshoot = _mm256_and_ps(nonzero, _mm256_castsi256_ps(opposite));
    __m256 stepped = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(s), _mm256_set1_epi32(1)));
    return _mm256_blendv_ps(s, stepped, overshoot);
}

#if UE5M3_AVX512
/* One AMR x 8 tile over kc (a multiple of width) K-steps, one 8-lane FP64 register per row; the same exact sums as
 * the AVX2 kernel (every FMA is exact, so neither the lane width nor the order changes a bit). */
static void micro_encoded(const double *ap, const double *bp, int64_t kc, int64_t width, int rtz, float *acc) {
    for (int64_t s = 0; s < kc; s += width) {
        __m512d c[AMR];
        for (int r = 0; r < AMR; ++r) c[r] = _mm512_setzero_pd();
        const double *a = ap + s * AMR, *b = bp + s * ANR;
        for (int64_t k = 0; k < width; ++k, a += AMR, b += ANR) {
            __m512d b0 = _mm512_loadu_pd(b);
            for (int r = 0; r < AMR; ++r) c[r] = _mm512_fmadd_pd(_mm512_set1_pd(a[r]), b0, c[r]);
        }
        for (int r = 0; r < AMR; ++r) {
            __m256 p = _mm512_cvtpd_ps(c[r]); /* each slice sum rounded once to FP32 (RNE conversion) */
            __m256 cur = _mm256_loadu_ps(acc + r * ANR);
            _mm256_storeu_ps(acc + r * ANR, rtz ? add_rtz8(cur, p) : _mm256_add_ps(cur, p));
        }
    }
}
#else
/* One 6 x 8 tile over kc (a multiple of width) K-steps; acc (6 x 8 floats) carries the FP32 accumulator. */
static void micro_encoded(const double *ap, const double *bp, int64_t kc, int64_t width, int rtz, float *acc) {
    for (int64_t s = 0; s < kc; s += width) {
        __m256d c00 = _mm256_setzero_pd(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
        __m256d c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
        const double *a = ap + s * AMR, *b = bp + s * ANR;
        for (int64_t k = 0; k < width; ++k, a += AMR, b += ANR) {
            __m256d b0 = _mm256_loadu_pd(b), b1 = _mm256_loadu_pd(b + 4), x;
            x = _mm256_broadcast_sd(a + 0); c00 = _mm256_fmadd_pd(x, b0, c00); c01 = _mm256_fmadd_pd(x, b1, c01);
            x = _mm256_broadcast_sd(a + 1); c10 = _mm256_fmadd_pd(x, b0, c10); c11 = _mm256_fmadd_pd(x, b1, c11);
            x = _mm256_broadcast_sd(a + 2); c20 = _mm256_fmadd_pd(x, b0, c20); c21 = _mm256_fmadd_pd(x, b1, c21);
            x = _mm256_broadcast_sd(a + 3); c30 = _mm256_fmadd_pd(x, b0, c30); c31 = _mm256_fmadd_pd(x, b1, c31);
            x = _mm256_broadcast_sd(a + 4); c40 = _mm256_fmadd_pd(x, b0, c40); c41 = _mm256_fmadd_pd(x, b1, c41);
            x = _mm256_broadcast_sd(a + 5); c50 = _mm256_fmadd_pd(x, b0, c50); c51 = _mm256_fmadd_pd(x, b1, c51);
        }
        const __m256d lo[AMR] = {c00, c10, c20, c30, c40, c50}, hi[AMR] = {c01, c11, c21, c31, c41, c51};
        for (int r = 0; r < AMR; ++r) {
            /* each slice sum rounded once to FP32 (RNE conversion), then combined in K order */
            __m256 p = _mm256_set_m128(_mm256_cvtpd_ps(hi[r]), _mm256_cvtpd_ps(lo[r]));
            __m256 c = _mm256_loadu_ps(acc + r * ANR);
            _mm256_storeu_ps(acc + r * ANR, rtz ? add_rtz8(c, p) : _mm256_add_ps(c, p));
        }
    }
}
#endif

#define KC 256 /* K-steps per pass over a tile (a multiple of every slice width used; checked below) */

/* The payload path: FP32 fused multiply-adds on A's encoded values (payload * scale, <= 8 bits) and B's values,
 * packed fully encoded where every sub-block sum stays in FP32's range (fully_encoded_b_exact), else as payload
 * times its scale's significand (<= 8 bits) with the scale's exponent kept apart. Inside a 16-element sub-block
 * both scales are constant, so the 16 products are integers of one quantum and every partial sum stays below 2^24
 * quanta: exact in FP32. At each sub-block's end the sum is widened (times B's scale exponent 2^e where kept
 * apart, exact) and added to the FP64 slice sum (exact by the caller's span check), which is rounded once to FP32
 * per slice. A tile's slice whose operands' bounds show every partial sum exact in FP32 (slice_exact_in_fp32, with
 * B fully encoded) skips the sub-block ends and FP64 altogether: its FP32 FMA sum is the exact slice sum. */
#define PNR 16
#define SUB 16

/* What decides whether a tile's slice may be summed in FP32 in one go (the whole-slice path), from the operands'
 * own values. Per A row (B column) and slice: every encoded value is a multiple of the quantum q = min over its
 * blocks of the scale's lowest set bit / 2 (payloads are multiples of 1/2), l1 = sum of |values|, max = max |value|.
 * For a tile: the largest l1 / q and max / q over its rows (columns), the smallest q, the largest l1 and max. */
typedef struct {
    double ratio_l1, ratio_max, quantum, l1, max;
} slice_bound;

/* Whether every partial sum of every output of the tile's slice is exact in FP32, in any order: the products of an
 * output (i, j) are multiples of Q = q_i * q_j and every partial sum is at most min(l1_i max_j, max_i l1_j) in
 * magnitude, so it is an integer multiple of Q below 2^24 Q (a representable FP32 number, subnormal or not, when
 * Q >= 2^-149), and below 2^128. FMAs then round nothing and the FP32 sum is the exact slice sum, whose one RNE
 * rounding to FP32 is itself: the caller's bits. (A small margin covers the FP64 rounding of l1.) */
static inline int slice_exact_in_fp32(const slice_bound *a, const slice_bound *b) {
    const double limit = 0x1p24 * (1.0 - 0x1p-30);
    return (a->ratio_l1 * b->ratio_max < limit || a->ratio_max * b->ratio_l1 < limit) &&
           a->quantum * b->quantum >= 0x1p-149 && (a->l1 * b->max < 0x1p127 || a->max * b->l1 < 0x1p127);
}

#if UE5M3_AVX512
/* The payload path with one 16-lane FP32 register per row: over a whole slice where the tile's bounds allow it (the
 * AVX2 kernel's whole-slice path), else per sub-block into two 8-lane FP64 slice sums (times B's scale exponents
 * where bf is given, B fully encoded where it is NULL). Returns the number of slices summed whole. */
static int64_t micro_payload(const float *ap, const float *bp, const double *bf, const slice_bound *bound_a,
                             const slice_bound *bound_b, int64_t kc, int64_t width, int rtz, float *acc) {
    int64_t whole = 0;
    for (int64_t s = 0; s < kc; s += width) {
        if (!bf && bound_a && slice_exact_in_fp32(bound_a + s / width, bound_b + s / width)) {
            __m512 c[AMR];
            for (int r = 0; r < AMR; ++r) c[r] = _mm512_setzero_ps();
            const float *a = ap + s * AMR, *b = bp + s * PNR;
            for (int64_t k = 0; k < width; ++k, a += AMR, b += PNR) {
                __m512 b0 = _mm512_loadu_ps(b);
                for (int r = 0; r < AMR; ++r) c[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), b0, c[r]);
            }
            for (int r = 0; r < AMR; ++r) {
                __m256 p0 = _mm512_castps512_ps256(c[r]), p1 = _mm512_extractf32x8_ps(c[r], 1);
                __m256 c0 = _mm256_loadu_ps(acc + r * PNR), c1 = _mm256_loadu_ps(acc + r * PNR + 8);
                _mm256_storeu_ps(acc + r * PNR, rtz ? add_rtz8(c0, p0) : _mm256_add_ps(c0, p0));
                _mm256_storeu_ps(acc + r * PNR + 8, rtz ? add_rtz8(c1, p1) : _mm256_add_ps(c1, p1));
            }
            ++whole;
            continue;
        }
        __m512d lo[AMR], hi[AMR];
        for (int r = 0; r < AMR; ++r) lo[r] = hi[r] = _mm512_setzero_pd();
        for (int64_t j = s; j < s + width; j += SUB) {
            __m512 c[AMR];
            for (int r = 0; r < AMR; ++r) c[r] = _mm512_setzero_ps();
            const float *a = ap + j * AMR, *b = bp + j * PNR;
            for (int k = 0; k < SUB; ++k, a += AMR, b += PNR) {
                __m512 b0 = _mm512_loadu_ps(b);
                for (int r = 0; r < AMR; ++r) c[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[r]), b0, c[r]);
            }
            if (bf) {
                const double *f = bf + (j / SUB) * PNR;
                __m512d f0 = _mm512_loadu_pd(f), f1 = _mm512_loadu_pd(f + 8);
                for (int r = 0; r < AMR; ++r) {
                    lo[r] = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(c[r])), f0, lo[r]);
                    hi[r] = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(c[r], 1)), f1, hi[r]);
                }
            } else {
                for (int r = 0; r < AMR; ++r) {
                    lo[r] = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(c[r])), lo[r]);
                    hi[r] = _mm512_add_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(c[r], 1)), hi[r]);
                }
            }
        }
        for (int r = 0; r < AMR; ++r) {
            __m256 p0 = _mm512_cvtpd_ps(lo[r]), p1 = _mm512_cvtpd_ps(hi[r]);
            __m256 c0 = _mm256_loadu_ps(acc + r * PNR), c1 = _mm256_loadu_ps(acc + r * PNR + 8);
            _mm256_storeu_ps(acc + r * PNR, rtz ? add_rtz8(c0, p0) : _mm256_add_ps(c0, p0));
            _mm256_storeu_ps(acc + r * PNR + 8, rtz ? add_rtz8(c1, p1) : _mm256_add_ps(c1, p1));
        }
    }
    return whole;
}
#else
/* The 6 x 16 tile of FP32 sums c<row><half> both payload paths use: zeroed, then one K-step (6 A values, 16 B ones). */
#define PAYLOAD_TILE_ZERO                                                                                          \
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;                       \
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00
#define PAYLOAD_FMA_STEP(a, b)                                                                                     \
    do {                                                                                                           \
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps((b) + 8), x;                                         \
        x = _mm256_broadcast_ss((a) + 0); c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);    \
        x = _mm256_broadcast_ss((a) + 1); c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);    \
        x = _mm256_broadcast_ss((a) + 2); c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);    \
        x = _mm256_broadcast_ss((a) + 3); c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);    \
        x = _mm256_broadcast_ss((a) + 4); c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);    \
        x = _mm256_broadcast_ss((a) + 5); c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);    \
    } while (0)

/* by_exponent: B packed as payload * significand, each sub-block sum then times B's scale exponent (bf); else B is
 * fully encoded and the sub-block sums already carry both scales. A constant in each of the two copies below. */
static inline __attribute__((always_inline)) int64_t payload_kernel(const float *ap, const float *bp,
                                                                    const double *bf, const slice_bound *bound_a,
                                                                    const slice_bound *bound_b, int64_t kc,
                                                                    int64_t width, int rtz, float *acc,
                                                                    const int by_exponent) {
    int64_t whole = 0;
    for (int64_t s = 0; s < kc; s += width) {
        if (!by_exponent && bound_a && slice_exact_in_fp32(bound_a + s / width, bound_b + s / width)) {
            /* the whole slice in FP32 FMAs: no sub-block ends, no FP64 (every partial sum is exact) */
            PAYLOAD_TILE_ZERO;
            const float *a = ap + s * AMR, *b = bp + s * PNR;
            for (int64_t k = 0; k < width; ++k, a += AMR, b += PNR) {
                PAYLOAD_FMA_STEP(a, b);
            }
            const __m256 sums[2 * AMR] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
            for (int q = 0; q < 2 * AMR; ++q) {
                __m256 c = _mm256_loadu_ps(acc + 8 * q);
                _mm256_storeu_ps(acc + 8 * q, rtz ? add_rtz8(c, sums[q]) : _mm256_add_ps(c, sums[q]));
            }
            ++whole;
            continue;
        }
        __m256d slice[AMR][4];
        for (int r = 0; r < AMR; ++r)
            for (int q = 0; q < 4; ++q) slice[r][q] = _mm256_setzero_pd();
        for (int64_t j = s; j < s + width; j += SUB) {
            PAYLOAD_TILE_ZERO;
            const float *a = ap + j * AMR, *b = bp + j * PNR;
            for (int k = 0; k < SUB; ++k, a += AMR, b += PNR) {
                PAYLOAD_FMA_STEP(a, b);
            }
            const __m256 lo[AMR] = {c00, c10, c20, c30, c40, c50}, hi[AMR] = {c01, c11, c21, c31, c41, c51};
            if (by_exponent) { /* times B's scale exponent (exact) */
                const double *f = bf + (j / SUB) * PNR;
                __m256d f0 = _mm256_loadu_pd(f), f1 = _mm256_loadu_pd(f + 4), f2 = _mm256_loadu_pd(f + 8),
                        f3 = _mm256_loadu_pd(f + 12);
                for (int r = 0; r < AMR; ++r) {
                    slice[r][0] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lo[r])), f0, slice[r][0]);
                    slice[r][1] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(lo[r], 1)), f1, slice[r][1]);
                    slice[r][2] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(hi[r])), f2, slice[r][2]);
                    slice[r][3] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(hi[r], 1)), f3, slice[r][3]);
                }
            } else { /* adds, which leave the FMA pipes to the next sub-block */
                for (int r = 0; r < AMR; ++r) {
                    slice[r][0] = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(lo[r])), slice[r][0]);
                    slice[r][1] = _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(lo[r], 1)), slice[r][1]);
                    slice[r][2] = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(hi[r])), slice[r][2]);
                    slice[r][3] = _mm256_add_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(hi[r], 1)), slice[r][3]);
                }
            }
        }
        for (int r = 0; r < AMR; ++r)
            for (int h = 0; h < 2; ++h) {
                __m256 p = _mm256_set_m128(_mm256_cvtpd_ps(slice[r][2 * h + 1]), _mm256_cvtpd_ps(slice[r][2 * h]));
                __m256 c = _mm256_loadu_ps(acc + r * PNR + 8 * h);
                _mm256_storeu_ps(acc + r * PNR + 8 * h, rtz ? add_rtz8(c, p) : _mm256_add_ps(c, p));
            }
    }
    return whole;
}

/* Returns the number of slices summed whole (bound_a and bound_b: the tile's slice bounds, or NULL for none). */
static int64_t micro_payload(const float *ap, const float *bp, const double *bf, const slice_bound *bound_a,
                             const slice_bound *bound_b, int64_t kc, int64_t width, int rtz, float *acc) {
    if (bf) return payload_kernel(ap, bp, bf, NULL, NULL, kc, width, rtz, acc, 1);
    return payload_kernel(ap, bp, NULL, bound_a, bound_b, kc, width, rtz, acc, 0);
}
#endif

/* One AMR x nr tile of FP32 accumulators advanced over K-steps [k0, k0 + len) (len a multiple of the width). */
typedef void (*tile_fn)(const void *ctx, int64_t band, int64_t panel, int64_t k0, int64_t len, float *acc);

/* The driver both AVX2 kernels share: row blocks of 16 bands (96 rows, whose packed A chunk stays in L2) sweep
 * every column panel per K chunk of KC steps, in parallel over row blocks; then each accumulator is finished and
 * stored. Returns 1 if a block's accumulators could not be allocated. */
static int run_bands(int64_t m, int64_t n, int64_t k, int64_t width, int nr, float grid, float alpha, float *c,
                     tile_fn tile, const void *ctx) {
    int64_t bands = (m + AMR - 1) / AMR, panels = (n + nr - 1) / nr;
    int64_t kc = KC % width == 0 ? KC : width;
    const int64_t band_block = 16;
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bb = 0; bb < bands; bb += band_block) {
        int64_t b_end = bb + band_block < bands ? bb + band_block : bands;
        float *acc = (float *)calloc((size_t)((b_end - bb) * panels * AMR * nr), sizeof(float));
        if (!acc) {
            failed = 1;
            continue;
        }
        for (int64_t k0 = 0; k0 < k; k0 += kc)
            for (int64_t p = 0; p < panels; ++p)
                for (int64_t band = bb; band < b_end; ++band)
                    tile(ctx, band, p, k0, k - k0 < kc ? k - k0 : kc, acc + ((band - bb) * panels + p) * AMR * nr);
        for (int64_t band = bb; band < b_end; ++band)
            for (int64_t p = 0; p < panels; ++p) {
                const float *tile_acc = acc + ((band - bb) * panels + p) * AMR * nr;
                if ((band + 1) * AMR <= m && (p + 1) * nr <= n) { /* a whole tile: 8 lanes at a time */
                    for (int r = 0; r < AMR; ++r)
                        for (int t = 0; t < nr; t += 8)
                            _mm256_storeu_ps(c + (band * AMR + r) * n + p * nr + t,
                                             finish8(_mm256_loadu_ps(tile_acc + r * nr + t), grid, alpha));
                    continue;
                }
                for (int r = 0; r < AMR && band * AMR + r < m; ++r)
                    for (int t = 0; t < nr && p * nr + t < n; ++t)
                        c[(band * AMR + r) * n + p * nr + t] = finish(tile_acc[r * nr + t], grid, alpha);
            }
        free(acc);
    }
    return failed;
}

typedef struct {
    const float *ap, *bp;
    const double *bf;
    const slice_bound *bound_a, *bound_b; /* [bands, slices] and [panels, slices], or NULL */
    int64_t k, subs, width, slices;
    int rtz;
    int64_t *whole; /* where to count the slices summed whole, or NULL */
} payload_ctx;

static void payload_tile(const void *ctx, int64_t band, int64_t p, int64_t k0, int64_t len, float *acc) {
    const payload_ctx *x = (const payload_ctx *)ctx;
    int64_t s0 = k0 / x->width;
    int64_t whole = micro_payload(x->ap + (band * x->k + k0) * AMR, x->bp + (p * x->k + k0) * PNR,
                                  x->bf ? x->bf + (p * x->subs + k0 / SUB) * PNR : NULL,
                                  x->bound_a ? x->bound_a + band * x->slices + s0 : NULL,
                                  x->bound_b ? x->bound_b + p * x->slices + s0 : NULL, len, x->width, x->rtz, acc);
    if (x->whole && whole) {
#pragma omp atomic
        *x->whole += whole;
    }
}

typedef struct {
    const double *ap, *bp;
    int64_t k, width;
    int rtz;
} encoded_ctx;

static void encoded_tile(const void *ctx, int64_t band, int64_t p, int64_t k0, int64_t len, float *acc) {
    const encoded_ctx *x = (const encoded_ctx *)ctx;
    micro_encoded(x->ap + (band * x->k + k0) * AMR, x->bp + (p * x->k + k0) * ANR, len, x->width, x->rtz, acc);
}

/* significand in [1, 2) and exponent of a positive finite FP32 scale (zero: 0 and 0) */
static inline float scale_significand(float s, int *e) {
    if (s == 0.0f) { *e = 0; return 0.0f; }
    float f = frexpf(s, e); /* s = f * 2^e, f in [0.5, 1) */
    *e -= 1;
    return f * 2.0f;
}

void ue5m3_scale_extremes(const float *scales, int64_t n, float *out); /* below: the largest and smallest positive */

/* Whether B may be packed fully encoded (payload * scale) with every 16-element sub-block sum still exact in FP32.
 * With scales of at most 6 significant bits (the payload path's limit, checked by the caller) and exponents ea, eb,
 * a product of two encoded values, (2pa * 2pb / 4) * sa * sb, is a multiple of 2^(ea + eb - 12), and a sub-block's
 * 16 products sum to less than 16 * 36 * 4 * 2^(ea + eb) < 2^(ea + eb + 12): under 2^24 quanta. So every partial sum
 * is exact when ea + eb >= -137 (a quantum no finer than FP32's 2^-149) and ea + eb <= 115 (no overflow), for every
 * pair of an A and a B scale. */
static int fully_encoded_b_exact(const float *sa, int64_t na, const float *sb, int64_t nb) {
    float a[2], b[2];
    ue5m3_scale_extremes(sa, na, a);
    ue5m3_scale_extremes(sb, nb, b);
    if (a[0] == 0.0f || b[0] == 0.0f) return 1; /* no positive scale on a side: every product is zero */
    int a_hi, a_lo, b_hi, b_lo; /* frexp exponents: floor(log2) + 1 on both sides, so the sums shift by 2 */
    frexpf(a[0], &a_hi);
    frexpf(a[1], &a_lo);
    frexpf(b[0], &b_hi);
    frexpf(b[1], &b_lo);
    return a_lo + b_lo - 2 >= -137 && a_hi + b_hi - 2 <= 115;
}

/* The quantum of a block's encoded values, half its scale's lowest set bit (E2M1 payloads are multiples of 1/2), as
 * an FP64 power of two; infinite for a zero scale, whose block holds only zeros. */
static inline double scale_quantum(float v) {
    if (!(v > 0.0f)) return INFINITY;
    uint32_t b = f2u(v), mantissa = b & 0x7FFFFFu;
    int e = (int)(b >> 23);
    if (e) {
        mantissa |= 0x800000u;
        e -= 150;
    } else {
        e = -149;
    }
    return ldexp(1.0, e + __builtin_ctz(mantissa) - 1);
}

static const slice_bound no_values = {0.0, 0.0, INFINITY, 0.0, 0.0};

/* One row's (column's) slice, l1 = sum |values|, max = max |value|, q = its quantum, into the tile's bound. */
static inline void fold_bound(slice_bound *tile, double l1, double max, double q) {
    double ratio_l1 = l1 / q, ratio_max = max / q; /* 0 for a slice with no positive scale (q infinite) */
    if (ratio_l1 > tile->ratio_l1) tile->ratio_l1 = ratio_l1;
    if (ratio_max > tile->ratio_max) tile->ratio_max = ratio_max;
    if (q < tile->quantum) tile->quantum = q;
    if (l1 > tile->l1) tile->l1 = l1;
    if (max > tile->max) tile->max = max;
}

/* pa [M, K] payloads with scales sa [M, K / block]; pb [K, N] payloads with scales sb [K / block, ceil(N / cb)]
 * (cb = 1 for 1D blocks along K, the tile side for 2D tiles). block and width are multiples of 16. whole (or NULL)
 * receives the number of tile slices summed whole in FP32. */
int ue5m3_probe_gemm_payload(const float *pa, const float *sa, const float *pb, const float *sb, int64_t m,
                             int64_t n, int64_t k, int64_t block, int64_t cb, int64_t width, int rtz, float grid,
                             float alpha, float *c, int64_t *whole) {
    int64_t bands = (m + AMR - 1) / AMR, panels = (n + PNR - 1) / PNR, subs = k / SUB, slices = k / width;
    int64_t scols = (n + cb - 1) / cb, sblocks = k / block;
    /* B fully encoded where the scales allow; then each tile slice whose bounds allow it is summed whole in FP32 */
    int fully_encoded = fully_encoded_b_exact(sa, m * sblocks, sb, sblocks * scols);
    float *ap = (float *)calloc((size_t)(bands * k * AMR), sizeof(float));
    float *bp = (float *)calloc((size_t)(panels * k * PNR), sizeof(float));
    double *bf = fully_encoded ? NULL : (double *)calloc((size_t)(panels * subs * PNR), sizeof(double));
    slice_bound *bound_a = fully_encoded ? (slice_bound *)malloc(sizeof(slice_bound) * (size_t)(bands * slices)) : NULL;
    slice_bound *bound_b = fully_encoded ? (slice_bound *)malloc(sizeof(slice_bound) * (size_t)(panels * slices)) : NULL;
    if (!ap || !bp || (fully_encoded ? !bound_a || !bound_b : !bf)) {
        free(ap); free(bp); free(bf); free(bound_a); free(bound_b);
        return 1;
    }
    if (whole) *whole = 0;
#pragma omp parallel for schedule(static)
    for (int64_t band = 0; band < bands; ++band) {
        if (bound_a)
            for (int64_t sl = 0; sl < slices; ++sl) bound_a[band * slices + sl] = no_values;
        for (int r = 0; r < AMR && band * AMR + r < m; ++r) {
            int64_t row = band * AMR + r;
            for (int64_t sl = 0; sl < slices; ++sl) {
                double l1 = 0.0, max = 0.0, q = INFINITY;
                for (int64_t kk = sl * width; kk < (sl + 1) * width; kk += SUB) {
                    const float scale = sa[row * sblocks + kk / block];
                    if (bound_a) q = fmin(q, scale_quantum(scale));
                    for (int64_t i = kk; i < kk + SUB; ++i) {
                        const float v = pa[row * k + i] * scale, magnitude = fabsf(v);
                        ap[(band * k + i) * AMR + r] = v;
                        l1 += magnitude;
                        if (magnitude > max) max = magnitude;
                    }
                }
                if (bound_a) fold_bound(bound_a + band * slices + sl, l1, max, q);
            }
        }
    }
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
        double l1[PNR], max[PNR], q[PNR];
        for (int64_t j = 0; j < subs; ++j) {
            if ((j * SUB) % width == 0) { /* a slice starts */
                if (bound_b) bound_b[p * slices + (j * SUB) / width] = no_values;
                for (int t = 0; t < PNR; ++t) l1[t] = max[t] = 0.0, q[t] = INFINITY;
            }
            for (int t = 0; t < PNR && p * PNR + t < n; ++t) {
                int64_t col = p * PNR + t;
                float scale = sb[((j * SUB) / block) * scols + col / cb], sig = scale;
                if (!fully_encoded) {
                    int e;
                    sig = scale_significand(scale, &e);
                    bf[(p * subs + j) * PNR + t] = ldexp(1.0, e);
                } else {
                    q[t] = fmin(q[t], scale_quantum(scale));
                }
                for (int64_t kk = j * SUB; kk < (j + 1) * SUB; ++kk) {
                    const float v = pb[kk * n + col] * sig, magnitude = fabsf(v);
                    bp[(p * k + kk) * PNR + t] = v;
                    l1[t] += magnitude;
                    if (magnitude > max[t]) max[t] = magnitude;
                }
            }
            if (bound_b && ((j + 1) * SUB) % width == 0)
                for (int t = 0; t < PNR && p * PNR + t < n; ++t)
                    fold_bound(bound_b + p * slices + (j * SUB) / width, l1[t], max[t], q[t]);
        }
    }
    payload_ctx ctx = {ap, bp, bf, bound_a, bound_b, k, subs, width, slices, rtz, whole};
    int failed = run_bands(m, n, k, width, PNR, grid, alpha, c, payload_tile, &ctx);
    free(ap);
    free(bp);
    free(bf);
    free(bound_a);
    free(bound_b);
    return failed;
}

/* a (M x K) and b (K x N) row-major, FP64 (f64 = 1) or FP32 operands; c = finish(acc) where finish snaps to the
 * 1/grid lattice with ties to even (grid > 0) and multiplies by alpha (alpha != 1), both in FP32 like the torch path. */
static int probe_gemm_avx2(const void *a, const void *b, int f64, int64_t m, int64_t n, int64_t k, int64_t width,
                           int rtz, float grid, float alpha, float *c) {
    int64_t bands = (m + AMR - 1) / AMR, panels = (n + ANR - 1) / ANR;
    double *ap = (double *)calloc((size_t)(bands * k * AMR), sizeof(double));
    double *bp = (double *)calloc((size_t)(panels * k * ANR), sizeof(double));
    if (!ap || !bp) { free(ap); free(bp); return 1; }
    const double *a64 = (const double *)a, *b64 = (const double *)b;
    const float *a32 = (const float *)a, *b32 = (const float *)b;
#pragma omp parallel for schedule(static)
    for (int64_t band = 0; band < bands; ++band)
        for (int r = 0; r < AMR && band * AMR + r < m; ++r) {
            int64_t row = (band * AMR + r) * k;
            for (int64_t kk = 0; kk < k; ++kk)
                ap[(band * k + kk) * AMR + r] = f64 ? a64[row + kk] : (double)a32[row + kk];
        }
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; ++p)
        for (int64_t kk = 0; kk < k; ++kk)
            for (int t = 0; t < ANR && p * ANR + t < n; ++t) {
                int64_t at = kk * n + p * ANR + t;
                bp[(p * k + kk) * ANR + t] = f64 ? b64[at] : (double)b32[at];
            }
    encoded_ctx ctx = {ap, bp, k, width, rtz};
    int failed = run_bands(m, n, k, width, ANR, grid, alpha, c, encoded_tile, &ctx);
    free(ap);
    free(bp);
    return failed;
}
#endif

#if !UE5M3_AVX2
/* Portable path (no AVX2 + FMA): the FP64 encoded kernel with GCC vector extensions. */
/* The probe-matched GEMM in one pass: C[M,N] = combine over K-slices of float(exact slice dot product).
 *
 * A [M,K] and B [K,N] are row-major FP64 encoded operands whose slice sums are exact in FP64 whatever the
 * order (the caller checks the exponent spans and routes other tiles to the exact TwoSum path), so the FP64
 * sums here may be formed in any order. Each slice sum is rounded once to FP32 and added to the FP32
 * accumulator in K order with add_rtz (rtz = 1) or an RNE addition. Register blocking: 8 rows x 8 columns of
 * FP64 slice sums and FP32 accumulators; B is packed into panels of 8 columns so a panel stays in cache while
 * a band of A rows sweeps over it.
 */

#define MR 8
#define NR 8
#define MB 64

/* A full MR x NR tile: one 8-wide FP64 vector of slice sums per row (GCC vector extensions: AVX-512 where the
 * CPU has it, narrower vectors elsewhere; the operations are the same IEEE multiplies and adds). */
typedef double v8d __attribute__((vector_size(64)));

static inline v8d load8(const double *p) {
    v8d v;
    memcpy(&v, p, sizeof v);
    return v;
}

static void probe_tile_full(const double *a, int64_t lda, const double *panel, int64_t k, int64_t width, int rtz,
                            float *c, int64_t ldc) {
    float acc[MR][NR] = {{0}};
    const double *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    const double *a4 = a + 4 * lda, *a5 = a + 5 * lda, *a6 = a + 6 * lda, *a7 = a + 7 * lda;
    for (int64_t s = 0; s < k; s += width) {
        v8d s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};
        for (int64_t kk = s; kk < s + width; ++kk) {
            const v8d b = load8(panel + kk * NR);
            s0 += b * a0[kk];
            s1 += b * a1[kk];
            s2 += b * a2[kk];
            s3 += b * a3[kk];
            s4 += b * a4[kk];
            s5 += b * a5[kk];
            s6 += b * a6[kk];
            s7 += b * a7[kk];
        }
        const v8d sums[MR] = {s0, s1, s2, s3, s4, s5, s6, s7};
        for (int r = 0; r < MR; ++r)
            for (int t = 0; t < NR; ++t) {
                float p = (float)sums[r][t];
                acc[r][t] = rtz ? add_rtz(acc[r][t], p) : acc[r][t] + p;
            }
    }
    for (int r = 0; r < MR; ++r)
        for (int t = 0; t < NR; ++t) c[r * ldc + t] = acc[r][t];
}

/* Edge tiles (fewer rows or columns): one output at a time, same operations. */
static void probe_tile_edge(const double *a, int64_t lda, const double *panel, int64_t rows, int64_t cols,
                            int64_t k, int64_t width, int rtz, float *c, int64_t ldc) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t t = 0; t < cols; ++t) {
            float acc = 0.0f;
            for (int64_t s = 0; s < k; s += width) {
                double sum = 0.0;
                for (int64_t kk = s; kk < s + width; ++kk) sum += a[r * lda + kk] * panel[kk * NR + t];
                acc = rtz ? add_rtz(acc, (float)sum) : acc + (float)sum;
            }
            c[r * ldc + t] = acc;
        }
}

static int probe_gemm_generic(const double *a, const double *b, int64_t m, int64_t n, int64_t k, int64_t width,
                              int rtz, float *c) {
    int64_t panels = (n + NR - 1) / NR;
    double *packed = (double *)calloc((size_t)(panels * k * NR), sizeof(double));
    if (!packed) return 1;
#pragma omp parallel for schedule(static) if (panels * k >= 65536)
    for (int64_t p = 0; p < panels; ++p)
        for (int64_t kk = 0; kk < k; ++kk)
            for (int64_t t = 0; t < NR && p * NR + t < n; ++t) packed[(p * k + kk) * NR + t] = b[kk * n + p * NR + t];
    int64_t bands = (m + MB - 1) / MB;
#pragma omp parallel for schedule(dynamic, 1) if (bands > 1)
    for (int64_t band = 0; band < bands; ++band) {
        int64_t i_end = (band + 1) * MB < m ? (band + 1) * MB : m;
        for (int64_t p = 0; p < panels; ++p) {
            int64_t cols = n - p * NR < NR ? n - p * NR : NR;
            for (int64_t i = band * MB; i < i_end; i += MR) {
                int64_t rows = i_end - i < MR ? i_end - i : MR;
                if (rows == MR && cols == NR)
                    probe_tile_full(a + i * k, k, packed + p * k * NR, k, width, rtz, c + i * n + p * NR, n);
                else
                    probe_tile_edge(a + i * k, k, packed + p * k * NR, rows, cols, k, width, rtz, c + i * n + p * NR, n);
            }
        }
    }
    free(packed);
    return 0;
}
#endif

/* The probe-matched GEMM of FP64 (f64 = 1) or FP32 encoded operands, finished with the lattice snap and alpha. */
int ue5m3_probe_gemm(const void *a, const void *b, int f64, int64_t m, int64_t n, int64_t k, int64_t width, int rtz,
                     float grid, float alpha, float *c) {
#if UE5M3_AVX2
    return probe_gemm_avx2(a, b, f64, m, n, k, width, rtz, grid, alpha, c);
#else
    const double *a64 = (const double *)a, *b64 = (const double *)b;
    double *wa = NULL, *wb = NULL;
    if (!f64) { /* widen once: FP32 encoded values are exact in FP64 */
        wa = (double *)malloc((size_t)(m * k) * sizeof(double));
        wb = (double *)malloc((size_t)(k * n) * sizeof(double));
        if (!wa || !wb) { free(wa); free(wb); return 1; }
        for (int64_t i = 0; i < m * k; ++i) wa[i] = (double)((const float *)a)[i];
        for (int64_t i = 0; i < k * n; ++i) wb[i] = (double)((const float *)b)[i];
        a64 = wa;
        b64 = wb;
    }
    int status = probe_gemm_generic(a64, b64, m, n, k, width, rtz, c);
    free(wa);
    free(wb);
    if (status) return status;
    for (int64_t i = 0; i < m * n; ++i) c[i] = finish(c[i], grid, alpha);
    return 0;
#endif
}

#if !UE5M3_AVX2
/* Without AVX2 + FMA the payload path is not built; the caller uses ue5m3_probe_gemm instead. */
int ue5m3_probe_gemm_payload(const float *pa, const float *sa, const float *pb, const float *sb, int64_t m,
                             int64_t n, int64_t k, int64_t block, int64_t cb, int64_t width, int rtz, float grid,
                             float alpha, float *c, int64_t *whole) {
    (void)pa; (void)sa; (void)pb; (void)sb; (void)m; (void)n; (void)k; (void)block; (void)cb; (void)width;
    (void)rtz; (void)grid; (void)alpha; (void)c; (void)whole;
    return 2;
}
#endif
int ue5m3_has_payload_gemm(void) { return UE5M3_AVX2; }
/* The vector width of the probe-matched GEMM's micro-kernels: 512 (AVX-512), 256 (AVX2 + FMA), 0 (portable). */
int ue5m3_gemm_vector_bits(void) { return UE5M3_AVX512 ? 512 : UE5M3_AVX2 ? 256 : 0; }
/* The rows of the payload GEMM's tiles (6 on AVX2, 8 on AVX-512; 0 without the payload path); its tiles are 16 wide. */
#if UE5M3_AVX2
int ue5m3_payload_tile_rows(void) { return AMR; }
#else
int ue5m3_payload_tile_rows(void) { return 0; }
#endif

/* The probe-matched GEMM's exactness check from per-block data only (gemm._span_bits, the same arithmetic): per
 * row of a [rows, nblocks] grid of block scales (an A row, or a B column), the largest over its K slices of
 * per_slice blocks of the bit span lead - lowest, where a block with a nonzero amax has lead = frexp exponent of
 * scale * element_max and lowest = frexp exponent of scale - 2 - mbits; 0 where a slice has no such block.
 * Row r reads the block scales of grid row r / row_div (2D tiles give one grid row per `block` columns);
 * scales and amax share the strides. */
void ue5m3_slice_span_max(const float *scales, const float *amax, int64_t rows, int64_t nblocks, int64_t row_stride,
                          int64_t block_stride, int64_t row_div, int64_t per_slice, double element_max, int mbits,
                          int32_t *row_max) {
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t base = (r / row_div) * row_stride;
        int32_t largest = 0;
        for (int64_t j0 = 0; j0 < nblocks; j0 += per_slice) {
            int32_t hi = -(1 << 20), lo = 1 << 20;
            for (int64_t j = j0; j < j0 + per_slice; ++j) {
                const int64_t at = base + j * block_stride;
                if (!(amax[at] > 0.0f)) continue;
                const double s = (double)scales[at];
                int lead, exponent;
                frexp(s * element_max, &lead);
                frexp(s, &exponent);
                if (lead > hi) hi = lead;
                if (exponent - 2 - mbits < lo) lo = exponent - 2 - mbits;
            }
            const int32_t span = hi - lo > 0 ? hi - lo : 0;
            if (span > largest) largest = span;
        }
        row_max[r] = largest;
    }
}

/* The largest and the smallest positive of n block scales (0 and 0 when none is positive): whether every FP32
 * product and sub-block sum of the payload GEMM stays normal. */
void ue5m3_scale_extremes(const float *scales, int64_t n, float *out) {
    float largest = 0.0f, smallest = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float s = scales[i];
        if (!(s > 0.0f)) continue;
        if (s > largest) largest = s;
        if (smallest == 0.0f || s < smallest) smallest = s;
    }
    out[0] = largest;
    out[1] = smallest;
}

/* The exact path of the probe-matched GEMM (gemm._probe_matched_rows, the same FP64 operations in the same order)
 * for the outputs the span check routes there: every column of the A rows in `rows`, every row of the B columns in
 * `cols`. Each slice sum is the TwoSum chain over its blocks' partials in K order, each partial the block's integer
 * dot product of twice the payloads (exact) times A's scale, B's scale and 1/4 in FP64, renormalised and rounded to
 * FP32 through round-to-odd; slices then combine as in the kernels above and finish() snaps and scales. Where the
 * torch path sums a slice in FP64 instead (its spans allow it), that sum is exact and so is this chain: the same
 * FP32 value. pa [M, K] payloads with scales sa [M, K / block]; pb [K, N] with scales sb [K / block, sb_cols], B's
 * scale of (kk, j) being sb[(kk / block) * sb_cols + j / cb] (cb = 1 for blocks along K, the tile side for 2D). */
static inline double two_sum(double a, double b, double *err) {
    double s = a + b, bb = s - a;
    *err = (a - (s - bb)) + (b - bb);
    return s;
}

static inline float round_odd_to_fp32(double hi, double lo) {
    uint64_t bits;
    memcpy(&bits, &hi, 8);
    if (lo != 0.0 && !(bits & 1u)) hi = nextafter(hi, lo > 0.0 ? INFINITY : -INFINITY);
    return (float)hi;
}

static float probe_exact_output(const float *pa, const float *sa, const float *pb, const float *sb, int64_t i,
                                int64_t j, int64_t n, int64_t k, int64_t block, int64_t cb, int64_t sb_cols, int64_t width, int rtz, float grid, float alpha) {
    float acc = 0.0f;
    const float *arow = pa + i * k, *srow = sa + i * (k / block);
    for (int64_t s0 = 0; s0 < k; s0 += width) {
        double hi = 0.0, lo = 0.0;
        for (int64_t b0 = s0; b0 < s0 + width; b0 += block) {
            float dot = 0.0f; /* integers below 2^24: exact in FP32, as the torch path's FP32 bmm */
            for (int64_t kk = b0; kk < b0 + block; ++kk) dot += (arow[kk] * 2.0f) * (pb[kk * n + j] * 2.0f);
            const double term = (double)dot * (double)srow[b0 / block] * (double)sb[(b0 / block) * sb_cols + j / cb] * 0.25;
            if (b0 == s0) {
                hi = term;
            } else {
                double err;
                hi = two_sum(hi, term, &err);
                lo = lo + err;
            }
        }
        double err;
        hi = two_sum(hi, lo, &err);
        const float p = round_odd_to_fp32(hi, err);
        acc = rtz ? add_rtz(acc, p) : acc + p;
    }
    return finish(acc, grid, alpha);
}

void ue5m3_probe_exact_outputs(const float *pa, const float *sa, const float *pb, const float *sb, int64_t m,
                               int64_t n, int64_t k, int64_t block, int64_t cb, int64_t sb_cols, int64_t width, int rtz, float grid, float alpha, const int64_t *rows,
                               int64_t nrows, const int64_t *cols, int64_t ncols, float *c) {
#pragma omp parallel for schedule(static) if (nrows * n * k >= (1 << 22))
    for (int64_t r = 0; r < nrows; ++r)
        for (int64_t j = 0; j < n; ++j)
            c[rows[r] * n + j] = probe_exact_output(pa, sa, pb, sb, rows[r], j, n, k, block, cb, sb_cols, width, rtz, grid, alpha);
#pragma omp parallel for schedule(static) if (ncols * m * k >= (1 << 22))
    for (int64_t i = 0; i < m; ++i)
        for (int64_t t = 0; t < ncols; ++t)
            c[i * n + cols[t]] = probe_exact_output(pa, sa, pb, sb, i, cols[t], n, k, block, cb, sb_cols, width, rtz, grid, alpha);
}
