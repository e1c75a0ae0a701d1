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
// layers, as Trax's extract_reversible_blocks does. With loss_chunk_size
// (trainer.h) the model is always cut into its top-level layers, and the
// loss layer runs its layers before the model's row-wise tail as usual, then
// the tail and the loss over chunks of rows (the chunks' forward once for
// the loss, then again with each chunk's backward), so the device never
// holds the full logits. Unlike Trax's loss chunking (which needs a tail
// with Select and LogSoftmax and refuses ReformerLM's), any model ending in
// LayerNorm/Dropout/Dense/activations qualifies, ReformerLM and
// TransformerLM included.
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
// trainer owns, ct_trainer_host). The accelerator `dev` holds only
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
// Devices (n_devices, comm), as the standard Trainer: the
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

// The memory-efficient trainer is a ct_trainer built with
// ct_trainer_options.memory_efficient (its own settings in
// ct_trainer_options.reversible), or from blocks:
//
// Blocks of (standard layers, reversible layers), as Trax's trainer takes
// them. The same as ct_trainer_new with memory_efficient and
// model = Serial(std_0..., rev_0..., std_1..., rev_1..., ...); the standard
// Trainer on that model gives the same weights. Takes new references to
// every layer and ownership of opt (freed on failure too). Fails with
// CT_ERR_ARG on a negative count or a NULL layer or array where a count says
// there are layers, or if a layer's weights or state are shared between two
// trainer layers (a weightless, stateless layer such as
// ReversibleSwap may be used in any number of them).
// ct_trainer_default_options() with memory_efficient set.
ct_trainer_options ct_reversible_default_options(void);

typedef struct ct_reversible_block {
    int n_std;
    ct_layer **std;
    int n_rev;
    ct_layer **rev;
} ct_reversible_block;
ct_status ct_trainer_new_blocks(ct_trainer **out, const ct_reversible_block *blocks, int n_blocks, ct_layer *loss,
                                const ct_tensor *batch_sigs, int n_batch, ct_optimizer *opt, ct_key init_key,
                                ct_device *dev, const ct_trainer_options *opts, ct_error *err);

// ct_trainer_one_step on this trainer: learning_rate overrides every
// layer's optimizer. stats gets the
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
// Per-layer stats of the last step, Trax's names: "layer{i}/gradients_l2"
// and "layer{i}/weights_l2" for each trainer layer i with weights (i counts
// every layer from the first, weightless ones too), and "layer{n-1}/loss"
// for the loss layer, last. Valid until the trainer is freed. The standard
// trainer has none (*n = 0).
typedef struct ct_layer_stat {
    char name[48];
    float value;
} ct_layer_stat;
const ct_layer_stat *ct_trainer_layer_stats(const ct_trainer *t, int *n);

// The trainer layers: how many (0 for the standard trainer), and a
// description of layer i ("standard: Embedding, Dropout, Dup",
// "reversible: <path>", "loss: ...").
int ct_trainer_n_layers(const ct_trainer *t);
const char *ct_trainer_layer_desc(const ct_trainer *t, int i);

// The device that holds weights, state and slots (and the gradient slabs of
// CT_CLIP_GLOBAL and keep_grads): the memory-efficient trainer's own host
// device; the standard trainer's is dev.
const ct_device *ct_trainer_host(const ct_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
