// LSH attention for one (example, head), Trax's LSHSelfAttention core
// (REFORMER.md section 2 steps 2-6): hashing by random rotations, the sort
// by bucket then position, chunked attention with look-back over the sorted
// length R*T, the unsort, and the logsumexp combination over hash rounds.
// llm.c style: plain arrays, outputs first, backward adds (+=).
//
// Buckets are floats holding exact integers (they live in a layer's f32
// state slab): bucket[r*T + t] in [r*NB, (r+1)*NB), round offset included.
//
// Windows and dropout are those of kernels/cpu/chunked_attention.h (the
// same wrap-around of look_adjacent, one (m, W) keep mask with counter
// r*W + w for every chunk, head and example), but the masks compare the
// original positions of the sorted rows: -1e9 where the query position is
// before the key's (causal), -1e5 where they are equal (always on for LSH;
// it also hits the same position met in another round), and -1e9 where the
// key's position is padding (mask 0, when a mask is given): Trax's kv_info
// < 0, but read from the flag, so padding at positions 0 and 1 is masked
// too (Trax's info = position x (+-1) + 1 is never negative there).
//
// Padding (masked layers): Trax's extra bucket. The hash gives padding
// positions bucket NB - 1 of NB = (the factors' product) + 1, so they sort
// after every real position of their round; NB counts that extra bucket.
//
// Memory: per call a work area of ct_lsh_work_floats floats, linear in
// R*T plus one or two (m, W) score windows; never T x T.
#ifndef CTRAX_KERNELS_CPU_LSH_ATTENTION_H
#define CTRAX_KERNELS_CPU_LSH_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "ctrax/core/rng.h"

typedef struct ct_lsh_dims {
    int64_t T, dk, dv;      // length, per-head q.k and value depths
    int64_t R, NB;          // hash rounds, buckets per round (masked: the padding one included)
    int64_t m;              // chunk length; (R * T) % m == 0
    int64_t before, after;  // chunks looked at before / after a query chunk
    bool causal;
    float dropout;  // attention dropout rate in effect (0 outside training)
} ct_lsh_dims;

// Floats of work area one forward (backward: true) call needs; the area
// must be 8-byte aligned (it begins with int64 sort keys).
int64_t ct_lsh_work_floats(const ct_lsh_dims *d, bool backward);

// Hashes q (T, dk) with rot (dk, R, n_rot / 2), n_rot = sum of the factors
// f[0 .. n_f) (each even): per round r and factor j, b_j = argmax(concat(z,
// -z)) over the factor's columns (first index on ties), bucket = sum_j b_j
// prod_{i<j} f_i, plus r * NB. With mask (T; 0 = padding) NB = prod f + 1
// and padding positions get bucket prod f (Trax's extra bucket); without
// (NULL) NB = prod f. -> buckets (R * T).
void ct_lsh_hash(float *buckets, const float *q, const float *mask, const float *rot, int64_t T, int64_t dk,
                 int64_t R, const int *f, int n_f);

// q (T, dk), v (T, dv), mask (T; 0 = padding key) or NULL, buckets (R*T)
// -> o_r (R, T, dv) and lse_r (R, T): each round's attention output and
// logsumexp, unsorted.
void ct_lsh_forward(float *o_r, float *lse_r, const float *q, const float *v, const float *mask,
                    const float *buckets, float *work, ct_key key, const ct_lsh_dims *d);
// o (T, dv) = sum_r softmax_r(lse_r) o_r (o = o_r for R = 1, bitwise);
// w: R floats of scratch.
void ct_lsh_combine(float *o, const float *o_r, const float *lse_r, float *w, const ct_lsh_dims *d);
// do (T, dv) of the combined o -> dq (T, dk) +=, dv (T, dv) +=, from what
// forward saw (q, v, mask, buckets) and gave (lse_r, o); not o_r, whose
// terms cancel (lsh_attention.c, combine_backward).
void ct_lsh_backward(float *dq, float *dv, const float *dout, const float *o, const float *lse_r, const float *q,
                     const float *v, const float *mask, const float *buckets, float *work, ct_key key,
                     const ct_lsh_dims *d);

#endif
