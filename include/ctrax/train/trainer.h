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
// Two implementations behind one ct_trainer: the standard step (this file)
// and the memory-efficient one (reversible_trainer.h), picked by
// ct_trainer_options.memory_efficient. The trainer owns the net (slabs), the
// optimizer slot slab, the arenas and the run contexts; other optimizers
// for the same weights (ct_trainer_opt_state) are laid out and counted by
// it but owned by the caller. Device memory is allocated when the trainer is
// created, as its memory plan says (ct_trainer_memory_plan); steps of the
// construction shapes allocate nothing on the device.
#ifndef CTRAX_TRAIN_TRAINER_H
#define CTRAX_TRAIN_TRAINER_H

#include "ctrax/core/error.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/dist/comm.h"
#include "ctrax/layers/layer.h"
#include "ctrax/layers/profile.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/train/checkpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_trainer ct_trainer;

// The most local devices (replica threads) one trainer runs.
#define CT_MAX_LOCAL_DEVICES 64

// How the memory-efficient trainer clips (see reversible_trainer.h).
typedef enum ct_clip_mode {
    CT_CLIP_GLOBAL = 0,     // over the global norm, as the standard trainer (two passes)
    CT_CLIP_PER_LAYER = 1,  // over each layer's norm, as Trax's ReversibleSerialTrainer
} ct_clip_mode;

// Settings only the memory-efficient trainer reads (reversible_trainer.h).
typedef struct ct_reversible_options {
    bool copy_weights;           // false: zero-copy staging (CPU); true: copy each layer's
                                 // weights and slots into device buffers and back
    bool prefetch;               // true: a helper thread copies the next layer's range while
                                 // the current one runs (copy_weights only)
    bool free_device_each_step;  // give every device buffer back at the end of each step
                                 // (Trax's free_accelerators_on_step)
    ct_clip_mode clip_mode;      // CT_CLIP_GLOBAL (when clip_grad_norm > 0)
    int log_every;               // log host memory (RSS) when step % log_every == 1 (100); 0: never
    // Keep every weight's gradient of the last step in a host slab (one
    // more float per weight: the memory this trainer exists to save, so off
    // by default), for ct_trainer_grads and ct_trainer_tensor.
    bool keep_grads;  // false
} ct_reversible_options;

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
    // started as soon as backward has finished it (standard trainer, one
    // local device only; the memory-efficient one sends each layer's as one).
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
    // The memory-efficient (reversible) trainer instead of the standard one:
    // weights and slots on the host, one layer at a time on the device
    // (reversible_trainer.h). Same weights, slots and checkpoints.
    bool memory_efficient;           // false
    ct_reversible_options reversible;  // its own settings
    // Trax's train.loss_chunk_size, in both trainers: > 0 runs the model's
    // row-wise tail (its last top-level layers that act on each row, a
    // position, alone: LayerNorm, Dropout, Dense, the activations Relu,
    // Gelu, Tanh, Sigmoid, LogSoftmax, Softmax) and the loss
    // (WeightedCategoryCrossEntropy or CrossEntropyLoss) over chunks of this
    // many of the (B*T) rows, so the full logits (and their gradient) never
    // exist at once: each chunk's forward runs twice (once for the loss,
    // once with its backward). Same loss and gradients as unchunked at
    // dropout 0; with dropout, each chunk of the tail draws its own masks
    // (ct_key_split(layer key, chunk)). The weights stay where they are (same
    // names): a run may change it on resume. A model without such a tail, or
    // another loss, is refused naming the layer. 0: off.
    int64_t loss_chunk_size;  // 0
    // Where the steps' time goes (ctrax/layers/profile.h): each step's wall
    // time, device 0's layers' self times, and the optimizer update as the
    // row "(optimizer update)". Not owned. NULL: off.
    ct_profile *profile;  // NULL
} ct_trainer_options;
ct_trainer_options ct_trainer_default_options(void);

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
// scalar. Takes new references to model and loss and ownership of opt (on
// every path: a failure frees it). dev counts every byte. opts may be NULL
// (the defaults); opts->memory_efficient picks the memory-efficient trainer.
ct_status ct_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs, int n_batch,
                         ct_optimizer *opt, ct_key init_key, ct_device *dev, const ct_trainer_options *opts,
                         ct_error *err);
void ct_trainer_free(ct_trainer *t);

// One step: forward, loss, backward, combine, update. key is this step's
// key (the loop splits its key per step; with more than one device in all,
// device g of the global order gets ct_key_split(key, g)); step is passed
// to the optimizer (the Loop passes its 1-based step, as Trax's; the
// optimizers' bias corrections use step + 1, so a negative step would give
// NaN or inf: refused with CT_ERR_ARG); the learning rate overrides the optimizer's own. The batch
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
// each process names what its own devices found. (The memory-efficient
// trainer's fused updates make one exception: reversible_trainer.h.)
ct_status ct_trainer_one_step(ct_trainer *t, const ct_tensor *batch, ct_key key, int64_t step, float learning_rate,
                              ct_step_stats *stats, ct_error *err);

// The loss of Serial(model, loss) on a batch in eval mode (dropout off),
// weighted and averaged over every device of every process as a step's:
// no update, no gradients kept, layer state as before. Every process calls it.
ct_status ct_trainer_eval_loss(ct_trainer *t, const ct_tensor *batch, ct_key key, float *loss, ct_error *err);

// The net: weights and state (on the host for the memory-efficient trainer),
// parameter names. To run the model alone (evals, sampling) see evaluator.h.
const ct_net *ct_trainer_net(const ct_trainer *t);
// The combined gradients of the last step (what the update used, after
// clipping), laid out as the net's weights; after a step skipped as
// non-finite, that step's gradients (no update used them: non-finite
// somewhere, frozen weights' zeroed); NULL before the first step and for a
// memory-efficient trainer without reversible.keep_grads.
const float *ct_trainer_grads(const ct_trainer *t);
// The optimizer slot slab (for checkpoints and tests), and where weight i
// (ct_trainer_net(t)->params[i]) has its slots: offset and count of floats
// (0 for a frozen weight).
float *ct_trainer_slots(const ct_trainer *t, size_t *n_floats);
void ct_trainer_param_slots(const ct_trainer *t, int i, size_t *offset, size_t *n_floats);
bool ct_trainer_param_frozen(const ct_trainer *t, int i);

// One tensor of the trainer by its full name (a layer path, as in
// checkpoints): a weight, its last gradient, its optimizer slots (one flat
// f32 tensor, empty for a frozen weight) or a state tensor. out views the
// trainer's memory. An unknown name, or gradients not kept, is an error.
typedef enum ct_trainer_part { CT_PART_WEIGHT, CT_PART_GRAD, CT_PART_SLOTS, CT_PART_STATE } ct_trainer_part;
ct_status ct_trainer_tensor(const ct_trainer *t, ct_trainer_part part, const char *name, ct_tensor *out,
                            ct_error *err);

// Loads weights (and state) by name from a safetensors file into the
// trainer: CT_LOAD_STRICT (every weight and state tensor present, with the
// same dtype and shape; the file may hold more), CT_LOAD_EXACT (and nothing
// more) or CT_LOAD_BY_NAME (what matches; an error only if nothing does). A
// failed load changes nothing. Slots are untouched.
ct_status ct_trainer_load_safetensors(ct_trainer *t, const char *path, ct_load_mode mode, ct_error *err);
// The same from a checkpoint's weights.safetensors.
ct_status ct_trainer_load_checkpoint(ct_trainer *t, const ct_checkpoint *c, ct_load_mode mode, ct_error *err);
// The same for any net (ctrax eval and sample load a net of their own, at
// their own batch size). A cache state tensor (ct_layer_declare_cache:
// LSHSelfAttention's stored buckets, shaped by the batch of the net that
// wrote them) found at another shape keeps its initial value in every
// mode: the next training forward recomputes it, and an eval forward does
// not read it.
ct_status ct_net_load_checkpoint(const ct_net *net, const ct_checkpoint *c, ct_load_mode mode, ct_error *err);

// Save/restore, as the Loop writes and reads checkpoints: the weights and
// state named by their layer paths (*weights), and each trained weight's
// slots as one flat tensor named like the weight (*slots). Views of the
// trainer's memory; ct_free both arrays.
void ct_trainer_checkpoint_tensors(const ct_trainer *t, ct_named_tensor **weights, int *n_weights,
                                   ct_named_tensor **slots, int *n_slots);

// The optimizer (its hyperparameters are read and set by name).
ct_optimizer *ct_trainer_optimizer(const ct_trainer *t);

// Another optimizer for the same weights (Trax's train task with an
// optimizer of its own: the Loop swaps it in for that task's steps). An
// optimizer and its slot slab, laid out as the trainer's own
// (ct_trainer_param_slots: per weight in net order, frozen weights none).
typedef struct ct_trainer_opt_state {
    ct_optimizer *opt;      // owned
    float *slots;           // on the trainer's slab device, counted there; NULL when it keeps none (SGD)
    size_t n_slot_floats;
    size_t *slot_offsets;   // n_params + 1: weight i's slots are [slot_offsets[i], slot_offsets[i + 1])
} ct_trainer_opt_state;
// Lays out, allocates and initializes opt's slots for t's weights, as the
// trainer's own are at construction; takes opt on every path (a failure
// frees it and leaves *out zeroed). The slots are added to t's memory plan
// (ct_memory_plan.slots and device_bytes), so a plan read afterwards (the
// Loop's, which makes its tasks' states right after the trainer) counts
// them. Standard trainer only: the memory-efficient one stages each layer's
// slots at ranges fixed at construction, and is refused with CT_ERR_ARG.
ct_status ct_trainer_opt_state_new(ct_trainer *t, ct_optimizer *opt, ct_trainer_opt_state *out, ct_error *err);
// Frees s's optimizer and slots and takes them out of t's plan; s is
// zeroed. Before ct_trainer_free (the slots are on its device); t may be
// NULL for a state that holds no slots (only an optimizer). Either side of
// a swap may be freed first: each frees what it holds then.
void ct_trainer_opt_state_free(ct_trainer *t, ct_trainer_opt_state *s);
// Exchanges t's optimizer and slots with *s: steps, ct_trainer_slots,
// ct_trainer_param_slots, ct_trainer_tensor(CT_PART_SLOTS),
// ct_trainer_optimizer and ct_trainer_checkpoint_tensors then see s's, and
// s holds the trainer's. Calling it again puts them back. Nothing is copied
// or allocated. s must come from ct_trainer_opt_state_new for this t.
void ct_trainer_swap_optimizer(ct_trainer *t, ct_trainer_opt_state *s);
// Bytes the step arenas reserve (all replicas), as planned at construction.
size_t ct_trainer_arena_bytes(const ct_trainer *t);
// What a trainer holds on its device, in bytes (each part padded as
// ct_device_alloc pads). Planned at construction: a planning pass runs one
// step's forward and backward on a batch of zeros of the construction
// signatures with the step arenas measuring (ct_arena_measure_begin), then
// gives each arena one block of its high-water mark; so the first step
// allocates nothing more and peaks no higher than later steps, and a device
// limit below the plan fails in ct_trainer_new with CT_ERR_MEMORY naming
// the bytes. The device parts add up to device_bytes: what dev holds from
// construction on (dev->current_bytes right after ct_trainer_new, when
// nothing else is on it; ct_trainer_opt_state_new and _free add and take
// their slots in both). Attention scratch has no part of its own: it is
// in the arena (activations). With loss_chunk_size the planning pass runs
// the chunked loss too, so the arenas hold one chunk's tail and loss
// activations (and the tail input's full-size gradient), not the logits.
typedef struct ct_memory_plan {
    size_t weights;      // the weight slab; memory-efficient: staged layer weights (copy_weights)
    size_t grads;        // one gradient slab per local device; memory-efficient: one layer's, per device
    size_t slots;        // the optimizer slot slab, and those of every ct_trainer_opt_state made for the
                         // trainer; memory-efficient: staged layer slots (copy_weights)
    size_t state;        // layer state and its copy for a non-finite step (standard)
    size_t activations;  // the step arenas, every local device's
    size_t stack;        // memory-efficient: stack items and kept inputs; standard: 0
    size_t scratch;      // the Adasum gather buffer
    size_t device_bytes; // the sum of the above
    size_t host_bytes;   // memory-efficient: weights, slots, state and gradients on the host; standard: 0
} ct_memory_plan;
const ct_memory_plan *ct_trainer_memory_plan(const ct_trainer *t);
// The plan as one line into buf ("memory plan: weights 1.2 MiB, gradients
// ..., device total 9.9 MiB"); returns buf.
char *ct_memory_plan_format(const ct_memory_plan *p, char *buf, size_t len);
// Devices over all processes.
int ct_trainer_global_devices(const ct_trainer *t);
// Whether this is the memory-efficient trainer.
bool ct_trainer_memory_efficient(const ct_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
