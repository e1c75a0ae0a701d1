// Matrix products through OpenBLAS (cblas_sgemm), llm.c style: plain arrays,
// outputs first, shapes in the comment. Backward writes the input gradient
// and adds into the weight and bias gradients.
#ifndef CTRAX_KERNELS_CPU_MATMUL_H
#define CTRAX_KERNELS_CPU_MATMUL_H

#include <stdbool.h>
#include <stdint.h>

// inp (N, C), weight (C, OC), bias (OC) or NULL -> out (N, OC)
void ct_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                       int64_t C, int64_t OC);
// dout (N, OC) -> dinp (N, C) = dout W^T (written; skipped if dinp is NULL),
// dweight (C, OC) += inp^T dout, dbias (OC) += sum over N of dout (if not
// NULL). scratch: ct_matmul_weight_grad_scratch_floats(N, C, OC) floats
// (NULL where that is 0).
void ct_matmul_backward(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout,
                        const float *inp, const float *weight, int64_t N, int64_t C, int64_t OC);
// dweight (C, OC) += inp (N, C)^T dout (N, OC) and dbias (OC) += the sum of
// dout's rows (if not NULL), the N rows cut into ct_matmul_weight_grad_parts
// parts (one thread's product and bias sum each) whose sums meet in scratch:
// (parts - 1) (C + 1) OC floats. The parts follow the shape and the
// machine's cores, never the thread count.
void ct_matmul_weight_grad(float *dweight, float *dbias, float *scratch, const float *inp, const float *dout,
                           int64_t N, int64_t C, int64_t OC);
int ct_matmul_weight_grad_parts(int64_t N, int64_t C, int64_t OC);
int64_t ct_matmul_weight_grad_scratch_floats(int64_t N, int64_t C, int64_t OC);
// The plain loops of the two ct_matmul_ above (bias copy and bias gradient),
// for tests/test_kernels.c; bitwise the same results.
void ct_matmul_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                           int64_t C, int64_t OC);
void ct_matmul_backward_ref(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C, int64_t OC);

// C (M, N) = alpha * op(A) op(B) + beta * C, row-major; op transposes if the
// flag is set. Every kernel's one way into BLAS. The same bits at any thread
// count: the product is cut into pieces by its shape alone (matmul.c).
void ct_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

// How many pieces ct_sgemm cuts a product with C (M, N) and inner size K
// into: the machine's cores (at most CT_SGEMM_MAX_PARTS), fewer where a piece
// would have under CT_SGEMM_BLOCK_MIN rows (columns) on C's longer side or
// under CT_SGEMM_BLOCK_FLOPS of work. Never the thread count.
#define CT_SGEMM_MAX_PARTS 64
#define CT_SGEMM_BLOCK_MIN 64
#define CT_SGEMM_BLOCK_FLOPS 8e6
int ct_sgemm_blocks(int64_t M, int64_t N, int64_t K);

#endif
