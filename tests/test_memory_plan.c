// The trainers' memory plan (issue 12): a planning pass at construction
// sizes the step arenas (and the memory-efficient trainer's buffers), so
// step 1 peaks no higher than later steps, the plan's parts add up to what
// the device holds, and a device limit below the plan fails at construction.
// Issue 13: the stack walk gives back what nobody reads any more
// (ct_arena_keep) and donates dead inputs to elementwise layers
// (ct_arena_donate), so the plan holds forward's saved tensors and one
// layer's backward, not every layer's outputs and gradients.
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"  // ct_net, ct_ctx: a forward pass alone
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

static ct_layer *transformer(int d_model, int d_ff, int n_layers, int n_heads) {
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = VOCAB;
    p.d_model = d_model;
    p.d_ff = d_ff;
    p.n_layers = n_layers;
    p.n_heads = n_heads;
    p.max_len = 64;
    return ct_transformer_lm(p);
}

static ct_layer *make_model_layers(bool reformer, int n_layers) {
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
    return transformer(16, 32, n_layers, 2);
}

static ct_layer *make_model(bool reformer) { return make_model_layers(reformer, 2); }

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


// ct_arena_keep on its own: kept regions move down to the mark with their
// bytes, a view moves with its tensor, memory before the mark stays, and
// the rest is freed; a move that would copy more than it frees, or a
// chained block, leaves everything as it was.
static void test_arena_keep(void) {
    ct_device dev = ct_device_cpu();
    ct_arena a;
    ct_arena_init(&a, &dev);
    ct_error err;
    CHECK_OK(ct_arena_reserve(&a, 1 << 16, &err), &err);
    unsigned char *before = ct_arena_alloc(&a, 100, &err);  // below the mark
    ct_arena_mark m = ct_arena_get_mark(&a);
    unsigned char *dead = ct_arena_alloc(&a, 3000, &err), *x = ct_arena_alloc(&a, 200, &err);
    unsigned char *dead2 = ct_arena_alloc(&a, 1000, &err), *y = ct_arena_alloc(&a, 300, &err);
    CHECK(before && dead && x && dead2 && y);
    for (int i = 0; i < 200; i++) x[i] = (unsigned char)i;
    for (int i = 0; i < 300; i++) y[i] = (unsigned char)(255 - i);
    void *px = x, *py = y, *view = y + 100, *pb = before, *none = NULL;
    void **data[] = {&py, &px, &view, &pb, &px, &none};
    size_t bytes[] = {300, 200, 50, 100, 200, 0};
    size_t used = a.used;
    size_t freed = ct_arena_keep(&a, m, data, bytes, 6, 1);
    // x (256 bytes, aligned) and y (320) move down over the dead 3008 + 1024.
    CHECK_MSG(freed == 3008 + 1024 && a.used == used - freed, "freed %zu, used %zu -> %zu", freed, used, a.used);
    unsigned char *nx = px, *ny = py;
    CHECK(nx == before + 128 && ny == nx + 256 && (unsigned char *)view == ny + 100 && pb == before);
    bool same = true;
    for (int i = 0; i < 200; i++) same &= nx[i] == (unsigned char)i;
    for (int i = 0; i < 300; i++) same &= ny[i] == (unsigned char)(255 - i);
    CHECK_MSG(same, "the kept bytes moved with their pointers");
    // The next allocation comes right after what was kept.
    CHECK(ct_arena_alloc(&a, 64, &err) == ny + 320);

    // Keeping a big region over a small dead one copies more than it frees.
    ct_arena_reset(&a);
    m = ct_arena_get_mark(&a);
    unsigned char *small = ct_arena_alloc(&a, 64, &err), *big = ct_arena_alloc(&a, 4096, &err);
    void *pbig = big;
    void **one[] = {&pbig};
    size_t big_bytes[] = {4096};
    used = a.used;
    CHECK(small && big && ct_arena_keep(&a, m, one, big_bytes, 1, 1) == 0 && pbig == big && a.used == used);
    // Nothing kept: everything since the mark goes, without a copy.
    CHECK(ct_arena_keep(&a, m, NULL, NULL, 0, 1) == used && a.used == 0);

    // What a move costs is the bytes that move: a big region already at the
    // mark stays where it is, so keeping it and a small one past a dead one
    // copies 64 bytes to free 1024.
    unsigned char *stays = ct_arena_alloc(&a, 4096, &err), *gap = ct_arena_alloc(&a, 1024, &err);
    unsigned char *moves = ct_arena_alloc(&a, 64, &err);
    void *ps = stays, *pm = moves;
    void **two[] = {&ps, &pm};
    size_t two_bytes[] = {4096, 64};
    CHECK(gap && ct_arena_keep(&a, m, two, two_bytes, 2, 1) == 1024 && ps == stays && pm == stays + 4096);
    // min_gain: freeing 128 bytes by moving 128 is worth it at a gain of 1,
    // not at 2.
    ct_arena_reset(&a);
    m = ct_arena_get_mark(&a);
    unsigned char *dead3 = ct_arena_alloc(&a, 128, &err), *z = ct_arena_alloc(&a, 128, &err);
    void *pz = z;
    void **onez[] = {&pz};
    size_t z_bytes[] = {128};
    CHECK(dead3 && ct_arena_keep(&a, m, onez, z_bytes, 1, 2) == 0 && pz == z);
    CHECK(ct_arena_keep(&a, m, onez, z_bytes, 1, 1) == 128 && pz == dead3);
    // A view kept alone (100 bytes into a tensor, 50 long) moves by a
    // multiple of the alignment, its bytes with it.
    ct_arena_reset(&a);
    m = ct_arena_get_mark(&a);
    unsigned char *dead4 = ct_arena_alloc(&a, 1024, &err), *t = ct_arena_alloc(&a, 256, &err);
    for (int i = 0; i < 50; i++) t[100 + i] = (unsigned char)(i + 1);
    void *pv = t + 100;
    void **onev[] = {&pv};
    size_t v_bytes[] = {50};
    CHECK(dead4 && ct_arena_keep(&a, m, onev, v_bytes, 1, 1) > 0);
    unsigned char *nv = pv;
    same = ((size_t)(t + 100 - nv)) % 64 == 0 && nv < t + 100;
    for (int i = 0; i < 50; i++) same &= nv[i] == (unsigned char)(i + 1);
    CHECK_MSG(same, "a view kept alone moved from %p to %p", (void *)(t + 100), (void *)nv);
    // ct_arena_since: a region wholly in what was handed out since the mark.
    ct_arena_reset(&a);
    unsigned char *old = ct_arena_alloc(&a, 64, &err);
    m = ct_arena_get_mark(&a);
    unsigned char *fresh = ct_arena_alloc(&a, 128, &err);
    CHECK(ct_arena_since(&a, m, fresh, 128) && ct_arena_since(&a, m, fresh + 64, 64));
    CHECK(!ct_arena_since(&a, m, fresh, 129) && !ct_arena_since(&a, m, old, 64) && !ct_arena_since(&a, m, NULL, 0));
    ct_arena_free(&a);

    // An unplanned arena that chained a block since the mark: left alone.
    ct_arena_init(&a, &dev);
    CHECK(ct_arena_alloc(&a, 100, &err) != NULL);
    m = ct_arena_get_mark(&a);
    CHECK(ct_arena_alloc(&a, 4 << 20, &err) != NULL);
    used = a.used;
    CHECK(ct_arena_keep(&a, m, NULL, NULL, 0, 1) == 0 && a.used == used);
    ct_arena_free(&a);
    CHECK(dev.current_bytes == 0);
}

// The arena bytes a forward pass (tape on) of the trainer's net takes.
static size_t forward_bytes(ct_trainer *tr, const fixture *f) {
    const ct_net *net = ct_trainer_net(tr);
    ct_device dev = ct_device_cpu();
    ct_arena arena;
    ct_ctx c;
    ct_error err;
    ct_arena_init(&arena, &dev);
    ct_ctx_init(&c, &arena);
    ct_net_bind(net, &c, true);
    ct_tensor out;
    CHECK_OK(ct_layer_forward(net->root, &c, f->batch, &out, ct_key_from_seed(2), &err), &err);
    size_t high = arena.high_water;
    ct_ctx_free(&c);
    ct_arena_free(&arena);
    return high;
}

// What the plan holds beyond forward's tensors does not grow with depth:
// backward frees each layer's gradients once the layer below has them
// (before issue 13's fix it held every layer's: 88 KiB more per
// DecoderBlock here, 44 MiB in bench/lm_speed's config A).
static void test_backward_reuse(void) {
    fixture f;
    fixture_init(&f);
    size_t extra[2], fwd[2];
    const int depths[2] = {2, 6};
    for (int k = 0; k < 2; k++) {
        ct_device dev = ct_device_cpu();
        ct_trainer *tr;
        ct_error err;
        ct_layer *model = make_model_layers(false, depths[k]), *loss = ct_weighted_category_cross_entropy();
        CHECK_OK(ct_trainer_new(&tr, model, loss, f.batch, 3, ct_adam_new(ct_adam_default_params()),
                                ct_key_from_seed(1), &dev, NULL, &err),
                 &err);
        ct_layer_free(model);
        ct_layer_free(loss);
        size_t arena = ct_trainer_arena_bytes(tr);
        fwd[k] = forward_bytes(tr, &f);
        CHECK(arena > fwd[k]);
        extra[k] = arena - fwd[k];
        printf("TransformerLM, %d layers: arena %zu bytes, forward %zu, backward's extra %zu\n", depths[k], arena,
               fwd[k], extra[k]);
        ct_trainer_free(tr);
    }
    // Forward grows with depth; backward's share stays one layer's.
    CHECK(fwd[1] > fwd[0]);
    CHECK_MSG(extra[1] == extra[0], "backward's extra: %zu bytes at %d layers, %zu at %d", extra[0], depths[0],
              extra[1], depths[1]);
}

// ---- forward: what nobody reads is given back or written over ----------------

// Runs layer forward on x over a fresh arena; the bytes in use after it,
// and the most in use during it in *high (if not NULL).
static size_t forward_used(ct_layer *layer, const ct_tensor *x, bool record, float *out_first, size_t *high) {
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    CHECK_OK(ct_net_init(&net, layer, x, 1, ct_key_from_seed(3), &dev, &err), &err);
    ct_arena arena;
    ct_ctx c;
    ct_arena_init(&arena, &dev);
    ct_ctx_init(&c, &arena);
    ct_net_bind(&net, &c, true);
    c.record = record;
    ct_tensor out;
    CHECK_OK(ct_layer_forward(net.root, &c, x, &out, ct_key_from_seed(4), &err), &err);
    size_t used = arena.used;
    if (high) *high = arena.high_water;
    if (out_first) *out_first = ct_f32(&out)[0];
    ct_ctx_free(&c);
    ct_arena_free(&arena);
    ct_net_free(&net);
    ct_layer_free(layer);
    CHECK(dev.current_bytes == 0);
    return used;
}

// Serial(Dense(1024), Relu, Dense(4)) on 32 rows: the Relu writes over its
// Dense's output (donated: the walk's, and nothing else reads it), so
// forward holds the Relu's output (saved by the last Dense) and the result,
// not the 128 KiB pre-activation too; without a tape (eval) only the result
// stays. Written over, not copied down after: the peak holds one hidden
// tensor, not two.
static void test_forward_reuse(void) {
    float xs[32 * 8];
    ct_tensor x = ct_tensor_2d(CT_DTYPE_F32, 32, 8, xs);
    for (int i = 0; i < 32 * 8; i++) xs[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    const size_t hidden = 32 * 1024 * sizeof(float), result = 512;  // (32, 4) f32, aligned
    size_t high;
    size_t used = forward_used(ct_serial(CT_LAYERS(ct_dense(1024), ct_relu(), ct_dense(4))), &x, true, NULL, &high);
    CHECK_MSG(used == hidden + result, "forward keeps %zu bytes, expected %zu (the Relu's output and the result)",
              used, hidden + result);
    CHECK_MSG(high == hidden + result, "forward peaks at %zu bytes, expected %zu (the Relu over its input)", high,
              hidden + result);
    used = forward_used(ct_serial(CT_LAYERS(ct_dense(1024), ct_relu(), ct_dense(4))), &x, false, NULL, NULL);
    CHECK_MSG(used == result, "eval forward keeps %zu bytes, expected %zu (the result)", used, result);
    // A residual block: the Add writes over the branch's output (the Relu's
    // input is the Residual's, so the Relu takes new memory).
    used = forward_used(ct_serial(CT_LAYERS(ct_dense(1024), ct_residual(CT_LAYERS(ct_relu()), NULL))), &x, false,
                        NULL, &high);
    CHECK_MSG(used == hidden, "eval forward of Dense, Residual(Relu) keeps %zu bytes, expected %zu", used, hidden);
    CHECK_MSG(high == 2 * hidden, "eval forward of Dense, Residual(Relu) peaks at %zu bytes, expected %zu (the Add "
              "over the Relu's output)", high, 2 * hidden);
}

// The arena bytes one backward of layer takes past what its forward kept,
// on x (32, 8) with output gradient dy (32, 4).
static size_t backward_extra(ct_layer *layer, ct_tensor *x, ct_tensor *dy) {
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    CHECK_OK(ct_net_init(&net, layer, x, 1, ct_key_from_seed(3), &dev, &err), &err);
    ct_arena arena;
    ct_ctx c;
    ct_arena_init(&arena, &dev);
    ct_ctx_init(&c, &arena);
    ct_net_bind(&net, &c, true);
    c.record = true;
    ct_tensor out, dx;
    CHECK_OK(ct_layer_forward(net.root, &c, x, &out, ct_key_from_seed(4), &err), &err);
    size_t kept = arena.used;
    CHECK_OK(ct_layer_backward(net.root, &c, dy, &dx, ct_key_from_seed(4), &err), &err);
    size_t extra = arena.high_water - kept;
    ct_ctx_free(&c);
    ct_arena_free(&arena);
    ct_net_free(&net);
    ct_layer_free(layer);
    CHECK(dev.current_bytes == 0);
    return extra;
}

// Backward, in a Serial, an elementwise layer writes its input gradient over
// its output gradient when nothing else reads that: Serial(Dense(1024),
// Relu, Dense(4)) on 32 rows takes one hidden-sized gradient past what
// forward kept (the last Dense's input gradient, which the Relu's is
// written over, and the first Dense's small one), not two; so does a
// LayerNorm in the Relu's place. A residual
// block's two gradients are summed over the branch's (donated to the
// Branch's Select): Serial(Dense(1024), Residual(Dense(1024)), Dense(4))
// takes two hidden gradients (the Residual's output gradient and the
// branch's, the sum over it), not three.
static void test_backward_over_gradient(void) {
    float xs[32 * 8], gs[32 * 4];
    ct_tensor x = ct_tensor_2d(CT_DTYPE_F32, 32, 8, xs);
    for (int i = 0; i < 32 * 8; i++) xs[i] = (float)((i * 7) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < 32 * 4; i++) gs[i] = (float)((i * 3) % 5) / 5.0f - 0.4f;
    const size_t hidden = 32 * 1024 * sizeof(float), input_grad = 32 * 8 * sizeof(float);
    ct_tensor dy = ct_tensor_2d(CT_DTYPE_F32, 32, 4, gs);
    for (int norm = 0; norm < 2; norm++) {
        const char *name = norm ? "LayerNorm" : "Relu";
        size_t extra = backward_extra(ct_serial(CT_LAYERS(ct_dense(1024), norm ? ct_layer_norm(1e-6f) : ct_relu(),
                                                          ct_dense(4))),
                                      &x, &dy);
        printf("Serial(Dense(1024), %s, Dense(4)), 32 rows: backward takes %zu bytes past forward's\n", name, extra);
        CHECK_MSG(extra >= hidden && extra < hidden + 2 * input_grad,
                  "backward through %s takes %zu bytes past forward's, expected a hidden gradient (%zu) and a small "
                  "one", name, extra, hidden);
    }
    size_t extra = backward_extra(
        ct_serial(CT_LAYERS(ct_dense(1024), ct_residual(CT_LAYERS(ct_dense(1024)), NULL), ct_dense(4))), &x, &dy);
    printf("Serial(Dense(1024), Residual(Dense(1024)), Dense(4)), 32 rows: backward takes %zu bytes past "
           "forward's\n", extra);
    CHECK_MSG(extra >= 2 * hidden && extra < 2 * hidden + 2 * input_grad,
              "backward of a residual block takes %zu bytes past forward's, expected two hidden gradients (%zu) "
              "and a small one (the sum over the branch's gradient)", extra, 2 * hidden);
}

// A layer that runs its sublayer f twice on its input, [x] -> [f(x) + f(x)]:
// x is read again after f's first run, so a donation of x meant for this
// layer must not reach f (ct_layer_forward gives it to one layer).
static ct_status twice_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    return ct_layer_init(l->sub[0], 0, ic, in, out, key, err);
}

static ct_status twice_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    bool record = c->record;
    c->record = false;  // forward only: this test runs no backward
    ct_tensor a, b;
    ct_status st = ct_layer_forward(l->sub[0], c, in, &a, key, err);
    if (st == CT_OK) st = ct_layer_forward(l->sub[0], c, in, &b, key, err);
    c->record = record;
    CT_TRY(st);
    out[0] = ct_tensor_sig(&a);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    for (int64_t i = 0; i < ct_tensor_numel(&a); i++) ct_f32(&out[0])[i] = ct_f32(&a)[i] + ct_f32(&b)[i];
    return CT_OK;
}

static const ct_layer_vtable twice_vt = {.type = "Twice", .init = twice_init, .forward = twice_forward};

static void test_donation_scope(void) {
    float xs[4 * 8];
    ct_tensor x = ct_tensor_2d(CT_DTYPE_F32, 4, 8, xs);
    for (int i = 0; i < 4 * 8; i++) xs[i] = (float)((i * 5) % 9) / 3.0f - 1.2f;
    ct_layer *tanh_layer[1] = {ct_tanh()};
    ct_layer *twice = ct_layer_new(&twice_vt, "Twice", 1, 1, NULL, tanh_layer, 1);
    float got = 0, dense_out = 0;
    forward_used(ct_serial(CT_LAYERS(ct_dense(8), twice)), &x, true, &got, NULL);
    // The same Dense (same key: sublayer 0 of a Serial) alone.
    forward_used(ct_serial(CT_LAYERS(ct_dense(8))), &x, true, &dense_out, NULL);
    float want = 2.0f * tanhf(dense_out);
    CHECK_MSG(fabsf(got - want) <= 1e-6f * fabsf(want) + 1e-7f,
              "f(x) + f(x) with f = Tanh: %.9g, expected %.9g (x overwritten by the first f?)", got, want);
}

// The copy task in batches of 8 sequences of 2 x 31 + 2 = 64 tokens.
static ct_stream *copy_batches(void) {
    ct_error err;
    ct_copy_task task = {VOCAB, 31, false, 3, 0};
    ct_stream *s = NULL;
    CHECK_OK(ct_copy_stream_new(&s, &task, &err), &err);
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 8;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    return s;
}

// The evaluator's arena: the first batch is measured and
// the arena reserved at that, so the stack walks give back each layer's
// activations and the eval peak does not grow with depth; later batches
// allocate nothing. Unplanned, a 16-layer TransformerLM's eval held every
// layer's activations at once (the arena's first run chains blocks, where
// ct_arena_keep does nothing). The values are those of the first batch run
// again. The first run is planned at 1 thread of 2, as when the thread fit
// (ct_blas_threads_fit, under load) lowers the count (ct_blas_use_threads)
// in a program that never called ct_blas_set_threads (ctrax train without
// --threads), and the second runs at 2: kernels size their per-thread
// scratch by the slots, not by the count of the moment. By the count, the
// attention's work areas outgrew the plan at 2 threads and the arena took
// another block (configs/fortunes_long.gin: 245,308 against 168,300 KB peak
// RSS).
// values: the two metrics, then ct_trainer_eval_loss's device peak.
static size_t eval_peak(int n_layers, double *values) {
    ct_error err;
    // Big enough that every layer's activations (8 x 64 tokens x d_ff 256
    // floats: 512 KiB) outgrow the arena's first block.
    ct_layer *model = transformer(64, 256, n_layers, 4);
    ct_stream *s = copy_batches();
    ct_eval_task et = {.stream = s, .metrics = {ct_sequence_accuracy(), ct_weighted_category_cross_entropy()},
                       .n_metrics = 2, .n_batches = 1};
    ct_device dev = ct_device_cpu();
    ct_evaluator *e;
    ct_net net;
    CHECK_OK(ct_evaluator_new(&e, model, &et, NULL, &dev, &err), &err);
    CHECK_OK(ct_evaluator_model_net(e, &net, ct_key_from_seed(4), &err), &err);
    ct_stream_cursor start = ct_stream_get_cursor(s);
    size_t weights = dev.current_bytes;  // the net's (the eval's own bytes are above them)
    ct_device_reset_peak(&dev);
    ct_blas_use_threads(1);
    CHECK_OK(ct_evaluator_run(e, &net, ct_key_from_seed(5), values, &err), &err);
    size_t peak = dev.peak_bytes - weights;
    uint64_t allocs = dev.n_allocs;
    double again[2];
    ct_blas_use_threads(2);
    CHECK_OK(ct_stream_set_cursor(s, start, &err), &err);
    CHECK_OK(ct_evaluator_run(e, &net, ct_key_from_seed(5), again, &err), &err);
    CHECK_MSG(dev.n_allocs == allocs, "%d layers: the second eval (2 threads, planned at 1) made %llu device allocations",
              n_layers, (unsigned long long)(dev.n_allocs - allocs));
    CHECK_MSG(again[0] == values[0] && again[1] == values[1], "%d layers: eval %.9g %.9g, again %.9g %.9g", n_layers,
              values[0], values[1], again[0], again[1]);
    ct_evaluator_free(e);
    ct_net_free(&net);
    // ct_trainer_eval_loss on the same batch: its arena is planned the same way.
    CHECK_OK(ct_stream_set_cursor(s, start, &err), &err);
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    ct_device tdev = ct_device_cpu();
    ct_trainer *tr;
    ct_trainer_options o = ct_trainer_default_options();
    ct_layer *loss = ct_weighted_category_cross_entropy();
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, b.n, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(4),
                            &tdev, &o, &err),
             &err);
    ct_layer_free(loss);
    size_t held = tdev.current_bytes;
    ct_device_reset_peak(&tdev);
    float l1, l2;
    CHECK_OK(ct_trainer_eval_loss(tr, b.t, ct_key_from_seed(5), &l1, &err), &err);
    values[2] = (double)(tdev.peak_bytes - held);
    allocs = tdev.n_allocs;
    CHECK_OK(ct_trainer_eval_loss(tr, b.t, ct_key_from_seed(5), &l2, &err), &err);
    CHECK_MSG(tdev.n_allocs == allocs && l1 == l2, "%d layers: eval loss %.9g then %.9g, %llu allocations", n_layers,
              l1, l2, (unsigned long long)(tdev.n_allocs - allocs));
    ct_trainer_free(tr);
    for (int m = 0; m < et.n_metrics; m++) ct_layer_free(et.metrics[m]);
    ct_stream_free(s);
    ct_layer_free(model);
    CHECK(dev.current_bytes == 0);
    return peak;
}

static void test_eval_peak(void) {
    int saved = ct_blas_threads();
    omp_set_num_threads(2);  // OMP_NUM_THREADS=2: the slots eval_peak's first ct_blas_use_threads keeps
    double v2[3], v16[3];
    size_t p2 = eval_peak(2, v2), p16 = eval_peak(16, v16);
    printf("eval device peak: 2 layers %zu bytes, 16 layers %zu bytes (loss %.6f, %.6f)\n", p2, p16, v2[1], v16[1]);
    CHECK_MSG(p16 <= p2 + p2 / 4, "eval peak grows with depth: %zu bytes at 2 layers, %zu at 16", p2, p16);
    printf("eval_loss device peak: 2 layers %.0f bytes, 16 layers %.0f bytes\n", v2[2], v16[2]);
    CHECK_MSG(v16[2] <= v2[2] * 1.25, "eval_loss peak grows with depth: %.0f bytes at 2 layers, %.0f at 16", v2[2],
              v16[2]);
    CHECK(isfinite(v2[1]) && isfinite(v16[1]));
    ct_blas_use_threads(saved);
}

int main(void) {
    ct_log_set_level(CT_LOG_WARN);
    test_arena_keep();
    test_backward_reuse();
    test_forward_reuse();
    test_donation_scope();
    test_backward_over_gradient();
    test_eval_peak();
    for (int n = 1; n <= 2; n++) {
        test_peaks(false, n);
        test_peaks(true, n);
    }
    test_limit(false);
    test_limit(true);
    return check_summary("test_memory_plan");
}
