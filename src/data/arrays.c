// Arrays in memory as a source (tf.data's Dataset.from_tensor_slices,
// torch's TensorDataset): n arrays sharing their leading dim N; item i is
// (arrays[0][i], ..., arrays[n-1][i]). The item tensors are views into the
// data (copied into the stream at creation, or the caller's, borrowed), so
// next and seek cost O(1) whatever the size of an item.
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>

#include "ctrax/core/memory.h"
#include "data/stream_internal.h"

typedef struct arrays_data {
    int n;
    int64_t rows;                             // N, items in all
    const char *base[CT_BATCH_MAX_TENSORS];   // each array's item 0
    size_t item_bytes[CT_BATCH_MAX_TENSORS];  // bytes of one item of each array
    void *copy;                               // the copied arrays (one block), NULL when borrowed
    size_t copy_bytes;                        // the arrays' bytes (without the block's padding)
} arrays_data;

static ct_status arrays_next(ct_stream *s, ct_batch *out, ct_error *err) {
    (void)err;
    const arrays_data *d = s->impl;
    int64_t i = s->position;
    if (i >= d->rows) return CT_OK;
    out->n = d->n;
    for (int k = 0; k < d->n; k++) {
        out->t[k] = s->sigs[k];
        // A view, not a copy: items are read-only to whoever takes them (the
        // batch stage copies rows out; the trainers read their inputs).
        out->t[k].data = (void *)(d->base[k] + (size_t)i * d->item_bytes[k]);
    }
    return CT_OK;
}

static void arrays_describe(const ct_stream *s, char *buf, size_t len) {
    const arrays_data *d = s->impl;
    size_t used = (size_t)snprintf(buf, len, "arrays(%lld items of ", (long long)d->rows);
    for (int k = 0; k < d->n && used < len; k++) {
        char sig[CT_SIG_STR_MAX];
        used += (size_t)snprintf(buf + used, len - used, "%s%s", k ? ", " : "",
                                 ct_tensor_sig_str(&s->sigs[k], sig, sizeof sig));
    }
    if (used < len) {
        if (d->copy)
            snprintf(buf + used, len - used, "; copied, %zu bytes)", d->copy_bytes);
        else
            snprintf(buf + used, len - used, "; borrowed)");
    }
}

static void arrays_free(ct_stream *s) {
    arrays_data *d = s->impl;
    ct_free(d->copy);
    ct_free(d);
}

static const ct_stream_ops arrays_ops = {"arrays", arrays_next, NULL, arrays_free, arrays_describe};

// Checks array k against what a source needs (and array 0's N), and
// returns the bytes of the whole array and of one item of it.
static ct_status check_array(const ct_tensor *arrays, int k, bool copy, size_t *bytes, size_t *item_bytes,
                             ct_error *err) {
    const ct_tensor *a = &arrays[k];
    if (a->dtype != CT_DTYPE_F32 && a->dtype != CT_DTYPE_I32)
        return ct_error_set(err, CT_ERR_ARG, "arrays: array %d is %s (dtype %d); expected f32 or i32", k,
                            ct_dtype_name(a->dtype), (int)a->dtype);
    if (a->ndim == 0)
        return ct_error_set(err, CT_ERR_ARG,
                            "arrays: array %d has rank 0 (a scalar); each array needs a leading dim N, the "
                            "number of items",
                            k);
    if (a->ndim < 0 || a->ndim > CT_MAX_DIMS)
        return ct_error_set(err, CT_ERR_ARG, "arrays: array %d has rank %d; expected 1..%d (CT_MAX_DIMS)", k, a->ndim,
                            CT_MAX_DIMS);
    // Dims checked before the shape is printed: a dim of -5 would print as a
    // signature's "varying".
    for (int i = 0; i < a->ndim; i++) {
        if (i == 0 && a->shape[0] == 0)
            return ct_error_set(err, CT_ERR_ARG, "arrays: array %d has N = 0 items (its leading dim is 0): nothing to "
                                "yield", k);
        if (a->shape[i] < 1)
            return ct_error_set(err, CT_ERR_ARG, "arrays: array %d: dim %d is %lld; expected >= 1", k, i,
                                (long long)a->shape[i]);
    }
    char sig[CT_SIG_STR_MAX];
    ct_tensor_sig_str(a, sig, sizeof sig);
    if (!a->data) return ct_error_set(err, CT_ERR_ARG, "arrays: array %d %s has no data (data is NULL)", k, sig);
    // numel is INT64_MAX when the product overflows; PTRDIFF_MAX bounds
    // what one object can hold.
    *bytes = ct_tensor_nbytes(a);
    if (ct_tensor_numel(a) == INT64_MAX || *bytes > (size_t)PTRDIFF_MAX)
        return ct_error_set(err, CT_ERR_ARG, "arrays: array %d %s is too large: its size overflows", k, sig);
    *item_bytes = *bytes / (size_t)a->shape[0];
    if (a->shape[0] != arrays[0].shape[0]) {
        char sig0[CT_SIG_STR_MAX];
        return ct_error_set(err, CT_ERR_ARG,
                            "arrays: array %d %s has %lld items (its leading dim) but array 0 %s has %lld; every "
                            "array needs the same N",
                            k, sig, (long long)a->shape[0], ct_tensor_sig_str(&arrays[0], sig0, sizeof sig0),
                            (long long)arrays[0].shape[0]);
    }
    // Borrowed items are views into this memory: the kernels read them as
    // floats and ints, which must be aligned (a copy is).
    if (!copy && (uintptr_t)a->data % ct_dtype_size(a->dtype) != 0)
        return ct_error_set(err, CT_ERR_ARG,
                            "arrays: array %d %s: its data at %p is not aligned to %zu bytes (its elements); align "
                            "it or pass copy = true",
                            k, sig, a->data, ct_dtype_size(a->dtype));
    return CT_OK;
}

ct_status ct_arrays_stream_new(ct_stream **out, const ct_tensor *arrays, int n, bool copy, ct_error *err) {
    CT_ASSERT(out);
    *out = NULL;
    CT_STREAM_CHECK(n >= 1 && n <= CT_BATCH_MAX_TENSORS, err,
                    "arrays: n is %d; expected 1..%d arrays (CT_BATCH_MAX_TENSORS)", n, CT_BATCH_MAX_TENSORS);
    CT_STREAM_CHECK(arrays != NULL, err, "arrays: the arrays pointer is NULL (n is %d)", n);
    size_t bytes[CT_BATCH_MAX_TENSORS], item_bytes[CT_BATCH_MAX_TENSORS], total = 0;
    for (int k = 0; k < n; k++) {
        CT_TRY(check_array(arrays, k, copy, &bytes[k], &item_bytes[k], err));
        // The copies' block: each array 16-aligned after the one before.
        CT_STREAM_CHECK(total <= (size_t)PTRDIFF_MAX - ct_round16(bytes[k]), err,
                        "arrays: the %d arrays are too large together: their sizes overflow", n);
        total += ct_round16(bytes[k]);
    }

    arrays_data *d = ct_calloc(1, sizeof *d);
    d->n = n;
    d->rows = arrays[0].shape[0];
    if (copy) {
        // The bytes come from the caller's shapes: the checked path.
        d->copy = ct_calloc_checked(1, total, err, "arrays: a copy of the %d arrays", n);
        if (!d->copy) {
            ct_free(d);
            return CT_ERR_MEMORY;
        }
    }
    ct_stream *s = ct_stream_alloc(&arrays_ops, NULL, d);
    char *at = d->copy;
    s->n_out = n;
    s->length = d->rows;
    ct_stream_mix(s, (uint64_t)n);
    for (int k = 0; k < n; k++) {
        const ct_tensor *a = &arrays[k];
        if (copy) {
            void *dst = ct_carve(&at, bytes[k]);
            memcpy(dst, a->data, bytes[k]);
            d->base[k] = dst;
            d->copy_bytes += bytes[k];
        } else {
            d->base[k] = a->data;
        }
        d->item_bytes[k] = item_bytes[k];
        // An item: the array's dims after the first.
        s->sigs[k] = ct_tensor_make(a->dtype, a->ndim - 1, a->shape + 1, NULL);
        // The fingerprint: dtype, shape and a CRC-32 of every byte, so a
        // cursor saved on other data (or the same bytes in another shape) is
        // refused. One pass over the data, here and never again.
        ct_stream_mix(s, (uint64_t)a->dtype);
        ct_stream_mix(s, (uint64_t)a->ndim);
        for (int i = 0; i < a->ndim; i++) ct_stream_mix(s, (uint64_t)a->shape[i]);
        ct_stream_mix(s, crc32_z(crc32(0L, Z_NULL, 0), (const Bytef *)d->base[k], bytes[k]));
    }
    *out = s;
    return CT_OK;
}
