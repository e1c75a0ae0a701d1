// The optimizer interface: dispatch to the vtable of each optimizer.
#include "ctrax/optim/optimizer.h"

#include "ctrax/core/memory.h"

void ct_optimizer_free(ct_optimizer *o) {
    if (!o) return;
    ct_free(o->params);
    ct_free(o);
}

size_t ct_optimizer_slot_floats(const ct_optimizer *o, const ct_tensor *sig) { return o->vt->slot_floats(o, sig); }

void ct_optimizer_init_slots(const ct_optimizer *o, const ct_tensor *sig, float *slots) {
    if (o->vt->init_slots) o->vt->init_slots(o, sig, slots);
}

void ct_optimizer_update(const ct_optimizer *o, int64_t step, float learning_rate, const ct_tensor *sig, float *w,
                         const float *g, float *slots) {
    o->vt->update(o, step, learning_rate, sig, w, g, slots);
}
