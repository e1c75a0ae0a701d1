// Finite-difference gradient checking for layers.
//
// The loss is L = sum_i <r_i, out_i> with fixed random r_i over the layer's
// f32 outputs, so dL/dout_i = r_i. Backward with those gradients gives the
// analytic gradients of every f32 input and every weight. Backward must add
// into the weight gradients, so the gradient slab starts at random values g0
// (the analytic gradient is what backward added), and a second forward and
// backward must leave g0 + 2 g (an error per weight, as below, printed as
// one line); backward must not write into the r_i. That second pass runs
// over an arena filled with NaNs and must give the first pass's input
// gradients, so memory read before it is written shows. Central differences
// (L(x + eps) - L(x - eps)) / 2 eps give the numeric ones, at up to
// max_elems sampled elements per tensor. The error per tensor is
// ||analytic - numeric|| / max(||analytic|| + ||numeric||, floor) over the
// sample. Every element enters a second check per tensor: the derivative
// along a random unit direction v against (L(x + eps v) - L(x - eps v)) /
// 2 eps, its error |analytic - numeric| / max(|analytic| + |numeric|,
// ||analytic|| / sqrt(n), floor), held to twice the bound (it counts half).
// Each error is printed, and the largest is returned (a NaN one as +inf).
#ifndef CTRAX_TESTS_GRADCHECK_H
#define CTRAX_TESTS_GRADCHECK_H

#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"

// The bounds on gradcheck's error, set from the errors the checks show when
// the gradients are right: the forward's float noise over the step (~1/eps)
// and the step's truncation error (~eps^2 times the curvature).
//
// GRADCHECK_TOL, for a layer or a few: the worst such check reads 5.0e-4
// (CausalAttention's key bias inside ReversibleHalfResidual: a gradient that
// is exactly 0, so noise against the floor); the rest below 4e-4. The
// checks along v read up to 5.5e-4 (DotProductCausalAttention(T 131)'s
// input, 2072 elements; 9.4e-4 with AVX2 kernels) and 5.0e-4 (an LSTM
// kernel in RNNLM), counted half. A
// gradient scaled by 1 + d reads about d / 2: a scale error above 0.2% fails.
#define GRADCHECK_TOL 1e-3
// GRADCHECK_MODEL_TOL with GRADCHECK_MODEL_FLOOR, for whole models
// (TransformerLM, ReformerLM, stacks of Reformer blocks): the forward through
// embedding, blocks and output carries more float noise than one layer, and
// Relu and fixed-base keep their steps at 2e-3 to 3e-3, so the noise of one
// tensor's sample reaches 1.5e-3 in norm. Against the layer floor of 0.05 a
// key bias (gradient 0) read up to 7.7e-3; against 0.5 (these models'
// gradients are 0.2 to 90 per tensor, so the floor is the noise's, not a
// gradient's) it reads 7.7e-4. Worst with that floor: 1.3e-3 (the shared Wq
// of ReformerLM(SelfAttention full, share_qk; Relu)), 1.2e-3 (TransformerLM's
// query bias, |grad| 0.27); the rest below 9e-4; along v below 3.2e-4
// (fixed-base, against its own bound of 6e-3: 1.7e-3). A scale error above
// 0.6% fails.
#define GRADCHECK_MODEL_TOL 3e-3
#define GRADCHECK_MODEL_FLOOR 0.5

typedef struct gradcheck_opts {
    double eps;       // finite-difference step (default 1e-2)
    int max_elems;    // elements sampled per tensor (default 48)
    bool train;       // training mode (dropout active with a fixed key)
    uint64_t seed;    // for init, projections and the layer key
    // The least denominator of the error (default 0.05): a gradient that is
    // truly 0 shows only numeric noise, which must not read as a 100% error.
    // Sized to that noise: up to 2.5e-5 in norm for one layer at eps 1e-2
    // (0.05 reads it as 5e-4), 3.9e-4 for a whole model (GRADCHECK_MODEL_FLOOR).
    double floor;
} gradcheck_opts;

gradcheck_opts gradcheck_default_opts(void);
// The defaults for a whole model: step eps, floor GRADCHECK_MODEL_FLOOR.
gradcheck_opts gradcheck_model_opts(double eps);

// Runs the check on layer (takes a reference) for the given inputs (data
// filled; i32 inputs are not perturbed). Returns the largest relative error,
// or a negative number if the layer failed to init or run.
double gradcheck(const char *label, ct_layer *layer, const ct_tensor *inputs, int n_in,
                 gradcheck_opts opts);

// Fills a tensor's data with uniform values in [lo, hi) from seed.
void gradcheck_fill(ct_tensor *t, uint64_t seed, float lo, float hi);

#endif
