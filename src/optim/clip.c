// Global-norm gradient clipping, as Trax's clip_grad_norm (see optimizer.h).
#include <math.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"

float ct_clip_factor(double norm, float max_norm) {
    // Trax: where(norm < max_norm, g, g * (max_norm / norm)). A zero norm
    // would give 0 * (max_norm / 0): keep the zeros instead. The norm is a
    // double: finite gradients can have a norm past FLT_MAX (four of 2e38),
    // which in float (as in Trax) is inf and makes the factor 0, zeroing
    // the step's gradient instead of clipping it.
    if (norm < max_norm || norm == 0.0) return 1.0f;
    return (float)(max_norm / norm);
}

float ct_clip_grad_norm(float *grads, size_t n, float max_norm) {
    double norm = sqrt(ct_sum_squares(grads, (int64_t)n));
    float factor = ct_clip_factor(norm, max_norm);
    if (factor != 1.0f)
        for (size_t i = 0; i < n; i++) grads[i] *= factor;
    return (float)norm;
}
