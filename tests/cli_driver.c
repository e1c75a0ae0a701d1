// A driver for the ctrax subcommands of tools/cmd_*.c, run by
// tests/test_cli_tools.sh:
//
//   cli_driver make-run DIR VOCAB STEPS
//       trains a small TransformerLM (vocabulary VOCAB) on the copy task for
//       STEPS steps with the Loop, built from a gin config whose operative
//       text the checkpoints keep; checkpoints and evals every 2 steps. Then
//       checks `sample --temperature 0` against the model run once over the
//       whole sampled text: at every generated position the argmax of the
//       logits must be the byte sampled there; and sampling at temperatures
//       0.5 (top-k 3) and 2 (all bytes) against the inverse CDF of the
//       softmax of those logits, in double.
//   cli_driver info|plot|sample|eval ARGS...
//       runs the command as `ctrax COMMAND ARGS...` would, and exits with its code.
//   cli_driver maps FILE ADDR_HEX CAP
//       runs the SIGBUS handler's parse (ctrax_maps_report) on FILE, lines as
//       /proc/self/maps writes them, with a buffer of CAP bytes; prints
//       "found 1" or "found 0" on stdout (the message goes to stderr).
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "commands.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "core/fs.h"

enum { LEN = 4, BATCH = 4 };

static const char *config_fmt =
    "# a small copy-task language model (tests/cli_driver.c)\n"
    "train.model = @TransformerLM\n"
    "TransformerLM.vocab_size = %d\n"
    "TransformerLM.d_model = 16\n"
    "TransformerLM.d_ff = 32\n"
    "TransformerLM.n_layers = 1\n"
    "TransformerLM.n_heads = 2\n"
    "TransformerLM.max_len = %d\n"
    "TransformerLM.dropout = 0.1\n"
    "train.loss_fn = @WeightedCategoryCrossEntropy()\n"
    "train.optimizer = @Adam\n"
    "Adam.learning_rate = 0.01\n"
    "train.metrics = [@WeightedCategoryAccuracy, @SequenceAccuracy]\n"
    "train.batch_size = %d\n"
    "train.eval_steps = 2\n"
    "train.random_seed = 3\n"
    "train.inputs = @sequence_copy_inputs\n"
    "sequence_copy_inputs.vocab_size = %d\n"
    "sequence_copy_inputs.train_length = 5\n"
    "sequence_copy_inputs.train_min_length = 4\n"
    "sequence_copy_inputs.eval_min_length = 4\n"
    "sequence_copy_inputs.eval_max_length = 5\n"
    "sequence_copy_inputs.pad_to_multiple = 1\n";  // unpadded, as before Trax's default 32

// The Loop evaluates once, at the last step, so its eval stream starts at
// its beginning, as `ctrax eval`'s does: the two must print the same numbers.
static bool at_last(int64_t step, void *user) { return step == *(const int64_t *)user; }

// Runs `sample ARGS` in this process with stdout sent to a file; returns its
// exit code and the bytes it wrote (malloc'ed) in *out, *n.
static int run_sample_captured(int argc, char **argv, char **out, size_t *n) {
    char path[] = "/tmp/ctrax_cli_driver_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    dup2(fd, STDOUT_FILENO);
    int rc = ctrax_cmd_sample(argc, argv);
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    close(fd);
    ct_error err;
    CHECK_OK(ct_fs_read(path, out, n, &err), &err);
    unlink(path);
    return rc;
}

// 9 bytes that `sample ARGV` wrote (--raw, prompt included) and the logits
// of one forward pass of the model over them, on the run's weights in eval
// mode: logits (1, 9, V) at t predict byte t.
typedef struct sampled {
    int32_t tokens[9];
    ct_tensor logits;
    ct_device dev;  // the arena keeps a pointer to it
    ct_arena arena;
    ct_ctx ctx;
} sampled;

// Runs `sample` (argc, argv) and the forward pass into *s; false (nothing
// to free) when sample did not write 9 bytes.
static bool sample_and_forward(ct_loop *loop, ct_layer *model, int argc, char **argv, sampled *s) {
    char *text = NULL;
    size_t n = 0;
    int rc = run_sample_captured(argc, argv, &text, &n);
    CHECK_MSG(rc == 0 && n == 9, "sample exited %d with %zu bytes", rc, n);
    if (rc != 0 || n != 9) {
        free(text);
        return false;
    }
    for (int t = 0; t < 9; t++) s->tokens[t] = (unsigned char)text[t];
    free(text);
    ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 1, 9, s->tokens);
    ct_error err;
    s->dev = ct_device_cpu();
    ct_arena_init(&s->arena, &s->dev);
    ct_ctx_init(&s->ctx, &s->arena);
    ct_net_bind(ct_loop_net(loop), &s->ctx, false);
    CHECK_OK(ct_layer_forward(model, &s->ctx, &in, &s->logits, ct_key_from_seed(0), &err), &err);
    return true;
}

static void sampled_free(sampled *s) {
    ct_ctx_free(&s->ctx);
    ct_arena_free(&s->arena);
}

// Greedy sampling must agree with one forward pass over the prompt and the
// sampled text (9 bytes in all; bytes past 127 in the prompt read as such).
static void check_greedy(ct_loop *loop, ct_layer *model, const char *dir, int vocab, const char *prompt) {
    int P = (int)strlen(prompt);
    char length[16];
    snprintf(length, sizeof length, "%d", 9 - P);
    char *argv[] = {"sample", (char *)dir,   "--temperature", "0", "--length", length, "--raw",
                    "--prompt", (char *)prompt, NULL};
    sampled s;
    if (!sample_and_forward(loop, model, 9, argv, &s)) return;
    int matches = 0;
    for (int t = P; t < 9; t++) {
        const float *row = ct_f32(&s.logits) + (size_t)t * (size_t)vocab;
        int best = 0;
        for (int v = 1; v < vocab; v++)
            if (row[v] > row[best]) best = v;
        // Lengths differ between the two runs, so BLAS may round differently:
        // a byte within 1e-4 of the best logit counts as the argmax.
        matches += best == s.tokens[t] || row[s.tokens[t]] >= row[best] - 1e-4f;
    }
    printf("greedy check (vocab %d, prompt of %d): %d of %d sampled bytes are the argmax of one forward pass\n", vocab,
           P, matches, 9 - P);
    CHECK(matches == 9 - P);
    sampled_free(&s);
}

// Sampling at a temperature with top-k must draw byte t by inverting the
// CDF of softmax(logits_t / T) over the K likeliest bytes (equal logits by
// id), computed here in double from one forward pass over the sampled text,
// with u the uniform `sample` draws for byte t (fold_in(key(seed), t)). A u
// within 1e-4 of a bucket's edge may fall in either bucket (the two runs'
// BLAS rounds differently).
static void check_sampled(ct_loop *loop, ct_layer *model, const char *dir, int vocab, const char *temperature,
                          const char *top_k, int seed) {
    char seed_s[16];
    snprintf(seed_s, sizeof seed_s, "%d", seed);
    char *argv[] = {"sample", (char *)dir, "--temperature", (char *)temperature, "--top-k", (char *)top_k,
                    "--seed", seed_s, "--length", "9", "--raw", NULL};
    sampled s;
    if (!sample_and_forward(loop, model, 11, argv, &s)) return;
    double T = atof(temperature);
    int K = atoi(top_k), matches = 0;
    if (K <= 0 || K > vocab) K = vocab;
    for (int t = 0; t < 9; t++) {
        const float *row = ct_f32(&s.logits) + (size_t)t * (size_t)vocab;
        // The K likeliest ids, by selection (no sort shared with the code).
        int ids[256];
        bool taken[256] = {false};
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int v = 0; v < vocab; v++)
                if (!taken[v] && (best < 0 || row[v] > row[best])) best = v;
            taken[best] = true;
            ids[j] = best;
        }
        double w[256], sum = 0;
        for (int j = 0; j < K; j++) sum += w[j] = exp(((double)row[ids[j]] - (double)row[ids[0]]) / T);
        float u;
        ct_random_uniform(ct_key_fold_in(ct_key_from_seed((uint64_t)seed), (uint32_t)t), &u, 1, 0.0f, 1.0f);
        bool ok = false;
        double lo = 0;
        for (int j = 0; j < K; j++) {
            double hi = lo + w[j] / sum;
            if (ids[j] == s.tokens[t] && (double)u >= lo - 1e-4 && (double)u < hi + 1e-4) ok = true;
            lo = hi;
        }
        matches += ok;
    }
    printf("sampling check (vocab %d, temperature %s, top-k %s, seed %d): %d of 9 bytes are the inverse CDF's\n",
           vocab, temperature, top_k, seed, matches);
    CHECK(matches == 9);
    sampled_free(&s);
}

static int make_run(const char *dir, int vocab, int steps) {
    ct_error err = {0};
    char text[2048];
    snprintf(text, sizeof text, config_fmt, vocab, 2 * LEN + 2, BATCH, vocab);
    ct_config *cfg = ct_config_new();
    CHECK_OK(ct_config_parse_text(cfg, text, strlen(text), "cli_driver.gin", &err), &err);
    CHECK_OK(ct_config_validate(cfg, &err), &err);
    const char *m = NULL, *l = NULL, *o = NULL, *in = NULL;
    int64_t batch, eval_steps, seed;
    const ct_config_value *metrics;
    CHECK_OK(ct_config_get_reference(cfg, "train", "model", NULL, &m, &err), &err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "loss_fn", NULL, &l, &err), &err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "optimizer", NULL, &o, &err), &err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "inputs", NULL, &in, &err), &err);
    CHECK_OK(ct_config_get_list(cfg, "train", "metrics", NULL, &metrics, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "batch_size", 32, &batch, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "eval_steps", 10, &eval_steps, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "random_seed", 0, &seed, &err), &err);
    ct_layer *model, *loss, *metric_loss, *acc, *seq_acc;
    ct_optimizer *opt;
    CHECK_OK(ct_config_build_model(cfg, m, &model, &err), &err);
    CHECK_OK(ct_config_build_layer(cfg, l, &loss, &err), &err);
    CHECK_OK(ct_config_build_layer(cfg, l, &metric_loss, &err), &err);
    CHECK_OK(ct_config_build_layer(cfg, metrics->items[0].s, &acc, &err), &err);
    CHECK_OK(ct_config_build_layer(cfg, metrics->items[1].s, &seq_acc, &err), &err);
    CHECK_OK(ct_config_build_optimizer(cfg, o, &opt, &err), &err);

    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, in, batch, (uint64_t)seed, &train, &eval, &err), &err);
    // After every query: the operative config holds all the run read.
    char *operative = ct_config_operative_text(cfg);
    // No schedule: every step at the optimizer's own learning rate.
    float lr = 0;
    CHECK_OK(ct_optimizer_get_param(opt, "learning_rate", &lr, &err), &err);
    ct_train_task task = {train, loss, opt, NULL, "loss", lr};
    ct_eval_task ev = {.stream = eval, .n_metrics = 3, .n_batches = (int)eval_steps};
    ev.metrics[0] = metric_loss;
    ev.metrics[1] = acc;
    ev.metrics[2] = seq_acc;
    ev.metric_names[0] = "loss";
    ev.metric_names[1] = "accuracy";
    ev.metric_names[2] = "sequence_accuracy";
    ct_loop_options lo = ct_loop_default_options();
    lo.output_dir = dir;
    lo.n_steps_per_checkpoint = 2;
    lo.keep_last = 3;  // model_2, model_4 and model_6 all stay for the tools to read
    lo.seed = (uint64_t)seed;
    lo.config_text = operative;
    int64_t last = steps;
    lo.eval_at = at_last;
    lo.predicate_user = &last;
    ct_loop *loop = NULL;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, &ev, &lo, &err), &err);
    if (loop) {
        CHECK_OK(ct_loop_run(loop, steps, &err), &err);
        printf("trained %s: vocab %d, %lld steps, %zu weights\n", dir, vocab, (long long)ct_loop_step(loop),
               ct_loop_net(loop)->n_weights);
        printf("loop eval: loss % .8f accuracy % .8f sequence_accuracy % .8f\n",
               ct_loop_last_value(loop, "eval", "metrics/loss"), ct_loop_last_value(loop, "eval", "metrics/accuracy"),
               ct_loop_last_value(loop, "eval", "metrics/sequence_accuracy"));
        check_greedy(loop, model, dir, vocab, "");
        if (vocab == 256) check_greedy(loop, model, dir, vocab, "\xe9\xff\x80");
        for (int seed = 1; seed <= 4; seed++) {
            check_sampled(loop, model, dir, vocab, "0.5", "3", seed);
            check_sampled(loop, model, dir, vocab, "2", "0", seed);
        }
    }
    ct_loop_free(loop);
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_layer_free(model);
    ct_layer_free(loss);
    ct_layer_free(metric_loss);
    ct_layer_free(acc);
    ct_layer_free(seq_acc);
    ct_free(operative);
    ct_config_free(cfg);
    return check_summary("cli_driver make-run");
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "make-run")) return make_run(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (argc >= 2) {
        if (!strcmp(argv[1], "info")) return ctrax_cmd_info(argc - 1, argv + 1);
        if (!strcmp(argv[1], "plot")) return ctrax_cmd_plot(argc - 1, argv + 1);
        if (!strcmp(argv[1], "sample")) return ctrax_cmd_sample(argc - 1, argv + 1);
        if (!strcmp(argv[1], "eval")) return ctrax_cmd_eval(argc - 1, argv + 1);
    }
    if (argc == 5 && !strcmp(argv[1], "maps")) {
        int fd = open(argv[2], O_RDONLY);
        size_t cap = (size_t)strtoull(argv[4], NULL, 10);
        char *buf = malloc(cap);
        if (fd < 0 || !buf || cap < 2) return 2;
        int found = ctrax_maps_report(fd, strtoull(argv[3], NULL, 16), buf, cap);
        close(fd);
        free(buf);
        printf("found %d\n", found);
        return 0;
    }
    fprintf(stderr, "usage: cli_driver make-run DIR VOCAB STEPS | cli_driver info|plot|sample|eval ARGS... | "
                    "cli_driver maps FILE ADDR_HEX CAP\n");
    return 2;
}
