// Trax's efficient_attention.SelfAttention (REFORMER.md section 3): multi-head
// self-attention that is local and memory-efficient when chunk_len is set,
// and full attention when it is not (the same kernel with one chunk of T).
#ifndef CTRAX_LAYERS_EFFICIENT_ATTENTION_H
#define CTRAX_LAYERS_EFFICIENT_ATTENTION_H

#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Trax's arguments and defaults (ct_self_attention_default_params). Trax's
// mode and n_parallel_heads are not here: 'train' or eval by the ctx, and
// heads are scheduled over threads.
typedef struct ct_self_attention_params {
    int n_heads;          // 2
    int d_qk, d_v;        // 64, 64: per-head depth of q.k and of values
    bool share_qk;        // false: k = RMS-normalised q / sqrt(d_qk), self masked (-1e5)
    bool causal;          // false: position t sees keys <= t (-1e9 on the rest)
    int chunk_len;        // 0 (Trax's None): full attention; else T % chunk_len == 0
    int n_chunks_before;  // 0: key chunks before a query chunk in its window
    int n_chunks_after;   // 0: and after it; both must be 0 for full attention
    bool bias;            // false: zero-initialised bq, bk, bv (no output bias)
    bool masked;          // false: n_in 1; true: n_in 2, (x, mask (B, T)): see below
    float attention_dropout;  // 0: on the probabilities, one (chunk_len, window) mask
    float output_dropout;     // 0: one (D,) channel mask for every position and example
} ct_self_attention_params;

ct_self_attention_params ct_self_attention_default_params(void);

// SelfAttention: x (B, T, D) -> (B, T, D); masked: (x, mask) -> (B, T, D).
// Per head h and example b:
// q, k, v = x Wq[h] (+bq[h]), x Wk[h] (+bk[h]), x Wv[h] (+bv[h]); chunked
// attention (kernels/cpu/chunked_attention.h: windows with Trax's
// wrap-around, causal and self masks, logsumexp softmax, attention
// dropout); y = sum_h o_h Wo[h], then output dropout. Dropout only in
// training mode; the step key k gives the attention mask split(k, 0) and
// the output mask split(k, 1), shared by all heads and examples as in Trax.
// The window of 1 + n_chunks_before + n_chunks_after chunks may wrap round
// the input's N = T / chunk_len chunks up to 2 N + 1 of them; a wider one
// (it only repeats chunks) fails, at init and at any forward or backward
// whose T has fewer chunks than init's.
//
// masked (Trax's masked=True, whose mask is bool, true = real token): the
// mask (B, T) is f32 (as the pipeline's loss weights, which mark padding
// with 0) or int32 (as token ids); 0 (either sign, for f32) is padding,
// anything else a real token. Keys at padding positions lose 1e9, on top
// of the causal and self penalties (Trax's kv_info < 0). Unlike Trax, whose
// kv_info = position x (-1) + 1 is never negative at positions 0 and 1, the
// flag itself decides, so padding there is masked too. Queries at padding
// are not masked (as Trax): their outputs are whatever their window gives.
// The mask takes no gradient (backward's grad_in[1] has no data) and is
// kept on the tape by reference, as x is.
//
// Weights, Trax's stacked layout, each head declared on its own so that its
// key is Trax's: "Wq[h]" (D, d_qk), "Wk[h]" (unless share_qk), "Wv[h]" (D,
// d_v), "Wo[h]" (d_v, D), contiguous over h (so (H, D, d) as one array),
// then with bias "bq" (H, d_qk), "bk" (unless share_qk), "bv" (H, d_v).
// Head h's key is split(layer key, h), split again as q 0, k 1, v 2, o 3;
// each weight is U(+-sqrt(6 / (D + d H))), d = d_qk for Wq, Wk and d_v for
// Wv, Wo. Trax draws Wo as (D, d_v) and transposes it; ctrax draws the
// (d_v, D) array directly (the numbers differ from JAX's anyway, the
// distribution is the same).
//
// Memory: forward keeps q, k, v, o (B, H, T, d) for backward, linear in T
// (backward recomputes each window's row softmax, bitwise the forward's); the working memory of both passes is a window
// of scores per thread, chunk_len x chunk_len (1 + before + after), never
// T x T (but for full attention, whose one window is T x T).
//
// Errors at init or forward name the layer: T not a multiple of chunk_len
// (both numbers), before/after set without chunk_len, negative sizes,
// dropout outside [0, 1), a dropout mask over 2^32 elements, and a mask
// that is not f32 or int32 (B, T) of x's B and T.
ct_layer *ct_self_attention(ct_self_attention_params p);

#ifdef __cplusplus
}
#endif
#endif
