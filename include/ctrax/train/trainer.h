// The Trainer: one training step of a model with a loss, on one or many
// devices.
//
//   batch -> split over the local devices (replicas: threads, each with its
//   own arena, gradient slab and key) -> forward through Serial(model, loss)
//   -> scalar loss -> backward (gradients += into the replica's slab) ->
//   gradients combined over every device of every process (mean, or Adasum)
//   -> stats -> optimizer update over the slab ranges with this step's
//   learning rate.
//
// Weighted losses are normalized by the global weight: each replica seeds
// its backward with n_devices * W_d / W (W_d its loss layer's weight sum, W
// the sum over all devices), so the mean over devices is the gradient of
// sum(loss * w) / sum(w) over the whole global batch: N devices with B/N
// examples each give the update one device gives with B.
//
// The trainer owns the net (slabs), the optimizer slot slab, the arenas and
// the run contexts. Everything is allocated when the trainer is created and
// during the first step; later steps of the same shapes allocate nothing.
#ifndef CTRAX_TRAIN_TRAINER_H
#define CTRAX_TRAIN_TRAINER_H

#include "ctrax/core/error.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/dist/comm.h"
#include "ctrax/layers/layer.h"
#include "ctrax/optim/optimizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_trainer ct_trainer;

// The most local devices (replica threads) one trainer runs.
#define CT_MAX_LOCAL_DEVICES 64

typedef struct ct_trainer_options {
    // Local replicas (threads) in this process, 1..CT_MAX_LOCAL_DEVICES. The
    // batch is split evenly over them along axis 0.
    int n_devices;  // 1
    // The process-level comm (single or MPI); NULL: this process alone. Not
    // owned. Each process passes its own slice of the global batch.
    ct_comm *comm;  // NULL
    // Combine device gradients by Adasum instead of averaging them.
    bool adasum;  // false
    // Gradients go to the comm in buckets of about this many bytes, each
    // started as soon as backward has finished it (one local device only).
    size_t bucket_bytes;  // 4 MiB
    // Clip the combined gradients to this global L2 norm (Trax's
    // clip_grad_norm); 0: no clipping.
    float clip_grad_norm;  // 0
    // Frozen weights: every weight whose name (its layer path, e.g.
    // "TransformerLM/Embedding[1]") starts with one of these prefixes gets no
    // update and no optimizer slots; its gradient is dropped (and left out of
    // gradients_l2 and clipping). Not copied: must outlive the trainer.
    const char *const *frozen;  // NULL
    int n_frozen;               // 0
} ct_trainer_options;
ct_trainer_options ct_trainer_default_options(void);
// Whether options o freeze the weight of this full name (a prefix matches).
bool ct_trainer_options_frozen(const ct_trainer_options *o, const char *name);

// What one step reports, as Trax's trainer: the loss (over the global
// batch), the global L2 norm of the combined gradients (before any clipping)
// and of the weights (before the update).
typedef struct ct_step_stats {
    float loss;
    float gradients_l2;
    float weights_l2;
} ct_step_stats;

// Builds Serial(model, loss) and initializes it for a batch of n_batch
// tensors with the given signatures (this process's batch: all its
// devices'): the model takes the first model->n_in of them, the loss its
// output and the rest (targets, weights). The loss must leave one f32
// scalar. Takes new references to model and loss and ownership of opt. dev
// counts every byte. opts may be NULL (the defaults).
ct_status ct_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs, int n_batch,
                         ct_optimizer *opt, ct_key init_key, ct_device *dev, const ct_trainer_options *opts,
                         ct_error *err);
void ct_trainer_free(ct_trainer *t);

// One step: forward, loss, backward, combine, update. key is this step's
// key (the loop splits its key per step; with more than one device in all,
// device g of the global order gets ct_key_split(key, g)); step is passed to
// the optimizer; the learning rate overrides the optimizer's own. The batch
// dimension (axis 0 of every item) must divide by the local device count.
//
// A loss or gradient that goes NaN or Inf (judged after combining over every
// device and process, so every process decides alike) fails the step with
// CT_ERR_NONFINITE, and the step updates nothing: weights, optimizer slots
// and layer state are bitwise as before it. The checks cost nothing on a
// healthy step (the loss and gradients_l2 are computed anyway). Only on
// failure, the step runs again on the same batch, keys and state in anomaly
// mode (ct_ctx.check_finite) to name the first layer, by path, whose
// output or gradient went non-finite, e.g. "non-finite loss (nan): first
// non-finite value: forward output 0 of TransformerLM/Serial[3]/Dense
// (inputs finite): inf at element 7" or "non-finite gradient (global L2
// norm nan): first non-finite value: backward: weight gradient of
// Model/Dense[1]/kernel ...". With several devices the message says which;
// each process names what its own devices found.
ct_status ct_trainer_one_step(ct_trainer *t, const ct_tensor *batch, ct_key key, int64_t step, float learning_rate,
                              ct_step_stats *stats, ct_error *err);

// To run the model alone (evals, sampling): bind a ct_ctx to
// ct_trainer_net(t) with ct_net_bind(net, ctx, false) and call
// ct_layer_forward on ct_trainer_model(t), as the Loop does.

// The net (weights, gradients, parameter names) and the model layer.
const ct_net *ct_trainer_net(const ct_trainer *t);
ct_layer *ct_trainer_model(const ct_trainer *t);
// The optimizer slot slab (for checkpoints and tests), and where weight i
// (ct_trainer_net(t)->params[i]) has its slots: offset and count of floats
// (0 for a frozen weight).
float *ct_trainer_slots(const ct_trainer *t, size_t *n_floats);
void ct_trainer_param_slots(const ct_trainer *t, int i, size_t *offset, size_t *n_floats);
bool ct_trainer_param_frozen(const ct_trainer *t, int i);
// The optimizer (its hyperparameters are read and set by name).
ct_optimizer *ct_trainer_optimizer(const ct_trainer *t);
// Bytes the step arenas reserve (all replicas), after the first step sized them.
size_t ct_trainer_arena_bytes(const ct_trainer *t);
// Devices in this process and in all processes.
int ct_trainer_local_devices(const ct_trainer *t);
int ct_trainer_global_devices(const ct_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
