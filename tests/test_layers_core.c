// Gradient checks and value tests for the core layers: activations,
// softmaxes, LayerNorm, Dropout, Embedding, positional encodings,
// ShiftRight, Flatten and Mean.
#include <omp.h>
#include <stdlib.h>

#include "layer_fixture.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/vmath.h"

// ---- gradient checks -----------------------------------------------------------

static void test_activation_gradients(void) {
    float a[4 * 6], b[4 * 6];
    ct_tensor x = uniform(ct_tensor_2d(CT_DTYPE_F32, 4, 6, a), 1, -2.0f, 2.0f);
    check_layer("Gelu", ct_gelu(), &x, 1, true);
    check_layer("Gelu (erf)", ct_gelu_erf(), &x, 1, true);
    check_layer("Tanh", ct_tanh(), &x, 1, true);
    check_layer("Sigmoid", ct_sigmoid(), &x, 1, true);
    // Behind a layer, in a Serial: the input may be donated; the GELUs save
    // it for backward, so they must not write their output over it.
    check_layer("Dense-FastGelu", ct_serial(CT_LAYERS(ct_dense(6), ct_gelu())), &x, 1, true);
    check_layer("Dense-Gelu", ct_serial(CT_LAYERS(ct_dense(6), ct_gelu_erf())), &x, 1, true);

    // Relu away from its kink: |x| >= 0.1, well beyond the step 1e-2.
    ct_tensor r = uniform(ct_tensor_2d(CT_DTYPE_F32, 4, 6, b), 2, -1.0f, 1.0f);
    for (int i = 0; i < 24; i++) b[i] = b[i] < 0 ? b[i] - 0.1f : b[i] + 0.1f;
    check_layer("Relu", ct_relu(), &r, 1, true);

    // Several rows, and a rank-3 input whose rows are the last axis.
    float c[5 * 7], d[2 * 3 * 5];
    ct_tensor rows = uniform(ct_tensor_2d(CT_DTYPE_F32, 5, 7, c), 3, -2.0f, 2.0f);
    ct_tensor cube = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 3, 5, d), 4, -2.0f, 2.0f);
    check_layer("LogSoftmax", ct_log_softmax(), &rows, 1, true);
    check_layer("LogSoftmax(rank 3)", ct_log_softmax(), &cube, 1, true);
    check_layer("Softmax", ct_softmax(), &rows, 1, true);
    check_layer("Softmax(rank 3)", ct_softmax(), &cube, 1, true);
}

static void test_layer_norm_gradients(void) {
    float a[4 * 6], b[2 * 3 * 8];
    ct_tensor x = uniform(ct_tensor_2d(CT_DTYPE_F32, 4, 6, a), 5, -1.0f, 1.0f);
    ct_tensor y = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 3, 8, b), 6, -2.0f, 2.0f);
    check_layer("LayerNorm", ct_layer_norm(1e-6f), &x, 1, true);
    check_layer("LayerNorm(rank 3)", ct_layer_norm(1e-6f), &y, 1, true);
    // Weights in front and behind, so scale and bias see varied gradients.
    check_layer("Dense-LayerNorm-Dense", ct_serial(CT_LAYERS(ct_dense(6), ct_layer_norm(1e-6f), ct_dense(3))),
                &x, 1, true);
    // At init the scale is 1 and the bias 0, where a backward that forgot
    // the scale would pass: once more with both moved by up to 0.5.
    ct_gradcheck_opts o = ct_gradcheck_defaults();
    o.weight_noise = 0.5f;
    ct_layer *ln = ct_layer_norm(1e-6f);
    double e = gradcheck("LayerNorm(scale, bias moved)", ln, &x, 1, o);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "LayerNorm with scale and bias moved: rel err %g", e);
    ct_layer_free(ln);
}

static void test_other_gradients(void) {
    float a[8 * 16];
    ct_tensor x = uniform(ct_tensor_2d(CT_DTYPE_F32, 8, 16, a), 7, -1.0f, 1.0f);
    // Train mode with a fixed key: every forward draws the same mask.
    check_layer("Dropout(0.5) train", ct_dropout(0.5f), &x, 1, true);

    // Ids with repeats (3 three times, 0 twice): their rows' gradients add up.
    int32_t ids[2 * 4] = {0, 3, 3, 1, 4, 3, 0, 2};
    ct_tensor t = ct_tensor_2d(CT_DTYPE_I32, 2, 4, ids);
    check_layer("Embedding", ct_embedding(5, 3), &t, 1, true);
    check_layer("Embedding-Dense", ct_serial(CT_LAYERS(ct_embedding(5, 3), ct_dense(2))), &t, 1, true);

    float b[2 * 4 * 3];
    ct_tensor s = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 4, 3, b), 8, -1.0f, 1.0f);
    check_layer("PositionalEncoding(learned)", ct_positional_encoding_learned(6), &s, 1, true);
    check_layer("PositionalEncoding(sinusoidal)", ct_positional_encoding_sinusoidal(6), &s, 1, true);
    // Trax's trainable table with its channel dropout (train mode, fixed key).
    check_layer("PositionalEncoding(trainable sinusoids, dropout 0.5)",
                ct_positional_encoding_trainable_sinusoidal(6, 0.5f), &s, 1, true);
    check_layer("Dense-PosEnc(sinusoidal)",
                ct_serial(CT_LAYERS(ct_dense(3), ct_positional_encoding_sinusoidal(4))), &s, 1, true);

    check_layer("ShiftRight(1) f32", ct_shift_right(1), &s, 1, true);
    float c[3 * 5];
    ct_tensor m = uniform(ct_tensor_2d(CT_DTYPE_F32, 3, 5, c), 9, -1.0f, 1.0f);
    check_layer("ShiftRight(2) f32 rank 2", ct_shift_right(2), &m, 1, true);
    // Int ids: nothing to differentiate; this checks it runs and pops its tape.
    check_layer("ShiftRight(1) i32", ct_shift_right(1), &t, 1, true);
    check_layer("ShiftRight(1)-Embedding", ct_serial(CT_LAYERS(ct_shift_right(1), ct_embedding(5, 3))), &t, 1, true);

    check_layer("Flatten(1)", ct_flatten(1), &s, 1, true);
    check_layer("Flatten(2)", ct_flatten(2), &s, 1, true);
    check_layer("Flatten(0)-Dense", ct_serial(CT_LAYERS(ct_flatten(0), ct_dense(2))), &s, 1, true);

    check_layer("Mean(1, keepdims)", ct_mean(1, true), &s, 1, true);
    check_layer("Mean(1)", ct_mean(1, false), &s, 1, true);
    check_layer("Mean(-1)", ct_mean(-1, false), &s, 1, true);
    check_layer("Mean(0, keepdims)", ct_mean(0, true), &s, 1, true);
}

// ---- values ---------------------------------------------------------------------------

// Runs a one-input layer forward (eval mode) and returns its output.
static ct_tensor run1(fixture *f, ct_layer *l, ct_tensor x) {
    ct_tensor out;
    memset(&out, 0, sizeof out);
    CHECK_OK(fixture_init(f, l, &x, 1, false), &f->err);
    ct_layer_free(l);
    CHECK_OK(fixture_forward(f, &x, &out, 1), &f->err);
    return out;
}

static void test_activation_values(void) {
    // gelu(x) = x/2 (1 + tanh(0.7978845608 x (1 + 0.044715 x^2))), in double:
    // gelu(1) = 0.5 (1 + tanh(0.7978845608 * 1.044715)) = 0.5 (1 + tanh(0.833556))
    //         = 0.5 * 1.682384 = 0.841192.
    float xs[6] = {-2.0f, -0.5f, 0.0f, 0.5f, 1.0f, 3.0f};
    const double want[6] = {-0.04540230591282446, -0.15428599017516514, 0.0,
                            0.34571400982483486, 0.841191990607477, 2.9963626079181394};
    fixture f;
    ct_tensor out = run1(&f, ct_gelu(), ct_tensor_1d(CT_DTYPE_F32, 6, xs));
    for (int i = 0; i < 6; i++) CHECK_NEAR(ct_f32(&out)[i], want[i], 1e-6);
    fixture_free(&f);

    // Trax's Gelu, exact: x/2 (1 + erf(x / sqrt 2)) (values from Python's math.erf),
    // gelu(1) = 0.8413447460685429, 1.5e-4 above the tanh form's.
    const double want_erf[6] = {-0.04550026389635842, -0.15426876936299344, 0.0,
                                0.34573123063700656, 0.8413447460685429, 2.99595030590511};
    out = run1(&f, ct_gelu_erf(), ct_tensor_1d(CT_DTYPE_F32, 6, xs));
    for (int i = 0; i < 6; i++) CHECK_NEAR(ct_f32(&out)[i], want_erf[i], 1e-6);

    // The erf form's derivative through the layer (its own backward kernel,
    // not the tanh form's, which is off by up to ~2e-4 here):
    // d/dx x Phi(x) = Phi(x) + x phi(x).
    {
        ct_tensor xt = ct_tensor_1d(CT_DTYPE_F32, 6, xs), g = ct_tensor_sig(&out), gin;
        float ones[6] = {1, 1, 1, 1, 1, 1};
        g.data = ones;
        CHECK_OK(fixture_forward(&f, &xt, &out, 1), &f.err);
        CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(1), &f.err), &f.err);
        for (int i = 0; i < 6; i++) {
            const double inv_sqrt_2pi = 0.3989422804014327;
            double x = xs[i], want_d = 0.5 * (1 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) * inv_sqrt_2pi;
            CHECK_NEAR(ct_f32(&gin)[i], want_d, 1e-6);
        }
    }
    fixture_free(&f);
    // Trax's names: FastGelu is the tanh form, Gelu the erf one.
    ct_layer *named[2] = {ct_gelu(), ct_gelu_erf()};
    CHECK(strcmp(named[0]->name, "FastGelu") == 0 && strcmp(named[1]->name, "Gelu") == 0);
    ct_layer_free(named[0]);
    ct_layer_free(named[1]);

    // The GELU kernels (their own vectorized tanh) against double, over
    // [-12, 12]: value and derivative.
    enum { N_SWEEP = 24001 };
    float *sx = malloc(N_SWEEP * sizeof *sx), *sy = malloc(N_SWEEP * sizeof *sy);
    float *ones = malloc(N_SWEEP * sizeof *ones), *sd = calloc(N_SWEEP, sizeof *sd);
    for (int i = 0; i < N_SWEEP; i++) {
        sx[i] = -12.0f + 0.001f * (float)i;
        ones[i] = 1.0f;
    }
    ct_gelu_forward(sy, sx, N_SWEEP);
    ct_gelu_backward(sd, sx, ones, N_SWEEP);
    double worst_y = 0, worst_d = 0;
    for (int i = 0; i < N_SWEEP; i++) {
        double x = sx[i], s = 0.7978845608, c = 0.044715, t = tanh(s * (x + c * x * x * x));
        double y = 0.5 * x * (1 + t), d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * s * (1 + 3 * c * x * x);
        worst_y = check_worse(worst_y, fabs(sy[i] - y) / (1 + fabs(y)));
        worst_d = check_worse(worst_d, fabs(sd[i] - d));
    }
    printf("gelu kernels over [-12, 12]: worst value error %.2g (relative to 1 + |y|), derivative %.2g\n", worst_y,
           worst_d);
    CHECK_MSG(worst_y < 1e-6 && worst_d < 1e-6, "gelu errors %g, %g", worst_y, worst_d);
    free(sx);
    free(sy);
    free(ones);
    free(sd);
    // Their exp (also the attention softmax's), against double over [-87, 0].
    double worst_exp = 0;
    for (int i = 0; i <= 870000; i++) {
        float x = -0.0001f * (float)i;
        worst_exp = check_worse(worst_exp, fabs(ct_vexp_nonpos(x) - exp(x)) / exp(x));
    }
    printf("ct_vexp_nonpos over [-87, 0]: worst relative error %.2g\n", worst_exp);
    CHECK_MSG(worst_exp < 3e-7, "exp error %g", worst_exp);  // 2.5 ulp
    CHECK(ct_vexp_nonpos(-88.0f) == 0.0f && ct_vexp_nonpos(-INFINITY) == 0.0f && isnan(ct_vexp_nonpos(NAN)));
    // Far out, GELU is the identity or 0, with derivative 1 or 0.
    float far_x[4] = {1e12f, -1e12f, 1e15f, -1e15f}, far_y[4], far_d[4] = {0}, far_g[4] = {1, 1, 1, 1};
    ct_gelu_forward(far_y, far_x, 4);
    ct_gelu_backward(far_d, far_x, far_g, 4);
    CHECK(far_y[0] == 1e12f && far_y[1] == 0.0f && far_y[2] == 1e15f && far_y[3] == 0.0f);
    CHECK_MSG(far_d[0] == 1.0f && far_d[1] == 0.0f && far_d[2] == 1.0f && far_d[3] == 0.0f,
              "gelu' far out: %g %g %g %g", far_d[0], far_d[1], far_d[2], far_d[3]);

    out = run1(&f, ct_relu(), ct_tensor_1d(CT_DTYPE_F32, 6, xs));
    CHECK(ct_f32(&out)[0] == 0.0f && ct_f32(&out)[1] == 0.0f && ct_f32(&out)[2] == 0.0f);
    CHECK(ct_f32(&out)[3] == 0.5f && ct_f32(&out)[5] == 3.0f);
    fixture_free(&f);

    out = run1(&f, ct_sigmoid(), ct_tensor_1d(CT_DTYPE_F32, 6, xs));
    CHECK_NEAR(ct_f32(&out)[2], 0.5, 1e-7);
    CHECK_NEAR(ct_f32(&out)[0], 1.0 / (1.0 + exp(2.0)), 1e-7);
    fixture_free(&f);

    out = run1(&f, ct_tanh(), ct_tensor_1d(CT_DTYPE_F32, 6, xs));
    CHECK_NEAR(ct_f32(&out)[4], tanh(1.0), 1e-7);
    fixture_free(&f);

    // softmax([0, ln 2]) = [1/3, 2/3]; log_softmax = [-ln 3, ln 2 - ln 3].
    float p[4] = {0.0f, (float)log(2.0), 5.0f, 5.0f};
    out = run1(&f, ct_softmax(), ct_tensor_2d(CT_DTYPE_F32, 2, 2, p));
    CHECK_NEAR(ct_f32(&out)[0], 1.0 / 3.0, 1e-6);
    CHECK_NEAR(ct_f32(&out)[1], 2.0 / 3.0, 1e-6);
    CHECK_NEAR(ct_f32(&out)[2], 0.5, 1e-6);
    fixture_free(&f);
    out = run1(&f, ct_log_softmax(), ct_tensor_2d(CT_DTYPE_F32, 2, 2, p));
    CHECK_NEAR(ct_f32(&out)[0], -log(3.0), 1e-6);
    CHECK_NEAR(ct_f32(&out)[1], log(2.0) - log(3.0), 1e-6);
    CHECK_NEAR(ct_f32(&out)[3], -log(2.0), 1e-6);
    fixture_free(&f);

    // An int input is a shape error naming the layer.
    int32_t ids[2] = {1, 2};
    ct_tensor it = ct_tensor_1d(CT_DTYPE_I32, 2, ids);
    ct_layer *g = ct_gelu();
    CHECK(fixture_init(&f, g, &it, 1, false) == CT_ERR_SHAPE);
    CHECK(strstr(f.err.msg, "Gelu") && strstr(f.err.msg, "(2) i32"));
    ct_layer_free(g);
    fixture_free(&f);
    // A softmax over the last axis needs one: a scalar is a shape error.
    ct_layer *sm = ct_softmax();
    CHECK(fixture_init(&f, sm, (ct_tensor[]){ct_tensor_make(CT_DTYPE_F32, 0, NULL, xs)}, 1, false) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(f.err.msg, "Softmax") && strstr(f.err.msg, "rank >= 1"), "%s", f.err.msg);
    ct_layer_free(sm);
    fixture_free(&f);
}

static void test_layer_norm_values(void) {
    // Row [1, 2, 3, 4]: mean 2.5, biased variance 1.25, rstd = 1/sqrt(1.25 + 1e-6)
    // = 0.894427, out = (x - 2.5) * rstd = [-1.341641, -0.447214, 0.447214, 1.341641].
    // Row [2, 2, 2, 2]: variance 0, out = 0 (epsilon keeps it finite).
    float x[8] = {1, 2, 3, 4, 2, 2, 2, 2};
    fixture f;
    ct_tensor out = run1(&f, ct_layer_norm(1e-6f), ct_tensor_2d(CT_DTYPE_F32, 2, 4, x));
    const double rstd = 0.8944268332292541;
    const double want[4] = {-1.5 * rstd, -0.5 * rstd, 0.5 * rstd, 1.5 * rstd};
    for (int i = 0; i < 4; i++) CHECK_NEAR(ct_f32(&out)[i], want[i], 1e-6);
    for (int i = 4; i < 8; i++) CHECK_NEAR(ct_f32(&out)[i], 0.0, 1e-7);
    CHECK(ct_net_find_param(&f.net, "LayerNorm/scale") && ct_net_find_param(&f.net, "LayerNorm/bias"));
    // scale 2 and bias 1 on the first row: 2 * norm + 1.
    for (int i = 0; i < 4; i++) f.net.weights[i] = 2.0f, f.net.weights[4 + i] = 1.0f;
    ct_tensor in = ct_tensor_2d(CT_DTYPE_F32, 2, 4, x);
    CHECK_OK(fixture_forward(&f, &in, &out, 1), &f.err);
    for (int i = 0; i < 4; i++) CHECK_NEAR(ct_f32(&out)[i], 2.0 * want[i] + 1.0, 1e-6);
    // A batch of another size runs; another width is an error.
    ct_tensor three = ct_tensor_2d(CT_DTYPE_F32, 1, 4, x);
    CHECK_OK(fixture_forward(&f, &three, &out, 1), &f.err);
    ct_tensor wide = ct_tensor_2d(CT_DTYPE_F32, 2, 3, x);
    CHECK(fixture_forward(&f, &wide, &out, 1) == CT_ERR_SHAPE);
    CHECK(strstr(f.err.msg, "LayerNorm (forward)") && strstr(f.err.msg, "(2,3) f32"));
    fixture_free(&f);

    // A zero-width last axis: weights of 0 floats, an empty slab. Init and
    // forward run (init filled the empty weights with memset(NULL, 0, 0),
    // which UBSan stops on).
    ct_layer *l = ct_layer_norm(1e-6f);
    ct_tensor empty = ct_tensor_2d(CT_DTYPE_F32, 2, 0, x);
    if (fixture_init_ok(&f, l, &empty, 1, false)) {
        CHECK(f.net.n_weights == 0);
        CHECK_OK(fixture_forward(&f, &empty, &out, 1), &f.err);
        CHECK(out.shape[0] == 2 && out.shape[1] == 0);
        ct_arena_reset(&f.arena);
        fixture_free(&f);
    }
    ct_layer_free(l);

    // A forward input of another width than init's 4 is a shape error (a
    // wider one would read past scale and bias).
    float y[2 * 5] = {0};
    out = run1(&f, ct_layer_norm(1e-6f), ct_tensor_2d(CT_DTYPE_F32, 2, 4, y));
    for (int d = 3; d <= 5; d += 2) {
        ct_tensor wrong = ct_tensor_2d(CT_DTYPE_F32, 2, d, y);
        ct_status st = fixture_forward(&f, &wrong, &out, 1);
        CHECK_MSG(st == CT_ERR_SHAPE && strstr(f.err.msg, "does not fit scale and bias (4)") != NULL, "D %d: %s", d,
                  f.err.msg);
    }
    fixture_free(&f);
}

static void test_dropout(void) {
    // The mask rule: kept iff bits >= ceil(rate * 2^32).
    CHECK(ct_dropout_threshold(0.5f) == 2147483648u);
    CHECK(ct_dropout_threshold(0.0f) == 0);

    enum { N = 10000 };
    float *ones = malloc(N * sizeof *ones);
    for (int i = 0; i < N; i++) ones[i] = 1.0f;
    ct_tensor x = ct_tensor_2d(CT_DTYPE_F32, 100, 100, ones);
    fixture f;
    ct_layer *l = ct_dropout(0.5f);
    CHECK_OK(fixture_init(&f, l, &x, 1, true), &f.err);
    ct_layer_free(l);
    ct_tensor out, again, other;
    CHECK_OK(fixture_forward(&f, &x, &out, 42), &f.err);
    CHECK_OK(fixture_forward(&f, &x, &again, 42), &f.err);
    CHECK_OK(fixture_forward(&f, &x, &other, 43), &f.err);
    int zeros = 0, twos = 0, same = 0, differ = 0, by_rule = 0;
    for (int i = 0; i < N; i++) {
        float v = ct_f32(&out)[i];
        zeros += v == 0.0f;
        twos += v == 2.0f;
        same += v == ct_f32(&again)[i];
        differ += v != ct_f32(&other)[i];
        // Element j's fate is its own bits against 2^31.
        by_rule += (v != 0.0f) == (ct_random_bits(ct_key_from_seed(42), (uint32_t)i) >= 2147483648u);
    }
    CHECK(by_rule == N);
    printf("dropout(0.5): %d of %d zeroed, %d scaled to 2, %d differ under another key\n", zeros, N, twos,
           differ);
    CHECK(zeros > 4700 && zeros < 5300);
    CHECK(zeros + twos == N);
    CHECK(same == N);
    CHECK(differ > 4000);

    // Backward: the same mask, scaled by 2, recomputed from the key.
    ct_tensor g = ct_tensor_sig(&out), gin;
    g.data = ones;
    CHECK_OK(fixture_forward(&f, &x, &out, 42), &f.err);
    CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(42), &f.err), &f.err);
    int match = 0;
    for (int i = 0; i < N; i++) match += ct_f32(&gin)[i] == ct_f32(&out)[i];
    CHECK(match == N);
    // A zero gradient stays zero (NULL data).
    ct_tensor gz = ct_tensor_sig(&out);
    CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &gz, &gin, ct_key_from_seed(42), &f.err), &f.err);
    CHECK(gin.data == NULL && ct_tensor_same_sig(&gin, &x));

    // Eval mode: the identity, the input itself.
    f.ctx.train = false;
    CHECK_OK(fixture_forward(&f, &x, &out, 42), &f.err);
    CHECK(out.data == x.data && ct_tensor_same_sig(&out, &x));
    CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(42), &f.err), &f.err);
    CHECK(gin.data == g.data);
    CHECK(f.ctx.tape_len == 0);
    fixture_free(&f);

    // Rate 0 in training mode: the identity too.
    l = ct_dropout(0.0f);
    CHECK_OK(fixture_init(&f, l, &x, 1, true), &f.err);
    ct_layer_free(l);
    CHECK_OK(fixture_forward(&f, &x, &out, 42), &f.err);
    CHECK(out.data == x.data);
    fixture_free(&f);

    // Int input is a shape error naming the layer (its mask would scale ints).
    int32_t ids[4] = {0};
    l = ct_dropout(0.5f);
    CHECK(fixture_init(&f, l, (ct_tensor[]){ct_tensor_1d(CT_DTYPE_I32, 4, ids)}, 1, true) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(f.err.msg, "Dropout (init): input is (4) i32, expected f32"), "%s", f.err.msg);
    ct_layer_free(l);
    fixture_free(&f);

    // Gradients in eval mode (the identity) check out as well.
    ct_gradcheck_opts o = ct_gradcheck_defaults();
    o.train = false;
    float a[4 * 5];
    ct_tensor y = uniform(ct_tensor_2d(CT_DTYPE_F32, 4, 5, a), 3, -1.0f, 1.0f);
    ct_layer *d = ct_dropout(0.5f);
    double e = gradcheck("Dropout(0.5) eval", d, &y, 1, o);
    CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "Dropout eval: rel err %g", e);
    ct_layer_free(d);
    free(ones);
}

static void test_embedding_values(void) {
    int32_t ids[6] = {2, 0, 2, 1, 1, 0};
    ct_tensor t = ct_tensor_2d(CT_DTYPE_I32, 2, 3, ids);
    fixture f;
    ct_tensor out = run1(&f, ct_embedding(3, 4), t);
    CHECK(out.ndim == 3 && out.shape[0] == 2 && out.shape[1] == 3 && out.shape[2] == 4);
    CHECK(out.dtype == CT_DTYPE_F32);
    const ct_param *w = ct_net_find_param(&f.net, "Embedding/embedding");
    CHECK(w && w->sig.shape[0] == 3 && w->sig.shape[1] == 4);
    const float *table = f.net.weights + (w ? w->offset : 0);
    int rows_ok = 0;
    for (int n = 0; n < 6; n++) rows_ok += memcmp(ct_f32(&out) + 4 * n, table + 4 * ids[n], 16) == 0;
    CHECK(rows_ok == 6);

    // Backward: repeated ids add up; the ids' gradient is a NULL-data i32.
    f.ctx.train = true;
    ct_net_zero_grads(&f.net);
    CHECK_OK(fixture_forward(&f, &t, &out, 1), &f.err);
    float ones[24];
    for (int i = 0; i < 24; i++) ones[i] = 1.0f;
    ct_tensor g = ct_tensor_sig(&out), gin;
    g.data = ones;
    CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(1), &f.err), &f.err);
    CHECK(gin.data == NULL && gin.dtype == CT_DTYPE_I32 && ct_tensor_same_sig(&gin, &t));
    CHECK(f.net.grads[0] == 2.0f && f.net.grads[4] == 2.0f && f.net.grads[8] == 2.0f);

    // An id out of range names itself, its position and the layer.
    ids[4] = 7;
    ct_status st = fixture_forward(&f, &t, &out, 1);
    printf("embedding error: %s\n", f.err.msg);
    CHECK(st == CT_ERR_ARG);
    CHECK(strstr(f.err.msg, "layer Embedding (forward)") != NULL);
    CHECK(strstr(f.err.msg, "id 7 at position (1,1)") != NULL);
    CHECK(strstr(f.err.msg, "[0, 3)") != NULL);
    ids[4] = 1;
    ids[0] = -1;
    st = fixture_forward(&f, &t, &out, 1);
    CHECK(st == CT_ERR_ARG && strstr(f.err.msg, "id -1 at position (0,0)") != NULL);
    // vocab_size itself is one past the table's last row.
    ids[0] = 2;
    ids[5] = 3;
    st = fixture_forward(&f, &t, &out, 1);
    CHECK_MSG(st == CT_ERR_ARG && strstr(f.err.msg, "id 3 at position (1,2)") != NULL, "%s", f.err.msg);
    fixture_free(&f);

    // Ids of rank 5 give an output of rank 6 (CT_MAX_DIMS); rank 6 is an error.
    int32_t one[2] = {1, 2};
    out = run1(&f, ct_embedding(3, 4), ct_tensor_make(CT_DTYPE_I32, 5, (int64_t[]){1, 1, 1, 1, 2}, one));
    CHECK(out.ndim == 6 && out.shape[4] == 2 && out.shape[5] == 4);
    fixture_free(&f);
    ct_layer *e6 = ct_embedding(3, 4);
    CHECK(fixture_init(&f, e6, (ct_tensor[]){ct_tensor_make(CT_DTYPE_I32, 6, (int64_t[]){1, 1, 1, 1, 1, 2}, one)}, 1,
                       false) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(f.err.msg, "Embedding (init)") && strstr(f.err.msg, "rank < 6"), "%s", f.err.msg);
    ct_layer_free(e6);
    fixture_free(&f);

    // f32 input is a shape error at init.
    float x[2] = {0, 1};
    ct_tensor ft = ct_tensor_1d(CT_DTYPE_F32, 2, x);
    ct_layer *e = ct_embedding(3, 4);
    CHECK(fixture_init(&f, e, &ft, 1, false) == CT_ERR_SHAPE);
    CHECK(strstr(f.err.msg, "Embedding (init)") != NULL);
    ct_layer_free(e);
    fixture_free(&f);
}

static void test_positional_values(void) {
    // Zero input: the output is pe itself. D = 4: pe[t] = [sin t, cos t,
    // sin(t/100), cos(t/100)] (10000^(2/4) = 100).
    float z[1 * 4 * 4] = {0};
    fixture f;
    ct_tensor out = run1(&f, ct_positional_encoding_sinusoidal(8), ct_tensor_3d(CT_DTYPE_F32, 1, 4, 4, z));
    CHECK(f.net.n_weights == 0);
    const double t1[4] = {0.8414709848078965, 0.5403023058681398, 0.009999833334166664, 0.9999500004166653};
    const double t3[4] = {0.1411200080598672, -0.9899924966004454, 0.02999550020249566, 0.9995500337489875};
    for (int i = 0; i < 4; i++) {
        CHECK_NEAR(ct_f32(&out)[i], i % 2 ? 1.0 : 0.0, 1e-7);  // t = 0
        CHECK_NEAR(ct_f32(&out)[4 + i], t1[i], 1e-6);
        CHECK_NEAR(ct_f32(&out)[12 + i], t3[i], 1e-6);
    }
    // Longer than max_len: an error; shorter: fine.
    float big[1 * 9 * 4] = {0};
    ct_tensor too_long = ct_tensor_3d(CT_DTYPE_F32, 1, 9, 4, big);
    CHECK(fixture_forward(&f, &too_long, &out, 1) == CT_ERR_SHAPE);
    CHECK(strstr(f.err.msg, "PositionalEncoding (forward)") && strstr(f.err.msg, "max_len 8"));
    ct_tensor shorter = ct_tensor_3d(CT_DTYPE_F32, 2, 2, 4, big);
    CHECK_OK(fixture_forward(&f, &shorter, &out, 1), &f.err);
    CHECK_NEAR(ct_f32(&out)[8 + 5], t1[1], 1e-6);  // batch 1, t = 1, c = 1
    fixture_free(&f);

    // D = 6 at t = 2: frequencies 1, 10000^(-2/6), 10000^(-4/6); x adds on.
    float x[1 * 3 * 6];
    for (int i = 0; i < 18; i++) x[i] = 0.5f;
    out = run1(&f, ct_positional_encoding_sinusoidal(3), ct_tensor_3d(CT_DTYPE_F32, 1, 3, 6, x));
    const double t2[6] = {0.9092974268256817, -0.4161468365471424, 0.09269850077872725,
                          0.9956942241237399, 0.0043088560467428125, 0.9999907168366957};
    for (int i = 0; i < 6; i++) CHECK_NEAR(ct_f32(&out)[12 + i], 0.5 + t2[i], 1e-6);
    fixture_free(&f);

    // Trainable sinusoids start at the fixed table's values (t = 2 above).
    out = run1(&f, ct_positional_encoding_trainable_sinusoidal(3, 0.0f), ct_tensor_3d(CT_DTYPE_F32, 1, 3, 6, x));
    for (int i = 0; i < 6; i++) CHECK_NEAR(f.net.weights[12 + i], t2[i], 1e-6);
    fixture_free(&f);
    // A fixed-table layer that joins a new net takes that net's D (6, then 4).
    ct_layer *again = ct_positional_encoding_sinusoidal(4);
    for (int d = 6; d >= 4; d -= 2) {
        ct_tensor in = ct_tensor_3d(CT_DTYPE_F32, 1, 2, d, x);
        if (fixture_init_ok(&f, again, &in, 1, false)) {
            CHECK_OK(fixture_forward(&f, &in, &out, 1), &f.err);
            CHECK_NEAR(ct_f32(&out)[d], 0.5 + sin(1.0), 1e-6);  // t = 1, channel 0
            fixture_free(&f);
        }
    }
    ct_layer_free(again);

    // Init with T > max_len fails; learned pe is a weight of (max_len, D).
    ct_layer *p = ct_positional_encoding_learned(2);
    ct_tensor sig = ct_tensor_3d(CT_DTYPE_F32, 1, 3, 6, x);
    CHECK(fixture_init(&f, p, &sig, 1, false) == CT_ERR_SHAPE);
    ct_layer_free(p);
    fixture_free(&f);
    out = run1(&f, ct_positional_encoding_learned(5), ct_tensor_3d(CT_DTYPE_F32, 1, 3, 6, x));
    const ct_param *w = ct_net_find_param(&f.net, "PositionalEncoding/embedding");
    CHECK(w && w->sig.shape[0] == 5 && w->sig.shape[1] == 6);
    if (w) CHECK_NEAR(ct_f32(&out)[7], 0.5 + f.net.weights[w->offset + 7], 1e-7);
    fixture_free(&f);
    // The learned table starts at N(0, 0.02^2): 64 x 32 draws.
    float z32[1 * 4 * 32] = {0};
    (void)run1(&f, ct_positional_encoding_learned(64), ct_tensor_3d(CT_DTYPE_F32, 1, 4, 32, z32));
    double sq = 0;
    for (size_t i = 0; i < f.net.n_weights; i++) sq += (double)f.net.weights[i] * f.net.weights[i];
    double sd = sqrt(sq / (double)f.net.n_weights);
    printf("learned positional table: standard deviation %.4f (0.02)\n", sd);
    CHECK(f.net.n_weights == 64 * 32 && fabs(sd / 0.02 - 1.0) < 0.1);
    fixture_free(&f);
    out = run1(&f, ct_positional_encoding_learned(5), ct_tensor_3d(CT_DTYPE_F32, 1, 3, 6, x));
    // A forward input of another width than init's 6 is a shape error (a
    // wider one would read past the table's rows), fixed table or learned.
    for (int learned = 1; learned >= 0; learned--) {
        if (!learned) {
            fixture_free(&f);
            out = run1(&f, ct_positional_encoding_sinusoidal(5), ct_tensor_3d(CT_DTYPE_F32, 1, 3, 6, x));
        }
        for (int d = 5; d <= 7; d += 2) {
            ct_tensor wrong = ct_tensor_3d(CT_DTYPE_F32, 1, 2, d, x);
            ct_status st = fixture_forward(&f, &wrong, &out, 1);
            CHECK_MSG(st == CT_ERR_SHAPE && strstr(f.err.msg, "does not fit encodings (5,6)") != NULL, "D %d: %s", d,
                      f.err.msg);
        }
    }
    fixture_free(&f);

    // A fixed table too large to hold, or whose max_len x D floats pass
    // size_t (4 x 2^62 x 4 bytes wrapped to 0: the sinusoids were written
    // past a 1-byte block), is an init error, not an abort or a crash.
    const int64_t too_wide[2] = {(int64_t)1 << 40, (int64_t)1 << 62};
    for (int i = 0; i < 2; i++) {
        int64_t d = too_wide[i];
        ct_layer *s = ct_positional_encoding_sinusoidal(4);
        ct_status st = fixture_init(&f, s, (ct_tensor[]){ct_tensor_3d(CT_DTYPE_F32, 1, 1, d, NULL)}, 1, false);
        printf("sinusoids (4,%lld): %s\n", (long long)d, f.err.msg);
        CHECK_MSG(st == CT_ERR_MEMORY && strstr(f.err.msg, "layer PositionalEncoding (init)") &&
                      strstr(f.err.msg, "sinusoid table"),
                  "D %lld: %s", (long long)d, f.err.msg);
        ct_layer_free(s);
        fixture_free(&f);
    }
}

// Trax's PositionalEncoding dropout: in training, out - x is the table with
// whole channels dropped (the same channels at every example and position)
// and the rest scaled by 1 / (1 - rate); in eval, the table itself.
static void test_positional_dropout(float rate) {
    enum { B = 3, T = 5, D = 16 };
    const double inv_keep = 1.0 / (1.0 - rate);
    float x[B * T * D];
    for (int i = 0; i < B * T * D; i++) x[i] = 0.25f * (float)(i % 7);
    ct_tensor in = ct_tensor_3d(CT_DTYPE_F32, B, T, D, x);
    fixture f;
    ct_layer *l = ct_positional_encoding_trainable_sinusoidal(8, rate);
    if (!fixture_init_ok(&f, l, &in, 1, true)) {
        ct_layer_free(l);
        return;
    }
    const float *pe = f.net.weights;  // the table, (8, D): its first T rows apply
    ct_tensor out;
    f.ctx.record = false;
    CHECK_OK(fixture_forward(&f, &in, &out, 4), &f.err);
    int kept = 0, dropped = 0, wrong = 0;
    for (int d = 0; d < D; d++) {
        // Channel d's factor, read at (0, 1), must hold at every (b, t). The
        // read loses digits where pe[1, d] is small (1e-3 in the last
        // channels): 1e-3 tells 0 from 1 / (1 - rate); the elements below
        // are held to 1e-6.
        double factor = (ct_f32(&out)[D + d] - x[D + d]) / pe[D + d];
        bool keep = fabs(factor - inv_keep) < 1e-3;
        kept += keep, dropped += fabs(factor) < 1e-3;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                int64_t i = ((int64_t)b * T + t) * D + d;
                wrong += fabs(ct_f32(&out)[i] - (x[i] + (keep ? inv_keep : 0.0) * pe[t * D + d])) > 1e-6;
            }
    }
    printf("positional dropout %g over %d channels: %d kept (x %g), %d dropped, %d elements off\n", (double)rate, D,
           kept, inv_keep, dropped, wrong);
    CHECK(kept + dropped == D && kept > 0 && dropped > 0 && wrong == 0);
    // Eval: the table as it is.
    f.ctx.train = false;
    CHECK_OK(fixture_forward(&f, &in, &out, 4), &f.err);
    wrong = 0;
    for (int i = 0; i < B * T * D; i++) wrong += fabs(ct_f32(&out)[i] - (x[i] + pe[i % (T * D)])) > 1e-6;
    CHECK(wrong == 0);
    fixture_free(&f);
    ct_layer_free(l);
}

// Trax's initializers: Embedding U(+-sqrt(3 / d_feature)) (variance
// 1 / d_feature), Dense's bias N(0, 1e-12).
static void test_initializers(void) {
    enum { V = 64, E = 48 };
    int32_t ids[1] = {0};
    ct_tensor t = ct_tensor_1d(CT_DTYPE_I32, 1, ids);
    fixture f;
    (void)run1(&f, ct_embedding(V, E), t);
    double lim = sqrt(3.0 / E), sq = 0, mx = 0;
    for (size_t i = 0; i < f.net.n_weights; i++) {
        sq += (double)f.net.weights[i] * f.net.weights[i];
        mx = fmax(mx, fabs(f.net.weights[i]));
    }
    double var = sq / (double)f.net.n_weights;
    printf("Embedding(%d, %d): max |w| %.4f (bound %.4f), variance %.5f (1 / d_feature %.5f)\n", V, E, mx, lim, var,
           1.0 / E);
    CHECK(mx <= lim && mx > 0.95 * lim && fabs(var * E - 1.0) < 0.1);
    fixture_free(&f);
    float xd[2 * 32];
    for (int i = 0; i < 64; i++) xd[i] = 1.0f;
    (void)run1(&f, ct_dense(256), ct_tensor_2d(CT_DTYPE_F32, 2, 32, xd));
    const ct_param *bias = ct_net_find_param(&f.net, "Dense/bias");
    CHECK(bias != NULL);
    if (bias) {
        double bsq = 0;
        int zeros = 0;
        for (int i = 0; i < 256; i++) {
            float b = f.net.weights[bias->offset + i];
            bsq += (double)b * b, zeros += b == 0.0f;
        }
        double sd = sqrt(bsq / 256);
        printf("Dense bias: standard deviation %.3g (Trax's 1e-6), %d of 256 zero\n", sd, zeros);
        CHECK(sd > 0.7e-6 && sd < 1.3e-6 && zeros == 0);
    }
    // The kernel (32, 256): Glorot uniform, U(+-sqrt(6 / (32 + 256))).
    const ct_param *kernel = ct_net_find_param(&f.net, "Dense/kernel");
    CHECK(kernel != NULL);
    if (kernel) {
        double klim = sqrt(6.0 / (32 + 256)), ksq = 0, kmx = 0;
        for (int i = 0; i < 32 * 256; i++) {
            double k = f.net.weights[kernel->offset + i];
            ksq += k * k, kmx = fmax(kmx, fabs(k));
        }
        double kvar = ksq / (32 * 256);
        printf("Dense kernel: max |w| %.4f (Glorot bound %.4f), variance %.5f (bound^2 / 3 %.5f)\n", kmx, klim, kvar,
               klim * klim / 3);
        CHECK(kmx <= klim && kmx > 0.95 * klim && fabs(kvar / (klim * klim / 3) - 1.0) < 0.1);
    }
    // Trax's Dense splits its key in two: the kernel from split(key, 0), the
    // bias from split(key, 1) (the fixture's init key is seed 3).
    if (kernel && bias) {
        ct_key key = ct_key_from_seed(3);
        float *want = malloc(32 * 256 * sizeof *want);
        double klim = sqrt(6.0 / (32 + 256));
        ct_random_uniform(ct_key_split(key, 0), want, 32 * 256, (float)-klim, (float)klim);
        CHECK(memcmp(want, f.net.weights + kernel->offset, 32 * 256 * sizeof *want) == 0);
        ct_random_normal(ct_key_split(key, 1), want, 256, 1e-6f);
        CHECK(memcmp(want, f.net.weights + bias->offset, 256 * sizeof *want) == 0);
        free(want);
    }
    // Trax's Embedding draws its one weight from the layer's key itself.
    {
        fixture e;
        (void)run1(&e, ct_embedding(V, E), t);
        float *want = malloc(V * E * sizeof *want);
        ct_random_uniform(ct_key_from_seed(3), want, V * E, (float)-sqrt(3.0 / E), (float)sqrt(3.0 / E));
        CHECK(e.net.n_weights == V * E && memcmp(want, e.net.weights, V * E * sizeof *want) == 0);
        free(want);
        fixture_free(&e);
    }
    // Dense without bias: the kernel alone.
    {
        fixture nb;
        (void)run1(&nb, ct_dense_no_bias(3), ct_tensor_2d(CT_DTYPE_F32, 2, 32, xd));
        CHECK(nb.net.n_weights == 32 * 3 && ct_net_find_param(&nb.net, "Dense/kernel") &&
              !ct_net_find_param(&nb.net, "Dense/bias"));
        fixture_free(&nb);
    }
    // A forward input narrower or wider than the kernel's 32 rows is a shape
    // error (a wider one would read past each row's weights).
    for (int width = 31; width <= 33; width += 2) {
        ct_tensor wrong = ct_tensor_2d(CT_DTYPE_F32, 1, width, xd), out;
        ct_status st = fixture_forward(&f, &wrong, &out, 1);
        CHECK_MSG(st == CT_ERR_SHAPE && strstr(f.err.msg, "does not fit kernel (32,256)") != NULL, "width %d: %s",
                  width, f.err.msg);
    }
    fixture_free(&f);
}

static void test_shift_right_values(void) {
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    fixture f;
    ct_tensor out = run1(&f, ct_shift_right(1), ct_tensor_2d(CT_DTYPE_I32, 2, 4, ids));
    const int32_t want[8] = {0, 1, 2, 3, 0, 5, 6, 7};
    CHECK(out.dtype == CT_DTYPE_I32 && memcmp(out.data, want, sizeof want) == 0);
    // Backward of int ids: a NULL-data gradient with their signature.
    ct_tensor t = ct_tensor_2d(CT_DTYPE_I32, 2, 4, ids), g, gin;
    CHECK_OK(fixture_forward(&f, &t, &out, 1), &f.err);
    g = ct_tensor_sig(&out);
    CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(1), &f.err), &f.err);
    CHECK(gin.data == NULL && ct_tensor_same_sig(&gin, &t));
    // Still none when the gradient given for the ids has data.
    int32_t gids[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_OK(fixture_forward(&f, &t, &out, 1), &f.err);
    g.data = gids;
    CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(1), &f.err), &f.err);
    CHECK(gin.data == NULL && ct_tensor_same_sig(&gin, &t));
    fixture_free(&f);

    // (1, 3, 2) f32 shifted by 2: [[a, b], [c, d], [e, f]] -> [[0, 0], [0, 0], [a, b]].
    float x[6] = {1, 2, 3, 4, 5, 6};
    out = run1(&f, ct_shift_right(2), ct_tensor_3d(CT_DTYPE_F32, 1, 3, 2, x));
    const float wf[6] = {0, 0, 0, 0, 1, 2};
    CHECK(memcmp(out.data, wf, sizeof wf) == 0);
    // The gradient shifts back: dx[t] = g[t + 2].
    float gv[6] = {10, 20, 30, 40, 50, 60};
    ct_tensor xt = ct_tensor_3d(CT_DTYPE_F32, 1, 3, 2, x);
    CHECK_OK(fixture_forward(&f, &xt, &out, 1), &f.err);
    g = ct_tensor_sig(&out);
    g.data = gv;
    CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(1), &f.err), &f.err);
    const float wg[6] = {50, 60, 0, 0, 0, 0};
    CHECK(gin.data && memcmp(gin.data, wg, sizeof wg) == 0);
    fixture_free(&f);

    // Shifting by T or more leaves only zeros.
    out = run1(&f, ct_shift_right(5), ct_tensor_3d(CT_DTYPE_F32, 1, 3, 2, x));
    int zeros = 0;
    for (int i = 0; i < 6; i++) zeros += ct_f32(&out)[i] == 0.0f;
    CHECK(zeros == 6);
    fixture_free(&f);

    // Time is axis 1: a rank-1 input has none.
    ct_layer *l = ct_shift_right(1);
    CHECK(fixture_init(&f, l, (ct_tensor[]){ct_tensor_1d(CT_DTYPE_F32, 6, x)}, 1, false) == CT_ERR_SHAPE);
    CHECK(strstr(f.err.msg, "ShiftRight (init): input is (6) f32, expected f32 or i32 of rank >= 2") != NULL);
    ct_layer_free(l);
    fixture_free(&f);
}

static void test_flatten_mean_values(void) {
    float x[2 * 3 * 4];
    for (int i = 0; i < 24; i++) x[i] = (float)i;
    ct_tensor in = ct_tensor_3d(CT_DTYPE_F32, 2, 3, 4, x);
    fixture f;
    ct_tensor out = run1(&f, ct_flatten(1), in);
    CHECK(out.data == x && out.ndim == 2 && out.shape[0] == 2 && out.shape[1] == 12);
    fixture_free(&f);
    out = run1(&f, ct_flatten(0), in);
    CHECK(out.data == x && out.ndim == 1 && out.shape[0] == 24);
    fixture_free(&f);
    // Int ids flatten too.
    int32_t ids[6] = {0};
    out = run1(&f, ct_flatten(1), ct_tensor_3d(CT_DTYPE_I32, 1, 2, 3, ids));
    CHECK(out.dtype == CT_DTYPE_I32 && out.ndim == 2 && out.shape[1] == 6);
    fixture_free(&f);
    // Keeping as many axes as the rank is Trax's error.
    ct_layer *l = ct_flatten(3);
    CHECK(fixture_init(&f, l, &in, 1, false) == CT_ERR_SHAPE);
    CHECK(strstr(f.err.msg, "Flatten (init)") && strstr(f.err.msg, "(2,3,4) f32"));
    ct_layer_free(l);
    fixture_free(&f);

    // Mean over axis 1 of (2, 3, 4): out[b, c] = x[b, 1, c] (arithmetic rows).
    out = run1(&f, ct_mean(1, false), in);
    CHECK(out.ndim == 2 && out.shape[0] == 2 && out.shape[1] == 4);
    CHECK_NEAR(ct_f32(&out)[0], 4.0, 1e-6);
    CHECK_NEAR(ct_f32(&out)[7], 19.0, 1e-6);
    fixture_free(&f);
    out = run1(&f, ct_mean(-1, true), in);
    CHECK(out.ndim == 3 && out.shape[2] == 1 && out.shape[1] == 3);
    CHECK_NEAR(ct_f32(&out)[0], 1.5, 1e-6);
    CHECK_NEAR(ct_f32(&out)[5], 21.5, 1e-6);
    fixture_free(&f);
    l = ct_mean(3, false);
    CHECK(fixture_init(&f, l, &in, 1, false) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(f.err.msg, "Mean (init): axis 3 does not fit input (2,3,4) f32") != NULL, "%s", f.err.msg);
    ct_layer_free(l);
    fixture_free(&f);
    // The mean over an empty axis is 0 / 0: an init error, not NaNs.
    l = ct_mean(1, false);
    CHECK(fixture_init(&f, l, (ct_tensor[]){ct_tensor_3d(CT_DTYPE_F32, 2, 0, 4, x)}, 1, false) == CT_ERR_SHAPE);
    CHECK(strstr(f.err.msg, "empty axis 1 of input (2,0,4) f32") != NULL);
    ct_layer_free(l);
    fixture_free(&f);
}

// Zero (NULL-data) output gradients come back as NULL-data input gradients
// with the inputs' signatures, and no weight gradient moves.
static void test_zero_grad_out(void) {
    float a[2 * 3 * 4];
    ct_tensor x = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 3, 4, a), 21, -1.0f, 1.0f);
    ct_layer *layers[] = {ct_layer_norm(1e-6f), ct_positional_encoding_learned(4),
                          ct_positional_encoding_sinusoidal(4), ct_shift_right(1), ct_flatten(1),
                          ct_mean(1, false), ct_dropout(0.5f), ct_relu(), ct_gelu(), ct_dense(3),
                          ct_dense_no_bias(2), ct_softmax(), ct_log_softmax()};
    for (size_t i = 0; i < sizeof layers / sizeof *layers; i++) {
        fixture f;
        CHECK_OK(fixture_init(&f, layers[i], &x, 1, true), &f.err);
        ct_net_zero_grads(&f.net);
        ct_tensor out, g, gin;
        CHECK_OK(fixture_forward(&f, &x, &out, 1), &f.err);
        g = ct_tensor_sig(&out);
        CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(1), &f.err), &f.err);
        bool zero = true;
        for (size_t k = 0; k < f.net.n_weights; k++) zero = zero && f.net.grads[k] == 0.0f;
        CHECK_MSG(gin.data == NULL && ct_tensor_same_sig(&gin, &x) && zero && f.ctx.tape_len == 0,
                  "%s", layers[i]->name);
        ct_layer_free(layers[i]);
        fixture_free(&f);
    }
    // Embedding: int ids, so its own input.
    int32_t ids[2 * 3] = {0, 1, 2, 2, 1, 0};
    ct_tensor t = ct_tensor_2d(CT_DTYPE_I32, 2, 3, ids);
    ct_layer *e = ct_embedding(3, 4);
    fixture f;
    if (fixture_init_ok(&f, e, &t, 1, true)) {
        ct_net_zero_grads(&f.net);
        ct_tensor out, g, gin;
        CHECK_OK(fixture_forward(&f, &t, &out, 1), &f.err);
        g = ct_tensor_sig(&out);
        CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, &gin, ct_key_from_seed(1), &f.err), &f.err);
        bool zero = true;
        for (size_t k = 0; k < f.net.n_weights; k++) zero = zero && f.net.grads[k] == 0.0f;
        CHECK(gin.data == NULL && ct_tensor_same_sig(&gin, &t) && zero && f.ctx.tape_len == 0);
        fixture_free(&f);
    }
    ct_layer_free(e);
}

// The LayerNorm kernels on rows big enough for threads give bitwise the same
// result on 1 thread and on 2 (scale and bias gradients sum rows in order).
static void test_layer_norm_threads(void) {
    enum { N = 64, C = 1024 };
    float *buf = malloc(sizeof(float) * (2 * (size_t)N * C + 2 * C));  // x, g, w, b
    float *x = buf, *g = x + N * C, *w = g + N * C, *b = w + C;
    ct_random_uniform(ct_key_from_seed(31), x, N * C, -2.0f, 2.0f);
    ct_random_uniform(ct_key_from_seed(32), g, N * C, -1.0f, 1.0f);
    ct_random_uniform(ct_key_from_seed(33), w, C, 0.5f, 1.5f);
    ct_random_uniform(ct_key_from_seed(34), b, C, -0.5f, 0.5f);
    float *res[2];
    size_t len = (size_t)2 * N * C + 2 * N + 2 * C;  // out, mean, rstd, dinp, dw, db
    int saved = omp_get_max_threads();
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        float *r = res[t] = calloc(len, sizeof(float));
        float *out = r, *mean = out + N * C, *rstd = mean + N, *dx = rstd + N, *dw = dx + N * C, *db = dw + C;
        ct_layernorm_forward(out, mean, rstd, x, w, b, N, C, 1e-6f);
        ct_layernorm_backward(dx, dw, db, g, x, w, mean, rstd, N, C);
    }
    omp_set_num_threads(saved);
    CHECK(memcmp(res[0], res[1], len * sizeof(float)) == 0);
    free(res[0]);
    free(res[1]);
    free(buf);
}

// A LayerNorm in a Serial writes its input gradient over its output
// gradient (donated: nothing else reads it); wrapped in a Serial of its own
// it cannot (the gradient comes from outside that walk) and allocates one.
// Serial(Dense(256), LayerNorm, Dense(8)) on 200 rows (200 x 256 is past
// the kernel's 32768: 2 threads take its threaded path) gives the same
// weight and input gradient bits either way, on 1 thread and on 2; the
// donated one's backward takes less arena past forward's (so it wrote over).
static float *layer_norm_model_grads(bool donated, int threads, const ct_tensor *x, const ct_tensor *gy, size_t *n,
                                     size_t *arena_bytes) {
    ct_layer *ln = ct_layer_norm(1e-6f);
    if (!donated) ln = ct_layer_rename(ct_serial(1, (ct_layer *[]){ln}), "Own");
    ct_layer *l = ct_serial(CT_LAYERS(ct_dense(256), ln, ct_dense(8)));
    int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    fixture f;
    float *res = NULL;
    if (fixture_init_ok(&f, l, x, 1, true)) {
        ct_tensor out, gin;
        CHECK_OK(fixture_forward(&f, x, &out, 4), &f.err);
        size_t kept = f.arena.used;
        f.arena.high_water = kept;  // from here backward's peak
        ct_net_zero_grads(&f.net);
        CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, gy, &gin, ct_key_from_seed(4), &f.err), &f.err);
        size_t nx = (size_t)ct_tensor_numel(x);
        *n = f.net.n_weights + nx;
        *arena_bytes = f.arena.high_water - kept;
        res = malloc(*n * sizeof(float));
        memcpy(res, f.net.grads, f.net.n_weights * sizeof(float));
        memcpy(res + f.net.n_weights, gin.data, nx * sizeof(float));
        fixture_free(&f);
    }
    omp_set_num_threads(saved);
    ct_layer_free(l);
    return res;
}

static void test_layer_norm_donated_bits(void) {
    enum { N = 200, D = 16 };
    float *xb = malloc(sizeof(float) * N * D), *gb = malloc(sizeof(float) * N * 8);
    ct_tensor x = uniform(ct_tensor_2d(CT_DTYPE_F32, N, D, xb), 5, -1.0f, 1.0f);
    ct_tensor gy = uniform(ct_tensor_2d(CT_DTYPE_F32, N, 8, gb), 6, -1.0f, 1.0f);
    size_t n[4] = {0}, bytes[4] = {0};
    float *g[4];
    for (int k = 0; k < 4; k++) g[k] = layer_norm_model_grads(k & 1, 1 + k / 2, &x, &gy, &n[k], &bytes[k]);
    for (int k = 1; k < 4; k++) {
        size_t differ = 0;
        for (size_t i = 0; g[0] && g[k] && n[k] == n[0] && i < n[0]; i++) differ += memcmp(&g[k][i], &g[0][i], 4) != 0;
        printf("LayerNorm model, %s, %d thread(s): %zu of %zu gradient floats differ from its own, 1 thread\n",
               k & 1 ? "over a donated gradient" : "its own", 1 + k / 2, differ, n[0]);
        CHECK(g[0] && g[k] && n[k] == n[0] && differ == 0);
    }
    printf("LayerNorm model: backward takes %zu arena bytes past forward's donated, %zu its own\n", bytes[1],
           bytes[0]);
    CHECK(bytes[1] < bytes[0] && bytes[3] < bytes[2]);
    for (int k = 0; k < 4; k++) free(g[k]);
    free(xb);
    free(gb);
}

int main(void) {
    test_positional_dropout(0.5f);
    test_positional_dropout(0.25f);
    test_initializers();
    test_activation_gradients();
    test_layer_norm_gradients();
    test_other_gradients();
    test_activation_values();
    test_layer_norm_values();
    test_dropout();
    test_embedding_values();
    test_positional_values();
    test_shift_right_values();
    test_flatten_mean_values();
    test_zero_grad_out();
    test_layer_norm_threads();
    test_layer_norm_donated_bits();
    return check_summary("test_layers_core");
}
