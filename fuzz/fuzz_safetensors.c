// safetensors reader (src/train/safetensors.c). Opening checks the whole
// header; what it accepts must then be safe to read through the public
// accessors, every tensor's data in range of the mapping. The input is
//   byte 0 = 0   then the file, as is
//   byte 0 = 1   then the header's JSON, a NUL byte, and the data: the harness
//                writes the u64 header length, so that a mutation of the JSON
//                (a key added, a value grown) still reaches the JSON checks
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/train/checkpoint.h"
#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t mode = fuzz_take(&data, &size, 1);
    char path[1024];
    if (mode == 1) {
        const uint8_t *nul = memchr(data, 0, size);
        uint64_t hlen = nul ? (uint64_t)(nul - data) : size;
        size_t rest = nul ? size - hlen - 1 : 0;
        uint8_t *file = malloc(8 + hlen + rest + 1);
        memcpy(file, &hlen, 8);  // little-endian, as x86 and the format are
        memcpy(file + 8, data, hlen);
        if (rest) memcpy(file + 8 + hlen, nul + 1, rest);
        fuzz_write(path, sizeof path, "weights.safetensors", file, 8 + hlen + rest);
        free(file);
    } else {
        fuzz_write(path, sizeof path, "weights.safetensors", data, size);
    }
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
        fuzz_touch(t.data, ct_tensor_nbytes(&t));
    }
    ct_safetensors_metadata(st, "format");
    ct_safetensors_metadata(st, "optimizer");
    ct_safetensors_close(st);
    return 0;
}
