// Long-context benchmark (issue 12): Trax's reformer test model
// (reformer_test.py's ReformerLM at T = 65,536) trained with the
// memory-efficient trainer and Adam at several sequence lengths T; prints,
// per T, the device peak, the peak RSS and the step time, their ratios to
// the first T, and PASS/FAIL against issue 12's acceptance:
//   device peak(64K) <= 2 GiB, peak(64K) / peak(4K) <= 17,
//   step time(64K) / step time(4K) <= 20.
// bench/long_context.sh runs it next to PyTorch (torch_long_context.py).
//
//   bench_long_context [--seqs 4096,16384,65536] [--steps 4] [--layers 2]
//       [--loss-chunk N] [--limit-gib G] [--json]
//
// The model: ReformerLM vocab 256, d_model 256 (each reversible half),
// d_ff 512, d_qk = d_v = 64, 2 layers, 2 heads, dropout 0.05, max_len T,
// attention [SelfAttention(chunk_len 64, n_chunks_before 1),
// LSHSelfAttention(chunk_len 64, n_buckets [32, 32], n_hashes 1)], Relu,
// ff_chunk_size 8192, the sinusoid table (Trax's test sets pos_axial_* but
// pos_type None); WeightedCategoryCrossEntropy on batch 1 of random bytes.
//
// Each T runs in its own forked process, so each peak RSS (VmHWM) is that
// T's alone. What is measured, over the whole process (construction with
// its planning pass included, nothing reset):
//   device peak   ct_device.peak_bytes of the trainer's device (on CPU the
//                 device is counted host memory; the weights, Adam slots
//                 and state live in the trainer's host device, not here);
//   peak RSS      VmHWM, the whole process (host slabs included);
//   step time     steps 2..S (step 1 excluded), wall clock and process CPU
//                 time: median, least and most. The machine may be shared,
//                 so the verdict uses the median CPU time (work done), with
//                 the wall-clock ratio printed beside it.
// --json prints one JSON line per T too (bench/long_context.sh reads them).
// --loss-chunk N sets ct_trainer_options.loss_chunk_size (Trax's
// train.loss_chunk_size): the final LayerNorm, Dropout, Dense and the loss run
// over chunks of N positions, so the (T, 256) logits and their gradient
// never exist whole. Default 0 (off), the configuration.
// --limit-gib sets the device's byte limit: a T that needs more fails in
// ct_trainer_new with CT_ERR_MEMORY, reported as an error for that T.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctrax/ctrax.h"
#include "bench_util.h"
#include "ctrax/layers/layer_author.h"  // ct_net (the weight count)
#include "ctrax/train/reversible_trainer.h"

#define MAX_SEQS 16
#define MAX_STEPS 64
#define MIB (1024.0 * 1024.0)

typedef struct args {
    int seqs[MAX_SEQS];
    int n_seqs;
    int steps, layers;
    long long loss_chunk;
    double limit_gib;
    bool json;
} args;

// What one T's child process sends back through its pipe (same binary, so
// the raw struct is the wire format).
typedef struct result {
    int seq, steps, n_timed;
    size_t n_weights, plan_device, device_after_init, peak_device, host_bytes;
    size_t rss_after_init, peak_rss;
    double init_s, step1_s, wall[MAX_STEPS], cpu[MAX_STEPS];
    float loss_first, loss_last;
    char error[CT_ERROR_MSG_MAX + 64];
} result;

static int parse_seqs(const char *v, args *a) {
    a->n_seqs = 0;
    for (const char *c = v; *c;) {
        char *end;
        long t = strtol(c, &end, 10);
        if (end == c || t < 1 || a->n_seqs == MAX_SEQS) return -1;
        a->seqs[a->n_seqs++] = (int)t;
        c = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return a->n_seqs > 0 ? 0 : -1;
}

static int parse(int argc, char **argv, args *a) {
    *a = (args){.steps = 4, .layers = 2};
    if (parse_seqs("4096,16384,65536", a)) return -1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--json") == 0) {
            a->json = true;
            continue;
        }
        if (!v) return -1;
        i++;
        if (strcmp(k, "--seqs") == 0) {
            if (parse_seqs(v, a)) return -1;
        } else if (strcmp(k, "--steps") == 0) a->steps = atoi(v);
        else if (strcmp(k, "--layers") == 0) a->layers = atoi(v);
        else if (strcmp(k, "--limit-gib") == 0) a->limit_gib = atof(v);
        else if (strcmp(k, "--loss-chunk") == 0) a->loss_chunk = atoll(v);
        else return -1;
    }
    // Two attention types cycle over the layers: n_layers must be even.
    if (a->steps < 2 || a->steps > MAX_STEPS || a->layers < 2 || a->layers % 2 || a->loss_chunk < 0) return -1;
    return 0;
}

// Trax's reformer_test model at sequence length T (the header comment).
static ct_reformer_lm_params model_params(int seq, int layers) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = 256;
    p.d_model = 256;
    p.d_ff = 512;
    p.d_attention_key = p.d_attention_value = 64;
    p.n_layers = layers;
    p.n_heads = 2;
    p.dropout = 0.05f;
    p.max_len = seq;
    p.ff_activation = "Relu";
    p.ff_chunk_size = 8192;
    p.pos_type = NULL;
    p.fixed_positions = true;  // the sinusoids as bench/torch_long_context.py adds them (Trax's test trains them)
    p.n_attention = 2;
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;
    p.self_attention.chunk_len = 64;
    p.self_attention.n_chunks_before = 1;
    p.attention[1] = CT_REFORMER_LSH_ATTENTION;
    p.lsh_attention.chunk_len = 64;
    p.lsh_attention.n_buckets[0] = p.lsh_attention.n_buckets[1] = 32;
    p.lsh_attention.n_hashes = 1;
    p.lsh_attention.n_chunks_before = 1;
    p.lsh_attention.n_chunks_after = 0;
    return p;
}

// Builds and trains the model at one T in this process; fills r.
static void run_one(const args *a, int seq, result *r) {
    memset(r, 0, sizeof *r);
    r->seq = seq;
    r->steps = a->steps;
    ct_reformer_lm_params p = model_params(seq, a->layers);
    ct_error err;
    if (ct_reformer_lm_check(&p, &err) != CT_OK) {
        snprintf(r->error, sizeof r->error, "model: %s", err.msg);
        return;
    }
    ct_layer *model = ct_reformer_lm(p), *loss = ct_weighted_category_cross_entropy();
    // Random bytes, batch 1, every position weighted.
    int32_t *tokens = malloc((size_t)seq * sizeof *tokens);
    float *weights = malloc((size_t)seq * sizeof *weights);
    for (int i = 0; i < seq; i++) {
        tokens[i] = (int32_t)(ct_random_bits(ct_key_from_seed(1), (uint32_t)i) % 256u);
        weights[i] = 1.0f;
    }
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, 1, seq, tokens), ct_tensor_2d(CT_DTYPE_I32, 1, seq, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, 1, seq, weights)};
    ct_device dev = ct_device_cpu();
    dev.limit_bytes = (size_t)(a->limit_gib * 1073741824.0);
    ct_trainer_options o = ct_reversible_default_options();
    o.reversible.log_every = 0;
    o.loss_chunk_size = a->loss_chunk;
    ct_trainer *t = NULL;
    double t0 = bench_clock_s(CLOCK_MONOTONIC);
    ct_status s = ct_trainer_new(&t, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()),
                                 ct_key_from_seed(1), &dev, &o, &err);
    r->init_s = bench_clock_s(CLOCK_MONOTONIC) - t0;
    if (s != CT_OK) {
        snprintf(r->error, sizeof r->error, "init: %s: %s", ct_status_name(err.code), err.msg);
        r->peak_device = dev.peak_bytes;
        goto done;
    }
    r->n_weights = ct_trainer_net(t)->n_weights;
    r->plan_device = ct_trainer_memory_plan(t)->device_bytes;
    r->host_bytes = ct_trainer_memory_plan(t)->host_bytes;
    r->device_after_init = dev.current_bytes;
    char plan[512];
    fprintf(stderr, "  ctrax T %d: %s\n", seq, ct_memory_plan_format(ct_trainer_memory_plan(t), plan, sizeof plan));
    size_t hwm;
    bench_rss(&r->rss_after_init, &hwm);
    for (int step = 1; step <= a->steps; step++) {
        ct_step_stats stats;
        ct_key key = ct_key_fold_in(ct_key_from_seed(2), (uint32_t)step);
        double w0 = bench_clock_s(CLOCK_MONOTONIC), c0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
        s = ct_trainer_one_step(t, batch, key, step, 1e-4f, &stats, &err);
        double dw = bench_clock_s(CLOCK_MONOTONIC) - w0, dc = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (s != CT_OK) {
            snprintf(r->error, sizeof r->error, "step %d: %s: %s", step, ct_status_name(err.code), err.msg);
            break;
        }
        if (step == 1) {
            r->step1_s = dw;
            r->loss_first = stats.loss;
        } else {
            r->wall[r->n_timed] = dw;
            r->cpu[r->n_timed] = dc;
            r->n_timed++;
        }
        r->loss_last = stats.loss;
        fprintf(stderr, "  ctrax T %d step %d: %.2f s (cpu %.2f s), loss %.4f, device peak %.1f MiB\n", seq, step, dw,
                dc, stats.loss, dev.peak_bytes / MIB);
    }
    r->peak_device = dev.peak_bytes;
    bench_rss(&hwm, &r->peak_rss);
done:
    ct_trainer_free(t);
    ct_layer_free(model);
    ct_layer_free(loss);
    free(tokens);
    free(weights);
}

// Forks a child that runs one T (so VmHWM is that T's alone) and reads its
// result back; a child that dies (a signal, an abort) becomes an error.
static void run_forked(const args *a, int seq, result *r) {
    memset(r, 0, sizeof *r);
    r->seq = seq;
    int fd[2];
    if (pipe(fd)) {
        snprintf(r->error, sizeof r->error, "pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(r->error, sizeof r->error, "fork: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return;
    }
    if (pid == 0) {
        close(fd[0]);
        result *mine = malloc(sizeof *mine);
        run_one(a, seq, mine);
        size_t off = 0;
        while (off < sizeof *mine) {
            ssize_t n = write(fd[1], (const char *)mine + off, sizeof *mine - off);
            if (n <= 0) _exit(1);
            off += (size_t)n;
        }
        _exit(0);
    }
    close(fd[1]);
    size_t off = 0;
    while (off < sizeof *r) {
        ssize_t n = read(fd[0], (char *)r + off, sizeof *r - off);
        if (n <= 0) break;
        off += (size_t)n;
    }
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (off < sizeof *r) {
        memset(r, 0, sizeof *r);
        r->seq = seq;
        if (WIFSIGNALED(status))
            snprintf(r->error, sizeof r->error, "the T %d process died of signal %d (%s)", seq, WTERMSIG(status),
                     WTERMSIG(status) == 9 ? "killed: out of host memory?" : strsignal(WTERMSIG(status)));
        else
            snprintf(r->error, sizeof r->error, "the T %d process exited with %d and no result", seq,
                     WEXITSTATUS(status));
    }
}

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// Median, least and most of v[0..n-1] (n >= 1).
static void summary(const double *v, int n, double *median, double *least, double *most) {
    double s[MAX_STEPS];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, by_value);
    *median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    *least = s[0];
    *most = s[n - 1];
}

static void print_json(const args *a, const result *r) {
    double wm, wl, wh, cm, cl, ch;
    printf("{\"impl\": \"ctrax\", \"loss_chunk\": %lld, \"seq\": %d", a->loss_chunk, r->seq);
    if (r->error[0]) {
        char msg[sizeof r->error];
        size_t j = 0;
        for (const char *c = r->error; *c && j + 1 < sizeof msg; c++)
            if (*c != '"' && *c != '\\' && *c != '\n') msg[j++] = *c;
        msg[j] = '\0';
        printf(", \"peak_device\": %zu, \"error\": \"%s\"}\n", r->peak_device, msg);
        return;
    }
    summary(r->wall, r->n_timed, &wm, &wl, &wh);
    summary(r->cpu, r->n_timed, &cm, &cl, &ch);
    printf(", \"steps\": %d, \"n_weights\": %zu, \"plan_device\": %zu, \"host_bytes\": %zu, "
           "\"device_after_init\": %zu, \"peak_device\": %zu, \"rss_after_init\": %zu, \"peak_rss\": %zu, "
           "\"init_s\": %.3f, \"step1_s\": %.3f, \"wall_s\": [",
           r->steps, r->n_weights, r->plan_device, r->host_bytes, r->device_after_init, r->peak_device,
           r->rss_after_init, r->peak_rss, r->init_s, r->step1_s);
    for (int i = 0; i < r->n_timed; i++) printf("%s%.3f", i ? ", " : "", r->wall[i]);
    printf("], \"cpu_s\": [");
    for (int i = 0; i < r->n_timed; i++) printf("%s%.3f", i ? ", " : "", r->cpu[i]);
    printf("], \"step_s\": %.3f, \"step_cpu_s\": %.3f, \"loss_first\": %.5f, \"loss_last\": %.5f}\n", wm, cm,
           r->loss_first, r->loss_last);
}

static void verdict(const char *what, double value, double bound, const char *unit) {
    printf("%s %s: %.2f%s (bound %.2f%s)\n", value <= bound ? "PASS" : "FAIL", what, value, unit, bound, unit);
}

int main(int argc, char **argv) {
    args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr,
                "usage: %s [--seqs T1,T2,...] [--steps S, 2..%d] [--layers even N>=2] [--loss-chunk N] [--limit-gib G] "
                "[--json]\n",
                argv[0], MAX_STEPS);
        return 2;
    }
    ct_log_set_level(CT_LOG_WARN);
    static result res[MAX_SEQS];
    for (int i = 0; i < a.n_seqs; i++) {
        run_forked(&a, a.seqs[i], &res[i]);
        if (a.json) print_json(&a, &res[i]);
        fflush(stdout);
    }

    printf("\nReformerLM (Trax's reformer_test model), %d layers, memory-efficient trainer, Adam, batch 1, "
           "loss_chunk_size %lld; steps 2..%d timed. MiB = 2^20 bytes.\n",
           a.layers, a.loss_chunk, a.steps);
    printf("%7s %10s %12s %10s %9s %10s %10s %10s %10s  %s\n", "T", "weights", "device peak", "RSS peak", "RSS init",
           "step s", "cpu s", "cpu spread", "x peak", "x cpu (x wall)");
    const result *base = res[0].error[0] ? NULL : &res[0];
    double base_cpu = 0, base_wall = 0, lo, hi;
    if (base) {
        summary(base->cpu, base->n_timed, &base_cpu, &lo, &hi);
        summary(base->wall, base->n_timed, &base_wall, &lo, &hi);
    }
    int rc = 0;
    for (int i = 0; i < a.n_seqs; i++) {
        const result *r = &res[i];
        if (r->error[0]) {
            printf("%7d  error: %s\n", r->seq, r->error);
            rc = 1;
            continue;
        }
        double wm, cm, cl, ch;
        summary(r->wall, r->n_timed, &wm, &lo, &hi);
        summary(r->cpu, r->n_timed, &cm, &cl, &ch);
        char spread[32];
        snprintf(spread, sizeof spread, "%.2f-%.2f", cl, ch);
        printf("%7d %10zu %12.1f %10.1f %9.1f %10.2f %10.2f %10s", r->seq, r->n_weights, r->peak_device / MIB,
               r->peak_rss / MIB, r->rss_after_init / MIB, wm, cm, spread);
        if (base)
            printf(" %10.2f  %.2f (%.2f)", (double)r->peak_device / (double)base->peak_device, cm / base_cpu,
                   wm / base_wall);
        printf("\n");
    }

    // Issue 12's acceptance, when the list has 4K and 64K.
    const result *r4 = NULL, *r64 = NULL;
    for (int i = 0; i < a.n_seqs; i++) {
        if (res[i].seq == 4096) r4 = &res[i];
        if (res[i].seq == 65536) r64 = &res[i];
    }
    if (!r64) return rc;
    printf("\nIssue 12 acceptance (T = 65,536 with the memory-efficient trainer):\n");
    if (r64->error[0]) {
        printf("FAIL T = 65536 trains: %s\n", r64->error);
        return 1;
    }
    printf("PASS T = 65536 trains (loss %.4f -> %.4f over %d steps)\n", r64->loss_first, r64->loss_last, r64->steps);
    verdict("device peak(64K)", r64->peak_device / MIB, 2048.0, " MiB");
    bool ok = r64->peak_device <= (size_t)2 << 30;
    if (r4 && !r4->error[0]) {
        double c4, c64, w4, w64;
        summary(r4->cpu, r4->n_timed, &c4, &lo, &hi);
        summary(r64->cpu, r64->n_timed, &c64, &lo, &hi);
        summary(r4->wall, r4->n_timed, &w4, &lo, &hi);
        summary(r64->wall, r64->n_timed, &w64, &lo, &hi);
        double peak_ratio = (double)r64->peak_device / (double)r4->peak_device;
        verdict("device peak(64K) / peak(4K)", peak_ratio, 17.0, "");
        verdict("step time(64K) / step time(4K), median CPU time", c64 / c4, 20.0, "");
        printf("     (median wall clock: %.2f s / %.2f s = %.2f)\n", w64, w4, w64 / w4);
        ok = ok && peak_ratio <= 17.0 && c64 / c4 <= 20.0;
    } else {
        // One T per process (bench/long_context.sh): the ratios are the
        // table's (torch_long_context.py --table).
        printf("     (no T = 4096 result in this run: the ratios are not checked here)\n");
    }
    return ok ? rc : 1;
}
