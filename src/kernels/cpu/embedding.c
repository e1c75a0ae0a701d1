#include "kernels/cpu/embedding.h"

#include <math.h>
#include <string.h>

#define CT_EMB_PARALLEL_MIN 32768

void ct_embedding_forward(float *out, const int32_t *ids, const float *weight, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > CT_EMB_PARALLEL_MIN)
    for (int64_t n = 0; n < N; n++)
        memcpy(out + n * C, weight + (int64_t)ids[n] * C, (size_t)C * sizeof *out);
}

void ct_embedding_backward(float *dweight, const float *dout, const int32_t *ids, int64_t N, int64_t C) {
    // Rows with the same id collide, so each column takes the rows in order:
    // the threads take blocks of 64 columns (256 bytes of each row), each
    // walking every row, so the bits do not depend on the thread count. (On
    // one thread it was 0.2% of a TransformerLM step, the other core idle.)
    enum { COLS = 64 };
    const int64_t n_blocks = (C + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) if (N * C > CT_EMB_PARALLEL_MIN && n_blocks > 1)
    for (int64_t blk = 0; blk < n_blocks; blk++) {
        const int64_t c0 = blk * COLS, c1 = c0 + COLS < C ? c0 + COLS : C;
        for (int64_t n = 0; n < N; n++) {
            float *dw = dweight + (int64_t)ids[n] * C;
            const float *g = dout + n * C;
#pragma omp simd
            for (int64_t c = c0; c < c1; c++) dw[c] += g[c];
        }
    }
}

void ct_positional_sinusoids(float *pe, int64_t T, int64_t C) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c += 2) {
            double angle = (double)t / pow(10000.0, (double)c / (double)C);
            pe[t * C + c] = (float)sin(angle);
            if (c + 1 < C) pe[t * C + c + 1] = (float)cos(angle);
        }
}

void ct_positional_forward(float *out, const float *inp, const float *pe, int64_t B, int64_t TC) {
#pragma omp parallel for schedule(static) if (B * TC > CT_EMB_PARALLEL_MIN)
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < TC; i++) out[b * TC + i] = inp[b * TC + i] + pe[i];
}

void ct_positional_backward(float *dpe, const float *dout, int64_t B, int64_t TC) {
    // Each element of pe sums over the batch in order b = 0..B-1.
#pragma omp parallel for schedule(static) if (B * TC > CT_EMB_PARALLEL_MIN)
    for (int64_t i = 0; i < TC; i++) {
        float s = dpe[i];
        for (int64_t b = 0; b < B; b++) s += dout[b * TC + i];
        dpe[i] = s;
    }
}
