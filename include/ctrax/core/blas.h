// The BLAS behind ctrax's matrix products (OpenBLAS, OpenMP build) and the
// kernel it runs on this CPU.
#ifndef CTRAX_CORE_BLAS_H
#define CTRAX_CORE_BLAS_H

#ifdef __cplusplus
extern "C" {
#endif

// OpenBLAS's name for the kernel it runs: "SkylakeX", "Haswell", "Zen",
// or a generic one ("Prescott", ...) when its table of CPU models does not
// know this CPU (Debian 12's OpenBLAS 0.3.21 on newer Intel Xeons).
const char *ct_blas_core(void);

// When OpenBLAS runs a generic kernel on a CPU that has AVX-512 (F, BW, DQ,
// VL) or AVX2 with FMA, the OpenBLAS kernel those features run: "SkylakeX"
// or "Haswell" (4-5x the generic kernel's sgemm here); NULL otherwise. It
// is chosen from the CPU's features, never from a table of models.
// OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, so a program applies
// the choice by setting that variable and executing itself again, before it
// does anything else (`ctrax` does; tools/ctrax.c). A library user can set
// OPENBLAS_CORETYPE in the environment.
const char *ct_blas_vector_core(void);

#ifdef __cplusplus
}
#endif
#endif
