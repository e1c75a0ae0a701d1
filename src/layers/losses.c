// Losses and metrics: [model output, targets(, weights)] -> a scalar (an
// ndim-0 f32 tensor), as Trax's WeightedCategoryCrossEntropy,
// CrossEntropyLoss, CategoryAccuracy, WeightedCategoryAccuracy,
// (Masked)SequenceAccuracy, L2Loss and BinaryCrossEntropy.
//
// Shapes: outputs (..., V) f32, targets (...) int32 class ids, weights (...)
// f32 of the targets' shape (L2Loss: outputs, targets and weights are f32 of
// one shape; BinaryCrossEntropy: logits f32 and targets int32 of one shape,
// no weights). A target id outside [0, V) (BinaryCrossEntropy: other than 0
// or 1) is an error naming it; so are a NaN weight sum and a negative
// weight. A weight sum of 0 gives 0, with loss weight 0 (see weight_sum).
//
// Gradients: a loss's backward gives the gradient of its f32 model output
// only. Targets and weights get none (NULL-data gradients): they are data,
// as in Trax, where gradients are taken w.r.t. the model's weights and never
// flow into the batch. Metrics are not differentiable and return NULL-data
// gradients for every input.
//
// Weighted means are normalized by this batch's sum of weights. Positions of
// weight 0 contribute nothing, even where their term is inf or NaN.
//
// WeightedCategoryCrossEntropy's label_smoothing s (Trax's): targets
// (1 - s) one_hot + s / V; checked at init, where the error names the layer.
#include <math.h>

#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/loss.h"
#include "layers/internal.h"

typedef enum loss_kind {
    LOSS_WEIGHTED_CATEGORY_CE,
    LOSS_CROSS_ENTROPY,
    LOSS_CATEGORY_ACCURACY,
    LOSS_WEIGHTED_CATEGORY_ACCURACY,
    LOSS_SEQUENCE_ACCURACY,
    LOSS_L2,
    LOSS_BINARY_CE,
} loss_kind;

typedef struct loss_hp {
    loss_kind kind;
    float label_smoothing;  // LOSS_WEIGHTED_CATEGORY_CE only; 0 for the rest
} loss_hp;

static loss_kind kind_of(const ct_layer *l) { return ((const loss_hp *)l->hp)->kind; }
static bool is_metric(loss_kind k) {
    return k == LOSS_CATEGORY_ACCURACY || k == LOSS_WEIGHTED_CATEGORY_ACCURACY || k == LOSS_SEQUENCE_ACCURACY;
}

static ct_tensor scalar_sig(void) { return ct_tensor_make(CT_DTYPE_F32, 0, NULL, NULL); }

// Checks the input signatures for the layer's kind.
static ct_status loss_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, const char *op, ct_error *err) {
    loss_kind k = kind_of(l);
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    if (in[0].dtype != CT_DTYPE_F32 || in[0].ndim < 1)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "model output %s is not an f32 tensor of rank >= 1",
                             ct_tensor_sig_str(&in[0], a, sizeof a));
    if (k == LOSS_BINARY_CE) {
        ct_tensor want = ct_tensor_sig(&in[0]);
        want.dtype = CT_DTYPE_I32;
        if (!ct_tensor_same_sig(&in[1], &want))
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "targets %s do not match logits %s (want int32 0/1 of "
                                 "that shape)",
                                 ct_tensor_sig_str(&in[1], a, sizeof a), ct_tensor_sig_str(&in[0], b, sizeof b));
    } else if (k == LOSS_L2) {
        for (int i = 1; i < 3; i++)
            if (!ct_tensor_same_sig(&in[i], &in[0]))
                return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "%s %s do not match model output %s",
                                     i == 1 ? "targets" : "weights", ct_tensor_sig_str(&in[i], a, sizeof a),
                                     ct_tensor_sig_str(&in[0], b, sizeof b));
    } else {
        // targets (...) for outputs (..., V)
        ct_tensor want = ct_tensor_sig(&in[0]);
        want.ndim--;
        want.dtype = CT_DTYPE_I32;
        if (!ct_tensor_same_sig(&in[1], &want)) {
            char w[CT_SIG_STR_MAX];
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "targets %s do not fit model output %s (want %s)",
                                 ct_tensor_sig_str(&in[1], a, sizeof a), ct_tensor_sig_str(&in[0], b, sizeof b),
                                 ct_tensor_sig_str(&want, w, sizeof w));
        }
        if (k == LOSS_SEQUENCE_ACCURACY && in[1].ndim < 1)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "targets %s have no sequence axis",
                                 ct_tensor_sig_str(&in[1], a, sizeof a));
        if (l->n_in == 3) {
            want.dtype = CT_DTYPE_F32;
            if (!ct_tensor_same_sig(&in[2], &want))
                return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "weights %s do not match targets %s",
                                     ct_tensor_sig_str(&in[2], a, sizeof a), ct_tensor_sig_str(&in[1], b, sizeof b));
        }
    }
    out[0] = scalar_sig();
    return CT_OK;
}

static ct_status loss_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                           ct_error *err) {
    (void)ic, (void)key;
    float s = ((const loss_hp *)l->hp)->label_smoothing;
    if (!(s >= 0.0f && s <= 1.0f))  // NaN too
        return ct_layer_fail(l, err, CT_ERR_ARG, "init", "label_smoothing %g must be in [0, 1]", (double)s);
    return loss_shape(l, in, out, "init", err);
}

static ct_status check_targets(const ct_layer *l, const ct_tensor *targets, int64_t V, ct_error *err) {
    const int32_t *t = targets->data;
    int64_t n = ct_tensor_numel(targets);
    for (int64_t i = 0; i < n; i++)
        if (t[i] < 0 || t[i] >= V) {
            char a[CT_SIG_STR_MAX];
            return ct_layer_fail(l, err, CT_ERR_ARG, "forward",
                                 "target id %d at flat index %lld of targets %s is outside [0, %lld)", (int)t[i],
                                 (long long)i, ct_tensor_sig_str(targets, a, sizeof a), (long long)V);
        }
    return CT_OK;
}

// The sum of weights, which must not be NaN, with no weight below 0. A sum
// of 0 (every weight 0) is allowed: the weighted mean over nothing is taken
// as 0 with weight 0 (a data-parallel device whose shard is all padding adds
// nothing); callers that need weight check ct_ctx.loss_weight. Negative
// weights are refused: where they cancel within a device's shard or a chunk
// of the chunked loss ({1, -1}), that part's sum L_c W_c would be taken as 0
// and the batch's loss and gradient would be wrong; an infinite weight
// would make the mean inf / inf, NaN.
static ct_status weight_sum(const ct_layer *l, const ct_tensor *weights, double *wsum, ct_error *err) {
    const float *w = weights->data;
    int64_t n = ct_tensor_numel(weights);
    char a[CT_SIG_STR_MAX];
    *wsum = ct_weight_sum(w, n);
    if (isnan(*wsum))
        return ct_layer_fail(l, err, CT_ERR_ARG, "forward", "sum of weights %s is NaN",
                             ct_tensor_sig_str(weights, a, sizeof a));
    for (int64_t i = 0; i < n; i++)
        if (!(w[i] >= 0.0f && w[i] < INFINITY))
            return ct_layer_fail(l, err, CT_ERR_ARG, "forward",
                                 "weights %s: weight [%lld] is %g; loss weights are finite and >= 0",
                                 ct_tensor_sig_str(weights, a, sizeof a), (long long)i, (double)w[i]);
    return CT_OK;
}

static ct_status loss_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)key;
    loss_kind k = kind_of(l);
    CT_TRY(loss_shape(l, in, out, "forward", err));
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    float *o = out[0].data;
    int64_t V = in[0].shape[in[0].ndim - 1];
    int64_t N = k == LOSS_L2 ? ct_tensor_numel(&in[0]) : ct_tensor_numel(&in[1]);
    if (k != LOSS_L2) CT_TRY(check_targets(l, &in[1], k == LOSS_BINARY_CE ? 2 : V, err));
    double wsum = 0.0;
    if (l->n_in == 3) CT_TRY(weight_sum(l, &in[2], &wsum, err));
    const int32_t *targets = in[1].data;
    const float *weights = l->n_in == 3 ? in[2].data : NULL;
    // Every weight 0: sum(x * w) is 0 too; divide by 1 to give 0.
    double denom_w = wsum != 0.0 ? wsum : 1.0;

    switch (k) {
    case LOSS_WEIGHTED_CATEGORY_CE: {
        ct_tensor logp = ct_tensor_sig(&in[0]);
        CT_TRY(ct_ctx_alloc(c, &logp, err));
        ct_category_cross_entropy_forward(o, logp.data, in[0].data, targets, weights, denom_w,
                                          ((const loss_hp *)l->hp)->label_smoothing, N, V);
        CT_TRY(ct_tape_push(c, &logp, err));
        break;
    }
    case LOSS_CROSS_ENTROPY: {
        ct_cross_entropy_forward(o, in[0].data, targets, weights, denom_w, N, V);
        ct_tensor sig = ct_tensor_sig(&in[0]);
        CT_TRY(ct_tape_push(c, &sig, err));
        break;
    }
    case LOSS_L2:
        ct_l2_loss_forward(o, in[0].data, in[1].data, weights, denom_w, N);
        CT_TRY(ct_tape_push(c, &in[0], err));
        break;
    case LOSS_BINARY_CE:
        ct_binary_cross_entropy_forward(o, in[0].data, targets, N);
        CT_TRY(ct_tape_push(c, &in[0], err));
        break;
    case LOSS_CATEGORY_ACCURACY:
    case LOSS_WEIGHTED_CATEGORY_ACCURACY:
    case LOSS_SEQUENCE_ACCURACY: {
        if (N == 0)
            return ct_layer_fail(l, err, CT_ERR_ARG, "forward", "no targets: an accuracy over nothing has no value");
        ct_arena_mark mark = ct_arena_get_mark(c->arena);
        ct_tensor pred = ct_tensor_sig(&in[1]);
        CT_TRY(ct_ctx_alloc(c, &pred, err));
        ct_argmax_forward(pred.data, in[0].data, N, V);
        if (k == LOSS_SEQUENCE_ACCURACY) {
            // Sequences run along the targets' last axis (Trax's
            // MaskedSequenceAccuracy); a position of weight 0 is always right.
            int64_t T = in[1].shape[in[1].ndim - 1], n_seq = T ? N / T : 0;
            if (n_seq == 0)
                return ct_layer_fail(l, err, CT_ERR_ARG, "forward", "no sequences: an accuracy over nothing has no value");
            o[0] = (float)((double)ct_sequence_matches(pred.data, targets, weights, n_seq, T) / (double)n_seq);
            c->loss_weight = (double)n_seq;
        } else {
            o[0] = (float)(ct_weighted_matches(pred.data, targets, weights, N) / (weights ? denom_w : (double)N));
            c->loss_weight = weights ? wsum : (double)N;
        }
        ct_arena_reset_to(c->arena, mark);
        ct_tensor sig = ct_tensor_sig(&in[0]);
        CT_TRY(ct_tape_push(c, &sig, err));
        break;
    }
    }
    // What this scalar averages over, so replicas can combine their values
    // exactly (see ct_ctx.loss_weight).
    if (k == LOSS_WEIGHTED_CATEGORY_CE || k == LOSS_CROSS_ENTROPY || k == LOSS_L2 || k == LOSS_BINARY_CE)
        c->loss_weight = weights ? wsum : (double)N;
    // Targets and weights, for backward's gradient signatures (and data).
    for (int i = 1; i < l->n_in; i++) CT_TRY(ct_tape_push(c, &in[i], err));
    return CT_OK;
}

static ct_status loss_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                               ct_error *err) {
    (void)key;
    loss_kind k = kind_of(l);
    ct_tensor saved[3];
    for (int i = l->n_in - 1; i >= 0; i--) saved[i] = ct_tape_pop(c);
    for (int i = 0; i < l->n_in; i++) grad_in[i] = ct_tensor_sig(&saved[i]);
    if (is_metric(k) || !grad_out[0].data) return CT_OK;

    float dout = ct_f32(&grad_out[0])[0];
    const ct_tensor *x = &saved[0], *targets = &saved[1], *weights = &saved[2];
    if (k == LOSS_BINARY_CE) {  // no weights
        CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
        ct_binary_cross_entropy_backward(grad_in[0].data, dout, x->data, targets->data, ct_tensor_numel(x));
        return CT_OK;
    }
    double wsum = ct_weight_sum(weights->data, ct_tensor_numel(weights));  // as forward summed it
    if (wsum == 0.0) wsum = 1.0;  // every weight 0: the gradient is 0, as forward's value
    int64_t V = x->shape[x->ndim - 1];
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    switch (k) {
    case LOSS_WEIGHTED_CATEGORY_CE:
        ct_category_cross_entropy_backward(grad_in[0].data, dout, x->data, targets->data, weights->data, wsum,
                                           ((const loss_hp *)l->hp)->label_smoothing, ct_tensor_numel(targets), V);
        break;
    case LOSS_CROSS_ENTROPY:
        ct_cross_entropy_backward(grad_in[0].data, dout, targets->data, weights->data, wsum,
                                  ct_tensor_numel(targets), V);
        break;
    case LOSS_L2:
        ct_l2_loss_backward(grad_in[0].data, dout, x->data, targets->data, weights->data, wsum, ct_tensor_numel(x));
        break;
    default:
        break;
    }
    return CT_OK;
}

// One vtable per kind, so each layer type carries its own name.
#define LOSS_VT(kind, name) \
    [kind] = {.type = name, .init = loss_init, .forward = loss_forward, .backward = loss_backward}
static const ct_layer_vtable loss_vts[] = {
    LOSS_VT(LOSS_WEIGHTED_CATEGORY_CE, "WeightedCategoryCrossEntropy"),
    LOSS_VT(LOSS_CROSS_ENTROPY, "CrossEntropyLoss"),
    LOSS_VT(LOSS_CATEGORY_ACCURACY, "CategoryAccuracy"),
    LOSS_VT(LOSS_WEIGHTED_CATEGORY_ACCURACY, "WeightedCategoryAccuracy"),
    LOSS_VT(LOSS_SEQUENCE_ACCURACY, "SequenceAccuracy"),
    LOSS_VT(LOSS_L2, "L2Loss"),
    LOSS_VT(LOSS_BINARY_CE, "BinaryCrossEntropy"),
};
#undef LOSS_VT

static ct_layer *loss_new(loss_kind kind, int n_in) {
    return ct_layer_new_hp(&loss_vts[kind], n_in, 1, &(loss_hp){kind, 0.0f}, sizeof(loss_hp));
}

ct_weighted_category_cross_entropy_params ct_weighted_category_cross_entropy_default_params(void) {
    return (ct_weighted_category_cross_entropy_params){CT_WEIGHTED_CATEGORY_CROSS_ENTROPY_PARAMS(CT_PARAM_DEFAULT)};
}

ct_layer *ct_weighted_category_cross_entropy_new(ct_weighted_category_cross_entropy_params p) {
    loss_hp hp = {LOSS_WEIGHTED_CATEGORY_CE, p.label_smoothing};
    return ct_layer_new_hp(&loss_vts[LOSS_WEIGHTED_CATEGORY_CE], 3, 1, &hp, sizeof hp);
}

ct_layer *ct_weighted_category_cross_entropy(void) {
    return ct_weighted_category_cross_entropy_new(ct_weighted_category_cross_entropy_default_params());
}
ct_layer *ct_cross_entropy_loss(void) { return loss_new(LOSS_CROSS_ENTROPY, 3); }
ct_layer *ct_category_accuracy(void) { return loss_new(LOSS_CATEGORY_ACCURACY, 2); }
ct_layer *ct_weighted_category_accuracy(void) { return loss_new(LOSS_WEIGHTED_CATEGORY_ACCURACY, 3); }
ct_layer *ct_sequence_accuracy(void) { return loss_new(LOSS_SEQUENCE_ACCURACY, 3); }
ct_layer *ct_l2_loss(void) { return loss_new(LOSS_L2, 3); }
ct_layer *ct_binary_cross_entropy(void) { return loss_new(LOSS_BINARY_CE, 2); }
