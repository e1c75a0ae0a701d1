// Configs in gin syntax, and the registry of configurables.
//
// A config is a set of bindings read from gin files and command-line
// overrides:
//
//   # comments run to the end of the line
//   include 'base.gin'                    # beside this file, or (gin's way) from the working
//                                         # directory; two different files: an error
//   D_MODEL = 512                         # a macro
//   train.model = @trax.models.TransformerLM
//   TransformerLM.d_model = %D_MODEL
//   TransformerLM.dropout = 0.1
//   eval/TransformerLM.dropout = 0.0      # scoped: used by @eval/TransformerLM
//   MLP.layer_widths = [128, 64]          # lists [..], tuples (..), dicts {..}
//   train.checkpoint_highest = 'accuracy' # '..' or ".." strings
//   train.random_seed = None              # True, False, None
//
// Values: ints (decimal or 0x hex, optional sign, _ separators), floats (1.,
// .5, 1e-4, -2.5E+3), strings with \ escapes, True/False, None, @Name and
// @Name() references, %MACRO, lists, tuples and dicts, nested; inside
// brackets a value may run over several lines. `import a.b` lines (gin's
// Python imports) are accepted and ignored. A later binding of the same
// Name.param replaces an earlier one; an override (ct_config_set) is never
// replaced by a file binding, whatever the order of the calls.
//
// Names. Every configurable is registered (src/config/registry.c) under its
// ctrax name, which is Trax's short name (TransformerLM, Adam, multifactor,
// train). Trax's module-qualified names are accepted too: `trax.<module>.Name`
// and `<module>.Name` name the configurable Name when <module> is, or lies
// under, the module Trax defines it in (trax.models.TransformerLM,
// trax.models.transformer.TransformerLM, models.TransformerLM,
// trax.optimizers.Adam, trax.layers.CrossEntropyLoss, trax.lr.multifactor,
// trax.supervised.lr_schedules.multifactor). A name in the wrong module
// (trax.optimizers.TransformerLM) is an error that gives the right one. A few
// configurables also answer to an alias (CopyInputs is sequence_copy_inputs);
// the operative config writes the name.
//
// Checks. Binding an unknown configurable or parameter, referring to an
// unknown configurable, or binding a value of the wrong type or range is an
// error naming the file, line and column and, for names, the closest known
// one ("did you mean 'd_model'?"). Macros may be defined after their use, so
// values that go through a macro are checked by ct_config_validate (and by
// every query). Syntax errors say file:line:col and what was expected.
// Command-line overrides use the same parser with the source name "--set".
//
// Queries. The program asks for each parameter it uses, with the default it
// uses when the parameter is not bound; every query is recorded, and the
// operative config (every parameter queried, with the value the program got)
// can be written as gin text that parses back to the same values. Bindings
// no query used can be listed (ct_config_binding_at(...).used), so the
// program can warn about them.
//
// Scopes. A name queried as "eval/TransformerLM" sees the bindings of
// eval/TransformerLM.param first, then of TransformerLM.param (with deeper
// scopes "a/b/Name": a/b/Name, then a/Name, then Name). As in gin, what a
// scoped configurable calls runs in its scope: the attention types of
// eval/ReformerLM's attention_type = @LSHSelfAttention read
// eval/LSHSelfAttention.* first, s/batcher's @data_streams
// s/data_streams.*; a scoped reference (@t/LSHSelfAttention) keeps its own
// scope, which gin puts in place of the caller's.
#ifndef CTRAX_CONFIG_CONFIG_H
#define CTRAX_CONFIG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "ctrax/core/error.h"
#include "ctrax/data/stream.h"
#include "ctrax/layers/layer.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/optim/schedules.h"
#include "ctrax/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_config ct_config;

// ---- Values ----------------------------------------------------------------

typedef enum ct_config_kind {
    CT_CONFIG_NONE = 0,
    CT_CONFIG_BOOL,
    CT_CONFIG_INT,
    CT_CONFIG_FLOAT,
    CT_CONFIG_STRING,
    CT_CONFIG_REFERENCE,  // @Name or @Name(): s is the ctrax name ("scope/Name")
    CT_CONFIG_MACRO,      // %NAME as written; queries never return one
    CT_CONFIG_LIST,
    CT_CONFIG_TUPLE,
    CT_CONFIG_DICT,  // items: key0, value0, key1, value1, ... (n pairs)
} ct_config_kind;

// A parsed value, with where it was written. Values returned by queries are
// owned by the config and live as long as it does.
typedef struct ct_config_value ct_config_value;
struct ct_config_value {
    ct_config_kind kind;
    const char *file;  // the file, "--set", or "<default>" for a default
    int line, col;     // 1-based
    bool b;            // BOOL
    int64_t i;         // INT
    double f;          // FLOAT
    char *s;           // STRING text, REFERENCE name, MACRO name
    bool call;         // REFERENCE written as @Name()
    int n;             // LIST, TUPLE: items; DICT: pairs (2n items)
    ct_config_value *items;
};

// Name of a kind: "an int", "a string", ...
const char *ct_config_kind_name(ct_config_kind kind);

// Writes v as gin text (what parses back to v) into a new string; ct_free it.
char *ct_config_value_to_gin(const ct_config_value *v);

// ---- Building a config -------------------------------------------------------

ct_config *ct_config_new(void);
void ct_config_free(ct_config *cfg);

// Parses a gin file (and what it includes) and adds its bindings and macros.
// A missing file, a syntax error, an include cycle or a binding that fails the
// registry's checks is an error naming the file and line.
ct_status ct_config_parse_file(ct_config *cfg, const char *path, ct_error *err);
// Parses len bytes of gin text (NUL bytes are errors, no terminator needed);
// source names it in errors. Includes are relative to the working directory.
ct_status ct_config_parse_text(ct_config *cfg, const char *text, size_t len, const char *source,
                               ct_error *err);
// A command-line override, `Name.param=value` or `MACRO=value` (any gin
// statements, in fact), parsed with the source name "--set". Overrides win
// over file bindings whatever the order of the calls.
ct_status ct_config_set(ct_config *cfg, const char *text, ct_error *err);
// Resolves every binding's macros and checks its type and range: call once
// after the files and overrides, before the queries, to find every error
// before training starts. An undefined macro or a cycle of macros is an error
// naming the file and line of its use.
ct_status ct_config_validate(ct_config *cfg, ct_error *err);

// ---- Queries -----------------------------------------------------------------
//
// name is a registered configurable (any of its names; "scope/Name" for a
// scoped query), param one of its parameters, of the type the getter reads.
// A parameter that is not bound gives def. A value through macros is
// resolved. Querying an unregistered name or parameter, or with the getter of
// another type, is a bug in the program and fails with CT_ERR_STATE. A
// parameter of a nullable kind bound to None gives def (get_string,
// get_reference, get_list give NULL). Each query is recorded for the
// operative config and marks the binding it read as used.

ct_status ct_config_get_int(ct_config *cfg, const char *name, const char *param, int64_t def, int64_t *out,
                            ct_error *err);
ct_status ct_config_get_float(ct_config *cfg, const char *name, const char *param, double def, double *out,
                              ct_error *err);
ct_status ct_config_get_bool(ct_config *cfg, const char *name, const char *param, bool def, bool *out,
                             ct_error *err);
// *out lives as long as cfg; NULL for None (or for def == NULL when unbound).
ct_status ct_config_get_string(ct_config *cfg, const char *name, const char *param, const char *def,
                               const char **out, ct_error *err);
// A list or tuple. def is gin text ("[128, 64]"), or NULL for None. *out
// lives as long as cfg; NULL for None.
ct_status ct_config_get_list(ct_config *cfg, const char *name, const char *param, const char *def,
                             const ct_config_value **out, ct_error *err);
// A list or tuple of ints: up to max of them into out, their count into *n.
// More than max, or an item that is not an int, is an error with file and line.
ct_status ct_config_get_int_list(ct_config *cfg, const char *name, const char *param, const int64_t *def,
                                 int n_def, int64_t *out, int max, int *n, ct_error *err);
// The ctrax name ("Adam", "eval/TransformerLM") of the configurable a
// reference parameter names; def is a name (or NULL for None). *out lives as
// long as cfg; NULL for None.
ct_status ct_config_get_reference(ct_config *cfg, const char *name, const char *param, const char *def,
                                  const char **out, ct_error *err);

// The builders write a new object to *out and return CT_OK, or return an
// error with *out NULL.
//
// Builds the model (or loss or metric layer: any configurable that is a
// layer) a reference names, from its bindings: for instance
//   ct_config_get_reference(cfg, "train", "model", NULL, &m, err);
//   CT_TRY(ct_config_build_model(cfg, m, &model, err));
// *out is a new layer (one reference). Its parameters'
// checks (TransformerLM's d_model divisible by n_heads, ...) name the file
// and line of the binding. A model whose weights and gradients alone cannot
// fit in the machine's memory is refused before any of it is built
// (CT_ERR_MEMORY, naming the setting that makes it large and the bytes; see
// ct_config_check_memory for the whole run's budget).
ct_status ct_config_build_model(ct_config *cfg, const char *name, ct_layer **out, ct_error *err);
ct_status ct_config_build_layer(ct_config *cfg, const char *name, ct_layer **out, ct_error *err);
// Builds the optimizer a reference names ("Adam", "Momentum", "RMSProp",
// "Adafactor", "SM3", "SGD"), its unbound parameters from its
// ct_*_default_params.
ct_status ct_config_build_optimizer(ct_config *cfg, const char *name, ct_optimizer **out, ct_error *err);

// Builds the learning-rate schedule a reference names, e.g.
//   ct_config_get_reference(cfg, "train", "lr_schedule_fn", "multifactor", &s, err);
//   CT_TRY(ct_config_build_schedule(cfg, s, &lr, err));
// constant(value), warmup(n_warmup_steps, max_value) and
// warmup_and_rsqrt_decay(n_warmup_steps, max_value) have no defaults, as in
// Trax: an unbound parameter is an error. multifactor's unbound parameters
// take Trax's defaults (ct_multifactor_default_params). A parameter the
// constructor refuses (an unknown factor) is an error naming the file and
// line of its binding. Free it with ct_schedule_free.
ct_status ct_config_build_schedule(ct_config *cfg, const char *name, ct_schedule **out, ct_error *err);

// Builds the train and eval streams of the input configurable name names
// (train.inputs), batches of batch_size examples. Both are endless: train
// repeats its data in shuffled epochs (seeded by seed) or is synthetic;
// eval repeats finite eval data in epochs, in order, so evals never run out.
// Both are deterministic functions of the config and seed. Each batch is
// the tuple the models and losses take:
//   language tasks   inputs int32 (B, T), targets int32 (B, T), weights f32 (B, T)
//   IDX images       images f32 (B, rows, cols), labels int32 (B), weights f32 (B)
// Variable-length synthetic data is padded (with weight 0) to one fixed
// length, the longest the task makes, so every batch has the same shape.
// The inputs (Trax's names where Trax has the same thing):
//   sequence_copy_inputs (alias CopyInputs), trax.data.sequence_copy_inputs:
//       vocab_size, train_length, eval_min_length, eval_max_length, reverse,
//       pad_to_multiple. As Trax: "0 w 0 w" with w of 1..train_length-1
//       tokens in training, eval_min_length..eval_max_length-1 in eval.
//   addition_inputs, trax.data.addition_inputs: vocab_size, train_length,
//       eval_min_length, eval_max_length, pad_to_multiple. Numbers of up to
//       train_length digits in training (min 3), eval_min_length..
//       eval_max_length in eval.
//   TextInputs: byte-level text (vocabulary 256) from paths (files and
//       directories), chunks of seq_len, a train/eval split by eval_fraction
//       and split_seed; shuffle_buffer, shifted (see ct_corpus_params).
//   TokenInputs: binary token files: paths, token_bytes (2 or 4),
//       vocab_size, seq_len, eval_fraction, split_seed, shuffle_buffer, shifted.
//   IDXInputs: train_images, train_labels, eval_images, eval_labels (IDX
//       files, .gz or plain: MNIST, Fashion-MNIST), n_classes, shuffle.
// With eval_fraction 0 (TextInputs, TokenInputs) there is no eval data and
// *eval is NULL. Paths are relative to the working directory. A missing file
// is an error naming the file and the config line that names it; a bad file
// is an error naming the file and byte, after the config line (a token file's
// tokens are checked against vocab_size as they are read, so that error
// comes from ct_stream_next). batch_size is 1 to 2^24. On failure both
// streams are NULL.
ct_status ct_config_build_inputs(ct_config *cfg, const char *name, int64_t batch_size, uint64_t seed,
                                 ct_stream **train, ct_stream **eval, ct_error *err);

// ---- The program's settings ---------------------------------------------------
//
// What `ctrax train` (and `ctrax eval`) read: Trax's trainer_lib.train and
// Loop parameters, described once here (see ctrax/params.h); the registry's
// rows, the defaults and the structs come from these lists. batch_size is
// ctrax's (Trax sets it on its input pipeline). Every setting the registry
// accepts is read by ctrax train.
#define CT_TRAIN_SETTINGS(X)                                                                                      \
    X(REF(MODEL), model, NULL, ANY, NONE, "the model to train")                                                  \
    X(REF(LAYER), loss_fn, "WeightedCategoryCrossEntropy", ANY, NONE, "the training loss")                       \
    X(REF(OPTIMIZER), optimizer, "Adafactor", ANY, NONE, "the optimizer; Trax's default Adafactor")              \
    X(REF(SCHEDULE), lr_schedule_fn, "multifactor", ANY, NONE,                                                   \
      "learning rate per step; Trax's default multifactor (its multifactor.* bindings apply); None: the optimizer's " \
      "learning_rate every step (ctrax's)")                                                                        \
    X(REF(SCHEDULE), lr_schedule, "None", ANY, UNSTORED,                                                          \
      "Trax's older spelling: @constant() (a call, as Trax's older configs write it) means lr_schedule_fn = @constant") \
    X(REF(INPUT), inputs, NULL, ANY, NONE,                                                                        \
      "the training and eval streams; unbound with data_streams.dataset_name bound: @batcher (Trax's default)")   \
    X(LIST_OF(LAYER), metrics, "[@WeightedCategoryAccuracy]", ANY, UNSTORED_NULLABLE,                             \
      "eval metrics: a list of @layers (losses and metrics)")                                                     \
    X(INT64, steps, 1000, AT_LEAST(0), NONE, "training steps")                                                   \
    X(INT64, batch_size, 32, AT_LEAST(1), NONE, "examples per step")                                             \
    X(INT64, eval_frequency, 100, AT_LEAST(0), NONE, "steps between evals (0: none)")                            \
    X(INT64, eval_steps, 10, RANGE(0, 2147483647), NONE, "batches per eval")                                              \
    X(INT64, random_seed, 0, AT_LEAST(0), NULLABLE,                                                              \
      "seed of init, data, dropout; unbound or None: drawn from the system (as Trax), logged, and recorded in the "    \
      "run (config.gin, state.json), which a resume reuses")                                                       \
    X(STRING, checkpoint_highest, NULL, ANY, NULLABLE, "keep the checkpoint with the highest value of this metric") \
    X(STRING, checkpoint_lowest, NULL, ANY, NULLABLE, "keep the checkpoint with the lowest value of this metric")   \
    X(INT64, permanent_checkpoint_frequency, 0, AT_LEAST(0), NULLABLE,                                           \
      "permanent checkpoints at step 1 and every N steps (Loop.n_steps_per_permanent_checkpoint); 0 or None: none") \
    X(LIST, checkpoints_at, "None", ANY, UNSTORED_NULLABLE,                                                      \
      "steps of the regular checkpoints (Loop.checkpoints_at); None: step 1 and every Loop.n_steps_per_checkpoint") \
    X(LIST, permanent_checkpoints_at, "None", ANY, UNSTORED_NULLABLE,                                            \
      "steps of the permanent checkpoints, never pruned (Loop.permanent_checkpoints_at); None: the frequency's")   \
    X(STRING, init_checkpoint, NULL, ANY, NULLABLE,                                                              \
      "a new run starts from this checkpoint's weights (a checkpoint directory, or a run's: its newest), with a "  \
      "fresh optimizer at step 0; a resumed run ignores it")                                                       \
    X(BOOL, use_memory_efficient_trainer, false, ANY, NONE, "the reversible trainer")                            \
    X(INT64, loss_chunk_size, 0, AT_LEAST(0), NONE,                                                              \
      "> 0: the model's row-wise tail and the loss run on chunks of this many rows (B*T), so the full logits never exist") \
    X(INT64, n_devices, 1, RANGE(1, 64), NONE, "local devices (replica threads); 1 when unbound")                \
    X(INT64, n_processes, 1, RANGE(1, 1 << 20), NONE,                                                           \
      "processes of the run (ctrax train binds mpirun's count); a batch size bound on the inputs is per process, "  \
      "as Trax's is per host, so the step's batch is it x this")                                                   \
    X(INT64, n_threads, 0, RANGE(0, 4096), NONE,                                                                \
      "threads for ctrax's loops and the GEMM together (ctrax train --threads); 0: OMP_NUM_THREADS, else every core") \
    X(BOOL, adasum, false, ANY, NONE, "combine device gradients with Adasum instead of averaging them")          \
    X(DOUBLE, clip_grad_norm, 0.0, AT_LEAST(0), NULLABLE, "clip gradients to this global L2 norm; None: no clipping") \
    X(INT64, keep_checkpoints, 2, RANGE(1, 2147483647), NONE,                                                     \
      "regular checkpoints kept (the Loop counts them in a C int)")                                               \
    X(BOOL, skip_nonfinite_steps, false, ANY, NONE,                                                              \
      "skip a step whose loss or gradients are NaN/Inf and count it, instead of stopping")                        \
    X(BOOL, save_graphs, "True", ANY, UNSTORED,                                                                   \
      "no effect: Trax writes the model's computation graphs for TensorBoard; ctrax writes none")
typedef struct ct_train_settings {
    CT_TRAIN_SETTINGS(CT_PARAM_FIELD)
} ct_train_settings;
ct_train_settings ct_train_default_settings(void);

// Trax's TrainTask/Loop checkpoint periods, and the bound on the Loop's
// metric history (ctrax's: Trax keeps all of it). Trax's train() makes its
// task's n_steps_per_checkpoint its eval_frequency: unbound, it is
// train.eval_frequency (100 when that is 0). history_max's default is
// CT_LOOP_HISTORY_MAX_DEFAULT (ctrax/train/loop.h); 0 is refused (the
// Loop's 0 means that default, which a config writes as itself).
#define CT_LOOP_SETTINGS(X)                                                                                \
    X(INT64, n_steps_per_checkpoint, 100, AT_LEAST(1), NONE, "unbound: train.eval_frequency (as Trax's train)") \
    X(INT64, n_steps_per_permanent_checkpoint, 0, AT_LEAST(0), NULLABLE,                                  \
      "permanent checkpoints at step 1 and every N steps; 0 or None: none")                               \
    X(LIST, checkpoints_at, "None", ANY, UNSTORED_NULLABLE, "steps of the regular checkpoints; None: the period's") \
    X(LIST, permanent_checkpoints_at, "None", ANY, UNSTORED_NULLABLE,                                     \
      "steps of the permanent checkpoints; None: n_steps_per_permanent_checkpoint's")                     \
    X(LIST, eval_at, "None", ANY, UNSTORED_NULLABLE,                                                      \
      "steps of the evals (and training logs), a list (Trax's is a function); None: train.eval_frequency's") \
    X(INT64, history_max, 4096, RANGE(-1, 2147483647), NONE,                                                \
      "rows of metric history held and saved in each state.json (ct_loop_options.history_max), plus each "  \
      "metric's last value; -1: every row, as Trax (metrics.jsonl keeps every value either way)")
typedef struct ct_loop_settings {
    CT_LOOP_SETTINGS(CT_PARAM_FIELD)
} ct_loop_settings;
ct_loop_settings ct_loop_default_settings(void);

// Reads every train.* (Loop.*) setting into *out: a bound value, else the
// default above. References are ctrax names ("Adam"); strings and names
// live as long as cfg. Each query is recorded for the operative config.
ct_status ct_config_read_train(ct_config *cfg, ct_train_settings *out, ct_error *err);
ct_status ct_config_read_loop(ct_config *cfg, ct_loop_settings *out, ct_error *err);

// ---- Memory budget -------------------------------------------------------------
//
// What a training run would need, estimated from the settings alone before
// anything is built or allocated, and checked against the device's limit
// and the machine's physical memory (ct_machine_memory_bytes: MemTotal, not
// MemAvailable, so the answer does not change with the page cache; a run
// above it cannot be held at once whatever else happens). The estimate
// counts from below (weights, a gradient slab per local device, the
// optimizer's slots, positional tables; the activations the layers keep
// for backward, the attention probabilities among them), in double, so
// nothing overflows and nothing that fits is refused.

typedef struct ct_config_run_shape {
    const char *model;      // the model's name (train.model); required
    const char *optimizer;  // its optimizer (train.optimizer); NULL: no slots counted
    const char *inputs;     // its inputs (train.inputs); NULL: no activations counted
    int64_t batch_size;     // examples per step over all devices and processes
    int n_devices;          // local replicas splitting the batch (0 means 1)
    int n_processes;        // processes splitting the batch, each with its own copy (0 means 1)
    bool memory_efficient;  // the reversible trainer: one layer's activations at a time
    size_t device_limit_bytes;  // the device's byte limit (ct_device.limit_bytes); 0: none
    int64_t loss_chunk_size;    // train.loss_chunk_size: > 0, the logits exist this many rows at a time
} ct_config_run_shape;

typedef struct ct_config_memory {
    double weights;           // floats in the weight slab
    double model_bytes;       // weights, gradients, optimizer slots and tables, on this process
    double activation_bytes;  // one step's activations on this process (0: not estimated)
    int64_t example_length;   // T, tokens per training example (0: unknown or not a sequence model)
    double limit_bytes;       // what the sum was checked against (0: no limit known)
} ct_config_memory;

// Fills *out (may be NULL) and checks the sum against the limits: CT_OK, or
// CT_ERR_MEMORY with an error that names the setting that makes the sum
// large, where it is bound, and the bytes, e.g.
//   run.gin:3:1: ReformerLM.n_layers = 100000000: the model's weights,
//   gradients and optimizer slots need about 72.8 TiB; this machine has 23.4 GiB
//   --set:1:1: train.batch_size = 16777216: one step's activations need about
//   3.1 TiB (16777216 x 34 tokens); this machine has 23.4 GiB
// A batch whose matrix products would pass the BLAS's int rows (batch share
// x T > 2^31 - 1) is CT_ERR_ARG naming the setting. Settings are queried as
// the builders query them (they appear in the operative config) and errors
// of the builders' own checks (d_model and n_heads, ...) come out first.
ct_status ct_config_check_memory(ct_config *cfg, const ct_config_run_shape *run, ct_config_memory *out,
                                 ct_error *err);

// "file:line:col: " of the binding a query of name.param reads, or "" when
// it is not bound: for a program's errors about settings it checks itself.
void ct_config_where(const ct_config *cfg, const char *name, const char *param, char *buf, size_t len);

// ---- Bindings and the operative config -----------------------------------------

typedef struct ct_config_binding_info {
    const char *name;  // ctrax name, with scope: "TransformerLM", "eval/TransformerLM"
    const char *param;
    const ct_config_value *value;  // as written (macros unresolved)
    const char *file;
    int line;
    bool used;      // a query read it
    bool override;  // from ct_config_set
} ct_config_binding_info;

int ct_config_n_bindings(const ct_config *cfg);
ct_config_binding_info ct_config_binding_at(const ct_config *cfg, int i);

// The operative config as gin text: every parameter queried, with the value
// the program got (bound or default), grouped by configurable and sorted, as
// gin writes it. A new string; ct_free it.
char *ct_config_operative_text(const ct_config *cfg);
// Writes it to path (the program writes <output_dir>/config.gin).
ct_status ct_config_write_operative(const ct_config *cfg, const char *path, ct_error *err);

// Every registered configurable with its kind, Trax module, parameters, types
// and defaults, as commented gin text. A new string; ct_free it.
char *ct_config_registry_text(void);

#ifdef __cplusplus
}
#endif
#endif
