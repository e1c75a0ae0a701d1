// Trax's ReformerLM (models/reformer/reformer.py), decoder-only and
// reversible (see models.h).
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/efficient_attention.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/layers/rnn.h"
#include "ctrax/models/models.h"

ct_reformer_lm_params ct_reformer_lm_default_params(void) {
    ct_reformer_lm_params p = {CT_REFORMER_LM_PARAMS(CT_PARAM_DEFAULT)};
    p.n_attention = 1;
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;  // Trax's: full attention (chunk_len None)
    p.self_attention = ct_self_attention_default_params();
    p.lsh_attention = ct_lsh_self_attention_default_params();
    return p;
}

static bool str_is(const char *s, const char *t) { return s && strcmp(s, t) == 0; }

// pos_type None and '' are Trax's PositionalEncoding.
static bool pos_is_default(const char *t) { return !t || !t[0]; }

// The attention types: a list that cycles evenly over the layers (Trax
// asserts n_layers % len == 0), and CausalAttention's fixed head depth.
static ct_status check_attention(const ct_reformer_lm_params *p, ct_error *err) {
    if (p->n_attention < 1 || p->n_attention > CT_REFORMER_MAX_ATTENTION)
        return ct_error_set(err, CT_ERR_ARG, "ReformerLM.attention_type: 1 to %d types, got %d",
                            CT_REFORMER_MAX_ATTENTION, p->n_attention);
    if (p->n_layers % p->n_attention)
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.attention_type: a list of %d types does not cycle evenly over n_layers %d "
                            "(Trax asserts n_layers %% len == 0)",
                            p->n_attention, p->n_layers);
    bool causal = false;
    for (int i = 0; i < p->n_attention; i++) {
        if ((unsigned)p->attention[i] > CT_REFORMER_LSH_ATTENTION)
            return ct_error_set(err, CT_ERR_ARG, "ReformerLM.attention_type[%d] = %d is not an attention type", i,
                                (int)p->attention[i]);
        causal |= p->attention[i] == CT_REFORMER_CAUSAL_ATTENTION;
    }
    int dh = p->d_model / p->n_heads;
    if (causal && ((p->d_attention_key && p->d_attention_key != dh) ||
                   (p->d_attention_value && p->d_attention_value != dh)))
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.d_attention_key/d_attention_value = %d/%d: CausalAttention's heads are "
                            "d_model / n_heads = %d wide (0 or %d; other depths need SelfAttention or "
                            "LSHSelfAttention)",
                            p->d_attention_key, p->d_attention_value, dh, dh);
    return CT_OK;
}

static ct_status check_positions(const ct_reformer_lm_params *p, ct_error *err) {
    const char *t = p->pos_type;
    if (p->fixed_positions && !pos_is_default(t))
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM.fixed_positions = True fixes pos_type None's table, but pos_type is '%s'", t);
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
    // In 64 bits: 8 widths of up to 2^31 - 1 pass an int. The length (the
    // product) is at most 2^31 - 1, as a batch's rows are.
    int64_t sum = 0, length = 1;
    for (int k = 0; k < p->pos_axial_n; k++) {
        if (p->pos_axial_shape[k] < 1 || p->pos_d_axial_embs[k] < 1)
            return ct_error_set(err, CT_ERR_ARG, "ReformerLM.pos_axial_shape[%d] = %d, pos_d_axial_embs[%d] = %d: both "
                                                 "must be >= 1",
                                k, p->pos_axial_shape[k], k, p->pos_d_axial_embs[k]);
        if (length > INT_MAX / p->pos_axial_shape[k])
            return ct_error_set(err, CT_ERR_ARG, "ReformerLM.pos_axial_shape multiplies to more than %d tokens",
                                INT_MAX);
        length *= p->pos_axial_shape[k];
        sum += p->pos_d_axial_embs[k];
    }
    if (sum != p->d_model)
        return ct_error_set(err, CT_ERR_ARG, "ReformerLM.pos_d_axial_embs sum to %lld, not d_model %d", (long long)sum,
                            p->d_model);
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
    if (p->d_attention_key < 0 || p->d_attention_value < 0 || p->ff_chunk_size < 0 || p->ff_use_sru < 0)
        return ct_error_set(err, CT_ERR_ARG,
                            "ReformerLM: d_attention_key, d_attention_value, ff_chunk_size and ff_use_sru must be >= 0");
    if (!ct_activation_named(p->ff_activation))
        return ct_error_set(err, CT_ERR_ARG, "ReformerLM.ff_activation = '%s' is not supported: " CT_ACTIVATION_NAMES,
                            p->ff_activation ? p->ff_activation : "None");
    CT_TRY(check_attention(p, err));
    return check_positions(p, err);
}

// The attention sublayer of a layer of type a, with the arguments Trax's
// DecoderBlock passes (n_heads, d_qk, d_v, causal, masked False, both
// dropouts = dropout) over the type's own settings.
static ct_layer *attention(const ct_reformer_lm_params *p, ct_reformer_attention a) {
    int d_qk = p->d_attention_key ? p->d_attention_key : CT_REFORMER_D_ATTENTION;
    int d_v = p->d_attention_value ? p->d_attention_value : CT_REFORMER_D_ATTENTION;
    if (a == CT_REFORMER_LSH_ATTENTION) {
        ct_lsh_self_attention_params l = p->lsh_attention;
        l.n_heads = p->n_heads, l.d_qk = d_qk, l.d_v = d_v, l.causal = true, l.masked = false;
        l.attention_dropout = l.output_dropout = p->dropout;
        return ct_lsh_self_attention(l);
    }
    if (a == CT_REFORMER_SELF_ATTENTION) {
        ct_self_attention_params s = p->self_attention;
        s.n_heads = p->n_heads, s.d_qk = d_qk, s.d_v = d_v, s.causal = true, s.masked = false;
        s.attention_dropout = s.output_dropout = p->dropout;
        return ct_self_attention(s);
    }
    return ct_causal_attention(p->d_model, p->n_heads, p->dropout);
}

// FeedForwardWithOptions: LayerNorm, Dense(d_ff), Dropout, activation (after
// the dropout, as Trax), Dense(d_model), Dropout; (B, T, D) -> (B, T, D).
// Writes the six layers to out.
static void ff_layers(const ct_reformer_lm_params *p, ct_layer **out) {
    out[0] = ct_layer_norm(1e-6f);
    out[1] = ct_dense(p->d_ff);
    out[2] = ct_dropout(p->dropout);
    out[3] = ct_activation_named(p->ff_activation)();
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
// With ff_use_sru = k the feed-forward is k SRU(d_model) layers instead
// (Trax's FeedForwardWithOptions: no LayerNorm, d_ff unused).
static int decoder_block(const ct_reformer_lm_params *p, ct_reformer_attention a, ct_layer **out) {
    ct_layer *attn = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), attention(p, a)));
    ct_layer *ff;
    if (p->ff_use_sru > 0) {
        ct_layer **sru = ct_malloc((size_t)p->ff_use_sru * sizeof *sru);
        for (int i = 0; i < p->ff_use_sru; i++) sru[i] = ct_sru(p->d_model);
        ff = ct_reversible_half_residual(p->ff_use_sru, sru);
        ct_free(sru);
    } else {
        ct_layer *f[6];
        ff_layers(p, f);
        ff = p->ff_chunk_size > 0 ? ct_reversible_half_residual(CT_LAYERS(ct_chunk(ct_serial(6, f), p->ff_chunk_size)))
                                  : ct_reversible_half_residual(6, f);
    }
    out[0] = ct_layer_rename(attn, "ReversibleHalfResidualAttn");
    out[1] = ct_reversible_swap();
    out[2] = ct_layer_rename(ff, "ReversibleHalfResidualFF");
    out[3] = ct_reversible_swap();
    return 4;
}

// The positional encoding by pos_type, or NULL for 'no'. None: Trax's
// PositionalEncoding, a trainable table started at the sinusoids, with
// dropout over whole channels.
static ct_layer *positions(const ct_reformer_lm_params *p) {
    if (pos_is_default(p->pos_type))
        return p->fixed_positions ? ct_positional_encoding_sinusoidal(p->max_len)
                                  : ct_positional_encoding_trainable_sinusoidal(p->max_len, p->dropout);
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
    for (int i = 0; i < p.n_layers; i++) decoder_block(&p, p.attention[i % p.n_attention], blocks + 4 * i);
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
