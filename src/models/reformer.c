// Trax's ReformerLM (models/reformer/reformer.py), decoder-only and
// reversible, with full causal attention (see models.h).
#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/models/models.h"

ct_reformer_lm_params ct_reformer_lm_default_params(void) {
    return (ct_reformer_lm_params){CT_REFORMER_LM_PARAMS(CT_PARAM_DEFAULT)};
}

// Trax's DecoderBlock: the attention half-residual and the feed-forward
// half-residual (FeedForwardWithOptions: LayerNorm, Dense(d_ff), Dropout,
// FastGelu, Dense(d_model), Dropout), each followed by a swap. Appends the
// four layers to out.
static int decoder_block(const ct_reformer_lm_params *p, ct_layer **out) {
    ct_layer *attn = ct_reversible_half_residual(
        CT_LAYERS(ct_layer_norm(1e-6f), ct_causal_attention(p->d_model, p->n_heads, p->dropout)));
    ct_layer *ff = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), ct_dense(p->d_ff),
                                                         ct_dropout(p->dropout), ct_gelu(),
                                                         ct_dense(p->d_model), ct_dropout(p->dropout)));
    out[0] = ct_layer_rename(attn, "ReversibleHalfResidualAttn");
    out[1] = ct_reversible_swap();
    out[2] = ct_layer_rename(ff, "ReversibleHalfResidualFF");
    out[3] = ct_reversible_swap();
    return 4;
}

ct_layer *ct_reformer_lm(ct_reformer_lm_params p) {
    CT_ASSERT(p.n_layers >= 0 && p.vocab_size > 0 && p.d_model > 0 && p.d_ff > 0);
    int n_rev = 4 * p.n_layers;
    ct_layer **blocks = ct_malloc((size_t)(n_rev ? n_rev : 1) * sizeof *blocks);
    for (int i = 0; i < p.n_layers; i++) decoder_block(&p, blocks + 4 * i);
    ct_layer *rev = ct_reversible_serial(n_rev, blocks);
    ct_free(blocks);
    ct_layer *model = ct_serial(CT_LAYERS(
        ct_shift_right(1), ct_embedding(p.vocab_size, p.d_model), ct_dropout(p.dropout),
        ct_positional_encoding_sinusoidal(p.max_len), ct_dup(), rev, ct_concatenate(2, -1),
        ct_layer_norm(1e-6f), ct_dropout(p.dropout), ct_dense(p.vocab_size)));
    return ct_layer_rename(model, "ReformerLM");
}
