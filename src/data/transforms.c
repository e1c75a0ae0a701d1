// Transforms: epochs (with per-epoch shuffling), the shuffle buffer,
// truncation, batching (padding, bucketing by length) and loss weights.
// Each stage's state is a function of its position, so each can seek.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "data/stream_internal.h"

// Takes ownership of inner: frees it when the stage cannot be built.
#define CT_STAGE_CHECK(cond, inner, err, ...)                             \
    do {                                                                  \
        if (!(cond)) {                                                    \
            ct_status st_ = ct_error_set((err), CT_ERR_ARG, __VA_ARGS__); \
            ct_stream_free(inner);                                        \
            return st_;                                                   \
        }                                                                 \
    } while (0)

static ct_key key_for(uint64_t seed, uint64_t i) {
    return ct_key_fold_in(ct_key_fold_in(ct_key_from_seed(seed), (uint32_t)i), (uint32_t)(i >> 32));
}

// Reads item `index` of inner (seeking only when it is not already there).
static ct_status read_at(ct_stream *inner, int64_t index, ct_batch *out, ct_error *err) {
    if (inner->position != index) CT_TRY(ct_stream_seek(inner, index, err));
    CT_TRY(ct_stream_next(inner, out, err));
    if (out->n == 0)
        return ct_error_set(err, CT_ERR_STATE, "%s stream ended before its item %lld", inner->ops->name,
                            (long long)index);
    return CT_OK;
}

// ---- epochs -----------------------------------------------------------------------------

typedef struct epochs {
    bool shuffle;
    uint64_t seed;
    int64_t n_epochs;  // 0: forever
    int64_t n;         // items per epoch
    int64_t *perm;     // the permutation of epoch perm_epoch (in the same block)
    int64_t perm_epoch;
} epochs;

static void epoch_permutation(epochs *e, int64_t epoch) {
    // Fisher-Yates, swap k with a uniform j in [0, k], draws from (seed, epoch).
    ct_key key = key_for(e->seed, (uint64_t)epoch);
    for (int64_t k = 0; k < e->n; k++) e->perm[k] = k;
    for (int64_t k = e->n - 1; k > 0; k--) {
        int64_t j = ct_stream_below(ct_random_bits(key, (uint32_t)k), (uint32_t)(k + 1));
        int64_t t = e->perm[k];
        e->perm[k] = e->perm[j];
        e->perm[j] = t;
    }
    e->perm_epoch = epoch;
}

static ct_status epochs_next(ct_stream *s, ct_batch *out, ct_error *err) {
    epochs *e = s->impl;
    int64_t p = s->position;
    if (e->n_epochs > 0 && p >= e->n_epochs * e->n) return CT_OK;
    int64_t epoch = p / e->n, k = p % e->n;
    if (e->shuffle && e->perm_epoch != epoch) epoch_permutation(e, epoch);
    return read_at(s->inner, e->shuffle ? e->perm[k] : k, out, err);
}

static void epochs_describe(const ct_stream *s, char *buf, size_t len) {
    const epochs *e = s->impl;
    char n[32] = "forever";
    if (e->n_epochs > 0) snprintf(n, sizeof n, "%lld", (long long)e->n_epochs);
    if (e->shuffle)
        snprintf(buf, len, "epochs(%s, shuffled, seed %llu)", n, (unsigned long long)e->seed);
    else
        snprintf(buf, len, "epochs(%s)", n);
}

static const ct_stream_ops epochs_ops = {"epochs", epochs_next, NULL, NULL, epochs_describe};

ct_status ct_epochs_stream_new(ct_stream **out, ct_stream *inner, bool shuffle, uint64_t seed, int64_t n_epochs,
                               ct_error *err) {
    *out = NULL;
    CT_ASSERT(inner);
    CT_STAGE_CHECK(inner->length > 0, inner, err, "epochs: the %s stream is %s; epochs need a finite, non-empty one",
                   inner->ops->name, inner->length < 0 ? "endless" : "empty");
    CT_STAGE_CHECK(inner->length <= UINT32_MAX, inner, err, "epochs: the %s stream has %lld items, more than 2^32",
                   inner->ops->name, (long long)inner->length);
    CT_STAGE_CHECK(n_epochs >= 0 && n_epochs <= INT64_MAX / inner->length, inner, err,
                   "epochs: n_epochs is %lld; expected 0 (forever) to %lld (%lld items each)", (long long)n_epochs,
                   (long long)(INT64_MAX / inner->length), (long long)inner->length);
    size_t perm = shuffle ? (size_t)inner->length * sizeof(int64_t) : 0;
    char what[96];
    snprintf(what, sizeof what, "epochs: the shuffled order of %lld items", (long long)inner->length);
    if (ct_host_check_room((double)perm, what, err) != CT_OK) {
        ct_stream_free(inner);
        return CT_ERR_MEMORY;
    }
    char *at = ct_calloc(1, ct_round16(sizeof(epochs)) + perm);
    epochs *e = ct_carve(&at, sizeof *e);
    e->perm = ct_carve(&at, perm);
    e->shuffle = shuffle;
    e->seed = seed;
    e->n_epochs = n_epochs;
    e->n = inner->length;
    e->perm_epoch = -1;
    ct_stream *s = ct_stream_wrap(&epochs_ops, inner, e);
    s->length = n_epochs > 0 ? n_epochs * e->n : -1;
    ct_stream_mix(s, shuffle);
    ct_stream_mix(s, seed);
    ct_stream_mix(s, (uint64_t)n_epochs);
    *out = s;
    return CT_OK;
}

// ---- shuffle buffer ------------------------------------------------------------------------
//
// Step t (0-based) takes slot j_t = below(hash(seed, t), c) of the c items in
// the buffer, then refills it with the next item of inner, or (once inner has
// ended) moves the last slot into it. So with F = the initial fill and D =
// (items of inner) - F the step where draining starts, slot s holds after p <=
// D steps inner item F + t for the last t < p with j_t = s, or item s if no
// such t exists; a seek finds those t by hashing backwards from p - 1 until
// every slot is known (about F ln F hashes), replays the hashes of the drain
// (at most F), then reads the items.

static int compare_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

typedef struct shuffle {
    int k;  // buffer size
    uint64_t seed;
    ct_item *slots;   // k
    int64_t *source;  // k: inner index held by each slot (seek only)
    int64_t *sorted;  // k: those indices in ascending order (seek only)
    int *slot_of;     // k: the slot holding sorted[i] (seek only)
    int count;           // items in the buffer
    int fill;            // F, the initial fill (known once filled)
    bool filled;
    int64_t t;    // steps taken
    ct_item out;  // the item handed out last
} shuffle;

static uint32_t shuffle_pick(const shuffle *sh, int64_t t, int count) {
    return ct_stream_below(ct_stream_hash(sh->seed, (uint32_t)t, (uint32_t)((uint64_t)t >> 32)), (uint32_t)count);
}

static ct_status shuffle_fill(ct_stream *s, ct_error *err) {
    shuffle *sh = s->impl;
    sh->count = 0;
    for (int i = 0; i < sh->k; i++) {
        ct_batch b;
        CT_TRY(ct_stream_next(s->inner, &b, err));
        if (b.n == 0) break;
        ct_item_copy(&sh->slots[i], &b);
        sh->count++;
    }
    sh->fill = sh->count;
    sh->filled = true;
    return CT_OK;
}

static ct_status shuffle_next(ct_stream *s, ct_batch *out, ct_error *err) {
    shuffle *sh = s->impl;
    if (!sh->filled) CT_TRY(shuffle_fill(s, err));
    if (sh->count == 0) return CT_OK;
    int j = (int)shuffle_pick(sh, sh->t, sh->count);
    // Hand out slot j's buffers; the old output buffers take its place.
    ct_item tmp = sh->out;
    sh->out = sh->slots[j];
    sh->slots[j] = tmp;
    ct_batch b;
    CT_TRY(ct_stream_next(s->inner, &b, err));
    if (b.n > 0) {
        ct_item_copy(&sh->slots[j], &b);
    } else {
        sh->count--;
        tmp = sh->slots[j];
        sh->slots[j] = sh->slots[sh->count];
        sh->slots[sh->count] = tmp;
    }
    sh->t++;
    *out = sh->out.b;
    return CT_OK;
}

static ct_status shuffle_seek(ct_stream *s, int64_t p, ct_error *err) {
    shuffle *sh = s->impl;
    sh->t = p;
    if (p == 0) {
        sh->filled = false;
        sh->count = 0;
        return ct_stream_seek(s->inner, 0, err);
    }
    // The initial fill: min(k, inner's length).
    int64_t n_in = s->inner->length;
    // Inner's position after p steps (fill + p over an endless inner) must fit.
    if (n_in < 0 && p > INT64_MAX - sh->k)
        return ct_error_set(err, CT_ERR_ARG, "shuffle: cannot seek to item %lld: the %s stream's position overflows",
                            (long long)p, s->inner->ops->name);
    int fill = n_in < 0 || n_in >= sh->k ? sh->k : (int)n_in;
    int64_t drain = n_in < 0 ? INT64_MAX : n_in - fill;  // D
    int64_t fill_steps = p < drain ? p : drain;          // steps with refills
    // Backwards over the refill steps: the last refill of each slot.
    for (int i = 0; i < fill; i++) sh->source[i] = -1;
    int unknown = fill;
    for (int64_t t = fill_steps - 1; t >= 0 && unknown > 0; t--) {
        int j = (int)shuffle_pick(sh, t, fill);
        if (sh->source[j] < 0) {
            sh->source[j] = fill + t;
            unknown--;
        }
    }
    for (int i = 0; i < fill; i++)
        if (sh->source[i] < 0) sh->source[i] = i;
    // Forwards over the drain steps.
    int count = fill;
    for (int64_t t = fill_steps; t < p && count > 0; t++) {
        int j = (int)shuffle_pick(sh, t, count);
        count--;
        sh->source[j] = sh->source[count];
    }
    // Read in inner's order: an epochs stage below then builds each epoch's
    // permutation once, not once per switch between two epochs. The slots
    // hold distinct items, so each sorted index is one slot's.
    memcpy(sh->sorted, sh->source, (size_t)count * sizeof *sh->sorted);
    if (count > 1) qsort(sh->sorted, (size_t)count, sizeof *sh->sorted, compare_i64);
    for (int j = 0; j < count; j++) {
        const int64_t *at = bsearch(&sh->source[j], sh->sorted, (size_t)count, sizeof *sh->sorted, compare_i64);
        sh->slot_of[at - sh->sorted] = j;
    }
    for (int i = 0; i < count; i++) {
        ct_batch b;
        CT_TRY(read_at(s->inner, sh->sorted[i], &b, err));
        ct_item_copy(&sh->slots[sh->slot_of[i]], &b);
    }
    sh->count = count;
    sh->fill = fill;
    sh->filled = true;
    int64_t inner_next = fill + fill_steps;
    return ct_stream_seek(s->inner, inner_next, err);
}

// Frees n staged items, the item handed out and the impl block holding them.
static void free_staged(void *impl, ct_item *staged, int n, ct_item *out) {
    for (int i = 0; i < n; i++) ct_item_free(&staged[i]);
    ct_item_free(out);
    ct_free(impl);
}

static void shuffle_free(ct_stream *s) {
    shuffle *sh = s->impl;
    free_staged(sh, sh->slots, sh->k, &sh->out);
}

static void shuffle_describe(const ct_stream *s, char *buf, size_t len) {
    const shuffle *sh = s->impl;
    snprintf(buf, len, "shuffle(buffer %d, seed %llu)", sh->k, (unsigned long long)sh->seed);
}

static const ct_stream_ops shuffle_ops = {"shuffle", shuffle_next, shuffle_seek, shuffle_free, shuffle_describe};

ct_status ct_shuffle_stream_new(ct_stream **out, ct_stream *inner, int buffer_size, uint64_t seed, ct_error *err) {
    *out = NULL;
    CT_ASSERT(inner);
    CT_STAGE_CHECK(buffer_size >= 1 && buffer_size <= (1 << 24), inner, err,
                   "shuffle: buffer_size is %d; expected 1..2^24", buffer_size);
    size_t k = (size_t)buffer_size;
    // The full buffer (bookkeeping and each example's tensors, a varying
    // dim counted as 1) against the machine's memory, before allocating.
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    double example = 0;
    for (int i = 0, n = ct_stream_signature(inner, sigs); i < n; i++) {
        double numel = 1;
        for (int d = 0; d < sigs[i].ndim; d++) numel *= sigs[i].shape[d] > 0 ? (double)sigs[i].shape[d] : 1.0;
        example += numel * (double)ct_dtype_size(sigs[i].dtype);
    }
    double need = (double)k * ((double)(sizeof(ct_item) + 2 * sizeof(int64_t) + sizeof(int)) + example);
    char what[64];
    snprintf(what, sizeof what, "shuffle: a buffer of %d examples", buffer_size);
    if (ct_host_check_room(need, what, err) != CT_OK) {
        ct_stream_free(inner);
        return CT_ERR_MEMORY;
    }
    char *at = ct_calloc(1, ct_round16(sizeof(shuffle)) + ct_round16(k * sizeof(ct_item)) +
                                2 * ct_round16(k * sizeof(int64_t)) + k * sizeof(int));
    shuffle *sh = ct_carve(&at, sizeof *sh);
    sh->slots = ct_carve(&at, k * sizeof *sh->slots);
    sh->source = ct_carve(&at, k * sizeof *sh->source);
    sh->sorted = ct_carve(&at, k * sizeof *sh->sorted);
    sh->slot_of = ct_carve(&at, k * sizeof *sh->slot_of);
    sh->k = buffer_size;
    sh->seed = seed;
    ct_stream *s = ct_stream_wrap(&shuffle_ops, inner, sh);
    ct_stream_mix(s, (uint64_t)buffer_size);
    ct_stream_mix(s, seed);
    *out = s;
    return CT_OK;
}

// ---- truncate -------------------------------------------------------------------------------

static ct_status truncate_next(ct_stream *s, ct_batch *out, ct_error *err) {
    CT_TRY(ct_stream_next(s->inner, out, err));
    int64_t max_len = *(const int64_t *)s->impl;
    // Rows are contiguous, so the first max_len of dim 0 are a prefix.
    for (int i = 0; i < out->n; i++)
        if (out->t[i].ndim >= 1 && out->t[i].shape[0] > max_len) out->t[i].shape[0] = max_len;
    return CT_OK;
}

static ct_status pass_seek(ct_stream *s, int64_t position, ct_error *err) {
    return ct_stream_seek(s->inner, position, err);
}

static void truncate_describe(const ct_stream *s, char *buf, size_t len) {
    snprintf(buf, len, "truncate(%lld)", (long long)*(const int64_t *)s->impl);
}

static const ct_stream_ops truncate_ops = {"truncate", truncate_next, pass_seek, NULL, truncate_describe};

ct_status ct_truncate_stream_new(ct_stream **out, ct_stream *inner, int64_t max_len, ct_error *err) {
    *out = NULL;
    CT_ASSERT(inner);
    CT_STAGE_CHECK(max_len >= 1, inner, err, "truncate: max_len is %lld; expected >= 1", (long long)max_len);
    int64_t *m = ct_malloc(sizeof *m);
    *m = max_len;
    ct_stream *s = ct_stream_wrap(&truncate_ops, inner, m);
    for (int i = 0; i < s->n_out; i++)
        if (s->sigs[i].ndim >= 1 && s->sigs[i].shape[0] > max_len) s->sigs[i].shape[0] = max_len;
    ct_stream_mix(s, (uint64_t)max_len);
    *out = s;
    return CT_OK;
}

// ---- batch ----------------------------------------------------------------------------------

typedef struct by_length {
    int64_t length;
    int index;
} by_length;

typedef struct batcher {
    ct_batch_params p;
    int64_t *boundaries;
    int w;  // batches per window (1 without bucketing)
    bool varying[CT_BATCH_MAX_TENSORS];
    ct_tensor in_sigs[CT_BATCH_MAX_TENSORS];
    ct_item *staged;     // w * batch_size examples of the current window
    int m;               // examples staged
    by_length *lengths;  // of the staged examples (sorted when bucketing)
    int *sorted;         // staged examples, by length when bucketing
    int *order;          // batches of the window, in the order they come out
    int nb;              // batches in the window
    int k;               // next batch of the window
    int64_t window;      // the window staged (or to stage)
    bool loaded;
    ct_item out;
} batcher;

// (B, ...) from (...).
static ct_tensor batched_sig(ct_tensor sig, int64_t B) {
    ct_tensor o = sig;
    o.ndim = sig.ndim + 1;
    o.shape[0] = B;
    for (int d = 0; d < sig.ndim; d++) o.shape[d + 1] = sig.shape[d];
    return o;
}

static int64_t example_length(const batcher *bt, const ct_batch *b) {
    int64_t len = 0;
    for (int i = 0; i < b->n; i++)
        if (bt->varying[i] && b->t[i].shape[0] > len) len = b->t[i].shape[0];
    return len;
}

static int compare_by_length(const void *a, const void *b) {
    const by_length *x = a, *y = b;
    if (x->length != y->length) return x->length < y->length ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);  // ties keep stream order: a stable sort
}

static ct_status check_example(const ct_stream *s, const batcher *bt, const ct_batch *b, int64_t index, ct_error *err) {
    if (b->n != s->n_out)
        return ct_error_set(err, CT_ERR_SHAPE, "batch: example %lld has %d tensors; the stream's signature has %d",
                            (long long)index, b->n, s->n_out);
    for (int i = 0; i < b->n; i++) {
        const ct_tensor *t = &b->t[i], *sig = &bt->in_sigs[i];
        bool ok = t->dtype == sig->dtype && t->ndim == sig->ndim;
        for (int d = 0; ok && d < t->ndim; d++) ok = sig->shape[d] < 0 || sig->shape[d] == t->shape[d];
        if (!ok) {
            char a[CT_SIG_STR_MAX], c[CT_SIG_STR_MAX];
            return ct_error_set(
                err, CT_ERR_SHAPE, "batch: tensor %d of example %lld is %s; the stream's signature is %s", i,
                (long long)index, ct_tensor_sig_str(t, a, sizeof a), ct_tensor_sig_str(sig, c, sizeof c));
        }
    }
    return CT_OK;
}

static ct_status load_window(ct_stream *s, ct_error *err) {
    batcher *bt = s->impl;
    int B = bt->p.batch_size, cap = bt->w * B;
    int64_t first = bt->window * (int64_t)cap;
    if (s->inner->position != first) CT_TRY(ct_stream_seek(s->inner, first, err));
    bt->m = 0;
    for (int i = 0; i < cap; i++) {
        ct_batch b;
        CT_TRY(ct_stream_next(s->inner, &b, err));
        if (b.n == 0) break;
        CT_TRY(check_example(s, bt, &b, first + i, err));
        ct_item_copy(&bt->staged[i], &b);
        bt->lengths[i].length = example_length(bt, &b);
        bt->lengths[i].index = i;
        bt->m++;
    }
    bt->nb = bt->p.pad_remainder ? (bt->m + B - 1) / B : bt->m / B;
    if (bt->p.bucket_window > 0 && bt->m > 1) qsort(bt->lengths, (size_t)bt->m, sizeof *bt->lengths, compare_by_length);
    for (int i = 0; i < bt->m; i++) bt->sorted[i] = bt->lengths[i].index;
    for (int i = 0; i < bt->nb; i++) bt->order[i] = i;
    if (bt->p.bucket_window > 0) {
        ct_key key = key_for(bt->p.seed, (uint64_t)bt->window);
        for (int i = bt->nb - 1; i > 0; i--) {
            int j = (int)ct_stream_below(ct_random_bits(key, (uint32_t)i), (uint32_t)(i + 1));
            int t = bt->order[i];
            bt->order[i] = bt->order[j];
            bt->order[j] = t;
        }
    }
    bt->loaded = true;
    return CT_OK;
}

// The padded length of varying tensor i for rows with longest example `longest`.
static ct_status padded_length(const batcher *bt, int64_t longest, int64_t *out, ct_error *err) {
    if (bt->p.length > 0) {
        if (longest > bt->p.length)
            return ct_error_set(err, CT_ERR_SHAPE,
                                "batch: an example of length %lld is longer than length %lld (truncate first)",
                                (long long)longest, (long long)bt->p.length);
        *out = bt->p.length;
        return CT_OK;
    }
    if (bt->p.n_boundaries > 0) {
        for (int i = 0; i < bt->p.n_boundaries; i++)
            if (bt->boundaries[i] >= longest) {
                *out = bt->boundaries[i];
                return CT_OK;
            }
        return ct_error_set(err, CT_ERR_SHAPE,
                            "batch: an example of length %lld is longer than the last boundary %lld (truncate first)",
                            (long long)longest, (long long)bt->boundaries[bt->p.n_boundaries - 1]);
    }
    int64_t m = bt->p.pad_to_multiple > 1 ? bt->p.pad_to_multiple : 1;
    *out = (longest + m - 1) / m * m;
    if (*out == 0) *out = m;
    return CT_OK;
}

static ct_status batch_next(ct_stream *s, ct_batch *out, ct_error *err) {
    batcher *bt = s->impl;
    if (bt->loaded && bt->k >= bt->nb) {
        if (bt->m < bt->w * bt->p.batch_size) return CT_OK;  // the last window was partial: inner ended
        bt->window++;
        bt->k = 0;
        bt->loaded = false;
    }
    if (!bt->loaded) CT_TRY(load_window(s, err));
    if (bt->k >= bt->nb) return CT_OK;
    int B = bt->p.batch_size, batch = bt->order[bt->k];
    int first = batch * B, rows = bt->m - first < B ? bt->m - first : B;
    const int *idx = bt->sorted + first;
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    for (int i = 0; i < s->n_out; i++) {
        ct_tensor sig = bt->in_sigs[i];
        if (bt->varying[i]) {
            int64_t longest = 0;
            for (int r = 0; r < rows; r++) {
                int64_t l = bt->staged[idx[r]].b.t[i].shape[0];
                if (l > longest) longest = l;
            }
            CT_TRY(padded_length(bt, longest, &sig.shape[0], err));
        }
        sigs[i] = batched_sig(sig, B);
    }
    ct_item_shape(&bt->out, s->n_out, sigs);  // zeroed: padding and missing rows are 0
    for (int i = 0; i < s->n_out; i++) {
        size_t row_bytes = ct_tensor_nbytes(&sigs[i]) / (size_t)B;
        char *dst = bt->out.b.t[i].data;
        for (int r = 0; r < rows; r++) {
            const ct_tensor *t = &bt->staged[idx[r]].b.t[i];
            size_t bytes = ct_tensor_nbytes(t);
            if (bytes) memcpy(dst + (size_t)r * row_bytes, t->data, bytes);
        }
    }
    bt->k++;
    *out = bt->out.b;
    return CT_OK;
}

static ct_status batch_seek(ct_stream *s, int64_t position, ct_error *err) {
    batcher *bt = s->impl;
    // The inner stream's position is the window's first example: it must fit.
    if (position / bt->w > INT64_MAX / ((int64_t)bt->w * bt->p.batch_size))
        return ct_error_set(err, CT_ERR_ARG, "batch: cannot seek to batch %lld: its examples' position overflows",
                            (long long)position);
    bt->window = position / bt->w;
    bt->loaded = false;
    // The window is staged at the next call; then skip to the batch.
    if (position % bt->w != 0) {
        CT_TRY(load_window(s, err));
        bt->k = (int)(position % bt->w);
    } else {
        bt->k = 0;
    }
    return CT_OK;
}

static void batch_free(ct_stream *s) {
    batcher *bt = s->impl;
    free_staged(bt, bt->staged, bt->w * bt->p.batch_size, &bt->out);
}

static void batch_describe(const ct_stream *s, char *buf, size_t len) {
    const batcher *bt = s->impl;
    int n = snprintf(buf, len, "batch(%d", bt->p.batch_size);
    if (n >= 0 && (size_t)n < len && bt->p.length > 0)
        n += snprintf(buf + n, len - (size_t)n, ", length %lld", (long long)bt->p.length);
    if (n >= 0 && (size_t)n < len && bt->p.n_boundaries > 0)
        n += snprintf(buf + n, len - (size_t)n, ", %d boundaries", bt->p.n_boundaries);
    if (n >= 0 && (size_t)n < len && bt->p.pad_to_multiple > 1)
        n += snprintf(buf + n, len - (size_t)n, ", pad to x%d", bt->p.pad_to_multiple);
    if (n >= 0 && (size_t)n < len && bt->p.bucket_window > 0)
        n += snprintf(buf + n, len - (size_t)n, ", buckets over %d batches, seed %llu", bt->p.bucket_window,
                      (unsigned long long)bt->p.seed);
    if (n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, "%s)", bt->p.pad_remainder ? ", pad remainder" : "");
}

static const ct_stream_ops batch_ops = {"batch", batch_next, batch_seek, batch_free, batch_describe};

ct_batch_params ct_batch_default_params(void) {
    ct_batch_params p = {0};
    p.batch_size = 32;
    p.pad_to_multiple = 1;
    return p;
}

// The checks of ct_batch_stream_new, before anything is allocated.
static ct_status batch_check(const ct_stream *inner, const ct_batch_params *p, ct_error *err) {
    CT_STREAM_CHECK(p->batch_size >= 1, err, "batch: batch_size is %d; expected >= 1", p->batch_size);
    CT_STREAM_CHECK(p->bucket_window >= 0 &&
                        (int64_t)p->batch_size * (p->bucket_window ? p->bucket_window : 1) <= (1 << 24),
                    err, "batch: batch_size %d x bucket_window %d is out of range (at most 2^24 examples)",
                    p->batch_size, p->bucket_window);
    CT_STREAM_CHECK(p->length >= 0, err, "batch: length is %lld; expected >= 0 (0: no fixed length)",
                    (long long)p->length);
    CT_STREAM_CHECK(p->n_boundaries >= 0 && (p->n_boundaries == 0 || p->boundaries), err,
                    "batch: %d boundaries but no array", p->n_boundaries);
    for (int i = 0; i < p->n_boundaries; i++)
        CT_STREAM_CHECK(p->boundaries[i] >= 1 && (i == 0 || p->boundaries[i] > p->boundaries[i - 1]), err,
                        "batch: boundaries must be positive and ascending (boundary %d is %lld)", i,
                        (long long)p->boundaries[i]);
    CT_STREAM_CHECK(p->pad_to_multiple >= 0, err, "batch: pad_to_multiple is %d; expected >= 0", p->pad_to_multiple);
    CT_STREAM_CHECK(inner->n_out >= 1, err, "batch: the %s stream yields no tensors", inner->ops->name);
    for (int i = 0; i < inner->n_out; i++) {
        const ct_tensor *sig = &inner->sigs[i];
        CT_STREAM_CHECK(sig->ndim < CT_MAX_DIMS, err, "batch: tensor %d has %d dims; a batch adds one (at most %d)", i,
                        sig->ndim, CT_MAX_DIMS);
        for (int d = 1; d < sig->ndim; d++)
            CT_STREAM_CHECK(sig->shape[d] >= 0, err,
                            "batch: tensor %d varies in dim %d; only dim 0 (the sequence) may vary", i, d);
        // A varying one is checked example by example (batch_pad).
        CT_STREAM_CHECK(sig->ndim < 1 || p->length == 0 || sig->shape[0] <= p->length, err,
                        "batch: tensor %d of the %s stream is %lld long, longer than length %lld (truncate first)", i,
                        inner->ops->name, (long long)sig->shape[0], (long long)p->length);
    }
    return CT_OK;
}

// The bytes of a window staged and its batch out, with every dim that is
// padded at the fixed length or the last boundary (1 when neither bounds it).
static double window_bytes(const ct_stream *inner, const ct_batch_params *p, int64_t bound) {
    double batch = 0;
    for (int i = 0; i < inner->n_out; i++) {
        const ct_tensor *sig = &inner->sigs[i];
        double numel = p->batch_size;
        for (int d = 0; d < sig->ndim; d++)
            numel *= d == 0 && (sig->shape[0] < 0 || sig->shape[0] < p->length) ? (double)bound : (double)sig->shape[d];
        batch += numel * (double)ct_dtype_size(sig->dtype);
    }
    return (double)((p->bucket_window > 0 ? p->bucket_window : 1) + 1) * batch;
}

// The batcher and its arrays (sized by the window), one block.
static batcher *batcher_new(const ct_batch_params *p) {
    int w = p->bucket_window > 0 ? p->bucket_window : 1;
    size_t cap = (size_t)w * (size_t)p->batch_size, nb = (size_t)p->n_boundaries;
    char *at = ct_calloc(1, ct_round16(sizeof(batcher)) + ct_round16(cap * sizeof(ct_item)) +
                                ct_round16(cap * sizeof(by_length)) + ct_round16(cap * sizeof(int)) +
                                ct_round16((size_t)w * sizeof(int)) + nb * sizeof(int64_t));
    batcher *bt = ct_carve(&at, sizeof *bt);
    bt->staged = ct_carve(&at, cap * sizeof *bt->staged);
    bt->lengths = ct_carve(&at, cap * sizeof *bt->lengths);
    bt->sorted = ct_carve(&at, cap * sizeof *bt->sorted);
    bt->order = ct_carve(&at, (size_t)w * sizeof *bt->order);
    bt->boundaries = ct_carve(&at, nb * sizeof *bt->boundaries);
    if (nb) memcpy(bt->boundaries, p->boundaries, nb * sizeof *bt->boundaries);
    bt->p = *p;
    bt->p.boundaries = bt->boundaries;
    bt->w = w;
    return bt;
}

ct_status ct_batch_stream_new(ct_stream **out, ct_stream *inner, const ct_batch_params *p, ct_error *err) {
    *out = NULL;
    CT_ASSERT(inner && p);
    ct_status st = batch_check(inner, p, err);
    if (st == CT_OK) {
        // Against the machine's memory before allocating: a fixed length or a
        // boundary of 2^40 passed the checks and aborted in malloc at the first batch.
        int64_t bound = p->length > 0 ? p->length : p->n_boundaries > 0 ? p->boundaries[p->n_boundaries - 1] : 1;
        char what[128];
        snprintf(what, sizeof what, "batch: a window of %d x %d examples padded to length %lld",
                 p->bucket_window > 0 ? p->bucket_window : 1, p->batch_size, (long long)bound);
        st = ct_host_check_room(window_bytes(inner, p, bound), what, err);
    }
    if (st != CT_OK) {
        ct_stream_free(inner);  // owned on every path
        return st;
    }
    batcher *bt = batcher_new(p);
    ct_stream *s = ct_stream_wrap(&batch_ops, inner, bt);
    for (int i = 0; i < inner->n_out; i++) {
        ct_tensor sig = inner->sigs[i];
        bt->in_sigs[i] = sig;
        // Padded: examples of varying length, and fixed ones shorter than a
        // fixed batch length (a copy task padded to pad_to_multiple).
        bt->varying[i] = sig.ndim >= 1 && (sig.shape[0] < 0 || (p->length > 0 && sig.shape[0] < p->length));
        s->sigs[i] = batched_sig(sig, p->batch_size);
        if (bt->varying[i]) s->sigs[i].shape[1] = p->length > 0 ? p->length : -1;
    }
    if (inner->length >= 0)
        s->length =
            p->pad_remainder ? (inner->length + p->batch_size - 1) / p->batch_size : inner->length / p->batch_size;
    ct_stream_mix(s, (uint64_t)p->batch_size);
    ct_stream_mix(s, (uint64_t)p->length);
    for (int i = 0; i < p->n_boundaries; i++) ct_stream_mix(s, (uint64_t)p->boundaries[i]);
    ct_stream_mix(s, (uint64_t)p->n_boundaries);
    ct_stream_mix(s, (uint64_t)p->pad_to_multiple);
    ct_stream_mix(s, (uint64_t)p->bucket_window);
    ct_stream_mix(s, p->seed);
    ct_stream_mix(s, p->pad_remainder);
    *out = s;
    return CT_OK;
}

// ---- loss weights ---------------------------------------------------------------------------

typedef struct weighter {
    int mask_id;
    ct_item w;
} weighter;

static ct_status weights_next(ct_stream *s, ct_batch *out, ct_error *err) {
    weighter *wt = s->impl;
    CT_TRY(ct_stream_next(s->inner, out, err));
    if (out->n == 0) return CT_OK;
    const ct_tensor *targets = &out->t[1];
    ct_tensor wsig = ct_tensor_sig(targets);
    wsig.dtype = CT_DTYPE_F32;
    if (out->n == 3 && !ct_tensor_same_sig(&out->t[2], &wsig)) {
        char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
        return ct_error_set(err, CT_ERR_SHAPE, "loss weights: weights %s do not match targets %s",
                            ct_tensor_sig_str(&out->t[2], a, sizeof a), ct_tensor_sig_str(targets, b, sizeof b));
    }
    ct_item_shape(&wt->w, 1, &wsig);
    float *w = wt->w.b.t[0].data;
    int64_t n = ct_tensor_numel(targets);
    for (int64_t i = 0; i < n; i++) w[i] = out->n == 3 ? ct_f32(&out->t[2])[i] : 1.0f;
    if (wt->mask_id >= 0)
        for (int64_t i = 0; i < n; i++)
            if (ct_i32(targets)[i] == wt->mask_id) w[i] = 0.0f;
    out->n = 3;
    out->t[2] = wt->w.b.t[0];
    return CT_OK;
}

static void weights_free(ct_stream *s) {
    weighter *wt = s->impl;
    ct_item_free(&wt->w);
    ct_free(wt);
}

static void weights_describe(const ct_stream *s, char *buf, size_t len) {
    const weighter *wt = s->impl;
    if (wt->mask_id >= 0)
        snprintf(buf, len, "loss_weights(mask id %d)", wt->mask_id);
    else
        snprintf(buf, len, "loss_weights");
}

static const ct_stream_ops weights_ops = {"loss_weights", weights_next, pass_seek, weights_free, weights_describe};

ct_status ct_weights_stream_new(ct_stream **out, ct_stream *inner, int mask_id, ct_error *err) {
    *out = NULL;
    CT_ASSERT(inner);
    CT_STAGE_CHECK(inner->n_out == 2 || inner->n_out == 3, inner, err,
                   "loss weights: the %s stream yields %d tensors; expected (inputs, targets[, weights])",
                   inner->ops->name, inner->n_out);
    CT_STAGE_CHECK(mask_id < 0 || inner->sigs[1].dtype == CT_DTYPE_I32, inner, err,
                   "loss weights: mask_id %d needs int32 targets; they are %s", mask_id,
                   ct_dtype_name(inner->sigs[1].dtype));
    weighter *wt = ct_calloc(1, sizeof *wt);
    wt->mask_id = mask_id;
    ct_stream *s = ct_stream_wrap(&weights_ops, inner, wt);
    s->n_out = 3;
    s->sigs[2] = inner->sigs[1];
    s->sigs[2].dtype = CT_DTYPE_F32;
    ct_stream_mix(s, (uint64_t)(int64_t)mask_id);
    *out = s;
    return CT_OK;
}
