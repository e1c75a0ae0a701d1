// Reversible layers: layers that can compute their inputs from their outputs,
// so a stack of them can be trained without keeping activations (RevNet,
// Reformer). Semantics follow Trax's trax/layers/reversible.py
// (../shared/SEMANTICS.md).
//
// Every reversible layer is also an ordinary layer: forward and backward use
// the tape as any other layer does, so it runs in the standard Trainer and
// passes the gradient checker. What it adds are the two vtable slots of
// layer.h, with this contract:
//
//   reverse(l, c, out, in, key, err)
//       From the layer's n_out outputs, writes its n_in inputs. key is the
//       key the forward got. The recomputation runs in c's mode (c->train
//       decides whether dropout is active, as in the forward) on c->weights,
//       and reads state from c->state, which the caller must hold as it was
//       AFTER the forward (Trax's order; the ReversibleTrainer puts that
//       state back before the recomputation and again after it). Leaves the
//       tape as it found it. in[i] may alias out[j] (an item that passes
//       through unchanged) and is otherwise allocated from c->arena.
//
//       Why after: in a stack the recomputation's inputs are rebuilt by
//       subtraction (out[0] - f(ctx) of a later half-residual), equal to the
//       forward's only up to rounding, so whatever a layer derives from its
//       input by a discrete choice (LSHSelfAttention's buckets, an argmax)
//       could come out different if computed again; taken from the state the
//       forward left, it is bitwise the forward's. So a stateful layer must
//       recognise its own recomputation by that state and then reuse what
//       it stored, neither advancing the state (counting, drawing, hashing
//       again) nor using the advanced values: e.g. it tags its state with
//       the key of its last training-mode forward, and a training-mode
//       forward under the tagged key is the recomputation
//       (LSHSelfAttention tags its buckets with the step key and T; see
//       Counter in tests/test_reversible_trainer.c). A layer that starts
//       afresh from the state it finds (as it would from the state before
//       the forward) gets the forward's result only on bitwise-equal
//       inputs.
//
//   reverse_and_grad(l, c, out, grad_out, in, grad_in, key, err)
//       reverse, plus backward on the way: from the outputs and their
//       gradients (grad_out[i].data == NULL means zero), writes the inputs,
//       the gradients of the inputs (NULL data for inputs that take none,
//       such as int32 masks) and adds into the weight gradients in c->grads,
//       exactly as forward-then-backward with the same key would. It
//       recomputes what forward would have saved, using the tape for that
//       recomputation only (it is balanced on return; c->record is set for
//       the call and restored), so no tape from the forward is needed. The
//       same rules as backward hold: grad_out is never written; gradients
//       may alias one another.
//
// Keys: ReversibleSerial gives sublayer i ct_key_split(key, i), as Serial
// does; ReversibleHalfResidual gives its residual function f (a Serial of the
// layers it was built from) ct_key_split(key, 0), as Trax does. forward,
// reverse and reverse_and_grad derive keys the same way, so a recomputation
// draws the same dropout masks.
#ifndef CTRAX_LAYERS_REVERSIBLE_H
#define CTRAX_LAYERS_REVERSIBLE_H

#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// Half of a RevNet residual: [acc, ctx...] -> [acc + f(ctx...), ctx...],
// where f = Serial(layers) takes the n_ctx = f->n_in context items and its
// top output (f32, the shape of acc) is the residual; any further outputs of
// f are dropped. n_in = n_out = 1 + n_ctx. Reverse: acc = out[0] - f(ctx).
// Gradients: acc's gradient passes through; each context item gets its
// incoming gradient plus f's input gradient; f's weights get f's weight
// gradients. Context items that take no gradient (int32) pass through with
// none. Takes ownership of the layers, as the combinators do.
ct_layer *ct_reversible_half_residual(int n, ct_layer **layers);

// [a, b] -> [b, a], its own inverse.
ct_layer *ct_reversible_swap(void);

// Runs reversible layers in order, as Serial (sublayer i gets
// ct_key_split(key, i); n_in is the deepest the sublayers reach); reverse
// walks them backwards with the same keys. Every sublayer must be reversible
// (have reverse_and_grad); init fails naming the first that is not.
ct_layer *ct_reversible_serial(int n, ct_layer **layers);

// True if l implements the reversible slots.
bool ct_layer_is_reversible(const ct_layer *l);

// Dispatch to the vtable slots (programmer error if l is not reversible).
ct_status ct_layer_reverse(ct_layer *l, ct_ctx *c, const ct_tensor *out, ct_tensor *in, ct_key key,
                           ct_error *err);
ct_status ct_layer_reverse_and_grad(ct_layer *l, ct_ctx *c, const ct_tensor *out,
                                    const ct_tensor *grad_out, ct_tensor *in, ct_tensor *grad_in,
                                    ct_key key, ct_error *err);

#ifdef __cplusplus
}
#endif
#endif
