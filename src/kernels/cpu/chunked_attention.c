#include "kernels/cpu/chunked_attention.h"

#include <math.h>
#include <omp.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vmath.h"
#include "core/clones.h"
#include "ctrax/core/blas.h"

int ct_chunked_attention_n_slots(const ct_chunked_attention_dims *d) {
    int64_t n = ct_blas_thread_slots(), bh = d->B * d->H;
    if (n > bh) n = bh;
    return n > 0 ? (int)n : 1;
}

static int64_t window_len(const ct_chunked_attention_dims *d) { return d->m * (1 + d->before + d->after); }

int64_t ct_chunked_attention_scratch_floats(const ct_chunked_attention_dims *d, bool backward) {
    return (backward ? 2 : 1) * d->m * window_len(d);
}

// The key chunk at window offset j of query chunk c, as Trax's look_adjacent
// builds it from concatenate(x[j:], x[:j]): a shift by j modulo N while
// |j| < N; a larger |j| makes one slice empty and the other all of x, so no
// shift at all.
int64_t ct_attention_window_chunk(int64_t c, int64_t j, int64_t N) {
    if (j <= -N || j >= N) return c;
    return (c + j + N) % N;
}

// S (m, W) = q_c k_window^T for query chunk c of one head, then the causal
// (-1e9) and self (-1e5) penalties by position and the padding (-1e9) one
// by the key's flag, each subtracted in that order as before. qh, kh: the
// head's (T, dk); maskb: its example's (T) or NULL. The penalties go by
// block: key chunk s before c has no causal one, after c (the wrapped
// look-back of chunk 0) all of it, and only the diagonal block s == c a
// triangle and the self positions.
static void window_dots(float *S, const float *qh, const float *kh, const float *maskb, int64_t c,
                        const ct_chunked_attention_dims *d) {
    const int64_t m = d->m, W = window_len(d), N = d->T / m, nw = 1 + d->before + d->after;
    for (int64_t jj = 0; jj < nw; jj++) {
        int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
        ct_sgemm(false, true, m, m, d->dk, 1.0f, qh + c * m * d->dk, d->dk, kh + s * m * d->dk, d->dk, 0.0f,
                 S + jj * m, W);
        const bool causal = d->causal && s >= c, self = d->exclude_self && s == c;
        if (!causal && !self && !maskb) continue;
        const float *maskk = maskb ? maskb + s * m : NULL;
        for (int64_t r = 0; r < m; r++) {
            float *row = S + r * W + jj * m;
            // keys i >= first are after the query (qpos = c m + r, kpos = s m + i)
            const int64_t first = s > c ? 0 : r + 1;
            if (causal)
                for (int64_t i = first; i < m; i++) row[i] -= 1e9f;
            if (self) row[r] -= 1e5f;
            if (maskk) {
#pragma omp simd
                for (int64_t i = 0; i < m; i++) row[i] = maskk[i] == 0.0f ? row[i] - 1e9f : row[i];
            }
        }
    }
}

// (The clones are static and the exported names plain calls: clang 14 does
// not resolve a target_clones function called from another file.)
// Trax's probabilities (lse >= every element).
CT_CLONES
static void row_probs(float *row, float lse, int64_t n) {
#pragma omp simd
    for (int64_t w = 0; w < n; w++) row[w] = ct_vexp_nonpos(row[w] - lse);
}

float ct_attention_row_softmax(float *row, int64_t W) {
    float maxv;
    double sum = ct_row_exp_sum(row, row, W, &maxv);  // row <- exp(row - max)
    const float inv = (float)(1.0 / sum);
#pragma omp simd
    for (int64_t w = 0; w < W; w++) row[w] *= inv;
    return maxv + (float)log(sum);  // sum >= 1: the max term is exp(0)
}
void ct_attention_row_probs(float *row, float lse, int64_t n) { row_probs(row, lse, n); }

// Dropout factors of mask row r, elements w0 .. w0 + n - 1 (n <= DROP_CHUNK):
// counter r * W + w, drawn a chunk at a time (vector threefry).
#define DROP_CHUNK 256
static void drop_factors(float *f, ct_key key, int64_t j0, int64_t n, uint64_t threshold, float scale) {
    uint32_t bits[DROP_CHUNK];
    ct_random_bits_block(key, (uint32_t)j0, (size_t)n, bits);
    for (int64_t i = 0; i < n; i++) f[i] = bits[i] >= threshold ? scale : 0.0f;
}

// row (W) *= the dropout factors of mask row r.
static void drop_row(float *row, int64_t r, ct_key key, const ct_chunked_attention_dims *d) {
    const int64_t W = window_len(d);
    const uint64_t threshold = ct_dropout_threshold(d->dropout);
    const float scale = 1.0f / (1.0f - d->dropout);
    for (int64_t w0 = 0; w0 < W; w0 += DROP_CHUNK) {
        float f[DROP_CHUNK];
        int64_t n = W - w0 < DROP_CHUNK ? W - w0 : DROP_CHUNK;
        drop_factors(f, key, r * W + w0, n, threshold, scale);
        for (int64_t i = 0; i < n; i++) row[w0 + i] *= f[i];
    }
}

void ct_attention_drop_span(float *f, int64_t j0, int64_t n, ct_key key, float rate) {
    if (rate <= 0.0f) {
        for (int64_t i = 0; i < n; i++) f[i] = 1.0f;
        return;
    }
    const uint64_t threshold = ct_dropout_threshold(rate);
    const float scale = 1.0f / (1.0f - rate);
    for (int64_t i0 = 0; i0 < n; i0 += DROP_CHUNK) {
        int64_t m = n - i0 < DROP_CHUNK ? n - i0 : DROP_CHUNK;
        drop_factors(f + i0, key, j0 + i0, m, threshold, scale);
    }
}

void ct_attention_drop_factors(float *f, int64_t r, int64_t W, ct_key key, float rate) {
    ct_attention_drop_span(f, r * W, W, key, rate);
}

// f == NULL is f = 1 without the multiplications (1 * x is x exactly, so
// the same bits).
void ct_attention_row_grads(float *p, float *g, const float *f, float dot, int64_t n) {
    if (!f) {
#pragma omp simd  // p and g are rows of two different buffers
        for (int64_t i = 0; i < n; i++) {
            float pw = p[i];
            p[i] = pw * (g[i] - dot);
            g[i] = pw;
        }
        return;
    }
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float pw = p[i];
        p[i] = pw * (f[i] * g[i] - dot);
        g[i] = pw * f[i];
    }
}

// One head's forward: qh, kh (T, dk), vh (T, dv) -> oh (T, dv).
static void head_forward(float *oh, const float *qh, const float *kh, const float *vh,
                         const float *maskb, float *S, ct_key key, const ct_chunked_attention_dims *d) {
    const int64_t m = d->m, W = window_len(d), N = d->T / m, nw = 1 + d->before + d->after;
    for (int64_t c = 0; c < N; c++) {
        window_dots(S, qh, kh, maskb, c, d);
        for (int64_t r = 0; r < m; r++) {
            float *row = S + r * W;
            (void)ct_attention_row_softmax(row, W);
            if (d->dropout > 0.0f) drop_row(row, r, key, d);
        }
        // o_c = sum over window chunks of P[:, chunk] v_chunk
        for (int64_t jj = 0; jj < nw; jj++) {
            int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
            ct_sgemm(false, false, m, d->dv, m, 1.0f, S + jj * m, W, vh + s * m * d->dv, d->dv, jj ? 1.0f : 0.0f,
                     oh + c * m * d->dv, d->dv);
        }
    }
}

void ct_chunked_attention_forward(float *o, const float *q, const float *k, const float *v,
                                  const float *mask, float *scratch, int n_slots, ct_key key,
                                  const ct_chunked_attention_dims *d) {
    const int64_t T = d->T, per_slot = ct_chunked_attention_scratch_floats(d, false);
    if (T == 0) return;  // BLAS rejects leading dimensions of 0
#pragma omp parallel for schedule(static) num_threads(ct_blas_slot_threads(n_slots))
    for (int64_t bh = 0; bh < d->B * d->H; bh++) {
        float *S = scratch + (int64_t)omp_get_thread_num() * per_slot;
        head_forward(o + bh * T * d->dv, q + bh * T * d->dk, k + bh * T * d->dk, v + bh * T * d->dv,
                     mask ? mask + bh / d->H * T : NULL, S, key, d);
    }
}

// Per row r of query chunk c, with S = P (probabilities before dropout) and
// G = dO V^T: G <- P * f (the dropped probabilities, for dv) and S <- P * (f
// * G - dO.o) (the score gradient; dO.o = sum_w P f G, as o includes the
// dropout). f is the row's dropout factors (1 without dropout).
static void row_grads(float *S, float *G, const float *doh, const float *oh, int64_t c, ct_key key,
                      const ct_chunked_attention_dims *d) {
    const int64_t m = d->m, W = window_len(d);
    float f[DROP_CHUNK];
    for (int64_t r = 0; r < m; r++) {
        const float *dor = doh + (c * m + r) * d->dv, *orow = oh + (c * m + r) * d->dv;
        double dot = 0.0;
        for (int64_t i = 0; i < d->dv; i++) dot += (double)dor[i] * orow[i];
        float *p = S + r * W, *g = G + r * W;
        for (int64_t w0 = 0; w0 < W; w0 += DROP_CHUNK) {
            int64_t n = W - w0 < DROP_CHUNK ? W - w0 : DROP_CHUNK;
            if (d->dropout > 0.0f)
                drop_factors(f, key, r * W + w0, n, ct_dropout_threshold(d->dropout), 1.0f / (1.0f - d->dropout));
            ct_attention_row_grads(p + w0, g + w0, d->dropout > 0.0f ? f : NULL, (float)dot, n);
        }
    }
}

// One head's backward for query chunk c: S, G two (m, W) buffers.
static void chunk_backward(float *dqh, float *dkh, float *dvh, float *S, float *G, const float *doh,
                           const float *oh, const float *qh, const float *kh, const float *vh,
                           const float *maskb, int64_t c, ct_key key, const ct_chunked_attention_dims *d) {
    const int64_t m = d->m, W = window_len(d), N = d->T / m, nw = 1 + d->before + d->after, dk = d->dk,
                  dv = d->dv;
    window_dots(S, qh, kh, maskb, c, d);
    // The forward's probabilities, bitwise: the row softmax again (exp(S -
    // lse) with a float logsumexp near the -1e5 self penalty, whose spacing
    // is 1/128, could be off by 0.4%).
    for (int64_t r = 0; r < m; r++) (void)ct_attention_row_softmax(S + r * W, W);
    for (int64_t jj = 0; jj < nw; jj++) {  // G = dO_c V_window^T
        int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
        ct_sgemm(false, true, m, m, dv, 1.0f, doh + c * m * dv, dv, vh + s * m * dv, dv, 0.0f, G + jj * m, W);
    }
    row_grads(S, G, doh, oh, c, key, d);
    for (int64_t jj = 0; jj < nw; jj++) {
        int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
        // dv_s += Pdrop^T dO_c; dq_c += dS k_s; dk_s += dS^T q_c. A chunk seen
        // twice in one window gets both contributions.
        ct_sgemm(true, false, m, dv, m, 1.0f, G + jj * m, W, doh + c * m * dv, dv, 1.0f, dvh + s * m * dv, dv);
        ct_sgemm(false, false, m, dk, m, 1.0f, S + jj * m, W, kh + s * m * dk, dk, 1.0f, dqh + c * m * dk, dk);
        ct_sgemm(true, false, m, dk, m, 1.0f, S + jj * m, W, qh + c * m * dk, dk, 1.0f, dkh + s * m * dk, dk);
    }
}

void ct_chunked_attention_backward(float *dq, float *dk, float *dv, float *scratch, int n_slots,
                                   const float *dout, const float *o, const float *q,
                                   const float *k, const float *v, const float *mask, ct_key key,
                                   const ct_chunked_attention_dims *d) {
    const int64_t T = d->T, per_slot = ct_chunked_attention_scratch_floats(d, true);
    const int64_t mw = d->m * window_len(d);
    if (T == 0) return;
    // One thread owns a (b, h) pair: its dq, dk, dv rows have no other writer.
#pragma omp parallel for schedule(static) num_threads(ct_blas_slot_threads(n_slots))
    for (int64_t bh = 0; bh < d->B * d->H; bh++) {
        float *S = scratch + (int64_t)omp_get_thread_num() * per_slot, *G = S + mw;
        const int64_t qo = bh * T * d->dk, vo = bh * T * d->dv;
        for (int64_t c = 0; c < T / d->m; c++)
            chunk_backward(dq + qo, dk + qo, dv + vo, S, G, dout + vo, o + vo, q + qo, k + qo, v + vo,
                           mask ? mask + bh / d->H * T : NULL, c, key, d);
    }
}

void ct_shared_key_forward(float *k, const float *q, int64_t N, int64_t dk) {
    const float scale = 1.0f / sqrtf((float)dk);
    for (int64_t n = 0; n < N; n++) {
        const float *x = q + n * dk;
        double ms = 0.0;
        for (int64_t i = 0; i < dk; i++) ms += (double)x[i] * x[i];
        float r = (float)(1.0 / sqrt(ms / (double)dk + 1e-6)) * scale;
        for (int64_t i = 0; i < dk; i++) k[n * dk + i] = x[i] * r;
    }
}

// k = s q r, r = (mean(q^2) + eps)^(-1/2): dq = s r g - s r^3 q (g.q) / dk.
void ct_shared_key_backward(float *dq, const float *dk, const float *q, int64_t N, int64_t d) {
    const double scale = 1.0 / sqrt((double)d);
    for (int64_t n = 0; n < N; n++) {
        const float *x = q + n * d, *g = dk + n * d;
        double ms = 0.0, gq = 0.0;
        for (int64_t i = 0; i < d; i++) ms += (double)x[i] * x[i], gq += (double)g[i] * x[i];
        double r = 1.0 / sqrt(ms / (double)d + 1e-6);
        double a = scale * r, b = scale * r * r * r * gq / (double)d;
        for (int64_t i = 0; i < d; i++) dq[n * d + i] += (float)(a * g[i] - b * x[i]);
    }
}

void ct_heads_project_forward(float *out, const float *x, const float *w, const float *bias, int64_t B,
                              int64_t T, int64_t D, int64_t H, int64_t d) {
    if (T == 0) return;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++) {
        const int64_t b = bh / H, h = bh % H;
        float *oh = out + bh * T * d;
        if (bias)
            for (int64_t t = 0; t < T; t++)
                for (int64_t i = 0; i < d; i++) oh[t * d + i] = bias[h * d + i];
        ct_sgemm(false, false, T, d, D, 1.0f, x + b * T * D, D, w + h * D * d, d, bias ? 1.0f : 0.0f, oh, d);
    }
}

void ct_heads_project_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                               const float *w, int64_t B, int64_t T, int64_t D, int64_t H, int64_t d) {
    if (T == 0) return;
    // dx[b] += sum_h dout[b,h] w[h]^T: one thread per example, heads in order.
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            ct_sgemm(false, true, T, D, d, 1.0f, dout + (b * H + h) * T * d, d, w + h * D * d, d, 1.0f, dx + b * T * D,
                     D);
    // dw[h] += sum_b x[b]^T dout[b,h]: one thread per head, examples in order.
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < H; h++)
        for (int64_t b = 0; b < B; b++) {
            const float *g = dout + (b * H + h) * T * d;
            ct_sgemm(true, false, D, d, T, 1.0f, x + b * T * D, D, g, d, 1.0f, dw + h * D * d, d);
            if (dbias)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t i = 0; i < d; i++) dbias[h * d + i] += g[t * d + i];
        }
}

void ct_heads_merge_forward(float *y, const float *o, const float *w, int64_t B, int64_t T, int64_t D,
                            int64_t H, int64_t d) {
    if (T == 0) return;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            ct_sgemm(false, false, T, D, d, 1.0f, o + (b * H + h) * T * d, d, w + h * d * D, D, h ? 1.0f : 0.0f,
                     y + b * T * D, D);
}

void ct_heads_merge_backward(float *dout, float *dw, const float *dy, const float *o, const float *w,
                             int64_t B, int64_t T, int64_t D, int64_t H, int64_t d) {
    if (T == 0) return;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < B * H; bh++) {  // do[b,h] += dy[b] w[h]^T
        const int64_t b = bh / H, h = bh % H;
        ct_sgemm(false, true, T, d, D, 1.0f, dy + b * T * D, D, w + h * d * D, D, 1.0f, dout + bh * T * d, d);
    }
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < H; h++)  // dw[h] += sum_b o[b,h]^T dy[b]
        for (int64_t b = 0; b < B; b++)
            ct_sgemm(true, false, d, D, T, 1.0f, o + (b * H + h) * T * d, d, dy + b * T * D, D, 1.0f, dw + h * d * D,
                     D);
}
