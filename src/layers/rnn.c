// Trax's Scan combinator (trax/layers/combinators.py) and the RNN cells of
// trax/layers/rnn.py: GRUCell, LSTMCell, MakeZeroState.
//
// Scan runs its sublayer once per step, recording each step's tape in
// forward and popping them in reverse in backward (Trax's remat=False):
// memory is T steps of the cell's activations, the usual cost of
// backpropagation through time. Chunk (chunk.c) recomputes instead, because
// its chunks are independent; a scan's steps are not (step t needs the carry
// of t - 1), so recomputing would cost a second pass over the sequence.
//
// The cells are one layer each, with their Dense products through
// ct_matmul_forward/backward and the gates fused per element, so a step is
// two (GRU) or one (LSTM) matrix products and a pass over the gates.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/layers/rnn.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/matmul.h"
#include "layers/internal.h"

// ---- Scan -------------------------------------------------------------------

typedef struct scan_hp {
    int axis;     // as given; negative counts from the end of each x's shape
    int n_carry;  // carries: the last n_carry inputs and outputs
} scan_hp;

// x viewed as (pre, T, post) around its scan axis, post in bytes.
typedef struct scan_view {
    int axis;
    int64_t pre, T;
    size_t post;
} scan_view;

static scan_view scan_view_of(const ct_tensor *x, int axis) {
    scan_view v = {.axis = axis < 0 ? axis + x->ndim : axis};
    v.pre = ct_tensor_dims_product(x, 0, v.axis);
    v.T = x->shape[v.axis];
    v.post = (size_t)ct_tensor_dims_product(x, v.axis + 1, x->ndim) * ct_dtype_size(x->dtype);
    return v;
}

// Checks the xs (in[0..nx)): rank >= 1, the axis inside each, T >= 1 along
// it, one T for all.
static ct_status scan_check(const ct_layer *l, const ct_tensor *in, int nx, const char *op, ct_error *err) {
    const scan_hp *hp = l->hp;
    char s[CT_SIG_STR_MAX];
    for (int i = 0; i < nx; i++) {
        int a = hp->axis < 0 ? hp->axis + in[i].ndim : hp->axis;
        if (in[i].ndim < 1 || a < 0 || a >= in[i].ndim)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %d is %s: it has no axis %d to scan over", i,
                                 ct_tensor_sig_str(&in[i], s, sizeof s), hp->axis);
        // T = 0 would leave the ys unwritten: Scan allocates them from the
        // sublayer's step-0 outputs.
        if (in[i].shape[a] < 1)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                                 "input %d is %s: its length %lld on axis %d leaves no step to scan (T >= 1)", i,
                                 ct_tensor_sig_str(&in[i], s, sizeof s), (long long)in[i].shape[a], hp->axis);
        int64_t T0 = in[0].shape[scan_view_of(&in[0], hp->axis).axis];
        if (in[i].shape[a] != T0)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                                 "input %d is %s: its length %lld on axis %d differs from input 0's %lld", i,
                                 ct_tensor_sig_str(&in[i], s, sizeof s), (long long)in[i].shape[a], hp->axis,
                                 (long long)T0);
    }
    return CT_OK;
}

// x's signature with the scan axis removed: one step's input.
static ct_tensor scan_step_sig(const ct_tensor *x, int axis) {
    scan_view v = scan_view_of(x, axis);
    ct_tensor s = ct_tensor_sig(x);
    for (int d = v.axis; d + 1 < x->ndim; d++) s.shape[d] = x->shape[d + 1];
    s.ndim--;
    return s;
}

// A step's signature y with T inserted at axis a (the xs' resolved axis).
static ct_tensor scan_stack_sig(const ct_tensor *y, int a, int64_t T) {
    ct_tensor s = ct_tensor_sig(y);
    for (int d = y->ndim; d > a; d--) s.shape[d] = y->shape[d - 1];
    s.shape[a] = T;
    s.ndim++;
    return s;
}

// step (pre, post) <-> stacked (pre, T, post) at step t: to_step copies
// slice t out, else writes step into slice t.
static void scan_copy(void *stacked, void *step, scan_view v, int64_t t, bool to_step) {
    for (int64_t p = 0; p < v.pre; p++) {
        char *a = (char *)stacked + ((size_t)(p * v.T + t)) * v.post, *b = (char *)step + (size_t)p * v.post;
        if (to_step)
            memcpy(b, a, v.post);
        else
            memcpy(a, b, v.post);
    }
}

// The scan axis resolved against input 0, where ys get their T.
static int scan_out_axis(const ct_layer *l, const ct_tensor *x0) {
    return scan_view_of(x0, ((const scan_hp *)l->hp)->axis).axis;
}

static ct_status scan_check_carry(const ct_layer *l, const ct_tensor *in_c, const ct_tensor *out_c, int k,
                                  const char *op, ct_error *err) {
    if (ct_tensor_same_sig(in_c, out_c)) return CT_OK;
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "carry %d goes in as %s but the sublayer returns %s", k,
                         ct_tensor_sig_str(in_c, a, sizeof a), ct_tensor_sig_str(out_c, b, sizeof b));
}

static ct_status scan_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                           ct_error *err) {
    const scan_hp *hp = l->hp;
    int nx = l->n_in - hp->n_carry, ny = l->n_out - hp->n_carry;
    CT_TRY(scan_check(l, in, nx, "init", err));
    ct_tensor step_in[CT_LAYER_MAX_IO], step_out[CT_LAYER_MAX_IO];
    for (int i = 0; i < nx; i++) step_in[i] = scan_step_sig(&in[i], hp->axis);
    for (int k = 0; k < hp->n_carry; k++) step_in[nx + k] = ct_tensor_sig(&in[nx + k]);
    CT_TRY(ct_layer_init(l->sub[0], 0, ic, step_in, step_out, ct_key_split(key, 0), err));
    int a = scan_out_axis(l, &in[0]);
    int64_t T = in[0].shape[a];
    for (int j = 0; j < ny; j++) {
        if (a > step_out[j].ndim || step_out[j].ndim >= CT_MAX_DIMS) {
            char s[CT_SIG_STR_MAX];
            return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "the sublayer's output %d is %s: cannot stack it on axis %d",
                                 j, ct_tensor_sig_str(&step_out[j], s, sizeof s), a);
        }
        out[j] = scan_stack_sig(&step_out[j], a, T);
    }
    for (int k = 0; k < hp->n_carry; k++) {
        CT_TRY(scan_check_carry(l, &in[nx + k], &step_out[ny + k], k, "init", err));
        out[ny + k] = ct_tensor_sig(&in[nx + k]);
    }
    return CT_OK;
}

static ct_status scan_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    const scan_hp *hp = l->hp;
    int nx = l->n_in - hp->n_carry, ny = l->n_out - hp->n_carry, nc = hp->n_carry;
    CT_TRY(scan_check(l, in, nx, "forward", err));
    int a = scan_out_axis(l, &in[0]);
    int64_t T = in[0].shape[a];
    ct_tensor step_in[CT_LAYER_MAX_IO], step_out[CT_LAYER_MAX_IO];
    for (int k = 0; k < nc; k++) step_in[nx + k] = in[nx + k];
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < nx; i++) {
            step_in[i] = scan_step_sig(&in[i], hp->axis);
            CT_TRY(ct_ctx_alloc(c, &step_in[i], err));
            scan_copy(in[i].data, step_in[i].data, scan_view_of(&in[i], hp->axis), t, true);
        }
        CT_TRY(ct_layer_forward(l->sub[0], c, step_in, step_out, ct_key_fold_in(key, (uint32_t)t), err));
        for (int j = 0; j < ny; j++) {
            // The ys are allocated at step 0, from the shapes the sublayer
            // gives for this batch.
            if (t == 0) {
                out[j] = scan_stack_sig(&step_out[j], a, T);
                CT_TRY(ct_ctx_alloc(c, &out[j], err));
            } else if (ct_tensor_numel(&step_out[j]) * (int64_t)T != ct_tensor_numel(&out[j])) {
                char s[CT_SIG_STR_MAX];
                return ct_layer_fail(l, err, CT_ERR_SHAPE, "forward", "the sublayer's output %d changed to %s at step %lld",
                                     j, ct_tensor_sig_str(&step_out[j], s, sizeof s), (long long)t);
            }
            scan_copy(out[j].data, step_out[j].data, scan_view_of(&out[j], a), t, false);
        }
        for (int k = 0; k < nc; k++) {
            CT_TRY(scan_check_carry(l, &in[nx + k], &step_out[ny + k], k, "forward", err));
            step_in[nx + k] = step_out[ny + k];
        }
    }
    for (int k = 0; k < nc; k++) out[ny + k] = step_in[nx + k];
    // The xs' signatures, last on the tape: backward pops them before the
    // steps' tapes, which it then pops from step T - 1 down.
    for (int i = 0; i < nx; i++) CT_TRY(ct_tape_push_sig(c, &in[i], err));
    for (int j = 0; j < ny; j++) CT_TRY(ct_tape_push_sig(c, &out[j], err));
    return CT_OK;
}

static ct_status scan_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                               ct_error *err) {
    const scan_hp *hp = l->hp;
    int nx = l->n_in - hp->n_carry, ny = l->n_out - hp->n_carry, nc = hp->n_carry;
    ct_tensor ys[CT_LAYER_MAX_IO];
    for (int j = ny - 1; j >= 0; j--) ys[j] = ct_tape_pop(c);
    for (int i = nx - 1; i >= 0; i--) grad_in[i] = ct_tape_pop(c);
    int a = scan_out_axis(l, &grad_in[0]);
    int64_t T = grad_in[0].shape[a];
    // Gradients of f32 xs start at zero and get step t's slice written;
    // others (int32 tokens) take none.
    for (int i = 0; i < nx; i++)
        if (grad_in[i].dtype == CT_DTYPE_F32) CT_TRY(ct_ctx_zeros(c, &grad_in[i], err));
    ct_tensor step_gout[CT_LAYER_MAX_IO], step_gin[CT_LAYER_MAX_IO];
    for (int k = 0; k < nc; k++) step_gout[ny + k] = grad_out[ny + k];
    for (int64_t t = T - 1; t >= 0; t--) {
        for (int j = 0; j < ny; j++) {
            step_gout[j] = scan_step_sig(&ys[j], a);
            if (!grad_out[j].data) continue;  // a zero gradient stays NULL
            CT_TRY(ct_ctx_alloc(c, &step_gout[j], err));
            scan_copy(grad_out[j].data, step_gout[j].data, scan_view_of(&ys[j], a), t, true);
        }
        CT_TRY(ct_layer_backward(l->sub[0], c, step_gout, step_gin, ct_key_fold_in(key, (uint32_t)t), err));
        for (int i = 0; i < nx; i++)
            if (step_gin[i].data && grad_in[i].data)
                scan_copy(grad_in[i].data, step_gin[i].data, scan_view_of(&grad_in[i], hp->axis), t, false);
        for (int k = 0; k < nc; k++) step_gout[ny + k] = step_gin[nx + k];
    }
    for (int k = 0; k < nc; k++) grad_in[nx + k] = step_gout[ny + k];
    return CT_OK;
}

static const ct_layer_vtable scan_vt = {
    .type = "Scan", .init = scan_init, .forward = scan_forward, .backward = scan_backward};

ct_layer *ct_scan(ct_layer *layer, int axis, int n_carry) {
    CT_ASSERT(layer && n_carry >= 0 && layer->n_in > n_carry && layer->n_out >= n_carry);
    scan_hp *hp = ct_malloc(sizeof *hp);
    *hp = (scan_hp){axis, n_carry};
    return ct_layer_new(&scan_vt, "Scan", layer->n_in, layer->n_out, hp, (ct_layer *[]){layer}, 1);
}

// ---- Cells: shared checks and helpers ---------------------------------------

typedef struct cell_hp {
    int n_units;
    int state_mult;  // the state is state_mult * n_units wide (GRU 1, LSTM 2)
} cell_hp;

// Checks x (..., D) and s (..., state_mult n) with the same leading dims;
// with D_want >= 0 (after init) D must be D_want. Writes the rows (product
// of the leading dims) and D.
static ct_status cell_check(const ct_layer *l, const ct_tensor *in, int64_t D_want, const char *op, int64_t *rows,
                            int64_t *D, ct_error *err) {
    const cell_hp *hp = l->hp;
    const ct_tensor *x = &in[0], *s = &in[1];
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    int64_t S = (int64_t)hp->state_mult * hp->n_units;
    bool lead_ok = x->ndim == s->ndim && x->ndim >= 1;
    for (int d = 0; lead_ok && d + 1 < x->ndim; d++) lead_ok = x->shape[d] == s->shape[d];
    if (x->dtype != CT_DTYPE_F32 || s->dtype != CT_DTYPE_F32 || !lead_ok)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "inputs x %s and state %s: expected f32 (..., D) and (..., %lld) with the same leading dims",
                             ct_tensor_sig_str(x, a, sizeof a), ct_tensor_sig_str(s, b, sizeof b), (long long)S);
    if (s->shape[s->ndim - 1] != S) {
        char want[64];  // "2 x 4 = 8" (LSTM), "4" (GRU)
        if (hp->state_mult > 1)
            snprintf(want, sizeof want, "%d x %d = %lld", hp->state_mult, hp->n_units, (long long)S);
        else
            snprintf(want, sizeof want, "%lld", (long long)S);
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "state %s is %lld wide, but %s(n_units %d) takes a state of %s",
                             ct_tensor_sig_str(s, b, sizeof b), (long long)s->shape[s->ndim - 1], l->vt->type,
                             hp->n_units, want);
    }
    *D = x->shape[x->ndim - 1];
    *rows = ct_tensor_dims_product(x, 0, x->ndim - 1);
    if (D_want >= 0 && *D != D_want)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input x %s is %lld wide; the cell was built for %lld",
                             ct_tensor_sig_str(x, a, sizeof a), (long long)*D, (long long)D_want);
    return CT_OK;
}

// The cell's outputs: h' (..., n) and the new state (..., state_mult n).
static void cell_out_sigs(const ct_layer *l, const ct_tensor *in, ct_tensor *out) {
    const cell_hp *hp = l->hp;
    out[0] = ct_tensor_sig(&in[1]);
    out[0].shape[out[0].ndim - 1] = hp->n_units;
    out[1] = ct_tensor_sig(&in[1]);
}

// dst (rows, da + db) = [a (rows, da) | b (rows, db, rows b_stride apart)]
static void cat_cols(float *dst, const float *a, int64_t da, const float *b, int64_t db, int64_t b_stride,
                     int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        memcpy(dst + r * (da + db), a + r * da, (size_t)da * sizeof *dst);
        memcpy(dst + r * (da + db) + da, b + r * b_stride, (size_t)db * sizeof *dst);
    }
}

// The x and h columns of a (rows, D + n) gradient added into gx (rows, D)
// and gh (rows, n, rows h_stride apart).
static void split_cols_add(float *gx, float *gh, int64_t h_stride, const float *g, int64_t D, int64_t n,
                           int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * (D + n);
        for (int64_t k = 0; k < D; k++) gx[r * D + k] += gr[k];
        for (int64_t k = 0; k < n; k++) gh[r * h_stride + k] += gr[D + k];
    }
}

// h' (rows, n) a second time, for the cell's two outputs: an output may
// not alias another, since gradients may be written into.
static ct_status cell_outputs(ct_ctx *c, const ct_tensor *in, const ct_layer *l, ct_tensor *out, ct_error *err) {
    cell_out_sigs(l, in, out);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    return ct_ctx_alloc(c, &out[1], err);
}

// ---- GRUCell ------------------------------------------------------------------

// Weights: 0 kernel_gates (D + n, 2 n), 1 bias_gates (2 n),
// 2 kernel_candidate (D + n, n), 3 bias_candidate (n).
static ct_status gru_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                         ct_error *err) {
    int64_t n = ((const cell_hp *)l->hp)->n_units, rows, D;
    CT_TRY(cell_check(l, in, -1, "init", &rows, &D, err));
    // Trax's GRUCell initializers: RandomUniform(0.01) kernels,
    // RandomNormal(1e-6) biases (plus forget_bias 0 on the gates).
    ct_initializer kern = {CT_INIT_UNIFORM, 0.01f}, bias = {CT_INIT_NORMAL, 1e-6f};
    ct_layer_declare_weight(l, ic, "kernel_gates", ct_tensor_2d(CT_DTYPE_F32, D + n, 2 * n, NULL), kern,
                            ct_key_split(key, 0));
    ct_layer_declare_weight(l, ic, "bias_gates", ct_tensor_1d(CT_DTYPE_F32, 2 * n, NULL), bias, ct_key_split(key, 1));
    ct_layer_declare_weight(l, ic, "kernel_candidate", ct_tensor_2d(CT_DTYPE_F32, D + n, n, NULL), kern,
                            ct_key_split(key, 2));
    ct_layer_declare_weight(l, ic, "bias_candidate", ct_tensor_1d(CT_DTYPE_F32, n, NULL), bias, ct_key_split(key, 3));
    cell_out_sigs(l, in, out);
    return CT_OK;
}

// x (rows, D), h (rows, n) -> h' (rows, n), with what backward needs:
//   xh = [x | h], ur = sigmoid(xh W1 + b1) (rows, 2 n),
//   xrh = [x | r h], cand = tanh(xrh W2 + b2) (rows, n),
//   h' = u h + (1 - u) cand
static void gru_cell_forward(float *hn, float *xh, float *ur, float *xrh, float *cand, const float *x,
                             const float *h, const float *w1, const float *b1, const float *w2, const float *b2,
                             int64_t rows, int64_t D, int64_t n) {
    cat_cols(xh, x, D, h, n, n, rows);
    ct_matmul_forward(ur, xh, w1, b1, rows, D + n, 2 * n);
    ct_sigmoid_forward(ur, ur, rows * 2 * n);
    for (int64_t r = 0; r < rows; r++) {
        memcpy(xrh + r * (D + n), x + r * D, (size_t)D * sizeof *x);
        for (int64_t k = 0; k < n; k++) xrh[r * (D + n) + D + k] = ur[r * 2 * n + n + k] * h[r * n + k];
    }
    ct_matmul_forward(cand, xrh, w2, b2, rows, D + n, n);
    ct_tanh_forward(cand, cand, rows * n);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < n; k++) {
            float u = ur[r * 2 * n + k];
            hn[r * n + k] = u * h[r * n + k] + (1.0f - u) * cand[r * n + k];
        }
}

static ct_status gru_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                             ct_error *err) {
    (void)key;
    int64_t n = ((const cell_hp *)l->hp)->n_units, rows, D;
    CT_TRY(cell_check(l, in, l->weights[0].sig.shape[0] - n, "forward", &rows, &D, err));
    CT_TRY(cell_outputs(c, in, l, out, err));
    ct_tensor xh = ct_tensor_2d(CT_DTYPE_F32, rows, D + n, NULL), ur = ct_tensor_2d(CT_DTYPE_F32, rows, 2 * n, NULL);
    ct_tensor xrh = xh, cand = ct_tensor_2d(CT_DTYPE_F32, rows, n, NULL);
    CT_TRY(ct_ctx_alloc(c, &xh, err));
    CT_TRY(ct_ctx_alloc(c, &ur, err));
    CT_TRY(ct_ctx_alloc(c, &xrh, err));
    CT_TRY(ct_ctx_alloc(c, &cand, err));
    gru_cell_forward(out[0].data, xh.data, ur.data, xrh.data, cand.data, in[0].data, in[1].data, ct_weight(c, l, 0),
                     ct_weight(c, l, 1), ct_weight(c, l, 2), ct_weight(c, l, 3), rows, D, n);
    memcpy(out[1].data, out[0].data, ct_tensor_nbytes(&out[0]));
    const ct_tensor saved[] = {in[0], in[1], xh, ur, xrh, cand};
    for (size_t i = 0; i < sizeof saved / sizeof *saved; i++) CT_TRY(ct_tape_push(c, &saved[i], err));
    return CT_OK;
}

// From dh (rows, n), the gradient of h', adds into gx (rows, D), gh (rows,
// n) and the weight gradients. tmp: (rows, n + 2 n + 2 (D + n)) scratch;
// wtmp: gru_weight_grad_scratch_floats.
static void gru_cell_backward(float *gx, float *gh, float *gw1, float *gb1, float *gw2, float *gb2, const float *dh,
                              const float *xh, const float *ur, const float *xrh, const float *cand,
                              const float *w1, const float *w2, float *tmp, float *wtmp, int64_t rows, int64_t D,
                              int64_t n) {
    float *dcand = tmp, *dy = dcand + rows * n, *dxrh = dy + rows * 2 * n, *dxh = dxrh + rows * (D + n);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < n; k++) {
            float u = ur[r * 2 * n + k], cd = cand[r * n + k], h = xh[r * (D + n) + D + k], g = dh[r * n + k];
            dcand[r * n + k] = g * (1.0f - u) * (1.0f - cd * cd);  // through tanh
            dy[r * 2 * n + k] = g * (h - cd) * u * (1.0f - u);     // through u's sigmoid
            gh[r * n + k] += g * u;
        }
    ct_matmul_backward(dxrh, gw2, gb2, wtmp, dcand, xrh, w2, rows, D + n, n);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < n; k++) {
            float rr = ur[r * 2 * n + n + k], h = xh[r * (D + n) + D + k], g = dxrh[r * (D + n) + D + k];
            dy[r * 2 * n + n + k] = g * h * rr * (1.0f - rr);  // d(r h)/dr, through r's sigmoid
            gh[r * n + k] += g * rr;
        }
    // dxrh's h columns are spent above; its x columns go to gx.
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < D; k++) gx[r * D + k] += dxrh[r * (D + n) + k];
    ct_matmul_backward(dxh, gw1, gb1, wtmp, dy, xh, w1, rows, D + n, 2 * n);
    split_cols_add(gx, gh, n, dxh, D, n, rows);
}

// The sum of the gradients of the cell's h' output and of the part of its
// state output that is h' (GRU: all of it; LSTM: the second half), into
// dh (rows, n); false when neither flows.
static bool cell_grad_h(const ct_tensor *grad_out, float *dh, int64_t rows, int64_t n, int64_t state_w) {
    const float *g0 = grad_out[0].data, *g1 = grad_out[1].data;
    if (!g0 && !g1) return false;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < n; k++)
            dh[r * n + k] = (g0 ? g0[r * n + k] : 0.0f) + (g1 ? g1[r * state_w + state_w - n + k] : 0.0f);
    return true;
}

// The weight gradients' scratch of the GRU cell's two products.
static int64_t gru_weight_grad_scratch_floats(int64_t rows, int64_t D, int64_t n) {
    int64_t a = ct_matmul_weight_grad_scratch_floats(rows, D + n, n);
    int64_t b = ct_matmul_weight_grad_scratch_floats(rows, D + n, 2 * n);
    return a > b ? a : b;
}

static ct_status gru_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                              ct_error *err) {
    (void)key;
    int64_t n = ((const cell_hp *)l->hp)->n_units;
    ct_tensor cand = ct_tape_pop(c), xrh = ct_tape_pop(c), ur = ct_tape_pop(c), xh = ct_tape_pop(c);
    ct_tensor s = ct_tape_pop(c), x = ct_tape_pop(c);
    int64_t rows = cand.shape[0], D = x.shape[x.ndim - 1];
    grad_in[0] = ct_tensor_sig(&x);
    grad_in[1] = ct_tensor_sig(&s);
    ct_tensor dh = ct_tensor_sig(&cand), tmp = ct_tensor_1d(CT_DTYPE_F32, rows * (3 * n + 2 * (D + n)), NULL);
    CT_TRY(ct_ctx_alloc(c, &dh, err));
    if (!cell_grad_h(grad_out, dh.data, rows, n, n)) return CT_OK;  // no gradient flows
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    CT_TRY(ct_ctx_zeros(c, &grad_in[1], err));
    ct_tensor wtmp = ct_tensor_1d(CT_DTYPE_F32, gru_weight_grad_scratch_floats(rows, D, n), NULL);
    CT_TRY(ct_ctx_alloc(c, &tmp, err));
    CT_TRY(ct_ctx_alloc(c, &wtmp, err));
    gru_cell_backward(grad_in[0].data, grad_in[1].data, ct_weight_grad(c, l, 0), ct_weight_grad(c, l, 1),
                      ct_weight_grad(c, l, 2), ct_weight_grad(c, l, 3), dh.data, xh.data, ur.data, xrh.data,
                      cand.data, ct_weight(c, l, 0), ct_weight(c, l, 2), tmp.data, wtmp.data, rows, D, n);
    return CT_OK;
}

static const ct_layer_vtable gru_vt = {
    .type = "GRUCell", .init = gru_init, .forward = gru_forward, .backward = gru_backward};

ct_layer *ct_gru_cell(int n_units) {
    CT_ASSERT(n_units > 0);
    return ct_layer_new_hp(&gru_vt, 2, 2, &(cell_hp){n_units, 1}, sizeof(cell_hp));
}

// ---- LSTMCell -----------------------------------------------------------------

// Weights: 0 kernel (D + n, 4 n), 1 bias (4 n).
static ct_status lstm_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                          ct_error *err) {
    int64_t n = ((const cell_hp *)l->hp)->n_units, rows, D;
    CT_TRY(cell_check(l, in, -1, "init", &rows, &D, err));
    ct_layer_declare_weight(l, ic, "kernel", ct_tensor_2d(CT_DTYPE_F32, D + n, 4 * n, NULL),
                            (ct_initializer){CT_INIT_GLOROT_UNIFORM, 1.0f}, ct_key_split(key, 0));
    // Trax: RandomNormal(1e-6) + forget_bias 1.0 on all 4 n biases. The
    // N(0, 1e-6^2) part is below a float's resolution at 1 but for a few
    // ulps; ctrax starts them at exactly 1.
    ct_layer_declare_weight(l, ic, "bias", ct_tensor_1d(CT_DTYPE_F32, 4 * n, NULL),
                            (ct_initializer){CT_INIT_ONES, 1.0f}, ct_key_split(key, 1));
    cell_out_sigs(l, in, out);
    return CT_OK;
}

// x (rows, D), s = [c | h] (rows, 2 n) -> h' (rows, n) and s' = [c' | h']
// (rows, 2 n), with xh = [x | h] and the activated gates
// g = [sigmoid(i) | tanh(j) | sigmoid(f) | sigmoid(o)] (rows, 4 n).
static void lstm_cell_forward(float *hn, float *sn, float *xh, float *g, const float *x, const float *s,
                              const float *w, const float *b, int64_t rows, int64_t D, int64_t n) {
    cat_cols(xh, x, D, s + n, n, 2 * n, rows);
    ct_matmul_forward(g, xh, w, b, rows, D + n, 4 * n);
    for (int64_t r = 0; r < rows; r++) {
        float *gr = g + r * 4 * n;
        ct_sigmoid_forward(gr, gr, n);
        ct_tanh_forward(gr + n, gr + n, n);
        ct_sigmoid_forward(gr + 2 * n, gr + 2 * n, 2 * n);
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * 4 * n, *cr = s + r * 2 * n;
        float *snr = sn + r * 2 * n;
        for (int64_t k = 0; k < n; k++) snr[k] = cr[k] * gr[2 * n + k] + gr[k] * gr[n + k];
        ct_tanh_forward(snr + n, snr, n);
        for (int64_t k = 0; k < n; k++) {
            snr[n + k] *= gr[3 * n + k];
            hn[r * n + k] = snr[n + k];
        }
    }
}

static ct_status lstm_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)key;
    int64_t n = ((const cell_hp *)l->hp)->n_units, rows, D;
    CT_TRY(cell_check(l, in, l->weights[0].sig.shape[0] - n, "forward", &rows, &D, err));
    CT_TRY(cell_outputs(c, in, l, out, err));
    ct_tensor xh = ct_tensor_2d(CT_DTYPE_F32, rows, D + n, NULL), g = ct_tensor_2d(CT_DTYPE_F32, rows, 4 * n, NULL);
    CT_TRY(ct_ctx_alloc(c, &xh, err));
    CT_TRY(ct_ctx_alloc(c, &g, err));
    lstm_cell_forward(out[0].data, out[1].data, xh.data, g.data, in[0].data, in[1].data, ct_weight(c, l, 0),
                      ct_weight(c, l, 1), rows, D, n);
    // The new state holds c', which backward needs: the output itself is
    // saved (layers never write into their inputs or outputs after forward).
    const ct_tensor saved[] = {in[0], in[1], xh, g, out[1]};
    for (size_t i = 0; i < sizeof saved / sizeof *saved; i++) CT_TRY(ct_tape_push(c, &saved[i], err));
    return CT_OK;
}

// From dh (rows, n) (h' from both outputs) and dcn (rows, 2 n, the state
// output's gradient, c' columns used; NULL: zero) adds into gx (rows, D),
// gs (rows, 2 n) and the weight gradients. dy (rows, 4 n), dxh (rows,
// D + n) and wtmp (ct_matmul_weight_grad_scratch_floats) are scratch.
static void lstm_cell_backward(float *gx, float *gs, float *gw, float *gb, const float *dh, const float *dcn,
                               const float *xh, const float *g, const float *s, const float *sn, const float *w,
                               float *dy, float *dxh, float *wtmp, int64_t rows, int64_t D, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * 4 * n;
        float *dyr = dy + r * 4 * n;
        for (int64_t k = 0; k < n; k++) {
            float si = gr[k], tj = gr[n + k], sf = gr[2 * n + k], so = gr[3 * n + k];
            float c = s[r * 2 * n + k], d = dh[r * n + k];
            float tc = tanhf(sn[r * 2 * n + k]);  // recomputed: h' / so loses it where so is near 0
            float dc = (dcn ? dcn[r * 2 * n + k] : 0.0f) + d * so * (1.0f - tc * tc);
            dyr[k] = dc * tj * si * (1.0f - si);
            dyr[n + k] = dc * si * (1.0f - tj * tj);
            dyr[2 * n + k] = dc * c * sf * (1.0f - sf);
            dyr[3 * n + k] = d * tc * so * (1.0f - so);
            gs[r * 2 * n + k] += dc * sf;
        }
    }
    ct_matmul_backward(dxh, gw, gb, wtmp, dy, xh, w, rows, D + n, 4 * n);
    split_cols_add(gx, gs + n, 2 * n, dxh, D, n, rows);
}

static ct_status lstm_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                               ct_error *err) {
    (void)key;
    int64_t n = ((const cell_hp *)l->hp)->n_units;
    ct_tensor sn = ct_tape_pop(c), g = ct_tape_pop(c), xh = ct_tape_pop(c), s = ct_tape_pop(c), x = ct_tape_pop(c);
    int64_t rows = g.shape[0], D = x.shape[x.ndim - 1];
    grad_in[0] = ct_tensor_sig(&x);
    grad_in[1] = ct_tensor_sig(&s);
    ct_tensor dh = ct_tensor_2d(CT_DTYPE_F32, rows, n, NULL);
    CT_TRY(ct_ctx_alloc(c, &dh, err));
    if (!cell_grad_h(grad_out, dh.data, rows, n, 2 * n)) return CT_OK;  // no gradient flows
    ct_tensor dy = g, dxh = xh;
    ct_tensor wtmp = ct_tensor_1d(CT_DTYPE_F32, ct_matmul_weight_grad_scratch_floats(rows, D + n, 4 * n), NULL);
    CT_TRY(ct_ctx_alloc(c, &dy, err));
    CT_TRY(ct_ctx_alloc(c, &dxh, err));
    CT_TRY(ct_ctx_alloc(c, &wtmp, err));
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    CT_TRY(ct_ctx_zeros(c, &grad_in[1], err));
    lstm_cell_backward(grad_in[0].data, grad_in[1].data, ct_weight_grad(c, l, 0), ct_weight_grad(c, l, 1), dh.data,
                       grad_out[1].data, xh.data, g.data, s.data, sn.data, ct_weight(c, l, 0), dy.data, dxh.data,
                       wtmp.data, rows, D, n);
    return CT_OK;
}

static const ct_layer_vtable lstm_vt = {
    .type = "LSTMCell", .init = lstm_init, .forward = lstm_forward, .backward = lstm_backward};

ct_layer *ct_lstm_cell(int n_units) {
    CT_ASSERT(n_units > 0);
    return ct_layer_new_hp(&lstm_vt, 2, 2, &(cell_hp){n_units, 2}, sizeof(cell_hp));
}

// ---- MakeZeroState ----------------------------------------------------------

typedef struct zero_state_hp {
    int depth_multiplier;
} zero_state_hp;

static ct_status zero_state_shape(const ct_layer *l, const ct_tensor *in, ct_tensor *out, const char *op,
                                  ct_error *err) {
    if (in[0].ndim != 3) {
        char s[CT_SIG_STR_MAX];
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected (batch, length, depth)",
                             ct_tensor_sig_str(&in[0], s, sizeof s));
    }
    int m = ((const zero_state_hp *)l->hp)->depth_multiplier;
    out[0] = ct_tensor_2d(CT_DTYPE_F32, in[0].shape[0], m * in[0].shape[2], NULL);
    return CT_OK;
}

static ct_status zero_state_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                                 ct_error *err) {
    (void)ic;
    (void)key;
    return zero_state_shape(l, in, out, "init", err);
}

static ct_status zero_state_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                    ct_error *err) {
    (void)key;
    CT_TRY(zero_state_shape(l, in, out, "forward", err));
    CT_TRY(ct_ctx_zeros(c, &out[0], err));
    return ct_tape_push_sig(c, &in[0], err);
}

// The zeros do not depend on x: its gradient is zero.
static ct_status zero_state_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                     ct_key key, ct_error *err) {
    (void)l;
    (void)key;
    (void)err;
    ct_tape_pop_input_sig(c, grad_out, grad_in);
    return CT_OK;
}

static const ct_layer_vtable zero_state_vt = {.type = "MakeZeroState",
                                              .init = zero_state_init,
                                              .forward = zero_state_forward,
                                              .backward = zero_state_backward};

ct_layer *ct_make_zero_state(int depth_multiplier) {
    CT_ASSERT(depth_multiplier >= 1);
    return ct_layer_new_hp(&zero_state_vt, 1, 1, &(zero_state_hp){depth_multiplier}, sizeof(zero_state_hp));
}
