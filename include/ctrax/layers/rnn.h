// Recurrent layers, as Trax's trax/layers/rnn.py.
#ifndef CTRAX_LAYERS_RNN_H
#define CTRAX_LAYERS_RNN_H

#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Trax's SRU(n_units) (Simple Recurrent Unit, arXiv:1709.02755) with no
// activation: x (B, T, n_units) -> h (B, T, n_units), recurrent over T:
//   [r | f | y] = x W + b          Dense(3 n_units), columns in that order
//   r, f = sigmoid(r), sigmoid(f)
//   c_t = f_t c_{t-1} + (1 - f_t) y_t, c_{-1} = 0
//   h_t = r_t c_t + (1 - r_t) x_t sqrt(3)
// The input width must equal n_units (init fails with CT_ERR_SHAPE naming
// both otherwise); the input is rank 3, time on axis 1.
// Built as Trax builds it and named as Trax names it, "SRU_<n_units>":
// Serial(Branch(Dense(3 n_units), Select([0])), SRUCell), the Dense's
// weights (Trax's initializers) being the only ones; SRUCell does the gates,
// the scan over T and the output gate in one layer (one pass forward, one
// reverse pass backward) and keeps the states c (B, T, n_units) on the tape
// for backward. Deterministic, so a reversible recompute gives the same.
// See src/layers/sru.c.
ct_layer *ct_sru(int n_units);

#ifdef __cplusplus
}
#endif
#endif
