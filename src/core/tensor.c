#include "ctrax/core/tensor.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctrax/core/error.h"

size_t ct_dtype_size(ct_dtype dtype) {
    switch (dtype) {
    case CT_DTYPE_F32: return 4;
    case CT_DTYPE_I32: return 4;
    case CT_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *ct_dtype_name(ct_dtype dtype) {
    switch (dtype) {
    case CT_DTYPE_F32: return "f32";
    case CT_DTYPE_I32: return "i32";
    case CT_DTYPE_BF16: return "bf16";
    }
    return "?";
}

ct_tensor ct_tensor_make(ct_dtype dtype, int ndim, const int64_t *shape, void *data) {
    CT_ASSERT(ndim >= 0 && ndim <= CT_MAX_DIMS);
    ct_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dtype;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
    t.data = data;
    return t;
}

ct_tensor ct_tensor_1d(ct_dtype dtype, int64_t d0, void *data) {
    return ct_tensor_make(dtype, 1, (int64_t[]){d0}, data);
}
ct_tensor ct_tensor_2d(ct_dtype dtype, int64_t d0, int64_t d1, void *data) {
    return ct_tensor_make(dtype, 2, (int64_t[]){d0, d1}, data);
}
ct_tensor ct_tensor_3d(ct_dtype dtype, int64_t d0, int64_t d1, int64_t d2, void *data) {
    return ct_tensor_make(dtype, 3, (int64_t[]){d0, d1, d2}, data);
}

ct_tensor ct_tensor_sig(const ct_tensor *t) {
    ct_tensor s = *t;
    s.data = NULL;
    return s;
}

ct_tensor ct_tensor_split_rows(const ct_tensor *t, int n_parts, int part) {
    CT_ASSERT(t->ndim >= 1 && n_parts >= 1 && part >= 0 && part < n_parts && t->shape[0] % n_parts == 0);
    ct_tensor s = *t;
    int64_t rows = t->shape[0] / n_parts;
    size_t row_bytes = t->shape[0] ? ct_tensor_nbytes(t) / (size_t)t->shape[0] : 0;
    s.shape[0] = rows;
    if (s.data) s.data = (char *)s.data + (size_t)(part * rows) * row_bytes;
    return s;
}

int64_t ct_tensor_dims_product(const ct_tensor *t, int from, int to) {
    // A product too large for int64 is INT64_MAX, which every size check
    // refuses; a zero dimension anywhere still makes it 0.
    for (int i = from; i < to; i++)
        if (t->shape[i] == 0) return 0;
    int64_t n = 1;
    for (int i = from; i < to; i++)
        if (__builtin_mul_overflow(n, t->shape[i], &n)) return INT64_MAX;
    return n;
}

int64_t ct_tensor_numel(const ct_tensor *t) { return ct_tensor_dims_product(t, 0, t->ndim); }

size_t ct_tensor_nbytes(const ct_tensor *t) {
    size_t n = (size_t)ct_tensor_numel(t), size = ct_dtype_size(t->dtype);
    return size && n > SIZE_MAX / size ? SIZE_MAX : n * size;
}

bool ct_tensor_same_sig(const ct_tensor *a, const ct_tensor *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

char *ct_tensor_sig_str(const ct_tensor *t, char *buf, size_t len) {
    size_t pos = 0;
    pos += (size_t)snprintf(buf + pos, len - pos, "(");
    for (int i = 0; i < t->ndim && pos < len; i++)
        pos += (size_t)snprintf(buf + pos, len - pos, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (pos < len) snprintf(buf + pos, len - pos, ") %s", ct_dtype_name(t->dtype));
    return buf;
}

int64_t ct_f32_first_nonfinite(const float *x, int64_t n) {
    const int64_t block = 4096;
    for (int64_t b = 0; b < n; b += block) {
        int64_t e = b + block < n ? b + block : n;
        uint32_t bad = 0;
        for (int64_t i = b; i < e; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;  // exponent all ones: Inf or NaN
        }
        if (bad)
            for (int64_t i = b; i < e; i++)
                if (!isfinite(x[i])) return i;
    }
    return n;
}
