// Elementwise activations (Relu, Gelu, Tanh, Sigmoid) and softmaxes over the
// last axis (LogSoftmax, Softmax), all weightless layers of type "Fn". The
// softmaxes are ct_fn layers (which save the input and the output); the
// elementwise activations save only the tensor their backward reads, so the
// other one dies with the walk that made it (ct_stack_walk gives it back):
// under a Relu the d_ff-wide Dense output is not kept for backward.
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/softmax.h"
#include "layers/internal.h"

// One activation: its kernels, and whether backward wants the input or the
// output (the kernels' second argument, the one tensor saved).
typedef struct act_ops {
    void (*forward)(float *out, const float *inp, int64_t N);
    void (*backward)(float *dinp, const float *saved, const float *dout, int64_t N);
    bool backward_from_input;
} act_ops;

typedef struct act_hp {
    const act_ops *ops;
} act_hp;

// (...) f32 -> (...) f32
static ct_status act_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                          ct_error *err) {
    (void)ic, (void)key;
    if (in[0].dtype != CT_DTYPE_F32) {
        char s[CT_SIG_STR_MAX];
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "shape", "input is %s, expected f32",
                             ct_tensor_sig_str(&in[0], s, sizeof s));
    }
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status act_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                             ct_error *err) {
    const act_ops *ops = ((const act_hp *)l->hp)->ops;
    CT_TRY(act_init(l, NULL, in, out, key, err));
    // Elementwise, so the output may be the input's memory when that was
    // donated and backward does not read the input.
    if (!ops->backward_from_input && ct_arena_donated(c->arena, in[0].data)) out[0].data = in[0].data;
    else CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ops->forward(ct_f32(&out[0]), ct_f32(&in[0]), ct_tensor_numel(&in[0]));
    return ct_tape_push(c, ops->backward_from_input ? &in[0] : &out[0], err);
}

static ct_status act_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                              ct_error *err) {
    (void)key;
    const act_ops *ops = ((const act_hp *)l->hp)->ops;
    ct_tensor saved = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&saved);
    if (!grad_out[0].data) return CT_OK;  // no gradient flows: a zero (NULL) one back
    // Elementwise: over the output gradient when that was donated; else
    // new memory the kernels write (no zeroing pass).
    if (ct_arena_donated(c->arena, grad_out[0].data)) grad_in[0].data = grad_out[0].data;
    else CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    ops->backward(ct_f32(&grad_in[0]), ct_f32(&saved), ct_f32(&grad_out[0]), ct_tensor_numel(&saved));
    return CT_OK;
}

static const ct_layer_vtable act_vt = {.type = "Fn", .init = act_init, .forward = act_forward, .backward = act_backward};

static ct_layer *act_new(const char *name, const act_ops *ops) {
    act_hp hp = {ops};
    return ct_layer_rename(ct_layer_new_hp(&act_vt, 1, 1, &hp, sizeof hp), name);
}

static const act_ops relu_ops = {ct_relu_forward, ct_relu_backward, false};
static const act_ops gelu_ops = {ct_gelu_forward, ct_gelu_backward, true};
static const act_ops gelu_erf_ops = {ct_gelu_erf_forward, ct_gelu_erf_backward, true};
static const act_ops tanh_ops = {ct_tanh_forward, ct_tanh_backward, false};
static const act_ops sigmoid_ops = {ct_sigmoid_forward, ct_sigmoid_backward, false};

ct_layer *ct_relu(void) { return act_new("Relu", &relu_ops); }
ct_layer *ct_gelu(void) { return act_new("FastGelu", &gelu_ops); }
ct_layer *ct_gelu_erf(void) { return act_new("Gelu", &gelu_erf_ops); }
ct_layer *ct_tanh(void) { return act_new("Tanh", &tanh_ops); }
ct_layer *ct_sigmoid(void) { return act_new("Sigmoid", &sigmoid_ops); }

ct_activation_fn ct_activation_named(const char *name) {
    static const struct {
        const char *name;
        ct_activation_fn fn;
    } named[] = {{"Relu", ct_relu}, {"Gelu", ct_gelu_erf}, {"FastGelu", ct_gelu}, {"Tanh", ct_tanh},
                 {"Sigmoid", ct_sigmoid}};
    for (size_t i = 0; name && i < sizeof named / sizeof *named; i++)
        if (!strcmp(name, named[i].name)) return named[i].fn;
    return NULL;
}

// ---- softmaxes over the last axis: (..., C) -> (..., C) --------------------

typedef struct softmax_ops {
    void (*forward)(float *out, const float *inp, int64_t N, int64_t C);
    void (*backward)(float *dinp, const float *dout, const float *out, int64_t N, int64_t C);
} softmax_ops;

static ct_status softmax_shape(const ct_tensor *in, ct_tensor *out, const void *user, ct_error *err) {
    (void)user;
    if (in[0].dtype != CT_DTYPE_F32 || in[0].ndim < 1) {
        char s[CT_SIG_STR_MAX];
        return ct_error_set(err, CT_ERR_SHAPE, "input is %s, expected f32 of rank >= 1",
                            ct_tensor_sig_str(&in[0], s, sizeof s));
    }
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

// The (N, C) view of a tensor with C its last dim.
static void rows_of(const ct_tensor *t, int64_t *N, int64_t *C) {
    *C = t->shape[t->ndim - 1];
    *N = ct_tensor_dims_product(t, 0, t->ndim - 1);
}

static void softmax_fn_forward(const ct_tensor *in, ct_tensor *out, const void *user) {
    const softmax_ops *ops = user;
    int64_t N, C;
    rows_of(&in[0], &N, &C);
    ops->forward(ct_f32(&out[0]), ct_f32(&in[0]), N, C);
}

static void softmax_fn_backward(const ct_tensor *in, const ct_tensor *out, const ct_tensor *grad_out,
                                ct_tensor *grad_in, const void *user) {
    const softmax_ops *ops = user;
    int64_t N, C;
    rows_of(&in[0], &N, &C);
    ops->backward(ct_f32(&grad_in[0]), ct_f32(&grad_out[0]), ct_f32(&out[0]), N, C);
}

static const softmax_ops log_softmax_ops = {ct_log_softmax_forward, ct_log_softmax_backward};
static const softmax_ops softmax_ops_ = {ct_softmax_forward, ct_softmax_backward};

static ct_layer *softmax_new(const char *name, const softmax_ops *ops) {
    ct_fn_spec spec = {name, 1, 1, softmax_shape, softmax_fn_forward, softmax_fn_backward, ops};
    return ct_fn(&spec);
}

ct_layer *ct_log_softmax(void) { return softmax_new("LogSoftmax", &log_softmax_ops); }
ct_layer *ct_softmax(void) { return softmax_new("Softmax", &softmax_ops_); }
