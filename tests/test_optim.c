// Optimizers against three-step references computed independently (numpy,
// float32, Trax's formulas; see the numbers' comments). The references for
// Momentum, RMSProp, Adafactor, SM3 and clipping come from
// tests/optim_reference.py (run with /usr/bin/python3, which has numpy); its
// output names each printed list.
#include <stdlib.h>

#include "check.h"
#include "ctrax/core/error.h"
#include "ctrax/optim/optimizer.h"
#include "optim/internal.h"

static const float grads[3][3] = {{0.1f, -0.2f, 0.3f}, {-0.4f, 0.5f, 0.6f}, {0.7f, 0.0f, -0.9f}};

static void run(ct_optimizer *o, float lr, float w[3]) {
    ct_tensor sig = ct_tensor_1d(CT_DTYPE_F32, 3, NULL);
    float slots[16] = {0};
    CHECK(ct_optimizer_slot_floats(o, &sig) <= 16);
    ct_optimizer_init_slots(o, &sig, slots);
    // Loop steps 1, 2, 3, as Trax's Loop passes them.
    for (int s = 0; s < 3; s++) ct_optimizer_update(o, s + 1, lr, &sig, w, grads[s], slots);
}

static void test_adam(void) {
    // numpy: m = (1-b1) g + b1 m; v = (1-b2) g^2 + b2 v; mh = m / (1 - b1^(step+1));
    // vh = v / (1 - b2^(step+1)); w = (1-wd) w - lr mh / (sqrt(vh) + eps), lr 0.01,
    // other hyperparameters Trax's defaults.
    ct_adam_params p = ct_adam_default_params();
    CHECK(p.b1 == 0.9f && p.b2 == 0.999f && p.eps == 1e-5f && p.weight_decay_rate == 1e-5f && p.learning_rate == 1e-4f);
    ct_optimizer *o = ct_adam_new(p);
    float w[3] = {0.5f, -1.0f, 2.0f};
    run(o, 0.01f, w);  // the step's learning rate overrides p.learning_rate
    CHECK_NEAR(w[0], 0.49433586, 2e-6);
    CHECK_NEAR(w[1], -0.999434829, 2e-6);
    CHECK_NEAR(w[2], 1.98481941, 2e-6);
    ct_tensor sig = ct_tensor_2d(CT_DTYPE_F32, 4, 5, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig) == 40);
    ct_optimizer_free(o);
}

static void test_sgd(void) {
    ct_optimizer *o = ct_sgd_new(ct_sgd_default_params());
    float w[3] = {0.5f, -1.0f, 2.0f};
    run(o, 0.1f, w);
    CHECK_NEAR(w[0], 0.460000038, 1e-7);
    CHECK_NEAR(w[1], -1.02999997, 1e-7);
    CHECK_NEAR(w[2], 2.0, 1e-7);
    ct_optimizer_free(o);
}


// Checks n floats against a reference within tol (absolute).
static void check_all(const char *what, const float *got, const double *want, int n, double tol) {
    for (int i = 0; i < n; i++)
        CHECK_MSG(fabs(got[i] - want[i]) <= tol, "%s[%d]: %.9g vs %.9g", what, i, got[i], want[i]);
}

// Three updates (Loop steps 1, 2, 3) of a weight of signature sig with grads
// (3, numel) laid out step after step. Returns the slots (caller frees).
static float *run_sig(ct_optimizer *o, float lr, const ct_tensor *sig, float *w, const float *grads) {
    size_t n = (size_t)ct_tensor_numel(sig), k = ct_optimizer_slot_floats(o, sig);
    float *slots = calloc(k + 1, sizeof(float));
    ct_optimizer_init_slots(o, sig, slots);
    for (int s = 0; s < 3; s++) ct_optimizer_update(o, s + 1, lr, sig, w, grads + s * n, slots);
    return slots;
}

// Test data (tests/optim_reference.py prints them as w2, g2, w3, g3).
static const float w2_init[6] = {1.76f, 0.4f, 0.98f, 2.24f, 1.87f, -0.98f};  // (2,3)
static const float g2[3][6] = {{0.95f, -0.15f, -0.1f, 0.41f, 0.14f, 1.45f},
                               {0.76f, 0.12f, 0.44f, 0.33f, 1.49f, -0.21f},
                               {0.31f, -0.85f, -2.55f, 0.65f, 0.86f, -0.74f}};
static const float w3_init[12] = {2.27f, -1.45f, 0.05f, -0.19f, 1.53f, 1.47f,
                                  0.15f, 0.38f, -0.89f, -1.98f, -0.35f, 0.16f};  // (2,2,3)
static const float g3[3][12] = {
    {1.23f, 1.2f, -0.39f, -0.3f, -1.05f, -1.42f, -1.71f, 1.95f, -0.51f, -0.44f, -1.25f, 0.78f},
    {-1.61f, -0.21f, -0.9f, 0.39f, -0.51f, -1.18f, -0.03f, 0.43f, 0.07f, 0.3f, -0.63f, -0.36f},
    {-0.67f, -0.36f, -0.81f, -1.73f, 0.18f, -0.4f, -1.63f, 0.46f, -0.91f, 0.05f, 0.73f, 0.13f}};

static void test_momentum(void) {
    ct_momentum_params p = ct_momentum_default_params();
    CHECK(p.learning_rate == 0.01f && p.mass == 0.9f && p.weight_decay_rate == 1e-5f && p.nesterov);
    ct_optimizer *o = ct_momentum_new(p);
    CHECK(strcmp(ct_optimizer_name(o), "Momentum") == 0);
    ct_tensor sig = ct_tensor_1d(CT_DTYPE_F32, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig) == 3);
    float w[3] = {0.5f, -1.0f, 2.0f};
    float *slots = run_sig(o, 0.1f, &sig, w, &grads[0][0]);
    // "momentum nesterov lr0.1", "momentum velocity"
    check_all("momentum w", w, (const double[]){0.44099468, -1.06668997, 1.90517247}, 3, 2e-6);
    check_all("momentum v", slots, (const double[]){0.421000004, 0.287999988, -0.116999984}, 3, 2e-6);
    free(slots);
    ct_optimizer_free(o);

    p.nesterov = false;
    o = ct_momentum_new(p);
    float w2[3] = {0.5f, -1.0f, 2.0f};
    slots = run_sig(o, 0.1f, &sig, w2, &grads[0][0]);
    // "momentum plain lr0.1"
    check_all("momentum plain w", w2, (const double[]){0.478884816, -1.04077005, 1.89464152}, 3, 2e-6);
    free(slots);
    ct_optimizer_free(o);
}

static void test_rmsprop(void) {
    ct_rmsprop_params p = ct_rmsprop_default_params();
    CHECK(p.learning_rate == 1e-3f && p.gamma == 0.9f && p.eps == 1e-8f);
    ct_optimizer *o = ct_rmsprop_new(p);
    ct_tensor sig = ct_tensor_2d(CT_DTYPE_F32, 2, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig) == 6);
    // Trax starts the accumulator at ones, not zeros.
    float start[6] = {0};
    ct_optimizer_init_slots(o, &sig, start);
    for (int i = 0; i < 6; i++) CHECK(start[i] == 1.0f);
    sig = ct_tensor_1d(CT_DTYPE_F32, 3, NULL);
    float w[3] = {0.5f, -1.0f, 2.0f};
    float *slots = run_sig(o, 0.01f, &sig, w, &grads[0][0]);
    // "rmsprop lr0.01", "rmsprop acc"
    check_all("rmsprop w", w, (const double[]){0.495485574, -1.00335646, 2.00012493}, 3, 2e-6);
    check_all("rmsprop a", slots, (const double[]){0.79321003, 0.754739881, 0.84969002}, 3, 2e-6);
    free(slots);
    ct_optimizer_free(o);

    // eps large enough to show where it goes: after the square root.
    p.eps = 0.1f;
    o = ct_rmsprop_new(p);
    float we[3] = {0.5f, -1.0f, 2.0f};
    slots = run_sig(o, 0.01f, &sig, we, &grads[0][0]);
    // "rmsprop eps0.1 lr0.01"
    check_all("rmsprop eps 0.1 w", we, (const double[]){0.495943606, -1.00301909, 2.0001018}, 3, 2e-6);
    free(slots);
    ct_optimizer_free(o);
}

static void test_adafactor(void) {
    ct_adafactor_params p = ct_adafactor_default_params();
    // Trax's current epsilon1 is 1e-16 (older Traxes had 1e-30).
    CHECK(p.learning_rate == 0.05f && p.factored && p.multiply_by_parameter_scale && p.do_clipping &&
          !p.do_momentum && p.beta1 == 0.0f && p.decay_rate == 0.8f && p.clipping_threshold == 1.0f &&
          p.weight_decay_rate == 1e-5f && p.epsilon1 == 1e-16f && p.epsilon2 == 1e-3f);
    ct_optimizer *o = ct_adafactor_new(p);

    // Unfactored (1-D): one accumulator per element.
    ct_tensor sig1 = ct_tensor_1d(CT_DTYPE_F32, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig1) == 3);
    float w[3] = {0.5f, -1.0f, 2.0f};
    float *slots = run_sig(o, 0.05f, &sig1, w, &grads[0][0]);
    // "adafactor 1d w", "adafactor 1d v"
    check_all("adafactor 1d w", w, (const double[]){0.419968843, -0.996920168, 1.94739699}, 3, 2e-6);
    check_all("adafactor 1d v", slots, (const double[]){0.208412647, 0.0785686299, 0.387631208}, 3, 1e-6);
    free(slots);

    // Factored (2-D): row and column accumulators, 2 + 3 floats.
    ct_tensor sig2 = ct_tensor_2d(CT_DTYPE_F32, 2, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig2) == 5);
    float wf[6];
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.05f, &sig2, wf, &g2[0][0]);
    // "adafactor 2d w", "adafactor 2d vr", "adafactor 2d vc"
    check_all("adafactor 2d w", wf,
              (const double[]){1.49288654, 0.538226306, 1.03795147, 2.09740782, 1.62052906, -1.00374579}, 6, 3e-6);
    check_all("adafactor 2d vr", slots, (const double[]){0.94803369, 0.579926848}, 2, 1e-6);
    check_all("adafactor 2d vc", slots + 2, (const double[]){0.301527947, 0.556784987, 1.43362796}, 3, 2e-6);
    free(slots);

    // Rank 3: a batch of two (2,3) matrices, each factored on its own; lr 0.5
    // so that update clipping acts.
    ct_tensor sig3 = ct_tensor_3d(CT_DTYPE_F32, 2, 2, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig3) == 4 + 6);
    float w3[12];
    memcpy(w3, w3_init, sizeof w3);
    slots = run_sig(o, 0.5f, &sig3, w3, &g3[0][0]);
    // "adafactor 3d lr0.5 w", "adafactor 3d vr", "adafactor 3d vc"
    check_all("adafactor 3d w", w3,
              (const double[]){3.08110809, -1.36642337, 1.70692825, 1.02778101, 2.32764935, 3.55910039, 2.04608774,
                               -0.759235144, 0.597601175, -2.10423851, -0.197281301, -0.383569539},
              12, 5e-6);
    check_all("adafactor 3d vr", slots, (const double[]){0.688347816, 0.75837326, 0.948313713, 0.295301378}, 4, 1e-6);
    check_all("adafactor 3d vc", slots + 4,
              (const double[]){1.12986922, 0.355156302, 0.685056269, 0.802125096, 0.807477355, 0.255820215}, 6, 2e-6);
    free(slots);
    ct_optimizer_free(o);

    // factored = false: a 2-D weight takes the unfactored path.
    p.factored = false;
    o = ct_adafactor_new(p);
    CHECK(ct_optimizer_slot_floats(o, &sig2) == 6);
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.05f, &sig2, wf, &g2[0][0]);
    // "adafactor 2d unfactored w"
    check_all("adafactor unfactored w", wf,
              (const double[]){1.59072852, 0.503760874, 1.05281389, 2.01876783, 1.64370465, -0.989412487}, 6, 3e-6);
    free(slots);
    ct_optimizer_free(o);

    // Momentum (beta1 0.9): the m slot follows vr, vc.
    p = ct_adafactor_default_params();
    p.do_momentum = true;
    p.beta1 = 0.9f;
    o = ct_adafactor_new(p);
    CHECK(ct_optimizer_slot_floats(o, &sig2) == 5 + 6);
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.05f, &sig2, wf, &g2[0][0]);
    // "adafactor 2d mom w", "adafactor 2d mom m"
    check_all("adafactor mom w", wf,
              (const double[]){1.70168519, 0.428873152, 0.982173622, 2.21674132, 1.82408667, -0.994583786}, 6, 3e-6);
    check_all("adafactor mom m", slots + 5,
              (const double[]){0.0235946905, -0.012482442, -0.00675910711, 0.0137945097, 0.0232952237,
                               0.000736112241},
              6, 2e-7);
    free(slots);
    ct_optimizer_free(o);

    // clipping_threshold 0.5: the update's RMS is clipped to it (1-D and 2-D
    // take separate paths).
    p = ct_adafactor_default_params();
    p.clipping_threshold = 0.5f;
    o = ct_adafactor_new(p);
    float wc[3] = {0.5f, -1.0f, 2.0f};
    slots = run_sig(o, 0.05f, &sig1, wc, &grads[0][0]);
    // "adafactor 1d thr0.5 w"
    check_all("adafactor 1d thr 0.5 w", wc, (const double[]){0.459712744, -0.999165237, 1.97392344}, 3, 2e-6);
    free(slots);
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.05f, &sig2, wf, &g2[0][0]);
    // "adafactor 2d thr0.5 w"
    check_all("adafactor 2d thr 0.5 w", wf,
              (const double[]){1.62543821, 0.469950229, 1.01039362, 2.16732049, 1.74354088, -0.991147101}, 6, 3e-6);
    free(slots);
    ct_optimizer_free(o);

    // multiply_by_parameter_scale off: the step is lr itself.
    p = ct_adafactor_default_params();
    p.multiply_by_parameter_scale = false;
    o = ct_adafactor_new(p);
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.05f, &sig2, wf, &g2[0][0]);
    // "adafactor 2d noscale w"
    check_all("adafactor 2d noscale w", wf,
              (const double[]){1.58049977, 0.493781596, 1.02223265, 2.14192319, 1.70023203, -0.993777812}, 6, 3e-6);
    free(slots);
    ct_optimizer_free(o);

    // Momentum on the rank-3 weight: m follows vr (2*2) and vc (2*3).
    p = ct_adafactor_default_params();
    p.do_momentum = true;
    p.beta1 = 0.9f;
    o = ct_adafactor_new(p);
    CHECK(ct_optimizer_slot_floats(o, &sig3) == 4 + 6 + 12);
    memcpy(w3, w3_init, sizeof w3);
    slots = run_sig(o, 0.5f, &sig3, w3, &g3[0][0]);
    // "adafactor 3d lr0.5 mom w", "adafactor 3d mom m"
    check_all("adafactor 3d mom w", w3,
              (const double[]){2.27804852, -1.54769063, 0.273799539, -0.093527481, 1.74443066, 1.86770201,
                               0.417718112, 0.162882566, -0.718881488, -1.96671808, -0.164752185, 0.00339527428},
              12, 5e-6);
    check_all("adafactor 3d mom m", slots + 10,
              (const double[]){-0.0621815696, -0.002696082, -0.127873465, -0.0875617564, -0.0670485497,
                               -0.166764677, -0.143561751, 0.0896470845, -0.110491261, 0.00979712605,
                               -0.0208329931, 0.040892411},
              12, 2e-6);
    free(slots);
    ct_optimizer_free(o);

    // A zero weight (a bias): its RMS is 0, so the step is lr * epsilon2 (1e-3)
    // times the clipped y (+-1 at step 1: g / sqrt(mix g^2), RMS 1.32 > 1).
    o = ct_adafactor_new(ct_adafactor_default_params());
    float wz[3] = {0};
    slots = calloc(3, sizeof(float));
    ct_optimizer_update(o, 1, 0.05f, &sig1, wz, grads[0], slots);
    check_all("adafactor zero w", wz, (const double[]){-5e-5, 5e-5, -5e-5}, 3, 1e-10);
    free(slots);
    ct_optimizer_free(o);

    // Gradients near 1e-8: g^2 is near epsilon1 (1e-16), so where epsilon1
    // goes shows (Trax's current Adafactor adds it where the accumulators
    // are read; added to g^2, as older Traxes did, w[0] of the 2-D case ended
    // at 1.597 rather than 1.687).
    o = ct_adafactor_new(ct_adafactor_default_params());
    float tiny1[9], tiny2[18];
    for (int i = 0; i < 9; i++) tiny1[i] = (&grads[0][0])[i] * 1e-8f;
    for (int i = 0; i < 18; i++) tiny2[i] = (&g2[0][0])[i] * 1e-8f;
    float wt[3] = {0.5f, -1.0f, 2.0f};
    slots = run_sig(o, 0.05f, &sig1, wt, tiny1);
    // "adafactor tiny 1d w"
    check_all("adafactor tiny 1d w", wt, (const double[]){0.477244586, -1.01785052, 1.99417615}, 3, 2e-6);
    free(slots);
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.05f, &sig2, wf, tiny2);
    // "adafactor tiny 2d w"
    check_all("adafactor tiny 2d w", wf,
              (const double[]){1.68666828, 0.433157146, 1.04299772, 2.18712783, 1.78308165, -0.988813698}, 6, 3e-6);
    free(slots);
    ct_optimizer_free(o);
}

static void test_sm3(void) {
    ct_sm3_params p = ct_sm3_default_params();
    CHECK(p.learning_rate == 0.01f && p.momentum == 0.9f && p.second_moment_averaging == 1.0f &&
          p.weight_decay == 0.0f && p.momentum_type == CT_SM3_MOMENTUM_EMA);
    ct_optimizer *o = ct_sm3_new(p);

    // 1-D: a diagonal accumulator. Slots: m (3), v (3).
    ct_tensor sig1 = ct_tensor_1d(CT_DTYPE_F32, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig1) == 6);
    float w[3] = {0.5f, -1.0f, 2.0f};
    float *slots = run_sig(o, 0.1f, &sig1, w, &grads[0][0]);
    // "sm3 1d w", "sm3 1d v"
    check_all("sm3 1d w", w, (const double[]){0.482716322, -0.990541101, 1.96392369}, 3, 2e-6);
    check_all("sm3 1d v", slots + 3, (const double[]){0.659999967, 0.289999992, 1.25999999}, 3, 2e-6);
    free(slots);

    // 2-D: one accumulator per row and per column, min over the two covers.
    // Slots: m (6), v (2 + 3), scratch (5).
    ct_tensor sig2 = ct_tensor_2d(CT_DTYPE_F32, 2, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig2) == 6 + 5 + 5);
    float wf[6];
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.1f, &sig2, wf, &g2[0][0]);
    // "sm3 2d w", "sm3 2d m", "sm3 2d v0", "sm3 2d v1"
    check_all("sm3 2d w", wf,
              (const double[]){1.71856153, 0.420958102, 1.00814033, 2.20195293, 1.8190155, -0.999868393}, 6, 3e-6);
    check_all("sm3 2d m", slots,
              (const double[]){0.161914587, -0.0820506215, -0.133430108, 0.157655895, 0.220347509, 0.0230166763}, 6,
              1e-6);
    check_all("sm3 2d v", slots + 6, (const double[]){7.98259926, 2.98219991, 1.90259981, 2.98219991, 7.98259926}, 5,
              5e-6);
    free(slots);

    // 3-D (2,2,3): covers 2 + 2 + 3.
    ct_tensor sig3 = ct_tensor_3d(CT_DTYPE_F32, 2, 2, 3, NULL);
    CHECK(ct_optimizer_slot_floats(o, &sig3) == 12 + 7 + 7);
    float w3[12];
    memcpy(w3, w3_init, sizeof w3);
    slots = run_sig(o, 0.1f, &sig3, w3, &g3[0][0]);
    // "sm3 3d w", "sm3 3d v"
    check_all("sm3 3d w", w3,
              (const double[]){2.26012874, -1.4725461, 0.0912889168, -0.161094457, 1.56255186, 1.51136065,
                               0.183756888, 0.346563697, -0.859414458, -1.95709813, -0.318871617, 0.136866808},
              12, 3e-6);
    check_all("sm3 3d v", slots + 12,
              (const double[]){6.40170002, 6.64430046, 6.64430046, 6.40170002, 6.64430046, 4.19900036, 4.23689985}, 7,
              5e-6);
    free(slots);
    ct_optimizer_free(o);

    // Grafting (second_moment_averaging 0.9), weight decay, heavy-ball momentum
    // on the 2-D weight; Nesterov on the 1-D one.
    p.second_moment_averaging = 0.9f;
    p.weight_decay = 0.01f;
    p.momentum_type = CT_SM3_MOMENTUM_HEAVY_BALL;
    o = ct_sm3_new(p);
    CHECK(ct_optimizer_slot_floats(o, &sig2) == 6 + 2 * 5 + 2 * 5);
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.1f, &sig2, wf, &g2[0][0]);
    // "sm3 2d graft heavy w"
    check_all("sm3 graft heavy w", wf,
              (const double[]){1.33375084, 0.606354117, 1.25130689, 1.84451425, 1.35367513, -1.17006075}, 6, 3e-6);
    free(slots);
    ct_optimizer_free(o);
    p.momentum_type = CT_SM3_MOMENTUM_NESTEROV;
    o = ct_sm3_new(p);
    float w1[3] = {0.5f, -1.0f, 2.0f};
    slots = run_sig(o, 0.1f, &sig1, w1, &grads[0][0]);
    // "sm3 1d graft nesterov w"
    check_all("sm3 graft nesterov w", w1, (const double[]){0.251625836, -0.900493085, 1.55108678}, 3, 3e-6);
    free(slots);
    ct_optimizer_free(o);

    // Gradients near 1e-17: sqrt(acc) is near the 1e-16 added to it.
    o = ct_sm3_new(ct_sm3_default_params());
    float tiny[9], wt[3] = {0.5f, -1.0f, 2.0f};
    for (int i = 0; i < 9; i++) tiny[i] = (&grads[0][0])[i] * 1e-16f;
    slots = run_sig(o, 0.1f, &sig1, wt, tiny);
    // "sm3 tiny 1d w"
    check_all("sm3 tiny w", wt, (const double[]){0.499055326, -1.00165808, 1.99116349}, 3, 2e-6);
    free(slots);

    // second_moment_averaging set to 0.9 after a construction at 1: decaying
    // averages (g^2 weighted by 1 - 0.9) without grafting, whose norms would
    // cancel that weight.
    ct_error err;
    CHECK_OK(ct_optimizer_set_param(o, "second_moment_averaging", 0.9f, &err), &err);
    CHECK(ct_optimizer_slot_floats(o, &sig2) == 6 + 5 + 5);
    memcpy(wf, w2_init, sizeof wf);
    slots = run_sig(o, 0.1f, &sig2, wf, &g2[0][0]);
    // "sm3 2d b2 0.9 nograft w"
    check_all("sm3 b2 0.9 no graft w", wf,
              (const double[]){1.62712252, 0.466098994, 1.06829786, 2.11775351, 1.70810914, -1.04116774}, 6, 3e-6);
    free(slots);
    ct_optimizer_free(o);

    // momentum 0: no momentum slot (its EMA would only copy the update), so
    // only v (and the covers' scratch) and the layout says so; a momentum slot
    // there would make checkpoints of another size than Trax's layout.
    p = ct_sm3_default_params();
    p.momentum = 0.0f;
    o = ct_sm3_new(p);
    CHECK_MSG(ct_optimizer_slot_floats(o, &sig1) == 3 && ct_optimizer_slot_floats(o, &sig2) == 5 + 5,
              "SM3 momentum 0: %zu and %zu slot floats, want 3 and 10", ct_optimizer_slot_floats(o, &sig1),
              ct_optimizer_slot_floats(o, &sig2));
    CHECK(!strcmp(ct_optimizer_slot_layout(o), "no momentum slot, no grafting accumulators"));
    ct_optimizer_free(o);
}

static void test_clip(void) {
    // Norm 13 ("clip norm"): above 6.5 every gradient is scaled by 6.5 / 13
    // ("clip to 6.5"); at or below it nothing changes.
    float g[4] = {3.0f, -4.0f, 0.0f, 12.0f};
    CHECK(ct_clip_grad_norm(g, 4, 20.0f) == 13.0f);
    CHECK(g[0] == 3.0f && g[1] == -4.0f && g[2] == 0.0f && g[3] == 12.0f);
    CHECK(ct_clip_grad_norm(g, 4, 6.5f) == 13.0f);
    check_all("clipped", g, (const double[]){1.5, -2, 0, 6}, 4, 1e-7);
    CHECK_NEAR(sqrt(g[0] * g[0] + g[1] * g[1] + g[3] * g[3]), 6.5, 1e-6);
    // Exactly at max_norm Trax scales by max_norm / norm = 1.
    float h[2] = {3.0f, 4.0f};
    CHECK(ct_clip_grad_norm(h, 2, 5.0f) == 5.0f && h[0] == 3.0f && h[1] == 4.0f);
    // A zero gradient stays zero (Trax would give NaN for max_norm 0).
    float z[3] = {0};
    CHECK(ct_clip_grad_norm(z, 3, 0.0f) == 0.0f && z[0] == 0.0f && !isnan(z[1]));
    CHECK(ct_clip_factor(2.0f, 1.0f) == 0.5f && ct_clip_factor(0.5f, 1.0f) == 1.0f);
    CHECK(ct_clip_grad_norm(NULL, 0, 1.0f) == 0.0f);
    // Finite gradients whose norm (4e38) is past FLT_MAX are clipped to the
    // norm asked for: each 2e38 becomes 0.5 (with the norm taken in float,
    // inf, the factor was 0 and the step's gradient zeroed).
    float big[4] = {2e38f, -2e38f, 2e38f, 2e38f};
    CHECK(isinf(ct_clip_grad_norm(big, 4, 1.0f)));  // the norm reported, as a float
    check_all("clipped past FLT_MAX", big, (const double[]){0.5, -0.5, 0.5, 0.5}, 4, 1e-5);
    CHECK_MSG(ct_clip_factor(4e38, 1.0f) > 0.0f, "factor for a norm of 4e38: %g", (double)ct_clip_factor(4e38, 1.0f));
}

static void test_params_by_name(void) {
    ct_error err;
    ct_optimizer *o = ct_adam_new(ct_adam_default_params());
    CHECK(strcmp(ct_optimizer_name(o), "Adam") == 0);
    CHECK(ct_optimizer_n_params(o) == 5);
    CHECK(strcmp(ct_optimizer_param_name(o, 1), "b1") == 0);
    float v = 0.0f;
    CHECK_OK(ct_optimizer_get_param(o, "b1", &v, &err), &err);
    CHECK(v == 0.9f);
    CHECK_OK(ct_optimizer_set_param(o, "b1", 0.8f, &err), &err);
    CHECK_OK(ct_optimizer_get_param(o, "b1", &v, &err), &err);
    CHECK(v == 0.8f && ((ct_adam_params *)o->params)->b1 == 0.8f);
    // An unknown name is an argument error that lists the known names.
    CHECK(ct_optimizer_get_param(o, "beta1", &v, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "'beta1'") && strstr(err.msg, "learning_rate, b1, b2, eps, weight_decay_rate"), "%s",
              err.msg);
    CHECK(ct_optimizer_set_param(o, "momentum", 0.5f, &err) == CT_ERR_ARG);
    CHECK(ct_optimizer_set_param(o, "b2", NAN, &err) == CT_ERR_ARG);
    // Values outside the config's ranges are refused here too (b1 = 1
    // divided by 0 in the bias correction; eps = 0 made 0/0 where a
    // gradient is 0), and the value stays.
    static const struct {
        const char *name;
        float value;
        const char *says;
    } out[] = {{"b1", 1.0f, "b1 must be in [0, 1), got 1"},
               {"b2", -0.1f, "b2 must be in [0, 1), got -0.1"},
               {"eps", 0.0f, "eps must be in (0, inf], got 0"},
               {"learning_rate", -1.0f, "learning_rate must be in [0, inf], got -1"}};
    for (size_t k = 0; k < sizeof out / sizeof out[0]; k++) {
        float before, after;
        CHECK_OK(ct_optimizer_get_param(o, out[k].name, &before, &err), &err);
        CHECK_MSG(ct_optimizer_set_param(o, out[k].name, out[k].value, &err) == CT_ERR_ARG &&
                      strstr(err.msg, out[k].says),
                  "%s = %g: %s", out[k].name, (double)out[k].value, err.msg);
        CHECK_OK(ct_optimizer_get_param(o, out[k].name, &after, &err), &err);
        CHECK(after == before);
    }
    ct_optimizer_free(o);

    // Every optimizer's parameters read back what was set, by index.
    ct_optimizer *all[] = {ct_sgd_new(ct_sgd_default_params()), ct_momentum_new(ct_momentum_default_params()),
                           ct_rmsprop_new(ct_rmsprop_default_params()),
                           ct_adafactor_new(ct_adafactor_default_params()), ct_sm3_new(ct_sm3_default_params())};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        CHECK(ct_optimizer_n_params(all[k]) >= 1);
        CHECK(strcmp(ct_optimizer_param_name(all[k], 0), "learning_rate") == 0);
        for (int i = 0; i < ct_optimizer_n_params(all[k]); i++) {
            const char *name = ct_optimizer_param_name(all[k], i);
            float x;
            CHECK_OK(ct_optimizer_get_param(all[k], name, &x, &err), &err);
            CHECK_OK(ct_optimizer_set_param(all[k], name, x, &err), &err);  // restoring a checkpoint's values
        }
    }
    // Booleans are 0 or 1; Momentum's nesterov can be switched.
    float x;
    CHECK_OK(ct_optimizer_set_param(all[1], "nesterov", 0.0f, &err), &err);
    CHECK(!((ct_momentum_params *)all[1]->params)->nesterov);
    CHECK(ct_optimizer_set_param(all[1], "nesterov", 0.5f, &err) == CT_ERR_ARG);
    // Adafactor's factored and do_momentum fix the slot layout.
    CHECK_OK(ct_optimizer_get_param(all[3], "factored", &x, &err), &err);
    CHECK(x == 1.0f);
    CHECK(ct_optimizer_set_param(all[3], "factored", 0.0f, &err) == CT_ERR_STATE);
    CHECK_MSG(strstr(err.msg, "factored") != NULL, "%s", err.msg);
    CHECK(ct_optimizer_set_param(all[3], "do_momentum", 1.0f, &err) == CT_ERR_STATE);
    CHECK_OK(ct_optimizer_set_param(all[3], "do_clipping", 0.0f, &err), &err);
    CHECK_OK(ct_optimizer_set_param(all[3], "beta1", 0.5f, &err), &err);
    CHECK(ct_optimizer_get_param(all[3], "beta", &x, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "Adafactor") && strstr(err.msg, "epsilon2"), "%s", err.msg);
    // RMSProp's eps = 0 gave 0/0 = NaN at a zero gradient once the mean
    // square reached 0 (gamma 0: at once); Adafactor's clipping_threshold = 0
    // divided every update by inf (the weights never moved).
    CHECK_MSG(ct_optimizer_set_param(all[2], "eps", 0.0f, &err) == CT_ERR_ARG &&
                  strstr(err.msg, "RMSProp: hyperparameter eps must be in (0, inf], got 0"),
              "%s", err.msg);
    CHECK_MSG(ct_optimizer_set_param(all[3], "clipping_threshold", 0.0f, &err) == CT_ERR_ARG &&
                  strstr(err.msg, "clipping_threshold must be in (0, inf], got 0"),
              "%s", err.msg);
    // SM3's momentum 1 kept EMA's m, and so every update, at 0.
    CHECK_MSG(ct_optimizer_set_param(all[4], "momentum", 1.0f, &err) == CT_ERR_ARG &&
                  strstr(err.msg, "SM3: hyperparameter momentum must be in [0, 1), got 1"),
              "%s", err.msg);
    // SM3's momentum_type is an enum in [1, 3].
    CHECK_OK(ct_optimizer_set_param(all[4], "momentum_type", 3.0f, &err), &err);
    CHECK(((ct_sm3_params *)all[4]->params)->momentum_type == CT_SM3_MOMENTUM_NESTEROV);
    CHECK(ct_optimizer_set_param(all[4], "momentum_type", 4.0f, &err) == CT_ERR_ARG);
    CHECK(ct_optimizer_set_param(all[4], "momentum_type", 1.5f, &err) == CT_ERR_ARG);
    // Below the range too: 0 would be taken as heavy ball by the update.
    CHECK_MSG(ct_optimizer_set_param(all[4], "momentum_type", 0.0f, &err) == CT_ERR_ARG &&
                  strstr(err.msg, "momentum_type must be a whole number in [1, 3], got 0"),
              "%s", err.msg);
    CHECK(((ct_sm3_params *)all[4]->params)->momentum_type == CT_SM3_MOMENTUM_NESTEROV);
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) ct_optimizer_free(all[k]);
}

int main(void) {
    test_adam();
    test_sgd();
    test_momentum();
    test_rmsprop();
    test_adafactor();
    test_sm3();
    test_clip();
    test_params_by_name();
    return check_summary("test_optim");
}
