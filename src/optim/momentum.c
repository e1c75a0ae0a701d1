// Momentum (Nesterov by default) with Trax's defaults (see optimizer.h).
#include <stddef.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"

ct_momentum_params ct_momentum_default_params(void) {
    return (ct_momentum_params){CT_MOMENTUM_PARAMS(CT_PARAM_DEFAULT)};
}

static void momentum_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w,
                            const float *g, float *slots) {
    (void)step;  // Trax's Momentum ignores the step
    const ct_momentum_params *p = o->params;
    ct_momentum_update(w, g, slots, ct_tensor_numel(sig), lr, p->mass, p->weight_decay_rate, p->nesterov);
}

#define ROW(...) CT_OPT_ROW(ct_momentum_params, __VA_ARGS__)
static const ct_optimizer_param momentum_param_table[] = {CT_MOMENTUM_PARAMS(ROW)};
#undef ROW

static const ct_optimizer_vtable momentum_vt = {
    .name = "Momentum",
    .slot_floats = ct_optimizer_one_slot,
    .update = momentum_update,
    CT_OPT_TABLE(momentum_param_table),
};

ct_optimizer *ct_momentum_new(ct_momentum_params p) { return ct_optimizer_wrap(&momentum_vt, &p, sizeof p); }
