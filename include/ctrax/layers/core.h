// The core layers. Shapes use B = batch, T = sequence length, D = features,
// V = vocabulary size, H = heads; "..." is any number of leading dims.
#ifndef CTRAX_LAYERS_CORE_H
#define CTRAX_LAYERS_CORE_H

#include "ctrax/layers/layer.h"
#include "ctrax/params.h"

#ifdef __cplusplus
extern "C" {
#endif

// (..., D) -> (..., n_units): x @ kernel + bias. kernel (D, n_units) is
// Glorot-uniform, bias N(0, 1e-12) (Trax's RandomNormalInitializer(1e-6));
// the init key is split into (kernel, bias).
ct_layer *ct_dense(int n_units);
ct_layer *ct_dense_no_bias(int n_units);
// int32 ids (...) -> (..., d_feature); weights (vocab_size, d_feature) are
// U(+-sqrt(3 / d_feature)), Trax's. An id outside [0, vocab_size) is an
// error naming it (Trax clips it).
ct_layer *ct_embedding(int vocab_size, int d_feature);

// Elementwise activations, (...) -> (...).
ct_layer *ct_relu(void);
ct_layer *ct_gelu(void);      // tanh approximation, as Trax's FastGelu
ct_layer *ct_gelu_erf(void);  // x / 2 (1 + erf(x / sqrt 2)), as Trax's Gelu
ct_layer *ct_tanh(void);
ct_layer *ct_sigmoid(void);
// The constructor of one of those by its Trax name, as a model's setting
// names it (TransformerLM.ff_activation, ReformerLM.ff_activation,
// MLP.activation_fn): "Relu", "Gelu" (erf), "FastGelu" (tanh), "Tanh",
// "Sigmoid"; NULL for any other name (CT_ACTIVATION_NAMES lists them).
typedef ct_layer *(*ct_activation_fn)(void);
ct_activation_fn ct_activation_named(const char *name);
#define CT_ACTIVATION_NAMES "'Relu', 'Gelu', 'FastGelu', 'Tanh' or 'Sigmoid'"
// Over the last axis.
ct_layer *ct_log_softmax(void);
ct_layer *ct_softmax(void);
// Over the last axis, with learned scale (ones) and bias (zeros).
ct_layer *ct_layer_norm(float epsilon);

// Zeroes each element with probability rate in training mode and scales the
// rest by 1/(1-rate); the identity in eval mode. The mask comes from the
// layer's key, so the same key gives the same mask.
ct_layer *ct_dropout(float rate);

// (B, T, D) -> (B, T, D) plus a position embedding for t < max_len:
// learned weights (max_len, D) drawn from N(0, 0.02^2); Trax's
// PositionalEncoding, learned weights "embedding" (max_len, D) that start as
// the sinusoids of Vaswani et al., with Trax's training dropout on the table
// (one (1, 1, D) mask: whole channels dropped for every example and
// position, the rest scaled by 1 / (1 - dropout)); or those sinusoids fixed,
// with no weights.
ct_layer *ct_positional_encoding_learned(int max_len);
ct_layer *ct_positional_encoding_trainable_sinusoidal(int max_len, float dropout);
ct_layer *ct_positional_encoding_sinusoidal(int max_len);
// Trax's AxialPositionalEncoding (REFORMER.md section 5): (B, T, D) -> (B, T,
// D) with T = prod shape[k] and D = sum d_embs[k]; position t, in row-major
// digits (i_0, .., i_{K-1}) of shape, gets concat_k E_k[i_k], E_k (shape[k],
// d_embs[k]) drawn from N(0, 1) with ct_key_split(key, k): sum n_k d_k
// weights for a (T, D) table. A length or d_model that does not fit is an
// error naming both. Training dropout drops PE elements over the noise shape
// (B, n_0, .., n_{K-1}, D) with broadcast_dims (negative from the end) set to
// 1; ReformerLM passes 1..K: one (B, 1, .., 1, D) mask.
#define CT_AXIAL_MAX_AXES 8
ct_layer *ct_axial_positional_encoding(int n_axes, const int *shape, const int *d_embs, float dropout,
                                       int n_broadcast_dims, const int *broadcast_dims);
// Trax's FixedBasePositionalEncoding, ReformerLM's pos_type='fixed-base':
// (B, T, D) -> (B, T, D), D a multiple of n_digits, T < min(bases)^n_digits.
// Block i (D / n_digits wide) of position p's encoding is the sum over bases
// r of digit i of p in base r times a learned vector W[r][i]
// (U(+-1e-4)); position 0 adds a learned start_vec (D). Training starts
// each example at a random position (at 0 one time in
// start_from_zero_one_in) and zeroes its digit embeddings one time in
// base_dropout_one_in; eval starts at 0. _trax() has Trax's defaults: bases
// (11, 13, 14, 15), 8 digits, 100, 100.
#define CT_FIXED_BASE_MAX_BASES 8
#define CT_FIXED_BASE_MAX_DIGITS 16
ct_layer *ct_fixed_base_positional_encoding(int n_bases, const int *bases, int n_digits, int start_from_zero_one_in,
                                            int base_dropout_one_in);
ct_layer *ct_fixed_base_positional_encoding_trax(void);
// Shifts along axis 1 by n_positions, filling with zeros: (B, T, ...) ->
// (B, T, ...). Works on int32 and f32.
ct_layer *ct_shift_right(int n_positions);
// (d0, ..., dk, ...) -> (d0, ..., dk, rest): keeps the first n_axes_to_keep
// axes, flattens the rest.
ct_layer *ct_flatten(int n_axes_to_keep);
// Mean over axis (negative counts from the end), optionally keeping it.
ct_layer *ct_mean(int axis, bool keepdims);

// Causal multi-head self-attention, (B, T, D) -> (B, T, D): Dense q, k, v,
// scaled dot products masked so position t sees positions <= t, softmax,
// attention dropout, a weighted sum of values, and an output Dense. Built
// from layers: Serial(Branch(Dense, Dense, Dense), DotProductCausalAttention,
// Dense).
ct_layer *ct_causal_attention(int d_model, int n_heads, float dropout);
// The weightless core: [q, k, v] (B, T, D) each -> (B, T, D), heads split
// from D.
ct_layer *ct_dot_product_causal_attention(int n_heads, float dropout);

// ---- Losses and metrics: scalars from (model output, targets[, weights]) --
// Targets are int32 class ids (..., ) for outputs (..., V).

// [logits, targets, weights] -> sum(ce * w) / sum(w), Trax's
// WeightedCategoryCrossEntropy: ce = -sum_c p_c log_softmax(logits)_c with
// targets p = one_hot(target), or with label_smoothing s (Trax's default
// None is 0 here) p = (1 - s) one_hot(target) + s / V over the V classes.
// The gradient of the logits is w / sum(w) (softmax - p). An s outside
// [0, 1] (or NaN) is an error at init naming the layer; a config's binding
// outside it is refused naming the binding.
#define CT_WEIGHTED_CATEGORY_CROSS_ENTROPY_PARAMS(X)                                                          \
    X(FLOAT, label_smoothing, 0.0f, UNIT, NULLABLE,                                                          \
      "targets (1 - s) one_hot + s / V over the V classes; 0 or None (Trax's default): one_hot")
typedef struct ct_weighted_category_cross_entropy_params {
    CT_WEIGHTED_CATEGORY_CROSS_ENTROPY_PARAMS(CT_PARAM_FIELD)
} ct_weighted_category_cross_entropy_params;
ct_weighted_category_cross_entropy_params ct_weighted_category_cross_entropy_default_params(void);
ct_layer *ct_weighted_category_cross_entropy_new(ct_weighted_category_cross_entropy_params p);
// The same with the defaults (no smoothing).
ct_layer *ct_weighted_category_cross_entropy(void);
// [log_probs, targets, weights] -> sum(-log_probs[target] * w) / sum(w), as
// Trax's CrossEntropyLoss (the model ends in LogSoftmax).
ct_layer *ct_cross_entropy_loss(void);
// [outputs, targets] -> mean(argmax == target).
ct_layer *ct_category_accuracy(void);
// [outputs, targets, weights] -> sum((argmax == target) * w) / sum(w).
ct_layer *ct_weighted_category_accuracy(void);
// [outputs, targets, weights] (B, T, V), (B, T), (B, T) -> fraction of
// sequences whose every weighted position is right.
ct_layer *ct_sequence_accuracy(void);
// [outputs, targets, weights] f32 of one shape -> sum(w * (o - t)^2) / sum(w).
ct_layer *ct_l2_loss(void);
// [logits, targets] f32 and int32 of one shape, targets 0 or 1 -> the mean
// binary cross-entropy of sigmoid(logits) (Trax's BinaryCrossEntropy: no
// weights).
ct_layer *ct_binary_cross_entropy(void);

#ifdef __cplusplus
}
#endif
#endif
