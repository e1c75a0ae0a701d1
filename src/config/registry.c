// The registry: every configurable a config may bind or refer to, with its
// parameters. This table is the one list of names the program reads
// (`train.steps`, `Loop.n_steps_per_checkpoint`, ...), and the one place
// to add a model, optimizer, schedule, input, loss or metric.
//
// Adding an optimizer is one entry: its parameter table (fields of its
// ct_*_params struct, whose defaults come from ct_*_default_params, so the
// registry never repeats a default) and two one-line wrappers, as for Adam
// below. Trax's other optimizers, to be registered the same way when they
// land: Momentum (trax.optimizers.Momentum: learning_rate, mass,
// weight_decay_rate, nesterov), RMSProp (learning_rate, gamma, eps,
// clip_grad_norm), Adafactor (learning_rate, factored, multiply_by_parameter_scale,
// do_clipping, do_momentum, momentum_in_bfloat16, beta1, decay_rate,
// clipping_threshold, weight_decay_rate, weight_decay_n_steps, epsilon1,
// epsilon2), SM3 (learning_rate, momentum, mode).
//
// A struct-backed model is the same (TransformerLM). A layer with no
// parameters (losses and metrics) names its constructor in make_layer.
// Parameters whose default is NULL and that have no field take the default
// the program passes to ct_config_get_* (settings, schedules).
#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "config/internal.h"
#include "ctrax/layers/core.h"
#include "ctrax/models/models.h"
#include "ctrax/optim/optimizer.h"

#define FIELD(type, member) .has_field = true, .field = offsetof(type, member)
#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define AT_LEAST(x) .lo = (x), .hi = INFINITY
#define UNIT_OPEN .lo = 0, .hi = 1, .hi_open = true  // [0, 1)

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

static ct_status transformer_lm_check(ct_config *cfg, const char *name, const void *vp, ct_error *err) {
    const ct_transformer_lm_params *p = vp;
    if (p->d_model % p->n_heads == 0) return CT_OK;
    char where[300];
    cfg_where(cfg, name, "n_heads", where, sizeof where);
    if (!where[0]) cfg_where(cfg, name, "d_model", where, sizeof where);
    return ct_error_set(err, CT_ERR_ARG, "%s%s: d_model %d does not divide by n_heads %d", where, name, p->d_model,
                        p->n_heads);
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

// ---- Schedules (their builders come with the schedules; defaults are the
// program's, Trax's are in the docs) ------------------------------------------------------

static const cfg_param multifactor_params[] = {
    {.name = "factors", .type = CFG_STRING, .doc = "'constant * linear_warmup * rsqrt_decay' in Trax"},
    {.name = "constant", .type = CFG_FLOAT, .doc = "0.1 in Trax"},
    {.name = "warmup_steps", .type = CFG_INT, AT_LEAST(0), .doc = "400 in Trax"},
    {.name = "decay_factor", .type = CFG_FLOAT, .doc = "0.5 in Trax"},
    {.name = "steps_per_decay", .type = CFG_INT, AT_LEAST(1), .doc = "20000 in Trax"},
    {.name = "steps_per_cycle", .type = CFG_INT, AT_LEAST(1), .doc = "100000 in Trax"},
    {.name = "second_constant", .type = CFG_FLOAT, .doc = "0.01 in Trax"},
    {.name = "second_constant_step", .type = CFG_INT, AT_LEAST(0), .doc = "1000 in Trax"},
    {.name = "minimum", .type = CFG_FLOAT, .doc = "0 in Trax"},
};
static const cfg_param warmup_params[] = {
    {.name = "n_warmup_steps", .type = CFG_INT, AT_LEAST(0)},
    {.name = "max_value", .type = CFG_FLOAT},
};
static const cfg_param constant_params[] = {
    {.name = "value", .type = CFG_FLOAT},
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
};

// Trax's TrainTask/Loop checkpoint periods.
static const cfg_param loop_params[] = {
    {.name = "n_steps_per_checkpoint", .type = CFG_INT, AT_LEAST(1)},
    {.name = "n_steps_per_permanent_checkpoint", .type = CFG_INT, AT_LEAST(1), .none_ok = true},
};

// ---- The table ----------------------------------------------------------------------------

#define PARAMS(a) .params = (a), .n_params = COUNT(a)
#define LOSS(n, fn, d) {.name = (n), .kind = CFG_LAYER, .modules = "trax.layers", .make_layer = (fn), .doc = (d)}

static const cfg_def registry[] = {
    {.name = "TransformerLM", .kind = CFG_MODEL, .modules = "trax.models", PARAMS(transformer_lm_params),
     .struct_size = sizeof(ct_transformer_lm_params), .defaults = transformer_lm_defaults,
     .check = transformer_lm_check, .new_layer = transformer_lm_new,
     .doc = "decoder-only Transformer language model: int32 tokens (B, T) -> logits (B, T, vocab_size)"},
    {.name = "MLP", .kind = CFG_MODEL, .modules = "trax.models", PARAMS(mlp_params), .build_layer = build_mlp,
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

    {.name = "multifactor", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr",
     PARAMS(multifactor_params), .doc = "product of factors: constant, linear_warmup, rsqrt_decay, ..."},
    {.name = "warmup", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr", PARAMS(warmup_params),
     .doc = "step / (n + 1) * max up to n, then max"},
    {.name = "warmup_and_rsqrt_decay", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr",
     PARAMS(warmup_params), .doc = "warmup, then max * sqrt(n + 1) / sqrt(step)"},
    {.name = "constant", .kind = CFG_SCHEDULE, .modules = "trax.supervised.lr_schedules trax.lr",
     PARAMS(constant_params), .doc = "the same learning rate every step"},

    {.name = "train", .kind = CFG_SETTINGS, .modules = "trax.supervised.trainer_lib trax.supervised",
     PARAMS(train_params), .doc = "what `ctrax train` trains, with what, for how long"},
    {.name = "Loop", .kind = CFG_SETTINGS, .modules = "trax.supervised.training", PARAMS(loop_params),
     .doc = "the training loop's checkpoint periods"},
};

const cfg_def *cfg_registry(int *n) {
    *n = COUNT(registry);
    return registry;
}
