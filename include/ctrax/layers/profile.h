// Where a training step's time goes, by layer.
//
// A context with a profile (ct_ctx.profile, or a trainer's
// ct_trainer_options.profile) has every ct_layer_forward and
// ct_layer_backward add its self time -- its wall time less its sublayers'
// -- to the row of its layer's name ("Dense", "CausalAttention", ...), so
// the rows add up to the time spent in layers without counting a time
// twice. The trainers add the optimizer update as a row of its own and
// count each step's wall time; the rest of a step (splitting the batch,
// combining gradients, checking them) is printed as what is left.
//
// The clock is read twice per layer call (about 30 ns a read on a 2026
// AMD EPYC) and the name looked up among the rows, only when a profile is
// set. Wall time: a layer whose loops run on several
// threads counts the time they take together.
#ifndef CTRAX_LAYERS_PROFILE_H
#define CTRAX_LAYERS_PROFILE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ctrax/layers/layer.h"  // CT_NAME_MAX

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_profile ct_profile;

// The trainers' row for the optimizer update.
#define CT_PROFILE_OPTIMIZER "(optimizer update)"

ct_profile *ct_profile_new(void);
void ct_profile_free(ct_profile *p);

// One row: a name's calls and self seconds, forward and backward (index 0
// and 1), summed over the steps counted.
typedef struct ct_profile_row {
    char name[CT_NAME_MAX];  // a layer's name, or a trainer's row
    int64_t calls[2];
    double seconds[2];
} ct_profile_row;

// The rows in the order their names were first seen; *n their count.
const ct_profile_row *ct_profile_rows(const ct_profile *p, int *n);
// Steps counted and their wall seconds in all.
int64_t ct_profile_steps(const ct_profile *p, double *seconds);

// What the layer base and the trainers call: a step starts and ends
// (counted, with its wall time); inside it a span starts (its start time
// returned) and ends, adding its self time to name's row (backward: the
// backward column). Spans nest as the calls do; outside a step they count
// nothing (a trainer's passes at construction).
double ct_profile_step_begin(ct_profile *p);
void ct_profile_step_end(ct_profile *p, double start);
double ct_profile_begin(ct_profile *p);
void ct_profile_end(ct_profile *p, const char *name, bool backward, double start);

// The table, rows by time, to f: per step, each name's calls, forward and
// backward milliseconds and share of the step, then what the step spent
// outside them.
void ct_profile_print(const ct_profile *p, FILE *f);

#ifdef __cplusplus
}
#endif

#endif
