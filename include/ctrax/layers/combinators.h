// Combinators: layers whose forward and backward compose their sublayers over
// the stack, and the weightless stack layers. Semantics follow Trax
// (../shared/SEMANTICS.md); keys are split evenly over sublayers, sublayer i
// getting ct_key_split(key, i).
//
// Constructors take ownership of one reference to each layer passed; pass
// ct_layer_ref(x) to use x in a second place with the same weights. Lists are
// written with CT_LAYERS: ct_serial(CT_LAYERS(ct_dense(64), ct_relu())).
#ifndef CTRAX_LAYERS_COMBINATORS_H
#define CTRAX_LAYERS_COMBINATORS_H

#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Expands to "count, array" for a list of layers.
#define CT_LAYERS(...) \
    (int)(sizeof((ct_layer *[]){__VA_ARGS__}) / sizeof(ct_layer *)), (ct_layer *[]){__VA_ARGS__}

// Runs layers in order; nested unnamed Serials are flattened into this one.
// n_in is the deepest the sublayers reach into the stack. With no layers it
// is Trax's one-in one-out no-op: [x] -> [x].
ct_layer *ct_serial(int n, ct_layer **layers);
// Sublayer i takes its own consecutive span of inputs.
ct_layer *ct_parallel(int n, ct_layer **layers);
// Each layer sees copies of the top inputs: Serial(Select, Parallel), named
// "Branch".
ct_layer *ct_branch(int n, ct_layer **layers);
// Serial(Branch(shortcut, layer), Add), named "Residual", layer being the
// one layer given or else Serial(layers) (as Trax); a NULL shortcut is the
// identity.
ct_layer *ct_residual(int n, ct_layer **layers, ct_layer *shortcut);

// Copies stack items: out[i] = in[indices[i]]; n_in = 0 means max index + 1.
ct_layer *ct_select(int n_indices, const int *indices, int n_in);
ct_layer *ct_dup(void);   // [a] -> [a, a]
ct_layer *ct_swap(void);  // [a, b] -> [b, a]
ct_layer *ct_drop(void);  // [a] -> []
ct_layer *ct_add(void);       // [a, b] -> [a + b], same shapes
ct_layer *ct_multiply(void);  // [a, b] -> [a * b], same shapes
// Joins n_items f32 tensors along axis (negative counts from the end).
ct_layer *ct_concatenate(int n_items, int axis);
// Splits one f32 tensor into n_items equal parts along axis.
ct_layer *ct_split(int n_items, int axis);

// Trax's BatchLeadingAxes(Chunk(layer, chunk_size)), as ReformerLM's
// ff_chunk_size uses it: (..., D) -> (..., D'). The input is viewed as
// (n, D) rows and layer (one in, one out) runs on (chunk_size, D) chunks --
// one chunk of n rows when chunk_size does not divide n, as Trax -- chunk i
// with ct_key_fold_in(key, i) and the same weights, so gradients add up.
// Backward recomputes each chunk's forward, so the peak activation memory is
// one chunk's. Equals layer on the whole input when layer treats rows alike
// and draws no randomness (dropout 0). chunk_size < 1 returns layer itself.
ct_layer *ct_chunk(ct_layer *layer, int chunk_size);

// A weightless layer from plain functions over tensors. out tensors arrive
// allocated with the signatures shape() gave; grad_in tensors arrive zeroed
// (f32 inputs) and backward adds into them. The layer saves its inputs and
// outputs on the tape for backward.
typedef struct ct_fn_spec {
    const char *name;
    int n_in, n_out;
    // Output signatures from input signatures; NULL means every output has
    // the signature of in[0]. Return an error message through err.
    ct_status (*shape)(const ct_tensor *in, ct_tensor *out, const void *user, ct_error *err);
    void (*forward)(const ct_tensor *in, ct_tensor *out, const void *user);
    // NULL: the inputs take zero gradients.
    void (*backward)(const ct_tensor *in, const ct_tensor *out, const ct_tensor *grad_out,
                     ct_tensor *grad_in, const void *user);
    const void *user;  // handed to the three functions; not owned
} ct_fn_spec;
ct_layer *ct_fn(const ct_fn_spec *spec);

#ifdef __cplusplus
}
#endif
#endif
