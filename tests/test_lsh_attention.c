// LSHSelfAttention: gradient checks with the buckets held fixed (the same
// step key reuses the stored buckets; one hash round and several), one
// bucket round and one chunk = causal shared-QK SelfAttention on copied
// weights, Trax's shape test, the buckets in range and a second forward on
// the stored buckets bitwise equal, the count advancing under a new key, the
// parameter errors; masked (Trax's padding test, padding at positions 0 and
// 1 masked too, gradient checks, an all-ones mask = unmasked, int32 = f32
// masks) and max_length_for_buckets; the init (weights on their documented
// keys), what a training forward keeps (no o_r), the hash keys' sequence (buckets against ct_lsh_hash on the
// documented rotations), T one over the buckets state refused, no dropout
// in eval, an eval leaving the stored buckets' tag alone, and the -1e5 self
// mask against a float64 reference at scores near 1e4.
#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/chunked_attention.h"
#include "kernels/cpu/lsh_attention.h"
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
// after the first reuses the stored buckets (held fixed). Keys are the
// queries: the step for shared QK. in[0..n_in): x, and the mask if masked.
static void gradcheck_one(const char *label, ct_lsh_self_attention_params p, const ct_tensor *in, int n_in) {
    check_layer_eps(label, ct_lsh_self_attention(p), in, n_in, true, SHARED_QK_EPS);
}

enum { B = 2, T = 8, D = 6 };

static void test_gradients(void) {
    float xd[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd);
    gradcheck_fill(&x, 21, -1.0f, 1.0f);
    // R T = 16 sorted rows in chunks of 4: look-back wraps.
    gradcheck_one("LSH(causal, chunk 4, before 1, R 2, nb 4)", lsh_params(2, 3, 4, true, 4, 1, 0, 2, 4, 0), &x, 1);
    gradcheck_one("LSH(chunk 4, before 1, after 1, R 2, nb {2, 2})", lsh_params(2, 3, 4, false, 4, 1, 1, 2, 2, 2), &x,
                  1);
    gradcheck_one("LSH(causal, chunk 2, before 1, R 3, nb from T)", lsh_params(3, 2, 3, true, 2, 1, 0, 3, 0, 0), &x, 1);
    ct_lsh_self_attention_params p = lsh_params(2, 3, 4, true, 4, 1, 0, 2, 4, 0);
    // Output dropout 0.3: with the check's key it drops a channel of D = 6 (at 0.1 none is dropped,
    // so a wrong output-dropout backward passed).
    p.attention_dropout = 0.2f, p.output_dropout = 0.3f;
    gradcheck_one("LSH(causal, chunk 4, before 1, R 2, nb 4, dropout 0.2/0.3)", p, &x, 1);
    // One round (n_hashes 1, the default and Trax's): the output is the
    // round's own, so the backward gives the logsumexp no gradient (the
    // rounds' weights are all 1); T = 8 in chunks of 4, look-back wraps.
    gradcheck_one("LSH(causal, chunk 4, before 1, R 1, nb 4)", lsh_params(2, 3, 4, true, 4, 1, 0, 1, 4, 0), &x, 1);
    gradcheck_one("LSH(chunk 4, before 1, after 1, R 1, nb 4)", lsh_params(2, 3, 4, false, 4, 1, 1, 1, 4, 0), &x, 1);
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
            for (int i = 0; i < B * Tn * D; i++) md = check_worse(md, fabs((double)a[i] - s[i]));
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
        // A key that differs only in its first word is another key (seeds
        // below 2^32 all have a first word of 0): it hashes again.
        run_forward(&r, &x, (ct_key){{1, 2}}, y2);
        printf("count after a key differing in its first word: %g\n", (double)hs[4]);
        CHECK(hs[4] == 3.0f);
        ct_net_bind(&r.net, &r.ctx, false);  // eval: every forward hashes, whatever the key
        run_forward(&r, &x, ct_key_from_seed(2), y2);
        run_forward(&r, &x, ct_key_from_seed(2), y2);
        printf("count after new keys and two eval forwards: %g\n", (double)hs[4]);
        CHECK(hs[4] == 5.0f);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// In a ReversibleHalfResidual, reverse_and_grad runs the forward again with
// the same key. The memory-efficient trainer hands it the state after the
// forward (Trax's order): the tag matches, nothing is hashed (the count
// stays 1) and the state is the forward's. From the state before the
// forward (what include/ctrax/layers/reversible.h still describes) it
// hashes again from the same count, so the same rotations: on the exact
// context item of one half-residual the buckets come out bitwise the same.
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
        for (int i = 0; i < N; i++) md = check_worse(md, fabs((double)((float *)in[0].data)[i] - x1d[i]));
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
    ct_lsh_self_attention_params p = lsh_params(2, 4, 4, true, 4, 1, 0, 1, 4, 0);
    p.max_length_for_buckets = 8;
    expect_init_error("init T over max_length_for_buckets", p, 16, "max_length_for_buckets 8");
    // One over: T 9 in chunks of 3 passes every other check, so only the
    // bound itself refuses it (its buckets would run one past each row).
    ct_lsh_self_attention_params p9 = lsh_params(2, 4, 4, true, 3, 1, 0, 1, 4, 0);
    p9.max_length_for_buckets = 8;
    expect_init_error("init T 9, one over max_length_for_buckets 8", p9, 9, "T=9");
    p.max_length_for_buckets = -1;
    expect_init_error("negative max_length_for_buckets", p, 16, "max_length_for_buckets -1");
    p.max_length_for_buckets = 0;
    expect_init_error("chunk_len 0", lsh_params(2, 4, 4, true, 0, 1, 0, 1, 4, 0), 16, "chunk_len 0");
    // A factor after an unused (0) entry would be ignored silently (the
    // buckets then come from the length).
    expect_init_error("n_buckets {0, 4}", lsh_params(2, 4, 4, true, 4, 1, 0, 1, 0, 4), 16, "n_buckets[1] = 4");
    // Buckets are floats holding exact integers: n_hashes x the product stays
    // under 2^24 (4096 x 4096 is 2^24 itself).
    expect_init_error("n_buckets 2^24", lsh_params(2, 4, 4, true, 4, 1, 0, 1, 4096, 4096), 16, "under 2^24");
    p.max_length_for_buckets = 0, p.masked = true;  // expect_init_error gives no mask input: n_in 2 needs one
    ct_tensor in[2] = {ct_tensor_3d(CT_DTYPE_F32, 2, 16, 4, NULL), ct_tensor_2d(CT_DTYPE_F32, 2, 17, NULL)};
    ct_layer *l = ct_lsh_self_attention(p);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_status st = ct_net_init(&net, l, in, 2, ct_key_from_seed(1), &dev, &err);
    CHECK_MSG(st != CT_OK && strstr(err.msg, "LSHSelfAttention") && strstr(err.msg, "mask"), "%s",
              st == CT_OK ? "accepted" : err.msg);
    if (st == CT_OK) ct_net_free(&net);
    else printf("mask (2, 17) for x (2, 16, 4): %s\n", err.msg);
    ct_layer_free(l);
}

// ---- masked: (x, mask) ----

// mask (Bn, Tn) = 1 but at the padding positions listed per example, each
// list ended by -1.
static void fill_mask(float *mask, int Bn, int Tn, const int *pad) {
    for (int i = 0; i < Bn * Tn; i++) mask[i] = 1.0f;
    for (int b = 0; b < Bn; b++, pad++)
        for (; *pad >= 0; pad++) mask[b * Tn + *pad] = 0.0f;
}

static void mask_to_i32(int32_t *dst, const float *mask, int n) {
    for (int i = 0; i < n; i++) dst[i] = mask[i] != 0.0f;
}

// Gradient checks with masked = true, buckets held fixed as above, on an
// int32 mask (the checker leaves non-f32 inputs alone). Padding sorts to
// the end of its round (the extra bucket); with T 8 and chunk 4 a padded
// row's window is its whole round, so every query keeps a real key (a
// query whose every score is near -1e9 has its dots rounded away).
static void test_masked_gradients(void) {
    float xd[B * T * D], mf[B * T];
    int32_t md[B * T];
    ct_tensor in[2] = {ct_tensor_3d(CT_DTYPE_F32, B, T, D, xd), ct_tensor_2d(CT_DTYPE_I32, B, T, md)};
    gradcheck_fill(&in[0], 21, -1.0f, 1.0f);
    fill_mask(mf, B, T, (const int[]){0, 1, -1, 6, 7, -1});  // padding at 0 and 1: masked, not as Trax
    mask_to_i32(md, mf, B * T);
    ct_lsh_self_attention_params p = lsh_params(2, 3, 4, false, 4, 1, 1, 2, 4, 0);
    p.masked = true;
    gradcheck_one("LSH(masked at 0 and 1, chunk 4, before 1, after 1, R 2, nb 4)", p, in, 2);
    p.n_hashes = 1;
    gradcheck_one("LSH(masked at 0 and 1, chunk 4, before 1, after 1, R 1, nb 4)", p, in, 2);
    fill_mask(mf, B, T, (const int[]){6, 7, -1, 3, 7, -1});  // causal: a padded query keeps earlier real keys
    mask_to_i32(md, mf, B * T);
    p = lsh_params(2, 3, 4, true, 4, 1, 0, 2, 2, 2);
    p.masked = true;
    gradcheck_one("LSH(masked, causal, chunk 4, before 1, R 2, nb {2, 2})", p, in, 2);
    p.attention_dropout = 0.2f, p.output_dropout = 0.3f;
    gradcheck_one("LSH(masked, causal, chunk 4, before 1, R 2, nb {2, 2}, dropout 0.2/0.3)", p, in, 2);
    p.n_hashes = 1;
    gradcheck_one("LSH(masked, causal, chunk 4, before 1, R 1, nb {2, 2}, dropout 0.2/0.3)", p, in, 2);
    // 3 heads over B = 2 rows: with n_heads = B (every case above) a
    // backward that takes head s's mask row as s / B, not s / H, reads the
    // same row and passed.
    fill_mask(mf, B, T, (const int[]){0, 1, -1, 6, 7, -1});
    mask_to_i32(md, mf, B * T);
    p = lsh_params(3, 3, 4, false, 4, 1, 1, 2, 4, 0);
    p.masked = true;
    gradcheck_one("LSH(masked at 0 and 1, 3 heads, chunk 4, before 1, after 1, R 2, nb 4)", p, in, 2);
}

// Output and input gradient of one training step on in (n_in inputs), on a
// fresh layer (the same init key, so the same weights and hash sequence).
static void masked_step(ct_lsh_self_attention_params p, const ct_tensor *in, int n_in, const ct_tensor *gy,
                        float *out, float *dx) {
    fixture_step(ct_lsh_self_attention(p), in, n_in, gy, true, out, dx);
}

// masked with an all-ones mask = unmasked (the extra bucket stays empty and
// the sort order is the same), an int32 mask = the same mask in f32:
// outputs and input gradients bitwise, training mode with both dropouts.
static void test_masked_all_ones_and_dtypes(void) {
    enum { Tn = 16, N = B * Tn * D };
    float xd[N], gd[N], ones[B * Tn], mf[B * Tn], out[3][N], dx[3][N];
    int32_t mi[B * Tn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, Tn, D, xd), gy = ct_tensor_3d(CT_DTYPE_F32, B, Tn, D, gd);
    gradcheck_fill(&x, 81, -1.0f, 1.0f);
    gradcheck_fill(&gy, 82, -1.0f, 1.0f);
    for (int i = 0; i < B * Tn; i++) ones[i] = 1.0f;
    fill_mask(mf, B, Tn, (const int[]){0, 1, 9, -1, 13, 14, 15, -1});
    mask_to_i32(mi, mf, B * Tn);
    ct_lsh_self_attention_params p = lsh_params(2, 4, 3, true, 4, 1, 0, 2, 4, 0);
    p.attention_dropout = 0.2f, p.output_dropout = 0.1f;
    masked_step(p, &x, 1, &gy, out[0], dx[0]);
    p.masked = true;
    ct_tensor in[2] = {x, ct_tensor_2d(CT_DTYPE_F32, B, Tn, ones)};
    masked_step(p, in, 2, &gy, out[1], dx[1]);
    bool same = memcmp(out[0], out[1], sizeof out[0]) == 0 && memcmp(dx[0], dx[1], sizeof dx[0]) == 0;
    printf("LSH masked with an all-ones mask vs unmasked: %s\n", same ? "bitwise equal" : "DIFFERS");
    CHECK(same);
    in[1] = ct_tensor_2d(CT_DTYPE_F32, B, Tn, mf);
    masked_step(p, in, 2, &gy, out[1], dx[1]);
    in[1] = ct_tensor_2d(CT_DTYPE_I32, B, Tn, mi);
    masked_step(p, in, 2, &gy, out[2], dx[2]);
    same = memcmp(out[1], out[2], sizeof out[1]) == 0 && memcmp(dx[1], dx[2], sizeof dx[1]) == 0;
    bool differs = memcmp(out[0], out[1], sizeof out[0]) != 0;
    printf("LSH int32 mask vs f32 mask: %s; vs unmasked: %s\n", same ? "bitwise equal" : "DIFFER",
           differs ? "differs" : "SAME");
    CHECK(same && differs);
}

// Trax's test_lsh_self_attention_masked_non_causal: H 5, dk 7, dv 17,
// non-causal, chunk 8, before 1, R 2, nb 4, B 5, T 32, D 8, x ~ U(0, 1),
// each example padded from a start in [1, 31). New x in the padding (same
// state before each run, so the same rotations) keeps the real positions'
// outputs (to 1e-6) and changes the padded ones (mean |diff| > 1e-5). Then
// with padding at positions 0 and 1 as well, which Trax's kv_info =
// position x (-1) + 1 leaves unmasked; and causal.
static void check_padding_ignored(bool causal, bool prefix) {
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
    if (prefix) mask[2] = mask[3] = 1.0f;  // keep real tokens in example 0
    for (int i = 0; i < N; i++)  // x2: x1 with new values at the padding
        if (mask[i / Dn] != 0.0f) x2[i] = x1[i];
    ct_lsh_self_attention_params p = lsh_params(5, 7, 17, causal, 8, 1, 0, 2, 4, 0);
    p.masked = true;
    ct_layer *l = ct_lsh_self_attention(p);
    fixture r;
    if (fixture_init_ok(&r, l, in, 2, false)) {
        float *state0 = malloc(r.net.n_state * sizeof(float));
        memcpy(state0, r.net.state, r.net.n_state * sizeof(float));
        run_forward(&r, in, ct_key_from_seed(1), y1);
        memcpy(r.net.state, state0, r.net.n_state * sizeof(float));
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
        printf("LSH(masked%s, %s): new x in the padding: real outputs max |diff| %.3e, padded mean |diff| %.3e\n",
               prefix ? ", padding at 0 and 1 too" : "", causal ? "causal" : "non-causal", real_max, pad_mean);
        CHECK_MSG(real_max <= 1e-6 && pad_mean > 1e-5, "real %g, padded %g", real_max, pad_mean);
        free(state0);
        fixture_free(&r);
    }
    ct_layer_free(l);
    free(x1), free(x2), free(y1), free(y2);
}

static void test_masked_padding_ignored(void) {
    check_padding_ignored(false, false);
    check_padding_ignored(false, true);
    check_padding_ignored(true, true);
}

// max_length_for_buckets Lb: the buckets state is (B H, R Lb) whatever
// init's T; a T up to Lb runs (a shorter one on its prefix, zero past R T)
// and gives what a layer sized by that T gives; a longer T fails, at init or
// forward, naming T and max_length_for_buckets.
// A training forward at x_long's T on a layer initialized on x16 (the
// state sized by its T 16) is refused, naming that T and `bound`.
static void longer_refused(ct_lsh_self_attention_params p, const ct_tensor *x16, const ct_tensor *x_long,
                           const char *bound) {
    ct_layer *l = ct_lsh_self_attention(p);
    fixture r;
    if (fixture_init_ok(&r, l, x16, 1, true)) {
        ct_tensor out[1];
        char t_is[32];
        snprintf(t_is, sizeof t_is, "T=%lld", (long long)x_long->shape[1]);
        ct_status st = ct_layer_forward(r.net.root, &r.ctx, x_long, out, ct_key_from_seed(2), &r.err);
        printf("%s on a layer sized by T 16: %s\n", t_is, st == CT_OK ? "(accepted)" : r.err.msg);
        CHECK_MSG(st != CT_OK && strstr(r.err.msg, t_is) && strstr(r.err.msg, bound), "%s",
                  st == CT_OK ? "accepted" : r.err.msg);
        ct_arena_reset(&r.arena);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// A (b, h)'s n_hashes x T rows are sorted with 32-bit indices: an eval
// forward (any T) of 2 x 2^30 rows is refused before it reads its input (the
// data pointer points at a small buffer) or allocates anything.
static void test_rows_past_int32(void) {
    enum { Dn = 4 };
    float xd[16 * Dn];
    ct_tensor x16 = uniform(ct_tensor_3d(CT_DTYPE_F32, 1, 16, Dn, xd), 104, -1.0f, 1.0f);
    ct_layer *l = ct_lsh_self_attention(lsh_params(2, 4, 4, true, 4, 1, 0, 2, 4, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x16, 1, false)) {
        ct_tensor big = ct_tensor_3d(CT_DTYPE_F32, 1, (int64_t)1 << 30, Dn, xd), out[1];
        ct_status st = fixture_forward(&r, &big, out, 1);
        printf("eval forward of n_hashes 2 x T 2^30: %s\n", st == CT_OK ? "(accepted)" : r.err.msg);
        CHECK_MSG(st == CT_ERR_SHAPE && strstr(r.err.msg, "over 2^31 - 1 rows"), "%s",
                  st == CT_OK ? "accepted" : r.err.msg);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

static void test_max_length_for_buckets(void) {
    enum { Bn = 2, H = 2, R = 2, Dn = 4, Lb = 32 };
    float x16d[Bn * 16 * Dn], x32d[Bn * 32 * Dn], x48d[Bn * 48 * Dn], a[Bn * 16 * Dn], b[Bn * 16 * Dn];
    ct_tensor x16 = ct_tensor_3d(CT_DTYPE_F32, Bn, 16, Dn, x16d), x32 = ct_tensor_3d(CT_DTYPE_F32, Bn, 32, Dn, x32d);
    ct_tensor x48 = ct_tensor_3d(CT_DTYPE_F32, Bn, 48, Dn, x48d);
    gradcheck_fill(&x16, 101, -1.0f, 1.0f);
    gradcheck_fill(&x32, 102, -1.0f, 1.0f);
    gradcheck_fill(&x48, 103, -1.0f, 1.0f);
    ct_lsh_self_attention_params p = lsh_params(H, 4, 4, true, 4, 1, 0, R, 4, 0);
    p.max_length_for_buckets = Lb;
    ct_layer *l = ct_lsh_self_attention(p), *l0 = ct_lsh_self_attention(lsh_params(H, 4, 4, true, 4, 1, 0, R, 4, 0));
    fixture r, r0;
    // Training forwards: they keep their buckets in the state.
    if (fixture_init_ok(&r, l, &x16, 1, true)) {
        const ct_param *bp = NULL;
        for (int i = 0; i < r.net.n_state_params; i++)
            if (strcmp(r.net.state_params[i]->name, "buckets") == 0) bp = r.net.state_params[i];
        CHECK(bp && bp->sig.shape[0] == Bn * H && bp->sig.shape[1] == R * Lb);
        printf("max_length_for_buckets %d, init T 16: buckets state (%lld, %lld)\n", Lb,
               bp ? (long long)bp->sig.shape[0] : -1, bp ? (long long)bp->sig.shape[1] : -1);
        float *sb = state_of(&r.net, "buckets"), *y32 = malloc(sizeof x32d);
        run_forward(&r, &x32, ct_key_from_seed(1), y32);  // T = Lb, over init's T
        free(y32);
        if (fixture_init_ok(&r0, l0, &x16, 1, true)) {
            // The same count of hashes on both: the layer sized by T 16 hashes
            // once first (under another key, or the second would reuse it).
            run_forward(&r0, &x16, ct_key_from_seed(5), b);
            run_forward(&r, &x16, ct_key_from_seed(1), a);
            run_forward(&r0, &x16, ct_key_from_seed(1), b);
            int nonzero_tail = 0;
            for (int s = 0; s < Bn * H; s++)
                for (int i = R * 16; i < R * Lb; i++) nonzero_tail += sb[s * R * Lb + i] != 0.0f;
            bool same = memcmp(a, b, sizeof a) == 0;
            printf("T 16 under max_length_for_buckets %d vs a layer sized by T 16: %s; %d stored buckets past R T\n",
                   Lb, same ? "bitwise equal" : "DIFFERS", nonzero_tail);
            CHECK(same && nonzero_tail == 0);
            // The same key again reuses them: the tag holds T 16, not Lb
            // (else every recompute of a T below Lb would hash anew).
            const float *hs = state_of(&r.net, "hash");
            float count = hs[4];
            run_forward(&r, &x16, ct_key_from_seed(1), b);
            same = memcmp(a, b, sizeof a) == 0;
            printf("T 16 again under its key: %s, count %g -> %g\n", same ? "bitwise equal" : "DIFFERS",
                   (double)count, (double)hs[4]);
            CHECK(same && hs[4] == count);
            fixture_free(&r0);
        }
        ct_tensor out[1];
        r.ctx.record = false;
        r.ctx.train = true;  // a training forward keeps its buckets in the state (an eval takes any T)
        ct_status st = ct_layer_forward(r.net.root, &r.ctx, &x48, out, ct_key_from_seed(2), &r.err);
        printf("T 48: %s\n", st == CT_OK ? "(accepted)" : r.err.msg);
        CHECK_MSG(st != CT_OK && strstr(r.err.msg, "LSHSelfAttention") && strstr(r.err.msg, "T=48") &&
                      strstr(r.err.msg, "max_length_for_buckets 32"),
                  "%s", st == CT_OK ? "accepted" : r.err.msg);
        ct_arena_reset(&r.arena);
        fixture_free(&r);
    }
    ct_layer_free(l);
    ct_layer_free(l0);
    // Without it the state is sized by init's T: a longer T fails. One
    // over (chunk 1: T 17 passes every other check): the state's rows hold
    // R 16 buckets, so T 17 must be refused, not hashed one bucket past
    // each row.
    longer_refused(lsh_params(H, 4, 4, true, 4, 1, 0, R, 4, 0), &x16, &x32, "max_length_for_buckets 0");
    float x17d[Bn * 17 * Dn] = {0};
    ct_tensor x17 = ct_tensor_3d(CT_DTYPE_F32, Bn, 17, Dn, x17d);
    longer_refused(lsh_params(H, 4, 4, true, 1, 1, 0, R, 4, 0), &x16, &x17, "init's T=16");
}

// An eval forward takes any B and T (REFORMER.md section 7: Trax's state
// sized at init fails on other shapes, its issue 1664): it hashes into its
// own memory, so a layer initialized for (2, 16) gives, on (3, 32), what a
// layer initialized for (3, 32) gives, bitwise, and leaves the stored
// buckets as they were. A training forward of another B is refused, naming
// init's B.
static void test_eval_any_shape(void) {
    enum { H = 2, R = 2, Dn = 4 };
    float x16d[2 * 16 * Dn], x32d[3 * 32 * Dn], a[3 * 32 * Dn], b[3 * 32 * Dn];
    ct_tensor x16 = ct_tensor_3d(CT_DTYPE_F32, 2, 16, Dn, x16d), x32 = ct_tensor_3d(CT_DTYPE_F32, 3, 32, Dn, x32d);
    gradcheck_fill(&x16, 201, -1.0f, 1.0f);
    gradcheck_fill(&x32, 202, -1.0f, 1.0f);
    ct_lsh_self_attention_params p = lsh_params(H, 4, 4, true, 4, 1, 0, R, 4, 0);
    ct_layer *small = ct_lsh_self_attention(p), *big = ct_lsh_self_attention(p);
    fixture rs, rb;
    if (fixture_init_ok(&rs, small, &x16, 1, false)) {
        if (fixture_init_ok(&rb, big, &x32, 1, false)) {
            const float *sb = state_of(&rs.net, "buckets");
            size_t n_sb = (size_t)2 * H * R * 16;
            float *before = malloc(n_sb * sizeof *before);
            memcpy(before, sb, n_sb * sizeof *before);
            run_forward(&rs, &x32, ct_key_from_seed(3), a);
            run_forward(&rb, &x32, ct_key_from_seed(3), b);
            bool same = memcmp(a, b, sizeof a) == 0, kept = memcmp(before, sb, n_sb * sizeof *before) == 0;
            printf("eval (3, 32) on a layer initialized for (2, 16): %s a layer initialized for (3, 32); stored "
                   "buckets %s\n",
                   same ? "bitwise equal to" : "DIFFERS from", kept ? "unchanged" : "CHANGED");
            CHECK(same && kept);
            free(before);
            fixture_free(&rb);
        }
        ct_tensor out[1];
        rs.ctx.record = false;
        rs.ctx.train = true;
        ct_status st = ct_layer_forward(rs.net.root, &rs.ctx, &x32, out, ct_key_from_seed(4), &rs.err);
        printf("training (3, 32) on a layer initialized for (2, 16): %s\n", st == CT_OK ? "(accepted)" : rs.err.msg);
        CHECK_MSG(st != CT_OK && strstr(rs.err.msg, "sized for init's B 2"), "%s", st == CT_OK ? "accepted" : rs.err.msg);
        ct_arena_reset(&rs.arena);
        fixture_free(&rs);
    }
    ct_layer_free(small);
    ct_layer_free(big);
    // The window bound holds for the length of each forward, not only
    // init's: before 16 over init's 16 chunks (2 x 32 / 4) passes, but an
    // eval on T 8 has 4 chunks, and 17 of them would only repeat them.
    p.n_chunks_before = 16;
    ct_layer *wide = ct_lsh_self_attention(p);
    float x8d[2 * 8 * Dn];
    ct_tensor x8 = ct_tensor_3d(CT_DTYPE_F32, 2, 8, Dn, x8d), out[1];
    gradcheck_fill(&x8, 203, -1.0f, 1.0f);
    fixture rw;
    if (fixture_init_ok(&rw, wide, &x32, 1, false)) {
        ct_status st = ct_layer_forward(rw.net.root, &rw.ctx, &x8, out, ct_key_from_seed(5), &rw.err);
        printf("before 16, eval on T 8 (4 chunks) after init on T 32: %s\n", st == CT_OK ? "(accepted)" : rw.err.msg);
        CHECK_MSG(st != CT_OK && strstr(rw.err.msg, "n_chunks_before 16") &&
                      strstr(rw.err.msg, "over twice the 4 of the input"),
                  "%s", st == CT_OK ? "accepted" : rw.err.msg);
        fixture_free(&rw);
    }
    ct_layer_free(wide);
}

// Hashing edge cases, on the stored buckets of a training forward:
// a zero query (x = 0 at a position) rotates to all zeros, a tie across the
// whole concat(z, -z), which Trax's argmax gives to the first index: bucket
// 0 of every round (r NB). And nb from T with floor(nb / f1) odd: T 144,
// chunk_len 2, nb 144 > 128 factors as Trax's [16, 2 (144 / 32)] = [16, 8]
// (NB 128), not [16, 9].
static void test_hash_edge_cases(void) {
    enum { Bn = 2, Tn = 8, Dn = 4, H = 2, R = 2, NB = 4 };
    float xd[Bn * Tn * Dn], y[Bn * Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 301, -1.0f, 1.0f);
    const int zero_t[3] = {0, 3, 7};  // example 1's zero positions
    for (int k = 0; k < 3; k++) memset(xd + (Tn + zero_t[k]) * Dn, 0, Dn * sizeof(float));
    ct_layer *l = ct_lsh_self_attention(lsh_params(H, 4, 4, true, 4, 1, 0, R, NB, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        run_forward(&r, &x, ct_key_from_seed(1), y);
        const float *bk = state_of(&r.net, "buckets");
        int bad = 0, nonzero_elsewhere = 0;
        for (int h = 0; h < H; h++)
            for (int rr = 0; rr < R; rr++) {
                for (int k = 0; k < 3; k++) bad += bk[(1 * H + h) * R * Tn + rr * Tn + zero_t[k]] != (float)(rr * NB);
                for (int t = 0; t < Tn; t++) nonzero_elsewhere += bk[(0 * H + h) * R * Tn + rr * Tn + t] != rr * NB;
            }
        printf("zero queries: %d of %d not in bucket r NB (first index of a tie); other rows off it: %d\n", bad,
               H * R * 3, nonzero_elsewhere);
        CHECK(bad == 0 && nonzero_elsewhere > 0);
        fixture_free(&r);
    }
    ct_layer_free(l);

    enum { Tb = 144 };
    float *xb = malloc(sizeof(float) * Tb * Dn), *yb = malloc(sizeof(float) * Tb * Dn);
    ct_tensor x144 = ct_tensor_3d(CT_DTYPE_F32, 1, Tb, Dn, xb);
    gradcheck_fill(&x144, 302, -1.0f, 1.0f);
    l = ct_lsh_self_attention(lsh_params(1, 4, 4, true, 2, 1, 0, 1, 0, 0));
    if (fixture_init_ok(&r, l, &x144, 1, true)) {
        run_forward(&r, &x144, ct_key_from_seed(1), yb);
        const float *bk = state_of(&r.net, "buckets");
        float top = 0;
        for (int t = 0; t < Tb; t++) top = bk[t] > top ? bk[t] : top;
        printf("nb from T 144, chunk_len 2 (nb 144 -> [16, 8]): largest bucket %g\n", (double)top);
        CHECK(top < 128.0f && top >= 64.0f);
        fixture_free(&r);
    }
    ct_layer_free(l);
    free(xb), free(yb);
}

// The defaults are Trax's (REFORMER.md section 2): lsh_params sets the
// sizes itself, so a wrong default would pass the tests above.
static void test_defaults(void) {
    ct_lsh_self_attention_params p = ct_lsh_self_attention_default_params();
    printf("defaults: n_heads %d, d_qk %d, d_v %d, chunk_len %d, before %d, after %d, n_hashes %d\n", p.n_heads,
           p.d_qk, p.d_v, p.chunk_len, p.n_chunks_before, p.n_chunks_after, p.n_hashes);
    CHECK(p.n_heads == 2 && p.d_qk == 64 && p.d_v == 64 && !p.causal && !p.masked);
    CHECK(p.chunk_len == 128 && p.n_chunks_before == 1 && p.n_chunks_after == 0 && p.n_hashes == 1);
    for (int j = 0; j < CT_LSH_MAX_BUCKET_FACTORS; j++) CHECK(p.n_buckets[j] == 0);
    CHECK(p.attention_dropout == 0.0f && p.output_dropout == 0.0f && p.max_length_for_buckets == 0);
}

// A layer that joins a new net takes that net's D (layer_fixture.h).
static void test_new_net_new_d(void) {
    float xd[B * T * D];
    ct_layer *l = ct_lsh_self_attention(lsh_params(2, 4, 4, true, 4, 1, 0, 1, 2, 0));
    check_new_net_new_d(l, B, T, D, xd, true);
    ct_layer_free(l);
}

// nb from the length at the edge of Trax's factoring (nb > 128 factors):
// T 128, chunk_len 2 gives nb 128, hashed as one factor {128}; T 130 gives
// nb 130, factored [16, 2 (130 / 32)] = [16, 8]. Each stores the buckets of
// the layer given those n_buckets, on the same keys.
static void test_nb_from_length_edge(void) {
    enum { Dn = 4 };
    const int cases[2][3] = {{128, 128, 0}, {130, 16, 8}};  // T, nb0, nb1
    for (int c = 0; c < 2; c++) {
        const int Tn = cases[c][0];
        float *xd = malloc(sizeof(float) * Tn * Dn), *y = malloc(sizeof(float) * Tn * Dn);
        float *first = malloc(sizeof(float) * Tn);
        ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 1, Tn, Dn, xd);
        gradcheck_fill(&x, 303, -1.0f, 1.0f);
        int bad = -1;
        for (int k = 0; k < 2; k++) {
            ct_lsh_self_attention_params p = lsh_params(1, 4, 4, true, 2, 1, 0, 1, 0, 0);
            if (k == 1) p.n_buckets[0] = cases[c][1], p.n_buckets[1] = cases[c][2];
            ct_layer *l = ct_lsh_self_attention(p);
            fixture r;
            if (fixture_init_ok(&r, l, &x, 1, true)) {
                run_forward(&r, &x, ct_key_from_seed(1), y);
                const float *bk = state_of(&r.net, "buckets");
                if (k == 0) memcpy(first, bk, sizeof(float) * Tn);
                else
                    for (int t = bad = 0; t < Tn; t++) bad += bk[t] != first[t];
                fixture_free(&r);
            }
            ct_layer_free(l);
        }
        printf("nb from T %d, chunk_len 2: %d of %d buckets differ from n_buckets {%d, %d}\n", Tn, bad, Tn,
               cases[c][1], cases[c][2]);
        CHECK(bad == 0);
        free(xd), free(y), free(first);
    }
}

// ct_lsh_hash with a factor of 128 buckets (64 rotation columns, over one
// block of 32 dots) against a plain first-index argmax over concat(z, -z),
// z summed in double over i as the kernel does. In round 0 columns 5 and 40
// are equal and the lowest (q > 0, columns -10): a tie in -z, the first
// (h + 5) wins; round 1's columns 7 and 50 equal and highest: 7 wins. Then
// without the ties, some argmax past column 32.
static void hash_reference(int *bad, int *arg_of, const float *buckets, const float *q, const float *rot, int Tn,
                           int dk, int R, int NR) {
    for (int r = 0; r < R; r++)
        for (int t = 0; t < Tn; t++) {
            float best = -INFINITY;
            int arg = 0;
            for (int c = 0; c < 2 * NR; c++) {
                double z = 0;
                for (int i = 0; i < dk; i++) z += (double)q[t * dk + i] * rot[(i * R + r) * NR + c % NR];
                float zv = c < NR ? (float)z : -(float)z;
                if (zv > best) best = zv, arg = c;
            }
            *bad += buckets[r * Tn + t] != (float)(arg + r * 2 * NR);
            arg_of[r * Tn + t] = arg;
        }
}

static void test_hash_wide_factor(void) {
    enum { Tn = 16, dk = 4, R = 2, NR = 64 };
    const int f[1] = {128};
    float q[Tn * dk], rot[dk * R * NR], buckets[R * Tn];
    int arg[R * Tn], bad = 0, tie_n = 0, tie_p = 0, spread = 0;
    for (int i = 0; i < Tn * dk; i++) q[i] = 0.1f + 0.9f * (float)fabs(sin(0.7 * i + 0.3));
    for (int i = 0; i < dk * R * NR; i++) rot[i] = (float)sin(1.3 * i + 0.5);
    for (int i = 0; i < dk; i++) {
        rot[(i * R + 0) * NR + 5] = rot[(i * R + 0) * NR + 40] = -10.0f;
        rot[(i * R + 1) * NR + 7] = rot[(i * R + 1) * NR + 50] = 10.0f;
    }
    ct_lsh_hash(buckets, q, NULL, rot, Tn, dk, R, f, 1);
    hash_reference(&bad, arg, buckets, q, rot, Tn, dk, R, NR);
    for (int t = 0; t < Tn; t++) tie_n += arg[t] == NR + 5, tie_p += arg[Tn + t] == 7;
    for (int i = 0; i < dk; i++) {
        rot[(i * R + 0) * NR + 5] = rot[(i * R + 0) * NR + 40] = 0.0f;
        rot[(i * R + 1) * NR + 7] = rot[(i * R + 1) * NR + 50] = 0.0f;
    }
    ct_lsh_hash(buckets, q, NULL, rot, Tn, dk, R, f, 1);
    hash_reference(&bad, arg, buckets, q, rot, Tn, dk, R, NR);
    for (int i = 0; i < R * Tn; i++) spread += arg[i] % NR >= 32;
    printf("hash, factor 128: %d of %d off the plain argmax; ties to the first %d, %d of %d; past column 32 %d\n",
           bad, 2 * R * Tn, tie_n, tie_p, Tn, spread);
    CHECK(bad == 0 && tie_n == Tn && tie_p == Tn && spread > 0);
}

// nb from the length with one chunk (T = chunk_len 8): 2 max(1, T / m) = 2,
// so each round's buckets are r 2 and r 2 + 1.
static void test_one_chunk_two_buckets(void) {
    enum { Bn = 2, Tn = 8, Dn = 4, H = 2, R = 2 };
    float xd[Bn * Tn * Dn], y[Bn * Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 303, -1.0f, 1.0f);
    ct_layer *l = ct_lsh_self_attention(lsh_params(H, 4, 4, true, 8, 1, 0, R, 0, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        run_forward(&r, &x, ct_key_from_seed(1), y);
        const float *bk = state_of(&r.net, "buckets");
        int bad = 0, used[2 * R] = {0};
        for (int s = 0; s < Bn * H; s++)
            for (int i = 0; i < R * Tn; i++) {
                float b = bk[s * R * Tn + i];
                int rr = i / Tn;
                if (b != floorf(b) || b < rr * 2 || b >= rr * 2 + 2) bad++;
                else used[(int)b] = 1;
            }
        printf("one chunk, nb from T: %d buckets outside r 2 + {0, 1}; used %d %d %d %d\n", bad, used[0], used[1],
               used[2], used[3]);
        CHECK(bad == 0 && used[0] + used[1] + used[2] + used[3] == 4);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// The rotations' keys as lsh_attention.h documents them: the first
// hashing's state key is k0 = split(layer key, 4); each hashing draws
// (b, h)'s rotations from split(split(k, 1), b H + h) and stores split(k,
// 0) for the next. Two training forwards under two step keys store, bitwise,
// what ct_lsh_hash gives on q = x Wq[h] with rotations from k0 and then
// split(k0, 0); the state then holds split(split(k0, 0), 0), count 2. The
// other tests compare the layer with itself, so a wrong or never-advancing
// hash key passed them.
static void test_hash_key_sequence(void) {
    enum { Bn = 2, Tn = 8, Dn = 4, H = 2, R = 2, dk = 4, nb = 8, n_rot = nb / 2 };
    float xd[Bn * Tn * Dn], y[Bn * Tn * Dn], q[Bn * H * Tn * dk], rot[dk * R * n_rot], want[R * Tn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 77, -1.0f, 1.0f);
    ct_layer *l = ct_lsh_self_attention(lsh_params(H, dk, 4, true, 4, 1, 0, R, nb, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        const ct_param *wq = ct_net_find_param(&r.net, "LSHSelfAttention/Wq[0]");
        CHECK(wq != NULL);
        // Wq[0..H) are declared one after another: (H, D, dk), as the layer reads them.
        if (wq) ct_heads_project_forward(q, xd, r.net.weights + wq->offset, NULL, Bn, Tn, Dn, H, dk);
        const float *bk = state_of(&r.net, "buckets"), *hs = state_of(&r.net, "hash");
        ct_key k = ct_key_split(ct_key_from_seed(3), 4);  // the fixture's layer key is the net's, seed 3
        int bad[2] = {0, 0};
        for (int step = 0; step < 2; step++) {
            run_forward(&r, &x, ct_key_from_seed(10 + (uint64_t)step), y);
            for (int s = 0; s < Bn * H; s++) {
                ct_random_normal(ct_key_split(ct_key_split(k, 1), (uint32_t)s), rot, sizeof rot / sizeof *rot, 1.0f);
                ct_lsh_hash(want, q + s * Tn * dk, NULL, rot, Tn, dk, R, (const int[]){nb}, 1);
                bad[step] += memcmp(want, bk + s * R * Tn, sizeof want) != 0;
            }
            k = ct_key_split(k, 0);
        }
        uint32_t w0 = (uint32_t)hs[0] | (uint32_t)hs[1] << 16, w1 = (uint32_t)hs[2] | (uint32_t)hs[3] << 16;
        printf("hash keys: %d and %d of %d (b, h) off the documented rotations; state key %s, count %g\n", bad[0],
               bad[1], Bn * H, w0 == k.w[0] && w1 == k.w[1] ? "split(split(k0, 0), 0)" : "ELSEWHERE", (double)hs[4]);
        CHECK(bad[0] == 0 && bad[1] == 0 && w0 == k.w[0] && w1 == k.w[1] && hs[4] == 2.0f);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// One sort case: round r's position t takes bucket r NB + val[(5 t + 3 r)
// % 8] (val increasing, under NB); the forward must give, bitwise, what the
// same buckets renumbered r 8 + 0..7 give (one radix pass), as only their
// order reaches the attention. Causal, chunk m, one chunk before. Prints
// and returns whether they match.
static bool sort_case_same(const char *label, int Tn, int R, int m, int64_t NB, const int64_t val[8]) {
    enum { dk = 4, dv = 4, nb = 8 };
    const size_t L = (size_t)R * Tn;
    float *q = malloc(sizeof(float) * Tn * dk), *v = malloc(sizeof(float) * Tn * dv);
    float *small = malloc(sizeof(float) * L), *big = malloc(sizeof(float) * L);
    float *o1 = malloc(sizeof(float) * L * dv), *o2 = malloc(sizeof(float) * L * dv);
    float *l1 = malloc(sizeof(float) * L), *l2 = malloc(sizeof(float) * L);
    ct_tensor tq = ct_tensor_2d(CT_DTYPE_F32, Tn, dk, q), tv = ct_tensor_2d(CT_DTYPE_F32, Tn, dv, v);
    gradcheck_fill(&tq, 91, -1.0f, 1.0f);
    gradcheck_fill(&tv, 92, -1.0f, 1.0f);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < Tn; t++) {
            const int b = (t * 5 + r * 3) % nb;
            small[r * Tn + t] = (float)(r * nb + b);
            big[r * Tn + t] = (float)(r * NB + val[b]);  // exact: R NB <= 2^24
        }
    ct_lsh_dims d = {.T = Tn, .dk = dk, .dv = dv, .R = R, .NB = nb, .m = m, .before = 1, .causal = true};
    float *work = malloc((size_t)ct_lsh_work_floats(&d, false) * sizeof(float));  // NB does not size it
    ct_lsh_forward(o1, l1, q, v, NULL, small, work, ct_key_from_seed(1), &d);
    d.NB = NB;
    ct_lsh_forward(o2, l2, q, v, NULL, big, work, ct_key_from_seed(1), &d);
    bool same = memcmp(o1, o2, sizeof(float) * L * dv) == 0 && memcmp(l1, l2, sizeof(float) * L) == 0;
    printf("sort, %s: %s the buckets renumbered 0..7 (1 pass)\n", label, same ? "bitwise equal to" : "DIFFERS from");
    free(q), free(v), free(small), free(big), free(o1), free(o2), free(l1), free(l2), free(work);
    return same;
}

// The sort's radix passes (11 bits each, as many as R NB needs): buckets
// spread over 2^23 (three passes, every digit used); R NB = 2^11 + 1, whose
// bucket 2^11 alone needs a second pass, with digit 2047 (the histogram's
// last) and buckets that differ only in bit 11; R NB = 2^22 + 1, whose
// bucket 2^22 alone needs a third; R NB = 2^24 - 2 over odd T, round 1's
// top bucket 2^24 - 3 (bits 0..23 each set in some bucket).
static void test_sort_passes(void) {
    const int64_t P22 = (int64_t)1 << 22, stride = P22 / 8;
    int64_t spread[8];
    for (int b = 0; b < 8; b++) spread[b] = b * stride + 3 * b;
    CHECK(sort_case_same("R 2, NB 2^22, buckets over 2^23 (3 passes)", 64, 2, 8, P22, spread));
    CHECK(sort_case_same("R 1, NB 2^11 + 1, buckets 0..2^11 (2 passes)", 45, 1, 9, 2049,
                         (const int64_t[8]){0, 5, 1023, 1024, 2045, 2046, 2047, 2048}));
    CHECK(sort_case_same("R 1, NB 2^22 + 1, buckets 1..2^22 (3 passes)", 45, 1, 9, P22 + 1,
                         (const int64_t[8]){1, 2047, 2048, 2049, P22 / 2, P22 - 2048, P22 - 1, P22}));
    CHECK(sort_case_same("R 2, NB 2^23 - 1, odd T 45 (3 passes)", 45, 2, 9, 2 * P22 - 1,
                         (const int64_t[8]){0, 2047, 2048, P22 - 1, P22, 2 * P22 - 2049, 2 * P22 - 3, 2 * P22 - 2}));
}

// What a training forward keeps for backward: its output and the tape (q,
// v, o, lse_r, buckets; x is the caller's), and not the rounds' outputs
// o_r (B,H,R,T,dv), which backward does not need. Every size here is a
// multiple of the arena's 64-byte alignment, so the bytes add up exactly.
static void test_tape_bytes(void) {
    enum { Bn = 2, Tn = 16, Dn = 8, H = 2, dk = 4, dv = 4, R = 2 };
    float xd[Bn * Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 5, -1.0f, 1.0f);
    ct_layer *l = ct_lsh_self_attention(lsh_params(H, dk, dv, true, 4, 1, 0, R, 4, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        ct_arena_mark before = ct_arena_get_mark(&r.arena);
        ct_tensor out[1];
        CHECK_OK(fixture_forward(&r, &x, out, 1), &r.err);
        size_t kept = ct_arena_get_mark(&r.arena).used - before.used;
        const size_t f = sizeof(float), y = (size_t)Bn * Tn * Dn * f, qvo = 3 * (size_t)Bn * H * Tn * dk * f,
                     rounds = 2 * (size_t)Bn * H * R * Tn * f, o_r = (size_t)Bn * H * R * Tn * dv * f;
        printf("training forward keeps %zu bytes: output %zu + q, v, o %zu + lse_r, buckets %zu (o_r would add %zu)\n",
               kept, y, qvo, rounds, o_r);
        CHECK(kept == y + qvo + rounds);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// Data parallelism: a replica holding example 1 of a batch of 2 (ctx
// first_row 1) draws example 1's rotations, so its buckets and output are
// the whole batch's for that example; numbered from 0 they differ.
static void test_first_row_rotations(void) {
    enum { Bn = 2, Tn = 8, Dn = 4, H = 2, R = 2 };
    float xd[Bn * Tn * Dn], y[Bn * Tn * Dn], y1[Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd), x1 = ct_tensor_3d(CT_DTYPE_F32, 1, Tn, Dn, xd + Tn * Dn);
    gradcheck_fill(&x, 304, -1.0f, 1.0f);
    ct_layer *la = ct_lsh_self_attention(lsh_params(H, 4, 4, true, 4, 1, 0, R, 8, 0));
    ct_layer *lb = ct_lsh_self_attention(lsh_params(H, 4, 4, true, 4, 1, 0, R, 8, 0));
    fixture a, b;
    if (fixture_init_ok(&a, la, &x, 1, true)) {
        run_forward(&a, &x, ct_key_from_seed(5), y);
        const float *bka = state_of(&a.net, "buckets") + 1 * H * R * Tn;
        int diff[2] = {0, 0};
        bool out_same[2] = {false, false};
        for (int first = 0; first < 2; first++)
            if (fixture_init_ok(&b, lb, &x1, 1, true)) {
                b.ctx.first_row = first;
                run_forward(&b, &x1, ct_key_from_seed(5), y1);
                const float *bkb = state_of(&b.net, "buckets");
                for (int i = 0; i < H * R * Tn; i++) diff[first] += bka[i] != bkb[i];
                out_same[first] = memcmp(y + Tn * Dn, y1, sizeof y1) == 0;
                fixture_free(&b);
            }
        printf("example 1 alone: buckets off the batch's %d (first_row 1), %d (first_row 0); output %s\n", diff[1],
               diff[0], out_same[1] ? "bitwise equal" : "DIFFERS");
        CHECK(diff[1] == 0 && out_same[1] && diff[0] > 0);
        fixture_free(&a);
    }
    ct_layer_free(la);
    ct_layer_free(lb);
}

// Init as lsh_attention.h says (Trax's _kernel_initializer): head h's Wq,
// Wv, Wo from split(split(layer key, h), 0 / 2 / 3), each U(+-sqrt(6 / (D
// + d H))), d = d_qk for Wq, d_v for Wv and Wo. The fixture's layer key is
// the net's, seed 3.
static void test_init_weights(void) {
    enum { Tn = 8, Dn = 6, H = 3, dk = 4, dv = 5 };
    float xd[Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 1, Tn, Dn, xd);
    gradcheck_fill(&x, 9, -1.0f, 1.0f);
    ct_layer *l = ct_lsh_self_attention(lsh_params(H, dk, dv, false, 4, 1, 0, 1, 2, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        const head_weight w[3] = {{"Wq", Dn * dk, dk, 0}, {"Wv", Dn * dv, dv, 2}, {"Wo", dv * Dn, dv, 3}};
        int bad = head_init_mismatches(&r.net, "LSHSelfAttention", w, 3, H, Dn, 3);
        printf("init: %d of %d weights differ from U(+-sqrt(6 / (D + d H))) on their documented keys\n", bad, 3 * H);
        CHECK(bad == 0);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// Outside training both dropouts are off (Trax sets them to 0 when mode is
// not 'train'): an eval forward of a layer with attention_dropout and
// output_dropout 0.5 equals, bitwise, the same layer's without them (the
// same init key: the same weights and the same first rotations).
static void test_eval_no_dropout(void) {
    enum { Bn = 2, Tn = 16, Dn = 6 };
    float xd[Bn * Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 12, -1.0f, 1.0f);
    ct_lsh_self_attention_params p = lsh_params(2, 4, 4, true, 4, 1, 0, 2, 4, 0);
    ct_layer *plain = ct_lsh_self_attention(p);
    p.attention_dropout = 0.5f, p.output_dropout = 0.5f;
    ct_layer *dropped = ct_lsh_self_attention(p);
    CHECK(eval_equal_without_dropout(plain, dropped, &x, sizeof xd / sizeof *xd));
}

// An eval forward hashes into its own memory and leaves the stored buckets
// and their tag alone: a training forward afterwards under the eval's key
// hashes anew (count 3) instead of taking buckets hashed under another key
// for its own.
static void test_eval_leaves_tag(void) {
    enum { Bn = 2, Tn = 16, Dn = 4 };
    float xd[Bn * Tn * Dn], y[Bn * Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 13, -1.0f, 1.0f);
    ct_layer *l = ct_lsh_self_attention(lsh_params(2, 4, 4, true, 4, 1, 0, 2, 4, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, true)) {
        const float *hs = state_of(&r.net, "hash");
        run_forward(&r, &x, ct_key_from_seed(1), y);
        ct_net_bind(&r.net, &r.ctx, false);
        run_forward(&r, &x, ct_key_from_seed(2), y);
        ct_net_bind(&r.net, &r.ctx, true);
        run_forward(&r, &x, ct_key_from_seed(2), y);
        printf("count after train (key 1), eval (key 2), train (key 2): %g\n", (double)hs[4]);
        CHECK(hs[4] == 3.0f);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// The self mask is -1e5 (Trax's), large against any real score: with x
// scaled so that |q| is ~1e4, a query's score with itself (|q|, as its key
// is q / rms(q) / sqrt(d_qk)) still loses to every other key's. One chunk
// of all T rows (no hashing matters), R 1, non-causal, no adjacent chunks,
// against a float64 reference of REFORMER.md section 2; the float32 scores
// near 1e4 are rounded by ~1e-3, hence the tolerance (a self penalty too
// small to win moves rows by their whole size).
static void test_self_mask_large_scores(void) {
    enum { Bn = 2, Tn = 8, Dn = 6, H = 2, dk = 4, dv = 3 };
    float xd[Bn * Tn * Dn], y[Bn * Tn * Dn];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, Bn, Tn, Dn, xd);
    gradcheck_fill(&x, 14, -1.0f, 1.0f);
    for (int i = 0; i < Bn * Tn * Dn; i++) xd[i] *= 1e4f;
    ct_layer *l = ct_lsh_self_attention(lsh_params(H, dk, dv, false, Tn, 0, 0, 1, 2, 0));
    fixture r;
    if (fixture_init_ok(&r, l, &x, 1, false)) {
        run_forward(&r, &x, ct_key_from_seed(6), y);
        const float *W[3];
        const char *names[3] = {"Wq", "Wv", "Wo"};
        for (int i = 0; i < 3; i++) {
            char name[64];
            snprintf(name, sizeof name, "LSHSelfAttention/%s[0]", names[i]);
            const ct_param *p = ct_net_find_param(&r.net, name);
            CHECK(p != NULL);
            W[i] = p ? r.net.weights + p->offset : NULL;  // heads stacked: (H, rows, cols)
        }
        double worst = 0, qmax = 0;
        for (int b = 0; b < Bn && W[0] && W[1] && W[2]; b++) {
            double want[Tn][Dn] = {{0}}, scale[Tn][Dn] = {{0}};
            for (int h = 0; h < H; h++) {
                double q[Tn][dk] = {{0}}, k[Tn][dk], v[Tn][dv] = {{0}};
                for (int t = 0; t < Tn; t++) {
                    const float *xt = xd + (b * Tn + t) * Dn;
                    for (int i = 0; i < Dn; i++) {
                        for (int j = 0; j < dk; j++) q[t][j] += (double)xt[i] * W[0][(h * Dn + i) * dk + j];
                        for (int j = 0; j < dv; j++) v[t][j] += (double)xt[i] * W[1][(h * Dn + i) * dv + j];
                    }
                    double ms = 0;
                    for (int j = 0; j < dk; j++) ms += q[t][j] * q[t][j];
                    qmax = fmax(qmax, sqrt(ms));
                    for (int j = 0; j < dk; j++) k[t][j] = q[t][j] / sqrt(ms / dk + 1e-6) / sqrt((double)dk);
                }
                for (int t = 0; t < Tn; t++) {
                    double s[Tn], mx = -INFINITY, sum = 0, o[dv] = {0};
                    for (int u = 0; u < Tn; u++) {
                        s[u] = (u == t ? -1e5 : 0.0);
                        for (int j = 0; j < dk; j++) s[u] += q[t][j] * k[u][j];
                        mx = fmax(mx, s[u]);
                    }
                    for (int u = 0; u < Tn; u++) sum += exp(s[u] - mx);
                    for (int u = 0; u < Tn; u++)
                        for (int j = 0; j < dv; j++) o[j] += exp(s[u] - mx) / sum * v[u][j];
                    for (int i = 0; i < Dn; i++)
                        for (int j = 0; j < dv; j++) {
                            double wo = W[2][(h * dv + j) * Dn + i];
                            want[t][i] += o[j] * wo, scale[t][i] += fabs(o[j] * wo);
                        }
                }
            }
            for (int t = 0; t < Tn; t++)
                for (int i = 0; i < Dn; i++)
                    worst = check_worse(worst, fabs(y[(b * Tn + t) * Dn + i] - want[t][i]) / scale[t][i]);
        }
        printf("self mask with |q| up to %.0f: max error %.2e relative to sum |o| |Wo| (tol 1e-2)\n", qmax, worst);
        CHECK(qmax > 5e3 && worst < 1e-2);
        fixture_free(&r);
    }
    ct_layer_free(l);
}

// A zero-length input (T 0) is an empty sequence: init (with Trax's default
// look-back of one chunk), a training forward and backward give (B, 0, D).
static void test_zero_length(void) {
    static float xd[1], gd[1];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, 0, D, xd), gy = ct_tensor_3d(CT_DTYPE_F32, B, 0, D, gd);
    ct_layer *l = ct_lsh_self_attention(lsh_params(2, 4, 4, true, 4, 1, 0, 2, 4, 0));
    fixture r;
    ct_status st = fixture_init(&r, l, &x, 1, true);
    printf("T 0, before 1: init %s\n", st == CT_OK ? "ok" : r.err.msg);
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

int main(void) {
    test_hash_wide_factor();
    test_one_chunk_two_buckets();
    test_first_row_rotations();
    test_hash_key_sequence();
    test_tape_bytes();
    test_sort_passes();
    test_gradients();
    test_one_chunk_is_shared_qk();
    test_trax_shapes();
    test_stored_buckets();
    test_reversible_recompute();
    test_errors();
    test_masked_gradients();
    test_masked_all_ones_and_dtypes();
    test_masked_padding_ignored();
    test_max_length_for_buckets();
    test_rows_past_int32();
    test_eval_any_shape();
    test_hash_edge_cases();
    test_defaults();
    test_new_net_new_d();
    test_nb_from_length_edge();
    test_init_weights();
    test_eval_no_dropout();
    test_eval_leaves_tag();
    test_self_mask_large_scores();
    test_zero_length();
    return check_summary("test_lsh_attention");
}
