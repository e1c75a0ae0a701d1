// Reversible layers: ReversibleHalfResidual, ReversibleSwap, ReversibleSerial
// (see include/ctrax/layers/reversible.h for the reverse/reverse_and_grad
// contract).
#include "ctrax/layers/reversible.h"

#include <string.h>

#include "ctrax/layers/combinators.h"
#include "layers/internal.h"
#include "layers/stack.h"

bool ct_layer_is_reversible(const ct_layer *l) { return l->vt->reverse_and_grad != NULL; }

// Both run l with no donation in force (a walk donates nothing before a
// reverse), as ct_layer_forward and ct_layer_backward hand theirs to one
// layer only: a donation held by the caller must not reach l, whose halves
// would write over it.
ct_status ct_layer_reverse(ct_layer *l, ct_ctx *c, const ct_tensor *out, ct_tensor *in, ct_key key,
                           ct_error *err) {
    CT_ASSERT(l->vt->reverse);
    const void *outer = ct_arena_take_donation(c->arena);
    ct_status st = l->vt->reverse(l, c, out, in, key, err);
    ct_arena_end_donation(c->arena, outer);
    return st;
}

ct_status ct_layer_reverse_and_grad(ct_layer *l, ct_ctx *c, const ct_tensor *out,
                                    const ct_tensor *grad_out, ct_tensor *in, ct_tensor *grad_in,
                                    ct_key key, ct_error *err) {
    CT_ASSERT(l->vt->reverse_and_grad);
    const void *outer = ct_arena_take_donation(c->arena);
    ct_status st = l->vt->reverse_and_grad(l, c, out, grad_out, in, grad_in, key, err);
    ct_arena_end_donation(c->arena, outer);
    return st;
}

// a + b for gradients where either may be NULL-data (zero): a is a context's
// output gradient, b f's gradient of that context. Over a when that was
// donated (ct_ctx_sum_keep_b), never over b: f may hand back the
// accumulator's gradient as b (an identity f; an Add in f gives both its
// inputs its output gradient), which the half also passes on as grad_in[0].
static ct_status grad_sum(ct_ctx *c, const ct_tensor *a, const ct_tensor *b, ct_tensor *sum,
                          ct_error *err) {
    if (a->data && b->data) return ct_ctx_sum_keep_b(c, a, b, sum, err);
    *sum = a->data ? *a : b->data ? *b : ct_tensor_sig(a);
    return CT_OK;
}

// ---- ReversibleHalfResidual -------------------------------------------------
//
// sub[0] is f = Serial(layers). Stack: in[0] = acc, in[1..n_ctx] = ctx.

static ct_status half_check_residual(const ct_layer *l, const ct_tensor *acc, const ct_tensor *r,
                                     const char *op, ct_error *err) {
    if (acc->dtype != CT_DTYPE_F32 || !ct_tensor_same_sig(acc, r)) {
        char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "accumulator %s and residual %s differ (need one f32 shape)",
                             ct_tensor_sig_str(acc, a, sizeof a), ct_tensor_sig_str(r, b, sizeof b));
    }
    return CT_OK;
}

static ct_status half_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                           ct_key key, ct_error *err) {
    ct_layer *f = l->sub[0];
    ct_tensor f_out[CT_LAYER_MAX_IO];
    CT_TRY(ct_layer_init(f, 0, ic, in + 1, f_out, ct_key_split(key, 0), err));
    if (f->n_out < 1)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "the residual function leaves no output");
    CT_TRY(half_check_residual(l, &in[0], &f_out[0], "init", err));
    for (int i = 0; i < l->n_out; i++) out[i] = ct_tensor_sig(&in[i]);
    return CT_OK;
}

// out[0] = acc + f(ctx); out[i] = in[i] for the context. Nothing of its own
// on the tape but the signatures of f's dropped outputs (for their zero
// gradients); f saves what it needs.
static ct_status half_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                              ct_key key, ct_error *err) {
    ct_layer *f = l->sub[0];
    ct_tensor r[CT_LAYER_MAX_IO];
    CT_TRY(ct_layer_forward(f, c, in + 1, r, ct_key_split(key, 0), err));
    CT_TRY(half_check_residual(l, &in[0], &r[0], "forward", err));
    for (int j = 1; j < f->n_out; j++) CT_TRY(ct_tape_push_sig(c, &r[j], err));
    // Over a donated accumulator, never over r: f may return a context
    // unchanged (an identity f), and the context goes on as out[1..].
    CT_TRY(ct_ctx_sum_keep_b(c, &in[0], &r[0], &out[0], err));
    for (int i = 1; i < l->n_out; i++) out[i] = in[i];
    return CT_OK;
}

// Backward of f from the accumulator's gradient (f's dropped outputs get
// none), then the context gradients: incoming + f's. dropped[] are the
// signatures of f's outputs past the first.
static ct_status half_grads(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, const ct_tensor *dropped,
                            ct_tensor *grad_in, ct_key key, ct_error *err) {
    ct_layer *f = l->sub[0];
    ct_tensor f_gout[CT_LAYER_MAX_IO], f_gin[CT_LAYER_MAX_IO];
    f_gout[0] = grad_out[0];
    for (int j = 1; j < f->n_out; j++) f_gout[j] = dropped[j];
    CT_TRY(ct_layer_backward(f, c, f_gout, f_gin, ct_key_split(key, 0), err));
    grad_in[0] = grad_out[0];
    for (int i = 1; i < l->n_in; i++) CT_TRY(grad_sum(c, &grad_out[i], &f_gin[i - 1], &grad_in[i], err));
    return CT_OK;
}

static ct_status half_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                               ct_key key, ct_error *err) {
    ct_layer *f = l->sub[0];
    ct_tensor dropped[CT_LAYER_MAX_IO];
    for (int j = f->n_out - 1; j >= 1; j--) dropped[j] = ct_tape_pop(c);
    return half_grads(l, c, grad_out, dropped, grad_in, key, err);
}

// in[0] = out[0] - r, into memory allocated before r so that what f
// allocated can be given back.
static void half_subtract(ct_tensor *acc, const ct_tensor *out0, const ct_tensor *r) {
    const float *a = out0->data, *b = r->data;
    float *o = acc->data;
    int64_t n = ct_tensor_numel(acc);
    for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i];
}

static ct_status half_reverse(ct_layer *l, ct_ctx *c, const ct_tensor *out, ct_tensor *in, ct_key key,
                              ct_error *err) {
    ct_layer *f = l->sub[0];
    in[0] = ct_tensor_sig(&out[0]);
    CT_TRY(ct_ctx_alloc(c, &in[0], err));
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    bool record = c->record;
    c->record = false;
    ct_tensor r[CT_LAYER_MAX_IO];
    ct_status st = ct_layer_forward(f, c, out + 1, r, ct_key_split(key, 0), err);
    c->record = record;
    CT_TRY(st);
    CT_TRY(half_check_residual(l, &out[0], &r[0], "reverse", err));
    half_subtract(&in[0], &out[0], &r[0]);
    ct_arena_reset_to(c->arena, mark);
    for (int i = 1; i < l->n_in; i++) in[i] = out[i];
    return CT_OK;
}

static ct_status half_reverse_and_grad(ct_layer *l, ct_ctx *c, const ct_tensor *out,
                                       const ct_tensor *grad_out, ct_tensor *in, ct_tensor *grad_in,
                                       ct_key key, ct_error *err) {
    ct_layer *f = l->sub[0];
    in[0] = ct_tensor_sig(&out[0]);
    CT_TRY(ct_ctx_alloc(c, &in[0], err));
    bool record = c->record;
    int tape_len = c->tape_len;
    c->record = true;
    ct_tensor r[CT_LAYER_MAX_IO], dropped[CT_LAYER_MAX_IO];
    ct_status st = ct_layer_forward(f, c, out + 1, r, ct_key_split(key, 0), err);
    if (st == CT_OK) st = half_check_residual(l, &out[0], &r[0], "reverse_and_grad", err);
    if (st == CT_OK) {
        half_subtract(&in[0], &out[0], &r[0]);
        for (int j = 1; j < f->n_out; j++) dropped[j] = ct_tensor_sig(&r[j]);
        st = half_grads(l, c, grad_out, dropped, grad_in, key, err);
    }
    c->record = record;
    if (st != CT_OK) {
        ct_tape_truncate(c, tape_len);  // drop what a failed recomputation left
        return st;
    }
    CT_ASSERT(c->tape_len == tape_len);
    for (int i = 1; i < l->n_in; i++) in[i] = out[i];
    return CT_OK;
}

static const ct_layer_vtable half_vt = {
    .type = "ReversibleHalfResidual", .init = half_init, .forward = half_forward, .backward = half_backward,
    .reverse = half_reverse, .reverse_and_grad = half_reverse_and_grad};

ct_layer *ct_reversible_half_residual(int n, ct_layer **layers) {
    ct_layer *f = ct_serial(n, layers);
    CT_ASSERT(f->n_in + 1 <= CT_LAYER_MAX_IO);
    ct_layer *sub[1] = {f};
    return ct_layer_new(&half_vt, "ReversibleHalfResidual", f->n_in + 1, f->n_in + 1, NULL, sub, 1);
}

// ---- ReversibleSwap -------------------------------------------------------------

static ct_status swap_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                           ct_key key, ct_error *err) {
    (void)l, (void)ic, (void)key, (void)err;
    out[0] = ct_tensor_sig(&in[1]);
    out[1] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

// [a, b] -> [b, a]; also its backward (on gradients) and its reverse.
static ct_status swap_apply(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    (void)l, (void)c, (void)key, (void)err;
    ct_tensor a = in[0], b = in[1];
    out[0] = b;
    out[1] = a;
    return CT_OK;
}

static ct_status swap_reverse_and_grad(ct_layer *l, ct_ctx *c, const ct_tensor *out,
                                       const ct_tensor *grad_out, ct_tensor *in, ct_tensor *grad_in,
                                       ct_key key, ct_error *err) {
    CT_TRY(swap_apply(l, c, out, in, key, err));
    return swap_apply(l, c, grad_out, grad_in, key, err);
}

static const ct_layer_vtable swap_vt = {
    .type = "ReversibleSwap", .init = swap_init, .forward = swap_apply, .backward = swap_apply, .reverse = swap_apply,
    .reverse_and_grad = swap_reverse_and_grad};

ct_layer *ct_reversible_swap(void) {
    return ct_layer_new_hp(&swap_vt, 2, 2, NULL, 0);
}

// ---- ReversibleSerial -------------------------------------------------------------

static ct_status rserial_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                              ct_key key, ct_error *err) {
    for (int i = 0; i < l->n_sub; i++)
        if (!ct_layer_is_reversible(l->sub[i]))
            return ct_layer_fail(l, err, CT_ERR_ARG, "init", "sublayer %d (%s) is not reversible", i,
                                 l->sub[i]->name);
    return ct_serial_init(l, ic, in, out, key, err);
}

// Forward and backward are Serial's (layers/stack.h).

static ct_status rserial_reverse(ct_layer *l, ct_ctx *c, const ct_tensor *out, ct_tensor *in, ct_key key,
                                 ct_error *err) {
    return ct_stack_walk(l, CT_STACK_REVERSE, NULL, c, out, in, key, err);
}

static ct_status rserial_reverse_and_grad(ct_layer *l, ct_ctx *c, const ct_tensor *out,
                                          const ct_tensor *grad_out, ct_tensor *in, ct_tensor *grad_in,
                                          ct_key key, ct_error *err) {
    // live: the values (depth items), then their gradients (depth more).
    // After each sublayer only those are needed (its tape is balanced on
    // return), so the rest goes back to the arena, as in a reverse walk
    // (combinators.c: at a gain of 1): the memory of a reversible stack
    // must not grow with its depth.
    ct_tensor live[2 * CT_STACK_MAX], ins[CT_LAYER_MAX_IO], gins[CT_LAYER_MAX_IO];
    ct_tensor *vals = live, *grads = live + CT_STACK_MAX;
    int depth = l->n_out;
    memcpy(vals, out, (size_t)depth * sizeof *vals);
    memcpy(grads, grad_out, (size_t)depth * sizeof *grads);
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    for (int i = l->n_sub - 1; i >= 0; i--) {
        ct_layer *s = l->sub[i];
        CT_TRY(ct_layer_reverse_and_grad(s, c, vals, grads, ins, gins, ct_key_split(key, (uint32_t)i), err));
        ct_stack_replace(vals, depth, s->n_out, ins, s->n_in);
        depth = ct_stack_replace(grads, depth, s->n_out, gins, s->n_in);
        memmove(live + depth, grads, (size_t)depth * sizeof *live);  // the two stacks side by side
        ct_stack_keep_live(c, mark, live, 2 * depth, c->tape_len, 1);
        memmove(grads, live + depth, (size_t)depth * sizeof *live);
    }
    memcpy(in, vals, (size_t)l->n_in * sizeof *in);
    memcpy(grad_in, grads, (size_t)l->n_in * sizeof *grad_in);
    return CT_OK;
}

static const ct_layer_vtable rserial_vt = {
    .type = "ReversibleSerial", .init = rserial_init, .forward = ct_serial_forward, .backward = ct_serial_backward,
    .reverse = rserial_reverse, .reverse_and_grad = rserial_reverse_and_grad};

ct_layer *ct_reversible_serial(int n, ct_layer **layers) {
    int n_in, n_out;
    ct_stack_arity(n, layers, &n_in, &n_out);
    return ct_layer_new(&rserial_vt, "ReversibleSerial", n_in, n_out, NULL, layers, n);
}
