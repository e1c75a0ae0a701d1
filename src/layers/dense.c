// Dense: (..., D) -> (..., n_units), out = x @ kernel + bias.
#include <string.h>

#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/matmul.h"
#include "layers/internal.h"

typedef struct dense_hp {
    int n_units;
    bool use_bias;
} dense_hp;

static ct_status dense_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, ct_error *err) {
    const dense_hp *hp = l->hp;
    CT_TRY(ct_layer_check_input(l, in, 0, CT_DTYPE_F32, -1, err));
    out[0] = ct_tensor_sig(&in[0]);
    out[0].shape[in[0].ndim - 1] = hp->n_units;
    return CT_OK;
}

static ct_status dense_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                            ct_key key, ct_error *err) {
    const dense_hp *hp = l->hp;
    CT_TRY(dense_shape(l, in, out, err));
    int64_t d_in = in[0].shape[in[0].ndim - 1];
    ct_layer_declare_weight(l, ic, "kernel", ct_tensor_2d(CT_DTYPE_F32, d_in, hp->n_units, NULL),
                            (ct_initializer){CT_INIT_GLOROT_UNIFORM, 1.0f}, ct_key_split(key, 0));
    if (hp->use_bias)
        ct_layer_declare_weight(l, ic, "bias", ct_tensor_1d(CT_DTYPE_F32, hp->n_units, NULL),
                                (ct_initializer){CT_INIT_NORMAL, 1e-6f}, ct_key_split(key, 1));
    return CT_OK;
}

// Checks a runtime input against the kernel's width (the batch may differ
// from init's; the feature width may not).
static ct_status check_width(const ct_layer *l, const ct_tensor *x, ct_error *err) {
    int64_t d_in = l->weights[0].sig.shape[0];
    if (x->dtype != CT_DTYPE_F32 || x->ndim < 1 || x->shape[x->ndim - 1] != d_in) {
        char a[CT_SIG_STR_MAX];
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "forward", "input %s does not fit kernel (%lld,%d)",
                             ct_tensor_sig_str(x, a, sizeof a), (long long)d_in,
                             ((const dense_hp *)l->hp)->n_units);
    }
    return CT_OK;
}

static ct_status dense_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                               ct_key key, ct_error *err) {
    (void)key;
    const dense_hp *hp = l->hp;
    CT_TRY(check_width(l, &in[0], err));
    CT_TRY(dense_shape(l, in, out, err));
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    int64_t d_in = in[0].shape[in[0].ndim - 1];
    int64_t n = ct_tensor_numel(&in[0]) / (d_in ? d_in : 1);
    ct_matmul_forward(out[0].data, in[0].data, ct_weight(c, l, 0), hp->use_bias ? ct_weight(c, l, 1) : NULL,
                      n, d_in, hp->n_units);
    return ct_tape_push(c, &in[0], err);
}

static ct_status dense_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                ct_key key, ct_error *err) {
    (void)key;
    const dense_hp *hp = l->hp;
    ct_tensor x = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&x);
    if (!grad_out[0].data) return CT_OK;  // no gradient flows: nothing to add
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));  // written by the product, not added to
    int64_t d_in = x.shape[x.ndim - 1];
    int64_t n = ct_tensor_numel(&x) / (d_in ? d_in : 1);
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    ct_tensor scratch = ct_tensor_1d(CT_DTYPE_F32, ct_matmul_weight_grad_scratch_floats(n, d_in, hp->n_units), NULL);
    CT_TRY(ct_ctx_alloc(c, &scratch, err));
    ct_matmul_backward(grad_in[0].data, ct_weight_grad(c, l, 0), hp->use_bias ? ct_weight_grad(c, l, 1) : NULL,
                       scratch.data, grad_out[0].data, x.data, ct_weight(c, l, 0), n, d_in, hp->n_units);
    ct_arena_reset_to(c->arena, mark);
    return CT_OK;
}

static const ct_layer_vtable dense_vt = {
    .type = "Dense", .init = dense_init, .forward = dense_forward, .backward = dense_backward};

static ct_layer *dense_new(int n_units, bool use_bias) {
    CT_ASSERT(n_units > 0);
    return ct_layer_new_hp(&dense_vt, 1, 1, &(dense_hp){n_units, use_bias}, sizeof(dense_hp));
}

ct_layer *ct_dense(int n_units) { return dense_new(n_units, true); }
ct_layer *ct_dense_no_bias(int n_units) { return dense_new(n_units, false); }
