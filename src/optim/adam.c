// Adam with Trax's defaults and decoupled weight decay (see optimizer.h).
#include <math.h>
#include <stddef.h>

#include "ctrax/core/memory.h"
#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"

ct_adam_params ct_adam_default_params(void) {
    return (ct_adam_params){
        .learning_rate = 1e-4f, .b1 = 0.9f, .b2 = 0.999f, .eps = 1e-5f, .weight_decay_rate = 1e-5f};
}

// Slots: m then v, each the size of the weight.
static size_t adam_slot_floats(const ct_optimizer *o, const ct_tensor *sig) {
    (void)o;
    return 2 * (size_t)ct_tensor_numel(sig);
}

static void adam_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w, const float *g,
                        float *slots) {
    const ct_adam_params *p = o->params;
    int64_t n = ct_tensor_numel(sig);
    // Bias corrections in double: b2^(step+1) is close to 1 for small steps.
    float bias1 = (float)(1.0 - pow(p->b1, (double)(step + 1)));
    float bias2 = (float)(1.0 - pow(p->b2, (double)(step + 1)));
    ct_adam_update(w, g, slots, slots + n, n, lr, p->b1, p->b2, p->eps, p->weight_decay_rate, bias1, bias2);
}

#define F(field) .name = #field, .offset = offsetof(ct_adam_params, field), .kind = CT_OPT_PARAM_FLOAT
static const ct_optimizer_param adam_param_table[] = {
    {F(learning_rate)}, {F(b1)}, {F(b2)}, {F(eps)}, {F(weight_decay_rate)},
};
#undef F

static const ct_optimizer_vtable adam_vt = {
    .name = "Adam",
    .slot_floats = adam_slot_floats,
    .update = adam_update,
    .param_table = adam_param_table,
    .n_param_table = sizeof adam_param_table / sizeof adam_param_table[0],
};

ct_optimizer *ct_adam_new(ct_adam_params p) {
    ct_optimizer *o = ct_calloc(1, sizeof *o);
    ct_adam_params *copy = ct_malloc(sizeof *copy);
    *copy = p;
    o->vt = &adam_vt;
    o->params = copy;
    return o;
}
