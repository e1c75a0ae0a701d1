// Embedding lookups and position encodings, llm.c style. Backward adds into
// its outputs.
#ifndef CTRAX_KERNELS_CPU_EMBEDDING_H
#define CTRAX_KERNELS_CPU_EMBEDDING_H

#include <stdint.h>

// ids (N) int32, each in [0, V) (the caller checks), weight (V, C) ->
// out (N, C), out[n] = weight[ids[n]]
void ct_embedding_forward(float *out, const int32_t *ids, const float *weight, int64_t N, int64_t C);
// dout (N, C) -> dweight (V, C) += dout[n] at row ids[n], for n in order,
// so repeated ids sum the same way on every run.
void ct_embedding_backward(float *dweight, const float *dout, const int32_t *ids, int64_t N, int64_t C);

// pe (T, C): the sinusoids of Vaswani et al., pe[t, 2i] = sin(t / 10000^(2i/C)),
// pe[t, 2i+1] = cos(t / 10000^(2i/C)), computed in double.
void ct_positional_sinusoids(float *pe, int64_t T, int64_t C);
// inp (B, TC), pe (TC) -> out (B, TC), out[b] = inp[b] + pe
void ct_positional_forward(float *out, const float *inp, const float *pe, int64_t B, int64_t TC);
// dout (B, TC) -> dpe (TC) += sum over b of dout[b] (b in order): the
// table's gradient (the input's is dout itself, which the layer passes on).
void ct_positional_backward(float *dpe, const float *dout, int64_t B, int64_t TC);

#endif
