// SelfAttention (efficient_attention): gradient checks (chunked causal
// look-back, chunked two-sided non-causal, share_qk, full), values against a
// double-precision reference of Trax's attend (windows, wrap-around, masks,
// both dropouts), one chunk = full attention, causal full attention = the
// CausalAttention layer on copied weights, Trax's shape test, the chunk_len
// errors, arena memory linear in T at a fixed chunk_len; masked (against the
// reference, gradient checks, Trax's padding test, padding at positions 0
// and 1 masked too, an all-ones mask = unmasked, int32 = f32 masks, mask
// errors); the init (Wq, Wk, Wv, Wo on their documented keys) and no
// dropout in eval.
#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/chunked_attention.h"
#include "layer_fixture.h"

static ct_self_attention_params sa_params(int H, int dk, int dv, bool causal, int m, int before, int after) {
    ct_self_attention_params p = ct_self_attention_default_params();
    p.n_heads = H, p.d_qk = dk, p.d_v = dv, p.causal = causal;
    p.chunk_len = m, p.n_chunks_before = before, p.n_chunks_after = after;
    return p;
}

// In training mode (dropout with the checker's fixed key), on in[0..n_in).
static void gradcheck_one(const char *label, ct_self_attention_params p, const ct_tensor *in, int n_in) {
    double eps = p.share_qk ? SHARED_QK_EPS : ct_gradcheck_defaults().eps;
    check_layer_eps(label, ct_self_attention(p), in, n_in, true, eps);
}

enum { B = 2, T = 12, D = 6 };

static void test_gradients(void) {
    float xd[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd);
    gradcheck_fill(&x, 21, -1.0f, 1.0f);
    // T = 12, chunk 4: three chunks, so look-back and look-ahead wrap.
    ct_self_attention_params p = sa_params(2, 3, 4, true, 4, 1, 0);
    gradcheck_one("SelfAttention(causal, chunk 4, before 1)", p, &x, 1);
    // Output dropout 0.3: with the check's key it drops a channel of D = 6 (at 0.1 none is dropped,
    // so a wrong output-dropout backward passed).
    p.bias = true, p.attention_dropout = 0.2f, p.output_dropout = 0.3f;
    gradcheck_one("SelfAttention(causal, chunk 4, before 1, bias, dropout 0.2/0.3)", p, &x, 1);
    p = sa_params(2, 3, 4, false, 4, 1, 1);
    gradcheck_one("SelfAttention(chunk 4, before 1, after 1)", p, &x, 1);
    p = sa_params(2, 3, 4, true, 4, 1, 0);
    p.share_qk = true;
    gradcheck_one("SelfAttention(share_qk, causal, chunk 4, before 1)", p, &x, 1);
    p.causal = false, p.bias = true, p.n_chunks_after = 1;
    gradcheck_one("SelfAttention(share_qk, bias, chunk 4, before 1, after 1)", p, &x, 1);
    p = sa_params(3, 2, 3, true, 0, 0, 0);
    gradcheck_one("SelfAttention(full, causal)", p, &x, 1);
    p.causal = false, p.share_qk = true, p.attention_dropout = 0.3f;
    gradcheck_one("SelfAttention(full, share_qk, dropout 0.3)", p, &x, 1);
}

// mask (B, T) = 1 but at the padding positions listed per example, each
// list ended by -1.
static void fill_mask(float *mask, const int *pad) {
    for (int i = 0; i < B * T; i++) mask[i] = 1.0f;
    for (int b = 0; b < B; b++, pad++)
        for (; *pad >= 0; pad++) mask[b * T + *pad] = 0.0f;
}

// ---- reference: Trax's attend in double, from the layer's own weights ----

typedef struct ref_weights {
    const float *wq, *wk, *wv, *wo, *bq, *bk, *bv;  // stacked over heads; NULL when absent
} ref_weights;

static const float *find(const ct_net *net, const char *name) {
    const ct_param *p = ct_net_find_param(net, name);
    return p ? net->weights + p->offset : NULL;
}

static ref_weights ref_weights_of(const ct_net *net) {
    return (ref_weights){find(net, "SelfAttention/Wq[0]"), find(net, "SelfAttention/Wk[0]"),
                         find(net, "SelfAttention/Wv[0]"), find(net, "SelfAttention/Wo[0]"),
                         find(net, "SelfAttention/bq"),    find(net, "SelfAttention/bk"),
                         find(net, "SelfAttention/bv")};
}

// out (Tn, d) = x (Tn, Dn) w (Dn, d) + b
static void ref_proj(double *out, const float *x, const float *w, const float *b, int Tn, int Dn, int d) {
    for (int t = 0; t < Tn; t++)
        for (int i = 0; i < d; i++) {
            double acc = b ? b[i] : 0.0;
            for (int e = 0; e < Dn; e++) acc += (double)x[t * Dn + e] * w[e * d + i];
            out[t * d + i] = acc;
        }
}

static double ref_keep(ct_key key, uint32_t j, float rate) {
    if (rate <= 0.0f) return 1.0;
    return (double)ct_random_bits(key, j) >= (double)rate * 4294967296.0 ? 1.0 / (1.0 - (double)rate) : 0.0;
}

// The key chunk at window offset j, as Trax's look_adjacent.
static int ref_chunk(int c, int j, int N) { return (j <= -N || j >= N) ? c : ((c + j) % N + N) % N; }

// Head (b, h): adds o_h Wo[h] into y (Tn, Dn). q, k, v are (Tn, d); maskb
// (Tn) or NULL: keys where it is 0 lose 1e9.
static void ref_head(double *y, const double *q, const double *k, const double *v, const float *wo,
                     const float *maskb, ct_self_attention_params p, int Tn, int Dn, ct_key key_att, float rate) {
    int m = p.chunk_len ? p.chunk_len : Tn, N = Tn / m, nw = 1 + p.n_chunks_before + p.n_chunks_after, W = m * nw;
    double *dots = malloc(sizeof(double) * (size_t)W), *o = calloc((size_t)p.d_v, sizeof(double));
    for (int t = 0; t < Tn; t++) {
        int c = t / m, r = t % m;
        double mx = -INFINITY, sum = 0;
        for (int w = 0; w < W; w++) {
            int kp = ref_chunk(c, w / m - p.n_chunks_before, N) * m + w % m;
            double s = 0;
            for (int i = 0; i < p.d_qk; i++) s += q[t * p.d_qk + i] * k[kp * p.d_qk + i];
            if (p.causal && t < kp) s -= 1e9;
            if (p.share_qk && t == kp) s -= 1e5;
            if (maskb && maskb[kp] == 0.0f) s -= 1e9;
            dots[w] = s;
            mx = fmax(mx, s);
        }
        for (int w = 0; w < W; w++) sum += exp(dots[w] - mx);
        memset(o, 0, sizeof(double) * (size_t)p.d_v);
        for (int w = 0; w < W; w++) {
            int kp = ref_chunk(c, w / m - p.n_chunks_before, N) * m + w % m;
            double pr = exp(dots[w] - mx) / sum * ref_keep(key_att, (uint32_t)(r * W + w), rate);
            for (int i = 0; i < p.d_v; i++) o[i] += pr * v[kp * p.d_v + i];
        }
        for (int e = 0; e < Dn; e++)
            for (int i = 0; i < p.d_v; i++) y[t * Dn + e] += o[i] * wo[i * Dn + e];
    }
    free(dots);
    free(o);
}

// SelfAttention's output for x (Bn, Tn, Dn) and mask (Bn, Tn) or NULL in
// double; train turns both dropouts on with key's splits.
static void ref_self_attention(double *y, const float *x, const float *mask, const ref_weights *w,
                               ct_self_attention_params p, int Bn, int Tn, int Dn, ct_key key, bool train) {
    int dk = p.d_qk, dv = p.d_v;
    double *q = malloc(sizeof(double) * (size_t)(Tn * dk)), *k = malloc(sizeof(double) * (size_t)(Tn * dk));
    double *v = malloc(sizeof(double) * (size_t)(Tn * dv));
    memset(y, 0, sizeof(double) * (size_t)(Bn * Tn * Dn));
    for (int b = 0; b < Bn; b++)
        for (int h = 0; h < p.n_heads; h++) {
            const float *xb = x + b * Tn * Dn;
            ref_proj(q, xb, w->wq + h * Dn * dk, w->bq ? w->bq + h * dk : NULL, Tn, Dn, dk);
            if (!p.share_qk) ref_proj(k, xb, w->wk + h * Dn * dk, w->bk ? w->bk + h * dk : NULL, Tn, Dn, dk);
            for (int t = 0; t < Tn; t++) {
                double ms = 0;
                for (int i = 0; i < dk; i++) ms += q[t * dk + i] * q[t * dk + i];
                double s = (p.share_qk ? 1.0 / sqrt(ms / dk + 1e-6) : 1.0) / sqrt((double)dk);
                for (int i = 0; i < dk; i++) k[t * dk + i] = (p.share_qk ? q[t * dk + i] : k[t * dk + i]) * s;
            }
            ref_proj(v, xb, w->wv + h * Dn * dv, w->bv ? w->bv + h * dv : NULL, Tn, Dn, dv);
            ref_head(y + b * Tn * Dn, q, k, v, w->wo + h * dv * Dn, mask ? mask + b * Tn : NULL, p, Tn, Dn,
                     ct_key_split(key, 0), train ? p.attention_dropout : 0.0f);
        }
    float out_rate = train ? p.output_dropout : 0.0f;
    for (int n = 0; n < Bn * Tn; n++)
        for (int e = 0; e < Dn; e++) y[n * Dn + e] *= ref_keep(ct_key_split(key, 1), (uint32_t)e, out_rate);
    free(q), free(k), free(v);
}

// The layer against the reference; biases set non-zero so a miswired one
// shows. With p.masked, mask (B, T) f32 is the second input.
static void check_against_reference(const char *label, ct_self_attention_params p, const float *mask, bool train) {
    float xd[B * T * D], out[B * T * D];
    double ref[B * T * D];
    ct_tensor x[2] = {ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd), ct_tensor_2d(CT_DTYPE_F32, B, T, (float *)mask)};
    gradcheck_fill(&x[0], 31, -1.0f, 1.0f);
    ct_layer *l = ct_self_attention(p);
    fixture r;
    if (fixture_init_ok(&r, l, x, p.masked ? 2 : 1, train)) {
        for (int i = 0; i < r.net.n_params; i++) {
            const ct_param *pa = r.net.params[i];
            ct_tensor wt = ct_tensor_1d(CT_DTYPE_F32, ct_tensor_numel(&pa->sig), r.net.weights + pa->offset);
            if (pa->name[0] == 'b') gradcheck_fill(&wt, 100 + (uint64_t)i, -0.5f, 0.5f);
        }
        ref_weights w = ref_weights_of(&r.net);
        ct_key key = ct_key_from_seed(9);
        run_forward(&r, x, key, out);
        ref_self_attention(ref, xd, p.masked ? mask : NULL, &w, p, B, T, D, key, train);
        double md = 0;
        for (int i = 0; i < B * T * D; i++) md = check_worse(md, fabs(out[i] - ref[i]));
        printf("%s vs double reference: max abs diff %.3e\n", label, md);
        CHECK_MSG(md < 1e-5, "%s: max diff %g", label, md);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

static void test_reference(void) {
    ct_self_attention_params p = sa_params(2, 3, 4, true, 4, 1, 0);
    p.bias = true;
    check_against_reference("chunked causal, before 1", p, NULL, false);
    p.attention_dropout = 0.25f, p.output_dropout = 0.2f;
    check_against_reference("chunked causal, before 1, dropout 0.25/0.2", p, NULL, true);
    p = sa_params(2, 3, 4, false, 4, 1, 1);
    check_against_reference("chunked, before 1, after 1", p, NULL, false);
    p = sa_params(2, 3, 4, false, 3, 2, 3);  // 4 chunks, window of 6: offset 3 wraps, -4 < j < 4
    p.share_qk = true, p.bias = true;
    check_against_reference("share_qk, chunk 3, before 2, after 3", p, NULL, false);
    p = sa_params(2, 3, 4, false, 6, 3, 0);  // 2 chunks: offset -3 is no shift (Trax's slices)
    check_against_reference("chunk 6, before 3 (|j| >= N)", p, NULL, false);
    p = sa_params(3, 4, 2, true, 0, 0, 0);
    p.share_qk = true;
    check_against_reference("full, causal, share_qk", p, NULL, false);
    // masked: padding keys lose 1e9 on top of the other penalties. Causal
    // padding at 0 would leave query 0 no real key: every score near -1e9,
    // whose float ulp (64) erases the dots the double reference keeps.
    float causal_mask[B * T], prefix_mask[B * T];
    fill_mask(causal_mask, (const int[]){1, 7, -1, 10, 11, -1});
    fill_mask(prefix_mask, (const int[]){0, 1, -1, 0, 1, 5, 11, -1});
    p = sa_params(2, 3, 4, true, 4, 1, 0);
    p.masked = true, p.bias = true, p.attention_dropout = 0.25f, p.output_dropout = 0.2f;
    check_against_reference("masked, chunked causal, before 1, dropout 0.25/0.2", p, causal_mask, true);
    p = sa_params(2, 3, 4, false, 3, 2, 3);
    p.masked = true, p.share_qk = true;
    check_against_reference("masked (padding at 0 and 1), share_qk, chunk 3, before 2, after 3", p, prefix_mask,
                            false);
    p = sa_params(2, 3, 4, false, 0, 0, 0);
    p.masked = true;
    check_against_reference("masked (padding at 0 and 1), full", p, prefix_mask, false);
    // A query whose only real key is itself (share_qk: -1e5) attends to
    // itself, not to the padding (-1e9): Trax's penalties differ by 10^4, so
    // a padding penalty of 1e5 (a tie with the self one) shows.
    float lone_mask[B * T];
    fill_mask(lone_mask, (const int[]){0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, -1, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11, -1});
    p = sa_params(2, 3, 4, false, 0, 0, 0);
    p.masked = true, p.share_qk = true;
    check_against_reference("masked (one real token), full, share_qk", p, lone_mask, false);
    p = sa_params(2, 3, 4, false, 4, 1, 1);
    p.masked = true, p.share_qk = true;
    check_against_reference("masked (one real token), share_qk, chunk 4, before 1, after 1", p, lone_mask, false);
}

// Forward with a tape, then backward with the gradient gy: out and dx into
// dst_out, dst_dx; the weight gradients are left in the net's slab.
static void run_step(fixture *r, const ct_tensor *x, const ct_tensor *gy, ct_key key, float *dst_out, float *dst_dx) {
    ct_tensor out[1], gin[1];
    ct_error err;
    ct_net_zero_grads(&r->net);
    CHECK_OK(ct_layer_forward(r->net.root, &r->ctx, x, out, key, &err), &err);
    CHECK_OK(ct_layer_backward(r->net.root, &r->ctx, gy, gin, key, &err), &err);
    if (dst_out) memcpy(dst_out, out[0].data, ct_tensor_nbytes(&out[0]));
    if (dst_dx) memcpy(dst_dx, gin[0].data, ct_tensor_nbytes(&gin[0]));
    ct_arena_reset(&r->arena);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = check_worse(m, fabs((double)a[i] - b[i]));
    return m;
}

// One chunk of the whole sequence (chunk_len = T) is full attention, and so
// is a window that repeats that chunk three times (before 1, after 1 with
// one chunk: Trax's offsets +-1 are no shift), since softmax over a key seen
// three times gives each copy a third. Outputs, input and weight gradients.
static void test_one_chunk_is_full(void) {
    float xd[B * T * D], gd[B * T * D], out[3][B * T * D], dx[3][B * T * D];
    float *wg[3] = {0};
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd), gy = ct_tensor_3d(CT_DTYPE_F32, B, T, D, gd);
    gradcheck_fill(&x, 41, -1.0f, 1.0f);
    gradcheck_fill(&gy, 42, -1.0f, 1.0f);
    for (int causal = 0; causal < 2; causal++) {
        size_t nw = 0;
        for (int v = 0; v < 3; v++) {
            ct_self_attention_params p = sa_params(2, 3, 4, causal, v ? T : 0, v == 2, v == 2);
            p.bias = true, p.share_qk = !causal;
            ct_layer *l = ct_self_attention(p);
            fixture r;
            if (fixture_init_ok(&r, l, &x, 1, false)) {
                run_step(&r, &x, &gy, ct_key_from_seed(5), out[v], dx[v]);
                nw = r.net.n_weights;
                wg[v] = malloc(nw * sizeof(float));
                memcpy(wg[v], r.net.grads, nw * sizeof(float));
                fixture_free(&r);
            }
            ct_layer_free(l);
        }
        for (int v = 1; v < 3 && wg[0] && wg[v]; v++) {
            double d_out = max_abs_diff(out[v], out[0], B * T * D), d_dx = max_abs_diff(dx[v], dx[0], B * T * D);
            double d_w = max_abs_diff(wg[v], wg[0], nw);
            printf("%s chunk_len T%s vs full: out %.3e, dx %.3e, weight grads %.3e\n", causal ? "causal" : "share_qk",
                   v == 2 ? " (window of 3 copies)" : "", d_out, d_dx, d_w);
            CHECK_MSG(d_out < 1e-5 && d_dx < 1e-5 && d_w < 1e-5, "%g %g %g", d_out, d_dx, d_w);
        }
        for (int v = 0; v < 3; v++) free(wg[v]), wg[v] = NULL;
    }
}

// Causal full SelfAttention (bias, d_qk = d_v = D / H) computes what
// CausalAttention computes, given the same weights: its Dense kernels (D, D)
// hold head h in columns [h hs, (h+1) hs), copied into Wq[h], Wk[h], Wv[h];
// the output Dense's rows of head h are Wo[h] as they lie; SelfAttention
// has no output bias, so CausalAttention's is 0.
static void test_matches_causal_attention(void) {
    enum { DM = 8, H = 2, HS = DM / H };
    float xd[B * T * DM], a[B * T * DM], b[B * T * DM];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, DM, xd);
    gradcheck_fill(&x, 51, -1.0f, 1.0f);
    ct_self_attention_params p = sa_params(H, HS, HS, true, 0, 0, 0);
    p.bias = true;
    ct_layer *ca = ct_causal_attention(DM, H, 0.0f), *sa = ct_self_attention(p);
    fixture rc, rs;
    if (fixture_init_ok(&rc, ca, &x, 1, false) && fixture_init_ok(&rs, sa, &x, 1, false)) {
        static const char *pre = "CausalAttention/Branch[0]/Parallel[1]/Dense[%d]/%s";
        static const char *wn[3] = {"Wq[0]", "Wk[0]", "Wv[0]"}, *bn[3] = {"bq", "bk", "bv"};
        char name[128];
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, pre, j, "bias");
            float *cb = (float *)find(&rc.net, name);
            for (int i = 0; i < DM; i++) cb[i] = 0.1f * (float)(i - 3 * j);  // non-zero biases
            snprintf(name, sizeof name, pre, j, "kernel");
            const float *ck = find(&rc.net, name);
            snprintf(name, sizeof name, "SelfAttention/%s", wn[j]);
            float *sw = (float *)find(&rs.net, name);
            snprintf(name, sizeof name, "SelfAttention/%s", bn[j]);
            float *sb = (float *)find(&rs.net, name);
            for (int h = 0; h < H; h++)
                for (int i = 0; i < HS; i++) {
                    sb[h * HS + i] = cb[h * HS + i];
                    for (int e = 0; e < DM; e++) sw[(h * DM + e) * HS + i] = ck[e * DM + h * HS + i];
                }
        }
        memset((float *)find(&rc.net, "CausalAttention/Dense[2]/bias"), 0, DM * sizeof(float));
        memcpy((float *)find(&rs.net, "SelfAttention/Wo[0]"), find(&rc.net, "CausalAttention/Dense[2]/kernel"),
               DM * DM * sizeof(float));
        run_forward(&rc, &x, ct_key_from_seed(6), a);
        run_forward(&rs, &x, ct_key_from_seed(6), b);
        double md = max_abs_diff(a, b, B * T * DM);
        printf("causal full SelfAttention vs CausalAttention (same weights): max abs diff %.3e\n", md);
        CHECK_MSG(md < 1e-5, "max diff %g", md);
        fixture_free(&rs);
    }
    if (rc.net.root) fixture_free(&rc);
    ct_layer_free(ca);
    ct_layer_free(sa);
}

// Trax's efficient_attention_test shapes: H=5, dk=7, dv=17, causal, chunk 8,
// one chunk before, on ones (3, 32, 8), in training mode.
static void test_trax_shapes(void) {
    float *xd = malloc(3 * 32 * 8 * sizeof(float));
    for (int i = 0; i < 3 * 32 * 8; i++) xd[i] = 1.0f;
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 3, 32, 8, xd), out[1];
    ct_layer *l = ct_self_attention(sa_params(5, 7, 17, true, 8, 1, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        ct_error err;
        CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, &x, out, ct_key_from_seed(1), &err), &err);
        printf("Trax shape test: (3,32,8) -> (%lld,%lld,%lld)\n", (long long)out[0].shape[0],
               (long long)out[0].shape[1], (long long)out[0].shape[2]);
        CHECK(out[0].ndim == 3 && out[0].shape[0] == 3 && out[0].shape[1] == 32 && out[0].shape[2] == 8);
        CHECK(r.net.n_weights == (size_t)5 * (8 * 7 * 2 + 8 * 17 * 2));
        fixture_free(&r);
    }
    ct_layer_free(l);
    free(xd);
}

// Init errors name the layer and the numbers at fault.
static void expect_init_error(ct_self_attention_params p, int Tn, const char *want1, const char *want2) {
    float *xd = calloc((size_t)(2 * Tn * 4), sizeof(float));
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 2, Tn, 4, xd), sig = ct_tensor_sig(&x);
    ct_layer *l = ct_self_attention(p);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_status st = ct_net_init(&net, l, &sig, 1, ct_key_from_seed(1), &dev, &err);
    printf("error: %s\n", st == CT_OK ? "(none)" : err.msg);
    CHECK(st != CT_OK);
    if (st != CT_OK)
        CHECK_MSG(strstr(err.msg, "SelfAttention") && strstr(err.msg, want1) && strstr(err.msg, want2), "%s", err.msg);
    else
        ct_net_free(&net);
    ct_layer_free(l);
    free(xd);
}

static void test_errors(void) {
    expect_init_error(sa_params(2, 4, 4, true, 8, 1, 0), 30, "T=30", "chunk_len 8");
    expect_init_error(sa_params(2, 4, 4, true, 0, 1, 0), 16, "n_chunks_before 1", "chunk_len");
    ct_self_attention_params p = sa_params(2, 4, 4, true, 4, 1, 0);
    p.attention_dropout = 1.0f;
    expect_init_error(p, 16, "attention_dropout 1", "[0, 1)");
    p.attention_dropout = 0.0f, p.output_dropout = 1.0f;
    expect_init_error(p, 16, "output_dropout 1", "[0, 1)");
    // A negative n_chunks_after would shrink the window (before 1, after -1:
    // only the previous chunk, not the query's own).
    expect_init_error(sa_params(2, 4, 4, true, 4, 1, -1), 16, "n_chunks_after -1", "must not be negative");
    expect_init_error(sa_params(2, 4, 4, true, 4, -1, 0), 16, "n_chunks_before -1", "must not be negative");
}

// A forward on an input whose D is not init's fails, naming the weights' d_model
// (the per-head weights are (D, d) of init's D).
static void test_forward_d_model(void) {
    float xd[B * T * D], wide[B * T * (D + 2)];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd), xw = ct_tensor_3d(CT_DTYPE_F32, B, T, D + 2, wide), out[1];
    gradcheck_fill(&x, 41, -1.0f, 1.0f);
    gradcheck_fill(&xw, 42, -1.0f, 1.0f);
    ct_layer *l = ct_self_attention(sa_params(2, 3, 4, true, 4, 1, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, false)) {
        ct_error err;
        ct_status st = ct_layer_forward(r.net.root, &r.ctx, &xw, out, ct_key_from_seed(1), &err);
        printf("forward on (2,12,8) after init on (2,12,6): %s\n", st == CT_OK ? "(accepted)" : err.msg);
        CHECK_MSG(st == CT_ERR_SHAPE && strstr(err.msg, "SelfAttention") && strstr(err.msg, "d_model 6"), "%s",
                  st == CT_OK ? "accepted" : err.msg);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// The defaults are Trax's (REFORMER.md section 3): the tests above set the
// sizes themselves, so a wrong default would pass them.
static void test_defaults(void) {
    ct_self_attention_params p = ct_self_attention_default_params();
    printf("defaults: n_heads %d, d_qk %d, d_v %d, chunk_len %d, before %d, after %d\n", p.n_heads, p.d_qk, p.d_v,
           p.chunk_len, p.n_chunks_before, p.n_chunks_after);
    CHECK(p.n_heads == 2 && p.d_qk == 64 && p.d_v == 64);
    CHECK(!p.share_qk && !p.causal && !p.masked && !p.bias);
    CHECK(p.chunk_len == 0 && p.n_chunks_before == 0 && p.n_chunks_after == 0);
    CHECK(p.attention_dropout == 0.0f && p.output_dropout == 0.0f);
}

// A layer that joins a new net takes that net's D (layer_fixture.h).
static void test_new_net_new_d(void) {
    float xd[B * T * D];
    ct_layer *l = ct_self_attention(sa_params(2, 3, 4, true, 4, 1, 0));
    check_new_net_new_d(l, B, T, D, xd, false);
    ct_layer_free(l);
}

// Arena bytes of one training step (forward with tape + backward).
static size_t step_bytes(ct_self_attention_params p, int Tn) {
    enum { DM = 16 };
    float *xd = malloc(sizeof(float) * (size_t)(Tn * DM)), *gd = malloc(sizeof(float) * (size_t)(Tn * DM));
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 1, Tn, DM, xd), gy = ct_tensor_3d(CT_DTYPE_F32, 1, Tn, DM, gd);
    gradcheck_fill(&x, 61, -1.0f, 1.0f);
    gradcheck_fill(&gy, 62, -1.0f, 1.0f);
    ct_layer *l = ct_self_attention(p);
    fixture r;
    size_t bytes = 0;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        ct_tensor out[1], gin[1];
        ct_error err;
        CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, &x, out, ct_key_from_seed(2), &err), &err);
        CHECK_OK(ct_layer_backward(r.net.root, &r.ctx, &gy, gin, ct_key_from_seed(2), &err), &err);
        bytes = r.arena.high_water;
        fixture_free(&r);
    }
    ct_layer_free(l);
    free(xd), free(gd);
    return bytes;
}

// At a fixed chunk_len the step's arena grows linearly in T (x4 for T x4);
// full attention's grows with its T x T window (about x16).
static void test_memory_linear(void) {
    ct_self_attention_params p = sa_params(2, 8, 8, true, 32, 1, 0);
    p.attention_dropout = 0.1f;
    size_t a = step_bytes(p, 256), b = step_bytes(p, 1024);
    double ratio = (double)b / (double)a;
    printf("arena bytes of a step, chunk_len 32, before 1: T=256 %zu, T=1024 %zu, ratio %.2f\n", a, b, ratio);
    CHECK_MSG(ratio > 3.0 && ratio < 4.5, "ratio %g", ratio);
    p.chunk_len = 0, p.n_chunks_before = 0;
    size_t fa = step_bytes(p, 256), fb = step_bytes(p, 1024);
    printf("arena bytes of a step, full attention: T=256 %zu, T=1024 %zu, ratio %.2f\n", fa, fb,
           (double)fb / (double)fa);
    CHECK(fb > 3 * b);
}

// The output does not depend on the number of threads.
static void test_threads(void) {
    float xd[B * T * D], a[B * T * D], b[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd);
    gradcheck_fill(&x, 71, -1.0f, 1.0f);
    ct_self_attention_params p = sa_params(3, 3, 4, true, 4, 1, 0);
    p.attention_dropout = 0.2f;
    ct_layer *l = ct_self_attention(p);
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        run_forward(&r, &x, ct_key_from_seed(8), a);
        omp_set_num_threads(saved > 1 ? saved : 2);
        run_forward(&r, &x, ct_key_from_seed(8), b);
        omp_set_num_threads(saved);
        CHECK(memcmp(a, b, sizeof a) == 0);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// ---- masked: (x, mask) ----

// Real tokens as 1, -1 and 7 in turn: any non-zero int32 is a real token.
static void mask_to_i32(int32_t *dst, const float *mask, int n) {
    static const int32_t real[3] = {1, -1, 7};
    for (int i = 0; i < n; i++) dst[i] = mask[i] != 0.0f ? real[i % 3] : 0;
}

// Gradient checks with masked = true on an int32 mask (the checker leaves
// non-f32 inputs alone; an f32 mask would be perturbed at its zeros, where
// the output jumps). Every query keeps a real key in its window: a query
// whose every score is near -1e9 has float dots rounded away (ulp 64), a
// flat output whose analytic gradient is not 0.
static void test_masked_gradients(void) {
    float xd[B * T * D], mf[B * T];
    int32_t md[B * T];
    ct_tensor in[2] = {ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd), ct_tensor_2d(CT_DTYPE_I32, B, T, md)};
    gradcheck_fill(&in[0], 21, -1.0f, 1.0f);
    fill_mask(mf, (const int[]){5, 10, 11, -1, 2, 3, -1});  // causal: no padding at 0
    mask_to_i32(md, mf, B * T);
    ct_self_attention_params p = sa_params(2, 3, 4, true, 4, 1, 0);
    p.masked = true;
    gradcheck_one("SelfAttention(masked, causal, chunk 4, before 1)", p, in, 2);
    p.bias = true, p.attention_dropout = 0.2f, p.output_dropout = 0.3f;
    gradcheck_one("SelfAttention(masked, causal, chunk 4, before 1, bias, dropout 0.2/0.3)", p, in, 2);
    fill_mask(mf, (const int[]){0, 1, -1, 10, 11, -1});  // padding at 0 and 1: masked, not as Trax
    mask_to_i32(md, mf, B * T);
    p = sa_params(2, 3, 4, false, 4, 1, 1);
    p.masked = true, p.share_qk = true;
    gradcheck_one("SelfAttention(masked at 0 and 1, share_qk, chunk 4, before 1, after 1)", p, in, 2);
    p = sa_params(3, 2, 3, false, 0, 0, 0);
    p.masked = true;
    gradcheck_one("SelfAttention(masked at 0 and 1, full)", p, in, 2);
}

// Output and input gradient of one step on in (n_in inputs), gradient gy.
static void masked_step(ct_self_attention_params p, const ct_tensor *in, int n_in, const ct_tensor *gy, bool train,
                        float *out, float *dx) {
    fixture_step(ct_self_attention(p), in, n_in, gy, train, out, dx);
}

// masked with an all-ones mask = unmasked, and an int32 mask = the same
// mask in f32: outputs and input gradients bitwise, in training mode with
// both dropouts.
static void test_masked_all_ones_and_dtypes(void) {
    float xd[B * T * D], gd[B * T * D], ones[B * T], mf[B * T], out[3][B * T * D], dx[3][B * T * D];
    int32_t mi[B * T];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd), gy = ct_tensor_3d(CT_DTYPE_F32, B, T, D, gd);
    gradcheck_fill(&x, 81, -1.0f, 1.0f);
    gradcheck_fill(&gy, 82, -1.0f, 1.0f);
    for (int i = 0; i < B * T; i++) ones[i] = 1.0f;
    fill_mask(mf, (const int[]){0, 1, 6, -1, 9, 10, 11, -1});
    mask_to_i32(mi, mf, B * T);
    for (int share = 0; share < 2; share++) {
        ct_self_attention_params p = sa_params(2, 3, 4, !share, share ? 0 : 4, !share, 0);
        p.share_qk = share, p.attention_dropout = 0.2f, p.output_dropout = 0.1f;
        masked_step(p, &x, 1, &gy, true, out[0], dx[0]);
        p.masked = true;
        ct_tensor in[2] = {x, ct_tensor_2d(CT_DTYPE_F32, B, T, ones)};
        masked_step(p, in, 2, &gy, true, out[1], dx[1]);
        bool same = memcmp(out[0], out[1], sizeof out[0]) == 0 && memcmp(dx[0], dx[1], sizeof dx[0]) == 0;
        printf("%s: masked with an all-ones mask vs unmasked: %s\n", share ? "full, share_qk" : "chunked causal",
               same ? "bitwise equal" : "DIFFERS");
        CHECK(same);
        in[1] = ct_tensor_2d(CT_DTYPE_F32, B, T, mf);
        masked_step(p, in, 2, &gy, true, out[1], dx[1]);
        in[1] = ct_tensor_2d(CT_DTYPE_I32, B, T, mi);
        masked_step(p, in, 2, &gy, true, out[2], dx[2]);
        same = memcmp(out[1], out[2], sizeof out[1]) == 0 && memcmp(dx[1], dx[2], sizeof dx[1]) == 0;
        bool differs = memcmp(out[0], out[1], sizeof out[0]) != 0;  // the mask does something
        printf("%s: int32 mask vs f32 mask: %s; vs unmasked: %s\n", share ? "full, share_qk" : "chunked causal",
               same ? "bitwise equal" : "DIFFER", differs ? "differs" : "SAME");
        CHECK(same && differs);
    }
}

// Trax's masked test (efficient_attention_test, for LSH; here SelfAttention):
// H 5, dk 7, dv 17, non-causal, chunk 8, before 1, B 5, T 32, D 8, x ~ U(0,
// 1), each example padded from a start in [1, 31). New x in the padding
// keeps the real positions' outputs (to 1e-6) and changes the padded ones
// (mean |diff| > 1e-5). Again with padding at positions 0 and 1 as well
// (Trax's kv_info = position x (-1) + 1 leaves those two unmasked).
static void check_padding_ignored(ct_self_attention_params p, bool prefix) {
    enum { Bn = 5, Tn = 32, Dn = 8, N = Bn * Tn * Dn };
    float *x1 = malloc(sizeof(float) * N), *x2 = malloc(sizeof(float) * N), *y1 = malloc(sizeof(float) * N),
          *y2 = malloc(sizeof(float) * N), mask[Bn * Tn];
    ct_tensor in[2] = {ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, x1), ct_tensor_2d(CT_DTYPE_F32, Bn, Tn, mask)};
    gradcheck_fill(&in[0], 91, 0.0f, 1.0f);
    ct_tensor xn = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, x2);
    gradcheck_fill(&xn, 92, 0.0f, 1.0f);
    for (int b = 0; b < Bn; b++) {
        int start = 1 + (int)(ct_random_bits(ct_key_from_seed(93), (uint32_t)b) % (Tn - 2));
        for (int t = 0; t < Tn; t++) mask[b * Tn + t] = t < start && !(prefix && t < 2) ? 1.0f : 0.0f;
    }
    if (prefix) mask[0 * Tn + 2] = mask[0 * Tn + 3] = 1.0f;  // keep real tokens in example 0
    for (int i = 0; i < N; i++)  // x2: x1 with new values at the padding
        if (mask[i / Dn] != 0.0f) x2[i] = x1[i];
    ct_layer *l = ct_self_attention(p);
    fixture r;
    if (fixture_init_ok(&r, l, in, 2, false)) {
        run_forward(&r, in, ct_key_from_seed(1), y1);
        in[0].data = x2;
        run_forward(&r, in, ct_key_from_seed(1), y2);
        double real_max = 0, pad_sum = 0;
        int n_pad = 0;
        for (int i = 0; i < N; i++) {
            double dd = fabs((double)y1[i] - y2[i]);
            if (mask[i / Dn] != 0.0f) real_max = check_worse(real_max, dd);
            else pad_sum += dd, n_pad++;
        }
        double pad_mean = pad_sum / n_pad;
        printf("SelfAttention(masked%s, %s): new x in the padding: real outputs max |diff| %.3e, padded mean |diff| "
               "%.3e\n",
               prefix ? ", padding at 0 and 1 too" : "", p.causal ? "causal" : "non-causal", real_max, pad_mean);
        CHECK_MSG(real_max <= 1e-6 && pad_mean > 1e-5, "real %g, padded %g", real_max, pad_mean);
        fixture_free(&r);
    }
    ct_layer_free(l);
    free(x1), free(x2), free(y1), free(y2);
}

static void test_masked_padding_ignored(void) {
    ct_self_attention_params p = sa_params(5, 7, 17, false, 8, 1, 0);
    p.masked = true;
    check_padding_ignored(p, false);
    check_padding_ignored(p, true);
    p.causal = true;
    check_padding_ignored(p, true);
    p = sa_params(5, 7, 17, false, 0, 0, 0);
    p.masked = true, p.share_qk = true;
    check_padding_ignored(p, true);
}

// A mask of the wrong shape or dtype fails at init, naming the layer.
static void test_mask_errors(void) {
    ct_tensor sig[2] = {ct_tensor_3d(CT_DTYPE_F32, 2, 16, 4, NULL), ct_tensor_2d(CT_DTYPE_F32, 2, 17, NULL)};
    for (int bad = 0; bad < 3; bad++) {
        if (bad == 1) sig[1] = ct_tensor_2d(CT_DTYPE_BF16, 2, 16, NULL);
        if (bad == 2) sig[1] = ct_tensor_2d(CT_DTYPE_F32, 3, 16, NULL);  // another batch
        ct_self_attention_params p = sa_params(2, 4, 4, true, 4, 1, 0);
        p.masked = true;
        ct_layer *l = ct_self_attention(p);
        ct_device dev = ct_device_cpu();
        ct_net net;
        ct_error err;
        ct_status st = ct_net_init(&net, l, sig, 2, ct_key_from_seed(1), &dev, &err);
        printf("error: %s\n", st == CT_OK ? "(none)" : err.msg);
        CHECK_MSG(st != CT_OK && strstr(err.msg, "SelfAttention") && strstr(err.msg, "mask"), "%s",
                  st == CT_OK ? "accepted" : err.msg);
        if (st == CT_OK) ct_net_free(&net);
        ct_layer_free(l);
    }
}

// A window may wrap round the input's chunks (the reference tests do), up
// to 2 N + 1 chunks; a wider one is refused at init, naming both settings
// (n_chunks_before = 10^6 once ran for hours on a 12-chunk input).
static void test_window_bound(void) {
    float xd[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd);  // T 12 in chunks of 3: N = 4
    static const struct {
        int before, after;
        bool ok;
    } cases[] = {{8, 0, true}, {4, 4, true}, {9, 0, false}, {1000000, 0, false}, {0, 9, false}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture f;
        ct_layer *l = ct_self_attention(sa_params(2, 3, 3, true, 3, cases[i].before, cases[i].after));
        ct_status st = fixture_init(&f, l, &x, 1, false);
        CHECK_MSG((st == CT_OK) == cases[i].ok, "before %d, after %d: %s", cases[i].before, cases[i].after,
                  st == CT_OK ? "accepted" : f.err.msg);
        if (st != CT_OK)
            CHECK_MSG(strstr(f.err.msg, "n_chunks_before") && strstr(f.err.msg, "over twice the 4 of the input"),
                      "%s", f.err.msg);
        if (st == CT_OK) ct_net_free(&f.net);
        ct_ctx_free(&f.ctx);
        ct_arena_free(&f.arena);
        ct_layer_free(l);
    }
    // A forward sees other lengths than init's: an empty init (no chunk to
    // repeat, any window passes) must not let a forward on 4 chunks run a
    // window of 10 of them (10^8 ran for hours just the same).
    ct_tensor empty = ct_tensor_3d(CT_DTYPE_F32, B, 0, D, xd), out[1];
    gradcheck_fill(&x, 51, -1.0f, 1.0f);
    ct_layer *l = ct_self_attention(sa_params(2, 3, 3, true, 3, 9, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &empty, 1, false)) {
        ct_status st = ct_layer_forward(r.net.root, &r.ctx, &x, out, ct_key_from_seed(1), &r.err);
        printf("before 9 after an init on T 0, forward on T 12 (4 chunks of 3): %s\n",
               st == CT_OK ? "(accepted)" : r.err.msg);
        CHECK_MSG(st != CT_OK && strstr(r.err.msg, "n_chunks_before 9") &&
                      strstr(r.err.msg, "over twice the 4 of the input") && strstr(r.err.msg, "forward"),
                  "%s", st == CT_OK ? "accepted" : r.err.msg);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// The kernel on a window wider than one dropout block of 256 (m 128, before
// 1, after 1: W 384), against the double reference of ref_head's dropout
// counters r W + w: the forward and dv (= sum over queries of the dropped
// probability times dO). Also ct_attention_drop_factors' counters r W + w.
static void test_wide_window_dropout(void) {
    ct_chunked_attention_dims d = {.B = 1, .H = 1, .T = 384, .dk = 2, .dv = 2, .m = 128, .before = 1, .after = 1,
                                   .causal = false, .exclude_self = false, .dropout = 0.25f};
    enum { Tn = 384, W = 384, dk = 2, dv = 2 };
    const int m = 128, N = Tn / m;
    float *q = malloc(sizeof(float) * Tn * dk), *k = malloc(sizeof(float) * Tn * dk);
    float *v = malloc(sizeof(float) * Tn * dv), *o = malloc(sizeof(float) * Tn * dv);
    float *dout = malloc(sizeof(float) * Tn * dv), *dq = calloc(Tn * dk, sizeof(float));
    float *dkk = calloc(Tn * dk, sizeof(float)), *dvv = calloc(Tn * dv, sizeof(float));
    double *dots = malloc(sizeof(double) * W), *rdv = calloc(Tn * dv, sizeof(double));
    for (int i = 0; i < Tn * dk; i++) q[i] = (float)sin(0.37 * i), k[i] = (float)cos(0.23 * i + 1.0);
    for (int i = 0; i < Tn * dv; i++) v[i] = (float)sin(0.11 * i + 2.0), dout[i] = (float)cos(0.07 * i);
    const ct_key key = ct_key_from_seed(17);
    const int n_slots = ct_chunked_attention_n_slots(&d);
    float *scratch = malloc(sizeof(float) * (size_t)(n_slots * ct_chunked_attention_scratch_floats(&d, true)));
    ct_chunked_attention_forward(o, q, k, v, NULL, scratch, n_slots, key, &d);
    ct_chunked_attention_backward(dq, dkk, dvv, scratch, n_slots, dout, o, q, k, v, NULL, key, &d);
    double mo = 0, mdv = 0;
    for (int t = 0; t < Tn; t++) {
        int c = t / m, r = t % m;
        double mx = -INFINITY, sum = 0, ro[dv] = {0};
        for (int w = 0; w < W; w++) {
            int kp = ref_chunk(c, w / m - 1, N) * m + w % m;
            dots[w] = (double)q[t * dk] * k[kp * dk] + (double)q[t * dk + 1] * k[kp * dk + 1];
            mx = fmax(mx, dots[w]);
        }
        for (int w = 0; w < W; w++) sum += exp(dots[w] - mx);
        for (int w = 0; w < W; w++) {
            int kp = ref_chunk(c, w / m - 1, N) * m + w % m;
            double pr = exp(dots[w] - mx) / sum * ref_keep(key, (uint32_t)(r * W + w), d.dropout);
            for (int i = 0; i < dv; i++) ro[i] += pr * v[kp * dv + i], rdv[kp * dv + i] += pr * dout[t * dv + i];
        }
        for (int i = 0; i < dv; i++) mo = check_worse(mo, fabs(ro[i] - o[t * dv + i]));
    }
    for (int i = 0; i < Tn * dv; i++) mdv = check_worse(mdv, fabs(rdv[i] - dvv[i]));
    float f[W];
    ct_attention_drop_factors(f, 3, W, key, d.dropout);
    int bad_f = 0;
    for (int w = 0; w < W; w++) bad_f += f[w] != (float)ref_keep(key, (uint32_t)(3 * W + w), d.dropout);
    printf("window 384 (> 256), dropout 0.25: max abs diff o %.3e, dv %.3e; drop_factors row 3 off: %d\n", mo, mdv,
           bad_f);
    CHECK_MSG(mo < 1e-5 && mdv < 1e-4 && bad_f == 0, "o %g dv %g factors %d", mo, mdv, bad_f);
    free(q), free(k), free(v), free(o), free(dout), free(dq), free(dkk), free(dvv), free(dots), free(rdv);
    free(scratch);
}

// Init as Trax's _kernel_initializer: head h's Wq, Wk, Wv, Wo from
// split(split(layer key, h), 0 / 1 / 2 / 3), each U(+-sqrt(6 / (D + d H))),
// d = d_qk for Wq and Wk, d_v for Wv and Wo (so Wk is not Wq). The
// fixture's layer key is the net's, seed 3.
static void test_init_weights(void) {
    enum { H = 3, dk = 4, dv = 5 };
    float xd[T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 1, T, D, xd);
    gradcheck_fill(&x, 9, -1.0f, 1.0f);
    ct_layer *l = ct_self_attention(sa_params(H, dk, dv, false, 4, 1, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        const head_weight w[4] = {
            {"Wq", D * dk, dk, 0}, {"Wk", D * dk, dk, 1}, {"Wv", D * dv, dv, 2}, {"Wo", dv * D, dv, 3}};
        int bad = head_init_mismatches(&r.net, "SelfAttention", w, 4, H, D, 3);
        printf("init: %d of %d weights differ from U(+-sqrt(6 / (D + d H))) on their documented keys\n", bad, 4 * H);
        CHECK(bad == 0);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// Outside training both dropouts are off (Trax sets them to 0 when mode is
// not 'train'): an eval forward with attention_dropout and output_dropout
// 0.5 equals, bitwise, the same layer's without them.
static void test_eval_no_dropout(void) {
    float xd[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd);
    gradcheck_fill(&x, 12, -1.0f, 1.0f);
    ct_self_attention_params p = sa_params(2, 3, 4, true, 4, 1, 0);
    ct_layer *plain = ct_self_attention(p);
    p.attention_dropout = 0.5f, p.output_dropout = 0.5f;
    ct_layer *dropped = ct_self_attention(p);
    CHECK(eval_equal_without_dropout(plain, dropped, &x, sizeof xd / sizeof *xd));
}

// A zero-length input (T 0) is an empty sequence: init, forward and
// backward give (B, 0, D), as CausalAttention's do, for full attention (its
// one chunk of T is 0 rows long) and a chunked look-back alike.
static void test_zero_length(void) {
    ct_self_attention_params ps[2] = {sa_params(2, 3, 4, true, 0, 0, 0), sa_params(2, 3, 4, true, 4, 1, 0)};
    for (int i = 0; i < 2; i++) {
        static float xd[1], gd[1];
        ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, 0, D, xd), gy = ct_tensor_3d(CT_DTYPE_F32, B, 0, D, gd);
        ct_layer *l = ct_self_attention(ps[i]);
        fixture r;
        ct_status st = fixture_init(&r, l, &x, 1, true);
        printf("T 0, chunk_len %d, before %d: init %s\n", ps[i].chunk_len, ps[i].n_chunks_before,
               st == CT_OK ? "ok" : r.err.msg);
        CHECK(st == CT_OK);
        if (st == CT_OK) {
            ct_tensor out[1], gin[1];
            CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, &x, out, ct_key_from_seed(4), &r.err), &r.err);
            CHECK(out[0].ndim == 3 && out[0].shape[0] == B && out[0].shape[1] == 0 && out[0].shape[2] == D);
            CHECK_OK(ct_layer_backward(r.net.root, &r.ctx, &gy, gin, ct_key_from_seed(4), &r.err), &r.err);
            CHECK(gin[0].ndim == 3 && gin[0].shape[1] == 0);
            ct_arena_reset(&r.arena);
            fixture_free(&r);
        } else {
            ct_ctx_free(&r.ctx);
            ct_arena_free(&r.arena);
        }
        ct_layer_free(l);
    }
}

int main(void) {
    test_wide_window_dropout();
    test_window_bound();
    test_gradients();
    test_reference();
    test_one_chunk_is_full();
    test_matches_causal_attention();
    test_trax_shapes();
    test_errors();
    test_forward_d_model();
    test_defaults();
    test_new_net_new_d();
    test_memory_linear();
    test_threads();
    test_masked_gradients();
    test_masked_all_ones_and_dtypes();
    test_masked_padding_ignored();
    test_mask_errors();
    test_init_weights();
    test_eval_no_dropout();
    test_zero_length();
    return check_summary("test_efficient_attention");
}
