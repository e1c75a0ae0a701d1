#include "kernels/cpu/lsh_attention.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/chunked_attention.h"
#include "kernels/cpu/matmul.h"
#include "core/clones.h"

static int64_t win_len(const ct_lsh_dims *d) { return d->m * (1 + d->before + d->after); }

// The work area, carved in this order: keys (L int64: the radix sort's
// second index array, then the sorted rows' positions), perm (L int32), sq,
// sk (L, dk), sv (L, dv); then forward's so (L, dv), slse (L), or nothing
// (backward recomputes neither); S (m, W), f (W): one row's dropout
// factors; backward's sdo, dsv (L, dv), srow (L), dsq, dsk (L, dk), G (m,
// W). The rounds' weights w_r (T, R) share dsq's space: combine_backward is
// done with them before dsq is zeroed. L = R T.
typedef struct lsh_work {
    const float *mask;  // (T): 0 = padding key; NULL: none
    int64_t *keys;
    int32_t *perm;
    float *sq, *sk, *sv, *so, *slse, *S, *f;
    float *sdo, *dsv, *srow, *dsq, *dsk, *G, *w_r;
} lsh_work;

int64_t ct_lsh_work_floats(const ct_lsh_dims *d, bool backward) {
    const int64_t L = d->R * d->T, mw = d->m * win_len(d);
    int64_t n = 3 * L + 2 * L * d->dk + L * d->dv + mw + win_len(d);
    return n + (backward ? 2 * L * d->dv + L + 2 * L * d->dk + mw : L * d->dv + L);
}

static lsh_work carve(float *w, const ct_lsh_dims *d, bool backward) {
    const int64_t L = d->R * d->T, mw = d->m * win_len(d);
    lsh_work k = {0};
    k.keys = (int64_t *)(void *)w;  // the arena is 64-byte aligned; L int64 = 2L floats
    k.perm = (int32_t *)(void *)(w + 2 * L);
    k.sq = w + 3 * L, k.sk = k.sq + L * d->dk, k.sv = k.sk + L * d->dk, k.S = k.sv + L * d->dv;
    if (!backward) k.so = k.S, k.slse = k.so + L * d->dv, k.S = k.slse + L;
    k.f = k.S + mw;
    if (backward) {
        k.sdo = k.f + win_len(d), k.dsv = k.sdo + L * d->dv, k.srow = k.dsv + L * d->dv, k.dsq = k.srow + L;
        k.dsk = k.dsq + L * d->dk, k.G = k.dsk + L * d->dk, k.w_r = k.dsq;  // L <= L dk floats
    }
    return k;
}

// Rotation dots per block of this many, so the sums sit in registers.
#define HASH_BLOCK 32

// (Compiled per vector width: the double dots ran 2 wide in the baseline
// build. The clone is static and ct_lsh_hash a plain call to it, as
// chunked_attention.c's row_probs.)
CT_CLONES
static void lsh_hash(float *buckets, const float *q, const float *mask, const float *rot, int64_t T, int64_t dk,
                     int64_t R, const int *f, int n_f) {
    int64_t n_rot = 0, NB = 1;
    for (int j = 0; j < n_f; j++) n_rot += f[j] / 2, NB *= f[j];
    const int64_t pad = NB;  // the padding bucket, one past the hashed ones
    if (mask) NB++;
    // rot is (dk, R, n_rot): z[r, t, c] = sum_i q[t, i] rot[i, r, c]
    for (int64_t r = 0; r < R; r++)
        for (int64_t t = 0; t < T; t++) {
            if (mask && mask[t] == 0.0f) {
                buckets[r * T + t] = (float)(pad + r * NB);
                continue;
            }
            int64_t bucket = 0, stride = 1, c0 = 0;
            for (int j = 0; j < n_f; j++) {
                const int64_t h = f[j] / 2;
                // argmax over concat(z, -z), the first index winning ties: the
                // first max of z and the first max of -z, each dot taken once;
                // on a tie between the two, z's (the lower index) wins.
                int64_t best_p = 0, best_n = 0;
                float vp = -INFINITY, vn = -INFINITY;
                for (int64_t c0b = 0; c0b < h; c0b += HASH_BLOCK) {
                    // HASH_BLOCK dots at once, each summed over i in order in
                    // double; the loop over c reads rot's contiguous row.
                    const int64_t nc = h - c0b < HASH_BLOCK ? h - c0b : HASH_BLOCK;
                    double z[HASH_BLOCK] = {0};
                    for (int64_t i = 0; i < dk; i++) {
                        const double qi = q[t * dk + i];
                        const float *rrow = rot + (i * R + r) * n_rot + c0 + c0b;
#pragma omp simd
                        for (int64_t c = 0; c < nc; c++) z[c] += qi * rrow[c];
                    }
                    for (int64_t c = 0; c < nc; c++) {
                        float zv = (float)z[c];
                        if (zv > vp) vp = zv, best_p = c0b + c;
                        if (-zv > vn) vn = -zv, best_n = c0b + c;
                    }
                }
                int64_t best = vn > vp ? h + best_n : best_p;
                bucket += best * stride, stride *= f[j], c0 += h;
            }
            buckets[r * T + t] = (float)(bucket + r * NB);
        }
}

void ct_lsh_hash(float *buckets, const float *q, const float *mask, const float *rot, int64_t T, int64_t dk,
                 int64_t R, const int *f, int n_f) {
    lsh_hash(buckets, q, mask, rot, T, dk, R, f, n_f);
}

// Radix digits of RADIX_BITS: at most three passes, as buckets (round
// offset included) are under 2^24 (lsh_dims refuses R NB >= 2^24).
#define RADIX_BITS 11

// perm: sorted row j -> flat index i = r * T + t, ordered by bucket_i, then
// t: Trax's argsort of T * bucket + t (all distinct). A stable radix sort by
// bucket over i in order gives exactly that order: rows of one bucket are
// of one round (its range of buckets is the round's own), met in order of
// t. (It replaced qsort: configs/fortunes_long.gin's LSH layers took about
// 380 ms a step with it, 300 without, on one thread.) The keys' space holds
// the other of the two index arrays, then the sorted rows' positions t
// (dots reads them). Then sq, sk, sv.
static void sort_gather(lsh_work *k, const float *q, const float *v, const float *buckets, const ct_lsh_dims *d) {
    const int64_t T = d->T, L = d->R * T;
    int32_t *src = k->perm, *dst = (int32_t *)(void *)k->keys, count[1 << RADIX_BITS];
    for (int64_t i = 0; i < L; i++) src[i] = (int32_t)i;
    for (int shift = 0; (int64_t)1 << shift < d->R * d->NB; shift += RADIX_BITS) {
        memset(count, 0, sizeof count);
        for (int64_t i = 0; i < L; i++) count[((int32_t)buckets[i] >> shift) & ((1 << RADIX_BITS) - 1)]++;
        for (int32_t b = 0, at = 0; b < 1 << RADIX_BITS; b++) {
            const int32_t n = count[b];
            count[b] = at, at += n;
        }
        for (int64_t j = 0; j < L; j++) {
            const int32_t i = src[j];
            dst[count[((int32_t)buckets[i] >> shift) & ((1 << RADIX_BITS) - 1)]++] = i;
        }
        int32_t *t = src;
        src = dst, dst = t;
    }
    if (src != k->perm) memcpy(k->perm, src, (size_t)L * sizeof *src);
    for (int64_t j = 0; j < L; j++) {
        const int64_t t = k->perm[j] % T;
        k->keys[j] = t;
        memcpy(k->sq + j * d->dk, q + t * d->dk, (size_t)d->dk * sizeof(float));
        memcpy(k->sv + j * d->dv, v + t * d->dv, (size_t)d->dv * sizeof(float));
    }
    // Trax's length_normalized / sqrt(dk): k = q / sqrt(mean(q^2) + 1e-6) / sqrt(dk)
    ct_shared_key_forward(k->sk, k->sq, L, d->dk);
}

// S (m, W) = sq_c sk_window^T, penalised by original position (k->keys:
// the sorted rows' positions) and by the key's padding flag, each penalty
// subtracted in the order causal, self, padding. (Per vector width: the
// position compares are of int64s, which the baseline build leaves scalar.)
CT_CLONES
static void dots(float *S, const lsh_work *k, int64_t c, const ct_lsh_dims *d) {
    const int64_t m = d->m, W = win_len(d), N = d->R * d->T / m, nw = 1 + d->before + d->after;
    const int64_t *pos = k->keys;
    for (int64_t jj = 0; jj < nw; jj++) {
        int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
        ct_sgemm(false, true, m, m, d->dk, 1.0f, k->sq + c * m * d->dk, d->dk, k->sk + s * m * d->dk, d->dk, 0.0f,
                 S + jj * m, W);
        const int64_t *kpos = pos + s * m;
        for (int64_t r = 0; r < m; r++) {
            const int64_t qpos = pos[c * m + r];
            float *row = S + r * W + jj * m;
            if (d->causal) {
#pragma omp simd
                for (int64_t i = 0; i < m; i++) row[i] = qpos < kpos[i] ? row[i] - 1e9f : row[i];
            }
#pragma omp simd
            for (int64_t i = 0; i < m; i++) row[i] = qpos == kpos[i] ? row[i] - 1e5f : row[i];
            if (k->mask)
                for (int64_t i = 0; i < m; i++) row[i] = k->mask[kpos[i]] == 0.0f ? row[i] - 1e9f : row[i];
        }
    }
}

// Sorted attention of chunk c: so_c, slse_c. f: W floats.
static void chunk_forward(lsh_work *k, float *f, int64_t c, ct_key key, const ct_lsh_dims *d) {
    const int64_t m = d->m, W = win_len(d), N = d->R * d->T / m, nw = 1 + d->before + d->after;
    dots(k->S, k, c, d);
    for (int64_t r = 0; r < m; r++) {
        float *row = k->S + r * W;
        k->slse[c * m + r] = ct_attention_row_softmax(row, W);
        if (d->dropout > 0.0f) {
            ct_attention_drop_factors(f, r, W, key, d->dropout);
            for (int64_t w = 0; w < W; w++) row[w] *= f[w];
        }
    }
    for (int64_t jj = 0; jj < nw; jj++) {
        int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
        ct_sgemm(false, false, m, d->dv, m, 1.0f, k->S + jj * m, W, k->sv + s * m * d->dv, d->dv, jj ? 1.0f : 0.0f,
                 k->so + c * m * d->dv, d->dv);
    }
}

void ct_lsh_forward(float *o_r, float *lse_r, const float *q, const float *v, const float *mask,
                    const float *buckets, float *work, ct_key key, const ct_lsh_dims *d) {
    const int64_t L = d->R * d->T;
    if (L == 0) return;
    lsh_work k = carve(work, d, false);
    k.mask = mask;
    sort_gather(&k, q, v, buckets, d);
    for (int64_t c = 0; c < L / d->m; c++) chunk_forward(&k, k.f, c, key, d);
    for (int64_t j = 0; j < L; j++) {  // unsort: the gather's inverse
        memcpy(o_r + (int64_t)k.perm[j] * d->dv, k.so + j * d->dv, (size_t)d->dv * sizeof(float));
        lse_r[k.perm[j]] = k.slse[j];
    }
}

// The rounds' weights of position t, softmax_r(lse_r[r, t]) -> w (R), as
// exp(lse_r - max) / sum in double: a logsumexp near the -1e5 self penalty
// has an ulp of 1/128 in float, too coarse to subtract. R = 1: w = 1.
static void round_weights(float *w, const float *lse_r, int64_t t, const ct_lsh_dims *d) {
    float mx = -INFINITY;
    for (int64_t r = 0; r < d->R; r++) mx = lse_r[r * d->T + t] > mx ? lse_r[r * d->T + t] : mx;
    double s = 0.0;
    for (int64_t r = 0; r < d->R; r++) s += exp((double)lse_r[r * d->T + t] - mx);
    for (int64_t r = 0; r < d->R; r++) w[r] = (float)(exp((double)lse_r[r * d->T + t] - mx) / s);
}

void ct_lsh_combine(float *o, const float *o_r, const float *lse_r, float *w, const ct_lsh_dims *d) {
    const int64_t T = d->T, dv = d->dv;
    for (int64_t t = 0; t < T; t++) {
        round_weights(w, lse_r, t, d);
        for (int64_t i = 0; i < dv; i++) o[t * dv + i] = 0.0f;
        for (int64_t r = 0; r < d->R; r++)
            for (int64_t i = 0; i < dv; i++) o[t * dv + i] += w[r] * o_r[(r * T + t) * dv + i];
    }
}

// The combination's backward, gathered into sorted order, for row j = (r,
// t): sdo[j] = w_r do_t, and srow[j], the softmax backward's row term with
// lse_r's own gradient folded in: dlse_j - sdo_j . o_r with dlse_j = w_r
// (do_t . o_r - do_t . o_t). The o_r terms cancel: srow[j] = -w_r do_t .
// o_t, so backward never needs o_r and the tape does not keep it (for R = 1
// the same bits as the two terms: o = o_r there).
static void combine_backward(lsh_work *k, const float *dout, const float *o, const float *lse_r,
                             const ct_lsh_dims *d) {
    const int64_t T = d->T, dv = d->dv, L = d->R * T;
    for (int64_t t = 0; t < T; t++) round_weights(k->w_r + t * d->R, lse_r, t, d);
    for (int64_t j = 0; j < L; j++) {
        const int64_t i = k->perm[j], t = i % T;
        const float *g = dout + t * dv, *ot = o + t * dv;
        const float w = k->w_r[t * d->R + i / T];
        float *sdo = k->sdo + j * dv;
        double dot = 0.0;
        for (int64_t x = 0; x < dv; x++) sdo[x] = w * g[x], dot += (double)sdo[x] * ot[x];
        k->srow[j] = -(float)dot;
    }
}

// Score gradients of chunk c's rows, with S = P, G = dO V^T: G <- P f (for
// dv), S <- P (f G + srow) (srow: -dO.o_r, plus dlse for lse's own
// gradient; combine_backward).
static void chunk_row_grads(lsh_work *k, float *f, int64_t c, ct_key key, const ct_lsh_dims *d) {
    const int64_t m = d->m, W = win_len(d);
    for (int64_t r = 0; r < m; r++) {
        const int64_t j = c * m + r;
        float *p = k->S + r * W, *g = k->G + r * W, extra = k->srow[j];
        // The forward's probabilities, bitwise: the row softmax again (a
        // float logsumexp near the -1e5 self penalty has a spacing of 1/128,
        // so exp(S - lse) was off by up to 0.4% for a query that sees only
        // its own copies).
        (void)ct_attention_row_softmax(p, W);
        if (d->dropout > 0.0f) {
            ct_attention_drop_factors(f, r, W, key, d->dropout);
#pragma omp simd  // p and g are rows of two different buffers
            for (int64_t w = 0; w < W; w++) {
                float pw = p[w];
                p[w] = pw * (f[w] * g[w] + extra);
                g[w] = pw * f[w];
            }
        } else {
#pragma omp simd  // f = 1: the same bits without the products
            for (int64_t w = 0; w < W; w++) {
                float pw = p[w];
                p[w] = pw * (g[w] + extra);
                g[w] = pw;
            }
        }
    }
}

static void chunk_backward(lsh_work *k, float *f, int64_t c, ct_key key, const ct_lsh_dims *d) {
    const int64_t m = d->m, W = win_len(d), N = d->R * d->T / m, nw = 1 + d->before + d->after, dk = d->dk,
                  dv = d->dv;
    dots(k->S, k, c, d);
    for (int64_t jj = 0; jj < nw; jj++) {  // G = dO_c V_window^T
        int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
        ct_sgemm(false, true, m, m, dv, 1.0f, k->sdo + c * m * dv, dv, k->sv + s * m * dv, dv, 0.0f, k->G + jj * m,
                 W);
    }
    chunk_row_grads(k, f, c, key, d);
    for (int64_t jj = 0; jj < nw; jj++) {
        int64_t s = ct_attention_window_chunk(c, jj - d->before, N);
        ct_sgemm(true, false, m, dv, m, 1.0f, k->G + jj * m, W, k->sdo + c * m * dv, dv, 1.0f, k->dsv + s * m * dv,
                 dv);
        ct_sgemm(false, false, m, dk, m, 1.0f, k->S + jj * m, W, k->sk + s * m * dk, dk, 1.0f, k->dsq + c * m * dk,
                 dk);
        ct_sgemm(true, false, m, dk, m, 1.0f, k->S + jj * m, W, k->sq + c * m * dk, dk, 1.0f, k->dsk + s * m * dk,
                 dk);
    }
}

void ct_lsh_backward(float *dq, float *dv, const float *dout, const float *o, const float *lse_r, const float *q,
                     const float *v, const float *mask, const float *buckets, float *work, ct_key key,
                     const ct_lsh_dims *d) {
    const int64_t T = d->T, L = d->R * T;
    if (L == 0) return;
    lsh_work k = carve(work, d, true);
    k.mask = mask;
    sort_gather(&k, q, v, buckets, d);
    combine_backward(&k, dout, o, lse_r, d);
    memset(k.dsv, 0, (size_t)(L * d->dv) * sizeof(float));
    memset(k.dsq, 0, (size_t)(L * d->dk) * sizeof(float));
    memset(k.dsk, 0, (size_t)(L * d->dk) * sizeof(float));
    for (int64_t c = 0; c < L / d->m; c++) chunk_backward(&k, k.f, c, key, d);
    ct_shared_key_backward(k.dsq, k.dsk, k.sq, L, d->dk);  // dsq += the gradient through sk
    for (int64_t j = 0; j < L; j++) {  // the gather's gradient: scatter-add by position
        const int64_t t = k.perm[j] % T;
        for (int64_t i = 0; i < d->dk; i++) dq[t * d->dk + i] += k.dsq[j * d->dk + i];
        for (int64_t i = 0; i < d->dv; i++) dv[t * d->dv + i] += k.dsv[j * d->dv + i];
    }
}
