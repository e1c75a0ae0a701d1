// Synthetic tasks that need no downloads, as Trax's (trax/data/inputs.py:
// sequence_copy_inputs, addition_inputs). Example i of a task is a pure
// function of (task, seed, i), so a stream of them seeks in O(1).
#ifndef CTRAX_DATA_SYNTHETIC_H
#define CTRAX_DATA_SYNTHETIC_H

#include <stdbool.h>
#include <stdint.h>

#include "ctrax/core/error.h"
#include "ctrax/data/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

// The copy task: sequences "0 w 0 w" of length 2 * n + 2 with the tokens of w
// drawn uniformly from [1, vocab_size); loss weights are 1 on the second w
// only (the part the model must produce). With reverse, the second w is
// reversed (Trax's reverse=True). n is `length`, or with 0 < min_length <
// length drawn uniformly from [min_length, length] per example (Trax draws
// one length per batch; here the batch stage pads or buckets mixed lengths).
// (Trax draws w from [1, vocab_size - 1), never using the last id; ctrax uses
// every id but 0.)
typedef struct ct_copy_task {
    int vocab_size;  // tokens 0..vocab_size-1; 0 is the separator
    int length;      // length of w (the longest, with min_length)
    bool reverse;
    uint64_t seed;   // train and eval streams use different seeds
    int min_length;  // 0: every w has `length` tokens
} ct_copy_task;

static inline int ct_copy_task_seq_len(const ct_copy_task *t) { return 2 * t->length + 2; }

// Fills batch number `index`: tokens (batch, seq_len) int32 (inputs and
// targets alike: the model shifts right itself) and weights (batch, seq_len).
// Batch i is a pure function of (task, i): its rows draw from the key
// fold_in(fold_in(key(seed), low 32 bits of i), high 32 bits of i), token k
// of row b from element b * length + k. Needs a fixed length (min_length 0
// or == length). This is the batch-indexed form `ctrax train` uses; the
// stream (ct_copy_stream_new) draws per example, so its sequences differ.
void ct_copy_task_batch(const ct_copy_task *t, uint64_t index, int batch, int32_t *tokens, float *weights);

// The copy task as a stream of examples: (inputs int32 (L), targets int32
// (L), weights f32 (L)), inputs == targets, L = 2n + 2 (-1 in the signature
// when n varies). Endless.
ct_status ct_copy_stream_new(ct_stream **out, const ct_copy_task *t, ct_error *err);

// The addition task, as Trax's addition_inputs: "<S> x + y <S> (x+y)" with
// numbers written little-endian in base vocab_size - 3; token d+1 is digit d,
// vocab_size-2 is "+", vocab_size-1 is <S>, 0 is padding. Lengths are drawn as
// Trax draws them: with a = (min_length-1)/2, x has l1 = a + U[0, (max_length -
// a + 1)/2) digits and y has l2 = 1 + U[0, max_length - l1 - 1); a number's top
// digit is non-zero unless it has one digit. Loss weights are 1 on the sum
// only. Examples (inputs int32 (L), targets int32 (L), weights f32 (L)),
// inputs == targets, L varies (at most 2 * max_length + 1); Trax pads each
// batch to a multiple of 32 (ct_batch_params.pad_to_multiple). Endless.
typedef struct ct_addition_task {
    int vocab_size;  // base + 3, base >= 2
    int min_length;  // >= 3
    int max_length;  // >= min_length
    uint64_t seed;
} ct_addition_task;

ct_status ct_addition_stream_new(ct_stream **out, const ct_addition_task *t, ct_error *err);

#ifdef __cplusplus
}
#endif
#endif
