// Trax's SRU(n_units) (trax/layers/rnn.py, no activation), named
// "SRU_<n_units>" as Trax names it:
//   Serial(Branch(Dense(3 n), Select([0])), SRUCell)
// The Dense is ctrax's (Trax's initializers; checkpoint names
// SRU_<n>/Branch[0]/Parallel[1]/Dense[0]/kernel and bias, ctrax's Branch
// being Serial(Select, Parallel)). Trax's Split, the two Sigmoids,
// the (y (1 - f), f, r) Fn, the zero state, ScanSRUCell, Select and
// FinalSRUGate are one layer here, SRUCell, whose forward is one pass over t
// and whose backward is one reverse pass, fused over the three gates: the
// recurrence is elementwise per (b, j) column, so a chain of stack layers
// would only add (B, T, n) tensors and passes.
//
// Memory: forward saves the cell states c (B, T, n) on the tape besides its
// two inputs (which its callers keep alive anyway). c_{t-1} cannot be
// rebuilt from c_t stably (it divides by f_t, which may be near 0), and
// recomputing c in backward costs a full scan with its two sigmoids again;
// c is a third of the Dense's output, so memory stays linear in T.
#include <math.h>
#include <stdio.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/layers/rnn.h"
#include "layers/internal.h"

// Trax's FinalSRUGate: h = c r + x (1 - r) 3**0.5.
#define SRU_X_SCALE 1.7320508075688772f

// Columns per block of the scan: a block of one example's columns walks t
// with its c values in registers/L1 and contiguous loads per row.
#define SRU_BLOCK 64
// Below this many elements (B T n) a scan runs on one thread.
#define SRU_PARALLEL_MIN 16384

typedef struct sru_hp {
    int n_units;
} sru_hp;

// The logistic function, in the form of kernels/cpu/activation.c's
// ct_sigmoid_forward (neither branch overflows expf), per element because
// r and f sit inside the (3 n)-wide rows next to y.
static inline float sru_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

// Checks rfy (B, T, 3n) and x (B, T, n): names the layer, the op and both
// widths, so a SRU given the wrong width says so.
static ct_status sru_check(const ct_layer *l, const char *op, const ct_tensor *in, ct_error *err) {
    int n = ((const sru_hp *)l->hp)->n_units;
    const ct_tensor *rfy = &in[0], *x = &in[1];
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 3)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "SRU input x is %s, expected f32 (batch, time, %d)",
                             ct_tensor_sig_str(x, a, sizeof a), n);
    if (x->shape[2] != n)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "SRU input width %lld must equal n_units %d (input %s; Trax's SRU keeps the width)",
                             (long long)x->shape[2], n, ct_tensor_sig_str(x, a, sizeof a));
    if (rfy->dtype != CT_DTYPE_F32 || rfy->ndim != 3 || rfy->shape[0] != x->shape[0] ||
        rfy->shape[1] != x->shape[1] || rfy->shape[2] != 3 * (int64_t)n)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "gates %s do not fit input %s: expected (%lld, %lld, %d)",
                             ct_tensor_sig_str(rfy, a, sizeof a), ct_tensor_sig_str(x, b, sizeof b),
                             (long long)x->shape[0], (long long)x->shape[1], 3 * n);
    return CT_OK;
}

static ct_status sru_cell_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    (void)ic;
    (void)key;
    CT_TRY(sru_check(l, "init", in, err));
    out[0] = ct_tensor_sig(&in[1]);
    return CT_OK;
}

// rfy (B, T, 3n) holds the pre-sigmoid r, f and y (columns [0,n), [n,2n),
// [2n,3n)); x (B, T, n). Writes h (B, T, n) and the states c (B, T, n):
//   c_t = f_t c_{t-1} + (1 - f_t) y_t, c_{-1} = 0
//   h_t = r_t c_t + (1 - r_t) sqrt(3) x_t
static void sru_cell_forward(float *h, float *cs, const float *rfy, const float *x, int64_t B, int64_t T,
                             int64_t n) {
    int64_t n_blocks = (n + SRU_BLOCK - 1) / SRU_BLOCK;
#pragma omp parallel for schedule(static) if (B * T * n > SRU_PARALLEL_MIN)
    for (int64_t bj = 0; bj < B * n_blocks; bj++) {
        int64_t b = bj / n_blocks, j0 = (bj % n_blocks) * SRU_BLOCK;
        int64_t m = n - j0 < SRU_BLOCK ? n - j0 : SRU_BLOCK;
        float c[SRU_BLOCK] = {0};
        for (int64_t t = 0; t < T; t++) {
            int64_t row = b * T + t;
            const float *g = rfy + row * 3 * n + j0;
            const float *xr = x + row * n + j0;
            float *hr = h + row * n + j0, *cr = cs + row * n + j0;
            for (int64_t k = 0; k < m; k++) {
                float r = sru_sigmoid(g[k]), f = sru_sigmoid(g[n + k]);
                c[k] = f * c[k] + (1.0f - f) * g[2 * n + k];
                cr[k] = c[k];
                hr[k] = r * c[k] + (1.0f - r) * SRU_X_SCALE * xr[k];
            }
        }
    }
}

// The reverse pass of sru_cell_forward: from dh (B, T, n) writes (=) drfy
// (B, T, 3n, gradients of the pre-sigmoid gates) and dx (B, T, n). dc
// carries dL/dc_t back: dc_t = dh_t r_t + dc_{t+1} f_{t+1}.
static void sru_cell_backward(float *drfy, float *dx, const float *dh, const float *rfy, const float *x,
                              const float *cs, int64_t B, int64_t T, int64_t n) {
    int64_t n_blocks = (n + SRU_BLOCK - 1) / SRU_BLOCK;
#pragma omp parallel for schedule(static) if (B * T * n > SRU_PARALLEL_MIN)
    for (int64_t bj = 0; bj < B * n_blocks; bj++) {
        int64_t b = bj / n_blocks, j0 = (bj % n_blocks) * SRU_BLOCK;
        int64_t m = n - j0 < SRU_BLOCK ? n - j0 : SRU_BLOCK;
        float dc[SRU_BLOCK] = {0};
        for (int64_t t = T - 1; t >= 0; t--) {
            int64_t row = b * T + t;
            const float *g = rfy + row * 3 * n + j0;
            float *dg = drfy + row * 3 * n + j0;
            const float *xr = x + row * n + j0, *dhr = dh + row * n + j0, *cr = cs + row * n + j0;
            const float *cprev = t > 0 ? cs + (row - 1) * n + j0 : NULL;
            float *dxr = dx + row * n + j0;
            for (int64_t k = 0; k < m; k++) {
                float r = sru_sigmoid(g[k]), f = sru_sigmoid(g[n + k]), y = g[2 * n + k];
                float sx = SRU_X_SCALE * xr[k];
                float c_prev = cprev ? cprev[k] : 0.0f;
                float dct = dhr[k] * r + dc[k];
                dg[k] = dhr[k] * (cr[k] - sx) * r * (1.0f - r);
                dg[n + k] = dct * (c_prev - y) * f * (1.0f - f);
                dg[2 * n + k] = dct * (1.0f - f);
                dxr[k] = dhr[k] * (1.0f - r) * SRU_X_SCALE;
                dc[k] = dct * f;
            }
        }
    }
}

static ct_status sru_cell_fwd(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)key;
    CT_TRY(sru_check(l, "forward", in, err));
    const ct_tensor *rfy = &in[0], *x = &in[1];
    out[0] = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_tensor cs = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &cs, err));
    sru_cell_forward(out[0].data, cs.data, rfy->data, x->data, x->shape[0], x->shape[1], x->shape[2]);
    CT_TRY(ct_tape_push(c, rfy, err));
    CT_TRY(ct_tape_push(c, x, err));
    return ct_tape_push(c, &cs, err);
}

static ct_status sru_cell_bwd(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                              ct_error *err) {
    (void)l;
    (void)key;
    ct_tensor cs = ct_tape_pop(c);
    ct_tensor x = ct_tape_pop(c);
    ct_tensor rfy = ct_tape_pop(c);
    grad_in[0] = ct_tensor_sig(&rfy);
    grad_in[1] = ct_tensor_sig(&x);
    if (!grad_out[0].data) return CT_OK;  // no gradient flows: both stay zero (NULL)
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    CT_TRY(ct_ctx_alloc(c, &grad_in[1], err));
    sru_cell_backward(grad_in[0].data, grad_in[1].data, grad_out[0].data, rfy.data, x.data, cs.data, x.shape[0],
                      x.shape[1], x.shape[2]);
    return CT_OK;
}

static const ct_layer_vtable sru_cell_vt = {
    .type = "SRUCell", .init = sru_cell_init, .forward = sru_cell_fwd, .backward = sru_cell_bwd};

ct_layer *ct_sru(int n_units) {
    CT_ASSERT(n_units > 0);
    ct_layer *cell = ct_layer_new_hp(&sru_cell_vt, 2, 1, &(sru_hp){n_units}, sizeof(sru_hp));
    // Branch(Dense(3n), []): Trax's [] is the identity on one item.
    ct_layer *branch = ct_branch(CT_LAYERS(ct_dense(3 * n_units), ct_select(1, (int[]){0}, 1)));
    char name[CT_NAME_MAX];
    snprintf(name, sizeof name, "SRU_%d", n_units);
    return ct_layer_rename(ct_serial(CT_LAYERS(branch, cell)), name);
}
