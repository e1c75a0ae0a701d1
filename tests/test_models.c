// Models built from layers: gradient checks of small MLP, TransformerLM and
// ReformerLM (every weight against finite differences), their weight names,
// ReformerLM's options (attention, activation, chunked FF, positions) and
// refusals, and its default against the construction before the options.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gradcheck.h"
#include "train_fixture.h"

static void test_mlp(void) {
    float x[3 * 2 * 4];
    ct_tensor in = ct_tensor_3d(CT_DTYPE_F32, 3, 2, 4, x);
    gradcheck_fill(&in, 3, -1.0f, 1.0f);
    ct_layer *mlp = ct_mlp(3, (int[]){8, 6, 5}, false, true);  // Flatten, Dense, Relu, Dense, Relu, Dense
    CHECK(mlp->n_sub == 6);
    double e = gradcheck("MLP", mlp, &in, 1, gradcheck_default_opts());
    CHECK_MSG(e >= 0 && e < GRADCHECK_TOL, "rel err %g", e);
    ct_layer_free(mlp);
}

static void test_transformer_lm(void) {
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = 7;
    p.d_model = 8;
    p.d_ff = 12;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 16;
    // pos 0: Trax's trainable sinusoids (the default), 1: ctrax's N(0, 0.02^2)
    // table, 2: ctrax's fixed sinusoids (no weights).
    for (int pos = 0; pos < 3; pos++) {
        int learned = pos == 1;
        p.learned_positions = pos == 1;
        p.fixed_positions = pos == 2;
        p.dropout = learned ? 0.2f : 0.0f;  // the checker keeps the key, so the masks are fixed
        int32_t tokens[2 * 5] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 2, 5, tokens);
        ct_layer *lm = ct_transformer_lm(p);
        // A smaller step than the default: with eps 1e-2 (here from 4e-3 on)
        // a weight of one block moves the inputs of a later block's Relu
        // across its kink.
        gradcheck_opts o = gradcheck_model_opts(2e-3);
        static const char *const what[] = {"TransformerLM", "TransformerLM(learned positions, dropout)",
                                           "TransformerLM(fixed positions)"};
        double e = gradcheck(what[pos], lm, &in, 1, o);
        CHECK_MSG(e >= 0 && e < GRADCHECK_MODEL_TOL, "rel err %g", e);

        // The tree and its names: 2 blocks, each 2 residuals.
        ct_device dev = ct_device_cpu();
        ct_net net;
        ct_error err;
        CHECK_OK(ct_net_init(&net, lm, &in, 1, ct_key_from_seed(0), &dev, &err), &err);
        CHECK(net.out_sigs[0].ndim == 3 && net.out_sigs[0].shape[2] == 7);
        CHECK(ct_net_find_param(&net, "TransformerLM/Embedding[1]/embedding") != NULL);
        CHECK(ct_net_find_param(&net, "TransformerLM/Dense[7]/kernel") != NULL);
        CHECK(ct_net_find_param(&net, "TransformerLM/DecoderBlock[5]/Residual[1]/Branch[0]/Parallel[1]/Serial[1]/"
                                      "Dense[1]/kernel") != NULL);
        // Weights: embedding, (positions), 2 x (attention 4 Dense + 2 LayerNorm + 2 Dense), final LayerNorm
        // and Dense.
        size_t d = 8, v = 7, f = 12;
        size_t block = 4 * (d * d + d) + 2 * (2 * d) + (d * f + f) + (f * d + d);
        size_t expect = v * d + (pos != 2 ? 16 * d : 0) + 2 * block + 2 * d + (d * v + v);
        CHECK_MSG(net.n_weights == expect, "%zu weights, expected %zu", net.n_weights, expect);
        // Trax's PositionalEncoding starts its trainable table at the
        // sinusoids: row t, column 2i sin(t / 10000^(2i/D)), 2i+1 its cos.
        const ct_param *pe = ct_net_find_param(&net, "TransformerLM/PositionalEncoding[3]/embedding");
        CHECK((pe != NULL) == (pos != 2));
        if (pe && pos == 0) {
            const float *w = net.weights + pe->offset;
            double worst = 0;
            for (int t = 0; t < 16; t++)
                for (int i = 0; i < 4; i++) {
                    double a = t / pow(10000.0, 2.0 * i / 8.0);
                    worst = fmax(worst, fabs(w[t * 8 + 2 * i] - sin(a)));
                    worst = fmax(worst, fabs(w[t * 8 + 2 * i + 1] - cos(a)));
                }
            CHECK_MSG(worst < 1e-6, "the table is %g from the sinusoids", worst);
        }
        if (pe && pos == 1) {
            const float *w = net.weights + pe->offset;
            double sq = 0;
            for (int k = 0; k < 16 * 8; k++) sq += (double)w[k] * w[k];
            CHECK(sqrt(sq / 128) > 0.01 && sqrt(sq / 128) < 0.04);  // N(0, 0.02^2)
        }
        ct_net_free(&net);
        ct_layer_free(lm);
    }
}

// ---- ReformerLM ----------------------------------------------------------------------------

static ct_reformer_lm_params small_reformer(void) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = 7;
    p.d_model = 8;
    p.d_ff = 12;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 16;
    return p;
}

// ReformerLM as ct_reformer_lm built it before attention_type, pos_type,
// ff_activation and ff_chunk_size existed (a copy of that code): the default
// must stay this model, weight for weight and step for step.
static ct_layer *old_reformer_lm(ct_reformer_lm_params p) {
    ct_layer *blocks[4 * 8];
    CT_ASSERT(p.n_layers <= 8);
    for (int i = 0; i < p.n_layers; i++) {
        ct_layer *attn = ct_reversible_half_residual(
            CT_LAYERS(ct_layer_norm(1e-6f), ct_causal_attention(p.d_model, p.n_heads, p.dropout)));
        ct_layer *ff = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), ct_dense(p.d_ff),
                                                             ct_dropout(p.dropout), ct_gelu(), ct_dense(p.d_model),
                                                             ct_dropout(p.dropout)));
        blocks[4 * i] = ct_layer_rename(attn, "ReversibleHalfResidualAttn");
        blocks[4 * i + 1] = ct_reversible_swap();
        blocks[4 * i + 2] = ct_layer_rename(ff, "ReversibleHalfResidualFF");
        blocks[4 * i + 3] = ct_reversible_swap();
    }
    ct_layer *rev = ct_reversible_serial(4 * p.n_layers, blocks);
    ct_layer *model = ct_serial(CT_LAYERS(
        ct_shift_right(1), ct_embedding(p.vocab_size, p.d_model), ct_dropout(p.dropout),
        ct_positional_encoding_sinusoidal(p.max_len), ct_dup(), rev, ct_concatenate(2, -1),
        ct_layer_norm(1e-6f), ct_dropout(p.dropout), ct_dense(p.vocab_size)));
    return ct_layer_rename(model, "ReformerLM");
}


// The default ReformerLM (dropout 0.1, so the keys matter too) against the
// old construction: the same weights at init and after 3 standard and 3
// memory-efficient steps, bit for bit.
static void test_reformer_default_unchanged(void) {
    ct_reformer_lm_params p = small_reformer();
    p.dropout = 0.1f;
    for (int me = 0; me < 2; me++)
        for (int steps = 0; steps <= 3; steps += 3) {
            ct_layer *a = ct_reformer_lm(p), *b = old_reformer_lm(p);
            size_t na, nb;
            float la, lb;
            float *wa = train_reformer(a, steps, me, &na, &la), *wb = train_reformer(b, steps, me, &nb, &lb);
            CHECK_MSG(wa && wb && na == nb && na > 0 && memcmp(wa, wb, na * sizeof *wa) == 0,
                      "default ReformerLM differs from the old one after %d %s steps", steps,
                      me ? "memory-efficient" : "standard");
            CHECK(steps == 0 || memcmp(&la, &lb, sizeof la) == 0);
            if (steps)
                printf("default ReformerLM vs old construction, %d %s steps: %zu weights bitwise equal, loss %.6f\n",
                       steps, me ? "memory-efficient" : "standard", na, la);
            free(wa), free(wb);
            ct_layer_free(a), ct_layer_free(b);
        }
}

// One ReformerLM option set: builds, passes a gradient check of the whole
// model (with dropout, masks fixed by the checker's key), and trains: 2
// standard steps at dropout 0 equal 2 memory-efficient ones (the reverse
// pass reconstructs the inputs), and a memory-efficient step at dropout 0.1
// is finite.
// eps: 3e-3 with Relu, to keep a later block's inputs on one side of the
// kink (crossed from 5e-3 here) while the float noise, ~1/eps, stays low
// (the shared Wq read 2.2e-3 at 2e-3, 1.3e-3 at 3e-3); 2e-3 where weights
// are tiny and their gradients large (fixed-base: a step of a digit weight
// moves the encoding by up to 14 eps, and the truncation error, ~eps^2,
// read 3.2e-3 at 5e-3, 8.6e-4 at 2e-3); else the default 1e-2, which keeps
// the float noise of a zero gradient (CausalAttention's key bias) well
// below the bar.
static void check_reformer_variant(const char *label, ct_reformer_lm_params p, double eps) {
    int32_t tokens[RB * RT] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5};
    ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, RB, RT, tokens);
    p.dropout = 0.1f;
    gradcheck_opts o = gradcheck_model_opts(eps);
    o.train = true;
    ct_layer *m = ct_reformer_lm(p);
    double e = gradcheck(label, m, &in, 1, o);
    CHECK_MSG(e >= 0 && e < GRADCHECK_MODEL_TOL, "%s: rel err %g", label, e);
    ct_layer_free(m);

    p.dropout = 0.0f;
    m = ct_reformer_lm(p);
    size_t n1, n2;
    float l1, l2;
    float *std = train_reformer(m, 2, false, &n1, &l1), *rev = train_reformer(m, 2, true, &n2, &l2);
    double num = 0, den = 0;
    for (size_t i = 0; std && rev && n1 == n2 && i < n1; i++) {
        num += ((double)std[i] - rev[i]) * ((double)std[i] - rev[i]);
        den += (double)std[i] * std[i];
    }
    double rel = sqrt(num / (den > 0 ? den : 1));
    CHECK_MSG(std && rev && n1 == n2 && isfinite(l1) && rel < 1e-4, "%s: standard vs memory-efficient rel %g", label,
              rel);
    free(std), free(rev);
    ct_layer_free(m);
    p.dropout = 0.1f;
    m = ct_reformer_lm(p);
    float *w = train_reformer(m, 1, true, &n1, &l2);
    CHECK_MSG(w && isfinite(l2), "%s: a memory-efficient step with dropout 0.1 gave loss %g", label, l2);
    printf("%s: grad rel err %.3g; 2 steps standard vs memory-efficient rel %.3g (loss %.4f); %zu weights\n", label,
           e, rel, l1, n1);
    free(w);
    ct_layer_free(m);
}

static void test_reformer_variants(void) {
    ct_reformer_lm_params p = small_reformer();
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;  // chunked local attention: chunks of 2, window previous + own
    p.self_attention.chunk_len = 2;
    p.self_attention.n_chunks_before = 1;
    p.d_attention_key = 3;
    p.d_attention_value = 5;
    check_reformer_variant("ReformerLM(SelfAttention chunk_len 2, before 1, dk 3, dv 5)", p, 1e-2);

    p = small_reformer();
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;  // full, share_qk
    p.self_attention.share_qk = true;
    p.ff_activation = "Relu";
    check_reformer_variant("ReformerLM(SelfAttention full, share_qk; Relu)", p, 3e-3);

    p = small_reformer();
    p.ff_chunk_size = 4;  // 12 rows: 3 chunks
    p.ff_activation = "Gelu";
    check_reformer_variant("ReformerLM(ff_chunk_size 4, Gelu)", p, 1e-2);

    p = small_reformer();
    p.ff_chunk_size = 5;  // does not divide 12 rows: one chunk, as Trax
    p.ff_activation = "FastGelu";
    p.pos_type = "no";
    check_reformer_variant("ReformerLM(ff_chunk_size 5, FastGelu, pos_type 'no')", p, 1e-2);

    p = small_reformer();
    p.pos_type = "fixed-base";
    check_reformer_variant("ReformerLM(pos_type 'fixed-base')", p, 2e-3);

    p = small_reformer();
    p.pos_type = "axial";
    p.pos_axial_n = 2;
    memcpy(p.pos_axial_shape, (int[]){2, 3}, 2 * sizeof(int));
    memcpy(p.pos_d_axial_embs, (int[]){3, 5}, 2 * sizeof(int));
    check_reformer_variant("ReformerLM(pos_type 'axial' (2, 3) / (3, 5))", p, 1e-2);

    // The tree: 'no' drops the positional layer; SelfAttention sits where
    // CausalAttention did; a chunked FF is one Chunk layer.
    p = small_reformer();
    p.pos_type = "no";
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;
    p.ff_chunk_size = 4;
    ct_layer *m = ct_reformer_lm(p);
    CHECK(m->n_sub == 9 && strcmp(m->sub[3]->name, "Dup") == 0);
    ct_layer *rs = m->sub[4];
    CHECK(rs->n_sub == 8);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    int32_t tokens[RB * RT] = {0};
    ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, RB, RT, tokens), sig = ct_tensor_sig(&in);
    CHECK_OK(ct_net_init(&net, m, &sig, 1, ct_key_from_seed(1), &dev, &err), &err);
    // Weights: embedding, 2 x (LayerNorm, SelfAttention 4 x 2 heads x 8 x 4, FF), LayerNorm(16), Dense.
    size_t d = 8, v = 7, f = 12;
    size_t block = 2 * d + 4 * 2 * d * 4 + 2 * d + (d * f + f) + (f * d + d);
    size_t expect = v * d + 2 * block + 2 * 2 * d + (2 * d * v + v);
    CHECK_MSG(net.n_weights == expect, "%zu weights, expected %zu", net.n_weights, expect);
    ct_net_free(&net);
    ct_layer_free(m);
    CHECK(dev.current_bytes == 0);
}

// Each refusal names its parameter.
static void test_reformer_refusals(void) {
    struct {
        const char *param, *needle;
        ct_reformer_lm_params p;
    } c[7];
    int n = 0;
    for (int i = 0; i < 7; i++) c[i].p = small_reformer();
    c[n].p.n_attention = 3, c[n].param = "attention_type", c[n++].needle = "cycle evenly";  // 2 layers
    c[n].p.attention[0] = (ct_reformer_attention)7, c[n].param = "attention_type", c[n++].needle = "not an attention";
    c[n].p.ff_activation = "Swish", c[n].param = "ff_activation", c[n++].needle = "'Swish'";
    c[n].p.pos_type = "sin-cos", c[n].param = "pos_type", c[n++].needle = "'sin-cos'";
    c[n].p.d_attention_key = 3, c[n].param = "d_attention_key", c[n++].needle = "CausalAttention";
    c[n].p.pos_type = "axial", c[n].p.pos_axial_n = 1, c[n].p.pos_axial_shape[0] = 6;
    c[n].p.pos_d_axial_embs[0] = 7, c[n].param = "pos_d_axial_embs", c[n++].needle = "not d_model 8";
    c[n].p.pos_axial_n = 1, c[n].param = "pos_axial_shape", c[n++].needle = "not 'axial'";
    for (int i = 0; i < n; i++) {
        ct_error err = {0};
        CHECK(ct_reformer_lm_check(&c[i].p, &err) == CT_ERR_ARG);
        char want[64];
        snprintf(want, sizeof want, "ReformerLM.%s", c[i].param);
        CHECK_MSG(strstr(err.msg, want) && strstr(err.msg, c[i].needle), "case %d: %s", i, err.msg);
    }
    ct_reformer_lm_params ok = small_reformer();
    ct_error err = {0};
    CHECK_OK(ct_reformer_lm_check(&ok, &err), &err);
}

int main(void) {
    test_mlp();
    test_transformer_lm();
    test_reformer_refusals();
    test_reformer_default_unchanged();
    test_reformer_variants();
    return check_summary("test_models");
}
