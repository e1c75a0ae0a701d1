// Finite-difference gradient checking for layers.
//
// The loss is L = sum_i <r_i, out_i> with fixed random r_i over the layer's
// f32 outputs, so dL/dout_i = r_i. Backward with those gradients gives the
// analytic gradients of every f32 input and every weight. Backward must add
// into the weight gradients, so the gradient slab starts at random values g0
// (the analytic gradient is what backward added), and a second forward and
// backward must leave g0 + 2 g (an error per weight, as below, printed as
// one line); backward must not write into the r_i. Central differences
// (L(x + eps) - L(x - eps)) / 2 eps give the numeric ones, at up to
// max_elems sampled elements per tensor. The error per tensor is
// ||analytic - numeric|| / max(||analytic|| + ||numeric||, 0.05) over the
// sample; each is printed, and the largest is returned.
#ifndef CTRAX_TESTS_GRADCHECK_H
#define CTRAX_TESTS_GRADCHECK_H

#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"

typedef struct gradcheck_opts {
    double eps;       // finite-difference step (default 1e-2)
    int max_elems;    // elements sampled per tensor (default 48)
    bool train;       // training mode (dropout active with a fixed key)
    uint64_t seed;    // for init, projections and the layer key
} gradcheck_opts;

gradcheck_opts gradcheck_default_opts(void);

// Runs the check on layer (takes a reference) for the given inputs (data
// filled; i32 inputs are not perturbed). Returns the largest relative error,
// or a negative number if the layer failed to init or run.
double gradcheck(const char *label, ct_layer *layer, const ct_tensor *inputs, int n_in,
                 gradcheck_opts opts);

// Fills a tensor's data with uniform values in [lo, hi) from seed.
void gradcheck_fill(ct_tensor *t, uint64_t seed, float lo, float hi);

#endif
