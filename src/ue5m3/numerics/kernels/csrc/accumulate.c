/* The probe-matched GEMM model of ue5m3.gemm as one fused CPU kernel.
 *
 * Slice sums are rounded once to FP32 (RNE conversion of an exact FP64 sum) and added to the accumulator
 * with FP32 additions rounded toward zero (rtz = 1) or to nearest even (rtz = 0). The RTZ addition is the TwoSum
 * construction of ue5m3.gemm.add_rtz: the RNE sum s and its exact error e; if e != 0 points back toward zero,
 * step s one ulp toward zero (for s != 0 that is the integer bit pattern minus one). Built without fast-math
 * and with FP contraction off, so every operation rounds exactly as the torch reference.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline uint32_t f2u(float v) { uint32_t b; memcpy(&b, &v, 4); return b; }
static inline float u2f(uint32_t b) { float v; memcpy(&v, &b, 4); return v; }

static inline float add_rtz(float a, float b) {
    float s = a + b;
    float bb = s - a;
    float err = (a - (s - bb)) + (b - bb);
    int overshoot = err != 0.0f && ((f2u(err) ^ f2u(s)) >> 31);
    return overshoot ? u2f(f2u(s) - 1u) : s;
}

/* The probe-matched GEMM in one pass: C[M,N] = combine over K-slices of float(exact slice dot product).
 *
 * A [M,K] and B [K,N] are row-major FP64 encoded operands whose slice sums are exact in FP64 whatever the
 * order (the caller checks the exponent spans and routes other tiles to the exact TwoSum path), so the FP64
 * sums here may be formed in any order. Each slice sum is rounded once to FP32 and added to the FP32
 * accumulator in K order with add_rtz (rtz = 1) or an RNE addition. Register blocking: 4 rows x 8 columns of
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

int ue5m3_probe_gemm(const double *a, const double *b, int64_t m, int64_t n, int64_t k, int64_t width, int rtz,
                     float *c) {
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
