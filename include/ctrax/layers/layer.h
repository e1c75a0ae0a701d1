// Layers and nets as a user building and running models sees them: opaque
// handles, references, names, and the sizes of a net. Layers are built by
// the constructors of core.h, combinators.h, reversible.h and models.h,
// and trained by a trainer (trainer.h) or the Loop (loop.h).
//
// A layer takes n_in tensors off the top of a data stack and pushes n_out;
// in[0] is the top of the stack (Trax's convention). A layer instance used in
// two places is initialized once, owns one set of weights, and gets the
// gradients of both uses added together.
//
// Writing a layer, or running one by hand (the vtable, the forward/backward
// context, the tape, a net's slabs): ctrax/layers/layer_author.h.
#ifndef CTRAX_LAYERS_LAYER_H
#define CTRAX_LAYERS_LAYER_H

#include <stdbool.h>
#include <stddef.h>
#include "ctrax/core/error.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// Most items a layer takes from or pushes onto the stack, and the deepest a
// Serial's stack may get.
#define CT_LAYER_MAX_IO 16
#define CT_NAME_MAX 32

typedef struct ct_layer ct_layer;
typedef struct ct_ctx ct_ctx;
typedef struct ct_init_ctx ct_init_ctx;
// A layer tree initialized for given inputs, with its weight, gradient and
// state slabs on a device (ct_trainer_net gives a trainer's).
typedef struct ct_net ct_net;

// ---- Building layers -----------------------------------------------------

// Adds a reference (to use the same layer, with the same weights, twice) and
// returns l.
ct_layer *ct_layer_ref(ct_layer *l);
// Drops a reference; the last one frees the layer and its sublayers.
void ct_layer_free(ct_layer *l);
// Renames l (paths and checkpoint names use the name); returns l.
ct_layer *ct_layer_rename(ct_layer *l, const char *name);

// The layer's name ("Dense" unless renamed), its type ("Dense", "Serial",
// ...), and its path once initialized ("Serial/Branch[1]/Dense[0]": where it
// was first used; its name before).
const char *ct_layer_name(const ct_layer *l);
const char *ct_layer_type(const ct_layer *l);
const char *ct_layer_path(const ct_layer *l);
// Items taken from and pushed onto the stack.
int ct_layer_n_in(const ct_layer *l);
int ct_layer_n_out(const ct_layer *l);

// ---- A net's sizes and weights -------------------------------------------

// Floats in the weight slab (the model's parameter count) and the state slab.
size_t ct_net_n_weights(const ct_net *net);
size_t ct_net_n_state(const ct_net *net);
// The root layer.
const ct_layer *ct_net_root(const ct_net *net);
// Weights (slab order, shared layers once) and state tensors: how many, and
// the i-th one's checkpoint name and tensor (f32, data pointing into the
// slab, valid while the net lives).
int ct_net_weight_count(const ct_net *net);
const char *ct_net_weight_name(const ct_net *net, int i);
ct_tensor ct_net_weight(const ct_net *net, int i);
int ct_net_state_count(const ct_net *net);
const char *ct_net_state_name(const ct_net *net, int i);
ct_tensor ct_net_state(const ct_net *net, int i);

#ifdef __cplusplus
}
#endif
#endif
