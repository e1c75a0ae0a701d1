// LayerNorm: (..., D) -> (..., D), normalized over the last axis, then
// scaled and shifted by learned "scale" (ones) and "bias" (zeros), as Trax.
#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/norm.h"
#include "layers/internal.h"

typedef struct layer_norm_hp {
    float epsilon;
} layer_norm_hp;

// Checks x against the width the weights were declared with (the leading
// dims may differ from init's; the last may not).
static ct_status layer_norm_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    int64_t d = l->n_weights ? l->weights[0].sig.shape[0] : -1;
    if (x->dtype != CT_DTYPE_F32 || x->ndim < 1 || (d >= 0 && x->shape[x->ndim - 1] != d)) {
        char s[CT_SIG_STR_MAX];
        if (d < 0)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 of rank >= 1",
                                 ct_tensor_sig_str(x, s, sizeof s));
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s does not fit scale and bias (%lld)",
                             ct_tensor_sig_str(x, s, sizeof s), (long long)d);
    }
    return CT_OK;
}

static ct_status layer_norm_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                                 ct_key key, ct_error *err) {
    CT_TRY(layer_norm_check(l, &in[0], "init", err));
    int64_t d = in[0].shape[in[0].ndim - 1];
    ct_layer_declare_weight(l, ic, "scale", ct_tensor_1d(CT_DTYPE_F32, d, NULL),
                            (ct_initializer){CT_INIT_ONES, 1.0f}, ct_key_split(key, 0));
    ct_layer_declare_weight(l, ic, "bias", ct_tensor_1d(CT_DTYPE_F32, d, NULL),
                            (ct_initializer){CT_INIT_ZEROS, 0.0f}, ct_key_split(key, 1));
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status layer_norm_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                    ct_key key, ct_error *err) {
    (void)key;
    const layer_norm_hp *hp = l->hp;
    const ct_tensor *x = &in[0];
    CT_TRY(layer_norm_check(l, x, "forward", err));
    int64_t C = x->shape[x->ndim - 1], N = ct_tensor_dims_product(x, 0, x->ndim - 1);
    out[0] = ct_tensor_sig(x);
    ct_tensor mean = ct_tensor_1d(CT_DTYPE_F32, N, NULL), rstd = mean;
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    CT_TRY(ct_ctx_alloc(c, &mean, err));
    CT_TRY(ct_ctx_alloc(c, &rstd, err));
    ct_layernorm_forward(out[0].data, mean.data, rstd.data, x->data, ct_weight(c, l, 0), ct_weight(c, l, 1),
                         N, C, hp->epsilon);
    CT_TRY(ct_tape_push(c, x, err));
    CT_TRY(ct_tape_push(c, &mean, err));
    return ct_tape_push(c, &rstd, err);
}

static ct_status layer_norm_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out,
                                     ct_tensor *grad_in, ct_key key, ct_error *err) {
    (void)key;
    ct_tensor rstd = ct_tape_pop(c), mean = ct_tape_pop(c), x = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&x);
    if (!grad_out[0].data) return CT_OK;  // a zero gradient adds nothing
    // The kernel writes it (no zeroing pass), over the output gradient when
    // that was donated (nothing reads it after).
    if (ct_arena_donated(c->arena, grad_out[0].data)) grad_in[0].data = grad_out[0].data;
    else CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    int64_t C = x.shape[x.ndim - 1], N = ct_tensor_dims_product(&x, 0, x.ndim - 1);
    ct_layernorm_backward(grad_in[0].data, ct_weight_grad(c, l, 0), ct_weight_grad(c, l, 1), grad_out[0].data,
                          x.data, ct_weight(c, l, 0), mean.data, rstd.data, N, C);
    return CT_OK;
}

static const ct_layer_vtable layer_norm_vt = {
    .type = "LayerNorm", .init = layer_norm_init, .forward = layer_norm_forward, .backward = layer_norm_backward};

ct_layer *ct_layer_norm(float epsilon) {
    CT_ASSERT(epsilon >= 0.0f);
    return ct_layer_new_hp(&layer_norm_vt, 1, 1, &(layer_norm_hp){epsilon}, sizeof(layer_norm_hp));
}
