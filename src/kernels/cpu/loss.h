// Losses and metrics over N rows of V classes (or N plain values), llm.c
// style: outputs first, shapes in the comments, backward adds (+=) into its
// outputs. Every sum is accumulated in double, in row order, so results do
// not depend on the thread count. Callers check target ids (0 <= t < V) and
// that the weight sum is not 0 before calling. A position of weight 0 adds
// nothing to a loss, even where its term is inf or NaN (a masked-out
// log-probability of -inf, say).
#ifndef CTRAX_KERNELS_CPU_LOSS_H
#define CTRAX_KERNELS_CPU_LOSS_H

#include <stdint.h>

// weights (N) -> sum of weights, in double.
double ct_weight_sum(const float *weights, int64_t N);

// logp (N, V) log-probabilities, targets (N), weights (N), wsum = sum(weights)
// -> out (1) = sum_n -logp[n, targets[n]] * weights[n] / wsum
void ct_cross_entropy_forward(float *out, const float *logp, const int32_t *targets, const float *weights,
                              double wsum, int64_t N, int64_t V);
// dlogp (N, V) += dout * -weights[n] / wsum at (n, targets[n])
void ct_cross_entropy_backward(float *dlogp, float dout, const int32_t *targets, const float *weights,
                               double wsum, int64_t N, int64_t V);

// logits (N, V), targets (N), weights (N), label smoothing s in [0, 1]
// -> logp (N, V) = log_softmax(logits) and out (1) = sum_n ce[n] * weights[n] / wsum,
// ce[n] = -sum_c p[n, c] logp[n, c] against Trax's smoothed targets
// p[n, c] = (1 - s) [c == targets[n]] + s / V, computed as
// (1 - s) (-logp[n, targets[n]]) + s / V (-sum_c logp[n, c]) in double.
// s == 0 is the plain -logp[n, targets[n]] (no row sums).
void ct_category_cross_entropy_forward(float *out, float *logp, const float *logits, const int32_t *targets,
                                       const float *weights, double wsum, float label_smoothing, int64_t N,
                                       int64_t V);
// dlogits (N, V) += dout * weights[n] / wsum * (exp(logp[n, c]) - p[n, c])
void ct_category_cross_entropy_backward(float *dlogits, float dout, const float *logp, const int32_t *targets,
                                        const float *weights, double wsum, float label_smoothing, int64_t N,
                                        int64_t V);

// Plain versions of the two above (Trax's p written out class by class,
// libm's expf, sums in index order), used only by tests/test_kernels.c to
// check them.
void ct_category_cross_entropy_forward_ref(float *out, float *logp, const float *logits, const int32_t *targets,
                                           const float *weights, double wsum, float label_smoothing, int64_t N,
                                           int64_t V);
void ct_category_cross_entropy_backward_ref(float *dlogits, float dout, const float *logp, const int32_t *targets,
                                            const float *weights, double wsum, float label_smoothing, int64_t N,
                                            int64_t V);

// outputs, targets, weights (N) -> out (1) = sum_n w[n] (o[n] - t[n])^2 / wsum
void ct_l2_loss_forward(float *out, const float *outputs, const float *targets, const float *weights,
                        double wsum, int64_t N);
// doutputs (N) += dout * 2 w[n] (o[n] - t[n]) / wsum
void ct_l2_loss_backward(float *doutputs, float dout, const float *outputs, const float *targets,
                         const float *weights, double wsum, int64_t N);

// x, t (N) -> out (1) = mean_n -(t log sigmoid(x) + (1 - t) log(1 - sigmoid(x))),
// computed as softplus(x) - t x = max(x, 0) - t x + log1p(exp(-|x|)), finite
// for every finite x (the plain form's log(1 - sigmoid(x)) is -inf from x of
// about 17 in float). t is 0 or 1.
void ct_binary_cross_entropy_forward(float *out, const float *x, const int32_t *t, int64_t N);
// dx (N) += dout * (sigmoid(x[n]) - t[n]) / N
void ct_binary_cross_entropy_backward(float *dx, float dout, const float *x, const int32_t *t, int64_t N);

// inp (N, V) -> out (N): index of the largest value in each row; ties go to
// the first, and a NaN counts as the largest (numpy's argmax).
void ct_argmax_forward(int32_t *out, const float *inp, int64_t N, int64_t V);

// pred, targets (N), weights (N) or NULL (all ones)
// -> sum_n [pred[n] == targets[n]] * weights[n], in double
double ct_weighted_matches(const int32_t *pred, const int32_t *targets, const float *weights, int64_t N);
// pred, targets, weights (N, T) -> number of rows n where every position t
// with weights[n, t] != 0 has pred == target
int64_t ct_sequence_matches(const int32_t *pred, const int32_t *targets, const float *weights, int64_t N,
                            int64_t T);

#endif
