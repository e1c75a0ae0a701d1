// Optimizer internals shared with the Loop (not part of the public API).
#ifndef CTRAX_OPTIM_INTERNAL_H
#define CTRAX_OPTIM_INTERNAL_H

#include <cjson/cJSON.h>
#include <math.h>  // INFINITY (the float ranges)
#include <stddef.h>

#include "ctrax/optim/optimizer.h"

// A new optimizer of vtable vt with a copy of the size bytes at params.
ct_optimizer *ct_optimizer_wrap(const ct_optimizer_vtable *vt, const void *params, size_t size);

// slot_floats of an optimizer with one slot the size of the weight
// (Momentum's velocity, RMSProp's mean square).
size_t ct_optimizer_one_slot(const ct_optimizer *o, const ct_tensor *sig);

// What each optimizer's file generates from its list (see ctrax/params.h):
// ct_<x>_default_params(), its table of hyperparameters by name (every
// stored entry; a FIXED one marked fixed, an ENUM with its range) and its
// vtable x_vt, named display, with the remaining vtable fields:
//   CT_OPTIMIZER(adam, "Adam", CT_ADAM_PARAMS, .slot_floats = ..., .update = ...)
#define CT_OPTIMIZER(x, display, LIST, ...)                                                                     \
    ct_##x##_params ct_##x##_default_params(void) { return (ct_##x##_params){LIST(CT_PARAM_DEFAULT)}; }      \
    static const ct_optimizer_param x##_param_table[] = {LIST(CT_OPT_ROW_OF_##x)};                            \
    static const ct_optimizer_vtable x##_vt = {.name = display, CT_OPT_TABLE(x##_param_table), __VA_ARGS__};
#define CT_OPT_ROW_OF_sgd(...) CT_OPT_ROW(ct_sgd_params, __VA_ARGS__)
#define CT_OPT_ROW_OF_adam(...) CT_OPT_ROW(ct_adam_params, __VA_ARGS__)
#define CT_OPT_ROW_OF_momentum(...) CT_OPT_ROW(ct_momentum_params, __VA_ARGS__)
#define CT_OPT_ROW_OF_rmsprop(...) CT_OPT_ROW(ct_rmsprop_params, __VA_ARGS__)
#define CT_OPT_ROW_OF_adafactor(...) CT_OPT_ROW(ct_adafactor_params, __VA_ARGS__)
#define CT_OPT_ROW_OF_sm3(...) CT_OPT_ROW(ct_sm3_params, __VA_ARGS__)
#define CT_OPT_ROW(S, TYPE, field, def, RANGE, FLAGS, doc) CT_OPT_ROW_##FLAGS(S, TYPE, field, RANGE)
#define CT_OPT_ROW_NONE(S, TYPE, field, RANGE) \
    {.name = #field, .offset = offsetof(S, field), .kind = CT_OPT_KIND_##TYPE, CT_OPT_LIMITS_##RANGE},
#define CT_OPT_ROW_FIXED(S, TYPE, field, RANGE) \
    {.name = #field, .offset = offsetof(S, field), .kind = CT_OPT_KIND_##TYPE, .fixed = true},
#define CT_OPT_ROW_UNSTORED(S, TYPE, field, RANGE)
#define CT_OPT_KIND_FLOAT CT_OPT_PARAM_FLOAT
#define CT_OPT_KIND_BOOL CT_OPT_PARAM_BOOL
#define CT_OPT_KIND_ENUM(t) CT_OPT_PARAM_INT
#define CT_OPT_LIMITS_ANY
#define CT_OPT_LIMITS_AT_LEAST(x) .min = (x), .max = INFINITY,
#define CT_OPT_LIMITS_POSITIVE .min = 0, .max = INFINITY, .min_open = true,
#define CT_OPT_LIMITS_UNIT .min = 0, .max = 1,
#define CT_OPT_LIMITS_UNIT_OPEN .min = 0, .max = 1, .max_open = true,
#define CT_OPT_LIMITS_RANGE(a, b) .lo = (a), .hi = (b),
// The vtable's table fields.
#define CT_OPT_TABLE(t) .param_table = (t), .n_param_table = (int)(sizeof(t) / sizeof((t)[0]))

// The slot layout o was made with, in words, for an optimizer whose layout
// follows hyperparameters that may change later (SM3); NULL for the others.
const char *ct_optimizer_slot_layout(const ct_optimizer *o);

// Checks the hyperparameters of a checkpoint's state.json "optimizer"
// object, {"name": "<optimizer>", "slot_layout": "<words>" (SM3's),
// "params": {"<hyperparameter>": <number>, ...}}, against o: the name must
// be o's, slot_layout o's (or, in a checkpoint without it, each value that
// decides the layout must give o's), "params" an object of numbers,
// each a known hyperparameter with a valid value (finite, a float, 0 or 1
// for a boolean, a whole number in range for an enum, o's own for a fixed
// one: it decided the slot layout). o keeps its values, the run's config,
// as in Trax, whose checkpoints hold no hyperparameters: a resume may change
// them. With report, each that differs is logged ("resuming with Adam.b2 =
// 0.99; <what> had 0.999"), but learning_rate, which the schedule sets every
// step. Errors name what (the state.json's path) and the field
// ("optimizer.params.b1").
ct_status ct_optimizer_check_json(const ct_optimizer *o, const cJSON *optimizer, const char *what, bool report,
                                  ct_error *err);

#endif
