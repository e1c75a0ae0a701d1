// Synthetic tasks that need no downloads, as Trax's: each batch is a pure
// function of (task, seed, batch index), so a data position is one integer.
#ifndef CTRAX_DATA_SYNTHETIC_H
#define CTRAX_DATA_SYNTHETIC_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The copy task: sequences "0 w 0 w" of length 2 * length + 2 with w drawn
// uniformly from [1, vocab_size); loss weights are 1 on the second w only
// (the part the model must produce). With reverse, the second w is reversed.
typedef struct ct_copy_task {
    int vocab_size;  // tokens 0..vocab_size-1; 0 is the separator
    int length;      // length of w
    bool reverse;
    uint64_t seed;   // train and eval streams use different seeds
} ct_copy_task;

static inline int ct_copy_task_seq_len(const ct_copy_task *t) { return 2 * t->length + 2; }

// Fills batch number `index`: tokens (batch, seq_len) int32 (inputs and
// targets alike: the model shifts right itself) and weights (batch, seq_len).
void ct_copy_task_batch(const ct_copy_task *t, uint64_t index, int batch, int32_t *tokens, float *weights);

#ifdef __cplusplus
}
#endif
#endif
