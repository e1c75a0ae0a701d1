// The single-device Trainer: stats, learning, bitwise determinism for a seed,
// and clear errors for a bad batch.
#include <stdlib.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/data/synthetic.h"
#include "ctrax/models/models.h"
#include "ctrax/train/trainer.h"

// Trains TransformerLM on the copy task for n_steps from seed; returns a
// malloc'd copy of the final weights.
static float *train_copy(uint64_t seed, int n_steps, float dropout, size_t *n_weights, float *last_loss) {
    ct_copy_task task = {10, 5, false, seed, 0};
    enum { B = 8, T = 12 };
    int32_t tokens[B * T];
    float weights[B * T];
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, B, T, tokens), ct_tensor_2d(CT_DTYPE_I32, B, T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, B, T, weights)};
    ct_transformer_lm_params mp = ct_transformer_lm_default_params();
    mp.vocab_size = 10;
    mp.d_model = 16;
    mp.d_ff = 32;
    mp.n_layers = 2;
    mp.n_heads = 4;
    mp.max_len = T;
    mp.dropout = dropout;
    ct_layer *model = ct_transformer_lm(mp), *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_key key = ct_key_from_seed(seed);
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_split(key, 0),
                            &dev, &err),
             &err);
    ct_step_stats stats = {0};
    for (int step = 1; step <= n_steps; step++) {
        ct_copy_task_batch(&task, (uint64_t)step, B, tokens, weights);
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_fold_in(ct_key_split(key, 1), (uint32_t)step), step, 3e-3f,
                                     &stats, &err),
                 &err);
    }
    const ct_net *net = ct_trainer_net(tr);
    *n_weights = net->n_weights;
    float *w = malloc(net->n_weights * sizeof *w);
    memcpy(w, net->weights, net->n_weights * sizeof *w);
    *last_loss = stats.loss;
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
    return w;
}

static void test_determinism(void) {
    size_t n1, n2, n3;
    float l1, l2, l3;
    float *a = train_copy(42, 50, 0.1f, &n1, &l1);
    float *b = train_copy(42, 50, 0.1f, &n2, &l2);
    float *c = train_copy(43, 50, 0.1f, &n3, &l3);
    CHECK(n1 == n2 && n1 == n3);
    CHECK_MSG(memcmp(a, b, n1 * sizeof *a) == 0, "same seed, different weights after 50 steps");
    CHECK_MSG(memcmp(a, c, n1 * sizeof *a) != 0, "different seeds gave the same weights");
    printf("50 steps twice with seed 42: weights bitwise equal (%zu floats), loss %.4f\n", n1, l1);
    free(a);
    free(b);
    free(c);
}

static void test_learns(void) {
    // The copy task's loss falls well below chance (ln 9 = 2.20 over 9 tokens).
    size_t n;
    float first, last;
    free(train_copy(7, 1, 0.0f, &n, &first));
    free(train_copy(7, 300, 0.0f, &n, &last));
    printf("copy task loss: step 1 %.4f, step 300 %.4f\n", first, last);
    CHECK(first > 1.8f);
    CHECK_MSG(last < 0.5f * first, "loss %.4f after 300 steps (first %.4f)", last, first);
}

static void test_stats_and_errors(void) {
    // Dense(1) on x with L2Loss: check the reported stats against the slabs.
    float x[4 * 3], y[4], w[4] = {1, 1, 1, 1};
    ct_tensor xt = ct_tensor_2d(CT_DTYPE_F32, 4, 3, x);
    ct_random_uniform(ct_key_from_seed(5), x, 12, -1, 1);
    for (int i = 0; i < 4; i++) y[i] = x[3 * i] - 2 * x[3 * i + 1];
    ct_tensor batch[3] = {xt, ct_tensor_2d(CT_DTYPE_F32, 4, 1, y), ct_tensor_2d(CT_DTYPE_F32, 4, 1, w)};
    ct_layer *model = ct_dense(1), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_sgd_params sp = ct_sgd_default_params();
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(sp), ct_key_from_seed(1), &dev, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    double w2 = 0;
    for (size_t i = 0; i < net->n_weights; i++) w2 += (double)net->weights[i] * net->weights[i];
    ct_step_stats s;
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(2), 1, 0.1f, &s, &err), &err);
    double g2 = 0;
    for (size_t i = 0; i < net->n_weights; i++) g2 += (double)net->grads[i] * net->grads[i];
    CHECK_NEAR(s.weights_l2, sqrt(w2), 1e-6);
    CHECK_NEAR(s.gradients_l2, sqrt(g2), 1e-6);
    CHECK(s.gradients_l2 > 0);
    float first = s.loss;
    for (int step = 2; step <= 200; step++) CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(2), step, 0.1f, &s, &err), &err);
    CHECK_MSG(s.loss < 1e-3f * first, "SGD on a linear problem: loss %g from %g", s.loss, first);

    // A batch of the wrong dtype is a clear error.
    ct_tensor bad[3] = {ct_tensor_2d(CT_DTYPE_I32, 4, 3, x), batch[1], batch[2]};
    CHECK(ct_trainer_one_step(tr, bad, ct_key_from_seed(2), 1, 0.1f, &s, &err) == CT_ERR_SHAPE);
    printf("bad batch: %s\n", err.msg);
    CHECK(strstr(err.msg, "batch item 0 is (4,3) i32") != NULL);
    ct_trainer_free(tr);

    // A loss that does not leave a scalar is refused.
    ct_layer *not_a_loss = ct_select(1, (int[]){0}, 3);
    CHECK(ct_trainer_new(&tr, model, not_a_loss, batch, 3, ct_sgd_new(sp), ct_key_from_seed(1), &dev, &err) != CT_OK);
    printf("bad loss: %s\n", err.msg);
    ct_layer_free(not_a_loss);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

int main(void) {
    test_stats_and_errors();
    test_determinism();
    test_learns();
    return check_summary("test_trainer");
}
