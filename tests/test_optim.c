// Optimizers against three-step references computed independently (numpy,
// float32, Trax's formulas; see the numbers' comments).
#include "check.h"
#include "ctrax/optim/optimizer.h"

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

int main(void) {
    test_adam();
    test_sgd();
    return check_summary("test_optim");
}
