// Float math written as straight-line code the compiler vectorizes (libm's
// expf and tanhf are calls, one element at a time). Inline, for loops under
// `#pragma omp simd` in functions compiled per vector width
// (target_clones).
#ifndef CTRAX_KERNELS_CPU_VMATH_H
#define CTRAX_KERNELS_CPU_VMATH_H

#include <math.h>
#include <stdint.h>

// exp(x) for x <= 0, Cephes' expf: n = round(x / ln 2) (by the 1.5 * 2^23
// trick, no rounding call), r = x - n ln 2 with ln 2 in two parts, a
// degree-6 polynomial in r, and 2^n put into the exponent bits. Within 2
// ulp of expf down to -87; below, 0 (expf's results there are denormals or
// 0). NaN gives NaN.
static inline float ct_vexp_nonpos(float x) {
    float x_in = x;
    x = x >= -87.0f ? x : -87.0f;  // keeps 2^n a normal float (and n finite for a NaN)
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = (int32_t)((uint32_t)((int32_t)n + 127) << 23)};
    return x_in >= -87.0f ? p * scale.f : x_in < -87.0f ? 0.0f : x_in;  // the last: NaN
}

// max of x[0 .. n) (-inf for n == 0; NaNs are skipped, as fmaxf does):
// exact in any order, so it is the same bits for every vector width. Eight
// running maxima, a shape GCC and clang both vectorize (neither accepts a
// `simd` max reduction of floats that may be NaN: clang fails the pragma).
static inline float ct_vmax(const float *x, int64_t n) {
    float m8[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m8[j] = x[i + j] > m8[j] ? x[i + j] : m8[j];
    float m = -INFINITY;
    for (int j = 0; j < 8; j++) m = m8[j] > m ? m8[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

// Sums over a row in CT_LANES running sums: element i goes to lane i % 8,
// and the lanes are added 0 to 7 at the end. The order is the C code's, so
// the result is the same bits whatever the vectorizer does (an `omp simd`
// reduction's order changes with the vector width and with the peeling
// that aligns the row, so a row at another address could sum differently),
// and the lanes' independent adds still vectorize.
#define CT_LANES 8

static inline double ct_lanes_total(const double lane[CT_LANES]) {
    double s = 0.0;
    for (int j = 0; j < CT_LANES; j++) s += lane[j];
    return s;
}

// a . b over n floats, in double, in CT_LANES lanes: the same bits at any
// vector width or address. Inline, so a caller compiled for wider vectors
// (target_clones) gets them here too.
static inline double ct_lanes_dot(const float *a, const float *b, int64_t n) {
    double lane[CT_LANES] = {0};
    int64_t i0 = 0;  // whole groups of CT_LANES (a constant count vectorizes), then the rest
    for (; i0 + CT_LANES <= n; i0 += CT_LANES) {
        const int nj = CT_LANES;
#pragma omp simd
        for (int j = 0; j < nj; j++) lane[j] += (double)a[i0 + j] * b[i0 + j];
    }
    {
        const int nj = (int)(n - i0);
        for (int j = 0; j < nj; j++) lane[j] += (double)a[i0 + j] * b[i0 + j];
    }
    return ct_lanes_total(lane);
}

// lane[i % CT_LANES] += x[i] for i in [0, n): a row summed a piece at a
// time, each piece starting at a multiple of CT_LANES, gives the bits of
// one ct_lanes_sum over the whole row.
static inline void ct_lanes_add(double lane[CT_LANES], const float *x, int64_t n) {
    int64_t i0 = 0;  // whole groups of CT_LANES (a constant count vectorizes), then the rest
    for (; i0 + CT_LANES <= n; i0 += CT_LANES) {
        const int nj = CT_LANES;
#pragma omp simd
        for (int j = 0; j < nj; j++) lane[j] += x[i0 + j];
    }
    const int nj = (int)(n - i0);
    for (int j = 0; j < nj; j++) lane[j] += x[i0 + j];
}

// The sum of x[0 .. n), in double, in CT_LANES lanes: as ct_lanes_dot.
// A file that wants it at the widest vectors wraps it in its own
// target_clones function with a name no other file uses (attention.c's
// row_sum, loss.c's lanes_row_sum): GCC resolves clones only for calls from
// the defining file, and clang 14 makes even a static function's resolver a
// global symbol, so one wrapper here, static inline, fails to link twice.
static inline double ct_lanes_sum(const float *x, int64_t n) {
    double lane[CT_LANES] = {0};
    ct_lanes_add(lane, x, n);
    return ct_lanes_total(lane);
}

// Put before a loop that calls sqrtf, in place of `#pragma omp simd`: the
// pragma only where sqrtf cannot set errno (built with -fno-math-errno,
// which defines __NO_MATH_ERRNO__). With errno, GCC leaves such a loop
// scalar anyway and clang fails the pragma (-Wpass-failed, an error under
// -Werror).
#ifdef __NO_MATH_ERRNO__
#define CT_SIMD_SQRT _Pragma("omp simd")
#else
#define CT_SIMD_SQRT
#endif

// Elementwise loops over n that take threads: chunks of this many elements,
// each a vector loop.
#define CT_VCHUNK 4096

#endif
