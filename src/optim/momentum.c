// Momentum (Nesterov by default) with Trax's defaults (see optimizer.h).
#include <stddef.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"

static void momentum_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w,
                            const float *g, float *slots) {
    (void)step;  // Trax's Momentum ignores the step
    const ct_momentum_params *p = o->params;
    ct_momentum_update(w, g, slots, ct_tensor_numel(sig), lr, p->mass, p->weight_decay_rate, p->nesterov);
}

CT_OPTIMIZER(momentum, "Momentum", CT_MOMENTUM_PARAMS, .slot_floats = ct_optimizer_one_slot, .update = momentum_update)

ct_optimizer *ct_momentum_new(ct_momentum_params p) { return ct_optimizer_wrap(&momentum_vt, &p, sizeof p); }
