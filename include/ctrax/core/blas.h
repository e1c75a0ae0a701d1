// The BLAS behind ctrax's matrix products (OpenBLAS, OpenMP build) and the
// kernel it runs on this CPU.
#ifndef CTRAX_CORE_BLAS_H
#define CTRAX_CORE_BLAS_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// OpenBLAS's description of itself ("OpenBLAS 0.3.21 NO_LAPACKE
// DYNAMIC_ARCH NO_AFFINITY USE_OPENMP SkylakeX MAX_THREADS=64": version,
// build options, the kernel it runs, its thread limit).
const char *ct_blas_config(void);

// OpenBLAS's name for the kernel it runs: "SkylakeX", "Haswell", "Zen",
// or a generic one ("Prescott", ...) when its table of CPU models does not
// know this CPU (Debian 12's OpenBLAS 0.3.21 on newer Intel Xeons).
const char *ct_blas_core(void);

// When OpenBLAS runs a kernel narrower than this CPU's vectors, the
// OpenBLAS kernel its features run: "SkylakeX" on a CPU with AVX-512 (F,
// BW, DQ, VL), "Haswell" on one with AVX2 and FMA; NULL when OpenBLAS's
// own choice is as wide. OpenBLAS picks from a table of CPU models: on a
// model it does not know it falls back to a generic SSE3 kernel (Debian
// 12's 0.3.21 on newer Xeons: SkylakeX runs 4-5x its sgemm); an AVX2
// kernel on an AVX-512 CPU loses less but still much (SkylakeX ran 1.8x
// Haswell on an AMD Zen 5). It is chosen from the CPU's features, never
// from a table of models.
// OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, so a program applies
// the choice by setting that variable and executing itself again, before it
// does anything else (`ctrax` does; tools/ctrax.c). A library user can set
// OPENBLAS_CORETYPE in the environment.
const char *ct_blas_vector_core(void);

// Whether OpenBLAS's kernel `core` (a ct_blas_core() name) is one of its
// x86-64 vector kernels (Haswell, Zen, SkylakeX, Cooperlake,
// SapphireRapids: AVX2 or AVX-512); false for the generic ones.
bool ct_blas_core_is_vector(const char *core);

// Threads for ctrax's OpenMP loops and the GEMM together: OpenBLAS's
// OpenMP build sizes each call from omp_get_max_threads(), so one
// omp_set_num_threads covers both; openblas_set_num_threads is called too,
// so a pthreads OpenBLAS follows as well. n >= 1. Set it before building a
// model: kernels size per-thread scratch from it (ct_blas_thread_slots).
void ct_blas_set_threads(int n);
// The thread count ctrax's loops and the GEMM use now (omp_get_max_threads()).
int ct_blas_threads(void);
// Sets the count for now, as ct_blas_set_threads, but not the thread slots
// below: what ct_blas_threads_fit calls between steps.
void ct_blas_use_threads(int n);
// Thread slots: how many threads' scratch a kernel sizes its work area for:
// the count ct_blas_set_threads last set or, where it was never called, the
// count before ct_blas_use_threads first changed it (or the count now, if
// larger). A step's memory then does not follow the count the fit picks:
// sized by the count of the moment, an arena planned while the fit held 1
// thread of 2 (an evaluator's, planned at its first batch) outgrew its plan
// at 2 and took a second block twice its size (configs/fortunes_long.gin,
// its first evals under a load that then went: peak RSS 245,308 against
// 168,300 KB).
int ct_blas_thread_slots(void);
// The threads a loop over n_slots slots runs with now: the fewer of n_slots
// and the count now (a slot's scratch is its thread's, by thread number).
int ct_blas_slot_threads(int n_slots);

// Denormal floats flushed to zero (x86's FTZ and DAZ) in the calling thread
// and every thread of its OpenMP pool (threads started later inherit the
// setting from the thread that starts them). Values below 2^-126 are lost,
// as under XLA's CPU backend; in exchange no step slows down when values
// decay into that range (Adam's first moments of weights that get no
// gradient reach it after about 800 steps: a ReformerLM's steps took 1.3-1.5x
// as long from then on). ct_net_init calls it, so every model runs so;
// elsewhere (AArch64 included) it does nothing.
void ct_cpu_flush_denormals(void);

// How long an idle OpenMP thread polls for work before it sleeps, in
// libgomp's polls (GOMP_SPINCOUNT; each poll a load and a pause
// instruction), as `ctrax` sets it when the user set neither
// GOMP_SPINCOUNT nor OMP_WAIT_POLICY: libgomp's own default. Sleeping at
// once (passive) made each of a step's few hundred parallel loops and GEMMs
// wait for a thread to be woken: TransformerLM config A of bench/lm_speed
// ran 8% slower (2 threads, idle machine). A short spin (20,000 polls, the
// value before 2026-12-03) was as costly on a virtual machine whose host
// took a third of its CPU time: a CPU that sleeps waits for the host to
// run it again, and config A ran 1,920-2,838 tokens/s against 3,452-4,832
// with this spin (3 alternating pairs, bench_lm_speed). A spinning thread
// on a core another process keeps busy made a step 14x slower
// (bench/threads.sh): the fitted thread count below keeps threads off such
// a core.
#define CT_OMP_SPINCOUNT "300000"

// Fitting the thread count to the cores other processes leave free. Idle
// threads that sleep (OMP_WAIT_POLICY=passive) stop a busy core from
// stealing a spinning thread's time, but every parallel loop and GEMM still
// splits its work evenly and waits for its slowest thread: a thread that
// shares a core with another process's work makes each step wait for that
// core's time slices (copy.gin, 2 threads, one core busy: a third of one
// thread's speed alone; bench/threads.sh). So the trainer gives the loops
// only the cores that are free, and takes them back when they are free again.
typedef struct ct_thread_fit {
    double t, machine_busy_s, self_s;  // the last measurement: time, busy CPU seconds of the machine and of this process
    double others;                     // cores other processes kept busy over the last interval
    int threads;                       // the count set (0: not measured yet)
} ct_thread_fit;

// Call between steps, from the thread that runs them (the count is that
// thread's OpenMP setting), with *f zeroed before the first call. At most
// every interval_s seconds it measures the CPU time the machine spent busy
// (/proc/stat) less this process's own (getrusage), i.e. the cores other
// processes kept busy, b, and sets the thread count (ct_blas_use_threads) to
// the cores left, rounded down where another process keeps at least 0.4 of
// a core busy, between 1 and max_threads. Returns the count now: unchanged
// between measurements, max_threads before the first and where /proc/stat
// cannot be read. Results do not depend on the count (the kernels' sums
// have a fixed order), so a run stays exactly reproducible.
int ct_blas_threads_fit(ct_thread_fit *f, int max_threads, double interval_s);

// Measures single-precision GEMM, C (M, N) = A (M, K) B (K, N), through the
// library's own call into BLAS (ct_sgemm), repeated for at least `seconds`
// after one warm-up call, on the current thread count. Returns GFLOP/s
// (2 M N K per product), or a negative number when the operands cannot be
// allocated.
double ct_blas_sgemm_gflops(int64_t M, int64_t N, int64_t K, double seconds);

#ifdef __cplusplus
}
#endif
#endif
