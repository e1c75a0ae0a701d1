// Elementwise activations and dropout over N floats, forward and backward,
// llm.c style. The activations' backward writes dinp (an input gradient the
// layer owns: no zeroing pass first); dropout's backward adds into it.
#ifndef CTRAX_KERNELS_CPU_ACTIVATION_H
#define CTRAX_KERNELS_CPU_ACTIVATION_H

#include <stdint.h>

#include "ctrax/core/rng.h"

// x, y (N) -> out (N) = x + y; out may be x or y. Threads for big N (a serial
// sum left the second core idle in each residual's and branch's gradient).
void ct_add_forward(float *out, const float *x, const float *y, int64_t N);

// inp (N) -> out (N), out = max(x, 0)
void ct_relu_forward(float *out, const float *inp, int64_t N);
// dinp (N) = dout * (out > 0); the derivative at 0 is taken as 0
void ct_relu_backward(float *dinp, const float *out, const float *dout, int64_t N);

// inp (N) -> out (N), the tanh approximation exactly as Trax writes it:
// out = x * 0.5 * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))
void ct_gelu_forward(float *out, const float *inp, int64_t N);
// dinp (N) = dout * d gelu(x) / dx, from the input
void ct_gelu_backward(float *dinp, const float *inp, const float *dout, int64_t N);

// inp (N) -> out (N), Trax's Gelu (the exact one, not FastGelu's tanh):
// out = x * 0.5 * (1 + erf(x / sqrt(2)))
void ct_gelu_erf_forward(float *out, const float *inp, int64_t N);
// dinp (N) = dout * (Phi(x) + x phi(x)), from the input
void ct_gelu_erf_backward(float *dinp, const float *inp, const float *dout, int64_t N);

// Plain versions of the kernels above, used only by tests/test_kernels.c to
// check the vectorized ones: ReLU's are bitwise equal, GELU's in double (the
// fast GELU is within 1e-6 of it).
void ct_relu_forward_ref(float *out, const float *inp, int64_t N);
void ct_relu_backward_ref(float *dinp, const float *out, const float *dout, int64_t N);
void ct_gelu_forward_ref(float *out, const float *inp, int64_t N);
void ct_gelu_backward_ref(float *dinp, const float *inp, const float *dout, int64_t N);

// inp (N) -> out (N), out = tanh(x)
void ct_tanh_forward(float *out, const float *inp, int64_t N);
// dinp (N) = dout * (1 - out^2)
void ct_tanh_backward(float *dinp, const float *out, const float *dout, int64_t N);

// inp (N) -> out (N), out = 1 / (1 + exp(-x))
void ct_sigmoid_forward(float *out, const float *inp, int64_t N);
// dinp (N) = dout * out * (1 - out)
void ct_sigmoid_backward(float *dinp, const float *out, const float *dout, int64_t N);

// Dropout's mask: element j is kept iff ct_random_bits(key, j) >= threshold,
// where threshold = ceil(rate * 2^32) (so a kept element has probability
// 1 - rate up to 2^-32). This gives the threshold for a rate in [0, 1].
uint64_t ct_dropout_threshold(float rate);
// inp (N) -> out (N), out[j] = kept(j) ? inp[j] * scale : 0, N <= 2^32
void ct_dropout_forward(float *out, const float *inp, ct_key key, uint64_t threshold, float scale,
                        int64_t N);
// dinp (N) += kept(j) ? dout[j] * scale : 0, the mask recomputed from key
void ct_dropout_backward(float *dinp, const float *dout, ct_key key, uint64_t threshold, float scale,
                         int64_t N);

#endif
