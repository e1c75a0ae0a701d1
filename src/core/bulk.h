// memset and memcpy for large buffers, shared among the OpenMP threads: the
// step's serial zeroing and moving (the gradient slab, zeroed tensors, the
// arena's compaction) left the other cores idle for about 3% of a
// two-thread TransformerLM step (bench config A: 44 MB moved, 32 MB
// zeroed and the 13 MB gradient slab, each step, on one thread).
#ifndef CTRAX_CORE_BULK_H
#define CTRAX_CORE_BULK_H

#include <stddef.h>

// p[0 .. n) = 0, the same bytes as memset.
void ct_bulk_zero(void *p, size_t n);
// dst[0 .. n) = src[0 .. n) for buffers that do not overlap (memcpy's rule).
void ct_bulk_copy(void *dst, const void *src, size_t n);

#endif
