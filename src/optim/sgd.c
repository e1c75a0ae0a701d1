// Plain SGD, as Trax: w -= lr * g; no slots, no weight decay.
#include <stddef.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"

static size_t sgd_slot_floats(const ct_optimizer *o, const ct_tensor *sig) {
    (void)o, (void)sig;
    return 0;
}

static void sgd_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w, const float *g,
                       float *slots) {
    (void)o, (void)step, (void)slots;
    ct_sgd_update(w, g, ct_tensor_numel(sig), lr);
}

CT_OPTIMIZER(sgd, "SGD", CT_SGD_PARAMS, .slot_floats = sgd_slot_floats, .update = sgd_update)

ct_optimizer *ct_sgd_new(ct_sgd_params p) { return ct_optimizer_wrap(&sgd_vt, &p, sizeof p); }
