// ctrax: the command-line trainer.
//
//   ctrax train [options]   train TransformerLM on the synthetic copy task
//
// Exit codes: 0 done, 1 error, 2 bad usage.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrax/ctrax.h"
#include "ctrax/data/synthetic.h"
#include "ctrax/models/models.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/train/trainer.h"

#define EXIT_USAGE 2

// ---- options ------------------------------------------------------------------

typedef struct train_opts {
    long steps;
    int batch;
    unsigned long long seed;
    long log_every;
    long eval_every;
    int eval_batches;
    double lr;
    long warmup;
    int d_model, d_ff, n_layers, n_heads;
    double dropout;
    int vocab, length;
    double stop_at;  // stop once held-out sequence accuracy reaches this (0: never)
} train_opts;

static train_opts train_defaults(void) {
    return (train_opts){.steps = 1000,
                        .batch = 32,
                        .seed = 0,
                        .log_every = 100,
                        .eval_every = 100,
                        .eval_batches = 8,
                        .lr = 2e-3,
                        .warmup = 100,
                        .d_model = 64,
                        .d_ff = 128,
                        .n_layers = 2,
                        .n_heads = 4,
                        .dropout = 0.0,
                        .vocab = 16,
                        .length = 16,
                        .stop_at = 0.0};
}

static void train_usage(FILE *f) {
    train_opts d = train_defaults();
    fprintf(f,
            "usage: ctrax train [options]\n"
            "\n"
            "Trains a TransformerLM on the synthetic copy task (sequences \"0 w 0 w\",\n"
            "loss on the second w) and reports loss and accuracy on held-out sequences.\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --steps N          training steps [%ld]\n"
            "  --batch N          sequences per batch [%d]\n"
            "  --seed N           seed for init, data and dropout [%llu]\n"
            "  --log-every N      print training loss every N steps [%ld]\n"
            "  --eval-every N     evaluate on held-out data every N steps [%ld]\n"
            "  --eval-batches N   held-out batches per evaluation [%d]\n"
            "  --lr X             Adam learning rate after warm-up [%g]\n"
            "  --warmup N         linear warm-up steps [%ld]\n"
            "  --d-model N        model width [%d]\n"
            "  --d-ff N           feed-forward width [%d]\n"
            "  --layers N         decoder blocks [%d]\n"
            "  --heads N          attention heads [%d]\n"
            "  --dropout X        dropout rate [%g]\n"
            "  --vocab N          vocabulary size (0 is the separator) [%d]\n"
            "  --length N         length of the sequence to copy [%d]\n"
            "  --stop-at X        stop when held-out sequence accuracy >= X [off]\n"
            "  -h, --help         show this help\n",
            d.steps, d.batch, d.seed, d.log_every, d.eval_every, d.eval_batches, d.lr, d.warmup, d.d_model, d.d_ff,
            d.n_layers, d.n_heads, d.dropout, d.vocab, d.length);
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "ctrax train: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "ctrax train: %s expects a number in [%g, %g], got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

// Returns 0, or EXIT_USAGE after printing what is wrong; 1 for --help.
static int parse_train(int argc, char **argv, train_opts *o) {
    *o = train_defaults();
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            train_usage(stdout);
            return 1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ctrax train: unknown option or missing value: '%s' (see ctrax train --help)\n", a);
            return EXIT_USAGE;
        }
        const char *v = argv[++i];
        long n;
        int bad = 0;
        if (!strcmp(a, "--steps")) bad = parse_long(a, v, 0, 1L << 40, &o->steps);
        else if (!strcmp(a, "--batch")) bad = parse_long(a, v, 1, 1 << 20, &n), o->batch = (int)n;
        else if (!strcmp(a, "--seed")) bad = parse_long(a, v, 0, 1L << 62, &n), o->seed = (unsigned long long)n;
        else if (!strcmp(a, "--log-every")) bad = parse_long(a, v, 1, 1L << 40, &o->log_every);
        else if (!strcmp(a, "--eval-every")) bad = parse_long(a, v, 1, 1L << 40, &o->eval_every);
        else if (!strcmp(a, "--eval-batches")) bad = parse_long(a, v, 1, 1 << 20, &n), o->eval_batches = (int)n;
        else if (!strcmp(a, "--lr")) bad = parse_double(a, v, 0, 10, &o->lr);
        else if (!strcmp(a, "--warmup")) bad = parse_long(a, v, 0, 1L << 40, &o->warmup);
        else if (!strcmp(a, "--d-model")) bad = parse_long(a, v, 1, 1 << 16, &n), o->d_model = (int)n;
        else if (!strcmp(a, "--d-ff")) bad = parse_long(a, v, 1, 1 << 18, &n), o->d_ff = (int)n;
        else if (!strcmp(a, "--layers")) bad = parse_long(a, v, 0, 1024, &n), o->n_layers = (int)n;
        else if (!strcmp(a, "--heads")) bad = parse_long(a, v, 1, 1024, &n), o->n_heads = (int)n;
        else if (!strcmp(a, "--dropout")) bad = parse_double(a, v, 0, 0.99, &o->dropout);
        else if (!strcmp(a, "--vocab")) bad = parse_long(a, v, 2, 1 << 24, &n), o->vocab = (int)n;
        else if (!strcmp(a, "--length")) bad = parse_long(a, v, 1, 1 << 16, &n), o->length = (int)n;
        else if (!strcmp(a, "--stop-at")) bad = parse_double(a, v, 0, 1, &o->stop_at);
        else {
            fprintf(stderr, "ctrax train: unknown option '%s' (see ctrax train --help)\n", a);
            return EXIT_USAGE;
        }
        if (bad) return EXIT_USAGE;
    }
    if (o->d_model % o->n_heads) {
        fprintf(stderr, "ctrax train: --d-model %d does not divide by --heads %d\n", o->d_model, o->n_heads);
        return EXIT_USAGE;
    }
    return 0;
}

// ---- train ----------------------------------------------------------------------

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// A weightless metric layer initialized for the model's output and the
// targets and weights.
typedef struct metric {
    const char *name;
    ct_net net;
} metric;

static int run_train(const train_opts *o) {
    ct_error err;
    ct_copy_task train_task = {o->vocab, o->length, false, o->seed, 0};
    ct_copy_task eval_task = {o->vocab, o->length, false, o->seed ^ 0x5eedf00dULL, 0};
    int B = o->batch, T = ct_copy_task_seq_len(&train_task);

    int32_t *tokens = malloc((size_t)B * T * sizeof *tokens);
    float *weights = malloc((size_t)B * T * sizeof *weights);
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, B, T, tokens), ct_tensor_2d(CT_DTYPE_I32, B, T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, B, T, weights)};

    ct_transformer_lm_params mp = ct_transformer_lm_default_params();
    mp.vocab_size = o->vocab;
    mp.d_model = o->d_model;
    mp.d_ff = o->d_ff;
    mp.n_layers = o->n_layers;
    mp.n_heads = o->n_heads;
    mp.max_len = T;
    mp.dropout = (float)o->dropout;
    ct_layer *model = ct_transformer_lm(mp);
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_adam_params ap = ct_adam_default_params();
    ap.learning_rate = (float)o->lr;

    ct_device dev = ct_device_cpu();
    ct_trainer *trainer = NULL;
    ct_key root_key = ct_key_from_seed(o->seed);
    int rc = 1;
    metric metrics[2] = {{"accuracy", {0}}, {"sequence_accuracy", {0}}};
    if (ct_trainer_new(&trainer, model, loss, batch, 3, ct_adam_new(ap), ct_key_split(root_key, 0), &dev, NULL, &err) != CT_OK)
        goto fail;
    const ct_net *net = ct_trainer_net(trainer);
    ct_tensor logits_sig = ct_tensor_3d(CT_DTYPE_F32, B, T, o->vocab, NULL);
    ct_tensor metric_sigs[3] = {logits_sig, ct_tensor_sig(&batch[1]), ct_tensor_sig(&batch[2])};
    ct_layer *acc = ct_weighted_category_accuracy(), *seq_acc = ct_sequence_accuracy();
    ct_status st = ct_net_init(&metrics[0].net, acc, metric_sigs, 3, root_key, &dev, &err);
    if (st == CT_OK) st = ct_net_init(&metrics[1].net, seq_acc, metric_sigs, 3, root_key, &dev, &err);
    ct_layer_free(acc);
    ct_layer_free(seq_acc);
    if (st != CT_OK) goto fail;

    printf("TransformerLM: %d layers, d_model %d, d_ff %d, %d heads, vocab %d, sequence %d; %zu weights (%.2f MiB)\n",
           o->n_layers, o->d_model, o->d_ff, o->n_heads, o->vocab, T, net->n_weights,
           (double)net->n_weights * 4 / (1 << 20));
    printf("copy task: batch %d, Adam lr %g with %ld warm-up steps, %ld steps\n", B, o->lr, o->warmup, o->steps);
    fflush(stdout);

    ct_arena metric_arena;
    ct_arena_init(&metric_arena, &dev);
    ct_ctx metric_ctx;
    ct_ctx_init(&metric_ctx, &metric_arena);
    metric_ctx.record = false;

    double t0 = now_seconds(), loss_sum = 0;
    long loss_count = 0;
    for (long step = 1; step <= o->steps; step++) {
        ct_copy_task_batch(&train_task, (uint64_t)step, B, tokens, weights);
        double lr = o->lr * (o->warmup > 0 && step <= o->warmup ? (double)step / (double)o->warmup : 1.0);
        ct_step_stats stats;
        if (ct_trainer_one_step(trainer, batch, ct_key_fold_in(ct_key_split(root_key, 1), (uint32_t)step), step,
                                (float)lr, &stats, &err) != CT_OK)
            goto fail_loop;
        loss_sum += stats.loss;
        loss_count++;
        if (step % o->log_every == 0 || step == o->steps) {
            printf("Step %6ld: train loss | %.4f   (gradients_l2 %.3f, weights_l2 %.2f, %.1f steps/s)\n", step,
                   loss_sum / (double)loss_count, stats.gradients_l2, stats.weights_l2,
                   (double)step / (now_seconds() - t0));
            loss_sum = 0;
            loss_count = 0;
            fflush(stdout);
        }
        if (step % o->eval_every == 0 || step == o->steps) {
            double sums[2] = {0, 0};
            for (int e = 0; e < o->eval_batches; e++) {
                ct_copy_task_batch(&eval_task, (uint64_t)e, B, tokens, weights);
                ct_tensor logits;
                if (ct_trainer_predict(trainer, batch, &logits, &err) != CT_OK) goto fail_loop;
                ct_tensor in[3] = {logits, batch[1], batch[2]};
                for (int m = 0; m < 2; m++) {
                    ct_tensor value;
                    ct_net_bind(&metrics[m].net, &metric_ctx, false);
                    if (ct_layer_forward(metrics[m].net.root, &metric_ctx, in, &value, root_key, &err) != CT_OK)
                        goto fail_loop;
                    sums[m] += *ct_f32(&value);
                }
                ct_arena_reset(&metric_arena);
            }
            double accuracy = sums[0] / o->eval_batches, seq_accuracy = sums[1] / o->eval_batches;
            printf("Step %6ld: eval  accuracy | %.4f   sequence_accuracy | %.4f   (%d held-out sequences, %.1f s)\n",
                   step, accuracy, seq_accuracy, o->eval_batches * B, now_seconds() - t0);
            fflush(stdout);
            if (o->stop_at > 0 && seq_accuracy >= o->stop_at) {
                printf("reached sequence accuracy %.4f >= %g at step %ld in %.1f s\n", seq_accuracy, o->stop_at, step,
                       now_seconds() - t0);
                break;
            }
        }
    }
    printf("peak device memory: %.2f MiB (step arena %.2f MiB)\n", (double)dev.peak_bytes / (1 << 20),
           (double)ct_trainer_arena_bytes(trainer) / (1 << 20));
    rc = 0;
fail_loop:
    ct_ctx_free(&metric_ctx);
    ct_arena_free(&metric_arena);
fail:
    if (rc) fprintf(stderr, "ctrax train: %s\n", err.msg);
    ct_net_free(&metrics[0].net);
    ct_net_free(&metrics[1].net);
    ct_trainer_free(trainer);
    ct_layer_free(model);
    ct_layer_free(loss);
    free(tokens);
    free(weights);
    return rc;
}

// ---- main --------------------------------------------------------------------------

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrax COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  train    train TransformerLM on the synthetic copy task\n"
            "\n"
            "ctrax COMMAND --help shows a command's options.\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "train")) {
        train_opts o;
        int r = parse_train(argc - 2, argv + 2, &o);
        if (r == 1) return 0;
        if (r) return r;
        return run_train(&o);
    }
    fprintf(stderr, "ctrax: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
