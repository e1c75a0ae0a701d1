// What the stages of a stream share (internal to src/data/).
#ifndef CTRAX_DATA_STREAM_INTERNAL_H
#define CTRAX_DATA_STREAM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"
#include "ctrax/data/stream.h"

// A stage. next writes the next item (out->n == 0 at the end); seek puts the
// stage in the state it has after yielding `position` items. The public
// wrappers keep ct_stream.position, which a stage whose whole state is its
// position (a source, epochs) reads instead of keeping a copy.
typedef struct ct_stream_ops {
    const char *name;
    ct_status (*next)(ct_stream *s, ct_batch *out, ct_error *err);
    // NULL: the stage's state is ct_stream.position alone; nothing to do.
    ct_status (*seek)(ct_stream *s, int64_t position, ct_error *err);
    // Frees impl (not inner, which ct_stream_free frees). NULL: impl is one
    // allocation (its arrays after the struct), freed with ct_free.
    void (*free_impl)(ct_stream *s);
    // Writes the stage's own part of the description ("batch(32)").
    void (*describe)(const ct_stream *s, char *buf, size_t len);
} ct_stream_ops;

struct ct_stream {
    const ct_stream_ops *ops;
    ct_stream *inner;  // the stream this stage wraps (owned), NULL for a source
    void *impl;
    int n_out;
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];  // data NULL, -1 for varying dims
    int64_t length;                        // items in all, -1 endless
    int64_t position;                      // items yielded so far
    uint64_t fingerprint;                  // 53 bits
};

// A stage around inner (NULL for a source) with fingerprint seeded from
// inner's; the caller fills n_out, sigs, length and mixes its parameters into
// the fingerprint with ct_stream_mix.
ct_stream *ct_stream_alloc(const ct_stream_ops *ops, ct_stream *inner, void *impl);
// ct_stream_alloc for a transform that keeps inner's items as they are:
// n_out, sigs and length are inner's (the caller changes what differs).
ct_stream *ct_stream_wrap(const ct_stream_ops *ops, ct_stream *inner, void *impl);

// An impl and its fixed-size arrays in one zeroed block, so that one ct_free
// (free_impl NULL) frees them all: the block is ct_round16(sizeof impl) plus
// ct_round16 of each array; ct_carve hands out the arrays in turn.
static inline size_t ct_round16(size_t bytes) { return (bytes + 15) & ~(size_t)15; }
static inline void *ct_carve(char **at, size_t bytes) {
    void *p = *at;
    *at += ct_round16(bytes);
    return p;
}
void ct_stream_mix(ct_stream *s, uint64_t value);
void ct_stream_mix_str(ct_stream *s, const char *str);

// An owned copy of an item (tensors in buffers that only grow).
typedef struct ct_item {
    ct_batch b;
    void *mem[CT_BATCH_MAX_TENSORS];
    size_t cap[CT_BATCH_MAX_TENSORS];
} ct_item;

// Copies src's tensors into dst (growing its buffers as needed).
void ct_item_copy(ct_item *dst, const ct_batch *src);
// Shapes dst like the given signatures (no -1) and returns zeroed buffers.
void ct_item_shape(ct_item *dst, int n, const ct_tensor *sigs);
void ct_item_free(ct_item *it);

// Fails with CT_ERR_ARG naming the stage unless cond holds.
#define CT_STREAM_CHECK(cond, err, ...)                                   \
    do {                                                                  \
        if (!(cond)) return ct_error_set((err), CT_ERR_ARG, __VA_ARGS__); \
    } while (0)

// Random 32 bits for (seed, a, b): threefry-2x32 under the seed's key with
// counter (a, b); used for split hashes, shuffles and batch orders.
uint32_t ct_stream_hash(uint64_t seed, uint32_t a, uint32_t b);
// A uniform integer in [0, n) from the 32 bits h (multiply-shift).
static inline uint32_t ct_stream_below(uint32_t h, uint32_t n) { return (uint32_t)(((uint64_t)h * n) >> 32); }

// Collects the files under paths (files in the given order, directories
// recursively with names sorted, hidden names skipped, duplicates of the same
// inode dropped). skip_binary drops files with a NUL in their first 8 KiB.
// Returns a malloc'd array of malloc'd paths.
ct_status ct_data_collect_files(const char *const *paths, int n_paths, bool skip_binary, char ***files, int *n_files,
                                ct_error *err);
void ct_data_free_files(char **files, int n_files);

// The corpus source behind ct_text_stream_new and ct_token_stream_new.
ct_status ct_corpus_stream_new(ct_stream **out, const ct_corpus_params *p, int token_bytes, ct_error *err);

#endif
