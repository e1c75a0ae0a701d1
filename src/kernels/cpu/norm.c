#include "kernels/cpu/norm.h"

#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stddef.h>

#include "kernels/cpu/vmath.h"
#include "core/clones.h"

#define CT_NORM_PARALLEL_MIN 32768
#define CT_NORM_COL_BLOCK 64

// The row kernels are compiled for the widest vectors this CPU has (the
// sums are in double: 2 lanes at x86-64's baseline, 8 with AVX-512), every
// clone with the same bits, the _ref loops' where the tests say bitwise
// (CT_CLONES_EXACT; clang's half is the pragma).
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
#define ROW_KERNEL CT_CLONES_EXACT

// Forward reads each row once from memory: mean and variance come from one
// pass of shifted sums in double, S1 = sum d, S2 = sum d^2 with d = x - x[0]
// (the shift keeps S2 / C - (S1 / C)^2 free of the cancellation the plain
// sum of squares has when |mean| >> std), then the row, now in L1, is
// written. The sums run in CT_LANES lanes (vmath.h): the same bits for any
// thread count, vector width or row address.
ROW_KERNEL
static void layernorm_row_forward(float *y, float *mean, float *rstd, const float *x, const float *weight,
                                  const float *bias, int64_t C, float eps) {
    double x0 = C > 0 ? x[0] : 0.0, l1[CT_LANES] = {0}, l2[CT_LANES] = {0};
    int64_t c0 = 0;  // whole groups of CT_LANES (a constant count vectorizes), then the rest
    for (; c0 + CT_LANES <= C; c0 += CT_LANES) {
        const int nj = CT_LANES;
#pragma omp simd
        for (int j = 0; j < nj; j++) {
            double d = (double)x[c0 + j] - x0;
            l1[j] += d;
            l2[j] += d * d;
        }
    }
    {
        const int nj = (int)(C - c0);
        for (int j = 0; j < nj; j++) {
            double d = (double)x[c0 + j] - x0;
            l1[j] += d;
            l2[j] += d * d;
        }
    }
    double s1 = ct_lanes_total(l1), s2 = ct_lanes_total(l2);
    double md = s1 / (double)C, var = s2 / (double)C - md * md;
    float m = (float)(x0 + md);
    float s = 1.0f / sqrtf((float)(var > 0.0 ? var : 0.0) + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    *mean = m;
    *rstd = s;
}

void ct_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > CT_NORM_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++)
        layernorm_row_forward(out + n * C, mean + n, rstd + n, inp + n * C, weight, bias, C, eps);
}

// One row's input gradient, written to dx (which may be g: each element is
// read before it is written):
// dx = rstd * (w*g - mean(w*g) - norm * mean(w*g*norm)); both means in one
// pass, in lanes as in the forward. The row's terms of dweight and dbias are
// added to them in the same pass over the row, as the column loop adds them.
ROW_KERNEL
static void layernorm_row_backward(float *dx, float *dweight, float *dbias, const float *g, const float *x,
                                   const float *weight, float m, float s, int64_t C) {
    double lg[CT_LANES] = {0}, lgn[CT_LANES] = {0};
    int64_t c0 = 0;  // whole groups of CT_LANES (a constant count vectorizes), then the rest
    for (; c0 + CT_LANES <= C; c0 += CT_LANES) {
        const int nj = CT_LANES;
#pragma omp simd
        for (int j = 0; j < nj; j++) {
            int64_t c = c0 + j;
            float wg = weight[c] * g[c];
            lg[j] += wg;
            lgn[j] += (double)wg * ((x[c] - m) * s);
        }
    }
    {
        const int nj = (int)(C - c0);
        for (int j = 0; j < nj; j++) {
            int64_t c = c0 + j;
            float wg = weight[c] * g[c];
            lg[j] += wg;
            lgn[j] += (double)wg * ((x[c] - m) * s);
        }
    }
    float mean_g = (float)(ct_lanes_total(lg) / (double)C), mean_gn = (float)(ct_lanes_total(lgn) / (double)C);
#pragma omp simd
    for (int64_t c = 0; c < C; c++) {
        float norm = (x[c] - m) * s, gc = g[c];  // read before dx[c] is written: dx may be g
        dweight[c] += gc * norm;
        dbias[c] += gc;
        dx[c] = s * (weight[c] * gc - mean_g - norm * mean_gn);
    }
}

// dweight, dbias [c0, c1) += their terms of every row, rows in order.
ROW_KERNEL
static void layernorm_cols_backward(float *dweight, float *dbias, const float *dout, const float *inp,
                                    const float *mean, const float *rstd, int64_t N, int64_t C, int64_t c0,
                                    int64_t c1) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *g = dout + n * C;
        float m = mean[n], s = rstd[n];
#pragma omp simd
        for (int64_t c = c0; c < c1; c++) {
            dweight[c] += g[c] * ((x[c] - m) * s);
            dbias[c] += g[c];
        }
    }
}

void ct_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean, const float *rstd,
                           int64_t N, int64_t C) {
    // With an input gradient, one pass on one thread: each row's input
    // gradient and its share of dweight and dbias while the row is in L1,
    // rows in order, so the sums are the column loop's bits. It beat the
    // threaded two passes it replaced (columns on every thread, then rows:
    // the second pass read dout and the input again, half of them rows the
    // other core's GEMM had just written). LayerNorm backward in a step at
    // two threads, profile, fused against two-pass: 1.6-1.7 against 3.0-3.3
    // ms (bench config A), 5.8-6.3 against 7.8-8.0 (B), 3.1 against 4.7
    // (make train's ReformerLM).
    if (dinp) {
        for (int64_t n = 0; n < N; n++)
            layernorm_row_backward(dinp + n * C, dweight, dbias, dout + n * C, inp + n * C, weight, mean[n],
                                   rstd[n], C);
        return;
    }
    // Weight and bias gradients alone sum over rows: threads take blocks of
    // columns and walk the rows in order, so the result does not depend on
    // the thread count (and is bitwise the reference's).
    int64_t n_blocks = (C + CT_NORM_COL_BLOCK - 1) / CT_NORM_COL_BLOCK;
#pragma omp parallel for schedule(static) if (N * C > CT_NORM_PARALLEL_MIN)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        int64_t c0 = blk * CT_NORM_COL_BLOCK;
        int64_t c1 = c0 + CT_NORM_COL_BLOCK < C ? c0 + CT_NORM_COL_BLOCK : C;
        layernorm_cols_backward(dweight, dbias, dout, inp, mean, rstd, N, C, c0, c1);
    }
}

// ---- the plain loops, two passes for the variance (tests/test_kernels.c
// checks the kernels above against these) ----

void ct_layernorm_forward_ref(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int64_t N, int64_t C, float eps) {
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        double sum = 0.0;
        for (int64_t c = 0; c < C; c++) sum += x[c];
        float m = (float)(sum / (double)C);
        double var = 0.0;
        for (int64_t c = 0; c < C; c++) {
            float d = x[c] - m;
            var += (double)d * d;
        }
        float s = 1.0f / sqrtf((float)(var / (double)C) + eps);
        for (int64_t c = 0; c < C; c++) y[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

void ct_layernorm_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean, const float *rstd,
                               int64_t N, int64_t C) {
    // The input gradient, row by row:
    // dx = rstd * (w*g - mean(w*g) - norm * mean(w*g*norm)).
    if (dinp) {
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * C, *g = dout + n * C;
            float *dx = dinp + n * C;
            float m = mean[n], s = rstd[n];
            double sum_g = 0.0, sum_gn = 0.0;
            for (int64_t c = 0; c < C; c++) {
                float wg = weight[c] * g[c];
                sum_g += wg;
                sum_gn += (double)wg * ((x[c] - m) * s);
            }
            float mean_g = (float)(sum_g / (double)C), mean_gn = (float)(sum_gn / (double)C);
            for (int64_t c = 0; c < C; c++) {
                float norm = (x[c] - m) * s;
                dx[c] = s * (weight[c] * g[c] - mean_g - norm * mean_gn);
            }
        }
    }
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C, *g = dout + n * C;
        float m = mean[n], s = rstd[n];
        for (int64_t c = 0; c < C; c++) {
            dweight[c] += g[c] * ((x[c] - m) * s);
            dbias[c] += g[c];
        }
    }
}
