// The single-device Trainer: stats, learning, bitwise determinism for a seed,
// clear errors for a bad batch, and a second optimizer for its weights
// (ct_trainer_opt_state) swapped in and out.
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "core/clock.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/data/synthetic.h"
#include "ctrax/models/models.h"
#include "ctrax/train/safetensors.h"
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
                            &dev, NULL, &err),
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
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(sp), ct_key_from_seed(1), &dev, NULL, &err), &err);
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

    // A negative step (Adam's bias correction 1 - b1^(step + 1) would be 0
    // at -1) is refused and updates nothing.
    float *before = ct_malloc(net->n_weights * sizeof *before);
    memcpy(before, net->weights, net->n_weights * sizeof *before);
    for (int64_t bad_step = -1; bad_step >= -2; bad_step--) {
        CHECK(ct_trainer_one_step(tr, batch, ct_key_from_seed(2), bad_step, 0.1f, &s, &err) == CT_ERR_ARG);
        CHECK_MSG(strstr(err.msg, bad_step == -1 ? "step -1 is negative" : "step -2 is negative"), "%s", err.msg);
    }
    CHECK(memcmp(before, net->weights, net->n_weights * sizeof *before) == 0);
    ct_free(before);

    // A batch of the wrong dtype is a clear error.
    ct_tensor bad[3] = {ct_tensor_2d(CT_DTYPE_I32, 4, 3, x), batch[1], batch[2]};
    CHECK(ct_trainer_one_step(tr, bad, ct_key_from_seed(2), 1, 0.1f, &s, &err) == CT_ERR_SHAPE);
    printf("bad batch: %s\n", err.msg);
    CHECK(strstr(err.msg, "batch item 0 is (4,3) i32") != NULL);
    // Items of two batch sizes: said as such, not as a size that does not
    // split over the (one) local device.
    ct_tensor ragged[3] = {xt, ct_tensor_2d(CT_DTYPE_F32, 2, 1, y), ct_tensor_2d(CT_DTYPE_F32, 2, 1, w)};
    CHECK(ct_trainer_one_step(tr, ragged, ct_key_from_seed(2), 1, 0.1f, &s, &err) == CT_ERR_SHAPE);
    printf("batch items of two sizes: %s\n", err.msg);
    CHECK_MSG(strstr(err.msg, "batch item 1 (2,1) f32 has 2 rows, item 0 has 4") && !strstr(err.msg, "split"),
              "batch items of two sizes: %s", err.msg);
    // Every loss weight 0: nothing to average over, said so (not a 0/0 loss
    // reported as non-finite).
    float zero_w[4] = {0, 0, 0, 0};
    ct_tensor unweighted[3] = {xt, batch[1], ct_tensor_2d(CT_DTYPE_F32, 4, 1, zero_w)};
    CHECK(ct_trainer_one_step(tr, unweighted, ct_key_from_seed(2), 1, 0.1f, &s, &err) == CT_ERR_STATE);
    printf("loss weights all 0: %s\n", err.msg);
    CHECK_MSG(strstr(err.msg, "loss weights sum to 0"), "loss weights all 0: %s", err.msg);
    // The loss-only eval too: an error, not a 0/0 loss of NaN.
    float eval = 0;
    ct_status est = ct_trainer_eval_loss(tr, unweighted, ct_key_from_seed(2), &eval, &err);
    CHECK_MSG(est == CT_ERR_STATE && strstr(err.msg, "eval loss") && strstr(err.msg, "loss weights sum to 0"),
              "eval, loss weights all 0: status %d, loss %g", (int)est, (double)eval);
    ct_trainer_free(tr);

    // A loss that does not leave a scalar is refused.
    ct_layer *not_a_loss = ct_select(1, (int[]){0}, 3);
    CHECK(ct_trainer_new(&tr, model, not_a_loss, batch, 3, ct_sgd_new(sp), ct_key_from_seed(1), &dev, NULL, &err) != CT_OK);
    printf("bad loss: %s\n", err.msg);
    ct_layer_free(not_a_loss);
    // A negative or NaN clip_grad_norm is refused by both trainers (the
    // standard one skipped clipping silently).
    for (int me = 0; me < 2; me++)
        for (int k = 0; k < 2; k++) {
            ct_trainer_options o = ct_trainer_default_options();
            o.memory_efficient = me;
            o.clip_grad_norm = k ? NAN : -1.0f;
            ct_status st = ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(sp), ct_key_from_seed(1), &dev, &o,
                                          &err);
            CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "clip_grad_norm is") && strstr(err.msg, "must be >= 0"),
                      "%s trainer, clip_grad_norm %g: %s", me ? "memory-efficient" : "standard", (double)o.clip_grad_norm,
                      st == CT_OK ? "accepted" : err.msg);
            if (st == CT_OK) ct_trainer_free(tr);
        }
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// A loss that overflows float while everything under it is finite: L2Loss
// sums in double, so (1e20)^2 is 1e40 there and inf only as its f32 value;
// its gradient, 2 (yhat - y) / 4 per row, about 5e19, is finite. The step
// must still fail as a non-finite loss (Trax's loss would be inf) and move
// nothing, not update from a finite gradient and report a loss of inf.
static void test_infinite_loss_finite_gradient(void) {
    float x[4 * 3], y[4] = {1e20f, 1e20f, 1e20f, 1e20f}, w[4] = {1, 1, 1, 1};
    ct_random_uniform(ct_key_from_seed(5), x, 12, -1, 1);
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, 4, 3, x), ct_tensor_2d(CT_DTYPE_F32, 4, 1, y),
                          ct_tensor_2d(CT_DTYPE_F32, 4, 1, w)};
    ct_layer *model = ct_dense(1), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            NULL, &err),
             &err);
    const ct_net *net = ct_trainer_net(tr);
    float before[4];
    CHECK(net->n_weights == 4);
    memcpy(before, net->weights, sizeof before);
    ct_step_stats s = {0};
    ct_status st = ct_trainer_one_step(tr, batch, ct_key_from_seed(2), 1, 1e-20f, &s, &err);
    printf("a loss of inf over finite gradients: %s\n", st == CT_OK ? "the step went through" : err.msg);
    CHECK_MSG(st == CT_ERR_NONFINITE && strstr(err.msg, "non-finite loss (inf)"), "status %d, loss %g", (int)st,
              (double)s.loss);
    CHECK_MSG(memcmp(before, net->weights, sizeof before) == 0, "a step with a loss of inf moved the weights");
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// The small regression batch the Dense tests train on: x (4, 3) and y
// (4, 2) drawn from fixed keys, weights 1; batch[] points into d.
typedef struct dense_data {
    float x[4 * 3], y[4 * 2], w[4 * 2];
} dense_data;

static void dense_batch(dense_data *d, ct_tensor batch[3]) {
    ct_random_uniform(ct_key_from_seed(8), d->x, 12, -1, 1);
    ct_random_uniform(ct_key_from_seed(9), d->y, 8, -3, 3);
    for (int i = 0; i < 8; i++) d->w[i] = 1;
    batch[0] = ct_tensor_2d(CT_DTYPE_F32, 4, 3, d->x);
    batch[1] = ct_tensor_2d(CT_DTYPE_F32, 4, 2, d->y);
    batch[2] = ct_tensor_2d(CT_DTYPE_F32, 4, 2, d->w);
}

// One SGD step on Dense(2) -> L2Loss with the given options; returns the
// weight change per param in *delta and the stats.
static void sgd_step(const ct_trainer_options *o, float *delta, size_t *n, ct_step_stats *s, bool *frozen0) {
    dense_data d;
    ct_tensor batch[3];
    dense_batch(&d, batch);
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(3), ct_dense(2))), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            o, &err),
             &err);
    const ct_net *net = ct_trainer_net(tr);
    *n = net->n_weights;
    memcpy(delta, net->weights, *n * sizeof *delta);
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(2), 1, 0.5f, s, &err), &err);
    for (size_t i = 0; i < *n; i++) delta[i] = net->weights[i] - delta[i];
    *frozen0 = ct_trainer_param_frozen(tr, 0);
    size_t off, cnt;
    ct_trainer_param_slots(tr, 0, &off, &cnt);
    CHECK(cnt == 0);  // SGD keeps no slots
    CHECK(ct_net_find_param(net, "Serial/Dense[0]/kernel") != NULL);  // the model's own names
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
}

static void test_clip_and_freeze(void) {
    ct_trainer_options o = ct_trainer_default_options();
    float plain[64], clipped[64], frozen[64];
    size_t n;
    ct_step_stats s1, s2, s3;
    bool f;
    sgd_step(&o, plain, &n, &s1, &f);
    CHECK(!f);
    // Clipping to half the gradient norm halves the SGD step.
    o.clip_grad_norm = 0.5f * s1.gradients_l2;
    sgd_step(&o, clipped, &n, &s2, &f);
    CHECK_NEAR(s2.gradients_l2, s1.gradients_l2, 1e-6);  // reported before clipping
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = check_worse(worst, fabs(clipped[i] - 0.5 * plain[i]));
    CHECK_MSG(worst < 1e-6, "clipped step differs from half the step by %g", worst);
    // Freezing the first Dense: its weights stay, the second's move as before.
    o.clip_grad_norm = 0;
    const char *frozen_names[] = {"Serial/Dense[0]"};
    o.frozen = frozen_names;
    o.n_frozen = 1;
    sgd_step(&o, frozen, &n, &s3, &f);
    CHECK(f);
    size_t first = 3 * 3 + 3;  // Dense[0]: kernel (3,3), bias (3)
    bool still = true, same = true;
    for (size_t i = 0; i < first; i++) still &= frozen[i] == 0.0f;
    for (size_t i = first; i < n; i++) same &= frozen[i] == plain[i];
    CHECK_MSG(still, "a frozen weight moved");
    CHECK_MSG(same, "unfrozen weights moved differently");
    CHECK(s3.gradients_l2 < s1.gradients_l2);  // frozen gradients left out
}

// Both kinds of trainer behind one ct_trainer: the same named weights loaded
// from a safetensors file into each (their own inits differ), one step on
// the same batch and key, and every weight's gradient read back by name:
// equal within 1e-5. Also the loss-only evaluation, and the errors for an
// unknown name and for gradients the memory-efficient trainer did not keep.
static ct_trainer *grads_trainer(bool memory_efficient, bool keep, uint64_t init_seed, const ct_tensor *batch,
                                 ct_reformer_lm_params mp, ct_device *dev) {
    // A layer belongs to one net at a time: each trainer gets its own model.
    ct_layer *model = ct_reformer_lm(mp), *loss = ct_weighted_category_cross_entropy();
    ct_trainer_options o = ct_trainer_default_options();
    o.memory_efficient = memory_efficient;
    o.reversible.keep_grads = keep;
    o.reversible.log_every = 0;
    ct_trainer *tr = NULL;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()),
                            ct_key_from_seed(init_seed), dev, &o, &err),
             &err);
    ct_layer_free(model);
    ct_layer_free(loss);
    return tr;
}

static void test_grads_both_trainers(void) {
    enum { B = 4, T = 8 };
    int32_t tokens[B * T];
    float weights[B * T];
    ct_copy_task task = {10, 3, false, 5, 0};
    ct_copy_task_batch(&task, 1, B, tokens, weights);
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, B, T, tokens), ct_tensor_2d(CT_DTYPE_I32, B, T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, B, T, weights)};
    ct_reformer_lm_params mp = ct_reformer_lm_default_params();
    mp.vocab_size = 10;
    mp.d_model = 16;
    mp.d_ff = 32;
    mp.n_layers = 2;
    mp.n_heads = 2;
    mp.max_len = T;
    mp.dropout = 0;
    ct_device dev = ct_device_cpu();
    ct_error err;
    char path[] = "/tmp/ctrax_test_grads_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    close(fd);
    // The file: the weights of a standard trainer from seed 1.
    ct_trainer *src = grads_trainer(false, false, 1, batch, mp, &dev);
    ct_named_tensor *wt, *sl;
    int nw, ns;
    ct_trainer_checkpoint_tensors(src, &wt, &nw, &sl, &ns);
    CHECK_OK(ct_safetensors_write(path, wt, nw, NULL, 0, &err), &err);
    ct_free(wt);
    ct_free(sl);
    ct_trainer_free(src);

    ct_trainer *std = grads_trainer(false, false, 2, batch, mp, &dev);
    ct_trainer *mem = grads_trainer(true, true, 3, batch, mp, &dev);
    CHECK_OK(ct_trainer_load_safetensors(std, path, CT_LOAD_STRICT, &err), &err);
    CHECK_OK(ct_trainer_load_safetensors(mem, path, CT_LOAD_EXACT, &err), &err);
    float l_std = 0, l_mem = 0;
    CHECK_OK(ct_trainer_eval_loss(std, batch, ct_key_from_seed(7), &l_std, &err), &err);
    CHECK_OK(ct_trainer_eval_loss(mem, batch, ct_key_from_seed(7), &l_mem, &err), &err);
    CHECK_NEAR(l_std, l_mem, 1e-5 * fabs(l_std));
    ct_step_stats s1, s2;
    CHECK_OK(ct_trainer_one_step(std, batch, ct_key_from_seed(7), 1, 0.1f, &s1, &err), &err);
    CHECK_OK(ct_trainer_one_step(mem, batch, ct_key_from_seed(7), 1, 0.1f, &s2, &err), &err);
    CHECK_NEAR(s1.loss, l_std, 1e-5 * fabs(l_std));  // dropout 0: train and eval loss agree
    const ct_net *net = ct_trainer_net(std);
    double max_diff = 0, max_g = 0;
    for (int i = 0; i < net->n_params; i++) {
        ct_tensor a, b;
        const char *name = net->params[i]->full_name;
        CHECK_OK(ct_trainer_tensor(std, CT_PART_GRAD, name, &a, &err), &err);
        CHECK_OK(ct_trainer_tensor(mem, CT_PART_GRAD, name, &b, &err), &err);
        CHECK(ct_tensor_same_sig(&a, &b));
        for (int64_t k = 0; k < ct_tensor_numel(&a); k++) {
            double d = fabs((double)ct_f32(&a)[k] - ct_f32(&b)[k]);
            max_diff = check_worse(max_diff, d);
            if (fabs(ct_f32(&a)[k]) > max_g) max_g = fabs(ct_f32(&a)[k]);
        }
    }
    CHECK_MSG(max_diff <= 1e-5, "gradients differ by %g", max_diff);
    CHECK(max_g > 0);  // there was something to compare
    printf("ReformerLM, weights loaded by name into both trainers: %d gradients, max |diff| %.2e (max |g| %.3f), "
           "eval loss %.6f vs %.6f\n", net->n_params, max_diff, max_g, l_std, l_mem);
    ct_tensor t;
    CHECK(ct_trainer_tensor(std, CT_PART_WEIGHT, "no/such/weight", &t, &err) == CT_ERR_ARG);
    ct_trainer *plain = grads_trainer(true, false, 3, batch, mp, &dev);
    CHECK(ct_trainer_grads(plain) == NULL);
    CHECK(ct_trainer_tensor(plain, CT_PART_GRAD, net->params[0]->full_name, &t, &err) == CT_ERR_STATE);
    printf("gradients not kept: %s\n", err.msg);
    ct_trainer_free(plain);
    ct_trainer_free(std);
    ct_trainer_free(mem);
    unlink(path);
    CHECK(dev.current_bytes == 0);
}

// A second optimizer for the trainer's weights (ct_trainer_opt_state, as a
// Loop's train task with its own): laid out as the trainer's own (frozen
// weights none), counted in the memory plan, swapped in and out by pointer;
// a step with it swapped in is the step of a trainer built with it and
// leaves the trainer's own slots alone. The memory-efficient trainer, and a
// device without room, refuse it with nothing left behind.
static ct_trainer *dense_trainer(ct_optimizer *opt, bool memory_efficient, const ct_tensor *batch, ct_device *dev) {
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(3), ct_dense(2))), *loss = ct_l2_loss();
    static const char *const frozen[] = {"Serial/Dense[0]/bias"};
    ct_trainer_options o = ct_trainer_default_options();
    o.frozen = frozen;
    o.n_frozen = 1;
    o.memory_efficient = memory_efficient;
    o.reversible.log_every = 0;
    ct_trainer *tr = NULL;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, opt, ct_key_from_seed(4), dev, &o, &err), &err);
    ct_layer_free(model);
    ct_layer_free(loss);
    return tr;
}

static void test_opt_state(void) {
    dense_data d;
    ct_tensor batch[3];
    dense_batch(&d, batch);
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_step_stats st;
    ct_trainer *tr = dense_trainer(ct_adam_new(ct_adam_default_params()), false, batch, &dev);
    const ct_net *net = ct_trainer_net(tr);
    ct_memory_plan plan0 = *ct_trainer_memory_plan(tr);
    size_t bytes0 = dev.current_bytes, n_own;
    float *own = ct_trainer_slots(tr, &n_own);
    ct_optimizer *adam = ct_trainer_optimizer(tr);

    ct_trainer_opt_state s;
    CHECK_OK(ct_trainer_opt_state_new(tr, ct_adafactor_new(ct_adafactor_default_params()), &s, &err), &err);
    ct_optimizer *ada = s.opt;
    float *theirs = s.slots;
    size_t n_theirs = s.n_slot_floats;
    // Laid out as the trainer's own: per weight, Adafactor's count, frozen none.
    bool layout = s.slot_offsets[0] == 0 && n_theirs > 0;
    for (int i = 0; i < net->n_params; i++) {
        size_t want = ct_trainer_param_frozen(tr, i) ? 0 : ct_optimizer_slot_floats(ada, &net->params[i]->sig);
        layout &= s.slot_offsets[i + 1] - s.slot_offsets[i] == want;
    }
    CHECK_MSG(layout, "the state's slots are not laid out per weight as the trainer's");
    CHECK(ct_trainer_param_frozen(tr, 1));  // Serial/Dense[0]/bias: there was a frozen weight to skip
    // Counted on the device and in the plan alike.
    const ct_memory_plan *plan = ct_trainer_memory_plan(tr);
    size_t added = dev.current_bytes - bytes0;
    CHECK(added >= n_theirs * sizeof(float) && added < n_theirs * sizeof(float) + 64);
    CHECK_MSG(plan->slots == plan0.slots + added && plan->device_bytes == plan0.device_bytes + added,
              "plan slots %zu -> %zu, device %zu -> %zu; the device grew by %zu", plan0.slots, plan->slots,
              plan0.device_bytes, plan->device_bytes, added);

    // Swapped twice: everything as it was, and the state holds its own again.
    ct_trainer_swap_optimizer(tr, &s);
    size_t n;
    CHECK(ct_trainer_slots(tr, &n) == theirs && n == n_theirs && ct_trainer_optimizer(tr) == ada);
    CHECK(s.opt == adam && s.slots == own && s.n_slot_floats == n_own);
    ct_trainer_swap_optimizer(tr, &s);
    CHECK(ct_trainer_slots(tr, &n) == own && n == n_own && ct_trainer_optimizer(tr) == adam);
    CHECK(s.opt == ada && s.slots == theirs && s.n_slot_floats == n_theirs);

    // A step with it swapped in: the state's slots move, the trainer's own
    // do not, and the weights and slots are those of a trainer built with
    // Adafactor from the same init (bit for bit).
    float *own_before = malloc(n_own * sizeof *own_before), *theirs_before = malloc(n_theirs * sizeof *theirs_before);
    memcpy(own_before, own, n_own * sizeof *own);
    memcpy(theirs_before, theirs, n_theirs * sizeof *theirs);
    ct_trainer_swap_optimizer(tr, &s);
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(2), 1, 0.05f, &st, &err), &err);
    ct_named_tensor *wt, *sl;
    int nw, ns;
    ct_trainer_checkpoint_tensors(tr, &wt, &nw, &sl, &ns);  // a checkpoint sees the swapped-in slots
    CHECK(ns > 0 && (float *)sl[0].tensor.data >= theirs && (float *)sl[0].tensor.data < theirs + n_theirs);
    ct_free(wt);
    ct_free(sl);
    ct_trainer_swap_optimizer(tr, &s);
    CHECK_MSG(memcmp(own, own_before, n_own * sizeof *own) == 0, "the trainer's own slots changed in another's step");
    CHECK_MSG(memcmp(theirs, theirs_before, n_theirs * sizeof *theirs) != 0, "the swapped-in slots did not move");
    ct_device dev2 = ct_device_cpu();
    ct_trainer *ref = dense_trainer(ct_adafactor_new(ct_adafactor_default_params()), false, batch, &dev2);
    CHECK_OK(ct_trainer_one_step(ref, batch, ct_key_from_seed(2), 1, 0.05f, &st, &err), &err);
    size_t n_ref;
    const float *ref_slots = ct_trainer_slots(ref, &n_ref);
    const ct_net *ref_net = ct_trainer_net(ref);
    CHECK(n_ref == n_theirs && memcmp(ref_slots, theirs, n_ref * sizeof *ref_slots) == 0);
    CHECK_MSG(memcmp(ref_net->weights, net->weights, net->n_weights * sizeof(float)) == 0,
              "a step with Adafactor swapped in differs from a trainer built with Adafactor");
    ct_trainer_free(ref);
    // And a step of its own: the trainer's slots move, the state's stay.
    memcpy(theirs_before, theirs, n_theirs * sizeof *theirs);
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(3), 2, 0.05f, &st, &err), &err);
    CHECK(memcmp(own, own_before, n_own * sizeof *own) != 0);
    CHECK(memcmp(theirs, theirs_before, n_theirs * sizeof *theirs) == 0);
    free(own_before);
    free(theirs_before);

    // A device without room: refused naming the optimizer, nothing kept.
    dev.limit_bytes = dev.current_bytes;
    ct_trainer_opt_state full;
    CHECK(ct_trainer_opt_state_new(tr, ct_adafactor_new(ct_adafactor_default_params()), &full, &err) == CT_ERR_MEMORY);
    printf("no room for a second optimizer: %s\n", err.msg);
    CHECK(strstr(err.msg, "Adafactor") != NULL);
    CHECK(full.opt == NULL && full.slots == NULL && full.slot_offsets == NULL);
    CHECK(plan->slots == plan0.slots + added);
    dev.limit_bytes = 0;

    ct_trainer_opt_state_free(tr, &s);
    CHECK(s.opt == NULL && s.slots == NULL);
    CHECK(plan->slots == plan0.slots && plan->device_bytes == plan0.device_bytes && dev.current_bytes == bytes0);
    ct_trainer_free(tr);
    CHECK(dev.current_bytes == 0);

    // The memory-efficient trainer refuses, naming itself and the setting.
    ct_trainer *mem = dense_trainer(ct_adam_new(ct_adam_default_params()), true, batch, &dev);
    bytes0 = dev.current_bytes;
    CHECK(ct_trainer_opt_state_new(mem, ct_momentum_new(ct_momentum_default_params()), &s, &err) == CT_ERR_ARG);
    printf("memory-efficient trainer: %s\n", err.msg);
    CHECK(strstr(err.msg, "memory_efficient") != NULL && strstr(err.msg, "standard trainer") != NULL);
    CHECK(s.opt == NULL && s.slots == NULL && dev.current_bytes == bytes0);
    ct_trainer_opt_state_free(mem, &s);  // a zeroed state frees nothing
    ct_trainer_free(mem);
    CHECK(dev.current_bytes == 0);
}


// ct_profile's rows when a trainer runs with one (ct_trainer_options.profile):
// no row before the first step (the trainers' passes at construction are not
// a step's), then per step each layer's forward and backward calls on device
// 0 only, the optimizer update once per step (the memory-efficient trainer:
// once per unit), and self times that add up to no more than the steps took.
static void profile_run(bool memory_efficient, int n_devices) {
    dense_data d;
    ct_tensor batch[3];
    dense_batch(&d, batch);
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(3), ct_relu(), ct_dense(2))), *loss = ct_l2_loss();
    ct_profile *prof = ct_profile_new();
    ct_trainer_options o = ct_trainer_default_options();
    o.memory_efficient = memory_efficient;
    o.reversible.log_every = 0;
    o.n_devices = n_devices;
    o.profile = prof;
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = NULL;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(4),
                            &dev, &o, &err),
             &err);
    int n_rows;
    const ct_profile_row *rows = ct_profile_rows(prof, &n_rows);
    CHECK_MSG(ct_profile_steps(prof, NULL) == 0 && n_rows == 0, "%d rows before the first step", n_rows);
    ct_step_stats st;
    for (int step = 1; step <= 3 && tr; step++)
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed((uint64_t)step), step, 1e-3f, &st, &err), &err);
    double step_s, rows_s = 0;
    CHECK(ct_profile_steps(prof, &step_s) == 3 && step_s > 0);
    rows = ct_profile_rows(prof, &n_rows);
    int64_t dense[2] = {0}, relu[2] = {0}, update = 0;
    bool negative = false;
    for (int i = 0; i < n_rows; i++) {
        const ct_profile_row *r = &rows[i];
        rows_s += r->seconds[0] + r->seconds[1];
        negative |= r->seconds[0] < 0 || r->seconds[1] < 0;
        if (!strcmp(r->name, "Dense")) dense[0] = r->calls[0], dense[1] = r->calls[1];
        if (!strcmp(r->name, "Relu")) relu[0] = r->calls[0], relu[1] = r->calls[1];
        if (!strcmp(r->name, CT_PROFILE_OPTIMIZER)) update = r->calls[0];
    }
    const char *what = memory_efficient ? "memory-efficient" : n_devices > 1 ? "2 devices" : "standard";
    CHECK_MSG(dense[0] == 6 && dense[1] == 6 && relu[0] == 3 && relu[1] == 3,
              "%s: Dense %lld/%lld, Relu %lld/%lld calls in 3 steps", what, (long long)dense[0], (long long)dense[1],
              (long long)relu[0], (long long)relu[1]);
    CHECK_MSG(memory_efficient ? update >= 3 && update % 3 == 0 : update == 3, "%s: %lld updates in 3 steps", what,
              (long long)update);
    CHECK_MSG(!negative && rows_s <= step_s + 1e-9, "%s: rows %.9f s, steps %.9f s", what, rows_s, step_s);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ct_profile_print(prof, f);
    fclose(f);
    CHECK_MSG(strstr(text, "profile of 3 training steps") && strstr(text, "\n  Dense ") &&
                  strstr(text, "\n  (optimizer update) ") && strstr(text, "\n  (rest of the step) "),
              "%s", text);
    free(text);
    ct_trainer_free(tr);
    ct_profile_free(prof);
    ct_layer_free(model);
    ct_layer_free(loss);
}

// Spans by hand: a span's self time leaves out its sub-spans', the rows add
// up to the outermost span, spans outside a step count nothing, spans past
// the depth kept count their whole time, and past 127 names the rest share
// one row.
static void test_profile_spans(void) {
    ct_profile *p = ct_profile_new();
    ct_profile_end(p, "outside", false, ct_profile_begin(p));  // no step: not counted
    double step = ct_profile_step_begin(p);
    double a = ct_profile_begin(p), b = ct_profile_begin(p), t0 = ct_now_s();
    while (ct_now_s() - t0 < 0.005) {
    }
    ct_profile_end(p, "B", true, b);
    ct_profile_end(p, "A", false, a);
    double spans[70];
    for (int i = 0; i < 70; i++) spans[i] = ct_profile_begin(p);
    for (int i = 69; i >= 0; i--) ct_profile_end(p, "deep", false, spans[i]);
    for (int i = 0; i < 200; i++) {
        char name[16];
        snprintf(name, sizeof name, "n%d", i);
        ct_profile_end(p, name, false, ct_profile_begin(p));
    }
    ct_profile_step_end(p, step);
    int n;
    const ct_profile_row *r = ct_profile_rows(p, &n);
    double total;
    CHECK(ct_profile_steps(p, &total) == 1);
    CHECK_MSG(n == 128 && !strcmp(r[0].name, "B") && !strcmp(r[1].name, "A") && !strcmp(r[2].name, "deep") &&
                  !strcmp(r[127].name, "(other layers)") && r[127].calls[0] == 200 - 124,  // n0..n123 named
              "%d rows: %s, %s, %s ... %s (%lld calls)", n, r[0].name, r[1].name, r[2].name, r[n - 1].name,
              (long long)r[n - 1].calls[0]);
    CHECK_MSG(r[0].calls[1] == 1 && r[0].calls[0] == 0 && r[0].seconds[1] >= 0.005 && r[1].calls[0] == 1 &&
                  r[1].seconds[0] >= 0 && r[1].seconds[0] < r[0].seconds[1],
              "B %.6f s backward, A %.6f s self", r[0].seconds[1], r[1].seconds[0]);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += r[i].seconds[0] + r[i].seconds[1];
    CHECK_MSG(r[2].calls[0] == 70 && sum <= total + 1e-6, "deep %lld calls; rows %.9f s, step %.9f s",
              (long long)r[2].calls[0], sum, total);
    ct_profile_free(p);
}

static void test_profile(void) {
    profile_run(false, 1);
    profile_run(false, 2);
    profile_run(true, 1);
    test_profile_spans();
}

// Adam's first two steps pinned to Trax's arithmetic, for both trainers on
// 1 and 2 local devices: the step handed to ct_trainer_one_step is the
// Loop's 1-based one, and Adam corrects its bias with step + 1, so step 1
// divides m by 1 - 0.9^2 = 0.19 and v by 1 - 0.999^2 = 0.001999 (a weight
// with |g| >> eps moves by lr * 0.744, not the lr * 1.0 of a correction with
// step); decay is decoupled, w = (1 - wd) w - lr * update. Dense(1) on
// (4,3) rows, L2Loss with unequal loss weights (each row counts by its
// weight across the devices), learning rates 0.01 then 0.02. The gradient,
// loss and norms are worked out here in double from the weights the step
// found; the weights must match within 2e-6 (float arithmetic), and the
// stats within 1e-6 relative.
enum { ADAM_ROWS = 4, ADAM_IN = 3 };

// L2Loss = sum_i w_i (o_i - y_i)^2 / sum_i w_i with o = x k + b: its value
// into *loss and its gradient into gk (ADAM_IN) and *gb.
static void l2_dense_grad(const float *x, const float *y, const float *w, const float *k, float b, double *gk,
                          double *gb, double *loss) {
    double wsum = 0, l = 0;
    for (int i = 0; i < ADAM_ROWS; i++) wsum += w[i];
    for (int j = 0; j < ADAM_IN; j++) gk[j] = 0;
    *gb = 0;
    for (int i = 0; i < ADAM_ROWS; i++) {
        double o = b;
        for (int j = 0; j < ADAM_IN; j++) o += (double)x[ADAM_IN * i + j] * k[j];
        double r = o - y[i];
        l += w[i] * r * r;
        for (int j = 0; j < ADAM_IN; j++) gk[j] += 2 * w[i] * r * x[ADAM_IN * i + j] / wsum;
        *gb += 2 * w[i] * r / wsum;
    }
    *loss = l / wsum;
}

static void test_adam_first_steps(void) {
    // Trax's defaults (SEMANTICS.md), which the expected values below use.
    ct_adam_params ap = ct_adam_default_params();
    CHECK_MSG(ap.b1 == 0.9f && ap.b2 == 0.999f && ap.eps == 1e-5f && ap.weight_decay_rate == 1e-5f,
              "Adam defaults b1 %g b2 %g eps %g weight_decay_rate %g", (double)ap.b1, (double)ap.b2, (double)ap.eps,
              (double)ap.weight_decay_rate);
    float x[ADAM_ROWS * ADAM_IN], y[ADAM_ROWS], w[ADAM_ROWS] = {1.0f, 2.0f, 0.5f, 1.5f};
    ct_random_uniform(ct_key_from_seed(21), x, ADAM_ROWS * ADAM_IN, -1, 1);
    ct_random_uniform(ct_key_from_seed(22), y, ADAM_ROWS, -2, 2);
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, ADAM_ROWS, ADAM_IN, x), ct_tensor_2d(CT_DTYPE_F32, ADAM_ROWS, 1, y),
                          ct_tensor_2d(CT_DTYPE_F32, ADAM_ROWS, 1, w)};
    const float lrs[2] = {0.01f, 0.02f};
    for (int me = 0; me < 2; me++)
        for (int n_dev = 1; n_dev <= 2; n_dev++) {
            ct_layer *model = ct_dense(1), *loss = ct_l2_loss();
            ct_device dev = ct_device_cpu();
            ct_trainer_options o = me ? ct_reversible_default_options() : ct_trainer_default_options();
            o.n_devices = n_dev;
            o.reversible.log_every = 0;
            ct_trainer *tr;
            ct_error err;
            CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_adam_new(ap), ct_key_from_seed(4), &dev, &o, &err),
                     &err);
            ct_tensor kt, bt;
            CHECK_OK(ct_trainer_tensor(tr, CT_PART_WEIGHT, "Dense/kernel", &kt, &err), &err);
            CHECK_OK(ct_trainer_tensor(tr, CT_PART_WEIGHT, "Dense/bias", &bt, &err), &err);
            float *k = ct_f32(&kt), *b = ct_f32(&bt);
            // Adam's slots m and v, per weight: kernel then bias.
            double m[ADAM_IN + 1] = {0}, v[ADAM_IN + 1] = {0};
            double worst = 0;
            for (int step = 1; step <= 2; step++) {
                double g[ADAM_IN + 1], want_loss, g2 = 0, w2 = 0, want[ADAM_IN + 1];
                l2_dense_grad(x, y, w, k, *b, g, &g[ADAM_IN], &want_loss);
                float before[ADAM_IN + 1] = {k[0], k[1], k[2], *b};
                double bias1 = 1 - pow(0.9, step + 1), bias2 = 1 - pow(0.999, step + 1);
                for (int i = 0; i <= ADAM_IN; i++) {
                    g2 += g[i] * g[i];
                    w2 += (double)before[i] * before[i];
                    m[i] = 0.1 * g[i] + 0.9 * m[i];
                    v[i] = 0.001 * g[i] * g[i] + 0.999 * v[i];
                    want[i] = (1 - 1e-5) * before[i] - lrs[step - 1] * (m[i] / bias1) / (sqrt(v[i] / bias2) + 1e-5);
                }
                ct_step_stats s;
                CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(5), step, lrs[step - 1], &s, &err), &err);
                const float got[ADAM_IN + 1] = {k[0], k[1], k[2], *b};
                for (int i = 0; i <= ADAM_IN; i++) worst = check_worse(worst, fabs(got[i] - want[i]));
                if (step == 1)
                    printf("%s trainer, %d device(s): Adam step 1 moved the bias by %.6f x lr (Trax: %.6f)\n",
                           me ? "memory-efficient" : "standard", n_dev, (got[ADAM_IN] - before[ADAM_IN]) / lrs[0],
                           (want[ADAM_IN] - before[ADAM_IN]) / lrs[0]);
                CHECK_MSG(fabs(s.loss - want_loss) <= 1e-6 * fabs(want_loss) &&
                              fabs(s.gradients_l2 - sqrt(g2)) <= 1e-6 * sqrt(g2) &&
                              fabs(s.weights_l2 - sqrt(w2)) <= 1e-6 * sqrt(w2),
                          "%s trainer, %d device(s), step %d: loss %.9g gradients_l2 %.9g weights_l2 %.9g, want %.9g "
                          "%.9g %.9g",
                          me ? "memory-efficient" : "standard", n_dev, step, (double)s.loss,
                          (double)s.gradients_l2, (double)s.weights_l2, want_loss, sqrt(g2), sqrt(w2));
            }
            CHECK_MSG(worst <= 2e-6, "%s trainer, %d device(s): Adam's steps 1 and 2 off Trax's by %g",
                      me ? "memory-efficient" : "standard", n_dev, worst);
            ct_trainer_free(tr);
            ct_layer_free(model);
            ct_layer_free(loss);
            CHECK(dev.current_bytes == 0);
        }
}

int main(void) {
    test_profile();
    test_opt_state();
    test_grads_both_trainers();
    test_clip_and_freeze();
    test_stats_and_errors();
    test_adam_first_steps();
    test_infinite_loss_finite_gradient();
    test_determinism();
    test_learns();
    return check_summary("test_trainer");
}
