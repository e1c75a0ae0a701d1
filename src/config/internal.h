// Internals of the config module: the registry's tables, values, the parser's
// entry points into the config, and a growable string.
#ifndef CTRAX_CONFIG_INTERNAL_H
#define CTRAX_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "ctrax/config/config.h"
#include "ctrax/data/stream.h"
#include "ctrax/optim/schedules.h"

// ---- The registry (registry.c) ---------------------------------------------------

// The type of a parameter. Struct-backed parameters are fields of a params
// struct: an int is a C int (field_size 4, enums too) or int64_t (8), a float
// a float (4) or double (8), a bool a bool, a string a const char * that
// points into the config (it lives as long as the config does).
typedef enum cfg_type {
    CFG_INT = 0,
    CFG_FLOAT,
    CFG_BOOL,
    CFG_STRING,
    CFG_LIST,       // a list or tuple
    CFG_REFERENCE,  // @Name of one of ref_kinds
    // A value whose forms only its configurable knows (ReformerLM's
    // attention_type: a reference or a list of them; n_buckets: None, an int
    // or a pair): any kind is bound, the configurable's fill checks it.
    CFG_ANY,
} cfg_type;

// What a configurable builds; a reference parameter accepts a set of kinds.
typedef enum cfg_kind {
    CFG_MODEL = 0,  // a layer that is a model
    CFG_LAYER,      // a loss or metric layer
    CFG_OPTIMIZER,
    CFG_SCHEDULE,
    CFG_INPUT,
    CFG_SETTINGS,   // settings the program reads (train, Loop)
    // A layer type a model builds itself from a reference: ReformerLM's
    // attention_type (@LSHSelfAttention), RNNLM's rnn_cell (@GRUCell).
    CFG_LAYER_TYPE,
    CFG_N_KINDS
} cfg_kind;
#define CFG_KIND_BIT(k) (1u << (k))

typedef struct cfg_param {
    const char *name;
    cfg_type type;
    // The default as gin text, or NULL: the field's value in the defaults
    // struct (struct-backed), else the default the program passes.
    const char *default_gin;
    bool has_field;
    size_t field;       // offset in the params struct when has_field
    size_t field_size;  // sizeof the field (see cfg_type)
    // No default: a builder fails when it is not bound (Trax's gin.REQUIRED).
    bool required;
    // Numeric range, checked when lo < hi: lo <= v <= hi (v > lo if
    // lo_open, v < hi if hi_open).
    double lo, hi;
    bool lo_open, hi_open;
    bool none_ok;        // None is accepted (queries then give their default)
    // CFG_REFERENCE: CFG_KIND_BITs accepted. CFG_STRING: 0, or the kinds
    // whose @Name (no call) is taken as the string Name.
    unsigned ref_kinds;
    const char *doc;
} cfg_param;

// What a model needs, from its settings alone (src/config/budget.c): its
// weights as groups of equal shapes (so an optimizer can say how many slot
// floats each takes), memory it keeps outside the slabs, and its
// activations per example of T tokens, counted from below (the tensors its
// layers keep for backward), so an estimate never refuses a run that fits.
#define CFG_PLAN_MAX_GROUPS 16
typedef struct cfg_plan {
    struct {
        int ndim;          // 1 or 2
        int64_t shape[2];  // each dim a setting (at most a C int)
        double count;      // how many weights of this shape
    } w[CFG_PLAN_MAX_GROUPS];
    int n_w;
    double host_floats;  // kept with the layers, not in a slab (sinusoid tables)
    // The state slab (LSHSelfAttention's stored buckets and hash counters):
    // state_floats + (state_per_example + state_per_token x T) x the
    // examples of T tokens a net is built for.
    double state_floats, state_per_example, state_per_token;
    // Activation floats of one example of T tokens: per_token * T +
    // per_token_sq * T^2 (attention probabilities) + per_example.
    double act_per_token, act_per_token_sq, act_per_example;
    // The part of act_per_token that is the logits and their gradient,
    // which a chunked loss (train.loss_chunk_size) holds for a chunk only.
    double logits_per_token;
    bool uses_length;  // a sequence model: its batches are (B, T) tokens
    // > 0: the only length T the model takes (ReformerLM's axial positions:
    // the product of pos_axial_shape), and the parameter that sets it.
    int64_t exact_length;
    const char *exact_length_param;
} cfg_plan;

typedef struct cfg_def cfg_def;
struct cfg_def {
    const char *name;  // the ctrax name, Trax's short name
    // Other names of it, space separated ("CopyInputs"), or NULL; bindings
    // and references through an alias are written with the name.
    const char *aliases;
    cfg_kind kind;
    // Trax modules that define it, space separated ("trax.lr
    // trax.supervised.lr_schedules"); NULL if Trax has no such name.
    const char *modules;
    const cfg_param *params;
    int n_params;
    // Struct-backed configurables: a params struct of struct_size bytes,
    // filled by defaults, then from the config field by field, checked by
    // check (may be NULL), and handed to new_layer, new_optimizer or
    // new_schedule.
    size_t struct_size;
    void (*defaults)(void *p);
    ct_status (*check)(ct_config *cfg, const char *name, const void *p, ct_error *err);
    // The fields no single row fills (ReformerLM's attention list and the
    // settings of its attention types, read from their own bindings), after
    // the rows and before check; may be NULL.
    ct_status (*fill)(ct_config *cfg, const char *name, void *p, ct_error *err);
    ct_layer *(*new_layer)(const void *p);
    ct_optimizer *(*new_optimizer)(const void *p);
    ct_status (*new_schedule)(const void *p, ct_schedule **out, ct_error *err);
    // Inputs: the train and eval streams of batches (see
    // ct_config_build_inputs), from the config directly.
    ct_status (*build_inputs)(ct_config *cfg, const char *name, int batch_size, uint64_t seed, ct_stream **train,
                              ct_stream **eval, ct_error *err);
    // Other layers: built from the config directly, or made with no
    // parameters (losses and metrics).
    ct_status (*build_layer)(ct_config *cfg, const char *name, ct_layer **out, ct_error *err);
    ct_layer *(*make_layer)(void);
    // Models: what the model needs (see cfg_plan), from the params struct p
    // (NULL for a model built from the config directly), under the run
    // (its trainer, its inputs; NULL: as a builder sees it). NULL: no estimate.
    ct_status (*plan)(ct_config *cfg, const char *name, const void *p, const ct_config_run_shape *run,
                      cfg_plan *out, ct_error *err);
    const char *doc;
};

const cfg_def *cfg_registry(int *n);
// Why a name ctrax does not have cannot be used, when it is one of Trax's
// (a model, attention layer or TFDS data function ctrax does not
// implement): "is Trax's ..., which ctrax does not implement: <what to
// do>"; NULL for any other name. name may carry its module
// ("trax.models.Reformer2"): an unknown name in trax.models or in Trax's
// data modules is taken as that kind.
const char *cfg_trax_missing(const char *name);
const char *cfg_kind_name(cfg_kind k);  // "a model", "an optimizer", ...
const char *cfg_type_name(cfg_type t);  // "an int", ...
const cfg_param *cfg_def_param(const cfg_def *d, const char *param);

// ---- Names (config.c) --------------------------------------------------------------

// Looks up a configurable by any of its names (no scope). Returns NULL and
// writes why (with the closest known name) into why.
const cfg_def *cfg_lookup(const char *name, char *why, size_t why_len);
// The closest of n candidate strings to s (case-insensitive optimal string
// alignment distance), or NULL if n == 0.
const char *cfg_closest(const char *s, const char *const *cands, int n);
// The value of name.param as ct_config_get_* would give it, with the
// registry's default (default_gin, or the field of the defaults struct) when
// unbound. Records the query. A required parameter that is not bound is an
// error (CT_ERR_ARG) that says so.
ct_status cfg_query_default(ct_config *cfg, const char *name, const char *param, const ct_config_value **out,
                            ct_error *err);
// Records v (a value the config owns, of name.param's type) as the value
// the program used for name.param, for the operative config: a setting
// another one decided (train.batch_size from the inputs' batch_size).
void cfg_record_value(ct_config *cfg, const char *name, const char *param, const ct_config_value *v);
// The same for a string the program decided (a copy is kept).
void cfg_record_string(ct_config *cfg, const char *name, const char *param, const char *s);
// The same for an int the program decided.
void cfg_record_int(ct_config *cfg, const char *name, const char *param, int64_t i);
// "file:line:col: " of the binding a query of name.param would read, or ""
// if it is not bound; for checks across parameters.
void cfg_where(const ct_config *cfg, const char *name, const char *param, char *buf, size_t len);
// "file:line:col: Name.param = value" (" (its default)" when unbound) of a
// setting an error blames; value is its text, or NULL to read it from the
// config.
void cfg_setting_text(ct_config *cfg, const char *name, const char *param, const char *value, char *buf, size_t len);

// The name under which the configurable `ref` names ("Name" or
// "scope/Name"), called by the configurable `holder` ("scope/Holder"), reads
// its bindings. gin runs what a scoped configurable calls in that scope: an
// unscoped reference takes the holder's scope (@eval/ReformerLM's
// @LSHSelfAttention reads eval/LSHSelfAttention.*); a scoped one keeps its
// own, which gin puts in place of the active scope. Interned: it lives as
// long as cfg.
const char *cfg_scoped_ref(ct_config *cfg, const char *holder, const char *ref);

// Fills a struct-backed configurable's params struct (buf, d->struct_size
// bytes) from its defaults and the config, and runs its check.
ct_status cfg_fill_struct(ct_config *cfg, const char *name, const cfg_def *d, void *buf, ct_error *err);

// ---- Memory budgets (budget.c) ----------------------------------------------------------------

// The plans of the registry's models.
ct_status cfg_plan_transformer_lm(ct_config *cfg, const char *name, const void *p, const ct_config_run_shape *run,
                                  cfg_plan *out, ct_error *err);
ct_status cfg_plan_reformer_lm(ct_config *cfg, const char *name, const void *p, const ct_config_run_shape *run,
                               cfg_plan *out, ct_error *err);
// The MLP's Dense widths, from layer_widths or Trax's older d_hidden /
// n_hidden_layers / n_output_classes, into w[CFG_MLP_MAX_LAYERS]; an error
// names a bad width or both spellings bound.
#define CFG_MLP_MAX_LAYERS 256
ct_status cfg_mlp_widths(ct_config *cfg, const char *name, int *w, int *n, ct_error *err);
// The MLP's parameter that gives its widths in this config: "layer_widths",
// or the first of Trax's older d_hidden / n_hidden_layers / n_output_classes
// that is bound (for an error to name what the config wrote).
const char *cfg_mlp_widths_param(ct_config *cfg, const char *name);
ct_status cfg_plan_mlp(ct_config *cfg, const char *name, const void *p, const ct_config_run_shape *run,
                       cfg_plan *out, ct_error *err);
ct_status cfg_plan_rnnlm(ct_config *cfg, const char *name, const void *p, const ct_config_run_shape *run,
                         cfg_plan *out, ct_error *err);
// Refuses (CT_ERR_MEMORY, naming the setting that makes it large and the
// bytes) a model whose weights and gradients alone cannot fit in the
// machine's memory, before it is built; p is its filled params struct.
ct_status cfg_check_model_memory(ct_config *cfg, const char *name, const cfg_def *d, const void *p, ct_error *err);

// ---- Input builders (inputs.c), named by the registry's input entries ----------------------

// The length T of the training (eval false) or eval examples the input name
// makes, from its settings, and the parameter that sets it; 0 and NULL when
// the data decide (IDX images).
ct_status cfg_inputs_length(ct_config *cfg, const char *name, bool eval, int64_t *length, const char **param,
                            ct_error *err);

// The eval batch (examples, every process's together) the input name makes
// when it sets one of its own (the batcher's eval_batch_size, made a
// multiple of train.n_devices as its builder makes it), and the parameter;
// 0 and NULL when its eval batches are the train batch's size.
ct_status cfg_inputs_eval_batch(ct_config *cfg, const char *name, int64_t *batch, const char **param, ct_error *err);

// The (rows, cols) of the images the input name makes (IDXInputs, the
// batcher's IDX files), read from the train images' header; 0, 0 when
// unknown (other inputs; a file that cannot be read: its builder says why).
void cfg_inputs_image_dims(ct_config *cfg, const char *name, int64_t *rows, int64_t *cols);

ct_status cfg_build_copy_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed, ct_stream **train,
                                ct_stream **eval, ct_error *err);
ct_status cfg_build_addition_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed,
                                    ct_stream **train, ct_stream **eval, ct_error *err);
ct_status cfg_build_text_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed, ct_stream **train,
                                ct_stream **eval, ct_error *err);
ct_status cfg_build_token_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed,
                                 ct_stream **train, ct_stream **eval, ct_error *err);
// Trax's batcher: data_streams.dataset_name 'mnist' or 'fashion_mnist'
// from IDX files in data_dir; the eval batches are eval_batch_size.
ct_status cfg_build_batcher_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed,
                                   ct_stream **train, ct_stream **eval, ct_error *err);
ct_status cfg_build_idx_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed, ct_stream **train,
                               ct_stream **eval, ct_error *err);

// ---- Values (value.c) --------------------------------------------------------------

void cfg_value_free(ct_config_value *v);  // frees what v holds, not v
bool cfg_value_has_macro(const ct_config_value *v);

// A growable NUL-terminated string.
typedef struct cfg_buf {
    char *s;
    size_t len, cap;
} cfg_buf;
void cfg_buf_put(cfg_buf *b, const char *s, size_t n);
void cfg_buf_puts(cfg_buf *b, const char *s);
void cfg_buf_printf(cfg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cfg_buf_value(cfg_buf *b, const ct_config_value *v);  // gin text of v

// ---- The parser (parse.c) and what it calls (config.c) -----------------------------

// Parses text as source (includes relative to the working directory).
ct_status cfg_parse(ct_config *cfg, const char *text, size_t len, const char *source, bool override,
                    ct_error *err);
ct_status cfg_parse_file(ct_config *cfg, const char *path, bool override, ct_error *err);
// Parses text holding one value (a default: source "<default>").
ct_status cfg_parse_value(ct_config *cfg, const char *text, const char *source, ct_config_value *out,
                          ct_error *err);

// Interned source names: the returned pointer lives as long as cfg.
const char *cfg_intern(ct_config *cfg, const char *s);
// Logs the warning msg (CT_LOG_WARN) unless this config has given it
// before: a model's settings are read more than once (the memory budget,
// then the build), its warnings are said once.
void cfg_warn_once(ct_config *cfg, const char *msg);
// Include stack for cycle detection (real paths): 0 when pushed, -1 when
// real_path is already on it (a cycle), -2 when it is max_depth deep, -3
// after CFG_MAX_INCLUDES includes in all (seven files of 20 includes each
// once meant 20^6 parses).
#define CFG_MAX_INCLUDES 1000
// The most items one value holds, everything nested in it counted, as
// written (the parser refuses more) and with its macros replaced (resolving
// refuses more: [%A, %A] with A = [%B, %B] ... doubles at each level).
#define CFG_MAX_VALUE_NODES 1000000
int cfg_include_push(ct_config *cfg, const char *real_path, int max_depth);
void cfg_include_pop(ct_config *cfg);
// "a.gin -> b.gin -> " of the stack from where real_path first appears.
void cfg_include_chain(const ct_config *cfg, const char *real_path, cfg_buf *out);

// A statement `key = value`: key is "scope/Name.param" as written, or a macro
// name. Takes ownership of *value (clears it). Checks names, references and,
// when no macro is involved, type and range.
ct_status cfg_bind(ct_config *cfg, const char *key, const char *file, int line, int col, ct_config_value *value,
                   bool override, ct_error *err);

#endif
