// Adam with Trax's defaults and decoupled weight decay (see optimizer.h).
#include <math.h>
#include <stddef.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"

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

CT_OPTIMIZER(adam, "Adam", CT_ADAM_PARAMS, .slot_floats = adam_slot_floats, .update = adam_update)

ct_optimizer *ct_adam_new(ct_adam_params p) { return ct_optimizer_wrap(&adam_vt, &p, sizeof p); }
