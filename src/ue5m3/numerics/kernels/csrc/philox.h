/* Philox4x32-10 (Salmon et al., SC'11), the counter-based generator of cuRAND and Triton's tl.randint, and the
 * mapping from an element's global index to its stochastic-rounding bits (ue5m3.numerics.philox is the
 * reference; tests/test_philox.py checks the Random123 known-answer vectors and bit equality with it).
 *
 * Key (k0, k1) = 64-bit hash of (seed, module, role); counter = (group, group >> 32, step, microbatch) with
 * group = global index / elements per counter (4 for up to 32 bits per element, 2 for up to 64).
 */
#ifndef UE5M3_PHILOX_H
#define UE5M3_PHILOX_H
#include <stdint.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

typedef struct {
    uint32_t k0, k1, step, microbatch;
    int bit_count; /* random bits per element: 8 (sf, sr_te) or 53 (sr) */
} philox_stream;

static inline void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c[0], p1 = (uint64_t)PHILOX_M1 * c[2];
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0; c[1] = (uint32_t)p1; c[2] = n2; c[3] = (uint32_t)p0;
    }
}

static inline int philox_per_counter(int bit_count) { return bit_count <= 32 ? 4 : 2; }

/* An element's bits from the four words of its counter and its lane (index % elements per counter). */
static inline uint64_t philox_bits_of(const uint32_t w[4], int lane, int bit_count) {
    if (bit_count <= 32) return (uint64_t)(w[lane] >> (32 - bit_count));
    return ((uint64_t)w[2 * lane] << (bit_count - 32)) | (uint64_t)(w[2 * lane + 1] >> (64 - bit_count));
}

/* The bits of one element from its global index (scalar path, any layout). */
static inline uint64_t philox_element_bits(const philox_stream *s, uint64_t index) {
    int per = philox_per_counter(s->bit_count);
    uint64_t group = index / (uint64_t)per;
    uint32_t c[4] = {(uint32_t)group, (uint32_t)(group >> 32), s->step, s->microbatch};
    philox4x32_10(c, s->k0, s->k1);
    return philox_bits_of(c, (int)(index % (uint64_t)per), s->bit_count);
}

#define PHILOX_MAX_COUNTERS 256

/* The ten rounds on n counters held as structure of arrays, in loops the compiler vectorises (32x32->64
 * multiplies). */
static inline void philox_rounds(uint32_t *c0, uint32_t *c1, uint32_t *c2, uint32_t *c3, int n, uint32_t k0,
                                 uint32_t k1) {
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += PHILOX_W0; k1 += PHILOX_W1; }
        for (int i = 0; i < n; ++i) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[i], p1 = (uint64_t)PHILOX_M1 * c2[i];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[i] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[i] ^ k1;
            c0[i] = n0; c1[i] = (uint32_t)p1; c2[i] = n2; c3[i] = (uint32_t)p0;
        }
    }
}

/* Words of n consecutive counters starting at group `first` into out[4 * i + word]. n <= PHILOX_MAX_COUNTERS. */
static inline void philox_fill(const philox_stream *s, uint64_t first, int n, uint32_t *out) {
    uint32_t c0[PHILOX_MAX_COUNTERS], c1[PHILOX_MAX_COUNTERS], c2[PHILOX_MAX_COUNTERS], c3[PHILOX_MAX_COUNTERS];
    for (int i = 0; i < n; ++i) {
        uint64_t g = first + (uint64_t)i;
        c0[i] = (uint32_t)g; c1[i] = (uint32_t)(g >> 32); c2[i] = s->step; c3[i] = s->microbatch;
    }
    philox_rounds(c0, c1, c2, c3, n, s->k0, s->k1);
    for (int i = 0; i < n; ++i) {
        out[4 * i] = c0[i]; out[4 * i + 1] = c1[i]; out[4 * i + 2] = c2[i]; out[4 * i + 3] = c3[i];
    }
}

/* The words of n elements at arbitrary global indices (a strided view's block: its elements' counters are not
 * consecutive), laid out as philox_fill lays out a consecutive run's, so that philox_bits_of(out + 4 * (i / per),
 * i % per) is element i's bits: each element's own counter through the vectorised rounds (one counter per element,
 * where a consecutive run shares one among `per`), then its lane's word (per == 4) or two words (per == 2) moved to
 * element i's place. n <= PHILOX_MAX_COUNTERS. */
static inline void philox_fill_elements(const philox_stream *s, const uint64_t *index, int n, uint32_t *out) {
    uint32_t c0[PHILOX_MAX_COUNTERS], c1[PHILOX_MAX_COUNTERS], c2[PHILOX_MAX_COUNTERS], c3[PHILOX_MAX_COUNTERS];
    const int per = philox_per_counter(s->bit_count);
    for (int i = 0; i < n; ++i) {
        uint64_t g = index[i] / (uint64_t)per;
        c0[i] = (uint32_t)g; c1[i] = (uint32_t)(g >> 32); c2[i] = s->step; c3[i] = s->microbatch;
    }
    philox_rounds(c0, c1, c2, c3, n, s->k0, s->k1);
    for (int i = 0; i < n; ++i) {
        const uint32_t w[4] = {c0[i], c1[i], c2[i], c3[i]};
        const int lane = (int)(index[i] % (uint64_t)per);
        if (per == 4) {
            out[i] = w[lane];
        } else {
            out[4 * (i / 2) + 2 * (i % 2)] = w[2 * lane];
            out[4 * (i / 2) + 2 * (i % 2) + 1] = w[2 * lane + 1];
        }
    }
}
#endif
