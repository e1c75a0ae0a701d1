// Adasum (Maleki et al., 2020) over k vectors in a fixed pairwise tree.
#include <math.h>

#include "ctrax/dist/comm.h"

// a <- (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b, one tensor at a time.
static void combine_pair(float *a, const float *b, const ct_range *ranges, int n_ranges) {
    for (int t = 0; t < n_ranges; t++) {
        float *x = a + ranges[t].offset;
        const float *y = b + ranges[t].offset;
        size_t n = ranges[t].length;
        double dot = 0, aa = 0, bb = 0;
        for (size_t i = 0; i < n; i++) {
            dot += (double)x[i] * y[i];
            aa += (double)x[i] * x[i];
            bb += (double)y[i] * y[i];
        }
        // A zero vector carries no direction: the other passes unchanged.
        double ca = aa > 0 ? 1.0 - dot / (2.0 * aa) : 0.0;
        double cb = bb > 0 ? 1.0 - dot / (2.0 * bb) : 0.0;
        if (aa == 0) cb = 1.0;
        if (bb == 0) ca = 1.0;
        for (size_t i = 0; i < n; i++) x[i] = (float)(ca * x[i] + cb * y[i]);
    }
}

void ct_adasum(float **vecs, int k, const ct_range *ranges, int n_ranges) {
    // Level by level: at stride s, vector i (a multiple of 2s) absorbs i + s.
    for (int stride = 1; stride < k; stride *= 2)
        for (int i = 0; i + stride < k; i += 2 * stride) combine_pair(vecs[i], vecs[i + stride], ranges, n_ranges);
}
