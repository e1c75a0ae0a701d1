#include "kernels/cpu/attention.h"

#include <math.h>
#include <omp.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vmath.h"

int ct_attention_n_slots(void) {
    int n = omp_get_max_threads();
    return n > 0 ? n : 1;
}

int64_t ct_attention_scratch_floats(int64_t T, float dropout, bool backward) {
    int64_t per = T * T;
    if (backward) return dropout > 0.0f ? 2 * per : per;
    return dropout > 0.0f ? per : 0;
}

// Dropout's keep threshold: bits >= rate * 2^32 for integer bits is
// bits >= ceil(rate * 2^32); rate * 2^32 is exact in double.
static uint64_t drop_threshold(float rate) { return (uint64_t)ceil((double)rate * 4294967296.0); }

// Dropout factors (0 or 1 / (1 - rate)) of elements j0 .. j0 + n - 1, n <=
// DROP_CHUNK: the masks are drawn a chunk at a time (vector threefry).
#define DROP_CHUNK 256
static void drop_factors(ct_key key, int64_t j0, int64_t n, uint64_t threshold, float scale, float *f) {
    uint32_t bits[DROP_CHUNK];
    ct_random_bits_block(key, (uint32_t)j0, (size_t)n, bits);
    for (int64_t i = 0; i < n; i++) f[i] = bits[i] >= threshold ? scale : 0.0f;
}

// Softmax over row[0 .. n), zeros in row[n .. T): one row of the causal
// attention probabilities, compiled for the widest vectors this CPU has.
// The max is exact in any order; the sum is in double, in order.
__attribute__((target_clones("avx512f", "avx2", "default")))
static void causal_softmax_row(float *row, int64_t n, int64_t T) {
    float maxv = -INFINITY;
#pragma omp simd reduction(max : maxv)
    for (int64_t s = 0; s < n; s++) maxv = row[s] > maxv ? row[s] : maxv;
#pragma omp simd
    for (int64_t s = 0; s < n; s++) row[s] = ct_vexp_nonpos(row[s] - maxv);
    double sum = 0.0;
    for (int64_t s = 0; s < n; s++) sum += row[s];
    float inv = (float)(1.0 / sum);  // sum >= 1: the max term is exp(0)
#pragma omp simd
    for (int64_t s = 0; s < n; s++) row[s] *= inv;
    for (int64_t s = n; s < T; s++) row[s] = 0.0f;
}

// D = A * mask / (1 - dropout) over the causal part of the (T, T) matrix A
// (zeros above the diagonal), the mask of element (t, s) drawn at counter
// j0 + t * T + s. When G is not NULL it is taken through the same mask:
// G <- G * mask / (1 - dropout) (the backward pass).
static void drop_probs(float *D, float *G, const float *A, ct_key key, int64_t j0, uint64_t threshold,
                       float drop_scale, int64_t T) {
    for (int64_t t = 0; t < T; t++) {
        for (int64_t s0 = 0; s0 <= t; s0 += DROP_CHUNK) {
            float f[DROP_CHUNK];
            int64_t n = t + 1 - s0 < DROP_CHUNK ? t + 1 - s0 : DROP_CHUNK;
            drop_factors(key, j0 + t * T + s0, n, threshold, drop_scale, f);
            for (int64_t i = 0; i < n; i++) D[t * T + s0 + i] = A[t * T + s0 + i] * f[i];
            if (G)
                for (int64_t i = 0; i < n; i++) G[t * T + s0 + i] *= f[i];
        }
        for (int64_t s = t + 1; s < T; s++) D[t * T + s] = 0.0f;
    }
}

void ct_attention_forward(float *out, float *att, const float *q, const float *k, const float *v,
                          float *scratch, int n_slots, ct_key key, float dropout, int64_t B, int64_t T,
                          int64_t C, int64_t NH) {
    const int64_t hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const uint64_t threshold = drop_threshold(dropout);
    const float drop_scale = 1.0f / (1.0f - dropout);
    const int64_t per_slot = ct_attention_scratch_floats(T, dropout, false);
    if (T == 0) return;  // BLAS rejects leading dimensions of 0
#pragma omp parallel for schedule(static) num_threads(n_slots)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        const int64_t b = bh / NH, h = bh % NH;
        const float *qh = q + b * T * C + h * hs, *kh = k + b * T * C + h * hs, *vh = v + b * T * C + h * hs;
        float *oh = out + b * T * C + h * hs;
        float *A = att + bh * T * T;
        // A = q k^T / sqrt(hs), then a causal softmax over each row.
        ct_sgemm(false, true, T, T, hs, scale, qh, C, kh, C, 0.0f, A, T);
        for (int64_t t = 0; t < T; t++) causal_softmax_row(A + t * T, t + 1, T);
        const float *P = A;
        if (dropout > 0.0f) {
            float *D = scratch + (int64_t)omp_get_thread_num() * per_slot;
            drop_probs(D, NULL, A, key, bh * T * T, threshold, drop_scale, T);
            P = D;
        }
        // out_h = P v_h
        ct_sgemm(false, false, T, hs, T, 1.0f, P, T, vh, C, 0.0f, oh, C);
    }
}

void ct_attention_backward(float *dq, float *dk, float *dv, float *scratch, int n_slots,
                           const float *dout, const float *att, const float *q, const float *k,
                           const float *v, ct_key key, float dropout, int64_t B, int64_t T, int64_t C,
                           int64_t NH) {
    const int64_t hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const uint64_t threshold = drop_threshold(dropout);
    const float drop_scale = 1.0f / (1.0f - dropout);
    const int64_t per_slot = ct_attention_scratch_floats(T, dropout, true);
    if (T == 0) return;
#pragma omp parallel for schedule(static) num_threads(n_slots)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        const int64_t b = bh / NH, h = bh % NH, off = b * T * C + h * hs;
        const float *qh = q + off, *kh = k + off, *vh = v + off, *doh = dout + off;
        float *dqh = dq + off, *dkh = dk + off, *dvh = dv + off;
        const float *A = att + bh * T * T;
        float *G = scratch + (int64_t)omp_get_thread_num() * per_slot;  // (T, T)
        // G = d(dropped att) = dout_h v_h^T
        ct_sgemm(false, true, T, T, hs, 1.0f, doh, C, vh, C, 0.0f, G, T);
        const float *P = A;
        if (dropout > 0.0f) {
            // Recompute the dropped probabilities P and take G back through
            // the mask: G <- G * mask / (1 - dropout).
            float *D = G + T * T;
            drop_probs(D, G, A, key, bh * T * T, threshold, drop_scale, T);
            P = D;
        }
        // dv_h += P^T dout_h
        ct_sgemm(true, false, T, hs, T, 1.0f, P, T, doh, C, 1.0f, dvh, C);
        // Softmax backward over s <= t: G <- A * (G - sum(A * G)); zero past t.
        for (int64_t t = 0; t < T; t++) {
            const float *a = A + t * T;
            float *g = G + t * T;
            double dot = 0.0;
            for (int64_t s = 0; s <= t; s++) dot += (double)a[s] * g[s];
            for (int64_t s = 0; s <= t; s++) g[s] = a[s] * (g[s] - (float)dot);
            for (int64_t s = t + 1; s < T; s++) g[s] = 0.0f;
        }
        // scores = scale q k^T: dq_h += scale G k_h, dk_h += scale G^T q_h
        ct_sgemm(false, false, T, hs, T, scale, G, T, kh, C, 1.0f, dqh, C);
        ct_sgemm(true, false, T, hs, T, scale, G, T, qh, C, 1.0f, dkh, C);
    }
}
