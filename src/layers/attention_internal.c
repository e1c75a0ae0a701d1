// See attention_internal.h.
#include "layers/attention_internal.h"

#include <stdio.h>
#include <string.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/chunked_attention.h"

int ct_attention_declare_heads(ct_layer *l, ct_init_ctx *ic, const char *name, int H, int64_t rows, int64_t cols,
                               float limit, ct_key key, uint32_t which) {
    int first = -1;
    for (int h = 0; h < H; h++) {
        char n[CT_NAME_MAX];
        snprintf(n, sizeof n, "%s[%d]", name, h);
        int i = ct_layer_declare_weight(l, ic, n, ct_tensor_2d(CT_DTYPE_F32, rows, cols, NULL),
                                        (ct_initializer){CT_INIT_UNIFORM, limit},
                                        ct_key_split(ct_key_split(key, (uint32_t)h), which));
        if (h == 0) first = i;
        // The kernels read the heads as one (H, rows, cols) array.
        CT_ASSERT(l->weights[i].offset == l->weights[first].offset + (size_t)(h * rows * cols));
    }
    return first;
}

void ct_attention_channel_dropout(float *y, int64_t N, int64_t D, ct_key key, float rate) {
    uint64_t threshold = ct_dropout_threshold(rate);
    for (int64_t i = 0; i < D; i++) {
        float fi = ct_random_bits(key, (uint32_t)i) >= threshold ? 1.0f / (1.0f - rate) : 0.0f;
        for (int64_t n = 0; n < N; n++) y[n * D + i] *= fi;
    }
}

ct_status ct_attention_backward_output(ct_layer *l, ct_ctx *c, int wo, float rate, const ct_tensor *dy,
                                       const ct_tensor *o, ct_tensor *dout, ct_key key, ct_error *err) {
    const int64_t B = o->shape[0], H = o->shape[1], T = o->shape[2], dv = o->shape[3], D = dy->shape[2];
    *dout = ct_tensor_sig(o);
    CT_TRY(ct_ctx_zeros(c, dout, err));
    const float *g = dy->data;
    if (rate > 0.0f) {
        ct_tensor gm = ct_tensor_sig(dy);  // never written into dy (gradients may be shared)
        CT_TRY(ct_ctx_alloc(c, &gm, err));
        memcpy(gm.data, dy->data, ct_tensor_nbytes(dy));
        ct_attention_channel_dropout(gm.data, B * T, D, key, rate);
        g = gm.data;
    }
    ct_heads_merge_backward(dout->data, ct_weight_grad(c, l, wo), g, o->data, ct_weight(c, l, wo), B, T, D, H, dv);
    return CT_OK;
}

ct_status ct_attention_check_dropouts(const ct_layer *l, float attention_dropout, float output_dropout, ct_error *err) {
    if (!(attention_dropout >= 0.0f && attention_dropout < 1.0f) || !(output_dropout >= 0.0f && output_dropout < 1.0f))
        return ct_layer_fail(l, err, CT_ERR_ARG, "init", "attention_dropout %g and output_dropout %g must be in [0, 1)",
                             (double)attention_dropout, (double)output_dropout);
    return CT_OK;
}

ct_status ct_attention_check_window(const ct_layer *l, int64_t n_chunks, int before, int after, const char *op,
                                    ct_error *err) {
    int64_t window = 1 + (int64_t)before + after, most = 2 * n_chunks + 1;
    if (n_chunks == 0 || window <= most) return CT_OK;
    return ct_layer_fail(l, err, CT_ERR_ARG, op,
                         "n_chunks_before %d + n_chunks_after %d: a window of %lld chunks, over twice the %lld of the "
                         "input plus one: it would only repeat them, at a cost that grows with it",
                         before, after, (long long)window, (long long)n_chunks);
}

ct_status ct_attention_check_mask(const ct_layer *l, const ct_tensor *x, const ct_tensor *mask, const char *op,
                                  ct_error *err) {
    if ((mask->dtype == CT_DTYPE_F32 || mask->dtype == CT_DTYPE_I32) && mask->ndim == 2 && x->ndim == 3 &&
        mask->shape[0] == x->shape[0] && mask->shape[1] == x->shape[1])
        return CT_OK;
    char sm[CT_SIG_STR_MAX], sx[CT_SIG_STR_MAX];
    return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "masked: mask (input 1) is %s, expected f32 or int32 (B, T) of x %s",
                         ct_tensor_sig_str(mask, sm, sizeof sm), ct_tensor_sig_str(x, sx, sizeof sx));
}

ct_status ct_attention_mask_f32(ct_ctx *c, const ct_tensor *mask, ct_tensor *f, ct_error *err) {
    if (mask->dtype == CT_DTYPE_F32) {
        *f = *mask;
        return CT_OK;
    }
    *f = ct_tensor_sig(mask);
    f->dtype = CT_DTYPE_F32;
    CT_TRY(ct_ctx_alloc(c, f, err));
    const int32_t *m = mask->data;
    float *o = f->data;
    const int64_t n = ct_tensor_numel(mask);
    for (int64_t i = 0; i < n; i++) o[i] = m[i] != 0 ? 1.0f : 0.0f;
    return CT_OK;
}

ct_status ct_attention_tape_push(ct_ctx *c, const ct_tensor *x, const ct_tensor *mask, const ct_tensor *t, int n,
                                 ct_arena_mark before, ct_error *err) {
    if (!c->record) {
        ct_arena_reset_to(c->arena, before);
        return CT_OK;
    }
    CT_TRY(ct_tape_push(c, x, err));
    if (mask) CT_TRY(ct_tape_push(c, mask, err));
    for (int i = 0; i < n; i++) CT_TRY(ct_tape_push(c, &t[i], err));
    return CT_OK;
}

bool ct_attention_tape_pop(ct_ctx *c, ct_tensor *t, int n, ct_tensor *x, ct_tensor *mask, const ct_tensor *grad_out,
                           ct_tensor *grad_in) {
    for (int i = n - 1; i >= 0; i--) t[i] = ct_tape_pop(c);
    if (mask) {
        *mask = ct_tape_pop(c);
        grad_in[1] = ct_tensor_sig(mask);
    }
    *x = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(x);
    return grad_out[0].data != NULL;
}
