// What SelfAttention (efficient_attention.c) and LSHSelfAttention
// (lsh_attention.c) share: per-head weights, Trax's output (channel)
// dropout and the output side of backward. Internal to src/layers/.
#ifndef CTRAX_LAYERS_ATTENTION_INTERNAL_H
#define CTRAX_LAYERS_ATTENTION_INTERNAL_H

#include "ctrax/layers/layer_author.h"

// Declares H weights "<name>[h]" (rows, cols) each, uniform in [-limit,
// limit], head h's from key split(split(key, h), which); returns the index
// of the first. The heads lie one after another: the kernels read them as
// one (H, rows, cols) array.
int ct_attention_declare_heads(ct_layer *l, ct_init_ctx *ic, const char *name, int H, int64_t rows, int64_t cols,
                               float limit, ct_key key, uint32_t which);

// y (N, D) *= the output dropout's (D,) channel factors from key: channel i
// kept iff ct_random_bits(key, i) >= ceil(rate 2^32), kept ones scaled by
// 1 / (1 - rate).
void ct_attention_channel_dropout(float *y, int64_t N, int64_t D, ct_key key, float rate);

// The output side of backward: dy (B,T,D) through the output dropout (rate,
// from key) and the heads' output weights (weight wo, (H, dv, D)) into *dout
// (B,H,T,dv), fresh, shaped as the forward's o; adds into wo's gradient.
ct_status ct_attention_backward_output(ct_layer *l, ct_ctx *c, int wo, float rate, const ct_tensor *dy,
                                       const ct_tensor *o, ct_tensor *dout, ct_key key, ct_error *err);

// Checks the two dropout rates (init): each in [0, 1).
ct_status ct_attention_check_dropouts(const ct_layer *l, float attention_dropout, float output_dropout, ct_error *err);
// At init and every forward and backward (op; a forward may see another
// length than init's, and an empty init bounds nothing): the window of 1 +
// before + after chunks may wrap round the n_chunks of the input (as Trax's
// look_adjacent), at most to 2 n_chunks + 1: a wider one only repeats
// chunks, at a cost that grows with it (n_chunks_before = 10^6 ran for
// hours). An empty input (n_chunks 0) has no chunk to repeat: any window
// passes.
ct_status ct_attention_check_window(const ct_layer *l, int64_t n_chunks, int before, int after, const char *op,
                                    ct_error *err);

// Checks a masked layer's mask input against x (B, T, D) (init and
// forward): shape (B, T), dtype f32 or int32.
ct_status ct_attention_check_mask(const ct_layer *l, const ct_tensor *x, const ct_tensor *mask, const char *op,
                                  ct_error *err);
// The kernels' view of a checked mask: *f (B, T) f32, 0 = padding. An f32
// mask is used as it is; an int32 one is converted into the arena (0 -> 0,
// anything else -> 1).
ct_status ct_attention_mask_f32(ct_ctx *c, const ct_tensor *mask, ct_tensor *f, ct_error *err);

// The end of a forward: with a tape, pushes x, the mask input (when mask is
// not NULL) then the n per-head tensors t (backward's ct_attention_tape_pop
// takes them back); without one, frees everything allocated since before
// (the per-head tensors die here).
ct_status ct_attention_tape_push(ct_ctx *c, const ct_tensor *x, const ct_tensor *mask, const ct_tensor *t, int n,
                                 ct_arena_mark before, ct_error *err);
// The start of a backward: pops what ct_attention_tape_push pushed into t
// (n), *mask (when not NULL) and *x, sets grad_in[0] to x's signature (a zero
// gradient) and grad_in[1] to the mask's (it takes no gradient: data NULL),
// and returns whether a gradient flows in (grad_out[0] has data).
bool ct_attention_tape_pop(ct_ctx *c, ct_tensor *t, int n, ct_tensor *x, ct_tensor *mask, const ct_tensor *grad_out,
                           ct_tensor *grad_in);

#endif
