#include "ctrax/data/synthetic.h"

#include "ctrax/core/rng.h"

void ct_copy_task_batch(const ct_copy_task *t, uint64_t index, int batch, int32_t *tokens, float *weights) {
    // Batch `index` draws from its own key, so batches are independent of
    // the order they are asked for in.
    ct_key key = ct_key_fold_in(ct_key_fold_in(ct_key_from_seed(t->seed), (uint32_t)index),
                                (uint32_t)(index >> 32));
    int n = t->length, len = ct_copy_task_seq_len(t);
    for (int b = 0; b < batch; b++) {
        int32_t *seq = tokens + (int64_t)b * len;
        float *w = weights + (int64_t)b * len;
        seq[0] = 0;
        seq[n + 1] = 0;
        for (int i = 0; i < n; i++) {
            uint32_t bits = ct_random_bits(key, (uint32_t)(b * n + i));
            seq[1 + i] = 1 + (int32_t)(bits % (uint32_t)(t->vocab_size - 1));
        }
        for (int i = 0; i < n; i++) seq[n + 2 + i] = seq[1 + (t->reverse ? n - 1 - i : i)];
        for (int i = 0; i < len; i++) w[i] = i >= n + 2 ? 1.0f : 0.0f;
    }
}
