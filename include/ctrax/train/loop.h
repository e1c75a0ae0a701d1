// The training Loop: tasks, evals, checkpoints, summaries, and exact resume.
//
// Trax's Loop semantics (../shared/SEMANTICS.md), with its flaws fixed:
//   - Steps are 1-based: the first update is step 1. Schedules, checkpoint
//     names and the checkpoint_at / eval_at / permanent_checkpoint_at
//     predicates see that number. By default a checkpoint is written and an
//     eval run at step 1 and every n_steps_per_checkpoint (100) steps.
//   - Permanent checkpoints (Trax's permanent_checkpoint_at): with
//     n_steps_per_permanent_checkpoint = P > 0, at step 1 and every P steps
//     (Trax's _at_step_1_and_every_nth_step(P)); permanent_checkpoints_at (a
//     list of steps) or the permanent_checkpoint_at predicate replace that.
//     A permanent checkpoint is the directory model_<step> written with
//     "keep": true in its manifest.json (ct_checkpoint_info.keep; `ctrax
//     info` shows it): ct_checkpoint_prune never removes it and it does not
//     count among keep_last. Trax writes a copy model_<step>.pkl.gz next to
//     its one regular model.pkl.gz; ctrax's regular checkpoints are already
//     named by step, so the mark is the manifest's, not the name.
//     lowest_<metric> / highest_<metric> are kept the same way.
//   - checkpoints_at / eval_at_steps (lists of steps, Trax's train(...,
//     checkpoints_at=...)) replace the default cadences of regular
//     checkpoints and of evals (and training logs).
//   - Several train tasks: step s trains task which_task(s); by default
//     s % n_tasks, Trax's `lambda n: n % len(tasks)` called with Trax's
//     step after its increment, i.e. the same 1-based step: with 2 tasks,
//     step 1 trains task 1 and step 2 task 0. Each task may have its own
//     loss layer and its own optimizer (its own slots, saved and restored
//     with the rest); all share the model's weights.
//   - Several eval tasks: opts.additional_eval_tasks after the main one
//     (Trax's additional_eval_tasks), each with its own stream, metrics and
//     export_prefix; opts.eval_model runs the evals instead of the model
//     (Trax's eval_model: a separate layer whose weights, in slab order, are
//     the model's, shape for shape; they are copied from the model before
//     each eval).
//   - A checkpoint is also written when run ends (Trax loses up to 99 steps),
//     and when a stop is requested (SIGINT/SIGTERM through opts.stop).
//   - A checkpoint holds everything needed to continue bit for bit: weights,
//     state, optimizer slots and hyperparameters (every task's), the step,
//     the seed and the loop's key, every task's data cursor, the history
//     (its newest rows: ct_loop_options.history_max),
//     the training metrics since the last log and the operative config. A
//     run pointed at a directory with a checkpoint resumes from the newest
//     complete one, and the steps it then takes are the ones the
//     uninterrupted run would have taken (same weights, bit for bit). The
//     optimizers keep their own hyperparameters, as Trax's (a resume may
//     change them: each change is logged); the saved ones are checked. A run
//     stopped (opts.stop) or killed and resumed logs the same metrics too
//     (metrics.jsonl and TensorBoard, apart from steps per second: the sums
//     since the last log are in the checkpoint); a run that reached its
//     n_steps logged the training metrics there, so a longer run from its
//     checkpoint averages from that step on.
//   - opts.init_checkpoint (Trax's train(init_checkpoint=...)): a run that
//     starts fresh (nothing to resume in output_dir) first loads the model's
//     weights and state from another run's checkpoint, by name, every one
//     with its shape (a missing or reshaped one is an error naming it); the
//     optimizer slots are fresh and the step is 0.
//   - A step whose loss or gradients are NaN or infinite updates nothing; the
//     run stops with CT_ERR_NONFINITE naming the step and the first layer
//     that went non-finite, or, with opts.skip_nonfinite, skips the step and
//     counts it (training/skipped_steps). A checkpoint is written only when
//     every weight and slot is finite, so the checkpoints on disk (and the
//     one a resume picks) are always good ones. Trax checks nothing here.
//   - The training metrics (metrics/<loss>, training/loss,
//     training/gradients_l2, training/weights_l2) are logged at every eval
//     step and at the last step of run, each averaged over the (finite)
//     steps since the last log, as Trax's _log_training_progress;
//     training/learning_rate is the logged step's. With several train tasks,
//     metrics/<loss> is the logged step's task's loss, averaged over that
//     task's steps since the last log alone; the training/ metrics average
//     every step. (Trax starts its loss average over whenever the task
//     changes, so with tasks alternating it logs one step's loss.)
//   - Evals are averaged over all batches, devices and processes, weighted by
//     what each metric averages over (tokens, for a weighted loss); Trax
//     averages per batch and per host.
//   - No task drops its first batch.
//
// Files in the output directory (only the chief, process 0, writes):
//   model_<step>/            checkpoints (the newest keep_last are kept, and
//   lowest_<metric>/         the permanent and best ones), each with
//   highest_<metric>/          weights.safetensors  weights and state by layer path
//   checkpoint                 slots.safetensors    optimizer slots, one flat
//                                                   tensor per weight
//                              slots_task<i>.safetensors  the same for train task i,
//                                                   when it has an optimizer of its own
//                              state.json           step, seed (and seed_text, exact),
//                                                   keys, cursors, history, ...
//   metrics.jsonl, train/ and eval/ TensorBoard event files
//   config.gin               the operative config, when the caller gives one
//
// Every step the step key is ct_key_fold_in(ct_key_split(loop key, 1),
// step) (past 2^32 steps with the step's high 32 bits folded in after), so
// a resumed run draws the same dropout masks as the uninterrupted one. Evals
// run with ct_loop_eval_key.
#ifndef CTRAX_TRAIN_LOOP_H
#define CTRAX_TRAIN_LOOP_H

#include <signal.h>
#include <stdio.h>

#include "ctrax/core/error.h"
#include "ctrax/data/stream.h"
#include "ctrax/layers/layer.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/optim/schedules.h"
#include "ctrax/train/checkpoint.h"
#include "ctrax/train/evaluator.h"
#include "ctrax/train/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

// A training task: where batches come from, the loss, the optimizer and the
// learning-rate schedule. Streams and schedules are not owned (they must
// outlive the loop); the loop takes a reference to the loss and ownership of
// the optimizer. Task 0 needs an optimizer; a later task with none shares
// task 0's optimizer and slots, one with its own keeps its own slots (the
// standard trainer only: the memory-efficient one lays its slots out once).
// Tasks with losses of their own must give the model's outputs and their
// batches' other tensors (targets, weights) the same shapes as task 0's.
// Each batch of the stream is the global batch: every process takes its own
// rows of it (process p of P: rows [p B/P, (p+1) B/P)).
typedef struct ct_train_task {
    ct_stream *stream;
    ct_layer *loss;
    ct_optimizer *optimizer;
    const ct_schedule *lr_schedule;  // every step's learning rate; NULL: learning_rate
    const char *loss_name;           // history/summaries: "metrics/<loss_name>"; NULL: the loss layer's name
    float learning_rate;             // with no lr_schedule, every step's (must then be > 0)
} ct_train_task;

// The eval task (ct_eval_task) is the evaluator's: evaluator.h.

typedef bool (*ct_step_predicate)(int64_t step, void *user);

// Called around steps and checkpoints (Trax's callbacks, plus on_checkpoint).
typedef struct ct_loop_callback {
    void (*on_step_begin)(int64_t step, void *user);
    void (*on_step_end)(int64_t step, void *user);
    void (*on_checkpoint)(const char *name, int64_t step, void *user);
    void *user;
} ct_loop_callback;

#define CT_LOOP_MAX_TASKS 8
#define CT_LOOP_MAX_CALLBACKS 8

#define CT_LOOP_MAX_EVAL_TASKS 8
#define CT_LOOP_MAX_STEP_LIST 1024
// ct_loop_options.history_max's default: about 450 logs of a run that logs
// 9 values (6 training metrics and 3 eval metrics) each time.
#define CT_LOOP_HISTORY_MAX_DEFAULT 4096

typedef struct ct_loop_options {
    const char *output_dir;  // NULL: no checkpoints, no summaries
    int64_t n_steps_per_checkpoint;            // 100
    int64_t n_steps_per_permanent_checkpoint;  // 0: none; P > 0: step 1 and every P steps
    // Steps (1-based, in any order) of regular checkpoints, of evals and of
    // permanent checkpoints, instead of the cadences above (Trax's
    // checkpoints_at, permanent_checkpoints_at). n_* = 0 with a NULL list:
    // the cadence; n_* = 0 with a non-NULL list: never. Copied by
    // ct_loop_new; at most CT_LOOP_MAX_STEP_LIST steps each, each step from
    // 1 and listed once (else ct_loop_new fails naming the list).
    const int64_t *checkpoints_at;
    int n_checkpoints_at;
    const int64_t *eval_at_steps;
    int n_eval_at_steps;
    const int64_t *permanent_checkpoints_at;
    int n_permanent_checkpoints_at;
    // Override all of the above (NULL: the lists, else the cadences).
    ct_step_predicate checkpoint_at;
    ct_step_predicate eval_at;
    ct_step_predicate permanent_checkpoint_at;
    void *predicate_user;
    // Which train task step s uses (NULL: s % n_tasks, as Trax). A value
    // outside [0, n_tasks) fails the run naming the step.
    int (*which_task)(int64_t step, void *user);
    void *which_task_user;
    // More eval tasks after the main one (Trax's additional_eval_tasks), run
    // at every eval. Metric m of additional task i is recorded as
    // "metrics/<prefix>/<name>" with prefix its export_prefix (NULL: its
    // number, 1 for the first); two tasks with one prefix are refused. Not
    // copied: must outlive the loop. A resume with another number of them
    // starts their streams from the beginning (evals change no weight).
    const ct_eval_task *additional_eval_tasks;
    int n_additional_eval_tasks;
    const char *const *eval_export_prefixes;  // one per additional task, or NULL
    // The layer evals run (Trax's eval_model; NULL: the model): its own
    // weights and state, copied from the model's before each eval, so they
    // must be the model's in slab order, shape for shape (e.g. the same
    // model built without dropout, or Serial(that model, LogSoftmax)).
    ct_layer *eval_model;
    // After each eval, write lowest_<metric> / highest_<metric> when that
    // eval metric (of the main eval task) reaches a new best (ties count).
    // NULL: off.
    const char *checkpoint_low_metric;
    const char *checkpoint_high_metric;
    int keep_last;      // regular checkpoints kept: 2
    // The history the loop holds (ct_loop_history) and writes into every
    // checkpoint's state.json: the newest history_max rows, plus the newest
    // row of each (mode, metric) among the older ones, so that
    // ct_loop_last_value and `ctrax info` still find every metric. Once
    // the rows number 2 x history_max, and history_max + 2 x the metrics
    // they name, the older ones (but each metric's last) are dropped at
    // once: fewer rows than the larger of the two are held, and at least
    // max(history_max - metrics, metrics) + 1 records come between two
    // cuts, so a cut costs O(1) a record however many metrics a run logs
    // (with more than history_max / 2 it would cut at every one). Trax
    // keeps the whole history in memory and in each checkpoint: a run of
    // days (hundreds of thousands of logged values) would then hold and
    // rewrite megabytes with every checkpoint, its checkpoints growing
    // with the step. metrics.jsonl and the TensorBoard files keep every
    // value. A resumed run drops the same rows as the uninterrupted one, so
    // its history is the same. 0: CT_LOOP_HISTORY_MAX_DEFAULT; < 0: keep
    // every row (Trax).
    int history_max;
    bool restore;       // resume from output_dir's newest checkpoint: true
    // With restore: output_dir's newest checkpoint, when the caller has
    // already searched for it (ct_checkpoint_open_latest found this one; the
    // chief's, other processes ignore it). The loop resumes from it instead
    // of searching again, which would read and check every byte of it once
    // more. Borrowed: the caller closes it after ct_loop_new. NULL: the loop
    // searches.
    const ct_checkpoint *restore_checkpoint;
    uint64_t seed;      // the loop's key (init, dropout): 0; recorded in state.json
    // Trax's init_checkpoint: a checkpoint directory (<run>/model_100) or a
    // run's output directory (its newest checkpoint). A run with nothing to
    // resume loads all the model's weights and state from it by name, each
    // of the same dtype and shape (else an error naming init_checkpoint and
    // the tensor; a partial load is ct_loop_load_weights), with fresh
    // optimizer slots at step 0. NULL: none.
    const char *init_checkpoint;
    // The trainer: devices, comm, Adasum, clipping, frozen weights, and
    // trainer.memory_efficient for the memory-efficient (reversible) one:
    // weights and slots on the host, one layer at a time on the device. Its
    // checkpoints are the standard trainer's, so a run can switch trainers
    // across a restore.
    ct_trainer_options trainer;
    // A step whose loss or gradients are not finite (the trainer then updates
    // nothing and fails with CT_ERR_NONFINITE, naming the step and the first
    // layer that went non-finite): false stops the run with that error (the
    // checkpoints on disk are all finite); true skips the step and counts it
    // (training/skipped_steps in the metrics). Trax has no such check.
    bool skip_nonfinite;
    ct_device *device;  // counts the trainer's bytes; NULL: the loop's own CPU device
    // Set (by a signal handler) to stop after the current step with a
    // checkpoint; run then returns CT_OK with ct_loop_stopped true.
    volatile sig_atomic_t *stop;
    const char *config_text;  // the operative config, saved in checkpoints and config.gin
    FILE *log;                // Trax-style step lines ("Step    100: train loss | ..."); NULL: none
    FILE *progress;           // a live progress line on a terminal, else a line a minute; NULL: none
    int64_t tokens_per_batch; // for tokens/s on the progress line (0: not shown)
    ct_loop_callback callbacks[CT_LOOP_MAX_CALLBACKS];
    int n_callbacks;
} ct_loop_options;
ct_loop_options ct_loop_default_options(void);

typedef struct ct_loop ct_loop;

// Builds the trainer for model and task 0 (batch signatures from task 0's
// stream), then, if opts.restore and output_dir holds a checkpoint, loads
// the newest complete one (and logs which); otherwise starts at step 0.
// Takes references to model and the layers of the tasks, ownership of the
// optimizers (on every path: a failure frees them too).
ct_status ct_loop_new(ct_loop **out, ct_layer *model, const ct_train_task *tasks, int n_tasks,
                      const ct_eval_task *eval, const ct_loop_options *opts, ct_error *err);
void ct_loop_free(ct_loop *loop);

// Runs until the loop's step reaches n_steps, then writes a final
// checkpoint if the last step did not. n_steps is a total, as Trax's
// train(steps=...) means it (it runs steps - loop.step more); Trax's
// Loop.run(n) runs n more steps.
ct_status ct_loop_run(ct_loop *loop, int64_t n_steps, ct_error *err);
// Runs the eval task now and records its metrics for the current step.
ct_status ct_loop_run_evals(ct_loop *loop, ct_error *err);
// Writes a checkpoint of the current step now.
ct_status ct_loop_save_checkpoint(ct_loop *loop, ct_error *err);

int64_t ct_loop_step(const ct_loop *loop);
bool ct_loop_stopped(const ct_loop *loop);
// The checkpoint the loop resumed from ("" if it started fresh).
const char *ct_loop_restored_from(const ct_loop *loop);
// The trainer (either kind), and its net (weights, names).
ct_trainer *ct_loop_trainer(const ct_loop *loop);
const ct_net *ct_loop_net(const ct_loop *loop);

// History: (mode, metric, step, value), in the order recorded: the newest
// rows (ct_loop_options.history_max) and each metric's last one; every
// value is in metrics.jsonl.
typedef struct ct_history_entry {
    char mode[8];  // "train" or "eval"
    char metric[64];
    int64_t step;
    double value;
} ct_history_entry;
const ct_history_entry *ct_loop_history(const ct_loop *loop, int *n);
// The last value of (mode, metric), or NAN.
double ct_loop_last_value(const ct_loop *loop, const char *mode, const char *metric);

// Loads only the weights of another run's checkpoint (fine-tuning): every
// weight of this loop's model that has a tensor of the same name, dtype and
// shape there; the rest keep their values (a warning lists them). None
// matching is an error.
ct_status ct_loop_load_weights(ct_loop *loop, const char *checkpoint_dir, const char *name, ct_error *err);

// Trax's random_seed = None: a seed drawn from the system (getrandom, else
// /dev/urandom), in [0, 2^31) as Trax's random.randint(0, 2**31 - 1).
ct_status ct_loop_system_seed(uint64_t *seed, ct_error *err);
// The key eval task `task` (0: the main one, then the additional ones) runs
// with at step: ct_key_fold_in(K, task), K the step key rule applied to
// ct_key_split(loop_key, 3); ct_evaluator_run folds in each batch's index,
// so every eval batch has a key of its own (Trax's run_evals draws one per
// batch), the same again on resume. loop_key is ct_key_from_seed(seed).
// `ctrax eval` uses it too, so it prints what the run's eval printed.
ct_key ct_loop_eval_key(ct_key loop_key, int64_t step, int task);
// The seed recorded in the newest complete checkpoint of output_dir (what a
// run that drew its seed must use again when it resumes): *found false when
// output_dir holds no checkpoint.
// opened, when not NULL, gets the checkpoint it read (NULL when none was
// found or on error; the caller closes it), for a caller that resumes from
// it (ct_loop_options.restore_checkpoint) without opening it again.
ct_status ct_loop_checkpoint_seed(const char *output_dir, ct_checkpoint **opened, bool *found, uint64_t *seed,
                                  ct_error *err);

#ifdef __cplusplus
}
#endif
#endif
