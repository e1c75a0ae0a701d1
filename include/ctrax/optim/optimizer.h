// Optimizers over the parameter slab.
//
// An optimizer updates one weight tensor at a time: its values w, its
// gradient g (both ranges of the weight and gradient slabs) and its slots (a
// range of the slot slab the trainer lays out once, with the size the
// optimizer asks for each weight). Hyperparameters are plain structs from
// ct_*_default_params(), so adding a field breaks no caller; the learning
// rate of each step is passed to update and overrides the one in the struct.
//
// step is the trainer's step as Trax passes it: the Loop's 1-based step.
// Adam's bias correction uses step + 1, as Trax's does.
#ifndef CTRAX_OPTIM_OPTIMIZER_H
#define CTRAX_OPTIM_OPTIMIZER_H

#include <stdint.h>
#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_optimizer ct_optimizer;

typedef struct ct_optimizer_vtable {
    const char *name;
    // Floats of slot memory for a weight of this signature.
    size_t (*slot_floats)(const ct_optimizer *o, const ct_tensor *sig);
    // Fills a weight's slots with their starting values (they arrive zeroed).
    void (*init_slots)(const ct_optimizer *o, const ct_tensor *sig, float *slots);
    // Updates one weight w (with gradient g, shape sig) in place.
    void (*update)(const ct_optimizer *o, int64_t step, float learning_rate, const ct_tensor *sig, float *w,
                   const float *g, float *slots);
} ct_optimizer_vtable;

struct ct_optimizer {
    const ct_optimizer_vtable *vt;
    void *params;  // the optimizer's hyperparameter struct, owned
};

void ct_optimizer_free(ct_optimizer *o);
size_t ct_optimizer_slot_floats(const ct_optimizer *o, const ct_tensor *sig);
void ct_optimizer_init_slots(const ct_optimizer *o, const ct_tensor *sig, float *slots);
void ct_optimizer_update(const ct_optimizer *o, int64_t step, float learning_rate, const ct_tensor *sig, float *w,
                         const float *g, float *slots);

// SGD: w -= lr * g.
typedef struct ct_sgd_params {
    float learning_rate;  // default 1e-2 (Trax's default: 0.01)
} ct_sgd_params;
ct_sgd_params ct_sgd_default_params(void);
ct_optimizer *ct_sgd_new(ct_sgd_params p);

// Adam as Trax: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// m^ = m / (1 - b1^(step+1)); v^ = v / (1 - b2^(step+1));
// w = (1 - weight_decay_rate) w - lr m^ / (sqrt(v^) + eps). Slots: m, v.
typedef struct ct_adam_params {
    float learning_rate;      // 1e-4
    float b1;                 // 0.9
    float b2;                 // 0.999
    float eps;                // 1e-5
    float weight_decay_rate;  // 1e-5, decoupled and not scaled by lr
} ct_adam_params;
ct_adam_params ct_adam_default_params(void);
ct_optimizer *ct_adam_new(ct_adam_params p);

#ifdef __cplusplus
}
#endif
#endif
