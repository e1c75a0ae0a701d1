// The vectorized CPU kernels against their plain _ref versions (issue 13):
// LayerNorm, softmax and log-softmax, softmax + cross-entropy, add, ReLU, GELU,
// Adam and Adafactor, forward and backward, on random inputs of sizes that
// are not multiples of any vector width (1, 3, 17, 255, ...) and of sizes
// above the kernels' thresholds for threads; and each kernel run with 1 and
// 2 threads gives the same bits. Also: LayerNorm's rstd where |mean| >>
// std against double, cross-entropy's edge cases (smoothing 1 with a -inf
// target logit, a NaN in a padding row), and the backward kernels that add
// into their input gradient (dropout, positions, ShiftRight, Mean) adding.
// ct_sgemm itself, its pieces and strides, against double; SM3 where the
// accumulator is 0; the shared-QK key backward against differences.
//
// Tolerances, from what differs between the two versions:
// - add, ReLU, Adam, the Adafactor apply steps, LayerNorm's dweight/dbias: the
//   same float operations per element; bitwise equal.
// - exp (softmax, cross-entropy): vmath's exp is within 2 ulp of expf, sums
//   in vector lanes against index order: 1e-6 relative. Cross-entropy with
//   label smoothing 0, 0.1 and 1, against the reference's Trax formula
//   written out class by class (sum_c p_c logp_c, all in double; the
//   kernel's row sums of logp in lanes): the same bound.
// - LayerNorm: mean and variance from shifted sums in lanes against two
//   passes in index order, both in double; rstd and the outputs round the
//   same double to float except in the last bit: 1e-6 relative to max(1, |y|).
// - Dense's bias copy and bias gradient (ct_matmul_*), the GEMM the same
//   call: bitwise equal.
// - The sum of squares: lanes against index order, both in double: 1e-12
//   relative; bitwise its stated order (lanes within chunks, chunks in
//   order) for a row at either of two addresses, and at 1 and 2 threads.
// - GELU against double math: the fast tanh's error, 1e-6 (test_layers_core
//   checks the same bound on a sweep).
#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/chunked_attention.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/loss.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/reshape.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/vmath.h"

// Deterministic test data: xorshift64*, uniform in [lo, hi).
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float urand(float lo, float hi) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    uint32_t bits = (uint32_t)((g_rng * 0x2545F4914F6CDD1Dull) >> 40);  // 24 bits
    return lo + (hi - lo) * ((float)bits / 16777216.0f);
}
static void fill(float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = urand(lo, hi);
}
static float *alloc_f(int64_t n) { return calloc((size_t)(n ? n : 1), sizeof(float)); }
static float *dup_f(const float *x, int64_t n) {
    float *y = alloc_f(n);
    memcpy(y, x, (size_t)n * sizeof(float));
    return y;
}

// Largest |a - b| / max(floor, |b|) over n elements: relative error, absolute
// below floor.
static double worst_err(const float *a, const float *b, int64_t n, double floor) {
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;  // equal infinities too
        double d = fabs((double)a[i] - b[i]), s = fabs((double)b[i]);
        double e = d / (s > floor ? s : floor);
        if (isnan(e)) return INFINITY;  // a NaN in one and not the other
        if (e > worst) worst = e;
    }
    return worst;
}
static bool same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}
static bool any_nan(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (isnan(x[i])) return true;
    return false;
}

// The comparison above catches what the tolerances are meant to catch: one
// element off by 1e-5 relative, or a NaN.
static void test_comparator(void) {
    float a[5] = {1, 2, 3, 4, 5}, b[5] = {1, 2, 3, 4, 5};
    CHECK(worst_err(a, b, 5, 1.0) == 0.0);
    a[3] = 4.0f * (1.0f + 1e-5f);
    CHECK(worst_err(a, b, 5, 1.0) > 1e-6);
    a[3] = NAN;
    CHECK(worst_err(a, b, 5, 1.0) > 1e-6);
    CHECK(!same_bits(a, b, 5));
}

// 0, every tail of 8- and 16-float vectors (and of the 8 double lanes)
// around one to four vectors, then sizes past the chunks (256, 4096) and
// the thresholds for threads.
static const int64_t k_sizes[] = {0,  1,  3,   7,    8,    15,    16,    17,    31,
                                  33, 63, 64, 65, 255, 1000, 4099, 70001, 300001};
#define N_SIZES (int)(sizeof k_sizes / sizeof k_sizes[0])

static void test_relu(void) {
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = k_sizes[s];
        float *x = alloc_f(n), *g = alloc_f(n), *d0 = alloc_f(n);
        fill(x, n, -1.0f, 1.0f);
        fill(g, n, -1.0f, 1.0f);
        for (int64_t i = 0; i < n; i++) d0[i] = NAN;  // backward writes dinp: nothing of it may show
        x[0] = n > 1 ? -0.0f : NAN;  // -0 and NaN give 0 in both
        if (n > 3) x[2] = 0.0f, x[3] = INFINITY;
        float *y = alloc_f(n), *yr = alloc_f(n), *d = dup_f(d0, n), *dr = dup_f(d0, n);
        ct_relu_forward(y, x, n);
        ct_relu_forward_ref(yr, x, n);
        CHECK_MSG(same_bits(y, yr, n), "relu forward, n %lld", (long long)n);
        ct_relu_backward(d, yr, g, n);
        ct_relu_backward_ref(dr, yr, g, n);
        CHECK_MSG(same_bits(d, dr, n) && !any_nan(d, n), "relu backward, n %lld", (long long)n);
        free(x), free(g), free(d0), free(y), free(yr), free(d), free(dr);
    }
}

// ct_add_forward against the plain loop, bitwise, into new memory and over x itself
// (the residual's donated input), below and above the threads' threshold.
static void test_add(void) {
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = k_sizes[s];
        float *x = alloc_f(n), *y = alloc_f(n), *o = alloc_f(n), *want = alloc_f(n);
        fill(x, n, -1.0f, 1.0f);
        fill(y, n, -1.0f, 1.0f);
        for (int64_t i = 0; i < n; i++) want[i] = x[i] + y[i];
        ct_add_forward(o, x, y, n);
        CHECK_MSG(same_bits(o, want, n), "add, n %lld", (long long)n);
        ct_add_forward(x, x, y, n);
        CHECK_MSG(same_bits(x, want, n), "add over its input, n %lld", (long long)n);
        free(x), free(y), free(o), free(want);
    }
}

static void test_gelu(void) {
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = k_sizes[s];
        float *x = alloc_f(n), *g = alloc_f(n), *d0 = alloc_f(n);
        fill(x, n, -8.0f, 8.0f);
        fill(g, n, -1.0f, 1.0f);
        for (int64_t i = 0; i < n; i++) d0[i] = NAN;  // backward writes dinp: nothing of it may show
        float *y = alloc_f(n), *yr = alloc_f(n), *d = dup_f(d0, n), *dr = dup_f(d0, n);
        ct_gelu_forward(y, x, n);
        ct_gelu_forward_ref(yr, x, n);
        double ey = worst_err(y, yr, n, 1.0);
        CHECK_MSG(ey <= 1e-6, "gelu forward, n %lld: error %g", (long long)n, ey);
        ct_gelu_backward(d, x, g, n);
        ct_gelu_backward_ref(dr, x, g, n);
        double ed = worst_err(d, dr, n, 1.0);
        CHECK_MSG(ed <= 1e-6 && !any_nan(d, n) && !any_nan(dr, n), "gelu backward, n %lld: error %g", (long long)n,
                  ed);
        free(x), free(g), free(d0), free(y), free(yr), free(d), free(dr);
    }
    // Large |x|, where x * x overflows float (|x| > 1.8e19): the slope is 1
    // above and 0 below, as in double (x (1 - t^2) (1 + 3c x^2) was
    // x * 0 * inf = NaN); and -0, denormals, 20 (tanh 1 in float).
    enum { K = 11 };
    const float x[K] = {1e20f, -1e20f, FLT_MAX, -FLT_MAX, 3e19f, 20.0f, -20.0f, -0.0f, 1e-45f, -1e-45f, 1e-38f};
    const float ones[K] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    float y[K], yr[K], d[K], dr[K];
    ct_gelu_forward(y, x, K);
    ct_gelu_forward_ref(yr, x, K);
    ct_gelu_backward(d, x, ones, K);
    ct_gelu_backward_ref(dr, x, ones, K);
    double e = fmax(worst_err(y, yr, K, 1.0), worst_err(d, dr, K, 1.0));
    CHECK_MSG(e <= 1e-6 && !any_nan(y, K) && !any_nan(d, K) && !any_nan(dr, K),
              "gelu at large |x|: error %g; slope at 1e20 %g, at -1e20 %g, ref %g %g", e, (double)d[0], (double)d[1],
              (double)dr[0], (double)dr[1]);
}

// Row shapes (N, C): single elements, odd widths, and N * C above the
// row kernels' threshold for threads (32768).
static const int64_t k_rows[][2] = {{1, 1},   {1, 3},   {3, 7},    {2, 8},    {2, 15},   {3, 16},    {5, 17},
                                    {2, 31},  {2, 33},  {2, 63},   {16, 64},  {2, 65},   {33, 255},  {64, 256},
                                    {200, 257}, {2, 5000}};
#define N_ROWS (int)(sizeof k_rows / sizeof k_rows[0])

// offset: added to every input, to check the shifted sums where |mean| >> std.
static void layernorm_case(int64_t N, int64_t C, float offset) {
    float *x = alloc_f(N * C), *w = alloc_f(C), *b = alloc_f(C), *g = alloc_f(N * C);
    fill(x, N * C, offset - 2.0f, offset + 2.0f);
    fill(w, C, 0.5f, 1.5f);
    fill(b, C, -0.5f, 0.5f);
    fill(g, N * C, -1.0f, 1.0f);
    float *y = alloc_f(N * C), *yr = alloc_f(N * C), *m = alloc_f(N), *mr = alloc_f(N), *r = alloc_f(N),
          *rr = alloc_f(N);
    ct_layernorm_forward(y, m, r, x, w, b, N, C, 1e-6f);
    ct_layernorm_forward_ref(yr, mr, rr, x, w, b, N, C, 1e-6f);
    double ey = worst_err(y, yr, N * C, 1.0), em = worst_err(m, mr, N, 1.0), er = worst_err(r, rr, N, 1.0);
    // With C == 1 the variance is 0 and rstd = 1 / sqrt(eps): the output is
    // the bias up to the rounding of x - mean (exactly 0 in both).
    CHECK_MSG(ey <= 1e-6 && em <= 1e-6 && er <= 1e-6,
              "layernorm forward (%lld, %lld) offset %g: errors y %g mean %g rstd %g", (long long)N, (long long)C,
              offset, ey, em, er);
    // Backward from the reference's saved mean and rstd, so that only the
    // backward differs.
    float *dx = alloc_f(N * C), *dxr = alloc_f(N * C), *dw = alloc_f(C), *dwr = alloc_f(C), *db = alloc_f(C),
          *dbr = alloc_f(C);
    for (int64_t i = 0; i < N * C; i++) dx[i] = dxr[i] = NAN;  // backward writes dinp: nothing of it may show
    fill(dw, C, -1.0f, 1.0f);
    memcpy(dwr, dw, (size_t)C * sizeof(float));
    float *dw0 = dup_f(dw, C);
    // One thread (one fused pass per row) and two (a row pass, then a
    // column pass for dweight/dbias above the threshold): the same bits.
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    ct_layernorm_backward(dx, dw, db, g, x, w, mr, rr, N, C);
    ct_layernorm_backward_ref(dxr, dwr, dbr, g, x, w, mr, rr, N, C);
    double edx = worst_err(dx, dxr, N * C, 1.0);
    CHECK_MSG(edx <= 1e-6 && !any_nan(dx, N * C), "layernorm backward dx (%lld, %lld) offset %g: error %g",
              (long long)N, (long long)C, offset, edx);
    CHECK_MSG(same_bits(dw, dwr, C) && same_bits(db, dbr, C), "layernorm backward dweight/dbias (%lld, %lld)",
              (long long)N, (long long)C);
    omp_set_num_threads(2);
    memcpy(dw, dw0, (size_t)C * sizeof(float));
    memset(db, 0, (size_t)C * sizeof(float));
    for (int64_t i = 0; i < N * C; i++) dxr[i] = NAN;
    ct_layernorm_backward(dxr, dw, db, g, x, w, mr, rr, N, C);
    CHECK_MSG(same_bits(dx, dxr, N * C) && same_bits(dw, dwr, C) && same_bits(db, dbr, C),
              "layernorm backward (%lld, %lld), 2 threads against 1", (long long)N, (long long)C);
    omp_set_num_threads(saved);
    free(dw0);
    free(x), free(w), free(b), free(g), free(y), free(yr), free(m), free(mr), free(r), free(rr);
    free(dx), free(dxr), free(dw), free(dwr), free(db), free(dbr);
}

static void test_layernorm(void) {
    for (int s = 0; s < N_ROWS; s++) {
        layernorm_case(k_rows[s][0], k_rows[s][1], 0.0f);
        layernorm_case(k_rows[s][0], k_rows[s][1], 100.0f);
    }
}

// Rows whose |mean| is a million times their spread: rstd against the
// variance in double, two passes around the double mean. The kernel's
// shifted sums keep it to rounding; the plain E[x^2] - E[x]^2, even in
// double, puts rstd 2e-5 off at (1, 3). (The _ref loops subtract the mean
// rounded to float, which adds that rounding squared to the variance:
// rstd up to 4e-4 off at this offset, so they are not the oracle here.)
static void test_layernorm_large_mean(void) {
    static const int64_t shapes[][2] = {{1, 3}, {4, 17}, {3, 256}, {2, 1001}};
    for (int s = 0; s < 4; s++) {
        int64_t N = shapes[s][0], C = shapes[s][1];
        float *x = alloc_f(N * C), *w = alloc_f(C), *b = alloc_f(C), *y = alloc_f(N * C), *m = alloc_f(N),
              *r = alloc_f(N);
        fill(x, N * C, 1e6f - 2.0f, 1e6f + 2.0f);
        for (int64_t c = 0; c < C; c++) w[c] = 1.0f, b[c] = 0.0f;
        ct_layernorm_forward(y, m, r, x, w, b, N, C, 1e-6f);
        double worst = 0.0;
        for (int64_t n = 0; n < N; n++) {
            double mean = 0.0, var = 0.0;
            for (int64_t c = 0; c < C; c++) mean += x[n * C + c];
            mean /= (double)C;
            for (int64_t c = 0; c < C; c++) var += ((double)x[n * C + c] - mean) * ((double)x[n * C + c] - mean);
            double want = 1.0 / sqrt(var / (double)C + 1e-6);
            worst = check_worse(worst, fabs(r[n] - want) / want);
        }
        CHECK_MSG(worst <= 1e-6, "layernorm rstd (%lld, %lld) at mean 1e6: error %g", (long long)N, (long long)C,
                  worst);
        free(x), free(w), free(b), free(y), free(m), free(r);
    }
}

// The mean rounded to float once: the kernel's x[0] + (shifted mean), added
// in double and then rounded. Rows of 31 whose mean lies 1/62 of a float
// ulp from a midpoint between floats near 98: rounding the shifted mean
// (about -5.8, whose float ulp is 1/16 of the mean's) to float first lands
// it on the midpoint, and the tie then goes to the even float, the wrong one
// in both rows (the right mean rounds down at js 22, up at js 54). Random
// rows rarely come that close (test_layernorm's did not). The mean against
// the double mean rounded (bitwise), the output against the _ref loops (a
// mean 1 ulp off moves y by 7e-6).
static void test_layernorm_mean_rounding(void) {
    enum { N = 2, C = 31 };
    static const int js[N] = {22, 54};
    float x[N * C], w[C], b[C], y[N * C], yr[N * C], m[N], mr[N], r[N], rr[N], want[N];
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) x[n * C + c] = 98.0f;
        x[n * C] = 104.0f;
        x[n * C + 1] = 98.0f + (float)js[n] * 0x1p-17f;  // 98 plus js[n] ulps
        double sum = 0.0;
        for (int c = 0; c < C; c++) sum += x[n * C + c];  // exact: 31 floats of one binade
        want[n] = (float)(sum / C);
    }
    for (int c = 0; c < C; c++) w[c] = 1.0f, b[c] = 0.0f;
    ct_layernorm_forward(y, m, r, x, w, b, N, C, 1e-6f);
    ct_layernorm_forward_ref(yr, mr, rr, x, w, b, N, C, 1e-6f);
    double ey = worst_err(y, yr, N * C, 1.0);
    CHECK_MSG(same_bits(m, want, N) && same_bits(mr, want, N) && ey <= 1e-6,
              "layernorm mean near a float midpoint: %a %a, ref %a %a, want %a %a; y error %g", (double)m[0],
              (double)m[1], (double)mr[0], (double)mr[1], (double)want[0], (double)want[1], ey);
}

static void test_softmax(void) {
    for (int s = 0; s < N_ROWS; s++) {
        int64_t N = k_rows[s][0], C = k_rows[s][1], n = N * C;
        float *x = alloc_f(n), *g = alloc_f(n), *d0 = alloc_f(n);
        fill(x, n, -20.0f, 20.0f);
        fill(g, n, -1.0f, 1.0f);
        fill(d0, n, -1.0f, 1.0f);
        if (n > 4) x[1] = -INFINITY;  // a masked logit
        float *y = alloc_f(n), *yr = alloc_f(n), *d = dup_f(d0, n), *dr = dup_f(d0, n);
        ct_softmax_forward(y, x, N, C);
        ct_softmax_forward_ref(yr, x, N, C);
        // Probabilities: relative error down to 1e-30 (exp's 2 ulp hold for
        // normal results).
        double e = worst_err(y, yr, n, 1e-30);
        CHECK_MSG(e <= 1e-6, "softmax forward (%lld, %lld): error %g", (long long)N, (long long)C, e);
        ct_softmax_backward(d, g, yr, N, C);
        ct_softmax_backward_ref(dr, g, yr, N, C);
        e = worst_err(d, dr, n, 1.0);
        CHECK_MSG(e <= 1e-6, "softmax backward (%lld, %lld): error %g", (long long)N, (long long)C, e);

        ct_log_softmax_forward(y, x, N, C);
        ct_log_softmax_forward_ref(yr, x, N, C);
        // x - lse: its error is lse's rounding, relative to the inputs'
        // scale (20) where x and lse cancel.
        e = worst_err(y, yr, n, 20.0);
        CHECK_MSG(e <= 1e-6, "log_softmax forward (%lld, %lld): error %g", (long long)N, (long long)C, e);
        memcpy(d, d0, (size_t)n * sizeof(float));
        memcpy(dr, d0, (size_t)n * sizeof(float));
        ct_log_softmax_backward(d, g, yr, N, C);
        ct_log_softmax_backward_ref(dr, g, yr, N, C);
        e = worst_err(d, dr, n, 1.0);
        CHECK_MSG(e <= 1e-6, "log_softmax backward (%lld, %lld): error %g", (long long)N,
                  (long long)C, e);
        free(x), free(g), free(d0), free(y), free(yr), free(d), free(dr);
    }
}

// ct_log_softmax_backward runs the _ref loop itself (softmax.c says why),
// so the comparison above cannot see a fault in it: here against double,
// dx += g - softmax * sum(g), softmax = exp(y) of the log-softmax rows y.
static void test_log_softmax_backward(void) {
    for (int s = 0; s < N_ROWS; s++) {
        int64_t N = k_rows[s][0], C = k_rows[s][1], n = N * C;
        float *x = alloc_f(n), *y = alloc_f(n), *g = alloc_f(n), *d = alloc_f(n), *want = alloc_f(n);
        fill(x, n, -5.0f, 5.0f);
        fill(g, n, -1.0f, 1.0f);
        fill(d, n, -1.0f, 1.0f);
        ct_log_softmax_forward(y, x, N, C);
        for (int64_t r = 0; r < N; r++) {
            double sum = 0.0;
            for (int64_t c = 0; c < C; c++) sum += g[r * C + c];
            for (int64_t c = 0; c < C; c++)
                want[r * C + c] = (float)(d[r * C + c] + g[r * C + c] - exp((double)y[r * C + c]) * sum);
        }
        ct_log_softmax_backward(d, g, y, N, C);
        double e = worst_err(d, want, n, 1.0);
        CHECK_MSG(e <= 1e-5, "log_softmax backward (%lld, %lld) against double: error %g", (long long)N, (long long)C,
                  e);
        free(x), free(y), free(g), free(d), free(want);
    }
}

// Log-softmax of large logits, against double from the same floats:
// x - (max + log(sum)) rounded the logsumexp to the spacing of floats near
// max (1 at 1e7): (1e7, 1e7, 1e7 - 1) gave (-1, -1, -2) for (-0.862,
// -0.862, -1.862) and a cross-entropy of 1 for 0.862; three logits of 3e38
// gave 0 for -log(3). (x - max) - log(sum), as jax.nn.log_softmax computes
// it, keeps both terms' precision.
static void test_log_softmax_large_logits(void) {
    static const float big[] = {1e4f, 1e7f, -3e5f, 3e38f};
    for (int b = 0; b < 4; b++) {
        enum { C = 3 };
        const float x[C] = {big[b], big[b], big[b] - 1.0f};
        float y[C], yr[C], lp[C], loss;
        double m = fmax(fmax(x[0], x[1]), x[2]), sum = 0.0, want[C];
        for (int c = 0; c < C; c++) sum += exp((double)x[c] - m);
        for (int c = 0; c < C; c++) want[c] = ((double)x[c] - m) - log(sum);
        ct_log_softmax_forward(y, x, 1, C);
        ct_log_softmax_forward_ref(yr, x, 1, C);
        const int32_t t = 0;
        const float w = 1.0f;
        ct_category_cross_entropy_forward(&loss, lp, x, &t, &w, 1.0, 0.0f, 1, C);
        double e = fabs(loss + want[0]) / fabs(want[0]);
        for (int c = 0; c < C; c++)
            e = check_worse(e, check_worse(fabs(y[c] - want[c]), fabs(yr[c] - want[c])) / fmax(1.0, fabs(want[c])));
        CHECK_MSG(e <= 1e-6, "log_softmax of (%g, %g, %g): (%.9g, %.9g, %.9g), ref (%.9g, %.9g, %.9g), loss %.9g; "
                  "want (%.9g, %.9g, %.9g)", (double)x[0], (double)x[1], (double)x[2], (double)y[0], (double)y[1],
                  (double)y[2], (double)yr[0], (double)yr[1], (double)yr[2], (double)loss, want[0], want[1], want[2]);
    }
}

// With label smoothing s 0, 0.1 and 1 (the reference writes out each
// class's target probability; the kernel sums each row of logp in lanes).
static void test_cross_entropy(void) {
    static const float smoothing[] = {0.0f, 0.1f, 1.0f};
    for (int k = 0; k < 3; k++)
        for (int s = 0; s < N_ROWS; s++) {
            int64_t N = k_rows[s][0], V = k_rows[s][1], n = N * V;
            float ls = smoothing[k];
            float *x = alloc_f(n), *w = alloc_f(N), *d0 = alloc_f(n);
            int32_t *t = malloc((size_t)N * sizeof *t);
            fill(x, n, -10.0f, 10.0f);
            fill(d0, n, -1.0f, 1.0f);
            for (int64_t i = 0; i < N; i++) {
                t[i] = (int32_t)(urand(0.0f, (float)V)) % (int32_t)V;
                w[i] = i % 3 == 2 ? 0.0f : urand(0.5f, 1.0f);  // some padding
            }
            w[0] = 1.0f;
            double wsum = ct_weight_sum(w, N);
            float loss, loss_r, *lp = alloc_f(n), *lpr = alloc_f(n), *d = dup_f(d0, n), *dr = dup_f(d0, n);
            ct_category_cross_entropy_forward(&loss, lp, x, t, w, wsum, ls, N, V);
            ct_category_cross_entropy_forward_ref(&loss_r, lpr, x, t, w, wsum, ls, N, V);
            double e = worst_err(lp, lpr, n, 10.0);  // as log_softmax's: the inputs' scale
            CHECK_MSG(e <= 1e-6, "cross-entropy logp (%lld, %lld), s %g: error %g", (long long)N, (long long)V,
                      (double)ls, e);
            e = worst_err(&loss, &loss_r, 1, 1.0);
            CHECK_MSG(e <= 1e-6, "cross-entropy loss (%lld, %lld), s %g: %.9g vs %.9g", (long long)N, (long long)V,
                      (double)ls, loss, loss_r);
            ct_category_cross_entropy_backward(d, 0.7f, lpr, t, w, wsum, ls, N, V);
            ct_category_cross_entropy_backward_ref(dr, 0.7f, lpr, t, w, wsum, ls, N, V);
            e = worst_err(d, dr, n, 1.0);
            CHECK_MSG(e <= 1e-6, "cross-entropy backward (%lld, %lld), s %g: error %g", (long long)N, (long long)V,
                      (double)ls, e);
            // One thread and three (more threads than this machine may have
            // cores): the loss and the gradient have the same bits.
            int saved = omp_get_max_threads();
            float loss_t[2], *lp_t = alloc_f(n), *d_t[2] = {dup_f(d0, n), dup_f(d0, n)};
            for (int r = 0; r < 2; r++) {
                omp_set_num_threads(r == 0 ? 1 : 3);
                ct_category_cross_entropy_forward(&loss_t[r], lp_t, x, t, w, wsum, ls, N, V);
                ct_category_cross_entropy_backward(d_t[r], 0.7f, lp_t, t, w, wsum, ls, N, V);
            }
            omp_set_num_threads(saved);
            CHECK_MSG(same_bits(&loss_t[0], &loss_t[1], 1) && same_bits(d_t[0], d_t[1], n),
                      "cross-entropy (%lld, %lld), s %g: 3 threads against 1: loss %.9g vs %.9g", (long long)N,
                      (long long)V, (double)ls, (double)loss_t[1], (double)loss_t[0]);
            free(lp_t), free(d_t[0]), free(d_t[1]);
            if (s == N_ROWS - 1)
                printf("cross-entropy (%lld, %lld), label smoothing %g: loss %.9g, ref %.9g\n", (long long)N,
                       (long long)V, (double)ls, (double)loss, (double)loss_r);
            free(x), free(w), free(d0), free(t), free(lp), free(lpr), free(d), free(dr);
        }
}

// Cross-entropy's edge cases, in the kernel and the reference alike:
// - label smoothing 1 with the target's logit -inf: the target's own term
//   has weight 0 and is skipped, so the loss is +inf (every class's share
//   of -inf), not 0 * -inf = NaN;
// - a padding row (weight 0) whose logits hold a NaN: no loss and no
//   gradient from it (its gradient row keeps its bits), at smoothing 0 and
//   0.1; the other rows' loss stays finite.
static void test_cross_entropy_edges(void) {
    enum { N = 3, V = 7 };
    float x[N * V], lp[N * V], lpr[N * V], w[N] = {1.0f, 0.0f, 0.5f}, d0[N * V];
    int32_t t[N] = {2, 4, 6};
    fill(x, N * V, -3.0f, 3.0f);
    fill(d0, N * V, -1.0f, 1.0f);
    x[0 * V + 2] = -INFINITY;
    float loss, loss_r;
    ct_category_cross_entropy_forward(&loss, lp, x, t, w, ct_weight_sum(w, N), 1.0f, N, V);
    ct_category_cross_entropy_forward_ref(&loss_r, lpr, x, t, w, ct_weight_sum(w, N), 1.0f, N, V);
    CHECK_MSG(isinf(loss) && loss > 0 && isinf(loss_r) && loss_r > 0,
              "cross-entropy, smoothing 1, target logit -inf: loss %g, ref %g (want +inf)", (double)loss,
              (double)loss_r);
    x[0 * V + 2] = 0.5f;
    x[1 * V + 3] = NAN;  // in the padding row
    static const float smoothing[] = {0.0f, 0.1f};
    for (int k = 0; k < 2; k++) {
        float d[N * V], dr[N * V];
        memcpy(d, d0, sizeof d);
        memcpy(dr, d0, sizeof dr);
        ct_category_cross_entropy_forward(&loss, lp, x, t, w, ct_weight_sum(w, N), smoothing[k], N, V);
        ct_category_cross_entropy_forward_ref(&loss_r, lpr, x, t, w, ct_weight_sum(w, N), smoothing[k], N, V);
        CHECK_MSG(isfinite(loss) && isfinite(loss_r), "cross-entropy, s %g, NaN in a padding row: loss %g, ref %g",
                  (double)smoothing[k], (double)loss, (double)loss_r);
        ct_category_cross_entropy_backward(d, 1.0f, lp, t, w, ct_weight_sum(w, N), smoothing[k], N, V);
        ct_category_cross_entropy_backward_ref(dr, 1.0f, lpr, t, w, ct_weight_sum(w, N), smoothing[k], N, V);
        CHECK_MSG(same_bits(d + V, d0 + V, V) && same_bits(dr + V, d0 + V, V) && !any_nan(d, N * V),
                  "cross-entropy backward, s %g: the padding row's gradient changed", (double)smoothing[k]);
    }
}

// Backward kernels documented to add into their input gradient (dropout,
// the position encoding's input, ShiftRight, Mean; the layers happen to
// zero it first) add to what the buffer holds, against plain loops, on
// sizes with a tail past the kernels' chunks (dropout's 256) and above
// Embedding backward adds each row's gradient to its id's row of the table,
// rows in order where ids repeat: against the plain loop, bitwise, at 1 and
// 2 threads, on a table wide enough that the threads take blocks of columns
// (300 rows of 257, 13 ids, the table starting from nonzero values).
static void test_embedding_backward(void) {
    const int64_t N = 300, C = 257, V = 13;
    float *g = alloc_f(N * C), *dw0 = alloc_f(V * C), *want = alloc_f(V * C);
    int32_t ids[300];
    for (int64_t n = 0; n < N; n++) ids[n] = (int32_t)((n * 7) % V);
    fill(g, N * C, -1.0f, 1.0f);
    fill(dw0, V * C, -1.0f, 1.0f);
    memcpy(want, dw0, (size_t)(V * C) * sizeof(float));
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) want[ids[n] * C + c] += g[n * C + c];
    int saved = omp_get_max_threads();
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        float *dw = dup_f(dw0, V * C);
        ct_embedding_backward(dw, g, ids, N, C);
        CHECK_MSG(same_bits(dw, want, V * C), "embedding backward, %d thread(s): not the plain loop's bits", t);
        free(dw);
    }
    omp_set_num_threads(saved);
    free(g), free(dw0), free(want);
}

// their thresholds for threads.
static void test_backward_adds(void) {
    static const int64_t sizes[] = {1, 7, 257, 70001};
    for (int s = 0; s < 4; s++) {
        int64_t n = sizes[s];
        float *g = alloc_f(n), *d0 = alloc_f(n), *d = alloc_f(n), *want = alloc_f(n);
        fill(g, n, -1.0f, 1.0f);
        fill(d0, n, -1.0f, 1.0f);
        // Dropout 0.3: element i kept iff ct_random_bits(key, i) >= the threshold.
        ct_key key = ct_key_from_seed(41 + (uint64_t)n);
        uint64_t thr = ct_dropout_threshold(0.3f);
        float scale = 1.0f / (1.0f - 0.3f);
        for (int64_t i = 0; i < n; i++)
            want[i] = ct_random_bits(key, (uint32_t)i) >= thr ? d0[i] + g[i] * scale : d0[i];
        memcpy(d, d0, (size_t)n * sizeof(float));
        ct_dropout_backward(d, g, key, thr, scale, n);
        CHECK_MSG(same_bits(d, want, n), "dropout backward adds, n %lld", (long long)n);
        // PositionalEncoding's table: dpe (TC) += the batch's sum, in batch order.
        const int64_t B = 2, TC = n;
        float *gb = alloc_f(B * TC), *di = alloc_f(B * TC), *dpe = dup_f(d0, TC), *want_i = alloc_f(B * TC);
        fill(gb, B * TC, -1.0f, 1.0f);
        for (int64_t i = 0; i < TC; i++) want[i] = (d0[i] + gb[i]) + gb[TC + i];
        ct_positional_backward(dpe, gb, B, TC);
        CHECK_MSG(same_bits(dpe, want, TC), "positional backward adds, TC %lld", (long long)TC);
        // ShiftRight by 1 of (B, T, 1): dinp[b, t] += dout[b, t + 1].
        fill(di, B * TC, -1.0f, 1.0f);
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < TC; i++)
                want_i[b * TC + i] = di[b * TC + i] + (i + 1 < TC ? gb[b * TC + i + 1] : 0.0f);
        ct_shift_right_backward(di, gb, B, TC, 1, 1);
        CHECK_MSG(same_bits(di, want_i, B * TC), "shift_right backward adds, T %lld", (long long)TC);
        // Mean over the middle axis of (1, B, TC): dinp[0, a, i] += dout[i] / B.
        fill(di, B * TC, -1.0f, 1.0f);
        for (int64_t a = 0; a < B; a++)
            for (int64_t i = 0; i < TC; i++) want_i[a * TC + i] = di[a * TC + i] + g[i] * (1.0f / (float)B);
        ct_mean_backward(di, g, 1, B, TC);
        CHECK_MSG(same_bits(di, want_i, B * TC), "mean backward adds, I %lld", (long long)TC);
        free(g), free(d0), free(d), free(want), free(gb), free(di), free(dpe), free(want_i);
    }
}

static void test_adam(void) {
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = k_sizes[s];
        float *w = alloc_f(n), *g = alloc_f(n), *m = alloc_f(n), *v = alloc_f(n);
        fill(w, n, -1.0f, 1.0f);
        fill(m, n, -0.1f, 0.1f);
        fill(v, n, 0.0f, 0.01f);
        float *wr = dup_f(w, n), *mr = dup_f(m, n), *vr = dup_f(v, n);
        for (int step = 0; step < 3; step++) {
            fill(g, n, -1.0f, 1.0f);
            float b1 = 0.9f, b2 = 0.999f, bias1 = 1.0f - powf(b1, (float)(step + 1)),
                  bias2 = 1.0f - powf(b2, (float)(step + 1));
            ct_adam_update(w, g, m, v, n, 1e-3f, b1, b2, 1e-5f, 1e-4f, bias1, bias2);
            ct_adam_update_ref(wr, g, mr, vr, n, 1e-3f, b1, b2, 1e-5f, 1e-4f, bias1, bias2);
        }
        CHECK_MSG(same_bits(w, wr, n) && same_bits(m, mr, n) && same_bits(v, vr, n), "adam, n %lld", (long long)n);
        free(w), free(g), free(m), free(v), free(wr), free(mr), free(vr);
    }
}

// ct_matmul_forward/backward against the plain bias loops; (N, C, OC) with
// odd widths, with and without a bias.
static void test_matmul(void) {
    // The last two cut their rows into parts on two or more cores
    // (ct_matmul_weight_grad_parts), the bias sums too.
    static const int64_t shapes[][3] = {{1, 1, 1},       {3, 5, 7},      {17, 33, 255}, {64, 256, 257},
                                        {130, 64, 1000}, {2048, 64, 100}, {1001, 200, 300}};
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int64_t N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        float *x = alloc_f(N * C), *w = alloc_f(C * OC), *b = alloc_f(OC), *g = alloc_f(N * OC);
        fill(x, N * C, -1.0f, 1.0f);
        fill(w, C * OC, -0.5f, 0.5f);
        fill(b, OC, -1.0f, 1.0f);
        fill(g, N * OC, -1.0f, 1.0f);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *bias = with_bias ? b : NULL;
            float *y = alloc_f(N * OC), *yr = alloc_f(N * OC);
            ct_matmul_forward(y, x, w, bias, N, C, OC);
            ct_matmul_forward_ref(yr, x, w, bias, N, C, OC);
            CHECK_MSG(same_bits(y, yr, N * OC), "matmul forward (%lld, %lld, %lld) bias %d", (long long)N,
                      (long long)C, (long long)OC, with_bias);
            // Backward writes dinp and adds into dweight and dbias, which
            // already hold something (dinp's old values, NaN, must not survive).
            float *dx = alloc_f(N * C), *dw = alloc_f(C * OC), *db = alloc_f(OC);
            fill(dw, C * OC, -1.0f, 1.0f);
            fill(db, OC, -1.0f, 1.0f);
            float *dxr = dup_f(dx, N * C), *dwr = dup_f(dw, C * OC), *dbr = dup_f(db, OC);
            for (int64_t i = 0; i < N * C; i++) dx[i] = dxr[i] = NAN;  // written, not added to: none may show
            float *ws = alloc_f(ct_matmul_weight_grad_scratch_floats(N, C, OC) + 1);
            ct_matmul_backward(dx, dw, with_bias ? db : NULL, ws, g, x, w, N, C, OC);
            ct_matmul_backward_ref(dxr, dwr, with_bias ? dbr : NULL, ws, g, x, w, N, C, OC);
            CHECK_MSG(!any_nan(dx, N * C), "matmul backward (%lld, %lld, %lld): dinp kept its old values",
                      (long long)N, (long long)C, (long long)OC);
            CHECK_MSG(same_bits(dx, dxr, N * C) && same_bits(dw, dwr, C * OC) && same_bits(db, dbr, OC),
                      "matmul backward (%lld, %lld, %lld) bias %d", (long long)N, (long long)C, (long long)OC,
                      with_bias);
            free(y), free(yr), free(dx), free(dw), free(db), free(dxr), free(dwr), free(dbr), free(ws);
        }
        free(x), free(w), free(b), free(g);
    }
}

// ct_sgemm against C = alpha op(A) op(B) + beta C in double, for all four
// transposes, strided operands (leading dimensions past the width, as the
// attention kernels pass a head's columns of a (T, C) row) and shapes that
// ct_sgemm cuts into pieces by rows (M > N) and by columns (M <= N), with
// a last piece shorter than the others. test_matmul compares ct_matmul_*
// with their _ref versions, and test_gemm_thread_count one thread count
// with another, but all of them call ct_sgemm: a wrong offset of a piece
// would be the same in each. Bound: float dot products of K terms are
// within K u of the sum of |terms| (u = FLT_EPSILON / 2); (K + 2) eps
// leaves a factor 2 and the alpha and beta roundings. (A machine with one
// core cuts nothing: ct_sgemm_blocks says how many pieces each shape got.)
static void test_sgemm_reference(void) {
    // (129, 128, 490): two pieces on two or more cores, 129 / 2 rounded up
    // (65) and then up to a multiple of 64: 128 rows and the last 1; its
    // transpose the same in columns.
    static const int64_t shapes[][3] = {{1, 1, 1},     {3, 5, 7},     {300, 130, 257}, {130, 300, 257},
                                        {129, 128, 490}, {128, 129, 490}, {200, 1, 64},  {1, 200, 64},
                                        {70, 65, 0}};
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        for (int op = 0; op < 8; op++) {
            bool ta = op & 1, tb = op & 2;
            float alpha = 0.75f, beta = (op & 4) ? 0.5f : 0.0f;
            // A is (K, M) stored if ta, else (M, K); B (N, K) if tb, else (K, N); C (M, N).
            int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            int64_t lda = ac + 3, ldb = bc + 5, ldc = N + 2;
            float *A = alloc_f(ar * lda), *B = alloc_f(br * ldb), *C = alloc_f(M * ldc), *C0 = alloc_f(M * ldc);
            fill(A, ar * lda, -1.0f, 1.0f);
            fill(B, br * ldb, -1.0f, 1.0f);
            fill(C0, M * ldc, -1.0f, 1.0f);
            if (beta == 0.0f)  // beta 0: C is written, not read (a NaN there must not survive)
                for (int64_t i = 0; i < M * ldc; i++) C0[i] = NAN;
            memcpy(C, C0, (size_t)(M * ldc) * sizeof(float));
            ct_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
            double worst = 0.0;
            bool pad_kept = true;
            for (int64_t i = 0; i < M; i++) {
                for (int64_t j = 0; j < N; j++) {
                    double want = 0.0, mag = 0.0;
                    for (int64_t k = 0; k < K; k++) {
                        double a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
                        want += alpha * a * b, mag += fabs(alpha * a * b);
                    }
                    double c0 = beta != 0.0f ? beta * (double)C0[i * ldc + j] : 0.0;
                    want += c0, mag += fabs(c0);
                    double e = fabs(C[i * ldc + j] - want) / (mag > 1e-30 ? mag : 1e-30);
                    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
                }
                // The columns past N in each row of C are not C's.
                for (int64_t j = N; j < ldc; j++)
                    if (memcmp(&C[i * ldc + j], &C0[i * ldc + j], sizeof(float)) != 0) pad_kept = false;
            }
            CHECK_MSG(worst <= (double)(K + 2) * FLT_EPSILON && pad_kept,
                      "sgemm (M %lld, N %lld, K %lld, %s%s, beta %g, %d pieces) against double: error %g (bound %g)%s",
                      (long long)M, (long long)N, (long long)K, ta ? "T" : "N", tb ? "T" : "N", beta,
                      ct_sgemm_blocks(M, N, K), worst, (double)(K + 2) * FLT_EPSILON,
                      pad_kept ? "" : ", wrote past N");
            free(A), free(B), free(C), free(C0);
        }
    }
}

// ct_matmul_weight_grad, dW (C, OC) += inp (N, C)^T dout (N, OC), against
// double, and the same bits at 1 to 4 threads. On two or more cores the
// first three shapes cut N into parts (on two cores the last one shorter:
// 1001 = 501 + 500), whose sums meet in the scratch; the last keeps
// ct_sgemm's cut (N under twice the longer side). dW starts non-zero: the
// parts add to it. Bound as test_sgemm_reference's, dW's old value counted
// in the magnitude. The first shape's parts: one a core, at most 3 (its 26
// MFLOP in parts of CT_SGEMM_BLOCK_FLOPS, 8 MFLOP, or more).
static void test_weight_grad(void) {
    static const int64_t shapes[][3] = {{2048, 64, 100}, {1001, 200, 300}, {3000, 300, 130}, {300, 256, 200}};
    int threads_before = omp_get_max_threads();
    long cores = sysconf(_SC_NPROCESSORS_ONLN), want = cores < 1 ? 1 : cores < 3 ? cores : 3;
    CHECK_MSG(ct_matmul_weight_grad_parts(2048, 64, 100) == want &&
                  ct_matmul_weight_grad_parts(300, 256, 200) == 1,
              "weight gradient parts: %d and %d on %ld cores", ct_matmul_weight_grad_parts(2048, 64, 100),
              ct_matmul_weight_grad_parts(300, 256, 200), cores);
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int64_t N = shapes[s][0], C = shapes[s][1], OC = shapes[s][2];
        float *x = alloc_f(N * C), *g = alloc_f(N * OC), *dw0 = alloc_f(C * OC);
        float *dw[2] = {alloc_f(C * OC), alloc_f(C * OC)};
        float *scratch = alloc_f(ct_matmul_weight_grad_scratch_floats(N, C, OC) + 1);
        fill(x, N * C, -1.0f, 1.0f);
        fill(g, N * OC, -1.0f, 1.0f);
        fill(dw0, C * OC, -1.0f, 1.0f);
        int differs_at = 0;
        for (int t = 1; t <= 4; t++) {
            float *out = dw[t > 1];
            memcpy(out, dw0, (size_t)(C * OC) * sizeof(float));
            omp_set_num_threads(t);
            ct_matmul_weight_grad(out, NULL, scratch, x, g, N, C, OC);
            if (t > 1 && !same_bits(dw[0], dw[1], C * OC) && !differs_at) differs_at = t;
        }
        double worst = 0.0;
        for (int64_t i = 0; i < C; i++)
            for (int64_t j = 0; j < OC; j++) {
                double want = dw0[i * OC + j], mag = fabs(want);
                for (int64_t n = 0; n < N; n++) {
                    double term = (double)x[n * C + i] * g[n * OC + j];
                    want += term, mag += fabs(term);
                }
                double e = fabs(dw[0][i * OC + j] - want) / (mag > 1e-30 ? mag : 1e-30);
                if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
            }
        CHECK_MSG(!differs_at && worst <= (double)(N + 2) * FLT_EPSILON,
                  "weight gradient (N %lld, C %lld, OC %lld, %d parts): error %g (bound %g), %d threads differ "
                  "from 1 (0: none)",
                  (long long)N, (long long)C, (long long)OC, ct_matmul_weight_grad_parts(N, C, OC), worst,
                  (double)(N + 2) * FLT_EPSILON, differs_at);
        free(x), free(g), free(dw0), free(dw[0]), free(dw[1]), free(scratch);
    }
    omp_set_num_threads(threads_before);
}

// SM3's preconditioned gradient is 0 where the accumulator is 0 (optim.c's
// sm3_precondition), which a gradient whose square underflows makes so:
// g = 1e-30 (g^2 = 1e-60, 0 in float) moves its weight not at all, where
// g / (sqrt(0) + 1e-16) would move it by lr 1e-14. Beside it g = 1 with
// beta2 1: accumulator 1, step lr / (1 + 1e-16) = lr.
static void test_sm3_zero_accumulator(void) {
    float w[2] = {0.0f, 0.0f}, g[2] = {1e-30f, 1.0f}, v[2] = {0.0f, 0.0f};
    const int64_t shape[1] = {2};
    ct_sm3_update(w, g, NULL, v, NULL, NULL, shape, 1, 0.1f, 0.0f, 0, 1.0f, 0.0f);
    CHECK_MSG(w[0] == 0.0f && w[1] == -0.1f && v[0] == 0.0f && v[1] == 1.0f,
              "sm3 with an underflowing g^2: w (%g, %g), want (0, -0.1); v (%g, %g), want (0, 1)", (double)w[0],
              (double)w[1], (double)v[0], (double)v[1]);
}

// The shared-QK key k = q (mean(q^2) + 1e-6)^(-1/2) / sqrt(dk): its
// backward against central differences of the forward, for a row of
// ordinary size and one of |q| ~ 1e-3, where mean(q^2) is the 1e-6 itself
// (at |q| ~ 1 leaving the 1e-6 out moves the gradient by 1e-6, below any
// gradient check; here by about half). Differences of h = |q| / 100 in float:
// the forward's rounding over h is 1e-5 of the slope; bound 1e-3 relative to
// the largest |dq|.
static void test_shared_key_backward(void) {
    enum { DK = 5 };
    static const float scales[2] = {1.0f, 1e-3f};
    for (int s = 0; s < 2; s++) {
        float q[DK], g[DK], dq[DK] = {0}, k1[DK], k2[DK];
        fill(q, DK, -scales[s], scales[s]);
        fill(g, DK, -1.0f, 1.0f);
        ct_shared_key_backward(dq, g, q, 1, DK);
        double worst = 0.0, top = 0.0;
        for (int i = 0; i < DK; i++) top = fmax(top, fabs(dq[i]));
        for (int i = 0; i < DK; i++) {
            float qi = q[i], h = scales[s] * 0.01f;
            q[i] = qi + h;
            ct_shared_key_forward(k1, q, 1, DK);
            q[i] = qi - h;
            ct_shared_key_forward(k2, q, 1, DK);
            q[i] = qi;
            double fd = 0.0;
            for (int j = 0; j < DK; j++) fd += (double)g[j] * ((double)k1[j] - k2[j]);
            fd /= 2.0 * h;
            worst = check_worse(worst, fabs(dq[i] - fd) / top);
        }
        CHECK_MSG(worst <= 1e-3, "shared-key backward at |q| ~ %g against differences: error %g", (double)scales[s],
                  worst);
    }
}

// A vector of more chunks than ct_sum_squares keeps on its stack at once
// (a group of CT_SUMSQ_GROUP chunks of CT_SUMSQ_CHUNK floats; 4099 chunks
// here, 537 MB), zero but for 8192 (8192^2 = 2^26) in the first chunk and q = 2^-14 in
// the last chunk of the first group and in each chunk of the second: each
// q^2 is a quarter of the double ulp at 2^26, so adding the chunks' sums in
// chunk order (as stated) loses every one, while adding the second group's
// sums first (or any other order) keeps three quarters of an ulp and rounds
// up. Bitwise, at one and two threads.
static void test_sum_squares_groups(void) {
    enum { GROUP = CT_SUMSQ_GROUP };
    const int64_t chunk = CT_SUMSQ_CHUNK, n = (GROUP + 3) * chunk;
    float *x = alloc_f(n);
    CHECK(x != NULL);
    if (!x) return;
    const float q = 0x1p-14f;
    x[0] = 8192.0f;
    x[GROUP * chunk - 1] = q;
    for (int64_t c = GROUP; c < GROUP + 3; c++) x[c * chunk + 5] = q;
    double big = 0x1p26, q2 = (double)q * q;
    double want = big + q2 + q2 + q2 + q2;  // chunk order: every q^2 rounds away
    double other = big + (q2 + (q2 + q2 + q2));  // the second group first: rounds up
    CHECK(want == big && other > big);
    for (int t = 1; t <= 2; t++) {
        omp_set_num_threads(t);
        double got = ct_sum_squares(x, n);
        CHECK_MSG(memcmp(&got, &want, sizeof got) == 0, "sum_squares of %lld floats, %d threads: %.17g, in order %.17g",
                  (long long)n, t, got, want);
    }
    free(x);
}

// ct_sum_squares against index order (1e-12), and bitwise against its
// stated order (element i in lane i % CT_LANES, the lanes added 0 to 7),
// which no vector width or alignment may change; at two addresses.
static void test_sum_squares(void) {
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = k_sizes[s];
        float *x = alloc_f(n + 1);
        fill(x, n + 1, -3.0f, 3.0f);
        for (int shift = 0; shift < 2; shift++) {
            if (shift) memmove(x + 1, x, (size_t)n * sizeof(float));
            const float *v = x + shift;
            double got = ct_sum_squares(v, n), want = ct_sum_squares_ref(v, n);
            double err = fabs(got - want) / (want > 1e-30 ? want : 1e-30);
            CHECK_MSG(err <= 1e-12, "sum_squares n %lld: %.17g against %.17g", (long long)n, got, want);
            double lanes = 0.0;  // the stated order: lanes within each chunk, chunks in order
            for (int64_t c0 = 0; c0 < n; c0 += CT_SUMSQ_CHUNK) {
                double lane[CT_LANES] = {0}, chunk = 0.0;
                for (int64_t i = c0; i < n && i < c0 + CT_SUMSQ_CHUNK; i++) lane[i % CT_LANES] += (double)v[i] * v[i];
                for (int j = 0; j < CT_LANES; j++) chunk += lane[j];
                lanes += chunk;
            }
            CHECK_MSG(memcmp(&got, &lanes, sizeof got) == 0, "sum_squares n %lld shift %d: %.17g, in lanes %.17g",
                      (long long)n, shift, got, lanes);
        }
        free(x);
    }
}

// ct_row_exp_sum, which computes its exps a piece at a time: its sum is
// its exps' in the stated order (element i in lane i % CT_LANES, lanes
// added 0 to 7), the same bits without y, and at two addresses (the exps
// too: a vector loop's peeling must not change them).
static void test_row_exp_sum(void) {
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = k_sizes[s];
        float *x = alloc_f(n + 1), *y = alloc_f(n + 1), *y0 = alloc_f(n + 1);
        fill(x, n + 1, -20.0f, 20.0f);
        for (int shift = 0; shift < 2; shift++) {
            if (shift) memmove(x + 1, x, (size_t)n * sizeof(float));
            if (shift) memcpy(y0, y, (size_t)n * sizeof(float));
            float m, m_null;
            double got = ct_row_exp_sum(x + shift, y + shift, n, &m);
            double without_y = ct_row_exp_sum(x + shift, NULL, n, &m_null);
            double lane[CT_LANES] = {0}, lanes = 0.0;
            for (int64_t i = 0; i < n; i++) lane[i % CT_LANES] += y[shift + i];
            for (int j = 0; j < CT_LANES; j++) lanes += lane[j];
            CHECK_MSG(memcmp(&got, &lanes, sizeof got) == 0 && memcmp(&got, &without_y, sizeof got) == 0 &&
                          (n == 0 || m == m_null),
                      "row_exp_sum n %lld shift %d: %.17g, in lanes %.17g, without y %.17g", (long long)n, shift,
                      got, lanes, without_y);
            CHECK_MSG(!shift || memcmp(y0, y + 1, (size_t)n * sizeof(float)) == 0,
                      "row_exp_sum n %lld: other exps at another address", (long long)n);
        }
        free(x), free(y), free(y0);
    }
}

// ct_lanes_sum compiled as the kernels compile it: for the widest vectors
// this CPU has (inline, so each clone vectorizes it at its own width).
__attribute__((target_clones("avx512f", "avx2", "default")))
static double lanes_sum_wide(const float *x, int64_t n) { return ct_lanes_sum(x, n); }

// ct_lanes_sum (at the default and the widest vector width) and ct_lanes_dot
// bitwise against their stated order (element i in lane i % CT_LANES, the
// lanes added 0 to 7), at two addresses.
static void test_lanes_sum(void) {
    for (int s = 0; s < N_SIZES; s++) {
        int64_t n = k_sizes[s];
        float *x = alloc_f(n + 1);
        fill(x, n + 1, -3.0f, 3.0f);
        // Magnitudes from 2^-60 to 2^60, so that a double sum rounds and its
        // order shows (floats of one range add exactly in double).
        for (int64_t i = 0; i <= n; i++) x[i] = ldexpf(x[i], (int)(i * 37 % 121) - 60);
        for (int shift = 0; shift < 2; shift++) {
            if (shift) memmove(x + 1, x, (size_t)n * sizeof(float));
            const float *v = x + shift;
            double lane[CT_LANES] = {0}, dot_lane[CT_LANES] = {0}, want = 0.0, want_dot = 0.0;
            for (int64_t i = 0; i < n; i++) lane[i % CT_LANES] += v[i], dot_lane[i % CT_LANES] += (double)v[i] * x[i];
            for (int j = 0; j < CT_LANES; j++) want += lane[j], want_dot += dot_lane[j];
            double got = ct_lanes_sum(v, n), got_wide = lanes_sum_wide(v, n), got_dot = ct_lanes_dot(v, x, n);
            CHECK_MSG(memcmp(&got, &want, sizeof got) == 0 && memcmp(&got_wide, &want, sizeof got) == 0 &&
                          memcmp(&got_dot, &want_dot, sizeof got) == 0,
                      "lanes n %lld shift %d: sum %a (widest vectors %a) against %a, dot %a against %a", (long long)n,
                      shift, got, got_wide, want, got_dot, want_dot);
        }
        free(x);
    }
}

// One Adafactor step as src/optim/adafactor.c runs it, through the fast or
// the reference kernels.
static void adafactor_factored(bool ref, float *w, float *m, const float *g, float *vr, float *vc, int64_t B,
                               int64_t R, int64_t C, double *y2) {
    float decay = 0.8f, mix = 0.2f, eps1 = 1e-3f, scale = 1e-2f, beta1 = 0.9f;  // an eps1 that shows
    if (ref) ct_adafactor_factored_moments_ref(vr, vc, g, B, R, C, decay, mix);
    else ct_adafactor_factored_moments(vr, vc, g, B, R, C, decay, mix);
    *y2 = ct_adafactor_factored_y_sumsq(g, vr, vc, B, R, C, eps1);  // index order: has no second version
    float denom = 1.2f;  // fixed: the clipping's denominator is the layer's business
    if (ref) ct_adafactor_factored_apply_ref(w, m, g, vr, vc, B, R, C, eps1, denom, scale, beta1, 1e-4f);
    else ct_adafactor_factored_apply(w, m, g, vr, vc, B, R, C, eps1, denom, scale, beta1, 1e-4f);
}

static void test_adafactor(void) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {1, 3, 5}, {2, 17, 33}, {1, 64, 255}, {3, 129, 300}, {1, 300, 257}};
    for (int s = 0; s < 6; s++) {
        int64_t B = shapes[s][0], R = shapes[s][1], C = shapes[s][2], n = B * R * C;
        for (int with_m = 0; with_m < 2; with_m++) {
            float *w = alloc_f(n), *g = alloc_f(n), *m = alloc_f(n), *vr = alloc_f(B * R), *vc = alloc_f(B * C);
            fill(w, n, -1.0f, 1.0f);
            fill(g, n, -1.0f, 1.0f);
            fill(vr, B * R, 0.1f, 1.0f);
            fill(vc, B * C, 0.1f, 1.0f);
            float *w2 = dup_f(w, n), *m2 = dup_f(m, n), *vr2 = dup_f(vr, B * R), *vc2 = dup_f(vc, B * C);
            double y2, y2r;
            adafactor_factored(false, w, with_m ? m : NULL, g, vr, vc, B, R, C, &y2);
            adafactor_factored(true, w2, with_m ? m2 : NULL, g, vr2, vc2, B, R, C, &y2r);
            double evr = worst_err(vr, vr2, B * R, 1e-30), evc = worst_err(vc, vc2, B * C, 1e-30),
                   ew = worst_err(w, w2, n, 1.0), em = worst_err(m, m2, n, 1e-3);
            CHECK_MSG(evr <= 1e-6 && evc <= 1e-6 && ew <= 1e-6 && em <= 1e-5 && fabs(y2 - y2r) <= 1e-6 * y2r,
                      "adafactor factored (%lld, %lld, %lld) m %d: errors vr %g vc %g w %g m %g y2 %.17g vs %.17g",
                      (long long)B, (long long)R, (long long)C, with_m, evr, evc, ew, em, y2, y2r);
            // The apply step alone, from the same moments: bitwise.
            memcpy(w2, w, (size_t)n * sizeof(float));
            memcpy(m2, m, (size_t)n * sizeof(float));
            ct_adafactor_factored_apply(w, with_m ? m : NULL, g, vr2, vc2, B, R, C, 1e-3f, 1.3f, 1e-2f, 0.9f, 0.0f);
            ct_adafactor_factored_apply_ref(w2, with_m ? m2 : NULL, g, vr2, vc2, B, R, C, 1e-3f, 1.3f, 1e-2f, 0.9f,
                                            0.0f);
            CHECK_MSG(same_bits(w, w2, n) && same_bits(m, m2, n), "adafactor factored apply (%lld, %lld, %lld)",
                      (long long)B, (long long)R, (long long)C);
            // Unfactored, on the same data as (n) vectors.
            float *v = alloc_f(n);
            fill(v, n, 0.1f, 1.0f);
            memcpy(w2, w, (size_t)n * sizeof(float));
            memcpy(m2, m, (size_t)n * sizeof(float));
            ct_adafactor_apply(w, with_m ? m : NULL, g, v, n, 1e-3f, 1.1f, 1e-2f, 0.9f, 1e-4f);
            ct_adafactor_apply_ref(w2, with_m ? m2 : NULL, g, v, n, 1e-3f, 1.1f, 1e-2f, 0.9f, 1e-4f);
            CHECK_MSG(same_bits(w, w2, n) && same_bits(m, m2, n), "adafactor apply (%lld)", (long long)n);
            free(w), free(g), free(m), free(vr), free(vc), free(w2), free(m2), free(vr2), free(vc2), free(v);
        }
    }
}

// The threaded kernels give the same bits with 1 and with 2 threads (the
// project promises bitwise resume on one machine with one thread count; the
// kernels keep that promise for any thread count). LayerNorm's backward
// gives the same bits again written over its output gradient (a donated
// one), on both paths (1 thread: rows and columns in one pass; 2: columns
// first, then rows).
static void test_thread_count(void) {
    int64_t N = 300, C = 257, n = N * C;
    float *x = alloc_f(n), *w = alloc_f(C), *b = alloc_f(C), *g = alloc_f(n);
    fill(x, n, -3.0f, 3.0f);
    fill(w, C, 0.5f, 1.5f);
    fill(b, C, -0.5f, 0.5f);
    fill(g, n, -1.0f, 1.0f);
    float *out[2], *dx[2], *dw[2], *db[2], *mean = alloc_f(N), *rstd = alloc_f(N);
    double sumsq[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        out[t] = alloc_f(n), dx[t] = alloc_f(n), dw[t] = alloc_f(C), db[t] = alloc_f(C);
        ct_layernorm_forward(out[t], mean, rstd, x, w, b, N, C, 1e-6f);
        ct_layernorm_backward(dx[t], dw[t], db[t], g, x, w, mean, rstd, N, C);
        float *over = dup_f(g, n), *dw_over = alloc_f(C), *db_over = alloc_f(C);
        ct_layernorm_backward(over, dw_over, db_over, over, x, w, mean, rstd, N, C);
        CHECK_MSG(same_bits(over, dx[t], n) && same_bits(dw_over, dw[t], C) && same_bits(db_over, db[t], C),
                  "layernorm backward over its output gradient, %d thread(s): not the same bits", t + 1);
        free(over), free(dw_over), free(db_over);
        ct_log_softmax_forward(out[t], x, N, C);
        ct_log_softmax_backward(dx[t], g, out[t], N, C);
        sumsq[t] = ct_sum_squares(x, n);  // 3 chunks
    }
    CHECK(same_bits(out[0], out[1], n) && same_bits(dx[0], dx[1], n));
    CHECK(same_bits(dw[0], dw[1], C) && same_bits(db[0], db[1], C));
    CHECK(memcmp(&sumsq[0], &sumsq[1], sizeof(double)) == 0);
    for (int t = 0; t < 2; t++) free(out[t]), free(dx[t]), free(dw[t]), free(db[t]);
    free(x), free(w), free(b), free(g), free(mean), free(rstd);
}

// ct_sgemm gives the same bits at any thread count, on shapes where
// OpenBLAS's own threading does not: OpenBLAS cuts a product among its
// threads by their number, and the cut changes how some elements are summed
// (SkylakeX: K over 448 and not 0 or 31 modulo 32, as Fashion-MNIST's 784
// inputs; Haswell and the generic kernel: almost any K). Each shape with
// and without the transposes, beta 0 and 1 (C already holding values).
static void test_gemm_thread_count(void) {
    static const int64_t shapes[][3] = {{100, 256, 784}, {784, 256, 100}, {300, 130, 36}, {2048, 64, 449}, {5, 3, 1000}};
    int threads_before = omp_get_max_threads();
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        float *A = alloc_f(M * K), *B = alloc_f(K * N), *C0 = alloc_f(M * N), *C[2] = {alloc_f(M * N), alloc_f(M * N)};
        fill(A, M * K, -1.0f, 1.0f);
        fill(B, K * N, -1.0f, 1.0f);
        fill(C0, M * N, -1.0f, 1.0f);
        for (int op = 0; op < 8; op++) {
            bool ta = op & 1, tb = op & 2;
            float beta = (op & 4) ? 1.0f : 0.0f;
            bool same = true;
            int differs_at = 0;
            for (int t = 1; t <= 4; t++) {
                float *out = C[t > 1];
                memcpy(out, C0, (size_t)(M * N) * sizeof(float));
                omp_set_num_threads(t);
                ct_sgemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, beta, out, N);
                if (t > 1 && !same_bits(C[0], C[1], M * N) && same) same = false, differs_at = t;
            }
            CHECK_MSG(same, "sgemm (M %lld, N %lld, K %lld, %s%s, beta %g): %d threads differ from 1",
                      (long long)M, (long long)N, (long long)K, ta ? "T" : "N", tb ? "T" : "N", beta, differs_at);
        }
        free(A), free(B), free(C0), free(C[0]), free(C[1]);
    }
    omp_set_num_threads(threads_before);
}

// vmath's exp against libm's exp in double, over every 127th float of
// [-87, -0] (9 million, every binade) and the edges: within 2 ulp of the
// correctly rounded float, as vmath.h promises (1 seen); 0 below -87; 1 for
// -0 and the negative denormals; 0 for -inf; NaN for NaN.
static void test_vexp(void) {
    union {
        uint32_t u;
        float f;
    } lo = {.f = -87.0f};
    uint32_t worst_ulp = 0;
    float worst_x = 0.0f;
    for (uint64_t b = 0x80000000u; b <= lo.u; b += 127) {
        union {
            uint32_t u;
            float f;
        } x = {.u = (uint32_t)b}, got, want;
        got.f = ct_vexp_nonpos(x.f);
        want.f = (float)exp((double)x.f);
        uint32_t ulp = got.u > want.u ? got.u - want.u : want.u - got.u;  // both positive
        if (ulp > worst_ulp) worst_ulp = ulp, worst_x = x.f;
    }
    CHECK_MSG(worst_ulp <= 2, "vexp: %u ulp from exp at %a", worst_ulp, (double)worst_x);
    CHECK(ct_vexp_nonpos(-87.0f) == (float)exp(-87.0));
    CHECK(ct_vexp_nonpos(-0.0f) == 1.0f && ct_vexp_nonpos(-0x1p-149f) == 1.0f && ct_vexp_nonpos(-0x1p-127f) == 1.0f);
    CHECK(ct_vexp_nonpos(-87.01f) == 0.0f && ct_vexp_nonpos(-1e30f) == 0.0f && ct_vexp_nonpos(-INFINITY) == 0.0f);
    CHECK(isnan(ct_vexp_nonpos(NAN)));
}

// Softmax rows at the edges, in the kernels and the _ref loops alike:
// - one finite logit, the rest -inf (a causal mask's first row): exactly
//   one-hot, its log-softmax 0 there and -inf elsewhere;
// - every logit -inf (a fully masked row): NaN, as jax.nn.softmax gives
//   (exp(-inf - -inf)), and only in that row;
// - logits near the largest float: x - max does not overflow to NaN; the
//   probabilities are exact halves and zeros.
static void test_softmax_edges(void) {
    enum { N = 3, C = 19 };
    float x[N * C], y[N * C], yr[N * C], l[N * C], lr[N * C];
    for (int c = 0; c < C; c++) {
        x[c] = c == 5 ? 3.0f : -INFINITY;
        x[C + c] = -INFINITY;
        x[2 * C + c] = c == 2 || c == 17 ? FLT_MAX : c % 2 ? -FLT_MAX : 0.0f;
    }
    ct_softmax_forward(y, x, N, C);
    ct_softmax_forward_ref(yr, x, N, C);
    ct_log_softmax_forward(l, x, N, C);
    ct_log_softmax_forward_ref(lr, x, N, C);
    int bad = 0;
    for (int c = 0; c < C; c++) {
        float p0 = c == 5 ? 1.0f : 0.0f, p2 = c == 2 || c == 17 ? 0.5f : 0.0f;
        bad += y[c] != p0 || yr[c] != p0 || y[2 * C + c] != p2 || yr[2 * C + c] != p2;
        bad += !isnan(y[C + c]) || !isnan(yr[C + c]) || !isnan(l[C + c]) || !isnan(lr[C + c]);
        bad += c == 5 ? l[c] != 0.0f || lr[c] != 0.0f : !(isinf(l[c]) && l[c] < 0 && isinf(lr[c]) && lr[c] < 0);
    }
    CHECK_MSG(bad == 0, "softmax edge rows: %d wrong values", bad);
}

// The kernels on rows that start 1 and 3 floats past malloc's alignment,
// at every tail size: a vector loop that peels to align, or a clone that
// loads whole vectors, must give the plain loops' results (bitwise where
// the header of this file says so).
static void test_unaligned(void) {
    static const int64_t tails[] = {1, 7, 8, 15, 16, 17, 31, 33, 63, 65};
    for (int s = 0; s < 10; s++)
        for (int off = 1; off <= 3; off += 2) {
            const int64_t C = tails[s], N = 2, n = N * C, len = n + off;
            float *bx = alloc_f(len), *bg = alloc_f(len), *bd0 = alloc_f(len), *by = alloc_f(len),
                  *byr = alloc_f(len), *bd = alloc_f(len), *bdr = alloc_f(len), *bw = alloc_f(len),
                  *bwr = alloc_f(len), *bm = alloc_f(len), *bmr = alloc_f(len), *bv = alloc_f(len),
                  *bvr = alloc_f(len);
            float *x = bx + off, *g = bg + off, *d0 = bd0 + off, *y = by + off, *yr = byr + off, *d = bd + off,
                  *dr = bdr + off, *w = bw + off, *wr = bwr + off, *m = bm + off, *mr = bmr + off, *v = bv + off,
                  *vr = bvr + off;
            fill(x, n, -8.0f, 8.0f);
            fill(g, n, -1.0f, 1.0f);
            fill(d0, n, -1.0f, 1.0f);
            bool ok = true;
            ct_relu_forward(y, x, n);
            ct_relu_forward_ref(yr, x, n);
            ok = ok && same_bits(y, yr, n);
            ct_relu_backward(d, yr, g, n);
            ct_relu_backward_ref(dr, yr, g, n);
            ok = ok && same_bits(d, dr, n);
            for (int64_t i = 0; i < n; i++) yr[i] = x[i] + g[i];
            ct_add_forward(y, x, g, n);
            ok = ok && same_bits(y, yr, n);
            CHECK_MSG(ok, "relu/add, n %lld at +%d floats", (long long)n, off);
            ct_gelu_forward(y, x, n);
            ct_gelu_forward_ref(yr, x, n);
            double e = worst_err(y, yr, n, 1.0);
            ct_gelu_backward(d, x, g, n);
            ct_gelu_backward_ref(dr, x, g, n);
            e = fmax(e, worst_err(d, dr, n, 1.0));
            CHECK_MSG(e <= 1e-6, "gelu, n %lld at +%d floats: error %g", (long long)n, off, e);
            // Rows: softmax, log-softmax, LayerNorm, cross-entropy over (2, C).
            ct_softmax_forward(y, x, N, C);
            ct_softmax_forward_ref(yr, x, N, C);
            e = worst_err(y, yr, n, 1e-30);
            memcpy(d, d0, (size_t)n * sizeof(float));
            memcpy(dr, d0, (size_t)n * sizeof(float));
            ct_softmax_backward(d, g, yr, N, C);
            ct_softmax_backward_ref(dr, g, yr, N, C);
            e = fmax(e, worst_err(d, dr, n, 1.0));
            ct_log_softmax_forward(y, x, N, C);
            ct_log_softmax_forward_ref(yr, x, N, C);
            e = fmax(e, worst_err(y, yr, n, 8.0));
            CHECK_MSG(e <= 1e-6, "softmax, (2, %lld) at +%d floats: error %g", (long long)C, off, e);
            float mean[2], rstd[2], mean_r[2], rstd_r[2];
            fill(w, C, 0.5f, 1.5f);
            fill(v, C, -0.5f, 0.5f);  // the bias
            ct_layernorm_forward(y, mean, rstd, x, w, v, N, C, 1e-6f);
            ct_layernorm_forward_ref(yr, mean_r, rstd_r, x, w, v, N, C, 1e-6f);
            e = fmax(worst_err(y, yr, n, 1.0), fmax(worst_err(mean, mean_r, 2, 1.0), worst_err(rstd, rstd_r, 2, 1.0)));
            for (int64_t i = 0; i < n; i++) d[i] = dr[i] = NAN;
            memset(m, 0, (size_t)C * sizeof(float)), memset(mr, 0, (size_t)C * sizeof(float));
            memset(bv, 0, (size_t)len * sizeof(float)), memset(bvr, 0, (size_t)len * sizeof(float));
            ct_layernorm_backward(d, m, v, g, x, w, mean_r, rstd_r, N, C);
            ct_layernorm_backward_ref(dr, mr, vr, g, x, w, mean_r, rstd_r, N, C);
            e = fmax(e, worst_err(d, dr, n, 1.0));
            CHECK_MSG(e <= 1e-6 && same_bits(m, mr, C) && same_bits(v, vr, C),
                      "layernorm, (2, %lld) at +%d floats: error %g", (long long)C, off, e);
            const int32_t t[2] = {0, (int32_t)C - 1};
            const float cw[2] = {1.0f, 0.5f};
            for (int k = 0; k < 2; k++) {
                float ls = k ? 0.1f : 0.0f, loss, loss_r;
                ct_category_cross_entropy_forward(&loss, y, x, t, cw, 1.5, ls, N, C);
                ct_category_cross_entropy_forward_ref(&loss_r, yr, x, t, cw, 1.5, ls, N, C);
                memcpy(d, d0, (size_t)n * sizeof(float));
                memcpy(dr, d0, (size_t)n * sizeof(float));
                ct_category_cross_entropy_backward(d, 0.7f, yr, t, cw, 1.5, ls, N, C);
                ct_category_cross_entropy_backward_ref(dr, 0.7f, yr, t, cw, 1.5, ls, N, C);
                e = fmax(worst_err(&loss, &loss_r, 1, 1.0), worst_err(d, dr, n, 1.0));
                CHECK_MSG(e <= 1e-6, "cross-entropy, (2, %lld) at +%d floats, s %g: error %g", (long long)C, off,
                          (double)ls, e);
            }
            // Adam and Adafactor's unfactored apply: bitwise.
            fill(w, n, -1.0f, 1.0f);
            fill(m, n, -0.1f, 0.1f);
            fill(v, n, 0.0f, 0.01f);
            memcpy(wr, w, (size_t)n * sizeof(float)), memcpy(mr, m, (size_t)n * sizeof(float));
            memcpy(vr, v, (size_t)n * sizeof(float));
            ct_adam_update(w, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-5f, 1e-4f, 0.1f, 0.001f);
            ct_adam_update_ref(wr, g, mr, vr, n, 1e-3f, 0.9f, 0.999f, 1e-5f, 1e-4f, 0.1f, 0.001f);
            ok = same_bits(w, wr, n) && same_bits(m, mr, n) && same_bits(v, vr, n);
            ct_adafactor_apply(w, m, g, v, n, 1e-3f, 1.1f, 1e-2f, 0.9f, 1e-4f);
            ct_adafactor_apply_ref(wr, mr, g, v, n, 1e-3f, 1.1f, 1e-2f, 0.9f, 1e-4f);
            ok = ok && same_bits(w, wr, n) && same_bits(m, mr, n);
            CHECK_MSG(ok, "adam/adafactor, n %lld at +%d floats", (long long)n, off);
            free(bx), free(bg), free(bd0), free(by), free(byr), free(bd), free(bdr), free(bw), free(bwr);
            free(bm), free(bmr), free(bv), free(bvr);
        }
}

// Dropout keeps element i iff bits_i / 2^32 >= rate: for integer bits,
// bits >= ceil(rate * 2^32). Rates of 2^-9 and up times 2^32 are integers
// in float; below, the rounding shows: 1e-6f * 2^32 = 4294.967..., so
// bits 4294 is dropped and 4295 kept (by hand from 1e-6f = 0x1.0c6f7ap-20).
static void test_dropout_threshold(void) {
    CHECK(ct_dropout_threshold(0.0f) == 0 && ct_dropout_threshold(1.0f) == (uint64_t)1 << 32);
    CHECK(ct_dropout_threshold(0.5f) == (uint64_t)1 << 31);
    CHECK_MSG(ct_dropout_threshold(1e-6f) == 4295, "threshold of 1e-6: %llu",
              (unsigned long long)ct_dropout_threshold(1e-6f));
    // At the threshold itself: the element whose bits equal it is kept, in
    // forward and backward (past the first 256-counter chunk).
    enum { N = 300 };
    ct_key key = ct_key_from_seed(5);
    uint64_t thr = ct_random_bits(key, 260);
    float x[N], y[N], d[N], want[N], want_d[N];
    fill(x, N, -1.0f, 1.0f);
    for (int i = 0; i < N; i++) {
        bool keep = ct_random_bits(key, (uint32_t)i) >= thr;
        want[i] = keep ? x[i] * 2.0f : 0.0f;
        want_d[i] = keep ? 1.0f + x[i] * 2.0f : 1.0f;
        d[i] = 1.0f;
    }
    ct_dropout_forward(y, x, key, thr, 2.0f, N);
    ct_dropout_backward(d, x, key, thr, 2.0f, N);
    CHECK_MSG(y[260] == x[260] * 2.0f && same_bits(y, want, N) && same_bits(d, want_d, N),
              "dropout at bits == threshold: y %g, want %g", (double)y[260], (double)want[260]);
}

// The clone of each target_clones kernel this CPU runs: GCC's resolvers pick
// the first of avx512f, avx2 that the CPU has, else the default (SSE2).
// tests/kernel_clones_test.sh runs this program on an emulated CPU without
// AVX and looks for "default" here.
static const char *kernel_clone(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return "avx512f";
    if (__builtin_cpu_supports("avx2")) return "avx2";
#endif
    return "default";
}

int main(void) {
    printf("test_kernels: the %s clones run\n", kernel_clone());
    test_comparator();
    test_relu();
    test_vexp();
    test_softmax_edges();
    test_unaligned();
    test_dropout_threshold();
    test_add();
    test_gelu();
    test_layernorm();
    test_layernorm_large_mean();
    test_layernorm_mean_rounding();
    test_softmax();
    test_log_softmax_backward();
    test_log_softmax_large_logits();
    test_row_exp_sum();
    test_cross_entropy();
    test_cross_entropy_edges();
    test_backward_adds();
    test_embedding_backward();
    test_adam();
    test_sum_squares();
    test_lanes_sum();
    test_sum_squares_groups();
    test_matmul();
    test_sgemm_reference();
    test_adafactor();
    test_sm3_zero_accumulator();
    test_shared_key_backward();
    test_thread_count();
    test_gemm_thread_count();
    test_weight_grad();
    return check_summary("test_kernels");
}
