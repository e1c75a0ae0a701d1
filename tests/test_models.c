// Models built from layers: gradient checks of small MLP, TransformerLM and
// ReformerLM (every weight against finite differences), their weight names,
// ReformerLM's options (attention, activation, chunked FF, positions) and
// refusals, and its default against the construction before the options;
// weight counts by hand; TransformerLM against Trax's built by hand.
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
    ct_layer *mlp = ct_mlp(3, (int[]){8, 6, 5}, ct_relu, false, true);  // Flatten, Dense, Relu, Dense, Relu, Dense
    CHECK(mlp->n_sub == 6);
    double e = gradcheck("MLP", mlp, &in, 1, ct_gradcheck_defaults());
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "rel err %g", e);
    // Weights by hand: (3, 2, 4) flattens to 8 features; Dense 8 -> 8 -> 6 -> 5.
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    CHECK_OK(ct_net_init(&net, mlp, &in, 1, ct_key_from_seed(0), &dev, &err), &err);
    size_t expect = (8 * 8 + 8) + (8 * 6 + 6) + (6 * 5 + 5);
    CHECK_MSG(net.n_weights == expect, "%zu weights, expected %zu", net.n_weights, expect);
    CHECK(net.out_sigs[0].ndim == 2 && net.out_sigs[0].shape[0] == 3 && net.out_sigs[0].shape[1] == 5);
    ct_net_free(&net);
    ct_layer_free(mlp);
    // Trax's out_activation=True ends with the activation; flatten=False has
    // no Flatten: Dense, Relu, Dense, Relu.
    mlp = ct_mlp(2, (int[]){8, 5}, ct_relu, true, false);
    CHECK(mlp->n_sub == 4 && strcmp(mlp->sub[0]->name, "Dense") == 0 && strcmp(mlp->sub[3]->name, "Relu") == 0);
    ct_layer_free(mlp);
    // Another activation (Trax's activation_fn) between the Dense layers, and after the last.
    mlp = ct_mlp(2, (int[]){8, 5}, ct_tanh, true, true);
    CHECK(mlp->n_sub == 5 && strcmp(mlp->sub[2]->name, "Tanh") == 0 && strcmp(mlp->sub[4]->name, "Tanh") == 0);
    e = gradcheck("MLP(Tanh)", mlp, &in, 1, ct_gradcheck_defaults());
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "rel err %g", e);
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
        // A smaller step than the default: with eps 1e-2 (here from 2e-3 on,
        // with Trax's embedding scale, U(+-sqrt(3 / d_model))) a weight of
        // one block moves the inputs of a later block's Relu across its kink
        // (the embedding read 3.7e-2 at 2e-3, 1.7e-4 at 1e-3, 2.8e-4 at 5e-4).
        ct_gradcheck_opts o = ct_gradcheck_model_defaults(1e-3);
        static const char *const what[] = {"TransformerLM", "TransformerLM(learned positions, dropout)",
                                           "TransformerLM(fixed positions)"};
        double e = gradcheck(what[pos], lm, &in, 1, o);
        CHECK_MSG(e >= 0 && e < CT_GRADCHECK_MODEL_TOL, "rel err %g", e);

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
                    worst = check_worse(worst, fabs(w[t * 8 + 2 * i] - sin(a)));
                    worst = check_worse(worst, fabs(w[t * 8 + 2 * i + 1] - cos(a)));
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
    // Trax's ff_activation: Dense(d_ff), the activation, then the dropout
    // (_FeedForwardBlock; ReformerLM's has it after the dropout).
    static const char *const activations[] = {"Gelu", "FastGelu", "Tanh", "Sigmoid"};
    p.learned_positions = p.fixed_positions = false;
    p.dropout = 0.1f;
    for (size_t a = 0; a < sizeof activations / sizeof *activations; a++) {
        p.ff_activation = activations[a];
        int32_t tokens[2 * 5] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 2, 5, tokens);
        ct_layer *lm = ct_transformer_lm(p);
        // TransformerLM[4] = DecoderBlock: Residual[1] = Serial(Branch(Serial(FF), Select), Add)...
        const ct_layer *ff = lm->sub[4]->sub[1]->sub[0]->sub[1]->sub[1];
        CHECK_MSG(ff->n_sub == 6 && !strcmp(ff->sub[1]->name, "Dense") && !strcmp(ff->sub[2]->name, activations[a]) &&
                      !strcmp(ff->sub[3]->name, "Dropout"),
                  "%s: the feed-forward block is not Dense, %s, Dropout", activations[a], activations[a]);
        char what[64];
        snprintf(what, sizeof what, "TransformerLM(%s, dropout)", activations[a]);
        double e = gradcheck(what, lm, &in, 1, ct_gradcheck_model_defaults(1e-3));
        CHECK_MSG(e >= 0 && e < CT_GRADCHECK_MODEL_TOL, "%s: rel err %g", what, e);
        ct_layer_free(lm);
    }
}

// Trax's TransformerLM (models/transformer.py) built by hand from layers:
// ShiftRight, Embedding, Dropout, PositionalEncoding (trainable sinusoids,
// no dropout), n_layers x _DecoderBlock [Residual(LayerNorm, CausalAttention,
// Dropout), Residual(_FeedForwardBlock: LayerNorm, Dense(d_ff), Relu,
// Dropout, Dense(d_model), Dropout)], LayerNorm (eps 1e-6), Dense(vocab).
static ct_layer *trax_transformer_lm(ct_transformer_lm_params p) {
    ct_layer *l[7 + 8];
    CT_ASSERT(p.n_layers <= 8);
    int n = 0;
    l[n++] = ct_shift_right(1);
    l[n++] = ct_embedding(p.vocab_size, p.d_model);
    l[n++] = ct_dropout(p.dropout);
    l[n++] = ct_positional_encoding_trainable_sinusoidal(p.max_len, 0.0f);
    for (int i = 0; i < p.n_layers; i++) {
        ct_layer *attn = ct_residual(CT_LAYERS(ct_layer_norm(1e-6f),
                                               ct_causal_attention(p.d_model, p.n_heads, p.dropout),
                                               ct_dropout(p.dropout)),
                                     NULL);
        ct_layer *ff = ct_residual(CT_LAYERS(ct_serial(CT_LAYERS(ct_layer_norm(1e-6f), ct_dense(p.d_ff), ct_relu(),
                                                                 ct_dropout(p.dropout), ct_dense(p.d_model),
                                                                 ct_dropout(p.dropout)))),
                                   NULL);
        l[n++] = ct_layer_rename(ct_serial(CT_LAYERS(attn, ff)), "DecoderBlock");
    }
    l[n++] = ct_layer_norm(1e-6f);
    l[n++] = ct_dense(p.vocab_size);
    return ct_layer_rename(ct_serial(n, l), "TransformerLM");
}

// The default TransformerLM at dropout 0.1 (every dropout draws, so their
// places and keys matter) against Trax's built by hand: the same weights
// after 3 training steps, bit for bit.
static void test_transformer_lm_is_trax(void) {
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = 7, p.d_model = 8, p.d_ff = 12, p.n_layers = 2, p.n_heads = 2, p.max_len = 16;
    p.dropout = 0.1f;
    ct_layer *a = ct_transformer_lm(p), *b = trax_transformer_lm(p);
    size_t na, nb;
    float la, lb;
    float *wa = train_reformer(a, 3, false, &na, &la), *wb = train_reformer(b, 3, false, &nb, &lb);
    bool same = wa && wb && na == nb && na > 0 && memcmp(wa, wb, na * sizeof *wa) == 0 &&
                memcmp(&la, &lb, sizeof la) == 0;
    printf("TransformerLM(dropout 0.1) vs Trax's by hand, 3 steps: %zu weights %s, loss %.6f / %.6f\n", na,
           same ? "bitwise equal" : "DIFFER", la, lb);
    CHECK(same);
    free(wa), free(wb);
    ct_layer_free(a), ct_layer_free(b);
}

// ---- ReformerLM ----------------------------------------------------------------------------

// Small sizes; heads of d_model / n_heads = 4 (Trax's default depth, 64,
// would dwarf d_model 8).
static ct_reformer_lm_params small_reformer(void) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = 7;
    p.d_model = 8;
    p.d_ff = 12;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 16;
    p.d_attention_key = p.d_attention_value = 4;
    return p;
}

// ReformerLM at Trax's defaults (REFORMER.md section 1), built by hand from
// layers: full causal SelfAttention with the given depths and both dropouts
// at dropout, Trax's trainable position table with its channel dropout,
// FastGelu (the tanh GELU; ff_activation 'Gelu': Trax's exact erf one).
// ct_reformer_lm's defaults must be this model, weight for weight and step
// for step.
static ct_layer *trax_default_reformer_lm(ct_reformer_lm_params p) {
    ct_layer *blocks[4 * 8];
    CT_ASSERT(p.n_layers <= 8);
    for (int i = 0; i < p.n_layers; i++) {
        ct_self_attention_params sa = ct_self_attention_default_params();
        sa.n_heads = p.n_heads, sa.d_qk = p.d_attention_key, sa.d_v = p.d_attention_value, sa.causal = true;
        sa.attention_dropout = sa.output_dropout = p.dropout;
        ct_layer *attn = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), ct_self_attention(sa)));
        ct_layer *ff = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), ct_dense(p.d_ff),
                                                             ct_dropout(p.dropout),
                                                             strcmp(p.ff_activation, "Gelu") ? ct_gelu() : ct_gelu_erf(),
                                                             ct_dense(p.d_model),
                                                             ct_dropout(p.dropout)));
        blocks[4 * i] = ct_layer_rename(attn, "ReversibleHalfResidualAttn");
        blocks[4 * i + 1] = ct_reversible_swap();
        blocks[4 * i + 2] = ct_layer_rename(ff, "ReversibleHalfResidualFF");
        blocks[4 * i + 3] = ct_reversible_swap();
    }
    ct_layer *rev = ct_reversible_serial(4 * p.n_layers, blocks);
    ct_layer *model = ct_serial(CT_LAYERS(
        ct_shift_right(1), ct_embedding(p.vocab_size, p.d_model), ct_dropout(p.dropout),
        ct_positional_encoding_trainable_sinusoidal(p.max_len, p.dropout), ct_dup(), rev, ct_concatenate(2, -1),
        ct_layer_norm(1e-6f), ct_dropout(p.dropout), ct_dense(p.vocab_size)));
    return ct_layer_rename(model, "ReformerLM");
}


// The default ReformerLM (dropout 0.1, so the keys matter too) against
// Trax's, built by hand: the same weights at init and after 3 standard and 3
// memory-efficient steps, bit for bit.
static void test_reformer_default_unchanged(void) {
    ct_reformer_lm_params p = small_reformer();
    p.dropout = 0.1f;
    p.d_attention_key = p.d_attention_value = 0;  // unbound: Trax's 64
    for (int me = 0; me < 2; me++)
        for (int steps = 0; steps <= 3; steps += 3) {
            ct_reformer_lm_params trax = p;
            trax.d_attention_key = trax.d_attention_value = 64;
            ct_layer *a = ct_reformer_lm(p), *b = trax_default_reformer_lm(trax);
            size_t na, nb;
            float la, lb;
            float *wa = train_reformer(a, steps, me, &na, &la), *wb = train_reformer(b, steps, me, &nb, &lb);
            CHECK_MSG(wa && wb && na == nb && na > 0 && memcmp(wa, wb, na * sizeof *wa) == 0,
                      "default ReformerLM differs from Trax's after %d %s steps", steps,
                      me ? "memory-efficient" : "standard");
            CHECK(steps == 0 || memcmp(&la, &lb, sizeof la) == 0);
            if (steps)
                printf("default ReformerLM vs Trax's by hand, %d %s steps: %zu weights bitwise equal, loss %.6f\n",
                       steps, me ? "memory-efficient" : "standard", na, la);
            free(wa), free(wb);
            ct_layer_free(a), ct_layer_free(b);
        }
    // ff_activation 'Gelu' is Trax's exact Gelu, x / 2 (1 + erf(x / sqrt 2)),
    // not FastGelu's tanh (they differ by up to ~5e-4, 1.5e-4 at x = 1).
    p.ff_activation = "Gelu";
    ct_reformer_lm_params trax = p;
    trax.d_attention_key = trax.d_attention_value = 64;
    ct_layer *a = ct_reformer_lm(p), *b = trax_default_reformer_lm(trax);
    size_t na, nb;
    float la, lb;
    float *wa = train_reformer(a, 3, false, &na, &la), *wb = train_reformer(b, 3, false, &nb, &lb);
    bool same = wa && wb && na == nb && na > 0 && memcmp(wa, wb, na * sizeof *wa) == 0;
    printf("ReformerLM(ff_activation 'Gelu') vs Trax's by hand with the erf Gelu, 3 standard steps: %s\n",
           same ? "bitwise equal" : "DIFFER");
    CHECK(same && memcmp(&la, &lb, sizeof la) == 0);
    free(wa), free(wb);
    ct_layer_free(a), ct_layer_free(b);
}

// One ReformerLM option set: builds, passes a gradient check of the whole
// model (with dropout, masks fixed by the checker's key), and trains: 2
// standard steps at dropout 0 equal 2 memory-efficient ones (the reverse
// pass reconstructs the inputs), and a memory-efficient step at dropout 0.1
// is finite.
// o: the check's options (ct_gradcheck_model_defaults(eps), its seed the init's):
// eps 3e-3 with Relu, to keep a later block's inputs on one side of the
// kink while the float noise, ~1/eps, stays low; fixed-base's tol below;
// else the default 1e-2, which keeps the float noise of a zero gradient (a
// key bias) well below the bar.
static void check_reformer_variant(const char *label, ct_reformer_lm_params p, ct_gradcheck_opts o, double tol) {
    int32_t tokens[RB * RT] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5};
    ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, RB, RT, tokens);
    p.dropout = 0.1f;
    o.train = true;
    ct_layer *m = ct_reformer_lm(p);
    double e = gradcheck(label, m, &in, 1, o);
    CHECK_MSG(e >= 0 && e < tol, "%s: rel err %g", label, e);
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
    // Both are the same arithmetic but for summation order: 8.4e-7 at most
    // (ff_chunk_size 4, Gelu), the rest below 1e-7. Adam all but hides a
    // gradient's scale (step 1 is about lr * g / |g|): memory-efficient
    // gradients 1.2 times too large read only 2.8e-5 to 7.6e-5 here, so the
    // bound is 1e-5 (1e-4 passed all 6 variants with them).
    CHECK_MSG(std && rev && n1 == n2 && isfinite(l1) && rel < 1e-5, "%s: standard vs memory-efficient rel %g", label,
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
    check_reformer_variant("ReformerLM(SelfAttention chunk_len 2, before 1, dk 3, dv 5)", p, ct_gradcheck_model_defaults(1e-2),
                           CT_GRADCHECK_MODEL_TOL);

    p = small_reformer();
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;  // full, share_qk
    p.self_attention.share_qk = true;
    p.ff_activation = "Relu";
    // Seed 3: at the default seed, with Trax's inits, a Relu input of the
    // first feed-forward sits within 1e-3 of its kink (2.4e-2 at eps 3e-3,
    // 1.8e-2 at 1e-3); seed 3 reads 2.1e-4 at 3e-3.
    ct_gradcheck_opts relu = ct_gradcheck_model_defaults(3e-3);
    relu.seed = 3;
    check_reformer_variant("ReformerLM(SelfAttention full, share_qk; Relu)", p, relu, CT_GRADCHECK_MODEL_TOL);

    p = small_reformer();
    p.ff_chunk_size = 4;  // 12 rows: 3 chunks
    p.ff_activation = "Gelu";
    check_reformer_variant("ReformerLM(ff_chunk_size 4, Gelu)", p, ct_gradcheck_model_defaults(1e-2), CT_GRADCHECK_MODEL_TOL);

    p = small_reformer();
    p.ff_chunk_size = 5;  // does not divide 12 rows: one chunk, as Trax
    p.ff_activation = "FastGelu";
    p.pos_type = "no";
    check_reformer_variant("ReformerLM(ff_chunk_size 5, FastGelu, pos_type 'no')", p, ct_gradcheck_model_defaults(1e-2),
                           CT_GRADCHECK_MODEL_TOL);

    p = small_reformer();
    p.pos_type = "fixed-base";
    // Fixed-base digit weights are multiplied by digits up to 14, and with
    // Trax's small embedding (U(+-sqrt(3 / d_model))) the encoding dominates
    // the residual stream: the digit weights' truncation error (~eps^2) read
    // 6.3e-3 at eps 2e-3 and their float noise (~1 / eps) 5.6e-3 at 2.5e-4,
    // 2.7e-3 at 1e-3 between them (4.1e-3 at 5e-4; seed 3 up to 6e-2 at
    // 2e-3). Their own layer check (test_positions_chunk) holds
    // CT_GRADCHECK_TOL; here 6e-3, so a scale error above 1.2% still fails.
    check_reformer_variant("ReformerLM(pos_type 'fixed-base')", p, ct_gradcheck_model_defaults(1e-3), 6e-3);

    p = small_reformer();
    p.pos_type = "axial";
    p.pos_axial_n = 2;
    memcpy(p.pos_axial_shape, (int[]){2, 3}, 2 * sizeof(int));
    memcpy(p.pos_d_axial_embs, (int[]){3, 5}, 2 * sizeof(int));
    check_reformer_variant("ReformerLM(pos_type 'axial' (2, 3) / (3, 5))", p, ct_gradcheck_model_defaults(1e-2),
                           CT_GRADCHECK_MODEL_TOL);

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

    // A list of attention types cycles over the layers (Trax: layer i takes
    // entry i % len): {SelfAttention, CausalAttention} over 4 layers.
    p = small_reformer();
    p.n_layers = 4;
    p.n_attention = 2;
    p.attention[0] = CT_REFORMER_SELF_ATTENTION;
    p.attention[1] = CT_REFORMER_CAUSAL_ATTENTION;
    m = ct_reformer_lm(p);
    rs = m->sub[5];  // ShiftRight, Embedding, Dropout, PositionalEncoding, Dup, ReversibleSerial
    CHECK(rs->n_sub == 16);
    for (int i = 0; i < 4 && rs->n_sub == 16; i++) {
        // ReversibleHalfResidualAttn: Serial(LayerNorm, attention)
        const char *name = rs->sub[4 * i]->sub[0]->sub[1]->name, *want = i % 2 ? "CausalAttention" : "SelfAttention";
        CHECK_MSG(!strcmp(name, want), "ReformerLM layer %d's attention is %s, not %s", i, name, want);
    }
    ct_layer_free(m);

    // d_attention_value unbound is Trax's 64 whatever d_attention_key is.
    size_t n_dv[2];
    for (int bound = 0; bound < 2; bound++) {
        p = small_reformer();
        p.attention[0] = CT_REFORMER_SELF_ATTENTION;
        p.d_attention_key = 4;
        p.d_attention_value = bound ? 64 : 0;
        m = ct_reformer_lm(p);
        CHECK_OK(ct_net_init(&net, m, &sig, 1, ct_key_from_seed(1), &dev, &err), &err);
        n_dv[bound] = net.n_weights;
        ct_net_free(&net);
        ct_layer_free(m);
    }
    CHECK_MSG(n_dv[0] == n_dv[1], "d_attention_value unbound: %zu weights, bound to 64: %zu", n_dv[0], n_dv[1]);
}

// Each refusal names its parameter.
static void test_reformer_refusals(void) {
    struct {
        const char *param, *needle;
        ct_reformer_lm_params p;
    } c[9];
    int n = 0;
    for (int i = 0; i < 9; i++) c[i].p = small_reformer();
    c[n].p.n_attention = 3, c[n].param = "attention_type", c[n++].needle = "cycle evenly";  // 2 layers
    c[n].p.attention[0] = (ct_reformer_attention)7, c[n].param = "attention_type", c[n++].needle = "not an attention";
    c[n].p.ff_activation = "Swish", c[n].param = "ff_activation", c[n++].needle = "'Swish'";
    c[n].p.pos_type = "sin-cos", c[n].param = "pos_type", c[n++].needle = "'sin-cos'";
    c[n].p.attention[0] = CT_REFORMER_CAUSAL_ATTENTION;
    c[n].p.d_attention_key = 3, c[n].param = "d_attention_key", c[n++].needle = "CausalAttention";
    c[n].p.pos_type = "axial", c[n].p.pos_axial_n = 1, c[n].p.pos_axial_shape[0] = 6;
    c[n].p.pos_d_axial_embs[0] = 7, c[n].param = "pos_d_axial_embs", c[n++].needle = "not d_model 8";
    c[n].p.pos_axial_n = 1, c[n].param = "pos_axial_shape", c[n++].needle = "not 'axial'";
    // 65536 x 65536 positions pass an int only as a product in 64 bits.
    c[n].p.pos_type = "axial", c[n].p.pos_axial_n = 2, c[n].p.pos_axial_shape[0] = c[n].p.pos_axial_shape[1] = 65536;
    c[n].p.pos_d_axial_embs[0] = c[n].p.pos_d_axial_embs[1] = 4;
    c[n].param = "pos_axial_shape", c[n++].needle = "more than 2147483647 tokens";
    c[n].p.pos_type = "no", c[n].p.fixed_positions = true, c[n].param = "fixed_positions", c[n++].needle = "'no'";
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
    // pos_type None: Trax's trainable table (max_len, d_model), or with
    // fixed_positions the sinusoids alone, no weights.
    size_t n_weights[2];
    for (int fixed = 0; fixed < 2; fixed++) {
        ok.fixed_positions = fixed;
        ct_layer *m = ct_reformer_lm(ok);
        int32_t tokens[RB * RT] = {0};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, RB, RT, tokens), sig = ct_tensor_sig(&in);
        ct_device dev = ct_device_cpu();
        ct_net net;
        CHECK_OK(ct_net_init(&net, m, &sig, 1, ct_key_from_seed(1), &dev, &err), &err);
        n_weights[fixed] = net.n_weights;
        CHECK((ct_net_find_param(&net, "ReformerLM/PositionalEncoding[3]/embedding") != NULL) == !fixed);
        ct_net_free(&net);
        ct_layer_free(m);
    }
    CHECK_MSG(n_weights[0] - n_weights[1] == (size_t)ok.max_len * ok.d_model, "%zu and %zu weights", n_weights[0],
              n_weights[1]);
}

int main(void) {
    test_mlp();
    test_transformer_lm();
    test_transformer_lm_is_trax();
    test_reformer_refusals();
    test_reformer_default_unchanged();
    test_reformer_variants();
    return check_summary("test_models");
}
