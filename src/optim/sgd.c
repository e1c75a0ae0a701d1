// Plain SGD, as Trax: w -= lr * g; no slots, no weight decay.
#include <stddef.h>

#include "ctrax/core/memory.h"
#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"

ct_sgd_params ct_sgd_default_params(void) { return (ct_sgd_params){.learning_rate = 0.01f}; }

static size_t sgd_slot_floats(const ct_optimizer *o, const ct_tensor *sig) {
    (void)o, (void)sig;
    return 0;
}

static void sgd_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w, const float *g,
                       float *slots) {
    (void)o, (void)step, (void)slots;
    ct_sgd_update(w, g, ct_tensor_numel(sig), lr);
}

static const ct_optimizer_param sgd_param_table[] = {
    {.name = "learning_rate", .offset = offsetof(ct_sgd_params, learning_rate), .kind = CT_OPT_PARAM_FLOAT},
};

static const ct_optimizer_vtable sgd_vt = {
    .name = "SGD",
    .slot_floats = sgd_slot_floats,
    .update = sgd_update,
    .param_table = sgd_param_table,
    .n_param_table = 1,
};

ct_optimizer *ct_sgd_new(ct_sgd_params p) {
    ct_optimizer *o = ct_calloc(1, sizeof *o);
    ct_sgd_params *copy = ct_malloc(sizeof *copy);
    *copy = p;
    o->vt = &sgd_vt;
    o->params = copy;
    return o;
}
