// Chunked (local) multi-head attention, Trax's efficient_attention.attend
// with chunks and look-back (REFORMER.md section 2 step 4, section 3), plus
// the per-head projections of SelfAttention around it. llm.c style: plain
// arrays, outputs first, backward adds (+=) into its outputs.
//
// Layout: per-head tensors are (B, H, T, d), head (b, h) rows contiguous.
// Chunks: N = T / m chunks of m positions; query chunk c attends to the key
// chunks at offsets j = -before .. +after, in that order, a window of W =
// m * (1 + before + after) keys. Offsets wrap as Trax's look_adjacent does
// (concatenate(x[j:], x[:j])): chunk (c + j) mod N when |j| < N, else chunk c
// itself (a Python slice past the end is empty). Full attention is m = T,
// before = after = 0: one chunk, one window of T.
//
// Masks, by position (Trax's info = position + 1): causal subtracts 1e9
// where the query comes before the key; exclude_self (share_qk) subtracts
// 1e5 where they are the same position; a padding mask (B, T), when given,
// subtracts 1e9 where the key is padding (mask 0), as Trax's kv_info < 0 but
// from the flag itself, so padding at positions 0 and 1 is masked too (Trax
// flips the sign of position 0 and of position 1 - 1 = 0: neither goes
// negative). The penalties add up. Then p = exp(dots - lse) with lse =
// logsumexp over the window (max-shifted, summed in double).
//
// Attention dropout (training): one keep mask of shape (m, W) for every
// chunk, head and example (Trax broadcasts it so); element (r, w) is kept
// iff ct_random_bits(key, r * W + w) >= ceil(rate * 2^32), kept values
// scaled by 1 / (1 - rate). So m * W <= 2^32 (the layer checks). The mask
// is recomputed in backward, never stored.
//
// Memory: nothing of size T x T (but full attention's one window). Forward
// gives o and lse, which backward needs besides q, k, v (flash-attention
// style: the probabilities are recomputed per window, never stored).
// Working memory is n_slots = min(threads, B*H) windows: m * W floats each
// forward (the scores), 2 * m * W backward (scores and their gradient).
#ifndef CTRAX_KERNELS_CPU_CHUNKED_ATTENTION_H
#define CTRAX_KERNELS_CPU_CHUNKED_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "ctrax/core/rng.h"

typedef struct ct_chunked_attention_dims {
    int64_t B, H, T;      // batch, heads, length
    int64_t dk, dv;       // per-head q.k and value depths
    int64_t m;            // chunk length; T % m == 0
    int64_t before, after;  // chunks looked at before / after a query chunk
    bool causal, exclude_self;
    float dropout;        // attention dropout rate in effect (0 outside training)
} ct_chunked_attention_dims;

// Thread slots the kernels use: min(ct_blas_thread_slots(), B * H), >= 1
// (the loops run on ct_blas_slot_threads of them).
int ct_chunked_attention_n_slots(const ct_chunked_attention_dims *d);
// Floats of scratch per slot: m * W (+ m) forward, 2 * m * W (+ m) backward.
int64_t ct_chunked_attention_scratch_floats(const ct_chunked_attention_dims *d, bool backward);

// q, k (B,H,T,dk), k already scaled (by 1/sqrt(dk), or normalized), v
// (B,H,T,dv), mask (B,T) or NULL (0 = padding key, anything else a real
// token) -> o (B,H,T,dv). scratch: n_slots * scratch floats(forward).
void ct_chunked_attention_forward(float *o, const float *q, const float *k, const float *v,
                                  const float *mask, float *scratch, int n_slots, ct_key key,
                                  const ct_chunked_attention_dims *d);
// do (B,H,T,dv) -> dq, dk (B,H,T,dk), dv (B,H,T,dv) +=, from what forward
// saw (q, k, v, mask) and gave (o); the probabilities are recomputed from
// the scores, the dropout's mask from key.
void ct_chunked_attention_backward(float *dq, float *dk, float *dv, float *scratch, int n_slots,
                                   const float *dout, const float *o, const float *q,
                                   const float *k, const float *v, const float *mask, ct_key key,
                                   const ct_chunked_attention_dims *d);

// Pieces the LSH kernel (kernels/cpu/lsh_attention.c) shares with this one.
// The key chunk at window offset j of query chunk c among N chunks, as
// Trax's look_adjacent builds it (see the top of this file).
int64_t ct_attention_window_chunk(int64_t c, int64_t j, int64_t N);
// row (W) <- its softmax, in place, with one exp per element (the shifted
// exps scaled by 1 / their sum, ct_row_exp_sum: the same bits for every
// vector width); returns the row's logsumexp. The chunked and LSH
// backwards call it again on the recomputed scores for the forward's very
// probabilities (exp(S - lse), ct_attention_row_probs, is within an ulp or
// two only where lse is not near the -1e5 self penalty).
float ct_attention_row_softmax(float *row, int64_t W);
// f (W): the dropout factors of mask row r of a (rows, W) mask (element w
// kept iff ct_random_bits(key, r * W + w) >= ceil(rate 2^32), kept ones
// 1 / (1 - rate)), or all ones when rate <= 0.
void ct_attention_drop_factors(float *f, int64_t r, int64_t W, ct_key key, float rate);
// f (n): the same rule for the counters j0 .. j0 + n - 1 (a part of a mask
// row); j0 + n <= 2^32. ct_attention_drop_factors is ct_attention_drop_span
// at j0 = r * W, n = W.
void ct_attention_drop_span(float *f, int64_t j0, int64_t n, ct_key key, float rate);
// row (n) <- exp(row - lse): probabilities from their scores and the row's
// logsumexp (lse >= every element; ct_vexp_nonpos, so -inf gives 0).
void ct_attention_row_probs(float *row, float lse, int64_t n);
// One row of the softmax backward through dropout, in place: p (n) the
// probabilities before dropout, g (n) the gradient of the dropped ones (dO
// v_s^T), f (n) the row's dropout factors or NULL (none), dot = dO . o (o
// includes the dropout, so dot = sum p f g). Then p <- p * (f g - dot), the
// score gradient, and g <- p f, the dropped probabilities.
void ct_attention_row_grads(float *p, float *g, const float *f, float dot, int64_t n);

// Trax's length_normalized then / sqrt(dk): k = q / sqrt(mean(q^2) + 1e-6)
// / sqrt(dk) over the last axis of q (N, dk) -> k (N, dk).
void ct_shared_key_forward(float *k, const float *q, int64_t N, int64_t dk);
// dk (N, d) -> dq (N, d) +=
void ct_shared_key_backward(float *dq, const float *dk, const float *q, int64_t N, int64_t d);

// Per-head projection: x (B,T,D), w (H,D,d), bias (H,d) or NULL -> out
// (B,H,T,d), out[b,h] = x[b] w[h] + bias[h].
void ct_heads_project_forward(float *out, const float *x, const float *w, const float *bias, int64_t B,
                              int64_t T, int64_t D, int64_t H, int64_t d);
// dout (B,H,T,d) -> dx (B,T,D) +=, dw (H,D,d) +=, dbias (H,d) += (if not NULL)
void ct_heads_project_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                               const float *w, int64_t B, int64_t T, int64_t D, int64_t H, int64_t d);
// Output projection summed over heads: o (B,H,T,d), w (H,d,D) -> y (B,T,D),
// y[b] = sum_h o[b,h] w[h] (heads added in order h = 0, 1, ...).
void ct_heads_merge_forward(float *y, const float *o, const float *w, int64_t B, int64_t T, int64_t D,
                            int64_t H, int64_t d);
// dy (B,T,D) -> do (B,H,T,d) +=, dw (H,d,D) +=
void ct_heads_merge_backward(float *dout, float *dw, const float *dy, const float *o, const float *w,
                             int64_t B, int64_t T, int64_t D, int64_t H, int64_t d);

#endif
