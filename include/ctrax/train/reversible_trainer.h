// The memory-efficient trainer for reversible models: Trax's
// ReversibleSerialTrainer (trax/optimizers/trainer.py), with the standard
// Trainer's results.
//
// The model is cut into trainer layers, in run order:
//   for each block: one standard layer (the standard layers before the
//                   block's reversible layers, as one unit; possibly empty),
//                   then each reversible layer of the block;
//   last:           the loss layer (the standard layers after the last
//                   reversible layer, then the loss).
// The cut follows Serial and ReversibleSerial nesting down to the reversible
// layers, as Trax's extract_reversible_blocks does.
//
// One step:
//   forward   each layer in turn, without a tape; a standard layer keeps
//             its inputs, a reversible layer keeps nothing (the stack holds
//             only the current items);
//   loss      forward, backward and optimizer update of the loss layer;
//   backward  the layers in reverse: a reversible layer rebuilds its inputs
//             from its outputs and runs backward on the way
//             (reverse_and_grad), a standard layer recomputes its forward from
//             the inputs it kept; then that layer's optimizer update, before
//             the next layer starts (fused: one layer's gradient at a time).
//
// Memory: weights, state and optimizer slots live on the host (a device the
// trainer owns, ct_reversible_trainer_host). The accelerator `dev` holds only
// one layer's staged weights and slots (twice: the next layer's copy
// overlaps the current layer's work) and, per local device, one layer's
// gradient, the stack items and one layer's activations (and, for Adasum
// over processes, every device's gradient of one layer); so its peak does
// not grow with depth. On CPU the
// staging is zero-copy by default (the layer runs on the host slab);
// copy_weights stages real copies.
//
// Keys: each layer the trainer runs gets the key it would get inside the
// standard Trainer's Serial(model, loss) (split along its path from the
// root), so dropout draws the same masks in both and a reversible layer's
// recomputation draws them again. (Trax splits the step key flat over its
// layers, which matches its Trainer only for unnested models.)
//
// Same weights as the standard Trainer: the net is Serial(model, loss)
// initialized with the same key, so weight names, the weight and state slab
// layout and the optimizer slot slab layout are the standard Trainer's
// (ct_trainer_net, ct_trainer_slots); a checkpoint written from one loads into
// the other. Each weight gets the same update; only summation orders differ
// (a few ulps).
//
// One optimizer per layer: each layer's weights are updated with the
// layer's own slots, by the same optimizer type and hyperparameters; the
// step's learning rate overrides them all. A ct_optimizer holds only
// hyperparameters (slots live in the slot slab), so one instance serves
// every layer.
//
// Devices (common.n_devices, common.comm), as the standard Trainer: the
// batch is split over the local replicas (threads, each with its own
// arena, gradient buffer, stack items and key) and over processes; each
// turn runs on every replica at once against the one staged copy of the
// layer's weights; a layer's gradient is combined over every device of
// every process (summed over the local replicas in device order, then one
// allreduce over the processes, then divided by the device count; or
// Adasum) before that layer's update, so every process makes the same
// update. The loss is normalized by the global weight, as the standard
// Trainer's: N devices with B/N examples each give the update of one device
// with B. Layer state follows device 0 (other replicas run on their own
// copy of it), as Trax keeps the first replica's state.
//
// Gradient clipping (clip_grad_norm > 0): CT_CLIP_GLOBAL scales every
// gradient by min(1, clip / global norm), as a standard trainer would; the
// global norm is known only after the last layer's backward, so this mode
// keeps each layer's gradient in a host gradient slab during backward and
// runs the updates in a second pass over the layers (device memory is still
// one layer's). CT_CLIP_PER_LAYER is Trax's behaviour (each layer's
// optimizer clips by that layer's norm): fused and cheaper, but a different
// update whenever a clip is hit.
#ifndef CTRAX_TRAIN_REVERSIBLE_TRAINER_H
#define CTRAX_TRAIN_REVERSIBLE_TRAINER_H

#include "ctrax/core/error.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/layers/layer.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/train/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_reversible_trainer ct_reversible_trainer;

typedef enum ct_clip_mode {
    CT_CLIP_GLOBAL = 0,     // over the global norm, as the standard trainer (two passes)
    CT_CLIP_PER_LAYER = 1,  // over each layer's norm, as Trax's ReversibleSerialTrainer
} ct_clip_mode;

typedef struct ct_reversible_trainer_options {
    // What both trainers take, with the same meaning: local devices, the
    // process comm (MPI), Adasum, clip_grad_norm and frozen weights.
    // bucket_bytes is unused: each layer's gradient is one bucket.
    ct_trainer_options common;
    bool copy_weights;           // false: zero-copy staging (CPU); true: copy each layer's
                                 // weights and slots into device buffers and back
    bool prefetch;               // true: a helper thread copies the next layer's range while
                                 // the current one runs (copy_weights only)
    bool free_device_each_step;  // give every device buffer back at the end of each step
                                 // (Trax's free_accelerators_on_step)
    ct_clip_mode clip_mode;      // CT_CLIP_GLOBAL (when common.clip_grad_norm > 0)
    int log_every;               // log host memory (RSS) when step % log_every == 1 (100); 0: never
} ct_reversible_trainer_options;
ct_reversible_trainer_options ct_reversible_trainer_default_options(void);

// Builds the trainer for Serial(model, loss), initialized with init_key for a
// batch of n_batch tensors of the given signatures, exactly as
// ct_trainer_new does. Takes new references to model and loss and ownership
// of opt. dev is the accelerator (counted, possibly limited); opts NULL
// means the defaults. Fails if a layer's weights are shared between two
// trainer layers.
ct_status ct_reversible_trainer_new(ct_reversible_trainer **out, ct_layer *model, ct_layer *loss,
                                    const ct_tensor *batch_sigs, int n_batch, ct_optimizer *opt,
                                    ct_key init_key, ct_device *dev,
                                    const ct_reversible_trainer_options *opts, ct_error *err);

// Blocks of (standard layers, reversible layers), as Trax's trainer takes
// them. The same as ct_reversible_trainer_new with
// model = Serial(std_0..., rev_0..., std_1..., rev_1..., ...); the standard
// Trainer on that model gives the same weights. Takes new references to
// every layer.
typedef struct ct_reversible_block {
    int n_std;
    ct_layer **std;
    int n_rev;
    ct_layer **rev;
} ct_reversible_block;
ct_status ct_reversible_trainer_new_blocks(ct_reversible_trainer **out, const ct_reversible_block *blocks,
                                           int n_blocks, ct_layer *loss, const ct_tensor *batch_sigs,
                                           int n_batch, ct_optimizer *opt, ct_key init_key, ct_device *dev,
                                           const ct_reversible_trainer_options *opts, ct_error *err);
void ct_reversible_trainer_free(ct_reversible_trainer *t);

// One step, as ct_trainer_one_step: key is this step's key, step goes to the
// optimizer, learning_rate overrides every layer's optimizer. stats gets the
// loss and the global gradient and weight norms (the sums over all layers).
// A step that fails in its backward pass leaves the layers already updated
// updated.
//
// Non-finite values (CT_ERR_NONFINITE; judged on values combined over every
// device and process, so every process stops at the same place):
// - a NaN or Inf loss is known after the forward pass, before any backward
//   or update: the step updates nothing (weights, slots and state bitwise
//   as before it);
// - each layer's combined gradient is checked before that layer's update
//   (its L2 norm is computed anyway: no cost on a healthy step), and a
//   non-finite one stops the step there. With CT_CLIP_GLOBAL clipping
//   (clip_grad_norm > 0) every update waits for the last gradient, so
//   nothing was updated. With fused updates (no clipping, or
//   CT_CLIP_PER_LAYER), the layers after the bad one in the model (whose
//   backward came first) have already made this step's update: undoing it
//   would need a second copy of their weights and slots, the memory this
//   trainer exists to save. Those updates are kept, and the message says
//   which trainer layers made them ("non-finite gradient (L2 norm nan) in
//   trainer layer 2, after this step had updated trainer layers 3 to 5:
//   ..."); the slots and weights of the bad layer and of the layers before
//   it are as before the step, and the layer state of every layer is put
//   back. Such a partly applied step fails with CT_ERR_STATE, not
//   CT_ERR_NONFINITE (which always means nothing was updated), so a Loop
//   told to skip non-finite steps stops there instead. A caller that needs
//   a step to update nothing or all uses CT_CLIP_GLOBAL.
// Then, only on failure, the failed turns run again on the same batch, keys
// and restored state in anomaly mode (ct_ctx.check_finite), with no
// collective and no update, to name the first layer, by path, whose
// forward output or backward gradient went non-finite, as
// ct_trainer_one_step does (after a fused partial update, the re-run sees
// the updated layers' new weights).
ct_status ct_reversible_trainer_one_step(ct_reversible_trainer *t, const ct_tensor *batch, ct_key key,
                                         int64_t step, float learning_rate, ct_step_stats *stats,
                                         ct_error *err);

// Per-layer stats of the last step, Trax's names: "layer{i}/gradients_l2"
// and "layer{i}/weights_l2" for each trainer layer i with weights (i counts
// every layer from the first, weightless ones too), and "layer{n-1}/loss"
// for the loss layer, last. Valid until the trainer is freed.
typedef struct ct_layer_stat {
    char name[48];
    float value;
} ct_layer_stat;
const ct_layer_stat *ct_reversible_trainer_layer_stats(const ct_reversible_trainer *t, int *n);

// The trainer layers: how many, and a description of layer i
// ("standard: Embedding, Dropout, Dup", "reversible: <path>", "loss: ...").
int ct_reversible_trainer_n_layers(const ct_reversible_trainer *t);
const char *ct_reversible_trainer_layer_desc(const ct_reversible_trainer *t, int i);

// The net (weights and state on the host, names as the standard Trainer's;
// its gradient slab is NULL), the model, and the slot slab (layout as
// ct_trainer_slots).
const ct_net *ct_reversible_trainer_net(const ct_reversible_trainer *t);
ct_layer *ct_reversible_trainer_model(const ct_reversible_trainer *t);
float *ct_reversible_trainer_slots(const ct_reversible_trainer *t, size_t *n_floats);
// Where weight i (ct_reversible_trainer_net(t)->params[i]) has its slots,
// as ct_trainer_param_slots; and the optimizer every layer uses.
void ct_reversible_trainer_param_slots(const ct_reversible_trainer *t, int i, size_t *offset, size_t *n_floats);
// Whether weight i is frozen (common.frozen): no update, no slots.
bool ct_reversible_trainer_param_frozen(const ct_reversible_trainer *t, int i);
// Local replicas, and devices over all processes.
int ct_reversible_trainer_local_devices(const ct_reversible_trainer *t);
int ct_reversible_trainer_global_devices(const ct_reversible_trainer *t);
ct_optimizer *ct_reversible_trainer_optimizer(const ct_reversible_trainer *t);
// The host device: bytes of weights, state, slots (and the gradient slab
// of CT_CLIP_GLOBAL).
const ct_device *ct_reversible_trainer_host(const ct_reversible_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
