// DotProductCausalAttention and CausalAttention: gradient checks (with and
// without dropout), values against a naive double-precision reference,
// causality, the documented dropout mask, determinism across thread counts,
// and init errors.
#include <omp.h>
#include <stdlib.h>

#include "layer_fixture.h"

enum { B = 2, T = 6, D = 8, H = 2 };

static void fill_qkv(float *q, float *k, float *v, ct_tensor *in) {
    in[0] = ct_tensor_3d(CT_DTYPE_F32, B, T, D, q);
    in[1] = ct_tensor_3d(CT_DTYPE_F32, B, T, D, k);
    in[2] = ct_tensor_3d(CT_DTYPE_F32, B, T, D, v);
    gradcheck_fill(&in[0], 11, -1.5f, 1.5f);
    gradcheck_fill(&in[1], 12, -1.5f, 1.5f);
    gradcheck_fill(&in[2], 13, -1.0f, 1.0f);
}

// The documented dropout factor of element j (kernels/cpu/attention.h).
static double ref_drop(ct_key key, uint32_t j, float rate) {
    return (double)ct_random_bits(key, j) >= (double)rate * 4294967296.0 ? 1.0 / (1.0 - (double)rate) : 0.0;
}

// Naive causal attention in double; rate 0 means no dropout.
static void ref_attention(double *out, const float *q, const float *k, const float *v, ct_key key, float rate) {
    const int hs = D / H;
    double scale = 1.0 / sqrt((double)hs), sc[T];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                double m = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) {
                    double dot = 0;
                    for (int i = 0; i < hs; i++)
                        dot += (double)q[(b * T + t) * D + h * hs + i] * k[(b * T + s) * D + h * hs + i];
                    sc[s] = dot * scale;
                    if (sc[s] > m) m = sc[s];
                }
                for (int s = 0; s <= t; s++) sum += (sc[s] = exp(sc[s] - m));
                for (int i = 0; i < hs; i++) {
                    double acc = 0;
                    for (int s = 0; s <= t; s++) {
                        double p = sc[s] / sum;
                        if (rate > 0) p *= ref_drop(key, (uint32_t)(((b * H + h) * T + t) * T + s), rate);
                        acc += p * v[(b * T + s) * D + h * hs + i];
                    }
                    out[(b * T + t) * D + h * hs + i] = acc;
                }
            }
}

static double max_diff(const float *a, const double *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = check_worse(m, fabs(a[i] - b[i]));
    return m;
}

static void test_gradients(void) {
    float q[B * T * D], k[B * T * D], v[B * T * D], x[B * T * 6];
    ct_tensor in[3];
    fill_qkv(q, k, v, in);

    check_layer("DotProductCausalAttention", ct_dot_product_causal_attention(H, 0.0f), in, 3, true);
    // Train mode: dropout on, fixed key.
    check_layer("DotProductCausalAttention(dropout 0.3)", ct_dot_product_causal_attention(H, 0.3f), in, 3, true);
    // Eval mode: dropout off.
    check_layer("DotProductCausalAttention(4 heads, eval)", ct_dot_product_causal_attention(4, 0.3f), in, 3, false);

    // CausalAttention itself, every weight and the input included. Its key
    // projection's bias gets an exactly zero gradient (it adds q_t . b_k to
    // every score of row t, and softmax ignores a constant shift); the
    // checker's floor (gradcheck.h) judges that zero against numeric noise.
    ct_tensor xin = ct_tensor_3d(CT_DTYPE_F32, B, T, 6, x);
    gradcheck_fill(&xin, 21, -1.0f, 1.0f);
    for (int with_dropout = 0; with_dropout < 2; with_dropout++) {
        float rate = with_dropout ? 0.2f : 0.0f;
        check_layer(with_dropout ? "CausalAttention(dropout 0.2)" : "CausalAttention",
                    ct_causal_attention(D, H, rate), &xin, 1, true);
    }
}

static const float *param(const ct_net *net, const char *name) {
    const ct_param *p = ct_net_find_param(net, name);
    CHECK_MSG(p != NULL, "no weight %s", name);
    return p ? net->weights + p->offset : NULL;
}

// x (N, C) @ w (C, OC) + b -> y (N, OC), in double
static void ref_dense(double *y, const float *x, const float *w, const float *b, int N, int C, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = b ? b[o] : 0.0;
            for (int c = 0; c < C; c++) acc += (double)x[n * C + c] * w[c * OC + o];
            y[n * OC + o] = acc;
        }
}

static void ref_attention(double *out, const float *q, const float *k, const float *v, ct_key key, float rate);

// ct_causal_attention itself: its output against a reference built from its
// own weights (so the wiring q, k, v -> attention -> Dense is right), and the
// key bias: zero gradient, and moving it moves no output.
static void test_causal_attention_values(void) {
    enum { DI = 6 };
    float x[B * T * DI], qkv[3][B * T * D], att[B * T * D], out[B * T * D], out2[B * T * D];
    double tmp[B * T * D], ref[B * T * D];
    ct_tensor xin = ct_tensor_3d(CT_DTYPE_F32, B, T, DI, x);
    gradcheck_fill(&xin, 31, -1.0f, 1.0f);
    ct_layer *l = ct_causal_attention(D, H, 0.0f);
    fixture r;
    if (!fixture_init_ok(&r, l, &xin, 1, true)) {
        ct_layer_free(l);
        return;
    }
    // Non-zero biases, so a miswired bias would show.
    for (int i = 0; i < r.net.n_params; i++) {
        const ct_param *p = r.net.params[i];
        ct_tensor w = ct_tensor_1d(CT_DTYPE_F32, p->sig.shape[0], r.net.weights + p->offset);
        if (strcmp(p->name, "bias") == 0) gradcheck_fill(&w, 100 + (uint64_t)i, -0.5f, 0.5f);
    }
    static const char *pre = "CausalAttention/Branch[0]/Parallel[1]/Dense[%d]/%s";
    char kn[128], bn[128];
    for (int j = 0; j < 3; j++) {
        snprintf(kn, sizeof kn, pre, j, "kernel");
        snprintf(bn, sizeof bn, pre, j, "bias");
        ref_dense(tmp, x, param(&r.net, kn), param(&r.net, bn), B * T, DI, D);
        for (int i = 0; i < B * T * D; i++) qkv[j][i] = (float)tmp[i];
    }
    ref_attention(tmp, qkv[0], qkv[1], qkv[2], ct_key_from_seed(0), 0.0);
    for (int i = 0; i < B * T * D; i++) att[i] = (float)tmp[i];
    const float *wo = param(&r.net, "CausalAttention/Dense[2]/kernel"), *bo = param(&r.net, "CausalAttention/Dense[2]/bias");
    if (wo && bo) ref_dense(ref, att, wo, bo, B * T, D, D);
    run_forward(&r, &xin, ct_key_from_seed(4), out);
    double md = max_diff(out, ref, B * T * D);
    printf("CausalAttention vs reference from its weights: max abs diff %.3e\n", md);
    CHECK_MSG(md < 1e-5, "max diff %g", md);

    // Key bias: the analytic gradient is ~0 next to the others ...
    const ct_param *kb = ct_net_find_param(&r.net, "CausalAttention/Branch[0]/Parallel[1]/Dense[1]/bias");
    const ct_param *qb = ct_net_find_param(&r.net, "CausalAttention/Branch[0]/Parallel[1]/Dense[0]/bias");
    CHECK(kb && qb);
    if (kb && qb) {
        float g[B * T * D];
        ct_tensor gt = ct_tensor_3d(CT_DTYPE_F32, B, T, D, g), o[1], gin[1];
        gradcheck_fill(&gt, 60, -1, 1);
        ct_error err;
        ct_net_zero_grads(&r.net);
        CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, &xin, o, ct_key_from_seed(4), &err), &err);
        CHECK_OK(ct_layer_backward(r.net.root, &r.ctx, &gt, gin, ct_key_from_seed(4), &err), &err);
        ct_arena_reset(&r.arena);
        double nk = 0, nq = 0;
        for (int i = 0; i < D; i++) {
            nk += (double)r.net.grads[kb->offset + i] * r.net.grads[kb->offset + i];
            nq += (double)r.net.grads[qb->offset + i] * r.net.grads[qb->offset + i];
        }
        printf("CausalAttention key-bias |grad| %.3e, query-bias |grad| %.3e\n", sqrt(nk), sqrt(nq));
        CHECK(sqrt(nk) < 1e-5 * sqrt(nq) + 1e-6 && sqrt(nq) > 1e-2);
        // ... and the output does not depend on the key bias at all.
        for (int i = 0; i < D; i++) r.net.weights[kb->offset + i] += 0.5f * (float)(i + 1);
        run_forward(&r, &xin, ct_key_from_seed(4), out2);
        md = 0;
        for (int i = 0; i < B * T * D; i++) md = check_worse(md, fabs(out2[i] - out[i]));
        printf("CausalAttention output change after moving the key bias: %.3e\n", md);
        CHECK_MSG(md < 1e-5, "max change %g", md);
    }
    fixture_free(&r);
    ct_layer_free(l);
}

static void test_values_and_causality(void) {
    float q[B * T * D], k[B * T * D], v[B * T * D], out[B * T * D], out2[B * T * D];
    double ref[B * T * D];
    ct_tensor in[3];
    fill_qkv(q, k, v, in);
    ct_key key = ct_key_from_seed(5);

    ct_layer *l = ct_dot_product_causal_attention(H, 0.0f);
    fixture r;
    if (fixture_init_ok(&r, l, in, 3, true)) {
        run_forward(&r, in, key, out);
        ref_attention(ref, q, k, v, key, 0.0);
        double md = max_diff(out, ref, B * T * D);
        printf("attention vs double reference: max abs diff %.3e\n", md);
        CHECK_MSG(md < 1e-5, "max diff %g", md);

        // Position t sees only s <= t: change q, k, v at t >= 3 and
        // positions 0..2 must not move at all; change them at t >= 1 and
        // position 0 depends on v[0] alone.
        for (int t0 = 3; t0 >= 1; t0 -= 2) {
            float q2[B * T * D], k2[B * T * D], v2[B * T * D];
            memcpy(q2, q, sizeof q2), memcpy(k2, k, sizeof k2), memcpy(v2, v, sizeof v2);
            for (int b = 0; b < B; b++)
                for (int t = t0; t < T; t++)
                    for (int i = 0; i < D; i++) {
                        q2[(b * T + t) * D + i] += 0.7f;
                        k2[(b * T + t) * D + i] -= 1.3f;
                        v2[(b * T + t) * D + i] *= -2.0f;
                    }
            ct_tensor in2[3] = {in[0], in[1], in[2]};
            in2[0].data = q2, in2[1].data = k2, in2[2].data = v2;
            run_forward(&r, in2, key, out2);
            bool same = true, later_moved = false;
            for (int b = 0; b < B; b++)
                for (int t = 0; t < T; t++)
                    for (int i = 0; i < D; i++) {
                        int idx = (b * T + t) * D + i;
                        if (t < t0 && out2[idx] != out[idx]) same = false;
                        if (t >= t0 && out2[idx] != out[idx]) later_moved = true;
                    }
            CHECK_MSG(same, "positions < %d changed when only positions >= %d did", t0, t0);
            CHECK(later_moved);
        }
        // With one position, the output is v itself.
        for (int b = 0; b < B; b++)
            for (int i = 0; i < D; i++) CHECK_NEAR(out[(b * T) * D + i], v[(b * T) * D + i], 1e-6);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

static void test_dropout(void) {
    float q[B * T * D], k[B * T * D], v[B * T * D], a[B * T * D], b2[B * T * D], c[B * T * D],
        plain[B * T * D];
    double ref[B * T * D];
    ct_tensor in[3];
    fill_qkv(q, k, v, in);
    ct_key key = ct_key_from_seed(77);
    const float rate = 0.4f;

    ct_layer *l = ct_dot_product_causal_attention(H, rate);
    fixture r;
    if (fixture_init_ok(&r, l, in, 3, true)) {
        run_forward(&r, in, key, a);
        run_forward(&r, in, key, b2);
        CHECK(memcmp(a, b2, sizeof a) == 0);  // same key, same mask
        run_forward(&r, in, ct_key_from_seed(78), c);
        CHECK(memcmp(a, c, sizeof a) != 0);  // another key, another mask
        // The mask is the documented one.
        ref_attention(ref, q, k, v, key, rate);
        double md = max_diff(a, ref, B * T * D);
        printf("attention with dropout %.1f vs double reference with the documented mask: max abs diff %.3e\n",
               (double)rate, md);
        CHECK_MSG(md < 1e-5, "max diff %g", md);
        // Eval mode: no dropout.
        ct_net_bind(&r.net, &r.ctx, false);
        run_forward(&r, in, key, c);
        ref_attention(ref, q, k, v, key, 0.0);
        md = max_diff(c, ref, B * T * D);
        CHECK_MSG(md < 1e-5, "eval mode max diff %g", md);
        fixture_free(&r);
    }
    ct_layer_free(l);

    // Same inputs, dropout 0 in train mode: equal to eval mode.
    l = ct_dot_product_causal_attention(H, 0.0f);
    if (fixture_init_ok(&r, l, in, 3, true)) {
        run_forward(&r, in, key, plain);
        CHECK(memcmp(plain, c, sizeof c) == 0);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// Forward and backward give the same bits with 1 and 2 threads (each (b, h)
// is one thread's work).
static void test_thread_determinism(void) {
    enum { BB = 3, TT = 17, DD = 12, HH = 3 };
    static float q[BB * TT * DD], k[BB * TT * DD], v[BB * TT * DD], g[BB * TT * DD];
    static float out[2][BB * TT * DD], dq[2][BB * TT * DD];
    ct_tensor in[3];
    for (int i = 0; i < 3; i++) in[i] = ct_tensor_3d(CT_DTYPE_F32, BB, TT, DD, i == 0 ? q : i == 1 ? k : v);
    for (int i = 0; i < 3; i++) gradcheck_fill(&in[i], 40 + (uint64_t)i, -1, 1);
    ct_tensor gt = ct_tensor_3d(CT_DTYPE_F32, BB, TT, DD, g);
    gradcheck_fill(&gt, 50, -1, 1);
    int saved = omp_get_max_threads();
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run == 0 ? 1 : 2);
        ct_layer *l = ct_dot_product_causal_attention(HH, 0.25f);
        fixture r;
        if (fixture_init_ok(&r, l, in, 3, true)) {
            ct_tensor o[1], gin[3];
            ct_error err;
            ct_key key = ct_key_from_seed(9);
            CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, in, o, key, &err), &err);
            memcpy(out[run], o[0].data, sizeof out[run]);
            CHECK_OK(ct_layer_backward(r.net.root, &r.ctx, &gt, gin, key, &err), &err);
            CHECK(r.ctx.tape_len == 0);
            CHECK(gin[0].data && gin[1].data && gin[2].data);
            if (gin[0].data) memcpy(dq[run], gin[0].data, sizeof dq[run]);
            // A NULL-data grad_out gives NULL-data input gradients.
            CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, in, o, key, &err), &err);
            ct_tensor none = ct_tensor_sig(&o[0]);
            CHECK_OK(ct_layer_backward(r.net.root, &r.ctx, &none, gin, key, &err), &err);
            CHECK(!gin[0].data && !gin[1].data && !gin[2].data);
            CHECK(ct_tensor_same_sig(&gin[2], &in[2]));
            fixture_free(&r);
        }
        ct_layer_free(l);
    }
    omp_set_num_threads(saved);
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
    CHECK(memcmp(dq[0], dq[1], sizeof dq[0]) == 0);
}

// DotProductCausalAttention with dropout on fake (B, T, D) inputs of more
// than 2^32 probabilities: init passes, forward refuses them before reading
// or allocating anything (the data pointer points at no tensor).
static void huge_dropout_refused(ct_device *dev, int64_t B, int64_t T, int64_t D, int n_heads) {
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, (void *)dev);
    ct_tensor x3[3] = {x, x, x};
    ct_layer *l = ct_dot_product_causal_attention(n_heads, 0.1f);
    ct_net net;
    ct_error err;
    CHECK_OK(ct_net_init(&net, l, x3, 3, ct_key_from_seed(1), dev, &err), &err);
    ct_arena arena;
    ct_arena_init(&arena, dev);
    ct_ctx c;
    ct_ctx_init(&c, &arena);
    ct_net_bind(&net, &c, true);
    ct_tensor out[1];
    ct_status st = ct_layer_forward(net.root, &c, x3, out, ct_key_from_seed(1), &err);
    printf("forward error: %s\n", st == CT_OK ? "(accepted)" : err.msg);
    CHECK(st == CT_ERR_SHAPE && strstr(err.msg, "2^32"));
    ct_ctx_free(&c);
    ct_arena_free(&arena);
    ct_net_free(&net);
    ct_layer_free(l);
    CHECK(dev->current_bytes == 0);
}

static void test_errors(void) {
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_tensor sig = ct_tensor_3d(CT_DTYPE_F32, 2, 4, 10, NULL);
    ct_tensor sigs[3] = {sig, sig, sig};

    ct_layer *l = ct_dot_product_causal_attention(4, 0.0f);
    ct_status st = ct_net_init(&net, l, sigs, 3, ct_key_from_seed(1), &dev, &err);
    printf("init error: %s\n", err.msg);
    CHECK(st == CT_ERR_SHAPE);
    CHECK(strstr(err.msg, "DotProductCausalAttention") && strstr(err.msg, "10") && strstr(err.msg, "n_heads 4"));
    ct_layer_free(l);

    l = ct_causal_attention(10, 4, 0.1f);
    st = ct_net_init(&net, l, &sig, 1, ct_key_from_seed(1), &dev, &err);
    printf("init error: %s\n", err.msg);
    CHECK(st == CT_ERR_SHAPE);
    CHECK(strstr(err.msg, "CausalAttention/DotProductCausalAttention[1]") && strstr(err.msg, "d_feature 10") &&
          strstr(err.msg, "n_heads 4"));
    ct_layer_free(l);

    // n_heads 0 would divide by zero, -1 divides every d_feature: the
    // message says what is wrong (not "not divisible").
    for (int n_heads = 0; n_heads >= -1; n_heads--) {
        l = ct_dot_product_causal_attention(n_heads, 0.0f);
        st = ct_net_init(&net, l, sigs, 3, ct_key_from_seed(1), &dev, &err);
        printf("init error: %s\n", st == CT_OK ? "(accepted)" : err.msg);
        CHECK(st == CT_ERR_SHAPE && strstr(err.msg, "n_heads") && strstr(err.msg, n_heads ? "n_heads -1" : "n_heads 0") &&
              strstr(err.msg, "must be positive"));
        if (st == CT_OK) ct_net_free(&net);
        ct_layer_free(l);
    }

    l = ct_dot_product_causal_attention(2, 1.0f);
    st = ct_net_init(&net, l, sigs, 3, ct_key_from_seed(1), &dev, &err);
    printf("init error: %s\n", err.msg);
    CHECK(st == CT_ERR_ARG && strstr(err.msg, "dropout"));
    ct_layer_free(l);

    ct_tensor bad[3] = {sig, sig, ct_tensor_3d(CT_DTYPE_F32, 2, 5, 10, NULL)};
    l = ct_dot_product_causal_attention(2, 0.0f);
    st = ct_net_init(&net, l, bad, 3, ct_key_from_seed(1), &dev, &err);
    printf("init error: %s\n", err.msg);
    CHECK(st == CT_ERR_SHAPE && strstr(err.msg, "(2,5,10) f32"));
    ct_layer_free(l);
    CHECK(dev.current_bytes == 0);

    // Dropout counts probabilities with uint32 counters: (1, 65537, 2) has
    // 65537^2 > 2^32 of them. The check comes before anything is read or
    // allocated, so the inputs need no real data.
    huge_dropout_refused(&dev, 1, 65537, 2, 1);
    // B H T^2 itself past 2^63: (4, 2^30, 8) with 8 heads is 2^65
    // probabilities. The count must not overflow (it wrapped to 2, passed
    // the check and the forward read the fake inputs).
    huge_dropout_refused(&dev, 4, (int64_t)1 << 30, 8, 8);

    // The name and structure of CausalAttention.
    l = ct_causal_attention(8, 2, 0.0f);
    CHECK(strcmp(l->name, "CausalAttention") == 0 && l->n_in == 1 && l->n_out == 1 && l->n_sub == 3);
    ct_layer_free(l);
}

int main(void) {
    test_gradients();
    test_values_and_causality();
    test_causal_attention_values();
    test_dropout();
    test_thread_determinism();
    test_errors();
    return check_summary("test_attention");
}
