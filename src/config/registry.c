// The registry: every configurable a config may bind or refer to, with its
// parameters. This table is the one list of names the program reads
// (`train.steps`, `Loop.n_steps_per_checkpoint`, ...), and the one place
// to add a model, optimizer, schedule, input, loss or metric.
//
// Adding an optimizer is one entry: its parameter table (fields of its
// ct_*_params struct, whose defaults come from ct_*_default_params, so the
// registry never repeats a default) and two one-line wrappers, as for Adam
// below. Schedules are the same (multifactor's struct is
// ct_multifactor_params; warmup's and constant's are local structs whose
// parameters are required, as in Trax).
//
// A struct-backed model is the same (TransformerLM). A layer with no
// parameters (losses and metrics) names its constructor in make_layer.
// Inputs name a builder (src/config/inputs.c) that reads the parameters
// listed here. Parameters whose default is NULL and that have no field take
// the default the program passes to ct_config_get_* (settings).
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "config/internal.h"
#include "ctrax/layers/core.h"
#include "ctrax/models/models.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/optim/schedules.h"

#define FIELD(type, member) \
    .has_field = true, .field = offsetof(type, member), .field_size = sizeof(((type *)0)->member)
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define AT_LEAST(x) .lo = (x), .hi = INFINITY
#define UNIT_OPEN .lo = 0, .hi = 1, .hi_open = true  // [0, 1)
#define UNIT .lo = 0, .hi = 1                          // [0, 1]
#define RANGE(a, b) .lo = (a), .hi = (b)

const char *cfg_kind_name(cfg_kind k) {
    switch (k) {
    case CFG_MODEL: return "a model";
    case CFG_LAYER: return "a loss or metric layer";
    case CFG_OPTIMIZER: return "an optimizer";
    case CFG_SCHEDULE: return "a learning-rate schedule";
    case CFG_INPUT: return "an input stream";
    case CFG_SETTINGS: return "program settings";
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
    }
    return "?";
}

// ---- Models -------------------------------------------------------------------------------

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

static ct_status transformer_lm_check(ct_config *cfg, const char *name, const void *vp, ct_error *err) {
    const ct_transformer_lm_params *p = vp;
    CT_TRY(check_layer_count(cfg, name, p->n_layers, 1, 7, err));
    return check_heads(cfg, name, p->d_model, p->n_heads, err);
}

// Trax's TransformerLM(vocab_size, d_model, d_ff, n_layers, n_heads, dropout,
// dropout_shared_axes, max_len, mode, ff_activation); ctrax has no
// dropout_shared_axes or ff_activation (always Relu), and adds
// learned_positions.
static const cfg_param transformer_lm_params[] = {
    {.name = "vocab_size", .type = CFG_INT, FIELD(ct_transformer_lm_params, vocab_size), AT_LEAST(1),
     .doc = "tokens are 0..vocab_size-1"},
    {.name = "d_model", .type = CFG_INT, FIELD(ct_transformer_lm_params, d_model), AT_LEAST(1),
     .doc = "width of the residual stream"},
    {.name = "d_ff", .type = CFG_INT, FIELD(ct_transformer_lm_params, d_ff), AT_LEAST(1),
     .doc = "width of the feed-forward layers"},
    {.name = "n_layers", .type = CFG_INT, FIELD(ct_transformer_lm_params, n_layers), AT_LEAST(0),
     .doc = "decoder blocks"},
    {.name = "n_heads", .type = CFG_INT, FIELD(ct_transformer_lm_params, n_heads), AT_LEAST(1),
     .doc = "attention heads; must divide d_model"},
    {.name = "max_len", .type = CFG_INT, FIELD(ct_transformer_lm_params, max_len), AT_LEAST(1),
     .doc = "longest sequence the positional encoding covers"},
    {.name = "dropout", .type = CFG_FLOAT, FIELD(ct_transformer_lm_params, dropout), UNIT_OPEN,
     .doc = "dropout rate everywhere"},
    {.name = "learned_positions", .type = CFG_BOOL, FIELD(ct_transformer_lm_params, learned_positions),
     .doc = "learned positional embeddings instead of sinusoids (ctrax's)"},
};

static void reformer_lm_defaults(void *p) { *(ct_reformer_lm_params *)p = ct_reformer_lm_default_params(); }
static ct_layer *reformer_lm_new(const void *p) { return ct_reformer_lm(*(const ct_reformer_lm_params *)p); }

static ct_status reformer_lm_check(ct_config *cfg, const char *name, const void *vp, ct_error *err) {
    const ct_reformer_lm_params *p = vp;
    CT_TRY(check_layer_count(cfg, name, p->n_layers, 4, 0, err));
    return check_heads(cfg, name, p->d_model, p->n_heads, err);
}

// Trax's ReformerLM(vocab_size, d_model, d_ff, d_attention_key,
// d_attention_value, n_layers, n_heads, dropout, max_len, attention_type,
// ...): ctrax's attention is always full causal attention, so only these.
static const cfg_param reformer_lm_params[] = {
    {.name = "vocab_size", .type = CFG_INT, FIELD(ct_reformer_lm_params, vocab_size), AT_LEAST(1),
     .doc = "tokens are 0..vocab_size-1"},
    {.name = "d_model", .type = CFG_INT, FIELD(ct_reformer_lm_params, d_model), AT_LEAST(1),
     .doc = "width of each of the two reversible halves"},
    {.name = "d_ff", .type = CFG_INT, FIELD(ct_reformer_lm_params, d_ff), AT_LEAST(1),
     .doc = "width of the feed-forward layers"},
    {.name = "n_layers", .type = CFG_INT, FIELD(ct_reformer_lm_params, n_layers), AT_LEAST(0),
     .doc = "reversible decoder blocks"},
    {.name = "n_heads", .type = CFG_INT, FIELD(ct_reformer_lm_params, n_heads), AT_LEAST(1),
     .doc = "attention heads; must divide d_model"},
    {.name = "max_len", .type = CFG_INT, FIELD(ct_reformer_lm_params, max_len), AT_LEAST(1),
     .doc = "longest sequence the positional encoding covers"},
    {.name = "dropout", .type = CFG_FLOAT, FIELD(ct_reformer_lm_params, dropout), UNIT_OPEN,
     .doc = "dropout rate everywhere"},
};

// Trax's MLP(layer_widths=(128, 64), activation_fn=Relu, out_activation=False,
// flatten=True, mode); the activation is always Relu.
static const cfg_param mlp_params[] = {
    {.name = "layer_widths", .type = CFG_LIST, .default_gin = "[128, 64]", .doc = "widths of the Dense layers"},
    {.name = "out_activation", .type = CFG_BOOL, .default_gin = "False", .doc = "Relu after the last Dense too"},
    {.name = "flatten", .type = CFG_BOOL, .default_gin = "True", .doc = "flatten all but the batch axis first"},
};

#define MLP_MAX_LAYERS 256

static ct_layer *build_mlp(ct_config *cfg, const char *name, ct_error *err) {
    const ct_config_value *widths, *out_activation, *flatten;
    if (cfg_query_default(cfg, name, "layer_widths", &widths, err) != CT_OK ||
        cfg_query_default(cfg, name, "out_activation", &out_activation, err) != CT_OK ||
        cfg_query_default(cfg, name, "flatten", &flatten, err) != CT_OK)
        return NULL;
    if (widths->n < 1 || widths->n > MLP_MAX_LAYERS) {
        ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.layer_widths must hold 1 to %d widths, got %d", widths->file,
                     widths->line, widths->col, name, MLP_MAX_LAYERS, widths->n);
        return NULL;
    }
    int w[MLP_MAX_LAYERS];
    for (int i = 0; i < widths->n; i++) {
        const ct_config_value *it = &widths->items[i];
        if (it->kind != CT_CONFIG_INT || it->i < 1 || it->i > (1 << 24)) {
            char *text = ct_config_value_to_gin(it);
            ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.layer_widths[%d] must be an int in [1, %d], got %.60s",
                         it->file, it->line, it->col, name, i, 1 << 24, text);
            ct_free(text);
            return NULL;
        }
        w[i] = (int)it->i;
    }
    return ct_mlp(widths->n, w, out_activation->b, flatten->b);
}

// ---- Optimizers ---------------------------------------------------------------------------

static void sgd_defaults(void *p) { *(ct_sgd_params *)p = ct_sgd_default_params(); }
static ct_optimizer *sgd_new(const void *p) { return ct_sgd_new(*(const ct_sgd_params *)p); }
static const cfg_param sgd_params[] = {
    {.name = "learning_rate", .type = CFG_FLOAT, FIELD(ct_sgd_params, learning_rate), AT_LEAST(0),
     .doc = "overridden by the schedule each step"},
};

static void adam_defaults(void *p) { *(ct_adam_params *)p = ct_adam_default_params(); }
static ct_optimizer *adam_new(const void *p) { return ct_adam_new(*(const ct_adam_params *)p); }
static const cfg_param adam_params[] = {
    {.name = "learning_rate", .type = CFG_FLOAT, FIELD(ct_adam_params, learning_rate), AT_LEAST(0),
     .doc = "overridden by the schedule each step"},
    {.name = "b1", .type = CFG_FLOAT, FIELD(ct_adam_params, b1), UNIT_OPEN},
    {.name = "b2", .type = CFG_FLOAT, FIELD(ct_adam_params, b2), UNIT_OPEN},
    {.name = "eps", .type = CFG_FLOAT, FIELD(ct_adam_params, eps), AT_LEAST(0)},
    {.name = "weight_decay_rate", .type = CFG_FLOAT, FIELD(ct_adam_params, weight_decay_rate), AT_LEAST(0),
     .doc = "decoupled, not scaled by the learning rate"},
};

static void momentum_defaults(void *p) { *(ct_momentum_params *)p = ct_momentum_default_params(); }
static ct_optimizer *momentum_new(const void *p) { return ct_momentum_new(*(const ct_momentum_params *)p); }
// Trax's Momentum(learning_rate=0.01, mass=0.9, weight_decay_rate=1e-5, nesterov=True).
static const cfg_param momentum_params[] = {
    {.name = "learning_rate", .type = CFG_FLOAT, FIELD(ct_momentum_params, learning_rate), AT_LEAST(0),
     .doc = "overridden by the schedule each step"},
    {.name = "mass", .type = CFG_FLOAT, FIELD(ct_momentum_params, mass), UNIT, .doc = "momentum decay"},
    {.name = "weight_decay_rate", .type = CFG_FLOAT, FIELD(ct_momentum_params, weight_decay_rate), AT_LEAST(0),
     .doc = "decoupled, not scaled by the learning rate"},
    {.name = "nesterov", .type = CFG_BOOL, FIELD(ct_momentum_params, nesterov), .doc = "Nesterov momentum"},
};

static void rmsprop_defaults(void *p) { *(ct_rmsprop_params *)p = ct_rmsprop_default_params(); }
static ct_optimizer *rmsprop_new(const void *p) { return ct_rmsprop_new(*(const ct_rmsprop_params *)p); }
// Trax's RMSProp(learning_rate=0.001, gamma=0.9, eps=1e-8); clipping is
// train.clip_grad_norm.
static const cfg_param rmsprop_params[] = {
    {.name = "learning_rate", .type = CFG_FLOAT, FIELD(ct_rmsprop_params, learning_rate), AT_LEAST(0),
     .doc = "overridden by the schedule each step"},
    {.name = "gamma", .type = CFG_FLOAT, FIELD(ct_rmsprop_params, gamma), UNIT, .doc = "decay of the mean square"},
    {.name = "eps", .type = CFG_FLOAT, FIELD(ct_rmsprop_params, eps), AT_LEAST(0)},
};

static void adafactor_defaults(void *p) { *(ct_adafactor_params *)p = ct_adafactor_default_params(); }
static ct_optimizer *adafactor_new(const void *p) { return ct_adafactor_new(*(const ct_adafactor_params *)p); }

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

// Trax's Adafactor(learning_rate=0.05, factored, multiply_by_parameter_scale,
// do_clipping, do_momentum, momentum_in_bfloat16, beta1, decay_rate,
// clipping_threshold, weight_decay_rate, weight_decay_n_steps, epsilon1, epsilon2).
static const cfg_param adafactor_params[] = {
    {.name = "learning_rate", .type = CFG_FLOAT, FIELD(ct_adafactor_params, learning_rate), AT_LEAST(0),
     .doc = "overridden by the schedule each step"},
    {.name = "factored", .type = CFG_BOOL, FIELD(ct_adafactor_params, factored),
     .doc = "factored second moments for weights of rank >= 2"},
    {.name = "multiply_by_parameter_scale", .type = CFG_BOOL, FIELD(ct_adafactor_params, multiply_by_parameter_scale),
     .doc = "scale the learning rate by the weight's RMS"},
    {.name = "do_clipping", .type = CFG_BOOL, FIELD(ct_adafactor_params, do_clipping),
     .doc = "clip the update's RMS to clipping_threshold"},
    {.name = "do_momentum", .type = CFG_BOOL, FIELD(ct_adafactor_params, do_momentum), .doc = "momentum with beta1"},
    {.name = "momentum_in_bfloat16", .type = CFG_BOOL, .default_gin = "False",
     .doc = "Trax's; only False (ctrax keeps momentum in float32)"},
    {.name = "beta1", .type = CFG_FLOAT, FIELD(ct_adafactor_params, beta1), UNIT_OPEN},
    {.name = "decay_rate", .type = CFG_FLOAT, FIELD(ct_adafactor_params, decay_rate), AT_LEAST(0),
     .doc = "exponent of the second-moment decay 1 - (step + 1)^-decay_rate"},
    {.name = "clipping_threshold", .type = CFG_FLOAT, FIELD(ct_adafactor_params, clipping_threshold), AT_LEAST(0)},
    {.name = "weight_decay_rate", .type = CFG_FLOAT, FIELD(ct_adafactor_params, weight_decay_rate), AT_LEAST(0)},
    {.name = "weight_decay_n_steps", .type = CFG_INT, .default_gin = "0", AT_LEAST(0),
     .doc = "Trax's; only 0 (decay at every step)"},
    {.name = "epsilon1", .type = CFG_FLOAT, FIELD(ct_adafactor_params, epsilon1), AT_LEAST(0),
     .doc = "added to g^2"},
    {.name = "epsilon2", .type = CFG_FLOAT, FIELD(ct_adafactor_params, epsilon2), AT_LEAST(0),
     .doc = "floor of the parameter scale"},
};

static void sm3_defaults(void *p) { *(ct_sm3_params *)p = ct_sm3_default_params(); }
static ct_optimizer *sm3_new(const void *p) { return ct_sm3_new(*(const ct_sm3_params *)p); }
_Static_assert(sizeof(ct_sm3_momentum_type) == sizeof(int), "SM3's momentum_type is read as a C int");
// Trax's SM3(learning_rate=0.01, momentum=0.9, second_moment_averaging=1.0,
// weight_decay=0.0, momentum_type=MomentumType.EMA).
static const cfg_param sm3_params[] = {
    {.name = "learning_rate", .type = CFG_FLOAT, FIELD(ct_sm3_params, learning_rate), AT_LEAST(0),
     .doc = "overridden by the schedule each step"},
    {.name = "momentum", .type = CFG_FLOAT, FIELD(ct_sm3_params, momentum), UNIT, .doc = "0: no momentum slot"},
    {.name = "second_moment_averaging", .type = CFG_FLOAT, FIELD(ct_sm3_params, second_moment_averaging), UNIT,
     .doc = "1: plain sums (AdaGrad-like); below 1: decaying averages with grafting"},
    {.name = "weight_decay", .type = CFG_FLOAT, FIELD(ct_sm3_params, weight_decay), AT_LEAST(0),
     .doc = "L2, added to the preconditioned gradient"},
    {.name = "momentum_type", .type = CFG_INT, FIELD(ct_sm3_params, momentum_type),
     RANGE(CT_SM3_MOMENTUM_EMA, CT_SM3_MOMENTUM_NESTEROV),
     .doc = "Trax's MomentumType: 1 EMA, 2 HEAVY_BALL, 3 NESTEROV"},
};

// ---- Schedules ------------------------------------------------------------------------------

static void multifactor_defaults(void *p) { *(ct_multifactor_params *)p = ct_multifactor_default_params(); }
static ct_status multifactor_new(const void *p, ct_schedule **out, ct_error *err) {
    return ct_schedule_multifactor(p, out, err);
}
static const cfg_param multifactor_params[] = {
    {.name = "factors", .type = CFG_STRING, FIELD(ct_multifactor_params, factors),
     .doc = "factors multiplied together: constant, linear_warmup, rsqrt_decay, rsqrt_normalized_decay, "
            "decay_every, cosine_decay, two_constants"},
    {.name = "constant", .type = CFG_FLOAT, FIELD(ct_multifactor_params, constant)},
    {.name = "warmup_steps", .type = CFG_INT, FIELD(ct_multifactor_params, warmup_steps), AT_LEAST(0)},
    {.name = "decay_factor", .type = CFG_FLOAT, FIELD(ct_multifactor_params, decay_factor), .doc = "decay_every"},
    {.name = "steps_per_decay", .type = CFG_INT, FIELD(ct_multifactor_params, steps_per_decay), AT_LEAST(1),
     .doc = "decay_every"},
    {.name = "steps_per_cycle", .type = CFG_INT, FIELD(ct_multifactor_params, steps_per_cycle), AT_LEAST(1),
     .doc = "cosine_decay"},
    {.name = "second_constant", .type = CFG_FLOAT, FIELD(ct_multifactor_params, second_constant),
     .doc = "two_constants"},
    {.name = "second_constant_step", .type = CFG_INT, FIELD(ct_multifactor_params, second_constant_step),
     AT_LEAST(0), .doc = "two_constants"},
    {.name = "minimum", .type = CFG_FLOAT, FIELD(ct_multifactor_params, minimum),
     .doc = "a product <= minimum gives minimum"},
};

// Trax's warmup(n_warmup_steps, max_value) and warmup_and_rsqrt_decay take
// no defaults.
typedef struct warmup_cfg {
    int64_t n_warmup_steps;
    double max_value;
} warmup_cfg;
static void warmup_defaults(void *p) { *(warmup_cfg *)p = (warmup_cfg){0}; }
static ct_status warmup_new(const void *vp, ct_schedule **out, ct_error *err) {
    const warmup_cfg *p = vp;
    return ct_schedule_warmup(p->n_warmup_steps, p->max_value, out, err);
}
static ct_status warmup_and_rsqrt_decay_new(const void *vp, ct_schedule **out, ct_error *err) {
    const warmup_cfg *p = vp;
    return ct_schedule_warmup_and_rsqrt_decay(p->n_warmup_steps, p->max_value, out, err);
}
static const cfg_param warmup_params[] = {
    {.name = "n_warmup_steps", .type = CFG_INT, FIELD(warmup_cfg, n_warmup_steps), AT_LEAST(0), .required = true},
    {.name = "max_value", .type = CFG_FLOAT, FIELD(warmup_cfg, max_value), .required = true},
};

typedef struct constant_cfg {
    double value;
} constant_cfg;
static void constant_defaults(void *p) { *(constant_cfg *)p = (constant_cfg){0}; }
static ct_status constant_new(const void *p, ct_schedule **out, ct_error *err) {
    return ct_schedule_constant(((const constant_cfg *)p)->value, out, err);
}
static const cfg_param constant_params[] = {
    {.name = "value", .type = CFG_FLOAT, FIELD(constant_cfg, value), .required = true},
};

// ---- Inputs (built in inputs.c; Trax's names where Trax has the same thing) ------------------

#define REQUIRED_INT(n, lo, hi, d) {.name = (n), .type = CFG_INT, RANGE(lo, hi), .required = true, .doc = (d)}

// Trax's trax.data.sequence_copy_inputs (its batch_size is train.batch_size).
static const cfg_param copy_inputs_params[] = {
    REQUIRED_INT("vocab_size", 2, 1 << 30, "tokens 0..vocab_size-1; 0 is the separator"),
    REQUIRED_INT("train_length", 2, 1 << 20, "training w has 1..train_length-1 tokens (as Trax)"),
    {.name = "train_min_length", .type = CFG_INT, .default_gin = "1", RANGE(1, 1 << 20),
     .doc = "the shortest training w (ctrax's; Trax's is always 1)"},
    REQUIRED_INT("eval_min_length", 1, 1 << 20, "eval w has eval_min_length..eval_max_length-1 tokens (as Trax)"),
    REQUIRED_INT("eval_max_length", 2, 1 << 20, "must be > eval_min_length"),
    {.name = "reverse", .type = CFG_BOOL, .default_gin = "False", .doc = "the second w reversed"},
    {.name = "pad_to_multiple", .type = CFG_INT, .default_gin = "1", RANGE(1, 1 << 20),
     .doc = "round the fixed padded length up to a multiple of this (Trax's default: 32)"},
};

// Trax's trax.data.addition_inputs.
static const cfg_param addition_inputs_params[] = {
    REQUIRED_INT("vocab_size", 5, 1 << 30, "digits in base vocab_size - 3, '+', <S>, and 0 for padding"),
    REQUIRED_INT("train_length", 3, 100000, "longest training example: 3..train_length (as Trax)"),
    REQUIRED_INT("eval_min_length", 3, 100000, "eval examples: eval_min_length..eval_max_length"),
    REQUIRED_INT("eval_max_length", 3, 100000, "must be >= eval_min_length"),
    {.name = "pad_to_multiple", .type = CFG_INT, .default_gin = "1", RANGE(1, 1 << 20),
     .doc = "round the fixed padded length up to a multiple of this (Trax's default: 32)"},
};

// Byte-level text; ctrax's (Trax reads text through TFDS).
static const cfg_param text_inputs_params[] = {
    {.name = "paths", .type = CFG_LIST, .required = true,
     .doc = "files and directories (read recursively, sorted), relative to the working directory"},
    {.name = "seq_len", .type = CFG_INT, .default_gin = "128", RANGE(1, 1 << 24), .doc = "tokens per example"},
    {.name = "eval_fraction", .type = CFG_FLOAT, .default_gin = "0.05", UNIT_OPEN,
     .doc = "share of the chunks held out for eval (0: no eval stream)"},
    {.name = "split_seed", .type = CFG_INT, .default_gin = "0", AT_LEAST(0),
     .doc = "decides which chunks are eval; independent of the run's seed"},
    {.name = "shuffle_buffer", .type = CFG_INT, .default_gin = "0", RANGE(0, 1 << 24),
     .doc = "0: every training epoch is a full permutation; K > 0: a shuffle buffer of K instead"},
    {.name = "shifted", .type = CFG_BOOL, .default_gin = "False",
     .doc = "targets are the inputs shifted left (False for models that shift right themselves)"},
};

// Binary token files; ctrax's.
static const cfg_param token_inputs_params[] = {
    {.name = "paths", .type = CFG_LIST, .required = true,
     .doc = "files and directories (read recursively, sorted), relative to the working directory"},
    {.name = "seq_len", .type = CFG_INT, .default_gin = "128", RANGE(1, 1 << 24), .doc = "tokens per example"},
    {.name = "eval_fraction", .type = CFG_FLOAT, .default_gin = "0.05", UNIT_OPEN,
     .doc = "share of the chunks held out for eval (0: no eval stream)"},
    {.name = "split_seed", .type = CFG_INT, .default_gin = "0", AT_LEAST(0),
     .doc = "decides which chunks are eval; independent of the run's seed"},
    {.name = "shuffle_buffer", .type = CFG_INT, .default_gin = "0", RANGE(0, 1 << 24),
     .doc = "0: every training epoch is a full permutation; K > 0: a shuffle buffer of K instead"},
    {.name = "shifted", .type = CFG_BOOL, .default_gin = "False",
     .doc = "targets are the inputs shifted left (False for models that shift right themselves)"},
    {.name = "token_bytes", .type = CFG_INT, .default_gin = "2", RANGE(2, 4), .doc = "2 (uint16) or 4 (uint32)"},
    {.name = "vocab_size", .type = CFG_INT, .default_gin = "0", AT_LEAST(0),
     .doc = "> 0: every token must be below it (checked as it is read)"},
};

// IDX files; ctrax's (Trax reads MNIST through TFDS).
static const cfg_param idx_inputs_params[] = {
    {.name = "train_images", .type = CFG_STRING, .required = true, .doc = "IDX images (3 dims), .gz or plain"},
    {.name = "train_labels", .type = CFG_STRING, .required = true, .doc = "IDX labels (1 dim)"},
    {.name = "eval_images", .type = CFG_STRING, .required = true},
    {.name = "eval_labels", .type = CFG_STRING, .required = true},
    {.name = "n_classes", .type = CFG_INT, .default_gin = "10", RANGE(1, 256), .doc = "every label must be below it"},
    {.name = "shuffle", .type = CFG_BOOL, .default_gin = "True", .doc = "shuffle every training epoch"},
};

// ---- Settings the program reads ---------------------------------------------------------

#define REF(kind) .type = CFG_REFERENCE, .ref_kinds = CFG_KIND_BIT(kind), .none_ok = true

// Trax's trainer_lib.train, the parameters ctrax reads (batch_size is
// ctrax's: Trax sets it on its input pipeline).
static const cfg_param train_params[] = {
    {.name = "model", REF(CFG_MODEL), .doc = "the model to train"},
    {.name = "loss_fn", REF(CFG_LAYER), .doc = "the training loss"},
    {.name = "optimizer", REF(CFG_OPTIMIZER)},
    {.name = "lr_schedule_fn", REF(CFG_SCHEDULE), .doc = "learning rate per step"},
    {.name = "inputs", REF(CFG_INPUT), .doc = "the training and eval streams"},
    {.name = "metrics", .type = CFG_LIST, .none_ok = true, .doc = "eval metrics: a list of @layers"},
    {.name = "steps", .type = CFG_INT, AT_LEAST(0), .doc = "training steps"},
    {.name = "batch_size", .type = CFG_INT, AT_LEAST(1), .doc = "examples per step"},
    {.name = "eval_frequency", .type = CFG_INT, AT_LEAST(0), .doc = "steps between evals (0: none)"},
    {.name = "eval_steps", .type = CFG_INT, AT_LEAST(0), .doc = "batches per eval"},
    {.name = "random_seed", .type = CFG_INT, AT_LEAST(0), .none_ok = true, .doc = "seed of init, data, dropout"},
    {.name = "checkpoint_highest", .type = CFG_STRING, .none_ok = true,
     .doc = "keep the checkpoint with the highest value of this metric"},
    {.name = "checkpoint_lowest", .type = CFG_STRING, .none_ok = true,
     .doc = "keep the checkpoint with the lowest value of this metric"},
    {.name = "permanent_checkpoint_frequency", .type = CFG_INT, AT_LEAST(1), .none_ok = true},
    {.name = "use_memory_efficient_trainer", .type = CFG_BOOL, .doc = "the reversible trainer"},
    {.name = "n_devices", .type = CFG_INT, RANGE(1, 64), .doc = "local devices (replica threads); 1 when unbound"},
    {.name = "adasum", .type = CFG_BOOL, .doc = "combine device gradients with Adasum instead of averaging them"},
    {.name = "clip_grad_norm", .type = CFG_FLOAT, AT_LEAST(0), .none_ok = true,
     .doc = "clip gradients to this global L2 norm; None: no clipping"},
    {.name = "keep_checkpoints", .type = CFG_INT, AT_LEAST(1), .doc = "regular checkpoints kept"},
    {.name = "skip_nonfinite_steps", .type = CFG_BOOL, .default_gin = "False",
     .doc = "skip a step whose loss or gradients are NaN/Inf and count it, instead of stopping"},
};

// Trax's TrainTask/Loop checkpoint periods.
static const cfg_param loop_params[] = {
    {.name = "n_steps_per_checkpoint", .type = CFG_INT, AT_LEAST(1)},
    {.name = "n_steps_per_permanent_checkpoint", .type = CFG_INT, AT_LEAST(0), .none_ok = true,
     .doc = "0 or None: no permanent checkpoints"},
};

// ---- The table ----------------------------------------------------------------------------

#define PARAMS(a) .params = (a), .n_params = COUNT(a)
#define LOSS(n, fn, d) {.name = (n), .kind = CFG_LAYER, .modules = "trax.layers", .make_layer = (fn), .doc = (d)}

static const cfg_def registry[] = {
    {.name = "TransformerLM", .kind = CFG_MODEL, .modules = "trax.models", PARAMS(transformer_lm_params),
     .struct_size = sizeof(ct_transformer_lm_params), .defaults = transformer_lm_defaults,
     .check = transformer_lm_check, .new_layer = transformer_lm_new, .plan = cfg_plan_transformer_lm,
     .doc = "decoder-only Transformer language model: int32 tokens (B, T) -> logits (B, T, vocab_size)"},
    {.name = "ReformerLM", .kind = CFG_MODEL, .modules = "trax.models trax.models.reformer",
     PARAMS(reformer_lm_params), .struct_size = sizeof(ct_reformer_lm_params), .defaults = reformer_lm_defaults,
     .check = reformer_lm_check, .new_layer = reformer_lm_new, .plan = cfg_plan_reformer_lm,
     .doc = "reversible decoder-only language model: int32 tokens (B, T) -> logits (B, T, vocab_size)"},
    {.name = "MLP", .kind = CFG_MODEL, .modules = "trax.models", PARAMS(mlp_params), .build_layer = build_mlp,
     .plan = cfg_plan_mlp,
     .doc = "Dense layers with Relu between them: (B, ...) -> (B, last width)"},

    {.name = "SGD", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(sgd_params),
     .struct_size = sizeof(ct_sgd_params), .defaults = sgd_defaults, .new_optimizer = sgd_new, .doc = "w -= lr * g"},
    {.name = "Adam", .kind = CFG_OPTIMIZER, .modules = "trax.optimizers", PARAMS(adam_params),
     .struct_size = sizeof(ct_adam_params), .defaults = adam_defaults, .new_optimizer = adam_new,
     .doc = "Adam with Trax's bias correction and decoupled weight decay"},

    LOSS("WeightedCategoryCrossEntropy", ct_weighted_category_cross_entropy,
         "[logits, targets, weights] -> sum(ce * w) / sum(w)"),
    LOSS("CrossEntropyLoss", ct_cross_entropy_loss, "[log_probs, targets, weights] -> sum(-log p * w) / sum(w)"),
    LOSS("CategoryAccuracy", ct_category_accuracy, "[outputs, targets] -> mean(argmax == target)"),
    LOSS("WeightedCategoryAccuracy", ct_weighted_category_accuracy,
         "[outputs, targets, weights] -> sum((argmax == target) * w) / sum(w)"),
    LOSS("SequenceAccuracy", ct_sequence_accuracy, "fraction of sequences right at every weighted position"),
    LOSS("L2Loss", ct_l2_loss, "[outputs, targets, weights] -> sum(w * (o - t)^2) / sum(w)"),

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

    {.name = "train", .kind = CFG_SETTINGS, .modules = "trax.supervised.trainer_lib trax.supervised",
     PARAMS(train_params), .doc = "what `ctrax train` trains, with what, for how long"},
    {.name = "Loop", .kind = CFG_SETTINGS, .modules = "trax.supervised.training", PARAMS(loop_params),
     .doc = "the training loop's checkpoint periods"},
};

const cfg_def *cfg_registry(int *n) {
    *n = COUNT(registry);
    return registry;
}
