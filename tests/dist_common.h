// Shared by the data-parallel tests (test_dist.c in one process,
// mpi_test_dist.c under mpirun): a small TransformerLM on the copy task with
// padding-like loss weights, trained for a few steps with given options.
#ifndef CTRAX_TESTS_DIST_COMMON_H
#define CTRAX_TESTS_DIST_COMMON_H

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"

enum { DIST_B = 8, DIST_T = 12, DIST_VOCAB = 10 };

// Global batch number `step`: tokens (B, T) and weights (B, T) where each
// sequence keeps a different number of weighted positions, so the per-device
// weight sums differ and the global normalization matters.
static inline void dist_batch(int step, int32_t *tokens, float *weights) {
    ct_copy_task task = {DIST_VOCAB, 5, false, 11, 0};
    ct_copy_task_batch(&task, (uint64_t)step, DIST_B, tokens, weights);
    for (int b = 0; b < DIST_B; b++)
        for (int t = 0; t < DIST_T; t++)
            if (t >= DIST_T - b) weights[b * DIST_T + t] = 0.0f;
}

// Which trainer and model dist_train_with runs.
typedef enum dist_run {
    DIST_STANDARD_TRANSFORMER,  // ct_trainer, TransformerLM
    DIST_STANDARD_REFORMER,     // ct_trainer, ReformerLM
    DIST_REVERSIBLE_REFORMER,   // the memory-efficient trainer, ReformerLM
    DIST_STANDARD_LSH_REFORMER, // ct_trainer, ReformerLM with LSHSelfAttention (per-example rotations)
    DIST_STANDARD_SHARED_DENSE, // ct_trainer, Embedding, a Dense, Relu, the same Dense again, Dense
} dist_run;

// The model run trains: the ReformerLM with the given dropout rate (the
// TransformerLM and the shared Dense have none).
static inline ct_layer *dist_model(dist_run run, float dropout) {
    ct_layer *model;
    if (run == DIST_STANDARD_SHARED_DENSE) {
        ct_layer *shared = ct_dense(8);
        return ct_serial(
            CT_LAYERS(ct_embedding(DIST_VOCAB, 8), shared, ct_relu(), ct_layer_ref(shared), ct_dense(DIST_VOCAB)));
    }
    if (run == DIST_STANDARD_TRANSFORMER) {
        ct_transformer_lm_params mp = ct_transformer_lm_default_params();
        mp.vocab_size = DIST_VOCAB;
        mp.d_model = 16;
        mp.d_ff = 32;
        mp.n_layers = 1;
        mp.n_heads = 2;
        mp.max_len = DIST_T;
        mp.dropout = 0.0f;  // dropout masks depend on the device's key
        model = ct_transformer_lm(mp);
    } else {
        ct_reformer_lm_params mp = ct_reformer_lm_default_params();
        mp.vocab_size = DIST_VOCAB;
        mp.d_model = 8;
        mp.d_ff = 16;
        mp.n_layers = 2;
        mp.n_heads = 2;
        mp.max_len = DIST_T;
        mp.dropout = dropout;
        if (run == DIST_STANDARD_LSH_REFORMER) {
            mp.attention[0] = CT_REFORMER_LSH_ATTENTION;
            mp.lsh_attention.chunk_len = 4;  // 6 buckets over T 12
        }
        model = ct_reformer_lm(mp);
    }
    return model;
}

// Trains for n_steps on rows [row0, row0 + rows) of each global batch; returns
// a malloc'd copy of the weights (and their count in *n).
static inline float *dist_train_with(dist_run run, float dropout, int n_steps, int row0, int rows,
                                     const ct_trainer_options *opts, float *last_loss, size_t *n) {
    int32_t tokens[DIST_B * DIST_T];
    float weights[DIST_B * DIST_T];
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens + row0 * DIST_T),
                          ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens + row0 * DIST_T),
                          ct_tensor_2d(CT_DTYPE_F32, rows, DIST_T, weights + row0 * DIST_T)};
    ct_layer *model = dist_model(run, dropout);
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = NULL;
    ct_error err;
    ct_optimizer *adam = ct_adam_new(ct_adam_default_params());
    ct_status st;
    ct_trainer_options o = *opts;
    o.memory_efficient = run == DIST_REVERSIBLE_REFORMER;
    o.reversible.log_every = 0;
    st = ct_trainer_new(&tr, model, loss, batch, 3, adam, ct_key_from_seed(5), &dev, &o, &err);
    CHECK_MSG(st == CT_OK, "%s", err.msg);
    float *w = NULL;
    if (st == CT_OK) {
        ct_step_stats stats = {0};
        for (int step = 1; step <= n_steps; step++) {
            dist_batch(step, tokens, weights);
            ct_key key = ct_key_from_seed((uint64_t)step);
            st = ct_trainer_one_step(tr, batch, key, step, 3e-3f, &stats, &err);
            CHECK_MSG(st == CT_OK, "step %d: %s", step, err.msg);
            if (st != CT_OK) break;
        }
        const ct_net *net = ct_trainer_net(tr);
        *n = net->n_weights;
        w = malloc(net->n_weights * sizeof *w);
        memcpy(w, net->weights, net->n_weights * sizeof *w);
        *last_loss = stats.loss;
    }
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
    return w;
}

// The standard Trainer on TransformerLM.
static inline float *dist_train(int n_steps, int row0, int rows, const ct_trainer_options *opts, float *last_loss,
                                size_t *n) {
    return dist_train_with(DIST_STANDARD_TRANSFORMER, 0.0f, n_steps, row0, rows, opts, last_loss, n);
}

// ||a - b|| / ||a|| over n floats: "equal within a relative tolerance" for
// a whole weight vector. (Elementwise ratios mislead here: a weight whose
// true gradient is zero, such as the key projection's bias, moves by Adam's
// reaction to rounding noise, a few 1e-6 absolute, in every run.)
static inline double dist_rel_diff(const float *a, const float *b, size_t n) {
    double dd = 0, aa = 0;
    for (size_t i = 0; i < n; i++) {
        dd += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        aa += (double)a[i] * a[i];
    }
    return sqrt(dd / (aa > 0 ? aa : 1));
}

// Adasum as comm.h documents it, in double, for checking ct_adasum: per
// tensor (ranges), a + b -> (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b
// (a zero vector leaves the other), pairs (0,1), (2,3), ... level by level,
// an odd one out moving up unchanged. v holds k vectors of n doubles, one
// after another (clobbered); the result is v[0..n).
static inline void dist_adasum_reference(double *v, int k, size_t n, const ct_range *ranges, int n_ranges) {
    for (int stride = 1; stride < k; stride *= 2)
        for (int i = 0; i + stride < k; i += 2 * stride)
            for (int t = 0; t < n_ranges; t++) {
                double *a = v + (size_t)i * n + ranges[t].offset;
                const double *b = v + (size_t)(i + stride) * n + ranges[t].offset;
                double ab = 0, aa = 0, bb = 0;
                for (size_t j = 0; j < ranges[t].length; j++) ab += a[j] * b[j], aa += a[j] * a[j], bb += b[j] * b[j];
                double ca = aa == 0 ? 0 : bb == 0 ? 1 : 1 - ab / (2 * aa);
                double cb = bb == 0 ? 0 : aa == 0 ? 1 : 1 - ab / (2 * bb);
                for (size_t j = 0; j < ranges[t].length; j++) a[j] = ca * a[j] + cb * b[j];
            }
}

#endif
