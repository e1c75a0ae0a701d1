// Optimizer updates over one weight's range of the slabs, in place: the
// elementwise ones, and Adafactor's and SM3's, which reduce over rows and
// dims. Every reduction is accumulated in double (or exact: min, max) in a
// fixed order, so results do not depend on the thread count.
#ifndef CTRAX_KERNELS_CPU_OPTIM_H
#define CTRAX_KERNELS_CPU_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

// w (n) -= lr * g (n)
void ct_sgd_update(float *w, const float *g, int64_t n, float lr);
// Trax's Adam; m, v (n) are the slots; bias1 = 1 - b1^(step+1), bias2 = 1 - b2^(step+1).
void ct_adam_update(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                    float eps, float weight_decay_rate, float bias1, float bias2);

// Chunks of the sum of squares: each a multiple of CT_LANES floats; their
// sums are kept (on the stack) CT_SUMSQ_GROUP chunks at a time.
#define CT_SUMSQ_CHUNK 32768
#define CT_SUMSQ_GROUP 4096
// x (n) -> sum of x^2, accumulated in double: per chunk of CT_SUMSQ_CHUNK
// floats in CT_LANES lanes (vmath.h: element i in lane i % 8, lanes added in
// order), the chunks' sums added in order; the same bits on any CPU and at
// any thread count.
double ct_sum_squares(const float *x, int64_t n);
// The plain loop, in index order (tests/test_kernels.c compares the two).
double ct_sum_squares_ref(const float *x, int64_t n);

// Trax's Momentum; v (n) is the slot: v = mass v + g; u = mass v + g (nesterov)
// or v; w = (1 - weight_decay_rate) w - lr u.
void ct_momentum_update(float *w, const float *g, float *v, int64_t n, float lr, float mass, float weight_decay_rate,
                        bool nesterov);
// Trax's RMSProp; a (n) is the slot: a = gamma a + (1 - gamma) g^2;
// w -= lr g / (sqrt(a) + eps).
void ct_rmsprop_update(float *w, const float *g, float *a, int64_t n, float lr, float gamma, float eps);

// Adafactor, factored: g, w, m are (B,R,C) (B matrices of R rows, C columns),
// vr is (B,R), vc is (B,C). As Trax's current Adafactor, epsilon1 is added
// where the accumulators are read, not to g^2:
// vr = decay vr + mix mean_c g^2; vc = decay vc + mix mean_r g^2 (means in double).
void ct_adafactor_factored_moments(float *vr, float *vc, const float *g, int64_t B, int64_t R, int64_t C, float decay,
                                   float mix);
// -> sum of y^2 in double, y = g (mean_r vr / (vr + eps1))^0.5 (vc + eps1)^-0.5.
double ct_adafactor_factored_y_sumsq(const float *g, const float *vr, const float *vc, int64_t B, int64_t R,
                                     int64_t C, float eps1);
// s = scale (y / denom); with m (not NULL): m = beta1 m + (1 - beta1) s, s = m;
// w = (1 - weight_decay_rate) w - s.
void ct_adafactor_factored_apply(float *w, float *m, const float *g, const float *vr, const float *vc, int64_t B,
                                 int64_t R, int64_t C, float eps1, float denom, float scale, float beta1,
                                 float weight_decay_rate);
// Adafactor, unfactored: g, w, v, m are (n). v = decay v + mix g^2.
void ct_adafactor_moments(float *v, const float *g, int64_t n, float decay, float mix);
// -> sum of y^2 in double, y = g (v + eps1)^-0.5.
double ct_adafactor_y_sumsq(const float *g, const float *v, int64_t n, float eps1);
// As ct_adafactor_factored_apply with y = g (v + eps1)^-0.5.
void ct_adafactor_apply(float *w, float *m, const float *g, const float *v, int64_t n, float eps1, float denom,
                        float scale, float beta1, float weight_decay_rate);

// Plain versions of the Adam and Adafactor updates above, used only by
// tests/test_kernels.c to check the vectorized ones. Adam's and the apply
// steps' results are bitwise equal; the row sums of the factored moments
// differ in order (CT_LANES lanes against index order).
void ct_adam_update_ref(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                        float eps, float weight_decay_rate, float bias1, float bias2);
void ct_adafactor_factored_moments_ref(float *vr, float *vc, const float *g, int64_t B, int64_t R, int64_t C,
                                       float decay, float mix);
void ct_adafactor_factored_apply_ref(float *w, float *m, const float *g, const float *vr, const float *vc,
                                     int64_t B, int64_t R, int64_t C, float eps1, float denom, float scale,
                                     float beta1, float weight_decay_rate);
void ct_adafactor_apply_ref(float *w, float *m, const float *g, const float *v, int64_t n, float eps1, float denom,
                            float scale, float beta1, float weight_decay_rate);

// SM3 (see ct_sm3_params in include/ctrax/optim/optimizer.h for the math).
// w, g (shape, ndim dims); m (numel) or NULL without momentum. For ndim <= 1,
// v (numel) is a diagonal accumulator and scratch is unused; for ndim >= 2,
// v holds the covers dim after dim (shape[0] floats, then shape[1], ...) and
// scratch is as big as v (twice that with grafting). u has the layout of v,
// or is NULL without grafting. momentum_type: 1 EMA, 2 heavy ball, 3 Nesterov.
void ct_sm3_update(float *w, const float *g, float *m, float *v, float *u, float *scratch, const int64_t *shape,
                   int ndim, float lr, float momentum, int momentum_type, float beta2, float weight_decay);

#endif
