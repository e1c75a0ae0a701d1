#include "kernels/cpu/activation.h"

#include <math.h>
#include <stdbool.h>

#include "kernels/cpu/vmath.h"
#include "core/clones.h"

// Elementwise work is cheap; threads only pay off for big tensors.
#define CT_ELEMWISE_PARALLEL_MIN 65536

#define GELU_SCALE 0.7978845608f  // sqrt(2 / pi), as Trax writes it
#define GELU_CUBE 0.044715f

// `simd`: GCC would not vectorize it unaided at -O2 (out may alias x or y,
// which is fine element by element).
void ct_add_forward(float *out, const float *x, const float *y, int64_t N) {
#pragma omp parallel for simd schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) out[i] = x[i] + y[i];
}

// ReLU is bound by memory bandwidth only when vectorized: GCC's -O2 cost
// model does not vectorize a loop whose arrays may overlap, and the scalar
// loop's compare-and-branch mispredicts on about half of a layer's random
// signs (ReLU forward + backward were 14% of a TransformerLM's step). `simd`
// states that the iterations are independent; the select then becomes a
// vector blend (-fno-trapping-math). Results are bitwise those of the _ref
// loops: each element is one comparison. Backward writes dinp: the layer's
// input gradient is its own buffer, so zeroing it first (a memset, 1% of a
// TransformerLM step) and adding would be a wasted pass.
void ct_relu_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for simd schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

void ct_relu_backward(float *dinp, const float *out, const float *dout, int64_t N) {
#pragma omp parallel for simd schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) {
        float g = dout[i];  // loaded unconditionally: a select, not a branch
        dinp[i] = out[i] > 0.0f ? g : 0.0f;
    }
}

void ct_relu_forward_ref(float *out, const float *inp, int64_t N) {
    for (int64_t i = 0; i < N; i++) {
        if (inp[i] > 0.0f)
            out[i] = inp[i];
        else
            out[i] = 0.0f;
    }
}

void ct_relu_backward_ref(float *dinp, const float *out, const float *dout, int64_t N) {
    for (int64_t i = 0; i < N; i++) {
        if (out[i] > 0.0f)
            dinp[i] = dout[i];
        else
            dinp[i] = 0.0f;
    }
}

// tanh for GELU, vectorizable: with e = exp(-2|u|), tanh(|u|) =
// (1 - e) / (1 + e), and 1 - tanh^2 = 4 e / (1 + e)^2 (without the
// cancellation of 1 - t * t). GELU's value and derivative come out within
// 1e-6 of double's (tests check it over [-12, 12]), closer than with glibc's
// tanhf, which, called per element, was a fifth of a transformer's training
// step.
static inline float gelu_tanh(float u, float *sech2) {
    float e = ct_vexp_nonpos(-2.0f * fabsf(u));
    float inv = 1.0f / (1.0f + e);
    float t = (1.0f - e) * inv;
    *sech2 = 4.0f * e * inv * inv;
    return u < 0.0f ? -t : t;
}

// Elementwise chunks of GELU, compiled for the widest vectors this CPU has.
#define GELU_CHUNK 4096

CT_CLONES
static void gelu_forward_chunk(float *out, const float *inp, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i], sech2;
        out[i] = x * 0.5f * (1.0f + gelu_tanh(x * GELU_SCALE * (1.0f + GELU_CUBE * x * x), &sech2));
    }
}

// With u = s * (x + c x^3) and t = tanh(u):
// d/dx [0.5 x (1 + t)] = 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2)
CT_CLONES
static void gelu_backward_chunk(float *dinp, const float *inp, const float *dout, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float x = inp[i], sech2;  // 1 - t^2
        float t = gelu_tanh(x * GELU_SCALE * (1.0f + GELU_CUBE * x * x), &sech2);
        float du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * x * x);
        // sech2 is 0 from |x| ~ 10 on, and du is inf once x * x overflows
        // (|x| > 1.8e19): the term is then 0, not 0 * inf = NaN.
        float d = 0.5f * (1.0f + t) + (sech2 != 0.0f ? 0.5f * x * sech2 * du : 0.0f);
        dinp[i] = dout[i] * d;
    }
}

void ct_gelu_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t c = 0; c < N; c += GELU_CHUNK)
        gelu_forward_chunk(out + c, inp + c, N - c < GELU_CHUNK ? N - c : GELU_CHUNK);
}

void ct_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t c = 0; c < N; c += GELU_CHUNK)
        gelu_backward_chunk(dinp + c, inp + c, dout + c, N - c < GELU_CHUNK ? N - c : GELU_CHUNK);
}

// The reference: Trax's formula in double, libm's tanh.
void ct_gelu_forward_ref(float *out, const float *inp, int64_t N) {
    for (int64_t i = 0; i < N; i++) {
        double x = inp[i];
        out[i] = (float)(x * 0.5 * (1.0 + tanh(x * (double)GELU_SCALE * (1.0 + (double)GELU_CUBE * x * x))));
    }
}

void ct_gelu_backward_ref(float *dinp, const float *inp, const float *dout, int64_t N) {
    for (int64_t i = 0; i < N; i++) {
        double x = inp[i], s = GELU_SCALE, c = GELU_CUBE;
        double t = tanh(x * s * (1.0 + c * x * x));
        double d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * c * x * x);
        dinp[i] = (float)(dout[i] * d);
    }
}

// The exact GELU in double: erf and exp of libm.
#define INV_SQRT2 0.70710678118654752440       // 1 / sqrt(2)
#define INV_SQRT_2PI 0.39894228040143267794    // 1 / sqrt(2 pi): the normal density at 0
void ct_gelu_erf_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) {
        double x = inp[i];
        out[i] = (float)(x * 0.5 * (1.0 + erf(x * INV_SQRT2)));
    }
}

void ct_gelu_erf_backward(float *dinp, const float *inp, const float *dout, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) {
        double x = inp[i];
        double d = 0.5 * (1.0 + erf(x * INV_SQRT2)) + x * exp(-0.5 * x * x) * INV_SQRT_2PI;
        dinp[i] = (float)(dout[i] * d);
    }
}

void ct_tanh_forward(float *out, const float *inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) out[i] = tanhf(inp[i]);
}

void ct_tanh_backward(float *dinp, const float *out, const float *dout, int64_t N) {
#pragma omp parallel for simd schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) dinp[i] = dout[i] * (1.0f - out[i] * out[i]);
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
#pragma omp parallel for simd schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN)
    for (int64_t i = 0; i < N; i++) dinp[i] = dout[i] * out[i] * (1.0f - out[i]);
}

uint64_t ct_dropout_threshold(float rate) {
    // bits >= rate * 2^32 for an integer bits is bits >= ceil(rate * 2^32);
    // rate * 2^32 is exact in double.
    return (uint64_t)ceil((double)rate * 4294967296.0);
}

// Masks are drawn DROPOUT_CHUNK counters at a time (vector threefry).
#define DROPOUT_CHUNK 256

// The mask of element i is bits(key, i) >= threshold. add: y += mask * x *
// scale (backward); otherwise y = mask ? x * scale : 0 (forward).
static void dropout_apply(float *y, const float *x, ct_key key, uint64_t threshold, float scale, int64_t N,
                          bool add) {
#pragma omp parallel for schedule(static) if (N > CT_ELEMWISE_PARALLEL_MIN / 8)
    for (int64_t c = 0; c < N; c += DROPOUT_CHUNK) {
        uint32_t bits[DROPOUT_CHUNK];
        int64_t n = N - c < DROPOUT_CHUNK ? N - c : DROPOUT_CHUNK;
        ct_random_bits_block(key, (uint32_t)c, (size_t)n, bits);
        if (add) {
            for (int64_t i = 0; i < n; i++)
                if (bits[i] >= threshold) y[c + i] += x[c + i] * scale;
        } else {
            for (int64_t i = 0; i < n; i++) y[c + i] = bits[i] >= threshold ? x[c + i] * scale : 0.0f;
        }
    }
}

void ct_dropout_forward(float *out, const float *inp, ct_key key, uint64_t threshold, float scale,
                        int64_t N) {
    dropout_apply(out, inp, key, threshold, scale, N, false);
}

void ct_dropout_backward(float *dinp, const float *dout, ct_key key, uint64_t threshold, float scale,
                         int64_t N) {
    dropout_apply(dinp, dout, key, threshold, scale, N, true);
}
