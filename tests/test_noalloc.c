// After the first step, a training step makes no heap allocation.
//
// This executable is linked with -Wl,--wrap for malloc, calloc, realloc and
// aligned_alloc (see CMakeLists.txt), so every call from ctrax's code (the
// static library linked into it) goes through the counters below.
#include <stdlib.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/data/synthetic.h"
#include "ctrax/models/models.h"
#include "ctrax/train/trainer.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);

static int counting;
static long n_calls;

void *__wrap_malloc(size_t n) {
    if (counting) n_calls++;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size) {
    if (counting) n_calls++;
    return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n) {
    if (counting) n_calls++;
    return __real_realloc(p, n);
}
void *__wrap_aligned_alloc(size_t align, size_t n) {
    if (counting) n_calls++;
    return __real_aligned_alloc(align, n);
}

int main(void) {
    // The counter sees ctrax's allocations (so the test below can fail).
    counting = 1;
    void *p = ct_malloc(16);
    ct_free(p);
    counting = 0;
    CHECK_MSG(n_calls == 1, "the malloc wrapper is not active (%ld calls counted)", n_calls);

    ct_copy_task task = {12, 6, false, 3, 0};
    int B = 4, T = ct_copy_task_seq_len(&task);
    int32_t tokens[4 * 14];
    float weights[4 * 14];
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, B, T, tokens), ct_tensor_2d(CT_DTYPE_I32, B, T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, B, T, weights)};
    ct_transformer_lm_params mp = ct_transformer_lm_default_params();
    mp.vocab_size = 12;
    mp.d_model = 16;
    mp.d_ff = 32;
    mp.n_layers = 2;
    mp.n_heads = 2;
    mp.max_len = T;
    mp.dropout = 0.1f;  // dropout draws masks from keys: no allocation either
    ct_layer *model = ct_transformer_lm(mp), *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(1),
                            &dev, NULL, &err),
             &err);
    ct_step_stats stats;
    for (int step = 1; step <= 6; step++) {
        ct_copy_task_batch(&task, (uint64_t)step, B, tokens, weights);
        uint64_t dev_allocs = dev.n_allocs;
        if (step >= 3) counting = 1;  // steps 1-2 size the arena and the tape
        n_calls = 0;
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed((uint64_t)step), step, 1e-3f, &stats, &err), &err);
        counting = 0;
        if (step >= 3) {
            CHECK_MSG(n_calls == 0, "step %d made %ld heap allocations", step, n_calls);
            CHECK_MSG(dev.n_allocs == dev_allocs, "step %d made %llu device allocations", step,
                      (unsigned long long)(dev.n_allocs - dev_allocs));
        }
    }
    printf("loss after 6 steps %.4f, arena %zu bytes, device peak %zu bytes\n", stats.loss, ct_trainer_arena_bytes(tr),
           dev.peak_bytes);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
    return check_summary("test_noalloc");
}
