#include "kernels/cpu/softmax.h"

#include <math.h>

// The largest of x[0..C), -inf for C == 0 (the start of a stable softmax).
static float row_max(const float *x, int64_t C) {
    float maxv = -INFINITY;
    for (int64_t c = 0; c < C; c++) maxv = fmaxf(maxv, x[c]);
    return maxv;
}

void ct_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        const float maxv = row_max(x, C);
        double sum = 0.0;
        for (int64_t c = 0; c < C; c++) {
            y[c] = expf(x[c] - maxv);
            sum += y[c];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < C; c++) y[c] *= inv;
    }
}

void ct_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *g = dout + n * C, *y = out + n * C;
        float *dx = dinp + n * C;
        double dot = 0.0;
        for (int64_t c = 0; c < C; c++) dot += (double)g[c] * y[c];
        for (int64_t c = 0; c < C; c++) dx[c] += y[c] * (g[c] - (float)dot);
    }
}

void ct_log_softmax_forward(float *out, const float *inp, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        const float maxv = row_max(x, C);
        double sum = 0.0;
        for (int64_t c = 0; c < C; c++) sum += expf(x[c] - maxv);
        float lse = maxv + (float)log(sum);
        for (int64_t c = 0; c < C; c++) y[c] = x[c] - lse;
    }
}

void ct_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > 32768)
    for (int64_t n = 0; n < N; n++) {
        const float *g = dout + n * C, *y = out + n * C;
        float *dx = dinp + n * C;
        double sum = 0.0;
        for (int64_t c = 0; c < C; c++) sum += g[c];
        for (int64_t c = 0; c < C; c++) dx[c] += g[c] - expf(y[c]) * (float)sum;
    }
}
