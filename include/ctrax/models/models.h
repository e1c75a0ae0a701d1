// Models, built only from layers. Each returns a new layer (one reference).
#ifndef CTRAX_MODELS_MODELS_H
#define CTRAX_MODELS_MODELS_H

#include "ctrax/layers/layer.h"
#include "ctrax/params.h"

#ifdef __cplusplus
extern "C" {
#endif

// Trax's MLP: [Flatten if flatten], then Dense(w) for each width, with Relu
// between them (and after the last if out_activation). (B, ...) -> (B, last).
ct_layer *ct_mlp(int n_widths, const int *layer_widths, bool out_activation, bool flatten);

// The parameters TransformerLM and ReformerLM share (see ctrax/params.h),
// with Trax's defaults; the two docs differ.
#define CT_LM_PARAMS(X, d_model_doc, n_layers_doc)                                                    \
    X(INT, vocab_size, 256, AT_LEAST(1), NONE, "tokens are 0..vocab_size-1")                          \
    X(INT, d_model, 512, AT_LEAST(1), NONE, d_model_doc)                                               \
    X(INT, d_ff, 2048, AT_LEAST(1), NONE, "width of the feed-forward layers")                         \
    X(INT, n_layers, 6, AT_LEAST(0), NONE, n_layers_doc)                                               \
    X(INT, n_heads, 8, AT_LEAST(1), NONE, "attention heads; must divide d_model")                     \
    X(INT, max_len, 2048, AT_LEAST(1), NONE, "longest sequence the positional encoding covers")      \
    X(FLOAT, dropout, 0.1f, UNIT_OPEN, NONE, "dropout rate everywhere")

// Trax's TransformerLM(vocab_size, d_model, d_ff, n_layers, n_heads, dropout,
// dropout_shared_axes, max_len, mode, ff_activation); ctrax has no
// dropout_shared_axes or ff_activation (always Relu), and adds
// learned_positions (false: sinusoidal positions, as Trax's default).
#define CT_TRANSFORMER_LM_PARAMS(X)                                   \
    CT_LM_PARAMS(X, "width of the residual stream", "decoder blocks") \
    X(BOOL, learned_positions, false, ANY, NONE, "learned positional embeddings instead of sinusoids (ctrax's)")
typedef struct ct_transformer_lm_params {
    CT_TRANSFORMER_LM_PARAMS(CT_PARAM_FIELD)
} ct_transformer_lm_params;
ct_transformer_lm_params ct_transformer_lm_default_params(void);

// Trax's decoder-only TransformerLM, int32 tokens (B, T) -> logits (B, T, V):
//   ShiftRight(1), Embedding, Dropout, PositionalEncoding,
//   n_layers x [Residual(LayerNorm, CausalAttention, Dropout),
//               Residual(LayerNorm, Dense(d_ff), Relu, Dropout, Dense(d_model), Dropout)],
//   LayerNorm, Dense(vocab_size).
ct_layer *ct_transformer_lm(ct_transformer_lm_params p);

// Trax's ReformerLM(vocab_size, d_model, d_ff, d_attention_key,
// d_attention_value, n_layers, n_heads, dropout, max_len, attention_type,
// ...): ctrax's attention is always full causal attention, so only these.
// d_model is the width of each of the two reversible halves.
#define CT_REFORMER_LM_PARAMS(X) \
    CT_LM_PARAMS(X, "width of each of the two reversible halves", "reversible decoder blocks")
typedef struct ct_reformer_lm_params {
    CT_REFORMER_LM_PARAMS(CT_PARAM_FIELD)
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
