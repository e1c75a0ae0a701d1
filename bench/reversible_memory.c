// Memory benchmark: trains ReformerLM with the standard Trainer or the
// ReversibleTrainer and prints one JSON line with peak device bytes, peak
// host memory (RSS) and step time. bench/torch_reversible_memory.py runs it
// for each depth and trainer next to PyTorch and prints the table.
//
//   bench_reversible_memory --trainer standard|reversible|both --depth N
//       [--steps S] [--batch 8] [--seq 512] [--d-model 256] [--d-ff 1024]
//       [--heads 4] [--vocab 256] [--copy-weights] [--limit-gib G]
//
// --trainer both builds the two trainers in one process and runs their
// steps alternately (standard, reversible, standard, ...), so that both see
// the same load on a shared machine; it reports the per-step CPU times and
// their ratios (memory figures come from the single-trainer runs).
//
// --limit-gib sets the device's byte limit: a trainer that needs more fails
// with CT_ERR_MEMORY, which is reported as {"error": ...} (exit code 0), so a
// model too big for this machine is shown not to fit without being
// allocated.
//
// Step 1 sizes the arena; the device peak and the step time (wall clock and
// process CPU time, mean and least: the machine may be shared) are measured
// over steps 2..S
// (the device's peak is reset after step 1), as is the RSS peak (VmHWM,
// reset through /proc/self/clear_refs after step 1).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrax/ctrax.h"
#include "bench_util.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/train/reversible_trainer.h"

typedef struct args {
    const char *trainer;
    int depth, steps, batch, seq, d_model, d_ff, heads, vocab;
    bool copy_weights;
    double limit_gib;
} args;

static int parse(int argc, char **argv, args *a) {
    *a = (args){"reversible", 4, 3, 8, 512, 256, 1024, 4, 256, false, 0.0};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(k, "--copy-weights") == 0) {
            a->copy_weights = true;
            continue;
        }
        if (!v) return -1;
        i++;
        if (strcmp(k, "--trainer") == 0) a->trainer = v;
        else if (strcmp(k, "--depth") == 0) a->depth = atoi(v);
        else if (strcmp(k, "--steps") == 0) a->steps = atoi(v);
        else if (strcmp(k, "--batch") == 0) a->batch = atoi(v);
        else if (strcmp(k, "--seq") == 0) a->seq = atoi(v);
        else if (strcmp(k, "--d-model") == 0) a->d_model = atoi(v);
        else if (strcmp(k, "--d-ff") == 0) a->d_ff = atoi(v);
        else if (strcmp(k, "--heads") == 0) a->heads = atoi(v);
        else if (strcmp(k, "--vocab") == 0) a->vocab = atoi(v);
        else if (strcmp(k, "--limit-gib") == 0) a->limit_gib = atof(v);
        else return -1;
    }
    bool known = strcmp(a->trainer, "standard") == 0 || strcmp(a->trainer, "reversible") == 0 ||
                 strcmp(a->trainer, "both") == 0;
    if (!known || a->steps < 2 || a->depth < 0) return -1;
    return 0;
}

// Makes VmHWM start again from the current RSS (Linux).
static void reset_peak_rss(void) {
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return;
    fputs("5", f);
    fclose(f);
}

// A run that did not fit: one JSON line, and exit code 0 if it was memory.
static int report_error(const args *a, const char *when, const ct_error *err, const ct_device *dev) {
    fprintf(stderr, "%s: %s\n", when, err->msg);
    char msg[CT_ERROR_MSG_MAX];
    size_t j = 0;
    for (const char *c = err->msg; *c && j + 1 < sizeof msg; c++)
        if (*c != '"' && *c != '\\') msg[j++] = *c;
    msg[j] = '\0';
    printf("{\"impl\": \"ctrax\", \"trainer\": \"%s\", \"depth\": %d, \"limit_bytes\": %zu, \"peak_device\": %zu, "
           "\"error\": \"%s: %s: %s\"}\n",
           a->trainer, a->depth, dev->limit_bytes, dev->peak_bytes, when, ct_status_name(err->code), msg);
    return err->code == CT_ERR_MEMORY ? 0 : 1;
}

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

// --trainer both: alternate steps of the two trainers on the same model.
static int run_both(const args *a, ct_reformer_lm_params p, const ct_tensor *batch) {
    ct_layer *model_s = ct_reformer_lm(p), *model_r = ct_reformer_lm(p), *loss = ct_weighted_category_cross_entropy();
    ct_layer *loss_r = ct_weighted_category_cross_entropy();
    ct_device dev_s = ct_device_cpu(), dev_r = ct_device_cpu();
    ct_error err;
    ct_trainer *st;
    ct_trainer *rt;
    ct_trainer_options o = ct_reversible_default_options();
    o.reversible.copy_weights = a->copy_weights;
    if (ct_trainer_new(&st, model_s, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(1),
                       &dev_s, NULL, &err) != CT_OK ||
        ct_trainer_new(&rt, model_r, loss_r, batch, 3, ct_adam_new(ct_adam_default_params()),
                                  ct_key_from_seed(1), &dev_r, &o, &err) != CT_OK) {
        fprintf(stderr, "init: %s\n", err.msg);
        return 1;
    }
    double cpu_s[64], cpu_r[64], ratio[64];
    int n = 0;
    bool same_loss = true;
    for (int step = 1; step <= a->steps && step <= 64; step++) {
        ct_key key = ct_key_fold_in(ct_key_from_seed(2), (uint32_t)step);
        ct_step_stats ss, sr;
        double c0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
        if (ct_trainer_one_step(st, batch, key, step, 1e-4f, &ss, &err) != CT_OK) break;
        double c1 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
        if (ct_trainer_one_step(rt, batch, key, step, 1e-4f, &sr, &err) != CT_OK) break;
        double c2 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
        same_loss = same_loss && fabsf(ss.loss - sr.loss) <= 1e-4f * (1.0f + fabsf(ss.loss));
        fprintf(stderr, "  both depth %d step %d: standard cpu %.2f s, reversible cpu %.2f s, loss %.4f / %.4f\n",
                a->depth, step, c1 - c0, c2 - c1, ss.loss, sr.loss);
        if (step == 1) continue;
        cpu_s[n] = c1 - c0;
        cpu_r[n] = c2 - c1;
        ratio[n] = cpu_r[n] / cpu_s[n];
        n++;
    }
    if (n < 1) {
        fprintf(stderr, "step: %s\n", err.msg);
        return 1;
    }
    double sorted[64];
    memcpy(sorted, ratio, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, by_value);
    double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
    printf("{\"impl\": \"ctrax\", \"trainer\": \"both\", \"depth\": %d, \"steps\": %d, \"ratios\": [", a->depth,
           a->steps);
    for (int i = 0; i < n; i++) printf("%s%.3f", i ? ", " : "", ratio[i]);
    printf("], \"standard_cpu_s\": [");
    for (int i = 0; i < n; i++) printf("%s%.3f", i ? ", " : "", cpu_s[i]);
    printf("], \"reversible_cpu_s\": [");
    for (int i = 0; i < n; i++) printf("%s%.3f", i ? ", " : "", cpu_r[i]);
    printf("], \"median_ratio\": %.3f, \"same_loss\": %s}\n", median, same_loss ? "true" : "false");
    ct_trainer_free(st);
    ct_trainer_free(rt);
    ct_layer_free(model_s);
    ct_layer_free(model_r);
    ct_layer_free(loss);
    ct_layer_free(loss_r);
    return 0;
}

int main(int argc, char **argv) {
    args a;
    if (parse(argc, argv, &a)) {
        fprintf(stderr,
                "usage: %s --trainer standard|reversible|both --depth N [--steps S>=2] [--batch B] [--seq T] "
                "[--d-model D] [--d-ff F] [--heads H] [--vocab V] [--copy-weights] [--limit-gib G]\n",
                argv[0]);
        return 2;
    }
    ct_log_set_level(CT_LOG_WARN);
    bool standard = strcmp(a.trainer, "standard") == 0;
    bool both = strcmp(a.trainer, "both") == 0;
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = a.vocab;
    p.d_model = a.d_model;
    p.d_ff = a.d_ff;
    p.n_layers = a.depth;
    p.n_heads = a.heads;
    p.max_len = a.seq;
    p.dropout = 0.1f;
    // The model bench/torch_reversible_memory.py builds: full causal
    // attention with biased q, k, v, o (d_model / n_heads per head), fixed
    // sinusoid positions.
    p.attention[0] = CT_REFORMER_CAUSAL_ATTENTION;
    p.fixed_positions = true;
    ct_layer *model = ct_reformer_lm(p), *loss = ct_weighted_category_cross_entropy();

    // Random tokens; every position weighted.
    size_t n = (size_t)a.batch * (size_t)a.seq;
    int32_t *tokens = malloc(n * sizeof *tokens);
    float *weights = malloc(n * sizeof *weights);
    for (size_t i = 0; i < n; i++) {
        tokens[i] = (int32_t)(ct_random_bits(ct_key_from_seed(1), (uint32_t)i) % (uint32_t)a.vocab);
        weights[i] = 1.0f;
    }
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, a.batch, a.seq, tokens),
                          ct_tensor_2d(CT_DTYPE_I32, a.batch, a.seq, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, a.batch, a.seq, weights)};
    if (both) {
        int rc = run_both(&a, p, batch);
        ct_layer_free(model);
        ct_layer_free(loss);
        free(tokens);
        free(weights);
        return rc;
    }
    ct_device dev = ct_device_cpu();
    dev.limit_bytes = (size_t)(a.limit_gib * 1073741824.0);
    ct_error err;
    ct_trainer *st = NULL;
    ct_trainer *rt = NULL;
    ct_status s;
    size_t host_slabs = 0, n_weights = 0;
    if (standard) {
        s = ct_trainer_new(&st, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(1), &dev,
                           NULL, &err);
        if (s == CT_OK) n_weights = ct_trainer_net(st)->n_weights;
    } else {
        ct_trainer_options o = ct_reversible_default_options();
        o.reversible.copy_weights = a.copy_weights;
        s = ct_trainer_new(&rt, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()),
                                      ct_key_from_seed(1), &dev, &o, &err);
        if (s == CT_OK) {
            host_slabs = ct_trainer_host(rt)->current_bytes;
            n_weights = ct_trainer_net(rt)->n_weights;
        }
    }
    if (s != CT_OK) return report_error(&a, "init", &err, &dev);
    size_t rss_init, hwm_init;
    bench_rss(&rss_init, &hwm_init);
    size_t device_after_init = dev.current_bytes;

    double t_first = 0, t_rest = 0, cpu_rest = 0, cpu_min = 0;
    float last_loss = 0;
    size_t peak_first = 0;
    for (int step = 1; step <= a.steps; step++) {
        if (step == 2) {
            peak_first = dev.peak_bytes;
            ct_device_reset_peak(&dev);
            reset_peak_rss();
        }
        ct_step_stats stats;
        ct_key key = ct_key_fold_in(ct_key_from_seed(2), (uint32_t)step);
        double t0 = bench_clock_s(CLOCK_MONOTONIC), c0 = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID);
        s = standard ? ct_trainer_one_step(st, batch, key, step, 1e-4f, &stats, &err)
                     : ct_trainer_one_step(rt, batch, key, step, 1e-4f, &stats, &err);
        double dt = bench_clock_s(CLOCK_MONOTONIC) - t0, dc = bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        if (s != CT_OK) return report_error(&a, step == 1 ? "step 1" : "a later step", &err, &dev);
        if (step == 1) t_first = dt;
        else {
            t_rest += dt;
            cpu_rest += dc;
            if (cpu_min == 0 || dc < cpu_min) cpu_min = dc;
        }
        last_loss = stats.loss;
        fprintf(stderr, "  %s depth %d step %d: %.2f s (cpu %.2f s), loss %.4f\n", a.trainer, a.depth, step, dt, dc,
                stats.loss);
    }
    size_t rss_end, hwm;
    bench_rss(&rss_end, &hwm);
    printf("{\"impl\": \"ctrax\", \"trainer\": \"%s\", \"copy_weights\": %s, \"depth\": %d, \"steps\": %d, "
           "\"n_weights\": %zu, \"host_slab_bytes\": %zu, \"device_after_init\": %zu, \"peak_device_step1\": %zu, "
           "\"peak_device\": %zu, \"rss_after_init\": %zu, \"peak_rss_init\": %zu, \"peak_rss\": %zu, "
           "\"step1_s\": %.3f, \"step_s\": %.3f, \"step_cpu_s\": %.3f, \"step_cpu_min_s\": %.3f, \"loss\": %.5f}\n",
           a.trainer, a.copy_weights ? "true" : "false", a.depth, a.steps, n_weights, host_slabs, device_after_init,
           peak_first, dev.peak_bytes, rss_init, hwm_init, hwm, t_first, t_rest / (a.steps - 1),
           cpu_rest / (a.steps - 1), cpu_min, last_loss);
    ct_trainer_free(st);
    ct_trainer_free(rt);
    ct_layer_free(model);
    ct_layer_free(loss);
    free(tokens);
    free(weights);
    return 0;
}
