// Elementwise optimizer updates over a weight range of n floats, in place.
#ifndef CTRAX_KERNELS_CPU_OPTIM_H
#define CTRAX_KERNELS_CPU_OPTIM_H

#include <stdint.h>

// w (n) -= lr * g (n)
void ct_sgd_update(float *w, const float *g, int64_t n, float lr);
// Trax's Adam; m, v (n) are the slots; bias1 = 1 - b1^(step+1), bias2 = 1 - b2^(step+1).
void ct_adam_update(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                    float eps, float weight_decay_rate, float bias1, float bias2);

#endif
