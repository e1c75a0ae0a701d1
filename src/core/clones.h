// CT_CLONES: a vector kernel compiled three times, for AVX-512F, AVX2 and
// the x86-64 baseline (SSE2), the dynamic loader picking the widest this CPU
// has when the program loads (an ifunc per function). One definition, so
// every kernel has the same three (tests/kernel_clones_test.sh runs the
// baseline ones).
//
// Under ThreadSanitizer (-fsanitize=thread) the loader runs the ifunc
// resolvers, instrumented like the rest, before the sanitizer's runtime is
// up, and the program crashes at load: that build compiles the baseline
// only. Elsewhere than x86-64 there is nothing to pick between.
#ifndef CT_CORE_CLONES_H
#define CT_CORE_CLONES_H

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define CT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CT_CLONES
#endif

// CT_CLONES_EXACT: CT_CLONES without contracting a * b + c into one fused
// multiply-add, which the AVX-512 clone could do and the others cannot: so
// every clone gives the same bits (a plain loop's, where a test says
// bitwise). GCC takes the optimize attribute; clang rejects it, and a file
// that uses this macro starts with `#pragma clang fp contract(off)` under
// __clang__ instead.
#if defined(__clang__)
#define CT_CLONES_EXACT CT_CLONES
#else
#define CT_CLONES_EXACT CT_CLONES __attribute__((optimize("fp-contract=off")))
#endif

#endif
