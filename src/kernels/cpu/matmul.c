#include "kernels/cpu/matmul.h"

#include <cblas.h>

void ct_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C,
                (blasint)ldc);
}

void ct_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                       int64_t C, int64_t OC) {
    float beta = 0.0f;
    if (bias) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) out[n * OC + o] = bias[o];
        beta = 1.0f;
    }
    ct_sgemm(false, false, N, OC, C, 1.0f, inp, C, weight, OC, beta, out, OC);
}

void ct_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                        const float *weight, int64_t N, int64_t C, int64_t OC) {
    if (dinp) ct_sgemm(false, true, N, C, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, C);
    ct_sgemm(true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
    if (dbias)
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) dbias[o] += dout[n * OC + o];
}
