#include "kernels/cpu/activation.h"

#include <math.h>

// Elementwise work is cheap; threads only pay off for big tensors.
#define CT_ELEMWISE_PARALLEL_MIN 65536

#define GELU_SCALE 0.7978845608f  // sqrt(2 / pi), as Trax writes it
#define GELU_CUBE 0.044715f

void ct_relu_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void ct_relu_backward(float *dinp, const float *out, const float *dout, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) dinp[i] += out[i] > 0.0f ? dout[i] : 0.0f;
}

void ct_gelu_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) {
        float x = inp[i];
        out[i] = x * 0.5f * (1.0f + tanhf(x * GELU_SCALE * (1.0f + GELU_CUBE * x * x)));
    }
}

// With u = s * (x + c x^3) and t = tanh(u):
// d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2)
void ct_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) {
        float x = inp[i];
        float t = tanhf(x * GELU_SCALE * (1.0f + GELU_CUBE * x * x));
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        float d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
        dinp[i] += dout[i] * d;
    }
}

void ct_tanh_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) out[i] = tanhf(inp[i]);
}

void ct_tanh_backward(float *dinp, const float *out, const float *dout, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) dinp[i] += dout[i] * (1.0f - out[i] * out[i]);
}

void ct_sigmoid_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) {
        // Written so neither branch overflows expf.
        float x = inp[i];
        if (x >= 0.0f) {
            out[i] = 1.0f / (1.0f + expf(-x));
        } else {
            float e = expf(x);
            out[i] = e / (1.0f + e);
        }
    }
}

void ct_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) dinp[i] += dout[i] * out[i] * (1.0f - out[i]);
}

uint64_t ct_dropout_threshold(float rate) {
    // bits >= rate * 2^32 for an integer bits is bits >= ceil(rate * 2^32);
    // rate * 2^32 is exact in double.
    return (uint64_t)ceil((double)rate * 4294967296.0);
}

void ct_dropout_forward(float *out, const float *inp, ct_key key, uint64_t threshold, float scale,
                        int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN / 8)
    for (int64_t i = 0; i < N; i++)
        out[i] = ct_random_bits(key, (uint32_t)i) >= threshold ? inp[i] * scale : 0.0f;
}

void ct_dropout_backward(float *dinp, const float *dout, ct_key key, uint64_t threshold, float scale,
                         int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN / 8)
    for (int64_t i = 0; i < N; i++)
        if (ct_random_bits(key, (uint32_t)i) >= threshold) dinp[i] += dout[i] * scale;
}
