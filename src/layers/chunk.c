// Chunk: a one-in one-out layer over row chunks, as Trax's
// BatchLeadingAxes(Chunk(layer, c)) for ReformerLM's ff_chunk_size
// (REFORMER.md section 4). The input (..., D) is viewed as (n, D) rows,
// n = the product of the leading axes; the sublayer runs on (c, D) chunks
// (one chunk of n rows when c does not divide n, as Trax), chunk i with key
// ct_key_fold_in(key, i) and the one set of weights, so their gradients add
// up. Outputs (c, D') are put back as (..., D').
//
// Memory: forward keeps no tape for the sublayer (its activations die with
// each chunk); backward recomputes chunk i's forward with the tape on, runs
// its backward, and gives the chunk's arena back before the next one. So the
// peak is one chunk's activations (c x d_ff for a feed-forward), not n x
// d_ff, at the cost of a second forward: Trax's Scan rematerialises the same
// way. Nothing on the tape but the input.
#include <stdio.h>
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/layer_author.h"
#include "layers/internal.h"

typedef struct chunk_hp {
    int chunk_size;  // c >= 1 as given
} chunk_hp;

// Rows n and the chunk length used for x: c if it divides n, else n.
static int64_t chunk_rows(const ct_layer *l, const ct_tensor *x, int64_t *n) {
    int64_t c = ((const chunk_hp *)l->hp)->chunk_size;
    *n = ct_tensor_dims_product(x, 0, x->ndim - 1);
    return *n > 0 && *n % c == 0 ? c : *n;
}

static ct_status chunk_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim < 2)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 (..., D) of rank >= 2",
                             ct_tensor_sig_str(x, s, sizeof s));
    return CT_OK;
}

// The sublayer's output for a (rows, D) chunk must be (rows, D'), with D'
// init's (d_out; -1 at init, which sets it): the output was allocated for
// it, and an input of another width than init's can change it.
static ct_status chunk_check_out(const ct_layer *l, const ct_tensor *y, int64_t rows, int64_t d_out, const char *op,
                                 ct_error *err) {
    if (y->dtype != CT_DTYPE_F32 || y->ndim != 2 || y->shape[0] != rows || (d_out >= 0 && y->shape[1] != d_out)) {
        char s[CT_SIG_STR_MAX], d[24] = "D'";
        if (d_out >= 0) snprintf(d, sizeof d, "%lld", (long long)d_out);
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "the sublayer gives %s for a chunk of %lld rows, expected f32 (%lld, %s)",
                             ct_tensor_sig_str(y, s, sizeof s), (long long)rows, (long long)rows, d);
    }
    return CT_OK;
}

// D', the sublayer's output width that init saw.
static int64_t chunk_d_out(const ct_layer *l) { return l->out_sigs[0].shape[l->out_sigs[0].ndim - 1]; }

// (..., D) with the last axis replaced by d.
static ct_tensor chunk_out_sig(const ct_tensor *x, int64_t d) {
    ct_tensor o = ct_tensor_sig(x);
    o.shape[o.ndim - 1] = d;
    return o;
}

static ct_status chunk_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    CT_TRY(chunk_check(l, &in[0], "init", err));
    int64_t n, rows = chunk_rows(l, &in[0], &n);
    ct_tensor sub_in = ct_tensor_2d(CT_DTYPE_F32, rows, in[0].shape[in[0].ndim - 1], NULL), sub_out;
    CT_TRY(ct_layer_init(l->sub[0], 0, ic, &sub_in, &sub_out, ct_key_split(key, 0), err));
    CT_TRY(chunk_check_out(l, &sub_out, rows, -1, "init", err));
    out[0] = chunk_out_sig(&in[0], sub_out.shape[1]);
    return CT_OK;
}

// Chunk i of x (..., D) as a (rows, D) tensor over x's memory.
static ct_tensor chunk_view(const ct_tensor *x, int64_t i, int64_t rows) {
    int64_t d = x->shape[x->ndim - 1];
    return ct_tensor_2d(CT_DTYPE_F32, rows, d, (float *)x->data + i * rows * d);
}

static ct_status chunk_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    const ct_tensor *x = &in[0];
    CT_TRY(chunk_check(l, x, "forward", err));
    int64_t n, rows = chunk_rows(l, x, &n);
    out[0] = chunk_out_sig(x, chunk_d_out(l));
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    bool record = c->record;
    c->record = false;  // backward recomputes: no chunk's activations outlive it
    ct_status st = CT_OK;
    for (int64_t i = 0; rows > 0 && i < n / rows && st == CT_OK; i++) {
        ct_tensor xi = chunk_view(x, i, rows), yi;
        st = ct_layer_forward(l->sub[0], c, &xi, &yi, ct_key_fold_in(key, (uint32_t)i), err);
        if (st == CT_OK) st = chunk_check_out(l, &yi, rows, chunk_d_out(l), "forward", err);
        if (st == CT_OK) memcpy(chunk_view(&out[0], i, rows).data, yi.data, ct_tensor_nbytes(&yi));
        ct_arena_reset_to(c->arena, mark);
    }
    c->record = record;
    CT_TRY(st);
    return ct_tape_push(c, x, err);
}

// Chunk i's forward (taped) and backward; its input gradient, if any, goes
// into gx's rows.
static ct_status chunk_grad_one(ct_layer *l, ct_ctx *c, const ct_tensor *x, const ct_tensor *gy,
                                ct_tensor *gx, int64_t i, int64_t rows, ct_key key, ct_error *err) {
    ct_tensor xi = chunk_view(x, i, rows), yi, gyi = chunk_view(gy, i, rows), gxi;
    ct_key ki = ct_key_fold_in(key, (uint32_t)i);
    CT_TRY(ct_layer_forward(l->sub[0], c, &xi, &yi, ki, err));
    CT_TRY(chunk_check_out(l, &yi, rows, chunk_d_out(l), "backward", err));
    CT_TRY(ct_layer_backward(l->sub[0], c, &gyi, &gxi, ki, err));
    if (!gxi.data) return CT_OK;  // a zero gradient adds nothing
    float *dst = chunk_view(gx, i, rows).data;
    const float *src = gxi.data;
    int64_t m = ct_tensor_numel(&xi);
    for (int64_t j = 0; j < m; j++) dst[j] += src[j];
    return CT_OK;
}

static ct_status chunk_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                ct_key key, ct_error *err) {
    ct_tensor x = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&x);
    if (!grad_out[0].data) return CT_OK;  // no gradient flows
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    int64_t n, rows = chunk_rows(l, &x, &n);
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    bool record = c->record;
    c->record = true;  // the recomputed chunk's tape feeds its backward
    ct_status st = CT_OK;
    for (int64_t i = 0; rows > 0 && i < n / rows && st == CT_OK; i++) {
        st = chunk_grad_one(l, c, &x, &grad_out[0], &grad_in[0], i, rows, key, err);
        ct_arena_reset_to(c->arena, mark);
    }
    c->record = record;
    return st;
}

static const ct_layer_vtable chunk_vt = {
    .type = "Chunk", .init = chunk_init, .forward = chunk_forward, .backward = chunk_backward};

ct_layer *ct_chunk(ct_layer *layer, int chunk_size) {
    CT_ASSERT(layer && layer->n_in == 1 && layer->n_out == 1);
    if (chunk_size < 1) return layer;  // Trax: Chunk(layer, c < 1) is the layer itself
    chunk_hp *hp = ct_malloc(sizeof *hp);
    hp->chunk_size = chunk_size;
    return ct_layer_new(&chunk_vt, "Chunk", 1, 1, hp, (ct_layer *[]){layer}, 1);
}
