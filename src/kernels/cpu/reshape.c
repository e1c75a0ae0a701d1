#include "kernels/cpu/reshape.h"

#include <string.h>

#define CT_RESHAPE_PARALLEL_MIN 32768

void ct_shift_right_forward(void *out, const void *inp, int64_t B, int64_t T, int64_t C, int64_t n,
                            size_t elem_size) {
    if (n > T) n = T;
    size_t row = (size_t)(T * C) * elem_size, pad = (size_t)(n * C) * elem_size;
    for (int64_t b = 0; b < B; b++) {
        char *o = (char *)out + (size_t)b * row;
        const char *x = (const char *)inp + (size_t)b * row;
        memset(o, 0, pad);  // all-zero bits are 0 and 0.0f
        memcpy(o + pad, x, row - pad);
    }
}

void ct_shift_right_backward(float *dinp, const float *dout, int64_t B, int64_t T, int64_t C, int64_t n) {
    if (n >= T) return;
    int64_t len = (T - n) * C;
#pragma omp parallel for schedule(static) if (B * T * C > CT_RESHAPE_PARALLEL_MIN)
    for (int64_t b = 0; b < B; b++) {
        float *dx = dinp + b * T * C;
        const float *g = dout + b * T * C + n * C;
        for (int64_t k = 0; k < len; k++) dx[k] += g[k];
    }
}

void ct_mean_forward(float *out, const float *inp, int64_t O, int64_t A, int64_t I) {
#pragma omp parallel for schedule(static) if (O * A * I > CT_RESHAPE_PARALLEL_MIN)
    for (int64_t o = 0; o < O; o++)
        for (int64_t i = 0; i < I; i++) {
            const float *x = inp + o * A * I + i;
            double s = 0.0;
            for (int64_t a = 0; a < A; a++) s += x[a * I];
            out[o * I + i] = (float)(s / (double)A);
        }
}

void ct_mean_backward(float *dinp, const float *dout, int64_t O, int64_t A, int64_t I) {
    float inv = 1.0f / (float)A;
#pragma omp parallel for schedule(static) if (O * A * I > CT_RESHAPE_PARALLEL_MIN)
    for (int64_t o = 0; o < O; o++)
        for (int64_t a = 0; a < A; a++) {
            float *dx = dinp + (o * A + a) * I;
            const float *g = dout + o * I;
            for (int64_t i = 0; i < I; i++) dx[i] += g[i] * inv;
        }
}
