// Models, built only from layers. Each returns a new layer (one reference).
#ifndef CTRAX_MODELS_MODELS_H
#define CTRAX_MODELS_MODELS_H

#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Trax's MLP: [Flatten if flatten], then Dense(w) for each width, with Relu
// between them (and after the last if out_activation). (B, ...) -> (B, last).
ct_layer *ct_mlp(int n_widths, const int *layer_widths, bool out_activation, bool flatten);

typedef struct ct_transformer_lm_params {
    int vocab_size;     // 256
    int d_model;        // 512
    int d_ff;           // 2048
    int n_layers;       // 6
    int n_heads;        // 8
    int max_len;        // 2048
    float dropout;      // 0.1
    bool learned_positions;  // false: sinusoidal positions, as Trax's default
} ct_transformer_lm_params;
ct_transformer_lm_params ct_transformer_lm_default_params(void);

// Trax's decoder-only TransformerLM, int32 tokens (B, T) -> logits (B, T, V):
//   ShiftRight(1), Embedding, Dropout, PositionalEncoding,
//   n_layers x [Residual(LayerNorm, CausalAttention, Dropout),
//               Residual(LayerNorm, Dense(d_ff), Relu, Dropout, Dense(d_model), Dropout)],
//   LayerNorm, Dense(vocab_size).
ct_layer *ct_transformer_lm(ct_transformer_lm_params p);

typedef struct ct_reformer_lm_params {
    int vocab_size;  // 256
    int d_model;     // 512: the width of each of the two reversible halves
    int d_ff;        // 2048
    int n_layers;    // 6 decoder blocks
    int n_heads;     // 8
    int max_len;     // 2048
    float dropout;   // 0.1
} ct_reformer_lm_params;
ct_reformer_lm_params ct_reformer_lm_default_params(void);

// Trax's ReformerLM (models/reformer/reformer.py) with causal multi-head
// attention, int32 tokens (B, T) -> logits (B, T, V):
//   ShiftRight(1), Embedding, Dropout, sinusoidal PositionalEncoding, Dup,
//   ReversibleSerial(n_layers x [
//     ReversibleHalfResidual(LayerNorm, CausalAttention)   named ...Attn,
//     ReversibleSwap,
//     ReversibleHalfResidual(LayerNorm, Dense(d_ff), Dropout, Gelu,
//                            Dense(d_model), Dropout)       named ...FF,
//     ReversibleSwap]),
//   Concatenate (-> 2 d_model), LayerNorm, Dropout, Dense(vocab_size).
// Differences from Trax: dropout masks are not shared along the sequence
// axis (Trax's shared_axes=[-2]); attention is the full causal
// CausalAttention (Trax's default SelfAttention takes the same role); the
// positional encoding is fixed sinusoids (Trax starts trainable weights
// from them); the half-residuals are named ReversibleHalfResidualAttn/FF
// (Trax's ...DecoderAttn is longer than a layer name may be).
ct_layer *ct_reformer_lm(ct_reformer_lm_params p);

#ifdef __cplusplus
}
#endif
#endif
