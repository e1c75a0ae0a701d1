// A short training run for model tests: a fixed batch of tokens through the
// standard or the memory-efficient trainer (CHECK and CHECK_OK from check.h).
#ifndef CTRAX_TESTS_TRAIN_FIXTURE_H
#define CTRAX_TESTS_TRAIN_FIXTURE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ctrax/ctrax.h"

enum { RB = 2, RT = 6 };

// Trains model (takes no reference) for n_steps of a fixed batch (B 2, T 6)
// with Adam from seed 5; returns the final weights (malloc'd) and the last
// loss. memory_efficient picks the reversible trainer.
static float *train_reformer(ct_layer *model, int n_steps, bool memory_efficient, size_t *n, float *loss_out) {
    int32_t tokens[RB * RT] = {1, 2, 3, 4, 5, 6, 6, 5, 4, 3, 2, 1};
    float weights[RB * RT];
    for (int i = 0; i < RB * RT; i++) weights[i] = 1.0f;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, RB, RT, tokens), ct_tensor_2d(CT_DTYPE_I32, RB, RT, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, RB, RT, weights)};
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_trainer_default_options();
    o.memory_efficient = memory_efficient;
    ct_trainer *tr = NULL;
    ct_error err;
    float *w = NULL;
    *n = 0;
    *loss_out = NAN;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(5),
                            &dev, &o, &err),
             &err);
    if (tr) {
        ct_step_stats stats = {0};
        for (int step = 1; step <= n_steps; step++)
            CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_fold_in(ct_key_from_seed(6), (uint32_t)step), step, 1e-2f,
                                         &stats, &err),
                     &err);
        const ct_net *net = ct_trainer_net(tr);
        *n = net->n_weights;
        w = malloc(*n * sizeof *w);
        memcpy(w, net->weights, *n * sizeof *w);
        *loss_out = stats.loss;
        ct_trainer_free(tr);
    }
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
    return w;
}

#endif
