#include "ctrax/core/rng.h"

#include <math.h>

#include "ctrax/core/error.h"

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
    CT_ASSERT(n <= UINT32_MAX);
    for (size_t j = 0; j < n; j++) {
        // 24 high bits -> [0, 1) exactly representable in float.
        float u = (float)(ct_random_bits(key, (uint32_t)j) >> 8) * (1.0f / 16777216.0f);
        out[j] = lo + (hi - lo) * u;
    }
}

void ct_random_normal(ct_key key, float *out, size_t n, float stddev) {
    CT_ASSERT(n <= UINT32_MAX / 2);
    for (size_t j = 0; j < n; j += 2) {
        // u1 in (0, 1] so log is finite.
        double u1 = ((double)(ct_random_bits(key, (uint32_t)j) >> 8) + 1.0) / 16777216.0;
        double u2 = (double)(ct_random_bits(key, (uint32_t)(j + 1)) >> 8) / 16777216.0;
        double r = sqrt(-2.0 * log(u1));
        out[j] = (float)(stddev * r * cos(2.0 * M_PI * u2));
        if (j + 1 < n) out[j + 1] = (float)(stddev * r * sin(2.0 * M_PI * u2));
    }
}
