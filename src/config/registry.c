// The registry: every configurable a config may bind or refer to, with its
// parameters. This table is the one list of names the program reads
// (`train.steps`, `Loop.n_steps_per_checkpoint`, ...), and the one place
// to add a model, optimizer, schedule, input, loss or metric.
//
// The parameters of a struct-backed configurable (optimizers, schedules,
// TransformerLM and ReformerLM, the program's settings) are rows generated
// from the list that declares its params struct (CT_ADAM_PARAMS in
// optimizer.h, ...; see ctrax/params.h), so a name, default, range or help
// text is written once. Adding an optimizer is its list, and here one line of
// rows and an entry with two one-line wrappers, as for Adam below.
// warmup's and constant's parameters are required, as in Trax: their lists
// are local.
//
// A layer with no parameters (losses and metrics) names its constructor in
// make_layer; WeightedCategoryCrossEntropy, whose label_smoothing is a row,
// is struct-backed (CT_WEIGHTED_CATEGORY_CROSS_ENTROPY_PARAMS in
// ctrax/layers/core.h). Inputs name a builder (src/config/inputs.c) that
// reads the parameters their lists here give (gin defaults, no struct).
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "config/internal.h"
#include "ctrax/layers/core.h"
#include "ctrax/models/models.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/optim/schedules.h"
#include "ctrax/train/loop.h"

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

// A row from an entry X(TYPE, field, def, RANGE, FLAGS, help) of the list
// of struct S (see ctrax/params.h); the tokens are pasted onto the prefixes
// below. UNSTORED and ASKED entries have no field: UNSTORED's def is gin
// text, ASKED is required (the inputs' lists).
#define ROW(S, TYPE, f, def, RANGE, FLAGS, help) \
    {.name = #f, CFG_TYPE_##TYPE, CFG_STORE_##FLAGS(S, f, def), CFG_RANGE_##RANGE .doc = (help)},
#define CFG_TYPE_FLOAT .type = CFG_FLOAT
#define CFG_TYPE_DOUBLE .type = CFG_FLOAT
#define CFG_TYPE_INT .type = CFG_INT
#define CFG_TYPE_INT64 .type = CFG_INT
#define CFG_TYPE_ENUM(t) .type = CFG_INT
#define CFG_TYPE_BOOL .type = CFG_BOOL
#define CFG_TYPE_STRING .type = CFG_STRING
#define CFG_TYPE_LIST .type = CFG_LIST
#define CFG_TYPE_LIST_OF(kind) .type = CFG_LIST, .ref_kinds = CFG_KIND_BIT(CFG_##kind)
#define CFG_TYPE_REF(kind) .type = CFG_REFERENCE, .ref_kinds = CFG_KIND_BIT(CFG_##kind), .none_ok = true
#define CFG_FIELD(S, f) .has_field = true, .field = offsetof(S, f), .field_size = sizeof(((S *)0)->f)
#define CFG_STORE_NONE(S, f, def) CFG_FIELD(S, f)
#define CFG_STORE_FIXED(S, f, def) CFG_FIELD(S, f)
#define CFG_STORE_REQUIRED(S, f, def) CFG_FIELD(S, f), .required = true
#define CFG_STORE_NULLABLE(S, f, def) CFG_FIELD(S, f), .none_ok = true
#define CFG_STORE_UNSTORED(S, f, def) .default_gin = (def)
#define CFG_STORE_UNSTORED_NULLABLE(S, f, def) .default_gin = (def), .none_ok = true
#define CFG_STORE_ASKED(S, f, def) .required = true
#define CFG_RANGE_ANY
#define CFG_RANGE_AT_LEAST(x) .lo = (x), .hi = INFINITY,
#define CFG_RANGE_POSITIVE .lo = 0, .hi = INFINITY, .lo_open = true,
#define CFG_RANGE_UNIT .lo = 0, .hi = 1,
#define CFG_RANGE_UNIT_OPEN .lo = 0, .hi = 1, .hi_open = true,
#define CFG_RANGE_RANGE(a, b) .lo = (a), .hi = (b),

const char *cfg_kind_name(cfg_kind k) {
    switch (k) {
    case CFG_MODEL: return "a model";
    case CFG_LAYER: return "a loss or metric layer";
    case CFG_OPTIMIZER: return "an optimizer";
    case CFG_SCHEDULE: return "a learning-rate schedule";
    case CFG_INPUT: return "an input stream";
    case CFG_SETTINGS: return "program settings";
    case CFG_LAYER_TYPE: return "a layer type a model builds (an attention type, an RNN cell, an activation)";
    case CFG_N_KINDS: break;
    }
    return "?";
}

const char *cfg_type_name(cfg_type t) {
    switch (t) {
    case CFG_INT: return "an int";
    case CFG_FLOAT: return "a float";
    case CFG_BOOL: return "a bool";
    case CFG_STRING: return "a string";
    case CFG_LIST: return "a list";
    case CFG_REFERENCE: return "a reference";
    case CFG_ANY: return "a value";
    }
    return "?";
}

// ---- Models -------------------------------------------------------------------------------

#define CFG_TYPE_TRANSFORMER_INT CFG_TYPE_INT
#define CFG_TYPE_TRANSFORMER_FLOAT CFG_TYPE_FLOAT
#define CFG_TYPE_TRANSFORMER_BOOL CFG_TYPE_BOOL
#define CFG_TYPE_TRANSFORMER_STRING CFG_TYPE_STRING, .ref_kinds = CFG_KIND_BIT(CFG_LAYER_TYPE)
#define TRANSFORMER_ROW(TYPE, ...) ROW(ct_transformer_lm_params, TRANSFORMER_##TYPE, __VA_ARGS__)
// mode is Trax's: not a field (the trainer builds the train and eval models).
static const cfg_param transformer_lm_params[] = {
    CT_TRANSFORMER_LM_PARAMS(TRANSFORMER_ROW)
    {.name = "mode", .type = CFG_STRING, .default_gin = "'train'",
     .doc = "the trainer builds the train and eval models; 'predict' is not supported"},
};
static void transformer_lm_defaults(void *p) { *(ct_transformer_lm_params *)p = ct_transformer_lm_default_params(); }
static ct_layer *transformer_lm_new(const void *p) { return ct_transformer_lm(*(const ct_transformer_lm_params *)p); }

// d_model must divide by n_heads; the error points at the binding.
static ct_status check_heads(ct_config *cfg, const char *name, int d_model, int n_heads, ct_error *err) {
    if (d_model % n_heads == 0) return CT_OK;
    char where[300];
    cfg_where(cfg, name, "n_heads", where, sizeof where);
    if (!where[0]) cfg_where(cfg, name, "d_model", where, sizeof where);
    return ct_error_set(err, CT_ERR_ARG, "%s%s: d_model %d does not divide by n_heads %d", where, name, d_model,
                        n_heads);
}

// The model's constructor counts its layers in a C int (n_layers + 7 for
// TransformerLM, 4 x n_layers for ReformerLM): a count past INT_MAX is an
// error naming the setting, whatever the memory budget says.
static ct_status check_layer_count(ct_config *cfg, const char *name, int n_layers, int per_block, int extra,
                                   ct_error *err) {
    if ((int64_t)n_layers * per_block + extra <= INT_MAX) return CT_OK;
    char where[300];
    cfg_where(cfg, name, "n_layers", where, sizeof where);
    char count[64];
    if (per_block == 1) snprintf(count, sizeof count, "n_layers + %d", extra);
    else if (extra == 0) snprintf(count, sizeof count, "%d x n_layers", per_block);
    else snprintf(count, sizeof count, "%d x n_layers + %d", per_block, extra);
    return ct_error_set(err, CT_ERR_ARG, "%s%s.n_layers = %d: its %s layers do not fit a C int (n_layers at most %d)",
                        where, name, n_layers, count, (INT_MAX - extra) / per_block);
}

// A model's activation setting (TransformerLM.ff_activation,
// MLP.activation_fn), a string ('Gelu') or a reference (@Gelu,
// @trax.layers.Gelu, @scope/Gelu): its constructor into *fn, or an error
// naming the binding and the names ctrax has.
static ct_status activation_of(ct_config *cfg, const char *name, const char *param, ct_activation_fn *fn,
                               ct_error *err) {
    const ct_config_value *v;
    CT_TRY(cfg_query_default(cfg, name, param, &v, err));
    const char *s = v->kind == CT_CONFIG_STRING || v->kind == CT_CONFIG_REFERENCE ? v->s : "";
    const char *tail = strrchr(s, '/') ? strrchr(s, '/') + 1 : s;
    if (v->kind == CT_CONFIG_REFERENCE && strrchr(tail, '.')) tail = strrchr(tail, '.') + 1;
    *fn = ct_activation_named(tail);
    if (*fn) return CT_OK;
    char where[300];
    cfg_where(cfg, name, param, where, sizeof where);
    char *text = ct_config_value_to_gin(v);
    ct_status st = ct_error_set(err, CT_ERR_ARG, "%s%s.%s = %.60s is not supported by ctrax: " CT_ACTIVATION_NAMES,
                                where, name, param, text);
    ct_free(text);
    return st;
}

// A Trax parameter a model takes only at Trax's default (a row of rows
// with no field): another bound value is refused, naming it. Numbers
// compare as numbers (1 == 1.0), the rest as gin text; also_ok is one more
// accepted gin text (mode's 'eval') or NULL.
static ct_status only_default(ct_config *cfg, const char *name, const cfg_param *rows, int n_rows, const char *param,
                              const char *also_ok, ct_error *err) {
    char where[300];
    cfg_where(cfg, name, param, where, sizeof where);
    if (!where[0]) return CT_OK;
    const ct_config_value *v;
    CT_TRY(cfg_query_default(cfg, name, param, &v, err));
    const cfg_param *row = NULL;
    for (int i = 0; i < n_rows; i++)
        if (!strcmp(rows[i].name, param)) row = &rows[i];
    CT_ASSERT(row && row->default_gin);
    ct_config_value dv;
    CT_TRY(cfg_parse_value(cfg, row->default_gin, "<default>", &dv, err));
    bool num = (v->kind == CT_CONFIG_INT || v->kind == CT_CONFIG_FLOAT) &&
               (dv.kind == CT_CONFIG_INT || dv.kind == CT_CONFIG_FLOAT);
    char *text = ct_config_value_to_gin(v), *dtext = ct_config_value_to_gin(&dv);
    double x = v->kind == CT_CONFIG_INT ? (double)v->i : v->f, dx = dv.kind == CT_CONFIG_INT ? (double)dv.i : dv.f;
    bool same = num ? x == dx : !strcmp(text, dtext) || (also_ok && !strcmp(text, also_ok));
    ct_status st = same ? CT_OK
                        : ct_error_set(err, CT_ERR_ARG,
                                       "%s%s.%s = %.60s is not supported by ctrax, only %s%s%s (%s)", where, name,
                                       param, text, dtext, also_ok ? " or " : "", also_ok ? also_ok : "",
                                       row->doc ? row->doc : "Trax's default");
    ct_free(text);
    ct_free(dtext);
    cfg_value_free(&dv);
    return st;
}

// A stored activation name bound as @scope/Gelu is Gelu: the scope has no
// settings to give it. (A module path, @trax.layers.Gelu, is resolved
// when the binding is read.)
static void activation_unscoped(const char **activation) {
    const char *slash = *activation ? strrchr(*activation, '/') : NULL;
    if (slash) *activation = slash + 1;
}

static ct_status transformer_lm_fill(ct_config *cfg, const char *name, void *vp, ct_error *err) {
    (void)cfg, (void)name, (void)err;
    activation_unscoped(&((ct_transformer_lm_params *)vp)->ff_activation);
    return CT_OK;
}

static ct_status transformer_lm_check(ct_config *cfg, const char *name, const void *vp, ct_error *err) {
    const ct_transformer_lm_params *p = vp;
    ct_activation_fn activation;
    CT_TRY(activation_of(cfg, name, "ff_activation", &activation, err));
    CT_TRY(only_default(cfg, name, transformer_lm_params, COUNT(transformer_lm_params), "mode", "'eval'", err));
    if (p->learned_positions && p->fixed_positions) {
        char where[300];
        cfg_where(cfg, name, "fixed_positions", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.fixed_positions = True and learned_positions = True: the table is fixed sinusoids "
                            "or learned, not both",
                            where, name);
    }
    CT_TRY(check_layer_count(cfg, name, p->n_layers, 1, 7, err));
    return check_heads(cfg, name, p->d_model, p->n_heads, err);
}

// ---- Attention types (ReformerLM's attention_type) ----------------------------------------
//
// Trax's configs write ReformerLM.attention_type = @LSHSelfAttention and
// bind the type's own settings as LSHSelfAttention.*: gin hands ReformerLM
// the partially bound class, which it then calls with n_heads, d_qk, d_v,
// causal, masked, both dropouts and mode. So a type's rows are of three
// sorts: stored (filled into p.self_attention / p.lsh_attention), passed
// by ReformerLM (a binding has no effect: a warning says what wins, as in
// gin, where the caller's arguments win), and Trax's scheduling knobs
// (accepted with no effect, checked for their type and range).
#define PASSED_DOC "ReformerLM passes its own value: a binding has no effect (a warning says so), as in Trax"
#define ATT_PASSED(S, chunk_default)                                                                                            \
    {.name = "n_heads", .type = CFG_INT, .default_gin = "2", .lo = 1, .hi = INFINITY, .doc = PASSED_DOC},         \
    {.name = "d_qk", .type = CFG_INT, .default_gin = "64", .lo = 1, .hi = INFINITY, .doc = PASSED_DOC},            \
    {.name = "d_v", .type = CFG_INT, .default_gin = "64", .lo = 1, .hi = INFINITY, .doc = PASSED_DOC},             \
    {.name = "causal", .type = CFG_BOOL, .default_gin = "False", .doc = PASSED_DOC},                               \
    {.name = "masked", .type = CFG_BOOL, .default_gin = "False", .doc = PASSED_DOC},                               \
    {.name = "attention_dropout", .type = CFG_FLOAT, .default_gin = "0.0", CFG_RANGE_UNIT_OPEN.doc = PASSED_DOC}, \
    {.name = "output_dropout", .type = CFG_FLOAT, .default_gin = "0.0", CFG_RANGE_UNIT_OPEN.doc = PASSED_DOC},    \
    {.name = "mode", .type = CFG_STRING, .default_gin = "'train'",                                                 \
     .doc = "'train' or 'eval' (the trainer picks; no effect); 'predict' is not supported"},                       \
    {.name = "use_python_loop", .type = CFG_BOOL, .default_gin = "False",                                          \
     .doc = "no effect: how Trax loops over heads; ctrax schedules heads over threads"},                           \
    {.name = "use_reference_code", .type = CFG_BOOL, .default_gin = "False",                                       \
     .doc = "no effect: Trax's unbatched reference path computes the same attention"},                            \
    {.name = "chunk_len", .type = CFG_INT, CFG_FIELD(S, chunk_len), .default_gin = chunk_default, .none_ok = true, .lo = 1, .hi = INFINITY,    \
     .doc = "rows per chunk (the length must divide by it); SelfAttention's None: full attention"},                                                   \
    {.name = "n_chunks_before", .type = CFG_INT, CFG_FIELD(S, n_chunks_before), .lo = 0, .hi = INFINITY,          \
     .doc = "chunks before a query chunk in its window"},                                                         \
    {.name = "n_chunks_after", .type = CFG_INT, CFG_FIELD(S, n_chunks_after), .lo = 0, .hi = INFINITY,            \
     .doc = "chunks after a query chunk in its window"}

// The rows ReformerLM's own arguments override, with what it passes.
static const char *const att_passed[] = {"n_heads", "d_qk", "d_v", "causal", "masked", "attention_dropout",
                                         "output_dropout"};
// Rows read only to check them (no effect).
static const char *const att_no_effect[] = {"mode", "use_python_loop", "use_reference_code", "n_parallel_heads",
                                            "predict_mem_len", "predict_drop_len", "share_qk", "bias"};

#define SELF_FIELD(f) CFG_FIELD(ct_self_attention_params, f)
static const cfg_param self_attention_params[] = {
    ATT_PASSED(ct_self_attention_params, "None"),
    {.name = "share_qk", .type = CFG_BOOL, SELF_FIELD(share_qk),
     .doc = "keys are the RMS-normalised queries (and a position never attends to itself)"},
    {.name = "bias", .type = CFG_BOOL, SELF_FIELD(bias), .doc = "zero-initialised biases on q, k, v"},
    {.name = "n_parallel_heads", .type = CFG_INT, .default_gin = "None", .none_ok = true, .lo = 1, .hi = INFINITY,
     .doc = "no effect: Trax's memory knob; ctrax schedules heads over threads"},
    {.name = "predict_mem_len", .type = CFG_INT, .default_gin = "None", .none_ok = true,
     .doc = "no effect: for 'predict' mode, which ctrax does not have"},
    {.name = "predict_drop_len", .type = CFG_INT, .default_gin = "None", .none_ok = true,
     .doc = "no effect: for 'predict' mode, which ctrax does not have"},
};
static void self_attention_defaults(void *p) { *(ct_self_attention_params *)p = ct_self_attention_default_params(); }

#define LSH_FIELD(f) CFG_FIELD(ct_lsh_self_attention_params, f)
static const cfg_param lsh_self_attention_params[] = {
    ATT_PASSED(ct_lsh_self_attention_params, NULL),
    {.name = "n_hashes", .type = CFG_INT, LSH_FIELD(n_hashes), .lo = 1, .hi = 1 << 16, .doc = "hash rounds"},
    {.name = "n_buckets", .type = CFG_ANY, .default_gin = "None", .none_ok = true,
     .doc = "None (2 max(1, T / chunk_len), factored over 128), an even int, or a list/tuple of up to 4 even factors"},
    {.name = "max_length_for_buckets", .type = CFG_INT, LSH_FIELD(max_length_for_buckets), .none_ok = true,
     .lo = 1, .hi = INFINITY, .doc = "None: the stored buckets are sized by the first input's length"},
    {.name = "share_qk", .type = CFG_BOOL, .default_gin = "False",
     .doc = "no effect: LSHSelfAttention always shares q and k, as Trax ignores it"},
    {.name = "bias", .type = CFG_BOOL, .default_gin = "False", .doc = "only False: True crashes in Trax"},
    {.name = "n_parallel_heads", .type = CFG_INT, .default_gin = "1", .lo = 1, .hi = INFINITY,
     .doc = "no effect: Trax's memory knob; ctrax schedules heads over threads"},
    {.name = "predict_mem_len", .type = CFG_INT, .default_gin = "2048",
     .doc = "no effect: for 'predict' mode, which ctrax does not have"},
    {.name = "predict_drop_len", .type = CFG_INT, .default_gin = "256",
     .doc = "no effect: for 'predict' mode, which ctrax does not have"},
};
static void lsh_self_attention_defaults(void *p) {
    *(ct_lsh_self_attention_params *)p = ct_lsh_self_attention_default_params();
}

// "file:line:col: name.param = value" of a bound parameter, for errors
// and warnings; the value as gin text.
static void binding_text(ct_config *cfg, const char *name, const char *param, const ct_config_value *v, char *buf,
                         size_t len) {
    char where[300];
    cfg_where(cfg, name, param, where, sizeof where);
    char *text = ct_config_value_to_gin(v);
    snprintf(buf, len, "%s%s.%s = %.60s", where, name, param, text);
    ct_free(text);
}

// The checks both types share: the no-effect rows are read (so that they
// count as read and are type-checked), 'predict' is refused.
static ct_status attention_check_common(ct_config *cfg, const char *name, ct_error *err) {
    for (int i = 0; i < COUNT(att_no_effect); i++) {
        const ct_config_value *v;
        CT_TRY(cfg_query_default(cfg, name, att_no_effect[i], &v, err));
    }
    const ct_config_value *mode;
    CT_TRY(cfg_query_default(cfg, name, "mode", &mode, err));
    if (strcmp(mode->s, "train") && strcmp(mode->s, "eval")) {
        char text[400];
        binding_text(cfg, name, "mode", mode, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG, "%s is not supported: 'train' or 'eval' (the trainer picks one%s)", text,
                            strcmp(mode->s, "predict") ? "" : "; ctrax has no 'predict' mode");
    }
    return CT_OK;
}

static ct_status self_attention_check(ct_config *cfg, const char *name, const void *p, ct_error *err) {
    (void)p;
    return attention_check_common(cfg, name, err);
}

// n_buckets: None, an int, or Trax's list of factors.
static ct_status lsh_self_attention_fill(ct_config *cfg, const char *name, void *vp, ct_error *err) {
    ct_lsh_self_attention_params *p = vp;
    const ct_config_value *v;
    CT_TRY(cfg_query_default(cfg, name, "n_buckets", &v, err));
    const ct_config_value *f = v->kind == CT_CONFIG_INT ? v : v->items;
    int n = v->kind == CT_CONFIG_INT ? 1 : v->kind == CT_CONFIG_LIST || v->kind == CT_CONFIG_TUPLE ? v->n : 0;
    bool ok = v->kind == CT_CONFIG_NONE || (n >= 1 && n <= CT_LSH_MAX_BUCKET_FACTORS);
    int64_t nb[CT_LSH_MAX_BUCKET_FACTORS] = {0};
    for (int i = 0; ok && i < n; i++) {
        ok = f[i].kind == CT_CONFIG_INT && f[i].i >= 2 && f[i].i <= (1 << 24) && f[i].i % 2 == 0;
        nb[i] = f[i].i;
    }
    if (!ok) {
        char text[400];
        binding_text(cfg, name, "n_buckets", v, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s: expected None, an even int or a list/tuple of up to %d even factors, each in 2..2^24",
                            text, CT_LSH_MAX_BUCKET_FACTORS);
    }
    for (int i = 0; i < CT_LSH_MAX_BUCKET_FACTORS; i++) p->n_buckets[i] = (int)nb[i];
    return CT_OK;
}

static ct_status lsh_self_attention_check(ct_config *cfg, const char *name, const void *vp, ct_error *err) {
    const ct_lsh_self_attention_params *p = vp;
    CT_TRY(attention_check_common(cfg, name, err));
    const ct_config_value *v;
    CT_TRY(cfg_query_default(cfg, name, "bias", &v, err));
    char text[400];
    if (v->b) {
        binding_text(cfg, name, "bias", v, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG, "%s is not supported: only False (True crashes in Trax)", text);
    }
    CT_TRY(cfg_query_default(cfg, name, "chunk_len", &v, err));
    if (v->kind == CT_CONFIG_NONE) {
        binding_text(cfg, name, "chunk_len", v, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s is not supported: LSHSelfAttention needs chunks of the sorted length (Trax's None "
                            "breaks its default n_buckets); the default is 128",
                            text);
    }
    (void)p;
    return CT_OK;
}

// ReformerLM.attention_type's names, by ct_reformer_attention.
static const char *const attention_names[] = {"CausalAttention", "SelfAttention", "LSHSelfAttention"};
_Static_assert(COUNT(attention_names) == CT_REFORMER_LSH_ATTENTION + 1, "one name per ct_reformer_attention");

// The type a reference names ("scope/SelfAttention"), or -1.
static int attention_of_ref(const ct_config_value *v) {
    if (v->kind != CT_CONFIG_REFERENCE || v->call) return -1;
    const char *slash = strrchr(v->s, '/');
    const char *n = slash ? slash + 1 : v->s;
    for (int i = 0; i < COUNT(attention_names); i++)
        if (!strcmp(n, attention_names[i])) return i;
    return -1;
}

static ct_status attention_type_refused(ct_config *cfg, const char *name, const ct_config_value *all,
                                        const ct_config_value *bad, ct_error *err) {
    char text[400];
    binding_text(cfg, name, "attention_type", all, text, sizeof text);
    char hint[240] = "";
    if (bad->kind == CT_CONFIG_STRING)
        for (int i = 0; i < COUNT(attention_names); i++)
            if (!strcmp(bad->s, attention_names[i]))
                snprintf(hint, sizeof hint, " (a string: write @%s, the reference Trax's configs use)", attention_names[i]);
    if (bad->kind == CT_CONFIG_REFERENCE && bad->call)
        snprintf(hint, sizeof hint, " (@%.60s() is a call: ReformerLM calls the type itself, write @%.60s)", bad->s,
                 bad->s);
    return ct_error_set(err, CT_ERR_ARG,
                        "%s is not an attention type%s: write @CausalAttention (the default), @SelfAttention, "
                        "@LSHSelfAttention or a list of them (cycled over the layers)",
                        text, hint);
}

// What ReformerLM passes instead of a binding of the type's param.
static void reformer_passed_text(const ct_reformer_lm_params *p, const char *param, char *buf, size_t len) {
    int dh = p->d_model / p->n_heads;
    if (!strcmp(param, "n_heads")) snprintf(buf, len, "n_heads = %d", p->n_heads);
    else if (!strcmp(param, "d_qk")) snprintf(buf, len, "d_qk = d_attention_key = %d", p->d_attention_key ? p->d_attention_key : dh);
    else if (!strcmp(param, "d_v")) snprintf(buf, len, "d_v = d_attention_value = %d", p->d_attention_value ? p->d_attention_value : dh);
    else if (!strcmp(param, "causal")) snprintf(buf, len, "causal = True");
    else if (!strcmp(param, "masked")) snprintf(buf, len, "masked = False");
    else snprintf(buf, len, "dropout = %g", (double)p->dropout);
}

// Fills p's attention settings from the config: the bindings of each
// attention type the list names (under the reference's scope), after
// warning about the bindings ReformerLM's own arguments override.
static ct_status attention_settings(ct_config *cfg, const ct_reformer_lm_params *p, const char *ref,
                                    ct_reformer_attention a, void *out, ct_error *err) {
    int n;
    const cfg_def *defs = cfg_registry(&n), *d = NULL;
    for (int i = 0; i < n && !d; i++)
        if (!strcmp(defs[i].name, attention_names[a])) d = &defs[i];
    CT_ASSERT(d);
    for (int i = 0; i < COUNT(att_passed); i++) {
        char where[300];
        cfg_where(cfg, ref, att_passed[i], where, sizeof where);
        if (!where[0]) continue;
        const ct_config_value *v;
        CT_TRY(cfg_query_default(cfg, ref, att_passed[i], &v, err));
        char text[400], passed[80];
        binding_text(cfg, ref, att_passed[i], v, text, sizeof text);
        reformer_passed_text(p, att_passed[i], passed, sizeof passed);
        char msg[600];
        snprintf(msg, sizeof msg, "%s is overridden by ReformerLM, which passes %s, as in Trax", text, passed);
        cfg_warn_once(cfg, msg);
    }
    return d->struct_size ? cfg_fill_struct(cfg, ref, d, out, err) : CT_OK;
}

// The bound one of a parameter's two spellings (Trax's new and old), or
// the new one's default; both bound is an error naming both.
static ct_status either_spelling(ct_config *cfg, const char *name, const char *new_name, const char *old_name,
                                 const char **param, const ct_config_value **v, ct_error *err) {
    char where_new[300], where_old[300];
    cfg_where(cfg, name, new_name, where_new, sizeof where_new);
    cfg_where(cfg, name, old_name, where_old, sizeof where_old);
    if (where_new[0] && where_old[0])
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.%s and %s%s.%s are two spellings of one parameter (the second is Trax's older "
                            "one): bind one",
                            where_new, name, new_name, where_old, name, old_name);
    *param = where_old[0] ? old_name : new_name;
    return cfg_query_default(cfg, name, *param, v, err);
}

// An axial tuple (pos_axial_shape or pos_d_axial_embs) into out[]: ints >= 1,
// 1 to CT_AXIAL_MAX_AXES of them. *n is the count (0 for None or ()).
static ct_status axial_tuple(ct_config *cfg, const char *name, const char *param, const ct_config_value *v, int *out,
                             int *n, ct_error *err) {
    *n = 0;
    if (v->kind == CT_CONFIG_NONE) return CT_OK;
    bool ok = v->n <= CT_AXIAL_MAX_AXES;
    for (int k = 0; ok && k < v->n; k++) {
        const ct_config_value *it = &v->items[k];
        ok = it->kind == CT_CONFIG_INT && it->i >= 1 && it->i <= (1 << 30);
        out[k] = ok ? (int)it->i : 0;
    }
    if (!ok) {
        char text[400];
        binding_text(cfg, name, param, v, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG, "%s: expected a tuple of 1 to %d ints in 1..2^30", text,
                            CT_AXIAL_MAX_AXES);
    }
    *n = v->n;
    return CT_OK;
}

// pos_axial_shape / pos_d_axial_embs (or Trax's older axial_pos_shape /
// d_axial_pos_embs) into p: the older axial_pos_shape also sets pos_type
// ('fixed-base', or 'axial' for a tuple), as it did in Trax.
static ct_status reformer_positions_fill(ct_config *cfg, const char *name, ct_reformer_lm_params *p, ct_error *err) {
    const char *shape_param, *embs_param;
    const ct_config_value *shape, *embs;
    CT_TRY(either_spelling(cfg, name, "pos_axial_shape", "axial_pos_shape", &shape_param, &shape, err));
    CT_TRY(either_spelling(cfg, name, "pos_d_axial_embs", "d_axial_pos_embs", &embs_param, &embs, err));
    char text[400], where_type[300];
    cfg_where(cfg, name, "pos_type", where_type, sizeof where_type);
    if (!strcmp(shape_param, "axial_pos_shape") && (shape->kind == CT_CONFIG_STRING || shape->n > 0)) {
        binding_text(cfg, name, shape_param, shape, text, sizeof text);
        if (shape->kind == CT_CONFIG_STRING && strcmp(shape->s, "fixed-base"))
            return ct_error_set(err, CT_ERR_ARG,
                                "%s is not supported: the string 'fixed-base' (pos_type 'fixed-base') or a tuple of "
                                "axis lengths (pos_type 'axial')",
                                text);
        const char *implied = shape->kind == CT_CONFIG_STRING ? "fixed-base" : "axial";
        if (where_type[0] && (!p->pos_type || strcmp(p->pos_type, implied)))
            return ct_error_set(err, CT_ERR_ARG, "%s means pos_type '%s', but %s%s.pos_type = '%s'", text, implied,
                                where_type, name, p->pos_type ? p->pos_type : "None");
        p->pos_type = implied;
        // The operative config says which pos_type was used (and reads back).
        cfg_record_string(cfg, name, "pos_type", implied);
        if (shape->kind == CT_CONFIG_STRING) shape = NULL;
    } else if (shape->kind != CT_CONFIG_LIST && shape->kind != CT_CONFIG_TUPLE) {
        binding_text(cfg, name, shape_param, shape, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG, "%s: expected a tuple of axis lengths", text);
    }
    int n_shape = 0, n_embs = 0;
    if (shape) CT_TRY(axial_tuple(cfg, name, shape_param, shape, p->pos_axial_shape, &n_shape, err));
    CT_TRY(axial_tuple(cfg, name, embs_param, embs, p->pos_d_axial_embs, &n_embs, err));
    // Trax silently ignores the tuples without pos_type 'axial' (REFORMER.md
    // section 7): a config that sets them means axial positions.
    if ((n_shape || n_embs) && (!p->pos_type || strcmp(p->pos_type, "axial"))) {
        binding_text(cfg, name, n_shape ? shape_param : embs_param, n_shape ? shape : embs, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s is set but %s%s.pos_type is %s%s%s, not 'axial' (Trax would silently ignore it)", text,
                            where_type, name, p->pos_type ? "'" : "", p->pos_type ? p->pos_type : "None",
                            p->pos_type ? "'" : "");
    }
    if (n_shape != n_embs && (n_embs > 0 || (p->pos_type && !strcmp(p->pos_type, "axial")))) {
        char text2[400];
        binding_text(cfg, name, shape_param, shape ? shape : embs, text, sizeof text);
        binding_text(cfg, name, embs_param, embs, text2, sizeof text2);
        return ct_error_set(err, CT_ERR_ARG, "%s and %s: one width per axis (%d axes, %d widths)", text, text2,
                            n_shape, n_embs);
    }
    p->pos_axial_n = n_shape;
    return CT_OK;
}

// attention_type: one reference or a list of them (Trax's forms) into
// n_attention/attention[], then each named type's settings; then the
// axial positions' tuples.
static ct_status reformer_lm_fill(ct_config *cfg, const char *name, void *vp, ct_error *err) {
    ct_reformer_lm_params *p = vp;
    activation_unscoped(&p->ff_activation);
    CT_TRY(reformer_positions_fill(cfg, name, p, err));
    const ct_config_value *v;
    CT_TRY(cfg_query_default(cfg, name, "attention_type", &v, err));
    bool list = v->kind == CT_CONFIG_LIST || v->kind == CT_CONFIG_TUPLE;
    int n = list ? v->n : 1;
    const ct_config_value *items = list ? v->items : v;
    if (n < 1 || n > CT_REFORMER_MAX_ATTENTION) {
        char text[400];
        binding_text(cfg, name, "attention_type", v, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG, "%s: a list of 1 to %d attention types, got %d", text,
                            CT_REFORMER_MAX_ATTENTION, n);
    }
    // One settings struct per type: every reference to a type must name
    // the same scope.
    const char *ref_of[COUNT(attention_names)] = {0};
    for (int i = 0; i < n; i++) {
        int a = attention_of_ref(&items[i]);
        if (a < 0) return attention_type_refused(cfg, name, v, &items[i], err);
        // ReformerLM calls the type: under a scoped model, in its scope.
        const char *ref = cfg_scoped_ref(cfg, name, items[i].s);
        if (ref_of[a] && strcmp(ref_of[a], ref)) {
            char text[400];
            binding_text(cfg, name, "attention_type", v, text, sizeof text);
            return ct_error_set(err, CT_ERR_ARG,
                                "%s: @%s and @%s are the same type under two scopes; ctrax keeps one setting of each "
                                "type per model",
                                text, ref_of[a], ref);
        }
        ref_of[a] = ref;
        p->attention[i] = (ct_reformer_attention)a;
    }
    p->n_attention = n;
    if (ref_of[CT_REFORMER_SELF_ATTENTION])
        CT_TRY(attention_settings(cfg, p, ref_of[CT_REFORMER_SELF_ATTENTION], CT_REFORMER_SELF_ATTENTION,
                                  &p->self_attention, err));
    if (ref_of[CT_REFORMER_LSH_ATTENTION])
        CT_TRY(attention_settings(cfg, p, ref_of[CT_REFORMER_LSH_ATTENTION], CT_REFORMER_LSH_ATTENTION,
                                  &p->lsh_attention, err));
    return CT_OK;
}

// Its string rows also take a reference to a layer type, as its name:
// Trax's configs write ReformerLM.ff_activation = @trax.layers.FastGelu.
#define CFG_TYPE_REFORMER_INT CFG_TYPE_INT
#define CFG_TYPE_REFORMER_FLOAT CFG_TYPE_FLOAT
#define CFG_TYPE_REFORMER_BOOL CFG_TYPE_BOOL
#define CFG_TYPE_REFORMER_STRING CFG_TYPE_STRING, .ref_kinds = CFG_KIND_BIT(CFG_LAYER_TYPE)
#define REFORMER_ROW(TYPE, ...) ROW(ct_reformer_lm_params, REFORMER_##TYPE, __VA_ARGS__)
// The list's rows, then those whose forms are Trax's references and tuples
// (filled by reformer_lm_fill).
static const cfg_param reformer_lm_params[] = {
    CT_REFORMER_LM_PARAMS(REFORMER_ROW)
    {.name = "attention_type", .type = CFG_ANY, .default_gin = "@SelfAttention",
     .doc = "@SelfAttention (Trax's default: full attention unless SelfAttention.chunk_len), @LSHSelfAttention, "
            "ctrax's @CausalAttention, or a list of them: layer i uses entry i % len (n_layers % len == 0)"},
    {.name = "pos_axial_shape", .type = CFG_LIST, .default_gin = "()",
     .doc = "pos_type 'axial': a tuple of axis lengths whose product is the sequence length"},
    {.name = "pos_d_axial_embs", .type = CFG_LIST, .default_gin = "None", .none_ok = true,
     .doc = "pos_type 'axial': a tuple of per-axis widths, one per axis, summing to d_model"},
    {.name = "axial_pos_shape", .type = CFG_ANY, .default_gin = "()",
     .doc = "Trax's older spelling: 'fixed-base' means pos_type 'fixed-base', a tuple means pos_axial_shape with "
            "pos_type 'axial'"},
    {.name = "d_axial_pos_embs", .type = CFG_LIST, .default_gin = "None", .none_ok = true,
     .doc = "Trax's older spelling of pos_d_axial_embs"},
};
static void reformer_lm_defaults(void *p) { *(ct_reformer_lm_params *)p = ct_reformer_lm_default_params(); }
static ct_layer *reformer_lm_new(const void *p) { return ct_reformer_lm(*(const ct_reformer_lm_params *)p); }

// ct_reformer_lm_check's error ("ReformerLM.param ...") with the place of
// that binding in front.
static ct_status reformer_where(ct_config *cfg, const char *name, ct_error *err) {
    const char *dot = strchr(err->msg, '.');
    char param[64] = {0}, where[300] = {0};
    if (dot && !strncmp(err->msg, "ReformerLM.", 11)) {
        size_t n = strspn(dot + 1, "abcdefghijklmnopqrstuvwxyz_");
        if (n < sizeof param) memcpy(param, dot + 1, n);
        if (param[0]) cfg_where(cfg, name, param, where, sizeof where);
        // Trax's older spellings of the axial tuples.
        if (!where[0] && !strcmp(param, "pos_axial_shape")) cfg_where(cfg, name, "axial_pos_shape", where, sizeof where);
        if (!where[0] && !strcmp(param, "pos_d_axial_embs"))
            cfg_where(cfg, name, "d_axial_pos_embs", where, sizeof where);
        // Axial positions with no tuples: pos_type asked for them.
        if (!where[0] && !strcmp(param, "pos_axial_shape")) cfg_where(cfg, name, "pos_type", where, sizeof where);
    }
    if (!where[0]) return CT_ERR_ARG;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return ct_error_set(err, CT_ERR_ARG, "%s%s", where, msg);
}

static ct_status reformer_lm_check(ct_config *cfg, const char *name, const void *vp, ct_error *err) {
    const ct_reformer_lm_params *p = vp;
    CT_TRY(check_layer_count(cfg, name, p->n_layers, 4, 0, err));
    CT_TRY(check_heads(cfg, name, p->d_model, p->n_heads, err));
    static const char *const fixed[] = {"pos_start_from_zero_prob",
                                        "pos_max_offset_to_add", "ff_sparsity", "loss_sparsity_type",
                                        "loss_sparsity", "loss_d_lowrank", "loss_sparsity_prob",
                                        "attention_chunk_size"};
    for (int i = 0; i < COUNT(fixed); i++)
        CT_TRY(only_default(cfg, name, reformer_lm_params, COUNT(reformer_lm_params), fixed[i], NULL, err));
    CT_TRY(only_default(cfg, name, reformer_lm_params, COUNT(reformer_lm_params), "mode", "'eval'", err));
    if (ct_reformer_lm_check(p, err) != CT_OK) return reformer_where(cfg, name, err);
    return CT_OK;
}

// ---- RNNLM --------------------------------------------------------------------------------
//
// Trax's configs write RNNLM.rnn_cell = @trax.layers.GRUCell: RNNLM calls
// the cell class itself with its n_units. The cells are layer types (as
// ReformerLM's attention types), and RNNLM's string rows take a reference
// to one as its name; a config may also write the string ('GRUCell').
#define CFG_TYPE_RNNLM_INT CFG_TYPE_INT
#define CFG_TYPE_RNNLM_FLOAT CFG_TYPE_FLOAT
#define CFG_TYPE_RNNLM_STRING CFG_TYPE_STRING, .ref_kinds = CFG_KIND_BIT(CFG_LAYER_TYPE)
#define RNNLM_ROW(TYPE, ...) ROW(ct_rnnlm_params, RNNLM_##TYPE, __VA_ARGS__)
static const cfg_param rnnlm_params[] = {CT_RNNLM_PARAMS(RNNLM_ROW)};
static void rnnlm_defaults(void *p) { *(ct_rnnlm_params *)p = ct_rnnlm_default_params(); }
static ct_layer *rnnlm_new(const void *p) { return ct_rnnlm(*(const ct_rnnlm_params *)p); }

// A scoped reference (@s/GRUCell) names the cell GRUCell: the scope has no
// settings to give it.
static ct_status rnnlm_fill(ct_config *cfg, const char *name, void *vp, ct_error *err) {
    (void)cfg, (void)name, (void)err;
    ct_rnnlm_params *p = vp;
    const char *slash = p->rnn_cell ? strrchr(p->rnn_cell, '/') : NULL;
    if (slash) p->rnn_cell = slash + 1;
    return CT_OK;
}

static ct_status rnnlm_check(ct_config *cfg, const char *name, const void *vp, ct_error *err) {
    const ct_rnnlm_params *p = vp;
    const ct_config_value *mode;
    CT_TRY(cfg_query_default(cfg, name, "mode", &mode, err));
    char text[400];
    if (mode->kind != CT_CONFIG_STRING || (strcmp(mode->s, "train") && strcmp(mode->s, "eval"))) {
        binding_text(cfg, name, "mode", mode, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG, "%s is not supported: 'train' or 'eval' (the trainer picks one%s)", text,
                            mode->kind == CT_CONFIG_STRING && !strcmp(mode->s, "predict")
                                ? "; ctrax has no 'predict' mode"
                                : "");
    }
    if (ct_rnnlm_check(p, err) == CT_OK) return CT_OK;
    // ct_rnnlm_check names RNNLM.<param>: put that binding's place in front
    // (an unbound multiplier is wrong for the cell bound).
    static const char *const params[] = {"rnn_cell_d_state_multiplier", "rnn_cell"};
    char where[300] = "";
    for (size_t i = 0; i < sizeof params / sizeof *params && !where[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "RNNLM.%s ", params[i]);
        if (!strstr(err->msg, key)) continue;
        cfg_where(cfg, name, params[i], where, sizeof where);
        if (!where[0]) cfg_where(cfg, name, "rnn_cell", where, sizeof where);
    }
    if (!where[0]) return CT_ERR_ARG;
    char msg[sizeof err->msg];
    snprintf(msg, sizeof msg, "%s", err->msg);
    return ct_error_set(err, CT_ERR_ARG, "%s%s", where, msg);
}

// Trax's MLP(layer_widths=(128, 64), activation_fn=Relu, out_activation=False,
// flatten=True, mode).
// Trax's older MLP(d_hidden=512, n_hidden_layers=2, n_output_classes=10)
// (mlp_mnist.gin) is layer_widths [d_hidden] x n_hidden_layers +
// [n_output_classes]; its closing LogSoftmax is left out, as the newer
// MLP's: cross-entropy and accuracy read logits and log-probabilities alike.
static const cfg_param mlp_params[] = {
    {.name = "layer_widths", .type = CFG_LIST, .default_gin = "[128, 64]", .doc = "widths of the Dense layers"},
    {.name = "activation_fn", .type = CFG_STRING, .ref_kinds = CFG_KIND_BIT(CFG_LAYER_TYPE), .default_gin = "'Relu'",
     .doc = "the activation between the Dense layers: " CT_ACTIVATION_NAMES " (@trax.layers.Tanh or 'Tanh')"},
    {.name = "out_activation", .type = CFG_BOOL, .default_gin = "False",
     .doc = "the activation after the last Dense too"},
    {.name = "flatten", .type = CFG_BOOL, .default_gin = "True", .doc = "flatten all but the batch axis first"},
    {.name = "d_hidden", .type = CFG_INT, .default_gin = "512", .lo = 1, .hi = 1 << 24,
     .doc = "Trax's older MLP: width of each hidden layer"},
    {.name = "n_hidden_layers", .type = CFG_INT, .default_gin = "2", .lo = 0, .hi = CFG_MLP_MAX_LAYERS - 1,
     .doc = "Trax's older MLP: hidden layers (Dense, activation)"},
    {.name = "n_output_classes", .type = CFG_INT, .default_gin = "10", .lo = 1, .hi = 1 << 24,
     .doc = "Trax's older MLP: width of the last Dense"},
};
static const char *const mlp_older[] = {"d_hidden", "n_hidden_layers", "n_output_classes"};

// Trax's older parameters, when one is bound, into w[] and *n; both
// spellings bound is an error naming both.
static ct_status mlp_older_widths(ct_config *cfg, const char *name, int *w, int *n, ct_error *err) {
    *n = 0;
    char where[300] = "", where_widths[300];
    for (int i = 0; i < COUNT(mlp_older) && !where[0]; i++) cfg_where(cfg, name, mlp_older[i], where, sizeof where);
    if (!where[0]) return CT_OK;
    cfg_where(cfg, name, "layer_widths", where_widths, sizeof where_widths);
    if (where_widths[0])
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.layer_widths and %s%s's older d_hidden / n_hidden_layers / n_output_classes "
                            "both give the widths: bind one",
                            where_widths, name, where, name);
    const ct_config_value *d, *h, *c;
    CT_TRY(cfg_query_default(cfg, name, "d_hidden", &d, err));
    CT_TRY(cfg_query_default(cfg, name, "n_hidden_layers", &h, err));
    CT_TRY(cfg_query_default(cfg, name, "n_output_classes", &c, err));
    for (int i = 0; i < h->i; i++) w[(*n)++] = (int)d->i;
    w[(*n)++] = (int)c->i;
    return CT_OK;
}

const char *cfg_mlp_widths_param(ct_config *cfg, const char *name) {
    char where[300];
    for (int i = 0; i < COUNT(mlp_older); i++) {
        cfg_where(cfg, name, mlp_older[i], where, sizeof where);
        if (where[0]) return mlp_older[i];
    }
    return "layer_widths";
}

// The MLP's widths from either spelling into w[] (CFG_MLP_MAX_LAYERS), *n of them.
ct_status cfg_mlp_widths(ct_config *cfg, const char *name, int *w, int *n, ct_error *err) {
    CT_TRY(mlp_older_widths(cfg, name, w, n, err));
    if (*n) return CT_OK;
    const ct_config_value *widths;
    CT_TRY(cfg_query_default(cfg, name, "layer_widths", &widths, err));
    if (widths->n < 1 || widths->n > CFG_MLP_MAX_LAYERS)
        return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.layer_widths must hold 1 to %d widths, got %d",
                            widths->file, widths->line, widths->col, name, CFG_MLP_MAX_LAYERS, widths->n);
    for (int i = 0; i < widths->n; i++) {
        const ct_config_value *it = &widths->items[i];
        if (it->kind != CT_CONFIG_INT || it->i < 1 || it->i > (1 << 24)) {
            char *text = ct_config_value_to_gin(it);
            ct_status st =
                ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.layer_widths[%d] must be an int in [1, %d], got %.60s",
                             it->file, it->line, it->col, name, i, 1 << 24, text);
            ct_free(text);
            return st;
        }
        w[i] = (int)it->i;
    }
    *n = widths->n;
    return CT_OK;
}

static ct_status build_mlp(ct_config *cfg, const char *name, ct_layer **out, ct_error *err) {
    const ct_config_value *out_activation, *flatten;
    ct_activation_fn activation;
    CT_TRY(activation_of(cfg, name, "activation_fn", &activation, err));
    CT_TRY(cfg_query_default(cfg, name, "out_activation", &out_activation, err));
    CT_TRY(cfg_query_default(cfg, name, "flatten", &flatten, err));
    int w[CFG_MLP_MAX_LAYERS], n;
    CT_TRY(cfg_mlp_widths(cfg, name, w, &n, err));
    *out = ct_mlp(n, w, activation, out_activation->b, flatten->b);
    return CT_OK;
}

// ---- Optimizers ---------------------------------------------------------------------------

// An optimizer's rows (from its list) and its two wrappers: its defaults into
// a buffer, and its constructor from one.
#define OPTIMIZER(x, rows)                                                                   \
    static const cfg_param x##_params[] = {rows};                                            \
    static void x##_defaults(void *p) { *(ct_##x##_params *)p = ct_##x##_default_params(); } \
    static ct_optimizer *x##_new(const void *p) { return ct_##x##_new(*(const ct_##x##_params *)p); }

#define SGD_ROW(...) ROW(ct_sgd_params, __VA_ARGS__)
#define ADAM_ROW(...) ROW(ct_adam_params, __VA_ARGS__)
#define MOMENTUM_ROW(...) ROW(ct_momentum_params, __VA_ARGS__)
#define RMSPROP_ROW(...) ROW(ct_rmsprop_params, __VA_ARGS__)
#define ADAFACTOR_ROW(...) ROW(ct_adafactor_params, __VA_ARGS__)
#define SM3_ROW(...) ROW(ct_sm3_params, __VA_ARGS__)
OPTIMIZER(sgd, CT_SGD_PARAMS(SGD_ROW))
OPTIMIZER(adam, CT_ADAM_PARAMS(ADAM_ROW))
OPTIMIZER(momentum, CT_MOMENTUM_PARAMS(MOMENTUM_ROW))
OPTIMIZER(rmsprop, CT_RMSPROP_PARAMS(RMSPROP_ROW))
OPTIMIZER(adafactor, CT_ADAFACTOR_PARAMS(ADAFACTOR_ROW))
OPTIMIZER(sm3, CT_SM3_PARAMS(SM3_ROW))
_Static_assert(sizeof(ct_sm3_momentum_type) == sizeof(int), "SM3's momentum_type is read as a C int");

// Trax's momentum_in_bfloat16 and weight_decay_n_steps are accepted at the
// values that mean what ctrax does (float32 momentum, decay every step).
static ct_status adafactor_check(ct_config *cfg, const char *name, const void *p, ct_error *err) {
    (void)p;
    const ct_config_value *bf16, *n_steps;
    CT_TRY(cfg_query_default(cfg, name, "momentum_in_bfloat16", &bf16, err));
    CT_TRY(cfg_query_default(cfg, name, "weight_decay_n_steps", &n_steps, err));
    char where[300];
    if (bf16->kind == CT_CONFIG_BOOL && bf16->b) {
        cfg_where(cfg, name, "momentum_in_bfloat16", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.momentum_in_bfloat16 = True is not supported: ctrax keeps momentum in float32 "
                            "(write False or leave it out)",
                            where, name);
    }
    if (n_steps->kind == CT_CONFIG_INT && n_steps->i != 0) {
        cfg_where(cfg, name, "weight_decay_n_steps", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.weight_decay_n_steps = %lld is not supported: ctrax decays weights at every step "
                            "(write 0 or leave it out)",
                            where, name, (long long)n_steps->i);
    }
    return CT_OK;
}

// ---- Schedules ------------------------------------------------------------------------------

#define MULTIFACTOR_ROW(...) ROW(ct_multifactor_params, __VA_ARGS__)
static const cfg_param multifactor_params[] = {CT_MULTIFACTOR_PARAMS(MULTIFACTOR_ROW)};
static void multifactor_defaults(void *p) { *(ct_multifactor_params *)p = ct_multifactor_default_params(); }
static ct_status multifactor_new(const void *p, ct_schedule **out, ct_error *err) {
    return ct_schedule_multifactor(p, out, err);
}

// Trax's warmup(n_warmup_steps, max_value), warmup_and_rsqrt_decay and
// constant(value) take no defaults.
#define WARMUP_PARAMS(X)                                          \
    X(INT64, n_warmup_steps, 0, AT_LEAST(0), REQUIRED, NULL) \
    X(DOUBLE, max_value, 0.0, ANY, REQUIRED, NULL)
typedef struct warmup_cfg {
    WARMUP_PARAMS(CT_PARAM_FIELD)
} warmup_cfg;
#define WARMUP_ROW(...) ROW(warmup_cfg, __VA_ARGS__)
static const cfg_param warmup_params[] = {WARMUP_PARAMS(WARMUP_ROW)};
static void warmup_defaults(void *p) { *(warmup_cfg *)p = (warmup_cfg){WARMUP_PARAMS(CT_PARAM_DEFAULT)}; }
static ct_status warmup_new(const void *vp, ct_schedule **out, ct_error *err) {
    const warmup_cfg *p = vp;
    return ct_schedule_warmup(p->n_warmup_steps, p->max_value, out, err);
}
static ct_status warmup_and_rsqrt_decay_new(const void *vp, ct_schedule **out, ct_error *err) {
    const warmup_cfg *p = vp;
    return ct_schedule_warmup_and_rsqrt_decay(p->n_warmup_steps, p->max_value, out, err);
}

#define CONSTANT_PARAMS(X) X(DOUBLE, value, 0.0, ANY, REQUIRED, NULL)
typedef struct constant_cfg {
    CONSTANT_PARAMS(CT_PARAM_FIELD)
} constant_cfg;
#define CONSTANT_ROW(...) ROW(constant_cfg, __VA_ARGS__)
static const cfg_param constant_params[] = {CONSTANT_PARAMS(CONSTANT_ROW)};
static void constant_defaults(void *p) { *(constant_cfg *)p = (constant_cfg){CONSTANT_PARAMS(CT_PARAM_DEFAULT)}; }
static ct_status constant_new(const void *p, ct_schedule **out, ct_error *err) {
    return ct_schedule_constant(((const constant_cfg *)p)->value, out, err);
}

// ---- Inputs (built in inputs.c; Trax's names where Trax has the same thing) ------------------
//
// Lists of gin defaults (UNSTORED) and required parameters (ASKED): the
// builders query them one by one, there is no struct.
#define INPUT_ROW(...) ROW(void, __VA_ARGS__)
#define PAD_TO_MULTIPLE(X)                                                                                        \
    X(INT, pad_to_multiple, "32", RANGE(1, 1 << 20), UNSTORED,                                                   \
      "round the padded length up to a multiple of this (Trax's default, 32; 1: no rounding)")                    \
    X(INT, batch_size, "None", RANGE(1, 1 << 24), UNSTORED_NULLABLE,                                             \
      "examples per batch of each process, as Trax sets it per host (the step's batch is this x "               \
      "train.n_processes); None: train.batch_size (binding both differently is an error)")

// Trax's trax.data.sequence_copy_inputs.
#define COPY_INPUTS_PARAMS(X)                                                                                     \
    X(INT, vocab_size, NULL, RANGE(2, 1 << 30), ASKED, "tokens 0..vocab_size-1; 0 is the separator")             \
    X(INT, train_length, NULL, RANGE(2, 1 << 20), ASKED, "training w has 1..train_length-1 tokens (as Trax)")     \
    X(INT, train_min_length, "1", RANGE(1, 1 << 20), UNSTORED, "the shortest training w (ctrax's; Trax's is always 1)") \
    X(INT, eval_min_length, NULL, RANGE(1, 1 << 20), ASKED,                                                      \
      "eval w has eval_min_length..eval_max_length-1 tokens (as Trax)")                                          \
    X(INT, eval_max_length, NULL, RANGE(2, 1 << 20), ASKED, "must be > eval_min_length")                          \
    X(BOOL, reverse, "False", ANY, UNSTORED, "the second w reversed")                                            \
    PAD_TO_MULTIPLE(X)
static const cfg_param copy_inputs_params[] = {COPY_INPUTS_PARAMS(INPUT_ROW)};

// Trax's trax.data.addition_inputs.
#define ADDITION_INPUTS_PARAMS(X)                                                                                 \
    X(INT, vocab_size, NULL, RANGE(5, 1 << 30), ASKED, "digits in base vocab_size - 3, '+', <S>, and 0 for padding") \
    X(INT, train_length, NULL, RANGE(3, 100000), ASKED, "longest training example: 3..train_length (as Trax)")    \
    X(INT, eval_min_length, NULL, RANGE(3, 100000), ASKED, "eval examples: eval_min_length..eval_max_length")      \
    X(INT, eval_max_length, NULL, RANGE(3, 100000), ASKED, "must be >= eval_min_length")                          \
    PAD_TO_MULTIPLE(X)                                                                                            \
    X(BOOL, encdec, "False", ANY, UNSTORED,                                                                       \
      "only False: True makes (x + y, sum) pairs for an encoder-decoder (Trax's Reformer2), which ctrax does not have")
static const cfg_param addition_inputs_params[] = {ADDITION_INPUTS_PARAMS(INPUT_ROW)};

// Chunks of files (TextInputs, TokenInputs); ctrax's (Trax reads text
// through TFDS).
#define CORPUS_PARAMS(X)                                                                                          \
    X(LIST, paths, NULL, ANY, ASKED,                                                                              \
      "files and directories (read recursively, sorted), relative to the working directory")                      \
    X(INT, seq_len, "128", RANGE(1, 1 << 24), UNSTORED, "tokens per example")                                    \
    X(FLOAT, eval_fraction, "0.05", UNIT_OPEN, UNSTORED, "share of the chunks held out for eval (0: no eval stream)") \
    X(INT, split_seed, "0", AT_LEAST(0), UNSTORED, "decides which chunks are eval; independent of the run's seed")  \
    X(INT, shuffle_buffer, "0", RANGE(0, 1 << 24), UNSTORED,                                                      \
      "0: every training epoch is a full permutation; K > 0: a shuffle buffer of K instead")                      \
    X(BOOL, shifted, "False", ANY, UNSTORED,                                                                      \
      "targets are the inputs shifted left (False for models that shift right themselves)")
static const cfg_param text_inputs_params[] = {CORPUS_PARAMS(INPUT_ROW)};
// Binary token files.
#define TOKEN_INPUTS_PARAMS(X)                                                                                    \
    CORPUS_PARAMS(X)                                                                                              \
    X(INT, token_bytes, "2", RANGE(2, 4), UNSTORED, "2 (uint16) or 4 (uint32)")                                  \
    X(INT, vocab_size, "0", AT_LEAST(0), UNSTORED, "> 0: every token must be below it (checked as it is read)")
static const cfg_param token_inputs_params[] = {TOKEN_INPUTS_PARAMS(INPUT_ROW)};

// IDX files; ctrax's (Trax reads MNIST through TFDS).
#define IDX_INPUTS_PARAMS(X)                                                                                      \
    X(STRING, train_images, NULL, ANY, ASKED, "IDX images (3 dims), .gz or plain")                               \
    X(STRING, train_labels, NULL, ANY, ASKED, "IDX labels (1 dim)")                                              \
    X(STRING, eval_images, NULL, ANY, ASKED, NULL)                                                               \
    X(STRING, eval_labels, NULL, ANY, ASKED, NULL)                                                               \
    X(INT, n_classes, "10", RANGE(1, 256), UNSTORED, "every label must be below it")                             \
    X(BOOL, shuffle, "True", ANY, UNSTORED, "shuffle every training epoch")
static const cfg_param idx_inputs_params[] = {IDX_INPUTS_PARAMS(INPUT_ROW)};

// Trax's batcher (trax.data.inputs) and data_streams (trax.data.tf_inputs):
// see cfg_build_batcher_inputs for the dataset names ctrax has. Every
// parameter of Trax's batcher is a row, so that a Trax config whose
// train.inputs is another input reads (its batcher lines are then unread,
// as in Trax, which never calls batcher); the ones that would change the
// batches are refused when batcher runs. data_streams' preprocess_fn and
// bare_preprocess_fn are not rows: their values are Trax's TFDS functions,
// which ctrax refuses by name.
#define BATCHER_PARAMS(X)                                                                                         \
    X(REF(SETTINGS), data_streams, "@data_streams", ANY, UNSTORED, "@data_streams (Trax's gin.REQUIRED)")         \
    X(INT, batch_size_per_device, "32", RANGE(1, 1 << 24), UNSTORED,                                              \
      "per device: the step's batch is this x train.n_devices x train.n_processes")                                 \
    X(INT, batch_size, "None", RANGE(1, 1 << 24), UNSTORED_NULLABLE,                                             \
      "per process (Trax's per host), rounded down to a multiple of train.n_devices; None: "                     \
      "batch_size_per_device x train.n_devices")                                                                  \
    X(INT, eval_batch_size, "32", RANGE(1, 1 << 24), UNSTORED,                                                    \
      "per process, rounded down to a multiple of train.n_devices; the eval batch is it x train.n_processes")      \
    X(BOOL, variable_shapes, "True", ANY, UNSTORED,                                                               \
      "no effect: the datasets ctrax has here are of one shape (Trax buckets variable lengths)")                 \
    X(INT, bucket_length, "32", RANGE(1, 1 << 30), UNSTORED,                                                      \
      "no effect: Trax's length buckets for variable-length examples; ctrax's are of one shape")                \
    X(INT, max_eval_length, "None", RANGE(1, 1 << 30), UNSTORED_NULLABLE,                                         \
      "no effect: the last of Trax's eval length buckets; ctrax's examples are of one shape")                   \
    X(BOOL, buckets_include_inputs_in_length, "False", ANY, UNSTORED,                                             \
      "no effect: how Trax measures an example for its length buckets")                                         \
    X(BOOL, strict_pad_on_len, "False", ANY, UNSTORED, "no effect: how Trax pads within explicit buckets")        \
    X(LIST, buckets, "None", ANY, UNSTORED_NULLABLE,                                                              \
      "only None: explicit buckets ([lengths], [batch sizes]) set other batch sizes, which ctrax does not do")   \
    X(INT, batch_shuffle_size, "None", RANGE(1, 1 << 30), UNSTORED_NULLABLE,                                      \
      "only None: ctrax shuffles examples each epoch, not batches")                                             \
    X(INT, id_to_mask, "None", ANY, UNSTORED_NULLABLE,                                                            \
      "only None: Trax gives targets equal to it weight 0; ctrax's batcher weights every example 1")
static const cfg_param batcher_params[] = {BATCHER_PARAMS(INPUT_ROW)};
#define DATA_STREAMS_PARAMS(X)                                                                                    \
    X(STRING, dataset_name, "None", ANY, UNSTORED_NULLABLE, "'mnist' or 'fashion_mnist' (IDX files in data_dir)") \
    X(STRING, data_dir, "None", ANY, UNSTORED_NULLABLE, "the directory of the dataset's files")                  \
    X(INT, shuffle_buffer_size, "1024", RANGE(1, 1 << 30), UNSTORED,                                              \
      "no effect: ctrax shuffles each training epoch as a whole permutation")                                    \
    X(INT, eval_holdout_size, "0", AT_LEAST(0), UNSTORED, "only 0: the eval data are the test files")          \
    X(STRING, input_name, "None", ANY, UNSTORED_NULLABLE,                                                         \
      "only None: a TFDS feature's name; ctrax's IDX data are images and labels")                               \
    X(STRING, target_name, "None", ANY, UNSTORED_NULLABLE,                                                        \
      "only None: a TFDS feature's name; ctrax's IDX data are images and labels")
static const cfg_param data_streams_params[] = {DATA_STREAMS_PARAMS(INPUT_ROW)};

// ---- Settings the program reads (lists in config.h) --------------------------------------

#define TRAIN_ROW(...) ROW(ct_train_settings, __VA_ARGS__)
static const cfg_param train_params[] = {CT_TRAIN_SETTINGS(TRAIN_ROW)};
static void train_defaults(void *p) { *(ct_train_settings *)p = ct_train_default_settings(); }

// Trax's older train.lr_schedule (a call, @constant()) is lr_schedule_fn
// (@constant); binding both is an error naming both.
static ct_status train_schedule_fill(ct_config *cfg, const char *name, ct_train_settings *t, ct_error *err) {
    // lr_schedule_fn: unbound is Trax's default (multifactor); None, which
    // would keep that default, means no schedule: the optimizer's own rate.
    const ct_config_value *lr, *old;
    CT_TRY(cfg_query_default(cfg, name, "lr_schedule_fn", &lr, err));
    if (lr->kind == CT_CONFIG_NONE) t->lr_schedule_fn = NULL;
    CT_TRY(cfg_query_default(cfg, name, "lr_schedule", &old, err));
    if (old->kind == CT_CONFIG_NONE) return CT_OK;
    char where_fn[300];
    cfg_where(cfg, name, "lr_schedule_fn", where_fn, sizeof where_fn);
    bool same = lr->kind == CT_CONFIG_REFERENCE && !strcmp(lr->s, old->s);
    if (where_fn[0] && !same) {
        char text[400];
        binding_text(cfg, name, "lr_schedule", old, text, sizeof text);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s and %s%s.lr_schedule_fn are two spellings of one setting (the first is Trax's older "
                            "one): bind one",
                            text, where_fn, name);
    }
    t->lr_schedule_fn = old->s;
    // The operative config says the schedule used in both spellings (one
    // schedule: it reads back).
    cfg_record_value(cfg, name, "lr_schedule_fn", old);
    return CT_OK;
}

// Trax's batcher sets each host's batch size as batch_size_per_device x
// its devices, or batch_size when that is bound, rounded as its batch_fn
// rounds it: down to a multiple of the devices, at least one row each (30 on
// 4 devices is 28), so that every device takes equal rows. The step's batch
// is that x the processes. *v is the bound batch_size (NULL:
// batch_size_per_device's).
static ct_status batcher_batch_size(ct_config *cfg, const char *inputs, const ct_train_settings *t, int64_t *out,
                                    const ct_config_value **v, ct_error *err) {
    const ct_config_value *bs, *per;
    CT_TRY(cfg_query_default(cfg, inputs, "batch_size", &bs, err));
    CT_TRY(cfg_query_default(cfg, inputs, "batch_size_per_device", &per, err));
    *v = bs->kind == CT_CONFIG_NONE ? NULL : bs;
    int64_t host = *v ? bs->i : per->i * t->n_devices;
    host = (host / t->n_devices > 1 ? host / t->n_devices : 1) * t->n_devices;
    *out = host * t->n_processes;
    return CT_OK;
}

// The train settings a row alone cannot give. Trax sets the batch size on
// its inputs (sequence_copy_inputs.batch_size, batcher.batch_size_per_device)
// for each host: bound there, that x train.n_processes is the run's batch
// size; train.batch_size (ctrax's: the whole step's) bound to another value
// too is an error naming both. With train.inputs unbound,
// a bound data_streams.dataset_name means Trax's default inputs, @batcher.
static ct_status train_fill(ct_config *cfg, const char *name, void *vp, ct_error *err) {
    ct_train_settings *t = vp;
    CT_TRY(train_schedule_fill(cfg, name, t, err));
    const ct_config_value *graphs;
    CT_TRY(cfg_query_default(cfg, name, "save_graphs", &graphs, err));  // no effect: read so it is not "unread"
    char where_ds[300];
    cfg_where(cfg, "data_streams", "dataset_name", where_ds, sizeof where_ds);
    if (!t->inputs && where_ds[0]) t->inputs = "batcher";
    if (!t->inputs) return CT_OK;
    const char *slash = strrchr(t->inputs, '/');
    char why[256];
    const cfg_def *d = cfg_lookup(slash ? slash + 1 : t->inputs, why, sizeof why);
    if (!d || !cfg_def_param(d, "batch_size")) return CT_OK;
    const ct_config_value *v;
    int64_t batch_size;
    const char *param = "batch_size";
    if (d->build_inputs == cfg_build_batcher_inputs) {
        CT_TRY(batcher_batch_size(cfg, t->inputs, t, &batch_size, &v, err));
        if (!v) param = "batch_size_per_device";
    } else {
        CT_TRY(cfg_query_default(cfg, t->inputs, "batch_size", &v, err));
        if (v->kind == CT_CONFIG_NONE) return CT_OK;
        batch_size = v->i * t->n_processes;
    }
    char where_in[300], where_train[300];
    cfg_where(cfg, t->inputs, param, where_in, sizeof where_in);
    cfg_where(cfg, name, "batch_size", where_train, sizeof where_train);
    if (where_train[0] && t->batch_size != batch_size) {
        char value[120];
        int64_t per = batch_size / t->n_processes;
        int n = v ? snprintf(value, sizeof value, "%lld", (long long)per)
                  : snprintf(value, sizeof value, "%lld (x %lld devices", (long long)(per / t->n_devices),
                             (long long)t->n_devices);
        if (t->n_processes > 1)
            n += snprintf(value + n, sizeof value - (size_t)n, "%sx %lld processes", v ? " (" : " ",
                          (long long)t->n_processes);
        if (!v || t->n_processes > 1) snprintf(value + n, sizeof value - (size_t)n, ": %lld)", (long long)batch_size);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.%s = %s and %s%s.batch_size = %lld set the batch size differently: bind one "
                            "(Trax's configs set it on the inputs)",
                            where_in, t->inputs, param, value, where_train, name, (long long)t->batch_size);
    }
    t->batch_size = batch_size;
    // The operative config says what was used, and reads back without a
    // conflict (with train.n_processes, which it records too).
    cfg_record_int(cfg, name, "batch_size", batch_size);
    return CT_OK;
}

#define LOOP_ROW(...) ROW(ct_loop_settings, __VA_ARGS__)
_Static_assert(CT_LOOP_HISTORY_MAX_DEFAULT == 4096, "Loop.history_max's default (CT_LOOP_SETTINGS) is the Loop's");
static const cfg_param loop_params[] = {CT_LOOP_SETTINGS(LOOP_ROW)};
static void loop_defaults(void *p) { *(ct_loop_settings *)p = ct_loop_default_settings(); }

// Trax's train() gives its task n_steps_per_checkpoint = eval_frequency:
// unbound here, the period is train.eval_frequency (the default 100 when
// that is 0, which has no period to give).
static ct_status loop_fill(ct_config *cfg, const char *name, void *vp, ct_error *err) {
    ct_loop_settings *l = vp;
    char where[300];
    if (l->history_max == 0) {
        cfg_where(cfg, name, "history_max", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.history_max = 0 would keep no metric history: give the rows to keep (>= 1; the "
                            "default is %d) or -1 to keep every row",
                            where, name, CT_LOOP_HISTORY_MAX_DEFAULT);
    }
    cfg_where(cfg, name, "n_steps_per_checkpoint", where, sizeof where);
    if (where[0]) return CT_OK;
    const ct_config_value *every;
    CT_TRY(cfg_query_default(cfg, "train", "eval_frequency", &every, err));
    if (every->i <= 0) return CT_OK;
    l->n_steps_per_checkpoint = every->i;
    cfg_record_value(cfg, name, "n_steps_per_checkpoint", every);
    return CT_OK;
}

// ---- Losses with parameters ------------------------------------------------------------------

#define WCCE_ROW(...) ROW(ct_weighted_category_cross_entropy_params, __VA_ARGS__)
static const cfg_param wcce_params[] = {CT_WEIGHTED_CATEGORY_CROSS_ENTROPY_PARAMS(WCCE_ROW)};
static void wcce_defaults(void *p) {
    *(ct_weighted_category_cross_entropy_params *)p = ct_weighted_category_cross_entropy_default_params();
}
static ct_layer *wcce_new(const void *p) {
    return ct_weighted_category_cross_entropy_new(*(const ct_weighted_category_cross_entropy_params *)p);
}

// ---- The table ----------------------------------------------------------------------------

#define PARAMS(a) .params = (a), .n_params = COUNT(a)
#define LOSS(n, fn, d) {.name = (n), .kind = CFG_LAYER, .modules = "trax.layers", .make_layer = (fn), .doc = (d)}

static const cfg_def registry[] = {
    {.name = "TransformerLM", .kind = CFG_MODEL, .modules = "trax.models", PARAMS(transformer_lm_params),
     .struct_size = sizeof(ct_transformer_lm_params), .defaults = transformer_lm_defaults,
     .fill = transformer_lm_fill, .check = transformer_lm_check, .new_layer = transformer_lm_new,
     .plan = cfg_plan_transformer_lm,
     .doc = "decoder-only Transformer language model: int32 tokens (B, T) -> logits (B, T, vocab_size)"},
    {.name = "ReformerLM", .kind = CFG_MODEL, .modules = "trax.models trax.models.reformer",
     PARAMS(reformer_lm_params), .struct_size = sizeof(ct_reformer_lm_params), .defaults = reformer_lm_defaults,
     .check = reformer_lm_check, .fill = reformer_lm_fill, .new_layer = reformer_lm_new, .plan = cfg_plan_reformer_lm,
     .doc = "reversible decoder-only language model: int32 tokens (B, T) -> logits (B, T, vocab_size)"},
    // The attention types ReformerLM.attention_type names: bound as Trax's
    // configs bind them, built only inside ReformerLM.
    {.name = "CausalAttention", .kind = CFG_LAYER_TYPE, .modules = "trax.layers",
     .doc = "ctrax's full causal attention (d_model / n_heads per head); no settings: ReformerLM passes them"},
    {.name = "SelfAttention", .kind = CFG_LAYER_TYPE, .modules = "trax.layers trax.layers.research.efficient_attention",
     PARAMS(self_attention_params), .struct_size = sizeof(ct_self_attention_params),
     .defaults = self_attention_defaults, .check = self_attention_check,
     .doc = "Trax's SelfAttention: full, or local over chunks (chunk_len)"},
    {.name = "LSHSelfAttention", .kind = CFG_LAYER_TYPE,
     .modules = "trax.layers trax.layers.research.efficient_attention", PARAMS(lsh_self_attention_params),
     .struct_size = sizeof(ct_lsh_self_attention_params), .defaults = lsh_self_attention_defaults,
     .fill = lsh_self_attention_fill, .check = lsh_self_attention_check,
     .doc = "Trax's LSHSelfAttention: shared-QK attention within hash buckets, chunked after sorting"},
    {.name = "RNNLM", .kind = CFG_MODEL, .modules = "trax.models trax.models.rnn", PARAMS(rnnlm_params),
     .struct_size = sizeof(ct_rnnlm_params), .defaults = rnnlm_defaults, .fill = rnnlm_fill, .check = rnnlm_check,
     .new_layer = rnnlm_new, .plan = cfg_plan_rnnlm,
     .doc = "Trax's RNNLM: embedding, stacked GRU or LSTM cells scanned over T, Dense: int32 (B, T) -> logits "
            "(B, T, vocab_size)"},
    {.name = "GRUCell", .kind = CFG_LAYER_TYPE, .modules = "trax.layers trax.layers.rnn",
     .doc = "Trax's GRUCell, as RNNLM.rnn_cell names it (RNNLM passes n_units = d_model)"},
    {.name = "LSTMCell", .kind = CFG_LAYER_TYPE, .modules = "trax.layers trax.layers.rnn",
     .doc = "Trax's LSTMCell, as RNNLM.rnn_cell names it (RNNLM passes n_units = d_model)"},
    // The activations models name (ReformerLM.ff_activation,
    // TransformerLM.ff_activation, MLP.activation_fn), built only inside them.
    {.name = "Relu", .kind = CFG_LAYER_TYPE, .modules = "trax.layers", .doc = "max(x, 0), as a model's activation"},
    {.name = "Gelu", .kind = CFG_LAYER_TYPE, .modules = "trax.layers",
     .doc = "Trax's Gelu (the exact erf form), as a model's activation"},
    {.name = "FastGelu", .kind = CFG_LAYER_TYPE, .modules = "trax.layers",
     .doc = "Trax's FastGelu (the tanh form), as a model's activation"},
    {.name = "Tanh", .kind = CFG_LAYER_TYPE, .modules = "trax.layers", .doc = "tanh(x), as a model's activation"},
    {.name = "Sigmoid", .kind = CFG_LAYER_TYPE, .modules = "trax.layers",
     .doc = "1 / (1 + exp(-x)), as a model's activation"},
    {.name = "MLP", .kind = CFG_MODEL, .modules = "trax.models", PARAMS(mlp_params), .build_layer = build_mlp,
     .plan = cfg_plan_mlp,
     .doc = "Dense layers with an activation (Relu) between them: (B, ...) -> (B, last width)"},

    {.name = "SGD", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(sgd_params),
     .struct_size = sizeof(ct_sgd_params), .defaults = sgd_defaults, .new_optimizer = sgd_new, .doc = "w -= lr * g"},
    {.name = "Adam", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(adam_params),
     .struct_size = sizeof(ct_adam_params), .defaults = adam_defaults, .new_optimizer = adam_new,
     .doc = "Adam with Trax's bias correction and decoupled weight decay"},

    {.name = "WeightedCategoryCrossEntropy", .kind = CFG_LAYER, .modules = "trax.layers", PARAMS(wcce_params),
     .struct_size = sizeof(ct_weighted_category_cross_entropy_params), .defaults = wcce_defaults,
     .new_layer = wcce_new, .doc = "[logits, targets, weights] -> sum(ce * w) / sum(w), optionally label-smoothed"},
    LOSS("CrossEntropyLoss", ct_cross_entropy_loss, "[log_probs, targets, weights] -> sum(-log p * w) / sum(w)"),
    LOSS("CategoryAccuracy", ct_category_accuracy, "[outputs, targets] -> mean(argmax == target)"),
    LOSS("WeightedCategoryAccuracy", ct_weighted_category_accuracy,
         "[outputs, targets, weights] -> sum((argmax == target) * w) / sum(w)"),
    {.name = "SequenceAccuracy", .aliases = "MaskedSequenceAccuracy", .kind = CFG_LAYER, .modules = "trax.layers",
     .make_layer = ct_sequence_accuracy,
     .doc = "fraction of sequences right at every weighted position (Trax's MaskedSequenceAccuracy)"},
    LOSS("L2Loss", ct_l2_loss, "[outputs, targets, weights] -> sum(w * (o - t)^2) / sum(w)"),
    LOSS("BinaryCrossEntropy", ct_binary_cross_entropy,
         "[logits, targets 0/1] -> mean(-(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))))"),

    {.name = "Momentum", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(momentum_params),
     .struct_size = sizeof(ct_momentum_params), .defaults = momentum_defaults, .new_optimizer = momentum_new,
     .doc = "SGD with (Nesterov) momentum and decoupled weight decay"},
    {.name = "RMSProp", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(rmsprop_params),
     .struct_size = sizeof(ct_rmsprop_params), .defaults = rmsprop_defaults, .new_optimizer = rmsprop_new,
     .doc = "RMSProp as Trax (the mean square starts at 1)"},
    {.name = "Adafactor", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(adafactor_params),
     .struct_size = sizeof(ct_adafactor_params), .defaults = adafactor_defaults, .check = adafactor_check,
     .new_optimizer = adafactor_new, .doc = "Adafactor: factored second moments for weights of rank >= 2"},
    {.name = "SM3", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(sm3_params),
     .struct_size = sizeof(ct_sm3_params), .defaults = sm3_defaults, .new_optimizer = sm3_new,
     .doc = "SM3: second moments over covers of each dim"},

    {.name = "multifactor", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr",
     PARAMS(multifactor_params), .struct_size = sizeof(ct_multifactor_params), .defaults = multifactor_defaults,
     .new_schedule = multifactor_new, .doc = "product of factors: constant, linear_warmup, rsqrt_decay, ..."},
    {.name = "warmup", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr", PARAMS(warmup_params),
     .struct_size = sizeof(warmup_cfg), .defaults = warmup_defaults, .new_schedule = warmup_new,
     .doc = "step / (n + 1) * max up to n, then max"},
    {.name = "warmup_and_rsqrt_decay", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr",
     PARAMS(warmup_params), .struct_size = sizeof(warmup_cfg), .defaults = warmup_defaults,
     .new_schedule = warmup_and_rsqrt_decay_new, .doc = "warmup, then max * sqrt(n + 1) / sqrt(step)"},
    {.name = "constant", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr",
     PARAMS(constant_params), .struct_size = sizeof(constant_cfg), .defaults = constant_defaults,
     .new_schedule = constant_new, .doc = "the same learning rate every step"},

    {.name = "sequence_copy_inputs", .aliases = "CopyInputs", .kind = CFG_INPUT,
     .modules = "trax.data trax.supervised.inputs", PARAMS(copy_inputs_params), .build_inputs = cfg_build_copy_inputs,
     .doc = "the copy task '0 w 0 w' (loss on the second w), padded to one fixed length"},
    {.name = "addition_inputs", .kind = CFG_INPUT, .modules = "trax.data trax.supervised.inputs",
     PARAMS(addition_inputs_params), .build_inputs = cfg_build_addition_inputs,
     .doc = "'<S> x + y <S> (x+y)' in base vocab_size - 3 (loss on the sum), padded to one fixed length"},
    {.name = "TextInputs", .kind = CFG_INPUT, PARAMS(text_inputs_params), .build_inputs = cfg_build_text_inputs,
     .doc = "byte-level text (vocabulary 256) from files and directories, with a train/eval split"},
    {.name = "TokenInputs", .kind = CFG_INPUT, PARAMS(token_inputs_params), .build_inputs = cfg_build_token_inputs,
     .doc = "binary token files (uint16 or uint32, little-endian), with a train/eval split"},
    {.name = "IDXInputs", .kind = CFG_INPUT, PARAMS(idx_inputs_params), .build_inputs = cfg_build_idx_inputs,
     .doc = "IDX images and labels (MNIST, Fashion-MNIST): images f32 (B, rows, cols) / 255, labels int32 (B)"},

    {.name = "batcher", .kind = CFG_INPUT, .modules = "trax.data trax.data.inputs trax.supervised.inputs",
     PARAMS(batcher_params), .build_inputs = cfg_build_batcher_inputs,
     .doc = "Trax's default inputs: batches of data_streams' dataset (ctrax: 'mnist' / 'fashion_mnist' IDX files)"},
    {.name = "data_streams", .kind = CFG_SETTINGS,
     .modules = "trax.data trax.data.tf_inputs trax.supervised.tf_inputs trax.supervised.inputs",
     PARAMS(data_streams_params), .doc = "the dataset batcher reads: a name and a directory of local files"},

    {.name = "train", .kind = CFG_SETTINGS, .modules = "trax.supervised.trainer_lib trax.supervised",
     PARAMS(train_params), .struct_size = sizeof(ct_train_settings), .defaults = train_defaults, .fill = train_fill,
     .doc = "what `ctrax train` trains, with what, for how long"},
    {.name = "Loop", .kind = CFG_SETTINGS, .modules = "trax.supervised.training", PARAMS(loop_params),
     .struct_size = sizeof(ct_loop_settings), .defaults = loop_defaults, .fill = loop_fill,
     .doc = "the training loop's checkpoint periods and the metric history it keeps"},
};

// ---- Trax's names ctrax does not have -------------------------------------------------
//
// Names of Trax's shipped configs (trax/supervised/configs) that ctrax does
// not implement, so that the error says so and what to use instead rather
// than suggesting the nearest ctrax name (SkippingTransformerLM is not
// TransformerLM).

static const char *const missing_models[] = {
    "Reformer", "Reformer2", "ReformerNoEncDecAttention", "ReformerShortenLM", "SkippingTransformerLM",
    "Transformer", "TransformerEncoder", "TransformerNoEncDecAttention", "LayerDropTransformerLM",
    "EveryOtherLayerDropTransformerLM", "ConfigurableTransformer", "ConfigurableTransformerLM",
    "ConfigurableTerraformer", "HourglassLM", "RelformerLM", "FunnelTransformer", "FunnelTransformerLM", "BERT",
    "Resnet50", "WideResnet", "LSTMSeq2SeqAttn", "ResidualShuffleExchange"};
static const char *const missing_attention[] = {"DotProductCausalAttention", "CausalFavor", "Favor", "Attention",
                                                "PureLSHSelfAttention", "PureLSHSelfAttentionWrapper",
                                                "MixedLSHSelfAttention", "EncDecAttention"};
static const char *const missing_data[] = {
    "lm1b_preprocess", "c4_preprocess", "c4_bare_preprocess_fn", "wmt_preprocess", "wmt_concat_preprocess",
    "cifar10_augmentation_preprocess", "cifar10_augmentation_flatten_preprocess",
    "downsampled_imagenet_flatten_bare_preprocess", "bair_robot_pushing_preprocess",
    "generic_text_dataset_preprocess_fn", "get_t5_preprocessor_by_name", "filter_dataset_on_len",
    "truncate_dataset_on_len", "pad_dataset_to_length", "add_eos_to_output_features", "lm_token_preprocessing",
    "squeeze_targets_preprocess", "concat_preprocess", "unsupervised", "select_random_chunk", "split_tokens",
    "denoise", "reduce_concat_tokens", "random_spans_helper", "random_spans_tokens_length",
    "noise_span_to_unique_sentinel", "nonnoise_span_to_unique_sentinel", "random_spans_noise_mask", "TFDS",
    "Tokenize", "BucketByLength", "FilterByLength", "AddLossWeights", "make_inputs", "make_additional_stream"};
// Modules whose unknown names are taken as those kinds.
static const char *const data_modules[] = {"trax.data", "tf_inputs", "trax.supervised.tf_inputs", "preprocessors",
                                           "t5.data"};

static bool listed(const char *const *list, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

// name's module ("trax.data.tf_inputs" of "trax.data.tf_inputs.lm1b_preprocess")
// is m or below it.
static bool in_module(const char *name, const char *m) {
    const char *dot = strrchr(name, '.');
    size_t n = strlen(m);
    return dot && (size_t)(dot - name) >= n && !strncmp(name, m, n) && (name[n] == '.');
}

const char *cfg_trax_missing(const char *name) {
    const char *dot = strrchr(name, '.');
    const char *s = dot ? dot + 1 : name;
    bool data_module = false;
    for (int i = 0; i < COUNT(data_modules); i++) data_module = data_module || in_module(name, data_modules[i]);
    if (listed(missing_data, COUNT(missing_data), s) || data_module)
        return "is Trax's TFDS data pipeline (trax.data), which ctrax does not implement (it reads no TFDS): replace "
               "the config's data lines (batcher, data_streams and their preprocessing) with train.inputs = "
               "@TextInputs or @TokenInputs (text or token files), @IDXInputs (MNIST-format files), or Trax's "
               "synthetic @sequence_copy_inputs or @addition_inputs";
    if (listed(missing_models, COUNT(missing_models), s) || in_module(name, "trax.models"))
        return "is a Trax model ctrax does not implement: ctrax's models are TransformerLM, ReformerLM, RNNLM and MLP "
               "(train.model = @ReformerLM, ...); delete the bindings of a model train.model does not name";
    if (listed(missing_attention, COUNT(missing_attention), s))
        return "is a Trax attention layer ctrax does not implement: ReformerLM.attention_type takes @SelfAttention, "
               "@LSHSelfAttention or ctrax's @CausalAttention; TransformerLM's attention is built in";
    return NULL;
}

const cfg_def *cfg_registry(int *n) {
    *n = COUNT(registry);
    return registry;
}
