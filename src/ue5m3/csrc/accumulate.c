/* Fused slice combination for the probe-matched GEMM model (ue5m3.gemm).
 *
 * acc[i] <- acc[i] (+) float(partials[s][i]) for s = 0..slices-1 in order, where float() is the RNE
 * conversion of an FP64 value that is already the exact slice sum (or its exact FP32 rounding) and (+) is an
 * FP32 addition rounded toward zero (rtz = 1) or to nearest even (rtz = 0). The RTZ addition is the TwoSum
 * construction of ue5m3.gemm.add_rtz: the RNE sum s and its exact error e; if e != 0 points back toward zero,
 * step s one ulp toward zero (for s != 0 that is the integer bit pattern minus one). Built without fast-math
 * and with FP contraction off, so every operation rounds exactly as the torch reference.
 */
#include <stdint.h>
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

void ue5m3_combine_slices(const double *partials, int64_t slices, int64_t n, int rtz, float *acc) {
    for (int64_t s = 0; s < slices; ++s) {
        const double *p = partials + s * n;
        if (rtz) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; ++i) acc[i] = add_rtz(acc[i], (float)p[i]);
        } else {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] + (float)p[i];
        }
    }
}
