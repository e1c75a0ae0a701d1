// The Loop when things go wrong: a non-finite step stops the run (naming the
// step and the layer) with only finite checkpoints on disk, or is skipped and
// counted; a run stopped and resumed logs the same metrics as one that was
// not; ct_loop_new owns the optimizers on every path.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "copy_fixture.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "core/fs.h"
#include "scratch.h"

// ---- a layer that turns its output into NaN on chosen steps ------------------

// poison_step[s] is true for the steps whose forward gives NaN. The Loop's
// on_step_begin callback sets current_step before the step runs.
static bool poison_step[64];
static int64_t current_step;

static void poison_forward(const ct_tensor *in, ct_tensor *out, const void *user) {
    (void)user;
    const float *x = ct_f32(&in[0]);
    float *y = ct_f32(&out[0]);
    bool poison = current_step >= 0 && current_step < 64 && poison_step[current_step];
    for (int64_t i = 0; i < ct_tensor_numel(&in[0]); i++) y[i] = poison ? NAN : x[i];
}

static void poison_backward(const ct_tensor *in, const ct_tensor *out, const ct_tensor *grad_out, ct_tensor *grad_in,
                            const void *user) {
    (void)in, (void)out, (void)user;
    if (!grad_out[0].data) return;
    for (int64_t i = 0; i < ct_tensor_numel(&grad_out[0]); i++) ct_f32(&grad_in[0])[i] += ct_f32(&grad_out[0])[i];
}

static void on_step_begin(int64_t step, void *user) {
    (void)user;
    current_step = step;
}

// Embedding -> Poison -> the rest of a small TransformerLM's work, as Serial.
static ct_layer *poisoned_lm(void) {
    ct_fn_spec spec = {.name = "Poison", .n_in = 1, .n_out = 1, .forward = poison_forward, .backward = poison_backward};
    ct_layer *layers[2] = {small_lm(0.1f), ct_fn(&spec)};
    return ct_serial(2, layers);
}

typedef struct run {
    ct_stream *train, *eval;
    ct_layer *model, *loss, *metric;
    ct_loop *loop;
} run;

static bool every_4(int64_t step, void *user) {
    (void)user;
    return step % 4 == 0;
}

// Checkpoints every 3 steps, evals and logs every 4: the two cadences cross,
// so a checkpoint often falls between two logs.
static ct_status run_new(run *r, const char *dir, ct_loop_options o, ct_error *err) {
    memset(r, 0, sizeof *r);
    r->train = copy_batches(1);
    r->eval = copy_batches(99);
    r->model = poisoned_lm();
    r->loss = ct_weighted_category_cross_entropy();
    r->metric = ct_weighted_category_cross_entropy();
    ct_train_task task = {r->train, r->loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", ct_adam_default_params().learning_rate};
    ct_eval_task ev = {.stream = r->eval, .n_metrics = 1, .n_batches = 1};
    ev.metrics[0] = r->metric;
    ev.metric_names[0] = "loss";
    o.output_dir = dir;
    o.seed = 3;
    o.n_steps_per_checkpoint = 3;
    o.eval_at = every_4;
    o.keep_last = 2;
    o.callbacks[o.n_callbacks++] = (ct_loop_callback){.on_step_begin = on_step_begin};
    return ct_loop_new(&r->loop, r->model, &task, 1, &ev, &o, err);
}

static void run_free(run *r) {
    ct_loop_free(r->loop);
    ct_stream_free(r->train);
    ct_stream_free(r->eval);
    ct_layer_free(r->model);
    ct_layer_free(r->loss);
    ct_layer_free(r->metric);
}

static bool exists(const char *dir, const char *name) {
    char p[1024];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

// Every weight and slot of the newest checkpoint in dir is finite.
static bool newest_checkpoint_finite(const char *dir, const ct_loop *loop, char *name, size_t cap) {
    ct_error err;
    if (ct_checkpoint_find_latest(dir, name, cap, &err) != CT_OK || !name[0]) return false;
    const ct_net *net = ct_loop_net(loop);
    float *w = calloc(net->n_weights + 1, sizeof *w);
    ct_tensor_request *reqs = calloc((size_t)net->n_params + 1, sizeof *reqs);
    for (int i = 0; i < net->n_params; i++) {
        ct_tensor t = net->params[i]->sig;
        t.data = w + net->params[i]->offset;
        reqs[i] = (ct_tensor_request){.file = "weights.safetensors", .name = net->params[i]->full_name, .dest = t};
    }
    bool ok = ct_checkpoint_read(dir, name, reqs, net->n_params, CT_LOAD_BY_NAME, NULL, &err) == CT_OK;
    for (size_t i = 0; ok && i < net->n_weights; i++) ok = isfinite(w[i]);
    free(w);
    free(reqs);
    return ok;
}

// Step 6 gives NaN: the run stops there, names the step and the Poison layer,
// keeps model_3 (finite) and writes nothing of step 6.
static void test_nonfinite_stops(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("stop"));
    memset(poison_step, 0, sizeof poison_step);
    poison_step[6] = true;
    ct_error err;
    run r;
    CHECK_OK(run_new(&r, dir, ct_loop_default_options(), &err), &err);
    ct_status st = ct_loop_run(r.loop, 20, &err);
    CHECK_MSG(st == CT_ERR_NONFINITE, "status %d: %s", (int)st, err.msg);
    CHECK_MSG(strstr(err.msg, "step 6") && strstr(err.msg, "Poison"), "%s", err.msg);
    CHECK(ct_loop_step(r.loop) == 6);
    char name[64] = "";
    CHECK(newest_checkpoint_finite(dir, r.loop, name, sizeof name));
    CHECK_MSG(!strcmp(name, "model_3"), "newest checkpoint %s", name);
    CHECK(exists(dir, "model_1") && exists(dir, "model_3") && !exists(dir, "model_6"));
    run_free(&r);
}

// With skip_nonfinite, steps 5 and 7 are skipped and counted; the others
// train as usual, and the weights stay finite.
static void test_nonfinite_skipped(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("skip"));
    memset(poison_step, 0, sizeof poison_step);
    poison_step[5] = poison_step[7] = true;
    ct_loop_options o = ct_loop_default_options();
    o.skip_nonfinite = true;
    ct_error err;
    run r;
    CHECK_OK(run_new(&r, dir, o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 10, &err), &err);
    CHECK(ct_loop_step(r.loop) == 10);
    int n;
    const ct_history_entry *h = ct_loop_history(r.loop, &n);
    int64_t at4 = -1, at8 = -1, at10 = -1;
    for (int i = 0; i < n; i++) {
        if (strcmp(h[i].metric, "training/skipped_steps")) continue;
        if (h[i].step == 4) at4 = (int64_t)h[i].value;
        if (h[i].step == 8) at8 = (int64_t)h[i].value;
        if (h[i].step == 10) at10 = (int64_t)h[i].value;
    }
    CHECK_MSG(at4 == 0 && at8 == 2 && at10 == 2, "skipped at steps 4, 8, 10: %lld %lld %lld", (long long)at4,
              (long long)at8, (long long)at10);
    // A skipped step is left out of the averages: the log at 8 averages
    // steps 6 and 8 alone. With one task, training/loss (over every step)
    // and metrics/loss (over the task's steps) are then one mean; a skipped
    // step counted in training/loss's count would halve it here.
    double loss8 = NAN, task_loss8 = NAN;
    for (int i = 0; i < n; i++)
        if (!strcmp(h[i].mode, "train") && h[i].step == 8) {
            if (!strcmp(h[i].metric, "training/loss")) loss8 = h[i].value;
            if (!strcmp(h[i].metric, "metrics/loss")) task_loss8 = h[i].value;
        }
    CHECK_MSG(isfinite(loss8) && loss8 == task_loss8,
              "logged at step 8 (steps 5 and 7 skipped): training/loss %.9g, metrics/loss %.9g", loss8, task_loss8);
    CHECK(isfinite(ct_loop_last_value(r.loop, "train", "metrics/loss")));
    char name[64] = "";
    CHECK(newest_checkpoint_finite(dir, r.loop, name, sizeof name) && !strcmp(name, "model_10"));
    run_free(&r);

    // Stopped at step 6 (one step skipped) and resumed: the count goes on.
    snprintf(dir, sizeof dir, "%s", tmp_path("skip_resumed"));
    CHECK_OK(run_new(&r, dir, o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    run_free(&r);
    CHECK_OK(run_new(&r, dir, o, &err), &err);
    CHECK(ct_loop_step(r.loop) == 6);
    CHECK_OK(ct_loop_run(r.loop, 10, &err), &err);
    h = ct_loop_history(r.loop, &n);
    at10 = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(h[i].metric, "training/skipped_steps") && h[i].step == 10) at10 = (int64_t)h[i].value;
    CHECK_MSG(at10 == 2, "skipped by step 10 of a run resumed at 6: %lld, not 2", (long long)at10);
    run_free(&r);
}

// metrics.jsonl without its timing rows.
static char *metrics_without_timing(const char *dir) {
    char path[1024], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t cap = 1 << 20, len = 0;
    char *out = calloc(cap, 1);
    while (fgets(line, sizeof line, f))
        if (!strstr(line, "steps per second") && len + strlen(line) < cap) {
            memcpy(out + len, line, strlen(line));
            len += strlen(line);
        }
    fclose(f);
    return out;
}

static volatile sig_atomic_t stop_flag;
static int64_t stop_at;
static void stop_at_step(int64_t step, void *user) {
    (void)user;
    if (step == stop_at) stop_flag = 1;
}

// Stopped at step 6 (between the log at 4 and the one at 8, with a checkpoint
// at 6) and resumed, and stopped at 9 and resumed again: metrics.jsonl equals
// the uninterrupted run's. Before the averages were saved, the train loss
// logged at 8 averaged steps 7-8 instead of 5-8.
static void test_metrics_resume(void) {
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s", tmp_path("metrics_a"));
    snprintf(b, sizeof b, "%s", tmp_path("metrics_b"));
    memset(poison_step, 0, sizeof poison_step);
    ct_error err;
    run r;
    CHECK_OK(run_new(&r, a, ct_loop_default_options(), &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 14, &err), &err);
    run_free(&r);

    ct_loop_options o = ct_loop_default_options();
    o.stop = &stop_flag;
    o.callbacks[o.n_callbacks++] = (ct_loop_callback){.on_step_end = stop_at_step};
    int64_t stops[2] = {6, 9};
    for (int i = 0; i < 3; i++) {
        stop_flag = 0;
        stop_at = i < 2 ? stops[i] : -1;
        CHECK_OK(run_new(&r, b, o, &err), &err);
        CHECK_OK(ct_loop_run(r.loop, 14, &err), &err);
        CHECK(ct_loop_step(r.loop) == (i < 2 ? stops[i] : 14));
        run_free(&r);
    }
    char *ma = metrics_without_timing(a), *mb = metrics_without_timing(b);
    CHECK(ma && mb && strlen(ma) > 100);
    CHECK_MSG(ma && mb && !strcmp(ma, mb), "metrics differ:\n--- uninterrupted\n%s--- resumed\n%s", ma ? ma : "",
              mb ? mb : "");
    free(ma);
    free(mb);
}

// Argument errors free the optimizers too (the sanitizer's leak check sees a
// leak otherwise), and the message says what is missing.
static void test_new_owns_optimizers(void) {
    ct_stream *s = copy_batches(1);
    ct_layer *model = poisoned_lm(), *loss = ct_weighted_category_cross_entropy();
    ct_train_task task = {s, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, ct_adam_default_params().learning_rate};
    ct_eval_task ev = {.stream = NULL, .n_metrics = 1};
    ev.metrics[0] = loss;
    ct_loop *loop;
    ct_error err;
    CHECK(ct_loop_new(&loop, model, &task, 1, &ev, NULL, &err) == CT_ERR_ARG && !loop);
    CHECK_MSG(strstr(err.msg, "eval task needs a stream"), "%s", err.msg);
    task.optimizer = ct_adam_new(ct_adam_default_params());
    task.loss = NULL;
    CHECK(ct_loop_new(&loop, model, &task, 1, NULL, NULL, NULL) == CT_ERR_ARG && !loop);
    ct_stream_free(s);
    ct_layer_free(model);
    ct_layer_free(loss);
}

// A weight made NaN between steps (by a caller holding the net): no
// checkpoint of it is written, the error names the weight, and model_2 (the
// run's final checkpoint, of the same step) stays the finite one.
static void test_nonfinite_not_saved(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("not_saved"));
    memset(poison_step, 0, sizeof poison_step);
    ct_error err;
    run r;
    CHECK_OK(run_new(&r, dir, ct_loop_default_options(), &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 2, &err), &err);
    ct_net *net = (ct_net *)ct_loop_net(r.loop);
    float saved = net->weights[0];
    net->weights[0] = NAN;
    ct_status st = ct_loop_save_checkpoint(r.loop, &err);
    CHECK_MSG(st == CT_ERR_NONFINITE && strstr(err.msg, "no checkpoint model_2 written") &&
                  strstr(err.msg, net->params[0]->full_name),
              "a NaN weight saved: %s", st == CT_OK ? "accepted" : err.msg);
    net->weights[0] = saved;
    char name[64] = "";
    CHECK(newest_checkpoint_finite(dir, r.loop, name, sizeof name));
    CHECK_MSG(!strcmp(name, "model_2"), "newest checkpoint %s", name);
    run_free(&r);
}

int main(void) {
    scratch_init("loop_safety");
    test_nonfinite_stops();
    test_nonfinite_skipped();
    test_metrics_resume();
    test_new_owns_optimizers();
    test_nonfinite_not_saved();
    ct_fs_remove_tree(g_tmp, NULL);
    return check_summary("test_loop_safety");
}
