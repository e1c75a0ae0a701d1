// Trax's ReformerLM (models/reformer/reformer.py), decoder-only and
// reversible (see models.h).
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/efficient_attention.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/models/models.h"

ct_reformer_lm_params ct_reformer_lm_default_params(void) {
    return (ct_reformer_lm_params){CT_REFORMER_LM_PARAMS(CT_PARAM_DEFAULT)};
}

static bool str_is(const char *s, const char *t) { return s && strcmp(s, t) == 0; }

// pos_type None and '' are Trax's PositionalEncoding.
static bool pos_is_default(const char *t) { return !t || !t[0]; }

// The attention and activation settings: which names exist, and that the
// SelfAttention-only settings are not set for CausalAttention (whose
// per-head depth is d_model / n_heads and which has no chunks).
static ct_status check_attention(const ct_reformer_lm_params *p, ct_error *err) {
    const char *a = p->attention_type;
    if (str_is(a, "LSHSelfAttention"))
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.attention_type = 'LSHSelfAttention' is not implemented in ctrax (use "
                            "'SelfAttention' or 'CausalAttention')");
    if (str_is(a, "SelfAttention")) return CT_OK;
    if (!str_is(a, "CausalAttention"))
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.attention_type = '%s' is not supported: 'CausalAttention' or 'SelfAttention'",
                            a ? a : "None");
    int dh = p->d_model / p->n_heads;
    if ((p->d_attention_key && p->d_attention_key != dh) || (p->d_attention_value && p->d_attention_value != dh))
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.d_attention_key/d_attention_value = %d/%d: CausalAttention's heads are "
                            "d_model / n_heads = %d wide (0 or %d; other depths need attention_type 'SelfAttention')",
                            p->d_attention_key, p->d_attention_value, dh, dh);
    const char *set = p->self_attention_chunk_len          ? "chunk_len"
                      : p->self_attention_n_chunks_before ? "n_chunks_before"
                      : p->self_attention_n_chunks_after  ? "n_chunks_after"
                      : p->self_attention_share_qk        ? "share_qk"
                                                          : NULL;
    if (set)
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.self_attention_%s is SelfAttention's setting: set attention_type = "
                            "'SelfAttention' (it is '%s')",
                            set, a);
    return CT_OK;
}

static ct_status check_positions(const ct_reformer_lm_params *p, ct_error *err) {
    const char *t = p->pos_type;
    if (pos_is_default(t) || str_is(t, "no") || str_is(t, "fixed-base")) {
        if (p->pos_axial_n != 0)
            return ct_error_set(err, CT_ERR_ARG,
                                "ReformerLM.pos_axial_shape is set (%d axes) but pos_type is '%s', not 'axial' "
                                "(Trax would silently ignore it)",
                                p->pos_axial_n, t ? t : "None");
        return CT_OK;
    }
    if (!str_is(t, "axial"))
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.pos_type = '%s' is not supported: None, 'no', 'fixed-base' or 'axial'", t);
    if (p->pos_axial_n < 1 || p->pos_axial_n > CT_AXIAL_MAX_AXES)
        return ct_error_set(err, CT_ERR_ARG, "ReformerLM.pos_axial_shape: pos_type 'axial' needs 1 to %d axes, got %d",
                            CT_AXIAL_MAX_AXES, p->pos_axial_n);
    int sum = 0;
    for (int k = 0; k < p->pos_axial_n; k++) {
        if (p->pos_axial_shape[k] < 1 || p->pos_d_axial_embs[k] < 1)
            return ct_error_set(err, CT_ERR_ARG, "ReformerLM.pos_axial_shape[%d] = %d, pos_d_axial_embs[%d] = %d: both "
                                                 "must be >= 1",
                                k, p->pos_axial_shape[k], k, p->pos_d_axial_embs[k]);
        sum += p->pos_d_axial_embs[k];
    }
    if (sum != p->d_model)
        return ct_error_set(err, CT_ERR_ARG, "ReformerLM.pos_d_axial_embs sum to %d, not d_model %d", sum, p->d_model);
    return CT_OK;
}

ct_status ct_reformer_lm_check(const ct_reformer_lm_params *p, ct_error *err) {
    if (p->n_layers < 0 || p->vocab_size < 1 || p->d_model < 1 || p->d_ff < 1 || p->n_heads < 1 || p->max_len < 1)
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM: vocab_size %d, d_model %d, d_ff %d, n_heads %d, max_len %d must be >= 1 and "
                            "n_layers %d >= 0",
                            p->vocab_size, p->d_model, p->d_ff, p->n_heads, p->max_len, p->n_layers);
    if (p->d_model % p->n_heads)
        return ct_error_set(err, CT_ERR_ARG, "ReformerLM: d_model %d does not divide by n_heads %d", p->d_model,
                            p->n_heads);
    if (p->d_attention_key < 0 || p->d_attention_value < 0 || p->ff_chunk_size < 0 || p->self_attention_chunk_len < 0 ||
        p->self_attention_n_chunks_before < 0 || p->self_attention_n_chunks_after < 0)
        return ct_error_set(err, CT_ERR_ARG, "ReformerLM: d_attention_key, d_attention_value, ff_chunk_size and "
                                             "self_attention_* must be >= 0");
    const char *f = p->ff_activation;
    if (!str_is(f, "Relu") && !str_is(f, "Gelu") && !str_is(f, "FastGelu"))
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.ff_activation = '%s' is not supported: 'Relu', 'Gelu' or 'FastGelu'",
                            f ? f : "None");
    CT_TRY(check_attention(p, err));
    return check_positions(p, err);
}

// The attention sublayer: today's CausalAttention, or SelfAttention with
// Trax's ReformerLM arguments (causal, both dropouts = dropout).
static ct_layer *attention(const ct_reformer_lm_params *p) {
    if (!str_is(p->attention_type, "SelfAttention")) return ct_causal_attention(p->d_model, p->n_heads, p->dropout);
    ct_self_attention_params a = ct_self_attention_default_params();
    int dh = p->d_model / p->n_heads;
    a.n_heads = p->n_heads;
    a.d_qk = p->d_attention_key ? p->d_attention_key : dh;
    a.d_v = p->d_attention_value ? p->d_attention_value : dh;
    a.share_qk = p->self_attention_share_qk;
    a.causal = true;
    a.chunk_len = p->self_attention_chunk_len;
    a.n_chunks_before = p->self_attention_n_chunks_before;
    a.n_chunks_after = p->self_attention_n_chunks_after;
    a.attention_dropout = p->dropout;
    a.output_dropout = p->dropout;
    return ct_self_attention(a);
}

// FeedForwardWithOptions: LayerNorm, Dense(d_ff), Dropout, activation (after
// the dropout, as Trax), Dense(d_model), Dropout; (B, T, D) -> (B, T, D).
// Writes the six layers to out.
static void ff_layers(const ct_reformer_lm_params *p, ct_layer **out) {
    out[0] = ct_layer_norm(1e-6f);
    out[1] = ct_dense(p->d_ff);
    out[2] = ct_dropout(p->dropout);
    // Trax's Gelu (approximate=True) and FastGelu are the same tanh formula.
    out[3] = str_is(p->ff_activation, "Relu") ? ct_relu() : ct_gelu();
    out[4] = ct_dense(p->d_model);
    out[5] = ct_dropout(p->dropout);
}

// Trax's DecoderBlock: the attention half-residual and the feed-forward
// half-residual, each followed by a swap. Appends the four layers to out.
// Unchunked, the FF's layers sit directly in the half-residual (the tree,
// names and keys of the model before ff_chunk_size). Chunked, they run on
// row chunks of the (B*T, D) rows (Trax's BatchLeadingAxes(Chunk(FF))):
// equal to the whole at dropout 0; with dropout each chunk draws its own
// masks from its folded key (Trax shares one (1, D) mask per chunk).
static int decoder_block(const ct_reformer_lm_params *p, ct_layer **out) {
    ct_layer *attn = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), attention(p)));
    ct_layer *f[6];
    ff_layers(p, f);
    ct_layer *ff = p->ff_chunk_size > 0
                       ? ct_reversible_half_residual(CT_LAYERS(ct_chunk(ct_serial(6, f), p->ff_chunk_size)))
                       : ct_reversible_half_residual(6, f);
    out[0] = ct_layer_rename(attn, "ReversibleHalfResidualAttn");
    out[1] = ct_reversible_swap();
    out[2] = ct_layer_rename(ff, "ReversibleHalfResidualFF");
    out[3] = ct_reversible_swap();
    return 4;
}

// The positional encoding by pos_type, or NULL for 'no'.
static ct_layer *positions(const ct_reformer_lm_params *p) {
    if (pos_is_default(p->pos_type)) return ct_positional_encoding_sinusoidal(p->max_len);
    if (str_is(p->pos_type, "no")) return NULL;
    if (str_is(p->pos_type, "fixed-base")) return ct_fixed_base_positional_encoding_trax();
    // Trax's ReformerLM: dropout on the table, one mask per example and
    // channel (broadcast over axes 1..K).
    int dims[CT_AXIAL_MAX_AXES];
    for (int k = 0; k < p->pos_axial_n; k++) dims[k] = k + 1;
    return ct_axial_positional_encoding(p->pos_axial_n, p->pos_axial_shape, p->pos_d_axial_embs, p->dropout,
                                        p->pos_axial_n, dims);
}

ct_layer *ct_reformer_lm(ct_reformer_lm_params p) {
    ct_error err = {0};
    if (ct_reformer_lm_check(&p, &err) != CT_OK) ct_abort(__FILE__, __LINE__, "%s", err.msg);
    int n_rev = 4 * p.n_layers;
    ct_layer **blocks = ct_malloc((size_t)(n_rev ? n_rev : 1) * sizeof *blocks);
    for (int i = 0; i < p.n_layers; i++) decoder_block(&p, blocks + 4 * i);
    ct_layer *rev = ct_reversible_serial(n_rev, blocks);
    ct_free(blocks);
    // ShiftRight, Embedding, Dropout, [positions], Dup, rev, Concatenate,
    // LayerNorm, Dropout, Dense: pos_type 'no' leaves positions out.
    ct_layer *l[10];
    int n = 0;
    l[n++] = ct_shift_right(1);
    l[n++] = ct_embedding(p.vocab_size, p.d_model);
    l[n++] = ct_dropout(p.dropout);
    ct_layer *pos = positions(&p);
    if (pos) l[n++] = pos;
    l[n++] = ct_dup();
    l[n++] = rev;
    l[n++] = ct_concatenate(2, -1);
    l[n++] = ct_layer_norm(1e-6f);
    l[n++] = ct_dropout(p.dropout);
    l[n++] = ct_dense(p.vocab_size);
    ct_layer *model = ct_serial(n, l);
    return ct_layer_rename(model, "ReformerLM");
}
