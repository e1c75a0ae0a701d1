// Models built from layers: gradient checks of small MLP and TransformerLM
// (every weight against finite differences), and their weight names.
#include "check.h"
#include "gradcheck.h"

static void test_mlp(void) {
    float x[3 * 2 * 4];
    ct_tensor in = ct_tensor_3d(CT_DTYPE_F32, 3, 2, 4, x);
    gradcheck_fill(&in, 3, -1.0f, 1.0f);
    ct_layer *mlp = ct_mlp(3, (int[]){8, 6, 5}, false, true);  // Flatten, Dense, Relu, Dense, Relu, Dense
    CHECK(mlp->n_sub == 6);
    double e = gradcheck("MLP", mlp, &in, 1, gradcheck_default_opts());
    CHECK_MSG(e >= 0 && e < 1e-2, "rel err %g", e);
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
    for (int learned = 0; learned < 2; learned++) {
        p.learned_positions = learned;
        p.dropout = learned ? 0.2f : 0.0f;  // the checker keeps the key, so the masks are fixed
        int32_t tokens[2 * 5] = {1, 2, 3, 4, 5, 6, 0, 1, 2, 3};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 2, 5, tokens);
        ct_layer *lm = ct_transformer_lm(p);
        // A smaller step than the default: with eps 1e-2 a weight of one
        // block moves the inputs of a later block's Relu across its kink.
        gradcheck_opts o = gradcheck_default_opts();
        o.eps = 2e-3;
        double e = gradcheck(learned ? "TransformerLM(learned positions, dropout)" : "TransformerLM", lm, &in, 1, o);
        CHECK_MSG(e >= 0 && e < 1e-2, "rel err %g", e);

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
        size_t expect = v * d + (learned ? 16 * d : 0) + 2 * block + 2 * d + (d * v + v);
        CHECK_MSG(net.n_weights == expect, "%zu weights, expected %zu", net.n_weights, expect);
        ct_net_free(&net);
        ct_layer_free(lm);
    }
}

int main(void) {
    test_mlp();
    test_transformer_lm();
    return check_summary("test_models");
}
