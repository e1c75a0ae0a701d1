#include "kernels/cpu/matmul.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#if defined(__SSE2__)
#include <xmmintrin.h>
#endif
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/clock.h"
#include "ctrax/core/blas.h"
#include "core/clones.h"

// Below this many output floats the bias copy and the bias gradient stay on
// one thread (waking the others costs more than the loop).
#define CT_MATMUL_PARALLEL_MIN 65536

// The most pieces a product is cut into: the machine's cores, read once, so
// that the cut never depends on the thread count of the moment.
static int g_sgemm_parts;
static void sgemm_parts_init(void) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    g_sgemm_parts = cores < 1 ? 1 : cores > CT_SGEMM_MAX_PARTS ? CT_SGEMM_MAX_PARTS : (int)cores;
}

static int sgemm_parts(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, sgemm_parts_init);
    return g_sgemm_parts;
}

int ct_sgemm_blocks(int64_t M, int64_t N, int64_t K) {
    int64_t blocks = sgemm_parts();
    int64_t by_side = (M >= N ? M : N) / CT_SGEMM_BLOCK_MIN;
    int64_t by_flops = (int64_t)(2.0 * (double)M * (double)N * (double)K / CT_SGEMM_BLOCK_FLOPS);
    if (blocks > by_side) blocks = by_side;
    if (blocks > by_flops) blocks = by_flops;
    return blocks < 1 ? 1 : (int)blocks;
}

// Piece b of ct_sgemm's cut: `per` rows of C (by_rows) or `per` columns, one
// OpenBLAS call. OpenBLAS's OpenMP build runs it on the calling thread
// inside an active parallel region, or where the thread count is 1.
static void sgemm_piece(int b, int64_t per, bool by_rows, bool trans_a, bool trans_b, int64_t M, int64_t N,
                        int64_t K, float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                        float *C, int64_t ldc) {
    int64_t o = b * per, len = (by_rows ? M : N) - o;
    if (len > per) len = per;
    if (len <= 0) return;
    if (by_rows) A = trans_a ? A + o : A + o * lda, C += o * ldc, M = len;
    else B = trans_b ? B + o * ldb : B + o, C += o, N = len;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                (blasint)M, (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C,
                (blasint)ldc);
}

// OpenBLAS cuts a product among its threads by their number, and on some
// kernels and shapes the cut changes how elements are summed (SkylakeX: K
// over 448 and not 0 or 31 modulo 32; Haswell and the generic kernel: almost
// any K), so the bits would follow the thread count, which follows what
// other processes leave free (ct_blas_threads_fit). ctrax cuts instead, by
// the shape alone: C's longer side into ct_sgemm_blocks pieces, whole
// multiples of CT_SGEMM_BLOCK_MIN but the last, each a single-threaded
// OpenBLAS call; the threads share the pieces. Each piece packs the other
// operand again, so the cut goes across the longer side, repeating the
// smaller operand (measured on TransformerLM's shapes at 1 and 2 threads:
// two pieces as fast as OpenBLAS's own threads, within the noise). A
// square C is cut into columns: single-threaded pieces of M = N = 256
// (K 256 or 2,048, every transpose) ran 2-10% faster as (256, 128) than as
// (128, 256) on OpenBLAS's SkylakeX kernel and -2 to +4% on Haswell's; at
// 512 within 3%. (Config A's weight gradients of d_model x d_model.)
void ct_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int blocks = ct_sgemm_blocks(M, N, K);
    bool by_rows = M > N;
    int64_t side = by_rows ? M : N;
    int64_t per = ((side + blocks - 1) / blocks + CT_SGEMM_BLOCK_MIN - 1) / CT_SGEMM_BLOCK_MIN * CT_SGEMM_BLOCK_MIN;
    int icv = omp_get_max_threads(), threads = icv < blocks ? icv : blocks;
    if (threads > 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int b = 0; b < blocks; b++)
            sgemm_piece(b, per, by_rows, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (icv > 1) omp_set_num_threads(1);  // else OpenBLAS would start its own threads
    for (int b = 0; b < blocks; b++)
        sgemm_piece(b, per, by_rows, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (icv > 1) omp_set_num_threads(icv);
}

// The bias is copied row by row (memcpy, not a scalar loop: it was 2% of a
// TransformerLM step) and the GEMM adds the product to it, as before. The
// rows are copied by the threads the GEMM then uses: run serially, the copy
// left the second core idle for 1-2% of a two-thread step.
void ct_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                       int64_t C, int64_t OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for schedule(static) if (N * OC > CT_MATMUL_PARALLEL_MIN)
        for (int64_t n = 0; n < N; n++) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    ct_sgemm(false, false, N, OC, C, 1.0f, inp, C, weight, OC, beta, out, OC);
}

// dbias (OC) += sum over the N rows of dout (N, OC), row after row: each
// column's sum is in row order whatever the vector width or the thread
// count, so the bits are the scalar loop's (ct_matmul_backward_ref; where
// ct_matmul_weight_grad cuts the rows into parts, each part's rows). The
// threads take blocks of columns (a serial loop was 1% of a two-thread
// step, the other core idle). `simd` because GCC's -O2 cost model leaves a
// loop whose arrays may overlap scalar (it was 3% of a step).
CT_CLONES
static void bias_grad_cols(float *dbias, const float *dout, int64_t N, int64_t OC, int64_t o0, int64_t o1) {
    for (int64_t n = 0; n < N; n++) {
        const float *row = dout + n * OC;
#pragma omp simd
        for (int64_t o = o0; o < o1; o++) dbias[o] += row[o];
    }
}

static void bias_grad(float *dbias, const float *dout, int64_t N, int64_t OC) {
    enum { COLS = 64 };  // a block: 256 bytes of each row
    int64_t n_blocks = (OC + COLS - 1) / COLS;
#pragma omp parallel for schedule(static) if (N * OC > CT_MATMUL_PARALLEL_MIN && n_blocks > 1)
    for (int64_t b = 0; b < n_blocks; b++)
        bias_grad_cols(dbias, dout, N, OC, b * COLS, b * COLS + COLS < OC ? b * COLS + COLS : OC);
}

int ct_matmul_weight_grad_parts(int64_t N, int64_t C, int64_t OC) {
    const int64_t side = C > OC ? C : OC;
    if (N < 2 * side) return 1;
    int64_t parts = sgemm_parts(), by_len = N / side;
    int64_t by_flops = (int64_t)(2.0 * (double)N * (double)C * (double)OC / CT_SGEMM_BLOCK_FLOPS);
    if (parts > by_len) parts = by_len;
    if (parts > by_flops) parts = by_flops;
    while (parts > 1 && (parts - 1) * ((N + parts - 1) / parts) >= N) parts--;  // every part has rows
    return parts < 1 ? 1 : (int)parts;
}

int64_t ct_matmul_weight_grad_scratch_floats(int64_t N, int64_t C, int64_t OC) {
    return (int64_t)(ct_matmul_weight_grad_parts(N, C, OC) - 1) * (C + 1) * OC;
}

// Part p of the rows, [p per, (p + 1) per): dweight += inp_p^T dout_p and
// dbias += its rows of dout in order (part 0), or the same written into the
// scratch (the others: (C, OC) at (p - 1) C OC, (OC) after all of those).
// One single-threaded OpenBLAS call and one pass over the rows it just read.
static void weight_grad_part(int p, int parts, int64_t per, float *dweight, float *dbias, float *scratch,
                             const float *inp, const float *dout, int64_t N, int64_t C, int64_t OC) {
    const int64_t n0 = p * per, len = N - n0 < per ? N - n0 : per;
    float *dw = p == 0 ? dweight : scratch + (p - 1) * C * OC;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (blasint)C, (blasint)OC, (blasint)len, 1.0f,
                inp + n0 * C, (blasint)C, dout + n0 * OC, (blasint)OC, p == 0 ? 1.0f : 0.0f, dw, (blasint)OC);
    if (!dbias) return;
    float *db = p == 0 ? dbias : scratch + (parts - 1) * C * OC + (p - 1) * OC;
    if (p > 0) memset(db, 0, (size_t)OC * sizeof(float));
    bias_grad_cols(db, dout + n0 * OC, len, OC, 0, OC);
}

// Row r of dst (rows of OC) += the same row of each further part's sum, in
// part order; part p - 1's rows start at parts_at + (p - 1) part_floats.
CT_CLONES
static void add_parts_row(float *dst, const float *parts_at, int64_t part_floats, int parts, int64_t OC, int64_t r) {
    float *row = dst + r * OC;
    for (int p = 1; p < parts; p++) {
        const float *part = parts_at + (p - 1) * part_floats + r * OC;
#pragma omp simd
        for (int64_t o = 0; o < OC; o++) row[o] += part[o];
    }
}

// The weight gradient sums over the N rows (tokens), usually far more than
// either side of dweight. ct_sgemm would cut dweight's longer side, and
// each piece would pack all of inp (or dout) again; cutting the rows gives
// each thread its own rows of both, at the cost of a (C, OC) scratch per
// further part and one pass adding them. Measured, two threads, N 2048,
// operands cold: (C, OC) (256, 256) 0.99 -> 0.87 ms, (256, 1024) 3.56-3.67
// -> 3.36-3.41, (1024, 256) 3.33-3.37 -> 3.20-3.30, (512, 512) 3.14 ->
// 3.07; (2048, 512), N no more than twice the longer side, 11.39 -> 11.59:
// such shapes keep ct_sgemm's cut. Each part's bias sum follows its product
// over the same rows, not a pass of its own over all of dout (Transformer
// A's step, 8 alternating pairs: 0.988 of the step time). The parts follow
// the shape and the machine's cores, never the thread count, so the bits
// do not either.
void ct_matmul_weight_grad(float *dweight, float *dbias, float *scratch, const float *inp, const float *dout,
                           int64_t N, int64_t C, int64_t OC) {
    const int parts = ct_matmul_weight_grad_parts(N, C, OC);
    if (parts == 1) {
        ct_sgemm(true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
        if (dbias) bias_grad(dbias, dout, N, OC);
        return;
    }
    const int64_t per = (N + parts - 1) / parts;
    const int icv = omp_get_max_threads(), threads = icv < parts ? icv : parts;
    if (threads > 1) {
#pragma omp parallel num_threads(threads)
        {
#pragma omp for schedule(static)
            for (int p = 0; p < parts; p++)
                weight_grad_part(p, parts, per, dweight, dbias, scratch, inp, dout, N, C, OC);
#pragma omp for schedule(static)
            for (int64_t r = 0; r < C; r++) add_parts_row(dweight, scratch, C * OC, parts, OC, r);
        }
    } else {
        if (icv > 1) omp_set_num_threads(1);  // else OpenBLAS would start its own threads
        for (int p = 0; p < parts; p++) weight_grad_part(p, parts, per, dweight, dbias, scratch, inp, dout, N, C, OC);
        if (icv > 1) omp_set_num_threads(icv);
        for (int64_t r = 0; r < C; r++) add_parts_row(dweight, scratch, C * OC, parts, OC, r);
    }
    if (dbias) add_parts_row(dbias, scratch + (parts - 1) * C * OC, OC, parts, OC, 0);
}

// dinp is written (beta 0), not added to: the input gradient is the
// caller's own buffer, so zeroing it first was a wasted pass (a memset, 1%
// of a TransformerLM step).
void ct_matmul_backward(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout,
                        const float *inp, const float *weight, int64_t N, int64_t C, int64_t OC) {
    if (dinp) ct_sgemm(false, true, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C);
    ct_matmul_weight_grad(dweight, dbias, scratch, inp, dout, N, C, OC);
}

void ct_matmul_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                           int64_t C, int64_t OC) {
    float beta = 0.0f;
    if (bias) {
        for (int64_t n = 0; n < N; n++)
            for (int64_t o = 0; o < OC; o++) out[n * OC + o] = bias[o];
        beta = 1.0f;
    }
    ct_sgemm(false, false, N, OC, C, 1.0f, inp, C, weight, OC, beta, out, OC);
}

void ct_matmul_backward_ref(float *dinp, float *dweight, float *dbias, float *scratch, const float *dout,
                            const float *inp, const float *weight, int64_t N, int64_t C, int64_t OC) {
    if (dinp) ct_sgemm(false, true, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp, C);
    ct_matmul_weight_grad(dweight, NULL, scratch, inp, dout, N, C, OC);
    if (!dbias) return;
    // Row order within each of ct_matmul_weight_grad's parts (part 0 onto
    // dbias, the others from 0), then the parts' sums in order.
    const int parts = ct_matmul_weight_grad_parts(N, C, OC);
    const int64_t per = (N + parts - 1) / parts;
    for (int64_t o = 0; o < OC; o++) {
        float total = dbias[o];
        for (int p = 0; p < parts; p++) {
            float sum = p == 0 ? total : 0.0f;
            for (int64_t n = p * per; n < N && n < (p + 1) * per; n++) sum += dout[n * OC + o];
            total = p == 0 ? sum : total + sum;
        }
        dbias[o] = total;
    }
}

const char *ct_blas_config(void) { return openblas_get_config(); }

const char *ct_blas_core(void) { return openblas_get_corename(); }

// OpenBLAS's x86-64 kernels by the widest vectors they use: 2 AVX-512,
// 1 AVX2 with FMA, 0 a generic (SSE) one.
static int core_width(const char *core) {
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    static const char *const avx2[] = {"Haswell", "Zen"};
    for (size_t i = 0; core && i < sizeof avx512 / sizeof *avx512; i++)
        if (strcasecmp(core, avx512[i]) == 0) return 2;
    for (size_t i = 0; core && i < sizeof avx2 / sizeof *avx2; i++)
        if (strcasecmp(core, avx2[i]) == 0) return 1;
    return 0;
}

bool ct_blas_core_is_vector(const char *core) { return core_width(core) > 0; }

// The widest of those kernels this CPU's features run, and its width.
static const char *widest_core(int *width) {
    *width = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
        *width = 2;
        return "SkylakeX";
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        *width = 1;
        return "Haswell";
    }
#endif
    return NULL;
}

const char *ct_blas_vector_core(void) {
    int width;
    const char *widest = widest_core(&width);
    return widest && core_width(openblas_get_corename()) < width ? widest : NULL;
}

// The thread slots: the count ct_blas_set_threads last set or, where it was
// never called, the count before ct_blas_use_threads first changed it (0:
// neither yet). Set and read between steps, from the thread that runs them.
static int g_thread_slots;

static void set_count(int n) {
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

void ct_blas_set_threads(int n) {
    if (n < 1) n = 1;
    g_thread_slots = n;
    set_count(n);
}

void ct_blas_use_threads(int n) {
    if (!g_thread_slots) g_thread_slots = omp_get_max_threads();  // a count from OMP_NUM_THREADS or the cores
    set_count(n < 1 ? 1 : n);
}

int ct_blas_threads(void) { return omp_get_max_threads(); }

int ct_blas_thread_slots(void) {
    int now = omp_get_max_threads();
    return g_thread_slots > now ? g_thread_slots : now > 0 ? now : 1;
}

int ct_blas_slot_threads(int n_slots) {
    int now = omp_get_max_threads();
    return n_slots < now ? n_slots : now > 0 ? now : 1;
}

static void flush_denormals_here(void) {
#if defined(__SSE2__)
    _mm_setcsr(_mm_getcsr() | 0x8040);  // FTZ (bit 15) and DAZ (bit 6)
#endif
}

void ct_cpu_flush_denormals(void) {
    flush_denormals_here();
#pragma omp parallel
    flush_denormals_here();
}

// CPU seconds the whole machine has spent busy since boot (the first line
// of /proc/stat: user, nice, system, irq, softirq; guest time is in user
// already); negative if unknown. Steal time (a virtual machine's CPUs given
// to other guests by the host) is not counted: it is no process of this
// machine, and every thread of ours loses it alike. Counted, a host taking a
// third of the time cut a run alone to 1 thread every other interval: 41-42
// steps/s against 60-75 with 2 threads (bench/threads.sh, 2026-12-03).
static double machine_busy_s(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1.0;
    unsigned long long v[7] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]);
    fclose(f);
    long tick = sysconf(_SC_CLK_TCK);
    if (n < 7 || tick <= 0) return -1.0;
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6]) / (double)tick;
}

// CPU seconds this process has used (every thread).
static double self_busy_s(void) {
    struct rusage u;
    if (getrusage(RUSAGE_SELF, &u)) return -1.0;
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
           1e-6 * (double)u.ru_stime.tv_usec;
}

int ct_blas_threads_fit(ct_thread_fit *f, int max_threads, double interval_s) {
    if (max_threads < 1) max_threads = 1;
    double now = ct_now_s();
    if (f->t > 0 && now - f->t < interval_s) return f->threads ? f->threads : max_threads;
    double machine = machine_busy_s(), self = self_busy_s();
    if (machine < 0 || self < 0) return max_threads;
    if (f->t > 0 && now > f->t) {
        f->others = fmax(0.0, (machine - f->machine_busy_s - (self - f->self_s)) / (now - f->t));
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        // A core another process keeps 40% busy or more is lost to the
        // loops: their slowest thread sets their pace.
        int free_cores = (int)(cores > 0 ? cores : 1) - (int)floor(f->others + 0.6);
        int threads = free_cores < 1 ? 1 : free_cores > max_threads ? max_threads : free_cores;
        if (threads != f->threads) ct_blas_use_threads(threads);
        f->threads = threads;
    }
    f->t = now;
    f->machine_busy_s = machine;
    f->self_s = self;
    return f->threads ? f->threads : max_threads;
}

double ct_blas_sgemm_gflops(int64_t M, int64_t N, int64_t K, double seconds) {
    // A (M, K), B (K, N), C (M, N) in one block; small values keep C finite.
    size_t na = (size_t)(M * K), nb = (size_t)(K * N), nc = (size_t)(M * N);
    float *mem = malloc((na + nb + nc) * sizeof(float));
    if (!mem) return -1.0;
    float *A = mem, *B = mem + na, *C = B + nb;
    for (size_t i = 0; i < na + nb; i++) mem[i] = (float)((i * 7919u) % 17u) * (1.0f / 64) - 0.125f;
    ct_sgemm(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);  // warm-up: threads started, pages touched
    int64_t reps = 0;
    double t0 = ct_now_s(), t = t0;
    while (reps == 0 || t - t0 < seconds) {
        ct_sgemm(false, false, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
        reps++;
        t = ct_now_s();
    }
    free(mem);
    return 2.0 * (double)M * (double)N * (double)K * (double)reps / (t - t0) * 1e-9;
}
