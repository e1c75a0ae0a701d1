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
// Adam's bias correction uses step + 1, as Trax's does; so does Adafactor's
// decay 1 - (step + 1)^-0.8.
//
// Hyperparameters can also be read and written by name
// (ct_optimizer_get_param / ct_optimizer_set_param), which is how checkpoints
// store them and configs set them. Every value travels as a float; booleans
// are 0 or 1.
#ifndef CTRAX_OPTIM_OPTIMIZER_H
#define CTRAX_OPTIM_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_optimizer ct_optimizer;

// One named hyperparameter: a field of the optimizer's params struct.
typedef enum ct_optimizer_param_kind {
    CT_OPT_PARAM_FLOAT = 0,  // a float field
    CT_OPT_PARAM_BOOL,       // a bool field, read and written as 0 or 1
    CT_OPT_PARAM_INT,        // an int field (an enum), written as a whole number in [lo, hi]
} ct_optimizer_param_kind;

typedef struct ct_optimizer_param {
    const char *name;
    size_t offset;  // offsetof(the params struct, the field)
    ct_optimizer_param_kind kind;
    int lo, hi;     // CT_OPT_PARAM_INT: the valid range
    // Fixed when the optimizer is made (it decides the slot layout, or Trax
    // fixes it in the constructor): set_param accepts only its current value.
    bool fixed;
} ct_optimizer_param;

typedef struct ct_optimizer_vtable {
    const char *name;
    // Floats of slot memory for a weight of this signature.
    size_t (*slot_floats)(const ct_optimizer *o, const ct_tensor *sig);
    // Fills a weight's slots with their starting values (they arrive zeroed).
    void (*init_slots)(const ct_optimizer *o, const ct_tensor *sig, float *slots);
    // Updates one weight w (with gradient g, shape sig) in place.
    void (*update)(const ct_optimizer *o, int64_t step, float learning_rate, const ct_tensor *sig, float *w,
                   const float *g, float *slots);
    // The named hyperparameters, fields of *params (may be NULL / 0).
    const ct_optimizer_param *param_table;
    int n_param_table;
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

// The optimizer's name as Trax spells its class: "Adam", "SGD", "Momentum",
// "RMSProp", "Adafactor", "SM3".
const char *ct_optimizer_name(const ct_optimizer *o);
// The hyperparameters by index, 0 <= i < ct_optimizer_n_params(o), in the
// order of the params struct (for writing them all to a checkpoint).
int ct_optimizer_n_params(const ct_optimizer *o);
const char *ct_optimizer_param_name(const ct_optimizer *o, int i);
// Reads the hyperparameter called name into *value (booleans as 0 or 1).
// CT_ERR_ARG for an unknown name; the message lists the known ones.
ct_status ct_optimizer_get_param(const ct_optimizer *o, const char *name, float *value, ct_error *err);
// Writes it. CT_ERR_ARG for an unknown name (listing the known ones), a
// boolean that is not 0 or 1, an enum out of range or a non-finite value;
// CT_ERR_STATE for a changed value of a parameter fixed at construction (a
// new optimizer is needed for that).
ct_status ct_optimizer_set_param(ct_optimizer *o, const char *name, float value, ct_error *err);

// Global-norm clipping over n gradient floats, as Trax's clip_grad_norm:
// norm = sqrt(sum g^2) (accumulated in double, in index order); if
// norm >= max_norm, every g is scaled by max_norm / norm. Returns the norm
// before clipping. Better than Trax: a zero gradient (norm 0) is left alone
// instead of becoming 0 * (max_norm / 0) = NaN when max_norm is 0.
float ct_clip_grad_norm(float *grads, size_t n, float max_norm);
// The factor clipping multiplies by, for a norm computed elsewhere (over
// several ranges or devices): max_norm / norm if norm >= max_norm and
// norm > 0, else 1.
float ct_clip_factor(float norm, float max_norm);

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

// Momentum as Trax (Nesterov by default): v = mass v + g;
// u = mass v + g (Nesterov) or v; w = (1 - weight_decay_rate) w - lr u.
// Slot: v.
typedef struct ct_momentum_params {
    float learning_rate;      // 0.01
    float mass;               // 0.9
    float weight_decay_rate;  // 1e-5, decoupled and not scaled by lr
    bool nesterov;            // true
} ct_momentum_params;
ct_momentum_params ct_momentum_default_params(void);
ct_optimizer *ct_momentum_new(ct_momentum_params p);

// RMSProp as Trax: a = gamma a + (1 - gamma) g^2; w -= lr g / (sqrt(a) + eps).
// Slot: a, which starts at 1 (not 0), as Trax's does.
typedef struct ct_rmsprop_params {
    float learning_rate;  // 1e-3
    float gamma;          // 0.9
    float eps;            // 1e-8
} ct_rmsprop_params;
ct_rmsprop_params ct_rmsprop_default_params(void);
ct_optimizer *ct_rmsprop_new(ct_rmsprop_params p);

// Adafactor as Trax (https://arxiv.org/abs/1804.04235):
//   decay = 1 - (step + 1)^-decay_rate, mix = 1 - decay
//   scale = lr * max(RMS(w), epsilon2)          (multiply_by_parameter_scale)
//   G = g^2 + epsilon1
//   factored (rank >= 2; the leading dims are a batch of (R, C) matrices):
//     vr = decay vr + mix mean_c G   (R)      vc = decay vc + mix mean_r G   (C)
//     y  = g / sqrt(vr / mean_r vr) / sqrt(vc)
//   otherwise: v = decay v + mix G; y = g / sqrt(v)
//   y /= max(1, RMS(y) / clipping_threshold)    (do_clipping)
//   s = scale y; with do_momentum: m = beta1 m + (1 - beta1) s; s = m
//   w = (1 - weight_decay_rate) w - s
// RMS means are accumulated in double. Slots: vr, vc (factored) or v, then m
// (do_momentum). factored and do_momentum are fixed at construction.
typedef struct ct_adafactor_params {
    float learning_rate;               // 0.05
    bool factored;                     // true
    bool multiply_by_parameter_scale;  // true
    bool do_clipping;                  // true
    bool do_momentum;                  // false
    float beta1;                       // 0.0 (momentum, used with do_momentum)
    float decay_rate;                  // 0.8 (the exponent of the decay schedule)
    float clipping_threshold;          // 1.0
    float weight_decay_rate;           // 1e-5
    float epsilon1;                    // 1e-30 (added to g^2)
    float epsilon2;                    // 1e-3 (floor of the parameter scale)
} ct_adafactor_params;
ct_adafactor_params ct_adafactor_default_params(void);
ct_optimizer *ct_adafactor_new(ct_adafactor_params p);

// SM3 as Trax's newest version (https://arxiv.org/abs/1901.11150). A rank-k
// weight (k >= 2) keeps one accumulator per index of each dim (the covers);
// rank 0 and 1 keep a full diagonal accumulator:
//   acc = min_i v_i[idx_i]  (or v[idx])
//   acc = b2 acc + c g^2    (c = 1 when b2 == 1, else 1 - b2; b2 is
//                            second_moment_averaging)
//   p = g / (sqrt(acc) + 1e-16), 0 where acc == 0
//   grafting (when second_moment_averaging != 1 at construction): a second set
//     of covers u adds g^2 with no decay; p *= |p_u| / (|p| + 1e-16), with
//     p_u = g / (sqrt(acc_u) + 1e-16) and norms over the whole weight
//   p += weight_decay w
//   momentum (if momentum > 0 at construction):
//     EMA: m = (1 - mom) p + mom m, u = m; HEAVY_BALL: m = p + mom m, u = m;
//     NESTEROV: m = p + mom m, u = p + mom m
//   w -= lr u;  v_i[j] = max of acc over the slice idx_i == j
// Slots: m (if momentum), the covers, the graft covers (if grafting), and
// scratch the size of the covers, where the new maxima are gathered before
// they replace the old ones (so an update allocates nothing).
// Older Trax versions have only lr and momentum (EMA), without the 1e-16; the
// defaults below give the same updates up to that epsilon.
typedef enum ct_sm3_momentum_type {
    CT_SM3_MOMENTUM_EMA = 1,
    CT_SM3_MOMENTUM_HEAVY_BALL = 2,
    CT_SM3_MOMENTUM_NESTEROV = 3,
} ct_sm3_momentum_type;
typedef struct ct_sm3_params {
    float learning_rate;             // 0.01
    float momentum;                  // 0.9
    float second_moment_averaging;   // 1.0 (plain sums, like AdaGrad)
    float weight_decay;              // 0.0 (L2 added to the preconditioned gradient)
    ct_sm3_momentum_type momentum_type;  // CT_SM3_MOMENTUM_EMA
} ct_sm3_params;
ct_sm3_params ct_sm3_default_params(void);
ct_optimizer *ct_sm3_new(ct_sm3_params p);

#ifdef __cplusplus
}
#endif
#endif
