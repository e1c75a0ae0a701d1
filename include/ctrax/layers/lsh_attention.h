// Trax's LSHSelfAttention (REFORMER.md section 2): shared-QK attention over
// buckets of a locality-sensitive hash, chunked after sorting by bucket.
#ifndef CTRAX_LAYERS_LSH_ATTENTION_H
#define CTRAX_LAYERS_LSH_ATTENTION_H

#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// The most factors n_buckets may list.
#define CT_LSH_MAX_BUCKET_FACTORS 4

// Trax's arguments and defaults (ct_lsh_self_attention_default_params).
// Not here: share_qk (always shared), mode ('train' or eval by the ctx;
// 'predict' is not supported), predict_*, bias (crashes in Trax),
// n_parallel_heads and the loop flags (heads are scheduled over threads).
// masked and max_length_for_buckets are supported (below).
typedef struct ct_lsh_self_attention_params {
    int n_heads;          // 2
    int d_qk, d_v;        // 64, 64
    bool causal;          // false
    int chunk_len;        // 128: chunks of the sorted length; (n_hashes T) % chunk_len == 0
    int n_chunks_before;  // 1
    int n_chunks_after;   // 0
    int n_hashes;         // 1: hash rounds R
    // All 0 (Trax's None): nb = 2 max(1, T / chunk_len) from the length,
    // factored as Trax when over 128; {nb}: nb buckets; {f1, f2, ...}:
    // Trax's list of factors (f1 f2 ... buckets), the unused entries 0.
    // Every factor even.
    int n_buckets[CT_LSH_MAX_BUCKET_FACTORS];
    float attention_dropout;  // 0: one (chunk_len, window) mask for all chunks, heads, examples
    float output_dropout;     // 0: one (D,) channel mask for all positions and examples
    bool masked;              // false: n_in 1; true: n_in 2, (x, mask (B, T)): see below
    int max_length_for_buckets;  // 0 (Trax's None): the state is sized by init's T; else by this
} ct_lsh_self_attention_params;

ct_lsh_self_attention_params ct_lsh_self_attention_default_params(void);

// LSHSelfAttention: x (B, T, D) -> (B, T, D); masked: (x, mask) -> (B, T,
// D). Per example b and head h:
// q = x Wq[h], v = x Wv[h]; buckets of q by random rotations (R rounds);
// rows sorted by (bucket, position); chunked attention over the sorted R T
// rows with keys k = RMS-normalised q / sqrt(d_qk), look-back windows with
// Trax's wrap-around, the causal (-1e9) and self (-1e5) masks by original
// position; unsorted; rounds combined by softmax over their logsumexps;
// y = sum_h o_h Wo[h], then output dropout. The step key k gives the
// attention dropout mask from split(k, 0), the output one from split(k, 1).
// The window of 1 + n_chunks_before + n_chunks_after chunks may wrap round
// the N = R T / chunk_len sorted chunks up to 2 N + 1 of them; a wider one
// (it only repeats chunks) fails, at init and at any forward or backward
// (an eval may be shorter than init's input). R T is at most 2^31 - 1 (the
// sort's indices are 32-bit) and R times the bucket count under 2^24.
//
// Weights as SelfAttention's with share_qk: "Wq[h]" (D, d_qk), "Wv[h]" (D,
// d_v), "Wo[h]" (d_v, D), head h's key split(split(layer key, h), 0 / 2 /
// 3), U(+-sqrt(6 / (D + d H))).
//
// masked (Trax's masked=True, whose mask is bool, true = real token): the
// mask (B, T) is f32 (as the pipeline's loss weights, which mark padding
// with 0) or int32 (as token ids); 0 (either sign, for f32) is padding,
// anything else a real token. As Trax: NB grows by one bucket, NB - 1,
// which every padding position gets in every round (so padding sorts after
// the real positions of its round and never moves them), and keys at
// padding lose 1e9 on top of the causal and self penalties. Unlike Trax,
// whose kv_info = position x (-1) + 1 is never negative at positions 0 and
// 1, the flag itself decides, so padding there is masked too. Queries at
// padding are not masked: their outputs are whatever their window gives.
// The mask takes no gradient (backward's grad_in[1] has no data); stored
// buckets are reused under a matching tag whatever the mask (a
// recomputation sees the same one).
//
// State (sized at init for its B and Lb = max_length_for_buckets, or
// init's T when that is 0; a training forward takes init's B and any T up
// to Lb, an eval forward any B and T):
//   "buckets" (B H, R Lb): the last hashed buckets of each (b, h), exact
//     integers in f32, round offset r NB included; a T below Lb uses the
//     prefix R T of each row (zero past it).
//   "hash" (11): the hash key (two words), the count of hashing forwards,
//     the tag of the stored buckets: the step key they were hashed under
//     (two words) and their T (0: none yet). Each 32-bit word as two exact
//     16-bit floats, so the state stays finite and survives a checkpoint
//     (a resumed run continues the same hash sequence).
// Hashing: a training-mode forward whose step key and T equal the tag
// reuses the stored buckets and changes no state; any other forward (every
// eval forward: an evaluator runs all its batches under one key) hashes q
// with rotations Rot ~ N(0, 1) (d_qk, R, n_rot / 2) drawn from
// split(sub, b H + h), where (next, sub) = (split(k, 0), split(k, 1)) of the
// state's hash key k (before the first hashing: split(init key, 4)), and
// stores next and count + 1, and (training forwards only) the buckets and
// the tag; an eval forward hashes into its own memory, so it takes any B and
// T (Trax's state, sized at init, fails on other shapes: REFORMER.md section
// 7) and leaves the stored buckets as they were. So hashing depends on the
// init key and the count of forwards (as Trax), not on the step key, and a
// training step that runs the layer again under its key sees the stored
// buckets, bitwise, whatever the input: the gradient check holds them fixed
// that way. Backward reads the buckets from its tape, never from the state.
//
// Recompute in the memory-efficient trainer (src/train/reversible_trainer.c):
// forward_turn saves the unit's state range before the forward (to roll a
// failed step back) and after it; backward_turn puts the state after back,
// runs reverse_and_grad (ReversibleHalfResidual calls this forward again
// with the same key), then puts it back again. This is
// Trax's order: the recomputation finds the tag of its own forward, reuses
// the stored buckets and hashes nothing, so it attends exactly as the
// forward did even where the attention's input is reconstructed by
// subtraction (equal up to rounding, which could flip an argmax tie if it
// were hashed again). The state it leaves is the forward's
// (test_reversible_recompute).
//
// Memory: forward keeps x, q, v, the combined o, each round's o and lse
// and the buckets (all linear in T) for backward; the working memory of a
// (b, h) is linear in R T plus one or two (chunk_len, window) score
// windows, never T x T (unless chunk_len = R T asks for one window).
//
// Numerics: a query whose only targets are its own copies (causal position
// 0 with R > 1 in one window) has a float logsumexp near -1e5 whose ulp is
// 1/128; its probabilities are normalized by their sum, in forward and in
// backward alike (Trax's exp(dots - lse) sum to 1 only within ~0.4%
// there). The rounds are combined in double relative to their maximum.
//
// Errors name the layer: a training forward's B other than init's or T
// over Lb (naming T and max_length_for_buckets, at init or forward), R T not a multiple of
// chunk_len, odd or non-positive bucket counts, negative sizes (and a
// negative max_length_for_buckets), dropout outside [0, 1), and a mask that
// is not f32 or int32 (B, T) of x's B and T.
ct_layer *ct_lsh_self_attention(ct_lsh_self_attention_params p);

#ifdef __cplusplus
}
#endif
#endif
