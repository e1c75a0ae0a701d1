// Causal multi-head scaled dot-product attention, llm.c style (after
// attention_forward / attention_backward in train_gpt2.c), with q, k and v as
// three inputs instead of one packed qkv. Backward adds into its outputs.
//
// Heads: C = NH * hs; head h of q, k, v and out is columns [h*hs, (h+1)*hs).
// Work is split over the B*NH (b, h) pairs with OpenMP; each pair is done by
// one thread with single-threaded BLAS calls (OpenBLAS runs one thread inside
// a parallel region), so results do not depend on the thread count.
//
// Dropout on the attention probabilities, by the rule of the Dropout layer:
// element (b, h, t, s) has counter j = ((b*NH + h)*T + t)*T + s and is kept
// iff ct_random_bits(key, j) >= ceil(dropout * 2^32); kept values are scaled
// by 1 / (1 - dropout). So j must fit in 32 bits: B*NH*T*T <= 2^32 (the
// layer checks). Backward recomputes the mask from the same key; nothing of
// it is stored.
#ifndef CTRAX_KERNELS_CPU_ATTENTION_H
#define CTRAX_KERNELS_CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "ctrax/core/rng.h"

// How many scratch slots (threads) the kernels may use: omp_get_max_threads().
int ct_attention_n_slots(void);
// Floats of scratch the kernels need per slot: forward T*T when dropout > 0
// (else none), backward 2*T*T when dropout > 0 (else T*T).
int64_t ct_attention_scratch_floats(int64_t T, float dropout, bool backward);

// q, k, v are (B, T, C); out is (B, T, C); att is (B, NH, T, T): the softmax
// probabilities before dropout, row t zero past column t.
// att[b,h,t,s] = softmax_{s<=t}(q[b,t,h] . k[b,s,h] / sqrt(hs))
// out[b,t,h]   = sum_{s<=t} drop(att)[b,h,t,s] * v[b,s,h]
// scratch: n_slots * ct_attention_scratch_floats(T, dropout, 0) floats (may be
// NULL when that is 0).
void ct_attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                          float *scratch, int n_slots, ct_key key, float dropout, int64_t B, int64_t T,
                          int64_t C, int64_t NH);
// dout (B, T, C) -> dq, dk, dv (B, T, C) +=; att and the inputs as forward
// saw them. scratch: n_slots * ct_attention_scratch_floats(T, dropout, 1).
void ct_attention_backward(float *dq, float *dk, float *dv, float *scratch, int n_slots,
                           const float *dout, const float *att, const float *q, const float *k,
                           const float *v, ct_key key, float dropout, int64_t B, int64_t T, int64_t C,
                           int64_t NH);

#endif
