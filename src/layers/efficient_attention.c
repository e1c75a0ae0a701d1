// SelfAttention (Trax's efficient_attention.SelfAttention): per-head
// projections, the chunked attention kernel, the output projection summed
// over heads, and Trax's two dropouts. See
// include/ctrax/layers/efficient_attention.h.
//
// Tape (forward, recording): x, the mask input (masked), q, k, v, o (B, H,
// T, d), all linear in T; the dropout masks are redrawn
// from the key in backward. k is stored as the kernel uses it (scaled, or
// normalised from q).
#include "ctrax/layers/efficient_attention.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/chunked_attention.h"
#include "layers/attention_internal.h"
#include "layers/internal.h"

typedef struct sa_hp {
    ct_self_attention_params p;
    // Set by init: D and the index of each stacked weight's first head (-1
    // when absent).
    int64_t d_model;
    int wq, wk, wv, wo, bq, bk, bv;
} sa_hp;

ct_self_attention_params ct_self_attention_default_params(void) {
    return (ct_self_attention_params){.n_heads = 2, .d_qk = 64, .d_v = 64};
}

// Checks the hyperparameters (init only: they do not change).
static ct_status sa_check_params(const ct_layer *l, ct_error *err) {
    const ct_self_attention_params *p = &((const sa_hp *)l->hp)->p;
    if (p->n_heads <= 0 || p->d_qk <= 0 || p->d_v <= 0)
        return ct_layer_fail(l, err, CT_ERR_ARG, "init", "n_heads %d, d_qk %d and d_v %d must be positive", p->n_heads,
                             p->d_qk, p->d_v);
    if (p->chunk_len < 0 || p->n_chunks_before < 0 || p->n_chunks_after < 0)
        return ct_layer_fail(l, err, CT_ERR_ARG, "init",
                             "chunk_len %d, n_chunks_before %d and n_chunks_after %d must not be negative",
                             p->chunk_len, p->n_chunks_before, p->n_chunks_after);
    if (p->chunk_len == 0 && (p->n_chunks_before || p->n_chunks_after))
        return ct_layer_fail(l, err, CT_ERR_ARG, "init",
                             "n_chunks_before %d / n_chunks_after %d need a chunk_len (full attention has one chunk)",
                             p->n_chunks_before, p->n_chunks_after);
    return ct_attention_check_dropouts(l, p->attention_dropout, p->output_dropout, err);
}

// The kernel's dimensions for input x (B, T, D) in this ctx's mode, after
// checking x against the layer: rank, D, and T a multiple of chunk_len.
static ct_status sa_dims(const ct_layer *l, const ct_ctx *c, const ct_tensor *x, const char *op,
                         ct_chunked_attention_dims *d, ct_error *err) {
    const sa_hp *hp = l->hp;
    const ct_self_attention_params *p = &hp->p;
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 3)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 (B, T, D)",
                             ct_tensor_sig_str(x, s, sizeof s));
    if (hp->d_model > 0 && x->shape[2] != hp->d_model)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s does not fit d_model %lld of the weights",
                             ct_tensor_sig_str(x, s, sizeof s), (long long)hp->d_model);
    int64_t T = x->shape[1], m = p->chunk_len ? p->chunk_len : T;
    if (p->chunk_len && T % m != 0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "length T=%lld of input %s is not a multiple of chunk_len %d",
                             (long long)T, ct_tensor_sig_str(x, s, sizeof s), p->chunk_len);
    // Full attention on T 0 has one chunk of 0 rows (m = T): no chunks.
    CT_TRY(ct_attention_check_window(l, m ? T / m : 0, p->n_chunks_before, p->n_chunks_after, op, err));
    *d = (ct_chunked_attention_dims){.B = x->shape[0], .H = p->n_heads, .T = T, .dk = p->d_qk, .dv = p->d_v,
                                     .m = m, .before = p->n_chunks_before, .after = p->n_chunks_after,
                                     .causal = p->causal, .exclude_self = p->share_qk,
                                     .dropout = c && c->train ? p->attention_dropout : 0.0f};
    double mask = (double)m * (double)m * (double)(1 + d->before + d->after);
    if (d->dropout > 0.0f && mask > 4294967296.0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "attention dropout mask (chunk_len %lld x window %lld) has more than 2^32 elements",
                             (long long)m, (long long)(m * (1 + d->before + d->after)));
    return CT_OK;
}

static ct_status sa_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                         ct_error *err) {
    sa_hp *hp = l->hp;
    const ct_self_attention_params *p = &hp->p;
    hp->d_model = 0;  // D is whatever this init sees (a layer may join a new net)
    CT_TRY(sa_check_params(l, err));
    ct_chunked_attention_dims d;
    CT_TRY(sa_dims(l, NULL, &in[0], "init", &d, err));
    if (p->masked) CT_TRY(ct_attention_check_mask(l, &in[0], &in[1], "init", err));
    int64_t D = hp->d_model = in[0].shape[2], H = p->n_heads;
    float lim_qk = (float)sqrt(6.0 / (double)(D + p->d_qk * H)), lim_v = (float)sqrt(6.0 / (double)(D + p->d_v * H));
    hp->wq = ct_attention_declare_heads(l, ic, "Wq", p->n_heads, D, p->d_qk, lim_qk, key, 0);
    hp->wk = p->share_qk ? -1 : ct_attention_declare_heads(l, ic, "Wk", p->n_heads, D, p->d_qk, lim_qk, key, 1);
    hp->wv = ct_attention_declare_heads(l, ic, "Wv", p->n_heads, D, p->d_v, lim_v, key, 2);
    hp->wo = ct_attention_declare_heads(l, ic, "Wo", p->n_heads, p->d_v, D, lim_v, key, 3);
    hp->bq = hp->bk = hp->bv = -1;
    ct_initializer zeros = {CT_INIT_ZEROS, 0.0f};
    if (p->bias) {
        hp->bq = ct_layer_declare_weight(l, ic, "bq", ct_tensor_2d(CT_DTYPE_F32, H, p->d_qk, NULL), zeros, key);
        if (!p->share_qk)
            hp->bk = ct_layer_declare_weight(l, ic, "bk", ct_tensor_2d(CT_DTYPE_F32, H, p->d_qk, NULL), zeros, key);
        hp->bv = ct_layer_declare_weight(l, ic, "bv", ct_tensor_2d(CT_DTYPE_F32, H, p->d_v, NULL), zeros, key);
    }
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static float *opt_weight(const ct_ctx *c, const ct_layer *l, int i) { return i < 0 ? NULL : ct_weight(c, l, i); }
static float *opt_grad(const ct_ctx *c, const ct_layer *l, int i) { return i < 0 ? NULL : ct_weight_grad(c, l, i); }

// The output dropout rate in effect.
static float out_rate(const ct_layer *l, const ct_ctx *c) {
    return c->train ? ((const sa_hp *)l->hp)->p.output_dropout : 0.0f;
}

// The per-head tensors of one forward: q, k (B,H,T,dk), v, o (B,H,T,dv),
// in tape order.
enum { SA_Q, SA_K, SA_V, SA_O, SA_N };

static ct_status sa_alloc_heads(ct_ctx *c, const ct_chunked_attention_dims *d, ct_tensor *t, ct_error *err) {
    for (int i = 0; i < SA_N; i++) {
        int64_t depth = i == SA_Q || i == SA_K ? d->dk : d->dv;
        t[i] = ct_tensor_make(CT_DTYPE_F32, 4, (int64_t[]){d->B, d->H, d->T, depth}, NULL);
        CT_TRY(ct_ctx_alloc(c, &t[i], err));
    }
    return CT_OK;
}

static ct_status sa_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    const sa_hp *hp = l->hp;
    const ct_tensor *x = &in[0], *mask = hp->p.masked ? &in[1] : NULL;
    ct_chunked_attention_dims d;
    CT_TRY(sa_dims(l, c, x, "forward", &d, err));
    if (mask) CT_TRY(ct_attention_check_mask(l, x, mask, "forward", err));
    const int64_t B = d.B, T = d.T, D = hp->d_model, H = d.H;
    out[0] = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_arena_mark before_heads = ct_arena_get_mark(c->arena);  // without a tape the heads die here
    ct_tensor t[SA_N], mf = {0};
    if (mask) CT_TRY(ct_attention_mask_f32(c, mask, &mf, err));
    CT_TRY(sa_alloc_heads(c, &d, t, err));
    ct_arena_mark after_heads = ct_arena_get_mark(c->arena);
    ct_heads_project_forward(t[SA_Q].data, x->data, ct_weight(c, l, hp->wq), opt_weight(c, l, hp->bq), B, T, D, H,
                             d.dk);
    if (hp->p.share_qk) {
        ct_shared_key_forward(t[SA_K].data, t[SA_Q].data, B * H * T, d.dk);
    } else {
        ct_heads_project_forward(t[SA_K].data, x->data, ct_weight(c, l, hp->wk), opt_weight(c, l, hp->bk), B, T, D,
                                 H, d.dk);
        float s = 1.0f / sqrtf((float)d.dk), *k = t[SA_K].data;
        for (int64_t i = 0; i < B * H * T * d.dk; i++) k[i] *= s;
    }
    ct_heads_project_forward(t[SA_V].data, x->data, ct_weight(c, l, hp->wv), opt_weight(c, l, hp->bv), B, T, D, H,
                             d.dv);
    int n_slots = ct_chunked_attention_n_slots(&d);
    ct_tensor scratch = ct_tensor_1d(CT_DTYPE_F32, n_slots * ct_chunked_attention_scratch_floats(&d, false), NULL);
    if (scratch.shape[0] > 0) CT_TRY(ct_ctx_alloc(c, &scratch, err));
    ct_chunked_attention_forward(t[SA_O].data, t[SA_Q].data, t[SA_K].data, t[SA_V].data,
                                 mf.data, scratch.data, n_slots, ct_key_split(key, 0), &d);
    ct_arena_reset_to(c->arena, after_heads);
    ct_heads_merge_forward(out[0].data, t[SA_O].data, ct_weight(c, l, hp->wo), B, T, D, H, d.dv);
    if (out_rate(l, c) > 0.0f)
        ct_attention_channel_dropout(out[0].data, B * T, D, ct_key_split(key, 1), out_rate(l, c));
    return ct_attention_tape_push(c, x, mask, t, SA_N, before_heads, err);
}

static ct_status sa_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                             ct_error *err) {
    const sa_hp *hp = l->hp;
    ct_tensor t[SA_N];
    ct_tensor x, mask = {0}, mf = {0};
    if (!ct_attention_tape_pop(c, t, SA_N, &x, hp->p.masked ? &mask : NULL, grad_out, grad_in))
        return CT_OK;  // no gradient flows
    ct_chunked_attention_dims d;
    CT_TRY(sa_dims(l, c, &x, "backward", &d, err));
    if (hp->p.masked) CT_TRY(ct_attention_mask_f32(c, &mask, &mf, err));
    const int64_t B = d.B, T = d.T, D = hp->d_model, H = d.H;
    ct_tensor dO, g[3] = {ct_tensor_sig(&t[SA_Q]), ct_tensor_sig(&t[SA_K]), ct_tensor_sig(&t[SA_V])};
    CT_TRY(ct_attention_backward_output(l, c, hp->wo, out_rate(l, c), &grad_out[0], &t[SA_O], &dO,
                                        ct_key_split(key, 1), err));
    for (int i = 0; i < 3; i++) CT_TRY(ct_ctx_zeros(c, &g[i], err));
    int n_slots = ct_chunked_attention_n_slots(&d);
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    ct_tensor scratch = ct_tensor_1d(CT_DTYPE_F32, n_slots * ct_chunked_attention_scratch_floats(&d, true), NULL);
    if (scratch.shape[0] > 0) CT_TRY(ct_ctx_alloc(c, &scratch, err));
    ct_chunked_attention_backward(g[0].data, g[1].data, g[2].data, scratch.data, n_slots, dO.data, t[SA_O].data,
                                  t[SA_Q].data, t[SA_K].data, t[SA_V].data, mf.data,
                                  ct_key_split(key, 0), &d);
    ct_arena_reset_to(c->arena, mark);
    float *dk = g[1].data;
    if (hp->p.share_qk) {
        ct_shared_key_backward(g[0].data, dk, t[SA_Q].data, B * H * T, d.dk);
    } else {
        float s = 1.0f / sqrtf((float)d.dk);
        for (int64_t i = 0; i < B * H * T * d.dk; i++) dk[i] *= s;
    }
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    float *dx = grad_in[0].data;
    ct_heads_project_backward(dx, ct_weight_grad(c, l, hp->wq), opt_grad(c, l, hp->bq), g[0].data, x.data,
                              ct_weight(c, l, hp->wq), B, T, D, H, d.dk);
    if (!hp->p.share_qk)
        ct_heads_project_backward(dx, ct_weight_grad(c, l, hp->wk), opt_grad(c, l, hp->bk), dk, x.data,
                                  ct_weight(c, l, hp->wk), B, T, D, H, d.dk);
    ct_heads_project_backward(dx, ct_weight_grad(c, l, hp->wv), opt_grad(c, l, hp->bv), g[2].data, x.data,
                              ct_weight(c, l, hp->wv), B, T, D, H, d.dv);
    return CT_OK;
}

static const ct_layer_vtable sa_vt = {
    .type = "SelfAttention", .init = sa_init, .forward = sa_forward, .backward = sa_backward};

ct_layer *ct_self_attention(ct_self_attention_params p) {
    // The parameters are checked at init, where errors can name the layer.
    sa_hp hp = {.p = p, .wq = -1, .wk = -1, .wv = -1, .wo = -1, .bq = -1, .bk = -1, .bv = -1};
    return ct_layer_new_hp(&sa_vt, p.masked ? 2 : 1, 1, &hp, sizeof hp);
}
