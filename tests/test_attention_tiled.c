// The tiled causal attention kernel (kernels/cpu/attention.h) against the
// whole-matrix reference kernel: forward and backward for several lengths,
// head counts and tile sizes, with and without dropout (the mask a function
// of the position, not of the tiling); bitwise the same with 1 and 2
// threads; scores spanning more than exp's range across key blocks;
// gradient checks of DotProductCausalAttention over several tiles;
// and the layer's memory at T = 1024, which must hold no T x T tensor.
#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/attention.h"
#include "layer_fixture.h"

// One problem: B, T, NH heads of hs, q k v (B, T, C), the output gradient.
typedef struct problem {
    int64_t B, T, NH, hs, C;
    float *q, *k, *v, *dout;
} problem;

static problem problem_new(int64_t B, int64_t T, int64_t NH, int64_t hs, uint64_t seed) {
    problem p = {B, T, NH, hs, NH * hs, NULL, NULL, NULL, NULL};
    int64_t n = B * T * p.C;
    float **bufs[4] = {&p.q, &p.k, &p.v, &p.dout};
    for (int i = 0; i < 4; i++) {
        *bufs[i] = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
        ct_tensor t = ct_tensor_1d(CT_DTYPE_F32, n, *bufs[i]);
        // Scores of a few units: softmax rows that are neither flat nor one-hot.
        gradcheck_fill(&t, seed * 10 + (uint64_t)i, i < 2 ? -2.0f : -1.0f, i < 2 ? 2.0f : 1.0f);
    }
    return p;
}

static void problem_free(problem *p) { free(p->q), free(p->k), free(p->v), free(p->dout); }

// out (B,T,C), dq, dk, dv (B,T,C): one kernel's results.
typedef struct results {
    float *out, *dq, *dk, *dv;
} results;

static results results_new(const problem *p) {
    size_t n = (size_t)(p->B * p->T * p->C > 0 ? p->B * p->T * p->C : 1);
    return (results){malloc(n * sizeof(float)), calloc(n, sizeof(float)), calloc(n, sizeof(float)),
                     calloc(n, sizeof(float))};
}

static void results_free(results *r) { free(r->out), free(r->dq), free(r->dk), free(r->dv); }

static void run_ref(results *r, const problem *p, ct_key key, float rate) {
    int slots = ct_attention_n_slots();
    float *att = malloc((size_t)(p->B * p->NH * p->T * p->T + 1) * sizeof(float));
    float *sf = malloc((size_t)(slots * ct_attention_ref_scratch_floats(p->T, rate, false) + 1) * sizeof(float));
    float *sb = malloc((size_t)(slots * ct_attention_ref_scratch_floats(p->T, rate, true) + 1) * sizeof(float));
    ct_attention_forward_ref(r->out, att, p->q, p->k, p->v, sf, slots, key, rate, p->B, p->T, p->C, p->NH);
    ct_attention_backward_ref(r->dq, r->dk, r->dv, sb, slots, p->dout, att, p->q, p->k, p->v, key, rate, p->B, p->T,
                              p->C, p->NH);
    free(att), free(sf), free(sb);
}

// The tiled kernel; lse (B, NH, T) is returned for the caller to free.
static float *run_tiled(results *r, const problem *p, ct_key key, float rate, int64_t tile) {
    int slots = ct_attention_n_slots();
    float *lse = malloc((size_t)(p->B * p->NH * p->T + 1) * sizeof(float));
    float *sf = malloc((size_t)ct_attention_scratch_floats(tile, false) * slots * sizeof(float));
    float *sb = malloc((size_t)ct_attention_scratch_floats(tile, true) * slots * sizeof(float));
    ct_attention_forward(r->out, lse, p->q, p->k, p->v, sf, slots, key, rate, p->B, p->T, p->C, p->NH, tile);
    // The tiled backward writes its gradients, so it gets them full of NaN:
    // an element it left would show in every comparison.
    for (int64_t i = 0; i < p->B * p->T * p->C; i++) r->dq[i] = r->dk[i] = r->dv[i] = NAN;
    ct_attention_backward(r->dq, r->dk, r->dv, sb, slots, p->dout, r->out, lse, p->q, p->k, p->v, key, rate, p->B,
                          p->T, p->C, p->NH, tile);
    free(sf), free(sb);
    return lse;
}

// max |a - b| / max |b| over n elements (0 when both are all zeros).
static double rel_diff(const float *a, const float *b, int64_t n) {
    double md = 0, mb = 0;
    for (int64_t i = 0; i < n; i++) {
        md = check_worse(md, fabs((double)a[i] - b[i]));
        mb = fmax(mb, fabs((double)b[i]));
    }
    return mb > 0 ? md / mb : md;
}

// lse[b,h,t] = logsumexp_{s<=t} q_t . k_s / sqrt(hs), in double.
static double lse_diff(const float *lse, const problem *p) {
    double md = 0, *sc = malloc((size_t)p->T * sizeof(double));
    for (int64_t b = 0; b < p->B; b++)
        for (int64_t h = 0; h < p->NH; h++)
            for (int64_t t = 0; t < p->T; t++) {
                double m = -INFINITY;
                for (int64_t s = 0; s <= t; s++) {
                    double dot = 0;
                    for (int64_t x = 0; x < p->hs; x++)
                        dot += (double)p->q[(b * p->T + t) * p->C + h * p->hs + x] *
                               p->k[(b * p->T + s) * p->C + h * p->hs + x];
                    sc[s] = dot / sqrt((double)p->hs);
                    m = fmax(m, sc[s]);
                }
                double sum = 0;
                for (int64_t s = 0; s <= t; s++) sum += exp(sc[s] - m);
                md = check_worse(md, fabs(lse[(b * p->NH + h) * p->T + t] - (m + log(sum))));
            }
    free(sc);
    return md;
}

// The tiled kernel equals the reference within 1e-5 (relative to the
// largest element) in out, dq, dk and dv; its logsumexp equals a double one.
static void test_against_reference(void) {
    static const int64_t lengths[] = {1, 7, 64, 130, 512, 1100};
    static const int64_t heads[][2] = {{1, 16}, {4, 8}};  // {NH, hs}
    static const int64_t tiles[] = {64, 128, 7, 32};  // the layer's two, odd, small
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++)
        for (int hi = 0; hi < 2; hi++)
            for (int di = 0; di < 2; di++) {
                const int64_t T = lengths[li], NH = heads[hi][0], hs = heads[hi][1], B = 2;
                const float rate = di ? 0.3f : 0.0f;
                problem p = problem_new(B, T, NH, hs, (uint64_t)(T * 8 + hi * 2 + di));
                ct_key key = ct_key_from_seed(100 + (uint64_t)T);
                results ref = results_new(&p);
                run_ref(&ref, &p, key, rate);
                const int64_t n = B * T * p.C;
                for (size_t ti = 0; ti < sizeof tiles / sizeof *tiles; ti++) {
                    results r = results_new(&p);
                    float *lse = run_tiled(&r, &p, key, rate, tiles[ti]);
                    double e[4] = {rel_diff(r.out, ref.out, n), rel_diff(r.dq, ref.dq, n),
                                   rel_diff(r.dk, ref.dk, n), rel_diff(r.dv, ref.dv, n)};
                    double el = lse_diff(lse, &p);
                    printf("T %4lld NH %lld hs %2lld dropout %.1f tile %2lld: rel diff out %.2e dq %.2e dk %.2e dv "
                           "%.2e; lse abs diff %.2e\n",
                           (long long)T, (long long)NH, (long long)hs, (double)rate, (long long)tiles[ti], e[0],
                           e[1], e[2], e[3], el);
                    for (int i = 0; i < 4; i++)
                        CHECK_MSG(e[i] < 1e-5, "T %lld NH %lld dropout %g tile %lld: %s rel diff %g", (long long)T,
                                  (long long)NH, (double)rate, (long long)tiles[ti],
                                  (const char *[]){"out", "dq", "dk", "dv"}[i], e[i]);
                    CHECK_MSG(el < 1e-5, "T %lld: lse diff %g", (long long)T, el);
                    free(lse);
                    results_free(&r);
                }
                results_free(&ref);
                problem_free(&p);
            }
}

// Scores that span more than a float's exp range within a row: keys 0..3
// score about +56, the rest about -56. Key blocks after the first have a
// lower max than the running one, so the online softmax must keep the
// running max (its rescaling factor exp(m_old - m_new) <= 1), or exp(112)
// overflows. Against the reference (whole rows) within 5e-5 (scores of 56
// round at 4e-6: dq read 9.2e-6), lse within 1e-5 relative.
static void test_wide_score_range(void) {
    problem p = problem_new(1, 64, 1, 8, 11);
    for (int64_t t = 0; t < p.T; t++)
        for (int64_t x = 0; x < p.C; x++) {
            p.q[t * p.C + x] = 2.0f + 0.25f * p.q[t * p.C + x];
            p.k[t * p.C + x] = (t < 4 ? 10.0f : -10.0f) + 0.5f * p.k[t * p.C + x];
        }
    ct_key key = ct_key_from_seed(12);
    const int64_t n = p.B * p.T * p.C;
    results ref = results_new(&p), r = results_new(&p);
    run_ref(&ref, &p, key, 0.0f);
    float *lse = run_tiled(&r, &p, key, 0.0f, 7);
    double e[4] = {rel_diff(r.out, ref.out, n), rel_diff(r.dq, ref.dq, n), rel_diff(r.dk, ref.dk, n),
                   rel_diff(r.dv, ref.dv, n)};
    double el = lse_diff(lse, &p), lmax = 0;
    for (int64_t t = 0; t < p.T; t++) lmax = fmax(lmax, fabs(lse[t]));
    printf("scores spanning +-56, T 64 tile 7: rel diff out %.2e dq %.2e dk %.2e dv %.2e; lse abs diff %.2e (max |lse| "
           "%.1f)\n", e[0], e[1], e[2], e[3], el, lmax);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(e[i] < 5e-5, "wide scores: %s rel diff %g", (const char *[]){"out", "dq", "dk", "dv"}[i], e[i]);
    CHECK_MSG(el < 1e-5 * fmax(1.0, lmax), "wide scores: lse diff %g", el);
    free(lse);
    results_free(&r), results_free(&ref);
    problem_free(&p);
}

// Dropout drops the same elements whatever the tile: with a rate near 1,
// almost every kept probability is scaled by 1 / (1 - rate) = 10, so a
// mask that moved with the tiling would change the output by far more than
// rounding. And another key gives another output.
static void test_dropout_mask_by_position(void) {
    problem p = problem_new(1, 100, 2, 8, 7);
    ct_key key = ct_key_from_seed(5);
    const int64_t n = p.B * p.T * p.C;
    results a = results_new(&p), b = results_new(&p), c = results_new(&p);
    free(run_tiled(&a, &p, key, 0.9f, 3));
    free(run_tiled(&b, &p, key, 0.9f, 64));
    free(run_tiled(&c, &p, ct_key_from_seed(6), 0.9f, 64));
    double same = rel_diff(a.out, b.out, n), other = rel_diff(c.out, b.out, n);
    double gsame = rel_diff(a.dq, b.dq, n) + rel_diff(a.dk, b.dk, n) + rel_diff(a.dv, b.dv, n);
    printf("dropout 0.9, tiles 3 and 64: rel diff out %.2e, grads %.2e; another key: %.2e\n", same, gsame, other);
    CHECK(same < 1e-5 && gsame < 3e-5);
    CHECK(other > 0.1);
    results_free(&a), results_free(&b), results_free(&c);
    problem_free(&p);
}

// Forward and backward give the same bits with 1 and 2 threads, over several
// tiles (the forward splits query tiles between threads).
static void test_thread_determinism(void) {
    problem p = problem_new(3, 150, 2, 8, 9);
    ct_key key = ct_key_from_seed(9);
    const size_t bytes = (size_t)(p.B * p.T * p.C) * sizeof(float);
    results r[2];
    float *lse[2];
    int saved = omp_get_max_threads();
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run + 1);
        r[run] = results_new(&p);
        lse[run] = run_tiled(&r[run], &p, key, 0.25f, 32);
    }
    omp_set_num_threads(saved);
    CHECK(memcmp(r[0].out, r[1].out, bytes) == 0);
    CHECK(memcmp(lse[0], lse[1], (size_t)(p.B * p.NH * p.T) * sizeof(float)) == 0);
    CHECK(memcmp(r[0].dq, r[1].dq, bytes) == 0);
    CHECK(memcmp(r[0].dk, r[1].dk, bytes) == 0);
    CHECK(memcmp(r[0].dv, r[1].dv, bytes) == 0);
    for (int run = 0; run < 2; run++) free(lse[run]), results_free(&r[run]);
    problem_free(&p);
}

// The layer's finite-difference gradient checks with T over three tiles of
// the layer's tile (the last one partial), with and without dropout.
static void test_gradients_over_tiles(void) {
    enum { B = 1, D = 8 };
    const int64_t T = 2 * ct_attention_tile(131) + 3;
    float *buf = malloc(3 * B * T * D * sizeof(float));
    ct_tensor in[3];
    for (int i = 0; i < 3; i++) {
        in[i] = ct_tensor_3d(CT_DTYPE_F32, B, T, D, buf + i * B * T * D);
        gradcheck_fill(&in[i], 70 + (uint64_t)i, -1.5f, 1.5f);
    }
    check_layer("DotProductCausalAttention(T 131)", ct_dot_product_causal_attention(2, 0.0f), in, 3, true);
    check_layer("DotProductCausalAttention(T 131, dropout 0.2)", ct_dot_product_causal_attention(2, 0.2f), in, 3,
                true);
    free(buf);
}

// One forward and backward of DotProductCausalAttention at T = 1024: the
// arena's high-water mark and the device's peak, which must stay far below
// the (B, NH, T, T) probabilities the reference keeps.
static void test_memory_at_1024(void) {
    enum { B = 2, T = 1024, D = 64, NH = 4 };
    const size_t n = (size_t)B * T * D, probs = (size_t)B * NH * T * T * sizeof(float);
    float *buf = malloc(4 * n * sizeof(float));
    ct_tensor in[3], g = ct_tensor_3d(CT_DTYPE_F32, B, T, D, buf + 3 * n);
    for (int i = 0; i < 3; i++) in[i] = uniform(ct_tensor_3d(CT_DTYPE_F32, B, T, D, buf + i * n), 80 + (uint64_t)i, -1, 1);
    gradcheck_fill(&g, 84, -1, 1);
    ct_layer *l = ct_dot_product_causal_attention(NH, 0.1f);
    fixture f;
    if (fixture_init_ok(&f, l, in, 3, true)) {
        ct_tensor out[1], gin[3];
        size_t before = f.dev.current_bytes;
        ct_device_reset_peak(&f.dev);
        CHECK_OK(ct_layer_forward(f.net.root, &f.ctx, in, out, ct_key_from_seed(1), &f.err), &f.err);
        CHECK_OK(ct_layer_backward(f.net.root, &f.ctx, &g, gin, ct_key_from_seed(1), &f.err), &f.err);
        size_t high = f.arena.high_water, peak = f.dev.peak_bytes - before;
        // In use at once: out and dq, dk, dv (4 n floats), the logsumexp
        // and a few tiles of scratch per thread.
        printf("DotProductCausalAttention (%d,%d,%d) %d heads, forward + backward: arena high water %zu bytes, "
               "device peak %zu bytes above the net; the probabilities would be %zu\n",
               B, T, D, NH, high, peak, probs);
        CHECK_MSG(high < 4 * n * sizeof(float) + probs / 16, "arena high water %zu bytes", high);
        CHECK(peak < probs / 4);
        ct_arena_reset(&f.arena);
        fixture_free(&f);
    }
    ct_layer_free(l);
    free(buf);
}

int main(void) {
    test_against_reference();
    test_wide_score_range();
    test_dropout_mask_by_position();
    test_thread_determinism();
    test_gradients_over_tiles();
    test_memory_at_1024();
    return check_summary("test_attention_tiled");
}
