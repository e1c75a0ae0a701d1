// Finite-difference gradient check of a layer: the check every layer and
// combinator of ctrax passes, for layers of one's own (layer_author.h).
//
//     ct_gradcheck_opts o = ct_gradcheck_defaults();
//     o.log = stdout;                        // one line per tensor checked
//     double worst;
//     if (ct_gradcheck(layer, &x, 1, o, &worst, &err) != CT_OK) ...  // err says what broke
//     if (!(worst < CT_GRADCHECK_TOL)) ...   // a gradient is wrong
//
// The loss is L = sum_i <r_i, out_i> with fixed random r_i over the layer's
// f32 outputs, so dL/dout_i = r_i. Backward with those gradients gives the
// analytic gradient of every f32 input and every weight; int32 inputs (token
// ids) are not perturbed. What is checked:
//   - each gradient against central differences (L(x + eps) - L(x - eps)) /
//     2 eps at up to max_elems sampled elements per tensor, as the error
//     ||analytic - numeric|| / max(||analytic|| + ||numeric||, floor);
//   - each tensor as a whole: the derivative along a random unit direction
//     v that moves every element, against (L(x + eps v) - L(x - eps v)) /
//     2 eps (so a gradient wrong only at elements the sample missed shows);
//     its float noise is larger, so it counts half;
//   - that backward adds into the weight gradients (+=, never =): the
//     gradient slab starts at random values, and a second forward and
//     backward must add the same gradient again;
//   - that backward reads no memory it did not write: the second pass runs
//     over an arena filled with NaNs and must give the first's input
//     gradients;
//   - the rules of the pass: backward takes back exactly what forward put
//     on the tape, never writes into the gradients it is given, and returns
//     input gradients of the inputs' shapes.
// The result is the largest of those errors (a NaN one as +inf). A layer
// that fails to init, forward or backward, or breaks a rule of the pass, is
// an error (err names it), not an error number.
//
// The layer is initialized from the inputs' shapes into a net of its own
// (ct_net_init takes a reference; ct_gradcheck drops it, and the caller's
// stays the caller's to free), so it must not be in another live net. The
// inputs are not changed: the check perturbs copies. An empty input (a dim
// of 0; its data may be NULL) has nothing to check and adds no error.
#ifndef CTRAX_LAYERS_GRADCHECK_H
#define CTRAX_LAYERS_GRADCHECK_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"
#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// The bounds on the error, set from the errors ctrax's own checks show when
// the gradients are right: the forward's float noise over the step (~1/eps)
// and the step's truncation error (~eps^2 times the curvature).
//
// CT_GRADCHECK_TOL, for a layer or a few, with the defaults: the worst of
// ctrax's own checks reads 5.0e-4 (CausalAttention's key bias inside
// ReversibleHalfResidual: a gradient that is exactly 0, so noise against the
// floor); the rest below 4e-4. The checks along v read up to 5.5e-4
// (DotProductCausalAttention(T 131)'s input, 2072 elements; 9.4e-4 with
// AVX2 kernels) and 5.0e-4 (an LSTM kernel in RNNLM), counted half. A
// gradient scaled by 1 + d reads about d / 2: a scale error above 0.2% fails.
#define CT_GRADCHECK_TOL 1e-3
// CT_GRADCHECK_MODEL_TOL, with ct_gradcheck_model_defaults, for whole
// models (TransformerLM, ReformerLM, stacks of Reformer blocks): the forward
// through embedding, blocks and output carries more float noise than one
// layer, and Relu and fixed-base positions keep their steps at 2e-3 to 3e-3,
// so the noise of one tensor's sample reaches 1.5e-3 in norm. Against the
// layer floor of 0.05 a key bias (gradient 0) read up to 7.7e-3; against
// CT_GRADCHECK_MODEL_FLOOR (these models' gradients are 0.2 to 90 per
// tensor, so the floor is the noise's, not a gradient's) it reads 7.7e-4.
// Worst with that floor: 1.3e-3 (the shared Wq of ReformerLM(SelfAttention
// full, share_qk; Relu)), 1.2e-3 (TransformerLM's query bias, |grad| 0.27);
// the rest below 9e-4; along v below 3.2e-4. A scale error above 0.6% fails.
#define CT_GRADCHECK_MODEL_TOL 3e-3
#define CT_GRADCHECK_MODEL_FLOOR 0.5

typedef struct ct_gradcheck_opts {
    double eps;     // finite-difference step (default 1e-2)
    int max_elems;  // elements sampled per tensor (default 48)
    bool train;     // training mode (dropout active, with a fixed key; default true)
    uint64_t seed;  // for init, the projections r_i, the samples and the layer key (default 1)
    // The least denominator of the error (default 0.05): a gradient that is
    // truly 0 shows only numeric noise, which must not read as a 100% error.
    // Sized to that noise: up to 2.5e-5 in norm for one layer at eps 1e-2
    // (0.05 reads it as 5e-4), 3.9e-4 for a whole model.
    double floor;
    // Added to every weight after init, uniform in [-weight_noise,
    // weight_noise] (default 0: init's weights). Weights that start as ones
    // and zeros (a scale, a shift) hide a backward that forgets them: with a
    // scale of 1, x * scale and x have the same gradient. 0.5 shows it.
    float weight_noise;
    FILE *log;          // each check's error, one line each (default NULL: none)
    const char *label;  // the check's name in the log (default NULL: the layer's name)
} ct_gradcheck_opts;

// The defaults above, for one layer or a few.
ct_gradcheck_opts ct_gradcheck_defaults(void);
// The defaults for a whole model: step eps, floor CT_GRADCHECK_MODEL_FLOOR.
ct_gradcheck_opts ct_gradcheck_model_defaults(double eps);

// Checks layer's gradients for the n_in inputs (data filled) and sets
// *worst to the largest error (compare with CT_GRADCHECK_TOL). Returns
// CT_OK, or an error naming what failed: an argument (CT_ERR_ARG: a NULL,
// n_in, an option, an input's rank, a negative dim, no data), init, forward
// or backward, a rule of the pass broken (CT_ERR_STATE; an output or input
// gradient of another shape than init's, CT_ERR_SHAPE), or memory.
ct_status ct_gradcheck(ct_layer *layer, const ct_tensor *inputs, int n_in, ct_gradcheck_opts opts,
                       double *worst, ct_error *err);

#ifdef __cplusplus
}
#endif

#endif
