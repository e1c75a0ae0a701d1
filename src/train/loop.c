// The training Loop (see loop.h).
#include "ctrax/train/loop.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrax/core/log.h"
#include "ctrax/train/checkpoint.h"
#include "core/fs.h"
#include "ctrax/layers/layer_author.h"
#include "core/json.h"
#include "train/summary_internal.h"
#include "optim/internal.h"
#include "train/train_internal.h"

#define LOOP_STATE_FORMAT "ctrax-loop"
// 2: cursors as decimal strings; 3: the training metrics since the last log,
// skipped steps, and exact (decimal string) bests. Version 2 still loads.
#define LOOP_STATE_VERSION 3

struct ct_loop {
    ct_loop_options opts;
    ct_device own_dev;
    ct_device *dev;
    ct_layer *model;  // one reference
    ct_train_task tasks[CT_LOOP_MAX_TASKS];
    int n_tasks;
    ct_evaluator *evaluator;  // NULL: no eval task
    // Either kind: both lay out and name weights and slots alike, so their
    // checkpoints are interchangeable.
    ct_trainer *trainer;
    ct_key key;
    int64_t step;
    int rank, n_proc;
    ct_comm *comm;  // opts.trainer.comm, or NULL

    ct_history_entry *history;
    int n_history, cap_history;
    ct_summary *summary;  // the chief's, when there is an output dir
    ct_progress *progress;
    char restored_from[CT_CHECKPOINT_NAME_MAX];
    bool stopped;
    int64_t last_checkpoint_step;  // -1: none this run
    bool have_low, have_high;
    double best_low, best_high;

    // Training metrics since the last log. They are saved in checkpoints, so a
    // resumed run logs the same averages as an uninterrupted one.
    double loss_sum;
    int64_t loss_count;
    int64_t skipped_steps;  // non-finite steps skipped (opts.skip_nonfinite), in all

    double log_time;
    int64_t log_step;
    ct_step_stats last_stats;
    float last_lr;
};

ct_loop_options ct_loop_default_options(void) {
    ct_loop_options o;
    memset(&o, 0, sizeof o);
    o.n_steps_per_checkpoint = 100;
    o.keep_last = 2;
    o.restore = true;
    o.trainer = ct_trainer_default_options();
    return o;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool is_chief(const ct_loop *l) { return l->rank == 0; }

// ---- cadences ------------------------------------------------------------------

static bool checkpoint_at(const ct_loop *l, int64_t step) {
    if (l->opts.checkpoint_at) return l->opts.checkpoint_at(step, l->opts.predicate_user);
    return step == 1 || (l->opts.n_steps_per_checkpoint > 0 && step % l->opts.n_steps_per_checkpoint == 0);
}

static bool eval_at(const ct_loop *l, int64_t step) {
    if (l->opts.eval_at) return l->opts.eval_at(step, l->opts.predicate_user);
    return step == 1 || (l->opts.n_steps_per_checkpoint > 0 && step % l->opts.n_steps_per_checkpoint == 0);
}

static bool permanent_at(const ct_loop *l, int64_t step) {
    if (l->opts.permanent_checkpoint_at) return l->opts.permanent_checkpoint_at(step, l->opts.predicate_user);
    return l->opts.n_steps_per_permanent_checkpoint > 0 && step % l->opts.n_steps_per_permanent_checkpoint == 0;
}

static int task_at(const ct_loop *l, int64_t step) {
    if (!l->opts.which_task) return 0;
    int t = l->opts.which_task(step, l->opts.which_task_user);
    return t >= 0 && t < l->n_tasks ? t : 0;
}

// ---- history and summaries ---------------------------------------------------------

static ct_status record(ct_loop *l, const char *mode, const char *metric, double value, ct_error *err) {
    if (l->n_history == l->cap_history) {
        l->cap_history = l->cap_history ? 2 * l->cap_history : 256;
        l->history = ct_realloc(l->history, (size_t)l->cap_history * sizeof *l->history);
    }
    ct_history_entry *e = &l->history[l->n_history++];
    memset(e, 0, sizeof *e);
    snprintf(e->mode, sizeof e->mode, "%s", mode);
    snprintf(e->metric, sizeof e->metric, "%s", metric);
    e->step = l->step;
    e->value = value;
    if (l->summary)
        CT_TRY(ct_summary_scalar(l->summary, strcmp(mode, "eval") == 0 ? CT_SUMMARY_EVAL : CT_SUMMARY_TRAIN, l->step,
                                 metric, value, err));
    return CT_OK;
}

// A Trax-style line "Step    100: train loss |  2.34560000" on opts.log.
static void log_line(ct_loop *l, const char *mode, const char *name, double value) {
    if (!l->opts.log || !is_chief(l)) return;
    char buf[256];
    ct_progress_clear(l->progress);
    ct_format_step_line(buf, sizeof buf, l->step, mode, name, 0, value);
    fputs(buf, l->opts.log);
    fputc('\n', l->opts.log);
    fflush(l->opts.log);
}

const ct_history_entry *ct_loop_history(const ct_loop *loop, int *n) {
    *n = loop->n_history;
    return loop->history;
}

double ct_loop_last_value(const ct_loop *loop, const char *mode, const char *metric) {
    for (int i = loop->n_history - 1; i >= 0; i--)
        if (!strcmp(loop->history[i].mode, mode) && !strcmp(loop->history[i].metric, metric))
            return loop->history[i].value;
    return NAN;
}

// ---- batches -------------------------------------------------------------------------

static ct_status local_rows(const ct_loop *l, const ct_batch *global, ct_tensor *out, ct_error *err) {
    return ct_train_local_rows(global, l->rank, l->n_proc, out, err);
}

static ct_status next_batch(ct_loop *l, ct_stream *s, const char *what, ct_batch *b, ct_error *err) {
    CT_TRY(ct_stream_next(s, b, err));
    if (b->n == 0) return ct_error_set(err, CT_ERR_STATE, "loop: the %s stream ran out of data at step %lld", what,
                                       (long long)l->step);
    return CT_OK;
}

// ---- checkpoints ------------------------------------------------------------------------

// Cursor fields are decimal strings: cJSON prints numbers with 15
// significant digits whenever that reads back within a relative epsilon, so
// an integer above 10^15 (most fingerprints) would come back off by a few.
static cJSON *cursor_json(ct_stream_cursor c) {
    cJSON *o = cJSON_CreateObject();
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)c.position);
    cJSON_AddStringToObject(o, "position", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)c.fingerprint);
    cJSON_AddStringToObject(o, "fingerprint", buf);
    return o;
}

// A double as the shortest JSON number that reads back exactly (%.17g; cJSON
// would print 15 digits whenever they read back within a relative epsilon,
// and a resumed run must continue from the very same sums and bests). JSON
// has no NaN: a non-finite value is null.
static cJSON *exact_number(double v) {
    if (!isfinite(v)) return cJSON_CreateNull();
    char buf[32];
    snprintf(buf, sizeof buf, "%.17g", v);
    return cJSON_CreateRaw(buf);
}

static char *state_json(const ct_loop *l) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", LOOP_STATE_FORMAT);
    cJSON_AddNumberToObject(root, "version", LOOP_STATE_VERSION);
    cJSON_AddNumberToObject(root, "step", (double)l->step);
    cJSON_AddNumberToObject(root, "seed", (double)l->opts.seed);
    cJSON *key = cJSON_AddArrayToObject(root, "key");
    cJSON_AddItemToArray(key, cJSON_CreateNumber(l->key.w[0]));
    cJSON_AddItemToArray(key, cJSON_CreateNumber(l->key.w[1]));
    cJSON *tasks = cJSON_AddArrayToObject(root, "train_cursors");
    for (int i = 0; i < l->n_tasks; i++) cJSON_AddItemToArray(tasks, cursor_json(ct_stream_get_cursor(l->tasks[i].stream)));
    if (l->evaluator)
        cJSON_AddItemToObject(root, "eval_cursor", cursor_json(ct_stream_get_cursor(ct_evaluator_stream(l->evaluator))));
    const ct_optimizer *opt = ct_trainer_optimizer(l->trainer);
    cJSON *o = cJSON_AddObjectToObject(root, "optimizer");
    cJSON_AddStringToObject(o, "name", ct_optimizer_name(opt));
    cJSON *params = cJSON_AddObjectToObject(o, "params");
    for (int i = 0; i < ct_optimizer_n_params(opt); i++) {
        float v = 0;
        const char *name = ct_optimizer_param_name(opt, i);
        if (ct_optimizer_get_param(opt, name, &v, NULL) == CT_OK) cJSON_AddNumberToObject(params, name, v);
    }
    cJSON *best = cJSON_AddObjectToObject(root, "best");
    if (l->have_low) cJSON_AddItemToObject(best, "low", exact_number(l->best_low));
    if (l->have_high) cJSON_AddItemToObject(best, "high", exact_number(l->best_high));
    cJSON *since_log = cJSON_AddObjectToObject(root, "train_since_log");
    cJSON_AddItemToObject(since_log, "loss_sum", exact_number(l->loss_sum));
    cJSON_AddNumberToObject(since_log, "loss_count", (double)l->loss_count);
    cJSON_AddNumberToObject(root, "skipped_steps", (double)l->skipped_steps);
    cJSON *hist = cJSON_AddArrayToObject(root, "history");
    for (int i = 0; i < l->n_history; i++) {
        const ct_history_entry *e = &l->history[i];
        cJSON *row = cJSON_CreateArray();
        cJSON_AddItemToArray(row, cJSON_CreateString(e->mode));
        cJSON_AddItemToArray(row, cJSON_CreateString(e->metric));
        cJSON_AddItemToArray(row, cJSON_CreateNumber((double)e->step));
        cJSON_AddItemToArray(row, exact_number(e->value));
        cJSON_AddItemToArray(hist, row);
    }
    cJSON_AddNumberToObject(root, "n_weights", (double)ct_trainer_net(l->trainer)->n_weights);
    cJSON_AddNumberToObject(root, "devices", ct_trainer_global_devices(l->trainer));
    cJSON_AddStringToObject(root, "trainer", ct_trainer_memory_efficient(l->trainer) ? "memory_efficient" : "standard");
    if (l->opts.config_text) cJSON_AddStringToObject(root, "config", l->opts.config_text);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

// Every checkpoint on disk holds finite weights and slots, so the newest one
// is always a good place to resume from (pruning can then never leave only
// NaN). Every process checks: their weights are the same, so all agree.
static ct_status check_finite(const ct_loop *l, ct_error *err) {
    const ct_net *net = ct_trainer_net(l->trainer);
    const float *slots = ct_trainer_slots(l->trainer, NULL);
    for (int i = 0; i < net->n_params; i++) {
        const ct_param *p = net->params[i];
        size_t off, cnt, numel = (size_t)ct_tensor_numel(&p->sig);
        size_t bad = (size_t)ct_f32_first_nonfinite(net->weights + p->offset, (int64_t)numel);
        if (bad < numel)
            return ct_error_set(err, CT_ERR_NONFINITE, "weight %s is %g at element %zu after step %lld", p->full_name,
                                (double)net->weights[p->offset + bad], bad, (long long)l->step);
        ct_trainer_param_slots(l->trainer, i, &off, &cnt);
        if ((bad = (size_t)ct_f32_first_nonfinite(slots + off, (int64_t)cnt)) < cnt)
            return ct_error_set(err, CT_ERR_NONFINITE, "optimizer slot of %s is %g at element %zu after step %lld",
                                p->full_name, (double)slots[off + bad], bad, (long long)l->step);
    }
    return CT_OK;
}

static ct_status write_checkpoint(ct_loop *l, const char *name, bool keep, ct_error *err) {
    if (!l->opts.output_dir) return CT_OK;
    if (check_finite(l, err) != CT_OK) return ct_error_prefix(err, "loop: no checkpoint %s written", name);
    if (is_chief(l)) {
        ct_checkpoint_options co = ct_checkpoint_default_options();
        co.step = l->step;
        co.keep = keep;
        ct_checkpoint_writer *w;
        CT_TRY(ct_checkpoint_writer_begin(&w, l->opts.output_dir, name, &co, err));
        int nw, ns;
        ct_named_tensor *wt, *st;
        ct_trainer_checkpoint_tensors(l->trainer, &wt, &nw, &st, &ns);
        ct_kv meta[1] = {{"optimizer", ct_optimizer_name(ct_trainer_optimizer(l->trainer))}};
        char *json = state_json(l);
        ct_status s = ct_checkpoint_writer_add_tensors(w, "weights.safetensors", wt, nw, NULL, 0, err);
        if (s == CT_OK) s = ct_checkpoint_writer_add_tensors(w, "slots.safetensors", st, ns, meta, 1, err);
        if (s == CT_OK && l->opts.config_text)
            s = ct_checkpoint_writer_add_bytes(w, "config.gin", l->opts.config_text, strlen(l->opts.config_text), err);
        if (s == CT_OK) s = ct_checkpoint_writer_set_state(w, json, err);
        if (s == CT_OK) s = ct_checkpoint_writer_commit(w, err);
        else ct_checkpoint_writer_abort(w);
        cJSON_free(json);
        ct_free(wt);
        ct_free(st);
        if (s == CT_OK) s = ct_checkpoint_prune(l->opts.output_dir, l->opts.keep_last, NULL, NULL, err);
        if (s != CT_OK) return ct_error_prefix(err, "loop: writing checkpoint %s at step %lld", name, (long long)l->step);
    }
    for (int i = 0; i < l->opts.n_callbacks; i++)
        if (l->opts.callbacks[i].on_checkpoint) l->opts.callbacks[i].on_checkpoint(name, l->step, l->opts.callbacks[i].user);
    return CT_OK;
}

ct_status ct_loop_save_checkpoint(ct_loop *loop, ct_error *err) {
    char name[CT_CHECKPOINT_NAME_MAX];
    snprintf(name, sizeof name, "model_%lld", (long long)loop->step);
    CT_TRY(write_checkpoint(loop, name, permanent_at(loop, loop->step), err));
    loop->last_checkpoint_step = loop->step;
    return CT_OK;
}

static ct_status json_cursor(const cJSON *o, ct_stream_cursor *c, const char *what, const char *ckpt, ct_error *err) {
    const cJSON *fields[2] = {cJSON_GetObjectItemCaseSensitive(o, "position"),
                              cJSON_GetObjectItemCaseSensitive(o, "fingerprint")};
    int64_t values[2];
    for (int i = 0; i < 2; i++) {
        char *end = NULL;
        long long v = cJSON_IsString(fields[i]) ? strtoll(fields[i]->valuestring, &end, 10) : -1;
        if (!end || end == fields[i]->valuestring || *end || v < 0)
            return ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s: state.json has no valid %s cursor (%s)", ckpt,
                                what, i == 0 ? "position" : "fingerprint");
        values[i] = v;
    }
    c->position = values[0];
    c->fingerprint = values[1];
    return CT_OK;
}

// Reading state.json: every field is checked (type and range) before it is
// used, and an error names the checkpoint and the field. Steps and counts are
// integers in [0, 2^53): doubles hold them exactly, and nothing converts an
// out-of-range double to an integer.
#define STATE_INT_MAX 9007199254740992.0  // 2^53

static bool json_count(const cJSON *j, double max, int64_t *v) {
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= 0 && j->valuedouble <= max) || j->valuedouble != floor(j->valuedouble))
        return false;
    *v = (int64_t)j->valuedouble;
    return true;
}

// A number, or null for a non-finite one (exact_number writes both).
static bool json_value(const cJSON *j, double *v) {
    if (cJSON_IsNull(j)) *v = NAN;
    else if (cJSON_IsNumber(j)) *v = j->valuedouble;
    else return false;
    return true;
}

static ct_status bad_field(ct_error *err, const char *ckpt, const char *field, const char *expected) {
    return ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s: state.json: \"%s\" is missing or not %s", ckpt, field,
                        expected);
}

static ct_status restore_history(ct_loop *l, const cJSON *hist, const char *name, ct_error *err) {
    if (!cJSON_IsArray(hist)) return bad_field(err, name, "history", "an array");
    l->n_history = 0;
    int i = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, hist) {
        const cJSON *m = cJSON_GetArrayItem(row, 0), *k = cJSON_GetArrayItem(row, 1), *s = cJSON_GetArrayItem(row, 2),
                    *v = cJSON_GetArrayItem(row, 3);
        int64_t step;
        double value;
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != 4 || !cJSON_IsString(m) || !cJSON_IsString(k) ||
            !json_count(s, STATE_INT_MAX, &step) || !json_value(v, &value))
            return ct_error_set(err, CT_ERR_FORMAT,
                                "checkpoint %s: state.json: history[%d] is not [mode, metric, step, value]", name, i);
        int64_t saved = l->step;
        l->step = step;
        record(l, m->valuestring, k->valuestring, value, NULL);  // no summary is open yet
        l->step = saved;
        i++;
    }
    return CT_OK;
}

// What state.json says, checked whole before anything is loaded.
typedef struct loop_state {
    int64_t step, key_words[2], loss_count, skipped;
    double loss_sum, best_low, best_high;
    bool have_low, have_high, have_eval_cursor;
    ct_stream_cursor train_cur[CT_LOOP_MAX_TASKS], eval_cur;
} loop_state;

// The format, the step, the key, the cursors and the bests.
static ct_status parse_core(const ct_loop *l, const cJSON *root, const char *name, loop_state *s, ct_error *err) {
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(root, "key");
    const cJSON *cursors = cJSON_GetObjectItemCaseSensitive(root, "train_cursors");
    const cJSON *best = cJSON_GetObjectItemCaseSensitive(root, "best");
    int64_t version;
    if (!cJSON_IsObject(root) || !cJSON_IsString(fmt) || strcmp(fmt->valuestring, LOOP_STATE_FORMAT) ||
        !json_count(ver, 1e9, &version) || version < 2 || version > LOOP_STATE_VERSION)
        return ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s: state.json is not a ctrax loop state of version 2 to %d",
                            name, LOOP_STATE_VERSION);
    if (!json_count(cJSON_GetObjectItemCaseSensitive(root, "step"), STATE_INT_MAX, &s->step))
        return bad_field(err, name, "step", "an integer from 0 to 2^53");
    if (!cJSON_IsArray(key) || cJSON_GetArraySize(key) != 2 ||
        !json_count(cJSON_GetArrayItem(key, 0), UINT32_MAX, &s->key_words[0]) ||
        !json_count(cJSON_GetArrayItem(key, 1), UINT32_MAX, &s->key_words[1]))
        return bad_field(err, name, "key", "two integers from 0 to 2^32 - 1");
    if (!cJSON_IsArray(cursors) || cJSON_GetArraySize(cursors) != l->n_tasks)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "checkpoint %s: state.json: \"train_cursors\" is not an array of %d cursor(s)", name,
                            l->n_tasks);
    const cJSON *lo = cJSON_GetObjectItemCaseSensitive(best, "low"), *hi = cJSON_GetObjectItemCaseSensitive(best, "high");
    if (!cJSON_IsObject(best) || (lo && !json_value(lo, &s->best_low)) || (hi && !json_value(hi, &s->best_high)))
        return bad_field(err, name, "best", "an object of numbers");
    s->have_low = lo != NULL;
    s->have_high = hi != NULL;
    if (version >= 3) {
        const cJSON *since = cJSON_GetObjectItemCaseSensitive(root, "train_since_log");
        if (!json_value(cJSON_GetObjectItemCaseSensitive(since, "loss_sum"), &s->loss_sum) ||
            !json_count(cJSON_GetObjectItemCaseSensitive(since, "loss_count"), STATE_INT_MAX, &s->loss_count) ||
            s->loss_count > s->step)
            return bad_field(err, name, "train_since_log", "{loss_sum, loss_count} with a count up to the step");
        if (!json_count(cJSON_GetObjectItemCaseSensitive(root, "skipped_steps"), (double)s->step, &s->skipped))
            return bad_field(err, name, "skipped_steps", "an integer from 0 to the step");
    }
    for (int i = 0; i < l->n_tasks; i++)
        CT_TRY(json_cursor(cJSON_GetArrayItem(cursors, i), &s->train_cur[i], "train", name, err));
    const cJSON *ec = cJSON_GetObjectItemCaseSensitive(root, "eval_cursor");
    s->have_eval_cursor = l->evaluator && ec;
    if (s->have_eval_cursor) CT_TRY(json_cursor(ec, &s->eval_cur, "eval", name, err));
    return CT_OK;
}

// The trainer's weights, state and slots: a failed load leaves every
// destination as it was.
static ct_status load_tensors(ct_loop *l, const ct_checkpoint *c, ct_error *err) {
    int nw, ns;
    ct_named_tensor *wt, *sl;
    ct_trainer_checkpoint_tensors(l->trainer, &wt, &nw, &sl, &ns);
    ct_tensor_request *reqs = ct_calloc((size_t)(nw + ns) + 1, sizeof *reqs);
    for (int i = 0; i < nw; i++) reqs[i] = (ct_tensor_request){"weights.safetensors", wt[i].name, wt[i].tensor, 0};
    for (int i = 0; i < ns; i++) reqs[nw + i] = (ct_tensor_request){"slots.safetensors", sl[i].name, sl[i].tensor, 0};
    ct_status st = ct_checkpoint_load(c, reqs, nw + ns, CT_LOAD_EXACT, err);
    ct_free(reqs);
    ct_free(wt);
    ct_free(sl);
    return st;
}

// Everything after the tensors: the optimizer, the cursors, the history and
// the loop's own fields.
static ct_status apply_state(ct_loop *l, const cJSON *root, const char *name, const char *what, const loop_state *s,
                             ct_error *err) {
    CT_TRY(ct_optimizer_restore_json(ct_trainer_optimizer(l->trainer), cJSON_GetObjectItemCaseSensitive(root, "optimizer"),
                                     what, err));
    for (int i = 0; i < l->n_tasks; i++) CT_TRY(ct_stream_set_cursor(l->tasks[i].stream, s->train_cur[i], err));
    if (s->have_eval_cursor) CT_TRY(ct_stream_set_cursor(ct_evaluator_stream(l->evaluator), s->eval_cur, err));
    CT_TRY(restore_history(l, cJSON_GetObjectItemCaseSensitive(root, "history"), name, err));
    l->step = s->step;
    l->key.w[0] = (uint32_t)s->key_words[0];
    l->key.w[1] = (uint32_t)s->key_words[1];
    l->have_low = s->have_low;
    l->best_low = s->best_low;
    l->have_high = s->have_high;
    l->best_high = s->best_high;
    l->loss_sum = s->loss_sum;
    l->loss_count = s->loss_count;
    l->skipped_steps = s->skipped;
    return CT_OK;
}

// Puts the loop in the state of a checkpoint: weights, state, slots,
// optimizer hyperparameters, step, key, cursors, history, bests, and the
// training metrics since the last log. state.json is checked whole before
// anything is loaded; a failure after that (a tensor, an optimizer
// parameter) fails ct_loop_new, which then frees the loop.
static ct_status restore_from(ct_loop *l, const ct_checkpoint *c, ct_error *err) {
    const char *name = ct_checkpoint_name(c);
    const char *json = ct_checkpoint_state(c);
    char what[CT_CHECKPOINT_NAME_MAX + 16];
    snprintf(what, sizeof what, "%s/state.json", name);
    if (!json) return ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s has no state.json", name);
    cJSON *root = ct_json_parse(json, strlen(json), what, err);
    if (!root) return err ? err->code : CT_ERR_FORMAT;
    loop_state s = {0};
    ct_status st = parse_core(l, root, name, &s, err);
    if (st == CT_OK) st = load_tensors(l, c, err);
    if (st == CT_OK) st = apply_state(l, root, name, what, &s, err);
    cJSON_Delete(root);
    return st;
}

// Finds the newest complete checkpoint (the chief decides, everyone loads
// the same one) and restores it.
static ct_status restore_latest(ct_loop *l, ct_error *err) {
    char name[CT_CHECKPOINT_NAME_MAX] = "";
    ct_status st = CT_OK;
    if (is_chief(l)) st = ct_checkpoint_find_latest(l->opts.output_dir, name, sizeof name, err);
    if (l->comm) {
        double ok = st == CT_OK;
        CT_TRY(ct_comm_allreduce_f64(l->comm, &ok, 1, err));  // every rank learns whether the chief failed
        if (st == CT_OK && ok < l->n_proc) return ct_error_set(err, CT_ERR_IO, "loop: the chief could not find a checkpoint");
        CT_TRY(ct_comm_broadcast(l->comm, name, sizeof name, 0, err));
    }
    CT_TRY(st);
    if (!name[0]) return CT_OK;
    ct_checkpoint *c;
    CT_TRY(ct_checkpoint_open(&c, l->opts.output_dir, name, err));
    st = restore_from(l, c, err);
    ct_checkpoint_close(c);
    if (st != CT_OK) return ct_error_prefix(err, "loop: resuming from %s/%s", l->opts.output_dir, name);
    snprintf(l->restored_from, sizeof l->restored_from, "%s", name);
    l->last_checkpoint_step = l->step;
    if (is_chief(l))
        ct_log(CT_LOG_INFO, "resuming from checkpoint %s/%s at step %lld", l->opts.output_dir, name, (long long)l->step);
    return CT_OK;
}

ct_status ct_loop_load_weights(ct_loop *loop, const char *checkpoint_dir, const char *name, ct_error *err) {
    ct_checkpoint *c;
    CT_TRY(ct_checkpoint_open(&c, checkpoint_dir, name, err));
    ct_status st = ct_trainer_load_checkpoint(loop->trainer, c, CT_LOAD_BY_NAME, err);
    ct_checkpoint_close(c);
    return st;
}

// ---- evals -------------------------------------------------------------------------------

// After an eval: lowest_<metric> / highest_<metric> at a new best (ties
// count, as Trax).
static ct_status save_bests(ct_loop *l, const char *name, double value, ct_error *err) {
    char ckpt[CT_CHECKPOINT_NAME_MAX];
    if (l->opts.checkpoint_low_metric && !strcmp(l->opts.checkpoint_low_metric, name) &&
        (!l->have_low || value <= l->best_low)) {
        l->have_low = true;
        l->best_low = value;
        snprintf(ckpt, sizeof ckpt, "lowest_%s", name);
        CT_TRY(write_checkpoint(l, ckpt, true, err));
    }
    if (l->opts.checkpoint_high_metric && !strcmp(l->opts.checkpoint_high_metric, name) &&
        (!l->have_high || value >= l->best_high)) {
        l->have_high = true;
        l->best_high = value;
        snprintf(ckpt, sizeof ckpt, "highest_%s", name);
        CT_TRY(write_checkpoint(l, ckpt, true, err));
    }
    return CT_OK;
}

ct_status ct_loop_run_evals(ct_loop *loop, ct_error *err) {
    ct_loop *l = loop;
    if (!l->evaluator) return CT_OK;
    double values[CT_EVAL_MAX_METRICS];
    // The model alone on the trainer's weights, in eval mode (dropout off).
    CT_TRY(ct_evaluator_run(l->evaluator, ct_trainer_net(l->trainer), l->key, values, err));
    for (int m = 0; m < ct_evaluator_n_metrics(l->evaluator); m++) {
        const char *name = ct_evaluator_metric_name(l->evaluator, m);
        char tag[96];
        snprintf(tag, sizeof tag, "metrics/%s", name);
        CT_TRY(record(l, "eval", tag, values[m], err));
        log_line(l, "eval", name, values[m]);
        CT_TRY(save_bests(l, name, values[m], err));
    }
    if (l->summary) CT_TRY(ct_summary_flush(l->summary, err));
    return CT_OK;
}

// ---- new / free ----------------------------------------------------------------------------

// ct_loop_new owns the tasks' optimizers on every path, failures included.
static ct_status refuse_tasks(const ct_train_task *tasks, int n_tasks, ct_error *err) {
    for (int i = 0; tasks && i < n_tasks && i < CT_LOOP_MAX_TASKS; i++) ct_optimizer_free(tasks[i].optimizer);
    return err ? err->code : CT_ERR_ARG;
}

// The tasks, before anything is built.
static ct_status check_tasks(const ct_train_task *tasks, int n_tasks, ct_error *err) {
    if (n_tasks < 1 || n_tasks > CT_LOOP_MAX_TASKS)
        return ct_error_set(err, CT_ERR_ARG, "loop: %d train tasks (1 to %d)", n_tasks, CT_LOOP_MAX_TASKS);
    for (int i = 0; i < n_tasks; i++) {
        if (!tasks[i].stream || !tasks[i].loss || (i == 0 && !tasks[i].optimizer))
            return ct_error_set(err, CT_ERR_ARG, "loop: train task %d needs a stream, a loss%s", i,
                                i == 0 ? " and an optimizer" : "");
        if (i > 0 && tasks[i].loss != tasks[0].loss)
            return ct_error_set(err, CT_ERR_ARG, "loop: train task %d has its own loss layer; tasks share task 0's", i);
        if (!tasks[i].lr_schedule && !(tasks[i].learning_rate > 0))
            return ct_error_set(err, CT_ERR_ARG,
                                "loop: train task %d has no lr_schedule and its learning_rate is %g (must be > 0)", i,
                                (double)tasks[i].learning_rate);
    }
    return CT_OK;
}

// The trainer, for the shapes of task 0's first batch (then the stream goes
// back to where it was). Takes opt on every path.
static ct_status make_trainer(ct_loop *l, ct_optimizer *opt, ct_error *err) {
    ct_batch first;
    ct_tensor local[CT_BATCH_MAX_TENSORS];
    ct_stream_cursor start = ct_stream_get_cursor(l->tasks[0].stream);
    ct_status st = next_batch(l, l->tasks[0].stream, "train", &first, err);
    if (st == CT_OK) st = local_rows(l, &first, local, err);
    if (st != CT_OK) {
        ct_optimizer_free(opt);
        return st;
    }
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    for (int i = 0; i < first.n; i++) sigs[i] = ct_tensor_sig(&local[i]);
    CT_TRY(ct_trainer_new(&l->trainer, l->model, l->tasks[0].loss, sigs, first.n, opt, ct_key_split(l->key, 0), l->dev,
                          &l->opts.trainer, err));
    return ct_stream_set_cursor(l->tasks[0].stream, start, err);
}

// The summaries and config.gin of the chief's output directory.
static ct_status open_output(ct_loop *l, ct_error *err) {
    if (!l->opts.output_dir || !is_chief(l)) return CT_OK;
    CT_TRY(ct_summary_open(&l->summary, l->opts.output_dir, l->step, err));
    if (!l->opts.config_text) return CT_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.gin", l->opts.output_dir);
    return ct_fs_write_atomic(path, l->opts.config_text, strlen(l->opts.config_text), err);
}

ct_status ct_loop_new(ct_loop **out, ct_layer *model, const ct_train_task *tasks, int n_tasks,
                      const ct_eval_task *eval, const ct_loop_options *opts, ct_error *err) {
    *out = NULL;
    ct_error arg_err;
    if (!err) err = &arg_err;
    if (check_tasks(tasks, n_tasks, err) != CT_OK) return refuse_tasks(tasks, n_tasks, err);
    ct_loop *l = ct_calloc(1, sizeof *l);
    l->opts = opts ? *opts : ct_loop_default_options();
    l->own_dev = ct_device_cpu();
    l->dev = l->opts.device ? l->opts.device : &l->own_dev;
    l->model = ct_layer_ref(model);
    l->n_tasks = n_tasks;
    for (int i = 0; i < n_tasks; i++) {
        l->tasks[i] = tasks[i];
        l->tasks[i].loss = ct_layer_ref(tasks[i].loss);
        l->tasks[i].optimizer = NULL;
        // One trainer serves every task: it has task 0's loss and optimizer.
        if (i > 0) ct_optimizer_free(tasks[i].optimizer);
    }
    l->comm = l->opts.trainer.comm;
    l->rank = l->comm ? ct_comm_rank(l->comm) : 0;
    l->n_proc = l->comm ? ct_comm_size(l->comm) : 1;
    l->key = ct_key_from_seed(l->opts.seed);
    l->last_checkpoint_step = -1;
    ct_status st = eval ? ct_evaluator_new(&l->evaluator, model, eval, l->comm, l->dev, err) : CT_OK;
    if (st != CT_OK) ct_optimizer_free(tasks[0].optimizer);
    else st = make_trainer(l, tasks[0].optimizer, err);  // the trainer owns it from here
    if (st == CT_OK && l->opts.output_dir && l->opts.restore) st = restore_latest(l, err);
    if (st == CT_OK) st = open_output(l, err);
    if (st != CT_OK) {
        ct_loop_free(l);
        return st;
    }
    *out = l;
    return CT_OK;
}

void ct_loop_free(ct_loop *loop) {
    if (!loop) return;
    ct_loop *l = loop;
    ct_summary_close(l->summary, NULL);
    ct_progress_free(l->progress);
    ct_evaluator_free(l->evaluator);
    ct_trainer_free(l->trainer);
    for (int i = 0; i < l->n_tasks; i++) ct_layer_free(l->tasks[i].loss);
    ct_layer_free(l->model);
    ct_free(l->history);
    ct_free(l);
}

// ---- run ---------------------------------------------------------------------------------------

// Logs the training metrics averaged since the last log (Trax's
// _log_training_progress).
static ct_status log_training(ct_loop *l, ct_error *err) {
    if (l->loss_count == 0 && l->step == l->log_step) return CT_OK;
    // Every step since the last log may have been skipped (non-finite): NaN.
    double now = now_s(), loss = l->loss_count ? l->loss_sum / (double)l->loss_count : NAN;
    double steps_per_s = (double)(l->step - l->log_step) / (now - l->log_time > 1e-9 ? now - l->log_time : 1e-9);
    const ct_train_task *task = &l->tasks[task_at(l, l->step)];
    const char *loss_name = task->loss_name ? task->loss_name : task->loss->name;
    char tag[96];
    snprintf(tag, sizeof tag, "metrics/%s", loss_name);
    CT_TRY(record(l, "train", tag, loss, err));
    CT_TRY(record(l, "train", "training/learning_rate", l->last_lr, err));
    CT_TRY(record(l, "train", "training/steps per second", steps_per_s, err));
    CT_TRY(record(l, "train", "training/gradients_l2", l->last_stats.gradients_l2, err));
    CT_TRY(record(l, "train", "training/weights_l2", l->last_stats.weights_l2, err));
    CT_TRY(record(l, "train", "training/loss", l->last_stats.loss, err));
    if (l->opts.skip_nonfinite) CT_TRY(record(l, "train", "training/skipped_steps", (double)l->skipped_steps, err));
    if (l->opts.log && is_chief(l)) {
        ct_progress_clear(l->progress);
        fprintf(l->opts.log, "Step %6lld: Ran %lld train steps in %.2f secs\n", (long long)l->step,
                (long long)(l->step - l->log_step), now - l->log_time);
    }
    log_line(l, "train", loss_name, loss);
    l->loss_sum = 0;
    l->loss_count = 0;
    l->log_time = now;
    l->log_step = l->step;
    return CT_OK;
}

static ct_status one_step(ct_loop *l, ct_error *err) {
    l->step++;
    for (int i = 0; i < l->opts.n_callbacks; i++)
        if (l->opts.callbacks[i].on_step_begin) l->opts.callbacks[i].on_step_begin(l->step, l->opts.callbacks[i].user);
    ct_train_task *task = &l->tasks[task_at(l, l->step)];
    ct_batch global;
    ct_tensor batch[CT_BATCH_MAX_TENSORS];
    CT_TRY(next_batch(l, task->stream, "train", &global, err));
    CT_TRY(local_rows(l, &global, batch, err));
    // Every step's learning rate comes from the schedule (Trax: it overrides
    // opt_params.learning_rate).
    float lr = task->lr_schedule ? ct_schedule_value(task->lr_schedule, l->step) : task->learning_rate;
    ct_key step_key = ct_key_fold_in(ct_key_split(l->key, 1), (uint32_t)l->step);
    ct_error step_err;
    ct_status st = ct_trainer_one_step(l->trainer, batch, step_key, l->step, lr, &l->last_stats, &step_err);
    if (st != CT_OK && err) *err = step_err;
    l->last_lr = lr;
    if (st == CT_ERR_NONFINITE && l->opts.skip_nonfinite) {
        // The trainer updated nothing; the step and its batch are spent.
        l->skipped_steps++;
        if (is_chief(l)) {
            ct_progress_clear(l->progress);
            ct_log(CT_LOG_WARN, "step %lld skipped (%lld so far): %s", (long long)l->step, (long long)l->skipped_steps,
                   step_err.msg);
        }
    } else if (st != CT_OK) {
        return ct_error_prefix(err, "step %lld", (long long)l->step);
    } else {
        l->loss_sum += l->last_stats.loss;
        l->loss_count++;
    }
    if (l->progress)
        ct_progress_update(l->progress, l->step, l->last_stats.loss, l->opts.tokens_per_batch * (l->step - l->log_step));
    for (int i = 0; i < l->opts.n_callbacks; i++)
        if (l->opts.callbacks[i].on_step_end) l->opts.callbacks[i].on_step_end(l->step, l->opts.callbacks[i].user);
    return CT_OK;
}

// Every process must agree to stop, or the others would wait in the next
// step's collectives.
static bool stop_requested(ct_loop *l) {
    double stop = l->opts.stop && *l->opts.stop;
    if (l->comm) ct_comm_allreduce_f64(l->comm, &stop, 1, NULL);
    return stop > 0;
}

ct_status ct_loop_run(ct_loop *loop, int64_t n_steps, ct_error *err) {
    ct_loop *l = loop;
    l->stopped = false;
    l->log_time = now_s();
    l->log_step = l->step;
    if (l->opts.progress && is_chief(l) && !l->progress) l->progress = ct_progress_new(l->opts.progress, n_steps);
    while (l->step < n_steps) {
        CT_TRY(one_step(l, err));
        bool evaluate = eval_at(l, l->step), save = checkpoint_at(l, l->step) || permanent_at(l, l->step);
        // The last step logs too, before its checkpoint: what a checkpoint
        // holds of the metrics since the last log is then exactly what a
        // resumed run must go on averaging.
        if (evaluate || l->step == n_steps) CT_TRY(log_training(l, err));
        if (evaluate) CT_TRY(ct_loop_run_evals(l, err));
        if (stop_requested(l)) {
            l->stopped = true;
            save = true;
        }
        if (save) CT_TRY(ct_loop_save_checkpoint(l, err));
        if (l->stopped) {
            if (is_chief(l)) ct_log(CT_LOG_INFO, "stopped at step %lld on request; checkpoint written", (long long)l->step);
            break;
        }
    }
    // Trax saves nothing at the end of run; ctrax does, so no step is lost.
    if (l->last_checkpoint_step != l->step) CT_TRY(ct_loop_save_checkpoint(l, err));
    if (l->summary) CT_TRY(ct_summary_flush(l->summary, err));
    if (l->progress) ct_progress_finish(l->progress);
    return CT_OK;
}

int64_t ct_loop_step(const ct_loop *loop) { return loop->step; }
bool ct_loop_stopped(const ct_loop *loop) { return loop->stopped; }
const char *ct_loop_restored_from(const ct_loop *loop) { return loop->restored_from; }
ct_trainer *ct_loop_trainer(const ct_loop *loop) { return loop->trainer; }
const ct_net *ct_loop_net(const ct_loop *loop) { return ct_trainer_net(loop->trainer); }
