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

// Trax's Scan(layer, axis, n_carry) (trax/layers/combinators.py, remat
// False): runs layer along axis of its non-carry inputs, with a carry.
// layer maps (x_t..., carry...) -> (y_t..., carry...): n_in = nx + n_carry,
// n_out = ny + n_carry, the carries deepest on the stack (last). Scan takes
// the same items: xs (each with length T on axis, T equal for all) and the
// initial carries, and returns the ys stacked along axis (y_t's shape with T
// inserted at axis) and the last carries. Step t gets ct_key_fold_in(key, t),
// as Trax's fold_in(rng, i), and the one set of weights (gradients add up
// over the steps). Each carry out must have its carry in's signature.
// axis counts from 0 (negative counts from the end of each x's shape).
// T must be >= 1 (init and forward fail with CT_ERR_SHAPE otherwise; JAX's
// scan would return empty ys). x_t is x with the axis removed, the other
// axes in order, as Trax's docstring (xs[..., t, ...]) and Trax's init
// (_shape_without_axis) have it; Trax's _scan swaps axis with axis 0
// instead, so for a (resolved) axis >= 2 its forward steps see x's axis 0
// moved to position axis - 1 (and it stacks the ys so), against its own
// init: not copied.
// Memory: every step's tape stays until backward (Trax's remat=False).
ct_layer *ct_scan(ct_layer *layer, int axis, int n_carry);

// Trax's GRUCell(n_units, forget_bias=0): (x (..., D), h (..., n)) ->
// (h', h'), both (..., n):
//   [u | r] = sigmoid([x | h] W1 + b1)        W1 (D + n, 2 n)
//   c = tanh([x | r h] W2 + b2)               W2 (D + n, n)
//   h' = u h + (1 - u) c
// Trax's initializers: kernels U(-0.01, 0.01), biases N(0, 1e-6^2) (plus
// forget_bias, 0). Weights "kernel_gates", "bias_gates", "kernel_candidate",
// "bias_candidate". The state width must be n_units (init fails naming both).
ct_layer *ct_gru_cell(int n_units);

// Trax's LSTMCell(n_units, forget_bias=1): (x (..., D), s (..., 2 n) =
// [c | h]) -> (h', [c' | h']):
//   [i | j | f | o] = [x | h] W + b             W (D + n, 4 n)
//   c' = c sigmoid(f) + sigmoid(i) tanh(j)
//   h' = tanh(c') sigmoid(o)
// Trax's initializers: W Glorot uniform, b N(0, 1e-6^2) + forget_bias (Trax
// adds forget_bias, 1.0, to all 4 n biases at init, not to f in forward);
// ctrax starts b at exactly 1 (the N(0, 1e-6^2) part is a few ulps at 1).
// The state width must be 2 n_units (init fails naming both).
ct_layer *ct_lstm_cell(int n_units);

// Trax's MakeZeroState(depth_multiplier): x (B, T, D) -> zeros (B,
// depth_multiplier D), f32, the initial state of a scan over T. x takes no
// gradient.
ct_layer *ct_make_zero_state(int depth_multiplier);

#ifdef __cplusplus
}
#endif
#endif
