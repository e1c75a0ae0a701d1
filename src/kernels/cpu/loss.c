#include "kernels/cpu/loss.h"

#include <math.h>

#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vmath.h"
#include "core/clones.h"

double ct_weight_sum(const float *weights, int64_t N) {
    double s = 0.0;
    for (int64_t n = 0; n < N; n++) s += weights[n];
    return s;
}

void ct_cross_entropy_forward(float *out, const float *logp, const int32_t *targets, const float *weights,
                              double wsum, int64_t N, int64_t V) {
    double s = 0.0;
    for (int64_t n = 0; n < N; n++)
        if (weights[n] != 0.0f) s -= (double)logp[n * V + targets[n]] * weights[n];
    out[0] = (float)(s / wsum);
}

void ct_cross_entropy_backward(float *dlogp, float dout, const int32_t *targets, const float *weights,
                               double wsum, int64_t N, int64_t V) {
    for (int64_t n = 0; n < N; n++) dlogp[n * V + targets[n]] -= (float)((double)dout * weights[n] / wsum);
}

// The sum of one row in CT_LANES lanes (vmath.h), for the widest vectors
// this CPU has.
CT_CLONES
static double lanes_row_sum(const float *x, int64_t V) { return ct_lanes_sum(x, V); }

// Rows per block of the smoothed loss's sum: a constant, so the grouping of
// the sum, and its bits, are the same at every thread count.
#define CE_BLOCK_ROWS 64

// The forward is the vectorized log-softmax (max, sum of exp and the written
// row: the row is read from memory once) and the loss picked from the rows
// it wrote, summed over rows in order. With label smoothing every class
// counts, so a second pass sums each weighted row (a full read of logp: at a
// large vocabulary as much work as the log-softmax): the threads take blocks
// of CE_BLOCK_ROWS rows, each summed in row order, and the blocks' sums are
// added in block order (`ordered`).
void ct_category_cross_entropy_forward(float *out, float *logp, const float *logits, const int32_t *targets,
                                       const float *weights, double wsum, float label_smoothing, int64_t N,
                                       int64_t V) {
    ct_log_softmax_forward(logp, logits, N, V);
    if (label_smoothing == 0.0f) {
        ct_cross_entropy_forward(out, logp, targets, weights, wsum, N, V);
        return;
    }
    double conf = 1.0 - (double)label_smoothing, share = (double)label_smoothing / (double)V, s = 0.0;
    int64_t n_blocks = (N + CE_BLOCK_ROWS - 1) / CE_BLOCK_ROWS;
#pragma omp parallel for ordered schedule(static, 1) if (N * V > 32768 && n_blocks > 1)
    for (int64_t b = 0; b < n_blocks; b++) {
        double block = 0.0;
        for (int64_t n = b * CE_BLOCK_ROWS; n < N && n < (b + 1) * CE_BLOCK_ROWS; n++) {
            if (weights[n] == 0.0f) continue;
            const float *lp = logp + n * V;
            double ce = -share * lanes_row_sum(lp, V);
            // At s = 1 the target's own term has weight 0: skipped, so that a
            // logp of -inf there gives the loss's inf, not 0 * inf = NaN.
            if (conf != 0.0) ce -= conf * lp[targets[n]];
            block += ce * weights[n];
        }
#pragma omp ordered
        s += block;
    }
    out[0] = (float)(s / wsum);
}

// One row of the backward: dx += coef * exp(lp), lp <= 0 a log-probability
// (the domain of ct_vexp_nonpos, within 2 ulp of expf). exp is the work
// here, so the loop is compiled for the widest vectors this CPU has.
CT_CLONES
static void ce_row_backward(float *dx, const float *lp, float coef, int64_t V) {
#pragma omp simd
    for (int64_t c = 0; c < V; c++) dx[c] += coef * ct_vexp_nonpos(lp[c]);
}

// The same with label smoothing: dx += coef * (exp(lp) - share), share =
// s / V, the smoothed targets' part of every class.
CT_CLONES
static void ce_row_backward_smoothed(float *dx, const float *lp, float coef, float share, int64_t V) {
#pragma omp simd
    for (int64_t c = 0; c < V; c++) dx[c] += coef * (ct_vexp_nonpos(lp[c]) - share);
}

// coef = dout * w / wsum; with smoothing s the target's class gets
// -coef (1 - s) on top of the row's -coef s / V. Every term is the float
// coef times a constant of the layer, so a row's gradient depends on dout,
// w and wsum only through coef (a chunk of the chunked loss that reaches
// the same float coef by another dout and wsum gives the same bits); with
// s == 0 they are the unsmoothed kernel's bits.
void ct_category_cross_entropy_backward(float *dlogits, float dout, const float *logp, const int32_t *targets,
                                        const float *weights, double wsum, float label_smoothing, int64_t N,
                                        int64_t V) {
    float share = (float)((double)label_smoothing / (double)V), hot = 1.0f - label_smoothing;
#pragma omp parallel for schedule(static) if (N * V > 32768)
    for (int64_t n = 0; n < N; n++) {
        float coef = (float)((double)dout * weights[n] / wsum);
        if (coef == 0.0f) continue;  // a padding position: no gradient
        if (label_smoothing == 0.0f) ce_row_backward(dlogits + n * V, logp + n * V, coef, V);
        else ce_row_backward_smoothed(dlogits + n * V, logp + n * V, coef, share, V);
        dlogits[n * V + targets[n]] -= coef * hot;
    }
}

// The references write out Trax's target distribution p of each class (no
// shortcut for s == 0): the loss -sum_c p_c logp_c in index order, the
// gradient coef (exp(logp_c) - p_c) with libm's expf.
void ct_category_cross_entropy_forward_ref(float *out, float *logp, const float *logits, const int32_t *targets,
                                           const float *weights, double wsum, float label_smoothing, int64_t N,
                                           int64_t V) {
    ct_log_softmax_forward_ref(logp, logits, N, V);
    double s = 0.0;
    for (int64_t n = 0; n < N; n++) {
        if (weights[n] == 0.0f) continue;
        double ce = 0.0;
        for (int64_t c = 0; c < V; c++) {
            double p = (c == targets[n] ? 1.0 - label_smoothing : 0.0) + (double)label_smoothing / (double)V;
            if (p != 0.0) ce -= p * logp[n * V + c];
        }
        s += ce * weights[n];
    }
    out[0] = (float)(s / wsum);
}

void ct_category_cross_entropy_backward_ref(float *dlogits, float dout, const float *logp, const int32_t *targets,
                                            const float *weights, double wsum, float label_smoothing, int64_t N,
                                            int64_t V) {
    for (int64_t n = 0; n < N; n++) {
        double coef = (double)dout * weights[n] / wsum;
        if ((float)coef == 0.0f) continue;
        const float *lp = logp + n * V;
        float *dx = dlogits + n * V;
        for (int64_t c = 0; c < V; c++) {
            double p = (c == targets[n] ? 1.0 - label_smoothing : 0.0) + (double)label_smoothing / (double)V;
            dx[c] += (float)(coef * ((double)expf(lp[c]) - p));
        }
    }
}

void ct_l2_loss_forward(float *out, const float *outputs, const float *targets, const float *weights,
                        double wsum, int64_t N) {
    double s = 0.0;
    for (int64_t n = 0; n < N; n++) {
        if (weights[n] == 0.0f) continue;
        double d = (double)outputs[n] - targets[n];
        s += weights[n] * d * d;
    }
    out[0] = (float)(s / wsum);
}

void ct_l2_loss_backward(float *doutputs, float dout, const float *outputs, const float *targets,
                         const float *weights, double wsum, int64_t N) {
    double k = 2.0 * dout / wsum;
    for (int64_t n = 0; n < N; n++) {
        // As forward: a weight-0 position adds nothing, even a NaN or inf
        // difference (0 * NaN would make the gradient NaN under a finite loss).
        if (weights[n] == 0.0f) continue;
        doutputs[n] += (float)(k * weights[n] * ((double)outputs[n] - targets[n]));
    }
}

void ct_binary_cross_entropy_forward(float *out, const float *x, const int32_t *t, int64_t N) {
    double s = 0.0;
    for (int64_t n = 0; n < N; n++) {
        double v = x[n];
        s += fmax(v, 0.0) - t[n] * v + log1p(exp(-fabs(v)));
    }
    out[0] = (float)(N ? s / (double)N : 0.0);
}

void ct_binary_cross_entropy_backward(float *dx, float dout, const float *x, const int32_t *t, int64_t N) {
    double k = (double)dout / (double)N;
    for (int64_t n = 0; n < N; n++) {
        double v = x[n], e = exp(-fabs(v));
        double sigmoid = v >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
        dx[n] += (float)(k * (sigmoid - t[n]));
    }
}

void ct_argmax_forward(int32_t *out, const float *inp, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static) if (N * V > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * V;
        int64_t best = 0;
        for (int64_t c = 0; c < V; c++) {
            if (isnan(x[c])) {
                best = c;
                break;
            }
            if (x[c] > x[best]) best = c;
        }
        out[n] = (int32_t)best;
    }
}

double ct_weighted_matches(const int32_t *pred, const int32_t *targets, const float *weights, int64_t N) {
    double s = 0.0;
    for (int64_t n = 0; n < N; n++)
        if (pred[n] == targets[n]) s += weights ? (double)weights[n] : 1.0;
    return s;
}

int64_t ct_sequence_matches(const int32_t *pred, const int32_t *targets, const float *weights, int64_t N,
                            int64_t T) {
    int64_t count = 0;
    for (int64_t n = 0; n < N; n++) {
        int ok = 1;
        for (int64_t t = 0; t < T && ok; t++)
            if (weights[n * T + t] != 0.0f && pred[n * T + t] != targets[n * T + t]) ok = 0;
        count += ok;
    }
    return count;
}
