// Adasum (Maleki et al., 2020) over k vectors in a fixed pairwise tree.
#include <math.h>
#include <string.h>

#include "ctrax/core/memory.h"
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

ct_status ct_adasum_devices(ct_comm *comm, float *const *local, int n_local, size_t n, const ct_range *ranges,
                            int n_ranges, float *gather, float *out, ct_error *err) {
    int n_proc = ct_comm_size(comm), n_global = n_proc * n_local;
    // No allocation per call for up to 64 devices (a step allocates nothing).
    float *vecs_stack[64];
    float **vecs = n_global <= 64 ? vecs_stack : ct_malloc((size_t)n_global * sizeof *vecs);
    ct_status st = CT_OK;
    if (n_proc == 1) {
        for (int d = 0; d < n_local; d++) vecs[d] = local[d];
    } else {
        // Block d of gather is (n_proc, n): local device d of every process.
        for (int d = 0; d < n_local && st == CT_OK; d++)
            st = ct_comm_allgather_f32(comm, local[d], gather + (size_t)d * n_proc * n, n, err);
        for (int p = 0; p < n_proc; p++)
            for (int d = 0; d < n_local; d++) vecs[p * n_local + d] = gather + ((size_t)d * n_proc + p) * n;
    }
    if (st == CT_OK) {
        ct_adasum(vecs, n_global, ranges, n_ranges);
        if (vecs[0] != out) memcpy(out, vecs[0], n * sizeof(float));
    }
    if (vecs != vecs_stack) ct_free(vecs);
    return st;
}
