// Counter-based random numbers: threefry-2x32 (20 rounds), as in JAX.
//
// There is no global generator. A key is two 32-bit words; new keys come from
// ct_key_split and ct_key_fold_in, which are pure functions, so the same key
// always yields the same numbers in any order and on any thread.
#ifndef CTRAX_CORE_RNG_H
#define CTRAX_CORE_RNG_H

#include <stdint.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_key {
    uint32_t w[2];
} ct_key;

// The threefry-2x32 block function: encrypts the counter (c0, c1) under key.
void ct_threefry2x32(ct_key key, uint32_t c0, uint32_t c1, uint32_t out[2]);

// A key from a seed: (high 32 bits, low 32 bits), as jax.random.PRNGKey.
ct_key ct_key_from_seed(uint64_t seed);
// The i-th of the keys split from key: ct_key_split(k, i) = threefry(k, (i, 0)).
// It does not depend on how many keys are split off, so a combinator with n
// sublayers gives sublayer i ct_key_split(k, i).
ct_key ct_key_split(ct_key key, uint32_t i);
// A key that mixes data into key: threefry(k, (data, 1)).
ct_key ct_key_fold_in(ct_key key, uint32_t data);

// The most numbers ct_random_uniform and ct_random_normal draw from one key
// (one per 32-bit counter).
#define CT_RANDOM_MAX_N ((uint64_t)1 << 32)
// n uniform floats in [lo, hi), element j from threefry(key, (j, 2)).
// n <= CT_RANDOM_MAX_N.
void ct_random_uniform(ct_key key, float *out, size_t n, float lo, float hi);
// n normal floats (mean 0, given stddev), by Box-Muller over uniform pairs
// (elements j and j + 1 from counters j and j + 1). n <= CT_RANDOM_MAX_N.
void ct_random_normal(ct_key key, float *out, size_t n, float stddev);
// The 32 random bits of element j of key's stream: threefry(key, (j, 2))[0].
// ct_random_uniform draws element j from these same bits.
static inline uint32_t ct_random_bits(ct_key key, uint32_t j) {
    uint32_t out[2];
    ct_threefry2x32(key, j, 2u, out);
    return out[0];
}
// ct_random_bits(key, j0 + i) for i in [0, n), into out: the same numbers,
// several times faster (vector code). Counters wrap modulo 2^32.
void ct_random_bits_block(ct_key key, uint32_t j0, size_t n, uint32_t *out);

#ifdef __cplusplus
}
#endif
#endif
