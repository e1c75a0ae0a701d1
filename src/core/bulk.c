#include "core/bulk.h"

#include <omp.h>
#include <stdint.h>
#include <string.h>

// Below this many bytes a buffer is one call on the calling thread: waking
// the others costs a few microseconds, about what one core takes for it.
#define CT_BULK_PARALLEL_MIN ((size_t)256 << 10)

// Part k of n parts of [0, len): multiples of 64 bytes but the last, so
// that no two threads write one cache line where the buffer is aligned (the
// arena's are).
static void part(size_t len, int k, int n, size_t *lo, size_t *hi) {
    size_t lines = (len + 63) / 64;
    *lo = lines * (size_t)k / (size_t)n * 64;
    *hi = k + 1 == n ? len : lines * (size_t)(k + 1) / (size_t)n * 64;
    if (*lo > len) *lo = len;
    if (*hi > len) *hi = len;
}

// How many parts: the threads of a region started here, but none under
// half the threshold (many cores would each get a sliver), and 1 inside
// another region (nested regions are not active, so the caller's thread
// does it all).
static int parts_for(size_t n) {
    if (n < CT_BULK_PARALLEL_MIN || omp_in_parallel()) return 1;
    size_t t = (size_t)omp_get_max_threads(), by_size = n / (CT_BULK_PARALLEL_MIN / 2);
    if (t > by_size) t = by_size;
    return t < 1 ? 1 : (int)t;
}

void ct_bulk_zero(void *p, size_t n) {
    int parts = parts_for(n);
    if (parts == 1) {
        memset(p, 0, n);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int k = 0; k < parts; k++) {
        size_t lo, hi;
        part(n, k, parts, &lo, &hi);
        memset((unsigned char *)p + lo, 0, hi - lo);
    }
}

void ct_bulk_copy(void *dst, const void *src, size_t n) {
    int parts = parts_for(n);
    if (parts == 1) {
        memcpy(dst, src, n);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(parts)
    for (int k = 0; k < parts; k++) {
        size_t lo, hi;
        part(n, k, parts, &lo, &hi);
        memcpy((unsigned char *)dst + lo, (const unsigned char *)src + lo, hi - lo);
    }
}
