// What the layer implementations of src/layers/ share beyond layer_author.h:
// building a layer from a hyperparameter struct, the tape of signatures, and
// the elementwise sum gradients and residuals need. Internal to src/layers/.
#ifndef CTRAX_LAYERS_INTERNAL_H
#define CTRAX_LAYERS_INTERNAL_H

#include "ctrax/layers/layer_author.h"

// A new layer named by its type (vt->type), with no sublayers and a
// ct_malloc'ed copy of the hp_size bytes at hp as its hyperparameters (NULL,
// 0: none).
ct_layer *ct_layer_new_hp(const ct_layer_vtable *vt, int n_in, int n_out, const void *hp, size_t hp_size);

// Saves t's signature (shape and dtype, no data) on the tape: what a
// backward needs to build the zero or the shape of an input's gradient.
ct_status ct_tape_push_sig(ct_ctx *c, const ct_tensor *t, ct_error *err);

// Pops the input signature a one-input forward saved (ct_tape_push_sig) into
// grad_in[0], which then stands for a zero gradient (NULL data). Returns
// whether a gradient flows in (grad_out[0] has data): if not, grad_in[0] is
// the answer.
bool ct_tape_pop_input_sig(ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in);

// *sum = a + b elementwise (f32, a's signature): over a or b when that was
// donated to the running layer (ct_arena_donated: nothing outside the layer
// reads it after), else in fresh memory from the ctx, never over an operand
// that may be aliased elsewhere (gradients are). The layer itself must
// neither read nor return a donated operand's memory after the sum (Select
// and Add return only the sums).
ct_status ct_ctx_sum(ct_ctx *c, const ct_tensor *a, const ct_tensor *b, ct_tensor *sum, ct_error *err);
// The same, but never over b, even donated: for a layer whose b may be
// memory it also returns as another result (a ReversibleHalfResidual's f
// can hand back a context, which the half passes on, or the accumulator's
// gradient, which it passes on as that input's).
ct_status ct_ctx_sum_keep_b(ct_ctx *c, const ct_tensor *a, const ct_tensor *b, ct_tensor *sum, ct_error *err);

#endif
