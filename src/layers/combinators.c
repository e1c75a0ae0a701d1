// Combinators (Serial, Parallel, Branch, Residual) and the weightless stack
// layers (Select, Dup, Swap, Drop, Add, Multiply, Concatenate, Split, Fn).
//
// Gradient tensors may alias one another (Select and Add hand the same
// gradient to two inputs), so no layer writes into a grad_out it was given.
#include "ctrax/layers/combinators.h"

#include "ctrax/layers/reversible.h"
#include "kernels/cpu/activation.h"
#include "layers/internal.h"
#include "layers/stack.h"

#include <string.h>

// ---- Serial ------------------------------------------------------------------

// Runs sublayer i of a walk: the op on the stack's top x into y.
static ct_status walk_one(ct_layer *s, int i, ct_stack_op op, ct_init_ctx *ic, ct_ctx *c, const ct_tensor *x,
                          ct_tensor *y, ct_key key, ct_error *err) {
    ct_key k = ct_key_split(key, (uint32_t)i);
    switch (op) {
    case CT_STACK_INIT: return ct_layer_init(s, i, ic, x, y, k, err);
    case CT_STACK_FORWARD: return ct_layer_forward(s, c, x, y, k, err);
    case CT_STACK_BACKWARD: return ct_layer_backward(s, c, x, y, k, err);
    case CT_STACK_REVERSE: break;
    }
    return ct_layer_reverse(s, c, x, y, k, err);
}

// After each sublayer, of what the walk allocated since mark only what the
// stack and the tape records pushed since the walk began (from tape_from)
// point to is still needed; the rest goes back to the arena, the live
// tensors moving down over it when that frees more than it copies
// (ct_arena_keep; tape records and stack items move with their data).
// Forward, that frees outputs the next sublayer consumed without saving --
// the d_ff-wide Dense output under a Relu, a residual branch's output once
// added. Backward, where each sublayer pops its own records and its saved
// tensors come from forward (before the mark), it frees the consumed output
// gradients and the sublayers' scratch: without it, backward's gradients
// would pile up for the whole step, as much again as forward keeps. Reverse
// (a ReversibleSerial rebuilding its inputs) frees each sublayer's outputs
// once the one below has rebuilt its own, so its memory does not grow with
// the depth (ReversibleSerial's reverse_and_grad does the same). A walk
// with more records than ct_arena_keep takes keeps everything (its
// sublayers' own walks gave back what died in them).
//
// A forward copy frees its own size for the rest of forward and through
// backward's peak, so it is made when it frees at least as much as it
// copies; backward's frees last only until the next sublayer, and the same
// gradient would move again at each level of nesting, so there it must
// free twice what it copies (config A: 48 MiB copied per step instead of
// 108, for 2 MiB more arena). Reverse copies at a gain of 1: a rebuilt
// input sits above the output it replaced, so each sublayer frees one
// tensor by moving one, and refusing that would let the memory grow with
// the depth, which is what a reversible stack is for.
void ct_stack_keep_live(ct_ctx *c, ct_arena_mark mark, ct_tensor *stack, int depth, int tape_from,
                        size_t min_gain) {
    int n_tape = c->tape_len > tape_from ? c->tape_len - tape_from : 0;
    if (depth + n_tape > CT_ARENA_KEEP_MAX) return;
    void **data[CT_ARENA_KEEP_MAX];
    size_t bytes[CT_ARENA_KEEP_MAX];
    int n = 0;
    for (int k = 0; k < depth; k++, n++) {
        data[n] = &stack[k].data;
        bytes[n] = stack[k].data ? ct_tensor_nbytes(&stack[k]) : 0;
    }
    for (int k = tape_from; k < tape_from + n_tape; k++, n++) {
        data[n] = &c->tape[k].data;
        bytes[n] = c->tape[k].data ? ct_tensor_nbytes(&c->tape[k]) : 0;
    }
    ct_arena_keep(c->arena, mark, data, bytes, n, min_gain);
}

static bool overlaps(const ct_tensor *t, const unsigned char *p, size_t n) {
    const unsigned char *q = t->data;
    return q && q < p + n && p < q + ct_tensor_nbytes(t);
}

// Before sublayer s runs on the stack's top: donates the first of the n it
// consumes (forward its inputs, backward its output gradients) that nothing
// reads after it (ct_arena_donate) -- memory the walk allocated (so no
// caller holds it), no other stack item and no tape record pushed since the
// walk began (from tape_from) overlapping it -- so an elementwise sublayer
// can write its output (input gradient) over it instead of taking new
// memory that a later copy would have to close up. Backward pushes no tape
// records, and the ones it pops were made in forward, before its mark.
static void donate_dead_operand(ct_ctx *c, ct_arena_mark mark, int n, const ct_tensor *stack, int depth,
                              int tape_from) {
    for (int i = 0; i < n; i++) {
        const ct_tensor *x = &stack[i];
        size_t bytes = x->data ? ct_tensor_nbytes(x) : 0;
        if (!bytes || !ct_arena_since(c->arena, mark, x->data, bytes)) continue;
        bool read_later = false;
        for (int k = 0; k < depth && !read_later; k++) read_later = k != i && overlaps(&stack[k], x->data, bytes);
        for (int k = tape_from; k < c->tape_len && !read_later; k++)
            read_later = overlaps(&c->tape[k], x->data, bytes);
        if (!read_later) {
            ct_arena_donate(c->arena, x->data);
            return;
        }
    }
}

ct_status ct_stack_walk(ct_layer *l, ct_stack_op op, ct_init_ctx *ic, ct_ctx *c, const ct_tensor *top,
                        ct_tensor *result, ct_key key, ct_error *err) {
    static const char *const op_names[] = {"init", "forward", "backward", "reverse"};
    bool back = op == CT_STACK_BACKWARD || op == CT_STACK_REVERSE;  // from the outputs to the inputs
    ct_tensor stack[CT_STACK_MAX], step[CT_LAYER_MAX_IO];
    int depth = back ? l->n_out : l->n_in;
    memcpy(stack, top, (size_t)depth * sizeof *stack);
    bool run = op != CT_STACK_INIT;
    ct_arena_mark mark = run ? ct_arena_get_mark(c->arena) : (ct_arena_mark){0};
    int tape_from = run ? c->tape_len : 0;
    for (int j = 0; j < l->n_sub; j++) {
        int i = back ? l->n_sub - 1 - j : j;
        ct_layer *s = l->sub[i];
        if (op == CT_STACK_FORWARD) donate_dead_operand(c, mark, s->n_in, stack, depth, tape_from);
        if (op == CT_STACK_BACKWARD) donate_dead_operand(c, mark, s->n_out, stack, depth, tape_from);
        CT_TRY(walk_one(s, i, op, ic, c, stack, step, key, err));
        depth = back ? ct_stack_replace(stack, depth, s->n_out, step, s->n_in)
                     : ct_stack_replace(stack, depth, s->n_in, step, s->n_out);
        if (depth < 0)  // only init can find it: the others run what init checked
            return ct_layer_fail(l, err, CT_ERR_ARG, op_names[op], "stack deeper than %d items", CT_STACK_MAX);
        if (run) ct_stack_keep_live(c, mark, stack, depth, tape_from, op == CT_STACK_BACKWARD ? 2 : 1);
    }
    memcpy(result, stack, (size_t)(back ? l->n_in : l->n_out) * sizeof *result);
    return CT_OK;
}

void ct_stack_arity(int n, ct_layer *const *layers, int *n_in, int *n_out) {
    int running_max = 0, running_total = 0;
    for (int i = 0; i < n; i++) {
        running_total += layers[i]->n_in;
        if (running_total > running_max) running_max = running_total;
        running_total -= layers[i]->n_out;
    }
    *n_in = running_max;
    *n_out = running_max - running_total;
}

ct_status ct_serial_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                         ct_error *err) {
    return ct_stack_walk(l, CT_STACK_INIT, ic, NULL, in, out, key, err);
}

ct_status ct_serial_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    return ct_stack_walk(l, CT_STACK_FORWARD, NULL, c, in, out, key, err);
}

ct_status ct_serial_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                             ct_key key, ct_error *err) {
    return ct_stack_walk(l, CT_STACK_BACKWARD, NULL, c, grad_out, grad_in, key, err);
}

static const ct_layer_vtable serial_vt = {
    .type = "Serial", .init = ct_serial_init, .forward = ct_serial_forward, .backward = ct_serial_backward};

// A plain Serial that may be flattened into the one it is put in. An empty
// one stays: it is a one-in one-out no-op, and flattened it would take that
// item out of the arity (Serial(Drop, Serial()) reaches 2 deep, as Trax's).
static bool flattens(const ct_layer *s) {
    return s->vt == &serial_vt && strcmp(s->name, "Serial") == 0 && s->refcount == 1 && s->n_sub > 0;
}

ct_layer *ct_serial(int n, ct_layer **layers) {
    // Flatten nested plain Serials (Trax does the same); a Serial that is
    // shared or renamed (Branch, Residual, a model) keeps its identity.
    int total = 0;
    for (int i = 0; i < n; i++) total += flattens(layers[i]) ? layers[i]->n_sub : 1;
    ct_layer **subs = ct_malloc((size_t)(total ? total : 1) * sizeof *subs);
    int k = 0;
    for (int i = 0; i < n; i++) {
        ct_layer *s = layers[i];
        if (flattens(s)) {
            for (int j = 0; j < s->n_sub; j++) subs[k++] = ct_layer_ref(s->sub[j]);
            ct_layer_free(s);
        } else {
            subs[k++] = s;
        }
    }
    // No sublayers: Trax's one-in one-out no-op (the identity a Residual
    // with no layers adds, and a Parallel passes an input through).
    int n_in = 1, n_out = 1;
    if (total) ct_stack_arity(total, subs, &n_in, &n_out);
    ct_layer *l = ct_layer_new(&serial_vt, "Serial", n_in, n_out, NULL, subs, total);
    ct_free(subs);
    return l;
}

// ---- Parallel ----------------------------------------------------------------

// Runs op on each sublayer over its own slice of the inputs (x) and outputs
// (y); backward goes from the last sublayer to the first, since sublayers
// pushed to the tape in order and pop in reverse.
static ct_status parallel_walk(ct_layer *l, ct_stack_op op, ct_init_ctx *ic, ct_ctx *c, const ct_tensor *x,
                               ct_tensor *y, ct_key key, ct_error *err) {
    bool back = op == CT_STACK_BACKWARD;
    int i_in = back ? l->n_in : 0, i_out = back ? l->n_out : 0;
    for (int j = 0; j < l->n_sub; j++) {
        int i = back ? l->n_sub - 1 - j : j;
        ct_layer *s = l->sub[i];
        if (back) {
            i_in -= s->n_in;
            i_out -= s->n_out;
            CT_TRY(walk_one(s, i, op, ic, c, x + i_out, y + i_in, key, err));
        } else {
            CT_TRY(walk_one(s, i, op, ic, c, x + i_in, y + i_out, key, err));
            i_in += s->n_in;
            i_out += s->n_out;
        }
    }
    return CT_OK;
}

static ct_status parallel_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                               ct_key key, ct_error *err) {
    return parallel_walk(l, CT_STACK_INIT, ic, NULL, in, out, key, err);
}

static ct_status parallel_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                  ct_key key, ct_error *err) {
    return parallel_walk(l, CT_STACK_FORWARD, NULL, c, in, out, key, err);
}

static ct_status parallel_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out,
                                   ct_tensor *grad_in, ct_key key, ct_error *err) {
    return parallel_walk(l, CT_STACK_BACKWARD, NULL, c, grad_out, grad_in, key, err);
}

static const ct_layer_vtable parallel_vt = {
    .type = "Parallel", .init = parallel_init, .forward = parallel_forward, .backward = parallel_backward};

ct_layer *ct_parallel(int n, ct_layer **layers) {
    int n_in = 0, n_out = 0;
    for (int i = 0; i < n; i++) {
        n_in += layers[i]->n_in;
        n_out += layers[i]->n_out;
    }
    return ct_layer_new(&parallel_vt, "Parallel", n_in, n_out, NULL, layers, n);
}

// ---- Branch and Residual -------------------------------------------------------

ct_layer *ct_branch(int n, ct_layer **layers) {
    // Select copies each sublayer's inputs from the top of the stack.
    int indices[CT_LAYER_MAX_IO], k = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < layers[i]->n_in; j++) {
            CT_ASSERT(k < CT_LAYER_MAX_IO);
            indices[k++] = j;
        }
    ct_layer *parts[2] = {ct_select(k, indices, 0), ct_parallel(n, layers)};
    return ct_layer_rename(ct_serial(2, parts), "Branch");
}

ct_layer *ct_residual(int n, ct_layer **layers, ct_layer *shortcut) {
    ct_layer *body = n == 1 ? layers[0] : ct_serial(n, layers);
    // A missing shortcut is the identity: [x] -> [x].
    ct_layer *identity = ct_layer_rename(ct_select(1, (int[]){0}, 1), "Identity");
    ct_layer *branch_parts[2] = {shortcut ? shortcut : identity, body};
    if (shortcut) ct_layer_free(identity);
    ct_layer *parts[2] = {ct_branch(2, branch_parts), ct_add()};
    return ct_layer_rename(ct_serial(2, parts), "Residual");
}

// ---- Select --------------------------------------------------------------------

typedef struct select_hp {
    int n_indices;
    int indices[CT_LAYER_MAX_IO];
} select_hp;

static ct_status select_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                             ct_key key, ct_error *err) {
    (void)ic, (void)key, (void)err;
    const select_hp *hp = l->hp;
    for (int i = 0; i < hp->n_indices; i++) out[i] = in[hp->indices[i]];
    return CT_OK;
}

static ct_status select_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                ct_key key, ct_error *err) {
    (void)key;
    const select_hp *hp = l->hp;
    for (int i = 0; i < hp->n_indices; i++) out[i] = in[hp->indices[i]];
    // The input signatures, for the zero gradients of inputs no output uses.
    for (int j = 0; j < l->n_in; j++) CT_TRY(ct_tape_push_sig(c, &in[j], err));
    return CT_OK;
}

static ct_status select_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out,
                                 ct_tensor *grad_in, ct_key key, ct_error *err) {
    (void)key;
    const select_hp *hp = l->hp;
    for (int j = l->n_in - 1; j >= 0; j--) grad_in[j] = ct_tape_pop(c);
    for (int i = 0; i < hp->n_indices; i++) {
        const ct_tensor *g = &grad_out[i];
        ct_tensor *acc = &grad_in[hp->indices[i]];
        if (!g->data) continue;
        if (!acc->data) {
            *acc = *g;  // the first gradient for this input: alias it
            continue;
        }
        // A second use of the same input: sum over a donated gradient (a
        // residual branch's, which nothing reads after), else into fresh
        // memory, since the first gradient may be aliased elsewhere.
        CT_TRY(ct_ctx_sum(c, acc, g, acc, err));
    }
    return CT_OK;
}

static const ct_layer_vtable select_vt = {
    .type = "Select", .init = select_init, .forward = select_forward, .backward = select_backward};

ct_layer *ct_select(int n_indices, const int *indices, int n_in) {
    CT_ASSERT(n_indices >= 0 && n_indices <= CT_LAYER_MAX_IO);
    select_hp hp = {.n_indices = n_indices};
    int max_index = -1;
    for (int i = 0; i < n_indices; i++) {
        CT_ASSERT(indices[i] >= 0);
        hp.indices[i] = indices[i];
        if (indices[i] > max_index) max_index = indices[i];
    }
    if (n_in == 0) n_in = max_index + 1;
    CT_ASSERT(n_in > max_index);
    return ct_layer_new_hp(&select_vt, n_in, n_indices, &hp, sizeof hp);
}

ct_layer *ct_dup(void) { return ct_layer_rename(ct_select(2, (int[]){0, 0}, 1), "Dup"); }
ct_layer *ct_swap(void) { return ct_layer_rename(ct_select(2, (int[]){1, 0}, 2), "Swap"); }
ct_layer *ct_drop(void) { return ct_layer_rename(ct_select(0, NULL, 1), "Drop"); }

// ---- Add and Multiply ------------------------------------------------------------

// Two equal f32 shapes, or an error that says which of the two is wrong.
static ct_status check_same(const ct_layer *l, const ct_tensor *in, const char *op, ct_error *err) {
    bool f32 = in[0].dtype == CT_DTYPE_F32 && in[1].dtype == CT_DTYPE_F32;
    if (f32 && ct_tensor_same_sig(&in[0], &in[1])) return CT_OK;
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    return ct_layer_fail(l, err, CT_ERR_SHAPE, op, f32 ? "inputs %s and %s differ (need two equal f32 shapes)"
                                                       : "inputs %s and %s: need f32",
                         ct_tensor_sig_str(&in[0], a, sizeof a), ct_tensor_sig_str(&in[1], b, sizeof b));
}

static ct_status binary_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                             ct_key key, ct_error *err) {
    (void)ic, (void)key;
    CT_TRY(check_same(l, in, "init", err));
    out[0] = in[0];
    return CT_OK;
}

// out = a + b; (...) x (...) -> (...), over a donated input's memory (a
// residual branch's output) when there is one.
static ct_status add_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                             ct_error *err) {
    (void)key;
    CT_TRY(check_same(l, in, "forward", err));
    return ct_ctx_sum(c, &in[0], &in[1], &out[0], err);
}

static ct_status add_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                              ct_key key, ct_error *err) {
    (void)l, (void)c, (void)key, (void)err;
    grad_in[0] = grad_out[0];
    grad_in[1] = grad_out[0];
    return CT_OK;
}

static const ct_layer_vtable add_vt = {
    .type = "Add", .init = binary_init, .forward = add_forward, .backward = add_backward};
ct_layer *ct_add(void) { return ct_layer_new_hp(&add_vt, 2, 1, NULL, 0); }

// out = a * b elementwise
static ct_status mul_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                             ct_error *err) {
    (void)key;
    CT_TRY(check_same(l, in, "forward", err));
    out[0] = ct_tensor_sig(&in[0]);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    const float *a = in[0].data, *b = in[1].data;
    float *o = out[0].data;
    int64_t n = ct_tensor_numel(&out[0]);
    for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i];
    CT_TRY(ct_tape_push(c, &in[0], err));
    return ct_tape_push(c, &in[1], err);
}

// da = g * b, db = g * a
static ct_status mul_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                              ct_key key, ct_error *err) {
    (void)l, (void)key;
    ct_tensor b = ct_tape_pop(c), a = ct_tape_pop(c);
    if (!grad_out[0].data) {
        grad_in[0] = ct_tensor_sig(&a);
        grad_in[1] = ct_tensor_sig(&b);
        return CT_OK;
    }
    grad_in[0] = ct_tensor_sig(&a);
    grad_in[1] = ct_tensor_sig(&b);
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    CT_TRY(ct_ctx_alloc(c, &grad_in[1], err));
    const float *g = grad_out[0].data, *pa = a.data, *pb = b.data;
    float *ga = grad_in[0].data, *gb = grad_in[1].data;
    int64_t n = ct_tensor_numel(&a);
    for (int64_t i = 0; i < n; i++) {
        ga[i] = g[i] * pb[i];
        gb[i] = g[i] * pa[i];
    }
    return CT_OK;
}

static const ct_layer_vtable mul_vt = {
    .type = "Multiply", .init = binary_init, .forward = mul_forward, .backward = mul_backward};
ct_layer *ct_multiply(void) { return ct_layer_new_hp(&mul_vt, 2, 1, NULL, 0); }

// ---- Concatenate and Split ---------------------------------------------------------
//
// Both view a tensor as (outer, axis, inner) and copy rows of axis*inner
// floats between the pieces and the whole: Concatenate's forward is Split's
// backward, and the other way round.

typedef struct axis_hp {
    int n_items;
    int axis;
    bool concat;  // Concatenate (n_items -> 1), else Split (1 -> n_items)
} axis_hp;

static int resolve_axis(int axis, int ndim) { return axis < 0 ? axis + ndim : axis; }

// Copies pieces (n of them, each (outer, len[i], inner)) to or from the
// whole (outer, sum len, inner).
static void copy_pieces(ct_tensor *pieces, int n, ct_tensor *whole, int axis, bool to_whole) {
    int64_t outer = ct_tensor_dims_product(whole, 0, axis);
    int64_t inner = ct_tensor_dims_product(whole, axis + 1, whole->ndim);
    int64_t total = whole->shape[axis] * inner;
    float *w = whole->data;
    for (int64_t o = 0; o < outer; o++) {
        int64_t pos = 0;
        for (int i = 0; i < n; i++) {
            int64_t len = pieces[i].shape[axis] * inner;
            float *p = (float *)pieces[i].data + o * len;
            float *q = w + o * total + pos;
            if (to_whole) memcpy(q, p, (size_t)len * sizeof *q);
            else memcpy(p, q, (size_t)len * sizeof *q);
            pos += len;
        }
    }
}

// Allocates *whole (its signature set) and copies the n pieces into it; a
// piece without data (a zero gradient) counts as zeros.
static ct_status join(const ct_layer *l, ct_ctx *c, const ct_tensor *parts, ct_tensor *whole, ct_error *err) {
    const axis_hp *hp = l->hp;
    CT_TRY(ct_ctx_alloc(c, whole, err));
    ct_tensor pieces[CT_LAYER_MAX_IO];
    for (int i = 0; i < hp->n_items; i++) {
        pieces[i] = parts[i];
        CT_TRY(ct_ctx_grad_or_zeros(c, &pieces[i], err));
    }
    copy_pieces(pieces, hp->n_items, whole, resolve_axis(hp->axis, whole->ndim), true);
    return CT_OK;
}

// Allocates the n pieces (their signatures set) and copies whole into them.
static ct_status cut(const ct_layer *l, ct_ctx *c, ct_tensor *pieces, const ct_tensor *whole, ct_error *err) {
    const axis_hp *hp = l->hp;
    for (int i = 0; i < hp->n_items; i++) CT_TRY(ct_ctx_alloc(c, &pieces[i], err));
    ct_tensor w = *whole;
    copy_pieces(pieces, hp->n_items, &w, resolve_axis(hp->axis, w.ndim), false);
    return CT_OK;
}

static ct_status concat_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, ct_error *err) {
    const axis_hp *hp = l->hp;
    int axis = resolve_axis(hp->axis, in[0].ndim);
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    if (axis < 0 || axis >= in[0].ndim || in[0].dtype != CT_DTYPE_F32)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "axis %d does not fit input 0 %s", hp->axis,
                             ct_tensor_sig_str(&in[0], a, sizeof a));
    out[0] = ct_tensor_sig(&in[0]);
    for (int i = 1; i < hp->n_items; i++) {
        bool ok = in[i].ndim == in[0].ndim && in[i].dtype == in[0].dtype;
        for (int d = 0; ok && d < in[0].ndim; d++)
            if (d != axis && in[i].shape[d] != in[0].shape[d]) ok = false;
        if (!ok)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, "init",
                                 "input %d %s does not match input 0 %s outside axis %d", i,
                                 ct_tensor_sig_str(&in[i], a, sizeof a),
                                 ct_tensor_sig_str(&in[0], b, sizeof b), axis);
        out[0].shape[axis] += in[i].shape[axis];
    }
    return CT_OK;
}

static ct_status split_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, ct_error *err) {
    const axis_hp *hp = l->hp;
    int axis = resolve_axis(hp->axis, in[0].ndim);
    char a[CT_SIG_STR_MAX];
    if (axis < 0 || axis >= in[0].ndim || in[0].dtype != CT_DTYPE_F32 ||
        in[0].shape[axis] % hp->n_items != 0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "cannot split %s into %d parts along axis %d",
                             ct_tensor_sig_str(&in[0], a, sizeof a), hp->n_items, hp->axis);
    for (int i = 0; i < hp->n_items; i++) {
        out[i] = ct_tensor_sig(&in[0]);
        out[i].shape[axis] /= hp->n_items;
    }
    return CT_OK;
}

static ct_status axis_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, ct_error *err) {
    return ((const axis_hp *)l->hp)->concat ? concat_shape(l, in, out, err) : split_shape(l, in, out, err);
}

static ct_status axis_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                           ct_error *err) {
    (void)ic, (void)key;
    return axis_shape(l, in, out, err);
}

// Concatenate saves its inputs' signatures, Split its input's: the shapes
// of the gradients it returns.
static ct_status axis_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)key;
    CT_TRY(axis_shape(l, in, out, err));
    if (((const axis_hp *)l->hp)->concat) CT_TRY(join(l, c, in, &out[0], err));
    else CT_TRY(cut(l, c, out, &in[0], err));
    for (int i = 0; i < l->n_in; i++) CT_TRY(ct_tape_push_sig(c, &in[i], err));
    return CT_OK;
}

static ct_status axis_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                               ct_key key, ct_error *err) {
    (void)key;
    for (int i = l->n_in - 1; i >= 0; i--) grad_in[i] = ct_tape_pop(c);
    if (!((const axis_hp *)l->hp)->concat) return join(l, c, grad_out, &grad_in[0], err);
    if (!grad_out[0].data) return CT_OK;  // zero gradients for every piece
    return cut(l, c, grad_in, &grad_out[0], err);
}

static const ct_layer_vtable concat_vt = {
    .type = "Concatenate", .init = axis_init, .forward = axis_forward, .backward = axis_backward};
static const ct_layer_vtable split_vt = {
    .type = "Split", .init = axis_init, .forward = axis_forward, .backward = axis_backward};

ct_layer *ct_concatenate(int n_items, int axis) {
    CT_ASSERT(n_items >= 1 && n_items <= CT_LAYER_MAX_IO);
    axis_hp hp = {n_items, axis, true};
    return ct_layer_new_hp(&concat_vt, n_items, 1, &hp, sizeof hp);
}

ct_layer *ct_split(int n_items, int axis) {
    CT_ASSERT(n_items >= 1 && n_items <= CT_LAYER_MAX_IO);
    axis_hp hp = {n_items, axis, false};
    return ct_layer_new_hp(&split_vt, 1, n_items, &hp, sizeof hp);
}

// ---- Fn: a weightless layer from plain functions -------------------------------------

static ct_status fn_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, ct_error *err) {
    const ct_fn_spec *spec = l->hp;
    if (spec->shape) {
        ct_error inner;
        ct_error_clear(&inner);
        ct_status st = spec->shape(in, out, spec->user, &inner);
        if (st != CT_OK) return ct_layer_fail(l, err, st, "shape", "%s", inner.msg);
    } else {
        for (int i = 0; i < l->n_out; i++) out[i] = ct_tensor_sig(&in[0]);
    }
    return CT_OK;
}

static ct_status fn_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                         ct_key key, ct_error *err) {
    (void)ic, (void)key;
    return fn_shape(l, in, out, err);
}

static ct_status fn_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    (void)key;
    const ct_fn_spec *spec = l->hp;
    CT_TRY(fn_shape(l, in, out, err));
    for (int i = 0; i < l->n_out; i++) CT_TRY(ct_ctx_alloc(c, &out[i], err));
    spec->forward(in, out, spec->user);
    for (int i = 0; i < l->n_in; i++) CT_TRY(ct_tape_push(c, &in[i], err));
    for (int i = 0; i < l->n_out; i++) CT_TRY(ct_tape_push(c, &out[i], err));
    return CT_OK;
}

static ct_status fn_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                             ct_key key, ct_error *err) {
    (void)key;
    const ct_fn_spec *spec = l->hp;
    ct_tensor in[CT_LAYER_MAX_IO], out[CT_LAYER_MAX_IO], g[CT_LAYER_MAX_IO];
    for (int i = l->n_out - 1; i >= 0; i--) out[i] = ct_tape_pop(c);
    for (int i = l->n_in - 1; i >= 0; i--) in[i] = ct_tape_pop(c);
    // A backward is linear in the output gradients: none in, none out (a
    // zero gradient is a NULL one, which callers skip), with no zeros made.
    bool any = false;
    for (int i = 0; i < l->n_out; i++) any = any || grad_out[i].data != NULL;
    if (!any) {
        for (int i = 0; i < l->n_in; i++) grad_in[i] = ct_tensor_sig(&in[i]);
        return CT_OK;
    }
    for (int i = 0; i < l->n_out; i++) {
        g[i] = grad_out[i];
        CT_TRY(ct_ctx_grad_or_zeros(c, &g[i], err));
    }
    for (int i = 0; i < l->n_in; i++) {
        grad_in[i] = ct_tensor_sig(&in[i]);
        if (in[i].dtype == CT_DTYPE_F32) CT_TRY(ct_ctx_zeros(c, &grad_in[i], err));
    }
    if (spec->backward) spec->backward(in, out, g, grad_in, spec->user);
    return CT_OK;
}

static const ct_layer_vtable fn_vt = {.type = "Fn", .init = fn_init, .forward = fn_forward, .backward = fn_backward};

ct_layer *ct_fn(const ct_fn_spec *spec) {
    CT_ASSERT(spec && spec->forward && spec->name);
    ct_fn_spec *copy = ct_malloc(sizeof *copy);
    *copy = *spec;
    return ct_layer_new(&fn_vt, spec->name, spec->n_in, spec->n_out, copy, NULL, 0);
}
