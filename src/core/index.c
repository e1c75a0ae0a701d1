// ct_index: open addressing with linear probing over positions of an array.
#include "core/index.h"

#include <string.h>

#include "ctrax/core/memory.h"

uint64_t ct_hash_bytes(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

uint64_t ct_hash_str(const char *s) { return ct_hash_bytes(CT_HASH_START, s, strlen(s)); }

int ct_index_find(const ct_index *ix, uint64_t h, bool (*same)(const void *ctx, int at, const void *key),
                  const void *ctx, const void *key) {
    if (!ix->cap) return -1;
    for (size_t i = h & (size_t)(ix->cap - 1);; i = (i + 1) & (size_t)(ix->cap - 1)) {
        int at = ix->slot[i];
        if (at < 0) return -1;
        if (ix->hash[at] == h && same(ctx, at, key)) return at;
    }
}

static void index_put(ct_index *ix, int at) {
    size_t i = ix->hash[at] & (size_t)(ix->cap - 1);
    while (ix->slot[i] >= 0) i = (i + 1) & (size_t)(ix->cap - 1);
    ix->slot[i] = at;
}

void ct_index_add(ct_index *ix, int at, uint64_t h) {
    if (at >= ix->cap_hash) {
        int c = ix->cap_hash ? ix->cap_hash : 8;
        while (c <= at) c *= 2;
        ix->hash = ct_realloc(ix->hash, (size_t)c * sizeof *ix->hash);
        ix->cap_hash = c;
    }
    ix->hash[at] = h;
    ix->n++;
    if (2 * ix->n > ix->cap) {
        ct_free(ix->slot);
        ix->cap = ix->cap ? 2 * ix->cap : 64;
        ix->slot = ct_malloc((size_t)ix->cap * sizeof *ix->slot);
        memset(ix->slot, 0xff, (size_t)ix->cap * sizeof *ix->slot);  // -1
        for (int e = 0; e < ix->n; e++) index_put(ix, e);
    } else {
        index_put(ix, at);
    }
}

void ct_index_free(ct_index *ix) {
    ct_free(ix->slot);
    ct_free(ix->hash);
    memset(ix, 0, sizeof *ix);
}
