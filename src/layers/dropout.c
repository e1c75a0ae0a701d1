// Dropout: (...) -> (...). In training mode (ctx->train) with rate > 0,
// element j is kept iff ct_random_bits(key, j) >= rate * 2^32 and kept
// elements are scaled by 1 / (1 - rate); otherwise the layer is the identity
// (the output is the input, not a copy). Nothing goes on the tape: backward
// gets the same key and recomputes the mask, so a recomputed forward (the
// reversible trainer's) draws the same mask.
#include <stdint.h>

#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/activation.h"
#include "layers/internal.h"

typedef struct dropout_hp {
    float rate;
} dropout_hp;

static bool dropout_active(const ct_layer *l, const ct_ctx *c) {
    return c->train && ((const dropout_hp *)l->hp)->rate > 0.0f;
}

static ct_status dropout_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32",
                             ct_tensor_sig_str(x, s, sizeof s));
    // Mask element j is drawn from counter j, a uint32.
    if (ct_tensor_numel(x) > (int64_t)UINT32_MAX + 1)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s has more than 2^32 elements",
                             ct_tensor_sig_str(x, s, sizeof s));
    return CT_OK;
}

static ct_status dropout_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                              ct_key key, ct_error *err) {
    (void)ic, (void)key;
    CT_TRY(dropout_check(l, &in[0], "init", err));
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status dropout_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                 ct_key key, ct_error *err) {
    const dropout_hp *hp = l->hp;
    CT_TRY(dropout_check(l, &in[0], "forward", err));
    if (!dropout_active(l, c)) {
        out[0] = in[0];
        return CT_OK;
    }
    out[0] = ct_tensor_sig(&in[0]);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_dropout_forward(out[0].data, in[0].data, key, ct_dropout_threshold(hp->rate), 1.0f / (1.0f - hp->rate),
                       ct_tensor_numel(&in[0]));
    return CT_OK;
}

static ct_status dropout_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                  ct_key key, ct_error *err) {
    const dropout_hp *hp = l->hp;
    // The identity passes its gradient through; a zero gradient stays zero.
    if (!dropout_active(l, c) || !grad_out[0].data) {
        grad_in[0] = grad_out[0];
        return CT_OK;
    }
    grad_in[0] = ct_tensor_sig(&grad_out[0]);
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    ct_dropout_backward(grad_in[0].data, grad_out[0].data, key, ct_dropout_threshold(hp->rate),
                        1.0f / (1.0f - hp->rate), ct_tensor_numel(&grad_out[0]));
    return CT_OK;
}

static const ct_layer_vtable dropout_vt = {
    .type = "Dropout", .init = dropout_init, .forward = dropout_forward, .backward = dropout_backward};

ct_layer *ct_dropout(float rate) {
    CT_ASSERT(rate >= 0.0f && rate < 1.0f);
    return ct_layer_new_hp(&dropout_vt, 1, 1, &(dropout_hp){rate}, sizeof(dropout_hp));
}
