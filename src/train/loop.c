// The training Loop (see loop.h).
#include "ctrax/train/loop.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "ctrax/core/log.h"
#include "ctrax/train/checkpoint.h"
#include "core/fs.h"
#include "ctrax/layers/layer_author.h"
#include "core/index.h"
#include "core/json.h"
#include "train/summary_internal.h"
#include "optim/internal.h"
#include "train/train_internal.h"  // ct_train_local_rows

#define LOOP_STATE_FORMAT "ctrax-loop"
// 2: cursors as decimal strings; 3: the training metrics since the last log,
// skipped steps, and exact (decimal string) bests; 4: the gradient and
// weight norms since the last log, the additional eval tasks' cursors and
// the optimizers of tasks with their own; 5: each train task's loss since
// the last log. Versions 2 to 4 still load.
#define LOOP_STATE_VERSION 5

// A list of steps (checkpoints_at, ...): on with the list given, even empty.
typedef struct step_list {
    int64_t *steps;
    int n;
    bool on;
} step_list;

// A (mode, metric) of the history, and the position of its newest row.
typedef struct history_metric {
    char mode[sizeof ((ct_history_entry *)0)->mode];
    char metric[sizeof ((ct_history_entry *)0)->metric];
    int last;
} history_metric;

struct ct_loop {
    ct_loop_options opts;
    ct_device own_dev;
    ct_device *dev;
    ct_layer *model;  // one reference
    ct_train_task tasks[CT_LOOP_MAX_TASKS];
    int n_tasks;
    // A train task with an optimizer of its own: its optimizer (set in
    // ct_loop_new) and, once the trainer is made, its slots
    // (ct_trainer_opt_state_new), swapped into the trainer for that task's
    // steps. opt NULL: the task shares task 0's, the trainer's own.
    ct_trainer_opt_state task_opts[CT_LOOP_MAX_TASKS];
    ct_layer *task_losses;  // tasks with losses of their own: the layer that picks one; NULL: one loss
    // evaluators[0] is the main eval task (NULL: no evals), then the
    // additional ones with their export prefixes.
    ct_evaluator *evaluators[1 + CT_LOOP_MAX_EVAL_TASKS];
    char eval_prefix[1 + CT_LOOP_MAX_EVAL_TASKS][64];
    int n_evaluators;
    int name_width;  // log lines right-justify names to it, as Trax's _rjust_len
    ct_layer *eval_model;  // one reference; NULL: evals run the model
    ct_net eval_net;       // eval_model's weights, copied from the model's before each eval
    float *state_saved;    // no eval model: the net's state, put back after each eval
    step_list ckpt_list, eval_list, perm_list;
    // Either kind: both lay out and name weights and slots alike, so their
    // checkpoints are interchangeable.
    ct_trainer *trainer;
    ct_key key;
    int64_t step;
    int rank, n_proc;
    ct_comm *comm;  // opts.trainer.comm, or NULL

    ct_history_entry *history;
    int *history_metric;  // each row's (mode, metric): an entry of metrics
    int n_history, cap_history;
    history_metric *metrics;  // the (mode, metric)s the rows name, each once
    int n_metrics, cap_metrics;
    ct_index metric_index;  // metrics by name
    ct_summary *summary;  // the chief's, when there is an output dir
    ct_progress *progress;
    char restored_from[CT_CHECKPOINT_NAME_MAX];
    bool stopped;
    int64_t last_checkpoint_step;  // -1: none this run
    bool have_low, have_high;
    double best_low, best_high;

    // Training metrics since the last log. They are saved in checkpoints, so a
    // resumed run logs the same averages as an uninterrupted one.
    double loss_sum, grads_l2_sum, weights_l2_sum;
    int64_t loss_count;
    // Each task's loss since the last log: a log gives metrics/<loss> of the
    // logged step's task from its own steps alone, never another task's loss
    // under its name. The counts add up to loss_count.
    double task_loss_sum[CT_LOOP_MAX_TASKS];
    int64_t task_loss_count[CT_LOOP_MAX_TASKS];
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

// Only the chief writes files (checkpoints, metrics, event files), so only
// it can fail at that: every process learns here whether it did (one
// allreduce), so that none goes on into a collective the chief never
// reaches, and all stop with an error.
static ct_status chief_agrees(ct_loop *l, ct_status st, const char *what, ct_error *err) {
    if (!l->comm) return st;
    return ct_train_agree(l->comm, st, err, "loop: step %lld: process 0 failed %s (its error is in its output)",
                          (long long)l->step, what);
}

// ---- cadences ------------------------------------------------------------------

static bool in_list(const step_list *sl, int64_t step) {
    for (int i = 0; i < sl->n; i++)
        if (sl->steps[i] == step) return true;
    return false;
}

// Trax's _at_step_1_and_every_nth_step(period): step 1, and every period
// steps after step 0 (a checkpoint saved at step 0, before any update, is
// on no cadence: ct_loop_save_checkpoint or a run of 0 steps writes one).
static bool at_1_and_every(int64_t step, int64_t period) {
    return step == 1 || (period > 0 && step > 0 && step % period == 0);
}

static bool checkpoint_at(const ct_loop *l, int64_t step) {
    if (l->opts.checkpoint_at) return l->opts.checkpoint_at(step, l->opts.predicate_user);
    if (l->ckpt_list.on) return in_list(&l->ckpt_list, step);
    return at_1_and_every(step, l->opts.n_steps_per_checkpoint);
}

static bool eval_at(const ct_loop *l, int64_t step) {
    if (l->opts.eval_at) return l->opts.eval_at(step, l->opts.predicate_user);
    if (l->eval_list.on) return in_list(&l->eval_list, step);
    return at_1_and_every(step, l->opts.n_steps_per_checkpoint);
}

// A period of permanent checkpoints also means one at step 1, as Trax's; no
// period, none.
static bool permanent_at(const ct_loop *l, int64_t step) {
    if (l->opts.permanent_checkpoint_at) return l->opts.permanent_checkpoint_at(step, l->opts.predicate_user);
    if (l->perm_list.on) return in_list(&l->perm_list, step);
    int64_t every = l->opts.n_steps_per_permanent_checkpoint;
    return every > 0 && at_1_and_every(step, every);
}

// Trax's default which_task is `lambda n: n % len(tasks)`, called with its
// step after the increment: the 1-based step ctrax numbers steps with.
static ct_status task_at(const ct_loop *l, int64_t step, int *task, ct_error *err) {
    int t = l->opts.which_task ? l->opts.which_task(step, l->opts.which_task_user) : (int)(step % l->n_tasks);
    if (t < 0 || t >= l->n_tasks)
        return ct_error_set(err, CT_ERR_ARG, "loop: which_task gave task %d for step %lld; there are %d train tasks", t,
                            (long long)step, l->n_tasks);
    *task = t;
    return CT_OK;
}

// ---- history and summaries ---------------------------------------------------------

static uint64_t metric_hash(const char *mode, const char *metric) {
    return ct_hash_bytes(ct_hash_bytes(CT_HASH_START, mode, strlen(mode) + 1), metric, strlen(metric));
}

static bool same_metric(const void *ctx, int at, const void *key) {
    const history_metric *m = &((const ct_loop *)ctx)->metrics[at];
    const ct_history_entry *e = key;
    return !strcmp(m->mode, e->mode) && !strcmp(m->metric, e->metric);
}

static void append_history(ct_loop *l, const char *mode, const char *metric, double value) {
    if (l->n_history == l->cap_history) {
        l->cap_history = l->cap_history ? 2 * l->cap_history : 256;
        l->history = ct_realloc(l->history, (size_t)l->cap_history * sizeof *l->history);
        l->history_metric = ct_realloc(l->history_metric, (size_t)l->cap_history * sizeof *l->history_metric);
    }
    ct_history_entry *e = &l->history[l->n_history];
    memset(e, 0, sizeof *e);
    snprintf(e->mode, sizeof e->mode, "%s", mode);
    snprintf(e->metric, sizeof e->metric, "%s", metric);
    e->step = l->step;
    e->value = value;
    uint64_t h = metric_hash(e->mode, e->metric);
    int k = ct_index_find(&l->metric_index, h, same_metric, l, e);
    if (k < 0) {
        if (l->n_metrics == l->cap_metrics) {
            l->cap_metrics = l->cap_metrics ? 2 * l->cap_metrics : 16;
            l->metrics = ct_realloc(l->metrics, (size_t)l->cap_metrics * sizeof *l->metrics);
        }
        k = l->n_metrics++;
        history_metric *m = &l->metrics[k];
        memcpy(m->mode, e->mode, sizeof m->mode);
        memcpy(m->metric, e->metric, sizeof m->metric);
        ct_index_add(&l->metric_index, k, h);
    }
    l->metrics[k].last = l->n_history;
    l->history_metric[l->n_history++] = k;
}

// Empties the history (a restore reads it anew).
static void clear_history(ct_loop *l) {
    l->n_history = 0;
    l->n_metrics = 0;
    ct_index_free(&l->metric_index);
}

// Bounds the history (ct_loop_options.history_max = M): once it holds 2 M
// rows and M + 2 D (D: the (mode, metric)s its rows name), the newest M
// stay, and of the older ones only each metric's last (no later row of its
// mode and metric), in the order recorded. What stays is then at most
// M + D - 1 rows (the newest row's metric is among the newest M), so the
// next cut is at least max(M - D, D) + 1 records away and its O(M + D) is
// O(1) a record, however many metrics a run logs (cut at 2 M rows alone, a
// history naming more than M metrics would be cut at every record).
// The rule depends on the rows alone, not on where the last cut was, and a
// cut's rows are those one cut of every row recorded so far would leave; so
// a history restored row by row through it (restore_history) is the one
// saved when a loop with this M saved it (its older rows, each its metric's
// last, name metrics the newer ones do not: no prefix of it reaches
// M + 2 D), and the rows a run with this M holds when it was saved with a
// larger M or none; a resumed run then goes on from, and cuts at, the very
// rows of the uninterrupted one.
static void bound_history(ct_loop *l) {
    int64_t max = l->opts.history_max, n = l->n_history;
    if (max <= 0 || n < 2 * max || n < max + 2 * (int64_t)l->n_metrics) return;
    int64_t newest = n - max;
    int m = 0;
    for (int i = 0; i < n; i++) {
        int k = l->history_metric[i];
        bool last = l->metrics[k].last == i;
        if (i < newest && !last) continue;
        l->history[m] = l->history[i];
        l->history_metric[m] = k;
        if (last) l->metrics[k].last = m;
        m++;
    }
    l->n_history = m;
}

static ct_status record(ct_loop *l, const char *mode, const char *metric, double value, ct_error *err) {
    append_history(l, mode, metric, value);
    bound_history(l);
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
    ct_format_step_line(buf, sizeof buf, l->step, mode, name, l->name_width, value);
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

// An optimizer's name and hyperparameters, as ct_optimizer_check_json reads them.
static cJSON *optimizer_json(const ct_optimizer *opt) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", ct_optimizer_name(opt));
    const char *layout = ct_optimizer_slot_layout(opt);
    if (layout) cJSON_AddStringToObject(o, "slot_layout", layout);
    cJSON *params = cJSON_AddObjectToObject(o, "params");
    for (int i = 0; i < ct_optimizer_n_params(opt); i++) {
        float v = 0;
        const char *name = ct_optimizer_param_name(opt, i);
        if (ct_optimizer_get_param(opt, name, &v, NULL) == CT_OK) cJSON_AddNumberToObject(params, name, v);
    }
    return o;
}

// The data cursors: every train task's, the main eval task's and the
// additional ones'.
static void add_cursors_json(cJSON *root, const ct_loop *l) {
    cJSON *tasks = cJSON_AddArrayToObject(root, "train_cursors");
    for (int i = 0; i < l->n_tasks; i++) cJSON_AddItemToArray(tasks, cursor_json(ct_stream_get_cursor(l->tasks[i].stream)));
    if (l->evaluators[0])
        cJSON_AddItemToObject(root, "eval_cursor", cursor_json(ct_stream_get_cursor(ct_evaluator_stream(l->evaluators[0]))));
    cJSON *more = cJSON_AddArrayToObject(root, "additional_eval_cursors");
    for (int i = 1; i < l->n_evaluators; i++)
        cJSON_AddItemToArray(more, cursor_json(ct_stream_get_cursor(ct_evaluator_stream(l->evaluators[i]))));
}

// The bests, the training metrics since the last log and the history:
// doubles written exactly, so a resumed run goes on from the same sums.
static void add_metrics_json(cJSON *root, const ct_loop *l) {
    cJSON *best = cJSON_AddObjectToObject(root, "best");
    if (l->have_low) cJSON_AddItemToObject(best, "low", exact_number(l->best_low));
    if (l->have_high) cJSON_AddItemToObject(best, "high", exact_number(l->best_high));
    cJSON *since_log = cJSON_AddObjectToObject(root, "train_since_log");
    cJSON_AddItemToObject(since_log, "loss_sum", exact_number(l->loss_sum));
    cJSON_AddNumberToObject(since_log, "loss_count", (double)l->loss_count);
    cJSON_AddItemToObject(since_log, "gradients_l2_sum", exact_number(l->grads_l2_sum));
    cJSON_AddItemToObject(since_log, "weights_l2_sum", exact_number(l->weights_l2_sum));
    cJSON *task_sums = cJSON_AddArrayToObject(since_log, "task_loss_sums");
    cJSON *task_counts = cJSON_AddArrayToObject(since_log, "task_loss_counts");
    for (int i = 0; i < l->n_tasks; i++) {
        cJSON_AddItemToArray(task_sums, exact_number(l->task_loss_sum[i]));
        cJSON_AddItemToArray(task_counts, cJSON_CreateNumber((double)l->task_loss_count[i]));
    }
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
}

// state.json: what a resume needs besides the tensors (parse_core and
// parse_v4 read it back).
static char *state_json(const ct_loop *l) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", LOOP_STATE_FORMAT);
    cJSON_AddNumberToObject(root, "version", LOOP_STATE_VERSION);
    cJSON_AddNumberToObject(root, "step", (double)l->step);
    cJSON_AddNumberToObject(root, "seed", (double)l->opts.seed);
    // The seed exactly (a double holds 53 bits): what a resume of a run
    // that drew its seed reads back (ct_loop_checkpoint_seed).
    char seed_text[32];
    snprintf(seed_text, sizeof seed_text, "%llu", (unsigned long long)l->opts.seed);
    cJSON_AddStringToObject(root, "seed_text", seed_text);
    cJSON *key = cJSON_AddArrayToObject(root, "key");
    cJSON_AddItemToArray(key, cJSON_CreateNumber(l->key.w[0]));
    cJSON_AddItemToArray(key, cJSON_CreateNumber(l->key.w[1]));
    add_cursors_json(root, l);
    cJSON_AddItemToObject(root, "optimizer", optimizer_json(ct_trainer_optimizer(l->trainer)));
    // Tasks with optimizers of their own (null: the task shares task 0's).
    cJSON *task_opts = cJSON_AddArrayToObject(root, "task_optimizers");
    for (int i = 0; i < l->n_tasks; i++)
        cJSON_AddItemToArray(task_opts, l->task_opts[i].opt ? optimizer_json(l->task_opts[i].opt) : cJSON_CreateNull());
    add_metrics_json(root, l);
    cJSON_AddNumberToObject(root, "n_weights", (double)ct_trainer_net(l->trainer)->n_weights);
    cJSON_AddNumberToObject(root, "devices", ct_trainer_global_devices(l->trainer));
    cJSON_AddStringToObject(root, "trainer", ct_trainer_memory_efficient(l->trainer) ? "memory_efficient" : "standard");
    if (l->opts.config_text) cJSON_AddStringToObject(root, "config", l->opts.config_text);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

// Puts task i's own optimizer and slots into the trainer, or takes them
// back out (the same swap twice), so a task's step, its checkpoint tensors
// and its checks see its own. A task with none is a no-op.
static void swap_task_optimizer(ct_loop *l, int task) {
    if (l->task_opts[task].opt) ct_trainer_swap_optimizer(l->trainer, &l->task_opts[task]);
}

// The trainer's weights and the slots it holds now are finite.
static ct_status check_finite_slots(const ct_loop *l, const char *whose, ct_error *err) {
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
            return ct_error_set(err, CT_ERR_NONFINITE, "%soptimizer slot of %s is %g at element %zu after step %lld",
                                whose, p->full_name, (double)slots[off + bad], bad, (long long)l->step);
    }
    return CT_OK;
}

// Every checkpoint on disk holds finite weights and slots, so the newest one
// is always a good place to resume from (pruning can then never leave only
// NaN). Every process checks: their weights are the same, so all agree.
static ct_status check_finite(ct_loop *l, ct_error *err) {
    CT_TRY(check_finite_slots(l, "", err));
    for (int i = 1; i < l->n_tasks; i++) {
        if (!l->task_opts[i].opt) continue;
        char whose[32];
        snprintf(whose, sizeof whose, "task %d's ", i);
        swap_task_optimizer(l, i);
        ct_status st = check_finite_slots(l, whose, err);
        swap_task_optimizer(l, i);
        CT_TRY(st);
    }
    return CT_OK;
}

// The crc32 of parameter i's weights in crc[2 i], and of its optimizer
// slots (the trainer's, then each task's own) in crc[2 i + 1].
static void replica_crcs(ct_loop *l, uint32_t *crc) {
    const ct_net *net = ct_trainer_net(l->trainer);
    for (int i = 0; i < net->n_params; i++) {
        const ct_param *p = net->params[i];
        size_t numel = (size_t)ct_tensor_numel(&p->sig);
        crc[2 * i] = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), (const Bytef *)(net->weights + p->offset),
                                      numel * sizeof(float));
        crc[2 * i + 1] = (uint32_t)crc32(0L, Z_NULL, 0);
    }
    for (int task = 0; task < l->n_tasks; task++) {
        if (task > 0 && !l->task_opts[task].opt) continue;
        swap_task_optimizer(l, task);
        const float *slots = ct_trainer_slots(l->trainer, NULL);
        for (int i = 0; i < net->n_params; i++) {
            size_t off, cnt;
            ct_trainer_param_slots(l->trainer, i, &off, &cnt);
            crc[2 * i + 1] = (uint32_t)crc32_z(crc[2 * i + 1], (const Bytef *)(slots + off), cnt * sizeof(float));
        }
        swap_task_optimizer(l, task);
    }
}

// Copies the chief's weights (the whole slab) and optimizer slots (the
// trainer's and each task's own) to every process.
static ct_status copy_chief_replica(ct_loop *l, ct_error *err) {
    const ct_net *net = ct_trainer_net(l->trainer);
    CT_TRY(ct_comm_broadcast(l->comm, net->weights, net->n_weights * sizeof(float), 0, err));
    for (int task = 0; task < l->n_tasks; task++) {
        if (task > 0 && !l->task_opts[task].opt) continue;
        swap_task_optimizer(l, task);
        size_t n;
        float *slots = ct_trainer_slots(l->trainer, &n);
        ct_status st = ct_comm_broadcast(l->comm, slots, n * sizeof(float), 0, err);
        swap_task_optimizer(l, task);
        CT_TRY(st);
    }
    return CT_OK;
}

// Data-parallel processes each hold a copy of the weights and slots that
// should stay bit for bit the chief's: each applies the same update to the
// same weights from the same summed gradients. A host whose CPU rounds an
// update otherwise (another kernel on a cluster of mixed machines), a
// flipped bit or a defect lets the copies drift apart silently, each
// process then training its own model and the checkpoint holding the
// chief's alone, from which a resumed run would not continue as this one
// does. So before each checkpoint every process compares a crc32 of each
// parameter's weights and slots with the chief's; if any differs, each that
// does says which (a warning), and the chief's are copied to every process
// before the checkpoint: training goes on from one model, and the
// checkpoint resumes it bit for bit.
static ct_status check_replicas(ct_loop *l, ct_error *err) {
    if (!l->comm || ct_comm_size(l->comm) <= 1) return CT_OK;
    const ct_net *net = ct_trainer_net(l->trainer);
    size_t n = 2 * (size_t)net->n_params;
    uint32_t *mine = ct_calloc(n + 1, sizeof *mine), *chief = ct_calloc(n + 1, sizeof *chief);
    replica_crcs(l, mine);
    memcpy(chief, mine, n * sizeof *chief);
    ct_status st = ct_comm_broadcast(l->comm, chief, n * sizeof *chief, 0, err);
    size_t k = 0;
    while (k < n && mine[k] == chief[k]) k++;
    double n_differ = k < n;
    if (st == CT_OK) st = ct_comm_allreduce_f64(l->comm, &n_differ, 1, err);
    if (st == CT_OK && k < n)
        ct_log(CT_LOG_WARN,
               "loop: step %lld: process %d's %s of %s differ from process 0's (crc32 %08x here, %08x on process 0): "
               "the processes' copies drifted apart (do their CPUs differ? compare `ctrax info --system` on each "
               "host); process 0's weights and slots are copied to every process",
               (long long)l->step, ct_comm_rank(l->comm), k % 2 ? "optimizer slots" : "weights",
               net->params[k / 2]->full_name, mine[k], chief[k]);
    else if (st == CT_OK && n_differ > 0 && is_chief(l))
        ct_log(CT_LOG_WARN,
               "loop: step %lld: %.0f other process(es) hold weights or slots that differ from process 0's (each "
               "says which): process 0's are copied to every process",
               (long long)l->step, n_differ);
    ct_free(mine);
    ct_free(chief);
    if (st == CT_OK && n_differ > 0) st = copy_chief_replica(l, err);
    return st;
}

// The file of task i's own slots: slots_task<i>.safetensors.
static void task_slots_file(int task, char *buf, size_t cap) { snprintf(buf, cap, "slots_task%d.safetensors", task); }

// Task i's own slots as named tensors (the names and views the trainer
// gives its own slots, into task i's slab; the caller frees the array).
static ct_named_tensor *task_slot_tensors(ct_loop *l, int task, int *n) {
    ct_named_tensor *wt, *st;
    int nw;
    swap_task_optimizer(l, task);
    ct_trainer_checkpoint_tensors(l->trainer, &wt, &nw, &st, n);
    swap_task_optimizer(l, task);
    ct_free(wt);
    return st;
}

// Writes the slots of every task with its own optimizer, as slots.safetensors.
static ct_status add_task_slots(ct_loop *l, ct_checkpoint_writer *w, ct_error *err) {
    for (int i = 1; i < l->n_tasks; i++) {
        if (!l->task_opts[i].opt) continue;
        char file[64];
        task_slots_file(i, file, sizeof file);
        int ns;
        ct_named_tensor *st = task_slot_tensors(l, i, &ns);
        ct_kv meta[1] = {{"optimizer", ct_optimizer_name(l->task_opts[i].opt)}};
        ct_status s = ct_checkpoint_writer_add_tensors(w, file, st, ns, meta, 1, err);
        ct_free(st);
        CT_TRY(s);
    }
    return CT_OK;
}

// The names of tensors [first, n) of wt, one per line: weights.safetensors'
// "state_tensors" metadata, which tells its readers (ctrax info, Python) the
// layers' state (LSH buckets, counters: kept, not trained) from the weights.
static char *tensor_names(const ct_named_tensor *wt, int first, int n) {
    size_t len = 1;
    for (int i = first; i < n; i++) len += strlen(wt[i].name) + 1;
    char *names = ct_calloc(len, 1), *end = names;
    for (int i = first; i < n; i++) end += sprintf(end, "%s%s", i > first ? "\n" : "", wt[i].name);
    return names;
}

// The chief's part of write_checkpoint: checkpoint name of the loop's state
// now. A resume point (model_<step>) becomes what the pointer names; a best
// checkpoint is a copy. The metrics logged so far are flushed before the
// commit: a checkpoint never exists whose step's metrics are still in a
// buffer (a resumed run would not log them again).
static ct_status write_files(ct_loop *l, const char *name, bool keep, bool resume_point, ct_error *err) {
    if (l->summary) CT_TRY(ct_summary_flush(l->summary, err));
    if (is_chief(l)) {
        ct_checkpoint_options co = ct_checkpoint_default_options();
        co.step = l->step;
        co.keep = keep;
        co.update_pointer = resume_point;
        ct_checkpoint_writer *w;
        if (ct_checkpoint_writer_begin(&w, l->opts.output_dir, name, &co, err) != CT_OK)
            return ct_error_prefix(err, "loop: writing checkpoint %s at step %lld", name, (long long)l->step);
        int nw, ns;
        ct_named_tensor *wt, *st;
        ct_trainer_checkpoint_tensors(l->trainer, &wt, &nw, &st, &ns);
        ct_kv meta[1] = {{"optimizer", ct_optimizer_name(ct_trainer_optimizer(l->trainer))}};
        char *json = state_json(l);
        int n_state = ct_trainer_net(l->trainer)->n_state_params;
        char *state_names = tensor_names(wt, nw - n_state, nw);
        ct_kv wmeta[1] = {{"state_tensors", state_names}};
        ct_status s = ct_checkpoint_writer_add_tensors(w, "weights.safetensors", wt, nw, wmeta, n_state ? 1 : 0, err);
        ct_free(state_names);
        if (s == CT_OK) s = ct_checkpoint_writer_add_tensors(w, "slots.safetensors", st, ns, meta, 1, err);
        if (s == CT_OK) s = add_task_slots(l, w, err);
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
    return CT_OK;
}

// Writes checkpoint name of the loop's state now (write_files, on the chief).
static ct_status write_checkpoint(ct_loop *l, const char *name, bool keep, bool resume_point, ct_error *err) {
    if (!l->opts.output_dir) return CT_OK;
    if (check_finite(l, err) != CT_OK) return ct_error_prefix(err, "loop: no checkpoint %s written", name);
    CT_TRY(check_replicas(l, err));
    CT_TRY(chief_agrees(l, write_files(l, name, keep, resume_point, err), "to write a checkpoint", err));
    for (int i = 0; i < l->opts.n_callbacks; i++)
        if (l->opts.callbacks[i].on_checkpoint) l->opts.callbacks[i].on_checkpoint(name, l->step, l->opts.callbacks[i].user);
    return CT_OK;
}

ct_status ct_loop_save_checkpoint(ct_loop *loop, ct_error *err) {
    char name[CT_CHECKPOINT_NAME_MAX];
    snprintf(name, sizeof name, "model_%lld", (long long)loop->step);
    CT_TRY(write_checkpoint(loop, name, permanent_at(loop, loop->step), true, err));
    loop->last_checkpoint_step = loop->step;
    return CT_OK;
}

#define CT_CURSOR_POSITION_MAX (INT64_C(1) << 48)

static ct_status json_cursor(const cJSON *o, ct_stream_cursor *c, const char *what, const char *ckpt, ct_error *err) {
    const cJSON *fields[2] = {cJSON_GetObjectItemCaseSensitive(o, "position"),
                              cJSON_GetObjectItemCaseSensitive(o, "fingerprint")};
    int64_t values[2];
    for (int i = 0; i < 2; i++) {
        char *end = NULL;
        errno = 0;  // strtoll's only sign of an overflow: it clamps to LLONG_MAX
        long long v = cJSON_IsString(fields[i]) ? strtoll(fields[i]->valuestring, &end, 10) : -1;
        if (!end || end == fields[i]->valuestring || *end || v < 0 || errno == ERANGE)
            return ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s: state.json has no valid %s cursor (%s)", ckpt,
                                what, i == 0 ? "position" : "fingerprint");
        // No run reaches 2^48 batches; a larger position would overflow the
        // streams' arithmetic (the batcher's example index is position x B).
        if (i == 0 && v > CT_CURSOR_POSITION_MAX)
            return ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s: state.json's %s cursor position %lld is over 2^48",
                                ckpt, what, v);
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

static ct_status restore_history(ct_loop *l, const cJSON *hist, const char *name, int64_t last_step, ct_error *err) {
    if (!cJSON_IsArray(hist)) return bad_field(err, name, "history", "an array");
    clear_history(l);
    int i = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, hist) {
        const cJSON *m = cJSON_GetArrayItem(row, 0), *k = cJSON_GetArrayItem(row, 1), *s = cJSON_GetArrayItem(row, 2),
                    *v = cJSON_GetArrayItem(row, 3);
        int64_t step;
        double value;
        // The mode picks the summary file and the metric names it: both as
        // the loop writes them (a longer name would come back cut short).
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != 4 || !cJSON_IsString(m) || !cJSON_IsString(k) ||
            (strcmp(m->valuestring, "train") && strcmp(m->valuestring, "eval")) || !k->valuestring[0] ||
            strlen(k->valuestring) >= sizeof l->history[0].metric || !json_count(s, (double)last_step, &step) ||
            !json_value(v, &value))
            return ct_error_set(err, CT_ERR_FORMAT,
                                "checkpoint %s: state.json: history[%d] is not [\"train\" or \"eval\", metric (1 to %zu "
                                "characters), step up to the checkpoint's, value]",
                                name, i, sizeof l->history[0].metric - 1);
        int64_t saved = l->step;
        l->step = step;
        // Bounded row by row, as the run recorded them (bound_history): a
        // history this loop saved comes back unchanged; one saved with a
        // larger history_max (or none, or an edited one) is cut to the rows
        // a run with this one holds, and is never held whole.
        append_history(l, m->valuestring, k->valuestring, value);
        bound_history(l);
        l->step = saved;
        i++;
    }
    return CT_OK;
}

// What state.json says, checked whole before anything is loaded.
typedef struct loop_state {
    int64_t step, key_words[2], loss_count, skipped, task_loss_count[CT_LOOP_MAX_TASKS];
    double loss_sum, grads_l2_sum, weights_l2_sum, best_low, best_high, task_loss_sum[CT_LOOP_MAX_TASKS];
    bool have_low, have_high, have_eval_cursor, have_more_cursors;
    ct_stream_cursor train_cur[CT_LOOP_MAX_TASKS], eval_cur, more_cur[CT_LOOP_MAX_EVAL_TASKS];
} loop_state;

// Version 3's fields: the loss since the last log and the skipped steps.
static ct_status parse_v3(const cJSON *root, const char *name, loop_state *s, ct_error *err) {
    const cJSON *since = cJSON_GetObjectItemCaseSensitive(root, "train_since_log");
    if (!json_value(cJSON_GetObjectItemCaseSensitive(since, "loss_sum"), &s->loss_sum) ||
        !json_count(cJSON_GetObjectItemCaseSensitive(since, "loss_count"), STATE_INT_MAX, &s->loss_count) ||
        s->loss_count > s->step)
        return bad_field(err, name, "train_since_log", "{loss_sum, loss_count} with a count up to the step");
    if (!json_count(cJSON_GetObjectItemCaseSensitive(root, "skipped_steps"), (double)s->step, &s->skipped))
        return bad_field(err, name, "skipped_steps", "an integer from 0 to the step");
    return CT_OK;
}

// Version 4's fields: the norms since the last log, the additional eval
// tasks' cursors, and which tasks have optimizers of their own (the run's
// tasks must say the same).
static ct_status parse_v4(const ct_loop *l, const cJSON *root, const char *name, loop_state *s, ct_error *err) {
    const cJSON *since = cJSON_GetObjectItemCaseSensitive(root, "train_since_log");
    if (!json_value(cJSON_GetObjectItemCaseSensitive(since, "gradients_l2_sum"), &s->grads_l2_sum) ||
        !json_value(cJSON_GetObjectItemCaseSensitive(since, "weights_l2_sum"), &s->weights_l2_sum))
        return bad_field(err, name, "train_since_log", "{gradients_l2_sum, weights_l2_sum} numbers");
    const cJSON *more = cJSON_GetObjectItemCaseSensitive(root, "additional_eval_cursors");
    if (!cJSON_IsArray(more))
        return bad_field(err, name, "additional_eval_cursors", "an array");
    int n_more = cJSON_GetArraySize(more);
    // A run may add or drop eval tasks across a resume (evals change no
    // weight); the cursors are used when the count is the same.
    s->have_more_cursors = n_more == l->n_evaluators - 1 && n_more > 0;
    for (int i = 0; s->have_more_cursors && i < n_more; i++)
        CT_TRY(json_cursor(cJSON_GetArrayItem(more, i), &s->more_cur[i], "additional eval", name, err));
    const cJSON *opts = cJSON_GetObjectItemCaseSensitive(root, "task_optimizers");
    if (!cJSON_IsArray(opts) || cJSON_GetArraySize(opts) != l->n_tasks)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "checkpoint %s: state.json: \"task_optimizers\" is not an array of %d entries (one per train "
                            "task)", name, l->n_tasks);
    for (int i = 0; i < l->n_tasks; i++) {
        const cJSON *o = cJSON_GetArrayItem(opts, i);
        bool own = i > 0 && l->task_opts[i].opt, saved = !cJSON_IsNull(o);
        if (saved && !cJSON_IsObject(o))
            return ct_error_set(err, CT_ERR_FORMAT,
                                "checkpoint %s: state.json: \"task_optimizers\"[%d] is neither null nor an optimizer "
                                "object", name, i);
        if (i > 0 && own != saved)
            return ct_error_set(err, CT_ERR_FORMAT,
                                "checkpoint %s: train task %d %s there, %s in this run", name, i,
                                saved ? "had an optimizer of its own" : "shared task 0's optimizer",
                                own ? "has one of its own" : "shares task 0's");
    }
    return CT_OK;
}

// Version 5's fields: each train task's loss since the last log, one entry
// per task, the counts adding up to loss_count.
static ct_status parse_v5(const ct_loop *l, const cJSON *root, const char *name, loop_state *s, ct_error *err) {
    const cJSON *since = cJSON_GetObjectItemCaseSensitive(root, "train_since_log");
    const cJSON *sums = cJSON_GetObjectItemCaseSensitive(since, "task_loss_sums");
    const cJSON *counts = cJSON_GetObjectItemCaseSensitive(since, "task_loss_counts");
    bool ok = cJSON_IsArray(sums) && cJSON_IsArray(counts) && cJSON_GetArraySize(sums) == l->n_tasks &&
              cJSON_GetArraySize(counts) == l->n_tasks;
    int64_t total = 0;
    for (int i = 0; ok && i < l->n_tasks; i++) {
        ok = json_value(cJSON_GetArrayItem(sums, i), &s->task_loss_sum[i]) &&
             json_count(cJSON_GetArrayItem(counts, i), (double)s->loss_count, &s->task_loss_count[i]);
        total += ok ? s->task_loss_count[i] : 0;
    }
    if (!ok || total != s->loss_count)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "checkpoint %s: state.json: \"train_since_log\" has no task_loss_sums and task_loss_counts "
                            "of %d entries (one per train task) with counts adding up to loss_count",
                            name, l->n_tasks);
    return CT_OK;
}

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
    // Before version 3 nothing since the last log was saved, before 4 only
    // the loss: what is not there starts from zero.
    if (version >= 3) CT_TRY(parse_v3(root, name, s, err));
    if (version >= 4) CT_TRY(parse_v4(l, root, name, s, err));
    if (version >= 5) CT_TRY(parse_v5(l, root, name, s, err));
    // Before version 5 one task's loss was the loss; several tasks' losses
    // since the last log are lost (their next log averages from the resume).
    if (version < 5 && l->n_tasks == 1) s->task_loss_sum[0] = s->loss_sum, s->task_loss_count[0] = s->loss_count;
    for (int i = 1; version < 4 && i < l->n_tasks; i++)
        if (l->task_opts[i].opt)
            return ct_error_set(err, CT_ERR_FORMAT,
                                "checkpoint %s (state version %lld) has no optimizer of train task %d's own", name,
                                (long long)version, i);
    for (int i = 0; i < l->n_tasks; i++)
        CT_TRY(json_cursor(cJSON_GetArrayItem(cursors, i), &s->train_cur[i], "train", name, err));
    const cJSON *ec = cJSON_GetObjectItemCaseSensitive(root, "eval_cursor");
    s->have_eval_cursor = l->evaluators[0] && ec;
    if (s->have_eval_cursor) CT_TRY(json_cursor(ec, &s->eval_cur, "eval", name, err));
    return CT_OK;
}

// The trainer's weights, state and slots: a failed load leaves every
// destination as it was.
static ct_status load_tensors(ct_loop *l, const ct_checkpoint *c, ct_error *err) {
    int nw, ns;
    ct_named_tensor *wt, *sl;
    ct_trainer_checkpoint_tensors(l->trainer, &wt, &nw, &sl, &ns);
    // Room for every task's slots: each has at most one tensor per weight.
    int cap = nw + ns + l->n_tasks * (ct_trainer_net(l->trainer)->n_params + 1) + 1, n = 0;
    ct_tensor_request *reqs = ct_calloc((size_t)cap, sizeof *reqs);
    const ct_net *net = ct_trainer_net(l->trainer);
    for (int i = 0; i < nw; i++) {
        bool cache = i >= net->n_params && net->state_params[i - net->n_params]->cache;  // weights, then state
        reqs[n++] = (ct_tensor_request){.file = "weights.safetensors", .name = wt[i].name,
            .dest = wt[i].tensor, .cache = cache};
    }
    for (int i = 0; i < ns; i++) reqs[n++] = (ct_tensor_request){.file = "slots.safetensors", .name = sl[i].name,
        .dest = sl[i].tensor};
    char files[CT_LOOP_MAX_TASKS][64];
    ct_named_tensor *task_sl[CT_LOOP_MAX_TASKS] = {0};
    for (int t = 1; t < l->n_tasks; t++) {
        if (!l->task_opts[t].opt) continue;
        task_slots_file(t, files[t], sizeof files[t]);
        int ns2;
        task_sl[t] = task_slot_tensors(l, t, &ns2);
        for (int i = 0; i < ns2; i++) reqs[n++] = (ct_tensor_request){.file = files[t], .name = task_sl[t][i].name,
            .dest = task_sl[t][i].tensor};
    }
    ct_status st = ct_checkpoint_load(c, reqs, n, CT_LOAD_EXACT, err);
    for (int t = 0; t < l->n_tasks; t++) ct_free(task_sl[t]);
    ct_free(reqs);
    ct_free(wt);
    ct_free(sl);
    return st;
}

// The checkpoint's optimizers against the run's (name, slot layout,
// values), before any tensor is loaded: a slot layout that differs is told
// as such, not as slots of the wrong size.
static ct_status check_optimizers(ct_loop *l, const cJSON *root, const char *what, ct_error *err) {
    CT_TRY(ct_optimizer_check_json(ct_trainer_optimizer(l->trainer), cJSON_GetObjectItemCaseSensitive(root, "optimizer"),
                                   what, is_chief(l), err));
    const cJSON *task_opts = cJSON_GetObjectItemCaseSensitive(root, "task_optimizers");
    for (int i = 1; i < l->n_tasks; i++) {
        if (!l->task_opts[i].opt) continue;  // parse_v4 checked that the checkpoint has it too
        char task_what[CT_CHECKPOINT_NAME_MAX + 48];
        snprintf(task_what, sizeof task_what, "%s: task_optimizers[%d]", what, i);
        CT_TRY(ct_optimizer_check_json(l->task_opts[i].opt, cJSON_GetArrayItem(task_opts, i), task_what, is_chief(l),
                                       err));
    }
    return CT_OK;
}

// Everything after the tensors: the cursors and the loop's own fields.
static ct_status apply_state(ct_loop *l, const loop_state *s, ct_error *err) {
    for (int i = 0; i < l->n_tasks; i++) CT_TRY(ct_stream_set_cursor(l->tasks[i].stream, s->train_cur[i], err));
    if (s->have_eval_cursor) CT_TRY(ct_stream_set_cursor(ct_evaluator_stream(l->evaluators[0]), s->eval_cur, err));
    for (int i = 1; s->have_more_cursors && i < l->n_evaluators; i++)
        CT_TRY(ct_stream_set_cursor(ct_evaluator_stream(l->evaluators[i]), s->more_cur[i - 1], err));
    l->step = s->step;
    l->key.w[0] = (uint32_t)s->key_words[0];
    l->key.w[1] = (uint32_t)s->key_words[1];
    l->have_low = s->have_low;
    l->best_low = s->best_low;
    l->have_high = s->have_high;
    l->best_high = s->best_high;
    l->loss_sum = s->loss_sum;
    l->grads_l2_sum = s->grads_l2_sum;
    l->weights_l2_sum = s->weights_l2_sum;
    l->loss_count = s->loss_count;
    memcpy(l->task_loss_sum, s->task_loss_sum, sizeof l->task_loss_sum);
    memcpy(l->task_loss_count, s->task_loss_count, sizeof l->task_loss_count);
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
    // A state.json edited (or copied) apart from its checkpoint would resume
    // the wrong step's schedule, cadences and keys with these weights.
    if (st == CT_OK && s.step != ct_checkpoint_step(c))
        st = ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s: state.json: \"step\" is %lld, the manifest's is %lld", name,
                          (long long)s.step, (long long)ct_checkpoint_step(c));
    if (st == CT_OK) st = restore_history(l, cJSON_GetObjectItemCaseSensitive(root, "history"), name, s.step, err);
    if (st == CT_OK) st = check_optimizers(l, root, what, err);
    if (st == CT_OK) st = load_tensors(l, c, err);
    if (st == CT_OK) st = apply_state(l, &s, err);
    cJSON_Delete(root);
    return st;
}

// Finds the newest complete checkpoint (the chief decides, everyone loads
// the same one) and restores it. Opening a checkpoint reads and checks every
// byte of it (about 0.7 s per GiB from the page cache), so the chief searches
// once and restores what that search opened, or what the caller's search
// opened (opts.restore_checkpoint); the other processes open the name the
// chief found.
static ct_status restore_latest(ct_loop *l, ct_error *err) {
    char name[CT_CHECKPOINT_NAME_MAX] = "";
    ct_checkpoint *opened = NULL;
    const ct_checkpoint *c = is_chief(l) ? l->opts.restore_checkpoint : NULL;
    ct_status st = CT_OK;
    if (is_chief(l) && !c) {
        st = ct_checkpoint_open_latest(&opened, l->opts.output_dir, err);
        c = opened;
    }
    if (c) snprintf(name, sizeof name, "%s", ct_checkpoint_name(c));
    if (l->comm) {
        double ok = st == CT_OK;
        // every rank learns whether the chief failed, and what it found
        // (every process makes both calls, the chief after a failure too)
        ct_status cs = ct_comm_allreduce_f64(l->comm, &ok, 1, err);
        if (cs == CT_OK) cs = ct_comm_broadcast(l->comm, name, sizeof name, 0, err);
        if (cs == CT_OK && st == CT_OK && ok < l->n_proc)
            cs = ct_error_set(err, CT_ERR_IO, "loop: the chief could not find a checkpoint");
        if (cs != CT_OK) {
            ct_checkpoint_close(opened);
            return cs;
        }
    }
    CT_TRY(st);
    if (!name[0]) return CT_OK;
    if (!c) {
        st = ct_checkpoint_open(&opened, l->opts.output_dir, name, err);
        c = opened;
    }
    if (st == CT_OK) st = restore_from(l, c, err);
    ct_checkpoint_close(opened);
    // Each process loads the checkpoint itself (from its own disk, where
    // the output directory is not shared): all learn whether every one did.
    if (l->comm)
        st = ct_train_agree(l->comm, st, err, "another process could not load it (its error is in its output)");
    if (st != CT_OK) return ct_error_prefix(err, "loop: resuming from %s/%s", l->opts.output_dir, name);
    snprintf(l->restored_from, sizeof l->restored_from, "%s", name);
    l->last_checkpoint_step = l->step;
    if (is_chief(l))
        ct_log(CT_LOG_INFO, "resuming from %s/%s at step %lld", l->opts.output_dir, name, (long long)l->step);
    return CT_OK;
}

ct_status ct_loop_load_weights(ct_loop *loop, const char *checkpoint_dir, const char *name, ct_error *err) {
    ct_checkpoint *c;
    CT_TRY(ct_checkpoint_open(&c, checkpoint_dir, name, err));
    ct_status st = ct_trainer_load_checkpoint(loop->trainer, c, CT_LOAD_BY_NAME, err);
    ct_checkpoint_close(c);
    return st;
}

// Where opts.init_checkpoint points: "<dir>/<name>" when that directory is a
// checkpoint (it has a manifest), else a run's output directory (name "":
// its newest checkpoint, found when opened). dir holds 4096 bytes, name
// CT_CHECKPOINT_NAME_MAX.
static ct_status init_checkpoint_where(const char *path, char *dir, char *name, ct_error *err) {
    size_t len = strlen(path);
    if (len == 0 || len >= 4000)
        return ct_error_set(err, CT_ERR_ARG, "loop: init_checkpoint '%.200s' is %zu characters (1 to 3999)", path, len);
    char manifest[4200];
    snprintf(dir, 4096, "%s", path);
    while (len > 1 && dir[len - 1] == '/') dir[--len] = '\0';
    snprintf(manifest, sizeof manifest, "%s/manifest.json", dir);
    struct stat sb;
    if (stat(manifest, &sb) == 0) {
        char *slash = strrchr(dir, '/');
        const char *base = slash ? slash + 1 : dir;
        if (strlen(base) >= CT_CHECKPOINT_NAME_MAX)
            return ct_error_set(err, CT_ERR_ARG, "loop: init_checkpoint '%s': the checkpoint name is too long", path);
        snprintf(name, CT_CHECKPOINT_NAME_MAX, "%s", base);
        if (slash == dir) dir[1] = '\0';
        else if (slash) *slash = '\0';
        else snprintf(dir, 4096, ".");
        return CT_OK;
    }
    if (stat(dir, &sb) != 0) return ct_error_set(err, CT_ERR_IO, "loop: init_checkpoint '%s': %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return ct_error_set(err, CT_ERR_ARG,
                            "loop: init_checkpoint '%s' is not a directory (a checkpoint such as <run>/model_100, or "
                            "a run's output directory)", path);
    name[0] = '\0';
    return CT_OK;
}

// opts.init_checkpoint: the model's weights and state, every one of them
// (CT_LOAD_STRICT: a weight missing or of another shape is an error, as
// Trax's load fails on another model; a partial load of another model's
// weights is ct_loop_load_weights). Every process reads the same files.
static ct_status load_init_checkpoint(ct_loop *l, ct_error *err) {
    const char *path = l->opts.init_checkpoint;
    char dir[4096], name[CT_CHECKPOINT_NAME_MAX];
    CT_TRY(init_checkpoint_where(path, dir, name, err));
    ct_checkpoint *c = NULL;
    // A run's directory is searched and its checkpoint read and checked once.
    ct_status st = name[0] ? ct_checkpoint_open(&c, dir, name, err) : ct_checkpoint_open_latest(&c, dir, err);
    if (st == CT_OK && !c) return ct_error_set(err, CT_ERR_ARG, "loop: init_checkpoint '%s' holds no checkpoint", path);
    if (st == CT_OK) {
        snprintf(name, sizeof name, "%s", ct_checkpoint_name(c));
        st = ct_trainer_load_checkpoint(l->trainer, c, CT_LOAD_STRICT, err);
        ct_checkpoint_close(c);
    }
    if (st != CT_OK) return ct_error_prefix(err, "loop: init_checkpoint '%s'", path);
    if (is_chief(l))
        ct_log(CT_LOG_INFO, "weights from %s/%s (init_checkpoint); fresh optimizer slots, step 0", dir, name);
    return CT_OK;
}

ct_status ct_loop_system_seed(uint64_t *seed, ct_error *err) {
    uint32_t r = 0;
    ssize_t n = getrandom(&r, sizeof r, 0);
    if (n != (ssize_t)sizeof r) {
        // No getrandom (old kernel, seccomp): /dev/urandom.
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        n = fd >= 0 ? read(fd, &r, sizeof r) : -1;
        if (fd >= 0) close(fd);
        if (n != (ssize_t)sizeof r)
            return ct_error_set(err, CT_ERR_IO, "random_seed = None: cannot draw a seed (getrandom and /dev/urandom: %s)",
                                strerror(errno));
    }
    *seed = r & 0x7fffffffu;  // Trax: random.randint(0, 2**31 - 1)
    return CT_OK;
}

ct_status ct_loop_checkpoint_seed(const char *output_dir, ct_checkpoint **opened, bool *found, uint64_t *seed,
                                  ct_error *err) {
    *found = false;
    if (opened) *opened = NULL;
    ct_checkpoint *c;
    CT_TRY(ct_checkpoint_open_latest(&c, output_dir, err));
    if (!c) return CT_OK;
    const char *json = ct_checkpoint_state(c);
    cJSON *root = json ? ct_json_parse(json, strlen(json), "state.json", NULL) : NULL;  // checked at open
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "seed_text");
    const cJSON *num = cJSON_GetObjectItemCaseSensitive(root, "seed");
    ct_status st = CT_OK;
    char *end = NULL;
    errno = 0;
    if (cJSON_IsString(text)) {
        unsigned long long v = strtoull(text->valuestring, &end, 10);
        if (end == text->valuestring || *end || errno || text->valuestring[0] == '-')
            st = ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s/%s: state.json: \"seed_text\" is not a decimal seed",
                              output_dir, ct_checkpoint_name(c));
        *seed = v;
    } else if (cJSON_IsNumber(num) && num->valuedouble >= 0 && num->valuedouble < 9007199254740992.0 &&
               num->valuedouble == floor(num->valuedouble)) {
        *seed = (uint64_t)num->valuedouble;  // before seed_text: exact below 2^53
    } else {
        st = ct_error_set(err, CT_ERR_FORMAT, "checkpoint %s/%s: state.json records no seed", output_dir,
                          ct_checkpoint_name(c));
    }
    *found = st == CT_OK;
    cJSON_Delete(root);
    if (opened && st == CT_OK) *opened = c;
    else ct_checkpoint_close(c);
    return st;
}

// ---- evals -------------------------------------------------------------------------------

// After all of a step's evals are recorded and flushed: lowest_<metric> /
// highest_<metric> at a new best of the main task's metrics (ties count, as
// Trax, which saves them "after all evals are run and recorded"). A NaN is
// never a best, and a NaN best (one restored from a checkpoint) counts as
// none: nothing compares <= or >= NaN, so Trax, whose min() keeps a first
// NaN, saves no best after one. Both bests are updated before either is
// written, and neither moves the pointer: a kill before the step's own
// checkpoint resumes from the one before and writes them again.
static ct_status save_bests(ct_loop *l, const double *values, ct_error *err) {
    ct_evaluator *ev = l->evaluators[0];
    const char *low = NULL, *high = NULL;
    for (int m = 0; m < ct_evaluator_n_metrics(ev); m++) {
        const char *name = ct_evaluator_metric_name(ev, m);
        if (isnan(values[m])) continue;
        if (l->opts.checkpoint_low_metric && !strcmp(l->opts.checkpoint_low_metric, name) &&
            (!l->have_low || isnan(l->best_low) || values[m] <= l->best_low)) {
            l->have_low = true;
            l->best_low = values[m];
            low = name;
        }
        if (l->opts.checkpoint_high_metric && !strcmp(l->opts.checkpoint_high_metric, name) &&
            (!l->have_high || isnan(l->best_high) || values[m] >= l->best_high)) {
            l->have_high = true;
            l->best_high = values[m];
            high = name;
        }
    }
    char ckpt[CT_CHECKPOINT_NAME_MAX];
    if (low) {
        snprintf(ckpt, sizeof ckpt, "lowest_%s", low);
        CT_TRY(write_checkpoint(l, ckpt, true, false, err));
    }
    if (high) {
        snprintf(ckpt, sizeof ckpt, "highest_%s", high);
        CT_TRY(write_checkpoint(l, ckpt, true, false, err));
    }
    return CT_OK;
}

// The model's weights and state (its part of the trainer's net) into the
// eval model's net, in slab order: make_eval_net made sure they line up.
// (An empty slab may be NULL, which memcpy must not see.)
static void copy_to_eval_net(ct_loop *l) {
    const ct_net *src = ct_trainer_net(l->trainer);
    if (l->eval_net.n_weights)
        memcpy(l->eval_net.weights, src->weights + l->model->w_begin, l->eval_net.n_weights * sizeof(float));
    if (l->eval_net.n_state)
        memcpy(l->eval_net.state, src->state + l->model->s_begin, l->eval_net.n_state * sizeof(float));
}

ct_key ct_loop_eval_key(ct_key loop_key, int64_t step, int task) {
    return ct_key_fold_in(ct_train_step_key(ct_key_split(loop_key, 3), step), (uint32_t)task);
}

// Runs evaluator e, records its metrics (the main task's as
// "metrics/<name>", an additional task's as "metrics/<prefix>/<name>") and
// leaves them in values.
static ct_status run_one_eval(ct_loop *l, int e, const ct_net *net, double *values, ct_error *err) {
    ct_evaluator *ev = l->evaluators[e];
    CT_TRY(ct_evaluator_run(ev, net, ct_loop_eval_key(l->key, l->step, e), values, err));
    ct_status st = CT_OK;
    for (int m = 0; m < ct_evaluator_n_metrics(ev) && st == CT_OK; m++) {
        const char *name = ct_evaluator_metric_name(ev, m);
        char tag[160], shown[128];
        if (e == 0) snprintf(shown, sizeof shown, "%s", name);
        else snprintf(shown, sizeof shown, "%s/%s", l->eval_prefix[e], name);
        snprintf(tag, sizeof tag, "metrics/%s", shown);
        st = record(l, "eval", tag, values[m], err);
        if (st == CT_OK) log_line(l, "eval", shown, values[m]);
    }
    return chief_agrees(l, st, "to record eval metrics", err);
}

ct_status ct_loop_run_evals(ct_loop *loop, ct_error *err) {
    ct_loop *l = loop;
    // The model alone on the trainer's weights (or the eval model on a copy
    // of them), in eval mode (dropout off).
    const ct_net *net = ct_trainer_net(l->trainer);
    if (l->eval_model && l->n_evaluators) {
        copy_to_eval_net(l);
        net = &l->eval_net;
    }
    double main_values[CT_EVAL_MAX_METRICS], values[CT_EVAL_MAX_METRICS];
    // An eval's forward may change the state (LSHSelfAttention's hash
    // counter); Trax drops that, and so does ctrax: the state goes back as
    // it was, so neither checkpoints nor the training after an eval depend
    // on when evals ran, and `ctrax eval` of a checkpoint repeats its evals.
    if (l->state_saved) memcpy(l->state_saved, net->state, net->n_state * sizeof(float));
    ct_status st = CT_OK;
    for (int e = 0; e < l->n_evaluators && st == CT_OK; e++)
        st = run_one_eval(l, e, net, e == 0 ? main_values : values, err);
    if (l->state_saved) memcpy(net->state, l->state_saved, net->n_state * sizeof(float));
    CT_TRY(st);
    CT_TRY(chief_agrees(l, l->summary ? ct_summary_flush(l->summary, err) : CT_OK, "to write the metrics", err));
    if (l->n_evaluators) CT_TRY(save_bests(l, main_values, err));
    return CT_OK;
}

// ---- new / free ----------------------------------------------------------------------------

// Tasks with loss layers of their own: one layer over the distinct losses
// that runs the current task's (hp: which one), so one trainer holds the
// model once and serves every task. Its sublayers all take the model's
// outputs and the batch's other tensors and leave one scalar.
typedef struct task_losses_hp {
    int active;
} task_losses_hp;

static ct_status task_losses_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                                  ct_error *err) {
    for (int i = 0; i < l->n_sub; i++) {
        ct_tensor o[CT_LAYER_MAX_IO];
        CT_TRY(ct_layer_init(l->sub[i], i, ic, in, o, ct_key_split(key, (uint32_t)i), err));
        if (i == 0) out[0] = o[0];
        else if (o[0].ndim != out[0].ndim || o[0].dtype != out[0].dtype)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "loss %s does not give what loss %s gives (one scalar)",
                                 l->sub[i]->name, l->sub[0]->name);
    }
    return CT_OK;
}

static ct_status task_losses_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                     ct_error *err) {
    int a = ((const task_losses_hp *)l->hp)->active;
    return ct_layer_forward(l->sub[a], c, in, out, ct_key_split(key, (uint32_t)a), err);
}

static ct_status task_losses_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                      ct_key key, ct_error *err) {
    int a = ((const task_losses_hp *)l->hp)->active;
    return ct_layer_backward(l->sub[a], c, grad_out, grad_in, ct_key_split(key, (uint32_t)a), err);
}

static const ct_layer_vtable task_losses_vt = {
    .type = "TaskLosses", .init = task_losses_init, .forward = task_losses_forward, .backward = task_losses_backward};

// The index of task t's loss among the distinct losses (task_losses' sublayers).
static int loss_index(const ct_loop *l, int t) {
    int k = 0;
    for (int i = 0; i < t; i++) {
        bool first = true;
        for (int j = 0; j < i; j++)
            if (l->tasks[j].loss == l->tasks[i].loss) first = false;
        if (first && l->tasks[i].loss == l->tasks[t].loss) return k;
        k += first;
    }
    return k;
}

// Builds task_losses when the tasks do not all share task 0's loss.
static void make_task_losses(ct_loop *l) {
    ct_layer *subs[CT_LOOP_MAX_TASKS];
    int n = 0;
    for (int i = 0; i < l->n_tasks; i++)
        if (loss_index(l, i) == n) subs[n++] = ct_layer_ref(l->tasks[i].loss);
    if (n == 1) {
        ct_layer_free(subs[0]);
        return;
    }
    task_losses_hp *hp = ct_calloc(1, sizeof *hp);
    l->task_losses = ct_layer_new(&task_losses_vt, "TaskLosses", subs[0]->n_in, 1, hp, subs, n);
}

// What a metric is recorded as ("metrics/<name>", or "metrics/<prefix>/<name>"
// for an additional eval task) must fit a history entry: cut short there, it
// would be another name than the summaries' (ct_loop_last_value would not
// find it) and two names could become one.
static ct_status check_metric_tag(const char *prefix, const char *name, const char *what, ct_error *err) {
    // A name goes into metrics.jsonl (JSON) and TensorBoard (a proto3
    // string), both UTF-8 only: refused here, before a file is written.
    CT_TRY(ct_utf8_check_name(name, what, "loop", err));
    if (prefix) CT_TRY(ct_utf8_check_name(prefix, "an additional eval task's export_prefix", "loop", err));
    char tag[256];
    size_t cap = sizeof ((ct_history_entry *)0)->metric;
    int n = prefix ? snprintf(tag, sizeof tag, "metrics/%s/%s", prefix, name)
                   : snprintf(tag, sizeof tag, "metrics/%s", name);
    if (n < 0 || (size_t)n >= cap)
        return ct_error_set(err, CT_ERR_ARG, "loop: %s is recorded as %.200s, %d characters (at most %zu)", what, tag,
                            n, cap - 1);
    return CT_OK;
}

// ct_loop_new owns the tasks' optimizers on every path, failures included.
static ct_status refuse_tasks(const ct_train_task *tasks, int n_tasks, ct_error *err) {
    for (int i = 0; tasks && i < n_tasks && i < CT_LOOP_MAX_TASKS; i++) ct_optimizer_free(tasks[i].optimizer);
    return err ? err->code : CT_ERR_ARG;
}

// The tasks and options, before anything is built.
static ct_status check_tasks(const ct_train_task *tasks, int n_tasks, const ct_loop_options *o, ct_error *err) {
    if (n_tasks < 1 || n_tasks > CT_LOOP_MAX_TASKS)
        return ct_error_set(err, CT_ERR_ARG, "loop: %d train tasks (1 to %d)", n_tasks, CT_LOOP_MAX_TASKS);
    for (int i = 0; i < n_tasks; i++) {
        if (!tasks[i].stream || !tasks[i].loss || (i == 0 && !tasks[i].optimizer))
            return ct_error_set(err, CT_ERR_ARG, "loop: train task %d needs a stream, a loss%s", i,
                                i == 0 ? " and an optimizer" : "");
        if (tasks[i].loss->n_in != tasks[0].loss->n_in || tasks[i].loss->n_out != 1)
            return ct_error_set(err, CT_ERR_ARG,
                                "loop: train task %d's loss %s takes %d inputs and gives %d; task 0's %s takes %d and "
                                "gives 1 (a task's loss takes the model's outputs and its batch's other tensors)",
                                i, tasks[i].loss->name, tasks[i].loss->n_in, tasks[i].loss->n_out, tasks[0].loss->name,
                                tasks[0].loss->n_in);
        if (i > 0 && tasks[i].optimizer && o && o->trainer.memory_efficient)
            return ct_error_set(err, CT_ERR_ARG,
                                "loop: train task %d has an optimizer of its own, which the memory-efficient trainer "
                                "cannot swap in (it lays its slots out once): give it none to share task 0's",
                                i);
        CT_TRY(check_metric_tag(NULL, tasks[i].loss_name ? tasks[i].loss_name : tasks[i].loss->name,
                                "a train task's loss", err));
        if (!tasks[i].lr_schedule && !(tasks[i].learning_rate > 0))
            return ct_error_set(err, CT_ERR_ARG,
                                "loop: train task %d has no lr_schedule and its learning_rate is %g (must be > 0)", i,
                                (double)tasks[i].learning_rate);
    }
    if (!o) return CT_OK;
    if (o->n_additional_eval_tasks < 0 || o->n_additional_eval_tasks > CT_LOOP_MAX_EVAL_TASKS ||
        (o->n_additional_eval_tasks > 0 && !o->additional_eval_tasks))
        return ct_error_set(err, CT_ERR_ARG, "loop: %d additional eval tasks (0 to %d, with their array)",
                            o->n_additional_eval_tasks, CT_LOOP_MAX_EVAL_TASKS);
    const struct {
        const char *what;
        const int64_t *steps;
        int n;
    } lists[3] = {{"checkpoints_at", o->checkpoints_at, o->n_checkpoints_at},
                  {"eval_at_steps", o->eval_at_steps, o->n_eval_at_steps},
                  {"permanent_checkpoints_at", o->permanent_checkpoints_at, o->n_permanent_checkpoints_at}};
    for (int k = 0; k < 3; k++) {
        if (lists[k].n < 0 || lists[k].n > CT_LOOP_MAX_STEP_LIST || (lists[k].n > 0 && !lists[k].steps))
            return ct_error_set(err, CT_ERR_ARG, "loop: %s has %d steps (0 to %d)", lists[k].what, lists[k].n,
                                CT_LOOP_MAX_STEP_LIST);
        for (int i = 0; i < lists[k].n; i++) {
            if (lists[k].steps[i] < 1)
                return ct_error_set(err, CT_ERR_ARG, "loop: %s[%d] is step %lld; steps start at 1", lists[k].what, i,
                                    (long long)lists[k].steps[i]);
            // A step listed twice is harmless to the cadence but is most
            // likely a typo for another step: say so rather than skip it.
            for (int j = 0; j < i; j++)
                if (lists[k].steps[j] == lists[k].steps[i])
                    return ct_error_set(err, CT_ERR_ARG, "loop: %s lists step %lld twice ([%d] and [%d])",
                                        lists[k].what, (long long)lists[k].steps[i], j, i);
        }
    }
    return CT_OK;
}

static void copy_list(step_list *sl, const int64_t *steps, int n) {
    sl->on = steps != NULL;
    sl->n = n;
    sl->steps = ct_malloc((size_t)(n + 1) * sizeof *sl->steps);
    if (n) memcpy(sl->steps, steps, (size_t)n * sizeof *steps);
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
    ct_layer *loss = l->task_losses ? l->task_losses : l->tasks[0].loss;
    CT_TRY(ct_trainer_new(&l->trainer, l->model, loss, sigs, first.n, opt, ct_key_split(l->key, 0), l->dev,
                          &l->opts.trainer, err));
    return ct_stream_set_cursor(l->tasks[0].stream, start, err);
}

// The slots of the tasks with optimizers of their own, laid out as the
// trainer's (ct_trainer_param_slots: the same weights, frozen ones none), on
// its slab device and in its memory plan.
static ct_status make_task_slots(ct_loop *l, ct_error *err) {
    for (int t = 1; t < l->n_tasks; t++) {
        ct_trainer_opt_state *o = &l->task_opts[t];
        if (!o->opt) continue;
        // Takes the optimizer on every path: a failure leaves *o zeroed.
        if (ct_trainer_opt_state_new(l->trainer, o->opt, o, err) != CT_OK)
            return ct_error_prefix(err, "loop: train task %d", t);
    }
    return CT_OK;
}

// The eval model's net: its weights and state must be the model's, in slab
// order, shape for shape (copy_to_eval_net copies the ranges whole).
static ct_status make_eval_net(ct_loop *l, ct_error *err) {
    const ct_net *net = ct_trainer_net(l->trainer);
    if (!l->eval_model && l->n_evaluators && net->n_state)
        l->state_saved = ct_malloc(net->n_state * sizeof(float));  // the model's state: bookkeeping (memory.h)
    if (!l->eval_model || !l->n_evaluators) return CT_OK;
    CT_TRY(ct_evaluator_model_net(l->evaluators[0], &l->eval_net, ct_key_split(l->key, 2), err));
    const ct_net *src = ct_trainer_net(l->trainer), *dst = &l->eval_net;
    const ct_layer *m = l->model;
    int first = 0, n = 0, first_s = 0, n_s = 0;
    while (first < src->n_params && src->params[first]->offset < m->w_begin) first++;
    while (first + n < src->n_params && src->params[first + n]->offset < m->w_end) n++;
    while (first_s < src->n_state_params && src->state_params[first_s]->offset < m->s_begin) first_s++;
    while (first_s + n_s < src->n_state_params && src->state_params[first_s + n_s]->offset < m->s_end) n_s++;
    bool same = n == dst->n_params && n_s == dst->n_state_params && dst->n_weights == m->w_end - m->w_begin &&
                dst->n_state == m->s_end - m->s_begin;
    for (int i = 0; same && i < n; i++)
        same = ct_tensor_same_sig(&src->params[first + i]->sig, &dst->params[i]->sig) &&
               dst->params[i]->offset == src->params[first + i]->offset - m->w_begin;
    for (int i = 0; same && i < n_s; i++)
        same = ct_tensor_same_sig(&src->state_params[first_s + i]->sig, &dst->state_params[i]->sig) &&
               dst->state_params[i]->offset == src->state_params[first_s + i]->offset - m->s_begin;
    if (!same)
        return ct_error_set(err, CT_ERR_ARG,
                            "loop: the eval model %s has %d weights (%zu floats) and %d state tensors, not the model "
                            "%s's %d weights (%zu floats) and %d state tensors shape for shape: build it as the model "
                            "(e.g. the same model without dropout), with weightless layers around it",
                            l->eval_model->name, dst->n_params, dst->n_weights, dst->n_state_params, m->name, n,
                            m->w_end - m->w_begin, n_s);
    return CT_OK;
}

// The summaries and config.gin of the chief's output directory.
static ct_status open_output(ct_loop *l, ct_error *err) {
    if (!l->opts.output_dir || !is_chief(l)) return CT_OK;
    CT_TRY(ct_summary_open(&l->summary, l->opts.output_dir, l->step, err));
    if (!l->opts.config_text) return CT_OK;
    char path[CT_FS_PATH_CAP];
    if ((size_t)snprintf(path, sizeof path, "%s/config.gin", l->opts.output_dir) >= sizeof path)
        return ct_error_set(err, CT_ERR_ARG, "loop: output_dir '%.60s...' is too long for its config.gin",
                            l->opts.output_dir);
    return ct_fs_write_atomic(path, l->opts.config_text, strlen(l->opts.config_text), err);
}

// The names evaluator e's metrics are recorded as fit (check_metric_tag).
static ct_status check_metric_tags(const ct_loop *l, int e, ct_error *err) {
    const ct_evaluator *ev = l->evaluators[e];
    for (int m = 0; m < ct_evaluator_n_metrics(ev); m++)
        CT_TRY(check_metric_tag(e ? l->eval_prefix[e] : NULL, ct_evaluator_metric_name(ev, m), "an eval metric", err));
    return CT_OK;
}

// The evaluators: the main eval task, then the additional ones, each
// running the eval model when there is one.
static ct_status make_evaluators(ct_loop *l, const ct_eval_task *eval, ct_error *err) {
    ct_layer *runs = l->eval_model ? l->eval_model : l->model;
    if (!eval) {
        if (l->opts.n_additional_eval_tasks > 0)
            return ct_error_set(err, CT_ERR_ARG, "loop: %d additional eval tasks but no main eval task",
                                l->opts.n_additional_eval_tasks);
        return CT_OK;
    }
    CT_TRY(ct_evaluator_new(&l->evaluators[0], runs, eval, l->comm, l->dev, err));
    l->n_evaluators = 1;
    CT_TRY(check_metric_tags(l, 0, err));
    for (int i = 0; i < l->opts.n_additional_eval_tasks; i++) {
        const char *prefix = l->opts.eval_export_prefixes ? l->opts.eval_export_prefixes[i] : NULL;
        if (prefix && (!prefix[0] || strlen(prefix) >= sizeof l->eval_prefix[0]))
            return ct_error_set(err, CT_ERR_ARG, "loop: additional eval task %d's export_prefix '%.80s' is %zu "
                                "characters (1 to %zu)", i + 1, prefix, strlen(prefix), sizeof l->eval_prefix[0] - 1);
        if (prefix) snprintf(l->eval_prefix[i + 1], sizeof l->eval_prefix[0], "%s", prefix);
        else snprintf(l->eval_prefix[i + 1], sizeof l->eval_prefix[0], "%d", i + 1);
        // Two tasks under one prefix would record their metrics under the
        // same names, one task's values then read as the other's.
        for (int j = 1; j <= i; j++)
            if (!strcmp(l->eval_prefix[j], l->eval_prefix[i + 1]))
                return ct_error_set(err, CT_ERR_ARG,
                                    "loop: additional eval tasks %d and %d both record as metrics/%s/...: give them "
                                    "export_prefixes of their own", j, i + 1, l->eval_prefix[j]);
        CT_TRY(ct_evaluator_new(&l->evaluators[i + 1], runs, &l->opts.additional_eval_tasks[i], l->comm, l->dev, err));
        l->n_evaluators++;
        CT_TRY(check_metric_tags(l, i + 1, err));
    }
    return CT_OK;
}

// Trax's _rjust_len: the longest name a log line shows, the tasks' losses
// and the eval metrics (an additional task's as "<prefix>/<name>"), so the
// lines' values line up.
static void set_name_width(ct_loop *l) {
    int w = 0;
    for (int i = 0; i < l->n_tasks; i++) {
        const char *name = l->tasks[i].loss_name ? l->tasks[i].loss_name : l->tasks[i].loss->name;
        if ((int)strlen(name) > w) w = (int)strlen(name);
    }
    for (int e = 0; e < l->n_evaluators; e++)
        for (int m = 0; m < ct_evaluator_n_metrics(l->evaluators[e]); m++) {
            int n = (int)strlen(ct_evaluator_metric_name(l->evaluators[e], m));
            if (e > 0) n += (int)strlen(l->eval_prefix[e]) + 1;
            if (n > w) w = n;
        }
    l->name_width = w;
}

// checkpoint_low_metric / checkpoint_high_metric name a metric of the main
// eval task: another name would silently keep no best checkpoint.
static ct_status check_best_metrics(const ct_loop *l, ct_error *err) {
    const char *asked[2] = {l->opts.checkpoint_low_metric, l->opts.checkpoint_high_metric};
    const char *opt[2] = {"checkpoint_low_metric", "checkpoint_high_metric"};
    const ct_evaluator *e = l->n_evaluators ? l->evaluators[0] : NULL;
    for (int k = 0; k < 2; k++) {
        if (!asked[k]) continue;
        bool found = false;
        char known[256] = "";
        size_t n = 0;
        for (int m = 0; e && m < ct_evaluator_n_metrics(e) && !found; m++) {
            found = !strcmp(ct_evaluator_metric_name(e, m), asked[k]);
            n += (size_t)snprintf(known + n, sizeof known - n, "%s%s", m ? ", " : "", ct_evaluator_metric_name(e, m));
            if (n >= sizeof known) n = sizeof known - 1;
        }
        if (!found)
            return ct_error_set(err, CT_ERR_ARG, "loop: %s '%.80s' is not a metric of the eval task (%s)", opt[k],
                                asked[k], e ? known : "there is none");
    }
    return CT_OK;
}

ct_status ct_loop_new(ct_loop **out, ct_layer *model, const ct_train_task *tasks, int n_tasks,
                      const ct_eval_task *eval, const ct_loop_options *opts, ct_error *err) {
    *out = NULL;
    ct_error arg_err;
    if (!err) err = &arg_err;
    if (check_tasks(tasks, n_tasks, opts, err) != CT_OK) return refuse_tasks(tasks, n_tasks, err);
    ct_loop *l = ct_calloc(1, sizeof *l);
    l->opts = opts ? *opts : ct_loop_default_options();
    if (l->opts.history_max == 0) l->opts.history_max = CT_LOOP_HISTORY_MAX_DEFAULT;
    copy_list(&l->ckpt_list, l->opts.checkpoints_at, l->opts.n_checkpoints_at);
    copy_list(&l->eval_list, l->opts.eval_at_steps, l->opts.n_eval_at_steps);
    copy_list(&l->perm_list, l->opts.permanent_checkpoints_at, l->opts.n_permanent_checkpoints_at);
    l->own_dev = ct_device_cpu();
    l->dev = l->opts.device ? l->opts.device : &l->own_dev;
    l->model = ct_layer_ref(model);
    l->eval_model = l->opts.eval_model ? ct_layer_ref(l->opts.eval_model) : NULL;
    l->n_tasks = n_tasks;
    for (int i = 0; i < n_tasks; i++) {
        l->tasks[i] = tasks[i];
        l->tasks[i].loss = ct_layer_ref(tasks[i].loss);
        l->tasks[i].optimizer = NULL;
        // Task 0's goes to the trainer; a later task's, if any, is its own.
        if (i > 0) l->task_opts[i].opt = tasks[i].optimizer;
    }
    make_task_losses(l);
    l->comm = l->opts.trainer.comm;
    l->rank = l->comm ? ct_comm_rank(l->comm) : 0;
    l->n_proc = l->comm ? ct_comm_size(l->comm) : 1;
    l->key = ct_key_from_seed(l->opts.seed);
    l->last_checkpoint_step = -1;
    ct_status st = make_evaluators(l, eval, err);
    if (st == CT_OK) set_name_width(l);
    if (st == CT_OK) st = check_best_metrics(l, err);
    if (st != CT_OK) ct_optimizer_free(tasks[0].optimizer);
    else st = make_trainer(l, tasks[0].optimizer, err);  // the trainer owns it from here
    if (st == CT_OK) st = make_task_slots(l, err);
    if (st == CT_OK) st = make_eval_net(l, err);
    if (st == CT_OK && l->opts.output_dir && l->opts.restore) st = restore_latest(l, err);
    if (st == CT_OK && l->opts.init_checkpoint && !l->restored_from[0]) st = load_init_checkpoint(l, err);
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
    for (int e = 0; e < l->n_evaluators; e++) ct_evaluator_free(l->evaluators[e]);
    ct_net_free(&l->eval_net);
    ct_free(l->state_saved);
    ct_layer_free(l->eval_model);
    // The tasks' slots are on the trainer's device: before the trainer
    // (with no trainer, a task holds only its optimizer).
    for (int i = 0; i < l->n_tasks; i++) ct_trainer_opt_state_free(l->trainer, &l->task_opts[i]);
    ct_trainer_free(l->trainer);
    for (int i = 0; i < l->n_tasks; i++) ct_layer_free(l->tasks[i].loss);
    ct_layer_free(l->task_losses);
    ct_layer_free(l->model);
    ct_free(l->ckpt_list.steps);
    ct_free(l->eval_list.steps);
    ct_free(l->perm_list.steps);
    ct_free(l->history);
    ct_free(l->history_metric);
    ct_free(l->metrics);
    ct_index_free(&l->metric_index);
    ct_free(l);
}

// ---- run ---------------------------------------------------------------------------------------

// Logs the training metrics averaged since the last log (Trax's
// _log_training_progress): metrics/<loss> over the logged step's task's
// steps alone, the optimizer stats (training/...) over every step.
static ct_status log_training(ct_loop *l, ct_error *err) {
    if (l->loss_count == 0 && l->step == l->log_step) return CT_OK;
    int t;
    CT_TRY(task_at(l, l->step, &t, err));
    // Every step since the last log may have been skipped (non-finite): NaN.
    double now = now_s(), count = l->loss_count ? (double)l->loss_count : NAN;
    double task_count = l->task_loss_count[t] ? (double)l->task_loss_count[t] : NAN;
    double task_loss = l->task_loss_sum[t] / task_count, loss = l->loss_sum / count;
    double grads_l2 = l->grads_l2_sum / count, weights_l2 = l->weights_l2_sum / count;
    double steps_per_s = (double)(l->step - l->log_step) / (now - l->log_time > 1e-9 ? now - l->log_time : 1e-9);
    const ct_train_task *task = &l->tasks[t];
    const char *loss_name = task->loss_name ? task->loss_name : task->loss->name;
    char tag[96];
    snprintf(tag, sizeof tag, "metrics/%s", loss_name);
    CT_TRY(record(l, "train", tag, task_loss, err));
    CT_TRY(record(l, "train", "training/learning_rate", l->last_lr, err));
    CT_TRY(record(l, "train", "training/steps per second", steps_per_s, err));
    // Trax averages its optimizer metrics (the loss among them) since the last log.
    CT_TRY(record(l, "train", "training/gradients_l2", grads_l2, err));
    CT_TRY(record(l, "train", "training/weights_l2", weights_l2, err));
    CT_TRY(record(l, "train", "training/loss", loss, err));
    if (l->opts.skip_nonfinite) CT_TRY(record(l, "train", "training/skipped_steps", (double)l->skipped_steps, err));
    if (l->opts.log && is_chief(l)) {
        ct_progress_clear(l->progress);
        fprintf(l->opts.log, "Step %6lld: Ran %lld train steps in %.2f secs\n", (long long)l->step,
                (long long)(l->step - l->log_step), now - l->log_time);
    }
    log_line(l, "train", loss_name, task_loss);
    l->loss_sum = l->grads_l2_sum = l->weights_l2_sum = 0;
    l->loss_count = 0;
    memset(l->task_loss_sum, 0, sizeof l->task_loss_sum);
    memset(l->task_loss_count, 0, sizeof l->task_loss_count);
    l->log_time = now;
    l->log_step = l->step;
    return CT_OK;
}

static ct_status one_step(ct_loop *l, ct_error *err) {
    l->step++;
    for (int i = 0; i < l->opts.n_callbacks; i++)
        if (l->opts.callbacks[i].on_step_begin) l->opts.callbacks[i].on_step_begin(l->step, l->opts.callbacks[i].user);
    int t;
    CT_TRY(task_at(l, l->step, &t, err));
    ct_train_task *task = &l->tasks[t];
    ct_batch global;
    ct_tensor batch[CT_BATCH_MAX_TENSORS];
    CT_TRY(next_batch(l, task->stream, "train", &global, err));
    CT_TRY(local_rows(l, &global, batch, err));
    // Every step's learning rate comes from the schedule (Trax: it overrides
    // opt_params.learning_rate).
    float lr = task->lr_schedule ? ct_schedule_value(task->lr_schedule, l->step) : task->learning_rate;
    ct_key step_key = ct_train_step_key(l->key, l->step);
    ct_error step_err;
    if (l->task_losses) ((task_losses_hp *)l->task_losses->hp)->active = loss_index(l, t);
    swap_task_optimizer(l, t);
    ct_status st = ct_trainer_one_step(l->trainer, batch, step_key, l->step, lr, &l->last_stats, &step_err);
    swap_task_optimizer(l, t);
    if (st != CT_OK && err) *err = step_err;
    l->last_lr = lr;
    double shown_loss = l->last_stats.loss;  // this step's, for the progress line
    if (st == CT_ERR_NONFINITE && l->opts.skip_nonfinite) {
        // A failed step leaves last_stats as the step before left them.
        shown_loss = NAN;
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
        l->grads_l2_sum += l->last_stats.gradients_l2;
        l->weights_l2_sum += l->last_stats.weights_l2;
        l->loss_count++;
        l->task_loss_sum[t] += l->last_stats.loss;
        l->task_loss_count[t]++;
    }
    if (l->progress)
        ct_progress_update(l->progress, l->step, shown_loss, l->opts.tokens_per_batch);
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
    if (l->opts.progress && is_chief(l) && !l->progress)
        l->progress = ct_progress_new(l->opts.progress, n_steps, CT_PROGRESS_LOG_INTERVAL_S);
    while (l->step < n_steps) {
        CT_TRY(one_step(l, err));
        bool evaluate = eval_at(l, l->step), save = checkpoint_at(l, l->step) || permanent_at(l, l->step);
        // The last step logs too, before its checkpoint: what a checkpoint
        // holds of the metrics since the last log is then exactly what a
        // resumed run must go on averaging.
        bool logged = evaluate || l->step == n_steps;
        if (logged) CT_TRY(chief_agrees(l, log_training(l, err), "to record the training metrics", err));
        if (evaluate) CT_TRY(ct_loop_run_evals(l, err));
        if (stop_requested(l)) {
            l->stopped = true;
            save = true;
        }
        if (save) CT_TRY(ct_loop_save_checkpoint(l, err));
        // The next log's steps per second count training steps alone: the
        // clock restarts after this step's evals and checkpoint (Trax
        // restarts it after its evals).
        if (logged) l->log_time = now_s();
        if (l->stopped) {
            if (is_chief(l)) {
                // On a terminal the progress line is up: erased first, or the
                // line would be written after it, on the same line.
                ct_progress_clear(l->progress);
                ct_log(CT_LOG_INFO, "stopped at step %lld on request; checkpoint written", (long long)l->step);
            }
            break;
        }
    }
    // Trax saves nothing at the end of run; ctrax does, so no step is lost.
    if (l->last_checkpoint_step != l->step) CT_TRY(ct_loop_save_checkpoint(l, err));
    CT_TRY(chief_agrees(l, l->summary ? ct_summary_flush(l->summary, err) : CT_OK, "to write the metrics", err));
    if (l->progress) ct_progress_finish(l->progress);
    return CT_OK;
}

int64_t ct_loop_step(const ct_loop *loop) { return loop->step; }
bool ct_loop_stopped(const ct_loop *loop) { return loop->stopped; }
const char *ct_loop_restored_from(const ct_loop *loop) { return loop->restored_from; }
ct_trainer *ct_loop_trainer(const ct_loop *loop) { return loop->trainer; }
const ct_net *ct_loop_net(const ct_loop *loop) { return ct_trainer_net(loop->trainer); }
