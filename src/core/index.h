// An open-addressing index from a hash to the entries of an array its user
// owns (the config's macros and bindings, the Loop's metric names): a
// lookup is a few probes, not a scan of the array (a config of 100,000
// macros took 25 s to read with scans). Entries are only added, each at
// the array's next position. Internal to ctrax.
#ifndef CTRAX_CORE_INDEX_H
#define CTRAX_CORE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ct_index {
    int *slot;       // cap slots (a power of two): an entry's position, or -1
    uint64_t *hash;  // each entry's hash, by position
    int cap, n, cap_hash;
} ct_index;  // all zero: empty

// FNV-1a of n bytes, going on from h (CT_HASH_START for the first piece).
#define CT_HASH_START 14695981039346656037ull
uint64_t ct_hash_bytes(uint64_t h, const void *p, size_t n);
uint64_t ct_hash_str(const char *s);  // of its bytes, from CT_HASH_START

// The position of the entry with hash h that same(ctx, position, key)
// accepts, or -1.
int ct_index_find(const ct_index *ix, uint64_t h, bool (*same)(const void *ctx, int at, const void *key),
                  const void *ctx, const void *key);
// Entry `at` (the next position: ix->n) with hash h; the table doubles at
// half full.
void ct_index_add(ct_index *ix, int at, uint64_t h);
// Frees the table and leaves it empty (all zero), ready for use again.
void ct_index_free(ct_index *ix);

#endif
