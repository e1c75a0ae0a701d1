// Dtypes and tensors.
//
// A tensor is a dtype, a row-major contiguous shape of up to CT_MAX_DIMS dims,
// and a pointer into memory owned by something else (the parameter slab, the
// step arena, or the caller). A tensor whose data is NULL is a signature: the
// shape and dtype a layer will see, used by the init pass before data flows.
#ifndef CTRAX_CORE_TENSOR_H
#define CTRAX_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_dtype {
    CT_DTYPE_F32 = 0,
    CT_DTYPE_I32 = 1,
    CT_DTYPE_BF16 = 2,  // storage type only, for now: no kernel computes in it
} ct_dtype;

#define CT_MAX_DIMS 6

typedef struct ct_tensor {
    ct_dtype dtype;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    void *data;  // NULL for a signature
} ct_tensor;

size_t ct_dtype_size(ct_dtype dtype);
const char *ct_dtype_name(ct_dtype dtype);

// A tensor (or signature, with data NULL) of the given shape.
ct_tensor ct_tensor_make(ct_dtype dtype, int ndim, const int64_t *shape, void *data);
// Shorthands for small fixed ranks: ct_tensor_2d(CT_DTYPE_F32, 4, 8, ptr).
ct_tensor ct_tensor_1d(ct_dtype dtype, int64_t d0, void *data);
ct_tensor ct_tensor_2d(ct_dtype dtype, int64_t d0, int64_t d1, void *data);
ct_tensor ct_tensor_3d(ct_dtype dtype, int64_t d0, int64_t d1, int64_t d2, void *data);
// The signature of t: same dtype and shape, data NULL.
ct_tensor ct_tensor_sig(const ct_tensor *t);
// Part `part` of n_parts equal parts of t along axis 0: rows
// [part * b, (part + 1) * b) with b = shape[0] / n_parts, a view (no copy; a
// signature stays a signature). t must have rank >= 1 and shape[0] divisible
// by n_parts.
ct_tensor ct_tensor_split_rows(const ct_tensor *t, int n_parts, int part);

// A size that does not fit (hostile shapes: (2^40, 2^30) floats) is
// INT64_MAX elements, SIZE_MAX bytes, which every size check refuses,
// never a product that wrapped around to a small one.
int64_t ct_tensor_numel(const ct_tensor *t);
size_t ct_tensor_nbytes(const ct_tensor *t);
// Product of dims [from, to) (INT64_MAX when it does not fit).
int64_t ct_tensor_dims_product(const ct_tensor *t, int from, int to);
// The index of the first NaN or Inf of x[0..n), or n. One pass of integer
// bit tests (vectorizes; no floating-point compare per element).
int64_t ct_f32_first_nonfinite(const float *x, int64_t n);
// Same dtype, rank and dims (data pointers are not compared).
bool ct_tensor_same_sig(const ct_tensor *a, const ct_tensor *b);
static inline float *ct_f32(const ct_tensor *t) { return (float *)t->data; }
static inline int32_t *ct_i32(const ct_tensor *t) { return (int32_t *)t->data; }

// Writes "(4,8) f32" into buf; returns buf.
char *ct_tensor_sig_str(const ct_tensor *t, char *buf, size_t len);
#define CT_SIG_STR_MAX 96

#ifdef __cplusplus
}
#endif
#endif
