// Binary token files (uint16 or uint32, little-endian), for corpora tokenized
// elsewhere. The chunking, split and checks are the text source's (text.c).
#include "data/stream_internal.h"

ct_status ct_token_stream_new(ct_stream **out, const ct_corpus_params *p, ct_error *err) {
    *out = NULL;
    CT_STREAM_CHECK(p->token_bytes == 2 || p->token_bytes == 4, err,
                    "token files: token_bytes is %d; expected 2 (uint16) or 4 (uint32)", p->token_bytes);
    return ct_corpus_stream_new(out, p, p->token_bytes, err);
}
