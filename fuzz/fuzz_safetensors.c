// safetensors reader (src/train/safetensors.c): the input is the file.
// Opening checks the whole header; what it accepts must then be safe to read
// through the public accessors, every tensor's data in range of the mapping.
#include <stdint.h>

#include "ctrax/train/checkpoint.h"
#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[1024];
    fuzz_write(path, sizeof path, "weights.safetensors", data, size);
    ct_safetensors *st;
    ct_error err;
    if (ct_safetensors_open(&st, path, &err) != CT_OK) return 0;
    size_t n_bytes;
    const void *bytes = ct_safetensors_bytes(st, &n_bytes);
    fuzz_touch(bytes, n_bytes);
    for (int i = 0; i < ct_safetensors_count(st); i++) {
        const char *name = ct_safetensors_name(st, i);
        if (ct_safetensors_find(st, name) != i) __builtin_trap();  // names are unique
        ct_tensor t = ct_safetensors_tensor(st, i);
        fuzz_touch(t.data, (size_t)ct_tensor_nbytes(&t));
    }
    ct_safetensors_metadata(st, "format");
    ct_safetensors_metadata(st, "optimizer");
    ct_safetensors_close(st);
    return 0;
}
