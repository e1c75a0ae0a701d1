// Learning-rate schedules: Trax's own test values (trax/supervised/
// lr_schedules_test.py) for constant, warmup and warmup_and_rsqrt_decay;
// multifactor against values computed in double with /usr/bin/python3 from
// Trax's multifactor formulas (a transcription of lr_schedules.multifactor,
// run at the steps below: the end of tests/optim_reference.py); describe;
// errors.
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "ctrax/optim/schedules.h"

// Schedules return float: compare to 1e-6 relative.
#define CHECK_LR(s, step, want)                                                              \
    do {                                                                                     \
        double w_ = (want);                                                                  \
        CHECK_MSG(fabs(ct_schedule_value((s), (step)) - w_) <= 1e-6 * fabs(w_) + 1e-12,      \
                  "step %lld: %.9g vs %.9g", (long long)(step), ct_schedule_value((s), (step)), w_); \
    } while (0)

static void check_describe(const ct_schedule *s, const char *want) {
    char buf[256];
    size_t n = ct_schedule_describe(s, buf, sizeof buf);
    CHECK_MSG(strcmp(buf, want) == 0, "'%s' vs '%s'", buf, want);
    CHECK(n == strlen(want));
    // Truncation: snprintf semantics, always terminated.
    char small[8];
    CHECK(ct_schedule_describe(s, small, sizeof small) == n);
    CHECK(strlen(small) == 7 && strncmp(small, want, 7) == 0);
    CHECK(ct_schedule_describe(s, NULL, 0) == n);
}

static void test_constant(void) {
    ct_error err;
    ct_schedule *s = NULL;
    CHECK_OK(ct_schedule_constant(0.02, &s, &err), &err);
    const int64_t steps[] = {1, 20, 300, 4000, 50000, 600000, 7000000, 80000000, 900000000};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) CHECK(ct_schedule_value(s, steps[i]) == 0.02f);
    // Trax's constant is a body from step 1 after a warm-up from (0, 0).
    CHECK(ct_schedule_value(s, 0) == 0.0f);
    CHECK(strcmp(ct_schedule_name(s), "constant") == 0);
    check_describe(s, "constant(value=0.02)");
    ct_schedule_free(s);
    // Every digit that reads back to the value (17 at most), not %g's 6.
    CHECK_OK(ct_schedule_constant(1.0 / 3.0, &s, &err), &err);
    check_describe(s, "constant(value=0.3333333333333333)");
    ct_schedule_free(s);
}

static void test_warmup(void) {
    ct_error err;
    ct_schedule *s = NULL;
    CHECK_OK(ct_schedule_warmup(9, 0.01, &s, &err), &err);
    // Linear warm-up, then constant (Trax's test_warmup).
    CHECK_LR(s, 1, 0.001);
    CHECK_LR(s, 2, 0.002);
    CHECK_LR(s, 5, 0.005);
    CHECK_LR(s, 9, 0.009);
    CHECK_LR(s, 10, 0.01);
    CHECK_LR(s, 11, 0.01);
    CHECK_LR(s, 20, 0.01);
    CHECK_LR(s, 300, 0.01);
    CHECK_LR(s, 4000, 0.01);
    check_describe(s, "warmup(n_warmup_steps=9, max_value=0.01)");
    ct_schedule_free(s);
    // No warm-up steps: constant from step 1.
    CHECK_OK(ct_schedule_warmup(0, 0.5, &s, &err), &err);
    CHECK_LR(s, 1, 0.5);
    ct_schedule_free(s);
    // The longest warm-up: n + 1 does not fit in int64 (it wrapped: 0.5 at
    // step 1, and NaN from warmup_and_rsqrt_decay).
    CHECK_OK(ct_schedule_warmup(INT64_MAX, 0.5, &s, &err), &err);
    CHECK_LR(s, 1, 0.5 / 0x1p63);
    CHECK_LR(s, INT64_MAX, 0.5);
    ct_schedule_free(s);
    CHECK_OK(ct_schedule_warmup_and_rsqrt_decay(INT64_MAX, 0.5, &s, &err), &err);
    CHECK_LR(s, 1, 0.5 / 0x1p63);
    ct_schedule_free(s);
}

static void test_warmup_and_rsqrt_decay(void) {
    ct_error err;
    ct_schedule *s = NULL;
    CHECK_OK(ct_schedule_warmup_and_rsqrt_decay(24, 0.25, &s, &err), &err);
    // Trax's test_warmup_and_rsqrt_decay.
    CHECK_LR(s, 1, 0.01);
    CHECK_LR(s, 2, 0.02);
    CHECK_LR(s, 23, 0.23);
    CHECK_LR(s, 24, 0.24);
    CHECK_LR(s, 25, 0.25 * (5 / sqrt(25)));
    CHECK_LR(s, 26, 0.25 * (5 / sqrt(26)));
    CHECK_LR(s, 27, 0.25 * (5 / sqrt(27)));
    CHECK_LR(s, 300, 0.25 * (5 / sqrt(300)));
    CHECK_LR(s, 4000, 0.25 * (5 / sqrt(4000)));
    CHECK_LR(s, 50000, 0.25 * (5 / sqrt(50000)));
    CHECK(strcmp(ct_schedule_name(s), "warmup_and_rsqrt_decay") == 0);
    check_describe(s, "warmup_and_rsqrt_decay(n_warmup_steps=24, max_value=0.25)");
    ct_schedule_free(s);
}

static ct_schedule *mf(const char *factors, ct_multifactor_params p) {
    ct_error err;
    ct_schedule *s = NULL;
    p.factors = factors;
    CHECK_OK(ct_schedule_multifactor(&p, &s, &err), &err);
    return s;
}

static void test_multifactor(void) {
    ct_multifactor_params d = ct_multifactor_default_params();
    CHECK(strcmp(d.factors, "constant * linear_warmup * rsqrt_decay") == 0 && d.constant == 0.1 &&
          d.warmup_steps == 400 && d.decay_factor == 0.5 && d.steps_per_decay == 20000 &&
          d.steps_per_cycle == 100000 && d.second_constant == 0.01 && d.second_constant_step == 10000 &&
          d.minimum == 0.0);

    // The default: constant 0.1, warm-up 400, rsqrt decay.
    ct_schedule *s = mf(d.factors, d);
    CHECK_LR(s, 1, 1.25e-05);
    CHECK_LR(s, 100, 0.00125);
    CHECK_LR(s, 399, 0.004987500000000001);
    CHECK_LR(s, 400, 0.005);
    CHECK_LR(s, 401, 0.004993761694389223);
    CHECK_LR(s, 1000, 0.0031622776601683794);
    CHECK_LR(s, 10000, 0.001);
    check_describe(s, "multifactor(factors='constant * linear_warmup * rsqrt_decay', constant=0.1, warmup_steps=400)");
    ct_schedule_free(s);

    s = mf("constant * linear_warmup", d);
    CHECK_LR(s, 1, 0.00025);
    CHECK_LR(s, 200, 0.05);
    CHECK_LR(s, 400, 0.1);
    CHECK_LR(s, 800, 0.1);
    check_describe(s, "multifactor(factors='constant * linear_warmup', constant=0.1, warmup_steps=400)");
    ct_schedule_free(s);

    s = mf("constant * rsqrt_normalized_decay", d);
    CHECK_LR(s, 1, 0.1);
    CHECK_LR(s, 100, 0.1);
    CHECK_LR(s, 400, 0.1);
    CHECK_LR(s, 1600, 0.05);
    ct_schedule_free(s);

    s = mf("constant * decay_every", d);
    CHECK_LR(s, 1, 0.1);
    CHECK_LR(s, 19999, 0.1);
    CHECK_LR(s, 20000, 0.05);
    CHECK_LR(s, 40000, 0.025);
    CHECK_LR(s, 65000, 0.0125);
    // Python's floor division, as Trax's step // steps_per_decay (a negative
    // step, which no Loop passes: -1 // 20000 is -1).
    CHECK_LR(s, -1, 0.2);
    check_describe(s, "multifactor(factors='constant * decay_every', constant=0.1, decay_factor=0.5, "
                      "steps_per_decay=20000)");
    ct_schedule_free(s);

    // Spaces around '*' are optional, as in Trax.
    ct_multifactor_params c = d;
    c.steps_per_cycle = 200;
    s = mf("constant*cosine_decay", c);
    CHECK_LR(s, 1, 0.1);
    CHECK_LR(s, 400, 0.1);
    CHECK_LR(s, 450, 0.08535533905932738);
    CHECK_LR(s, 500, 0.05);
    CHECK_LR(s, 599, 6.168375916970615e-06);
    CHECK_LR(s, 600, 0.1);
    CHECK_LR(s, 650, 0.08535533905932738);
    check_describe(s, "multifactor(factors='constant * cosine_decay', constant=0.1, warmup_steps=400, "
                      "steps_per_cycle=200)");
    ct_schedule_free(s);

    s = mf("two_constants", d);
    CHECK_LR(s, 1, 0.1);
    CHECK_LR(s, 9999, 0.1);
    CHECK_LR(s, 10000, 0.01);
    CHECK_LR(s, 20000, 0.01);
    check_describe(s, "multifactor(factors='two_constants', constant=0.1, second_constant=0.01, "
                      "second_constant_step=10000)");
    ct_schedule_free(s);

    // minimum: a product at or below it gives it.
    ct_multifactor_params m = d;
    m.minimum = 0.01;
    s = mf(" constant *  linear_warmup ", m);
    CHECK_LR(s, 1, 0.01);
    CHECK_LR(s, 100, 0.025);
    CHECK_LR(s, 400, 0.1);
    check_describe(s, "multifactor(factors='constant * linear_warmup', constant=0.1, warmup_steps=400, minimum=0.01)");
    ct_schedule_free(s);
}

static void test_errors(void) {
    ct_error err;
    ct_schedule *s = NULL;
    ct_multifactor_params p = ct_multifactor_default_params();
    p.factors = "constant * linear_warmpu";
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "'linear_warmpu'") &&
                  strstr(err.msg, "constant, two_constants, linear_warmup, rsqrt_decay, rsqrt_normalized_decay, "
                                  "decay_every, cosine_decay"),
              "%s", err.msg);
    p.factors = "";  // Trax: Unknown factor ''
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    p.factors = "constant * * rsqrt_decay";
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    p.factors = "constant * linear_warmup";
    p.warmup_steps = 0;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "warmup_steps") != NULL, "%s", err.msg);
    p = ct_multifactor_default_params();
    p.factors = "decay_every";
    p.steps_per_decay = 0;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    p.factors = "cosine_decay";
    p.steps_per_cycle = -1;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    p.steps_per_cycle = 0;  // Trax: a division by zero
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "steps_per_cycle > 0, got 0") != NULL, "%s", err.msg);
    // rsqrt_normalized_decay of a negative warmup_steps: Trax's sqrt(-1).
    p = ct_multifactor_default_params();
    p.factors = "constant * rsqrt_normalized_decay";
    p.warmup_steps = -1;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "warmup_steps must be >= 0, got -1") != NULL, "%s", err.msg);
    // rsqrt_decay's too (Trax's sqrt(max(step, -1)) is 1/0 at step 0).
    p.factors = "constant * rsqrt_decay";
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "warmup_steps must be >= 0, got -1") != NULL, "%s", err.msg);
    // 32 factors fit; a 33rd is refused (it was stored past the array).
    p = ct_multifactor_default_params();
    char many[33 * 11 + 1] = "constant";
    for (int i = 1; i < 32; i++) strcat(many, " * constant");
    p.factors = many;
    CHECK_OK(ct_schedule_multifactor(&p, &s, &err), &err);
    ct_schedule_free(s);
    strcat(many, " * constant");
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "more than 32 factors") != NULL, "%s", err.msg);
    // minimum, too, must be finite (a NaN minimum made every value NaN).
    p = ct_multifactor_default_params();
    p.minimum = NAN;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "minimum nan is not finite") != NULL, "%s", err.msg);
    // A parameter no factor uses is not checked (decay_every is absent).
    p = ct_multifactor_default_params();
    p.steps_per_decay = 0;
    CHECK_OK(ct_schedule_multifactor(&p, &s, &err), &err);
    ct_schedule_free(s);
    CHECK(ct_schedule_warmup(-1, 0.1, &s, &err) == CT_ERR_ARG);
    CHECK(ct_schedule_constant(NAN, &s, &err) == CT_ERR_ARG);
    // A negative learning rate climbs the loss (the optimizers and the Loop
    // refuse one; schedules gave them unchecked).
    CHECK(ct_schedule_constant(-0.1, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "value must be >= 0, got -0.1"), "%s", err.msg);
    CHECK(ct_schedule_warmup(9, -0.01, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "warmup: max_value must be >= 0, got -0.01"), "%s", err.msg);
    CHECK(ct_schedule_warmup_and_rsqrt_decay(9, -0.01, &s, &err) == CT_ERR_ARG);
    p = ct_multifactor_default_params();
    p.constant = -0.1;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "constant must be >= 0, got -0.1"), "%s", err.msg);
    p = ct_multifactor_default_params();
    p.factors = "constant * decay_every";
    p.decay_factor = -0.5;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "decay_factor must be >= 0, got -0.5"), "%s", err.msg);
    p = ct_multifactor_default_params();
    p.factors = "two_constants";
    p.second_constant = -0.01;
    CHECK(ct_schedule_multifactor(&p, &s, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "second_constant must be >= 0, got -0.01"), "%s", err.msg);
    // Unused by the factors: not checked.
    p.factors = "constant * linear_warmup";
    CHECK_OK(ct_schedule_multifactor(&p, &s, &err), &err);
    ct_schedule_free(s);
}

int main(void) {
    test_constant();
    test_warmup();
    test_warmup_and_rsqrt_decay();
    test_multifactor();
    test_errors();
    return check_summary("test_schedules");
}
