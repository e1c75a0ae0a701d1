// Causal self-attention: the weightless DotProductCausalAttention over
// [q, k, v], and CausalAttention built from it and Dense layers.
//
// DotProductCausalAttention runs the tiled kernel (kernels/cpu/attention.h)
// and saves q, k, v, its output and the logsumexp of each row, (B, H, T),
// for backward: memory linear in T, no (B, H, T, T) probabilities; backward
// recomputes them tile by tile. Its dropout mask is not stored either but
// recomputed from the key (the header says which bits decide which element). Dropout is active only in training mode (ct_ctx.train), and
// backward must run under the same ctx mode as its forward.
#include <stdint.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/attention.h"
#include "layers/internal.h"

typedef struct attention_hp {
    int n_heads;
    float dropout;
} attention_hp;

// Checks [q, k, v]: three f32 (B, T, D) of one shape, D divisible by the
// head count; writes the output signature.
static ct_status attention_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, const char *op,
                                 ct_error *err) {
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    for (int i = 0; i < 3; i++)
        if (in[i].dtype != CT_DTYPE_F32 || in[i].ndim != 3)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %d is %s, expected (B,T,D) f32", i,
                                 ct_tensor_sig_str(&in[i], a, sizeof a));
    for (int i = 1; i < 3; i++)
        if (!ct_tensor_same_sig(&in[i], &in[0]))
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "q %s and %s %s differ", ct_tensor_sig_str(&in[0], a, sizeof a),
                                 i == 1 ? "k" : "v", ct_tensor_sig_str(&in[i], b, sizeof b));
    int64_t d = in[0].shape[2];
    int n_heads = ((const attention_hp *)l->hp)->n_heads;
    if (n_heads <= 0)  // (-1 divides every d_feature: "not divisible" would be wrong)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "n_heads %d must be positive", n_heads);
    if (d % n_heads != 0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "d_feature %lld of %s is not divisible by n_heads %d",
                             (long long)d, ct_tensor_sig_str(&in[0], a, sizeof a), n_heads);
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status attention_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                                ct_key key, ct_error *err) {
    (void)ic, (void)key;
    const attention_hp *hp = l->hp;
    if (!(hp->dropout >= 0.0f && hp->dropout < 1.0f))
        return ct_layer_fail(l, err, CT_ERR_ARG, "init", "dropout rate %g is not in [0, 1)", (double)hp->dropout);
    return attention_shape(l, in, out, "init", err);
}

// The dropout rate in effect: the layer's rate in training mode, else 0.
static float active_rate(const ct_layer *l, const ct_ctx *c) {
    return c->train ? ((const attention_hp *)l->hp)->dropout : 0.0f;
}

static ct_status attention_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                   ct_key key, ct_error *err) {
    const attention_hp *hp = l->hp;
    CT_TRY(attention_shape(l, in, out, "forward", err));
    int64_t B = in[0].shape[0], T = in[0].shape[1], D = in[0].shape[2];
    float rate = active_rate(l, c);
    // Counted in double: B H T^2 overflows int64 for T near 2^30.
    if (rate > 0.0f && (double)B * hp->n_heads * (double)T * (double)T > 4294967296.0) {
        char a[CT_SIG_STR_MAX];
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "forward",
                             "%s with %d heads has more than 2^32 attention probabilities, the most dropout can "
                             "count",
                             ct_tensor_sig_str(&in[0], a, sizeof a), hp->n_heads);
    }
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    int n_slots = ct_attention_n_slots();
    // Without a tape the logsumexp dies with this call.
    ct_arena_mark before_lse = ct_arena_get_mark(c->arena);
    ct_tensor lse = ct_tensor_3d(CT_DTYPE_F32, B, hp->n_heads, T, NULL);
    CT_TRY(ct_ctx_alloc(c, &lse, err));
    ct_arena_mark after_lse = ct_arena_get_mark(c->arena);
    const int64_t tile = ct_attention_tile(T);
    ct_tensor scratch = ct_tensor_1d(CT_DTYPE_F32, n_slots * ct_attention_scratch_floats(tile, false),
                                     NULL);
    CT_TRY(ct_ctx_alloc(c, &scratch, err));
    ct_attention_forward(out[0].data, lse.data, in[0].data, in[1].data, in[2].data, scratch.data, n_slots, key,
                         rate, B, T, D, hp->n_heads, tile);
    if (!c->record) {
        ct_arena_reset_to(c->arena, before_lse);
        return CT_OK;
    }
    ct_arena_reset_to(c->arena, after_lse);
    for (int i = 0; i < 3; i++) CT_TRY(ct_tape_push(c, &in[i], err));
    CT_TRY(ct_tape_push(c, &out[0], err));
    return ct_tape_push(c, &lse, err);
}

static ct_status attention_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                    ct_key key, ct_error *err) {
    const attention_hp *hp = l->hp;
    ct_tensor lse = ct_tape_pop(c), o = ct_tape_pop(c), v = ct_tape_pop(c), k = ct_tape_pop(c), q = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&q);
    grad_in[1] = ct_tensor_sig(&k);
    grad_in[2] = ct_tensor_sig(&v);
    if (!grad_out[0].data) return CT_OK;  // no gradient flows
    for (int i = 0; i < 3; i++) CT_TRY(ct_ctx_alloc(c, &grad_in[i], err));  // the kernel writes all of them
    int64_t B = q.shape[0], T = q.shape[1], D = q.shape[2];
    float rate = active_rate(l, c);
    int n_slots = ct_attention_n_slots();
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    const int64_t tile = ct_attention_tile(T);
    ct_tensor scratch = ct_tensor_1d(CT_DTYPE_F32, n_slots * ct_attention_scratch_floats(tile, true),
                                     NULL);
    CT_TRY(ct_ctx_alloc(c, &scratch, err));
    ct_attention_backward(grad_in[0].data, grad_in[1].data, grad_in[2].data, scratch.data, n_slots,
                          grad_out[0].data, o.data, lse.data, q.data, k.data, v.data, key, rate, B, T, D, hp->n_heads,
                          tile);
    ct_arena_reset_to(c->arena, mark);
    return CT_OK;
}

static const ct_layer_vtable attention_vt = {
    .type = "DotProductCausalAttention", .init = attention_init, .forward = attention_forward,
    .backward = attention_backward};

ct_layer *ct_dot_product_causal_attention(int n_heads, float dropout) {
    // n_heads is checked at init, where the error can name d_feature.
    return ct_layer_new_hp(&attention_vt, 3, 1, &(attention_hp){n_heads, dropout}, sizeof(attention_hp));
}

ct_layer *ct_causal_attention(int d_model, int n_heads, float dropout) {
    // A d_model that n_heads does not divide fails at init, in
    // DotProductCausalAttention, with both numbers in the message.
    ct_layer *qkv = ct_branch(CT_LAYERS(ct_dense(d_model), ct_dense(d_model), ct_dense(d_model)));
    ct_layer *l = ct_serial(CT_LAYERS(qkv, ct_dot_product_causal_attention(n_heads, dropout), ct_dense(d_model)));
    return ct_layer_rename(l, "CausalAttention");
}
