// A small copy task and TransformerLM shared by the Loop tests: sequences
// "0 w 0 w" with w of LEN tokens from VOCAB, in shuffled batches of B, and a
// 1-layer model of width 16 that fits them.
#ifndef CTRAX_TESTS_COPY_FIXTURE_H
#define CTRAX_TESTS_COPY_FIXTURE_H

#include "check.h"
#include "ctrax/ctrax.h"

enum { VOCAB = 10, LEN = 4, B = 4 };

static inline ct_stream *copy_batches(uint64_t seed) {
    ct_copy_task t = {VOCAB, LEN, false, seed, 0};
    ct_stream *s;
    ct_error err;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK_OK(ct_shuffle_stream_new(&s, s, 16, seed + 1, &err), &err);
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = B;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    return s;
}

static inline ct_layer *small_lm(float dropout) {
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = VOCAB;
    p.d_model = 16;
    p.d_ff = 32;
    p.n_layers = 1;
    p.n_heads = 2;
    p.max_len = 2 * LEN + 2;  // "0 w 0 w"
    p.dropout = dropout;
    return ct_transformer_lm(p);
}

#endif
