#include "kernels/cpu/optim.h"

#include <math.h>

void ct_sgd_update(float *w, const float *g, int64_t n, float lr) {
    for (int64_t i = 0; i < n; i++) w[i] -= lr * g[i];
}

void ct_adam_update(float *w, const float *g, float *m, float *v, int64_t n, float lr, float b1, float b2,
                    float eps, float weight_decay_rate, float bias1, float bias2) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        m[i] = (1.0f - b1) * g[i] + b1 * m[i];
        v[i] = (1.0f - b2) * g[i] * g[i] + b2 * v[i];
        float mhat = m[i] / bias1;
        float vhat = v[i] / bias2;
        w[i] = (1.0f - weight_decay_rate) * w[i] - lr * (mhat / (sqrtf(vhat) + eps));
    }
}
