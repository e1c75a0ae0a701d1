// RMSProp with Trax's defaults; its accumulator starts at 1 (see optimizer.h).
#include <stddef.h>

#include "ctrax/core/memory.h"
#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"

ct_rmsprop_params ct_rmsprop_default_params(void) {
    return (ct_rmsprop_params){.learning_rate = 1e-3f, .gamma = 0.9f, .eps = 1e-8f};
}

// Slot: the running average of g^2, the size of the weight.
static size_t rmsprop_slot_floats(const ct_optimizer *o, const ct_tensor *sig) {
    (void)o;
    return (size_t)ct_tensor_numel(sig);
}

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

static const ct_optimizer_param rmsprop_param_table[] = {
    {.name = "learning_rate", .offset = offsetof(ct_rmsprop_params, learning_rate), .kind = CT_OPT_PARAM_FLOAT},
    {.name = "gamma", .offset = offsetof(ct_rmsprop_params, gamma), .kind = CT_OPT_PARAM_FLOAT},
    {.name = "eps", .offset = offsetof(ct_rmsprop_params, eps), .kind = CT_OPT_PARAM_FLOAT},
};

static const ct_optimizer_vtable rmsprop_vt = {
    .name = "RMSProp",
    .slot_floats = rmsprop_slot_floats,
    .init_slots = rmsprop_init_slots,
    .update = rmsprop_update,
    .param_table = rmsprop_param_table,
    .n_param_table = sizeof rmsprop_param_table / sizeof rmsprop_param_table[0],
};

ct_optimizer *ct_rmsprop_new(ct_rmsprop_params p) {
    ct_optimizer *o = ct_calloc(1, sizeof *o);
    ct_rmsprop_params *copy = ct_malloc(sizeof *copy);
    *copy = p;
    o->vt = &rmsprop_vt;
    o->params = copy;
    return o;
}
