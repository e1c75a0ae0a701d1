// The suite's way to run ct_gradcheck (include/ctrax/layers/gradcheck.h,
// where the checks and their bounds CT_GRADCHECK_TOL, CT_GRADCHECK_MODEL_TOL
// are described): each check's errors printed under its label, a failure to
// run printed and returned as -1, so a test compares one number.
#ifndef CTRAX_TESTS_GRADCHECK_H
#define CTRAX_TESTS_GRADCHECK_H

#include "ctrax/ctrax.h"
#include "ctrax/layers/gradcheck.h"
#include "ctrax/layers/layer_author.h"

// Runs ct_gradcheck on layer (the caller still frees it) for the given
// inputs with opts, its log on stdout under label. Returns the largest
// error, or -1 (the error printed) if the check could not run: init,
// forward or backward failed, or a rule of the pass was broken.
double gradcheck(const char *label, ct_layer *layer, const ct_tensor *inputs, int n_in, ct_gradcheck_opts opts);

// Fills a tensor's data with uniform values in [lo, hi) from seed.
void gradcheck_fill(ct_tensor *t, uint64_t seed, float lo, float hi);

#endif
