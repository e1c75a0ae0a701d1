// Writing layers and running them by hand: the layer vtable and struct, the
// context of a forward/backward pass with its tape, and the net that binds a
// layer tree to its parameter slabs. The user API is layer.h; trainers,
// optimizers and layer implementations include this one.
//
// A layer takes n_in tensors off the top of the stack and pushes n_out. Its
// life has two phases:
//   init     from input signatures (shape + dtype, no data) and a key, the layer
//            checks shapes, declares its weights and state (shape, initializer,
//            key) and returns its output signatures. No data flows yet.
//   forward  computes outputs from inputs and the weights in the slab, saving
//            what backward needs on the step's tape (LIFO), and
//   backward pops what forward saved, adds (+=) into its weight gradients in
//            the gradient slab, and returns the gradients of its inputs.
// A layer instance used in two places is initialized once, owns one set of
// weights, and gets the gradients of both uses added together.
//
// Stack order: in[0] is the top of the stack (Trax's convention), so a layer
// with n_in = 2 called on stack [a, b, c] sees in = {a, b} and leaves
// [out..., c].
//
// Gradients: a gradient tensor whose data is NULL means "zero" (an output no
// one used, or an input that takes no gradient, such as int32 token ids).
// Layers accept such gradients (ct_ctx_grad_or_zeros) and may return them.
//
// Writing a new layer: one file with a vtable, init, forward, backward, a
// constructor that calls ct_layer_new, and a check of its gradient against
// finite differences (ct_gradcheck, gradcheck.h: the check every layer of
// ctrax passes). examples/custom_layer.c is one, start to end: a layer with
// weights, one through ct_fn, their checks and their training. A weightless
// layer with one forward/backward pair of plain functions is simpler still:
// ct_fn (combinators.h). A loss or metric layer returns a scalar (rank 0) and
// sets ct_ctx.loss_weight.
//
// Stack order, sharing: layer.h.
#ifndef CTRAX_LAYERS_LAYER_AUTHOR_H
#define CTRAX_LAYERS_LAYER_AUTHOR_H

#include "ctrax/layers/layer.h"
#include "ctrax/layers/profile.h"

#ifdef __cplusplus
extern "C" {
#endif

// How a weight is filled at init. fan_in/fan_out come from the weight's
// shape: for rank >= 2, fan_in = product of all dims but the last, fan_out =
// last dim.
typedef enum ct_init_kind {
    CT_INIT_ZEROS = 0,
    CT_INIT_ONES,
    CT_INIT_GLOROT_UNIFORM,  // U(-a, a), a = scale * sqrt(6 / (fan_in + fan_out))
    CT_INIT_NORMAL,          // N(0, scale^2)
    CT_INIT_UNIFORM,         // U(-scale, scale)
    CT_INIT_SINUSOID,        // a (T, D) table of Vaswani et al.'s sinusoids (scale unused)
} ct_init_kind;

typedef struct ct_initializer {
    ct_init_kind kind;
    float scale;
} ct_initializer;

// One weight or state tensor of a layer: where it lives in its slab and how it
// is filled at init.
typedef struct ct_param {
    char name[CT_NAME_MAX];  // "kernel", "bias", ...
    char *full_name;         // "<layer path>/<name>", the checkpoint name
    ct_tensor sig;           // shape and dtype (f32)
    size_t offset;           // into the slab, in floats
    ct_initializer init;
    ct_key key;
    bool cache;  // state a forward recomputes (ct_layer_declare_cache)
} ct_param;

typedef struct ct_layer_vtable {
    const char *type;  // "Dense", "Serial", ...
    // Checks in_sigs (n_in of them), declares weights and state with
    // ct_layer_declare_*, and writes n_out output signatures.
    ct_status (*init)(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in_sigs, ct_tensor *out_sigs,
                      ct_key key, ct_error *err);
    // Computes out (n_out tensors) from in: the layer sets each out[i]'s
    // dtype and shape and allocates its data (ct_ctx_alloc), and pushes on
    // the tape what backward needs.
    ct_status (*forward)(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                         ct_error *err);
    // From grad_out (n_out) computes grad_in (n_in), adding into weight
    // gradients. It pops what forward pushed, and sets each grad_in[i] to
    // in[i]'s signature with data it allocates, or with data NULL for a zero
    // gradient (int32 inputs). key is the one forward got, so a layer may
    // recompute instead of saving.
    ct_status (*backward)(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                          ct_key key, ct_error *err);
    // Frees l->hp contents if needed (NULL: ct_free(l->hp) is enough).
    void (*destroy)(ct_layer *l);
    // Reversible layers only (NULL for others). reverse computes the inputs
    // from the outputs; reverse_and_grad also runs backward on the way (it
    // recomputes what forward would have saved, with the same key), so no
    // tape is needed. See include/ctrax/layers/reversible.h.
    ct_status (*reverse)(ct_layer *l, ct_ctx *c, const ct_tensor *out, ct_tensor *in, ct_key key,
                         ct_error *err);
    ct_status (*reverse_and_grad)(ct_layer *l, ct_ctx *c, const ct_tensor *out,
                                  const ct_tensor *grad_out, ct_tensor *in, ct_tensor *grad_in,
                                  ct_key key, ct_error *err);
} ct_layer_vtable;

struct ct_layer {
    const ct_layer_vtable *vt;
    char name[CT_NAME_MAX];  // shown in paths; the type unless renamed
    int n_in, n_out;
    ct_layer **sub;  // sublayers, owned (one reference each)
    int n_sub;
    void *hp;  // hyperparameters and anything the layer type keeps, owned
    int refcount;

    // Set by the first init.
    bool initialized;
    char *path;  // "Serial/Branch[1]/Dense[0]": where the layer was first used
    ct_tensor in_sigs[CT_LAYER_MAX_IO];
    ct_tensor out_sigs[CT_LAYER_MAX_IO];
    ct_param *weights;  // own weights, contiguous in the weight slab
    int n_weights;
    ct_param *states;  // own state, contiguous in the state slab
    int n_states;
    size_t w_begin, w_end;  // the weight slab range of this layer and its subtree
    size_t s_begin, s_end;  // the state slab range of this layer and its subtree
};

// ---- Building layers -----------------------------------------------------

// A new layer with one reference, taking ownership of hp and of one
// reference to each of the n_sub sublayers.
ct_layer *ct_layer_new(const ct_layer_vtable *vt, const char *name, int n_in, int n_out, void *hp,
                       ct_layer **sub, int n_sub);

// ---- Init ---------------------------------------------------------------

// Initializes l (and its subtree) for inputs in_sigs, writing out_sigs.
// index is l's position in its parent (-1 for a root); it names l in paths.
// A layer already initialized checks that in_sigs equal those of its first
// use and returns the same out_sigs.
ct_status ct_layer_init(ct_layer *l, int index, ct_init_ctx *ic, const ct_tensor *in_sigs,
                        ct_tensor *out_sigs, ct_key key, ct_error *err);
// Declares a weight of l (call from init). Weights of one layer are laid out
// in declaration order; returns its index in l->weights.
int ct_layer_declare_weight(ct_layer *l, ct_init_ctx *ic, const char *name, ct_tensor sig,
                            ct_initializer init, ct_key key);
int ct_layer_declare_state(ct_layer *l, ct_init_ctx *ic, const char *name, ct_tensor sig,
                           ct_initializer init, ct_key key);
// Declares state that forward recomputes when it is stale (a per-batch
// cache, zeros at first): checkpointed like other state, but a resume that
// finds it with another shape (another device count) keeps the zeros.
int ct_layer_declare_cache(ct_layer *l, ct_init_ctx *ic, const char *name, ct_tensor sig);

// Sets err to "layer PATH (op): message" and returns code. Every error a
// layer raises goes through this, so messages always say where.
ct_status ct_layer_fail(const ct_layer *l, ct_error *err, ct_status code, const char *op,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));
// Checks that in_sigs[i] has the given rank (or at least min_ndim if
// ndim < 0 is passed as -min_ndim) and dtype; fails with the path and shape.
ct_status ct_layer_check_input(const ct_layer *l, const ct_tensor *in_sigs, int i, ct_dtype dtype,
                               int ndim, ct_error *err);

// ---- Running --------------------------------------------------------------

// The context of one forward/backward pass: where activations go, the slabs,
// the mode, and the tape. One per replica; reused from step to step.
struct ct_ctx {
    ct_arena *arena;
    float *weights;  // the weight slab
    float *grads;    // the gradient slab (NULL when not training)
    float *state;    // the state slab
    bool train;      // training mode: dropout and the like are active
    bool record;     // forward saves to the tape (needed for backward)
    ct_tensor *tape;
    int tape_len, tape_cap;
    // One mark per recorded forward not yet taken back, in the tape's order:
    // which layer, and the tape length before and after its forward.
    // ct_layer_backward checks that it takes back the newest one and leaves
    // the tape where that forward found it, so a layer that pops too few or
    // too many records is named there instead of corrupting the backward of
    // the layer before it.
    struct ct_tape_mark {
        const ct_layer *layer;
        int begin, end;
    } *marks;
    int n_marks, marks_cap;
    // Set by loss and metric layers: what their scalar averages over (the
    // sum of the weights, or the count of items or sequences; 0 when every
    // weight is 0, and the scalar is then 0). Replicas of a
    // data-parallel step weight their scalars by it, so N devices with B/N
    // examples each give what one device gives with B.
    double loss_weight;
    // Called by ct_layer_backward after a layer with weights of its own has
    // added its weight gradients (a shared layer: once per use). A trainer
    // uses it to send finished gradients while backward goes on.
    void (*on_weight_grads)(void *user, const ct_layer *l);
    void *on_weight_grads_user;
    // Anomaly mode (PyTorch's detect_anomaly): ct_layer_forward checks each
    // layer's f32 outputs, and ct_layer_backward its input gradients and
    // its own weight gradients, and the first that holds a NaN or Inf fails
    // with CT_ERR_NONFINITE naming the layer by path. Sublayers return
    // before their parent is checked, so the layer named is the innermost
    // one whose inputs were finite but whose outputs were not. A pass over
    // every output: the trainers set it only to re-run a step whose loss or
    // gradient went non-finite, never on a healthy step.
    bool check_finite;
    // The global index of the first row of the batch this context runs: a
    // data-parallel replica's rows are rows first_row.. of the global batch
    // (0 for a whole batch). Layers that draw randomness per example
    // (LSHSelfAttention's rotations) number examples by it, so N devices
    // draw what one device draws for the whole batch.
    int64_t first_row;
    // Where the time goes (profile.h): when set, ct_layer_forward and
    // ct_layer_backward add each layer's self time to it. NULL: off.
    ct_profile *profile;
};

// A ctx with no slabs, recording (c->record true), in eval mode.
void ct_ctx_init(ct_ctx *c, ct_arena *arena);
void ct_ctx_free(ct_ctx *c);

// Runs l's forward (and, when c->record, marks the tape for its backward).
ct_status ct_layer_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                           ct_error *err);
// Runs l's backward, which takes back l's newest recorded forward on c: a
// backward with no such forward, or one that does not pop exactly what its
// forward pushed, fails naming the layer (CT_ERR_STATE).
ct_status ct_layer_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                            ct_key key, ct_error *err);

// Pointers to a layer's own weight i, its gradient, and state i, i in
// declaration order (ct_layer_declare_*); an i the layer did not declare
// aborts naming the layer.
void ct_layer_abort_index(const ct_layer *l, const char *what, int i, int n) __attribute__((noreturn));
static inline float *ct_weight(const ct_ctx *c, const ct_layer *l, int i) {
    if (i < 0 || i >= l->n_weights) ct_layer_abort_index(l, "weight", i, l->n_weights);
    return c->weights + l->weights[i].offset;
}
static inline float *ct_weight_grad(const ct_ctx *c, const ct_layer *l, int i) {
    if (i < 0 || i >= l->n_weights) ct_layer_abort_index(l, "weight", i, l->n_weights);
    return c->grads + l->weights[i].offset;
}
static inline float *ct_state(const ct_ctx *c, const ct_layer *l, int i) {
    if (i < 0 || i >= l->n_states) ct_layer_abort_index(l, "state", i, l->n_states);
    return c->state + l->states[i].offset;
}

// Anomaly mode's backward check, for a layer run by another entry point than
// ct_layer_backward (a trainer's reverse_and_grad): when c->check_finite,
// fails with CT_ERR_NONFINITE if one of l's own weight gradients or
// grad_in[0..l->n_in) holds a NaN or Inf, naming which and where. CT_OK
// otherwise.
ct_status ct_ctx_check_grads(const ct_ctx *c, const ct_layer *l, const ct_tensor *grad_in, ct_error *err);

// Allocates data for t (whose dtype and shape are set) from the arena.
ct_status ct_ctx_alloc(ct_ctx *c, ct_tensor *t, ct_error *err);
// Same, zeroed.
ct_status ct_ctx_zeros(ct_ctx *c, ct_tensor *t, ct_error *err);
// Returns g if it has data, else a zeroed tensor with g's signature.
ct_status ct_ctx_grad_or_zeros(ct_ctx *c, ct_tensor *g, ct_error *err);

// Saves a tensor descriptor (not a copy of the data: the data must live to
// the end of the step) on the tape, if c->record. Pops return them in
// reverse order. A layer's backward pops exactly what its forward pushed
// (ct_layer_backward fails naming the layer otherwise, CT_ERR_STATE).
ct_status ct_tape_push(ct_ctx *c, const ct_tensor *t, ct_error *err);
ct_tensor ct_tape_pop(ct_ctx *c);
// Drops the tape from tape_len on, with the marks of the forwards that
// pushed there: after a pass that failed, or to start a new step on c.
void ct_tape_truncate(ct_ctx *c, int tape_len);

// ---- The net: a layer tree bound to its slabs -----------------------------

// The slabs are flat float arrays; each layer owns contiguous ranges in them
// (ct_layer.w_begin/w_end).
struct ct_net {
    ct_layer *root;  // one reference held
    ct_device *dev;
    int n_in, n_out;
    ct_tensor in_sigs[CT_LAYER_MAX_IO];
    ct_tensor out_sigs[CT_LAYER_MAX_IO];
    size_t n_weights;  // floats in the weight slab
    size_t n_state;    // floats in the state slab
    float *weights, *grads, *state;
    ct_param **params;  // every weight, in slab order (shared layers once)
    int n_params;
    ct_param **state_params;
    int n_state_params;
};

// Runs the init pass of root for in_sigs (n_in of them) with key, allocates
// the slabs on dev, and fills the weights and state from their initializers.
// Takes a new reference to root. A layer belongs to one net at a time: a tree
// holding a layer already initialized in another live net is refused
// (CT_ERR_STATE); ct_net_free releases the tree for a new net.
ct_status ct_net_init(ct_net *net, ct_layer *root, const ct_tensor *in_sigs, int n_in, ct_key key,
                      ct_device *dev, ct_error *err);
void ct_net_free(ct_net *net);
// A ctx that runs net's layers on its slabs, in training or eval mode;
// it records the tape (c->record) in training mode only.
void ct_net_bind(const ct_net *net, ct_ctx *c, bool train);
// Sets the gradient slab to zero.
void ct_net_zero_grads(ct_net *net);
// Finds a weight by full name, or NULL.
const ct_param *ct_net_find_param(const ct_net *net, const char *full_name);

#ifdef __cplusplus
}
#endif
#endif
