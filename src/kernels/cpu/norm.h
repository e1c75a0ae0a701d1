// Layer normalization over the last axis of (N, C) rows, llm.c style.
// Backward writes the input gradient (the layer's own buffer: no zeroing
// pass) and adds into the weight gradients.
#ifndef CTRAX_KERNELS_CPU_NORM_H
#define CTRAX_KERNELS_CPU_NORM_H

#include <stdint.h>

// inp (N, C), weight (C), bias (C) -> out (N, C), mean (N), rstd (N):
// out = (x - mean) * rstd * weight + bias, mean and the biased variance over
// C, rstd = 1 / sqrt(var + eps). mean and rstd are saved for backward.
void ct_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                          const float *bias, int64_t N, int64_t C, float eps);
// dout (N, C) -> dinp (N, C) = d/dx, dweight (C) += sum_n dout * norm,
// dbias (C) += sum_n dout, with norm = (x - mean) * rstd. dinp may be NULL,
// or dout itself (written over it: a donated output gradient).
// Sums over n run in row order for every thread count.
void ct_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                           const float *inp, const float *weight, const float *mean, const float *rstd,
                           int64_t N, int64_t C);

// Plain versions of the two above (two passes over the row, sums in index
// order), used only by tests/test_kernels.c to check them.
void ct_layernorm_forward_ref(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int64_t N, int64_t C, float eps);
void ct_layernorm_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean, const float *rstd,
                               int64_t N, int64_t C);

#endif
