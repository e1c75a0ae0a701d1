// bench/gemm_backends (issue 13, item 1): the measurement behind ctrax's GEMM
// backend. For the dense shapes of a TransformerLM step (2048 token rows,
// d_model D, d_ff 4 D: the forward product, the input gradient and the
// weight gradient of the attention projections and of both feed-forward
// layers), it times OpenBLAS (ct_sgemm, ctrax's one call into BLAS) and
// oneDNN's dnnl_sgemm, alternating the two shape by shape so both see the
// same load, and reports GFLOP/s over the step's mix (each shape weighted by
// how often a layer runs it). Then, for each backend and shape, whether the
// product has the same bits at every thread count from 1 to the current one
// -- what ctrax needs, since its thread count follows the cores other
// processes leave free (ct_blas_threads_fit) and a run must stay exactly
// reproducible.
//
//   build/bench_gemm_backends [--d-model 256] [--rounds 6]
//
// Built when oneDNN's headers are installed (Debian: libdnnl-dev, in `make
// bench-deps`). Set OPENBLAS_CORETYPE to the vector kernel `ctrax info
// --system` names (bench/lm_speed.sh does) and OMP_NUM_THREADS to the
// thread count: both libraries read it.
#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "ctrax/core/blas.h"
#include "../src/kernels/cpu/matmul.h"  // ct_sgemm

enum { BACKEND_OPENBLAS, BACKEND_ONEDNN, N_BACKENDS };
static const char *const k_backend_names[N_BACKENDS] = {"openblas", "onednn"};

// C (M, N) = op(A) op(B), row-major; op transposes when trans_*.
typedef struct gemm_shape {
    const char *what;
    bool trans_a, trans_b;
    int64_t M, N, K;
    int per_layer;  // how many times one layer runs it per step
} gemm_shape;

static void run_gemm(int backend, const gemm_shape *s, const float *A, const float *B, float *C) {
    int64_t lda = s->trans_a ? s->M : s->K, ldb = s->trans_b ? s->K : s->N;
    if (backend == BACKEND_OPENBLAS)
        ct_sgemm(s->trans_a, s->trans_b, s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
    else
        dnnl_sgemm(s->trans_a ? 'T' : 'N', s->trans_b ? 'T' : 'N', s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C,
                   s->N);
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--d-model D, 16..4096] [--rounds R, 1..100]\n", argv0);
    return 2;
}

int main(int argc, char **argv) {
    int64_t D = 256;
    int rounds = 6;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (!strcmp(argv[i], "--d-model") && i + 1 < argc) {
            D = strtoll(argv[++i], &end, 10);
            if (*end || D < 16 || D > 4096) return usage(argv[0]);
        } else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) {
            rounds = (int)strtol(argv[++i], &end, 10);
            if (*end || rounds < 1 || rounds > 100) return usage(argv[0]);
        } else {
            return usage(argv[0]);
        }
    }
    const int64_t T = 2048, F = 4 * D;
    const gemm_shape shapes[] = {
        {"attention projection forward", false, false, T, D, D, 4},
        {"attention projection input gradient", false, true, T, D, D, 4},
        {"attention projection weight gradient", true, false, D, D, T, 4},
        {"feed-forward in forward", false, false, T, F, D, 1},
        {"feed-forward in input gradient", false, true, T, D, F, 1},
        {"feed-forward in weight gradient", true, false, D, F, T, 1},
        {"feed-forward out forward", false, false, T, D, F, 1},
        {"feed-forward out input gradient", false, true, T, F, D, 1},
        {"feed-forward out weight gradient", true, false, F, D, T, 1},
    };
    enum { N_SHAPES = sizeof shapes / sizeof *shapes };
    size_t n_floats = (size_t)((T > D ? T : D) * F);  // the largest operand: (T, F) or (D, F)
    float *A = malloc(n_floats * sizeof(float)), *B = malloc(n_floats * sizeof(float));
    float *C = malloc(n_floats * sizeof(float)), *C1 = malloc(n_floats * sizeof(float));
    if (!A || !B || !C || !C1) {
        fprintf(stderr, "bench_gemm_backends: cannot allocate 4 x %zu floats\n", n_floats);
        return 1;
    }
    uint32_t x = 12345;  // operands in [-0.5, 0.5): a fixed LCG, so every run multiplies the same numbers
    for (size_t i = 0; i < n_floats; i++) {
        x = x * 1664525u + 1013904223u;
        A[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
        x = x * 1664525u + 1013904223u;
        B[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
    }
    const int threads = ct_blas_threads();

    // Speed: per round and shape, each backend for about 0.1 s of products
    // (after one untimed call), the backend that goes first swapping every
    // round.
    double secs[N_BACKENDS][N_SHAPES] = {{0}}, flops[N_BACKENDS][N_SHAPES] = {{0}};
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < N_SHAPES; s++) {
            const gemm_shape *sh = &shapes[s];
            double flop = 2.0 * (double)sh->M * (double)sh->N * (double)sh->K;
            int reps = 1 + (int)(2e10 / flop);  // ~0.1 s at 200 GFLOP/s
            for (int j = 0; j < N_BACKENDS; j++) {
                int b = (j + r) % N_BACKENDS;
                run_gemm(b, sh, A, B, C);
                double t0 = bench_clock_s(CLOCK_MONOTONIC);
                for (int i = 0; i < reps; i++) run_gemm(b, sh, A, B, C);
                secs[b][s] += bench_clock_s(CLOCK_MONOTONIC) - t0;
                flops[b][s] += flop * reps;
            }
        }
    }

    // Bits: each backend's product at 1 thread against 2..threads.
    bool same_bits[N_BACKENDS][N_SHAPES];
    for (int b = 0; b < N_BACKENDS; b++) {
        for (int s = 0; s < N_SHAPES; s++) {
            const gemm_shape *sh = &shapes[s];
            size_t bytes = (size_t)(sh->M * sh->N) * sizeof(float);
            ct_blas_set_threads(1);
            run_gemm(b, sh, A, B, C1);
            same_bits[b][s] = true;
            for (int t = 2; t <= threads; t++) {
                ct_blas_set_threads(t);
                run_gemm(b, sh, A, B, C);
                if (memcmp(C, C1, bytes)) same_bits[b][s] = false;
            }
        }
    }
    ct_blas_set_threads(threads);

    // The step's mix: a layer's seconds in these products (each shape's
    // seconds per call times its calls per layer) over its FLOPs.
    double rate[N_BACKENDS][N_SHAPES], mix_gflops[N_BACKENDS];
    for (int b = 0; b < N_BACKENDS; b++) {
        double mix_s = 0.0, mix_flop = 0.0;
        for (int s = 0; s < N_SHAPES; s++) {
            const gemm_shape *sh = &shapes[s];
            double flop = 2.0 * (double)sh->M * (double)sh->N * (double)sh->K;
            rate[b][s] = flops[b][s] / secs[b][s] / 1e9;
            mix_s += sh->per_layer * flop / (rate[b][s] * 1e9);
            mix_flop += sh->per_layer * flop;
        }
        mix_gflops[b] = mix_flop / mix_s / 1e9;
    }

    // A table, then all of it again as one JSON line (the last line).
    printf("%d threads, OpenBLAS kernel %s, d_model %lld, %lld rows, %d rounds\n", threads, ct_blas_core(), (long long)D,
           (long long)T, rounds);
    printf("%-38s %5s %5s %5s %2s  %16s  %16s\n", "GEMM", "M", "N", "K", "op", "OpenBLAS GFLOP/s", "oneDNN GFLOP/s");
    for (int s = 0; s < N_SHAPES; s++) {
        const gemm_shape *sh = &shapes[s];
        printf("%-38s %5lld %5lld %5lld %c%c", sh->what, (long long)sh->M, (long long)sh->N, (long long)sh->K,
               sh->trans_a ? 'T' : 'N', sh->trans_b ? 'T' : 'N');
        for (int b = 0; b < N_BACKENDS; b++) printf("  %8.1f %-7s", rate[b][s], same_bits[b][s] ? "" : "(bits!)");
        printf("\n");
    }
    printf("%-55s  %8.1f          %8.1f\n", "a step's mix", mix_gflops[BACKEND_OPENBLAS], mix_gflops[BACKEND_ONEDNN]);
    printf("(bits!): not the same bits at every thread count from 1 to %d\n", threads);

    printf("{\"bench\": \"gemm_backends\", \"threads\": %d, \"blas_core\": \"%s\", \"d_model\": %lld, \"rows\": %lld, "
           "\"rounds\": %d, \"shapes\": [",
           threads, ct_blas_core(), (long long)D, (long long)T, rounds);
    for (int s = 0; s < N_SHAPES; s++) {
        const gemm_shape *sh = &shapes[s];
        printf("%s{\"what\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"trans_a\": %s, \"trans_b\": %s",
               s ? ", " : "", sh->what, (long long)sh->M, (long long)sh->N, (long long)sh->K,
               sh->trans_a ? "true" : "false", sh->trans_b ? "true" : "false");
        for (int b = 0; b < N_BACKENDS; b++)
            printf(", \"%s_gflops\": %.1f, \"%s_same_bits_at_any_thread_count\": %s", k_backend_names[b], rate[b][s],
                   k_backend_names[b], same_bits[b][s] ? "true" : "false");
        printf("}");
    }
    printf("]");
    for (int b = 0; b < N_BACKENDS; b++) {
        int n_same = 0;
        for (int s = 0; s < N_SHAPES; s++) n_same += same_bits[b][s];
        printf(", \"%s_step_mix_gflops\": %.1f, \"%s_shapes_same_bits\": %d", k_backend_names[b], mix_gflops[b],
               k_backend_names[b], n_same);
    }
    printf(", \"n_shapes\": %d}\n", N_SHAPES);
    free(A), free(B), free(C), free(C1);
    return 0;
}
