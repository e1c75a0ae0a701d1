// safetensors files: an atomic writer, and a reader that checks everything it maps.
//
// The format (https://github.com/huggingface/safetensors): a u64 little-endian
// header length N, N bytes of JSON
//   {"<tensor name>": {"dtype": "F32" | "I32" | "BF16", "shape": [d0, ...],
//                      "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"<key>": "<string value>", ...}}
// then the data, with offsets relative to the start of the data. ctrax writes
// little-endian data, pads the header with spaces so the data starts at an
// 8-byte aligned file offset, and lays tensors out wider dtypes first so every
// tensor starts at a multiple of its element size. The data has no holes: the
// format forbids them (Hugging Face's reader rejects a file with gaps), so
// tensors are aligned to their element size, not to 8 bytes.
#ifndef CTRAX_TRAIN_SAFETENSORS_H
#define CTRAX_TRAIN_SAFETENSORS_H

#include <stddef.h>

#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// A tensor with the name it is stored under.
typedef struct ct_named_tensor {
    const char *name;
    ct_tensor tensor;  // data must not be NULL unless the tensor has no elements
} ct_named_tensor;

// A string key and value (safetensors __metadata__).
typedef struct ct_kv {
    const char *key;
    const char *value;
} ct_kv;

// Writes a safetensors file at path, atomically: into a temporary file beside
// it, fsync, rename, fsync of the directory. Names must be unique, non-empty and not
// "__metadata__". meta may be NULL when n_meta is 0.
ct_status ct_safetensors_write(const char *path, const ct_named_tensor *tensors, int n, const ct_kv *meta, int n_meta,
                               ct_error *err);

// An opened safetensors file: the file is mapped read-only and its header
// checked completely: header length against the file size, valid JSON, known
// dtypes, shapes of at most CT_MAX_DIMS non-negative dims, numel x dtype size
// == data_offsets end - begin, and offsets that tile the data exactly (in
// range, no overlap, no gap, nothing after the last tensor). An error names
// the file and the tensor.
typedef struct ct_safetensors ct_safetensors;

ct_status ct_safetensors_open(ct_safetensors **out, const char *path, ct_error *err);
void ct_safetensors_close(ct_safetensors *st);

const char *ct_safetensors_path(const ct_safetensors *st);
// Tensors in the order of their data in the file, i in [0, count).
int ct_safetensors_count(const ct_safetensors *st);
const char *ct_safetensors_name(const ct_safetensors *st, int i);
// The tensor's dtype, shape and data. The data points into the read-only
// mapping (valid until close; never write through it). A file ctrax did not
// write may leave it unaligned for its dtype: memcpy it out in that case.
ct_tensor ct_safetensors_tensor(const ct_safetensors *st, int i);
// Index of the tensor called name, -1 if there is none.
int ct_safetensors_find(const ct_safetensors *st, const char *name);
// A __metadata__ value, NULL if the key is absent.
const char *ct_safetensors_metadata(const ct_safetensors *st, const char *key);
// The whole file as mapped.
const void *ct_safetensors_bytes(const ct_safetensors *st, size_t *n_bytes);

#ifdef __cplusplus
}
#endif
#endif
