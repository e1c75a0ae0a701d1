#include "kernels/cpu/attention.h"

#include <assert.h>
#include <math.h>
#include <omp.h>

#include "kernels/cpu/chunked_attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vmath.h"
#include "core/clones.h"
#include "ctrax/core/blas.h"

// The largest tile the tiled kernels take: their per-row state (running max
// and sum, dO . o) lives on the stack, TILE_MAX rows of it.
#define TILE_MAX 256

// A query tile meets the keys it sees in blocks of KEY_TILES tiles, at most
// KEY_BLOCK keys: one GEMM per block instead of one per tile pair, and the online softmax rescales once per block. A block is
// bounded so the scratch and a row's dropout factors (on the stack) are.
// Measured at tile 128: blocks of 4 tiles instead of 1 took C 512, 8
// heads, T 256, batch 8 from 13.6 to 12.5 ms forward and 25.2 to 24.6
// backward (one thread); C 256, 4 heads, T 2048, batch 2, from 72 to 58
// and 148 to 127 ms. At tile 64, 8-tile blocks (512 keys) against 4-tile
// ones, config C's step (T 2048, two threads, two runs): forward 42.6-42.7
// / 46.1-46.3 ms, backward 86.7-87.3 / 88.2-88.6.
#define KEY_BLOCK 512
#define KEY_TILES(tile) (KEY_BLOCK / (tile))
_Static_assert(TILE_MAX <= KEY_BLOCK, "a block holds at least one tile");

int64_t ct_attention_tile(int64_t T) { return T <= 512 ? 64 : 128; }

int ct_attention_n_slots(void) { return ct_blas_thread_slots(); }

// ---- tiled --------------------------------------------------------------------------------------

int64_t ct_attention_scratch_floats(int64_t tile, bool backward) {
    return (backward ? 2 : 1) * tile * KEY_TILES(tile) * tile;
}

// max of row[0 .. n) (-inf for n == 0): exact in any order, so every clone
// gives the same bits.
CT_CLONES
static float row_max(const float *row, int64_t n) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t s = 0; s < n; s++) m = row[s] > m ? row[s] : m;
    return m;
}

// sum of row[0 .. n) in double (the exps of a softmax row: its normalizer),
// in CT_LANES lanes (vmath.h): the same bits at any vector width (an `omp
// simd` reduction's order followed the clone's width). (Measured: a separate
// pass after the 16-wide exp of row_probs beats one fused pass in CT_LANES
// double lanes, whose exps run 8 wide: attention forward at T 128 took 4.2 ms
// against 5.0.)
CT_CLONES
static double row_sum(const float *row, int64_t n) { return ct_lanes_sum(row, n); }

// dO_t . o_t over one head's hs columns, in double, in CT_LANES lanes
// (vmath.h): the softmax backward's row term. (A single chain of dependent
// adds was most of head_backward's own time.)
CT_CLONES
static float row_dot(const float *a, const float *b, int64_t n) { return (float)ct_lanes_dot(a, b, n); }

// row[0 .. n) *= f. `simd`: GCC's -O2 leaves a loop of unknown count
// scalar, and so scalar the final scaling was most of the attention
// forward's own time at config A (T 128).
static void scale_row(float *row, float f, int64_t n) {
#pragma omp simd
    for (int64_t x = 0; x < n; x++) row[x] *= f;
}

// Columns of a key block (first key s0, nc keys) that query t sees (s <= t):
// all of a block left of t, t + 1 - s0 of one across it (none of one past
// it, which the kernels never form).
static int64_t visible(int64_t t, int64_t s0, int64_t nc) {
    int64_t n = t + 1 - s0;
    return n < 0 ? 0 : n > nc ? nc : n;
}

// Query tile i of head (b, h): rows t0 .. t0 + nr of out (ld C) and lse,
// against keys [0, t0 + nr) in key blocks. S: (tile, KEY_TILES(tile) * tile)
// scratch.
static void query_tile_forward(float *oh, float *lseh, const float *qh, const float *kh, const float *vh,
                               float *S, ct_key key, float dropout, int64_t bh, int64_t i, int64_t T, int64_t C,
                               int64_t hs, int64_t tile) {
    const float scale = 1.0f / sqrtf((float)hs);
    const int64_t t0 = i * tile, nr = T - t0 < tile ? T - t0 : tile;
    const int64_t e = t0 + nr, kw = KEY_TILES(tile) * tile;  // keys [0, e) in blocks of kw
    float m[TILE_MAX], f[KEY_BLOCK];
    double l[TILE_MAX];
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, l[r] = 0.0;
    float *oi = oh + t0 * C;
    for (int64_t s0 = 0; s0 < e; s0 += kw) {
        const int64_t nc = e - s0 < kw ? e - s0 : kw;
        // S (nr, nc) = q_i k_block^T / sqrt(hs)
        ct_sgemm(false, true, nr, nc, hs, scale, qh + t0 * C, C, kh + s0 * C, C, 0.0f, S, nc);
        for (int64_t r = 0; r < nr; r++) {
            float *row = S + r * nc;
            const int64_t n = visible(t0 + r, s0, nc);
            // Online softmax: the new running max, the old sum and output
            // row rescaled to it (exp(-inf) = 0 before the first block).
            // Blocks start at multiples of the tile, at or before t0, so
            // every row sees at least one column of each (n >= 1).
            const float mt = row_max(row, n), mnew = mt > m[r] ? mt : m[r];
            const float alpha = ct_vexp_nonpos(m[r] - mnew);
            ct_attention_row_probs(row, mnew, n);
            l[r] = l[r] * alpha + row_sum(row, n);
            m[r] = mnew;
            for (int64_t s = n; s < nc; s++) row[s] = 0.0f;
            if (dropout > 0.0f) {
                ct_attention_drop_span(f, (bh * T + t0 + r) * T + s0, n, key, dropout);
                for (int64_t s = 0; s < n; s++) row[s] *= f[s];
            }
            if (s0 > 0 && alpha != 1.0f) scale_row(oi + r * C, alpha, hs);
        }
        // out_i (+)= P v_block; the first block sets it.
        ct_sgemm(false, false, nr, hs, nc, 1.0f, S, nc, vh + s0 * C, C, s0 > 0 ? 1.0f : 0.0f, oi, C);
    }
    for (int64_t r = 0; r < nr; r++) {
        scale_row(oi + r * C, (float)(1.0 / l[r]), hs);  // l >= 1: the max term is exp(0)
        lseh[t0 + r] = m[r] + (float)log(l[r]);
    }
}

void ct_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                          float *scratch, int n_slots, ct_key key, float dropout, int64_t B, int64_t T,
                          int64_t C, int64_t NH, int64_t tile) {
    assert(tile >= 1 && tile <= TILE_MAX);
    const int64_t hs = C / NH, nt = (T + tile - 1) / tile, per_slot = ct_attention_scratch_floats(tile, false);
    if (T == 0) return;  // BLAS rejects leading dimensions of 0
    // Work items (b, h, query tile) are independent; query tile i costs
    // i + 1 key tiles. Handed out longest first, each to the next free
    // thread: a static round-robin gave two threads at T = 2 tiles (bench
    // config B) all the short and all the long tiles, one idle a third of
    // the time. Which thread runs an item does not change its result.
#pragma omp parallel for schedule(dynamic, 1) num_threads(ct_blas_slot_threads(n_slots))
    for (int64_t w = 0; w < B * NH * nt; w++) {
        const int64_t i = nt - 1 - w / (B * NH), bh = w % (B * NH), b = bh / NH, h = bh % NH,
                      off = b * T * C + h * hs;
        float *S = scratch + (int64_t)omp_get_thread_num() * per_slot;
        query_tile_forward(out + off, lse + bh * T, q + off, k + off, v + off, S, key, dropout, bh, i, T, C, hs,
                           tile);
    }
}

// Head (b, h)'s backward, query tile by query tile, each against its keys
// in key blocks as forward: S, G two (tile, KEY_TILES(tile) * tile) scratch blocks.
static void head_backward(float *dqh, float *dkh, float *dvh, float *S, float *G, const float *doh,
                          const float *oh, const float *lseh, const float *qh, const float *kh, const float *vh,
                          ct_key key, float dropout, int64_t bh, int64_t T, int64_t C, int64_t hs, int64_t tile) {
    const float scale = 1.0f / sqrtf((float)hs);
    const int64_t kw = KEY_TILES(tile) * tile;
    float dot[TILE_MAX], f[KEY_BLOCK];
    // Query tiles from the last to the first: the last one meets every key,
    // so its products write all of dk and dv (beta 0) and the others add to
    // them; a tile's first key block writes its rows of dq. Nothing is
    // zeroed first (a serial memset of dq, dk, dv took 24 MiB a step at
    // config A, the other core idle).
    const int64_t last = (T - 1) / tile * tile;
    for (int64_t t0 = last; t0 >= 0; t0 -= tile) {
        const int64_t nr = T - t0 < tile ? T - t0 : tile;
        const float *qi = qh + t0 * C, *doi = doh + t0 * C;
        // dot[r] = dO_t . o_t = sum_s P f G over the whole row: the softmax
        // backward's row term, known before any tile is recomputed.
        for (int64_t r = 0; r < nr; r++) dot[r] = row_dot(doi + r * C, oh + (t0 + r) * C, hs);
        const int64_t e = t0 + nr;  // keys [0, e)
        for (int64_t s0 = 0; s0 < e; s0 += kw) {
            const int64_t nc = e - s0 < kw ? e - s0 : kw;
            // S = P = exp(q_i k_block^T / sqrt(hs) - lse), G = dO_i v_block^T
            ct_sgemm(false, true, nr, nc, hs, scale, qi, C, kh + s0 * C, C, 0.0f, S, nc);
            ct_sgemm(false, true, nr, nc, hs, 1.0f, doi, C, vh + s0 * C, C, 0.0f, G, nc);
            for (int64_t r = 0; r < nr; r++) {
                float *p = S + r * nc, *g = G + r * nc;
                const int64_t n = visible(t0 + r, s0, nc);
                ct_attention_row_probs(p, lseh[t0 + r], n);
                if (dropout > 0.0f) ct_attention_drop_span(f, (bh * T + t0 + r) * T + s0, n, key, dropout);
                // S <- dScores, G <- the dropped probabilities
                ct_attention_row_grads(p, g, dropout > 0.0f ? f : NULL, dot[r], n);
                for (int64_t s = n; s < nc; s++) p[s] = 0.0f, g[s] = 0.0f;
            }
            // dv_block (+)= Pdrop^T dO_i; dq_i (+)= scale dS k_block; dk_block (+)= scale dS^T q_i
            const float kv_beta = t0 == last ? 0.0f : 1.0f, q_beta = s0 == 0 ? 0.0f : 1.0f;
            ct_sgemm(true, false, nc, hs, nr, 1.0f, G, nc, doi, C, kv_beta, dvh + s0 * C, C);
            ct_sgemm(false, false, nr, hs, nc, scale, S, nc, kh + s0 * C, C, q_beta, dqh + t0 * C, C);
            ct_sgemm(true, false, nc, hs, nr, scale, S, nc, qi, C, kv_beta, dkh + s0 * C, C);
        }
    }
}

void ct_attention_backward(float *dq, float *dk, float *dv, float *scratch, int n_slots, const float *dout,
                           const float *out, const float *lse, const float *q, const float *k, const float *v,
                           ct_key key, float dropout, int64_t B, int64_t T, int64_t C, int64_t NH, int64_t tile) {
    assert(tile >= 1 && tile <= TILE_MAX);
    const int64_t hs = C / NH, per_slot = ct_attention_scratch_floats(tile, true);
    if (T == 0) return;
    // One thread owns a (b, h) pair: the dk, dv rows of key tile j take
    // every query tile's share, and no other thread writes them.
#pragma omp parallel for schedule(static) num_threads(ct_blas_slot_threads(n_slots))
    for (int64_t bh = 0; bh < B * NH; bh++) {
        const int64_t b = bh / NH, h = bh % NH, off = b * T * C + h * hs;
        float *S = scratch + (int64_t)omp_get_thread_num() * per_slot, *G = S + KEY_TILES(tile) * tile * tile;
        head_backward(dq + off, dk + off, dv + off, S, G, dout + off, out + off, lse + bh * T, q + off, k + off,
                      v + off, key, dropout, bh, T, C, hs, tile);
    }
}

// ---- reference ----------------------------------------------------------------------------------

int64_t ct_attention_ref_scratch_floats(int64_t T, float dropout, bool backward) {
    int64_t per = T * T;
    if (backward) return dropout > 0.0f ? 2 * per : per;
    return dropout > 0.0f ? per : 0;
}

// Softmax over row[0 .. n), zeros in row[n .. T): one row of the causal
// attention probabilities, compiled for the widest vectors this CPU has.
// The max is exact in any order; the sum is in double, in order.
CT_CLONES
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
static void drop_probs(float *D, float *G, const float *A, ct_key key, int64_t j0, float dropout, int64_t T) {
    enum { CHUNK = 256 };
    for (int64_t t = 0; t < T; t++) {
        for (int64_t s0 = 0; s0 <= t; s0 += CHUNK) {
            float f[CHUNK];
            int64_t n = t + 1 - s0 < CHUNK ? t + 1 - s0 : CHUNK;
            ct_attention_drop_span(f, j0 + t * T + s0, n, key, dropout);
            for (int64_t i = 0; i < n; i++) D[t * T + s0 + i] = A[t * T + s0 + i] * f[i];
            if (G)
                for (int64_t i = 0; i < n; i++) G[t * T + s0 + i] *= f[i];
        }
        for (int64_t s = t + 1; s < T; s++) D[t * T + s] = 0.0f;
    }
}

void ct_attention_forward_ref(float *out, float *att, const float *q, const float *k, const float *v,
                          float *scratch, int n_slots, ct_key key, float dropout, int64_t B, int64_t T,
                          int64_t C, int64_t NH) {
    const int64_t hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int64_t per_slot = ct_attention_ref_scratch_floats(T, dropout, false);
    if (T == 0) return;  // BLAS rejects leading dimensions of 0
#pragma omp parallel for schedule(static) num_threads(ct_blas_slot_threads(n_slots))
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
            drop_probs(D, NULL, A, key, bh * T * T, dropout, T);
            P = D;
        }
        // out_h = P v_h
        ct_sgemm(false, false, T, hs, T, 1.0f, P, T, vh, C, 0.0f, oh, C);
    }
}

void ct_attention_backward_ref(float *dq, float *dk, float *dv, float *scratch, int n_slots,
                           const float *dout, const float *att, const float *q, const float *k,
                           const float *v, ct_key key, float dropout, int64_t B, int64_t T, int64_t C,
                           int64_t NH) {
    const int64_t hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const int64_t per_slot = ct_attention_ref_scratch_floats(T, dropout, true);
    if (T == 0) return;
#pragma omp parallel for schedule(static) num_threads(ct_blas_slot_threads(n_slots))
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
            drop_probs(D, G, A, key, bh * T * T, dropout, T);
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
