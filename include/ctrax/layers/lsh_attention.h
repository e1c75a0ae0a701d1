// Trax's LSHSelfAttention (REFORMER.md section 2): shared-QK attention over
// buckets of a locality-sensitive hash, chunked after sorting by bucket.
#ifndef CTRAX_LAYERS_LSH_ATTENTION_H
#define CTRAX_LAYERS_LSH_ATTENTION_H

#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Trax's arguments and defaults (ct_lsh_self_attention_default_params).
// Not here: share_qk (always shared), mode ('train' or eval by the ctx;
// 'predict' is not supported), predict_*, bias (crashes in Trax),
// n_parallel_heads and the loop flags (heads are scheduled over threads).
typedef struct ct_lsh_self_attention_params {
    int n_heads;          // 2
    int d_qk, d_v;        // 64, 64
    bool causal;          // false
    int chunk_len;        // 128: chunks of the sorted length; (n_hashes T) % chunk_len == 0
    int n_chunks_before;  // 1
    int n_chunks_after;   // 0
    int n_hashes;         // 1: hash rounds R
    // {0, 0} (Trax's None): nb = 2 max(1, T / chunk_len) from the length,
    // factored as Trax when over 128; {nb, 0}: nb buckets; {f1, f2}: a
    // factored pair (f1 f2 buckets). Every factor even.
    int n_buckets[2];
    float attention_dropout;  // 0: one (chunk_len, window) mask for all chunks, heads, examples
    float output_dropout;     // 0: one (D,) channel mask for all positions and examples
    bool masked;              // false: n_in 1; true: n_in 2, (x, mask (B, T) f32, nonzero = real token)
    int max_length_for_buckets;  // 0: the state is sized by init's T; else by this (a longer T fails)
} ct_lsh_self_attention_params;

ct_lsh_self_attention_params ct_lsh_self_attention_default_params(void);

// LSHSelfAttention: x (B, T, D) -> (B, T, D). Per example b and head h:
// q = x Wq[h], v = x Wv[h]; buckets of q by random rotations (R rounds);
// rows sorted by (bucket, position); chunked attention over the sorted R T
// rows with keys k = RMS-normalised q / sqrt(d_qk), look-back windows with
// Trax's wrap-around, the causal (-1e9) and self (-1e5) masks by original
// position; unsorted; rounds combined by softmax over their logsumexps;
// y = sum_h o_h Wo[h], then output dropout. The step key k gives the
// attention dropout mask from split(k, 0), the output one from split(k, 1).
//
// Weights as SelfAttention's with share_qk: "Wq[h]" (D, d_qk), "Wv[h]" (D,
// d_v), "Wo[h]" (d_v, D), head h's key split(split(layer key, h), 0 / 2 /
// 3), U(+-sqrt(6 / (D + d H))).
//
// State (sized at init for its B and T = Lb):
//   "buckets" (B H, R Lb): the last hashed buckets of each (b, h), exact
//     integers in f32, round offset r NB included; zero past R T.
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
// stores the buckets, next, the tag and count + 1. So hashing depends on the
// init key and the count of forwards (as Trax), not on the step key, and a
// training step that runs the layer again under its key sees the stored
// buckets, bitwise, whatever the input: the gradient check holds them fixed
// that way. Backward reads
// the buckets from its tape, never from the state.
//
// Recompute in the memory-efficient trainer (src/train/reversible_trainer.c,
// and the contract of include/ctrax/layers/reversible.h): forward_turn
// saves the unit's state range before the forward (state_before) and after
// it (state_after); backward_turn puts state_before back, runs
// reverse_and_grad (ReversibleHalfResidual calls this forward again with the
// same key), then puts state_after back. The recompute so sees the hash
// key the first forward saw and draws the same rotations; the tag is the
// step before's, so it hashes again, once, and leaves the same state. On
// the same q the buckets are bitwise the same (test_reversible_recompute: the context
// item of a half-residual passes through exactly). In a deeper stack the
// attention's input is reconstructed by subtraction, equal up to rounding,
// and a bucket flips only where that rounding crosses an argmax tie. Made
// exact by a trainer that hands reverse_and_grad the state after the
// forward (Trax's order): the tag then matches and nothing is hashed (also
// tested); that is the trainer's to change, not this layer's.
//
// Memory: forward keeps x, q, v, the combined o, each round's o and lse
// and the buckets (all linear in T) for backward; the working memory of a
// (b, h) is linear in R T plus one or two (chunk_len, window) score
// windows, never T x T (unless chunk_len = R T asks for one window).
//
// Numerics: a query whose only targets are its own copies (causal position
// 0 with R > 1 in one window) has a float logsumexp near -1e5 whose ulp is
// 1/128, so its probabilities sum to 1 within ~0.4%, as in Trax. The
// rounds are combined in double relative to their maximum.
//
// Errors name the layer: B other than init's, T over init's, R T not a
// multiple of chunk_len, odd or non-positive bucket counts, negative sizes,
// dropout outside [0, 1).
ct_layer *ct_lsh_self_attention(ct_lsh_self_attention_params p);

#ifdef __cplusplus
}
#endif
#endif
