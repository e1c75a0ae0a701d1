// Axial positional encoding, the fixed position tables and Chunk (the chunked
// feed-forward): gradient checks, the axial table's values, size, errors,
// init keys and dropout mask (negative broadcast dims, ReformerLM's dims),
// the trainable table's dropout (train and eval), chunked = unchunked
// (forward and every gradient) and Chunk(layer, c < 1) = layer.
#include <stdlib.h>

#include "layer_fixture.h"

// ---- AxialPositionalEncoding --------------------------------------------------

static ct_layer *axial(int n_axes, const int *shape, const int *d_embs, float rate, int n_dims, const int *dims) {
    return ct_axial_positional_encoding(n_axes, shape, d_embs, rate, n_dims, dims);
}

static void test_axial_gradients(void) {
    float a[2 * 12 * 5], b[2 * 12 * 6];
    ct_tensor x2 = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 12, 5, a), 1, -1.0f, 1.0f);
    ct_tensor x3 = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 12, 6, b), 2, -1.0f, 1.0f);
    check_layer("Axial (3,4)/(2,3)", axial(2, (int[]){3, 4}, (int[]){2, 3}, 0, 0, NULL), &x2, 1, false);
    check_layer("Axial (2,3,2)/(2,1,3)", axial(3, (int[]){2, 3, 2}, (int[]){2, 1, 3}, 0, 0, NULL), &x3, 1, false);
    // Training dropout: the mask is recomputed from the key in backward.
    check_layer("Axial (3,4) dropout 0.3 dims (1,2)", axial(2, (int[]){3, 4}, (int[]){2, 3}, 0.3f, 2, (int[]){1, 2}),
                &x2, 1, true);
    check_layer("Axial (2,3,2) dropout 0.3 dims ()", axial(3, (int[]){2, 3, 2}, (int[]){2, 1, 3}, 0.3f, 0, NULL),
                &x3, 1, true);
}

// Zero input, eval: out[b, t] = concat(E_0[i_0], E_1[i_1]) with t = 4 i_0 + i_1;
// the weights are (3, 2) and (4, 3): sum n_k d_k = 18 floats.
static void test_axial_values(void) {
    float z[2 * 12 * 5] = {0};
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 2, 12, 5, z);
    fixture f;
    ct_layer *l = axial(2, (int[]){3, 4}, (int[]){2, 3}, 0.5f, 0, NULL);
    CHECK_OK(fixture_init(&f, l, &x, 1, false), &f.err);
    ct_layer_free(l);
    printf("axial (3,4)/(2,3): %zu weights (sum n_k d_k = 18; a (12, 5) table has 60)\n", f.net.n_weights);
    CHECK(f.net.n_weights == 3 * 2 + 4 * 3);
    const ct_param *e0 = ct_net_find_param(&f.net, "AxialPositionalEncoding/axis_0");
    const ct_param *e1 = ct_net_find_param(&f.net, "AxialPositionalEncoding/axis_1");
    CHECK_OK_OR(e0 && e1 ? CT_OK : CT_ERR_STATE, &f.err, return);
    CHECK(e0->sig.shape[0] == 3 && e0->sig.shape[1] == 2 && e1->sig.shape[0] == 4 && e1->sig.shape[1] == 3);
    ct_tensor out;
    CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, &x, &out, ct_key_from_seed(1), &f.err), &f.err);
    const float *w = f.net.weights, *o = ct_f32(&out);
    int bad = 0;
    for (int bt = 0; bt < 24; bt++) {
        int t = bt % 12, i0 = t / 4, i1 = t % 4;
        for (int d = 0; d < 5; d++) {
            float want = d < 2 ? w[e0->offset + i0 * 2 + d] : w[e1->offset + i1 * 3 + d - 2];
            bad += o[bt * 5 + d] != want;  // eval: no dropout, exact
        }
    }
    CHECK(bad == 0);
    // N(0, 1) weights: not all tiny, not all equal.
    double ss = 0;
    for (size_t i = 0; i < f.net.n_weights; i++) ss += w[i] * w[i];
    CHECK(ss / (double)f.net.n_weights > 0.2 && ss / (double)f.net.n_weights < 5);
    fixture_free(&f);
}

static void expect_error(ct_layer *l, ct_tensor sig, const char *a, const char *b) {
    fixture f;
    CHECK(fixture_init(&f, l, &sig, 1, false) == CT_ERR_SHAPE);
    ct_layer_free(l);
    printf("error: %s\n", f.err.msg);
    CHECK_MSG(strstr(f.err.msg, "AxialPositionalEncoding (init)") && strstr(f.err.msg, a) && strstr(f.err.msg, b),
              "%s", f.err.msg);
    fixture_free(&f);
}

static void test_axial_errors(void) {
    expect_error(axial(2, (int[]){64, 64}, (int[]){32, 32}, 0, 0, NULL),
                 ct_tensor_3d(CT_DTYPE_F32, 1, 1024, 64, NULL), "shape (64, 64) multiplies to 4096",
                 "has length 1024");
    expect_error(axial(2, (int[]){32, 32}, (int[]){32, 16}, 0, 0, NULL),
                 ct_tensor_3d(CT_DTYPE_F32, 1, 1024, 64, NULL), "d_embs (32, 16) sum to 48", "d_model is 64");
    // A shape whose product passes int64 (2^120 here) is refused by name; the
    // product wrapped to 0 before (signed overflow, which UBSan stops on).
    expect_error(axial(4, (int[]){1 << 30, 1 << 30, 1 << 30, 1 << 30}, (int[]){1, 1, 1, 1}, 0, 0, NULL),
                 ct_tensor_3d(CT_DTYPE_F32, 1, 4, 4, NULL),
                 "shape (1073741824, 1073741824, 1073741824, 1073741824) multiplies past 2^63", "has length 4");
}

// ReformerLM's dims (1, 2): one (B, D) mask. On a zero input the output is
// PE * keep / (1 - rate): for each (example, channel) it is zero at every
// position or at none, and the examples' masks differ.
static void test_axial_dropout_mask(void) {
    enum { B = 4, T = 20, D = 8 };
    static float z[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, z);
    fixture f;
    ct_layer *l = axial(2, (int[]){4, 5}, (int[]){3, 5}, 0.5f, 2, (int[]){1, 2});
    CHECK_OK(fixture_init(&f, l, &x, 1, true), &f.err);
    ct_layer_free(l);
    ct_tensor out;
    CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, &x, &out, ct_key_from_seed(5), &f.err), &f.err);
    const float *o = ct_f32(&out);
    int mixed = 0, dropped = 0, differ = 0;
    bool mask[B][D];
    for (int b = 0; b < B; b++)
        for (int d = 0; d < D; d++) {
            int zeros = 0;
            for (int t = 0; t < T; t++) zeros += o[(b * T + t) * D + d] == 0.0f;
            mixed += zeros != 0 && zeros != T;
            mask[b][d] = zeros == 0;
            dropped += zeros == T;
        }
    for (int b = 1; b < B; b++) differ += memcmp(mask[b], mask[0], sizeof mask[0]) != 0;
    printf("axial dropout 0.5, dims (1,2): %d of %d (example, channel) masks dropped, %d mixed, %d of %d "
           "examples differ from the first\n", dropped, B * D, mixed, differ, B - 1);
    CHECK(mixed == 0 && dropped > 0 && dropped < B * D && differ > 0);
    // Kept values are PE / keep: position 0 of channel d in a kept column.
    const float *w = f.net.weights;
    int kept = 0;
    for (int d = 0; d < 3; d++)
        if (mask[0][d]) {
            CHECK_NEAR(o[d], 2.0f * w[d], 1e-6);
            kept++;
        }
    CHECK_MSG(kept > 0, "no kept column among channels 0..2 of example 0: nothing compared");
    fixture_free(&f);
}

// ---- Fixed positions ------------------------------------------------------------

static void test_fixed_gradients(void) {
    float a[2 * 5 * 6];
    ct_tensor x = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 5, 6, a), 3, -1.0f, 1.0f);
    check_layer("PositionalEncoding(sinusoidal, fixed)", ct_positional_encoding_sinusoidal(8), &x, 1, false);
    fixture f;
    ct_layer *l = ct_positional_encoding_sinusoidal(8);
    CHECK_OK(fixture_init(&f, l, &x, 1, false), &f.err);
    ct_layer_free(l);
    CHECK(f.net.n_weights == 0);  // fixed: no weights
    fixture_free(&f);
}

// FixedBasePositionalEncoding ('fixed-base'): bases (3, 4), 3 digits, D = 6
// (blocks of 2); T < 3^3.
static ct_layer *fixed_base(int zero_one_in, int drop_one_in) {
    return ct_fixed_base_positional_encoding(2, (int[]){3, 4}, 3, zero_one_in, drop_one_in);
}

static void test_fixed_base_gradients(void) {
    // T = 10 reaches digit 2 of base 3 (positions >= 9).
    float a[4 * 10 * 6];
    ct_tensor x = uniform(ct_tensor_3d(CT_DTYPE_F32, 4, 10, 6, a), 5, -1.0f, 1.0f);
    check_layer("FixedBase (3,4) x 3 eval", fixed_base(100, 100), &x, 1, false);
    // Random starts and base dropout, recomputed from the key in backward.
    check_layer("FixedBase (3,4) x 3 train, zero 1 in 100, drop 1 in 4", fixed_base(100, 4), &x, 1, true);
}

// Eval on zeros: block i of position t is sum_r digit_i^r(t) W[r][i], plus
// start_vec at t = 0. Train: other starts, and 1 in 2 examples lose their
// digit embeddings (only start_vec remains).
static void test_fixed_base_values(void) {
    enum { B = 16, T = 5, D = 6 };
    static float z[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, z);
    fixture f;
    ct_layer *l = fixed_base(2, 2);
    CHECK_OK(fixture_init(&f, l, &x, 1, false), &f.err);
    ct_layer_free(l);
    CHECK(f.net.n_weights == 2 * 3 * 2 + 6);
    ct_tensor out;
    CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, &x, &out, ct_key_from_seed(1), &f.err), &f.err);
    const float *o = ct_f32(&out);
    double worst = 0;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < 3; i++)
            for (int e = 0; e < 2; e++) {
                const int bases[2] = {3, 4};
                double want = t == 0 ? f.net.weights[f.net.params[6]->offset + i * 2 + e] : 0;
                for (int r = 0; r < 2; r++) {
                    int p = t;
                    for (int k = 0; k < i; k++) p /= bases[r];
                    want += (p % bases[r]) * f.net.weights[f.net.params[r * 3 + i]->offset + e];
                }
                for (int b = 0; b < B; b++) worst = check_worse(worst, fabs(o[(b * T + t) * D + i * 2 + e] - want));
            }
    CHECK(worst < 1e-9);
    CHECK(strcmp(f.net.params[6]->name, "start_vec") == 0 && strcmp(f.net.params[1]->name, "base3_digit1") == 0);
    f.ctx.train = true;
    CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, &x, &out, ct_key_from_seed(2), &f.err), &f.err);
    o = ct_f32(&out);
    int silent = 0;  // examples whose positions t >= 1 are all zero
    for (int b = 0; b < B; b++) {
        int nz = 0;
        for (int j = D; j < T * D; j++) nz += o[b * T * D + j] != 0.0f;
        silent += nz == 0;
    }
    printf("fixed-base train, base dropout 1 in 2: %d of %d examples keep only start_vec\n", silent, B);
    CHECK(silent > 0 && silent < B);
    fixture_free(&f);
    // One in 1: Trax's randint(0, 1) is always 0, so every example starts
    // at 0 and loses its digit embeddings (only start_vec at t = 0 is left);
    // at base dropout one in 100 none drops under this key: training = eval.
    float *eval_out = malloc(sizeof z);
    for (int drop = 0; drop < 2; drop++) {
        l = fixed_base(1, drop ? 1 : 100);
        CHECK_OK(fixture_init(&f, l, &x, 1, false), &f.err);
        ct_layer_free(l);
        CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, &x, &out, ct_key_from_seed(1), &f.err), &f.err);
        memcpy(eval_out, ct_f32(&out), sizeof z);
        f.ctx.train = true;
        CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, &x, &out, ct_key_from_seed(3), &f.err), &f.err);
        o = ct_f32(&out);
        int off = 0;
        for (int b = 0; b < B; b++)
            for (int j = 0; j < T * D; j++) {
                float want = !drop ? eval_out[b * T * D + j]
                             : j < D ? f.net.weights[f.net.params[6]->offset + j] : 0.0f;
                off += o[b * T * D + j] != want;
            }
        printf("fixed-base train, start from zero 1 in 1, base dropout 1 in %d: %d values off\n", drop ? 1 : 100, off);
        CHECK(off == 0);
        fixture_free(&f);
    }
    free(eval_out);
    // D must split into n_digits blocks.
    ct_tensor bad = ct_tensor_3d(CT_DTYPE_F32, 1, 5, 7, NULL);
    ct_layer *lb = fixed_base(2, 2);
    CHECK(fixture_init(&f, lb, &bad, 1, false) == CT_ERR_SHAPE);
    ct_layer_free(lb);
    CHECK(strstr(f.err.msg, "FixedBasePositionalEncoding (init)") && strstr(f.err.msg, "n_digits 3"));
    fixture_free(&f);
    // Trax's defaults: 4 bases x 8 digits x D/8, plus start_vec.
    ct_tensor sig = ct_tensor_3d(CT_DTYPE_F32, 1, 16, 64, NULL);
    ct_layer *lt = ct_fixed_base_positional_encoding_trax();
    CHECK_OK(fixture_init(&f, lt, &sig, 1, false), &f.err);
    ct_layer_free(lt);
    CHECK(f.net.n_weights == 4 * 8 * 8 + 64);
    fixture_free(&f);
    // ... and its draws: bases (11, 13, 14, 15), 8 digits, start from zero
    // 1 in 100, base dropout 1 in 100. A training forward of 256 examples
    // gives the bits of the layer given those values (the same init key, so
    // the same weights). Measured: a default of 10 for the base dropout made
    // 6,080 values differ, for the start from zero 4,800, bases in another
    // order 10,320.
    enum { TB = 256, TT = 4, TD = 64 };
    const size_t tbytes = TB * TT * TD * sizeof(float);
    float *tz = calloc(1, tbytes), *ty[2] = {malloc(tbytes), malloc(tbytes)};
    ct_tensor tx = ct_tensor_3d(CT_DTYPE_F32, TB, TT, TD, tz);
    for (int k = 0; k < 2; k++) {
        ct_layer *lk = k ? ct_fixed_base_positional_encoding(4, (const int[]){11, 13, 14, 15}, 8, 100, 100)
                         : ct_fixed_base_positional_encoding_trax();
        if (fixture_init_ok(&f, lk, &tx, 1, true)) {
            run_forward(&f, &tx, ct_key_from_seed(5), ty[k]);
            fixture_free(&f);
        }
        ct_layer_free(lk);
    }
    int differ = 0;
    for (int j = 0; j < TB * TT * TD; j++) differ += memcmp(&ty[0][j], &ty[1][j], sizeof(float)) != 0;
    printf("fixed-base Trax defaults against (11, 13, 14, 15), 8 digits, 100, 100 in training: %d values differ\n",
           differ);
    CHECK(differ == 0);
    free(tz), free(ty[0]), free(ty[1]);
}

// ---- Chunk ------------------------------------------------------------------------

static ct_layer *ff(float rate) {
    if (rate > 0) return ct_serial(CT_LAYERS(ct_dense(7), ct_dropout(rate), ct_relu(), ct_dense(4)));
    return ct_serial(CT_LAYERS(ct_dense(7), ct_relu(), ct_dense(4)));
}

// The edge of max_pos = min(bases)^n_digits (the smallest base, not the
// first: bases (3, 2) with 2 digits give 4): T = max_pos is refused, as
// Trax's assert, where the start draw in [0, max_pos - T) would divide by 0.
// At T = max_pos - 1 the draw has one value, so a training forward (never
// from zero by rule, never base-dropped) equals eval's.
static void test_fixed_base_max_pos(void) {
    enum { B = 32, D = 4 };
    static float z[B * 4 * D], eval_out[B * 3 * D];
    fixture f;
    ct_layer *l = ct_fixed_base_positional_encoding(2, (int[]){3, 2}, 2, 1 << 30, 1 << 30);
    CHECK(fixture_init(&f, l, (ct_tensor[]){ct_tensor_3d(CT_DTYPE_F32, B, 4, D, z)}, 1, true) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(f.err.msg, "FixedBasePositionalEncoding (init)") && strstr(f.err.msg, "not below max_pos 4"), "%s",
              f.err.msg);
    fixture_free(&f);
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, 3, D, z);
    if (fixture_init_ok(&f, l, &x, 1, false)) {
        run_forward(&f, &x, ct_key_from_seed(1), eval_out);
        f.ctx.train = true;
        ct_tensor out;
        CHECK_OK(fixture_forward(&f, &x, &out, 7), &f.err);
        int off = 0;
        for (int i = 0; i < B * 3 * D; i++) off += ct_f32(&out)[i] != eval_out[i];
        CHECK_MSG(off == 0, "T = max_pos - 1: %d values start elsewhere than 0", off);
        fixture_free(&f);
    }
    ct_layer_free(l);
}

// Init keys as documented: W[r][i] from split(split(key, 0), i), the same
// for every base r, start_vec from split(key, 1), all U(+-1e-4) (the
// fixture's init key is seed 3).
static void test_fixed_base_init_keys(void) {
    static float z[1 * 4 * 6];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 1, 4, 6, z);
    fixture f;
    ct_layer *l = fixed_base(100, 100);  // bases (3, 4), 3 digits: d_w = 2
    if (fixture_init_ok(&f, l, &x, 1, false)) {
        ct_key key = ct_key_from_seed(3);
        float want[6];
        int off = 0;
        for (int w = 0; w < 7; w++) {
            const ct_param *p = f.net.params[w];
            int n = w < 6 ? 2 : 6;
            ct_key k = w < 6 ? ct_key_split(ct_key_split(key, 0), (uint32_t)(w % 3)) : ct_key_split(key, 1);
            ct_random_uniform(k, want, (size_t)n, -1e-4f, 1e-4f);
            off += memcmp(want, f.net.weights + p->offset, (size_t)n * sizeof(float)) != 0;
        }
        CHECK_MSG(off == 0, "%d of 7 fixed-base weights drawn from other keys or bounds", off);
        fixture_free(&f);
    }
    ct_layer_free(l);
}

static void test_chunk_gradients(void) {
    float a[2 * 6 * 5];
    ct_tensor x = uniform(ct_tensor_3d(CT_DTYPE_F32, 2, 6, 5, a), 4, -1.0f, 1.0f);
    // 12 rows: 4 and 1 divide, 5 does not (one chunk of 12), 12 is one chunk.
    const int sizes[] = {4, 1, 5, 12};
    for (int i = 0; i < 4; i++) {
        char label[64];
        snprintf(label, sizeof label, "Chunk(Serial(Dense, Relu, Dense), %d)", sizes[i]);
        check_layer(label, ct_chunk(ff(0), sizes[i]), &x, 1, false);
    }
    // Dropout inside: chunk i's key is fold_in(key, i) in forward and in the
    // recomputed forward of backward alike.
    check_layer("Chunk(Serial(Dense, Dropout(0.3), Relu, Dense), 3) train", ct_chunk(ff(0.3f), 3), &x, 1, true);
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = check_worse(m, fabs((double)a[i] - (double)b[i]));
    return m;
}

// Forward and backward of f's root on x with cotangent g; out, grad_in and
// the weight gradients are copied into *_copy.
static void run_fb(fixture *f, const ct_tensor *x, const float *g, float *out_copy, float *gin_copy) {
    ct_tensor out, gout, gin;
    ct_net_zero_grads(&f->net);
    CHECK_OK(ct_layer_forward(f->net.root, &f->ctx, x, &out, ct_key_from_seed(9), &f->err), &f->err);
    memcpy(out_copy, out.data, ct_tensor_nbytes(&out));
    gout = ct_tensor_sig(&out);
    gout.data = (float *)g;
    CHECK_OK(ct_layer_backward(f->net.root, &f->ctx, &gout, &gin, ct_key_from_seed(9), &f->err), &f->err);
    memcpy(gin_copy, gin.data, ct_tensor_nbytes(&gin));
}

// Chunk(FF, c) = FF on the whole (B, T, D) at dropout 0 with the same weights:
// output, input gradient and every weight gradient within 1e-6.
static void test_chunk_exact(int chunk_size) {
    enum { B = 3, T = 8, D = 5, DO = 4 };
    static float xb[B * T * D], g[B * T * DO];
    ct_tensor x = uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, D, xb), 6, -1.0f, 1.0f);
    ct_random_uniform(ct_key_from_seed(7), g, B * T * DO, -1.0f, 1.0f);
    fixture fc, fu;
    ct_layer *lc = ct_chunk(ff(0), chunk_size);
    CHECK_OK(fixture_init(&fc, lc, &x, 1, true), &fc.err);
    ct_layer_free(lc);
    ct_layer *lu = ff(0);
    CHECK_OK(fixture_init(&fu, lu, &x, 1, true), &fu.err);
    ct_layer_free(lu);
    CHECK(fc.net.n_weights == fu.net.n_weights);
    memcpy(fu.net.weights, fc.net.weights, fc.net.n_weights * sizeof(float));
    float oc[B * T * DO], ou[B * T * DO], gc[B * T * D], gu[B * T * D];
    run_fb(&fc, &x, g, oc, gc);
    run_fb(&fu, &x, g, ou, gu);
    double eo = max_abs_diff(oc, ou, B * T * DO), ei = max_abs_diff(gc, gu, B * T * D);
    double ew = max_abs_diff(fc.net.grads, fu.net.grads, fc.net.n_weights);
    printf("Chunk(FF, %d) vs FF on %d rows: max |diff| out %.3g, grad x %.3g, grad w %.3g\n", chunk_size, B * T,
           eo, ei, ew);
    CHECK(eo <= 1e-6 && ei <= 1e-6 && ew <= 1e-6);
    fixture_free(&fc);
    fixture_free(&fu);
}

// Backward keeps one chunk's activations: the arena of a chunked step grows
// far less than the unchunked one when d_ff dominates.
static size_t arena_after_step(ct_layer *l, const ct_tensor *x, const float *g) {
    fixture f;
    CHECK_OK(fixture_init(&f, l, x, 1, true), &f.err);
    ct_layer_free(l);
    static float o[1024 * 4], gi[1024 * 4];
    run_fb(&f, x, g, o, gi);
    size_t cap = ct_arena_capacity(&f.arena);
    fixture_free(&f);
    return cap;
}

// At 1024 rows the unchunked step holds the (1024, 1024) Relu output (4
// MiB) and its gradient; the chunked one 16 rows of them.
static void test_chunk_memory(void) {
    static float xb[1024 * 4], g[1024 * 4];
    ct_tensor x = uniform(ct_tensor_3d(CT_DTYPE_F32, 1, 1024, 4, xb), 8, -1.0f, 1.0f);
    ct_random_uniform(ct_key_from_seed(9), g, 1024 * 4, -1.0f, 1.0f);
    size_t chunked = arena_after_step(ct_chunk(ct_serial(CT_LAYERS(ct_dense(1024), ct_relu(), ct_dense(4))), 16),
                                      &x, g);
    size_t whole = arena_after_step(ct_serial(CT_LAYERS(ct_dense(1024), ct_relu(), ct_dense(4))), &x, g);
    printf("arena after a step, 1024 rows, d_ff 1024: chunked (16 rows) %.2f MiB, unchunked %.2f MiB\n",
           (double)chunked / 1048576.0, (double)whole / 1048576.0);
    CHECK(chunked * 4 < whole);
}

// Axis k's table is drawn from split(layer key, k) (Trax's split(key, K)[k]),
// N(0, 1): the fixture's layer key is the net's, seed 3.
static void test_axial_init_keys(void) {
    float z[1 * 12 * 5] = {0};
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, 1, 12, 5, z);
    fixture f;
    ct_layer *l = axial(2, (int[]){3, 4}, (int[]){2, 3}, 0, 0, NULL);
    CHECK_OK(fixture_init(&f, l, &x, 1, false), &f.err);
    ct_layer_free(l);
    const int n[2] = {3 * 2, 4 * 3};
    int bad = 0;
    for (int k = 0; k < 2; k++) {
        char name[64];
        snprintf(name, sizeof name, "AxialPositionalEncoding/axis_%d", k);
        const ct_param *p = ct_net_find_param(&f.net, name);
        float want[12];
        ct_random_normal(ct_key_split(ct_key_from_seed(3), (uint32_t)k), want, (size_t)n[k], 1.0f);
        bad += !p || memcmp(want, f.net.weights + p->offset, sizeof(float) * (size_t)n[k]) != 0;
    }
    printf("axial init: %d of 2 axis tables differ from N(0, 1) on split(key, k)\n", bad);
    CHECK(bad == 0);
    fixture_free(&f);
}

// Negative dropout_broadcast_dims count from the end of the noise shape (B,
// n_0, n_1, D), as Python's noise_shape[dim]: -1 is D (3), -2 is n_1 (2).
static void test_axial_negative_dims(void) {
    enum { B = 2, T = 12, D = 5 };
    static float z[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, z);
    const int neg[2] = {-1, -2}, pos[2] = {3, 2};
    for (int i = 0; i < 2; i++) {
        float a[B * T * D], b[B * T * D];
        fixture fa, fb;
        ct_layer *la = axial(2, (int[]){3, 4}, (int[]){2, 3}, 0.5f, 1, &neg[i]);
        ct_layer *lb = axial(2, (int[]){3, 4}, (int[]){2, 3}, 0.5f, 1, &pos[i]);
        CHECK_OK(fixture_init(&fa, la, &x, 1, true), &fa.err);
        CHECK_OK(fixture_init(&fb, lb, &x, 1, true), &fb.err);
        ct_layer_free(la);
        ct_layer_free(lb);
        run_forward(&fa, &x, ct_key_from_seed(5), a);
        run_forward(&fb, &x, ct_key_from_seed(5), b);
        bool same = memcmp(a, b, sizeof a) == 0;
        printf("axial dropout dims (%d) vs (%d): %s\n", neg[i], pos[i], same ? "bitwise equal" : "DIFFER");
        CHECK(same);
        fixture_free(&fa);
        fixture_free(&fb);
    }
}

// The trainable table with Trax's channel dropout: the gradient check in
// training (the table's gradient takes the same channel scales), and no
// dropout in eval (on a zero input the output is the sinusoids, exactly).
static void test_trainable_dropout(void) {
    enum { B = 2, T = 5, D = 6 };
    float a[B * T * D], y[B * T * D], pe[8 * D];
    ct_tensor x = uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, D, a), 3, -1.0f, 1.0f);
    check_layer("PositionalEncoding(trainable, dropout 0.3) train",
                ct_positional_encoding_trainable_sinusoidal(8, 0.3f), &x, 1, true);
    memset(a, 0, sizeof a);
    fixture f;
    ct_layer *l = ct_positional_encoding_trainable_sinusoidal(8, 0.5f);
    CHECK_OK(fixture_init(&f, l, &x, 1, false), &f.err);
    ct_layer_free(l);
    run_forward(&f, &x, ct_key_from_seed(5), y);
    memcpy(pe, f.net.weights, sizeof pe);
    int bad = 0;
    for (int i = 0; i < B * T * D; i++) bad += y[i] != pe[i % (T * D)];
    printf("trainable table, dropout 0.5, eval: %d of %d outputs differ from the table\n", bad, B * T * D);
    CHECK(f.net.n_weights == 8 * D && bad == 0);
    // Training: each channel is 0 everywhere or the table / (1 - 0.5)
    // (told apart at position 1, where no sinusoid is 0).
    ct_net_bind(&f.net, &f.ctx, true);
    run_forward(&f, &x, ct_key_from_seed(5), y);
    int kept = 0, dropped = 0;
    bad = 0;
    for (int d = 0; d < D; d++) {
        bool zero = y[D + d] == 0.0f;
        kept += !zero, dropped += zero;
        for (int i = d; i < B * T * D; i += D) bad += y[i] != (zero ? 0.0f : 2.0f * pe[i % (T * D)]);
    }
    printf("trainable table, dropout 0.5, train: %d channels kept (x 2), %d dropped, %d outputs otherwise\n", kept,
           dropped, bad);
    CHECK(bad == 0 && kept > 0 && dropped > 0);
    fixture_free(&f);
}

// Trax's Chunk(layer, c) with c < 1 is the layer itself.
// The sublayer's output for a forward input of another width than init's
// does not fit the output Chunk allocated from init's (n, D'): an error
// naming both, where a wider one was copied past the output's end and a
// narrower one left rows of it unwritten.
static void test_chunk_width(void) {
    float x[4 * 8] = {0};
    fixture f;
    ct_layer *l = ct_chunk(ct_relu(), 2);
    if (fixture_init_ok(&f, l, (ct_tensor[]){ct_tensor_2d(CT_DTYPE_F32, 4, 4, x)}, 1, true)) {
        for (int d = 2; d <= 8; d += 6) {
            ct_tensor in = ct_tensor_2d(CT_DTYPE_F32, 4, d, x), out;
            ct_status st = fixture_forward(&f, &in, &out, 1);
            printf("Chunk(Relu, 2) of (4,4) on (4,%d): %s\n", d, f.err.msg);
            CHECK_MSG(st == CT_ERR_SHAPE && strstr(f.err.msg, "layer Chunk (forward)") &&
                          strstr(f.err.msg, d == 2 ? "gives (2,2) f32" : "gives (2,8) f32") &&
                          strstr(f.err.msg, "expected f32 (2, 4)"),
                      "width %d: %s", d, f.err.msg);
            ct_arena_reset(&f.arena);
        }
        fixture_free(&f);
    }
    ct_layer_free(l);
    // A sublayer that changes the rows (Mean over them) or an input without
    // a feature axis is an error naming Chunk.
    l = ct_chunk(ct_mean(0, true), 2);
    CHECK(fixture_init(&f, l, (ct_tensor[]){ct_tensor_2d(CT_DTYPE_F32, 4, 3, x)}, 1, false) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(f.err.msg, "layer Chunk (init): the sublayer gives (1,3) f32 for a chunk of 2 rows"), "%s",
              f.err.msg);
    fixture_free(&f);
    ct_layer_free(l);
    l = ct_chunk(ct_relu(), 2);
    CHECK(fixture_init(&f, l, (ct_tensor[]){ct_tensor_1d(CT_DTYPE_F32, 4, x)}, 1, false) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(f.err.msg, "layer Chunk (init): input is (4) f32, expected f32 (..., D) of rank >= 2"), "%s",
              f.err.msg);
    fixture_free(&f);
    ct_layer_free(l);
}

static void test_chunk_below_one(void) {
    ct_layer *l = ff(0);
    CHECK(ct_chunk(l, 0) == l && ct_chunk(l, -3) == l);
    // Chunk(layer, 1) is a chunk of one row (Trax's c >= 1), not the layer.
    ct_layer *one = ct_chunk(ct_layer_ref(l), 1);
    CHECK(one != l && strcmp(one->vt->type, "Chunk") == 0);
    ct_layer_free(one);
    ct_layer_free(l);
}

// ReformerLM's 'axial' passes dropout_broadcast_dims 1..K, as Trax: in
// training one (B, D) mask, each (example, channel) dropped at every
// position or at none (zero input: the output is PE x mask / keep).
static void test_reformer_axial_dropout(void) {
    enum { B = 4, T = 20, D = 8 };
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = 8, p.d_model = D, p.d_ff = 8, p.n_layers = 0, p.n_heads = 2, p.max_len = T, p.dropout = 0.5f;
    p.pos_type = "axial", p.pos_axial_n = 2;
    p.pos_axial_shape[0] = 4, p.pos_axial_shape[1] = 5, p.pos_d_axial_embs[0] = 3, p.pos_d_axial_embs[1] = 5;
    ct_layer *m = ct_reformer_lm(p), *ax = NULL;
    for (int i = 0; i < m->n_sub; i++)
        if (strcmp(m->sub[i]->vt->type, "AxialPositionalEncoding") == 0) ax = m->sub[i];
    CHECK(ax != NULL);
    static float z[B * T * D], o[B * T * D];
    ct_tensor x = ct_tensor_3d(CT_DTYPE_F32, B, T, D, z);
    fixture f;
    if (ax && fixture_init_ok(&f, ax, &x, 1, true)) {
        run_forward(&f, &x, ct_key_from_seed(5), o);
        int mixed = 0, dropped = 0;
        for (int b = 0; b < B; b++)
            for (int d = 0; d < D; d++) {
                int zeros = 0;
                for (int t = 0; t < T; t++) zeros += o[(b * T + t) * D + d] == 0.0f;
                mixed += zeros != 0 && zeros != T, dropped += zeros == T;
            }
        printf("ReformerLM axial, dropout 0.5: %d of %d (example, channel) masks dropped, %d mixed\n", dropped,
               B * D, mixed);
        CHECK(mixed == 0 && dropped > 0 && dropped < B * D);
        fixture_free(&f);
    }
    ct_layer_free(m);
}

int main(void) {
    test_axial_gradients();
    test_axial_values();
    test_axial_errors();
    test_axial_dropout_mask();
    test_fixed_gradients();
    test_fixed_base_gradients();
    test_fixed_base_values();
    test_fixed_base_max_pos();
    test_fixed_base_init_keys();
    test_chunk_gradients();
    test_chunk_exact(4);
    test_chunk_exact(5);  // 24 rows: one chunk
    test_chunk_exact(1);
    test_chunk_memory();
    test_axial_init_keys();
    test_axial_negative_dims();
    test_trainable_dropout();
    test_chunk_below_one();
    test_chunk_width();
    test_reformer_axial_dropout();
    return check_summary("test_positions_chunk");
}
