// Softmax and log-softmax over the last axis of (N, C) rows, forward and
// backward. Backward adds into dinp.
#ifndef CTRAX_KERNELS_CPU_SOFTMAX_H
#define CTRAX_KERNELS_CPU_SOFTMAX_H

#include <stdint.h>

// inp (N, C) -> out (N, C), out = exp(x - max) / sum exp(x - max)
void ct_softmax_forward(float *out, const float *inp, int64_t N, int64_t C);
// dinp (N, C) += out * (dout - sum(dout * out))
void ct_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C);
// inp (N, C) -> out (N, C), out = x - max - log sum exp(x - max)
void ct_log_softmax_forward(float *out, const float *inp, int64_t N, int64_t C);
// dinp (N, C) += dout - exp(out) * sum(dout)
void ct_log_softmax_backward(float *dinp, const float *dout, const float *out, int64_t N, int64_t C);

// One row's stable exp sum: *max = max of x[0 .. C) (-inf for C == 0; NaNs
// skipped), returns sum exp(x[c] - *max) in double (CT_LANES lanes: the same
// bits for any vector width or row address), each term also written to y[c]
// when y is not NULL. The attention kernels' row logsumexp is
// *max + log(the sum).
double ct_row_exp_sum(const float *x, float *y, int64_t C, float *max);

// Plain versions of the four above (libm's expf, sums in index order), used
// only by tests/test_kernels.c to check them.
void ct_softmax_forward_ref(float *out, const float *inp, int64_t N, int64_t C);
void ct_softmax_backward_ref(float *dinp, const float *dout, const float *out, int64_t N, int64_t C);
void ct_log_softmax_forward_ref(float *out, const float *inp, int64_t N, int64_t C);
void ct_log_softmax_backward_ref(float *dinp, const float *dout, const float *out, int64_t N, int64_t C);

#endif
