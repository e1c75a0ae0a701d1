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

// What a walk over a Serial's sublayers runs on each.
typedef enum ct_stack_op { CT_STACK_INIT, CT_STACK_FORWARD, CT_STACK_BACKWARD, CT_STACK_REVERSE } ct_stack_op;

// Runs op on each sublayer of l over the stack that starts as top: in order
// for init and forward (a sublayer takes its n_in items and pushes its
// n_out), in reverse order for backward and reverse (n_out taken, n_in
// pushed); sublayer i gets ct_key_split(key, i), and ic (init) or c (the
// others). result gets what is left: l->n_out items, or l->n_in going back.
ct_status ct_stack_walk(ct_layer *l, ct_stack_op op, ct_init_ctx *ic, ct_ctx *c, const ct_tensor *top,
                        ct_tensor *result, ct_key key, ct_error *err);

// After a walk's sublayer: gives back to the arena what the walk allocated
// since mark that neither the depth stack items nor the tape records pushed
// since tape_from point to, moving live tensors down when that frees at
// least min_gain times what it copies (combinators.c says which gain).
void ct_stack_keep_live(ct_ctx *c, ct_arena_mark mark, ct_tensor *stack, int depth, int tape_from,
                        size_t min_gain);

// The arity of n layers run in sequence: *n_in is the deepest they reach
// into the stack, *n_out what they leave above that depth.
void ct_stack_arity(int n, ct_layer *const *layers, int *n_in, int *n_out);

// Serial's init, forward and backward: ct_stack_walk.
ct_status ct_serial_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                         ct_error *err);
ct_status ct_serial_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err);
ct_status ct_serial_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                             ct_key key, ct_error *err);

#endif
