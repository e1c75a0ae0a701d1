// Embedding: int32 ids (...) -> (..., d_feature), out = embedding[id], with
// weight "embedding" (vocab_size, d_feature) drawn from U(+-sqrt(3 /
// d_feature)), Trax's (a variance of 1 / d_feature: ScaledInitializer,
// fan_out, uniform). An id outside [0, vocab_size) is an error naming the id
// and its position (Trax clips it to the range, which hides a wrong
// vocabulary).
#include <math.h>
#include <stdio.h>

#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/embedding.h"
#include "layers/internal.h"

typedef struct embedding_hp {
    int vocab_size;
    int d_feature;
} embedding_hp;

static ct_status embedding_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, const char *op,
                                 ct_error *err) {
    const embedding_hp *hp = l->hp;
    char s[CT_SIG_STR_MAX];
    if (in[0].dtype != CT_DTYPE_I32 || in[0].ndim + 1 > CT_MAX_DIMS)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected i32 ids of rank < %d",
                             ct_tensor_sig_str(&in[0], s, sizeof s), CT_MAX_DIMS);
    out[0] = ct_tensor_sig(&in[0]);
    out[0].dtype = CT_DTYPE_F32;
    out[0].shape[out[0].ndim++] = hp->d_feature;
    return CT_OK;
}

static ct_status embedding_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                                ct_key key, ct_error *err) {
    const embedding_hp *hp = l->hp;
    CT_TRY(embedding_shape(l, in, out, "init", err));
    // One weight: it takes the layer's key, as Trax's Embedding does.
    ct_layer_declare_weight(l, ic, "embedding", ct_tensor_2d(CT_DTYPE_F32, hp->vocab_size, hp->d_feature, NULL),
                            (ct_initializer){CT_INIT_UNIFORM, (float)sqrt(3.0 / hp->d_feature)}, key);
    return CT_OK;
}

// Fails on the first id outside [0, vocab_size), naming it and its index.
static ct_status embedding_check_ids(const ct_layer *l, const ct_tensor *ids, ct_error *err) {
    const embedding_hp *hp = l->hp;
    const int32_t *p = ct_i32(ids);
    int64_t n = ct_tensor_numel(ids);
    for (int64_t k = 0; k < n; k++) {
        if (p[k] >= 0 && p[k] < hp->vocab_size) continue;
        // The position as an index tuple, last axis fastest.
        int64_t idx[CT_MAX_DIMS], rest = k;
        for (int d = ids->ndim - 1; d >= 0; d--) {
            idx[d] = ids->shape[d] ? rest % ids->shape[d] : 0;
            rest = ids->shape[d] ? rest / ids->shape[d] : 0;
        }
        char pos[8 * CT_MAX_DIMS * 3], s[CT_SIG_STR_MAX];
        size_t len = 0;
        len += (size_t)snprintf(pos, sizeof pos, "(");
        for (int d = 0; d < ids->ndim && len < sizeof pos; d++)
            len += (size_t)snprintf(pos + len, sizeof pos - len, d ? ",%lld" : "%lld", (long long)idx[d]);
        if (len < sizeof pos) snprintf(pos + len, sizeof pos - len, ")");
        return ct_layer_fail(l, err, CT_ERR_ARG, "forward",
                             "id %d at position %s of input %s is outside [0, %d)", (int)p[k], pos,
                             ct_tensor_sig_str(ids, s, sizeof s), hp->vocab_size);
    }
    return CT_OK;
}

static ct_status embedding_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                   ct_key key, ct_error *err) {
    (void)key;
    const embedding_hp *hp = l->hp;
    CT_TRY(embedding_shape(l, in, out, "forward", err));
    CT_TRY(embedding_check_ids(l, &in[0], err));
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_embedding_forward(out[0].data, ct_i32(&in[0]), ct_weight(c, l, 0), ct_tensor_numel(&in[0]),
                         hp->d_feature);
    return ct_tape_push(c, &in[0], err);
}

static ct_status embedding_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                    ct_key key, ct_error *err) {
    (void)key, (void)err;
    const embedding_hp *hp = l->hp;
    ct_tensor ids = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&ids);  // int ids take no gradient
    if (grad_out[0].data)
        ct_embedding_backward(ct_weight_grad(c, l, 0), grad_out[0].data, ct_i32(&ids), ct_tensor_numel(&ids),
                              hp->d_feature);
    return CT_OK;
}

static const ct_layer_vtable embedding_vt = {
    .type = "Embedding", .init = embedding_init, .forward = embedding_forward, .backward = embedding_backward};

ct_layer *ct_embedding(int vocab_size, int d_feature) {
    CT_ASSERT(vocab_size > 0 && d_feature > 0);
    return ct_layer_new_hp(&embedding_vt, 1, 1, &(embedding_hp){vocab_size, d_feature}, sizeof(embedding_hp));
}
