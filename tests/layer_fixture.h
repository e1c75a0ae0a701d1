// One fixture for the layer tests: a layer bound to a net with a device,
// an arena and a ctx; the gradient check against CT_GRADCHECK_TOL; uniform fills.
#ifndef CTRAX_TESTS_LAYER_FIXTURE_H
#define CTRAX_TESTS_LAYER_FIXTURE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"

// A layer bound to a net, ready to run forward and backward.
typedef struct fixture {
    ct_device dev;
    ct_net net;
    ct_arena arena;
    ct_ctx ctx;
    ct_error err;
} fixture;

// Initializes l for the signatures of in[0..n_in) (the net takes its own
// reference; the caller still frees l); CT_OK or the init error in f->err.
// Recording is on after a successful init.
static inline ct_status fixture_init(fixture *f, ct_layer *l, const ct_tensor *in, int n_in, bool train) {
    memset(f, 0, sizeof *f);
    f->dev = ct_device_cpu();
    ct_tensor sigs[CT_LAYER_MAX_IO];
    for (int i = 0; i < n_in; i++) sigs[i] = ct_tensor_sig(&in[i]);
    ct_arena_init(&f->arena, &f->dev);
    ct_ctx_init(&f->ctx, &f->arena);
    ct_status st = ct_net_init(&f->net, l, sigs, n_in, ct_key_from_seed(3), &f->dev, &f->err);
    if (st == CT_OK) {
        ct_net_bind(&f->net, &f->ctx, train);
        f->ctx.record = true;
    }
    return st;
}

// fixture_init for a layer that must initialize: a failed init is a failed
// check (with its message) and leaves nothing to free. True on success.
static inline bool fixture_init_ok(fixture *f, ct_layer *l, const ct_tensor *in, int n_in, bool train) {
    ct_status st = fixture_init(f, l, in, n_in, train);
    CHECK_MSG(st == CT_OK, "%s", f->err.msg);
    if (st != CT_OK) {
        ct_ctx_free(&f->ctx);
        ct_arena_free(&f->arena);
    }
    return st == CT_OK;
}

static inline ct_status fixture_forward(fixture *f, const ct_tensor *in, ct_tensor *out, uint64_t key_seed) {
    return ct_layer_forward(f->net.root, &f->ctx, in, out, ct_key_from_seed(key_seed), &f->err);
}

// Forward without a tape; output 0 copied into dst (numel floats); the arena
// is reset and recording back on afterwards.
static inline void run_forward(fixture *f, const ct_tensor *in, ct_key key, float *dst) {
    ct_tensor out[1];
    f->ctx.record = false;
    CHECK_OK(ct_layer_forward(f->net.root, &f->ctx, in, out, key, &f->err), &f->err);
    memcpy(dst, out[0].data, ct_tensor_nbytes(&out[0]));
    ct_arena_reset(&f->arena);
    f->ctx.record = true;
}

static inline void fixture_free(fixture *f) {
    ct_ctx_free(&f->ctx);
    ct_arena_free(&f->arena);
    ct_net_free(&f->net);
    CHECK(f->dev.current_bytes == 0);
}

// The finite-difference step for attention whose keys are its queries
// (SelfAttention's share_qk, LSHSelfAttention): the scores are quadratic in
// Wq, and the truncation error of central differences (~eps^2) read up to
// 7.7e-4 at the default 1e-2, 1.9e-4 at 5e-3 (where float noise, ~1/eps, is
// still below 4e-4).
#define SHARED_QK_EPS 5e-3

// Gradient check of l on in[0..n_in) (train: dropout active with a fixed
// key) with step eps; the error must be below CT_GRADCHECK_TOL. Frees l.
static inline void check_layer_eps(const char *label, ct_layer *l, const ct_tensor *in, int n_in, bool train,
                                   double eps) {
    ct_gradcheck_opts o = ct_gradcheck_defaults();
    o.train = train;
    o.eps = eps;
    double e = gradcheck(label, l, in, n_in, o);
    printf("  max rel err %.3e\n", e);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "%s: rel err %g", label, e);
    ct_layer_free(l);
}

// check_layer_eps at the default step.
static inline void check_layer(const char *label, ct_layer *l, const ct_tensor *in, int n_in, bool train) {
    check_layer_eps(label, l, in, n_in, train, ct_gradcheck_defaults().eps);
}

// A layer that joins a new net takes that net's D: l initialized on (B, T,
// D) and run, then on D - 2, ... down to 4 (a second init must not check x
// against the first net's d_model). xd: B T D floats.
static inline void check_new_net_new_d(ct_layer *l, int64_t B, int64_t T, int64_t D, float *xd, bool train) {
    for (int64_t d = D; d >= 4; d -= 2) {
        ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, d, xd), out[1];
        gradcheck_fill(&x, 43, -1.0f, 1.0f);
        fixture r;
        if (fixture_init_ok(&r, l, &x, 1, train)) {
            CHECK_OK(fixture_forward(&r, &x, out, 1), &r.err);
            fixture_free(&r);
        }
    }
}

static inline ct_tensor uniform(ct_tensor t, uint64_t seed, float lo, float hi) {
    gradcheck_fill(&t, seed, lo, hi);
    return t;
}

// One forward and backward of l (takes the reference) on in (n_in inputs)
// with key seed 4 and output gradient gy: copies out[0] and the gradient of
// in[0]. An input past the first (a mask) must take no gradient: its
// signature, no data.
static inline void fixture_step(ct_layer *l, const ct_tensor *in, int n_in, const ct_tensor *gy, bool train,
                                float *out, float *dx) {
    fixture r;
    if (fixture_init_ok(&r, l, in, n_in, train)) {
        ct_tensor o[1], gin[CT_LAYER_MAX_IO];
        CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, in, o, ct_key_from_seed(4), &r.err), &r.err);
        CHECK_OK(ct_layer_backward(r.net.root, &r.ctx, gy, gin, ct_key_from_seed(4), &r.err), &r.err);
        memcpy(out, o[0].data, ct_tensor_nbytes(&o[0]));
        memcpy(dx, gin[0].data, ct_tensor_nbytes(&gin[0]));
        for (int i = 1; i < n_in; i++)
            CHECK(gin[i].data == NULL && gin[i].dtype == in[i].dtype && ct_tensor_same_sig(&gin[i], &in[i]));
        ct_arena_reset(&r.arena);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// An attention layer's per-head weights against Trax's _kernel_initializer:
// head h's weight `which` drawn from split(split(key of seed, h), which),
// U(+-sqrt(6 / (D + d H))). Returns how many of the n_w x H differ.
typedef struct head_weight {
    const char *name;  // "Wq": the net names it "<layer>/Wq[h]"
    int n, d;          // its floats, and its d (d_qk or d_v)
    uint32_t which;
} head_weight;

static inline int head_init_mismatches(const ct_net *net, const char *layer, const head_weight *w, int n_w, int H,
                                       int D, uint64_t seed) {
    int bad = 0;
    for (int i = 0; i < n_w; i++)
        for (int h = 0; h < H; h++) {
            char name[64];
            snprintf(name, sizeof name, "%s/%s[%d]", layer, w[i].name, h);
            const ct_param *p = ct_net_find_param(net, name);
            float *want = malloc(sizeof(float) * (size_t)w[i].n), lim = (float)sqrt(6.0 / (double)(D + w[i].d * H));
            ct_key k = ct_key_split(ct_key_split(ct_key_from_seed(seed), (uint32_t)h), w[i].which);
            ct_random_uniform(k, want, (size_t)w[i].n, -lim, lim);
            bad += !p || memcmp(want, net->weights + p->offset, sizeof(float) * (size_t)w[i].n) != 0;
            free(want);
        }
    return bad;
}

// Two layers that differ only by their dropouts, run in eval mode on x with
// one key: true if their outputs (n floats) are bitwise equal (Trax turns
// dropout off outside 'train'). Frees both layers.
static inline bool eval_equal_without_dropout(ct_layer *plain, ct_layer *dropped, const ct_tensor *x, size_t n) {
    float *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    bool same = false;
    fixture ra, rb;
    if (fixture_init_ok(&ra, plain, x, 1, false)) {
        if (fixture_init_ok(&rb, dropped, x, 1, false)) {
            run_forward(&ra, x, ct_key_from_seed(5), a);
            run_forward(&rb, x, ct_key_from_seed(5), b);
            same = memcmp(a, b, n * sizeof *a) == 0;
            printf("eval with dropouts 0.5/0.5: %s the layer without them\n",
                   same ? "bitwise equal to" : "DIFFERS from");
            fixture_free(&rb);
        }
        fixture_free(&ra);
    }
    free(a);
    free(b);
    ct_layer_free(plain);
    ct_layer_free(dropped);
    return same;
}

#endif
