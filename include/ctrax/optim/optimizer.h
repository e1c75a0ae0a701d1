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
#include "ctrax/params.h"

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
    // CT_OPT_PARAM_FLOAT: the valid range when min < max (the config's
    // RANGE column), each end open or closed.
    double min, max;
    bool min_open, max_open;
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
    // Optional, for an optimizer whose slot layout follows hyperparameters
    // that may change after it is made (SM3's momentum, zero or not, and
    // second_moment_averaging, 1 or not): the layout o was made with, in
    // words ("momentum slot, no grafting accumulators"). A checkpoint saves
    // it and a resume compares it.
    const char *(*slot_layout)(const ct_optimizer *o);
    // Optional, for checkpoints written before slot_layout was saved: would
    // hyperparameter name at value `saved` (a checkpoint's) have given the
    // slots another layout than o's? NULL if not, else what it gave ("no
    // momentum slot"). Only a guess: the saved value may have changed after
    // that run's optimizer was made.
    const char *(*layout_change)(const ct_optimizer *o, const char *name, float saved);
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
// norm = sqrt(sum g^2) (accumulated in double, in 8 lanes per chunk of
// 32768 floats, the chunks added in order: the same bits at any thread
// count); if
// norm >= max_norm, every g is scaled by max_norm / norm. Returns the norm
// before clipping. Better than Trax: a zero gradient (norm 0) is left alone
// instead of becoming 0 * (max_norm / 0) = NaN when max_norm is 0.
float ct_clip_grad_norm(float *grads, size_t n, float max_norm);
// The factor clipping multiplies by, for a norm computed elsewhere (over
// several ranges or devices): max_norm / norm if norm >= max_norm and
// norm > 0, else 1. The norm is a double, as summed: finite gradients may
// have one past FLT_MAX (Trax's float norm is then inf and zeroes them).
float ct_clip_factor(double norm, float max_norm);

// Each optimizer's hyperparameters are one list (see ctrax/params.h): its
// params struct, its ct_*_default_params(), its table of hyperparameters by
// name (ct_optimizer_get_param) and its config registry rows all come from
// it. Trax's defaults.
#define CT_LR_DOC "overridden by the schedule each step"
#define CT_DECAY_DOC "decoupled, not scaled by the learning rate"

// SGD: w -= lr * g.
#define CT_SGD_PARAMS(X) X(FLOAT, learning_rate, 0.01f, AT_LEAST(0), NONE, CT_LR_DOC)
typedef struct ct_sgd_params {
    CT_SGD_PARAMS(CT_PARAM_FIELD)
} ct_sgd_params;
ct_sgd_params ct_sgd_default_params(void);
ct_optimizer *ct_sgd_new(ct_sgd_params p);

// Adam as Trax: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// m^ = m / (1 - b1^(step+1)); v^ = v / (1 - b2^(step+1));
// w = (1 - weight_decay_rate) w - lr m^ / (sqrt(v^) + eps). Slots: m, v.
#define CT_ADAM_PARAMS(X)                                                   \
    X(FLOAT, learning_rate, 1e-4f, AT_LEAST(0), NONE, CT_LR_DOC)            \
    X(FLOAT, b1, 0.9f, UNIT_OPEN, NONE, NULL)                               \
    X(FLOAT, b2, 0.999f, UNIT_OPEN, NONE, NULL)                             \
    X(FLOAT, eps, 1e-5f, POSITIVE, NONE, NULL)                              \
    X(FLOAT, weight_decay_rate, 1e-5f, AT_LEAST(0), NONE, CT_DECAY_DOC)
typedef struct ct_adam_params {
    CT_ADAM_PARAMS(CT_PARAM_FIELD)
} ct_adam_params;
ct_adam_params ct_adam_default_params(void);
ct_optimizer *ct_adam_new(ct_adam_params p);

// Momentum as Trax (Nesterov by default): v = mass v + g;
// u = mass v + g (Nesterov) or v; w = (1 - weight_decay_rate) w - lr u.
// Slot: v.
#define CT_MOMENTUM_PARAMS(X)                                               \
    X(FLOAT, learning_rate, 0.01f, AT_LEAST(0), NONE, CT_LR_DOC)            \
    X(FLOAT, mass, 0.9f, UNIT, NONE, "momentum decay")                      \
    X(FLOAT, weight_decay_rate, 1e-5f, AT_LEAST(0), NONE, CT_DECAY_DOC)     \
    X(BOOL, nesterov, true, ANY, NONE, "Nesterov momentum")
typedef struct ct_momentum_params {
    CT_MOMENTUM_PARAMS(CT_PARAM_FIELD)
} ct_momentum_params;
ct_momentum_params ct_momentum_default_params(void);
ct_optimizer *ct_momentum_new(ct_momentum_params p);

// RMSProp as Trax: a = gamma a + (1 - gamma) g^2; w -= lr g / (sqrt(a) + eps).
// Slot: a, which starts at 1 (not 0), as Trax's does. Clipping is
// train.clip_grad_norm. eps > 0: at 0, a zero gradient where a has decayed to
// 0 (gamma 0: at once; gamma 0.1: after 46 zero gradients) gave 0/0 = NaN.
#define CT_RMSPROP_PARAMS(X)                                                \
    X(FLOAT, learning_rate, 1e-3f, AT_LEAST(0), NONE, CT_LR_DOC)            \
    X(FLOAT, gamma, 0.9f, UNIT, NONE, "decay of the mean square")           \
    X(FLOAT, eps, 1e-8f, POSITIVE, NONE, NULL)
typedef struct ct_rmsprop_params {
    CT_RMSPROP_PARAMS(CT_PARAM_FIELD)
} ct_rmsprop_params;
ct_rmsprop_params ct_rmsprop_default_params(void);
ct_optimizer *ct_rmsprop_new(ct_rmsprop_params p);

// Adafactor as Trax's current one (https://arxiv.org/abs/1804.04235):
//   decay = 1 - (step + 1)^-decay_rate, mix = 1 - decay
//   scale = lr * max(RMS(w), epsilon2)          (multiply_by_parameter_scale)
//   factored (rank >= 2; the leading dims are a batch of (R, C) matrices):
//     vr = decay vr + mix mean_c g^2   (R)      vc = decay vc + mix mean_r g^2   (C)
//     y  = g * sqrt(mean_r vr / (vr + epsilon1)) / sqrt(vc + epsilon1)
//   otherwise: v = decay v + mix g^2; y = g / sqrt(v + epsilon1)
//   (older Traxes added epsilon1, then 1e-30, to g^2 instead)
//   y /= max(1, RMS(y) / clipping_threshold)    (do_clipping; the threshold is
//                                                > 0: at 0, y / inf froze w)
//   s = scale y; with do_momentum: m = beta1 m + (1 - beta1) s; s = m
//   w = (1 - weight_decay_rate) w - s
// RMS means are accumulated in double. Slots: vr, vc (factored) or v, then m
// (do_momentum). factored and do_momentum decide the slot layout, so they
// are fixed at construction (Trax fixes all four flags in its
// constructor). Trax's momentum_in_bfloat16 and weight_decay_n_steps are
// accepted by configs only at the values that mean what ctrax does.
#define CT_ADAFACTOR_PARAMS(X)                                                                                   \
    X(FLOAT, learning_rate, 0.05f, AT_LEAST(0), NONE, CT_LR_DOC)                                                 \
    X(BOOL, factored, true, ANY, FIXED, "factored second moments for weights of rank >= 2")                     \
    X(BOOL, multiply_by_parameter_scale, true, ANY, NONE, "scale the learning rate by the weight's RMS")        \
    X(BOOL, do_clipping, true, ANY, NONE, "clip the update's RMS to clipping_threshold")                        \
    X(BOOL, do_momentum, false, ANY, FIXED, "momentum with beta1")                                              \
    X(BOOL, momentum_in_bfloat16, "False", ANY, UNSTORED, "Trax's; only False (ctrax keeps momentum in float32)") \
    X(FLOAT, beta1, 0.0f, UNIT_OPEN, NONE, NULL)                                                                 \
    X(FLOAT, decay_rate, 0.8f, AT_LEAST(0), NONE,                                                                \
      "exponent of the second-moment decay 1 - (step + 1)^-decay_rate")                                          \
    X(FLOAT, clipping_threshold, 1.0f, POSITIVE, NONE, NULL)                                                     \
    X(FLOAT, weight_decay_rate, 1e-5f, AT_LEAST(0), NONE, NULL)                                                  \
    X(INT, weight_decay_n_steps, "0", AT_LEAST(0), UNSTORED, "Trax's; only 0 (decay at every step)")            \
    X(FLOAT, epsilon1, 1e-16f, POSITIVE, NONE, "added to the accumulators where read")                          \
    X(FLOAT, epsilon2, 1e-3f, AT_LEAST(0), NONE, "floor of the parameter scale")
typedef struct ct_adafactor_params {
    CT_ADAFACTOR_PARAMS(CT_PARAM_FIELD)
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
#define CT_SM3_PARAMS(X)                                                                                        \
    X(FLOAT, learning_rate, 0.01f, AT_LEAST(0), NONE, CT_LR_DOC)                                                \
    X(FLOAT, momentum, 0.9f, UNIT_OPEN, NONE, "0: no momentum slot; below 1 (at 1, EMA's m stays 0)")           \
    X(FLOAT, second_moment_averaging, 1.0f, UNIT, NONE,                                                         \
      "1: plain sums (AdaGrad-like); below 1: decaying averages with grafting")                                 \
    X(FLOAT, weight_decay, 0.0f, AT_LEAST(0), NONE, "L2, added to the preconditioned gradient")                 \
    X(ENUM(ct_sm3_momentum_type), momentum_type, CT_SM3_MOMENTUM_EMA,                                           \
      RANGE(CT_SM3_MOMENTUM_EMA, CT_SM3_MOMENTUM_NESTEROV), NONE,                                               \
      "Trax's MomentumType: 1 EMA, 2 HEAVY_BALL, 3 NESTEROV")
typedef struct ct_sm3_params {
    CT_SM3_PARAMS(CT_PARAM_FIELD)
} ct_sm3_params;
ct_sm3_params ct_sm3_default_params(void);
ct_optimizer *ct_sm3_new(ct_sm3_params p);

#ifdef __cplusplus
}
#endif
#endif
