// The Trainer: one training step of a model with a loss, on one device.
//
//   batch -> forward through Serial(model, loss) (tape) -> scalar loss ->
//   backward (gradients += into the gradient slab) -> stats -> optimizer
//   update over the slab ranges with this step's learning rate.
//
// The trainer owns the net (slabs), the optimizer slot slab, the step arena
// and the run context. Everything is allocated when the trainer is created
// and during the first step; later steps of the same shapes allocate nothing.
#ifndef CTRAX_TRAIN_TRAINER_H
#define CTRAX_TRAIN_TRAINER_H

#include "ctrax/core/error.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/layers/layer.h"
#include "ctrax/optim/optimizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_trainer ct_trainer;

// What one step reports, as Trax's trainer: the loss, the global L2 norm of
// the gradients (before any clipping) and of the weights (before the update).
typedef struct ct_step_stats {
    float loss;
    float gradients_l2;
    float weights_l2;
} ct_step_stats;

// Builds Serial(model, loss) and initializes it for a batch of n_batch
// tensors with the given signatures: the model takes the first model->n_in of
// them, the loss its output and the rest (targets, weights). The loss must
// leave one f32 scalar. Takes new references to model and loss and ownership
// of opt. dev counts every byte.
ct_status ct_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs, int n_batch,
                         ct_optimizer *opt, ct_key init_key, ct_device *dev, ct_error *err);
void ct_trainer_free(ct_trainer *t);

// One step: forward, loss, backward, update. key is this step's key (the
// loop splits its key per step); step is passed to the optimizer; the
// learning rate overrides the optimizer's own.
ct_status ct_trainer_one_step(ct_trainer *t, const ct_tensor *batch, ct_key key, int64_t step, float learning_rate,
                              ct_step_stats *stats, ct_error *err);

// Runs the model alone in eval mode (dropout off) on its n_in inputs and
// writes its outputs. They live in the trainer's eval arena until the next
// call of ct_trainer_predict.
ct_status ct_trainer_predict(ct_trainer *t, const ct_tensor *inputs, ct_tensor *outputs, ct_error *err);

// The net (weights, gradients, parameter names) and the model layer.
const ct_net *ct_trainer_net(const ct_trainer *t);
ct_layer *ct_trainer_model(const ct_trainer *t);
// The optimizer slot slab (for checkpoints and tests).
float *ct_trainer_slots(const ct_trainer *t, size_t *n_floats);
// Bytes the step arena reserves, after the first step sized it.
size_t ct_trainer_arena_bytes(const ct_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
