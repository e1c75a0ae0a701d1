// The trainers' memory plan (issue 12): a planning pass at construction
// sizes the step arenas (and the memory-efficient trainer's buffers), so
// step 1 peaks no higher than later steps, the plan's parts add up to what
// the device holds, and a device limit below the plan fails at construction.
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/train/reversible_trainer.h"

enum { VOCAB = 11, BATCH = 4, LEN = 16 };

typedef struct fixture {
    int32_t tokens[BATCH * LEN];
    float weights[BATCH * LEN];
    ct_tensor batch[3];  // inputs (B, T) i32, targets (B, T) i32, weights (B, T) f32
} fixture;

static void fixture_init(fixture *f) {
    for (int i = 0; i < BATCH * LEN; i++) {
        f->tokens[i] = (int32_t)(ct_random_bits(ct_key_from_seed(7), (uint32_t)i) % VOCAB);
        f->weights[i] = 1.0f;
    }
    f->batch[0] = ct_tensor_2d(CT_DTYPE_I32, BATCH, LEN, f->tokens);
    f->batch[1] = ct_tensor_2d(CT_DTYPE_I32, BATCH, LEN, f->tokens);
    f->batch[2] = ct_tensor_2d(CT_DTYPE_F32, BATCH, LEN, f->weights);
}

static ct_layer *make_model(bool reformer) {
    if (reformer) {
        ct_reformer_lm_params p = ct_reformer_lm_default_params();
        p.vocab_size = VOCAB;
        p.d_model = 16;
        p.d_ff = 32;
        p.n_layers = 2;
        p.n_heads = 2;
        p.max_len = 64;
        return ct_reformer_lm(p);
    }
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = VOCAB;
    p.d_model = 16;
    p.d_ff = 32;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 64;
    return ct_transformer_lm(p);
}

static ct_trainer_options options(bool reformer, int n_devices) {
    ct_trainer_options o = reformer ? ct_reversible_default_options() : ct_trainer_default_options();
    o.n_devices = n_devices;
    return o;
}

static ct_status make_trainer(ct_trainer **tr, bool reformer, int n_devices, fixture *f, ct_device *dev,
                              ct_error *err) {
    ct_layer *model = make_model(reformer), *loss = ct_weighted_category_cross_entropy();
    ct_trainer_options o = options(reformer, n_devices);
    ct_status st = ct_trainer_new(tr, model, loss, f->batch, 3, ct_adam_new(ct_adam_default_params()),
                                  ct_key_from_seed(1), dev, &o, err);
    ct_layer_free(model);
    ct_layer_free(loss);
    return st;
}

static size_t parts_sum(const ct_memory_plan *p) {
    return p->weights + p->grads + p->slots + p->state + p->activations + p->stack + p->scratch;
}

// Peaks of step 1 and of steps 2-3, and the plan against the device.
static void test_peaks(bool reformer, int n_devices) {
    const char *name = reformer ? "ReformerLM, memory-efficient" : "TransformerLM, standard";
    fixture f;
    fixture_init(&f);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(make_trainer(&tr, reformer, n_devices, &f, &dev, &err), &err);
    const ct_memory_plan *p = ct_trainer_memory_plan(tr);
    char line[512];
    printf("%s, %d device(s): %s\n", name, n_devices, ct_memory_plan_format(p, line, sizeof line));
    CHECK_MSG(parts_sum(p) == p->device_bytes && p->device_bytes == dev.current_bytes,
              "%s: parts %zu, plan %zu, device %zu bytes", name, parts_sum(p), p->device_bytes, dev.current_bytes);
    CHECK(p->activations > 0 && p->activations == ct_trainer_arena_bytes(tr) + 64 * (size_t)n_devices);
    // The planning pass peaks at the plan: no chain of growing blocks.
    CHECK_MSG(dev.peak_bytes == p->device_bytes, "%s: construction peak %zu, plan %zu", name, dev.peak_bytes,
              p->device_bytes);

    uint64_t allocs = dev.n_allocs;
    ct_device_reset_peak(&dev);
    CHECK_OK(ct_trainer_one_step(tr, f.batch, ct_key_from_seed(2), 1, 1e-3f, NULL, &err), &err);
    size_t peak1 = dev.peak_bytes;
    CHECK_MSG(dev.n_allocs == allocs, "%s: step 1 made %llu device allocations", name,
              (unsigned long long)(dev.n_allocs - allocs));
    ct_device_reset_peak(&dev);
    for (int step = 2; step <= 3; step++)
        CHECK_OK(ct_trainer_one_step(tr, f.batch, ct_key_from_seed(2 + (uint64_t)step), step, 1e-3f, NULL, &err),
                 &err);
    size_t peak23 = dev.peak_bytes;
    printf("  device peak: step 1 %zu bytes, steps 2-3 %zu bytes, plan %zu bytes\n", peak1, peak23,
           p->device_bytes);
    CHECK_MSG(peak1 <= peak23, "%s: step 1 peaks at %zu bytes, later steps at %zu", name, peak1, peak23);
    ct_trainer_free(tr);
    CHECK(dev.current_bytes == 0);
}

// A limit one byte below the plan fails in ct_trainer_new, naming bytes; at
// the plan itself, the trainer builds and steps.
static void test_limit(bool reformer) {
    const char *name = reformer ? "ReformerLM, memory-efficient" : "TransformerLM, standard";
    fixture f;
    fixture_init(&f);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(make_trainer(&tr, reformer, 1, &f, &dev, &err), &err);
    size_t plan = ct_trainer_memory_plan(tr)->device_bytes;
    ct_trainer_free(tr);

    dev = ct_device_cpu();
    dev.limit_bytes = plan - 1;
    tr = NULL;
    ct_status st = make_trainer(&tr, reformer, 1, &f, &dev, &err);
    CHECK_MSG(st == CT_ERR_MEMORY && tr == NULL && strstr(err.msg, "bytes"), "%s under %zu bytes: %s", name,
              plan - 1, err.msg);
    printf("%s under a limit of %zu bytes (plan %zu): %s\n", name, plan - 1, plan, err.msg);
    CHECK(dev.current_bytes == 0);

    dev = ct_device_cpu();
    dev.limit_bytes = plan;
    CHECK_OK(make_trainer(&tr, reformer, 1, &f, &dev, &err), &err);
    for (int step = 1; step <= 2; step++)
        CHECK_OK(ct_trainer_one_step(tr, f.batch, ct_key_from_seed(2), step, 1e-3f, NULL, &err), &err);
    CHECK(dev.peak_bytes <= plan);
    ct_trainer_free(tr);
}

int main(void) {
    ct_log_set_level(CT_LOG_WARN);
    for (int n = 1; n <= 2; n++) {
        test_peaks(false, n);
        test_peaks(true, n);
    }
    test_limit(false);
    test_limit(true);
    return check_summary("test_memory_plan");
}
