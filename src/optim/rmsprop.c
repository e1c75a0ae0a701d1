// RMSProp with Trax's defaults; its accumulator starts at 1 (see optimizer.h).
#include <stddef.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"

// Trax starts the average at ones, so the first steps are small.
static void rmsprop_init_slots(const ct_optimizer *o, const ct_tensor *sig, float *slots) {
    (void)o;
    int64_t n = ct_tensor_numel(sig);
    for (int64_t i = 0; i < n; i++) slots[i] = 1.0f;
}

static void rmsprop_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w,
                           const float *g, float *slots) {
    (void)step;  // Trax's RMSProp ignores the step
    const ct_rmsprop_params *p = o->params;
    ct_rmsprop_update(w, g, slots, ct_tensor_numel(sig), lr, p->gamma, p->eps);
}

CT_OPTIMIZER(rmsprop, "RMSProp", CT_RMSPROP_PARAMS,
             .slot_floats = ct_optimizer_one_slot, .init_slots = rmsprop_init_slots, .update = rmsprop_update)

ct_optimizer *ct_rmsprop_new(ct_rmsprop_params p) { return ct_optimizer_wrap(&rmsprop_vt, &p, sizeof p); }
