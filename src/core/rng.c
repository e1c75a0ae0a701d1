#include "ctrax/core/rng.h"

#include <math.h>
#include <string.h>

#include "ctrax/core/error.h"
#include "core/clones.h"

static inline uint32_t rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }

// Threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as
// easy as 1, 2, 3", SC'11), the rotation constants and key schedule of
// Random123 and jax.random.
void ct_threefry2x32(ct_key key, uint32_t c0, uint32_t c1, uint32_t out[2]) {
    static const int rot[8] = {13, 15, 26, 6, 17, 29, 16, 24};
    uint32_t ks[3] = {key.w[0], key.w[1], 0x1BD11BDAu ^ key.w[0] ^ key.w[1]};
    uint32_t x0 = c0 + ks[0], x1 = c1 + ks[1];
    for (int block = 0; block < 5; block++) {
        for (int r = 0; r < 4; r++) {
            x0 += x1;
            x1 = rotl32(x1, rot[(block % 2) * 4 + r]);
            x1 ^= x0;
        }
        // Key injection after every four rounds.
        x0 += ks[(block + 1) % 3];
        x1 += ks[(block + 2) % 3] + (uint32_t)(block + 1);
    }
    out[0] = x0;
    out[1] = x1;
}

// ct_random_bits for 16 counters at once: the rounds of ct_threefry2x32 on
// GCC vector types, which compile to SSE, AVX2 or AVX-512 instructions
// (target_clones picks the widest this CPU has when the program loads).
typedef uint32_t u32x16 __attribute__((vector_size(64)));
#define CT_RNG_LANES 16
#define THREEFRY_ROUND(r)                   \
    x0 += x1;                               \
    x1 = (x1 << (r)) | (x1 >> (32 - (r)));  \
    x1 ^= x0;
#define THREEFRY_INJECT(a, b, block) \
    x0 += ks[a];                     \
    x1 += ks[b] + (uint32_t)(block);

CT_CLONES
static void random_bits_lanes(const uint32_t ks[3], uint32_t j0, uint32_t *out) {
    const u32x16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    u32x16 x0 = iota + (j0 + ks[0]), x1 = (u32x16){0} + (2u + ks[1]);
    THREEFRY_ROUND(13) THREEFRY_ROUND(15) THREEFRY_ROUND(26) THREEFRY_ROUND(6) THREEFRY_INJECT(1, 2, 1)
    THREEFRY_ROUND(17) THREEFRY_ROUND(29) THREEFRY_ROUND(16) THREEFRY_ROUND(24) THREEFRY_INJECT(2, 0, 2)
    THREEFRY_ROUND(13) THREEFRY_ROUND(15) THREEFRY_ROUND(26) THREEFRY_ROUND(6) THREEFRY_INJECT(0, 1, 3)
    THREEFRY_ROUND(17) THREEFRY_ROUND(29) THREEFRY_ROUND(16) THREEFRY_ROUND(24) THREEFRY_INJECT(1, 2, 4)
    THREEFRY_ROUND(13) THREEFRY_ROUND(15) THREEFRY_ROUND(26) THREEFRY_ROUND(6) THREEFRY_INJECT(2, 0, 5)
    memcpy(out, &x0, sizeof x0);
}

void ct_random_bits_block(ct_key key, uint32_t j0, size_t n, uint32_t *out) {
    const uint32_t ks[3] = {key.w[0], key.w[1], 0x1BD11BDAu ^ key.w[0] ^ key.w[1]};
    size_t i = 0;
    for (; i + CT_RNG_LANES <= n; i += CT_RNG_LANES) random_bits_lanes(ks, j0 + (uint32_t)i, out + i);
    if (i < n) {
        uint32_t tail[CT_RNG_LANES];
        random_bits_lanes(ks, j0 + (uint32_t)i, tail);
        for (size_t k = 0; i + k < n; k++) out[i + k] = tail[k];
    }
}

ct_key ct_key_from_seed(uint64_t seed) {
    ct_key k = {{(uint32_t)(seed >> 32), (uint32_t)seed}};
    return k;
}

ct_key ct_key_split(ct_key key, uint32_t i) {
    ct_key k;
    ct_threefry2x32(key, i, 0u, k.w);
    return k;
}

ct_key ct_key_fold_in(ct_key key, uint32_t data) {
    ct_key k;
    ct_threefry2x32(key, data, 1u, k.w);
    return k;
}

void ct_random_uniform(ct_key key, float *out, size_t n, float lo, float hi) {
    CT_ASSERT(n <= CT_RANDOM_MAX_N);
    for (size_t j = 0; j < n; j++) {
        // 24 high bits -> [0, 1) exactly representable in float.
        float u = (float)(ct_random_bits(key, (uint32_t)j) >> 8) * (1.0f / 16777216.0f);
        // lo + (hi - lo) * u rounds up to hi for u near 1 when hi - lo is
        // small next to lo (never for the initializers' -a, a).
        // A span past FLT_MAX (-FLT_MAX, FLT_MAX) overflows to inf: then in
        // double, where it is finite (only there: the float form keeps the
        // bits every initializer has drawn so far).
        float span = hi - lo;
        float v = isfinite(span) ? lo + span * u : (float)((double)lo + ((double)hi - (double)lo) * (double)u);
        out[j] = v < hi ? v : nextafterf(hi, lo);
    }
}

void ct_random_normal(ct_key key, float *out, size_t n, float stddev) {
    CT_ASSERT(n <= CT_RANDOM_MAX_N);  // j is even and below n, so j + 1 < 2^32
    for (size_t j = 0; j < n; j += 2) {
        // u1 in (0, 1] so log is finite.
        double u1 = ((double)(ct_random_bits(key, (uint32_t)j) >> 8) + 1.0) / 16777216.0;
        double u2 = (double)(ct_random_bits(key, (uint32_t)(j + 1)) >> 8) / 16777216.0;
        double r = sqrt(-2.0 * log(u1));
        out[j] = (float)(stddev * r * cos(2.0 * M_PI * u2));
        if (j + 1 < n) out[j + 1] = (float)(stddev * r * sin(2.0 * M_PI * u2));
    }
}
