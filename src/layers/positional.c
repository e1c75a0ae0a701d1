// Positional encodings: (B, T, D) -> (B, T, D), out = x + pe[:T] for
// T <= max_len. pe is either a learned weight "embedding" (max_len, D),
// N(0, 0.02^2), or the fixed sinusoids of Vaswani et al. (no weights;
// computed once at init and kept with the layer).
#include <string.h>

#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/embedding.h"
#include "layers/internal.h"

typedef struct positional_hp {
    int max_len;
    bool learned;
    float *sinusoids;  // (max_len, D), set by init when !learned; owned
    int64_t d;         // D, set by init
} positional_hp;

static ct_status positional_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    const positional_hp *hp = l->hp;
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 3)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 (B, T, D)",
                             ct_tensor_sig_str(x, s, sizeof s));
    if (x->shape[1] > hp->max_len)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s is longer than max_len %d",
                             ct_tensor_sig_str(x, s, sizeof s), hp->max_len);
    if (hp->d > 0 && x->shape[2] != hp->d)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s does not fit encodings (%d,%lld)",
                             ct_tensor_sig_str(x, s, sizeof s), hp->max_len, (long long)hp->d);
    return CT_OK;
}

static ct_status positional_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                                 ct_key key, ct_error *err) {
    positional_hp *hp = l->hp;
    hp->d = 0;  // D is whatever this init sees (a layer may join a new net)
    CT_TRY(positional_check(l, &in[0], "init", err));
    hp->d = in[0].shape[2];
    if (hp->learned) {
        ct_layer_declare_weight(l, ic, "embedding", ct_tensor_2d(CT_DTYPE_F32, hp->max_len, hp->d, NULL),
                                (ct_initializer){CT_INIT_NORMAL, 0.02f}, key);
    } else {
        ct_free(hp->sinusoids);
        hp->sinusoids = ct_malloc((size_t)hp->max_len * (size_t)hp->d * sizeof(float));
        ct_positional_sinusoids(hp->sinusoids, hp->max_len, hp->d);
    }
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static const float *positional_table(const ct_layer *l, const ct_ctx *c) {
    const positional_hp *hp = l->hp;
    return hp->learned ? ct_weight(c, l, 0) : hp->sinusoids;
}

static ct_status positional_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                    ct_key key, ct_error *err) {
    (void)key;
    const ct_tensor *x = &in[0];
    CT_TRY(positional_check(l, x, "forward", err));
    out[0] = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    // Rows t < T of a (max_len, D) table are its first T * D floats.
    ct_positional_forward(out[0].data, x->data, positional_table(l, c), x->shape[0], x->shape[1] * x->shape[2]);
    return ct_tape_push_sig(c, x, err);
}

static ct_status positional_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                     ct_key key, ct_error *err) {
    (void)key;
    if (!ct_tape_pop_input_sig(c, grad_out, grad_in)) return CT_OK;
    if (!((const positional_hp *)l->hp)->learned) {
        grad_in[0] = grad_out[0];  // x + constant: the gradient passes through
        return CT_OK;
    }
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    const int64_t *shape = grad_in[0].shape;  // the input's (B, T, D)
    ct_positional_backward(grad_in[0].data, ct_weight_grad(c, l, 0), grad_out[0].data, shape[0], shape[1] * shape[2]);
    return CT_OK;
}

static void positional_destroy(ct_layer *l) {
    positional_hp *hp = l->hp;
    ct_free(hp->sinusoids);
    ct_free(hp);
}

static const ct_layer_vtable positional_vt = {
    .type = "PositionalEncoding", .init = positional_init, .forward = positional_forward,
    .backward = positional_backward, .destroy = positional_destroy};

static ct_layer *positional_new(int max_len, bool learned) {
    CT_ASSERT(max_len > 0);
    positional_hp hp = {.max_len = max_len, .learned = learned};
    return ct_layer_new_hp(&positional_vt, 1, 1, &hp, sizeof hp);
}

ct_layer *ct_positional_encoding_learned(int max_len) { return positional_new(max_len, true); }
ct_layer *ct_positional_encoding_sinusoidal(int max_len) { return positional_new(max_len, false); }
