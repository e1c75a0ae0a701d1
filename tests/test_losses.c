// Losses and metrics: values against hand-computed numbers, gradients
// (hand-computed and by finite differences), NULL-data gradients for targets,
// weights and metrics, and the errors for bad target ids, zero weight sums,
// shapes that do not fit and a label smoothing outside [0, 1].
// WeightedCategoryCrossEntropy's label smoothing (0, 0.1, 1): value and
// gradient against Trax's formula in double, and by finite differences.
//
// Gradient checks: each loss inside Serial(Feed, Loss), which keeps targets
// and weights (data, no gradient) out of the checked inputs (feed_fixture.h).
#include <stdlib.h>

#include "check.h"
#include "feed_fixture.h"
#include "gradcheck.h"

static const double LN2 = 0.69314718055994531, LN3 = 1.0986122886681098;

// ---- running a layer ---------------------------------------------------------

typedef struct runner {
    ct_device dev;
    ct_net net;
    ct_arena arena;
    ct_ctx ctx;
} runner;

static ct_status runner_init(runner *r, ct_layer *l, const ct_tensor *in, int n_in, ct_error *err) {
    r->dev = ct_device_cpu();
    ct_tensor sigs[CT_LAYER_MAX_IO];
    for (int i = 0; i < n_in; i++) sigs[i] = ct_tensor_sig(&in[i]);
    CT_TRY(ct_net_init(&r->net, l, sigs, n_in, ct_key_from_seed(3), &r->dev, err));
    ct_arena_init(&r->arena, &r->dev);
    ct_ctx_init(&r->ctx, &r->arena);
    ct_net_bind(&r->net, &r->ctx, true);
    return CT_OK;
}

static void runner_free(runner *r) {
    ct_ctx_free(&r->ctx);
    ct_arena_free(&r->arena);
    ct_net_free(&r->net);
}

// Runs l (takes no reference) forward on in; on success writes the scalar to
// *value and, if grads is not NULL, runs backward with dL/dout = 1 and
// copies grad_in[0] (numel floats) into grads; null[i] tells whether
// grad_in[i] came back with NULL data. Returns the status; err has the
// message.
static ct_status eval_layer(ct_layer *l, const ct_tensor *in, int n_in, double *value, float *grads, bool *null,
                            ct_error *err) {
    runner r;
    ct_status st = runner_init(&r, l, in, n_in, err);
    if (st != CT_OK) return st;
    ct_tensor out[1], gin[3];
    st = ct_layer_forward(r.net.root, &r.ctx, in, out, ct_key_from_seed(1), err);
    if (st == CT_OK) {
        CHECK(out[0].ndim == 0 && out[0].dtype == CT_DTYPE_F32);
        *value = ct_f32(&out[0])[0];
        float one = 1.0f;
        ct_tensor g = ct_tensor_make(CT_DTYPE_F32, 0, NULL, &one);
        st = ct_layer_backward(r.net.root, &r.ctx, &g, gin, ct_key_from_seed(1), err);
        CHECK(r.ctx.tape_len == 0);
        if (st == CT_OK) {
            for (int i = 0; i < n_in; i++) {
                CHECK(ct_tensor_same_sig(&gin[i], &in[i]));
                if (null) null[i] = gin[i].data == NULL;
            }
            if (grads && gin[0].data) memcpy(grads, gin[0].data, ct_tensor_nbytes(&in[0]));
        }
    }
    runner_free(&r);
    return st;
}

// ---- values --------------------------------------------------------------------

static void test_weighted_category_cross_entropy(void) {
    // logits [[0, 0], [ln3, 0]], targets [0, 1]: ce = [ln2, ln4].
    float logits[4] = {0, 0, (float)LN3, 0}, w11[2] = {1, 1}, w13[2] = {1, 3}, g[4];
    int32_t t[2] = {0, 1};
    ct_tensor in[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 2, logits), ct_tensor_1d(CT_DTYPE_I32, 2, t),
                       ct_tensor_1d(CT_DTYPE_F32, 2, w11)};
    double v;
    bool null[3];
    ct_error err;
    ct_layer *l = ct_weighted_category_cross_entropy();
    CHECK_OK(eval_layer(l, in, 3, &v, g, null, &err), &err);
    CHECK_NEAR(v, 1.5 * LN2, 1e-6);
    // dlogits = w/sum(w) * (softmax - onehot): rows [.5,.5]-[1,0] and [.75,.25]-[0,1], halved.
    CHECK_NEAR(g[0], -0.25, 1e-6);
    CHECK_NEAR(g[1], 0.25, 1e-6);
    CHECK_NEAR(g[2], 0.375, 1e-6);
    CHECK_NEAR(g[3], -0.375, 1e-6);
    CHECK(!null[0] && null[1] && null[2]);  // no gradient for targets or weights
    ct_layer_free(l);

    in[2].data = w13;  // (ln2 + 3 ln4) / 4 = 7/4 ln2
    l = ct_weighted_category_cross_entropy();
    CHECK_OK(eval_layer(l, in, 3, &v, g, NULL, &err), &err);
    CHECK_NEAR(v, 1.75 * LN2, 1e-6);
    CHECK_NEAR(g[0], -0.125, 1e-6);
    CHECK_NEAR(g[3], -0.5625, 1e-6);
    ct_layer_free(l);

    // A weight-0 position adds nothing, even with a huge logit gap.
    float big[4] = {0, 0, 1e30f, -1e30f}, w10[2] = {1, 0};
    in[0].data = big, in[2].data = w10;
    l = ct_weighted_category_cross_entropy();
    CHECK_OK(eval_layer(l, in, 3, &v, g, NULL, &err), &err);
    CHECK_NEAR(v, LN2, 1e-6);
    CHECK(g[2] == 0.0f && g[3] == 0.0f);
    ct_layer_free(l);
}

static ct_layer *smoothed_ce(float label_smoothing) {
    ct_weighted_category_cross_entropy_params p = ct_weighted_category_cross_entropy_default_params();
    p.label_smoothing = label_smoothing;
    return ct_weighted_category_cross_entropy_new(p);
}

// Trax's _category_cross_entropy in double, with plain loops: targets
// p = one_hot(t, V) * (1 - s) + s / V, ce = -sum_c p_c log_softmax(x)_c, the
// loss sum(ce w) / sum(w), and its gradient w / sum(w) (softmax(x) - p).
static double smoothed_ce_double(const float *x, const int32_t *t, const float *w, int N, int V, double s,
                                 double *grad) {
    double wsum = 0, loss = 0;
    for (int n = 0; n < N; n++) wsum += w[n];
    for (int n = 0; n < N; n++) {
        const float *row = x + n * V;
        double m = row[0], z = 0, ce = 0;
        for (int c = 1; c < V; c++) m = fmax(m, row[c]);
        for (int c = 0; c < V; c++) z += exp(row[c] - m);
        for (int c = 0; c < V; c++) {
            double p = (c == t[n] ? 1.0 : 0.0) * (1 - s) + s / V, logp = row[c] - m - log(z);
            ce -= p * logp;
            grad[n * V + c] = w[n] / wsum * (exp(logp) - p);
        }
        loss += ce * w[n];
    }
    return loss / wsum;
}

// Label smoothing 0, 0.1 and 1 (every target 1 / V) on (2, 3, 5) logits
// with uneven weights, one of them 0: the value within 1e-6 relative and
// each gradient within 1e-7 of the double computation; smoothing 0 is the
// plain layer's bits.
static void test_label_smoothing(void) {
    enum { NB = 2, NT = 3, V = 5, N = NB * NT };
    float x[N * V], w[N] = {1.0f, 0.5f, 0.0f, 2.0f, 0.25f, 1.0f}, g[N * V], g0[N * V];
    int32_t t[N] = {0, 4, 2, 1, 3, 3};
    ct_tensor in[3] = {ct_tensor_3d(CT_DTYPE_F32, NB, NT, V, x), ct_tensor_2d(CT_DTYPE_I32, NB, NT, t),
                       ct_tensor_2d(CT_DTYPE_F32, NB, NT, w)};
    gradcheck_fill(&in[0], 5, -3.0f, 3.0f);
    static const float smoothing[] = {0.0f, 0.1f, 1.0f};
    double v, v0 = 0;
    bool null[3];
    ct_error err;
    for (int k = 0; k < 3; k++) {
        double want_g[N * V];
        double want = smoothed_ce_double(x, t, w, N, V, smoothing[k], want_g);
        ct_layer *l = smoothed_ce(smoothing[k]);
        CHECK_OK(eval_layer(l, in, 3, &v, g, null, &err), &err);
        double worst = 0;
        for (int i = 0; i < N * V; i++) worst = check_worse(worst, fabs(g[i] - want_g[i]));
        printf("WeightedCategoryCrossEntropy label_smoothing %g: %.9f, double %.9f; max |grad - double| %.2e\n",
               (double)smoothing[k], v, want, worst);
        CHECK_MSG(fabs(v - want) <= 1e-6 * fabs(want), "label_smoothing %g: %.9g, want %.9g", (double)smoothing[k],
                  v, want);
        CHECK_MSG(worst <= 1e-7, "label_smoothing %g: gradient off by %g", (double)smoothing[k], worst);
        CHECK(!null[0] && null[1] && null[2]);
        for (int c = 0; c < V; c++) CHECK(g[2 * V + c] == 0.0f);  // weight 0: no gradient
        ct_layer_free(l);
        if (k == 0) v0 = v, memcpy(g0, g, sizeof g);
    }
    ct_layer *l = ct_weighted_category_cross_entropy();
    CHECK_OK(eval_layer(l, in, 3, &v, g, NULL, &err), &err);
    CHECK(v == v0 && memcmp(g, g0, sizeof g) == 0);
    ct_layer_free(l);
}

static void test_cross_entropy_loss(void) {
    float lp[4] = {(float)-LN2, (float)-LN2, (float)log(0.75), (float)log(0.25)}, w[2] = {1, 1}, g[4];
    int32_t t[2] = {0, 1};
    ct_tensor in[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 2, lp), ct_tensor_1d(CT_DTYPE_I32, 2, t),
                       ct_tensor_1d(CT_DTYPE_F32, 2, w)};
    double v;
    bool null[3];
    ct_error err;
    ct_layer *l = ct_cross_entropy_loss();
    CHECK_OK(eval_layer(l, in, 3, &v, g, null, &err), &err);
    CHECK_NEAR(v, 1.5 * LN2, 1e-6);
    CHECK(g[0] == -0.5f && g[1] == 0.0f && g[2] == 0.0f && g[3] == -0.5f);
    CHECK(!null[0] && null[1] && null[2]);
    ct_layer_free(l);
}

static void test_accuracies(void) {
    // argmax rows: [1, 0 (tie: first), 2, 0]
    float o[12] = {1, 2, 0, 3, 3, 1, 0, 0, 5, 2, 1, 0};
    int32_t t[4] = {1, 0, 2, 1}, t_tie[4] = {1, 1, 2, 1};
    float w[4] = {1, 1, 0, 2};
    ct_tensor in[3] = {ct_tensor_2d(CT_DTYPE_F32, 4, 3, o), ct_tensor_1d(CT_DTYPE_I32, 4, t),
                       ct_tensor_1d(CT_DTYPE_F32, 4, w)};
    double v;
    bool null[3];
    ct_error err;
    ct_layer *l = ct_category_accuracy();
    CHECK_OK(eval_layer(l, in, 2, &v, NULL, null, &err), &err);
    CHECK_NEAR(v, 0.75, 1e-7);
    CHECK(null[0] && null[1]);  // metrics: no gradients
    ct_layer_free(l);

    in[1].data = t_tie;  // the tie [3, 3, 1] is argmax 0, not 1
    l = ct_category_accuracy();
    CHECK_OK(eval_layer(l, in, 2, &v, NULL, NULL, &err), &err);
    CHECK_NEAR(v, 0.5, 1e-7);
    ct_layer_free(l);

    in[1].data = t;  // matches [1, 1, 1, 0] weighted [1, 1, 0, 2] -> 2/4
    l = ct_weighted_category_accuracy();
    CHECK_OK(eval_layer(l, in, 3, &v, NULL, null, &err), &err);
    CHECK_NEAR(v, 0.5, 1e-7);
    CHECK(null[0] && null[1] && null[2]);
    ct_layer_free(l);

    // numpy's argmax takes a NaN as the largest, the first NaN of several:
    // rows [1, NaN, 2, NaN] and [NaN, 0, NaN, 1] are argmax 1 and 0 (a scan
    // that went on past the first NaN ended on the last, 3 and 2).
    float nan_row[2 * 4] = {1, NAN, 2, NAN, NAN, 0, NAN, 1};
    int32_t t1[2] = {1, 0};
    ct_tensor nin[2] = {ct_tensor_2d(CT_DTYPE_F32, 2, 4, nan_row), ct_tensor_1d(CT_DTYPE_I32, 2, t1)};
    l = ct_category_accuracy();
    CHECK_OK(eval_layer(l, nin, 2, &v, NULL, NULL, &err), &err);
    CHECK_NEAR(v, 1.0, 0);
    ct_layer_free(l);
}

static void test_sequence_accuracy(void) {
    // Two sequences of 3 positions over 2 classes. Predictions (argmax):
    // seq 0 = [0, 1, 1], seq 1 = [1, 1, 0].
    float o[12] = {2, 1, 0, 1, 0, 3, /**/ 0, 1, 1, 2, 5, 4};
    int32_t t[6] = {0, 1, 1, /**/ 1, 0, 0};  // seq 1 wrong at position 1
    float w[6] = {1, 1, 1, 1, 1, 1};
    ct_tensor in[3] = {ct_tensor_3d(CT_DTYPE_F32, 2, 3, 2, o), ct_tensor_2d(CT_DTYPE_I32, 2, 3, t),
                       ct_tensor_2d(CT_DTYPE_F32, 2, 3, w)};
    double v;
    bool null[3];
    ct_error err;
    ct_layer *l = ct_sequence_accuracy();
    CHECK_OK(eval_layer(l, in, 3, &v, NULL, null, &err), &err);
    CHECK_NEAR(v, 0.5, 1e-7);
    CHECK(null[0] && null[1] && null[2]);
    ct_layer_free(l);

    // The wrong position has weight 0 (padding): both sequences are right.
    w[4] = 0;
    l = ct_sequence_accuracy();
    CHECK_OK(eval_layer(l, in, 3, &v, NULL, NULL, &err), &err);
    CHECK_NEAR(v, 1.0, 1e-7);
    ct_layer_free(l);

    // Both wrong.
    w[4] = 1;
    t[0] = 1;
    l = ct_sequence_accuracy();
    CHECK_OK(eval_layer(l, in, 3, &v, NULL, NULL, &err), &err);
    CHECK_NEAR(v, 0.0, 1e-7);
    ct_layer_free(l);
}

static void test_l2_loss(void) {
    float o[3] = {1, 2, 3}, t[3] = {0, 2, 5}, w[3] = {1, 1, 2}, g[3];
    ct_tensor in[3] = {ct_tensor_1d(CT_DTYPE_F32, 3, o), ct_tensor_1d(CT_DTYPE_F32, 3, t),
                       ct_tensor_1d(CT_DTYPE_F32, 3, w)};
    double v;
    bool null[3];
    ct_error err;
    ct_layer *l = ct_l2_loss();
    CHECK_OK(eval_layer(l, in, 3, &v, g, null, &err), &err);
    CHECK_NEAR(v, 9.0 / 4.0, 1e-7);  // (1 + 0 + 2*4) / 4
    CHECK_NEAR(g[0], 0.5, 1e-7);     // 2 w (o - t) / sum(w)
    CHECK_NEAR(g[1], 0.0, 1e-7);
    CHECK_NEAR(g[2], -2.0, 1e-7);
    CHECK(!null[0] && null[1] && null[2]);
    ct_layer_free(l);

    // A weight-0 position adds nothing to the value or the gradient, even
    // with a NaN or inf target there (the forward skipped it, the backward
    // gave NaN).
    float tbad[3] = {0, NAN, INFINITY}, w0[3] = {1, 0, 0};
    in[1].data = tbad, in[2].data = w0;
    l = ct_l2_loss();
    CHECK_OK(eval_layer(l, in, 3, &v, g, null, &err), &err);
    CHECK_NEAR(v, 1.0, 1e-7);
    CHECK_NEAR(g[0], 2.0, 1e-7);
    CHECK(g[1] == 0.0f && g[2] == 0.0f);
    ct_layer_free(l);
}

// Trax's BinaryCrossEntropy: the mean of -(t log q + (1 - t) log(1 - q)),
// q = sigmoid(x), against that plain form in double; large logits stay
// finite (the plain form in float gives log(0) from |x| of about 17).
static void test_binary_cross_entropy(void) {
    float x[6] = {-3.0f, -0.5f, 0.0f, 0.25f, 2.0f, 4.0f}, g[6];
    int32_t t[6] = {0, 1, 1, 0, 1, 0};
    ct_tensor in[2] = {ct_tensor_2d(CT_DTYPE_F32, 2, 3, x), ct_tensor_2d(CT_DTYPE_I32, 2, 3, t)};
    double want = 0, want_g[6];
    for (int i = 0; i < 6; i++) {
        double q = 1.0 / (1.0 + exp(-(double)x[i]));
        want -= (t[i] * log(q) + (1 - t[i]) * log(1 - q)) / 6;
        want_g[i] = (q - t[i]) / 6;
    }
    double v;
    bool null[2];
    ct_error err;
    ct_layer *l = ct_binary_cross_entropy();
    CHECK_OK(eval_layer(l, in, 2, &v, g, null, &err), &err);
    CHECK_MSG(fabs(v - want) < 1e-6, "BinaryCrossEntropy %.9g, want %.9g", v, want);
    for (int i = 0; i < 6; i++) CHECK_MSG(fabs(g[i] - want_g[i]) < 1e-7, "grad[%d] %g, want %g", i, g[i], want_g[i]);
    CHECK(!null[0] && null[1]);
    ct_layer_free(l);
    // x = 100 with t = 0 costs 100; x = -100 with t = 0 costs e^-100.
    float big[2] = {100.0f, -100.0f};
    int32_t zero[2] = {0, 0};
    ct_tensor bin[2] = {ct_tensor_1d(CT_DTYPE_F32, 2, big), ct_tensor_1d(CT_DTYPE_I32, 2, zero)};
    l = ct_binary_cross_entropy();
    CHECK_OK(eval_layer(l, bin, 2, &v, g, NULL, &err), &err);
    CHECK_MSG(fabs(v - 50.0) < 1e-5 && fabs(g[0] - 0.5f) < 1e-7 && fabs(g[1]) < 1e-7, "%g (%g %g)", v, g[0], g[1]);
    ct_layer_free(l);
    // Confident and right: x = -50 with t = 0 and x = 50 with t = 1 each cost
    // log(1 + e^-50) = e^-50 (1.9e-22), which log1p keeps; written as
    // log(1 + exp(-|x|)) in double it is log(1) = 0 once |x| passes about 37.
    float sure[2] = {-50.0f, 50.0f};
    int32_t right[2] = {0, 1};
    ct_tensor sure_in[2] = {ct_tensor_1d(CT_DTYPE_F32, 2, sure), ct_tensor_1d(CT_DTYPE_I32, 2, right)};
    l = ct_binary_cross_entropy();
    CHECK_OK(eval_layer(l, sure_in, 2, &v, NULL, NULL, &err), &err);
    CHECK_MSG(fabs(v - exp(-50.0)) <= 1e-6 * exp(-50.0), "BinaryCrossEntropy of sure, right logits %.9g, want %.9g",
              v, exp(-50.0));
    ct_layer_free(l);
}

// ---- gradients by finite differences --------------------------------------------

static void test_gradchecks(void) {
    enum { NB = 3, NT = 4, V = 5 };
    float x[NB * NT * V], w[NB * NT], yt[NB * NT * V], w2[NB * NT * V];
    int32_t t[NB * NT];
    ct_tensor xs = ct_tensor_3d(CT_DTYPE_F32, NB, NT, V, x);
    ct_tensor ws = ct_tensor_2d(CT_DTYPE_F32, NB, NT, w);
    gradcheck_fill(&xs, 1, -2.0f, 2.0f);
    gradcheck_fill(&ws, 2, 0.0f, 1.0f);
    w[3] = 0.0f;  // a padding position
    for (int i = 0; i < NB * NT; i++) t[i] = (int32_t)((i * 7 + 3) % V);
    ct_tensor ts = ct_tensor_2d(CT_DTYPE_I32, NB, NT, t);
    ct_tensor in[2] = {xs, ts};
    ct_gradcheck_opts o = ct_gradcheck_defaults();

    feed f = {2, 1, {ws}};
    ct_layer *l = with_feed(&f, ct_weighted_category_cross_entropy());
    double e = gradcheck("WeightedCategoryCrossEntropy", l, in, 2, o);
    printf("  max rel err %.3e\n", e);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "rel err %g", e);
    ct_layer_free(l);

    static const float smoothing[] = {0.1f, 1.0f};
    for (int k = 0; k < 2; k++) {
        char label[96];
        snprintf(label, sizeof label, "WeightedCategoryCrossEntropy, label_smoothing %g", (double)smoothing[k]);
        l = with_feed(&f, smoothed_ce(smoothing[k]));
        e = gradcheck(label, l, in, 2, o);
        printf("  max rel err %.3e\n", e);
        CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "%s: rel err %g", label, e);
        ct_layer_free(l);
    }

    l = with_feed(&f, ct_cross_entropy_loss());
    e = gradcheck("CrossEntropyLoss", l, in, 2, o);
    printf("  max rel err %.3e\n", e);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "rel err %g", e);
    ct_layer_free(l);

    ct_tensor ys = ct_tensor_3d(CT_DTYPE_F32, NB, NT, V, yt), w2s = ct_tensor_3d(CT_DTYPE_F32, NB, NT, V, w2);
    gradcheck_fill(&ys, 3, -1.0f, 1.0f);
    gradcheck_fill(&w2s, 4, 0.0f, 2.0f);
    feed f2 = {1, 2, {ys, w2s}};
    l = with_feed(&f2, ct_l2_loss());
    e = gradcheck("L2Loss", l, &xs, 1, o);
    printf("  max rel err %.3e\n", e);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "rel err %g", e);
    ct_layer_free(l);

    // BinaryCrossEntropy over (NB, NT, V) logits, targets 0/1.
    int32_t bt[NB * NT * V];
    for (int i = 0; i < NB * NT * V; i++) bt[i] = (i * 5 + 1) % 3 == 0;
    feed fb = {1, 1, {ct_tensor_3d(CT_DTYPE_I32, NB, NT, V, bt)}};
    l = with_feed(&fb, ct_binary_cross_entropy());
    e = gradcheck("BinaryCrossEntropy", l, &xs, 1, o);
    printf("  max rel err %.3e\n", e);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "rel err %g", e);
    ct_layer_free(l);

    // A model in front of the loss: Dense -> WeightedCategoryCrossEntropy.
    l = with_feed(&f, ct_weighted_category_cross_entropy());
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(V), l));
    e = gradcheck("Dense -> WeightedCategoryCrossEntropy", model, in, 2, o);
    printf("  max rel err %.3e\n", e);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "rel err %g", e);
    ct_layer_free(model);
}

// ---- errors ---------------------------------------------------------------------

static void expect_error(ct_layer *l, const ct_tensor *in, int n_in, ct_status code, const char *a, const char *b) {
    double v;
    ct_error err;
    ct_error_clear(&err);
    ct_status st = eval_layer(l, in, n_in, &v, NULL, NULL, &err);
    printf("error: %s\n", err.msg);
    CHECK_MSG(st == code, "status %d, want %d", (int)st, (int)code);
    CHECK_MSG(strstr(err.msg, a) != NULL, "'%s' not in '%s'", a, err.msg);
    CHECK_MSG(!b || strstr(err.msg, b) != NULL, "'%s' not in '%s'", b, err.msg);
    ct_layer_free(l);
}

static void test_errors(void) {
    float x[4] = {0, 1, 2, 3}, w[2] = {1, 1}, w0[2] = {0, 0}, y[2] = {0, 0};
    int32_t bad[2] = {0, 2}, neg[2] = {-1, 0};
    ct_tensor in[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 2, x), ct_tensor_1d(CT_DTYPE_I32, 2, bad),
                       ct_tensor_1d(CT_DTYPE_F32, 2, w)};
    expect_error(ct_weighted_category_cross_entropy(), in, 3, CT_ERR_ARG,
                 "layer WeightedCategoryCrossEntropy (forward)", "target id 2 at flat index 1");
    expect_error(ct_cross_entropy_loss(), in, 3, CT_ERR_ARG, "CrossEntropyLoss", "outside [0, 2)");
    expect_error(ct_category_accuracy(), in, 2, CT_ERR_ARG, "CategoryAccuracy", "target id 2");
    expect_error(ct_weighted_category_accuracy(), in, 3, CT_ERR_ARG, "WeightedCategoryAccuracy", "target id 2");
    in[1].data = neg;
    expect_error(ct_weighted_category_cross_entropy(), in, 3, CT_ERR_ARG, "target id -1 at flat index 0", NULL);

    // Weights that sum to 0: the weighted mean over nothing is 0, with weight
    // 0 (so a data-parallel device whose shard is all padding adds nothing)
    // and a zero gradient; NaN weights are an error naming the layer.
    in[1].data = (int32_t[]){0, 1};
    in[2].data = w0;
    ct_layer *zero_weight[3] = {ct_weighted_category_cross_entropy(), ct_cross_entropy_loss(),
                                ct_weighted_category_accuracy()};
    for (int i = 0; i < 3; i++) {
        double v = -1;
        float g[4] = {9, 9, 9, 9};
        ct_error err;
        CHECK_OK(eval_layer(zero_weight[i], in, 3, &v, g, NULL, &err), &err);
        CHECK_MSG(v == 0.0, "%s over zero weight: %g", zero_weight[i]->name, v);
        CHECK(i == 2 || (g[0] == 0 && g[1] == 0 && g[2] == 0 && g[3] == 0));
        ct_layer_free(zero_weight[i]);
    }
    // A label smoothing outside [0, 1], or NaN: an error at init naming the
    // layer and the value.
    in[2].data = w;
    expect_error(smoothed_ce(1.5f), in, 3, CT_ERR_ARG, "layer WeightedCategoryCrossEntropy (init)",
                 "label_smoothing 1.5 must be in [0, 1]");
    expect_error(smoothed_ce(-0.1f), in, 3, CT_ERR_ARG, "WeightedCategoryCrossEntropy (init)",
                 "label_smoothing -0.1 must be in [0, 1]");
    expect_error(smoothed_ce(NAN), in, 3, CT_ERR_ARG, "WeightedCategoryCrossEntropy (init)",
                 "label_smoothing nan must be in [0, 1]");
    ct_tensor l2in[3] = {ct_tensor_1d(CT_DTYPE_F32, 2, x), ct_tensor_1d(CT_DTYPE_F32, 2, y),
                         ct_tensor_1d(CT_DTYPE_F32, 2, w0)};
    float wnan[2] = {1, NAN};
    l2in[2].data = wnan;
    expect_error(ct_l2_loss(), l2in, 3, CT_ERR_ARG, "layer L2Loss", "sum of weights (2) f32 is NaN");
    // A negative weight: where weights cancel in a device's shard or a loss
    // chunk ({1, -1}) that part's weighted sum would be taken as 0.
    l2in[2].data = (float[]){1, -1};
    expect_error(ct_l2_loss(), l2in, 3, CT_ERR_ARG, "layer L2Loss",
                 "weights (2) f32: weight [1] is -1; loss weights are finite and >= 0");
    in[2].data = (float[]){2.5f, -0.5f};
    expect_error(ct_weighted_category_cross_entropy(), in, 3, CT_ERR_ARG, "layer WeightedCategoryCrossEntropy",
                 "weight [1] is -0.5; loss weights are finite and >= 0");
    // An infinite weight: the weighted mean would be inf / inf, NaN.
    in[2].data = (float[]){INFINITY, 1.0f};
    expect_error(ct_weighted_category_cross_entropy(), in, 3, CT_ERR_ARG, "layer WeightedCategoryCrossEntropy",
                 "weight [0] is inf; loss weights are finite and >= 0");
    l2in[2].data = w0;

    // Shapes that do not fit, at init.
    in[2].data = w;
    ct_tensor t3 = ct_tensor_1d(CT_DTYPE_I32, 3, (int32_t[]){0, 0, 0});
    ct_tensor shape_in[3] = {in[0], t3, in[2]};
    expect_error(ct_weighted_category_cross_entropy(), shape_in, 3, CT_ERR_SHAPE, "(init)",
                 "targets (3) i32 do not fit model output (2,2) f32");
    ct_tensor f_targets[3] = {in[0], ct_tensor_1d(CT_DTYPE_F32, 2, y), in[2]};
    expect_error(ct_category_accuracy(), f_targets, 2, CT_ERR_SHAPE, "CategoryAccuracy (init)", "(2) f32");
    ct_tensor w3[3] = {in[0], in[1], ct_tensor_1d(CT_DTYPE_F32, 3, (float[]){1, 1, 1})};
    expect_error(ct_weighted_category_accuracy(), w3, 3, CT_ERR_SHAPE, "weights (3) f32 do not match", NULL);
    ct_tensor l2bad[3] = {ct_tensor_1d(CT_DTYPE_F32, 2, x), ct_tensor_1d(CT_DTYPE_F32, 3, (float[]){0, 0, 0}),
                          l2in[2]};
    expect_error(ct_l2_loss(), l2bad, 3, CT_ERR_SHAPE, "L2Loss (init)", "targets (3) f32");
    // Weights of another shape than the outputs (fewer: read past otherwise).
    ct_tensor l2w[3] = {ct_tensor_1d(CT_DTYPE_F32, 2, x), ct_tensor_1d(CT_DTYPE_F32, 2, y),
                        ct_tensor_1d(CT_DTYPE_F32, 1, w)};
    expect_error(ct_l2_loss(), l2w, 3, CT_ERR_SHAPE, "L2Loss (init)",
                 "weights (1) f32 do not match model output (2) f32");
    // An accuracy over no targets has no value (0 / 0): an error, not NaN.
    ct_tensor none[2] = {ct_tensor_2d(CT_DTYPE_F32, 0, 2, x), ct_tensor_1d(CT_DTYPE_I32, 0, bad)};
    expect_error(ct_category_accuracy(), none, 2, CT_ERR_ARG, "CategoryAccuracy (forward)", "no targets");
    // SequenceAccuracy over one position, outputs (2,): scalar targets have
    // no sequence axis to run along.
    ct_tensor scalar_t[3] = {ct_tensor_1d(CT_DTYPE_F32, 2, x), ct_tensor_make(CT_DTYPE_I32, 0, NULL, bad),
                             ct_tensor_make(CT_DTYPE_F32, 0, NULL, w)};
    expect_error(ct_sequence_accuracy(), scalar_t, 3, CT_ERR_SHAPE, "SequenceAccuracy (init)",
                 "targets () i32 have no sequence axis");
    // BinaryCrossEntropy: targets of the logits' shape, each 0 or 1.
    ct_tensor bce[2] = {ct_tensor_1d(CT_DTYPE_F32, 2, x), ct_tensor_1d(CT_DTYPE_I32, 2, (int32_t[]){1, 2})};
    expect_error(ct_binary_cross_entropy(), bce, 2, CT_ERR_ARG, "BinaryCrossEntropy",
                 "target id 2 at flat index 1 of targets (2) i32 is outside [0, 2)");
    bce[1] = ct_tensor_1d(CT_DTYPE_I32, 3, (int32_t[]){0, 1, 0});
    expect_error(ct_binary_cross_entropy(), bce, 2, CT_ERR_SHAPE, "BinaryCrossEntropy (init)",
                 "targets (3) i32 do not match logits (2) f32");
}

// A NULL-data gradient into a loss gives NULL-data gradients out.
static void test_null_grad_out(void) {
    float logits[4] = {0, 1, 2, 3}, w[2] = {1, 1};
    int32_t t[2] = {0, 1};
    ct_tensor in[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 2, logits), ct_tensor_1d(CT_DTYPE_I32, 2, t),
                       ct_tensor_1d(CT_DTYPE_F32, 2, w)};
    ct_layer *l = ct_weighted_category_cross_entropy();
    runner r;
    ct_error err;
    CHECK_OK(runner_init(&r, l, in, 3, &err), &err);
    ct_tensor out[1], gin[3];
    CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, in, out, ct_key_from_seed(1), &err), &err);
    ct_tensor none = ct_tensor_sig(&out[0]);
    CHECK_OK(ct_layer_backward(r.net.root, &r.ctx, &none, gin, ct_key_from_seed(1), &err), &err);
    CHECK(!gin[0].data && !gin[1].data && !gin[2].data);
    CHECK(ct_tensor_same_sig(&gin[0], &in[0]) && r.ctx.tape_len == 0);
    runner_free(&r);
    ct_layer_free(l);
}

// Runs l (takes no reference) forward on in and returns what its value
// averages over (ct_ctx.loss_weight), or NAN on an error.
static double forward_loss_weight(ct_layer *l, const ct_tensor *in, int n_in) {
    runner r;
    ct_error err;
    CHECK_OK(runner_init(&r, l, in, n_in, &err), &err);
    ct_tensor out[1];
    r.ctx.loss_weight = NAN;
    ct_status st = ct_layer_forward(r.net.root, &r.ctx, in, out, ct_key_from_seed(1), &err);
    CHECK_OK(st, &err);
    double w = st == CT_OK ? r.ctx.loss_weight : NAN;
    runner_free(&r);
    ct_layer_free(l);
    return w;
}

// What each loss and metric averages over, by hand: the weight sum (3.5)
// for the weighted ones, the target count (4) without weights, the sequence
// count (2) for SequenceAccuracy; replicas combine their values by it. And a
// weighted accuracy divides by the weight sum, not the target count.
static void test_loss_weights(void) {
    // argmax rows: [1, 0, 2, 0]; targets [1, 0, 2, 1]: matches [1, 1, 1, 0]
    float o[12] = {1, 2, 0, 3, 3, 1, 0, 0, 5, 2, 1, 0}, w[4] = {1, 0.5f, 0, 2};
    int32_t t[4] = {1, 0, 2, 1};
    ct_tensor in[3] = {ct_tensor_2d(CT_DTYPE_F32, 4, 3, o), ct_tensor_1d(CT_DTYPE_I32, 4, t),
                       ct_tensor_1d(CT_DTYPE_F32, 4, w)};
    CHECK_NEAR(forward_loss_weight(ct_weighted_category_cross_entropy(), in, 3), 3.5, 0);
    CHECK_NEAR(forward_loss_weight(ct_cross_entropy_loss(), in, 3), 3.5, 0);
    CHECK_NEAR(forward_loss_weight(ct_weighted_category_accuracy(), in, 3), 3.5, 0);
    CHECK_NEAR(forward_loss_weight(ct_category_accuracy(), in, 2), 4.0, 0);
    double v;
    ct_error err;
    ct_layer *l = ct_weighted_category_accuracy();
    CHECK_OK(eval_layer(l, in, 3, &v, NULL, NULL, &err), &err);
    CHECK_NEAR(v, 1.5 / 3.5, 1e-7);  // (1 + 0.5 + 0) / 3.5
    ct_layer_free(l);
    // The same 12 values as 2 sequences of 2 positions over 3 classes.
    ct_tensor seq[3] = {ct_tensor_3d(CT_DTYPE_F32, 2, 2, 3, o), ct_tensor_2d(CT_DTYPE_I32, 2, 2, t),
                        ct_tensor_2d(CT_DTYPE_F32, 2, 2, w)};
    CHECK_NEAR(forward_loss_weight(ct_sequence_accuracy(), seq, 3), 2.0, 0);
    float lo[4] = {0, 1, 2, 3}, lt[4] = {1, 1, 1, 1};
    ct_tensor l2[3] = {ct_tensor_1d(CT_DTYPE_F32, 4, lo), ct_tensor_1d(CT_DTYPE_F32, 4, lt),
                       ct_tensor_1d(CT_DTYPE_F32, 4, w)};
    CHECK_NEAR(forward_loss_weight(ct_l2_loss(), l2, 3), 3.5, 0);
    int32_t bt[4] = {0, 1, 1, 0};
    ct_tensor bce[2] = {ct_tensor_1d(CT_DTYPE_F32, 4, lo), ct_tensor_1d(CT_DTYPE_I32, 4, bt)};
    CHECK_NEAR(forward_loss_weight(ct_binary_cross_entropy(), bce, 2), 4.0, 0);
}

int main(void) {
    test_weighted_category_cross_entropy();
    test_label_smoothing();
    test_cross_entropy_loss();
    test_accuracies();
    test_sequence_accuracy();
    test_loss_weights();
    test_l2_loss();
    test_binary_cross_entropy();
    test_gradchecks();
    test_errors();
    test_null_grad_out();
    return check_summary("test_losses");
}
