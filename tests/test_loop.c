// The training Loop: checkpoints and files, exact resume, best checkpoints
// (Trax's lowest/highest test), stopping on request, a final checkpoint,
// several tasks, and loading weights by name.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "copy_fixture.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "core/fs.h"
#include "data/stream_internal.h"
#include "train/train_internal.h"
#include "scratch.h"

// A run directory in this program's scratch directory (the caller frees the name).
static char *temp_dir(const char *tag) { return strdup(tmp_path(tag)); }

static bool exists(const char *dir, const char *name) {
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

// A run: model, one task, an eval task with two metrics.
typedef struct run {
    ct_stream *train, *eval;
    ct_layer *model, *loss, *metric_loss, *metric_acc;
    ct_schedule *schedule;
    ct_loop *loop;
} run;

// A run with the optimizer opt (the loop takes it).
static ct_status run_new_opt(run *r, const char *dir, ct_loop_options o, ct_optimizer *opt, ct_error *err) {
    memset(r, 0, sizeof *r);
    r->train = copy_batches(1);
    r->eval = copy_batches(99);
    r->model = small_lm(0.1f);  // dropout on: resume must redraw the same masks
    r->loss = ct_weighted_category_cross_entropy();
    r->metric_loss = ct_weighted_category_cross_entropy();
    r->metric_acc = ct_weighted_category_accuracy();
    CHECK_OK(ct_schedule_warmup(5, 3e-3, &r->schedule, err), err);
    ct_train_task task = {r->train, r->loss, opt, r->schedule, "loss", 0};
    ct_eval_task ev = {.stream = r->eval, .n_metrics = 2, .n_batches = 2};
    ev.metrics[0] = r->metric_loss;
    ev.metrics[1] = r->metric_acc;
    ev.metric_names[0] = "loss";
    ev.metric_names[1] = "accuracy";
    o.output_dir = dir;
    o.seed = 7;
    return ct_loop_new(&r->loop, r->model, &task, 1, &ev, &o, err);
}

static ct_status run_new(run *r, const char *dir, ct_loop_options o, ct_error *err) {
    return run_new_opt(r, dir, o, ct_adam_new(ct_adam_default_params()), err);
}

static void run_free(run *r) {
    ct_loop_free(r->loop);
    ct_stream_free(r->train);
    ct_stream_free(r->eval);
    ct_layer_free(r->model);
    ct_layer_free(r->loss);
    ct_layer_free(r->metric_loss);
    ct_layer_free(r->metric_acc);
    ct_schedule_free(r->schedule);
}

// Copies of the weights and slots.
static void snapshot(const ct_loop *loop, float **w, size_t *nw, float **s, size_t *ns) {
    ct_trainer *tr = ct_loop_trainer(loop);
    const ct_net *net = ct_loop_net(loop);
    float *slots = ct_trainer_slots(tr, ns);
    *nw = net->n_weights;
    *w = malloc(*nw * sizeof **w + 4);
    memcpy(*w, net->weights, *nw * sizeof **w);
    *s = malloc(*ns * sizeof **s + 4);
    if (*ns) memcpy(*s, slots, *ns * sizeof **s);  // SGD has no slots (and no slab: NULL)
}

static void test_files_and_resume(void) {
    char *a = temp_dir("a"), *b = temp_dir("b");
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 5;
    ct_error err;
    run r;

    // Uninterrupted: 20 steps.
    CHECK_OK(run_new(&r, a, o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 20, &err), &err);
    CHECK(ct_loop_step(r.loop) == 20);
    float *w1, *s1;
    size_t nw1, ns1;
    snapshot(r.loop, &w1, &nw1, &s1, &ns1);
    int n_hist;
    const ct_history_entry *h = ct_loop_history(r.loop, &n_hist);
    CHECK(n_hist > 0);
    double eval_loss = ct_loop_last_value(r.loop, "eval", "metrics/loss");
    CHECK(isfinite(eval_loss));
    (void)h;
    run_free(&r);
    // Checkpoints at 1, 5, ..., 20: the last two regular ones are kept.
    CHECK(exists(a, "model_20/weights.safetensors") && exists(a, "model_20/slots.safetensors"));
    CHECK(exists(a, "model_15/state.json") && !exists(a, "model_5") && !exists(a, "model_1"));
    CHECK(exists(a, "checkpoint") && exists(a, "metrics.jsonl") && exists(a, "train") && exists(a, "eval"));

    // Interrupted: 13 steps (last checkpoint at 10, plus the final one at
    // 13), then the newest is removed as if the run had died at step 12.
    CHECK_OK(run_new(&r, b, o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 13, &err), &err);
    run_free(&r);
    CHECK(exists(b, "model_13"));
    CHECK_OK(ct_checkpoint_remove(b, "model_13", &err), &err);
    // The pointer now names a missing checkpoint: resume falls back to model_10.
    CHECK_OK(run_new(&r, b, o, &err), &err);
    CHECK(strcmp(ct_loop_restored_from(r.loop), "model_10") == 0);
    CHECK(ct_loop_step(r.loop) == 10);
    CHECK_OK(ct_loop_run(r.loop, 20, &err), &err);
    float *w2, *s2;
    size_t nw2, ns2;
    snapshot(r.loop, &w2, &nw2, &s2, &ns2);
    CHECK(nw1 == nw2 && ns1 == ns2);
    CHECK_MSG(memcmp(w1, w2, nw1 * sizeof *w1) == 0, "resumed weights differ from the uninterrupted run's");
    CHECK_MSG(memcmp(s1, s2, ns1 * sizeof *s1) == 0, "resumed optimizer slots differ");
    CHECK(ct_loop_last_value(r.loop, "eval", "metrics/loss") == eval_loss);
    printf("resume: 20 steps straight vs 10 + resumed 10: weights and slots bitwise equal (%zu + %zu floats)\n", nw1,
           ns1);
    run_free(&r);

    // metrics.jsonl of the resumed run has each (step, mode, metric) once.
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", b);
    char *text;
    size_t n;
    CHECK_OK(ct_fs_read(path, &text, &n, &err), &err);
    int lines = 0, eval20 = 0;
    for (char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        lines++;
        if (!strncmp(p, "{\"step\": 20, \"mode\": \"eval\", \"metric\": \"metrics/loss\"", 53)) eval20++;
    }
    CHECK_MSG(eval20 == 1, "eval loss at step 20 logged %d times", eval20);
    printf("metrics.jsonl after resume: %d lines\n", lines);
    free(text);
    // Starting over on purpose ignores the checkpoints (and the metrics of
    // the old run).
    o.restore = false;
    CHECK_OK(run_new(&r, b, o, &err), &err);
    CHECK(ct_loop_step(r.loop) == 0 && ct_loop_restored_from(r.loop)[0] == 0);
    run_free(&r);
    // A caller that has searched already (ctrax train does, to decide what to
    // set aside) hands the loop what it opened, and the loop resumes from
    // that without a search of its own (one reads and checks every byte of
    // the checkpoint): given model_15, it resumes there, not at the newest,
    // model_20, and leaves the caller's checkpoint open.
    ct_checkpoint *given = NULL;
    CHECK_OK(ct_checkpoint_open(&given, a, "model_15", &err), &err);
    o.restore = true;
    o.restore_checkpoint = given;
    CHECK_OK(run_new(&r, a, o, &err), &err);
    CHECK_MSG(r.loop && ct_loop_step(r.loop) == 15 && !strcmp(ct_loop_restored_from(r.loop), "model_15"),
              "resumed from '%s' at step %lld", r.loop ? ct_loop_restored_from(r.loop) : "",
              r.loop ? (long long)ct_loop_step(r.loop) : -1LL);
    run_free(&r);
    CHECK(given && ct_checkpoint_step(given) == 15);
    ct_checkpoint_close(given);
    o.restore_checkpoint = NULL;

    free(w1), free(w2), free(s1), free(s2);
    ct_fs_remove_tree(a, NULL);
    ct_fs_remove_tree(b, NULL);
    free(a), free(b);
}

// Every optimizer's slots (SM3's and Adafactor's of their own layouts) and
// every trainer's slabs come back exactly: 10 steps straight and 4 + resumed
// 6 (dropout on) end with the same weights and slots, bit for bit, on the
// standard trainer on one and two local devices and on the memory-efficient
// trainer on two.
static ct_optimizer *optimizer_at(int i) {
    switch (i) {
    case 0: return ct_sgd_new(ct_sgd_default_params());
    case 1: return ct_momentum_new(ct_momentum_default_params());
    case 2: return ct_rmsprop_new(ct_rmsprop_default_params());
    case 3: return ct_adafactor_new(ct_adafactor_default_params());
    default: return ct_sm3_new(ct_sm3_default_params());
    }
}

static void test_optimizers_resumed(void) {
    static const char *optimizers[] = {"SGD", "Momentum", "RMSProp", "Adafactor", "SM3"};
    static const char *trainers[] = {"standard, 1 device", "standard, 2 devices", "memory-efficient, 2 devices"};
    int equal = 0, runs = 0;
    for (int i = 0; i < 5; i++)
        for (int t = 0; t < 3; t++) {
            char *a = temp_dir("opt_a"), *b = temp_dir("opt_b");
            ct_loop_options o = ct_loop_default_options();
            o.n_steps_per_checkpoint = 2;
            o.trainer.n_devices = t == 0 ? 1 : 2;
            o.trainer.memory_efficient = t == 2;
            ct_error err;
            run r;
            float *w1 = NULL, *s1 = NULL, *w2 = NULL, *s2 = NULL;
            size_t nw1 = 0, ns1 = 0, nw2 = 0, ns2 = 0;
            CHECK_OK(run_new_opt(&r, a, o, optimizer_at(i), &err), &err);
            if (i == 2 && r.loop) {  // the trainer starts RMSProp's mean square at ones, as Trax
                size_t ns = 0;
                const float *fresh = ct_trainer_slots(ct_loop_trainer(r.loop), &ns);
                size_t ones = 0;
                for (size_t k = 0; k < ns; k++) ones += fresh[k] == 1.0f;
                CHECK_MSG(ns > 0 && ones == ns, "RMSProp, %s: %zu of %zu fresh slots are 1", trainers[t], ones, ns);
            }
            if (r.loop && ct_loop_run(r.loop, 10, &err) == CT_OK) snapshot(r.loop, &w1, &nw1, &s1, &ns1);
            run_free(&r);
            CHECK_OK(run_new_opt(&r, b, o, optimizer_at(i), &err), &err);
            if (r.loop) CHECK_OK(ct_loop_run(r.loop, 4, &err), &err);
            run_free(&r);
            CHECK_OK(run_new_opt(&r, b, o, optimizer_at(i), &err), &err);
            if (r.loop) {
                CHECK(ct_loop_step(r.loop) == 4);
                if (ct_loop_run(r.loop, 10, &err) == CT_OK) snapshot(r.loop, &w2, &nw2, &s2, &ns2);
            }
            run_free(&r);
            bool same = w1 && w2 && nw1 == nw2 && ns1 == ns2 && !memcmp(w1, w2, nw1 * sizeof *w1) &&
                        !memcmp(s1, s2, ns1 * sizeof *s1);
            CHECK_MSG(same, "%s, %s: 4 + resumed 6 steps: weights or slots differ from 10 straight", optimizers[i],
                      trainers[t]);
            equal += same, runs++;
            free(w1), free(s1), free(w2), free(s2);
            ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL);
            free(a), free(b);
        }
    printf("SGD, Momentum, RMSProp, Adafactor, SM3 on the standard trainer (1, 2 devices) and the memory-efficient one "
           "(2 devices): %d of %d resumed at 4 end bit for bit as 10 steps straight\n", equal, runs);
}

// ---- the checkpoint of step 1 ----------------------------------------------------

// A copy of the weights after step 1, taken by a callback.
typedef struct first_step {
    const ct_loop *loop;
    float *w;
    size_t n;
    int64_t saved[8];  // steps of the checkpoints written
    char names[8][32];
    int n_saved;
} first_step;

static void keep_step_1(int64_t step, void *user) {
    first_step *f = user;
    if (step != 1 || f->w) return;
    const ct_net *net = ct_loop_net(f->loop);
    f->n = net->n_weights;
    f->w = malloc(f->n * sizeof *f->w + 4);
    memcpy(f->w, net->weights, f->n * sizeof *f->w);
}

static void note_checkpoint(const char *name, int64_t step, void *user) {
    first_step *f = user;
    if (f->n_saved < 8) {
        f->saved[f->n_saved] = step;
        snprintf(f->names[f->n_saved], sizeof f->names[0], "%s", name);
    }
    f->n_saved++;
}

// Reads checkpoint `name`'s weights into w (laid out as net's slab).
static ct_status checkpoint_weights(const char *dir, const char *name, const ct_net *net, float *w, ct_error *err) {
    ct_tensor_request *reqs = calloc((size_t)net->n_params, sizeof *reqs);
    for (int p = 0; p < net->n_params; p++) {
        const ct_param *pp = net->params[p];
        reqs[p].file = "weights.safetensors";
        reqs[p].name = pp->full_name;
        reqs[p].dest = pp->sig;
        reqs[p].dest.data = w + pp->offset;
    }
    ct_status st = ct_checkpoint_read(dir, name, reqs, net->n_params, CT_LOAD_STRICT, NULL, err);
    free(reqs);
    return st;
}

// With the default cadence (every 100 steps, and step 1), a run of 4 steps
// writes model_1 with the weights after step 1, and model_4 at the end;
// keep_last 10 keeps both, so the test sees what was written, not what
// pruning left. The eval of step 1 is there too.
static void test_first_checkpoint(void) {
    char *dir = temp_dir("first");
    ct_loop_options o = ct_loop_default_options();
    o.keep_last = 10;
    first_step f = {0};
    o.callbacks[0] = (ct_loop_callback){.on_step_end = keep_step_1, .on_checkpoint = note_checkpoint, .user = &f};
    o.n_callbacks = 1;
    ct_error err;
    run r;
    CHECK_OK(run_new(&r, dir, o, &err), &err);
    f.loop = r.loop;
    float *w0 = malloc(ct_loop_net(r.loop)->n_weights * sizeof *w0 + 4);
    memcpy(w0, ct_loop_net(r.loop)->weights, ct_loop_net(r.loop)->n_weights * sizeof *w0);
    CHECK_OK(ct_loop_run(r.loop, 4, &err), &err);
    CHECK_MSG(f.n_saved == 2 && f.saved[0] == 1 && !strcmp(f.names[0], "model_1") && f.saved[1] == 4 &&
                  !strcmp(f.names[1], "model_4"),
              "checkpoints written: %d, the first %s at step %lld (expected model_1 at step 1, then model_4)",
              f.n_saved, f.n_saved ? f.names[0] : "none", f.n_saved ? (long long)f.saved[0] : -1LL);
    CHECK_MSG(exists(dir, "model_1/weights.safetensors"), "no checkpoint model_1 after a run of 4 steps");
    int n_hist, eval1 = 0;
    const ct_history_entry *h = ct_loop_history(r.loop, &n_hist);
    for (int i = 0; i < n_hist; i++) eval1 += !strcmp(h[i].mode, "eval") && h[i].step == 1;
    CHECK_MSG(eval1 == 2, "%d eval metrics recorded at step 1, expected 2", eval1);

    // model_1 holds the weights of step 1: not the initial ones, not step 4's.
    const ct_net *net = ct_loop_net(r.loop);
    float *w1 = calloc(net->n_weights + 1, sizeof *w1);
    CHECK(f.w && f.n == net->n_weights);
    if (f.w && f.n == net->n_weights && exists(dir, "model_1")) {
        CHECK_OK(checkpoint_weights(dir, "model_1", net, w1, &err), &err);
        CHECK_MSG(memcmp(w1, f.w, f.n * sizeof *w1) == 0, "model_1 does not hold the weights after step 1");
        CHECK(memcmp(w1, w0, f.n * sizeof *w1) != 0 && memcmp(w1, net->weights, f.n * sizeof *w1) != 0);
        ct_checkpoint *c;
        CHECK_OK(ct_checkpoint_open(&c, dir, "model_1", &err), &err);
        CHECK(ct_checkpoint_step(c) == 1);
        ct_checkpoint_close(c);
    }
    run_free(&r);
    free(w0), free(w1), free(f.w);
    ct_fs_remove_tree(dir, NULL);
    free(dir);
}

// ---- step keys -------------------------------------------------------------------

// Every step gets its own key, fold_in(split(loop key, 1), step) (loop.h),
// so dropout masks differ from step to step and a resume redraws them.

static bool every_step(int64_t step, void *user) {
    (void)step, (void)user;
    return true;
}

// B examples of LEN tokens in a token file, repeated forever in order and
// batched by B: every batch is the same batch.
static ct_stream *same_batch_forever(const char *dir, ct_error *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokens.bin", dir);
    uint16_t tok[B * LEN];
    for (int i = 0; i < B * LEN; i++) tok[i] = (uint16_t)(1 + (7 * i) % (VOCAB - 1));
    CHECK_OK(ct_fs_mkdirs(dir, err), err);
    CHECK_OK(ct_fs_write_atomic(path, tok, sizeof tok, err), err);
    const char *paths[1] = {path};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = LEN;
    p.token_bytes = 2;
    ct_stream *s;
    CHECK_OK(ct_token_stream_new(&s, &p, err), err);
    CHECK_OK(ct_epochs_stream_new(&s, s, false, 0, 0, err), err);
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = B;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, err), err);
    return s;
}

// The train loss of steps 1..n on one batch with a learning rate of 0: the
// weights never change, so only the dropout masks can make two steps differ.
static void frozen_losses(const char *dir, float dropout, int n, double *loss) {
    ct_error err;
    ct_stream *train = same_batch_forever(dir, &err);
    ct_layer *model = small_lm(dropout), *l = ct_weighted_category_cross_entropy();
    ct_schedule *zero;
    CHECK_OK(ct_schedule_constant(0.0, &zero, &err), &err);
    ct_train_task task = {train, l, ct_sgd_new(ct_sgd_default_params()), zero, "loss", 0};
    ct_loop_options o = ct_loop_default_options();
    o.eval_at = every_step;  // logs each step's train loss on its own
    o.seed = 3;
    ct_loop *loop;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err), &err);
    for (int i = 0; i < n; i++) loss[i] = NAN;
    CHECK_OK(ct_loop_run(loop, n, &err), &err);
    int n_hist;
    const ct_history_entry *h = ct_loop_history(loop, &n_hist);
    for (int i = 0; i < n_hist; i++)
        if (!strcmp(h[i].mode, "train") && !strcmp(h[i].metric, "metrics/loss") && h[i].step >= 1 && h[i].step <= n)
            loss[h[i].step - 1] = h[i].value;
    ct_loop_free(loop);
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(l);
    ct_schedule_free(zero);
}

// A malloc'ed copy of net's weights (free it), their count in *n.
static float *weights_copy(const ct_net *net, size_t *n) {
    *n = net->n_weights;
    float *w = malloc(*n * sizeof *w + 4);  // + 4: never malloc(0)
    memcpy(w, net->weights, *n * sizeof *w);
    return w;
}

// The weights after 3 steps of the Loop (seed 11, small_lm(0.3) on the
// copy batches, SGD or Adam at its default rate), malloc'd; NULL on failure.
static float *loop_weights_seed11(bool adam, size_t *n) {
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0.3f), *l = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, l,
                          adam ? ct_adam_new(ct_adam_default_params()) : ct_sgd_new(ct_sgd_default_params()), NULL,
                          NULL, adam ? ct_adam_default_params().learning_rate : ct_sgd_default_params().learning_rate};
    ct_loop_options o = ct_loop_default_options();
    o.seed = 11;
    ct_loop *loop = NULL;
    ct_error err;
    float *w = NULL;
    *n = 0;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err), &err);
    ct_status st = loop ? ct_loop_run(loop, 3, &err) : CT_ERR_STATE;
    CHECK_MSG(st == CT_OK, "the Loop's 3 steps: %s", err.msg);
    if (st == CT_OK) {
        w = weights_copy(ct_loop_net(loop), n);
    }
    ct_loop_free(loop);
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(l);
    return w;
}

// The Loop's weights after n steps against a trainer driven by hand with the
// keys loop.h promises: fold_in(split(key, 1), s) for step s, where key comes
// from the seed and the trainer's init key is split(key, 0). With constant
// = true the hand-driven trainer uses split(key, 1) at every step instead.
// lr: step s's learning rate is lr's value at s (NULL: the optimizer's
// default). adam: Adam, whose bias correction sees the step, instead of SGD,
// which ignores it; the trainer is handed step s + first - 1 (first = 1: the
// Loop's 1-based steps).
static float *trainer_by_hand(uint64_t seed, int n, bool constant, const ct_schedule *lr, bool adam, int64_t first,
                              size_t *nw) {
    ct_error err;
    ct_stream *s = copy_batches(1);
    ct_layer *model = small_lm(0.3f), *l = ct_weighted_category_cross_entropy();
    ct_batch b;
    ct_stream_cursor start = ct_stream_get_cursor(s);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    for (int i = 0; i < b.n; i++) sigs[i] = ct_tensor_sig(&b.t[i]);
    CHECK_OK(ct_stream_set_cursor(s, start, &err), &err);
    ct_key key = ct_key_from_seed(seed);
    ct_device dev = ct_device_cpu();
    ct_trainer *t;
    ct_optimizer *opt = adam ? ct_adam_new(ct_adam_default_params()) : ct_sgd_new(ct_sgd_default_params());
    float default_lr = adam ? ct_adam_default_params().learning_rate : ct_sgd_default_params().learning_rate;
    CHECK_OK(ct_trainer_new(&t, model, l, sigs, b.n, opt, ct_key_split(key, 0), &dev, NULL, &err), &err);
    for (int step = 1; step <= n; step++) {
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        ct_key k = constant ? ct_key_split(key, 1) : ct_key_fold_in(ct_key_split(key, 1), (uint32_t)step);
        ct_step_stats stats;
        float rate = lr ? ct_schedule_value(lr, step) : default_lr;
        CHECK_OK(ct_trainer_one_step(t, b.t, k, step + first - 1, rate, &stats, &err), &err);
    }
    float *w = weights_copy(ct_trainer_net(t), nw);
    ct_trainer_free(t);
    ct_stream_free(s);
    ct_layer_free(model), ct_layer_free(l);
    return w;
}

static void test_step_keys(void) {
    // Dropout on, one batch, weights frozen: each step's loss is its own.
    enum { N = 4 };
    char *dir = temp_dir("keys");
    double with[N], without[N];
    frozen_losses(dir, 0.3f, N, with);
    frozen_losses(dir, 0.0f, N, without);
    printf("loss of one batch at steps 1..%d, weights frozen: with dropout", N);
    for (int i = 0; i < N; i++) printf(" %.6f", with[i]);
    printf("; without %.6f\n", without[0]);
    for (int i = 0; i < N; i++) {
        CHECK_MSG(isfinite(with[i]) && isfinite(without[i]), "no train loss logged at step %d", i + 1);
        // Without dropout the steps agree: the setup really repeats one batch.
        CHECK_MSG(without[i] == without[0], "without dropout, step %d's loss %.9g differs from step 1's %.9g", i + 1,
                  without[i], without[0]);
        for (int j = 0; j < i; j++)
            CHECK_MSG(with[i] != with[j], "steps %d and %d drew the same dropout masks (loss %.9g)", j + 1, i + 1,
                      with[i]);
    }
    ct_fs_remove_tree(dir, NULL);
    free(dir);

    // The keys themselves: the Loop's run equals a trainer given
    // fold_in(split(key, 1), s) by hand, bit for bit.
    size_t n_loop, n_by_hand, n_constant;
    float *looped = loop_weights_seed11(false, &n_loop);
    float *by_hand = trainer_by_hand(11, 3, false, NULL, false, 1, &n_by_hand);
    float *constant = trainer_by_hand(11, 3, true, NULL, false, 1, &n_constant);
    CHECK(looped && n_by_hand == n_loop && n_constant == n_loop);
    if (looped && n_by_hand == n_loop && n_constant == n_loop) {
        CHECK_MSG(memcmp(looped, by_hand, n_by_hand * sizeof *by_hand) == 0,
                  "the Loop's 3 steps differ from a trainer given fold_in(split(key, 1), step) at each step");
        // The check can tell: one key for every step gives other weights.
        CHECK(memcmp(by_hand, constant, n_by_hand * sizeof *by_hand) != 0);
    }
    free(looped), free(by_hand), free(constant);

    // Past 2^32 steps the step's high bits are folded in after its low ones
    // (step 2^32 + 5 took step 5's key: the cast to uint32_t dropped them);
    // below 2^32 the key is the one above, so earlier runs resume unchanged.
    ct_key key = ct_key_from_seed(11), base = ct_key_split(key, 1);
    for (int64_t high = 0; high < 3; high++) {
        int64_t step = (high << 32) + 5;
        ct_key got = ct_train_step_key(key, step), want = ct_key_fold_in(base, 5);
        if (high) want = ct_key_fold_in(want, (uint32_t)high);
        CHECK_MSG(got.w[0] == want.w[0] && got.w[1] == want.w[1], "step %lld: key %08x %08x, want %08x %08x",
                  (long long)step, got.w[0], got.w[1], want.w[0], want.w[1]);
    }
    ct_key k5 = ct_train_step_key(key, 5), far = ct_train_step_key(key, ((int64_t)1 << 32) + 5);
    CHECK_MSG(k5.w[0] != far.w[0] || k5.w[1] != far.w[1], "steps 5 and 2^32 + 5 share a key");
}

// ---- the learning-rate schedule sees the 1-based step ----------------------------

// Trax's warmup(9, 0.01) is 0.001 at step 1 (its test's value): the Loop's
// first update is step 1, so it logs 0.001 there and 0.002 at step 2, and
// its weights are a trainer's given the schedule's value at steps 1, 2, 3.
static void test_schedule_steps(void) {
    ct_error err;
    ct_schedule *warm;
    CHECK_OK(ct_schedule_warmup(9, 0.01, &warm, &err), &err);
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0.3f), *l = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, l, ct_sgd_new(ct_sgd_default_params()), warm, NULL, 0};
    ct_loop_options o = ct_loop_default_options();
    o.seed = 11;
    o.eval_at = every_step;  // logs every step's learning rate
    ct_loop *loop;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err), &err);
    CHECK_OK(ct_loop_run(loop, 3, &err), &err);
    int n_hist;
    double lr[4] = {NAN, NAN, NAN, NAN};
    const ct_history_entry *h = ct_loop_history(loop, &n_hist);
    for (int i = 0; i < n_hist; i++)
        if (!strcmp(h[i].metric, "training/learning_rate") && h[i].step >= 1 && h[i].step <= 3) lr[h[i].step] = h[i].value;
    printf("warmup(9, 0.01): learning rate logged at steps 1, 2, 3: %.9g %.9g %.9g\n", lr[1], lr[2], lr[3]);
    for (int s = 1; s <= 3; s++)
        CHECK_MSG(fabs(lr[s] - 0.001 * s) <= 1e-9, "step %d's learning rate %.9g, Trax's warmup(9, 0.01)(%d) = %g", s,
                  lr[s], s, 0.001 * s);
    size_t nw;
    float *by_hand = trainer_by_hand(11, 3, false, warm, false, 1, &nw);
    const ct_net *net = ct_loop_net(loop);
    CHECK_MSG(nw == net->n_weights && memcmp(net->weights, by_hand, nw * sizeof *by_hand) == 0,
              "the Loop's 3 steps differ from a trainer given the schedule's value at steps 1, 2, 3");
    free(by_hand);
    ct_loop_free(loop);
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(l);
    ct_schedule_free(warm);
}

// ---- the optimizer sees the 1-based step ------------------------------------------

// The Loop hands the trainer its 1-based step (Trax increments before
// one_step), so Adam's bias correction at the first update uses step + 1 =
// 2: the Loop's 3 Adam steps equal a trainer given steps 1, 2, 3 by hand,
// bit for bit, and not one given 0, 1, 2 (SGD, which ignores the step, could
// not tell the two apart).
static void test_optimizer_steps(void) {
    size_t n_loop, n1, n0;
    float *looped = loop_weights_seed11(true, &n_loop);
    float *from_1 = trainer_by_hand(11, 3, false, NULL, true, 1, &n1);
    float *from_0 = trainer_by_hand(11, 3, false, NULL, true, 0, &n0);
    CHECK(looped && n1 == n_loop && n0 == n_loop);
    if (looped && n1 == n_loop && n0 == n_loop) {
        CHECK_MSG(memcmp(looped, from_1, n1 * sizeof *from_1) == 0,
                  "the Loop's 3 Adam steps differ from a trainer given steps 1, 2, 3");
        CHECK_MSG(memcmp(from_1, from_0, n1 * sizeof *from_1) != 0, "Adam given steps 0, 1, 2 gave the same weights");
    }
    free(looped), free(from_1), free(from_0);
}

// A checkpoint holds the loop's key (loop.h): a run resumed with another
// seed goes on with the checkpoint's key, so its dropout masks, and with them
// its weights, are the uninterrupted run's bit for bit. (A resume with the
// same seed could not tell: its key from the seed is the same.)
static float *seeded_run(const char *dir, uint64_t seed, int64_t to, size_t *n) {
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0.3f), *l = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, l, ct_adam_new(ct_adam_default_params()), NULL, NULL, ct_adam_default_params().learning_rate};
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = dir;
    o.seed = seed;
    ct_loop *loop;
    ct_error err;
    float *w = NULL;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err), &err);
    if (loop) {
        CHECK_OK(ct_loop_run(loop, to, &err), &err);
        w = weights_copy(ct_loop_net(loop), n);
        ct_loop_free(loop);
    }
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(l);
    return w;
}

static void test_resume_keeps_key(void) {
    char *a = temp_dir("key_a"), *b = temp_dir("key_b");
    size_t na = 0, nb = 0;
    float *straight = seeded_run(a, 11, 4, &na);
    free(seeded_run(b, 11, 2, &nb));
    float *resumed = seeded_run(b, 99, 4, &nb);  // another seed: the checkpoint's key wins
    CHECK(straight && resumed && na == nb);
    if (straight && resumed && na == nb)
        CHECK_MSG(memcmp(straight, resumed, na * sizeof *straight) == 0,
                  "resumed at 2 with seed 99: weights differ from the seed-11 run's (the checkpoint's key was not used)");
    free(straight), free(resumed);
    ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL);
    free(a), free(b);
}

// ---- Trax's lowest/highest test --------------------------------------------------

// A metric that only falls: 1/calls, whatever its inputs.
static void falling_fwd(const ct_tensor *in, ct_tensor *out, const void *user) {
    (void)in;
    int *calls = (int *)user;
    ct_f32(&out[0])[0] = 1.0f / (float)++*calls;
}
static ct_status scalar_shape(const ct_tensor *in, ct_tensor *out, const void *user, ct_error *err) {
    (void)in, (void)user, (void)err;
    out[0] = ct_tensor_make(CT_DTYPE_F32, 0, NULL, NULL);
    return CT_OK;
}

typedef struct ckpt_counts {
    const char *dir;
    int lowest, highest, regular;
    int pointer_moved;  // best checkpoints the pointer named once written
    int unlogged;       // checkpoints whose step's last metrics line was not in metrics.jsonl yet
    int64_t last_step;  // the run's last step, which logs whether or not it evaluates
} ckpt_counts;

// Does dir/file hold the line prefix?
static bool file_has(const char *dir, const char *file, const char *prefix) {
    char path[512], *text = NULL;
    size_t n;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (ct_fs_read(path, &text, &n, NULL) != CT_OK) return false;
    bool found = false;
    for (char *p = text; p && *p && !found; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        found = !strncmp(p, prefix, strlen(prefix));
    free(text);
    return found;
}

// Counts the checkpoints by kind; when one is written, its step's metrics
// are already in metrics.jsonl (a resumed run would not log them again) and
// a best checkpoint is not what the pointer names (it is a copy, written
// before its step's own checkpoint).
static void count_checkpoint(const char *name, int64_t step, void *user) {
    ckpt_counts *c = user;
    bool best = !strncmp(name, "lowest_", 7) || !strncmp(name, "highest_", 8);
    if (!strncmp(name, "lowest_", 7)) c->lowest++;
    else if (!strncmp(name, "highest_", 8)) c->highest++;
    else c->regular++;
    char line[128];
    if (best) {
        snprintf(line, sizeof line, "%s\n", name);
        c->pointer_moved += file_has(c->dir, "checkpoint", line);
        snprintf(line, sizeof line, "{\"step\": %lld, \"mode\": \"eval\", \"metric\": \"metrics/falling\"",
                 (long long)step);
    } else {
        snprintf(line, sizeof line, "{\"step\": %lld, \"mode\": \"train\", \"metric\": \"training/loss\"",
                 (long long)step);
    }
    bool logs = step % 2 == 0 || step == c->last_step;  // steps 2, 4, ... and the last
    if (logs && !file_has(c->dir, "metrics.jsonl", line)) c->unlogged++;
}

static bool every_2(int64_t step, void *user) {
    (void)user;
    return step % 2 == 0;
}

// A loop over copy batches whose one eval metric, "falling", is what fwd
// gives (its user: the count of calls), evaluated every 2 steps, with both
// best checkpoints on it; counts sees every checkpoint.
typedef struct best_run {
    char *dir;
    int calls;
    ct_stream *train, *eval;
    ct_layer *model, *loss, *metric;
    ckpt_counts counts;
    ct_loop *loop;
} best_run;

static void best_run_start(best_run *r, const char *name, const char *fn_name,
                           void (*fwd)(const ct_tensor *, ct_tensor *, const void *)) {
    *r = (best_run){.dir = name ? temp_dir(name) : r->dir};
    ct_fn_spec spec = {fn_name, 3, 1, scalar_shape, fwd, NULL, &r->calls};
    r->train = copy_batches(1), r->eval = copy_batches(2);
    r->model = small_lm(0), r->loss = ct_weighted_category_cross_entropy(), r->metric = ct_fn(&spec);
    ct_train_task task = {r->train, r->loss, ct_sgd_new(ct_sgd_default_params()), NULL, NULL,
                          ct_sgd_default_params().learning_rate};
    ct_eval_task ev = {.stream = r->eval, .n_metrics = 1, .n_batches = 1};
    ev.metrics[0] = r->metric;
    ev.metric_names[0] = "falling";
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = r->dir;
    o.eval_at = every_2;
    o.checkpoint_low_metric = "falling";
    o.checkpoint_high_metric = "falling";
    o.callbacks[0] = (ct_loop_callback){.on_checkpoint = count_checkpoint, .user = &r->counts};
    o.n_callbacks = 1;
    ct_error err;
    CHECK_OK(ct_loop_new(&r->loop, r->model, &task, 1, &ev, &o, &err), &err);
}

// keep_dir: the directory stays, for a run that resumes there (best_run_start
// with no name).
static void best_run_stop(best_run *r, bool keep_dir) {
    ct_loop_free(r->loop);
    ct_stream_free(r->train);
    ct_stream_free(r->eval);
    ct_layer_free(r->model), ct_layer_free(r->loss), ct_layer_free(r->metric);
    if (keep_dir) return;
    ct_fs_remove_tree(r->dir, NULL);
    free(r->dir);
}

static void best_run_free(best_run *r) { best_run_stop(r, false); }

static void test_best_checkpoints(void) {
    best_run r;
    best_run_start(&r, "best", "Falling", falling_fwd);
    ct_error err;
    r.counts = (ckpt_counts){.dir = r.dir, .last_step = 10};
    CHECK_OK(ct_loop_run(r.loop, 10, &err), &err);
    ckpt_counts counts = r.counts;
    printf("best checkpoints over 10 steps, eval every 2: lowest %d, highest %d, regular %d\n", counts.lowest,
           counts.highest, counts.regular);
    CHECK(counts.lowest == 5 && counts.highest == 1);
    // Regular ones at step 1 and at the end (step 10): the default cadence is
    // every 100 steps.
    CHECK_MSG(counts.regular == 2, "%d regular checkpoints, expected 2 (steps 1 and 10)", counts.regular);
    CHECK_MSG(counts.pointer_moved == 0, "the pointer named a best checkpoint %d times", counts.pointer_moved);
    CHECK_MSG(counts.unlogged == 0, "%d checkpoints written before their step's metrics were", counts.unlogged);
    // A last step that does not evaluate logs its training metrics before its checkpoint too.
    r.counts = (ckpt_counts){.dir = r.dir, .last_step = 11};
    CHECK_OK(ct_loop_run(r.loop, 11, &err), &err);
    CHECK_MSG(r.counts.regular == 1 && r.counts.unlogged == 0,
              "step 11: %d regular checkpoints, %d before their metrics", r.counts.regular, r.counts.unlogged);
    CHECK(exists(r.dir, "lowest_falling") && exists(r.dir, "highest_falling"));
    best_run_free(&r);
}

// A metric that never moves: every eval ties the best.
static void constant_fwd(const ct_tensor *in, ct_tensor *out, const void *user) {
    (void)in, (void)user;
    ct_f32(&out[0])[0] = 0.5f;
}

// Ties count, as Trax's (its _at_lowest is vals[-1] == min(vals)): a metric
// that never moves writes lowest_ and highest_ at every eval.
static void test_best_ties(void) {
    best_run r;
    best_run_start(&r, "best_ties", "Constant", constant_fwd);
    ct_error err;
    r.counts = (ckpt_counts){.dir = r.dir, .last_step = 6};
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    printf("a constant metric, evals at 2, 4, 6: lowest_ written %d times, highest_ %d times\n", r.counts.lowest,
           r.counts.highest);
    CHECK_MSG(r.counts.lowest == 3 && r.counts.highest == 3, "ties: lowest_ %d times, highest_ %d (want 3 and 3)",
              r.counts.lowest, r.counts.highest);
    best_run_free(&r);
}

// A metric that is NaN at its first eval (every weight 0, say), then falls.
static void nan_then_falling_fwd(const ct_tensor *in, ct_tensor *out, const void *user) {
    (void)in;
    int *calls = (int *)user;
    ct_f32(&out[0])[0] = ++*calls == 1 ? NAN : 1.0f / (float)*calls;
}

// The step of checkpoint name in dir, or -1.
static int64_t checkpoint_step_of(const char *dir, const char *name) {
    ct_checkpoint *c;
    if (ct_checkpoint_open(&c, dir, name, NULL) != CT_OK) return -1;
    int64_t step = ct_checkpoint_step(c);
    ct_checkpoint_close(c);
    return step;
}

// A NaN eval is no best, and does not stop later evals from being one (a
// first NaN was kept as the best, and no value compares <= or >= NaN, so
// lowest_ stayed the step-2 checkpoint for good).
static void test_best_after_nan(void) {
    best_run r;
    best_run_start(&r, "best_nan", "NanThenFalling", nan_then_falling_fwd);
    ct_error err;
    r.counts = (ckpt_counts){.dir = r.dir, .last_step = 6};
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    int64_t low = checkpoint_step_of(r.dir, "lowest_falling"), high = checkpoint_step_of(r.dir, "highest_falling");
    printf("evals NaN, 1/2, 1/3 at steps 2, 4, 6: lowest %d (of step %lld), highest %d (of step %lld)\n",
           r.counts.lowest, (long long)low, r.counts.highest, (long long)high);
    CHECK_MSG(r.counts.lowest == 2 && low == 6, "lowest_falling written %d times, of step %lld (want 2, step 6)",
              r.counts.lowest, (long long)low);
    CHECK_MSG(r.counts.highest == 1 && high == 4, "highest_falling written %d times, of step %lld (want 1, step 4)",
              r.counts.highest, (long long)high);
    best_run_free(&r);
}

// The bests are part of a checkpoint: a run resumed after evals of 1 and
// 1/2 writes lowest_ for 1/3 (below 1/2), and highest_ for none of them.
static void test_best_resumed(void) {
    best_run r;
    best_run_start(&r, "best_resumed", "FallingResumed", falling_fwd);
    ct_error err;
    r.counts = (ckpt_counts){.dir = r.dir, .last_step = 4};
    CHECK_OK(ct_loop_run(r.loop, 4, &err), &err);
    CHECK(r.counts.lowest == 2 && r.counts.highest == 1);
    best_run_stop(&r, true);
    best_run_start(&r, NULL, "FallingResumed", falling_fwd);
    CHECK(ct_loop_step(r.loop) == 4);
    r.calls = 2;  // the metric goes on where it was: 1/3 at step 6
    r.counts = (ckpt_counts){.dir = r.dir, .last_step = 6};
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    CHECK_MSG(r.counts.lowest == 1 && r.counts.highest == 0 && checkpoint_step_of(r.dir, "lowest_falling") == 6 &&
                  checkpoint_step_of(r.dir, "highest_falling") == 2,
              "resumed at 4, eval 1/3 at 6: lowest_ written %d times, highest_ %d times", r.counts.lowest,
              r.counts.highest);
    // Resumed at 6 and run to 6: nothing to do, and no checkpoint written
    // again (the one it resumed from is the final one).
    best_run_stop(&r, true);
    best_run_start(&r, NULL, "FallingResumed", falling_fwd);
    r.counts = (ckpt_counts){.dir = r.dir, .last_step = 6};
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    CHECK_MSG(ct_loop_step(r.loop) == 6 && r.counts.regular + r.counts.lowest + r.counts.highest == 0,
              "resumed at 6, run to 6: %d checkpoints written", r.counts.regular + r.counts.lowest + r.counts.highest);
    best_run_free(&r);
}

// ---- stop, final checkpoint, tasks, fine-tuning -----------------------------------------

static volatile sig_atomic_t stop_flag;
static void stop_at_7(int64_t step, void *user) {
    (void)user;
    if (step == 7) stop_flag = 1;
}

static int alternate(int64_t step, void *user) {
    (void)user;
    return (int)(step % 2);
}

static void test_stop_final_tasks_finetune(void) {
    char *dir = temp_dir("stop"), *dir2 = temp_dir("tune");
    ct_stream *train = copy_batches(1), *other = copy_batches(5);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    float lr = ct_adam_default_params().learning_rate;
    ct_train_task tasks[2] = {{train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr},
                              {other, loss, NULL, NULL, NULL, lr}};
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = dir;
    o.n_steps_per_checkpoint = 100;
    o.stop = &stop_flag;
    o.which_task = alternate;
    o.callbacks[0] = (ct_loop_callback){.on_step_end = stop_at_7};
    o.n_callbacks = 1;
    ct_loop *loop;
    ct_error err;
    CHECK_OK(ct_loop_new(&loop, model, tasks, 2, NULL, &o, &err), &err);
    CHECK_OK(ct_loop_run(loop, 50, &err), &err);
    CHECK(ct_loop_stopped(loop) && ct_loop_step(loop) == 7);
    CHECK(exists(dir, "model_7"));
    // Both tasks took batches: 4 of task 1 (odd steps), 3 of task 0.
    ct_stream_cursor c0 = ct_stream_get_cursor(train), c1 = ct_stream_get_cursor(other);
    CHECK_MSG(c0.position == 3 && c1.position == 4, "task cursors %lld and %lld", (long long)c0.position,
              (long long)c1.position);
    ct_loop_free(loop);
    stop_flag = 0;

    // Going on to step 9 (not on the cadence) still ends with a checkpoint.
    tasks[0].optimizer = ct_adam_new(ct_adam_default_params());  // the last loop owned the first
    CHECK_OK(ct_loop_new(&loop, model, tasks, 2, NULL, &o, &err), &err);
    CHECK(ct_loop_step(loop) == 7);
    o.n_callbacks = 0;
    CHECK_OK(ct_loop_run(loop, 9, &err), &err);
    CHECK(exists(dir, "model_9") && !ct_loop_stopped(loop));
    float w9 = ct_trainer_net(ct_loop_trainer(loop))->weights[0];
    ct_loop_free(loop);

    // A task's loss of its own must take what task 0's takes (the model's
    // outputs, targets and weights): one without the weights is refused.
    ct_layer *other_loss = ct_category_accuracy();
    ct_train_task bad[2] = {{train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, ct_adam_default_params().learning_rate},
                            {other, other_loss, NULL, NULL, NULL, lr}};
    CHECK(ct_loop_new(&loop, model, bad, 2, NULL, &o, &err) == CT_ERR_ARG && strstr(err.msg, "takes"));
    printf("tasks with losses of different inputs: %s\n", err.msg);
    ct_layer_free(other_loss);

    // Fine-tuning: a fresh run in another directory takes model_9's weights.
    o = ct_loop_default_options();
    o.output_dir = dir2;
    ct_train_task one = {train, loss, ct_sgd_new(ct_sgd_default_params()), NULL, NULL, ct_sgd_default_params().learning_rate};
    CHECK_OK(ct_loop_new(&loop, model, &one, 1, NULL, &o, &err), &err);
    CHECK(ct_trainer_net(ct_loop_trainer(loop))->weights[0] != w9);
    CHECK_OK(ct_loop_load_weights(loop, dir, "model_9", &err), &err);
    CHECK(ct_trainer_net(ct_loop_trainer(loop))->weights[0] == w9);
    ct_loop_free(loop);

    ct_stream_free(train);
    ct_stream_free(other);
    ct_layer_free(model), ct_layer_free(loss);
    ct_fs_remove_tree(dir, NULL);
    ct_fs_remove_tree(dir2, NULL);
    free(dir), free(dir2);
}

// ---- switching trainers across a restore ------------------------------------------

static ct_layer *small_reformer(bool lsh) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    if (lsh) {
        p.attention[0] = CT_REFORMER_LSH_ATTENTION;
        p.lsh_attention.chunk_len = LEN + 1;  // half of the 2 LEN + 2 tokens
    }
    p.vocab_size = VOCAB;
    p.d_model = 8;
    p.d_ff = 16;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 2 * LEN + 2;
    p.dropout = 0;
    return ct_reformer_lm(p);
}

// Trains a ReformerLM in dir up to step `to`, with the standard or the
// memory-efficient trainer on n_devices local devices, resuming what is
// there; returns the weights.
static float *reformer_run(const char *dir, int64_t to, bool memory_efficient, int n_devices, size_t *n) {
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_reformer(false), *loss = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, ct_adam_default_params().learning_rate};
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = dir;
    o.n_steps_per_checkpoint = 5;
    o.trainer.memory_efficient = memory_efficient;
    o.trainer.n_devices = n_devices;
    ct_loop *loop;
    ct_error err;
    float *w = NULL;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err), &err);
    if (loop) {
        CHECK_OK(ct_loop_run(loop, to, &err), &err);
        w = weights_copy(ct_loop_net(loop), n);
        ct_loop_free(loop);
    }
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(loss);
    return w;
}

static void test_switch_trainers(void) {
    char *a = temp_dir("std"), *b = temp_dir("switch"), *c = temp_dir("eff"), *d = temp_dir("eff2");
    size_t n1, n2, n3, n4;
    float *std = reformer_run(a, 10, false, 1, &n1);
    // 5 standard steps, then 5 memory-efficient ones from its checkpoint.
    free(reformer_run(b, 5, false, 1, &n2));
    float *sw = reformer_run(b, 10, true, 1, &n2);
    // 5 memory-efficient, then 5 standard.
    free(reformer_run(c, 5, true, 1, &n3));
    float *back = reformer_run(c, 10, false, 1, &n3);
    // Memory-efficient on 2 local devices, 5 steps, then 5 more resumed.
    free(reformer_run(d, 5, true, 2, &n4));
    float *two = reformer_run(d, 10, true, 2, &n4);
    CHECK(std && sw && back && two && n1 == n2 && n1 == n3 && n1 == n4);
    if (std && sw && back && two && n1 == n2 && n1 == n3 && n1 == n4) {
        double d1 = 0, d2 = 0, d3 = 0, norm = 0;
        for (size_t i = 0; i < n1; i++) {
            d1 += ((double)std[i] - sw[i]) * ((double)std[i] - sw[i]);
            d2 += ((double)std[i] - back[i]) * ((double)std[i] - back[i]);
            d3 += ((double)std[i] - two[i]) * ((double)std[i] - two[i]);
            norm += (double)std[i] * std[i];
        }
        d1 = sqrt(d1 / norm), d2 = sqrt(d2 / norm), d3 = sqrt(d3 / norm);
        printf("ReformerLM, 10 steps: standard vs standard->memory-efficient %.2e, vs memory-efficient->standard "
               "%.2e, vs memory-efficient on 2 devices, resumed at 5: %.2e (relative)\n",
               d1, d2, d3);
        CHECK(d1 < 1e-5 && d2 < 1e-5 && d3 < 1e-5);
    }
    free(std), free(sw), free(back), free(two);
    ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL), ct_fs_remove_tree(c, NULL), ct_fs_remove_tree(d, NULL);
    free(a), free(b), free(c), free(d);
}

// LSHSelfAttention keeps a training step's buckets in a state with a batch
// axis, sized at init for one device's share of the batch. Evals hash into
// their own memory, so on 2 local devices the Loop's evals take each batch
// whole (before, they had to run it in the devices' pieces).
static void test_devices_eval_lsh(void) {
    ct_stream *train = copy_batches(1), *eval = copy_batches(99);
    ct_layer *model = small_reformer(true), *loss = ct_weighted_category_cross_entropy();
    ct_layer *metric = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, ct_adam_default_params().learning_rate};
    ct_eval_task ev = {.stream = eval, .n_metrics = 1, .n_batches = 2, .metrics = {metric}, .metric_names = {"loss"}};
    ct_loop_options o = ct_loop_default_options();
    o.trainer.n_devices = 2;
    o.eval_at = every_step;
    ct_loop *loop;
    ct_error err;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, &ev, &o, &err), &err);
    if (loop) {
        CHECK_OK(ct_loop_run(loop, 2, &err), &err);  // an eval at each step
        int n_hist, n_evals = 0;
        const ct_history_entry *h = ct_loop_history(loop, &n_hist);
        for (int i = 0; i < n_hist; i++)
            if (!strcmp(h[i].mode, "eval") && !strcmp(h[i].metric, "metrics/loss")) {
                CHECK_MSG(isfinite(h[i].value) && h[i].value > 0, "eval loss at step %lld: %g", (long long)h[i].step,
                          h[i].value);
                n_evals++;
            }
        CHECK_MSG(n_evals == 2, "%d evals recorded, want 2", n_evals);
        ct_loop_free(loop);
    }
    ct_stream_free(train), ct_stream_free(eval);
    ct_layer_free(model), ct_layer_free(loss), ct_layer_free(metric);
}

// An eval leaves the model's state as it was (Trax drops the state an
// eval's forward changes): an LSH ReformerLM trained 4 steps with an eval at
// every step ends with the weights and state of one that never evaluated
// (the evals advanced its hash counter, so the weights followed the evals).
static float *lsh_run(bool evals, size_t *n_weights, size_t *n_state, float **state) {
    ct_stream *train = copy_batches(1), *eval = copy_batches(99);
    ct_layer *model = small_reformer(true), *loss = ct_weighted_category_cross_entropy();
    ct_layer *metric = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, ct_adam_default_params().learning_rate};
    ct_eval_task ev = {.stream = eval, .n_metrics = 1, .n_batches = 3, .metrics = {metric}, .metric_names = {"loss"}};
    ct_loop_options o = ct_loop_default_options();
    o.eval_at = evals ? every_step : NULL;
    ct_loop *loop;
    ct_error err;
    float *w = NULL;
    *state = NULL;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, evals ? &ev : NULL, &o, &err), &err);
    if (loop) {
        CHECK_OK(ct_loop_run(loop, 4, &err), &err);
        const ct_net *net = ct_loop_net(loop);
        *n_weights = net->n_weights, *n_state = net->n_state;
        w = malloc(net->n_weights * sizeof *w), *state = malloc(net->n_state * sizeof **state + 1);
        memcpy(w, net->weights, net->n_weights * sizeof *w);
        memcpy(*state, net->state, net->n_state * sizeof **state);
        ct_loop_free(loop);
    }
    ct_stream_free(train), ct_stream_free(eval);
    ct_layer_free(model), ct_layer_free(loss), ct_layer_free(metric);
    return w;
}

static void test_evals_keep_state(void) {
    size_t nw[2], ns[2];
    float *state[2], *w[2];
    for (int e = 0; e < 2; e++) w[e] = lsh_run(e, &nw[e], &ns[e], &state[e]);
    CHECK(w[0] && w[1] && nw[0] == nw[1] && ns[0] == ns[1] && ns[0] > 0);
    if (w[0] && w[1] && nw[0] == nw[1] && ns[0] == ns[1]) {
        CHECK_MSG(!memcmp(w[0], w[1], nw[0] * sizeof(float)), "evals changed the weights trained after them");
        CHECK_MSG(!memcmp(state[0], state[1], ns[0] * sizeof(float)), "evals changed the state");
    }
    for (int e = 0; e < 2; e++) free(w[e]), free(state[e]);
}

// An eval batch need not split over the local devices: the evaluator takes
// each process's rows whole (an eval batch of 3 on 2 devices failed at the
// first eval, after training had begun; then it was refused at start).
// Over processes it must split: the evaluator refuses that when made.
static void test_eval_batch_split(void) {
    ct_copy_task t = {VOCAB, LEN, false, 5, 0};
    ct_stream *train = copy_batches(1), *eval;
    ct_error err;
    CHECK_OK(ct_copy_stream_new(&eval, &t, &err), &err);
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 3;
    CHECK_OK(ct_batch_stream_new(&eval, eval, &bp, &err), &err);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_layer *metric = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, loss, ct_sgd_new(ct_sgd_default_params()), NULL, NULL, ct_sgd_default_params().learning_rate};
    ct_eval_task ev = {.stream = eval, .n_metrics = 1, .n_batches = 1, .metrics = {metric}, .metric_names = {"loss"}};
    ct_loop_options o = ct_loop_default_options();
    o.trainer.n_devices = 2;
    o.eval_at = every_step;
    ct_loop *loop = NULL;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, &ev, &o, &err), &err);
    if (loop) {
        CHECK_OK(ct_loop_run(loop, 1, &err), &err);
        int n_hist, n_evals = 0;
        const ct_history_entry *h = ct_loop_history(loop, &n_hist);
        for (int i = 0; i < n_hist; i++)
            n_evals += !strcmp(h[i].mode, "eval") && !strcmp(h[i].metric, "metrics/loss") && isfinite(h[i].value);
        CHECK_MSG(n_evals == 1, "%d finite eval losses, want 1", n_evals);
        ct_loop_free(loop);
    }
    ct_stream_free(train), ct_stream_free(eval);
    ct_layer_free(model), ct_layer_free(loss), ct_layer_free(metric);
}

// A metric layer's first part: passes the logits on after sleeping 0.3 s,
// an eval far slower than a training step.
static void slow_forward(const ct_tensor *in, ct_tensor *out, const void *user) {
    (void)user;
    memcpy(out[0].data, in[0].data, ct_tensor_nbytes(&in[0]));
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
}

// training/steps per second counts training steps alone (Trax restarts its
// clock after the evals): with a 0.3 s eval after every step, each logged
// rate is that of one training step, not one step plus an eval (below 3.4
// per second before). The bound is 4 per second, not more: any rate that
// counts the eval is below 1 / 0.3 s, and a step of this model took up to
// 0.12 s here on a loaded machine (8.4 per second; a bound of 10 failed).
static void test_steps_per_second_excludes_evals(void) {
    ct_stream *train = copy_batches(1), *eval = copy_batches(99);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_fn_spec slow = {"SlowPass", 1, 1, NULL, slow_forward, NULL, NULL};
    ct_layer *metric = ct_serial(CT_LAYERS(ct_fn(&slow), ct_weighted_category_cross_entropy()));
    ct_train_task task = {train, loss, ct_sgd_new(ct_sgd_default_params()), NULL, NULL, ct_sgd_default_params().learning_rate};
    ct_eval_task ev = {.stream = eval, .n_metrics = 1, .n_batches = 1, .metrics = {metric}, .metric_names = {"loss"}};
    ct_loop_options o = ct_loop_default_options();
    o.eval_at = every_step;
    ct_loop *loop = NULL;
    ct_error err;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, &ev, &o, &err), &err);
    if (loop) {
        CHECK_OK(ct_loop_run(loop, 4, &err), &err);
        int n_hist, n_rates = 0;
        const ct_history_entry *h = ct_loop_history(loop, &n_hist);
        for (int i = 0; i < n_hist; i++) {
            if (strcmp(h[i].metric, "training/steps per second") || h[i].step < 2) continue;
            printf("steps per second at step %lld: %.1f\n", (long long)h[i].step, h[i].value);
            CHECK_MSG(h[i].value > 4.0, "step %lld: %g steps per second: the 0.3 s eval was counted",
                      (long long)h[i].step, h[i].value);
            n_rates++;
        }
        CHECK(n_rates == 3);
        ct_loop_free(loop);
    }
    ct_stream_free(train), ct_stream_free(eval);
    ct_layer_free(model), ct_layer_free(loss), ct_layer_free(metric);
}

// ---- eval metrics weighted by what they average over ----------------------------

// Eval batches of two rows, in turn: logits (2, 3), targets (2), weights
// (2); the first batch weighs one row, the second both.
static const float wb_logits[2][2][3] = {{{0.5f, -1.0f, 2.0f}, {1.0f, 0.0f, 0.0f}},
                                         {{0.0f, 0.0f, 0.0f}, {3.0f, -2.0f, 0.5f}}};
static const int32_t wb_targets[2][2] = {{2, 0}, {1, 1}};
static const float wb_weights[2][2] = {{1.0f, 0.0f}, {1.0f, 1.0f}};

static ct_status wb_next(ct_stream *s, ct_batch *out, ct_error *err) {
    (void)err;
    int64_t i = s->position % 2;
    *out = (ct_batch){3, {s->sigs[0], s->sigs[1], s->sigs[2]}};
    out->t[0].data = (void *)wb_logits[i];
    out->t[1].data = (void *)wb_targets[i];
    out->t[2].data = (void *)wb_weights[i];
    return CT_OK;
}
static const ct_stream_ops wb_ops = {"weighted_batches", wb_next, NULL, NULL, NULL};

// The stream of those batches, endless.
static ct_stream *weighted_batches(void) {
    ct_stream *s = ct_stream_alloc(&wb_ops, NULL, ct_calloc(1, 16));
    s->n_out = 3;
    s->length = -1;
    s->sigs[0] = ct_tensor_2d(CT_DTYPE_F32, 2, 3, NULL);
    s->sigs[1] = ct_tensor_1d(CT_DTYPE_I32, 2, NULL);
    s->sigs[2] = ct_tensor_1d(CT_DTYPE_F32, 2, NULL);
    return s;
}

// An eval of n_batches of weighted_batches() through model, with metric
// (both taken): its status, the value in *v.
static ct_status eval_with(ct_layer *model, ct_layer *metric, int n_batches, double *v, ct_error *err) {
    ct_stream *s = weighted_batches();
    ct_eval_task task = {.stream = s, .n_metrics = 1, .n_batches = n_batches, .metrics = {metric}};
    ct_device dev = ct_device_cpu();
    ct_evaluator *e;
    ct_net net;
    *v = NAN;
    CHECK_OK(ct_evaluator_new(&e, model, &task, NULL, &dev, err), err);
    CHECK_OK(ct_evaluator_model_net(e, &net, ct_key_from_seed(1), err), err);
    ct_status st = ct_evaluator_run(e, &net, ct_key_from_seed(2), v, err);
    ct_net_free(&net);
    ct_evaluator_free(e);
    ct_layer_free(model), ct_layer_free(metric);
    ct_stream_free(s);
    CHECK(dev.current_bytes == 0);
    return st;
}

// ... through LogSoftmax, its metric WeightedCategoryCrossEntropy.
static double weighted_eval(int n_batches) {
    double v;
    ct_error err;
    CHECK_OK(eval_with(ct_log_softmax(), ct_weighted_category_cross_entropy(), n_batches, &v, &err), &err);
    return v;
}

// Metrics the evaluator cannot run are refused at the first eval, naming
// them: one taking more inputs than the model's outputs and the rest of the
// batch give (a Select model leaves 1 of the 3 items; CategoryAccuracy
// takes 2), one with weights of its own (Dense inside), and one that gives
// the logits themselves, not a scalar (its first element was the value).
static void test_eval_metric_refused(void) {
    for (int k = 0; k < 3; k++) {
        ct_layer *model = k == 0 ? ct_select(1, (int[]){0}, 3) : ct_log_softmax();
        ct_layer *metric = k == 0   ? ct_category_accuracy()
                           : k == 1 ? ct_serial(CT_LAYERS(ct_dense(3), ct_weighted_category_cross_entropy()))
                                    : ct_select(1, (int[]){0}, 1);
        double v;
        ct_error err;
        ct_status st = eval_with(model, metric, 1, &v, &err);
        const char *want = k == 0 ? "metric CategoryAccuracy takes 2 inputs, the model and batch give 1"
                                  : "must be weightless and give one scalar";
        printf("eval metric refused: %s\n", st == CT_OK ? "accepted" : err.msg);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, want), "status %d (value %g): %s", (int)st, v,
                  st == CT_OK ? "accepted" : err.msg);
    }
}

// An eval over batches weighs every token alike (Trax averages per batch, so
// a batch of one weighted token counts as much as one of many): two batches
// of 1 and 2 weighted rows give the mean of the 3 rows' cross-entropies,
// each -log softmax(x)[t] in double. n_batches 0 is the default, 1.
static void test_eval_weighted_by_tokens(void) {
    double ce[2][2];
    for (int b = 0; b < 2; b++)
        for (int r = 0; r < 2; r++) {
            const float *x = wb_logits[b][r];
            double lse = log(exp((double)x[0]) + exp((double)x[1]) + exp((double)x[2]));
            ce[b][r] = lse - x[wb_targets[b][r]];
        }
    double by_token = (ce[0][0] + ce[1][0] + ce[1][1]) / 3, by_batch = (ce[0][0] + (ce[1][0] + ce[1][1]) / 2) / 2;
    double two = weighted_eval(2), one = weighted_eval(0);
    printf("eval of batches weighing 1 and 2 rows: %.7f (by token %.7f; Trax's mean of batches %.7f); "
           "n_batches 0: %.7f (batch 1's %.7f)\n", two, by_token, by_batch, one, ce[0][0]);
    CHECK(fabs(by_token - by_batch) > 0.1);  // the check can tell the two apart
    CHECK_MSG(fabs(two - by_token) <= 1e-6 * by_token, "eval %.9g, the mean over tokens is %.9g", two, by_token);
    CHECK_MSG(fabs(one - ce[0][0]) <= 1e-6 * ce[0][0], "n_batches 0: eval %.9g, batch 1's %.9g", one, ce[0][0]);
}

// ---- eval keys ---------------------------------------------------------------------

// The keys an identity layer ran with in eval mode (c->train false), in order.
static ct_key g_eval_keys[16];
static int g_n_eval_keys;

static ct_status key_note_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    (void)l, (void)ic, (void)key, (void)err;
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static ct_status key_note_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                  ct_error *err) {
    (void)l;
    if (!c->train && g_n_eval_keys < 16) g_eval_keys[g_n_eval_keys++] = key;
    out[0] = ct_tensor_sig(&in[0]);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    memcpy(out[0].data, in[0].data, ct_tensor_nbytes(&in[0]));
    return CT_OK;
}

static ct_status key_note_backward(ct_layer *l, ct_ctx *c, const ct_tensor *g, ct_tensor *gin, ct_key key,
                                   ct_error *err) {
    (void)l, (void)c, (void)key, (void)err;
    gin[0] = g[0];
    return CT_OK;
}

static const ct_layer_vtable key_note_vt = {
    .type = "KeyNote", .init = key_note_init, .forward = key_note_forward, .backward = key_note_backward};

static bool same_key(ct_key a, ct_key b) { return a.w[0] == b.w[0] && a.w[1] == b.w[1]; }

// Each eval batch gets its own key, fold_in(key, b), as Trax's run_evals
// draws a fresh one per batch (before, every batch of every eval ran with
// the loop key; no built-in layer draws from it in eval mode:
// LSHSelfAttention's rotations come from its state, as Trax's).
static void test_eval_key_per_batch(void) {
    ct_stream *s = weighted_batches();
    ct_layer *model = ct_layer_new(&key_note_vt, NULL, 1, 1, NULL, NULL, 0);
    ct_layer *metric = ct_weighted_category_cross_entropy();
    ct_eval_task task = {.stream = s, .n_metrics = 1, .n_batches = 3, .metrics = {metric}};
    ct_device dev = ct_device_cpu();
    ct_evaluator *e;
    ct_net net;
    ct_error err;
    double v = NAN;
    ct_key key = ct_key_from_seed(2);
    g_n_eval_keys = 0;
    CHECK_OK(ct_evaluator_new(&e, model, &task, NULL, &dev, &err), &err);
    CHECK_OK(ct_evaluator_model_net(e, &net, ct_key_from_seed(1), &err), &err);
    CHECK_OK(ct_evaluator_run(e, &net, key, &v, &err), &err);
    CHECK_MSG(g_n_eval_keys == 3, "%d eval forwards, want 3", g_n_eval_keys);
    for (int b = 0; b < g_n_eval_keys; b++) {
        ct_key want = ct_key_fold_in(key, (uint32_t)b);
        CHECK_MSG(same_key(g_eval_keys[b], want), "eval batch %d ran with key %08x %08x, want fold_in(key, %d) = "
                  "%08x %08x", b, g_eval_keys[b].w[0], g_eval_keys[b].w[1], b, want.w[0], want.w[1]);
    }
    ct_net_free(&net);
    ct_evaluator_free(e);
    ct_layer_free(model), ct_layer_free(metric);
    ct_stream_free(s);
}

// The Loop's evals at steps 1 and 2 (two batches each) run with four
// different keys, those loop.h gives, and a run resumed at step 1 draws
// step 2's again.
static void eval_keys_of_run(const char *dir, int64_t steps, ct_key *keys, int *n) {
    ct_stream *train = copy_batches(1), *eval = copy_batches(99);
    ct_layer *note = ct_layer_new(&key_note_vt, NULL, 1, 1, NULL, NULL, 0);
    ct_layer *model = ct_serial(CT_LAYERS(note, small_lm(0.0f)));
    ct_layer *loss = ct_weighted_category_cross_entropy(), *metric = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, 1e-3f};
    ct_eval_task ev = {.stream = eval, .n_metrics = 1, .n_batches = 2, .metrics = {metric}, .metric_names = {"loss"}};
    ct_loop_options o = ct_loop_default_options();
    o.eval_at = every_step;
    o.output_dir = dir;
    o.seed = 5;
    ct_loop *loop;
    ct_error err;
    g_n_eval_keys = 0;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, &ev, &o, &err), &err);
    if (loop) CHECK_OK(ct_loop_run(loop, steps, &err), &err);
    ct_loop_free(loop);
    memcpy(keys, g_eval_keys, sizeof g_eval_keys);
    *n = g_n_eval_keys;
    ct_stream_free(train), ct_stream_free(eval);
    ct_layer_free(model), ct_layer_free(loss), ct_layer_free(metric);
}

static void test_eval_keys_per_step(void) {
    char *a = temp_dir("eval_keys_a"), *b = temp_dir("eval_keys_b");
    ct_key whole[16], first[16], resumed[16];
    int n_whole, n_first, n_resumed;
    eval_keys_of_run(a, 2, whole, &n_whole);
    eval_keys_of_run(b, 1, first, &n_first);
    eval_keys_of_run(b, 2, resumed, &n_resumed);  // resumes at step 1
    CHECK_MSG(n_whole == 4 && n_first == 2 && n_resumed == 2, "eval forwards: %d, %d then %d; want 4, 2 then 2",
              n_whole, n_first, n_resumed);
    ct_key loop_key = ct_key_from_seed(5);
    for (int i = 0; i < n_whole && i < 4; i++) {
        int64_t step = 1 + i / 2;
        // By hand as loop.h gives it; Serial gives its first sublayer split(key, 0).
        ct_key want = ct_key_split(
            ct_key_fold_in(ct_key_fold_in(ct_train_step_key(ct_key_split(loop_key, 3), step), 0), (uint32_t)(i % 2)),
            0);
        ct_key api = ct_key_split(ct_key_fold_in(ct_loop_eval_key(loop_key, step, 0), (uint32_t)(i % 2)), 0);
        CHECK(same_key(api, want));
        CHECK_MSG(same_key(whole[i], want), "step %lld eval batch %d: key %08x %08x, want %08x %08x",
                  (long long)step, i % 2, whole[i].w[0], whole[i].w[1], want.w[0], want.w[1]);
        for (int j = 0; j < i; j++)
            CHECK_MSG(!same_key(whole[i], whole[j]), "eval forwards %d and %d share a key", j, i);
    }
    for (int i = 0; i < 2 && n_whole == 4 && n_first == 2 && n_resumed == 2; i++) {
        CHECK_MSG(same_key(first[i], whole[i]), "step 1 eval batch %d: another key than the whole run's", i);
        CHECK_MSG(same_key(resumed[i], whole[2 + i]), "resumed step 2 eval batch %d: another key than the whole "
                  "run's", i);
    }
    ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL);
    free(a), free(b);
}

// Log lines right-justify names to the longest one the run logs (Trax's
// _rjust_len over the tasks' loss names and the eval metric names), so the
// values line up: here "accuracy" (8) sets the width.
static void test_log_names_justified(void) {
    char *dir = temp_dir("justified");
    char *text = NULL;
    size_t len = 0;
    FILE *log = open_memstream(&text, &len);
    ct_loop_options o = ct_loop_default_options();
    o.log = log;
    ct_error err;
    run r;
    CHECK_OK(run_new(&r, dir, o, &err), &err);
    if (r.loop) CHECK_OK(ct_loop_run(r.loop, 1, &err), &err);
    run_free(&r);
    fclose(log);
    const char *want[3] = {"\nStep      1: train     loss | ", "\nStep      1: eval      loss | ",
                           "\nStep      1: eval  accuracy | "};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(text && strstr(text, want[i]), "no line '%s' in the log:\n%s", want[i] + 1, text ? text : "");
    free(text);
    ct_fs_remove_tree(dir, NULL);
    free(dir);
}

// A run of days logs hundreds of thousands of values; the history the loop
// holds, and writes into every checkpoint, keeps the newest history_max rows
// and each metric's last one (metrics.jsonl keeps every value). Checked on
// a run that logs 8 values (6 training metrics, 2 eval metrics) at each of
// 12 steps with history_max 3, more metrics than history_max: the rows
// held, in memory and in state.json, those model_bounded gives (the rule,
// written plainly) from the rows of the run that keeps all (history_max <
// 0), so bounded; the newest 3 rows and every metric's last value among
// them; a state.json of every row restored into history_max 3 or 1 cut to
// the rows such a run holds; a run stopped and resumed, at several steps,
// holds the rows the uninterrupted one holds.
static int history_rows(const char *dir, const char *name) {
    ct_checkpoint *c = NULL;
    ct_error err;
    CHECK_OK(ct_checkpoint_open(&c, dir, name, &err), &err);
    cJSON *root = c ? cJSON_Parse(ct_checkpoint_state(c)) : NULL;
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "history"));
    cJSON_Delete(root);
    ct_checkpoint_close(c);
    return n;
}

static bool same_row(const ct_history_entry *a, const ct_history_entry *b) {
    // Steps per second is a measurement: its value differs from run to run.
    bool timed = strstr(a->metric, "per second") != NULL;
    return !strcmp(a->mode, b->mode) && !strcmp(a->metric, b->metric) && a->step == b->step &&
           (timed || a->value == b->value);
}

static bool same_metric(const ct_history_entry *a, const ct_history_entry *b) {
    return !strcmp(a->mode, b->mode) && !strcmp(a->metric, b->metric);
}

// rows[i] has no later row of its metric among rows[0..n).
static bool last_of_metric(const ct_history_entry *rows, int n, int i) {
    for (int j = i + 1; j < n; j++)
        if (same_metric(&rows[j], &rows[i])) return false;
    return true;
}

// The rows a Loop with history_max max holds after recording rows[0..n)
// one by one (ct_loop_options.history_max's rule, with plain scans): after
// each row, once the rows held number 2 max and max + 2 D (D: the metrics
// they name), the newest max stay and of the older ones each metric's
// last. Into out (n rows of room); returns the count.
static int model_bounded(const ct_history_entry *rows, int n, int max, ct_history_entry *out) {
    int m = 0;
    for (int r = 0; r < n; r++) {
        out[m++] = rows[r];
        int d = 0;
        for (int i = 0; i < m; i++) d += last_of_metric(out, m, i);
        if (m < 2 * max || m < max + 2 * d) continue;
        int k = 0;
        for (int i = 0; i < m; i++)
            if (i >= m - max || last_of_metric(out, m, i)) out[k++] = out[i];
        m = k;
    }
    return m;
}

// The loop's history is want[0..n_want): the count and every row.
static bool history_is(const ct_loop *loop, const ct_history_entry *want, int n_want, int *n_held, int *n_same) {
    int n;
    const ct_history_entry *h = ct_loop_history(loop, &n);
    int same = 0;
    for (int i = 0; i < n && i < n_want; i++) same += same_row(&h[i], &want[i]);
    *n_held = n;
    *n_same = same;
    return n == n_want && same == n_want;
}

static void test_history_bounded(void) {
    enum { STEPS = 12, MAX = 3, PER_LOG = 8 };
    char *all_dir = temp_dir("history_all"), *dir = temp_dir("history"), *cut_dir = temp_dir("history_cut");
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 1;  // an eval, a log and a checkpoint at every step
    ct_error err;
    run r;
    o.history_max = -1;
    CHECK_OK(run_new(&r, all_dir, o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, STEPS, &err), &err);
    int n_all;
    const ct_history_entry *h = ct_loop_history(r.loop, &n_all);
    ct_history_entry *all = malloc((size_t)n_all * sizeof *all + 1);
    ct_history_entry *want = malloc((size_t)n_all * sizeof *want + 1);
    memcpy(all, h, (size_t)n_all * sizeof *all);
    run_free(&r);
    CHECK_MSG(n_all == STEPS * PER_LOG, "history_max -1: %d rows, not %d", n_all, STEPS * PER_LOG);
    CHECK(history_rows(all_dir, "model_12") == n_all);

    o.history_max = MAX;
    CHECK_OK(run_new(&r, dir, o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, STEPS, &err), &err);
    int n, n_want = model_bounded(all, n_all, MAX, want), same;
    CHECK_MSG(history_is(r.loop, want, n_want, &n, &same),
              "history_max %d: %d rows held (%d as the model's %d rows)", MAX, n, same, n_want);
    h = ct_loop_history(r.loop, &n);
    ct_history_entry *kept = malloc((size_t)n * sizeof *kept + 1);
    memcpy(kept, h, (size_t)n * sizeof *kept);
    // Fewer rows than would make the next record cut them.
    CHECK_MSG(n < MAX + 2 * PER_LOG, "history_max %d: %d rows held", MAX, n);
    CHECK_MSG(history_rows(dir, "model_12") == n, "model_12/state.json: %d history rows, the loop holds %d",
              history_rows(dir, "model_12"), n);
    for (int i = 0; i < MAX && i < n; i++)
        CHECK_MSG(same_row(&kept[n - 1 - i], &all[n_all - 1 - i]), "history_max %d: the newest row %d is %s %s at %lld",
                  MAX, i, kept[n - 1 - i].mode, kept[n - 1 - i].metric, (long long)kept[n - 1 - i].step);
    int found = 0;
    for (int i = 0; i < n_all; i++) {
        double last = ct_loop_last_value(r.loop, all[i].mode, all[i].metric), want_last = NAN;
        for (int j = n_all - 1; j >= 0 && isnan(want_last); j--)
            if (same_metric(&all[j], &all[i])) want_last = all[j].value;
        found += last == want_last || strstr(all[i].metric, "per second");
    }
    CHECK_MSG(found == n_all, "history_max %d: %d of %d rows' metrics have their last value", MAX, found, n_all);
    int j = 0;
    for (int i = 0; i < n; i++) {
        while (j < n_all && !same_row(&kept[i], &all[j])) j++;
        j++;
    }
    CHECK_MSG(j <= n_all, "history_max %d: the rows held are not the run's rows in order", MAX);
    run_free(&r);

    // A state.json holding every row (saved with history_max -1, or by a
    // ctrax from before the bound) is cut as it is read: to the very rows
    // the run with history_max 3 holds at that step; with history_max 1, to
    // those a run with history_max 1 would hold.
    o.history_max = MAX;
    CHECK_OK(run_new(&r, all_dir, o, &err), &err);
    int n_restored, same_restored;
    CHECK_MSG(ct_loop_step(r.loop) == STEPS && history_is(r.loop, kept, n, &n_restored, &same_restored),
              "%d rows restored into history_max %d: %d held (%d as the run's %d)", n_all, MAX, n_restored,
              same_restored, n);
    run_free(&r);
    o.history_max = 1;
    CHECK_OK(run_new(&r, all_dir, o, &err), &err);
    int n_want1 = model_bounded(all, n_all, 1, want);
    CHECK_MSG(history_is(r.loop, want, n_want1, &n_restored, &same_restored),
              "%d rows restored into history_max 1: %d held (%d as the model's %d)", n_all, n_restored,
              same_restored, n_want1);
    run_free(&r);
    printf("history: %d steps x %d values, history_max %d: %d rows held and in state.json (all: %d); "
           "restored into history_max 1: %d\n", STEPS, PER_LOG, MAX, n, n_all, n_want1);

    // Stopped and resumed with history_max 3 (more metrics than that): the
    // history restored is the one saved, and the resumed run ends with the
    // rows of the uninterrupted one, wherever between two cuts it stopped.
    static const int stops[] = {2, 5, 7, 9, 11};
    for (size_t k = 0; k < sizeof stops / sizeof *stops; k++) {
        char tag[32];
        snprintf(tag, sizeof tag, "history_stop%d", stops[k]);
        char *stop_dir = temp_dir(tag);
        o.history_max = MAX;
        CHECK_OK(run_new(&r, stop_dir, o, &err), &err);
        CHECK_OK(ct_loop_run(r.loop, stops[k], &err), &err);
        run_free(&r);
        CHECK_OK(run_new(&r, stop_dir, o, &err), &err);
        CHECK(ct_loop_step(r.loop) == stops[k]);
        int n_at = model_bounded(all, stops[k] * PER_LOG, MAX, want);
        CHECK_MSG(history_is(r.loop, want, n_at, &n_restored, &same_restored),
                  "history_max %d, resumed at %d: %d rows restored (%d as the %d saved)", MAX, stops[k], n_restored,
                  same_restored, n_at);
        CHECK_OK(ct_loop_run(r.loop, STEPS, &err), &err);
        CHECK_MSG(history_is(r.loop, kept, n, &n_restored, &same_restored),
                  "history_max %d, resumed at %d: %d rows at step %d (%d as the uninterrupted run's %d)", MAX,
                  stops[k], n_restored, STEPS, same_restored, n);
        run_free(&r);
        ct_fs_remove_tree(stop_dir, NULL);
        free(stop_dir);
    }

    // With history_max 40, stopped at step 9 (72 rows, all restored) and
    // resumed to 12: at 80 rows the newest 40 stay, so it ends with the
    // newest 56 rows of the run that keeps all, those of steps 6 to 12, as
    // the uninterrupted run would.
    o.history_max = 40;
    CHECK_OK(run_new(&r, cut_dir, o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 9, &err), &err);
    run_free(&r);
    CHECK_OK(run_new(&r, cut_dir, o, &err), &err);
    CHECK(ct_loop_step(r.loop) == 9);
    CHECK_OK(ct_loop_run(r.loop, STEPS, &err), &err);
    int n_cut, same_cut, n_want40 = n_all - 40;
    CHECK_MSG(history_is(r.loop, all + n_all - n_want40, n_want40, &n_cut, &same_cut),
              "history_max 40, resumed at 9: %d rows (%d the same), want the newest %d", n_cut, same_cut, n_want40);
    CHECK(model_bounded(all, n_all, 40, want) == n_want40);
    run_free(&r);
    free(all), free(kept), free(want);
    ct_fs_remove_tree(all_dir, NULL), ct_fs_remove_tree(dir, NULL), ct_fs_remove_tree(cut_dir, NULL);
    free(all_dir), free(dir), free(cut_dir);
}

int main(void) {
    scratch_init("test_loop");
    ct_log_set_level(CT_LOG_WARN);
    test_files_and_resume();
    test_optimizers_resumed();
    test_steps_per_second_excludes_evals();
    test_first_checkpoint();
    test_step_keys();
    test_schedule_steps();
    test_optimizer_steps();
    test_resume_keeps_key();
    test_best_checkpoints();
    test_best_ties();
    test_best_after_nan();
    test_best_resumed();
    test_stop_final_tasks_finetune();
    test_switch_trainers();
    test_devices_eval_lsh();
    test_evals_keep_state();
    test_eval_batch_split();
    test_eval_weighted_by_tokens();
    test_eval_metric_refused();
    test_eval_key_per_batch();
    test_eval_keys_per_step();
    test_log_names_justified();
    test_history_bounded();
    if (!check_failed_) ct_fs_remove_tree(g_tmp, NULL);
    return check_summary("test_loop");
}
