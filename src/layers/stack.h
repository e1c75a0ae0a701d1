// The data stack as combinators walk it, shared by Serial (combinators.c)
// and ReversibleSerial (reversible.c). Internal to src/layers/.
#ifndef CTRAX_LAYERS_STACK_H
#define CTRAX_LAYERS_STACK_H

#include <string.h>

#include "ctrax/layers/layer_author.h"

// The deepest stack a Serial may build while running its sublayers.
#define CT_STACK_MAX (2 * CT_LAYER_MAX_IO)

// Replaces the top n_pop items of stack (depth items, top at index 0) by the
// n_push items of top. Returns the new depth, or -1 if it would overflow.
static inline int ct_stack_replace(ct_tensor *stack, int depth, int n_pop, const ct_tensor *top, int n_push) {
    int new_depth = depth - n_pop + n_push;
    if (new_depth > CT_STACK_MAX) return -1;
    memmove(stack + n_push, stack + n_pop, (size_t)(depth - n_pop) * sizeof *stack);
    memcpy(stack, top, (size_t)n_push * sizeof *stack);
    return new_depth;
}

// Serial's init, forward and backward: the sublayers in order over the
// stack (backward in reverse), sublayer i with ct_key_split(key, i).
ct_status ct_serial_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                         ct_error *err);
ct_status ct_serial_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err);
ct_status ct_serial_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                             ct_key key, ct_error *err);

#endif
