// memset and memcpy for large buffers, shared among the OpenMP threads. The
// step's zeroing and moving (the gradient slab, zeroed tensors, the arena's
// compaction) ran on one thread while the others spun: at bench config A,
// counted by caller over 11 steps, 44 MB moved (ct_arena_keep), 32 MB
// zeroed (ct_arena_calloc) and the 13 MB slab, a step.
#ifndef CTRAX_CORE_BULK_H
#define CTRAX_CORE_BULK_H

#include <stddef.h>

// p[0 .. n) = 0, the same bytes as memset.
void ct_bulk_zero(void *p, size_t n);
// dst[0 .. n) = src[0 .. n) for buffers that do not overlap (memcpy's rule).
void ct_bulk_copy(void *dst, const void *src, size_t n);

#endif
