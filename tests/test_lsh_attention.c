// LSHSelfAttention: gradient checks with the buckets held fixed (the same
// step key reuses the stored buckets), one bucket round and one chunk =
// causal shared-QK SelfAttention on copied weights, Trax's shape test, the
// buckets in range and a second forward on the stored buckets bitwise equal,
// the count advancing under a new key, and the parameter errors.
#include <math.h>
#include <stdlib.h>

#include "layer_fixture.h"

static float *state_of(const ct_net *net, const char *name) {
    for (int i = 0; i < net->n_state_params; i++)
        if (strcmp(net->state_params[i]->name, name) == 0) return net->state + net->state_params[i]->offset;
    return NULL;
}

static ct_lsh_self_attention_params lsh_params(int H, int dk, int dv, bool causal, int m, int before, int after,
                                               int R, int nb0, int nb1) {
    ct_lsh_self_attention_params p = ct_lsh_self_attention_default_params();
    p.n_heads = H, p.d_qk = dk, p.d_v = dv, p.causal = causal, p.chunk_len = m;
    p.n_chunks_before = before, p.n_chunks_after = after, p.n_hashes = R;
    p.n_buckets[0] = nb0, p.n_buckets[1] = nb1;
    return p;
}

// In training mode: the checker's forwards share one key, so every forward
// after the first reuses the stored buckets (held fixed).
static void gradcheck_one(const char *label, ct_lsh_self_attention_params p, const ct_tensor *x) {
    check_layer(label, ct_lsh_self_attention(p), x, 1, true);
}

enum { B = 2, T = 8, D = 6 };

static void test_gradients(void) {
    float xd[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd);
    gradcheck_fill(&x, 21, -1.0f, 1.0f);
    // R T = 16 sorted rows in chunks of 4: look-back wraps.
    gradcheck_one("LSH(causal, chunk 4, before 1, R 2, nb 4)", lsh_params(2, 3, 4, true, 4, 1, 0, 2, 4, 0), &x);
    gradcheck_one("LSH(chunk 4, before 1, after 1, R 2, nb {2, 2})", lsh_params(2, 3, 4, false, 4, 1, 1, 2, 2, 2), &x);
    gradcheck_one("LSH(causal, chunk 2, before 1, R 3, nb from T)", lsh_params(3, 2, 3, true, 2, 1, 0, 3, 0, 0), &x);
    ct_lsh_self_attention_params p = lsh_params(2, 3, 4, true, 4, 1, 0, 2, 4, 0);
    p.attention_dropout = 0.2f, p.output_dropout = 0.1f;
    gradcheck_one("LSH(causal, chunk 4, before 1, R 2, nb 4, dropout 0.2/0.1)", p, &x);
}

// Copies LSHSelfAttention's Wq, Wv, Wo into SelfAttention's of the same shape.
static void copy_weights(ct_net *dst, const ct_net *src, int H) {
    const char *names[3] = {"Wq", "Wv", "Wo"};
    for (int w = 0; w < 3; w++)
        for (int h = 0; h < H; h++) {
            char a[64], b[64];
            snprintf(a, sizeof a, "LSHSelfAttention/%s[%d]", names[w], h);
            snprintf(b, sizeof b, "SelfAttention/%s[%d]", names[w], h);
            const ct_param *ps = ct_net_find_param(src, a), *pd = ct_net_find_param(dst, b);
            CHECK_MSG(ps && pd, "weights %s / %s", a, b);
            if (ps && pd)
                memcpy(dst->weights + pd->offset, src->weights + ps->offset, ct_tensor_nbytes(&ps->sig));
        }
}

// One chunk of the whole sorted length R T: every round attends over every
// position (R = 2: each twice, which leaves the softmax unchanged, and the
// rounds' equal logsumexps average equal outputs), whatever the buckets, =
// SelfAttention(share_qk, one chunk). R = 2 is checked non-causal: causal
// position 0 attends only to its own two copies (the -1e5 self penalty),
// and a float logsumexp near -1e5 (ulp 1/128) misses log 2 by up to 0.004,
// as Trax's does; one copy (R = 1) gives exp(0) exactly.
static void check_one_chunk(int R, bool causal) {
    enum { Tn = 16 };
    float xd[B * Tn * D], a[B * Tn * D], s[B * Tn * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, Tn, D, xd);
    gradcheck_fill(&x, 5, -1.0f, 1.0f);
    ct_layer *ll = ct_lsh_self_attention(lsh_params(3, 4, 5, causal, R * Tn, 0, 0, R, 4, 0));
    ct_self_attention_params sp = ct_self_attention_default_params();
    sp.n_heads = 3, sp.d_qk = 4, sp.d_v = 5, sp.causal = causal, sp.share_qk = true, sp.chunk_len = Tn;
    ct_layer *sl = ct_self_attention(sp);
    fixture rl, rs;
    if (fixture_init_ok(&rl, ll, &x, 1, false)) {
        if (fixture_init_ok(&rs, sl, &x, 1, false)) {
            copy_weights(&rs.net, &rl.net, 3);
            run_forward(&rl, &x, ct_key_from_seed(1), a);
            run_forward(&rs, &x, ct_key_from_seed(1), s);
            double md = 0;
            for (int i = 0; i < B * Tn * D; i++) md = fmax(md, fabs((double)a[i] - s[i]));
            printf("LSH(R %d, nb 4, one chunk) vs SelfAttention(share_qk, %s, one chunk): max abs diff %.3e\n", R,
                   causal ? "causal" : "non-causal", md);
            CHECK_MSG(md < 1e-5, "max diff %g", md);
            fixture_free(&rs);
        }
        fixture_free(&rl);
    }
    ct_layer_free(ll);
    ct_layer_free(sl);
}

static void test_one_chunk_is_shared_qk(void) {
    check_one_chunk(1, true);
    check_one_chunk(1, false);
    check_one_chunk(2, false);
}

// Trax's test_lsh_self_attention shape: H 5, dk 7, dv 17, causal, chunk 8,
// before 1, R 2, nb 4 on ones (3, 32, 8).
static void test_trax_shapes(void) {
    enum { Bn = 3, Tn = 32, Dn = 8 };
    float *xd = malloc(sizeof(float) * Bn * Tn * Dn);
    for (int i = 0; i < Bn * Tn * Dn; i++) xd[i] = 1.0f;
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    ct_layer *l = ct_lsh_self_attention(lsh_params(5, 7, 17, true, 8, 1, 0, 2, 4, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        ct_tensor out[1];
        ct_error err;
        CHECK_OK(ct_layer_forward(r.net.root, &r.ctx, &x, out, ct_key_from_seed(0), &err), &err);
        CHECK(out[0].ndim == 3 && out[0].shape[0] == Bn && out[0].shape[1] == Tn && out[0].shape[2] == Dn);
        printf("Trax shape test: (3, 32, 8) -> (%lld, %lld, %lld)\n", (long long)out[0].shape[0],
               (long long)out[0].shape[1], (long long)out[0].shape[2]);
        fixture_free(&r);
    }
    ct_layer_free(l);
    free(xd);
}

// Buckets in [r NB, (r + 1) NB); the same key again reuses them (bitwise the
// same output, count unchanged); a new key hashes again (count 2).
static void test_stored_buckets(void) {
    enum { Bn = 2, Tn = 32, Dn = 8, H = 2, R = 2 };
    float xd[Bn * Tn * Dn], y1[Bn * Tn * Dn], y2[Bn * Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 8, -1.0f, 1.0f);
    ct_layer *l = ct_lsh_self_attention(lsh_params(H, 4, 4, false, 8, 1, 0, R, 0, 0));  // nb = 2 (32 / 8) = 8
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        run_forward(&r, &x, ct_key_from_seed(1), y1);
        const float *bk = state_of(&r.net, "buckets"), *hs = state_of(&r.net, "hash");
        int bad = 0, used[R * 8] = {0};
        for (int s = 0; s < Bn * H; s++)
            for (int i = 0; i < R * Tn; i++) {
                float b = bk[s * R * Tn + i];
                int rr = i / Tn;
                if (b != floorf(b) || b < rr * 8 || b >= (rr + 1) * 8) bad++;
                else used[(int)b] = 1;
            }
        int n_used = 0;
        for (int i = 0; i < R * 8; i++) n_used += used[i];
        printf("buckets: %d out of range, %d of %d buckets used, count %g\n", bad, n_used, R * 8, (double)hs[4]);
        CHECK(bad == 0 && n_used > 2 && hs[4] == 1.0f);
        run_forward(&r, &x, ct_key_from_seed(1), y2);
        CHECK(memcmp(y1, y2, sizeof y1) == 0 && hs[4] == 1.0f);
        bool same = memcmp(y1, y2, sizeof y1) == 0;
        printf("second forward on the stored buckets: %s\n", same ? "bitwise equal" : "DIFFERS");
        run_forward(&r, &x, ct_key_from_seed(2), y2);
        CHECK(hs[4] == 2.0f);
        ct_net_bind(&r.net, &r.ctx, false);  // eval: every forward hashes, whatever the key
        run_forward(&r, &x, ct_key_from_seed(2), y2);
        run_forward(&r, &x, ct_key_from_seed(2), y2);
        printf("count after a new key and two eval forwards: %g\n", (double)hs[4]);
        CHECK(hs[4] == 4.0f);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// In a ReversibleHalfResidual, reverse_and_grad runs the forward again with
// the same key. Under the trainer's contract (state as before the forward)
// it hashes again from the same count, so the same rotations: on the exact
// context item of one half-residual the buckets come out bitwise the same.
// With the state after the forward (Trax's), the tag matches: no hashing.
static void test_reversible_recompute(void) {
    enum { Bn = 2, Tn = 16, Dn = 8, N = Bn * Tn * Dn };
    float x1d[N], x2d[N], g1[N], g2[N];
    ct_tensor x[2] = {ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, x1d), ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, x2d)};
    gradcheck_fill(&x[0], 41, -1.0f, 1.0f);
    gradcheck_fill(&x[1], 42, -1.0f, 1.0f);
    for (int i = 0; i < N; i++) g1[i] = g2[i] = 1.0f;
    ct_layer *lsh = ct_lsh_self_attention(lsh_params(2, 4, 4, true, 4, 1, 0, 2, 4, 0));
    ct_layer *half = ct_reversible_half_residual(1, &lsh);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_tensor sigs[2] = {ct_tensor_sig(&x[0]), ct_tensor_sig(&x[1])};
    CHECK_OK(ct_net_init(&net, half, sigs, 2, ct_key_from_seed(3), &dev, &err), &err);
    ct_arena arena;
    ct_arena_init(&arena, &dev);
    ct_ctx c;
    ct_ctx_init(&c, &arena);
    ct_net_bind(&net, &c, true);
    ct_net_zero_grads(&net);
    float *before = malloc(net.n_state * sizeof(float)), *after = malloc(net.n_state * sizeof(float));
    memcpy(before, net.state, net.n_state * sizeof(float));
    c.record = false;
    ct_tensor out[2], in[2], gin[2], gout[2] = {ct_tensor_sig(&x[0]), ct_tensor_sig(&x[1])};
    gout[0].data = g1, gout[1].data = g2;
    ct_key key = ct_key_from_seed(11);
    CHECK_OK(ct_layer_forward(net.root, &c, x, out, key, &err), &err);
    memcpy(after, net.state, net.n_state * sizeof(float));
    const float *hs = state_of(&net, "hash");
    for (int trax_flow = 0; trax_flow < 2; trax_flow++) {
        memcpy(net.state, trax_flow ? after : before, net.n_state * sizeof(float));
        CHECK_OK(ct_layer_reverse_and_grad(net.root, &c, out, gout, in, gin, key, &err), &err);
        double md = 0;
        for (int i = 0; i < N; i++) md = fmax(md, fabs((double)((float *)in[0].data)[i] - x1d[i]));
        bool same = memcmp(net.state, after, net.n_state * sizeof(float)) == 0;
        printf("reverse_and_grad from the state %s the forward: x1 back within %.2e, count %g, state %s\n",
               trax_flow ? "after" : "before", md, (double)hs[4], same ? "= the forward's (same buckets)" : "DIFFERS");
        CHECK(md < 1e-5 && same && hs[4] == 1.0f);
    }
    free(before), free(after);
    ct_ctx_free(&c);
    ct_arena_free(&arena);
    ct_net_free(&net);
    ct_layer_free(half);
}

static void expect_init_error(const char *label, ct_lsh_self_attention_params p, int Tn, const char *needle) {
    float xd[2 * 16 * 4] = {0};
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 2, Tn, 4, xd);
    ct_layer *l = ct_lsh_self_attention(p);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_tensor sig = ct_tensor_sig(&x);
    ct_status st = ct_net_init(&net, l, &sig, 1, ct_key_from_seed(1), &dev, &err);
    CHECK_MSG(st != CT_OK && strstr(err.msg, needle) && strstr(err.msg, "LSHSelfAttention"), "%s: %s", label,
              st == CT_OK ? "accepted" : err.msg);
    if (st == CT_OK) ct_net_free(&net);
    else printf("%s: %s\n", label, err.msg);
    ct_layer_free(l);
}

static void test_errors(void) {
    expect_init_error("odd n_buckets", lsh_params(2, 4, 4, true, 4, 1, 0, 1, 3, 0), 16, "n_buckets");
    expect_init_error("T not a multiple", lsh_params(2, 4, 4, true, 5, 1, 0, 1, 4, 0), 16, "chunk_len 5");
}

int main(void) {
    test_gradients();
    test_one_chunk_is_shared_qk();
    test_trax_shapes();
    test_stored_buckets();
    test_reversible_recompute();
    test_errors();
    return check_summary("test_lsh_attention");
}
