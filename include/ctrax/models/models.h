// Models, built only from layers. Each returns a new layer (one reference).
#ifndef CTRAX_MODELS_MODELS_H
#define CTRAX_MODELS_MODELS_H

#include "ctrax/layers/core.h"
#include "ctrax/layers/efficient_attention.h"
#include "ctrax/layers/lsh_attention.h"
#include "ctrax/layers/layer.h"
#include "ctrax/params.h"

#ifdef __cplusplus
extern "C" {
#endif

// Trax's MLP: [Flatten if flatten], then Dense(w) for each width, with the
// activation between them (and after the last if out_activation): Trax's
// default is ct_relu. (B, ...) -> (B, last).
ct_layer *ct_mlp(int n_widths, const int *layer_widths, ct_activation_fn activation_fn, bool out_activation,
                 bool flatten);

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
// dropout_shared_axes. ff_activation is a name (ct_activation_named). Its positions are
// Trax's PositionalEncoding, a trainable table started at the sinusoids;
// ctrax adds learned_positions (started at N(0, 0.02^2) instead) and
// fixed_positions (the sinusoids, not trained).
#define CT_TRANSFORMER_LM_PARAMS(X)                                                                          \
    CT_LM_PARAMS(X, "width of the residual stream", "decoder blocks")                                        \
    X(BOOL, learned_positions, false, ANY, NONE, "the positions' table starts at N(0, 0.02^2) (ctrax's)")    \
    X(BOOL, fixed_positions, false, ANY, NONE, "the sinusoids fixed, no weights (ctrax's; Trax's train them)") \
    X(STRING, ff_activation, "Relu", ANY, NONE, "the feed-forward activation: " CT_ACTIVATION_NAMES ", as Trax")
typedef struct ct_transformer_lm_params {
    CT_TRANSFORMER_LM_PARAMS(CT_PARAM_FIELD)
} ct_transformer_lm_params;
ct_transformer_lm_params ct_transformer_lm_default_params(void);

// Trax's decoder-only TransformerLM, int32 tokens (B, T) -> logits (B, T, V):
//   ShiftRight(1), Embedding, Dropout, PositionalEncoding,
//   n_layers x [Residual(LayerNorm, CausalAttention, Dropout),
//               Residual(LayerNorm, Dense(d_ff), ff_activation, Dropout, Dense(d_model), Dropout)],
//   LayerNorm, Dense(vocab_size).
ct_layer *ct_transformer_lm(ct_transformer_lm_params p);

// Trax's ReformerLM(vocab_size, d_model, d_ff, d_attention_key,
// d_attention_value, n_layers, n_heads, dropout, max_len, attention_type,
// pos_type, pos_axial_shape, pos_d_axial_embs, ff_activation, ff_chunk_size,
// ...; REFORMER.md section 1). d_model is the width of each of the two
// reversible halves. The defaults are Trax's (REFORMER.md section 1): full
// SelfAttention with 64-wide heads, a trainable position table; the
// vocabulary, which Trax requires, defaults to 256 (bytes) here. The UNSTORED rows are Trax's parameters ctrax accepts
// only at Trax's default: a config that sets another value is refused,
// naming the parameter. ff_activation is a name (ct_activation_named). The
// fields after the list are what a config writes in Trax's forms
// (src/config/registry.c): attention_type as a reference or a list of
// them (@SelfAttention, [@SelfAttention, @LSHSelfAttention]), each type's
// settings bound on the type itself (SelfAttention.chunk_len,
// LSHSelfAttention.n_hashes, ...), and pos_axial_shape / pos_d_axial_embs
// as tuples (or Trax's older axial_pos_shape / d_axial_pos_embs).
#define CT_REFORMER_LM_PARAMS(X)                                                                                   \
    CT_LM_PARAMS(X, "width of each of the two reversible halves", "reversible decoder blocks")                     \
    X(INT, d_attention_key, 0, AT_LEAST(0), NONE,                                                                  \
      "attention's per-head q.k depth; 0: Trax's 64 (CausalAttention: d_model / n_heads)")                         \
    X(INT, d_attention_value, 0, AT_LEAST(0), NONE,                                                                \
      "attention's per-head value depth; 0: Trax's 64 (CausalAttention: d_model / n_heads)")                       \
    X(STRING, ff_activation, "FastGelu", ANY, NONE, CT_ACTIVATION_NAMES " (Gelu: erf; FastGelu: tanh), as Trax") \
    X(INT, ff_chunk_size, 0, AT_LEAST(0), NONE, "> 0: the feed-forward runs on chunks of this many rows (B*T)")    \
    X(INT, ff_use_sru, 0, AT_LEAST(0), NONE, "> 0: the feed-forward is this many SRU(d_model) layers (Trax's)")    \
    X(STRING, pos_type, NULL, ANY, NULLABLE,                                                                       \
      "None: Trax's trainable table started at the sinusoids, channel dropout; 'no'; 'fixed-base'; 'axial'")       \
    X(BOOL, fixed_positions, false, ANY, NONE,                                                                     \
      "pos_type None: the sinusoids fixed, no weights, no dropout (ctrax's; Trax trains them)")                    \
    X(FLOAT, pos_start_from_zero_prob, "1.0", ANY, UNSTORED, "random start positions in training: not in ctrax")   \
    X(INT, pos_max_offset_to_add, "0", ANY, UNSTORED, "random position offsets: not in ctrax")                     \
    X(INT, ff_sparsity, "0", ANY, UNSTORED, "a sparse feed-forward: not in ctrax")                                 \
    X(STRING, loss_sparsity_type, "'mult'", ANY, UNSTORED, "the kind of sparse output layer: not in ctrax")        \
    X(INT, loss_sparsity, "0", ANY, UNSTORED, "a sparse output layer: not in ctrax")                               \
    X(INT, loss_d_lowrank, "0", ANY, UNSTORED, "a low-rank output layer: not in ctrax")                            \
    X(FLOAT, loss_sparsity_prob, "None", ANY, UNSTORED_NULLABLE, "a sparse output layer's probability: not in ctrax")  \
    X(INT, attention_chunk_size, "0", ANY, UNSTORED, "attention on chunks of the sequence: not in ctrax")          \
    X(STRING, mode, "'train'", ANY, UNSTORED, "the trainer picks train or eval; 'predict' is not supported")
// The attention types a ReformerLM layer can use.
#define CT_REFORMER_MAX_ATTENTION 16
// SelfAttention's and LSHSelfAttention's per-head depths when
// d_attention_key / d_attention_value are 0: Trax's defaults.
#define CT_REFORMER_D_ATTENTION 64
typedef enum ct_reformer_attention {
    CT_REFORMER_CAUSAL_ATTENTION,  // ctrax's full CausalAttention (d_model / n_heads per head)
    CT_REFORMER_SELF_ATTENTION,    // Trax's SelfAttention (self_attention below)
    CT_REFORMER_LSH_ATTENTION,     // Trax's LSHSelfAttention (lsh_attention below)
} ct_reformer_attention;
typedef struct ct_reformer_lm_params {
    CT_REFORMER_LM_PARAMS(CT_PARAM_FIELD)
    // attention_type: one type (n_attention 1) or a list; layer i uses
    // attention[i % n_attention] (n_layers % n_attention == 0, as Trax
    // asserts). Default: {CT_REFORMER_SELF_ATTENTION}, Trax's.
    int n_attention;
    ct_reformer_attention attention[CT_REFORMER_MAX_ATTENTION];
    // The settings of every SelfAttention and LSHSelfAttention layer (what a
    // config binds as SelfAttention.* and LSHSelfAttention.*), but for
    // those ReformerLM passes itself, as Trax does: n_heads, d_qk
    // (d_attention_key), d_v (d_attention_value), causal (true), masked
    // (false) and both dropouts (dropout). Defaults: Trax's.
    ct_self_attention_params self_attention;
    ct_lsh_self_attention_params lsh_attention;
    // pos_type 'axial': Trax's pos_axial_shape and pos_d_axial_embs, n axes.
    int pos_axial_n;
    int pos_axial_shape[CT_AXIAL_MAX_AXES];
    int pos_d_axial_embs[CT_AXIAL_MAX_AXES];
} ct_reformer_lm_params;
ct_reformer_lm_params ct_reformer_lm_default_params(void);

// Whether p is a ReformerLM ctrax can build; if not, writes an error naming
// the parameter (ReformerLM.<param>) into err. ct_reformer_lm asserts it.
ct_status ct_reformer_lm_check(const ct_reformer_lm_params *p, ct_error *err);

// Trax's ReformerLM (models/reformer/reformer.py), int32 tokens (B, T) ->
// logits (B, T, V):
//   ShiftRight(1), Embedding, Dropout, positional encoding (pos_type), Dup,
//   ReversibleSerial(n_layers x [
//     ReversibleHalfResidual(LayerNorm, attention)         named ...Attn,
//     ReversibleSwap,
//     ReversibleHalfResidual(FF)                           named ...FF,
//     ReversibleSwap]),
//   Concatenate (-> 2 d_model), LayerNorm, Dropout, Dense(vocab_size);
// FF = LayerNorm, Dense(d_ff), Dropout, ff_activation, Dense(d_model),
// Dropout, in Chunk(FF, ff_chunk_size) over the B*T rows when > 0.
// attention: CausalAttention(d_model, n_heads, dropout), or
// SelfAttention / LSHSelfAttention(n_heads, d_attention_key, d_attention_value, causal,
// their other settings from self_attention / lsh_attention, both dropouts =
// dropout); layer i uses attention[i % n_attention].
// pos_type None: the trainable table (max_len, D) started at the sinusoids,
// with training dropout over whole channels (one (1, 1, D) mask), as
// Trax's PositionalEncoding. attention_type may also be ctrax's
// CausalAttention (@CausalAttention: Dense q, k, v with biases, d_model /
// n_heads per head), which Trax's ReformerLM cannot take.
// Differences from Trax: dropout masks are not shared along the sequence
// axis (Trax's shared_axes=[-2]; REFORMER.md section 7 leaves the choice
// of masks to ctrax); ids outside the vocabulary are an error (Trax
// clips them); the half-residuals are named
// ReversibleHalfResidualAttn/FF (Trax's ...DecoderAttn is longer than a
// layer name may be); with ff_chunk_size and dropout, each chunk draws its
// own elementwise masks (Trax one (1, D) mask per chunk), so chunking is
// exact only at dropout 0, as in Trax. 'fixed-base' is Trax's
// FixedBasePositionalEncoding with its defaults; 'axial' drops table
// elements at rate dropout with one mask per example and channel, as Trax.
ct_layer *ct_reformer_lm(ct_reformer_lm_params p);

// Trax's RNNLM(vocab_size, d_model, n_layers, rnn_cell,
// rnn_cell_d_state_multiplier, dropout, mode). rnn_cell is the cell's name
// ('LSTMCell' or 'GRUCell'; a config's @trax.layers.GRUCell maps to it).
// Each cell's state is d_model * rnn_cell_d_state_multiplier wide, so an
// LSTMCell needs the multiplier 2 and a GRUCell 1 (ct_rnnlm_check says so).
#define CT_RNNLM_PARAMS(X)                                                                                   \
    X(INT, vocab_size, 256, AT_LEAST(1), NONE, "tokens are 0..vocab_size-1")                                \
    X(INT, d_model, 512, AT_LEAST(1), NONE, "width of the embedding and n_units of each RNN cell")          \
    X(INT, n_layers, 2, AT_LEAST(1), NONE, "stacked RNN cells (Trax asserts 2; ctrax takes any >= 1)")       \
    X(STRING, rnn_cell, "LSTMCell", ANY, NONE, "'LSTMCell' or 'GRUCell'")                                   \
    X(INT, rnn_cell_d_state_multiplier, 2, AT_LEAST(1), NONE,                                                \
      "a cell's state is this many times d_model wide (LSTMCell: 2, GRUCell: 1)")                           \
    X(FLOAT, dropout, 0.1f, UNIT_OPEN, NONE, "dropout rate after the embedding")                           \
    X(STRING, mode, "'train'", ANY, UNSTORED, "the trainer picks train or eval; 'predict' is not supported")
typedef struct ct_rnnlm_params {
    CT_RNNLM_PARAMS(CT_PARAM_FIELD)
} ct_rnnlm_params;
ct_rnnlm_params ct_rnnlm_default_params(void);

// Whether p is an RNNLM ctrax can build; if not, writes an error naming the
// parameter (RNNLM.<param>) and its value into err. ct_rnnlm asserts it.
ct_status ct_rnnlm_check(const ct_rnnlm_params *p, ct_error *err);

// Trax's RNNLM (models/rnn.py), int32 tokens (B, T) -> logits (B, T, V):
//   ShiftRight(1), Embedding(vocab_size, d_model), Dropout(dropout),
//   Branch([], MakeZeroState(n_layers * multiplier)),   zeros (B, n_layers S)
//   Scan(MultiRNNCell, axis 1), Select([0]) (drops the state), Dense(vocab_size)
// with S = d_model * rnn_cell_d_state_multiplier and MultiRNNCell: the state
// split into n_layers parts of S, cell k mapping (x, s_k) -> (x', s_k') in
// series (Trax's SerialWithSideOutputs), the states concatenated again.
// Trax ends with LogSoftmax; ctrax's losses take logits.
ct_layer *ct_rnnlm(ct_rnnlm_params p);

#ifdef __cplusplus
}
#endif
#endif
