// SRU (Trax's, include/ctrax/layers/rnn.h): finite-difference gradients of
// inputs and weights (one block of columns, several blocks with a partial
// one, T = 1); the forward against a plain double-precision scalar
// implementation of the formulas using the net's own Dense weights (one
// thread and the OpenMP path, T = 1); c_{-1} = 0; causality over time;
// Trax's name and weight names; wrong widths and ranks refused by name; a
// reversible half-residual of SRU rebuilds its inputs and its
// reverse_and_grad matches forward + backward; a ReformerLM with
// ff_use_sru = 1 passes a gradient check and trains (standard and
// memory-efficient steps agree).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/layers/reversible.h"
#include "ctrax/layers/rnn.h"
#include "ctrax/models/models.h"
#include "layer_fixture.h"
#include "train_fixture.h"

// The net's weight whose checkpoint name ends with suffix, or NULL.
static float *weight_ending(const ct_net *net, const char *suffix, int64_t *numel) {
    for (int i = 0; i < ct_net_weight_count(net); i++) {
        const char *name = ct_net_weight_name(net, i);
        size_t n = strlen(name), m = strlen(suffix);
        if (n >= m && strcmp(name + n - m, suffix) == 0) {
            ct_tensor w = ct_net_weight(net, i);
            *numel = ct_tensor_numel(&w);
            return ct_f32(&w);
        }
    }
    return NULL;
}

static double sigmoid_ref(double v) { return 1.0 / (1.0 + exp(-v)); }

// The formulas of rnn.h, one (b, t, j) at a time, in double:
//   [r | f | y] = x W + b; r, f = sigmoid; c_t = f c_{t-1} + (1 - f) y,
//   c_{-1} = 0; h_t = r c_t + (1 - r) sqrt(3) x_t.
// x (B, T, n), W (n, 3n), bias (3n) -> h (B, T, n).
static void sru_reference(double *h, const float *x, const float *W, const float *bias, int B, int T, int n) {
    for (int b = 0; b < B; b++)
        for (int j = 0; j < n; j++) {
            double c = 0.0;
            for (int t = 0; t < T; t++) {
                const float *xr = x + ((int64_t)b * T + t) * n;
                double g[3];
                for (int k = 0; k < 3; k++) {
                    g[k] = bias[k * n + j];
                    for (int i = 0; i < n; i++) g[k] += (double)xr[i] * W[(int64_t)i * 3 * n + k * n + j];
                }
                double r = sigmoid_ref(g[0]), f = sigmoid_ref(g[1]), y = g[2];
                c = f * c + (1.0 - f) * y;
                h[((int64_t)b * T + t) * n + j] = r * c + (1.0 - r) * sqrt(3.0) * xr[j];
            }
        }
}

static void test_gradients(void) {
    struct { int B, T, n; } cases[] = {{2, 5, 8}, {2, 3, 70}, {3, 1, 6}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int B = cases[i].B, T = cases[i].T, n = cases[i].n;
        float *x = malloc((size_t)B * T * n * sizeof *x);
        ct_tensor in = uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, n, x), 11 + i, -1, 1);
        char label[64];
        snprintf(label, sizeof label, "SRU(%d) on (%d,%d,%d)", n, B, T, n);
        check_layer(label, ct_sru(n), &in, 1, true);
        free(x);
    }
}

// The layer's forward against sru_reference with the net's own weights (a
// random bias, so the bias's place is checked too). Returns the error.
static double reference_error(int B, int T, int n) {
    float *x = malloc((size_t)B * T * n * sizeof *x), *h = malloc((size_t)B * T * n * sizeof *h);
    double *ref = malloc((size_t)B * T * n * sizeof *ref);
    ct_tensor in = uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, n, x), 21, -1, 1);
    ct_layer *l = ct_sru(n);
    fixture f;
    double worst = INFINITY;
    if (fixture_init_ok(&f, l, &in, 1, true)) {
        int64_t nk = 0, nb = 0;
        float *W = weight_ending(&f.net, "/kernel", &nk), *bias = weight_ending(&f.net, "/bias", &nb);
        CHECK_MSG(W && bias && nk == (int64_t)n * 3 * n && nb == 3 * n, "SRU(%d): Dense weights not found", n);
        if (W && bias) {
            ct_tensor bt = ct_tensor_1d(CT_DTYPE_F32, nb, bias);
            gradcheck_fill(&bt, 22, -2, 2);
            run_forward(&f, &in, ct_key_from_seed(1), h);
            sru_reference(ref, x, W, bias, B, T, n);
            worst = 0;
            for (int64_t i = 0; i < (int64_t)B * T * n; i++) {
                double e = fabs(h[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
                worst = check_worse(worst, e);
            }
        }
        fixture_free(&f);
    }
    ct_layer_free(l);
    free(x), free(h), free(ref);
    return worst;
}

static void test_reference(void) {
    // (3, 40, 150): above the scan's threshold for threads, 3 column blocks,
    // the last partial; T = 1: c_0 = (1 - f) y.
    struct { int B, T, n; } cases[] = {{2, 7, 5}, {3, 40, 150}, {4, 1, 9}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double e = reference_error(cases[i].B, cases[i].T, cases[i].n);
        printf("SRU(%d) on (%d,%d,%d) vs scalar reference: max rel err %.2e\n", cases[i].n, cases[i].B, cases[i].T,
               cases[i].n, e);
        CHECK_MSG(e <= 1e-6, "SRU(%d) forward differs from the reference by %g", cases[i].n, e);
    }
}

// c_{-1} = 0 even on a reused arena full of garbage: with W = 0 and the
// forget gate's bias +40 (f = 1), c stays c_{-1}, and with r's bias +40
// (r = 1) h = c. Causality: changing x at the last step changes only the
// last step's outputs.
static void test_initial_state_and_causality(void) {
    enum { B = 2, T = 4, N = 6 };
    float x[B * T * N], h[B * T * N], h2[B * T * N];
    ct_tensor in = uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, N, x), 31, -1, 1);
    ct_layer *l = ct_sru(N);
    fixture f;
    if (fixture_init_ok(&f, l, &in, 1, false)) {
        int64_t nk, nb;
        float *W = weight_ending(&f.net, "/kernel", &nk), *bias = weight_ending(&f.net, "/bias", &nb);
        CHECK(W && bias);
        // Garbage in the arena the forward will allocate from.
        ct_tensor junk = ct_tensor_1d(CT_DTYPE_F32, 4096, NULL);
        CHECK_OK(ct_ctx_alloc(&f.ctx, &junk, &f.err), &f.err);
        for (int i = 0; i < 4096; i++) ct_f32(&junk)[i] = 1e3f;
        ct_arena_reset(&f.arena);
        float saved_w[N * 3 * N], saved_b[3 * N];
        memcpy(saved_w, W, sizeof saved_w), memcpy(saved_b, bias, sizeof saved_b);
        memset(W, 0, sizeof saved_w);
        for (int j = 0; j < N; j++) bias[j] = bias[N + j] = 40.0f, bias[2 * N + j] = 5.0f;
        run_forward(&f, &in, ct_key_from_seed(1), h);
        float worst = 0;
        for (int i = 0; i < B * T * N; i++) worst = (float)check_worse(worst, fabsf(h[i]));
        printf("SRU with f = r = 1: max |h| %.2e (c stays c_{-1} = 0)\n", worst);
        CHECK_MSG(worst < 1e-6f, "c_{-1} is not 0: |h| reaches %g", worst);

        memcpy(W, saved_w, sizeof saved_w), memcpy(bias, saved_b, sizeof saved_b);
        run_forward(&f, &in, ct_key_from_seed(1), h);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < N; j++) x[(b * T + T - 1) * N + j] += 0.5f;
        run_forward(&f, &in, ct_key_from_seed(1), h2);
        int early_same = 1, last_changed = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int j = 0; j < N; j++) {
                    int i = (b * T + t) * N + j;
                    if (t < T - 1) early_same &= h[i] == h2[i];
                    else last_changed |= h[i] != h2[i];
                }
        CHECK_MSG(early_same && last_changed, "SRU is not causal over time (earlier same %d, last changed %d)",
                  early_same, last_changed);
        fixture_free(&f);
    }
    ct_layer_free(l);
}

// Backward given no output gradient (NULL: zero) gives x a zero gradient
// (NULL or zeros) and adds nothing to the weight gradients.
static void test_no_gradient(void) {
    enum { B = 2, T = 3, N = 6 };
    float x[B * T * N];
    ct_tensor in = uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, N, x), 51, -1, 1);
    ct_layer *l = ct_sru(N);
    fixture f;
    if (fixture_init_ok(&f, l, &in, 1, true)) {
        ct_net_zero_grads(&f.net);
        ct_tensor out[1], gin[1];
        CHECK_OK(fixture_forward(&f, &in, out, 1), &f.err);
        ct_tensor gout = ct_tensor_sig(&out[0]);
        CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &gout, gin, ct_key_from_seed(1), &f.err), &f.err);
        int nonzero = 0;
        for (int64_t i = 0; gin[0].data && i < B * T * N; i++) nonzero += ct_f32(&gin[0])[i] != 0.0f;
        for (size_t i = 0; i < f.net.n_weights; i++) nonzero += f.net.grads[i] != 0.0f;
        printf("SRU with no output gradient: %d nonzero gradient elements\n", nonzero);
        CHECK_MSG(nonzero == 0, "SRU with a zero output gradient gives %d nonzero gradient elements", nonzero);
        fixture_free(&f);
    }
    ct_layer_free(l);
}

// Trax's name, the weight names, and refusals: a width other than n_units,
// an input without a time axis.
static void test_names_and_errors(void) {
    ct_layer *l = ct_sru(8);
    CHECK(strcmp(ct_layer_name(l), "SRU_8") == 0 && ct_layer_n_in(l) == 1 && ct_layer_n_out(l) == 1);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_tensor good = ct_tensor_3d(CT_DTYPE_F32, 2, 3, 8, NULL);
    CHECK_OK(ct_net_init(&net, l, &good, 1, ct_key_from_seed(1), &dev, &err), &err);
    CHECK(ct_net_weight_count(&net) == 2);
    for (int i = 0; i < ct_net_weight_count(&net); i++) printf("SRU weight %s\n", ct_net_weight_name(&net, i));
    CHECK(strncmp(ct_net_weight_name(&net, 0), "SRU_8/", 6) == 0 && strstr(ct_net_weight_name(&net, 0), "Dense"));
    int64_t nk;
    CHECK(weight_ending(&net, "/kernel", &nk) && nk == 8 * 24);
    ct_net_free(&net);
    ct_layer_free(l);

    l = ct_sru(8);
    ct_tensor wide = ct_tensor_3d(CT_DTYPE_F32, 2, 3, 6, NULL);
    CHECK(ct_net_init(&net, l, &wide, 1, ct_key_from_seed(1), &dev, &err) == CT_ERR_SHAPE);
    printf("wrong width: %s\n", err.msg);
    CHECK(strstr(err.msg, "SRU_8") && strstr(err.msg, "width 6") && strstr(err.msg, "n_units 8"));
    ct_layer_free(l);

    // Wider than n_units too: the cell would take x's width for n and read
    // the (3 n_units)-wide gates past their rows.
    l = ct_sru(8);
    wide = ct_tensor_3d(CT_DTYPE_F32, 2, 3, 10, NULL);
    CHECK(ct_net_init(&net, l, &wide, 1, ct_key_from_seed(1), &dev, &err) == CT_ERR_SHAPE);
    printf("width 10: %s\n", err.msg);
    CHECK(strstr(err.msg, "SRU_8") && strstr(err.msg, "width 10") && strstr(err.msg, "n_units 8"));
    ct_layer_free(l);

    l = ct_sru(8);
    ct_tensor flat = ct_tensor_2d(CT_DTYPE_F32, 2, 8, NULL);
    CHECK(ct_net_init(&net, l, &flat, 1, ct_key_from_seed(1), &dev, &err) == CT_ERR_SHAPE);
    printf("no time axis: %s\n", err.msg);
    CHECK(strstr(err.msg, "SRU_8") && strstr(err.msg, "(batch, time, 8)"));
    ct_layer_free(l);
    CHECK(dev.current_bytes == 0);
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        m = check_worse(m, d);  // NaN: +inf, kept (with !(d <= m) the next d replaced it)
    }
    return m;
}

// A ReversibleHalfResidual(SRU), as ReformerLM's decoder_block builds it for
// ff_use_sru = 1, on [x1, x2] -> [x1 + SRU(x2), x2]: reverse rebuilds the
// inputs from the outputs, and reverse_and_grad gives the input and weight
// gradients of forward + backward.
static void test_reversible(void) {
    enum { B = 2, T = 5, D = 8 };
    float a[B * T * D], b[B * T * D], ga[B * T * D], gb[B * T * D];
    ct_tensor in[2] = {uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, D, a), 41, -1, 1),
                       uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, D, b), 42, -1, 1)};
    check_layer("ReversibleHalfResidual(SRU)", ct_reversible_half_residual(CT_LAYERS(ct_sru(D))), in, 2, true);

    ct_layer *l = ct_reversible_half_residual(CT_LAYERS(ct_sru(D)));
    fixture f;
    if (!fixture_init_ok(&f, l, in, 2, true)) {
        ct_layer_free(l);
        return;
    }
    ct_key key = ct_key_from_seed(9);
    ct_tensor out[2], gout[2] = {uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, D, ga), 43, -1, 1),
                                 uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, D, gb), 44, -1, 1)};
    ct_tensor gin[2], rin[2], rin2[2], rgin[2];
    CHECK_OK(ct_layer_forward(l, &f.ctx, in, out, key, &f.err), &f.err);
    ct_net_zero_grads(&f.net);
    CHECK_OK(ct_layer_backward(l, &f.ctx, gout, gin, key, &f.err), &f.err);
    size_t nw = f.net.n_weights;
    float *wref = malloc(nw * sizeof *wref), *gref[2];
    memcpy(wref, f.net.grads, nw * sizeof *wref);
    for (int i = 0; i < 2; i++) {
        gref[i] = malloc(ct_tensor_nbytes(&in[i]));
        memcpy(gref[i], gin[i].data, ct_tensor_nbytes(&in[i]));
    }
    f.ctx.record = false;
    CHECK_OK(ct_layer_reverse(l, &f.ctx, out, rin, key, &f.err), &f.err);
    f.ctx.record = true;
    ct_net_zero_grads(&f.net);
    CHECK_OK(ct_layer_reverse_and_grad(l, &f.ctx, out, gout, rin2, rgin, key, &f.err), &f.err);
    CHECK(f.ctx.tape_len == 0);
    double e_in = 0, e_in2 = 0, e_g = 0;
    for (int i = 0; i < 2; i++) {
        e_in = fmax(e_in, max_abs_diff(ct_f32(&rin[i]), ct_f32(&in[i]), B * T * D));
        e_in2 = fmax(e_in2, max_abs_diff(ct_f32(&rin2[i]), ct_f32(&in[i]), B * T * D));
        e_g = fmax(e_g, max_abs_diff(ct_f32(&rgin[i]), gref[i], B * T * D));
    }
    double e_w = max_abs_diff(f.net.grads, wref, (int64_t)nw);
    printf("ReversibleHalfResidual(SRU): reverse inputs %.2e, reverse_and_grad inputs %.2e, input grads %.2e, "
           "weight grads %.2e\n", e_in, e_in2, e_g, e_w);
    CHECK_MSG(e_in <= 1e-5 && e_in2 <= 1e-5 && e_g <= 1e-5 && e_w <= 1e-4,
              "ReversibleHalfResidual(SRU) reverse: %g %g %g %g", e_in, e_in2, e_g, e_w);
    free(wref), free(gref[0]), free(gref[1]);
    fixture_free(&f);
    ct_layer_free(l);
}

// A small ReformerLM with ff_use_sru = 1 (tests/test_models.c's size).
static ct_reformer_lm_params sru_reformer(float dropout) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = 7;
    p.d_model = 8;
    p.d_ff = 12;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 16;
    p.dropout = dropout;
    p.ff_use_sru = 1;
    return p;
}

// Trains a fresh ReformerLM(p) for n_steps of one batch with Adam; returns
// its weights (malloc'd, *n of them) and the last loss.
static float *train_sru_reformer(ct_reformer_lm_params p, int n_steps, bool memory_efficient, size_t *n,
                                 float *loss) {
    ct_layer *model = ct_reformer_lm(p);
    float *w = train_reformer(model, n_steps, memory_efficient, n, loss);
    ct_layer_free(model);
    return w;
}

static void test_reformer_lm(void) {
    int32_t tokens[RB * RT] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5};
    ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, RB, RT, tokens);
    ct_gradcheck_opts o = ct_gradcheck_model_defaults(ct_gradcheck_defaults().eps);
    o.train = true;
    ct_layer *m = ct_reformer_lm(sru_reformer(0.1f));
    double e = gradcheck("ReformerLM(ff_use_sru = 1)", m, &in, 1, o);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_MODEL_TOL, "ReformerLM(ff_use_sru = 1): rel err %g", e);
    ct_layer_free(m);

    size_t n1, n2;
    float l0, l1, l2;
    float *w0 = train_sru_reformer(sru_reformer(0.0f), 1, false, &n1, &l0);
    float *w1 = train_sru_reformer(sru_reformer(0.0f), 3, false, &n1, &l1);
    float *w2 = train_sru_reformer(sru_reformer(0.0f), 3, true, &n2, &l2);
    double num = 0, den = 0;
    for (size_t i = 0; w1 && w2 && n1 == n2 && i < n1; i++) {
        num += ((double)w1[i] - w2[i]) * ((double)w1[i] - w2[i]);
        den += (double)w1[i] * w1[i];
    }
    double rel = sqrt(num / (den > 0 ? den : 1));
    printf("ReformerLM(ff_use_sru = 1): grad rel err %.3g; loss %.4f after 1 step, %.4f after 3; "
           "3 steps standard vs memory-efficient rel %.3g; %zu weights\n", e, l0, l1, rel, n1);
    CHECK_MSG(w0 && w1 && w2 && n1 == n2 && isfinite(l1) && l1 < l0 && rel < 1e-4,
              "ReformerLM(ff_use_sru = 1) training: loss %g -> %g, standard vs memory-efficient rel %g", l0, l1, rel);
    free(w0), free(w1), free(w2);
}

int main(void) {
    test_names_and_errors();
    test_gradients();
    test_reference();
    test_initial_state_and_causality();
    test_no_gradient();
    test_reversible();
    test_reformer_lm();
    return check_summary("test_sru");
}
