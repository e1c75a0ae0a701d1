// The ReversibleTrainer against the standard Trainer: Trax's equivalence
// tests ported (the basic model, two steps with the second at learning rate
// 0.02; the two-block model with a middle standard layer, three steps),
// ReformerLM with dropout, ReformerLM with LSHSelfAttention (its buckets and
// dropout masks reused in the recomputation, one hashing per step), staging
// options (copy, prefetch thread, freeing device buffers) bitwise equal to
// zero-copy, the per-layer stats, layer state as the forward left it for the
// recomputation (a layer that hashes its input must see its own hashes
// again) and put back after a non-finite loss (the loss layer's too),
// gradient clipping (global: equal to the standard update, and with staged
// copies bitwise the zero-copy one; per layer: Trax's, each layer's update
// clipped to its own norm), shared weights and shared state refused (a
// weightless layer used in two trainer layers accepted), a layer's state
// put back after its recomputation, frozen weights, unequal loss weights
// over 2 devices and kept gradients as the standard Trainer's, the stack
// items of a failed step given back, the host memory log, hostile
// construction refused (negative block counts or NULL layers in the blocks
// form, an invalid clip mode, a loss ending in a reversible layer), and a 64-layer
// ReformerLM that trains under a device byte limit the standard trainer
// cannot train under.
// The equivalence tests run with Adam and with Adafactor.
#include <stdlib.h>
#include <unistd.h>

#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/train/reversible_trainer.h"
#include "layer_fixture.h"

#define WEIGHT_TOL 1e-5

typedef void (*model_fn)(ct_layer **model, ct_layer **loss);
typedef ct_optimizer *(*optimizer_fn)(void);

static ct_optimizer *adam(void) { return ct_adam_new(ct_adam_default_params()); }
static ct_optimizer *sgd(void) { return ct_sgd_new(ct_sgd_default_params()); }
static ct_optimizer *adafactor(void) { return ct_adafactor_new(ct_adafactor_default_params()); }

static ct_layer *half(ct_layer *a, ct_layer *b) {
    return b ? ct_reversible_half_residual(CT_LAYERS(a, b)) : ct_reversible_half_residual(CT_LAYERS(a));
}

static ct_layer *trax_loss(void) {
    return ct_serial(CT_LAYERS(ct_concatenate(2, -1), ct_dense(19), ct_dropout(0.3f), ct_log_softmax(),
                               ct_cross_entropy_loss()));
}

// Trax's test_run_reversible_same_as_default_basic.
static void basic_model(ct_layer **model, ct_layer **loss) {
    ct_layer *first = ct_serial(CT_LAYERS(ct_embedding(9, 4), ct_dropout(0.5f), ct_dup()));
    *model = ct_serial(CT_LAYERS(first, half(ct_dense(4), ct_dropout(0.2f)), ct_reversible_swap(),
                                 half(ct_dropout(0.5f), ct_dense(4)), ct_reversible_swap()));
    *loss = trax_loss();
}

// Trax's test_run_reversible_same_as_default_extended.
static void extended_model(ct_layer **model, ct_layer **loss) {
    ct_layer *first = ct_serial(CT_LAYERS(ct_embedding(9, 4), ct_dropout(0.5f), ct_dup()));
    ct_layer *mid = ct_serial(CT_LAYERS(ct_add(), ct_dense(4), ct_dup()));
    *model = ct_serial(CT_LAYERS(first, half(ct_dense(4), ct_dropout(0.2f)), ct_reversible_swap(),
                                 half(ct_dropout(0.5f), ct_dense(4)), ct_reversible_swap(), mid,
                                 half(ct_dense(4), ct_dropout(0.3f)), ct_reversible_swap()));
    *loss = trax_loss();
}

static ct_reformer_lm_params small_reformer(int n_layers) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = 11;
    p.d_model = 8;
    p.d_ff = 16;
    p.n_layers = n_layers;
    p.n_heads = 2;
    p.max_len = 64;
    p.dropout = 0.1f;
    return p;
}

static void reformer_model(ct_layer **model, ct_layer **loss) {
    *model = ct_reformer_lm(small_reformer(2));
    *loss = ct_weighted_category_cross_entropy();
}

// Four layers alternating SelfAttention and LSHSelfAttention (2 rounds, 4
// buckets, chunks of 4) at dropout 0.2, for (B, 16) tokens: the sorted
// length 2 x 16 is 8 chunks. Every attention's input is rebuilt in reverse
// by its feed-forward's subtraction.
static void lsh_reformer_model(ct_layer **model, ct_layer **loss) {
    ct_reformer_lm_params p = small_reformer(4);
    p.dropout = 0.2f;
    p.n_attention = 2;
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;
    p.self_attention.chunk_len = 4;
    p.self_attention.n_chunks_before = 1;
    p.attention[1] = CT_REFORMER_LSH_ATTENTION;
    p.lsh_attention.chunk_len = 4;
    p.lsh_attention.n_hashes = 2;
    p.lsh_attention.n_buckets[0] = 4;
    *model = ct_reformer_lm(p);
    *loss = ct_weighted_category_cross_entropy();
}

// A weightless layer with state, written to the reversible contract (a
// recomputation sees the state its forward left, reversible.h):
//   y = s (1 + n) x,  x and y of any shape,
// where n counts the training forwards before this one and s = +-1 per
// element by the last bit of x's float: a hash of the input as sensitive
// as one can be (LSHSelfAttention's buckets flip only near an argmax tie;
// these flip on any rounding). A training forward whose key is the one the
// state is tagged with is its own recomputation: it uses the stored signs
// and n = count - 1 and changes no state. Any other training forward hashes
// x, stores the signs, counts and tags the state with its key.
//
// So the trainer's contract shows in the gradients (s and n scale them):
// handed the state from before the forward, the recomputation is a fresh
// forward and hashes again, and where its input is rebuilt by subtraction
// (the first half-residual of a stack) the signs flip; a layer that did not
// recognise its recomputation would use n + 1.
enum { COUNTER_COUNT, COUNTER_TAG, COUNTER_SIGNS };

// The key as four exact 16-bit halves, so the tag stays a finite float.
static void key_halves(ct_key k, float *out) {
    for (int i = 0; i < 2; i++) out[2 * i] = (float)(k.w[i] & 0xffffu), out[2 * i + 1] = (float)(k.w[i] >> 16);
}

static ct_status counter_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)err;
    ct_initializer zeros = {CT_INIT_ZEROS, 0};
    ct_layer_declare_state(l, ic, "count", ct_tensor_1d(CT_DTYPE_F32, 1, NULL), zeros, key);
    ct_layer_declare_state(l, ic, "tag", ct_tensor_1d(CT_DTYPE_F32, 4, NULL), zeros, key);
    ct_layer_declare_state(l, ic, "signs", ct_tensor_1d(CT_DTYPE_F32, ct_tensor_numel(&in[0]), NULL), zeros, key);
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

// Tape: the factors s (1 + n), x's shape.
static ct_status counter_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                 ct_error *err) {
    const int64_t numel = ct_tensor_numel(&in[0]);
    if (numel != ct_tensor_numel(&l->in_sigs[0]))
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "forward", "%lld elements, init had %lld", (long long)numel,
                             (long long)ct_tensor_numel(&l->in_sigs[0]));
    float *count = ct_state(c, l, COUNTER_COUNT), *tag = ct_state(c, l, COUNTER_TAG);
    float *signs = ct_state(c, l, COUNTER_SIGNS), halves[4];
    key_halves(key, halves);
    bool recompute = c->train && *count > 0 && memcmp(tag, halves, sizeof halves) == 0;
    float n = recompute ? *count - 1 : *count;
    out[0] = ct_tensor_sig(&in[0]);
    ct_tensor factor = ct_tensor_sig(&in[0]);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    CT_TRY(ct_ctx_alloc(c, &factor, err));
    const float *x = ct_f32(&in[0]);
    for (int64_t i = 0; i < numel; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        float s = recompute ? signs[i] : (bits & 1u) ? -1.0f : 1.0f;
        if (c->train && !recompute) signs[i] = s;
        ct_f32(&factor)[i] = s * (1.0f + n);
        ct_f32(&out[0])[i] = ct_f32(&factor)[i] * x[i];
    }
    if (c->train && !recompute) {
        *count += 1.0f;
        memcpy(tag, halves, sizeof halves);
    }
    return ct_tape_push(c, &factor, err);
}

static ct_status counter_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                  ct_key key, ct_error *err) {
    (void)l, (void)key;
    ct_tensor factor = ct_tape_pop(c);
    grad_in[0] = grad_out[0];
    if (!grad_out[0].data) return CT_OK;  // zero stays zero
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    for (int64_t i = 0; i < ct_tensor_numel(&factor); i++)
        ct_f32(&grad_in[0])[i] = ct_f32(&factor)[i] * ct_f32(&grad_out[0])[i];
    return CT_OK;
}
static const ct_layer_vtable counter_vt = {
    .type = "Counter", .init = counter_init, .forward = counter_forward, .backward = counter_backward};

static ct_layer *counter(void) { return ct_layer_new(&counter_vt, "Counter", 1, 1, NULL, NULL, 0); }

// The gradient check holds the signs fixed the way the trainers do: its
// forwards share one key, so every one after the first is a recomputation.
// Normal draws, as uniform()'s are multiples of 2^-23 (last bit 0 above
// 0.5): some signs must be -1 for the check to see them.
static void test_counter_gradients(void) {
    enum { N = 2 * 3 * 4 };
    float xd[N];
    ct_random_normal(ct_key_from_seed(5), xd, N, 1.0f);
    int odd = 0;
    for (int i = 0; i < N; i++) {
        uint32_t bits;
        memcpy(&bits, &xd[i], sizeof bits);
        odd += (int)(bits & 1u);
    }
    printf("Counter gradient check: %d of %d signs -1\n", odd, N);
    CHECK(odd > 0 && odd < N);
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 2, 3, 4, xd);
    check_layer("Counter (2,3,4), training", counter(), &x, 1, true);
}

// Counters in a standard layer (after the embedding) and in the first of
// two half-residuals, whose context the second one's reverse rebuilds by
// subtraction: each must count one forward per step and see its own signs
// again, though both layers' forwards run again in backward.
static void stateful_model(ct_layer **model, ct_layer **loss) {
    *model = ct_serial(CT_LAYERS(ct_embedding(9, 4), counter(), ct_dup(), half(ct_dense(4), counter()),
                                 ct_reversible_swap(), half(ct_dense(4), NULL), ct_reversible_swap()));
    *loss = ct_serial(CT_LAYERS(ct_concatenate(2, -1), ct_dense(19), ct_log_softmax(), ct_cross_entropy_loss()));
}

// The batch of Trax's tests: inputs arange(8) as (2, 4), targets 2 * inputs,
// weights ones.
typedef struct trax_batch {
    int32_t inputs[8], targets[8];
    float weights[8];
    ct_tensor t[3];
} trax_batch;

static void trax_batch_init(trax_batch *b) {
    for (int i = 0; i < 8; i++) {
        b->inputs[i] = i;
        b->targets[i] = 2 * i;
        b->weights[i] = 1.0f;
    }
    b->t[0] = ct_tensor_2d(CT_DTYPE_I32, 2, 4, b->inputs);
    b->t[1] = ct_tensor_2d(CT_DTYPE_I32, 2, 4, b->targets);
    b->t[2] = ct_tensor_2d(CT_DTYPE_F32, 2, 4, b->weights);
}

// A copy-task batch for ReformerLM: tokens (B, T) as inputs and targets.
typedef struct copy_batch {
    int32_t *tokens;
    float *weights;
    ct_tensor t[3];
} copy_batch;

static void copy_batch_init(copy_batch *b, int vocab, int length, int batch, uint64_t index) {
    ct_copy_task task = {vocab, length, false, 5, 0};
    int T = ct_copy_task_seq_len(&task);
    b->tokens = malloc((size_t)(batch * T) * sizeof *b->tokens);
    b->weights = malloc((size_t)(batch * T) * sizeof *b->weights);
    ct_copy_task_batch(&task, index, batch, b->tokens, b->weights);
    b->t[0] = ct_tensor_2d(CT_DTYPE_I32, batch, T, b->tokens);
    b->t[1] = ct_tensor_2d(CT_DTYPE_I32, batch, T, b->tokens);
    b->t[2] = ct_tensor_2d(CT_DTYPE_F32, batch, T, b->weights);
}

static void copy_batch_free(copy_batch *b) {
    free(b->tokens);
    free(b->weights);
}

// What a run leaves: weights, state and slots, with the weight and state
// names (and where each state tensor starts in state, and its size).
typedef struct result {
    size_t n_w, n_state, n_slots;
    float *w, *state, *slots;
    float *grads;  // the last step's gradients (n_w), when the trainer has them
    int n_params, n_state_params;
    char **names, **state_names;
    size_t *offsets;  // per weight: where it starts in w
    size_t *state_offsets;
    int64_t *state_numel;
    ct_step_stats last;
    float losses[8];
} result;

static void result_take(result *r, const ct_net *net, const float *slots, size_t n_slots) {
    r->n_w = net->n_weights;
    r->n_state = net->n_state;
    r->n_slots = n_slots;
    r->w = malloc(r->n_w * sizeof(float) + 4);
    r->state = malloc(r->n_state * sizeof(float) + 4);
    r->slots = malloc(r->n_slots * sizeof(float) + 4);
    memcpy(r->w, net->weights, r->n_w * sizeof(float));
    if (r->n_state) memcpy(r->state, net->state, r->n_state * sizeof(float));
    if (r->n_slots) memcpy(r->slots, slots, r->n_slots * sizeof(float));
    r->n_params = net->n_params;
    r->names = malloc((size_t)r->n_params * sizeof *r->names + 1);
    r->offsets = malloc((size_t)r->n_params * sizeof *r->offsets + 1);
    for (int i = 0; i < r->n_params; i++) {
        r->names[i] = strdup(net->params[i]->full_name);
        r->offsets[i] = net->params[i]->offset;
    }
    r->n_state_params = net->n_state_params;
    r->state_names = malloc((size_t)r->n_state_params * sizeof *r->state_names + 1);
    r->state_offsets = malloc((size_t)r->n_state_params * sizeof *r->state_offsets + 1);
    r->state_numel = malloc((size_t)r->n_state_params * sizeof *r->state_numel + 1);
    for (int i = 0; i < r->n_state_params; i++) {
        r->state_names[i] = strdup(net->state_params[i]->full_name);
        r->state_offsets[i] = net->state_params[i]->offset;
        r->state_numel[i] = ct_tensor_numel(&net->state_params[i]->sig);
    }
}

static void result_free(result *r) {
    free(r->w);
    free(r->state);
    free(r->slots);
    free(r->grads);
    for (int i = 0; i < r->n_params; i++) free(r->names[i]);
    free(r->names);
    free(r->offsets);
    for (int i = 0; i < r->n_state_params; i++) free(r->state_names[i]);
    free(r->state_names);
    free(r->state_offsets);
    free(r->state_numel);
}

// The state tensors of r named name (the last element of their full name),
// in slab order: up to max pointers into r->state and, if numel is not
// NULL, their sizes; returns how many.
static int find_states(const result *r, const char *name, const float **at, int64_t *numel, int max) {
    int n = 0;
    size_t len = strlen(name);
    for (int i = 0; i < r->n_state_params && n < max; i++) {
        const char *full = r->state_names[i];
        size_t fl = strlen(full);
        if (fl > len && full[fl - len - 1] == '/' && strcmp(full + fl - len, name) == 0) {
            if (numel) numel[n] = r->state_numel[i];
            at[n++] = r->state + r->state_offsets[i];
        }
    }
    return n;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}

// The trainer's last gradients into r->grads (NULL when it kept none).
static void take_grads(result *r, const ct_trainer *tr) {
    const float *g = ct_trainer_grads(tr);
    r->grads = NULL;
    if (!g) return;
    r->grads = malloc(r->n_w * sizeof(float) + 4);
    memcpy(r->grads, g, r->n_w * sizeof(float));
}

typedef struct run_spec {
    model_fn model;
    optimizer_fn opt;
    const ct_tensor *batch;
    int n_batch;
    int n_steps;
    const float *lrs;       // per step
    const uint64_t *seeds;  // per step key
    uint64_t init_seed;
    float clip;             // standard trainer only: lr scaled by min(1, clip/|g|) from clip_norms
    const float *clip_norms;
    int n_devices;          // local devices (0: 1)
    const char *const *frozen;  // both trainers: weights frozen by name prefix
    int n_frozen;
    bool keep_grads;  // reversible: keep the last step's gradients (the standard trainer always has them)
} run_spec;

static int run_standard(const run_spec *s, result *r) {
    ct_layer *model, *loss;
    s->model(&model, &loss);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = s->n_devices ? s->n_devices : 1;
    o.frozen = s->frozen;
    o.n_frozen = s->n_frozen;
    ct_status st = ct_trainer_new(&tr, model, loss, s->batch, s->n_batch, s->opt(), ct_key_from_seed(s->init_seed),
                                  &dev, &o, &err);
    CHECK_OK(st, &err);
    if (st != CT_OK) return -1;
    for (int i = 0; i < s->n_steps; i++) {
        float lr = s->lrs[i];
        if (s->clip > 0 && s->clip_norms[i] > s->clip) lr *= s->clip / s->clip_norms[i];
        CHECK_OK(ct_trainer_one_step(tr, s->batch, ct_key_from_seed(s->seeds[i]), i + 1, lr, &r->last, &err), &err);
        r->losses[i] = r->last.loss;
    }
    size_t n_slots;
    float *slots = ct_trainer_slots(tr, &n_slots);
    result_take(r, ct_trainer_net(tr), slots, n_slots);
    take_grads(r, tr);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
    return 0;
}

static int run_reversible(const run_spec *s, const ct_trainer_options *o, result *r, ct_device *dev_out,
                          float *grad_norms) {
    ct_layer *model, *loss;
    s->model(&model, &loss);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_trainer_options opts = o ? *o : ct_reversible_default_options();
    if (s->n_devices) opts.n_devices = s->n_devices;
    if (s->n_frozen) opts.frozen = s->frozen, opts.n_frozen = s->n_frozen;
    if (s->keep_grads) opts.reversible.keep_grads = true;
    ct_status st = ct_trainer_new(&tr, model, loss, s->batch, s->n_batch, s->opt(),
                                             ct_key_from_seed(s->init_seed), &dev, &opts, &err);
    CHECK_OK(st, &err);
    if (st != CT_OK) return -1;
    for (int i = 0; i < s->n_steps; i++) {
        CHECK_OK(ct_trainer_one_step(tr, s->batch, ct_key_from_seed(s->seeds[i]), i + 1, s->lrs[i],
                                                &r->last, &err),
                 &err);
        r->losses[i] = r->last.loss;
        if (grad_norms) grad_norms[i] = r->last.gradients_l2;
    }
    size_t n_slots;
    float *slots = ct_trainer_slots(tr, &n_slots);
    result_take(r, ct_trainer_net(tr), slots, n_slots);
    take_grads(r, tr);
    if (dev_out) *dev_out = dev;
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
    return 0;
}

// Same names, same layout; returns the largest weight difference.
static double compare(const char *label, const result *a, const result *b) {
    CHECK(a->n_w == b->n_w && a->n_slots == b->n_slots && a->n_state == b->n_state && a->n_params == b->n_params);
    if (a->n_w != b->n_w || a->n_params != b->n_params || a->n_slots != b->n_slots || a->n_state != b->n_state)
        return INFINITY;
    for (int i = 0; i < a->n_params; i++) CHECK(strcmp(a->names[i], b->names[i]) == 0);
    CHECK(a->n_state_params == b->n_state_params);
    for (int i = 0; i < a->n_state_params && i < b->n_state_params; i++)
        CHECK(strcmp(a->state_names[i], b->state_names[i]) == 0 && a->state_offsets[i] == b->state_offsets[i]);
    double dw = max_abs_diff(a->w, b->w, a->n_w);
    double ds = max_abs_diff(a->slots, b->slots, a->n_slots);
    double dst = max_abs_diff(a->state, b->state, a->n_state);
    printf("%-46s max |w diff| %.2e, max |slot diff| %.2e, state diff %.2e, loss %.6f vs %.6f (%d weights)\n", label,
           dw, ds, dst, a->last.loss, b->last.loss, a->n_params);
    return dw;
}

// Runs s on both trainers; the reversible one must give the standard one's
// weights, slots, losses and norms within 1e-5 and its state bitwise. The
// results stay in std_r and rev_r for more checks (the caller frees them,
// whatever this returns); false if a run failed.
static bool same_as_standard(const char *label, const run_spec *s, result *std_r, result *rev_r) {
    *std_r = *rev_r = (result){0};
    if (run_standard(s, std_r) || run_reversible(s, NULL, rev_r, NULL, NULL)) return false;
    double d = compare(label, std_r, rev_r);
    CHECK_MSG(d <= WEIGHT_TOL, "%s: weights differ by %g", label, d);
    double ds = max_abs_diff(std_r->slots, rev_r->slots, std_r->n_slots);
    CHECK_MSG(ds <= WEIGHT_TOL, "%s: slots differ by %g", label, ds);
    CHECK_MSG(max_abs_diff(std_r->state, rev_r->state, std_r->n_state) == 0, "%s: state differs", label);
    if (s->keep_grads) {
        CHECK_MSG(rev_r->grads != NULL, "%s: keep_grads kept no gradients", label);
        double dg = rev_r->grads ? max_abs_diff(std_r->grads, rev_r->grads, std_r->n_w) : INFINITY;
        printf("  last step's gradients kept: max |grad diff| %.2e\n", dg);
        CHECK_MSG(dg <= WEIGHT_TOL, "%s: kept gradients differ by %g", label, dg);
    }
    for (int i = 0; i < s->n_steps; i++) CHECK_NEAR(std_r->losses[i], rev_r->losses[i], 1e-5);
    CHECK_NEAR(std_r->last.gradients_l2, rev_r->last.gradients_l2, 1e-5 * (1 + std_r->last.gradients_l2));
    CHECK_NEAR(std_r->last.weights_l2, rev_r->last.weights_l2, 1e-5 * (1 + std_r->last.weights_l2));
    return true;
}

static void check_same_as_standard(const char *label, const run_spec *s) {
    result std_r, rev_r;
    same_as_standard(label, s, &std_r, &rev_r);
    result_free(&std_r);
    result_free(&rev_r);
}

static const uint64_t trax_seeds[3] = {7, 8, 9};

static void test_trax_equivalence(optimizer_fn opt, float default_lr, const char *name) {
    trax_batch b;
    trax_batch_init(&b);
    // Trax's first step uses the optimizer's own learning rate.
    float lrs[3] = {default_lr, 0.02f, 0.03f};
    char label[96];
    run_spec s = {basic_model, opt, b.t, 3, 2, lrs, trax_seeds, 12, 0, NULL, 0, NULL, 0, false};
    snprintf(label, sizeof label, "basic model, %s, 2 steps", name);
    check_same_as_standard(label, &s);
    s.model = extended_model;
    s.n_steps = 3;
    snprintf(label, sizeof label, "two blocks + middle layer, %s, 3 steps", name);
    check_same_as_standard(label, &s);
}

static void test_blocks_api(void) {
    // The blocks form is the same trainer as Serial(std..., rev..., ...).
    trax_batch b;
    trax_batch_init(&b);
    float lrs[2] = {1e-4f, 0.02f};
    run_spec s = {basic_model, adam, b.t, 3, 2, lrs, trax_seeds, 12, 0, NULL, 0, NULL, 0, false};
    result std_r = {0};
    if (run_standard(&s, &std_r)) return;
    ct_layer *std_layers[3] = {ct_embedding(9, 4), ct_dropout(0.5f), ct_dup()};
    ct_layer *rev_layers[4] = {half(ct_dense(4), ct_dropout(0.2f)), ct_reversible_swap(),
                               half(ct_dropout(0.5f), ct_dense(4)), ct_reversible_swap()};
    ct_reversible_block block = {3, std_layers, 4, rev_layers};
    ct_layer *loss = trax_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new_blocks(&tr, &block, 1, loss, b.t, 3, adam(), ct_key_from_seed(12), &dev, NULL,
                                              &err),
             &err);
    result rev_r = {0};
    for (int i = 0; i < 2; i++)
        CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(trax_seeds[i]), i + 1, lrs[i], &rev_r.last,
                                                &err),
                 &err);
    CHECK(ct_trainer_n_layers(tr) == 6);
    for (int i = 0; i < ct_trainer_n_layers(tr); i++)
        printf("  layer%d: %s\n", i, ct_trainer_layer_desc(tr, i));
    CHECK(strcmp(ct_trainer_layer_desc(tr, 0), "standard: Embedding, Dropout, Dup") == 0);
    CHECK(strncmp(ct_trainer_layer_desc(tr, 1), "reversible: Serial/ReversibleHalfResidual[3]",
                  60) == 0);
    CHECK(strcmp(ct_trainer_layer_desc(tr, 5), "loss: Serial") == 0);
    size_t n_slots;
    float *slots = ct_trainer_slots(tr, &n_slots);
    result_take(&rev_r, ct_trainer_net(tr), slots, n_slots);
    double d = compare("blocks API, basic model, Adam, 2 steps", &std_r, &rev_r);
    CHECK_MSG(d <= WEIGHT_TOL, "blocks API: weights differ by %g", d);
    ct_trainer_free(tr);
    for (int i = 0; i < 3; i++) ct_layer_free(std_layers[i]);
    for (int i = 0; i < 4; i++) ct_layer_free(rev_layers[i]);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
    result_free(&std_r);
    result_free(&rev_r);
}

// Counts that cannot describe the arrays are refused before any layer is
// referenced: a negative n_std with a positive n_rev once sized the layer
// list by their sum (2 - 1 = 1 slot for the block's 2 reversible layers).
static void test_blocks_refused(void) {
    trax_batch b;
    trax_batch_init(&b);
    ct_layer *std_layers[1] = {ct_dense(4)};
    ct_layer *rev_layers[2] = {half(ct_dense(4), NULL), ct_reversible_swap()};
    ct_layer *with_null[2] = {rev_layers[0], NULL};
    ct_layer *loss = trax_loss();
    struct {
        ct_reversible_block block;
        int n_blocks;
        const char *want;
    } cases[] = {
        {{-1, std_layers, 2, rev_layers}, 1, "block 0 has -1 standard and 2 reversible layers"},
        {{1, std_layers, -2, rev_layers}, 1, "block 0 has 1 standard and -2 reversible layers"},
        {{1, NULL, 2, rev_layers}, 1, "block 0 has 1 standard and 2 reversible layers"},
        {{1, std_layers, 2, with_null}, 1, "block 0 has 1 standard and 2 reversible layers"},
        {{1, std_layers, 2, rev_layers}, -1, "-1 blocks (must be >= 0)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ct_device dev = ct_device_cpu();
        ct_trainer *tr = (ct_trainer *)&dev;  // must come back NULL
        ct_error err = {0};
        // The optimizer is the trainer's even when it fails.
        ct_status st = ct_trainer_new_blocks(&tr, &cases[i].block, cases[i].n_blocks, loss, b.t, 3, adam(),
                                             ct_key_from_seed(1), &dev, NULL, &err);
        printf("blocks case %zu: %s\n", i, err.msg);
        CHECK_MSG(st == CT_ERR_ARG && tr == NULL && strstr(err.msg, cases[i].want),
                  "case %zu: status %d, message \"%s\"", i, (int)st, err.msg);
        if (st == CT_OK) ct_trainer_free(tr);
        CHECK(dev.current_bytes == 0);
    }
    for (int i = 0; i < 2; i++) ct_layer_free(rev_layers[i]);
    ct_layer_free(std_layers[0]);
    ct_layer_free(loss);
}

// A clip mode that is neither CT_CLIP_GLOBAL nor CT_CLIP_PER_LAYER (a
// config's stray integer) is refused: it would clip nothing, silently.
static void test_invalid_clip_mode(void) {
    trax_batch b;
    trax_batch_init(&b);
    ct_layer *model, *loss;
    basic_model(&model, &loss);
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_reversible_default_options();
    o.clip_grad_norm = 1.0f;
    o.reversible.clip_mode = (ct_clip_mode)7;
    ct_trainer *tr = NULL;
    ct_error err = {0};
    ct_status st = ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(1), &dev, &o, &err);
    printf("clip mode 7: %s\n", err.msg);
    CHECK_MSG(st == CT_ERR_ARG && tr == NULL && strstr(err.msg, "clip mode 7 is invalid"), "status %d: %s", (int)st,
              err.msg);
    if (st == CT_OK) ct_trainer_free(tr);
    CHECK(dev.current_bytes == 0);
    ct_layer_free(model);
    ct_layer_free(loss);
}

// Zero: no inputs, out = 0.0f (a scalar). ReversibleHalfResidual(Zero) is
// a reversible layer of one item, [l] -> [l + 0], that can end a loss.
static ct_status zero_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                           ct_error *err) {
    (void)l, (void)ic, (void)in, (void)key, (void)err;
    out[0] = ct_tensor_make(CT_DTYPE_F32, 0, NULL, NULL);
    return CT_OK;
}

static ct_status zero_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)l, (void)in, (void)key;
    out[0] = ct_tensor_make(CT_DTYPE_F32, 0, NULL, NULL);
    return ct_ctx_zeros(c, &out[0], err);
}

static ct_status zero_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                               ct_error *err) {
    (void)l, (void)c, (void)grad_out, (void)grad_in, (void)key, (void)err;
    return CT_OK;
}

static const ct_layer_vtable zero_vt = {
    .type = "Zero", .init = zero_init, .forward = zero_forward, .backward = zero_backward};

// A loss whose last layer is reversible has no standard loss layer to end
// the trainer's layers with (the scalar loss would go through the reverse
// walk without a seed): refused, naming the loss.
static void test_reversible_last_refused(void) {
    trax_batch b;
    trax_batch_init(&b);
    ct_layer *model, *loss;
    basic_model(&model, &loss);
    ct_layer *rev_loss = ct_serial(CT_LAYERS(
        loss, ct_reversible_half_residual(CT_LAYERS(ct_layer_new(&zero_vt, "Zero", 0, 1, NULL, NULL, 0)))));
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = NULL;
    ct_error err = {0};
    ct_trainer_options o = ct_reversible_default_options();
    ct_status st = ct_trainer_new(&tr, model, rev_loss, b.t, 3, adam(), ct_key_from_seed(1), &dev, &o, &err);
    printf("loss ending with a reversible layer: %s\n", err.msg);
    CHECK_MSG(st == CT_ERR_ARG && tr == NULL && strstr(err.msg, "the last layer must be a standard loss") &&
                  strstr(err.msg, "(Serial/ReversibleHalfResidual[5], in the loss Serial)"),
              "status %d: %s", (int)st, err.msg);
    if (st == CT_OK) ct_trainer_free(tr);
    CHECK(dev.current_bytes == 0);
    ct_layer_free(model);
    ct_layer_free(rev_loss);
}

static void test_reformer_equivalence(void) {
    // Dropout 0.1 everywhere, nested Serial/ReversibleSerial: the keys
    // follow the layers' paths, so the masks (and weights) match.
    copy_batch b;
    copy_batch_init(&b, 11, 3, 2, 1);
    float lrs[3] = {1e-3f, 1e-3f, 2e-3f};
    run_spec s = {reformer_model, adam, b.t, 3, 3, lrs, trax_seeds, 3, 0, NULL, 0, NULL, 0, false};
    check_same_as_standard("ReformerLM(2 layers, dropout 0.1), Adam, 3 steps", &s);
    copy_batch_free(&b);
}

// The counters after a run: each counted one forward per step (n_steps),
// in both trainers, and its last signs are mixed (all +1 would hide a
// recomputation that hashed again).
static void check_counts(const char *label, const result *std_r, const result *rev_r, int n_steps) {
    const float *a[2], *b[2], *signs[2];
    int64_t n_signs[2];
    int na = find_states(std_r, "count", a, NULL, 2), nb = find_states(rev_r, "count", b, NULL, 2);
    int ns = find_states(rev_r, "signs", signs, n_signs, 2);
    CHECK_MSG(na == 2 && nb == 2 && ns == 2, "%s: %d, %d and %d counters", label, na, nb, ns);
    for (int i = 0; i < na && i < nb && i < ns; i++) {
        int neg = 0;
        for (int64_t j = 0; j < n_signs[i]; j++) neg += signs[i][j] < 0;
        printf("  counter %d after %d steps: standard %g, reversible %g; %d of %lld signs -1\n", i, n_steps, a[i][0],
               b[i][0], neg, (long long)n_signs[i]);
        CHECK(a[i][0] == (float)n_steps && b[i][0] == (float)n_steps);
        CHECK(neg > 0 && neg < n_signs[i]);
    }
}

static void test_lsh_reformer_equivalence(void) {
    // Issue 12: the buckets and dropout masks of the recomputation are the
    // forward's, so the memory-efficient trainer gives the standard one's
    // weights, slots, losses and state (buckets and hash words, bitwise).
    copy_batch b;
    copy_batch_init(&b, 11, 7, 2, 3);
    float lrs[3] = {1e-3f, 1e-3f, 2e-3f};
    run_spec s = {lsh_reformer_model, adam, b.t, 3, 3, lrs, trax_seeds, 5, 0, NULL, 0, NULL, 0, false};
    result std_r, rev_r;
    if (same_as_standard("ReformerLM(4 layers, Self/LSH, dropout 0.2), Adam, 3 steps", &s, &std_r, &rev_r)) {
        // One hashing per training forward (each step has its own key) and
        // none that stays: the count in each LSHSelfAttention's "hash" state
        // (its third word, floats 4 and 5: lsh_attention.h) is the step
        // count. Extra hashings in the planning pass or in backward that
        // were not put back would raise it.
        const float *a[4], *h[4];
        int na = find_states(&std_r, "hash", a, NULL, 4), nh = find_states(&rev_r, "hash", h, NULL, 4);
        CHECK_MSG(na == 2 && nh == 2, "%d and %d LSHSelfAttention hash states, expected 2", na, nh);
        for (int i = 0; i < na && i < nh; i++) {
            float ca = a[i][4] + 65536.0f * a[i][5], ch = h[i][4] + 65536.0f * h[i][5];
            printf("  LSH layer %d: hash count after %d steps: standard %g, reversible %g\n", i, s.n_steps, ca, ch);
            CHECK(ca == (float)s.n_steps && ch == (float)s.n_steps);
        }
    }
    result_free(&std_r);
    result_free(&rev_r);
    copy_batch_free(&b);
}

// A counter's signs are read off the last bit of its input, so the two
// trainers agree on them only while their forwards see the same weights.
// After a step with a learning rate they need not: the reversible trainer
// rebuilds inputs by subtraction, its gradients differ in the last bits and
// so do the next step's weights (1.9e-09 after two steps here) and inputs.
// Hence one step with a learning rate (weights, slots and state compared as
// everywhere), then three at lr 0: every step's forward sees the same
// weights, the counts reach 3, and the slots (Adam's moments) carry all
// three steps' gradients.
static void test_state(void) {
    trax_batch b;
    trax_batch_init(&b);
    const float lrs[2][3] = {{1e-2f}, {0, 0, 0}};
    for (int n_devices = 1; n_devices <= 2; n_devices++) {
        for (int run = 0; run < 2; run++) {
            // On 2 local devices (each its own row of the batch) the state is
            // device 0's, counted once per step.
            run_spec s = {stateful_model, adam, b.t, 3, run ? 3 : 1, lrs[run], trax_seeds, 12, 0, NULL, n_devices,
                          NULL, 0, false};
            char label[96];
            snprintf(label, sizeof label, "layer with state (counter), %d device%s, %d step%s%s", n_devices,
                     n_devices > 1 ? "s" : "", s.n_steps, s.n_steps > 1 ? "s" : "", run ? " at lr 0" : "");
            result std_r, rev_r;
            if (same_as_standard(label, &s, &std_r, &rev_r)) check_counts(label, &std_r, &rev_r, s.n_steps);
            result_free(&std_r);
            result_free(&rev_r);
        }
    }
}

// A counter in the loss layer too (after the last reversible layer): a
// step whose loss is not finite (a huge kernel in the loss layer) updates nothing,
// and every counter, the loss layer's included, counts as before it.
static void loss_state_model(ct_layer **model, ct_layer **loss) {
    stateful_model(model, loss);
    ct_layer_free(*loss);
    *loss = ct_serial(CT_LAYERS(ct_concatenate(2, -1), ct_dense(19), counter(), ct_log_softmax(),
                                ct_cross_entropy_loss()));
}

static void test_loss_state_nonfinite(void) {
    trax_batch b;
    trax_batch_init(&b);
    ct_layer *model, *loss;
    loss_state_model(&model, &loss);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_trainer_options o = ct_reversible_default_options();
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(12), &dev, &o, &err), &err);
    for (int i = 1; i <= 2; i++)
        CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(trax_seeds[i]), i, 1e-2f, NULL, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    size_t healthy_bytes = dev.current_bytes;  // the stack items a step needs, from the planning pass on
    // The loss layer's Dense kernel (the last kernel) huge: infinite logits.
    const ct_param *kernel = NULL;
    for (int i = 0; i < net->n_params; i++)
        if (strstr(net->params[i]->full_name, "/kernel")) kernel = net->params[i];
    size_t kernel_n = (size_t)ct_tensor_numel(&kernel->sig);
    float *kernel_was = malloc(kernel_n * sizeof(float));
    memcpy(kernel_was, net->weights + kernel->offset, kernel_n * sizeof(float));
    for (size_t i = 0; i < kernel_n; i++) net->weights[kernel->offset + i] = 1e38f;
    size_t n_slots;
    const float *slots = ct_trainer_slots(tr, &n_slots);
    result before = {0}, after = {0};
    result_take(&before, net, slots, n_slots);
    CHECK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(9), 3, 1e-2f, NULL, &err) == CT_ERR_NONFINITE);
    printf("huge kernel in the loss layer (a counter there too): %s\n", err.msg);
    // Found at the loss, before any backward (not as the loss layer's gradient).
    CHECK_MSG(strncmp(err.msg, "non-finite loss (", 17) == 0, "%s", err.msg);
    result_take(&after, net, slots, n_slots);
    const float *counts[3];
    int n = find_states(&after, "count", counts, NULL, 3);
    CHECK_MSG(n == 3, "%d counters, expected 3", n);
    for (int i = 0; i < n; i++) CHECK_MSG(counts[i][0] == 2.0f, "counter %d counts %g after 2 steps", i, counts[i][0]);
    CHECK(memcmp(before.state, after.state, before.n_state * sizeof(float)) == 0);
    CHECK(memcmp(before.w, after.w, before.n_w * sizeof(float)) == 0);
    CHECK(memcmp(before.slots, after.slots, before.n_slots * sizeof(float)) == 0);
    // The failed step's stack items are given back: the next steps reuse
    // the same buffers.
    memcpy(net->weights + kernel->offset, kernel_was, kernel_n * sizeof(float));
    for (int i = 3; i <= 4; i++)
        CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(trax_seeds[i - 3]), i, 1e-2f, NULL, &err), &err);
    CHECK_MSG(dev.current_bytes == healthy_bytes, "device bytes %zu after a failed step, %zu before",
              dev.current_bytes, healthy_bytes);
    free(kernel_was);
    result_free(&before);
    result_free(&after);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

static void test_options(void) {
    // Every staging variant gives bitwise the same weights as zero-copy.
    copy_batch b;
    copy_batch_init(&b, 11, 3, 2, 2);
    float lrs[2] = {1e-3f, 1e-3f};
    run_spec s = {reformer_model, adam, b.t, 3, 2, lrs, trax_seeds, 4, 0, NULL, 0, NULL, 0, false};
    ct_trainer_options o = ct_reversible_default_options();
    result base = {0};
    ct_device dev_zero, dev;
    if (run_reversible(&s, &o, &base, &dev_zero, NULL)) return;
    const char *names[3] = {"copy_weights + prefetch thread", "copy_weights, no thread", "copy + free each step"};
    for (int v = 0; v < 3; v++) {
        o = ct_reversible_default_options();
        o.reversible.copy_weights = true;
        o.reversible.prefetch = v == 0 || v == 2;
        o.reversible.free_device_each_step = v == 2;
        result r = {0};
        if (run_reversible(&s, &o, &r, &dev, NULL)) continue;
        CHECK_MSG(memcmp(r.w, base.w, base.n_w * sizeof(float)) == 0, "%s: weights differ from zero-copy", names[v]);
        CHECK_MSG(memcmp(r.slots, base.slots, base.n_slots * sizeof(float)) == 0, "%s: slots differ", names[v]);
        printf("%-32s weights and slots bitwise equal to zero-copy; device peak %zu bytes (zero-copy %zu), %llu "
               "device allocations (zero-copy %llu)\n",
               names[v], dev.peak_bytes, dev_zero.peak_bytes, (unsigned long long)dev.n_allocs,
               (unsigned long long)dev_zero.n_allocs);
        // Staged copies take device memory zero-copy does not.
        CHECK(dev.peak_bytes > dev_zero.peak_bytes);
        if (v == 2) CHECK(dev.n_allocs > dev_zero.n_allocs);  // allocated again each step
        result_free(&r);
    }
    result_free(&base);

    // Global clipping updates every layer in a second pass, staged in copies
    // of its own: bitwise the zero-copy update too (0.05 binds at each step).
    o = ct_reversible_default_options();
    o.clip_grad_norm = 0.05f;
    base = (result){0};
    if (run_reversible(&s, &o, &base, NULL, NULL) == 0) {
        o.reversible.copy_weights = true;
        result r = {0};
        if (run_reversible(&s, &o, &r, NULL, NULL) == 0) {
            CHECK_MSG(memcmp(r.w, base.w, base.n_w * sizeof(float)) == 0, "copy + global clipping: weights differ");
            CHECK_MSG(memcmp(r.slots, base.slots, base.n_slots * sizeof(float)) == 0,
                      "copy + global clipping: slots differ");
            result_free(&r);
        }
        result_free(&base);
    }

    // Freeing at each step leaves nothing on the device between steps.
    ct_layer *model, *loss;
    reformer_model(&model, &loss);
    dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    o = ct_reversible_default_options();
    o.reversible.free_device_each_step = true;
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(1), &dev, &o, &err), &err);
    CHECK(dev.current_bytes == 0);
    CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(2), 1, 1e-3f, NULL, &err), &err);
    CHECK_MSG(dev.current_bytes == 0, "%zu bytes left on the device", dev.current_bytes);
    CHECK(dev.peak_bytes > 0);
    const ct_device *host = ct_trainer_host(tr);
    const ct_net *net = ct_trainer_net(tr);
    size_t n_slots;
    ct_trainer_slots(tr, &n_slots);
    // The host holds weights, state and slots, and no gradient slab.
    CHECK(net->grads == NULL);
    size_t expect = ((net->n_weights * 4 + 63) / 64 + (n_slots * 4 + 63) / 64) * 64;
    CHECK_MSG(host->current_bytes == expect + (net->n_state ? (net->n_state * 4 + 63) / 64 * 64 : 0),
              "host bytes %zu, weights + slots %zu", host->current_bytes, expect);
    ct_trainer_free(tr);

    // No room on the device for the staging buffers: the planning pass
    // allocates them, so construction fails with the device's error, before
    // any step (issue 12: a limit below the memory plan fails at once).
    dev = ct_device_cpu();
    dev.limit_bytes = 64;
    o = ct_reversible_default_options();
    o.reversible.copy_weights = true;
    tr = NULL;
    ct_status st = ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(1), &dev, &o, &err);
    CHECK_MSG(st == CT_ERR_MEMORY && strstr(err.msg, "device memory limit") && tr == NULL,
              "construction under a 64-byte device: %s", err.msg);
    printf("copy_weights under a 64-byte device: %s\n", err.msg);
    CHECK(dev.current_bytes == 0);
    ct_layer_free(model);
    ct_layer_free(loss);
    copy_batch_free(&b);
}

static void test_stats(void) {
    trax_batch b;
    trax_batch_init(&b);
    ct_layer *model, *loss;
    basic_model(&model, &loss);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_trainer_options me = ct_reversible_default_options();
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(12), &dev, &me, &err), &err);
    ct_step_stats st;
    ct_log_set_level(CT_LOG_INFO);  // step 1 logs host memory (RSS), as every 100th step does
    CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(7), 1, 1e-3f, &st, &err), &err);
    ct_log_set_level(CT_LOG_WARN);
    int n;
    const ct_layer_stat *stats = ct_trainer_layer_stats(tr, &n);
    // Layers: 0 standard, 1 half, 2 swap, 3 half, 4 swap, 5 loss; the swaps
    // have no weights but take their index.
    const char *expect[] = {"layer0/gradients_l2", "layer0/weights_l2", "layer1/gradients_l2", "layer1/weights_l2",
                            "layer3/gradients_l2", "layer3/weights_l2", "layer5/gradients_l2", "layer5/weights_l2",
                            "layer5/loss"};
    CHECK(n == 9);
    double g2 = 0, w2 = 0;
    for (int i = 0; i < n && i < 9; i++) {
        printf("  %-22s %.6f\n", stats[i].name, stats[i].value);
        CHECK_MSG(strcmp(stats[i].name, expect[i]) == 0, "stat %d is %s, expected %s", i, stats[i].name, expect[i]);
        if (strstr(stats[i].name, "gradients_l2")) g2 += (double)stats[i].value * stats[i].value;
        if (strstr(stats[i].name, "weights_l2")) w2 += (double)stats[i].value * stats[i].value;
    }
    CHECK(n >= 9 && stats[8].value == st.loss);
    CHECK_NEAR(sqrt(g2), st.gradients_l2, 1e-5 * st.gradients_l2);
    CHECK_NEAR(sqrt(w2), st.weights_l2, 1e-5 * st.weights_l2);
    // A batch of the wrong dtype is refused as by the standard trainer.
    ct_tensor bad[3] = {b.t[2], b.t[1], b.t[2]};
    CHECK(ct_trainer_one_step(tr, bad, ct_key_from_seed(7), 2, 1e-3f, &st, &err) == CT_ERR_SHAPE);
    printf("bad batch: %s\n", err.msg);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// Host memory is logged at steps 1, 1 + log_every, 1 + 2 log_every, ...
// (Trax's every 100 steps), three times a step: read back from stderr.
static void test_memory_log(void) {
    trax_batch b;
    trax_batch_init(&b);
    ct_layer *model, *loss;
    basic_model(&model, &loss);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_trainer_options o = ct_reversible_default_options();
    o.reversible.log_every = 2;
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(12), &dev, &o, &err), &err);
    char log[4096] = "";
    FILE *f = tmpfile();
    int saved = dup(2);
    fflush(stderr);
    if (f && saved >= 0 && dup2(fileno(f), 2) >= 0) {
        ct_log_set_level(CT_LOG_INFO);
        for (int i = 1; i <= 4; i++)
            CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(7), i, 1e-3f, NULL, &err), &err);
        ct_log_set_level(CT_LOG_WARN);
        fflush(stderr);
        dup2(saved, 2);
        rewind(f);
        log[fread(log, 1, sizeof log - 1, f)] = '\0';
    }
    if (saved >= 0) close(saved);
    if (f) fclose(f);
    int lines = 0;
    for (const char *p = log; (p = strstr(p, "reversible trainer step")); p++) lines++;
    printf("memory log, log_every 2, 4 steps: %d lines\n", lines);
    CHECK_MSG(lines == 6 && strstr(log, "step 1, forward") && strstr(log, "step 3, backward done") &&
                  !strstr(log, "step 2,") && !strstr(log, "step 4,"),
              "memory log: %s", log);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// The update norm of one SGD step: |lr * g|, per-layer clipped to
// sqrt(sum over layers of min(|g_l|, c)^2), |g_l| read from the layer
// stats (before clipping). c is half the largest layer norm, so it binds
// for some layers and the unclipped update's norm is larger.
static void test_per_layer_clip_norms(void) {
    trax_batch b;
    trax_batch_init(&b);
    const float lr = 0.5f;
    float clip = 0;
    for (int run = 0; run < 2; run++) {
        ct_layer *model, *loss;
        extended_model(&model, &loss);
        ct_device dev = ct_device_cpu();
        ct_trainer_options o = ct_reversible_default_options();
        o.clip_grad_norm = clip;
        o.reversible.clip_mode = CT_CLIP_PER_LAYER;
        ct_trainer *tr;
        ct_error err;
        CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, sgd(), ct_key_from_seed(12), &dev, &o, &err), &err);
        const ct_net *net = ct_trainer_net(tr);
        float *before = malloc(net->n_weights * sizeof(float));
        memcpy(before, net->weights, net->n_weights * sizeof(float));
        ct_step_stats st;
        CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(7), 1, lr, &st, &err), &err);
        double step2 = 0, want2 = 0, most = 0;
        for (size_t i = 0; i < net->n_weights; i++)
            step2 += ((double)net->weights[i] - before[i]) * ((double)net->weights[i] - before[i]);
        int n;
        const ct_layer_stat *stats = ct_trainer_layer_stats(tr, &n);
        for (int i = 0; i < n; i++) {
            if (!strstr(stats[i].name, "gradients_l2")) continue;
            double g = stats[i].value, c = run ? fmin(g, clip) : g;
            want2 += c * c;
            most = fmax(most, g);
        }
        printf("per-layer clipping to %.4f: update norm / lr %.6f, expected %.6f (unclipped %.6f)\n", clip,
               sqrt(step2) / lr, sqrt(want2), (double)st.gradients_l2);
        CHECK_NEAR(sqrt(step2) / lr, sqrt(want2), 1e-4 * sqrt(want2));
        if (run) CHECK(sqrt(want2) < 0.99 * st.gradients_l2);
        clip = 0.5f * (float)most;
        free(before);
        ct_trainer_free(tr);
        ct_layer_free(model);
        ct_layer_free(loss);
        CHECK(dev.current_bytes == 0);
    }
}

static void test_clipping(void) {
    // SGD: global clipping is the update lr * min(1, c/|g|) * g, which the
    // standard trainer gives with its learning rate scaled by that factor.
    trax_batch b;
    trax_batch_init(&b);
    float lrs[3] = {0.5f, 0.5f, 0.5f}, norms[3];
    run_spec s = {extended_model, sgd, b.t, 3, 3, lrs, trax_seeds, 12, 0, NULL, 0, NULL, 0, false};
    ct_trainer_options o = ct_reversible_default_options();
    result unclipped = {0}, global = {0}, per_layer = {0}, std_r = {0};
    if (run_reversible(&s, &o, &unclipped, NULL, norms)) return;
    float clip = 0.5f * norms[0];  // binds at every step
    o.clip_grad_norm = clip;
    o.reversible.clip_mode = CT_CLIP_GLOBAL;
    if (run_reversible(&s, &o, &global, NULL, norms)) return;
    s.clip = clip;
    s.clip_norms = norms;
    if (run_standard(&s, &std_r)) return;
    printf("gradient norms %.4f %.4f %.4f, clipped to %.4f\n", norms[0], norms[1], norms[2], clip);
    double d = compare("global clipping vs standard (SGD)", &std_r, &global);
    CHECK_MSG(d <= WEIGHT_TOL, "global clipping: weights differ by %g", d);
    o.reversible.clip_mode = CT_CLIP_PER_LAYER;
    s.clip = 0;
    if (run_reversible(&s, &o, &per_layer, NULL, NULL)) return;
    double d_pl = max_abs_diff(per_layer.w, global.w, global.n_w);
    double d_un = max_abs_diff(unclipped.w, global.w, global.n_w);
    printf("per-layer (Trax) clipping differs from global by %.3e (unclipped differs by %.3e)\n", d_pl, d_un);
    CHECK(d_pl > 1e-3 && d_un > 1e-3);
    test_per_layer_clip_norms();
    result_free(&unclipped);
    result_free(&global);
    result_free(&per_layer);
    result_free(&std_r);
}

static void test_shared_weights_refused(void) {
    // One Dense in the first standard layer and in the loss layer.
    float x[8], y[8], w[8];
    for (int i = 0; i < 8; i++) x[i] = y[i] = w[i] = 1.0f;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 4, x), ct_tensor_2d(CT_DTYPE_F32, 2, 4, y),
                          ct_tensor_2d(CT_DTYPE_F32, 2, 4, w)};
    ct_layer *shared = ct_dense(4);
    ct_layer *model = ct_serial(CT_LAYERS(shared, ct_dup(), half(ct_dense(4), NULL), ct_reversible_swap()));
    ct_layer *loss = ct_serial(CT_LAYERS(ct_add(), ct_layer_ref(shared), ct_l2_loss()));
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    ct_trainer_options me = ct_reversible_default_options();
    CHECK(ct_trainer_new(&tr, model, loss, batch, 3, sgd(), ct_key_from_seed(1), &dev, &me, &err) ==
          CT_ERR_ARG);
    printf("shared weights: %s\n", err.msg);
    CHECK(strstr(err.msg, "Dense[0]/kernel is shared between trainer layer 3") != NULL);
    ct_layer_free(model);
    ct_layer_free(loss);
    // The same Dense as a leaf of the loss layer too: the message names it,
    // not the loss layer's first leaf (Add).
    shared = ct_dense(4);
    model = ct_serial(CT_LAYERS(shared, ct_dup(), half(ct_dense(4), NULL), ct_reversible_swap(), ct_add(),
                                ct_layer_ref(shared)));
    loss = ct_l2_loss();
    CHECK(ct_trainer_new(&tr, model, loss, batch, 3, sgd(), ct_key_from_seed(1), &dev, &me, &err) == CT_ERR_ARG);
    printf("shared leaf: %s\n", err.msg);
    CHECK(strstr(err.msg, "layer 3 (Serial/Dense[0]) shares weights or state with an earlier layer") != NULL);
    ct_layer_free(model);
    ct_layer_free(loss);
    // A layer with state (no weights) in the first trainer layer and inside
    // the loss layer: the first one's recomputation would put back its own
    // state over what the loss layer's use left (the standard Trainer counts
    // two uses a step).
    trax_batch tb;
    trax_batch_init(&tb);
    shared = counter();
    model = ct_serial(CT_LAYERS(ct_embedding(9, 4), shared, ct_dup(), half(ct_dense(4), NULL), ct_reversible_swap()));
    loss = ct_serial(
        CT_LAYERS(ct_add(), ct_layer_ref(shared), ct_dense(19), ct_log_softmax(), ct_cross_entropy_loss()));
    CHECK(ct_trainer_new(&tr, model, loss, tb.t, 3, sgd(), ct_key_from_seed(1), &dev, &me, &err) == CT_ERR_ARG);
    printf("shared state: %s\n", err.msg);
    CHECK(strstr(err.msg, "state Serial/Counter[1]/count is shared between trainer layer 3") != NULL);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// A weightless layer instance used twice, in two trainer layers: one
// ReversibleSwap for both swaps, one Relu in two blocks' standard layers.
// Nothing is shared but the instance (its empty weight range lies where its
// first use put it), so both are the standard Trainer's model.
static void shared_weightless_model(ct_layer **model, ct_layer **loss) {
    ct_layer *relu = ct_relu(), *swap = ct_reversible_swap();
    ct_layer *first = ct_serial(CT_LAYERS(ct_embedding(9, 4), relu, ct_dup()));
    ct_layer *mid = ct_serial(CT_LAYERS(ct_add(), ct_dense(4), ct_layer_ref(relu), ct_dup()));
    *model = ct_serial(CT_LAYERS(first, half(ct_dense(4), ct_dropout(0.2f)), swap, half(ct_dropout(0.5f), ct_dense(4)),
                                 ct_layer_ref(swap), mid, half(ct_dense(4), NULL), ct_layer_ref(swap)));
    *loss = trax_loss();
}

static void test_shared_weightless(void) {
    trax_batch b;
    trax_batch_init(&b);
    float lrs[3] = {1e-2f, 0.02f, 0.03f};
    run_spec s = {shared_weightless_model, adam, b.t, 3, 3, lrs, trax_seeds, 12, 0, NULL, 0, NULL, 0, false};
    check_same_as_standard("one Swap and one Relu instance used twice, Adam, 3 steps", &s);
}

// A layer that does not recognise its recomputation (reversible.h asks it
// to): it counts every training forward, y = x. The trainer puts the state
// the forward left back after each recomputation, so the counts are the
// standard Trainer's: one per step.
static ct_status ticks_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    (void)err;
    ct_layer_declare_state(l, ic, "ticks", ct_tensor_1d(CT_DTYPE_F32, 1, NULL), (ct_initializer){CT_INIT_ZEROS, 0},
                           key);
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status ticks_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    (void)key, (void)err;
    if (c->train) *ct_state(c, l, 0) += 1.0f;
    out[0] = in[0];
    return CT_OK;
}

static ct_status ticks_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                                ct_error *err) {
    (void)l, (void)c, (void)key, (void)err;
    grad_in[0] = grad_out[0];
    return CT_OK;
}

static const ct_layer_vtable ticks_vt = {
    .type = "Ticks", .init = ticks_init, .forward = ticks_forward, .backward = ticks_backward};

static void ticks_model(ct_layer **model, ct_layer **loss) {
    ct_layer *ticks[2] = {ct_layer_new(&ticks_vt, "Ticks", 1, 1, NULL, NULL, 0),
                          ct_layer_new(&ticks_vt, "Ticks", 1, 1, NULL, NULL, 0)};
    *model = ct_serial(CT_LAYERS(ct_embedding(9, 4), ticks[0], ct_dup(), half(ct_dense(4), ticks[1]),
                                 ct_reversible_swap(), half(ct_dense(4), NULL), ct_reversible_swap()));
    *loss = ct_serial(CT_LAYERS(ct_concatenate(2, -1), ct_dense(19), ct_log_softmax(), ct_cross_entropy_loss()));
}

static void test_state_put_back(void) {
    trax_batch b;
    trax_batch_init(&b);
    float lrs[3] = {1e-2f, 1e-2f, 1e-2f};
    run_spec s = {ticks_model, adam, b.t, 3, 3, lrs, trax_seeds, 12, 0, NULL, 0, NULL, 0, false};
    result std_r, rev_r;
    if (same_as_standard("a layer that counts every forward, 3 steps", &s, &std_r, &rev_r)) {
        const float *at[2];
        int n = find_states(&rev_r, "ticks", at, NULL, 2);
        CHECK_MSG(n == 2, "%d Ticks states, expected 2", n);
        for (int i = 0; i < n; i++) CHECK_MSG(at[i][0] == 3.0f, "Ticks %d counted %g forwards in 3 steps", i, at[i][0]);
    }
    result_free(&std_r);
    result_free(&rev_r);
}

// TopAndWhole: x (B, ...) -> [x's first B/2 rows (a view at x's own
// address), x]. Two outputs at one address, the first the smaller: the
// memory-efficient trainer copies each output it keeps (adopt), sharing one
// copy between outputs at one address only when that copy is big enough.
// Had x shared its top's copy, it would be read past that copy's end.
static ct_status top_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                          ct_error *err) {
    (void)l, (void)ic, (void)key, (void)err;
    out[0] = ct_tensor_sig(&in[0]);
    out[0].shape[0] /= 2;
    out[1] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status top_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                             ct_error *err) {
    (void)l, (void)c, (void)key, (void)err;
    out[0] = in[0];
    out[0].shape[0] /= 2;
    out[1] = in[0];
    return CT_OK;
}

// dx = d(whole) + d(top) added into the first half.
static ct_status top_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                              ct_error *err) {
    (void)l, (void)key;
    ct_tensor g_top = grad_out[0], g_whole = grad_out[1];
    CT_TRY(ct_ctx_grad_or_zeros(c, &g_top, err));
    CT_TRY(ct_ctx_grad_or_zeros(c, &g_whole, err));
    grad_in[0] = ct_tensor_sig(&g_whole);
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    int64_t n = ct_tensor_numel(&g_whole), n_top = ct_tensor_numel(&g_top);
    for (int64_t i = 0; i < n; i++) ct_f32(&grad_in[0])[i] = ct_f32(&g_whole)[i] + (i < n_top ? ct_f32(&g_top)[i] : 0);
    return CT_OK;
}

static const ct_layer_vtable top_vt = {
    .type = "TopAndWhole", .init = top_init, .forward = top_forward, .backward = top_backward};

// The trainer keeps the standard layers' outputs where a reversible layer
// follows them: [top, whole] go into a ReversibleSwap, then the top is
// dropped and the whole goes on into two half-residuals.
static void top_and_whole_model(ct_layer **model, ct_layer **loss) {
    *model = ct_serial(CT_LAYERS(ct_embedding(9, 4), ct_layer_new(&top_vt, "TopAndWhole", 1, 2, NULL, NULL, 0),
                                 ct_reversible_swap(), ct_swap(), ct_drop(), ct_dup(), half(ct_dense(4), NULL),
                                 ct_reversible_swap(), half(ct_dense(4), NULL), ct_reversible_swap()));
    *loss = ct_serial(CT_LAYERS(ct_concatenate(2, -1), ct_dense(19), ct_log_softmax(), ct_cross_entropy_loss()));
}

static void test_outputs_at_one_address(void) {
    trax_batch b;
    trax_batch_init(&b);
    float lrs[3] = {1e-2f, 1e-2f, 1e-2f};
    run_spec s = {top_and_whole_model, adam, b.t, 3, 3, lrs, trax_seeds, 12, 0, NULL, 0, NULL, 0, false};
    check_same_as_standard("two outputs at one address, the first smaller, 3 steps", &s);
}

// Frozen weights (Adam: no slots of their own, and weight decay would move
// them), loss weights that differ between the 2 local devices (each device's
// seed is its share of the global weight), and the last step's gradients
// kept (keep_grads): all as the standard Trainer.
static void test_frozen_weighted_devices(void) {
    trax_batch b;
    trax_batch_init(&b);
    for (int i = 4; i < 8; i++) b.weights[i] = 0.25f * (float)(i - 3);  // device 1's row: 0.25 .. 1
    const char *frozen[2] = {"Serial/Embedding", "Serial/Dense[8]"};
    float lrs[3] = {1e-2f, 0.02f, 0.03f};
    run_spec s = {extended_model, adam, b.t, 3, 3, lrs, trax_seeds, 12, 0, NULL, 2, frozen, 2, true};
    result std_r, rev_r;
    if (same_as_standard("frozen weights, unequal loss weights on 2 devices, kept gradients", &s, &std_r, &rev_r)) {
        int n_frozen = 0;
        for (int i = 0; i < std_r.n_params; i++) {
            if (strncmp(std_r.names[i], frozen[0], strlen(frozen[0])) &&
                strncmp(std_r.names[i], frozen[1], strlen(frozen[1])))
                continue;
            // Never moved: bitwise the same init in both.
            size_t end = i + 1 < std_r.n_params ? std_r.offsets[i + 1] : std_r.n_w;
            CHECK_MSG(memcmp(std_r.w + std_r.offsets[i], rev_r.w + std_r.offsets[i],
                             (end - std_r.offsets[i]) * sizeof(float)) == 0,
                      "frozen %s moved", std_r.names[i]);
            n_frozen++;
        }
        CHECK_MSG(n_frozen == 3, "%d frozen weights, expected 3 (embedding, kernel, bias)", n_frozen);
    }
    result_free(&std_r);
    result_free(&rev_r);
}

// A device whose rows all weigh 0 (a padded or fully masked shard): its
// loss says it averaged over weight 0, so it adds nothing to the global
// loss or weight and gets seed 0, as in the standard Trainer (taking its
// weight as 1, as for a loss that says nothing, would halve the loss and
// the other device's seed).
static void test_zero_weight_device(void) {
    trax_batch b;
    trax_batch_init(&b);
    for (int i = 0; i < 4; i++) b.weights[i] = 0.0f;  // device 0's row
    float lrs[3] = {1e-2f, 0.02f, 0.03f};
    run_spec s = {extended_model, adam, b.t, 3, 3, lrs, trax_seeds, 12, 0, NULL, 2, NULL, 0, false};
    check_same_as_standard("device 0's rows all of weight 0, 2 devices", &s);
}

static void test_no_reversible_layers(void) {
    // A plain model: one standard layer and the loss.
    float x[8], y[8], w[8];
    ct_random_uniform(ct_key_from_seed(3), x, 8, -1, 1);
    for (int i = 0; i < 8; i++) y[i] = 0.5f * x[i], w[i] = 1.0f;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 4, x), ct_tensor_2d(CT_DTYPE_F32, 2, 4, y),
                          ct_tensor_2d(CT_DTYPE_F32, 2, 4, w)};
    ct_layer *model = ct_mlp(2, (int[]){8, 4}, ct_relu, false, false), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer *rt;
    ct_trainer *st;
    ct_error err;
    ct_step_stats a, b;
    ct_trainer_options me = ct_reversible_default_options();
    CHECK_OK(ct_trainer_new(&rt, model, loss, batch, 3, adam(), ct_key_from_seed(1), &dev, &me, &err), &err);
    // No reversible layer: everything is the loss layer, as in Trax.
    CHECK(ct_trainer_n_layers(rt) == 1);
    for (int i = 1; i <= 3; i++) CHECK_OK(ct_trainer_one_step(rt, batch, ct_key_from_seed(2), i, 1e-2f, &a, &err), &err);
    float *w1 = malloc(ct_trainer_net(rt)->n_weights * sizeof(float));
    memcpy(w1, ct_trainer_net(rt)->weights, ct_trainer_net(rt)->n_weights * sizeof(float));
    ct_trainer_free(rt);
    CHECK_OK(ct_trainer_new(&st, model, loss, batch, 3, adam(), ct_key_from_seed(1), &dev, NULL, &err), &err);
    for (int i = 1; i <= 3; i++) CHECK_OK(ct_trainer_one_step(st, batch, ct_key_from_seed(2), i, 1e-2f, &b, &err), &err);
    double d = max_abs_diff(w1, ct_trainer_net(st)->weights, ct_trainer_net(st)->n_weights);
    printf("MLP without reversible layers: max |w diff| %.2e, loss %.6f vs %.6f\n", d, a.loss, b.loss);
    CHECK(d <= WEIGHT_TOL);
    free(w1);
    ct_trainer_free(st);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// Device peak of the reversible trainer for a small ReformerLM of the given
// depth over two steps (copy_weights, so staged weights count).
static size_t reversible_peak(int n_layers, const copy_batch *b, int n_steps, size_t limit, float *last_loss) {
    ct_layer *model = ct_reformer_lm(small_reformer(n_layers)), *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    dev.limit_bytes = limit;
    ct_trainer_options o = ct_reversible_default_options();
    o.reversible.copy_weights = true;
    ct_trainer *tr;
    ct_error err;
    ct_step_stats st = {0};
    ct_status status = ct_trainer_new(&tr, model, loss, b->t, 3, adam(), ct_key_from_seed(1), &dev, &o, &err);
    CHECK_OK(status, &err);
    for (int i = 1; i <= n_steps && status == CT_OK; i++)
        CHECK_OK(ct_trainer_one_step(tr, b->t, ct_key_from_seed(10 + (uint64_t)i), i, 1e-3f, &st, &err),
                 &err);
    if (last_loss) *last_loss = st.loss;
    if (status == CT_OK) ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    return dev.peak_bytes;
}

static void test_memory_limit(void) {
    // A 64-layer ReformerLM (d_model 8, 2 heads) on (2, 64) tokens.
    copy_batch b;
    copy_batch_init(&b, 11, 31, 2, 1);
    size_t p4 = reversible_peak(4, &b, 2, 0, NULL), p16 = reversible_peak(16, &b, 2, 0, NULL);
    size_t p64 = reversible_peak(64, &b, 2, 0, NULL);
    printf("reversible trainer device peak: depth 4 %zu, depth 16 %zu, depth 64 %zu bytes\n", p4, p16, p64);
    CHECK_MSG(p64 == p4 && p16 == p4, "device peak grows with depth: %zu -> %zu", p4, p64);

    // The standard trainer on the same model: slabs W plus activations A.
    ct_layer *model = ct_reformer_lm(small_reformer(64)), *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(1), &dev, NULL, &err), &err);
    // The arena is planned at construction (ct_trainer_memory_plan).
    size_t activations = ct_trainer_arena_bytes(tr);
    size_t slabs = dev.current_bytes - ct_trainer_memory_plan(tr)->activations;
    CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(11), 1, 1e-3f, NULL, &err), &err);
    ct_trainer_free(tr);
    // The limit: what the reversible trainer needs, well below the standard
    // trainer's activations alone.
    size_t limit = p64 + p64 / 8;
    printf("standard trainer: slabs %zu bytes + activations %zu bytes (peak %zu); limit %zu bytes\n", slabs,
           activations, dev.peak_bytes, limit);
    CHECK(activations > 2 * limit);
    // Under the limit (plus room for its own slabs) the standard trainer
    // runs out of memory for activations, at construction (its planning
    // pass)...
    dev = ct_device_cpu();
    dev.limit_bytes = slabs + limit;
    tr = NULL;
    ct_status st = ct_trainer_new(&tr, model, loss, b.t, 3, adam(), ct_key_from_seed(1), &dev, NULL, &err);
    CHECK(st == CT_ERR_MEMORY && tr == NULL);
    printf("standard trainer under %zu + %zu bytes: %s: %s\n", slabs, limit, ct_status_name(st), err.msg);
    ct_layer_free(model);
    ct_layer_free(loss);
    // ...while the reversible trainer trains under the limit alone.
    float first, last;
    reversible_peak(64, &b, 1, limit, &first);
    size_t peak = reversible_peak(64, &b, 4, limit, &last);
    printf("reversible trainer under %zu bytes: peak %zu bytes, loss %.4f after 1 step, %.4f after 4\n", limit, peak,
           first, last);
    CHECK(peak <= limit && isfinite(last));
    copy_batch_free(&b);
}

int main(void) {
    ct_log_set_level(CT_LOG_WARN);  // test_stats shows the memory log once
    test_trax_equivalence(adam, ct_adam_default_params().learning_rate, "Adam");
    test_trax_equivalence(adafactor, ct_adafactor_default_params().learning_rate, "Adafactor");
    test_blocks_api();
    test_blocks_refused();
    test_invalid_clip_mode();
    test_reversible_last_refused();
    test_reformer_equivalence();
    test_lsh_reformer_equivalence();
    test_counter_gradients();
    test_state();
    test_loss_state_nonfinite();
    test_stats();
    test_memory_log();
    test_options();
    test_clipping();
    test_shared_weights_refused();
    test_shared_weightless();
    test_outputs_at_one_address();
    test_state_put_back();
    test_frozen_weighted_devices();
    test_zero_weight_device();
    test_no_reversible_layers();
    test_memory_limit();
    return check_summary("test_reversible_trainer");
}
