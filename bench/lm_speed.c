// LM speed benchmark, ctrax side (issue 13, item 4): trains ctrax's
// TransformerLM (ct_transformer_lm) with the standard trainer and Adam on a
// fixed batch of random bytes and prints one JSON line: tokens/s over the
// timed steps, model FLOPs per token, peak RSS, the BLAS kernel and the
// thread count it ran with. With --sgemm it instead measures the sgemm rate
// of the model's dense shapes through ctrax's own GEMM calls (ct_sgemm, and
// ct_matmul_weight_grad for the weight gradients), the "peak" the bench's
// MFU divides by, and after it the cores' vector FMA
// peak with the same threads. bench/lm_speed.sh runs both, alternating
// with PyTorch (bench/torch_lm_speed.py), and prints the table.
//
//   bench_lm_speed --config A|B|C [--steps 20] [--d-model D] [--layers L]
//       [--heads H] [--d-ff F] [--seq T] [--batch B]        # train: JSON line
//       [--profile]                                   # and the steps' time by layer (stderr)
//   bench_lm_speed --config A --sgemm [--seconds 1]        # sgemm: JSON line
//   bench_lm_speed --vector-core                          # see below
//   bench_lm_speed --spincount                            # CT_OMP_SPINCOUNT
//
// Configurations (issue 13): A d_model 256, 4 layers, 4 heads, d_ff 1024,
// T 128, batch 16; B d_model 512, 6 layers, 8 heads, d_ff 2048, T 256,
// batch 8; C d_model 256, 2 layers, 4 heads, d_ff 1024, T 2048, batch 2.
// Always vocabulary 256 (bytes), dropout 0 (so no dropout work on either
// side: PyTorch's model has no dropout layers), Trax's PositionalEncoding
// (a trainable table started at the sinusoids; PyTorch's too),
// max_len T, Adam (ctrax's defaults: lr 1e-4, b1 0.9, b2 0.999, eps 1e-5,
// weight decay 1e-5), WeightedCategoryCrossEntropy with every weight 1.
//
// Threads and the BLAS kernel come from the environment, set by
// bench/lm_speed.sh for both sides alike (the one mechanism; this program
// does not re-execute itself as `ctrax` does): OMP_NUM_THREADS governs
// ctrax's OpenMP loops and OpenBLAS (the OpenMP build), OPENBLAS_CORETYPE
// the kernel. --vector-core prints the kernel the script should export:
// ct_blas_vector_core() (the widest kernel the CPU's features run, when
// OpenBLAS runs a narrower one) or nothing when OpenBLAS already runs its
// best kernel. The JSON line names the kernel
// that ran (ct_blas_core()), so the table shows both sides ran the same.
// --spincount prints the GOMP_SPINCOUNT `ctrax` sets (CT_OMP_SPINCOUNT), so
// the script runs this side with the waits ctrax's users get; the JSON line
// records the OMP_WAIT_POLICY and GOMP_SPINCOUNT it ran with.
//
// Model FLOPs per token (the same formula in torch_lm_speed.py):
//   6 * P_dense + 6 * n_layers * T * d_model,
//   P_dense = n_layers * (4 d_model^2 + 2 d_model d_ff) + d_model * vocab
// the weights of the matrix products (q, k, v, output, the two
// feed-forward Denses, the output Dense; no embedding, biases or
// LayerNorm), 2 FLOPs per weight forward and 4 backward; plus causal
// attention's two T x T products (q k^T and att v), counted for the half
// of the scores a causal mask keeps: 2 products x 2 FLOPs x T/2 positions
// x d_model per token forward, times 3 with backward.
//
// Timing: step 1 is warm-up (it faults memory in); steps 2..S are timed one
// by one, wall clock and process CPU time. Peak RSS is VmHWM of this
// process, over the whole run; "memory_plan" gives the trainer's parts of
// it in bytes (ct_trainer_memory_plan: weights, gradients, optimizer slots,
// state, the step arena, and their total on the device), so the rest --
// libraries, BLAS and OpenMP buffers, the batch -- is peak_rss - device.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ctrax/core/blas.h"
#include "ctrax/ctrax.h"
#include "bench_util.h"
#include "ctrax/layers/layer_author.h"  // ct_net (the weight count)
// ctrax's one call into BLAS (not a public header): the sgemm peak is
// measured through it, so it is the GEMM ctrax's Dense layers run, whatever
// backend is behind it.
#include "../src/kernels/cpu/matmul.h"

#define MAX_STEPS 256
#define VOCAB 256

typedef struct args {
    char config;
    int d_model, layers, heads, d_ff, seq, batch, steps;
    double seconds;
    bool sgemm, vector_core, spincount, profile;
} args;

static bool set_config(char c, args *a) {
    switch (c) {
    case 'A': a->d_model = 256, a->layers = 4, a->heads = 4, a->d_ff = 1024, a->seq = 128, a->batch = 16; break;
    case 'B': a->d_model = 512, a->layers = 6, a->heads = 8, a->d_ff = 2048, a->seq = 256, a->batch = 8; break;
    case 'C': a->d_model = 256, a->layers = 2, a->heads = 4, a->d_ff = 1024, a->seq = 2048, a->batch = 2; break;
    default: return false;
    }
    a->config = c;
    return true;
}

static int parse(int argc, char **argv, args *a) {
    *a = (args){.steps = 20, .seconds = 1.0};
    set_config('A', a);
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--sgemm") == 0) {
            a->sgemm = true;
            continue;
        }
        if (strcmp(k, "--vector-core") == 0) {
            a->vector_core = true;
            continue;
        }
        if (strcmp(k, "--spincount") == 0) {
            a->spincount = true;
            continue;
        }
        if (strcmp(k, "--profile") == 0) {
            a->profile = true;
            continue;
        }
        if (!v) return -1;
        i++;
        if (strcmp(k, "--config") == 0) {
            if (strlen(v) != 1 || !set_config(v[0], a)) return -1;
        } else if (strcmp(k, "--steps") == 0) a->steps = atoi(v);
        else if (strcmp(k, "--seconds") == 0) a->seconds = atof(v);
        else if (strcmp(k, "--d-model") == 0) a->d_model = atoi(v), a->config = '-';
        else if (strcmp(k, "--layers") == 0) a->layers = atoi(v), a->config = '-';
        else if (strcmp(k, "--heads") == 0) a->heads = atoi(v), a->config = '-';
        else if (strcmp(k, "--d-ff") == 0) a->d_ff = atoi(v), a->config = '-';
        else if (strcmp(k, "--seq") == 0) a->seq = atoi(v), a->config = '-';
        else if (strcmp(k, "--batch") == 0) a->batch = atoi(v), a->config = '-';
        else return -1;
    }
    if (a->steps < 2 || a->steps > MAX_STEPS || a->d_model < 1 || a->layers < 1 || a->heads < 1 ||
        a->d_model % a->heads || a->d_ff < 1 || a->seq < 1 || a->batch < 1 || a->seconds <= 0)
        return -1;
    return 0;
}

// Peak resident set size (VmHWM) in bytes.
static size_t peak_rss(void) {
    size_t now, peak;
    bench_rss(&now, &peak);
    return peak;
}

// The header's formula; torch_lm_speed.py's flops_per_token is the same.
static double flops_per_token(const args *a) {
    double d = a->d_model, p_dense = a->layers * (4 * d * d + 2 * d * a->d_ff) + d * VOCAB;
    return 6 * p_dense + 6.0 * a->layers * a->seq * d;
}

// ---- the FMA peak: what the cores' vector units can do at all -------------------

// Twelve independent chains of fused multiply-adds, each x = x * m + a: more
// chains than an FMA's latency times the FMAs a core starts per cycle (4 x 2
// on current x86 cores), so the pipes never wait. Returns the FLOPs done
// (2 per lane per FMA); the sum of the chains goes to *sink so the compiler
// keeps them. One function per vector width, chosen by the CPU's features:
// AVX-512 cores with two 512-bit FMA units do twice the 256-bit rate.
#define FMA_CHAINS(X, ...)                                                                                  \
    X(0, __VA_ARGS__) X(1, __VA_ARGS__) X(2, __VA_ARGS__) X(3, __VA_ARGS__) X(4, __VA_ARGS__) X(5, __VA_ARGS__) \
    X(6, __VA_ARGS__) X(7, __VA_ARGS__) X(8, __VA_ARGS__) X(9, __VA_ARGS__) X(10, __VA_ARGS__) X(11, __VA_ARGS__)
#define FMA_INIT(i, vec, set1) vec x##i = set1((float)(i));
#define FMA_STEP(i, fmadd) x##i = fmadd(x##i, m, add);
#define FMA_SUM(i, storeu) storeu(lanes, x##i), s += lanes[0];
// The chain function for one vector type: n_lanes floats a vector; set1,
// fmadd and storeu its intrinsics; isa the target that has them.
#define FMA_CHAIN_FN(name, isa, vec, n_lanes, set1, fmadd, storeu)                                                     \
    __attribute__((target(isa))) static double name(long iters, float *sink) {                                         \
        vec m = set1(0.999f), add = set1(1e-3f);                                                                       \
        FMA_CHAINS(FMA_INIT, vec, set1)                                                                                \
        for (long k = 0; k < iters; k++) {                                                                             \
            FMA_CHAINS(FMA_STEP, fmadd)                                                                                \
        }                                                                                                              \
        float lanes[n_lanes], s = 0;                                                                                   \
        FMA_CHAINS(FMA_SUM, storeu)                                                                                    \
        *sink = s;                                                                                                     \
        return 12.0 * n_lanes * 2 * (double)iters;                                                                     \
    }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
FMA_CHAIN_FN(fma_chains_512, "avx512f", __m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps)
FMA_CHAIN_FN(fma_chains_256, "avx2,fma", __m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps)

// The widest of the two this CPU runs, or NULL (no AVX2 with FMA).
static double (*fma_chains(void))(long, float *) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return fma_chains_512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return fma_chains_256;
    return NULL;
}
#else
static double (*fma_chains(void))(long, float *) { return NULL; }
#endif

static volatile float g_fma_sink;

// Every thread runs the chains for about `seconds`; FLOPs per wall second of
// all threads together, or -1 where the CPU has no vector FMA this knows.
static double fma_peak_flops(double seconds) {
    double (*chains)(long, float *) = fma_chains();
    if (!chains) return -1.0;
    double flops = 0, t0 = bench_clock_s(CLOCK_MONOTONIC);
    float sums = 0;
#pragma omp parallel reduction(+ : flops, sums)
    {
        float sink;
        do flops += chains(1L << 20, &sink), sums += sink;  // about 2-4 ms a call
        while (bench_clock_s(CLOCK_MONOTONIC) - t0 < seconds);
    }
    g_fma_sink = sums;  // the chains' results are used: not dead code
    return flops / (bench_clock_s(CLOCK_MONOTONIC) - t0);
}

// ---- sgemm: the model's dense products through ct_sgemm ----------------------

// One Dense of the model, inp (M, C) @ weight (C, OC), and how many the model
// has (per step).
typedef struct dense_shape {
    int64_t c, oc;
    int count;
} dense_shape;

// Measures each Dense shape's three products (forward out = inp W; backward
// dinp += dout W^T and dW += inp^T dout, as ct_matmul_backward: the
// weight gradient through ct_matmul_weight_grad's cut) round robin
// until `seconds` have passed, then combines them as the model's step
// would: rate = sum of FLOPs / sum of times, each shape weighted by its
// count; by wall clock and by process CPU time. Prints one JSON line.
static int run_sgemm(const args *a) {
    const int64_t m = (int64_t)a->batch * a->seq, d = a->d_model, f = a->d_ff;
    const dense_shape shapes[] = {{d, d, 4 * a->layers}, {d, f, a->layers}, {f, d, a->layers}, {d, VOCAB, 1}};
    enum { N_SHAPES = sizeof shapes / sizeof shapes[0], N_KINDS = 3 };
    const char *kind_name[N_KINDS] = {"fwd", "dinp", "dweight"};
    int64_t big = f > d ? f : d;
    if (big < VOCAB) big = VOCAB;
    // x: inp (M, C); y: out and dout (M, OC); z: dinp (M, C); w: weight and
    // g: dweight (C, OC). x and w never change, so the accumulating products
    // grow linearly (never to inf) however long the loop runs.
    float *x = malloc((size_t)(m * big) * sizeof *x), *y = malloc((size_t)(m * big) * sizeof *y);
    float *z = calloc((size_t)(m * big), sizeof *z);
    float *w = malloc((size_t)(big * big) * sizeof *w), *g = calloc((size_t)(big * big), sizeof *g);
    int64_t scratch_floats = 1;
    for (int s = 0; s < N_SHAPES; s++) {
        int64_t n = ct_matmul_weight_grad_scratch_floats(m, shapes[s].c, shapes[s].oc);
        if (n > scratch_floats) scratch_floats = n;
    }
    float *scratch = malloc((size_t)scratch_floats * sizeof *scratch);
    if (!x || !y || !z || !w || !g || !scratch) {
        fprintf(stderr, "lm_speed --sgemm: out of memory for M %lld, K/N %lld\n", (long long)m, (long long)big);
        return 1;
    }
    for (int64_t i = 0; i < m * big; i++) x[i] = (float)(i % 7) * 0.01f;
    for (int64_t i = 0; i < big * big; i++) w[i] = (float)(i % 5) * 0.01f;

    double secs[N_SHAPES][N_KINDS] = {{0}}, cpu_secs[N_SHAPES][N_KINDS] = {{0}};
    long reps[N_SHAPES][N_KINDS] = {{0}};
    double t_start = bench_clock_s(CLOCK_MONOTONIC);
    for (int round = 0;; round++) {
        for (int s = 0; s < N_SHAPES; s++)
            for (int k = 0; k < N_KINDS; k++) {
                int64_t c = shapes[s].c, oc = shapes[s].oc;
                double t0 = bench_clock_s(CLOCK_MONOTONIC), c0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
                if (k == 0) ct_sgemm(false, false, m, oc, c, 1.0f, x, c, w, oc, 0.0f, y, oc);
                else if (k == 1) ct_sgemm(false, true, m, c, oc, 1.0f, y, oc, w, oc, 1.0f, z, c);
                else ct_matmul_weight_grad(g, NULL, scratch, x, y, m, c, oc);
                double dt = bench_clock_s(CLOCK_MONOTONIC) - t0, dc = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
                if (round == 0) continue;  // warm-up: thread start, page faults
                secs[s][k] += dt;
                cpu_secs[s][k] += dc;
                reps[s][k]++;
            }
        if (round > 0 && bench_clock_s(CLOCK_MONOTONIC) - t_start >= a->seconds) break;
    }
    double model_flops = 0, model_secs = 0, model_cpu_secs = 0, best = 0;
    printf("{\"impl\": \"sgemm\", \"config\": \"%c\", \"threads\": %d, \"blas_core\": \"%s\", \"m\": %lld, "
           "\"shapes\": [",
           a->config, omp_get_max_threads(), ct_blas_core(), (long long)m);
    for (int s = 0; s < N_SHAPES; s++)
        for (int k = 0; k < N_KINDS; k++) {
            double flops = 2.0 * (double)m * (double)shapes[s].c * (double)shapes[s].oc;
            double per_call = secs[s][k] / (double)reps[s][k], rate = flops / per_call;
            model_flops += shapes[s].count * flops;
            model_secs += shapes[s].count * per_call;
            model_cpu_secs += shapes[s].count * cpu_secs[s][k] / (double)reps[s][k];
            if (rate > best) best = rate;
            printf("%s{\"k\": %lld, \"n\": %lld, \"kind\": \"%s\", \"gflops\": %.1f}", s + k ? ", " : "",
                   (long long)shapes[s].c, (long long)shapes[s].oc, kind_name[k], rate * 1e-9);
        }
    // gflops_cpu: per second of process CPU time (all threads' together),
    // what the MFU by CPU time divides by: on a machine shared with other
    // jobs it does not count the time the process waited for a core.
    // fma_gflops: the cores' vector FMA peak with the same threads, right
    // after (the sgemm rate's own ceiling; -1 where unknown).
    double fma = fma_peak_flops(0.3);
    printf("], \"gflops\": %.1f, \"gflops_cpu\": %.1f, \"best_gflops\": %.1f, \"fma_gflops\": %.1f, "
           "\"seconds\": %.2f}\n",
           model_flops / model_secs * 1e-9, model_flops / model_cpu_secs * 1e-9, best * 1e-9,
           fma < 0 ? -1.0 : fma * 1e-9, bench_clock_s(CLOCK_MONOTONIC) - t_start);
    free(x);
    free(y);
    free(z);
    free(w);
    free(g);
    free(scratch);
    return 0;
}

// ---- training -----------------------------------------------------------------

// How OpenMP's idle threads wait in this process, as the environment set it:
// "OMP_WAIT_POLICY=... GOMP_SPINCOUNT=...", "-" for an unset one.
static const char *wait_env(void) {
    static char buf[160];
    const char *p = getenv("OMP_WAIT_POLICY"), *s = getenv("GOMP_SPINCOUNT");
    snprintf(buf, sizeof buf, "OMP_WAIT_POLICY=%.40s GOMP_SPINCOUNT=%.40s", p ? p : "-", s ? s : "-");
    return buf;
}

static int run_train(const args *a) {
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = VOCAB;
    p.d_model = a->d_model;
    p.d_ff = a->d_ff;
    p.n_layers = a->layers;
    p.n_heads = a->heads;
    p.max_len = a->seq;
    p.dropout = 0.0f;
    ct_layer *model = ct_transformer_lm(p), *loss = ct_weighted_category_cross_entropy();

    // Random bytes as inputs and targets (ShiftRight makes it next-token
    // prediction); every position weighted. Speed does not depend on them.
    size_t n = (size_t)a->batch * (size_t)a->seq;
    int32_t *tokens = malloc(n * sizeof *tokens);
    float *weights = malloc(n * sizeof *weights);
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(ct_random_bits(ct_key_from_seed(1), (uint32_t)i) % VOCAB);
        weights[i] = 1.0f;
    }
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, a->batch, a->seq, tokens),
                          ct_tensor_2d(CT_DTYPE_I32, a->batch, a->seq, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, a->batch, a->seq, weights)};
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_trainer *t = NULL;
    int rc = 1;
    double wall[MAX_STEPS], cpu[MAX_STEPS];
    float loss_first = 0, loss_last = 0;
    // --profile: where the steps' time goes, by layer (stderr, after the JSON line).
    ct_trainer_options o = ct_trainer_default_options();
    o.profile = a->profile ? ct_profile_new() : NULL;
    if (ct_trainer_new(&t, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(1), &dev,
                       &o, &err) != CT_OK) {
        fprintf(stderr, "lm_speed config %c: init: %s: %s\n", a->config, ct_status_name(err.code), err.msg);
        goto done;
    }
    for (int step = 1; step <= a->steps; step++) {
        ct_step_stats stats;
        ct_key key = ct_key_fold_in(ct_key_from_seed(2), (uint32_t)step);
        double w0 = bench_clock_s(CLOCK_MONOTONIC), c0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
        if (ct_trainer_one_step(t, batch, key, step, 1e-4f, &stats, &err) != CT_OK) {
            fprintf(stderr, "lm_speed config %c: step %d: %s: %s\n", a->config, step, ct_status_name(err.code),
                    err.msg);
            goto done;
        }
        wall[step - 1] = bench_clock_s(CLOCK_MONOTONIC) - w0;
        cpu[step - 1] = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (step == 1) loss_first = stats.loss;
        loss_last = stats.loss;
    }
    printf("{\"impl\": \"ctrax\", \"config\": \"%c\", \"threads\": %d, \"blas_core\": \"%s\", \"wait\": \"%s\", "
           "\"d_model\": %d, \"layers\": %d, \"heads\": %d, \"d_ff\": %d, \"seq\": %d, \"batch\": %d, \"n_weights\": %zu, "
           "\"flops_per_token\": %.0f, \"steps\": %d, \"wall_s\": [",
           a->config, omp_get_max_threads(), ct_blas_core(), wait_env(), a->d_model, a->layers, a->heads, a->d_ff, a->seq,
           a->batch, ct_trainer_net(t)->n_weights, flops_per_token(a), a->steps);
    // Step 1 is warm-up: left out of the lists.
    for (int i = 1; i < a->steps; i++) printf("%s%.4f", i > 1 ? ", " : "", wall[i]);
    printf("], \"cpu_s\": [");
    for (int i = 1; i < a->steps; i++) printf("%s%.4f", i > 1 ? ", " : "", cpu[i]);
    const ct_memory_plan *plan = ct_trainer_memory_plan(t);
    printf("], \"step1_s\": %.3f, \"peak_rss\": %zu, \"memory_plan\": {\"weights\": %zu, \"grads\": %zu, "
           "\"slots\": %zu, \"state\": %zu, \"activations\": %zu, \"device\": %zu}, \"loss_first\": %.4f, "
           "\"loss_last\": %.4f}\n",
           wall[0], peak_rss(), plan->weights, plan->grads, plan->slots, plan->state, plan->activations,
           plan->device_bytes, loss_first, loss_last);
    rc = 0;
    if (o.profile) ct_profile_print(o.profile, stderr);
done:
    ct_profile_free(o.profile);
    ct_trainer_free(t);
    ct_layer_free(model);
    ct_layer_free(loss);
    free(tokens);
    free(weights);
    return rc;
}

int main(int argc, char **argv) {
    args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr,
                "usage: %s [--config A|B|C] [--steps S, 2..%d] [--d-model D] [--layers L] [--heads H] [--d-ff F] "
                "[--seq T] [--batch B] [--profile] [--sgemm [--seconds S]] [--vector-core]\n",
                argv[0], MAX_STEPS);
        return 2;
    }
    if (a.spincount) {
        printf("%s\n", CT_OMP_SPINCOUNT);
        return 0;
    }
    if (a.vector_core) {
        const char *core = ct_blas_vector_core();
        if (core) printf("%s\n", core);
        return 0;
    }
    ct_log_set_level(CT_LOG_WARN);
    return a.sgemm ? run_sgemm(&a) : run_train(&a);
}
