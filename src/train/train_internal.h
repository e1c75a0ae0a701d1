// What the two trainers (trainer.c: the standard step; reversible_trainer.c:
// the memory-efficient one) share, behind the one ct_trainer of trainer.h:
// construction (options, comm, the net, the slot slab), the batch split over
// local devices, the loss weights across devices and processes, the
// gradient mean, clipping and statistics, the checking re-run's report, and
// the accessors (train_common.c). Not public.
#ifndef CTRAX_TRAIN_TRAIN_INTERNAL_H
#define CTRAX_TRAIN_TRAIN_INTERNAL_H

#include "ctrax/core/error.h"
#include "ctrax/data/stream.h"
#include "ctrax/dist/comm.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/train/reversible_trainer.h"
#include "ctrax/train/trainer.h"

// What one local device's step leaves for the shared code: its loss, what
// the loss averaged over, its backward seed, and how its pass ended.
typedef struct ct_train_dev {
    ct_tensor loss_out;
    double weight;  // what its loss averaged over (ct_ctx.loss_weight)
    float seed;     // d loss / d (its loss), from the global weight
    ct_status status;
    ct_error err;
    const ct_arena *arena;  // its step arena (for ct_trainer_arena_bytes)
} ct_train_dev;

// The two implementations.
typedef struct ct_trainer_vt {
    const char *who;  // in messages: "trainer", "reversible trainer"
    ct_status (*one_step)(ct_trainer *t, const ct_tensor *batch, ct_key key, int64_t step, float lr,
                          ct_step_stats *stats, ct_error *err);
    void (*free)(ct_trainer *t);  // everything: its own parts, ct_train_base_free, the struct
} ct_trainer_vt;

// ---- leaves: layers a trainer runs itself --------------------------------------

#define CT_TRAIN_PATH_MAX 32

// A layer a trainer runs itself, with its place in Serial(model, loss): the
// child indices from the root, so it gets the key it would get inside the
// standard Trainer's Serial (the step key split along the path).
typedef struct ct_train_leaf {
    ct_layer *layer;  // owned by the net's tree
    int depth;
    uint32_t path[CT_TRAIN_PATH_MAX];
} ct_train_leaf;

ct_key ct_train_leaf_key(ct_key key, const ct_train_leaf *leaf);

// Runs leaves[0..n) as a Serial of them would, over a stack whose top is top
// with depth items: forward in order (each takes its n_in, pushes its
// n_out), backward in reverse (n_out gradients taken, n_in pushed). res gets
// every item left (at most CT_LAYER_MAX_IO; *res_depth of them, if not NULL).
ct_status ct_train_leaves_run(const ct_train_leaf *leaves, int n, ct_key key, ct_ctx *c, bool backward,
                              const ct_tensor *top, int depth, ct_tensor *res, int *res_depth, ct_error *err);

// ---- the chunked loss (ct_trainer_options.loss_chunk_size) ----------------------
//
// Serial(model, loss) one level down: the model's top-level layers (leaves
// with path {0, i}; a model that is not a Serial is one leaf {0}), then the
// loss ({1}). The part leaves[first..n) is the model's row-wise tail (the
// last top-level layers that each act on every row, a position, alone) and
// the loss; it runs over chunks of `rows` rows of its (B*T) rows, so its
// full-size activations (the logits) never exist at once:
//   forward   every chunk without a tape: the loss is the chunks' weighted
//             mean sum(L_c W_c) / sum(W_c), W = sum(W_c) what it averaged over;
//   backward  per chunk, forward again with the tape, then backward from
//             seed * W_c / W (d loss / d L_c); the input's gradient is
//             assembled row by row, weight gradients add up (+=).
// Dropout in the tail draws chunk i's mask from ct_key_split(key, i) (the
// layer's key when one chunk covers every row): the same in both passes,
// but not the masks of the unchunked step. At dropout 0, and with one
// chunk, the result is the unchunked one (to rounding: ulps).
typedef struct ct_chunked_loss {
    int64_t rows;           // rows per chunk; 0: off
    ct_train_leaf *leaves;  // n_leaves
    int n_leaves;
    int first;  // the chunked part: leaves[first..n_leaves)
    int n_in;   // items the part takes: the tail's input (..., D), then the loss's targets (and weights)
} ct_chunked_loss;

// Finds the tail of t->net's model (t->opts.loss_chunk_size > 0) or leaves
// t->chunked off; refuses, naming the setting and the layer, a model with
// no row-wise tail, a loss that is not a mean over rows, or inputs whose
// rows do not line up.
ct_status ct_chunked_loss_init(ct_trainer *t, ct_error *err);
void ct_chunked_loss_free(ct_chunked_loss *cl);
// The part's forward over every chunk, without a tape: *loss (an f32
// scalar from c's arena) and *weight (what it averaged over). in: the
// part's n_in inputs. key: the device's step key.
ct_status ct_chunked_loss_forward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *in, ct_key key,
                                  ct_tensor *loss, double *weight, ct_error *err);
// The part's backward from seed (d step loss / d its loss; weight: forward's
// *weight): grad_in gets the gradients of its n_in inputs (the first a
// full-size tensor from c's arena; targets and weights none). Weight
// gradients are added into c->grads; c->on_weight_grads is called once per
// layer (after the last chunk), as for one backward.
ct_status ct_chunked_loss_backward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *in, ct_key key, float seed,
                                   double weight, ct_tensor *grad_in, ct_error *err);
// The whole of Serial(model, loss) with the chunked part: the leaves before
// it (with the tape when c->record), then ct_chunked_loss_forward.
// part_in gets the part's inputs (kept for ct_chunked_loss_net_backward).
ct_status ct_chunked_loss_net_forward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *batch, int n_batch,
                                      ct_key key, ct_tensor *part_in, ct_tensor *loss, double *weight,
                                      ct_error *err);
// Its backward: ct_chunked_loss_backward, then the leaves before the part.
ct_status ct_chunked_loss_net_backward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *part_in, int n_batch,
                                       ct_key key, float seed, double weight, ct_error *err);

// The shared part, first in each implementation's struct.
struct ct_trainer {
    const ct_trainer_vt *vt;
    ct_trainer_options opts;
    ct_net net;            // Serial(model, loss) bound to its slabs
    ct_layer *model;       // one reference
    ct_optimizer *opt;     // owned
    ct_device *dev;        // the accelerator: arenas, gradients (counted)
    ct_device *slab_dev;   // where the net and the slots live: dev, or the host
    ct_comm *comm;         // opts.comm, or own_comm
    ct_comm *own_comm;
    int n_local;           // local devices (opts.n_devices)
    int n_global;          // devices over all processes
    int first_global;      // global index of this process's device 0
    int64_t device_rows;   // rows of the batch each device takes
    float *slots;          // optimizer slot slab
    size_t n_slot_floats;
    size_t *slot_offsets;  // per net.params[i], into slots (n_params + 1 entries)
    bool *frozen;          // per net.params[i]
    ct_range *ranges;      // per net.params[i]: its slab range
    const float *grads;    // the last step's combined gradients, or NULL
    ct_train_dev *devs[CT_MAX_LOCAL_DEVICES];  // set by the implementation
    // ct_trainer_eval_loss: one context on dev, made at the first call.
    ct_arena eval_arena;
    ct_ctx eval_ctx;
    bool eval_ready;
    ct_memory_plan plan;  // set by the implementation at construction
    ct_chunked_loss chunked;  // opts.loss_chunk_size (rows 0: off)
};

// The construction both share: checks the options, takes model, loss and
// opt (opt on every path), sets up the comm, initializes the net for one
// device's share of batch_sigs on slab_dev, checks that the loss leaves one
// f32 scalar, and lays out and allocates the slot slab (frozen weights have
// none) on slab_dev. On failure the caller frees t with ct_train_base_free.
ct_status ct_train_base_init(ct_trainer *t, const ct_trainer_vt *vt, ct_layer *model, ct_layer *loss,
                             const ct_tensor *batch_sigs, int n_batch, ct_optimizer *opt, ct_key init_key,
                             ct_device *dev, ct_device *slab_dev, const ct_trainer_options *opts, ct_error *err);
void ct_train_base_free(ct_trainer *t);

// Local device d's arena (on t->dev) and context, and its entry in t->devs.
void ct_train_dev_init(ct_trainer *t, int d, ct_train_dev *dev, ct_arena *arena, ct_ctx *ctx);

// The planning pass's batch: zeros shaped as sigs (f32 items ones, so a
// weighted loss has weight to average over), on the host; free with
// ct_train_plan_batch_free.
ct_status ct_train_plan_batch(const ct_tensor *sigs, int n, ct_tensor *out, ct_error *err);
void ct_train_plan_batch_free(ct_tensor *batch, int n);
// Bytes ct_device_alloc counts for bytes (padded).
size_t ct_train_padded(size_t bytes);
// Ends every local device's arena's measuring and gives it one block of the
// high-water mark; t->plan.activations gets their device bytes.
ct_status ct_train_plan_arenas(ct_trainer *t, ct_arena *const *arenas, ct_error *err);

// The implementations' constructors (t->vt->who names them in messages).
ct_status ct_standard_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs,
                                  int n_batch, ct_optimizer *opt, ct_key init_key, ct_device *dev,
                                  const ct_trainer_options *opts, ct_error *err);
ct_status ct_reversible_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs,
                                    int n_batch, ct_optimizer *opt, ct_key init_key, ct_device *dev,
                                    const ct_trainer_options *opts, ct_error *err);

// This process's rows of a global batch: rows [p B/P, (p+1) B/P) of every
// tensor (views), for process rank of n_proc.
ct_status ct_train_local_rows(const ct_batch *global, int rank, int n_proc, ct_tensor *out, ct_error *err);

// A step's batch against the per-device signatures the net was built for:
// same dtypes and ranks, one batch size that divides by n_local.
ct_status ct_train_check_batch(const ct_trainer *t, const ct_tensor *batch, ct_error *err);

// The loss over every device of every process: sums W_d and L_d * W_d over
// the local devices (t->devs), adds them over the processes, and sets each
// device's seed n_global * W_d / W. Every process takes part, even one that
// failed (failed != CT_OK): it sends a NaN, and every process fails here.
// *mean gets the loss, which may be non-finite (the caller decides).
ct_status ct_train_global_loss(ct_trainer *t, ct_status failed, double *mean, ct_error *err);

// The first failing local device's error (prefixed with the device when
// there are several), or CT_OK.
ct_status ct_train_devices_status(const ct_trainer *t, ct_error *err);

// The mean of n floats over every device: grads[d] is local device d's; the
// result goes to grads[0] (local devices summed in device order, then the
// processes' sums added, then divided by the device count). allreduce false:
// the caller adds over the processes itself (gradient buckets).
ct_status ct_train_mean(const ct_trainer *t, float *const *grads, size_t n, bool allreduce, ct_error *err);
// Divides n floats by the global device count (the last part of the mean).
void ct_train_divide(const ct_trainer *t, float *g, size_t n);

// Zeroes the gradients of frozen weights among params [p_begin, p_end) in
// grad, whose float 0 is slab offset base; returns sum g^2 of grad[0..n).
double ct_train_drop_frozen(const ct_trainer *t, float *grad, size_t base, size_t n, int p_begin, int p_end);
// Scales g[0..n) by ct_clip_factor(norm, clip) (nothing when it is 1).
void ct_train_clip(float *g, size_t n, double norm, float clip);
// sum x^2 in double (ct_sum_squares).
double ct_train_sum_squares(const float *x, size_t n);

// After a failure on some process, every process must still call the same
// collectives: each says here whether it failed (one f64 allreduce over
// comm). Returns this process's own error (failed, whose message is in
// err), or, where it did not fail, CT_ERR_STATE with the message fmt (which
// says another process failed), or CT_OK when none failed.
ct_status ct_train_agree(ct_comm *comm, ct_status failed, ct_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// The same for a trainer's step: the message names `where` it stopped.
ct_status ct_train_agree_on_failure(const ct_trainer *t, ct_status failed, const char *where, ct_error *err);

// The checking re-run of a non-finite step. ct_train_nonfinite_begin sets
// found to "nothing found on this process" and returns true when a batch
// item holds a non-finite value (found then names it: no layer's doing).
// ct_train_first_finding describes the first local device whose pass failed
// into found; false if every device finished.
bool ct_train_nonfinite_begin(const ct_tensor *batch, int n_batch, ct_error *found);
bool ct_train_first_finding(const ct_trainer *t, ct_error *found);
// A value for a message: NaN without its sign bit.
double ct_train_shown(double v);

// The key of the Loop's step `step` (1-based) from the loop key:
// fold_in(split(key, 1), low 32 bits of step), and, past 2^32 steps, the
// high 32 bits folded in after (so no two steps share dropout masks, and
// every step below 2^32 keeps the key earlier versions gave it: a resumed
// run's keys do not change).
ct_key ct_train_step_key(ct_key loop_key, int64_t step);

#endif
