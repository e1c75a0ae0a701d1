// Data parallelism inside one process: the local (threads) comm engine,
// Adasum, and the trainer over local replicas against one device.
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "dist_common.h"
#include "train/train_internal.h"

// ---- the local engine --------------------------------------------------------------

enum { N_THREADS = 3, LEN = 1001 };

typedef struct member {
    ct_comm *comm;
    float buf[LEN];
    double dbuf[3];
    float order[1];       // summed in rank order: 1 + 1e8 - 1e8
    float started[2];     // ct_comm_allreduce_start's sum (done at once here)
    float gathered[N_THREADS * 4];
    char bytes[8], last_bytes[8];
    int arrived;          // members that had reached the barrier when it let this one go
    ct_status st;
} member;

// Members counted as they reach ct_comm_barrier (rank 0 last, after a nap).
static atomic_int at_barrier;

static void *member_run(void *arg) {
    member *m = arg;
    int r = ct_comm_rank(m->comm), n = ct_comm_size(m->comm);
    for (int i = 0; i < LEN; i++) m->buf[i] = (float)(r + 1) * (float)i;
    m->dbuf[0] = r;
    m->dbuf[1] = 0.5;
    m->dbuf[2] = 0.1 * (r + 1);  // not floats: a sum through float would show
    // Rank order gives (1 + 1e8) - 1e8 = 0 in float (the 1 is lost against
    // 1e8); the reverse order gives (-1e8 + 1e8) + 1 = 1.
    m->order[0] = r == 0 ? 1.0f : r == 1 ? 1e8f : -1e8f;
    m->started[0] = (float)r;
    m->started[1] = 1.0f;
    float mine[4] = {(float)r, (float)r, (float)r, (float)r};
    if (r == 1) memcpy(m->bytes, "chosen!", 8);
    if (r == n - 1) memcpy(m->last_bytes, "thelast", 8);
    ct_error err;
    m->st = ct_comm_allreduce_f32(m->comm, m->buf, LEN, &err);
    if (m->st == CT_OK) m->st = ct_comm_allreduce_f64(m->comm, m->dbuf, 3, &err);
    if (m->st == CT_OK) m->st = ct_comm_allreduce_f32(m->comm, m->order, 1, &err);
    if (m->st == CT_OK) m->st = ct_comm_allreduce_start(m->comm, m->started, 2, &err);
    if (m->st == CT_OK) m->st = ct_comm_allreduce_wait(m->comm, &err);
    if (m->st == CT_OK) m->st = ct_comm_allgather_f32(m->comm, mine, m->gathered, 4, &err);
    if (m->st == CT_OK) m->st = ct_comm_broadcast(m->comm, m->bytes, 8, 1, &err);
    if (m->st == CT_OK) m->st = ct_comm_broadcast(m->comm, m->last_bytes, 8, n - 1, &err);
    if (r == 0) nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);  // the others wait for rank 0
    atomic_fetch_add(&at_barrier, 1);
    if (m->st == CT_OK) m->st = ct_comm_barrier(m->comm, &err);
    m->arrived = atomic_load(&at_barrier);
    return NULL;
}

static void test_local_comm(void) {
    ct_comm *comms[N_THREADS];
    ct_error err;
    CHECK_OK(ct_comm_local_new(comms, N_THREADS, &err), &err);
    member members[N_THREADS];
    pthread_t threads[N_THREADS];
    memset(members, 0, sizeof members);
    atomic_store(&at_barrier, 0);
    for (int r = 0; r < N_THREADS; r++) {
        members[r].comm = comms[r];
        CHECK(ct_comm_rank(comms[r]) == r && ct_comm_size(comms[r]) == N_THREADS);
        CHECK(ct_comm_get_kind(comms[r]) == CT_COMM_LOCAL);
        pthread_create(&threads[r], NULL, member_run, &members[r]);
    }
    for (int r = 0; r < N_THREADS; r++) pthread_join(threads[r], NULL);
    for (int r = 0; r < N_THREADS; r++) {
        member *m = &members[r];
        CHECK(m->st == CT_OK);
        bool sums_ok = true;
        for (int i = 0; i < LEN; i++) sums_ok &= m->buf[i] == 6.0f * (float)i;  // (1 + 2 + 3) i
        CHECK_MSG(sums_ok, "rank %d: allreduce sums wrong", r);
        CHECK(m->dbuf[0] == 3.0 && m->dbuf[1] == 1.5);
        // f64 sums stay in double, in rank order, as ct_train_global_loss's
        // sums over processes need.
        double want = 0;
        for (int q = 0; q < N_THREADS; q++) want += 0.1 * (q + 1);
        CHECK_MSG(m->dbuf[2] == want, "rank %d: f64 sum of 0.1, 0.2, 0.3 is %.17g, want %.17g", r, m->dbuf[2], want);
        // Rank order, the device order ct_train_mean sums replicas in: a
        // group of threads sums as one process's local devices do.
        CHECK_MSG(m->order[0] == 0.0f, "rank %d: 1 + 1e8 - 1e8 summed to %g, not in rank order", r, m->order[0]);
        CHECK_MSG(m->started[0] == 3.0f && m->started[1] == 3.0f, "rank %d: allreduce_start summed to (%g, %g)", r,
                  m->started[0], m->started[1]);
        for (int q = 0; q < N_THREADS; q++) CHECK(m->gathered[q * 4] == (float)q && m->gathered[q * 4 + 3] == (float)q);
        CHECK(strcmp(m->bytes, "chosen!") == 0);
        CHECK_MSG(strcmp(m->last_bytes, "thelast") == 0, "rank %d: broadcast from rank %d gave '%.8s'", r,
                  N_THREADS - 1, m->last_bytes);
        CHECK_MSG(m->arrived == N_THREADS, "rank %d left the barrier when %d of %d members had reached it", r,
                  m->arrived, N_THREADS);
        ct_comm_free(comms[r]);
    }
    // The single engine leaves buffers alone.
    ct_comm *one = ct_comm_single_new();
    float x[2] = {1, 2};
    CHECK(ct_comm_allreduce_f32(one, x, 2, &err) == CT_OK && x[0] == 1 && x[1] == 2);
    CHECK(ct_comm_broadcast(one, x, 8, 1, &err) == CT_ERR_ARG);
    // ... and gathers its own vector: out is in.
    float gathered[2] = {0, 0};
    CHECK(ct_comm_allgather_f32(one, x, gathered, 2, &err) == CT_OK && gathered[0] == 1 && gathered[1] == 2);
    ct_comm_free(one);
    // Groups of 1 to CT_COMM_LOCAL_MAX threads.
    ct_comm *none[1] = {NULL};
    CHECK(ct_comm_local_new(none, 0, &err) == CT_ERR_ARG && none[0] == NULL);
    CHECK(ct_comm_local_new(none, CT_COMM_LOCAL_MAX + 1, &err) == CT_ERR_ARG && none[0] == NULL);
    printf("local comm of %d: %s\n", CT_COMM_LOCAL_MAX + 1, err.msg);
    static ct_comm *most[CT_COMM_LOCAL_MAX];
    CHECK_OK(ct_comm_local_new(most, CT_COMM_LOCAL_MAX, &err), &err);
    CHECK(ct_comm_rank(most[CT_COMM_LOCAL_MAX - 1]) == CT_COMM_LOCAL_MAX - 1 &&
          ct_comm_size(most[0]) == CT_COMM_LOCAL_MAX);
    for (int i = 0; i < CT_COMM_LOCAL_MAX; i++) ct_comm_free(most[i]);
}

// ---- Adasum ---------------------------------------------------------------------------

static void test_adasum(void) {
    enum { D = 8 };
    ct_range ranges[2] = {{0, 5}, {5, 3}};  // two tensors
    for (int k = 2; k <= 4; k++) {
        float v[4][D], *vecs[4];
        // Orthogonal: each worker owns different coordinates in each tensor.
        memset(v, 0, sizeof v);
        float expect_sum[D] = {0};
        for (int w = 0; w < k; w++) {
            v[w][w] = (float)(w + 1);          // tensor 0
            v[w][5 + (w % 3)] = (w < 3) ? 0.5f * (float)(w + 1) : 0.0f;  // tensor 1 (3 coordinates)
            for (int i = 0; i < D; i++) expect_sum[i] += v[w][i];
            vecs[w] = v[w];
        }
        ct_adasum(vecs, k, ranges, 2);
        double worst = 0;
        for (int i = 0; i < D; i++) worst = check_worse(worst, fabs(v[0][i] - expect_sum[i]) / fmax(fabs(expect_sum[i]), 1e-6));
        CHECK_MSG(worst <= 1e-6, "%d orthogonal workers: rel err %g", k, worst);
        // Parallel (equal) vectors: the mean.
        float base[D] = {0.3f, -1.2f, 2.0f, 0.7f, -0.1f, 4.0f, -3.0f, 0.25f};
        for (int w = 0; w < k; w++) {
            memcpy(v[w], base, sizeof base);
            vecs[w] = v[w];
        }
        ct_adasum(vecs, k, ranges, 2);
        worst = 0;
        for (int i = 0; i < D; i++) worst = check_worse(worst, fabs(v[0][i] - base[i]) / fabs(base[i]));
        CHECK_MSG(worst <= 1e-6, "%d parallel workers: rel err %g", k, worst);
        printf("adasum with %d workers: orthogonal -> sum, parallel -> mean (within 1e-6)\n", k);
    }
}

// Vectors neither orthogonal nor equal, where each coefficient and the tree's
// order show: by hand, and against the double reference for 3 to 8 workers.
static void test_adasum_values(void) {
    // a = (1, 0), b = (1, 1): a.b = 1, |a|^2 = 1, |b|^2 = 2, so
    // (1 - 1/2) a + (1 - 1/4) b = (1.25, 0.75).
    ct_range whole = {0, 2};
    float a[2] = {1, 0}, b[2] = {1, 1}, *ab[2] = {a, b};
    ct_adasum(ab, 2, &whole, 1);
    CHECK_MSG(a[0] == 1.25f && a[1] == 0.75f, "adasum((1,0), (1,1)) = (%g, %g), want (1.25, 0.75)", a[0], a[1]);
    // A zero vector on either side leaves the other.
    float z[2] = {0, 0}, c[2] = {2, -3}, *zc[2] = {z, c};
    ct_adasum(zc, 2, &whole, 1);
    CHECK_MSG(z[0] == 2 && z[1] == -3, "adasum(0, (2,-3)) = (%g, %g)", z[0], z[1]);
    float c2[2] = {2, -3}, z2[2] = {0, 0}, *cz[2] = {c2, z2};
    ct_adasum(cz, 2, &whole, 1);
    CHECK_MSG(c2[0] == 2 && c2[1] == -3, "adasum((2,-3), 0) = (%g, %g)", c2[0], c2[1]);
    // Dot products in double: a = (1, 1, 1), b = (1e8, 3, -1e8) have a.b = 3
    // (a float sum loses the 3 against 1e8, giving 0), |a|^2 = 3, so
    // ca = 1 - 3 / 6 = 1/2 and cb = 1 - 3 / (2 (2e16 + 9)), 1 in float:
    // (1e8 + 1/2, 3.5, -1e8 + 1/2), in float (1e8, 3.5, -1e8).
    ct_range three = {0, 3};
    float p[3] = {1, 1, 1}, q[3] = {1e8f, 3, -1e8f}, *pq[2] = {p, q};
    ct_adasum(pq, 2, &three, 1);
    CHECK_MSG(p[0] == 1e8f && p[1] == 3.5f && p[2] == -1e8f, "adasum((1,1,1), (1e8,3,-1e8)) = (%.9g, %g, %.9g), want "
              "(1e8, 3.5, -1e8)", p[0], p[1], p[2]);
    enum { D = 7, K = 8 };
    ct_range ranges[2] = {{0, 4}, {4, 3}};
    const int ks[4] = {3, 5, 6, 8};
    for (int ki = 0; ki < 4; ki++) {
        int k = ks[ki];
        float v[K][D], *vecs[K];
        double ref[K * D];
        for (int w = 0; w < k; w++) {
            for (int i = 0; i < D; i++) {
                v[w][i] = (float)((w * 7 + i * 3) % 11) * 0.25f - 1.0f;
                ref[w * D + i] = v[w][i];
            }
            vecs[w] = v[w];
        }
        ct_adasum(vecs, k, ranges, 2);
        dist_adasum_reference(ref, k, D, ranges, 2);
        double worst = 0;
        for (int i = 0; i < D; i++) worst = check_worse(worst, fabs(v[0][i] - ref[i]) / fmax(fabs(ref[i]), 1e-3));
        printf("adasum of %d workers against the double reference: worst relative error %.3g\n", k, worst);
        CHECK_MSG(worst <= 1e-5, "%d workers: rel err %g", k, worst);
    }
}

// ---- the trainer over local devices ------------------------------------------------------

// The mean over 3 devices is the sum divided by 3, correctly rounded, as
// Trax's psum / n (float(g / 3.0) in double is that: g / 3 is never halfway
// between two floats). Times float(1/3) differed in 1 ulp for about a third
// of the values.
static void test_mean_divides(void) {
    enum { N = 4096 };
    ct_trainer t;
    memset(&t, 0, sizeof t);
    t.n_global = 3;
    float g[N], want[N];
    for (int i = 0; i < N; i++) {
        g[i] = (float)(i - N / 2) * 0.0137f + 1e-6f * (float)i * (float)i;
        want[i] = (float)((double)g[i] / 3.0);
    }
    ct_train_divide(&t, g, N);
    int off = 0;
    for (int i = 0; i < N; i++) off += g[i] != want[i];
    CHECK_MSG(off == 0, "%d of %d gradients divided over 3 devices are not g / 3 correctly rounded", off, N);
}

static void test_local_devices_match_one(void) {
    ct_trainer_options one = ct_trainer_default_options(), two = one;
    two.n_devices = 2;
    size_t n1, n2;
    float l1, l2;
    float *w1 = dist_train(20, 0, DIST_B, &one, &l1, &n1);
    float *w2 = dist_train(20, 0, DIST_B, &two, &l2, &n2);
    CHECK(w1 && w2 && n1 == n2);
    if (w1 && w2) {
        double rel = dist_rel_diff(w1, w2, n1);
        printf("20 steps: 1 device x batch %d vs 2 local devices x %d: relative weight difference %.3g, loss %.5f vs %.5f\n",
               DIST_B, DIST_B / 2, rel, l1, l2);
        CHECK_MSG(rel <= 1e-5, "max rel diff %g", rel);
        CHECK_NEAR(l1, l2, 1e-5);
    }
    free(w1);
    free(w2);
}

// LSHSelfAttention draws each example's rotations by its row in the global
// batch (ct_ctx.first_row), so 2 local devices hash as one device with the
// whole batch does, and train alike.
static void test_lsh_local_devices_match_one(void) {
    ct_trainer_options one = ct_trainer_default_options(), two = one;
    two.n_devices = 2;
    size_t n1, n2;
    float l1, l2;
    float *w1 = dist_train_with(DIST_STANDARD_LSH_REFORMER, 0.0f, 20, 0, DIST_B, &one, &l1, &n1);
    float *w2 = dist_train_with(DIST_STANDARD_LSH_REFORMER, 0.0f, 20, 0, DIST_B, &two, &l2, &n2);
    CHECK(w1 && w2 && n1 == n2);
    if (w1 && w2 && n1 == n2) {
        double rel = dist_rel_diff(w1, w2, n1);
        printf("ReformerLM with LSH attention, 20 steps: 1 device x batch %d vs 2 local devices x %d: relative weight "
               "difference %.3g, loss %.5f vs %.5f\n", DIST_B, DIST_B / 2, rel, l1, l2);
        CHECK_MSG(rel <= 1e-5, "LSH: rel diff %g", rel);
        CHECK_NEAR(l1, l2, 1e-5);
    }
    free(w1);
    free(w2);
}

static void test_batch_must_split(void) {
    int32_t tokens[3 * DIST_T] = {0};
    float weights[3 * DIST_T] = {1};
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, 3, DIST_T, tokens), ct_tensor_2d(CT_DTYPE_I32, 3, DIST_T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, 3, DIST_T, weights)};
    ct_layer *model = ct_serial(CT_LAYERS(ct_embedding(DIST_VOCAB, 4), ct_dense(DIST_VOCAB)));
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = 2;
    ct_trainer *tr;
    ct_error err;
    CHECK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev, &o,
                         &err) == CT_ERR_SHAPE);
    printf("odd batch: %s\n", err.msg);
    CHECK(strstr(err.msg, "does not split over 2 devices") != NULL);
    // Built for 4 rows, then handed 3.
    ct_tensor four[3] = {ct_tensor_2d(CT_DTYPE_I32, 4, DIST_T, NULL), ct_tensor_2d(CT_DTYPE_I32, 4, DIST_T, NULL),
                         ct_tensor_2d(CT_DTYPE_F32, 4, DIST_T, NULL)};
    CHECK_OK(ct_trainer_new(&tr, model, loss, four, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            &o, &err),
             &err);
    ct_step_stats s;
    CHECK(ct_trainer_one_step(tr, batch, ct_key_from_seed(1), 1, 0.1f, &s, &err) == CT_ERR_SHAPE);
    printf("odd batch at a step: %s\n", err.msg);
    CHECK(strstr(err.msg, "does not split evenly over 2 local devices") != NULL);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

static void test_adasum_training_converges(void) {
    // Two local devices combined by Adasum learn the copy task.
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = 2;
    o.adasum = true;
    size_t n;
    float first, last;
    free(dist_train(1, 0, DIST_B, &o, &first, &n));
    free(dist_train(300, 0, DIST_B, &o, &last, &n));
    printf("adasum, 2 local devices, copy task: loss %.4f at step 1, %.4f at step 300\n", first, last);
    CHECK_MSG(last < 0.5f * first, "loss %g after 300 steps (first %g)", last, first);
}

// ---- the memory-efficient trainer over local devices ----------------------------------

static double rel_to(const float *ref, const float *w, size_t n_ref, size_t n) {
    CHECK(ref && w && n_ref == n);
    return ref && w && n_ref == n ? dist_rel_diff(ref, w, n) : INFINITY;
}

static void test_reversible_local_devices(void) {
    // ReformerLM, dropout off, uneven loss weights: the standard trainer on
    // one device with the whole batch, against the reversible trainer on
    // one device and on 2 and 4 local devices.
    ct_trainer_options one = ct_trainer_default_options();
    size_t n_ref, n;
    float l_ref, l;
    float *ref = dist_train_with(DIST_STANDARD_REFORMER, 0.0f, 20, 0, DIST_B, &one, &l_ref, &n_ref);
    const int devices[3] = {1, 2, 4};
    for (int i = 0; i < 3; i++) {
        ct_trainer_options o = one;
        o.n_devices = devices[i];
        float *w = dist_train_with(DIST_REVERSIBLE_REFORMER, 0.0f, 20, 0, DIST_B, &o, &l, &n);
        double rel = rel_to(ref, w, n_ref, n);
        printf("ReformerLM, 20 steps: memory-efficient trainer on %d local device(s) x batch %d vs standard on 1 x %d: "
               "relative weight difference %.3g, loss %.5f vs %.5f\n",
               devices[i], DIST_B / devices[i], DIST_B, rel, l, l_ref);
        CHECK_MSG(rel <= 1e-5, "%d devices: rel diff %g", devices[i], rel);
        CHECK_NEAR(l, l_ref, 1e-5);
        free(w);
    }
    free(ref);

    // Adasum over 2 local devices: each layer's gradients combined alone
    // are the standard trainer's per-tensor Adasum.
    ct_trainer_options ada = one;
    ada.n_devices = 2;
    ada.adasum = true;
    ref = dist_train_with(DIST_STANDARD_REFORMER, 0.0f, 20, 0, DIST_B, &ada, &l_ref, &n_ref);
    float *w = dist_train_with(DIST_REVERSIBLE_REFORMER, 0.0f, 20, 0, DIST_B, &ada, &l, &n);
    double rel = rel_to(ref, w, n_ref, n);
    printf("ReformerLM, 20 steps, Adasum over 2 local devices: memory-efficient vs standard relative weight difference "
           "%.3g\n", rel);
    CHECK_MSG(rel <= 1e-5, "adasum: rel diff %g", rel);
    free(ref);
    free(w);

    // Dropout 0.1 on 2 devices: each device draws its masks from its own key
    // (the step key split by its index), in both trainers alike.
    ct_trainer_options two = one;
    two.n_devices = 2;
    ref = dist_train_with(DIST_STANDARD_REFORMER, 0.1f, 20, 0, DIST_B, &two, &l_ref, &n_ref);
    w = dist_train_with(DIST_REVERSIBLE_REFORMER, 0.1f, 20, 0, DIST_B, &two, &l, &n);
    rel = rel_to(ref, w, n_ref, n);
    printf("ReformerLM, 20 steps, dropout 0.1, 2 local devices: memory-efficient vs standard relative weight "
           "difference %.3g\n", rel);
    CHECK_MSG(rel <= 1e-5, "dropout: rel diff %g", rel);
    free(ref);
    free(w);

    // Frozen weights (the embedding), on 2 devices, with the gradient
    // clipped to a global norm that frozen gradients must not count in: no
    // update in either trainer, and the same updates elsewhere.
    const char *frozen[1] = {"ReformerLM/Embedding"};
    ct_trainer_options fr = one;
    fr.n_devices = 2;
    fr.frozen = frozen;
    fr.n_frozen = 1;
    fr.clip_grad_norm = 0.05f;
    float *init = dist_train_with(DIST_REVERSIBLE_REFORMER, 0.0f, 0, 0, DIST_B, &fr, &l, &n);
    ref = dist_train_with(DIST_STANDARD_REFORMER, 0.0f, 20, 0, DIST_B, &fr, &l_ref, &n_ref);
    w = dist_train_with(DIST_REVERSIBLE_REFORMER, 0.0f, 20, 0, DIST_B, &fr, &l, &n);
    rel = rel_to(ref, w, n_ref, n);
    size_t unchanged = 0;
    for (size_t i = 0; w && init && i < n; i++) unchanged += w[i] == init[i];
    printf("ReformerLM, 20 steps, embedding frozen, clip 0.05, 2 devices: memory-efficient vs standard %.3g; %zu of %zu weights "
           "unchanged\n", rel, unchanged, n);
    CHECK_MSG(rel <= 1e-5, "frozen: rel diff %g", rel);
    CHECK(unchanged >= (size_t)DIST_VOCAB * 8);  // the (vocab, d_model) table at least
    free(init);
    free(ref);
    free(w);
}

static void test_reversible_batch_must_split(void) {
    ct_reformer_lm_params mp = ct_reformer_lm_default_params();
    mp.vocab_size = DIST_VOCAB;
    mp.d_model = 8;
    mp.d_ff = 16;
    mp.n_layers = 1;
    mp.n_heads = 2;
    mp.max_len = DIST_T;
    ct_layer *model = ct_reformer_lm(mp), *loss = ct_weighted_category_cross_entropy();
    ct_tensor three[3] = {ct_tensor_2d(CT_DTYPE_I32, 3, DIST_T, NULL), ct_tensor_2d(CT_DTYPE_I32, 3, DIST_T, NULL),
                          ct_tensor_2d(CT_DTYPE_F32, 3, DIST_T, NULL)};
    ct_trainer_options o = ct_reversible_default_options();
    o.n_devices = 2;
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK(ct_trainer_new(&tr, model, loss, three, 3, ct_sgd_new(ct_sgd_default_params()),
                                    ct_key_from_seed(1), &dev, &o, &err) == CT_ERR_SHAPE);
    printf("memory-efficient trainer, odd batch: %s\n", err.msg);
    CHECK(strstr(err.msg, "does not split over 2 devices") != NULL);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// ---- a step against a hand computation -------------------------------------------------

// Dense(2) on x (3, 3) with L2Loss, weights per row {1, 1}, {0, 0}, {0.5, 2}:
// on 3 local devices each takes one row, and device 1's loss weights sum to
// 0. The loss, its gradient, the stats, clipping and the SGD update are
// computed here in double from the initial weights:
//   yhat = x K + b (3, 2); W = sum w; L = sum w (yhat - y)^2 / W;
//   dL/dyhat = 2 w (yhat - y) / W; gK = x^T dyhat (3, 2); gb = sum_rows dyhat (2);
//   c = min(1, clip / |g|); K' = K - lr c gK; b' = b - lr c gb.
enum { HB = 3, HD = 3, HO = 2 };

typedef struct hand_step {
    double loss, g_norm, w_norm;
    double g[HD * HO + HO];  // gK then gb
} hand_step;

static void hand_reference(const float *x, const float *y, const float *w, const float *k, const float *b,
                           hand_step *r) {
    double wsum = 0, lsum = 0, dy[HB * HO];
    for (int i = 0; i < HB * HO; i++) wsum += w[i];
    for (int n = 0; n < HB; n++)
        for (int j = 0; j < HO; j++) {
            double yh = b[j];
            for (int i = 0; i < HD; i++) yh += (double)x[n * HD + i] * k[i * HO + j];
            double d = yh - y[n * HO + j];
            lsum += w[n * HO + j] * d * d;
            dy[n * HO + j] = 2 * w[n * HO + j] * d / wsum;
        }
    r->loss = lsum / wsum;
    memset(r->g, 0, sizeof r->g);
    for (int n = 0; n < HB; n++)
        for (int j = 0; j < HO; j++) {
            for (int i = 0; i < HD; i++) r->g[i * HO + j] += (double)x[n * HD + i] * dy[n * HO + j];
            r->g[HD * HO + j] += dy[n * HO + j];
        }
    double g2 = 0, w2 = 0;
    for (int i = 0; i < HD * HO + HO; i++) g2 += r->g[i] * r->g[i];
    for (int i = 0; i < HD * HO; i++) w2 += (double)k[i] * k[i];
    for (int j = 0; j < HO; j++) w2 += (double)b[j] * b[j];
    r->g_norm = sqrt(g2);
    r->w_norm = sqrt(w2);
}

// One SGD step (lr 0.5) of Dense(2) on n_devices local devices, against the
// hand computation; clip_frac > 0 clips to that fraction of the true norm;
// all_frozen freezes every weight (Adam then: no slots, nothing moves).
static void hand_step_check(int n_devices, float clip_frac, bool all_frozen) {
    float x[HB * HD], y[HB * HO], w[HB * HO] = {1, 1, 0, 0, 0.5f, 2};
    ct_random_uniform(ct_key_from_seed(21), x, HB * HD, -1, 1);
    ct_random_uniform(ct_key_from_seed(22), y, HB * HO, -2, 2);
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, HB, HD, x), ct_tensor_2d(CT_DTYPE_F32, HB, HO, y),
                          ct_tensor_2d(CT_DTYPE_F32, HB, HO, w)};
    ct_layer *model = ct_dense(HO), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = n_devices;
    static const char *const every[] = {""};  // every name starts with ""
    if (all_frozen) {
        o.frozen = every;
        o.n_frozen = 1;
    }
    ct_trainer *tr;
    ct_error err;
    ct_optimizer *opt = all_frozen ? ct_adam_new(ct_adam_default_params()) : ct_sgd_new(ct_sgd_default_params());
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, opt, ct_key_from_seed(23), &dev, &o, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    CHECK(net->n_params == 2 && net->n_weights == HD * HO + HO);
    const ct_param *kp = net->params[0], *bp = net->params[1];
    CHECK(kp->sig.ndim == 2 && kp->sig.shape[0] == HD && kp->sig.shape[1] == HO && bp->offset == HD * HO);
    float w0[HD * HO + HO];
    memcpy(w0, net->weights, sizeof w0);
    hand_step r;
    hand_reference(x, y, w, w0, w0 + HD * HO, &r);
    double clip = clip_frac > 0 ? clip_frac * r.g_norm : 0, c = clip > 0 && r.g_norm > clip ? clip / r.g_norm : 1;
    if (clip > 0) {
        // A fresh trainer with clipping: the same init key, the same weights.
        ct_trainer_free(tr);
        o.clip_grad_norm = (float)clip;
        CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(23),
                                &dev, &o, &err),
                 &err);
        net = ct_trainer_net(tr);
        CHECK(memcmp(net->weights, w0, sizeof w0) == 0);
    }
    float eval = 0;
    CHECK_OK(ct_trainer_eval_loss(tr, batch, ct_key_from_seed(24), &eval, &err), &err);
    CHECK_NEAR(eval, r.loss, 1e-6 * r.loss);
    ct_step_stats s;
    const float lr = 0.5f;
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(24), 1, lr, &s, &err), &err);
    CHECK_NEAR(s.loss, r.loss, 1e-6 * r.loss);
    CHECK_NEAR(s.weights_l2, r.w_norm, 1e-6 * r.w_norm);
    double worst = 0, worst_g = 0;
    const float *g = ct_trainer_grads(tr);
    for (int i = 0; i < HD * HO + HO; i++) {
        double want = all_frozen ? w0[i] : w0[i] - lr * c * r.g[i];
        worst = check_worse(worst, fabs(net->weights[i] - want));
        worst_g = check_worse(worst_g, fabs(g[i] - (all_frozen ? 0 : c * r.g[i])));
    }
    printf("Dense(2), %d local device(s)%s%s: loss %.7f (hand %.7f), |g| %.7f (hand %.7f), |w| %.7f (hand %.7f), "
           "max |weight - hand| %.2g, max |grad - hand| %.2g\n",
           n_devices, clip > 0 ? ", clipped" : "", all_frozen ? ", every weight frozen" : "", s.loss, r.loss,
           s.gradients_l2, all_frozen ? 0 : r.g_norm, s.weights_l2, r.w_norm, worst, worst_g);
    // Frozen: no gradient counts, nothing moves, no slots (Adam would have 2 per weight).
    CHECK_NEAR(s.gradients_l2, all_frozen ? 0 : r.g_norm, 1e-6 * r.g_norm);
    CHECK_MSG(all_frozen ? worst == 0 : worst <= 1e-6, "weights off the hand computation by %g", worst);
    CHECK_MSG(worst_g <= 1e-6, "kept gradients off the hand computation (after clipping) by %g", worst_g);
    size_t n_slots = 99;
    ct_trainer_slots(tr, &n_slots);
    if (all_frozen) CHECK(n_slots == 0);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// 3 local devices: a batch that does not divide by 3 is refused at
// construction and at a step, and an eval batch of fewer rows than devices too.
static void test_three_devices_refuse_odd_batches(void) {
    float x[4 * HD] = {0}, y[4 * HO] = {0}, w[4 * HO] = {1, 1, 1, 1, 1, 1, 1, 1};
    ct_layer *model = ct_dense(HO), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = 3;
    ct_trainer *tr;
    ct_error err;
    ct_tensor four[3] = {ct_tensor_2d(CT_DTYPE_F32, 4, HD, x), ct_tensor_2d(CT_DTYPE_F32, 4, HO, y),
                         ct_tensor_2d(CT_DTYPE_F32, 4, HO, w)};
    CHECK(ct_trainer_new(&tr, model, loss, four, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev, &o,
                         &err) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "does not split over 3 devices"), "%s", err.msg);
    ct_tensor three[3] = {ct_tensor_2d(CT_DTYPE_F32, 3, HD, x), ct_tensor_2d(CT_DTYPE_F32, 3, HO, y),
                          ct_tensor_2d(CT_DTYPE_F32, 3, HO, w)};
    CHECK_OK(ct_trainer_new(&tr, model, loss, three, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            &o, &err),
             &err);
    const ct_net *net = ct_trainer_net(tr);
    float before[HD * HO + HO];
    memcpy(before, net->weights, sizeof before);
    ct_step_stats s;
    CHECK(ct_trainer_one_step(tr, four, ct_key_from_seed(1), 1, 0.1f, &s, &err) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "does not split evenly over 3 local devices"), "%s", err.msg);
    ct_tensor one[3] = {ct_tensor_2d(CT_DTYPE_F32, 1, HD, x), ct_tensor_2d(CT_DTYPE_F32, 1, HO, y),
                        ct_tensor_2d(CT_DTYPE_F32, 1, HO, w)};
    float l = -1;
    CHECK(ct_trainer_eval_loss(tr, one, ct_key_from_seed(1), &l, &err) == CT_ERR_SHAPE);
    printf("3 devices, an eval batch of 1 row: %s\n", err.msg);
    CHECK(memcmp(before, net->weights, sizeof before) == 0);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// A device whose pass fails (a negative loss weight in the last device's
// row; one row each) fails the step with its error, said to be that
// device's, and nothing moves.
static void failing_device_named(int n_devices) {
    float x[HB * HD] = {0}, y[HB * HO] = {0}, w[HB * HO] = {1, 1, 1, 1, 1, 1};
    w[(n_devices - 1) * HO] = -1;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, n_devices, HD, x), ct_tensor_2d(CT_DTYPE_F32, n_devices, HO, y),
                          ct_tensor_2d(CT_DTYPE_F32, n_devices, HO, w)};
    ct_layer *model = ct_dense(HO), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = n_devices;
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            &o, &err),
             &err);
    const ct_net *net = ct_trainer_net(tr);
    float before[HD * HO + HO];
    memcpy(before, net->weights, sizeof before);
    ct_step_stats s;
    ct_status st = ct_trainer_one_step(tr, batch, ct_key_from_seed(1), 1, 0.1f, &s, &err);
    printf("%d devices, a negative loss weight on the last: %s\n", n_devices, st == CT_OK ? "accepted" : err.msg);
    char want[32];
    snprintf(want, sizeof want, "device %d: ", n_devices - 1);
    CHECK_MSG(st == CT_ERR_ARG && strncmp(err.msg, want, strlen(want)) == 0 && strstr(err.msg, "weight [0] is -1"),
              "status %d: %s", (int)st, err.msg);
    CHECK(memcmp(before, net->weights, sizeof before) == 0);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

static void test_failing_device_named(void) {
    failing_device_named(2);
    failing_device_named(3);
}

// Every device's gradient finite, their sum not: Dense(1) at zero weights on
// rows (1e37, 0, 0) with targets 10, on 2 devices of 2 rows (seeds 1): each
// row's output gradient is 2 (0 - 10) / 2 = -10, so each device's kernel
// gradient is 2 x 1e37 x -10 = -2e38 (finite in f32), and their sum, -4e38,
// is -inf (no NaN anywhere); the loss, 100, is finite. The step must fail as
// a non-finite gradient from the combining and move nothing (an update would
// make the kernel inf).
static void test_gradient_sum_overflow(void) {
    float x[4 * HD] = {1e37f, 0, 0, 1e37f, 0, 0, 1e37f, 0, 0, 1e37f, 0, 0}, y[4] = {10, 10, 10, 10}, w[4] = {1, 1, 1, 1};
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, 4, HD, x), ct_tensor_2d(CT_DTYPE_F32, 4, 1, y),
                          ct_tensor_2d(CT_DTYPE_F32, 4, 1, w)};
    ct_layer *model = ct_dense(1), *loss = ct_l2_loss();
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = 2;
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1), &dev,
                            &o, &err),
             &err);
    const ct_net *net = ct_trainer_net(tr);
    memset(net->weights, 0, net->n_weights * sizeof(float));
    ct_step_stats s = {0};
    ct_status st = ct_trainer_one_step(tr, batch, ct_key_from_seed(1), 1, 0.1f, &s, &err);
    printf("2 devices, finite gradients whose sum overflows: %s\n", st == CT_OK ? "the step went through" : err.msg);
    CHECK_MSG(st == CT_ERR_NONFINITE && strstr(err.msg, "non-finite gradient (global L2 norm inf)") &&
                  strstr(err.msg, "came from combining them"),
              "status %d: %s", (int)st, st == CT_OK ? "accepted" : err.msg);
    bool zero = true;
    for (size_t i = 0; i < net->n_weights; i++) zero &= net->weights[i] == 0.0f;
    CHECK_MSG(zero, "a step whose combined gradient is inf moved the weights");
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// The mean over 3 local devices sums them in device order, ((g0 + g1) + g2)
// / 3, to the bit (ct_train_mean's contract in train_internal.h: the bits do
// not depend on which replica thread finishes first). Dense(1) over one
// feature at zero weights, one row each, x 1, loss weights 1 (so each seed
// is 3 * 1 / 3 = 1): device d's kernel and bias gradients are both
// 2 (0 - y_d), here 1, -1 and 2^-26. In order, 1 - 1 cancels exactly and
// 2^-26 survives; any order that adds 2^-26 to +-1 first loses it (under
// half an ulp of 1) and gives 0. Both trainers call ct_train_mean.
static void test_device_sum_order(void) {
    const float tiny = 0x1p-26f;
    float x[3] = {1, 1, 1}, y[3] = {-0.5f, 0.5f, -0.5f * tiny}, w[3] = {1, 1, 1};
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, 3, 1, x), ct_tensor_2d(CT_DTYPE_F32, 3, 1, y),
                          ct_tensor_2d(CT_DTYPE_F32, 3, 1, w)};
    const float g[3] = {1.0f, -1.0f, tiny}, lr = 0.5f;
    const float want = ((g[0] + g[1]) + g[2]) / 3.0f;
    CHECK(want != 0.0f && g[0] + (g[1] + g[2]) == 0.0f && (g[2] + g[1]) + g[0] == 0.0f);  // the order shows
    for (int me = 0; me < 2; me++) {
        const char *which = me ? "memory-efficient" : "standard";
        ct_layer *model = ct_dense(1), *loss = ct_l2_loss();
        ct_device dev = ct_device_cpu();
        ct_trainer_options o = ct_trainer_default_options();
        o.n_devices = 3;
        o.memory_efficient = me;
        o.reversible.keep_grads = true;  // for ct_trainer_grads
        ct_trainer *tr;
        ct_error err;
        CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(1),
                                &dev, &o, &err),
                 &err);
        const ct_net *net = ct_trainer_net(tr);
        CHECK(net->n_weights == 2);  // kernel (1, 1), bias (1)
        memset(net->weights, 0, net->n_weights * sizeof(float));
        ct_step_stats s;
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(1), 1, lr, &s, &err), &err);
        const float *grads = ct_trainer_grads(tr);
        CHECK(grads != NULL);
        for (size_t i = 0; grads && i < net->n_weights; i++)
            CHECK_MSG(grads[i] == want && net->weights[i] == -lr * want,
                      "%s trainer, weight %zu: gradient %a, weight %a; want %a (device order), %a", which, i, grads[i],
                      net->weights[i], want, -lr * want);
        printf("%s trainer, 3 devices' gradients 1, -1, 2^-26: mean %a (in device order %a)\n", which,
               grads ? grads[1] : 0.0f, want);
        ct_trainer_free(tr);
        ct_layer_free(model);
        ct_layer_free(loss);
        CHECK(dev.current_bytes == 0);
    }
}

static void test_step_against_hand(void) {
    hand_step_check(1, 0, false);
    hand_step_check(3, 0, false);
    hand_step_check(3, 0.5f, false);
    hand_step_check(1, 0.5f, false);
    hand_step_check(3, 0, true);
}

// An eval batch of another size than the trainer was built for (evals
// take any: LSH's buckets are sized for training's B only): LSH numbers
// each example by its row in this batch (ct_ctx.first_row), so 2 local
// devices hash as one device does, as in a step. The row numbers were those
// of the construction batch: device 1 of a 4-row batch built for 8 drew
// rows 4's and 5's rotations for rows 2 and 3.
static void test_lsh_eval_other_batch_size(void) {
    int32_t tokens[DIST_B * DIST_T];
    float weights[DIST_B * DIST_T];
    dist_batch(1, tokens, weights);
    enum { R = DIST_B / 2 };
    ct_tensor built[3] = {ct_tensor_2d(CT_DTYPE_I32, DIST_B, DIST_T, NULL),
                          ct_tensor_2d(CT_DTYPE_I32, DIST_B, DIST_T, NULL),
                          ct_tensor_2d(CT_DTYPE_F32, DIST_B, DIST_T, NULL)};
    ct_tensor half[3] = {ct_tensor_2d(CT_DTYPE_I32, R, DIST_T, tokens), ct_tensor_2d(CT_DTYPE_I32, R, DIST_T, tokens),
                         ct_tensor_2d(CT_DTYPE_F32, R, DIST_T, weights)};
    ct_device dev = ct_device_cpu();
    ct_error err;
    float eval[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        ct_layer *model = dist_model(DIST_STANDARD_LSH_REFORMER, 0.0f), *loss = ct_weighted_category_cross_entropy();
        ct_trainer_options o = ct_trainer_default_options();
        o.n_devices = k + 1;
        ct_trainer *tr;
        CHECK_OK(ct_trainer_new(&tr, model, loss, built, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(5),
                                &dev, &o, &err),
                 &err);
        CHECK_OK(ct_trainer_eval_loss(tr, half, ct_key_from_seed(6), &eval[k], &err), &err);
        ct_trainer_free(tr);
        ct_layer_free(model);
        ct_layer_free(loss);
    }
    printf("LSH ReformerLM built for %d rows, an eval batch of %d: loss on 1 device %.7f, on 2 devices %.7f\n", DIST_B,
           R, eval[0], eval[1]);
    CHECK_NEAR(eval[0], eval[1], 1e-6 * fabs(eval[0]));
    CHECK(dev.current_bytes == 0);
}

int main(void) {
    test_mean_divides();
    test_local_comm();
    test_adasum();
    test_adasum_values();
    test_local_devices_match_one();
    test_lsh_local_devices_match_one();
    test_batch_must_split();
    test_adasum_training_converges();
    test_reversible_local_devices();
    test_reversible_batch_must_split();
    test_step_against_hand();
    test_device_sum_order();
    test_three_devices_refuse_odd_batches();
    test_gradient_sum_overflow();
    test_failing_device_named();
    test_lsh_eval_other_batch_size();
    return check_summary("test_dist");
}
