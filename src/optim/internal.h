// Optimizer internals shared with the Loop (not part of the public API).
#ifndef CTRAX_OPTIM_INTERNAL_H
#define CTRAX_OPTIM_INTERNAL_H

#include <cjson/cJSON.h>

#include "ctrax/optim/optimizer.h"

// Restores the hyperparameters of a checkpoint's state.json "optimizer"
// object, {"name": "<optimizer>", "params": {"<hyperparameter>": <number>,
// ...}}: the name must be o's, "params" an object of numbers, each a known
// hyperparameter with a valid value (finite, a float, 0 or 1 for a
// boolean, a whole number in range for an enum, unchanged for a fixed one).
// Everything is checked before anything is set, so on failure o is as it
// was. Errors name what (the state.json's path) and the field
// ("optimizer.params.b1").
ct_status ct_optimizer_restore_json(ct_optimizer *o, const cJSON *optimizer, const char *what, ct_error *err);

#endif
