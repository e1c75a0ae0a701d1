// A loss or gradient gone NaN or Inf: both trainers return CT_ERR_NONFINITE
// at the step where it happens, update nothing (weights, optimizer slots and
// layer state bitwise as before the step; the memory-efficient trainer's
// fused updates as documented), and name the first layer, by path, whose
// forward output or backward gradient went non-finite, found by re-running
// the step in anomaly mode (ct_ctx.check_finite).
//
// The cases: SGD at a learning rate of 1e6 (the layer named is checked
// against a forward run layer by layer here); a Dense mid-model with a huge
// kernel (on one device, on two, and on only the second device's rows);
// a NaN in the batch; a layer that makes NaN only in backward, in its input gradient or in its
// weight gradient; the same in the ReversibleTrainer, with fused and with
// deferred (CT_CLIP_GLOBAL) updates, zero-copy and copied staging, one and
// two devices.
#include <float.h>
#include <stdlib.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/train/reversible_trainer.h"
#include "ctrax/train/trainer.h"

// ---- Probe: out = x * w, with a state counter and NaN or Inf on demand ------

typedef enum probe_mode {
    PROBE_HEALTHY,
    PROBE_NAN_WEIGHT_GRAD,  // backward adds NaN into the gradient of w
    PROBE_NAN_INPUT_GRAD,   // backward writes NaN into the input gradient
    PROBE_INF_OUTPUT,       // forward writes Inf into the output
} probe_mode;

typedef struct probe_hp {
    probe_mode mode;
    bool marked_only;  // only on a shard holding an input >= 1000 (one device's rows)
} probe_hp;

static bool probe_fires(const probe_hp *hp, const ct_tensor *x) {
    if (hp->mode == PROBE_HEALTHY) return false;
    if (!hp->marked_only) return true;
    for (int64_t i = 0; i < ct_tensor_numel(x); i++)
        if (ct_f32(x)[i] >= 1000.0f) return true;
    return false;
}

static ct_status probe_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    CT_TRY(ct_layer_check_input(l, in, 0, CT_DTYPE_F32, -1, err));
    ct_layer_declare_weight(l, ic, "w", ct_tensor_1d(CT_DTYPE_F32, 1, NULL), (ct_initializer){CT_INIT_ONES, 0}, key);
    ct_layer_declare_state(l, ic, "count", ct_tensor_1d(CT_DTYPE_F32, 1, NULL), (ct_initializer){CT_INIT_ZEROS, 0},
                           key);
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status probe_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    (void)key;
    const probe_hp *hp = l->hp;
    out[0] = ct_tensor_sig(&in[0]);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    float w = ct_weight(c, l, 0)[0];
    int64_t n = ct_tensor_numel(&in[0]);
    for (int64_t i = 0; i < n; i++) ct_f32(&out[0])[i] = ct_f32(&in[0])[i] * w;
    if (hp->mode == PROBE_INF_OUTPUT && probe_fires(hp, &in[0])) ct_f32(&out[0])[n - 1] = INFINITY;
    if (c->train) *ct_state(c, l, 0) += 1.0f;
    return ct_tape_push(c, &in[0], err);
}

static ct_status probe_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                                ct_error *err) {
    (void)key;
    const probe_hp *hp = l->hp;
    ct_tensor x = ct_tape_pop(c), g = grad_out[0];
    CT_TRY(ct_ctx_grad_or_zeros(c, &g, err));
    grad_in[0] = ct_tensor_sig(&x);
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    float w = ct_weight(c, l, 0)[0];
    double gw = 0;
    for (int64_t i = 0; i < ct_tensor_numel(&x); i++) {
        ct_f32(&grad_in[0])[i] = ct_f32(&g)[i] * w;
        gw += (double)ct_f32(&g)[i] * ct_f32(&x)[i];
    }
    if (hp->mode == PROBE_NAN_WEIGHT_GRAD && probe_fires(hp, &x)) gw = NAN;
    if (hp->mode == PROBE_NAN_INPUT_GRAD && probe_fires(hp, &x)) ct_f32(&grad_in[0])[0] = NAN;
    ct_weight_grad(c, l, 0)[0] += (float)gw;
    return CT_OK;
}

static const ct_layer_vtable probe_vt = {
    .type = "Probe", .init = probe_init, .forward = probe_forward, .backward = probe_backward};

static ct_layer *probe(probe_mode mode, bool marked_only) {
    probe_hp *hp = ct_calloc(1, sizeof *hp);
    hp->mode = mode;
    hp->marked_only = marked_only;
    return ct_layer_new(&probe_vt, "Probe", 1, 1, hp, NULL, 0);
}

// ---- helpers -------------------------------------------------------------------

enum { B = 8, D = 4 };

// x (B, D), y (B, 1), loss weights (B, 1) of ones: a regression batch.
typedef struct batch {
    float x[B * D], y[B], w[B];
    ct_tensor t[3];
} batch;

static void batch_init(batch *b, uint64_t seed) {
    ct_random_uniform(ct_key_from_seed(seed), b->x, B * D, -1, 1);
    for (int i = 0; i < B; i++) {
        b->y[i] = b->x[i * D] - 2 * b->x[i * D + 1];
        b->w[i] = 1.0f;
    }
    b->t[0] = ct_tensor_2d(CT_DTYPE_F32, B, D, b->x);
    b->t[1] = ct_tensor_2d(CT_DTYPE_F32, B, 1, b->y);
    b->t[2] = ct_tensor_2d(CT_DTYPE_F32, B, 1, b->w);
}

// Weights, slots and state, copied.
typedef struct snapshot {
    float *w, *s, *st;
    size_t nw, ns, nst;
} snapshot;

static float *copy_floats(const float *x, size_t n) {
    float *c = malloc((n ? n : 1) * sizeof *c);
    if (n) memcpy(c, x, n * sizeof *c);
    return c;
}

static snapshot snap(const ct_net *net, const float *slots, size_t n_slots) {
    return (snapshot){copy_floats(net->weights, net->n_weights), copy_floats(slots, n_slots),
                      copy_floats(net->state, net->n_state), net->n_weights, n_slots, net->n_state};
}

static bool snap_same(const snapshot *a, const snapshot *b) {
    return a->nw == b->nw && a->ns == b->ns && a->nst == b->nst && memcmp(a->w, b->w, a->nw * sizeof(float)) == 0 &&
           memcmp(a->s, b->s, a->ns * sizeof(float)) == 0 && memcmp(a->st, b->st, a->nst * sizeof(float)) == 0;
}

static void snap_free(snapshot *s) {
    free(s->w);
    free(s->s);
    free(s->st);
}

static float *weight_of(const ct_net *net, const ct_layer *l, int i) { return net->weights + l->weights[i].offset; }

static void fill(float *x, size_t n, float v) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}

static bool contains(const char *msg, const char *part) {
    bool ok = strstr(msg, part) != NULL;
    if (!ok) fprintf(stderr, "  message \"%s\"\n  lacks \"%s\"\n", msg, part);
    return ok;
}

// A standard trainer with Adam on n_devices for model and loss over b.
static ct_trainer *adam_trainer(ct_layer *model, ct_layer *loss, const batch *b, int n_devices, ct_device *dev) {
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = n_devices;
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, b->t, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(1),
                            dev, &o, &err),
             &err);
    return tr;
}

static ct_status std_step(ct_trainer *tr, const batch *b, int64_t step, float lr, ct_step_stats *s, ct_error *err) {
    return ct_trainer_one_step(tr, b->t, ct_key_fold_in(ct_key_from_seed(3), (uint32_t)step), step, lr, s, err);
}

static snapshot std_snap(const ct_trainer *tr) {
    size_t n_slots;
    const float *slots = ct_trainer_slots(tr, &n_slots);
    return snap(ct_trainer_net(tr), slots, n_slots);
}

// ---- the standard Trainer ------------------------------------------------------------

// The first of the model's layers (a Serial of one-in, one-out layers)
// whose output is non-finite on rows [r0, r1) of x, run one by one here
// (eval mode: no state change); -1 if none.
static int first_bad_layer(const ct_net *net, const ct_layer *model, const float *x, int r0, int r1) {
    ct_device dev = ct_device_cpu();
    ct_arena arena;
    ct_arena_init(&arena, &dev);
    ct_ctx c;
    ct_ctx_init(&c, &arena);
    ct_net_bind(net, &c, false);
    ct_tensor cur = ct_tensor_2d(CT_DTYPE_F32, r1 - r0, D, (float *)x + r0 * D);
    int bad = -1;
    ct_error err;
    for (int i = 0; i < model->n_sub && bad < 0; i++) {
        ct_tensor out;
        CHECK_OK(ct_layer_forward(model->sub[i], &c, &cur, &out, ct_key_from_seed(0), &err), &err);
        for (int64_t k = 0; k < ct_tensor_numel(&out); k++)
            if (!isfinite(ct_f32(&out)[k])) bad = i;
        cur = out;
    }
    ct_ctx_free(&c);
    ct_arena_free(&arena);
    return bad;
}

// SGD at 1e6 until the step fails: the step before it was finite, the
// failed step changed nothing and says which layer, as a forward run layer
// by layer here finds it.
static void test_huge_learning_rate(int n_devices) {
    batch b;
    batch_init(&b, 1);
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(16), ct_relu(), ct_dense(16), ct_relu(), ct_dense(1)));
    ct_layer *loss = ct_l2_loss();
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = n_devices;
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            &o, &err),
             &err);
    ct_step_stats s = {0};
    float last_loss = 0;
    int failed_at = 0;
    ct_status st = CT_OK;
    snapshot before = {0};
    for (int step = 1; step <= 40 && st == CT_OK; step++) {
        snap_free(&before);
        before = std_snap(tr);
        st = std_step(tr, &b, step, 1e6f, &s, &err);
        if (st == CT_OK) {
            CHECK(isfinite(s.loss) && isfinite(s.gradients_l2));
            last_loss = s.loss;
        } else {
            failed_at = step;
        }
    }
    CHECK_MSG(st == CT_ERR_NONFINITE, "status %d: %s", (int)st, err.msg);
    CHECK_MSG(failed_at > 1, "failed at step %d", failed_at);
    printf("SGD at 1e6 on %d device(s): step %d (loss before %g): %s\n", n_devices, failed_at, (double)last_loss,
           err.msg);
    snapshot after = std_snap(tr);
    CHECK_MSG(snap_same(&before, &after), "the failed step changed weights, slots or state");

    // Where it went non-finite: each device's rows in turn, layer by layer.
    const ct_net *net = ct_trainer_net(tr);
    int rows = B / n_devices, bad = -1, bad_device = -1;
    for (int d = 0; d < n_devices && bad < 0; d++) {
        bad = first_bad_layer(net, model, b.x, d * rows, (d + 1) * rows);
        if (bad >= 0) bad_device = d;
    }
    if (bad >= 0) {
        char want[256];
        snprintf(want, sizeof want, "forward output 0 of %s (inputs finite)", model->sub[bad]->path);
        CHECK(contains(err.msg, "non-finite loss"));
        CHECK(contains(err.msg, want));
        if (n_devices > 1) {
            snprintf(want, sizeof want, "(device %d)", bad_device);
            CHECK(contains(err.msg, want));
        }
    } else {
        CHECK(contains(err.msg, "non-finite gradient"));
        CHECK(contains(err.msg, "backward: "));
    }
    // The same step again fails the same way: nothing moved.
    ct_error again;
    CHECK(std_step(tr, &b, failed_at, 1e6f, &s, &again) == CT_ERR_NONFINITE);
    CHECK(strcmp(again.msg, err.msg) == 0);
    snap_free(&before);
    snap_free(&after);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// A Dense mid-model whose kernel is huge overflows to Inf on rows of ones:
// it is named (not the Dense after it, whose inputs are already Inf), the
// step changes nothing (Adam slots and the Probe's state counter
// included), and once the kernel is put back the next step trains and
// counts. poison_rows: which device's rows are ones (-1: every row); the
// others are zeros, which the huge kernel leaves finite.
static void test_huge_weight(int n_devices, int poison_rows) {
    batch b;
    batch_init(&b, 2);
    ct_layer *in = ct_layer_rename(ct_dense(8), "In"), *big = ct_layer_rename(ct_dense(8), "Big");
    ct_layer *pr = probe(PROBE_HEALTHY, false);
    ct_layer *model = ct_serial(CT_LAYERS(in, pr, big, ct_dense(1)));
    ct_layer *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_trainer *tr = adam_trainer(model, loss, &b, n_devices, &dev);
    const ct_net *net = ct_trainer_net(tr);
    ct_step_stats s;
    for (int step = 1; step <= 2; step++) CHECK_OK(std_step(tr, &b, step, 1e-2f, &s, &err), &err);
    CHECK(net->n_state == 1 && net->state[0] == 2.0f);

    // In maps rows of ones to 4 (kernel ones, bias zero); Big's kernel then
    // overflows: 4 * 1e38 > FLT_MAX.
    size_t n_big = (size_t)ct_tensor_numel(&big->weights[0].sig);
    float *kept = copy_floats(weight_of(net, big, 0), n_big);
    fill(weight_of(net, in, 0), (size_t)ct_tensor_numel(&in->weights[0].sig), 1.0f);
    fill(weight_of(net, in, 1), 8, 0.0f);
    fill(weight_of(net, big, 0), n_big, 1e38f);
    int rows = B / n_devices;
    for (int r = 0; r < B; r++)
        fill(b.x + r * D, D, poison_rows < 0 || r / rows == poison_rows ? 1.0f : 0.0f);
    snapshot before = std_snap(tr);
    CHECK(std_step(tr, &b, 3, 1e-2f, &s, &err) == CT_ERR_NONFINITE);
    printf("huge kernel, %d device(s), rows of ones on %d: %s\n", n_devices, poison_rows, err.msg);
    char want[256];
    snprintf(want, sizeof want, "first non-finite value%s: forward output 0 of %s (inputs finite)",
             n_devices > 1 ? (poison_rows == 1 ? " (device 1)" : " (device 0)") : "", big->path);
    CHECK(contains(err.msg, "non-finite loss ("));
    CHECK(contains(err.msg, want));
    snapshot after = std_snap(tr);
    CHECK_MSG(snap_same(&before, &after), "the failed step changed weights, slots or state");

    // Big's kernel back: the step trains, and its state counts one forward.
    memcpy(weight_of(net, big, 0), kept, n_big * sizeof(float));
    CHECK_OK(std_step(tr, &b, 3, 1e-2f, &s, &err), &err);
    CHECK(isfinite(s.loss));
    CHECK(net->state[0] == 3.0f);
    snapshot trained = std_snap(tr);
    CHECK(memcmp(trained.w, after.w, after.nw * sizeof(float)) != 0);
    free(kept);
    snap_free(&before);
    snap_free(&after);
    snap_free(&trained);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// A layer whose forward is finite and whose backward makes NaN (in its
// input gradient, or in its own weight gradient): the loss is finite, the
// gradient is not, and the layer is named as a backward one. With
// marked_only, only the rows carrying the marker (device 1's) make NaN.
static void test_backward_nan(probe_mode mode, int n_devices, bool marked_only) {
    batch b;
    batch_init(&b, 3);
    if (marked_only)
        for (int r = B / 2; r < B; r++) b.x[r * D] = 1000.0f;
    ct_layer *pr = probe(mode, marked_only);
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(8), pr, ct_dense(1)));
    ct_layer *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_trainer *tr = adam_trainer(model, loss, &b, n_devices, &dev);
    // The Probe sees the first Dense's output: a kernel that copies x[:, 0]
    // into output 0 (bias zero at init) carries the marker through.
    const ct_net *net = ct_trainer_net(tr);
    if (marked_only) {
        ct_layer *first = model->sub[0];
        fill(weight_of(net, first, 0), (size_t)ct_tensor_numel(&first->weights[0].sig), 0.0f);
        weight_of(net, first, 0)[0] = 1.0f;  // kernel (D, 8): out[:, 0] = x[:, 0]
    }
    snapshot before = std_snap(tr);
    ct_step_stats s;
    CHECK(std_step(tr, &b, 1, 1e-2f, &s, &err) == CT_ERR_NONFINITE);
    printf("NaN in backward (mode %d, %d device(s)): %s\n", (int)mode, n_devices, err.msg);
    char want[256];
    if (mode == PROBE_NAN_WEIGHT_GRAD)
        snprintf(want, sizeof want, "backward: weight gradient of %s/w (output gradients finite)", pr->path);
    else
        snprintf(want, sizeof want, "backward: input gradient 0 of %s (output gradients finite)", pr->path);
    CHECK(contains(err.msg, "non-finite gradient (global L2 norm nan)"));
    CHECK(contains(err.msg, want));
    if (n_devices > 1) CHECK(contains(err.msg, marked_only ? "(device 1)" : "(device 0)"));
    snapshot after = std_snap(tr);
    CHECK_MSG(snap_same(&before, &after), "the failed step changed weights, slots or state");
    snap_free(&before);
    snap_free(&after);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// ---- the ReversibleTrainer ------------------------------------------------------------

// In -> Dup -> half(Probe1, F) -> swap -> half(Probe2, Big) -> swap, then
// Concatenate, Dense(1), L2 loss. Trainer layers: 0 [In, Dup], 1 half, 2
// swap, 3 half, 4 swap, 5 loss.
typedef struct rev_model {
    ct_layer *model, *loss, *in, *probe1, *f, *probe2, *big;
} rev_model;

static rev_model rev_model_new(probe_mode mode1, probe_mode mode2) {
    rev_model m;
    m.in = ct_layer_rename(ct_dense(D), "In");
    m.probe1 = probe(mode1, false);
    m.f = ct_dense(D);
    m.probe2 = probe(mode2, false);
    m.big = ct_layer_rename(ct_dense(D), "Big");
    m.model = ct_serial(CT_LAYERS(m.in, ct_dup(), ct_reversible_half_residual(CT_LAYERS(m.probe1, m.f)),
                                  ct_reversible_swap(), ct_reversible_half_residual(CT_LAYERS(m.probe2, m.big)),
                                  ct_reversible_swap()));
    m.loss = ct_serial(CT_LAYERS(ct_concatenate(2, -1), ct_dense(1), ct_l2_loss()));
    return m;
}

static void rev_model_free(rev_model *m) {
    ct_layer_free(m->model);
    ct_layer_free(m->loss);
}

static ct_status rev_step(ct_trainer *tr, const batch *b, int64_t step, float lr, ct_error *err) {
    ct_step_stats s;
    return ct_trainer_one_step(tr, b->t, ct_key_fold_in(ct_key_from_seed(3), (uint32_t)step), step, lr,
                                          &s, err);
}

static snapshot rev_snap(const ct_trainer *tr) {
    size_t n_slots;
    const float *slots = ct_trainer_slots(tr, &n_slots);
    return snap(ct_trainer_net(tr), slots, n_slots);
}

static ct_trainer *rev_new(const rev_model *m, const batch *b, int n_devices, bool copy_weights,
                                     bool deferred, ct_device *dev) {
    ct_trainer_options o = ct_reversible_default_options();
    o.n_devices = n_devices;
    o.reversible.copy_weights = copy_weights;
    o.reversible.log_every = 0;
    if (deferred) {
        o.clip_grad_norm = 1e30f;  // never clips: the updates just wait for every gradient
        o.reversible.clip_mode = CT_CLIP_GLOBAL;
    }
    ct_trainer *tr = NULL;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, m->model, m->loss, b->t, 3, ct_adam_new(ct_adam_default_params()),
                                       ct_key_from_seed(1), dev, &o, &err),
             &err);
    return tr;
}

// Big (in the second half-residual) with a huge kernel on rows of ones: the
// loss is non-finite, Big is named, nothing changes (both Probes' state
// counters included); with the kernel back, the step trains.
static void test_reversible_huge_weight(int n_devices, bool copy_weights) {
    batch b;
    batch_init(&b, 4);
    rev_model m = rev_model_new(PROBE_HEALTHY, PROBE_HEALTHY);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = rev_new(&m, &b, n_devices, copy_weights, false, &dev);
    ct_error err;
    for (int step = 1; step <= 2; step++) CHECK_OK(rev_step(tr, &b, step, 1e-2f, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    CHECK(net->n_state == 2 && net->state[0] == 2.0f && net->state[1] == 2.0f);

    // In gives ones (zero kernel, bias ones) and F zeros, so Big sees about
    // ones (times Probe2's weight, near 1) through the first half-residual
    // and the swap; 1e38 * 4 overflows.
    fill(weight_of(net, m.in, 0), D * D, 0.0f);
    fill(weight_of(net, m.in, 1), D, 1.0f);
    fill(weight_of(net, m.f, 0), D * D, 0.0f);
    fill(weight_of(net, m.f, 1), D, 0.0f);
    float *kept = copy_floats(weight_of(net, m.big, 0), D * D);
    fill(weight_of(net, m.big, 0), D * D, 1e38f);
    snapshot before = rev_snap(tr);
    CHECK(rev_step(tr, &b, 3, 1e-2f, &err) == CT_ERR_NONFINITE);
    printf("reversible, huge kernel (%d device(s), copy_weights %d): %s\n", n_devices, copy_weights, err.msg);
    char want[256];
    snprintf(want, sizeof want, "first non-finite value%s: forward output 0 of %s (inputs finite)",
             n_devices > 1 ? " (device 0)" : "", m.big->path);
    CHECK(contains(err.msg, "non-finite loss ("));
    CHECK(contains(err.msg, want));
    snapshot after = rev_snap(tr);
    CHECK_MSG(snap_same(&before, &after), "the failed step changed weights, slots or state");

    memcpy(weight_of(net, m.big, 0), kept, D * D * sizeof(float));
    CHECK_OK(rev_step(tr, &b, 3, 1e-2f, &err), &err);
    CHECK(net->state[0] == 3.0f && net->state[1] == 3.0f);
    free(kept);
    snap_free(&before);
    snap_free(&after);
    ct_trainer_free(tr);
    rev_model_free(&m);
    CHECK(dev.current_bytes == 0);
}

// NaN made in backward by a layer low in the model (the first half-residual:
// trainer layer 1, whose input gradient reaches In in layer 0) or higher up
// (the second: trainer layer 3, in its weight gradient). Deferred updates
// (CT_CLIP_GLOBAL) change nothing; fused updates keep those of the layers
// after the bad one (whose backward came first), say so, and leave the bad
// layer and the ones before it as they were; the state goes back either
// way.
static void test_reversible_backward_nan(bool low, bool deferred, int n_devices) {
    batch b;
    batch_init(&b, 5);
    rev_model m = low ? rev_model_new(PROBE_NAN_INPUT_GRAD, PROBE_HEALTHY)
                      : rev_model_new(PROBE_HEALTHY, PROBE_NAN_WEIGHT_GRAD);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = rev_new(&m, &b, n_devices, false, deferred, &dev);
    const ct_net *net = ct_trainer_net(tr);
    ct_error err;
    snapshot before = rev_snap(tr);
    // Deferred updates: nothing was updated, CT_ERR_NONFINITE. Fused: the
    // layers above were, so the step is not one a Loop may skip.
    ct_status st = rev_step(tr, &b, 1, 1e-2f, &err);
    CHECK_MSG(st == (deferred ? CT_ERR_NONFINITE : CT_ERR_STATE), "status %d", (int)st);
    printf("reversible, NaN in backward (%s, %s, %d device(s)): %s\n", low ? "low" : "high",
           deferred ? "deferred" : "fused", n_devices, err.msg);
    int bad_layer = low ? 0 : 3;
    char want[256];
    snprintf(want, sizeof want, "non-finite gradient (L2 norm nan) in trainer layer %d", bad_layer);
    CHECK(contains(err.msg, want));
    if (low) snprintf(want, sizeof want, "backward: input gradient 0 of %s (output gradients finite)", m.probe1->path);
    else snprintf(want, sizeof want, "backward: weight gradient of %s/w (output gradients finite)", m.probe2->path);
    CHECK(contains(err.msg, want));
    snapshot after = rev_snap(tr);
    if (deferred) {
        CHECK(!strstr(err.msg, "had updated"));
        CHECK_MSG(snap_same(&before, &after), "the failed step changed weights, slots or state");
    } else {
        CHECK(contains(err.msg, low ? "after this step had updated trainer layers 1 to 5"
                                    : "after this step had updated trainer layer 5"));
        // Layers up to the bad one (their weights, then their slots: both
        // in slab order) as before; the later ones updated; state back.
        const ct_layer *last_kept = low ? m.in : m.big;
        size_t w_end = last_kept->w_end, s_end = 0, off, cnt;
        for (int i = 0; i < net->n_params; i++)
            if (net->params[i]->offset < w_end) {
                ct_trainer_param_slots(tr, i, &off, &cnt);
                s_end = off + cnt;
            }
        CHECK(memcmp(before.w, after.w, w_end * sizeof(float)) == 0);
        CHECK(memcmp(before.s, after.s, s_end * sizeof(float)) == 0);
        CHECK(memcmp(before.w + w_end, after.w + w_end, (before.nw - w_end) * sizeof(float)) != 0);
        CHECK(memcmp(before.st, after.st, before.nst * sizeof(float)) == 0);
    }
    snap_free(&before);
    snap_free(&after);
    ct_trainer_free(tr);
    rev_model_free(&m);
    CHECK(dev.current_bytes == 0);
}

// A half-residual's context gradient is the sum of two finite gradients (the
// one passed down and f's input gradient) that overflows: the re-run names
// that sum in the second half-residual, not the first layer below it whose
// gradient it poisons (F, whose kernel gradient is 0 * inf). In = 0 and F,
// Big biases 0 make a = y = 0 (the loss sees [a, y]), so every weight
// gradient up to the sum is finite: Dense(1)'s kernel gets 0, Big's kernel
// 0 and its bias sum_i g_y[i] = k_y * sum_i 2 r_i / 8 = 5e36 * 20 = 1e38,
// with r_i = 10 - target_i in [7, 13]. Per row, g_a = 1e38 * r_i / 4 and
// f's input gradient (g_y @ Big^T, Big = 4) = 4 * 4 * 5e36 * r_i / 4: each
// under FLT_MAX, their sum 1.8e38 * r_i / 4 over it once r_i > 7.6.
static void test_reversible_gradient_sum_overflow(void) {
    batch b;
    batch_init(&b, 7);
    rev_model m = rev_model_new(PROBE_HEALTHY, PROBE_HEALTHY);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = rev_new(&m, &b, 1, false, true, &dev);
    ct_net *net = (ct_net *)ct_trainer_net(tr);
    const ct_layer *dense1 = m.loss->sub[1];
    fill(weight_of(net, m.in, 0), D * D, 0.0f);
    fill(weight_of(net, m.in, 1), D, 0.0f);
    fill(weight_of(net, m.f, 1), D, 0.0f);
    fill(weight_of(net, m.big, 0), D * D, 4.0f);
    fill(weight_of(net, m.big, 1), D, 0.0f);
    fill(weight_of(net, dense1, 0), D, 1e38f);          // k_a: the rows of a in the (2D, 1) kernel
    fill(weight_of(net, dense1, 0) + D, D, 5e36f);      // k_y
    fill(weight_of(net, dense1, 1), 1, 10.0f);
    snapshot before = rev_snap(tr);
    ct_error err;
    CHECK(rev_step(tr, &b, 1, 1e-2f, &err) == CT_ERR_NONFINITE);
    printf("reversible, overflowing context gradient sum: %s\n", err.msg);
    CHECK(contains(err.msg, "non-finite gradient (L2 norm nan) in trainer layer 1"));
    const ct_layer *half2 = m.model->sub[4];
    char want[256];
    snprintf(want, sizeof want, "backward: input gradient 1 of %s (output gradients finite): inf", half2->path);
    CHECK(contains(err.msg, want));
    snapshot after = rev_snap(tr);
    CHECK_MSG(snap_same(&before, &after), "the failed step changed weights, slots or state");
    snap_free(&before);
    snap_free(&after);
    ct_trainer_free(tr);
    rev_model_free(&m);
    CHECK(dev.current_bytes == 0);
}

// A NaN in the data is named as such, not blamed on the first layer.
static void test_nan_in_batch(void) {
    batch b;
    batch_init(&b, 6);
    b.x[5] = NAN;
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(8), ct_dense(1)));
    ct_layer *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            NULL, &err),
             &err);
    ct_step_stats s;
    CHECK(std_step(tr, &b, 1, 1e-2f, &s, &err) == CT_ERR_NONFINITE);
    printf("NaN in the batch: %s\n", err.msg);
    CHECK(contains(err.msg, "non-finite loss (nan): batch item 0 is nan at element 5"));
    ct_trainer_free(tr);

    rev_model m = rev_model_new(PROBE_HEALTHY, PROBE_HEALTHY);
    ct_trainer *rt = rev_new(&m, &b, 1, false, false, &dev);
    CHECK(rev_step(rt, &b, 1, 1e-2f, &err) == CT_ERR_NONFINITE);
    printf("NaN in the batch (reversible): %s\n", err.msg);
    CHECK(contains(err.msg, "non-finite loss (nan): batch item 0 is nan at element 5"));
    ct_trainer_free(rt);
    rev_model_free(&m);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

int main(void) {
    test_nan_in_batch();
    test_huge_learning_rate(1);
    test_huge_learning_rate(2);
    test_huge_weight(1, -1);
    test_huge_weight(2, -1);
    test_huge_weight(2, 1);
    test_backward_nan(PROBE_NAN_INPUT_GRAD, 1, false);
    test_backward_nan(PROBE_NAN_WEIGHT_GRAD, 1, false);
    test_backward_nan(PROBE_NAN_WEIGHT_GRAD, 2, true);
    test_reversible_huge_weight(1, false);
    test_reversible_huge_weight(1, true);
    test_reversible_huge_weight(2, false);
    test_reversible_backward_nan(true, false, 1);
    test_reversible_backward_nan(true, true, 1);
    test_reversible_backward_nan(false, false, 1);
    test_reversible_backward_nan(false, true, 2);
    test_reversible_gradient_sum_overflow();
    return check_summary("test_nonfinite");
}
