#include "kernels/cpu/softmax.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>

// The start of a stable softmax over one row x[0..C): its max m (-inf for
// C == 0) and the sum of exp(x[c] - m) in double, each term written to y[c]
// when y is not NULL.
static double row_exp_sum(const float *x, float *y, int64_t C, float *m) {
    float maxv = -INFINITY;
    for (int64_t c = 0; c < C; c++) maxv = fmaxf(maxv, x[c]);
    double sum = 0.0;
    for (int64_t c = 0; c < C; c++) {
        float e = expf(x[c] - maxv);
        if (y) y[c] = e;
        sum += e;
    }
    *m = maxv;
    return sum;
}

void ct_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        float *y = out + n * C, maxv;
        float inv = (float)(1.0 / row_exp_sum(inp + n * C, y, C, &maxv));
        for (int64_t c = 0; c < C; c++) y[c] *= inv;
    }
}

void ct_log_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float maxv;
        double sum = row_exp_sum(x, NULL, C, &maxv);
        float lse = maxv + (float)log(sum), *y = out + n * C;
        for (int64_t c = 0; c < C; c++) y[c] = x[c] - lse;
    }
}

// dinp += the gradient through the softmax (log_softmax: the log-softmax)
// whose output rows are out, from dout; all (N, C).
static void rows_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C, bool log_softmax) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *g = dout + n * C, *y = out + n * C;
        float *dx = dinp + n * C;
        if (log_softmax) {  // dx = g - softmax * sum(g), where softmax = exp(y)
            double sum = 0.0;
            for (int64_t c = 0; c < C; c++) sum += g[c];
            for (int64_t c = 0; c < C; c++) dx[c] += g[c] - expf(y[c]) * (float)sum;
        } else {  // dx = y * (g - <g, y>)
            double dot = 0.0;
            for (int64_t c = 0; c < C; c++) dot += (double)g[c] * y[c];
            for (int64_t c = 0; c < C; c++) dx[c] += y[c] * (g[c] - (float)dot);
        }
    }
}

void ct_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C) {
    rows_backward(dinp, dout, out, N, C, false);
}

void ct_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C) {
    rows_backward(dinp, dout, out, N, C, true);
}
