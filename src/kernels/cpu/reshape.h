// Shifts and reductions along one axis, llm.c style. Backward adds into
// dinp.
#ifndef CTRAX_KERNELS_CPU_RESHAPE_H
#define CTRAX_KERNELS_CPU_RESHAPE_H

#include <stddef.h>
#include <stdint.h>

// inp (B, T, C) of elem_size-byte elements (f32 or int32) -> out (B, T, C),
// out[b, t] = inp[b, t - n] for t >= n, zero bits (0 or 0.0f) for t < n.
void ct_shift_right_forward(void *out, const void *inp, int64_t B, int64_t T, int64_t C, int64_t n,
                            size_t elem_size);
// dout (B, T, C) -> dinp (B, T, C), dinp[b, t] += dout[b, t + n] for t + n < T
void ct_shift_right_backward(float *dinp, const float *dout, int64_t B, int64_t T, int64_t C, int64_t n);

// inp (O, A, I) -> out (O, I), out[o, i] = mean over a of inp[o, a, i]
// (summed in double, a in order)
void ct_mean_forward(float *out, const float *inp, int64_t O, int64_t A, int64_t I);
// dout (O, I) -> dinp (O, A, I) += dout[o, i] / A
void ct_mean_backward(float *dinp, const float *dout, int64_t O, int64_t A, int64_t I);

#endif
