// Corpus files (src/data/text.c, tokens.c): byte-level text or binary token
// files. The input is
//   byte 0   flags: 1 token files (else text), 2 four-byte tokens (else two),
//            4 shifted, 8 split in train and eval (else all), 16 skip binary
//            text files, 32 the file given through its directory
//   byte 1   seq_len - 1 (1..256)
//   byte 2   vocab_size for token files (0: unchecked)
//   the rest the file
// The harness opens the stream, reads up to 64 examples, seeks around.
#include <stdint.h>

#include "ctrax/data/stream.h"
#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint32_t flags = fuzz_take(&data, &size, 1);
    int seq_len = (int)fuzz_take(&data, &size, 1) + 1;
    int64_t vocab = fuzz_take(&data, &size, 1);
    char path[1024];
    fuzz_write(path, sizeof path, "corpus/part-0", data, size);
    if (flags & 32) fuzz_path(path, sizeof path, "corpus");
    const char *paths[1] = {path};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = seq_len;
    p.shifted = flags & 4;
    p.split = flags & 8 ? CT_DATA_SPLIT_TRAIN : CT_DATA_SPLIT_ALL;
    p.eval_fraction = 0.25;
    p.skip_binary = flags & 16;
    p.token_bytes = flags & 2 ? 4 : 2;
    p.vocab_size = vocab;
    ct_stream *s;
    ct_error err;
    ct_status st = flags & 1 ? ct_token_stream_new(&s, &p, &err) : ct_text_stream_new(&s, &p, &err);
    if (st != CT_OK) return 0;
    int64_t len = ct_stream_length(s);
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < 64; i++) {
            ct_batch b;
            if (ct_stream_next(s, &b, &err) != CT_OK || b.n == 0) break;
            for (int t = 0; t < b.n; t++) fuzz_touch(b.t[t].data, ct_tensor_nbytes(&b.t[t]));
        }
        if (ct_stream_seek(s, k == 0 && len > 0 ? len - 1 : 0, &err) != CT_OK) break;
    }
    ct_stream_free(s);
    return 0;
}
