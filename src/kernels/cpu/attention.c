#include "kernels/cpu/attention.h"

#include <math.h>
#include <omp.h>

#include "kernels/cpu/matmul.h"

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

// The dropout factor of element j: 0 or 1 / (1 - rate).
static inline float drop_factor(ct_key key, int64_t j, uint64_t threshold, float scale) {
    return ct_random_bits(key, (uint32_t)j) >= threshold ? scale : 0.0f;
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
        for (int64_t t = 0; t < T; t++) {
            float *row = A + t * T;
            float maxv = -INFINITY;
            for (int64_t s = 0; s <= t; s++) maxv = fmaxf(maxv, row[s]);
            double sum = 0.0;
            for (int64_t s = 0; s <= t; s++) {
                row[s] = expf(row[s] - maxv);
                sum += row[s];
            }
            float inv = (float)(1.0 / sum);  // sum >= 1: the max term is exp(0)
            for (int64_t s = 0; s <= t; s++) row[s] *= inv;
            for (int64_t s = t + 1; s < T; s++) row[s] = 0.0f;
        }
        const float *P = A;
        if (dropout > 0.0f) {
            float *D = scratch + (int64_t)omp_get_thread_num() * per_slot;
            for (int64_t t = 0; t < T; t++) {
                const int64_t j0 = bh * T * T + t * T;
                for (int64_t s = 0; s <= t; s++) D[t * T + s] = A[t * T + s] * drop_factor(key, j0 + s, threshold, drop_scale);
                for (int64_t s = t + 1; s < T; s++) D[t * T + s] = 0.0f;
            }
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
            for (int64_t t = 0; t < T; t++) {
                const int64_t j0 = bh * T * T + t * T;
                for (int64_t s = 0; s <= t; s++) {
                    float f = drop_factor(key, j0 + s, threshold, drop_scale);
                    D[t * T + s] = A[t * T + s] * f;
                    G[t * T + s] *= f;
                }
                for (int64_t s = t + 1; s < T; s++) D[t * T + s] = 0.0f;
            }
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
