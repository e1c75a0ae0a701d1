// Trax's TransformerLM (models/transformer.py), decoder-only.
#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/models/models.h"

ct_transformer_lm_params ct_transformer_lm_default_params(void) {
    return (ct_transformer_lm_params){CT_TRANSFORMER_LM_PARAMS(CT_PARAM_DEFAULT)};
}

// [LayerNorm, Dense(d_ff), activation, Dropout, Dense(d_model), Dropout]:
// Trax's _FeedForwardBlock (the activation before the dropout, where
// ReformerLM's has it after).
static ct_layer *feed_forward(const ct_transformer_lm_params *p) {
    ct_activation_fn activation = ct_activation_named(p->ff_activation);
    return ct_serial(CT_LAYERS(ct_layer_norm(1e-6f), ct_dense(p->d_ff), activation(), ct_dropout(p->dropout),
                               ct_dense(p->d_model), ct_dropout(p->dropout)));
}

// Residual(LayerNorm, CausalAttention, Dropout), Residual(feed-forward)
static ct_layer *decoder_block(const ct_transformer_lm_params *p) {
    ct_layer *attention = ct_residual(
        CT_LAYERS(ct_layer_norm(1e-6f), ct_causal_attention(p->d_model, p->n_heads, p->dropout), ct_dropout(p->dropout)),
        NULL);
    ct_layer *ff = ct_residual(CT_LAYERS(feed_forward(p)), NULL);
    return ct_layer_rename(ct_serial(CT_LAYERS(attention, ff)), "DecoderBlock");
}

ct_layer *ct_transformer_lm(ct_transformer_lm_params p) {
    CT_ASSERT(p.n_layers >= 0 && p.vocab_size > 0 && p.d_model > 0 && ct_activation_named(p.ff_activation));
    int n = 0;
    ct_layer **layers = ct_malloc((size_t)(p.n_layers + 7) * sizeof *layers);
    layers[n++] = ct_shift_right(1);
    layers[n++] = ct_embedding(p.vocab_size, p.d_model);
    layers[n++] = ct_dropout(p.dropout);
    // Trax's PositionalEncoding trains its sinusoid table.
    layers[n++] = p.learned_positions ? ct_positional_encoding_learned(p.max_len)
                  : p.fixed_positions ? ct_positional_encoding_sinusoidal(p.max_len)
                                      : ct_positional_encoding_trainable_sinusoidal(p.max_len, 0.0f);
    for (int i = 0; i < p.n_layers; i++) layers[n++] = decoder_block(&p);
    layers[n++] = ct_layer_norm(1e-6f);
    layers[n++] = ct_dense(p.vocab_size);
    ct_layer *model = ct_layer_rename(ct_serial(n, layers), "TransformerLM");
    ct_free(layers);
    return model;
}
