// Learning-rate schedules, as Trax's trax.supervised.lr_schedules.
//
// A schedule maps the Loop's 1-based step to a learning rate; the trainer
// passes that rate to the optimizer's update, overriding the optimizer's own
// learning_rate. Values are computed in double and returned as float.
//
//   constant(value)                      value (Trax: step / 1 * value at step 0)
//   warmup(n, max)                       step / (n + 1) * max for step <= n, then max
//   warmup_and_rsqrt_decay(n, max)       step / (n + 1) * max for step <= n, then
//                                        max * sqrt(n + 1) / sqrt(step)
//   multifactor(factors, ...)            the product of the factors named in a
//                                        string such as "constant * linear_warmup *
//                                        rsqrt_decay" (see ct_multifactor_params)
//
// Every schedule can describe itself as the call that makes it (for a
// checkpoint's JSON and the operative config), e.g.
// "multifactor(factors='constant * linear_warmup', constant=0.1, warmup_steps=400)".
#ifndef CTRAX_OPTIM_SCHEDULES_H
#define CTRAX_OPTIM_SCHEDULES_H

#include <stddef.h>
#include <stdint.h>
#include "ctrax/core/error.h"
#include "ctrax/params.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_schedule ct_schedule;

// The parameters of multifactor, with Trax's defaults from
// ct_multifactor_default_params(). The factors, multiplied left to right
// starting from 1:
//   constant                 constant
//   two_constants            constant while step < second_constant_step, then second_constant
//   linear_warmup            min(1, step / warmup_steps)
//   rsqrt_decay              1 / sqrt(max(step, warmup_steps))
//   rsqrt_normalized_decay   sqrt(warmup_steps) / sqrt(max(step, warmup_steps))
//   decay_every              decay_factor ^ floor(step / steps_per_decay)
//   cosine_decay             (1 + cos(pi * (p mod 1))) / 2,
//                            p = max(0, (step - warmup_steps) / steps_per_cycle)
// and a product <= minimum gives minimum.
// One list (see ctrax/params.h): factors is copied by the constructor.
#define CT_MULTIFACTOR_PARAMS(X)                                                                                 \
    X(STRING, factors, "constant * linear_warmup * rsqrt_decay", ANY, NONE,                                      \
      "factors multiplied together: constant, linear_warmup, rsqrt_decay, rsqrt_normalized_decay, "              \
      "decay_every, cosine_decay, two_constants")                                                                \
    X(DOUBLE, constant, 0.1, ANY, NONE, NULL)                                                                    \
    X(INT64, warmup_steps, 400, AT_LEAST(0), NONE, NULL)                                                         \
    X(DOUBLE, decay_factor, 0.5, ANY, NONE, "decay_every")                                                       \
    X(INT64, steps_per_decay, 20000, AT_LEAST(1), NONE, "decay_every")                                           \
    X(INT64, steps_per_cycle, 100000, AT_LEAST(1), NONE, "cosine_decay")                                         \
    X(DOUBLE, second_constant, 0.01, ANY, NONE, "two_constants")                                                 \
    X(INT64, second_constant_step, 10000, AT_LEAST(0), NONE, "two_constants")                                    \
    X(DOUBLE, minimum, 0.0, ANY, NONE, "a product <= minimum gives minimum")
typedef struct ct_multifactor_params {
    CT_MULTIFACTOR_PARAMS(CT_PARAM_FIELD)
} ct_multifactor_params;
ct_multifactor_params ct_multifactor_default_params(void);

// Constructors. Each writes a new schedule to *out (free it with
// ct_schedule_free) or returns CT_ERR_ARG naming the bad argument. Values
// are finite and, as learning rates (and multifactor's constant,
// second_constant and decay_factor, where a factor uses them), >= 0.
ct_status ct_schedule_constant(double value, ct_schedule **out, ct_error *err);
// n_warmup_steps >= 0.
ct_status ct_schedule_warmup(int64_t n_warmup_steps, double max_value, ct_schedule **out, ct_error *err);
ct_status ct_schedule_warmup_and_rsqrt_decay(int64_t n_warmup_steps, double max_value, ct_schedule **out,
                                             ct_error *err);
// Fails on an unknown factor name (the message names it and lists the known
// ones), an empty factor (as Trax, "" and "a * * b" are errors), and on
// parameters a named factor cannot use: warmup_steps <= 0 with linear_warmup,
// warmup_steps < 0 with a decay, steps_per_decay <= 0 with decay_every,
// steps_per_cycle <= 0 with cosine_decay (Trax would divide by zero).
ct_status ct_schedule_multifactor(const ct_multifactor_params *p, ct_schedule **out, ct_error *err);
void ct_schedule_free(ct_schedule *s);

// The learning rate at a 1-based step.
float ct_schedule_value(const ct_schedule *s, int64_t step);

// "constant", "warmup", "warmup_and_rsqrt_decay" or "multifactor".
const char *ct_schedule_name(const ct_schedule *s);

// Writes the call that makes s, e.g. "warmup(n_warmup_steps=9,
// max_value=0.01)", into buf (always NUL-terminated when len > 0), as
// snprintf does: returns the length the full text needs. Numbers are written
// in the shortest form that reads back to the same double. multifactor lists
// the factors, then only the parameters its factors use (and minimum when it
// is not 0), in the order of ct_multifactor_params.
size_t ct_schedule_describe(const ct_schedule *s, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
