// Momentum (Nesterov by default) with Trax's defaults (see optimizer.h).
#include <stddef.h>

#include "ctrax/core/memory.h"
#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"

ct_momentum_params ct_momentum_default_params(void) {
    return (ct_momentum_params){.learning_rate = 0.01f, .mass = 0.9f, .weight_decay_rate = 1e-5f, .nesterov = true};
}

// Slot: the velocity, the size of the weight.
static size_t momentum_slot_floats(const ct_optimizer *o, const ct_tensor *sig) {
    (void)o;
    return (size_t)ct_tensor_numel(sig);
}

static void momentum_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w,
                            const float *g, float *slots) {
    (void)step;  // Trax's Momentum ignores the step
    const ct_momentum_params *p = o->params;
    ct_momentum_update(w, g, slots, ct_tensor_numel(sig), lr, p->mass, p->weight_decay_rate, p->nesterov);
}

static const ct_optimizer_param momentum_param_table[] = {
    {.name = "learning_rate", .offset = offsetof(ct_momentum_params, learning_rate), .kind = CT_OPT_PARAM_FLOAT},
    {.name = "mass", .offset = offsetof(ct_momentum_params, mass), .kind = CT_OPT_PARAM_FLOAT},
    {.name = "weight_decay_rate", .offset = offsetof(ct_momentum_params, weight_decay_rate),
     .kind = CT_OPT_PARAM_FLOAT},
    {.name = "nesterov", .offset = offsetof(ct_momentum_params, nesterov), .kind = CT_OPT_PARAM_BOOL},
};

static const ct_optimizer_vtable momentum_vt = {
    .name = "Momentum",
    .slot_floats = momentum_slot_floats,
    .update = momentum_update,
    .param_table = momentum_param_table,
    .n_param_table = sizeof momentum_param_table / sizeof momentum_param_table[0],
};

ct_optimizer *ct_momentum_new(ct_momentum_params p) {
    ct_optimizer *o = ct_calloc(1, sizeof *o);
    ct_momentum_params *copy = ct_malloc(sizeof *copy);
    *copy = p;
    o->vt = &momentum_vt;
    o->params = copy;
    return o;
}
