// IDX image and label files (src/data/idx.c), plain or gzip. The input is
//   byte 0       flags: 1 images file is .gz, 2 labels file is .gz, 4 scale
//   byte 1       n_classes (0: labels unchecked)
//   bytes 2..5   n, the images file's length (little-endian; clamped)
//   n bytes      the images file, the rest the labels file
// Opening reads and checks both files; the harness then reads every example
// (up to 64) and seeks back, touching each tensor.
#include <stdint.h>

#include "ctrax/data/stream.h"
#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t flags = fuzz_take(&data, &size, 1);
    uint32_t n_classes = fuzz_take(&data, &size, 1);
    size_t n_images = fuzz_take(&data, &size, 4);
    if (n_images > size) n_images = size;
    char images[1024], labels[1024];
    fuzz_write(images, sizeof images, flags & 1 ? "images-idx3-ubyte.gz" : "images-idx3-ubyte", data, n_images);
    fuzz_write(labels, sizeof labels, flags & 2 ? "labels-idx1-ubyte.gz" : "labels-idx1-ubyte", data + n_images,
               size - n_images);
    ct_idx_params p = ct_idx_default_params();
    p.images_path = images;
    p.labels_path = labels;
    p.n_classes = (int)n_classes;
    p.scale = flags & 4;
    ct_stream *s;
    ct_error err;
    if (ct_idx_stream_new(&s, &p, &err) != CT_OK) return 0;
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 64; i++) {
            ct_batch b;
            if (ct_stream_next(s, &b, &err) != CT_OK || b.n == 0) break;
            for (int t = 0; t < b.n; t++) fuzz_touch(b.t[t].data, ct_tensor_nbytes(&b.t[t]));
        }
        if (ct_stream_seek(s, 0, &err) != CT_OK) break;
    }
    ct_stream_free(s);
    return 0;
}
