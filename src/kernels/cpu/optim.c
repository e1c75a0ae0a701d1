#include "kernels/cpu/optim.h"

#include <math.h>
#include <string.h>

#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"
#include "kernels/cpu/vmath.h"
#include "core/clones.h"

#if defined(__clang__)
#pragma clang fp contract(off)  // CT_CLONES_EXACT's half for clang (core/clones.h)
#endif

// Up to this many weights an update runs on one thread. Measured with
// Adam over config A's 69 weights (3.3M floats, 2 threads): a threshold of
// 65536, which left the 256 x 256 matrices on one core, took 2.07-2.21 ms
// an update; 16384 took 1.63-1.73, and 4096 1.63-1.77.
#define CT_OPTIM_PARALLEL_MIN 16384

void ct_sgd_update(float *w, const float *g, int64_t n, float lr) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) w[i] -= lr * g[i];
}

// Elementwise updates vectorize only under `simd` (the arrays might
// overlap, and -O2's cost model gives up on that), and those with sqrtf only
// without errno (CT_SIMD_SQRT in vmath.h); vector division and square root
// are correctly rounded, so the fast loop is bitwise the _ref one at every
// vector width (CT_CLONES_EXACT). Adam's three divisions and a square root
// an element made it bound by the divider at the baseline's 4 lanes: config
// A's update took about 3.5 ms a step at two threads, against about 1 ms for
// a loop of the same memory traffic. Threads take chunks of CT_VCHUNK.
CT_CLONES_EXACT
static void adam_chunk(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                       float eps, float weight_decay_rate, float bias1, float bias2) {
    CT_SIMD_SQRT
    for (int64_t i = 0; i < n; i++) {
        m[i] = (1.0f - b1) * g[i] + b1 * m[i];
        v[i] = (1.0f - b2) * g[i] * g[i] + b2 * v[i];
        float mhat = m[i] / bias1;
        float vhat = v[i] / bias2;
        w[i] = (1.0f - weight_decay_rate) * w[i] - lr * (mhat / (sqrtf(vhat) + eps));
    }
}

void ct_adam_update(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                    float eps, float weight_decay_rate, float bias1, float bias2) {
#pragma omp parallel for schedule(static) if (n > CT_OPTIM_PARALLEL_MIN)
    for (int64_t c = 0; c < n; c += CT_VCHUNK) {
        int64_t len = n - c < CT_VCHUNK ? n - c : CT_VCHUNK;
        adam_chunk(w + c, g + c, m + c, v + c, len, lr, b1, b2, eps, weight_decay_rate, bias1, bias2);
    }
}

void ct_adam_update_ref(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                        float eps, float weight_decay_rate, float bias1, float bias2) {
    for (int64_t i = 0; i < n; i++) {
        m[i] = (1.0f - b1) * g[i] + b1 * m[i];
        v[i] = (1.0f - b2) * g[i] * g[i] + b2 * v[i];
        float mhat = m[i] / bias1;
        float vhat = v[i] / bias2;
        w[i] = (1.0f - weight_decay_rate) * w[i] - lr * (mhat / (sqrtf(vhat) + eps));
    }
}

// The trainer takes it over every weight and every gradient each step (the
// logged norms, clipping): one chain of dependent double adds ran at a
// quarter of memory speed (2% of a TransformerLM step). CT_LANES lanes
// (vmath.h) vectorize and give the same bits at any vector width or
// address. Threads take chunks of CT_SUMSQ_CHUNK floats (run serially, the
// two passes left the second core idle for 1% of a two-thread step); the
// chunks' totals are added in chunk order, so the bits do not depend on the
// thread count either.
CT_CLONES
static double sum_squares_lanes(const float *x, int64_t n) { return ct_lanes_dot(x, x, n); }

double ct_sum_squares(const float *x, int64_t n) {
    int64_t n_chunks = (n + CT_SUMSQ_CHUNK - 1) / CT_SUMSQ_CHUNK;
    if (n_chunks <= 1) return sum_squares_lanes(x, n);
    // The chunks' sums go on the stack (32 KiB), a group of CT_SUMSQ_GROUP
    // chunks (134M floats) at a time; the groups run one after another, so
    // the total is still the chunks' sums added in chunk order.
    enum { GROUP = CT_SUMSQ_GROUP };
    double chunk[GROUP];
    double total = 0.0;
    for (int64_t g0 = 0; g0 < n_chunks; g0 += GROUP) {
        int64_t g1 = n_chunks - g0 < GROUP ? n_chunks : g0 + GROUP;
#pragma omp parallel for schedule(static)
        for (int64_t c = g0; c < g1; c++) {
            int64_t start = c * CT_SUMSQ_CHUNK, len = n - start < CT_SUMSQ_CHUNK ? n - start : CT_SUMSQ_CHUNK;
            chunk[c - g0] = sum_squares_lanes(x + start, len);
        }
        for (int64_t c = g0; c < g1; c++) total += chunk[c - g0];
    }
    return total;
}

double ct_sum_squares_ref(const float *x, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

void ct_momentum_update(float *w, const float *g, float *v, int64_t n, float lr, float mass, float weight_decay_rate,
                        bool nesterov) {
#pragma omp parallel for simd schedule(static) if (n > CT_OPTIM_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        v[i] = mass * v[i] + g[i];
        float u = nesterov ? mass * v[i] + g[i] : v[i];
        w[i] = (1.0f - weight_decay_rate) * w[i] - lr * u;
    }
}

void ct_rmsprop_update(float *w, const float *g, float *a, int64_t n, float lr, float gamma, float eps) {
#pragma omp parallel for schedule(static) if (n > CT_OPTIM_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) {
        a[i] = a[i] * gamma + g[i] * g[i] * (1.0f - gamma);
        w[i] -= lr * g[i] / (sqrtf(a[i]) + eps);
    }
}

// ---- Adafactor ----

void ct_adafactor_factored_moments(float *vr, float *vc, const float *g, int64_t B, int64_t R, int64_t C, float decay,
                                   float mix) {
    for (int64_t b = 0; b < B; b++) {
        const float *gb = g + b * R * C;
        float *vrb = vr + b * R, *vcb = vc + b * C;
        // Column means accumulate down the rows, in row order, 256 columns
        // at a time (a vector of independent sums).
        double col_sum[256];
        for (int64_t c0 = 0; c0 < C; c0 += 256) {
            int64_t nc = C - c0 < 256 ? C - c0 : 256;
            for (int64_t c = 0; c < nc; c++) col_sum[c] = 0.0;
            for (int64_t r = 0; r < R; r++) {
                const float *x = gb + r * C + c0;
#pragma omp simd
                for (int64_t c = 0; c < nc; c++) col_sum[c] += (double)(x[c] * x[c]);
            }
            for (int64_t c = 0; c < nc; c++)
                vcb[c0 + c] = decay * vcb[c0 + c] + mix * (float)(col_sum[c] / (double)R);
        }
        for (int64_t r = 0; r < R; r++) {
            const float *x = gb + r * C;
            double lane[CT_LANES] = {0};  // in lanes: the same bits at any address (vmath.h)
            int64_t c0 = 0;  // whole groups of CT_LANES (a constant count vectorizes), then the rest
            for (; c0 + CT_LANES <= C; c0 += CT_LANES) {
                const int nj = CT_LANES;
#pragma omp simd
                for (int j = 0; j < nj; j++) lane[j] += (double)(x[c0 + j] * x[c0 + j]);
            }
            {
                const int nj = (int)(C - c0);
                for (int j = 0; j < nj; j++) lane[j] += (double)(x[c0 + j] * x[c0 + j]);
            }
            vrb[r] = decay * vrb[r] + mix * (float)(ct_lanes_total(lane) / (double)C);
        }
    }
}

// mean_r vr[b] for matrix b, in double.
static float row_mean(const float *vrb, int64_t R) {
    double s = 0.0;
    for (int64_t r = 0; r < R; r++) s += vrb[r];
    return (float)(s / (double)R);
}

// Trax's row factor (mean_r vr / (vr + eps1))^0.5 and column factor
// (vc + eps1)^-0.5: epsilon1 where the accumulators are read, not in them.
static inline float row_factor_of(float vr, float mean, float eps1) { return sqrtf(mean / (vr + eps1)); }
static inline float col_factor_of(float vc, float eps1) { return 1.0f / sqrtf(vc + eps1); }

double ct_adafactor_factored_y_sumsq(const float *g, const float *vr, const float *vc, int64_t B, int64_t R,
                                     int64_t C, float eps1) {
    double s = 0.0;
    for (int64_t b = 0; b < B; b++) {
        const float *gb = g + b * R * C, *vrb = vr + b * R, *vcb = vc + b * C;
        float mean = row_mean(vrb, R);
        for (int64_t r = 0; r < R; r++) {
            float row_factor = row_factor_of(vrb[r], mean, eps1);
            for (int64_t c = 0; c < C; c++) {
                float y = gb[r * C + c] * row_factor * col_factor_of(vcb[c], eps1);
                s += (double)y * y;
            }
        }
    }
    return s;
}

// The update of one element from its y, as Trax orders the float operations;
// m NULL: no first moment. Called from `simd` loops with m's test hoisted
// out (the callers pass a constant NULL or a pointer), so it vectorizes.
static inline void adafactor_step(float *w, float *m, float y, float denom, float scale, float beta1, float wd) {
    float sub = scale * (y / denom);
    if (m) {
        *m = beta1 * *m + (1.0f - beta1) * sub;
        sub = *m;
    }
    *w = (1.0f - wd) * *w - sub;
}

// One row of C elements of a factored update; y = g * row_factor * (vc + eps1)^-0.5.
// Two divisions and a square root an element: at every vector width, as Adam's.
CT_CLONES_EXACT
static void adafactor_factored_row(float *w, float *m, const float *g, const float *vc, int64_t C,
                                   float row_factor, float eps1, float denom, float scale, float beta1, float wd) {
    if (m) {
        CT_SIMD_SQRT
        for (int64_t c = 0; c < C; c++)
            adafactor_step(&w[c], &m[c], g[c] * row_factor * col_factor_of(vc[c], eps1), denom, scale, beta1, wd);
    } else {
        CT_SIMD_SQRT
        for (int64_t c = 0; c < C; c++)
            adafactor_step(&w[c], NULL, g[c] * row_factor * col_factor_of(vc[c], eps1), denom, scale, beta1, wd);
    }
}

void ct_adafactor_factored_apply(float *w, float *m, const float *g, const float *vr, const float *vc, int64_t B,
                                 int64_t R, int64_t C, float eps1, float denom, float scale, float beta1,
                                 float weight_decay_rate) {
    for (int64_t b = 0; b < B; b++) {
        const float *vrb = vr + b * R, *vcb = vc + b * C;
        float mean = row_mean(vrb, R);
#pragma omp parallel for schedule(static) if (R * C > CT_OPTIM_PARALLEL_MIN)
        for (int64_t r = 0; r < R; r++) {
            int64_t row = (b * R + r) * C;
            adafactor_factored_row(w + row, m ? m + row : NULL, g + row, vcb, C, row_factor_of(vrb[r], mean, eps1),
                                   eps1, denom, scale, beta1, weight_decay_rate);
        }
    }
}

void ct_adafactor_moments(float *v, const float *g, int64_t n, float decay, float mix) {
#pragma omp parallel for simd schedule(static) if (n > CT_OPTIM_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) v[i] = decay * v[i] + mix * (g[i] * g[i]);
}

double ct_adafactor_y_sumsq(const float *g, const float *v, int64_t n, float eps1) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        float y = g[i] * col_factor_of(v[i], eps1);
        s += (double)y * y;
    }
    return s;
}

void ct_adafactor_apply(float *w, float *m, const float *g, const float *v, int64_t n, float eps1, float denom,
                        float scale, float beta1, float weight_decay_rate) {
#pragma omp parallel for schedule(static) if (n > CT_OPTIM_PARALLEL_MIN)
    for (int64_t c = 0; c < n; c += CT_VCHUNK) {
        int64_t len = n - c < CT_VCHUNK ? n - c : CT_VCHUNK;
        // Row functions take one vector, so a 1-row "factor" of 1 is it.
        adafactor_factored_row(w + c, m ? m + c : NULL, g + c, v + c, len, 1.0f, eps1, denom, scale, beta1,
                               weight_decay_rate);
    }
}

// ---- Adafactor, the plain loops (tests/test_kernels.c checks the ones above
// against these) ----

void ct_adafactor_factored_moments_ref(float *vr, float *vc, const float *g, int64_t B, int64_t R, int64_t C,
                                       float decay, float mix) {
    for (int64_t b = 0; b < B; b++) {
        const float *gb = g + b * R * C;
        float *vrb = vr + b * R, *vcb = vc + b * C;
        // Column means accumulate down the rows, in row order.
        double col_sum[256];
        for (int64_t c0 = 0; c0 < C; c0 += 256) {
            int64_t nc = C - c0 < 256 ? C - c0 : 256;
            for (int64_t c = 0; c < nc; c++) col_sum[c] = 0.0;
            for (int64_t r = 0; r < R; r++)
                for (int64_t c = 0; c < nc; c++) {
                    float x = gb[r * C + c0 + c];
                    col_sum[c] += (double)(x * x);
                }
            for (int64_t c = 0; c < nc; c++)
                vcb[c0 + c] = decay * vcb[c0 + c] + mix * (float)(col_sum[c] / (double)R);
        }
        for (int64_t r = 0; r < R; r++) {
            double s = 0.0;
            for (int64_t c = 0; c < C; c++) {
                float x = gb[r * C + c];
                s += (double)(x * x);
            }
            vrb[r] = decay * vrb[r] + mix * (float)(s / (double)C);
        }
    }
}

void ct_adafactor_factored_apply_ref(float *w, float *m, const float *g, const float *vr, const float *vc,
                                     int64_t B, int64_t R, int64_t C, float eps1, float denom, float scale,
                                     float beta1, float weight_decay_rate) {
    for (int64_t b = 0; b < B; b++) {
        const float *vrb = vr + b * R, *vcb = vc + b * C;
        float mean = row_mean(vrb, R);
        for (int64_t r = 0; r < R; r++) {
            int64_t row = (b * R + r) * C;
            float row_factor = sqrtf(mean / (vrb[r] + eps1));
            for (int64_t c = 0; c < C; c++) {
                float y = g[row + c] * row_factor * (1.0f / sqrtf(vcb[c] + eps1));
                adafactor_step(&w[row + c], m ? &m[row + c] : NULL, y, denom, scale, beta1, weight_decay_rate);
            }
        }
    }
}

void ct_adafactor_apply_ref(float *w, float *m, const float *g, const float *v, int64_t n, float eps1, float denom,
                            float scale, float beta1, float weight_decay_rate) {
    for (int64_t i = 0; i < n; i++) {
        float y = g[i] * (1.0f / sqrtf(v[i] + eps1));
        adafactor_step(&w[i], m ? &m[i] : NULL, y, denom, scale, beta1, weight_decay_rate);
    }
}

// ---- SM3 ----

// g / (sqrt(acc) + 1e-16), 0 where acc is 0.
static inline float sm3_precondition(float g, float acc) {
    return g * (acc > 0.0f ? 1.0f / (sqrtf(acc) + 1e-16f) : 0.0f);
}

// Momentum, weight decay and the weight update of one element with
// preconditioned gradient p.
static inline void sm3_step(float *w, float *m, float p, float lr, float momentum, int momentum_type, float wd) {
    p = p + *w * wd;
    float u = p;
    if (m) {
        if (momentum_type == 1) {
            *m = (1.0f - momentum) * p + momentum * *m;
            u = *m;
        } else {
            *m = p + momentum * *m;
            u = momentum_type == 3 ? p + momentum * *m : *m;
        }
    }
    *w = *w - lr * u;
}

// Diagonal accumulators (rank 0 or 1): v, u (n).
static void sm3_diagonal(float *w, const float *g, float *m, float *v, float *u, int64_t n, float lr, float momentum,
                         int momentum_type, float beta2, float wd) {
    float c = beta2 == 1.0f ? 1.0f : 1.0f - beta2;
    float ratio = 1.0f;
    for (int64_t i = 0; i < n; i++) v[i] = beta2 * v[i] + c * g[i] * g[i];
    if (u) {
        double p2 = 0.0, pu2 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            u[i] += g[i] * g[i];
            float p = sm3_precondition(g[i], v[i]), pu = sm3_precondition(g[i], u[i]);
            p2 += (double)p * p;
            pu2 += (double)pu * pu;
        }
        ratio = (float)sqrt(pu2) / ((float)sqrt(p2) + 1e-16f);
    }
    for (int64_t i = 0; i < n; i++) {
        float p = sm3_precondition(g[i], v[i]);
        if (u) p = p * ratio;
        sm3_step(&w[i], m ? &m[i] : NULL, p, lr, momentum, momentum_type, wd);
    }
}

// min over the covers of the row idx[0..ndim-2] (the last dim's cover is
// taken per element).
static float sm3_row_min(const float *v, const int64_t *shape, int ndim, const int64_t *idx) {
    float mn = INFINITY;
    int64_t off = 0;
    for (int d = 0; d < ndim - 1; d++) {
        float x = v[off + idx[d]];
        if (x < mn) mn = x;
        off += shape[d];
    }
    return mn;
}

// Pass over all elements of a rank >= 2 weight, row by row (a row is the
// last dim). With apply false it only sums the squared preconditioned
// gradients (for grafting); with apply true it updates w and m and gathers
// the new covers' maxima into scratch (and scratch_u).
static void sm3_sketched_pass(float *w, const float *g, float *m, const float *v, const float *u, float *scratch,
                              float *scratch_u, const int64_t *shape, int ndim, float lr, float momentum,
                              int momentum_type, float beta2, float wd, float ratio, bool apply, double *p2,
                              double *pu2) {
    float c2 = beta2 == 1.0f ? 1.0f : 1.0f - beta2;
    int64_t C = shape[ndim - 1], rows = 1, last_off = 0;
    for (int d = 0; d < ndim - 1; d++) rows *= shape[d], last_off += shape[d];
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t row = 0; row < rows; row++) {
        float vmin = sm3_row_min(v, shape, ndim, idx);
        float umin = u ? sm3_row_min(u, shape, ndim, idx) : 0.0f;
        float rmax = -INFINITY, rmax_u = -INFINITY;
        for (int64_t c = 0; c < C; c++) {
            int64_t i = row * C + c;
            float acc = v[last_off + c] < vmin ? v[last_off + c] : vmin;
            acc = beta2 * acc + c2 * g[i] * g[i];
            float p = sm3_precondition(g[i], acc), pu = 0.0f, acc_u = 0.0f;
            if (u) {
                acc_u = u[last_off + c] < umin ? u[last_off + c] : umin;
                acc_u = acc_u + g[i] * g[i];
                pu = sm3_precondition(g[i], acc_u);
            }
            if (!apply) {
                *p2 += (double)p * p;
                *pu2 += (double)pu * pu;
                continue;
            }
            if (u) p = p * ratio;
            sm3_step(&w[i], m ? &m[i] : NULL, p, lr, momentum, momentum_type, wd);
            if (acc > rmax) rmax = acc;
            if (acc > scratch[last_off + c]) scratch[last_off + c] = acc;
            if (u) {
                if (acc_u > rmax_u) rmax_u = acc_u;
                if (acc_u > scratch_u[last_off + c]) scratch_u[last_off + c] = acc_u;
            }
        }
        if (apply) {
            int64_t off = 0;
            for (int d = 0; d < ndim - 1; d++) {
                if (rmax > scratch[off + idx[d]]) scratch[off + idx[d]] = rmax;
                if (u && rmax_u > scratch_u[off + idx[d]]) scratch_u[off + idx[d]] = rmax_u;
                off += shape[d];
            }
        }
        // Next row: increment the multi-index over dims 0..ndim-2.
        for (int d = ndim - 2; d >= 0; d--) {
            if (++idx[d] < shape[d]) break;
            idx[d] = 0;
        }
    }
}

void ct_sm3_update(float *w, const float *g, float *m, float *v, float *u, float *scratch, const int64_t *shape,
                   int ndim, float lr, float momentum, int momentum_type, float beta2, float weight_decay) {
    CT_ASSERT(ndim >= 0 && ndim <= CT_MAX_DIMS);
    if (ndim <= 1) {
        int64_t n = ndim == 1 ? shape[0] : 1;
        sm3_diagonal(w, g, m, v, u, n, lr, momentum, momentum_type, beta2, weight_decay);
        return;
    }
    int64_t n_covers = 0;
    for (int d = 0; d < ndim; d++) n_covers += shape[d];
    float *scratch_u = u ? scratch + n_covers : NULL;
    float ratio = 1.0f;
    if (u) {
        double p2 = 0.0, pu2 = 0.0;
        sm3_sketched_pass(w, g, m, v, u, NULL, NULL, shape, ndim, lr, momentum, momentum_type, beta2, weight_decay,
                          1.0f, false, &p2, &pu2);
        ratio = (float)sqrt(pu2) / ((float)sqrt(p2) + 1e-16f);
    }
    for (int64_t j = 0; j < n_covers * (u ? 2 : 1); j++) scratch[j] = -INFINITY;
    sm3_sketched_pass(w, g, m, v, u, scratch, scratch_u, shape, ndim, lr, momentum, momentum_type, beta2,
                      weight_decay, ratio, true, NULL, NULL);
    memcpy(v, scratch, (size_t)n_covers * sizeof(float));
    if (u) memcpy(u, scratch_u, (size_t)n_covers * sizeof(float));
}
