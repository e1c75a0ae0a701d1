// The chunked loss (ct_trainer_options.loss_chunk_size, Trax's
// train.loss_chunk_size; issue 12): the model's row-wise tail and the loss
// run over chunks of rows in both trainers.
//   - equality with the unchunked step at dropout 0: the loss, every weight
//     gradient of step 1 and the eval loss within 1e-6 relative, every
//     weight after two Adam steps within that plus what Adam makes of its
//     gradients' differences (test_equal), for a chunk size that divides B*T and one
//     that leaves a shorter last chunk; ReformerLM and TransformerLM (whose
//     tail the memory-efficient trainer must find inside a model with no
//     reversible layer), standard and memory-efficient trainers; and with
//     WeightedCategoryCrossEntropy's label smoothing 0.1;
//   - finite differences (tests/gradcheck.c) on the chunked part as a layer,
//     with a shorter last chunk, dropout on, and label smoothing 0.1;
//   - the chunked part as a layer against one chunk of every row when a
//     chunk's weights, or all, are 0; each weighted layer's gradients
//     announced (ct_ctx.on_weight_grads) once, when final; and each chunk
//     drawing its own dropout masks;
//   - a model that is one row-wise layer (no Serial) chunked whole;
//   - the refusals: a model with no row-wise tail, a loss that is no mean
//     over rows, a negative size;
//   - the device peak of a step of ReformerLM (vocab 256, T 4096, B 1) with
//     and without chunking, memory-efficient and standard: chunked is lower,
//     and step 1 peaks no higher than later steps.
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/train/reversible_trainer.h"
#include "layer_fixture.h"
#include "train/train_internal.h"

#define TOL 1e-6

// ---- the chunked part as a layer, for gradcheck --------------------------------------
//
// ChunkedLoss(tail..., loss): (x (..., D) f32, targets (...) i32) -> the
// loss, running its sublayers (sublayer i with ct_key_split(key, i), as a
// Serial) through ct_chunked_loss_forward/backward. The loss's weights are
// fixed data held by the layer, not an input: gradcheck perturbs every f32
// input, and weights get no gradient by design (losses.c).

typedef struct chunked_hp {
    ct_chunked_loss cl;
    ct_tensor weights;
} chunked_hp;

static void chunked_destroy(ct_layer *l) {
    chunked_hp *hp = l->hp;
    ct_chunked_loss_free(&hp->cl);
    ct_free(hp);
}

static ct_status chunked_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    chunked_hp *hp = l->hp;
    ct_tensor x = in[0];
    for (int i = 0; i < l->n_sub - 1; i++) {
        ct_tensor y;
        CT_TRY(ct_layer_init(l->sub[i], i, ic, &x, &y, ct_key_split(key, (uint32_t)i), err));
        x = y;
    }
    ct_tensor loss_in[3] = {x, ct_tensor_sig(&in[1]), ct_tensor_sig(&hp->weights)};
    int last = l->n_sub - 1;
    CT_TRY(ct_layer_init(l->sub[last], last, ic, loss_in, out, ct_key_split(key, (uint32_t)last), err));
    hp->cl.leaves = ct_calloc((size_t)l->n_sub, sizeof *hp->cl.leaves);
    for (int i = 0; i < l->n_sub; i++)
        hp->cl.leaves[i] = (ct_train_leaf){.layer = l->sub[i], .depth = 1, .path = {(uint32_t)i}};
    hp->cl.n_leaves = l->n_sub;
    hp->cl.first = 0;
    hp->cl.n_in = 3;
    return CT_OK;
}

static ct_status chunked_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                 ct_error *err) {
    chunked_hp *hp = l->hp;
    ct_tensor part[3] = {in[0], in[1], hp->weights};
    double weight;
    CT_TRY(ct_chunked_loss_forward(&hp->cl, c, part, key, &out[0], &weight, err));
    CT_TRY(ct_tape_push(c, &in[0], err));
    return ct_tape_push(c, &in[1], err);
}

static ct_status chunked_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                  ct_key key, ct_error *err) {
    chunked_hp *hp = l->hp;
    ct_tensor targets = ct_tape_pop(c), x = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&x);
    grad_in[1] = ct_tensor_sig(&targets);
    if (!grad_out[0].data) return CT_OK;
    ct_tensor part[3] = {x, targets, hp->weights}, loss, gin[3];
    double weight;
    // The weight sum forward found (the seeds need it).
    CT_TRY(ct_chunked_loss_forward(&hp->cl, c, part, key, &loss, &weight, err));
    CT_TRY(ct_chunked_loss_backward(&hp->cl, c, part, key, *ct_f32(&grad_out[0]), weight, gin, err));
    grad_in[0] = gin[0];
    return CT_OK;
}

static const ct_layer_vtable chunked_vt = {.type = "ChunkedLoss",
                                           .init = chunked_init,
                                           .forward = chunked_forward,
                                           .backward = chunked_backward,
                                           .destroy = chunked_destroy};

static ct_layer *chunked_layer(int64_t rows, ct_tensor weights, int n, ct_layer **layers) {
    chunked_hp *hp = ct_calloc(1, sizeof *hp);
    hp->cl.rows = rows;
    hp->weights = weights;
    return ct_layer_new(&chunked_vt, "ChunkedLoss", 2, 1, hp, layers, n);
}

// WeightedCategoryCrossEntropy with this label smoothing.
static ct_layer *make_loss(float label_smoothing) {
    ct_weighted_category_cross_entropy_params p = ct_weighted_category_cross_entropy_default_params();
    p.label_smoothing = label_smoothing;
    return ct_weighted_category_cross_entropy_new(p);
}

// (3, 4) rows in chunks of 5: 5, 5 and a last one of 2; some weights 0.
static void test_gradcheck(void) {
    enum { NB = 3, NT = 4, D = 6, V = 7 };
    float x[NB * NT * D], w[NB * NT];
    int32_t t[NB * NT];
    ct_tensor xs = ct_tensor_3d(CT_DTYPE_F32, NB, NT, D, x), ws = ct_tensor_2d(CT_DTYPE_F32, NB, NT, w);
    gradcheck_fill(&xs, 1, -2.0f, 2.0f);
    gradcheck_fill(&ws, 2, 0.0f, 1.0f);
    w[3] = w[10] = 0.0f;
    for (int i = 0; i < NB * NT; i++) t[i] = (int32_t)((i * 5 + 2) % V);
    ct_tensor in[2] = {xs, ct_tensor_2d(CT_DTYPE_I32, NB, NT, t)};
    ct_gradcheck_opts o = ct_gradcheck_defaults();
    static const char *const labels[] = {"chunked loss", "chunked loss, dropout 0.2",
                                         "chunked loss, label_smoothing 0.1"};
    for (int k = 0; k < 3; k++) {
        ct_layer *l = chunked_layer(5, ws,
                                    CT_LAYERS(ct_layer_norm(1e-6f), ct_dropout(k == 1 ? 0.2f : 0.0f), ct_dense(V),
                                              make_loss(k == 2 ? 0.1f : 0.0f)));
        double e = gradcheck(labels[k], l, in, 2, o);
        printf("  max rel err %.3e\n", e);
        CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "%s: rel err %g", labels[k], e);
        ct_layer_free(l);
    }
}

// ---- the chunked part as a layer, run: against one chunk of every row -------------------

// What ct_ctx.on_weight_grads told of the weighted sublayers of a ChunkedLoss
// (LayerNorm, Dense): calls, and the sum of the layer's gradient slab range
// at the last call, to compare with the sum after backward. The trainers
// send a layer's gradients to the other processes when told: a call before
// the last chunk sends a partial gradient.
typedef struct heard {
    const ct_ctx *ctx;
    const ct_layer *layers[2];
    int calls[2];
    double at_call[2], after[2];
} heard;

static double grad_sum(const ct_ctx *c, const ct_layer *l) {
    double s = 0;
    for (int i = 0; i < l->n_weights; i++) {
        const float *g = ct_weight_grad(c, l, i);
        for (int64_t k = 0; k < ct_tensor_numel(&l->weights[i].sig); k++) s += g[k];
    }
    return s;
}

static void on_grads(void *user, const ct_layer *l) {
    heard *h = user;
    for (int i = 0; i < 2; i++)
        if (h->layers[i] == l) h->calls[i]++, h->at_call[i] = grad_sum(h->ctx, l);
}

// ChunkedLoss(rows; LayerNorm, Dropout(rate), Dense(V), loss) on in (x (3,
// 4, 6), targets) with loss weights w, in training, key 9: forward, then
// backward from 1. Returns the loss (NaN on failure); x's gradient into
// dx (72 floats); the callbacks into *h.
static float run_chunked(int64_t rows, float rate, const ct_tensor *in, ct_tensor w, float *dx, heard *h) {
    enum { V = 7 };
    ct_layer *norm = ct_layer_norm(1e-6f), *dense = ct_dense(V);
    ct_layer *l = chunked_layer(rows, w, CT_LAYERS(norm, ct_dropout(rate), dense, make_loss(0.0f)));
    fixture f;
    float loss = NAN;
    memset(h, 0, sizeof *h);
    if (fixture_init_ok(&f, l, in, 2, true)) {
        ct_net_zero_grads(&f.net);
        *h = (heard){.ctx = &f.ctx, .layers = {norm, dense}};
        f.ctx.on_weight_grads = on_grads;
        f.ctx.on_weight_grads_user = h;
        ct_key key = ct_key_from_seed(9);
        ct_tensor out[1], gin[2];
        CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, in, out, key, &f.err), &f.err);
        float one = 1.0f;
        ct_tensor g = ct_tensor_sig(&out[0]);
        g.data = &one;
        loss = *ct_f32(&out[0]);
        CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, gin, key, &f.err), &f.err);
        CHECK(gin[0].data != NULL);
        if (gin[0].data) memcpy(dx, gin[0].data, ct_tensor_nbytes(&gin[0]));
        for (int i = 0; i < 2; i++) h->after[i] = grad_sum(&f.ctx, h->layers[i]);
        h->ctx = NULL;
        ct_arena_reset(&f.arena);
        fixture_free(&f);
    }
    ct_layer_free(l);
    return loss;
}

// (3, 4) rows in chunks of 5 against one chunk of every row (the
// unchunked computation), at dropout 0: the loss and x's gradient equal,
// finite, when a whole chunk's weights are 0 (it averages over nothing and
// must count for nothing) and when every weight is 0 (the loss is 0, as the
// loss layer's mean over nothing). Each weighted sublayer's gradients are
// announced once, after the last chunk: the callback sees their final sums.
static void test_zero_weight_chunks(void) {
    enum { NB = 3, NT = 4, D = 6, V = 7, N = NB * NT };
    float x[N * D], w[N], dx[2][N * D];
    int32_t t[N];
    ct_tensor xs = ct_tensor_3d(CT_DTYPE_F32, NB, NT, D, x), ws = ct_tensor_2d(CT_DTYPE_F32, NB, NT, w);
    gradcheck_fill(&xs, 1, -2.0f, 2.0f);
    for (int i = 0; i < N; i++) t[i] = (int32_t)((i * 5 + 2) % V);
    ct_tensor in[2] = {xs, ct_tensor_2d(CT_DTYPE_I32, NB, NT, t)};
    for (int all = 0; all < 2; all++) {
        gradcheck_fill(&ws, 2, 0.5f, 1.0f);
        for (int i = 0; i < (all ? N : 5); i++) w[i] = 0.0f;  // chunk 0 (rows 0..4), or every row
        heard h[2];
        float loss[2];
        for (int k = 0; k < 2; k++) loss[k] = run_chunked(k ? 1000 : 5, 0.0f, in, ws, dx[k], &h[k]);
        double dmax = 0, dref = 0;
        bool finite = isfinite(loss[0]) && isfinite(loss[1]);
        for (int i = 0; i < N * D; i++) {
            finite = finite && isfinite(dx[0][i]) && isfinite(dx[1][i]);
            dmax = check_worse(dmax, fabs((double)dx[0][i] - dx[1][i]));
            dref = fmax(dref, fabs((double)dx[1][i]));
        }
        const char *what = all ? "every weight 0" : "chunk 0's weights 0";
        printf("chunks of 5 vs one chunk, %s: loss %.7g vs %.7g, max |dx diff| %.2e (max |dx| %.2e); "
               "LayerNorm, Dense told %d, %d times\n",
               what, (double)loss[0], (double)loss[1], dmax, dref, h[0].calls[0], h[0].calls[1]);
        CHECK_MSG(finite, "%s: non-finite loss or gradient", what);
        CHECK_MSG(fabs((double)loss[0] - loss[1]) <= TOL * fmax(1.0, fabs((double)loss[1])), "%s: loss %g vs %g",
                  what, (double)loss[0], (double)loss[1]);
        CHECK_MSG(dmax <= TOL * fmax(1.0, dref), "%s: dx differs by %g", what, dmax);
        if (all) CHECK(loss[0] == 0.0f && dref == 0.0);
        for (int k = 0; k < 2; k++)
            for (int i = 0; i < 2; i++) {
                CHECK_MSG(h[k].calls[i] == 1, "%s, %s: on_weight_grads called %d times for %s", what,
                          k ? "one chunk" : "chunks of 5", h[k].calls[i], i ? "Dense" : "LayerNorm");
                CHECK_MSG(h[k].at_call[i] == h[k].after[i], "%s: %s's gradients announced at sum %.9g, final %.9g",
                          what, i ? "Dense" : "LayerNorm", h[k].at_call[i], h[k].after[i]);
            }
    }
}

// Each chunk draws its own dropout masks: rows 5..9 (chunk 1) repeat rows
// 0..4 (chunk 0), targets and weights too, so x's gradients of the two
// would be equal bit for bit under one mask; at dropout 0.5 they differ.
static void test_chunk_masks_differ(void) {
    enum { NB = 3, NT = 4, D = 6, V = 7, N = NB * NT };
    float x[N * D], w[N], dx[N * D];
    int32_t t[N];
    ct_tensor xs = ct_tensor_3d(CT_DTYPE_F32, NB, NT, D, x), ws = ct_tensor_2d(CT_DTYPE_F32, NB, NT, w);
    gradcheck_fill(&xs, 1, -2.0f, 2.0f);
    for (int i = 0; i < N; i++) {
        w[i] = 1.0f;
        t[i] = (int32_t)((i % 5) * 3 % V);
    }
    memcpy(x + 5 * D, x, 5 * D * sizeof *x);
    ct_tensor in[2] = {xs, ct_tensor_2d(CT_DTYPE_I32, NB, NT, t)};
    heard h;
    float loss = run_chunked(5, 0.5f, in, ws, dx, &h);
    double d = 0;
    for (int i = 0; i < 5 * D; i++) d = check_worse(d, fabs((double)dx[i] - dx[5 * D + i]));
    printf("dropout 0.5, chunks of 5, chunk 1's rows = chunk 0's: loss %.6f, max |dx diff| between them %.3e\n",
           (double)loss, d);
    CHECK(isfinite(loss));
    CHECK_MSG(d > 1e-3, "chunks 0 and 1 drew the same dropout masks (dx differs by %g)", d);
}

// ---- trainers: chunked = unchunked -------------------------------------------------------

enum { VOCAB = 13, BATCH = 2, LEN = 16 };

typedef struct lm_batch {
    int32_t tokens[BATCH * LEN], targets[BATCH * LEN];
    float weights[BATCH * LEN];
    ct_tensor batch[3];  // inputs (B, T) i32, targets (B, T) i32, weights (B, T) f32
} lm_batch;

static void lm_batch_init(lm_batch *f) {
    for (int i = 0; i < BATCH * LEN; i++) {
        f->tokens[i] = (int32_t)(ct_random_bits(ct_key_from_seed(7), (uint32_t)i) % VOCAB);
        f->targets[i] = (int32_t)(ct_random_bits(ct_key_from_seed(8), (uint32_t)i) % VOCAB);
        // Uneven weights, some 0: chunks average over different weight sums.
        f->weights[i] = (float)(i % 4) * 0.5f;
    }
    f->batch[0] = ct_tensor_2d(CT_DTYPE_I32, BATCH, LEN, f->tokens);
    f->batch[1] = ct_tensor_2d(CT_DTYPE_I32, BATCH, LEN, f->targets);
    f->batch[2] = ct_tensor_2d(CT_DTYPE_F32, BATCH, LEN, f->weights);
}

static ct_layer *make_model(bool reformer, float dropout) {
    if (reformer) {
        ct_reformer_lm_params p = ct_reformer_lm_default_params();
        p.vocab_size = VOCAB;
        p.d_model = 8;
        p.d_ff = 16;
        p.n_layers = 2;
        p.n_heads = 2;
        p.max_len = 64;
        p.dropout = dropout;
        return ct_reformer_lm(p);
    }
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = VOCAB;
    p.d_model = 8;
    p.d_ff = 16;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 64;
    p.dropout = dropout;
    return ct_transformer_lm(p);
}

static ct_status make_trainer(ct_trainer **tr, ct_layer *model, ct_layer *loss, const ct_tensor *batch,
                              bool memory_efficient, int64_t chunk, ct_device *dev, ct_error *err) {
    ct_trainer_options o = memory_efficient ? ct_reversible_default_options() : ct_trainer_default_options();
    o.reversible.keep_grads = true;  // for ct_trainer_grads
    o.loss_chunk_size = chunk;
    return ct_trainer_new(tr, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(1), dev,
                          &o, err);
}

// max |a - b| / max |a| over every weight of the net (a gradient that is
// zero but for rounding, as an attention key bias's, would make any
// per-tensor ratio noise); *worst names the tensor of the largest |a - b|.
static double net_diff(const ct_net *net, const float *a, const float *b, const char **worst) {
    double d = 0, m = 0;
    *worst = "";
    for (int i = 0; i < net->n_params; i++) {
        const ct_param *p = net->params[i];
        for (int64_t k = 0; k < ct_tensor_numel(&p->sig); k++) {
            double e = fabs((double)a[p->offset + k] - b[p->offset + k]);
            if (e > d || isnan(e)) {
                d = e;
                *worst = p->full_name;
            }
            if (fabs(a[p->offset + k]) > m) m = fabs(a[p->offset + k]);
        }
    }
    return m > 0 ? d / m : d;
}

// One step of each trainer on the same batch and key: tr[1]'s loss and
// gradients (chunked) equal tr[0]'s (unchunked) within TOL.
static void check_same_step(ct_trainer *tr[2], const ct_tensor *batch, uint64_t seed, const char *what) {
    ct_error err;
    ct_step_stats s[2];
    for (int i = 0; i < 2; i++)
        CHECK_OK(ct_trainer_one_step(tr[i], batch, ct_key_from_seed(seed), 1, 1e-3f, &s[i], &err), &err);
    const char *worst = "";
    double e_loss = fabs((double)s[0].loss - s[1].loss) / fabs((double)s[0].loss);
    double e_grad = net_diff(ct_trainer_net(tr[0]), ct_trainer_grads(tr[0]), ct_trainer_grads(tr[1]), &worst);
    printf("%s: loss %.2e, gradients %.2e (%s)\n", what, e_loss, e_grad, worst);
    CHECK(e_loss <= TOL && e_grad <= TOL);
}

static void test_equal(bool reformer, bool memory_efficient, int64_t chunk, float label_smoothing) {
    char name[160];
    snprintf(name, sizeof name, "%s, %s trainer, loss_chunk_size %lld of %d rows%s",
             reformer ? "ReformerLM" : "TransformerLM", memory_efficient ? "memory-efficient" : "standard",
             (long long)chunk, BATCH * LEN, label_smoothing != 0.0f ? ", label_smoothing 0.1" : "");
    lm_batch f;
    lm_batch_init(&f);
    ct_device dev = ct_device_cpu();
    ct_trainer *ta, *tb;
    ct_error err;
    ct_layer *model = make_model(reformer, 0.0f), *loss = make_loss(label_smoothing);
    CHECK_OK(make_trainer(&ta, model, loss, f.batch, memory_efficient, 0, &dev, &err), &err);
    ct_layer_free(model);
    ct_layer_free(loss);
    model = make_model(reformer, 0.0f);
    loss = make_loss(label_smoothing);
    CHECK_OK(make_trainer(&tb, model, loss, f.batch, memory_efficient, chunk, &dev, &err), &err);
    ct_layer_free(model);
    ct_layer_free(loss);
    const ct_net *na = ct_trainer_net(ta), *nb = ct_trainer_net(tb);
    CHECK(na->n_weights == nb->n_weights && na->n_params == nb->n_params);
    // Same weights, same names: the tail's weights stay the model's.
    bool same_names = true;
    for (int i = 0; i < na->n_params && same_names; i++)
        same_names = strcmp(na->params[i]->full_name, nb->params[i]->full_name) == 0;
    CHECK_MSG(same_names, "%s: weight names differ", name);
    CHECK(memcmp(na->weights, nb->weights, na->n_weights * sizeof(float)) == 0);

    // Adam moves a weight whose gradient is zero but for rounding (an
    // attention key bias: softmax ignores a shift common to all keys) by
    // up to lr |dg| / eps per step for a gradient difference dg (the
    // derivative of g / (|g| + eps) is at most 1 / eps): 100 |dg| at lr
    // 1e-3, eps 1e-5. So each weight after two steps may differ by TOL
    // relative plus what its own two measured gradient differences
    // explain (drift), and no more.
    const float lr = 1e-3f, eps = ct_adam_default_params().eps;
    double max_loss = 0, max_grad = 0, max_eval = 0;
    double *drift = calloc(na->n_weights, sizeof *drift);
    CHECK(drift != NULL);
    if (!drift) return;
    const char *worst_grad = "", *worst_weight = "";
    for (int step = 1; step <= 2; step++) {
        ct_step_stats sa, sb;
        ct_key key = ct_key_from_seed(10 + (uint64_t)step);
        CHECK_OK(ct_trainer_one_step(ta, f.batch, key, step, lr, &sa, &err), &err);
        CHECK_OK(ct_trainer_one_step(tb, f.batch, key, step, lr, &sb, &err), &err);
        double e = fabs((double)sa.loss - sb.loss) / fabs((double)sa.loss);
        if (e > max_loss || isnan(e)) max_loss = e;
        // Step 1's gradients are held to TOL; step 2's come from weights
        // that already differ (by the drift above), so they only add to it.
        const float *ga = ct_trainer_grads(ta), *gb = ct_trainer_grads(tb);
        if (step == 1) max_grad = net_diff(na, ga, gb, &worst_grad);
        for (size_t i = 0; i < na->n_weights; i++) drift[i] += lr / eps * fabs((double)ga[i] - gb[i]);
        float la, lb;
        CHECK_OK(ct_trainer_eval_loss(ta, f.batch, key, &la, &err), &err);
        CHECK_OK(ct_trainer_eval_loss(tb, f.batch, key, &lb, &err), &err);
        e = fabs((double)la - lb) / fabs((double)la);
        if (e > max_eval || isnan(e)) max_eval = e;
    }
    // The largest difference beyond its drift, relative to the largest weight.
    double max_weight = 0, max_abs = 0;
    for (int i = 0; i < na->n_params; i++) {
        const ct_param *p = na->params[i];
        for (size_t k = p->offset; k < p->offset + (size_t)ct_tensor_numel(&p->sig); k++) {
            double beyond = fabs((double)na->weights[k] - nb->weights[k]) - drift[k];
            if (beyond > max_weight || isnan(beyond)) max_weight = beyond, worst_weight = p->full_name;
            if (fabs(na->weights[k]) > max_abs) max_abs = fabs(na->weights[k]);
        }
    }
    max_weight /= max_abs;
    free(drift);
    printf("%s: max rel diff: loss %.2e, eval loss %.2e, step-1 gradients %.2e (%s), weights after 2 Adam steps "
           "beyond Adam's drift %.2e (%s)\n",
           name, max_loss, max_eval, max_grad, worst_grad, max_weight, worst_weight);
    CHECK_MSG(max_loss <= TOL, "%s: loss %g", name, max_loss);
    CHECK_MSG(max_eval <= TOL, "%s: eval loss %g", name, max_eval);
    CHECK_MSG(max_grad <= TOL, "%s: gradient of %s %g", name, worst_grad, max_grad);
    CHECK_MSG(max_weight <= TOL, "%s: weight %s %g beyond Adam's drift", name, worst_weight, max_weight);
    ct_trainer_free(ta);
    ct_trainer_free(tb);
    CHECK(dev.current_bytes == 0);
}

// With dropout each chunk draws its own masks: the step runs, is finite and
// repeats itself bitwise from the same key and weights.
static void test_dropout(bool memory_efficient) {
    lm_batch f;
    lm_batch_init(&f);
    ct_device dev = ct_device_cpu();
    ct_error err;
    float losses[2];
    for (int run = 0; run < 2; run++) {
        ct_trainer *tr;
        ct_layer *model = make_model(true, 0.1f), *loss = ct_weighted_category_cross_entropy();
        CHECK_OK(make_trainer(&tr, model, loss, f.batch, memory_efficient, 5, &dev, &err), &err);
        ct_layer_free(model);
        ct_layer_free(loss);
        ct_step_stats s;
        for (int step = 1; step <= 2; step++)
            CHECK_OK(ct_trainer_one_step(tr, f.batch, ct_key_from_seed(20 + (uint64_t)step), step, 1e-3f, &s, &err),
                     &err);
        losses[run] = s.loss;
        ct_trainer_free(tr);
    }
    printf("dropout 0.1, %s, chunks of 5: step-2 loss %.6f and %.6f\n",
           memory_efficient ? "memory-efficient" : "standard", (double)losses[0], (double)losses[1]);
    CHECK(isfinite(losses[0]) && losses[0] == losses[1]);
}

// One chunk of every row keeps the tail's keys (the layers' own, as
// unchunked): with dropout the loss and gradients of a step equal the
// unchunked step's, the masks included.
static void test_one_chunk_dropout(bool memory_efficient) {
    lm_batch f;
    lm_batch_init(&f);
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_trainer *tr[2];
    for (int i = 0; i < 2; i++) {
        ct_layer *model = make_model(true, 0.1f), *loss = ct_weighted_category_cross_entropy();
        CHECK_OK(make_trainer(&tr[i], model, loss, f.batch, memory_efficient, i ? 1000 : 0, &dev, &err), &err);
        ct_layer_free(model);
        ct_layer_free(loss);
    }
    check_same_step(tr, f.batch, 30,
                    memory_efficient ? "dropout 0.1, memory-efficient, one chunk of every row vs unchunked"
                                     : "dropout 0.1, standard, one chunk of every row vs unchunked");
    for (int i = 0; i < 2; i++) ct_trainer_free(tr[i]);
    CHECK(dev.current_bytes == 0);
}

// A model that is one row-wise layer, not a Serial (Dense on f32 rows): the
// whole model is the tail, chunked; one step's loss and gradients equal the
// unchunked step's.
static void test_one_layer_model(bool memory_efficient) {
    enum { D = 4 };
    lm_batch f;
    lm_batch_init(&f);
    float x[BATCH * LEN * D];
    ct_tensor batch[3] = {ct_tensor_3d(CT_DTYPE_F32, BATCH, LEN, D, x), f.batch[1], f.batch[2]};
    gradcheck_fill(&batch[0], 5, -1.0f, 1.0f);
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_trainer *tr[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        ct_layer *model = ct_dense(VOCAB), *loss = ct_weighted_category_cross_entropy();
        CHECK_OK(make_trainer(&tr[i], model, loss, batch, memory_efficient, i ? 5 : 0, &dev, &err), &err);
        ct_layer_free(model);
        ct_layer_free(loss);
    }
    if (tr[0] && tr[1]) {
        check_same_step(tr, batch, 40,
                        memory_efficient ? "model Dense (no Serial), memory-efficient, chunks of 5 vs unchunked"
                                         : "model Dense (no Serial), standard, chunks of 5 vs unchunked");
    }
    for (int i = 0; i < 2; i++)
        if (tr[i]) ct_trainer_free(tr[i]);
    CHECK(dev.current_bytes == 0);
}

// ---- refusals ------------------------------------------------------------------------------

static void expect_refused(const char *what, ct_layer *model, ct_layer *loss, bool memory_efficient, int64_t chunk,
                           const char *needle) {
    lm_batch f;
    lm_batch_init(&f);
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = NULL;
    ct_error err;
    ct_error_clear(&err);
    ct_status st = make_trainer(&tr, model, loss, f.batch, memory_efficient, chunk, &dev, &err);
    printf("refused (%s, %s): %s\n", what, memory_efficient ? "memory-efficient" : "standard", err.msg);
    CHECK_MSG(st == CT_ERR_ARG && tr == NULL, "%s: status %d", what, (int)st);
    CHECK_MSG(strstr(err.msg, "loss_chunk_size") && strstr(err.msg, needle), "%s: %s", what, err.msg);
    if (tr) ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

static void test_refusals(void) {
    for (int me = 0; me < 2; me++) {
        // Ends with a Residual block: no row-wise tail.
        ct_layer *block = ct_residual(CT_LAYERS(ct_dense(VOCAB)), NULL);
        ct_layer *model = ct_serial(CT_LAYERS(ct_embedding(VOCAB, 8), ct_dense(VOCAB), block));
        model = ct_layer_rename(model, "NoTail");
        expect_refused("no row-wise tail", model, ct_weighted_category_cross_entropy(), me, 8, "Residual");
        // A loss that is not a mean over rows.
        model = make_model(false, 0.0f);
        ct_layer *loss = ct_serial(CT_LAYERS(ct_log_softmax(), ct_cross_entropy_loss()));
        expect_refused("loss not a row mean", model, loss, me, 8, "not a mean over rows");
        expect_refused("negative size", make_model(false, 0.0f), ct_weighted_category_cross_entropy(), me, -1,
                       "must be >= 0");
    }
}

// ---- memory ----------------------------------------------------------------------------------

// ReformerLM with vocab 256 and T 4096, B 1 (local attention, so the logits
// and their gradient dominate): one step's device peak with and without
// chunks of 512 rows. Step 1 peaks no higher than later steps.
static void test_memory(bool memory_efficient) {
    enum { T = 4096, V = 256 };
    int32_t *tokens = ct_malloc(T * sizeof *tokens);
    float *weights = ct_malloc(T * sizeof *weights);
    for (int i = 0; i < T; i++) {
        tokens[i] = (int32_t)(ct_random_bits(ct_key_from_seed(3), (uint32_t)i) % V);
        weights[i] = 1.0f;
    }
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, 1, T, tokens), ct_tensor_2d(CT_DTYPE_I32, 1, T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, 1, T, weights)};
    size_t peaks[2];
    float first_loss[2];
    for (int chunked = 0; chunked < 2; chunked++) {
        ct_reformer_lm_params p = ct_reformer_lm_default_params();
        p.vocab_size = V;
        p.d_model = 32;
        p.d_ff = 64;
        p.n_layers = 2;
        p.n_heads = 2;
        p.max_len = T;
        p.dropout = 0.0f;
        p.n_attention = 1;
        p.attention[0] = CT_REFORMER_SELF_ATTENTION;
        p.d_attention_key = p.d_attention_value = 16;  // d_model / n_heads: the logits dominate
        p.self_attention.chunk_len = 64;
        p.self_attention.n_chunks_before = 1;
        ct_layer *model = ct_reformer_lm(p), *loss = ct_weighted_category_cross_entropy();
        ct_device dev = ct_device_cpu();
        ct_trainer *tr;
        ct_error err;
        CHECK_OK(make_trainer(&tr, model, loss, batch, memory_efficient, chunked ? 512 : 0, &dev, &err), &err);
        ct_layer_free(model);
        ct_layer_free(loss);
        const ct_memory_plan *plan = ct_trainer_memory_plan(tr);
        ct_device_reset_peak(&dev);
        ct_step_stats s;
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(4), 1, 1e-3f, &s, &err), &err);
        size_t peak1 = dev.peak_bytes;
        first_loss[chunked] = s.loss;
        ct_device_reset_peak(&dev);
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(5), 2, 1e-3f, &s, &err), &err);
        size_t peak2 = dev.peak_bytes;
        char line[512];
        printf("ReformerLM V %d, T %d, B 1, %s, loss_chunk_size %d: device peak step 1 %.2f MiB, step 2 %.2f MiB "
               "(plan %.2f MiB; activations %.2f MiB)\n  %s\n",
               V, T, memory_efficient ? "memory-efficient" : "standard", chunked ? 512 : 0, peak1 / 1048576.0,
               peak2 / 1048576.0, plan->device_bytes / 1048576.0, plan->activations / 1048576.0,
               ct_memory_plan_format(plan, line, sizeof line));
        CHECK_MSG(peak1 <= peak2, "step 1 peaks at %zu bytes, step 2 at %zu", peak1, peak2);
        peaks[chunked] = peak2;
        ct_trainer_free(tr);
        CHECK(dev.current_bytes == 0);
    }
    printf("  chunked / unchunked peak: %.3f; step-1 losses %.7f, %.7f\n", (double)peaks[1] / (double)peaks[0],
           (double)first_loss[0], (double)first_loss[1]);
    // The logits (4 MiB) and their gradient no longer exist at once.
    CHECK_MSG(peaks[1] + ((size_t)4 << 20) < peaks[0], "chunked peak %zu, unchunked %zu", peaks[1], peaks[0]);
    CHECK(fabs((double)first_loss[0] - first_loss[1]) <= TOL * fabs((double)first_loss[0]));
    ct_free(tokens);
    ct_free(weights);
}

int main(void) {
    test_gradcheck();
    test_zero_weight_chunks();
    test_chunk_masks_differ();
    for (int me = 0; me < 2; me++)
        for (int reformer = 0; reformer < 2; reformer++) {
            test_equal(reformer, me, 8, 0.0f);  // divides B*T = 32
            test_equal(reformer, me, 5, 0.0f);  // 6 chunks of 5 and one of 2
            test_equal(reformer, me, 5, 0.1f);  // label smoothing
        }
    test_equal(true, true, 1000, 0.0f);  // one chunk of every row
    // So is the largest (train.loss_chunk_size = 2^63 - 1): rows + chunk
    // once overflowed, no chunk ran and the step failed.
    test_equal(false, false, INT64_MAX, 0.0f);
    test_equal(true, true, INT64_MAX, 0.0f);
    test_dropout(false);
    test_dropout(true);
    test_one_chunk_dropout(false);
    test_one_chunk_dropout(true);
    test_one_layer_model(false);
    test_one_layer_model(true);
    test_refusals();
    test_memory(true);
    test_memory(false);
    return check_summary("test_chunked_loss");
}
