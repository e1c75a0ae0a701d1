// Layers that move or reduce data along axes: ShiftRight, Flatten, Mean.
#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/reshape.h"
#include "layers/internal.h"

// ---- ShiftRight: (B, T, ...) -> (B, T, ...), out[:, t] = in[:, t - n] ------
//
// As Trax's ShiftRight (train mode): pads n zeros in front of axis 1 and
// drops the last n positions. f32 and int32 (token ids) alike.

typedef struct shift_hp {
    int n_positions;
} shift_hp;

static ct_status shift_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    if ((x->dtype != CT_DTYPE_F32 && x->dtype != CT_DTYPE_I32) || x->ndim < 2) {
        char s[CT_SIG_STR_MAX];
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 or i32 of rank >= 2",
                             ct_tensor_sig_str(x, s, sizeof s));
    }
    return CT_OK;
}

static ct_status shift_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    (void)ic, (void)key;
    CT_TRY(shift_check(l, &in[0], "init", err));
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status shift_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    (void)key;
    const shift_hp *hp = l->hp;
    const ct_tensor *x = &in[0];
    CT_TRY(shift_check(l, x, "forward", err));
    out[0] = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_shift_right_forward(out[0].data, x->data, x->shape[0], x->shape[1], ct_tensor_dims_product(x, 2, x->ndim),
                           hp->n_positions, ct_dtype_size(x->dtype));
    return ct_tape_push_sig(c, x, err);
}

static ct_status shift_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                ct_key key, ct_error *err) {
    (void)key;
    // NULL data: int ids take no gradient, a zero one stays zero.
    if (!ct_tape_pop_input_sig(c, grad_out, grad_in) || grad_in[0].dtype != CT_DTYPE_F32) return CT_OK;
    const shift_hp *hp = l->hp;
    ct_tensor x = grad_in[0];
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    ct_shift_right_backward(grad_in[0].data, grad_out[0].data, x.shape[0], x.shape[1],
                            ct_tensor_dims_product(&x, 2, x.ndim), hp->n_positions);
    return CT_OK;
}

static const ct_layer_vtable shift_vt = {
    .type = "ShiftRight", .init = shift_init, .forward = shift_forward, .backward = shift_backward};

ct_layer *ct_shift_right(int n_positions) {
    CT_ASSERT(n_positions >= 0);
    return ct_layer_new_hp(&shift_vt, 1, 1, &(shift_hp){n_positions}, sizeof(shift_hp));
}

// ---- Flatten: (d0, ..., dk, rest...) -> (d0, ..., dk, prod rest) -----------
//
// k = n_axes_to_keep - 1, which must be below the input's rank (Trax's rule).
// A pure reshape: the output is the input's memory with another shape, and
// the gradient is grad_out's memory with the input's shape.

typedef struct flatten_hp {
    int n_axes_to_keep;
} flatten_hp;

static ct_status flatten_shape(const ct_layer *l, const ct_tensor *x, ct_tensor *out, const char *op,
                               ct_error *err) {
    const flatten_hp *hp = l->hp;
    if (hp->n_axes_to_keep >= x->ndim) {
        char s[CT_SIG_STR_MAX];
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "n_axes_to_keep %d must be less than the rank of input %s",
                             hp->n_axes_to_keep, ct_tensor_sig_str(x, s, sizeof s));
    }
    *out = *x;  // keeps data: the output aliases the input
    out->ndim = hp->n_axes_to_keep + 1;
    out->shape[hp->n_axes_to_keep] = ct_tensor_dims_product(x, hp->n_axes_to_keep, x->ndim);
    return CT_OK;
}

static ct_status flatten_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                              ct_key key, ct_error *err) {
    (void)ic, (void)key;
    CT_TRY(flatten_shape(l, &in[0], &out[0], "init", err));
    out[0].data = NULL;
    return CT_OK;
}

static ct_status flatten_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                 ct_error *err) {
    (void)key;
    CT_TRY(flatten_shape(l, &in[0], &out[0], "forward", err));
    return ct_tape_push_sig(c, &in[0], err);
}

static ct_status flatten_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                  ct_key key, ct_error *err) {
    (void)l, (void)key, (void)err;
    grad_in[0] = ct_tape_pop(c);
    if (grad_in[0].dtype == CT_DTYPE_F32) grad_in[0].data = grad_out[0].data;
    return CT_OK;
}

static const ct_layer_vtable flatten_vt = {
    .type = "Flatten", .init = flatten_init, .forward = flatten_forward, .backward = flatten_backward};

ct_layer *ct_flatten(int n_axes_to_keep) {
    CT_ASSERT(n_axes_to_keep >= 0 && n_axes_to_keep < CT_MAX_DIMS);
    return ct_layer_new_hp(&flatten_vt, 1, 1, &(flatten_hp){n_axes_to_keep}, sizeof(flatten_hp));
}

// ---- Mean over one axis ----------------------------------------------------
//
// (d0, ..., da, ..., dn) -> (d0, ..., 1, ..., dn) with keepdims, else with
// axis a removed. The input is viewed as (outer, da, inner).

typedef struct mean_hp {
    int axis;
    bool keepdims;
} mean_hp;

static ct_status mean_shape(const ct_layer *l, const ct_tensor *x, ct_tensor *out, int *axis,
                            const char *op, ct_error *err) {
    const mean_hp *hp = l->hp;
    int a = hp->axis < 0 ? hp->axis + x->ndim : hp->axis;
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || a < 0 || a >= x->ndim)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "axis %d does not fit input %s (need f32)", hp->axis,
                             ct_tensor_sig_str(x, s, sizeof s));
    if (x->shape[a] == 0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "the mean over empty axis %d of input %s is undefined",
                             hp->axis, ct_tensor_sig_str(x, s, sizeof s));
    *out = ct_tensor_sig(x);
    if (hp->keepdims) {
        out->shape[a] = 1;
    } else {
        for (int d = a; d + 1 < x->ndim; d++) out->shape[d] = x->shape[d + 1];
        out->ndim--;
    }
    *axis = a;
    return CT_OK;
}

static ct_status mean_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                           ct_error *err) {
    (void)ic, (void)key;
    int axis;
    return mean_shape(l, &in[0], &out[0], &axis, "init", err);
}

static ct_status mean_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)key;
    const ct_tensor *x = &in[0];
    int a;
    CT_TRY(mean_shape(l, x, &out[0], &a, "forward", err));
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_mean_forward(out[0].data, x->data, ct_tensor_dims_product(x, 0, a), x->shape[a],
                    ct_tensor_dims_product(x, a + 1, x->ndim));
    return ct_tape_push_sig(c, x, err);
}

static ct_status mean_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                               ct_key key, ct_error *err) {
    (void)key;
    if (!ct_tape_pop_input_sig(c, grad_out, grad_in)) return CT_OK;
    ct_tensor x = grad_in[0];
    int a = ((const mean_hp *)l->hp)->axis;
    if (a < 0) a += x.ndim;
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    ct_mean_backward(grad_in[0].data, grad_out[0].data, ct_tensor_dims_product(&x, 0, a), x.shape[a],
                     ct_tensor_dims_product(&x, a + 1, x.ndim));
    return CT_OK;
}

static const ct_layer_vtable mean_vt = {
    .type = "Mean", .init = mean_init, .forward = mean_forward, .backward = mean_backward};

ct_layer *ct_mean(int axis, bool keepdims) {
    return ct_layer_new_hp(&mean_vt, 1, 1, &(mean_hp){axis, keepdims}, sizeof(mean_hp));
}
