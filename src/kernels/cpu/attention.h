// Causal multi-head scaled dot-product attention with q, k and v as three
// (B, T, C) inputs, in two versions:
//
// - ct_attention_forward / _backward, the layer's: tiled, flash-attention
//   style. Query tiles of `tile` positions; query tile i (rows t0 .. t0 +
//   nr) meets only the keys s < t0 + nr, in key blocks of up to 4 tiles
//   (one GEMM per block; the keys past the diagonal are skipped, the block
//   that crosses it is masked inside). Forward keeps a running max and sum
//   per row over the blocks (online softmax) and gives out and the
//   logsumexp of each row, (B, NH, T); backward recomputes each block's
//   probabilities from q, k and the logsumexp. Nothing of size T x T is
//   kept: working memory is one or two (tile, 4 tile) blocks per thread.
// - ct_attention_forward_ref / _backward_ref, llm.c style (after
//   attention_forward / attention_backward in train_gpt2.c): the whole
//   (B, NH, T, T) probabilities, kept for backward. The reference the tests
//   compare the tiled kernel with.
//
// Heads: C = NH * hs; head h of q, k, v and out is columns [h*hs, (h+1)*hs).
// Each (b, h) pair, or (b, h, query tile) in the tiled forward, is one
// thread's work with single-threaded BLAS calls (OpenBLAS runs one thread
// inside a parallel region), so results do not depend on the thread count.
// Backward adds (+=) into its outputs.
//
// Dropout on the attention probabilities, by the rule of the Dropout layer,
// the same in both versions and for every tile size (a function of the key
// and the position only): element (b, h, t, s) has counter j = ((b*NH + h)*T
// + t)*T + s and is kept iff ct_random_bits(key, j) >= ceil(dropout * 2^32);
// kept values are scaled by 1 / (1 - dropout). So j must fit in 32 bits:
// B*NH*T*T <= 2^32 (the layer checks). Backward recomputes the mask from the
// same key; nothing of it is stored. The softmax's normalizer is that of the
// probabilities before dropout (the logsumexp ignores the mask).
#ifndef CTRAX_KERNELS_CPU_ATTENTION_H
#define CTRAX_KERNELS_CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "ctrax/core/rng.h"

// The layer's tile edge for sequences of length T: 64 up to T 512, 128
// beyond. A query tile of q meets the keys it sees in blocks of about 512
// (attention.c), so a tile costs a few GEMMs whatever T is; smaller tiles
// skip more of the masked triangle (the diagonal tiles are half masked),
// larger ones make GEMMs that run nearer BLAS's peak. Measured (fwd + bwd,
// OpenBLAS SkylakeX, hs 64, `bench_lm_speed --profile`, two runs each), ms
// a step with tiles 128 / 64: at 2 threads T 128 (config A) 18.5-18.7 /
// 16.0-16.1, T 256 (config B) 80.9-81.8 / 70.0-70.8, T 512 (batch 4)
// 37.4-38.1 / 36.8-37.3, T 1024 (batch 2) 64.7-65.2 / 66.7-67.4, T 2048
// (config C) 122-125 / 129-130; at 1 thread A 31-32 / 25-27, B 137-144 /
// 125-127.
int64_t ct_attention_tile(int64_t T);

// How many scratch slots (threads) the kernels may use: ct_blas_thread_slots(),
// not the count of the moment, so a planned arena holds at any count; the
// loops run on ct_blas_slot_threads of them.
int ct_attention_n_slots(void);

// ---- tiled --------------------------------------------------------------------------------------

// Floats of scratch the tiled kernels need per slot: forward one (tile,
// key block) score block, about 512 tile floats; backward two.
int64_t ct_attention_scratch_floats(int64_t tile, bool backward);
// q, k, v (B, T, C) -> out (B, T, C), lse (B, NH, T):
// lse[b,h,t] = logsumexp_{s<=t}(q[b,t,h] . k[b,s,h] / sqrt(hs))
// out[b,t,h] = sum_{s<=t} drop(exp(score[t,s] - lse[b,h,t])) * v[b,s,h]
// scratch: n_slots * ct_attention_scratch_floats(tile, false) floats; tile >= 1.
void ct_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          float *scratch, int n_slots, ct_key key, float dropout, int64_t B, int64_t T,
                          int64_t C, int64_t NH, int64_t tile);
// dout (B, T, C) -> dq, dk, dv (B, T, C), written (every element set, not
// added to), from the inputs forward saw and the out and lse it gave; the
// same tile. scratch: n_slots * ct_attention_scratch_floats(tile, true).
void ct_attention_backward(float *dq, float *dk, float *dv, float *scratch, int n_slots, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k, const float *v,
                           ct_key key, float dropout, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t tile);

// ---- reference (tests only) ----------------------------------------------------------------------

// Floats of scratch the reference kernels need per slot: forward T*T when
// dropout > 0 (else none), backward 2*T*T when dropout > 0 (else T*T).
int64_t ct_attention_ref_scratch_floats(int64_t T, float dropout, bool backward);
// q, k, v are (B, T, C); out is (B, T, C); att is (B, NH, T, T): the softmax
// probabilities before dropout, row t zero past column t.
// att[b,h,t,s] = softmax_{s<=t}(q[b,t,h] . k[b,s,h] / sqrt(hs))
// out[b,t,h]   = sum_{s<=t} drop(att)[b,h,t,s] * v[b,s,h]
// scratch: n_slots * ct_attention_ref_scratch_floats(T, dropout, 0) floats
// (may be NULL when that is 0).
void ct_attention_forward_ref(float *out, float *att, const float *q, const float *k, const float *v,
                              float *scratch, int n_slots, ct_key key, float dropout, int64_t B, int64_t T,
                              int64_t C, int64_t NH);
// dout (B, T, C) -> dq, dk, dv (B, T, C) +=; att and the inputs as forward
// saw them. scratch: n_slots * ct_attention_ref_scratch_floats(T, dropout, 1).
void ct_attention_backward_ref(float *dq, float *dk, float *dv, float *scratch, int n_slots,
                               const float *dout, const float *att, const float *q, const float *k,
                               const float *v, ct_key key, float dropout, int64_t B, int64_t T, int64_t C,
                               int64_t NH);

#endif
