// Data parallelism across processes, run under `mpirun -np 2` (see
// CMakeLists.txt): the MPI comm engine, and the trainer over ranks against
// one device with the whole batch.
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#include "capture.h"
#include "copy_fixture.h"
#include "core/fs.h"
#include "dist/comm_internal.h"
#include "dist_common.h"
#include "scratch.h"

static ct_comm *comm;
static int rank, size;

static void test_collectives(void) {
    ct_error err;
    float f[5];
    double d[2] = {rank + 1.0, 0.25};
    for (int i = 0; i < 5; i++) f[i] = (float)(rank * 10 + i);
    CHECK_OK(ct_comm_allreduce_f32(comm, f, 5, &err), &err);
    CHECK_OK(ct_comm_allreduce_f64(comm, d, 2, &err), &err);
    // sum over ranks r of (10 r + i), and of (r + 1)
    float base = 10.0f * (float)(size * (size - 1) / 2);
    for (int i = 0; i < 5; i++) CHECK(f[i] == base + (float)(size * i));
    CHECK(d[0] == size * (size + 1) / 2.0 && d[1] == 0.25 * size);
    float mine[3] = {(float)rank, (float)rank, (float)rank}, all[3 * 8];
    CHECK_OK(ct_comm_allgather_f32(comm, mine, all, 3, &err), &err);
    for (int r = 0; r < size; r++) CHECK(all[3 * r] == (float)r && all[3 * r + 2] == (float)r);
    char msg[32] = "";
    if (rank == size - 1) snprintf(msg, sizeof msg, "from rank %d", rank);
    CHECK_OK(ct_comm_broadcast(comm, msg, sizeof msg, size - 1, &err), &err);
    char want[32];
    snprintf(want, sizeof want, "from rank %d", size - 1);
    CHECK(strcmp(msg, want) == 0);
    // Bucketed, overlapped sums.
    float a[3] = {1, 2, 3}, b[2] = {10, 20};
    CHECK_OK(ct_comm_allreduce_start(comm, a, 3, &err), &err);
    CHECK_OK(ct_comm_allreduce_start(comm, b, 2, &err), &err);
    CHECK(ct_mpi_pending(comm) == 2);
    CHECK_OK(ct_comm_allreduce_wait(comm, &err), &err);
    CHECK(ct_mpi_pending(comm) == 0);
    CHECK(a[2] == 3.0f * size && b[1] == 20.0f * size);
    // More buckets than the pending list first holds (64), twice: it grows,
    // every one is waited for, and the second round starts from an empty list.
    enum { MANY = 150 };
    float many[MANY];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < MANY; i++) many[i] = (float)(i + rank + round);
        for (int i = 0; i < MANY; i++) CHECK_OK(ct_comm_allreduce_start(comm, &many[i], 1, &err), &err);
        CHECK_OK(ct_comm_allreduce_wait(comm, &err), &err);
        CHECK(ct_mpi_pending(comm) == 0);
        bool sums_ok = true;
        for (int i = 0; i < MANY; i++)
            sums_ok = sums_ok && many[i] == (float)(size * (i + round) + size * (size - 1) / 2);
        CHECK_MSG(sums_ok, "round %d: %d bucketed sums of one float each are wrong", round, MANY);
    }
    CHECK_OK(ct_comm_barrier(comm, &err), &err);
}

// loss_chunk_size: the ranks' (the reference runs unchunked).
static void compare(const char *what, int n_local, size_t bucket_bytes, int64_t loss_chunk_size) {
    ct_trainer_options one = ct_trainer_default_options(), many = one;
    many.comm = comm;
    many.n_devices = n_local;
    many.loss_chunk_size = loss_chunk_size;
    if (bucket_bytes) many.bucket_bytes = bucket_bytes;
    size_t n1, n2;
    float l1, l2;
    // Every rank trains the one-device reference itself (same numbers).
    float *ref = dist_train(20, 0, DIST_B, &one, &l1, &n1);
    int rows = DIST_B / size;
    float *w = dist_train(20, rank * rows, rows, &many, &l2, &n2);
    CHECK(ref && w && n1 == n2);
    if (ref && w) {
        double rel = dist_rel_diff(ref, w, n1);
        if (rank == 0)
            printf("20 steps, %s (%d x %d devices, batch %d each) vs 1 device x %d: relative weight difference %.3g, "
                   "loss %.5f vs %.5f\n",
                   what, size, n_local, DIST_B / (size * n_local), DIST_B, rel, l2, l1);
        CHECK_MSG(rel <= 1e-5, "%s: rel diff %g", what, rel);
        CHECK_NEAR(l1, l2, 1e-5);
    }
    free(ref);
    free(w);
}

// A Dense used twice (shared weights): 5 steps over the ranks with a
// bucket per layer or so against one device with the whole batch. Its
// gradients are final after its second backward use only (bucketer.uses);
// a bucket sent after the first would carry half of them.
static void compare_shared_layer(void) {
    ct_trainer_options one = ct_trainer_default_options(), many = one;
    many.comm = comm;
    many.bucket_bytes = 4;
    size_t n1 = 0, n2 = 0;
    int rows = DIST_B / size;
    float l1, l2;
    float *ref = dist_train_with(DIST_STANDARD_SHARED_DENSE, 0.0f, 5, 0, DIST_B, &one, &l1, &n1);
    float *w = dist_train_with(DIST_STANDARD_SHARED_DENSE, 0.0f, 5, rank * rows, rows, &many, &l2, &n2);
    CHECK(ref && w && n1 == n2);
    if (ref && w && n1 == n2) {
        double rel = dist_rel_diff(ref, w, n1);
        if (rank == 0)
            printf("5 steps, a Dense used twice, one-float buckets, %d ranks vs 1 device: relative weight difference "
                   "%.3g\n", size, rel);
        CHECK_MSG(rel <= 1e-5, "shared Dense: rel diff %g", rel);
    }
    free(ref);
    free(w);
}

static void test_adasum_over_ranks(void) {
    ct_trainer_options o = ct_trainer_default_options();
    o.comm = comm;
    o.n_devices = 2;
    o.adasum = true;
    size_t n;
    float first, last;
    int rows = DIST_B / size;
    free(dist_train(1, rank * rows, rows, &o, &first, &n));
    float *w = dist_train(300, rank * rows, rows, &o, &last, &n);
    // Every rank ends with the same weights.
    float *all = malloc(n * (size_t)size * sizeof *all);
    ct_error err;
    CHECK_OK(ct_comm_allgather_f32(comm, w, all, n, &err), &err);
    for (int r = 1; r < size; r++) CHECK(memcmp(all, all + (size_t)r * n, n * sizeof *all) == 0);
    if (rank == 0)
        printf("adasum over %d ranks x 2 devices, copy task: loss %.4f at step 1, %.4f at step 300\n", size, first, last);
    CHECK_MSG(last < 0.5f * first, "loss %g after 300 steps (first %g)", last, first);
    free(w);
    free(all);
}

// ct_adasum_devices over size ranks x 2 local devices combines the vectors in
// global device order (rank p's device d is p * 2 + d), as the double
// reference does; every rank gets the same result.
static void test_adasum_devices_order(void) {
    enum { N = 6, LOCAL = 2, MAX_DEVICES = 16 };
    ct_range ranges[2] = {{0, 4}, {4, 2}};
    int k = size * LOCAL;
    CHECK(k <= MAX_DEVICES);
    if (k > MAX_DEVICES) return;
    double ref[MAX_DEVICES * N];
    float mine[LOCAL][N], *local[LOCAL], gather[MAX_DEVICES * N], out[N];
    for (int g = 0; g < k; g++)
        for (int i = 0; i < N; i++) {
            float x = (float)((g * 5 + i * 3) % 7) * 0.5f - 1.25f;
            ref[g * N + i] = x;
            if (g / LOCAL == rank) mine[g % LOCAL][i] = x;
        }
    for (int d = 0; d < LOCAL; d++) local[d] = mine[d];
    ct_error err;
    CHECK_OK(ct_adasum_devices(comm, local, LOCAL, N, ranges, 2, gather, out, &err), &err);
    dist_adasum_reference(ref, k, N, ranges, 2);
    double worst = 0;
    for (int i = 0; i < N; i++) worst = check_worse(worst, fabs(out[i] - ref[i]) / fmax(fabs(ref[i]), 1e-3));
    if (rank == 0)
        printf("adasum over %d ranks x %d devices against the double reference in global device order: worst "
               "relative error %.3g\n", size, LOCAL, worst);
    CHECK_MSG(worst <= 1e-5, "rank %d: rel err %g", rank, worst);
}

// Each device's dropout key is the step key split by its global index, and
// LSHSelfAttention numbers examples in the global batch: size ranks x 1 or 2
// devices train as one process with as many local devices (dropout), size
// ranks x 1 device as one device with the whole batch (LSH).
static void compare_keys_and_rows(void) {
    int rows = DIST_B / size;
    size_t n1, n2;
    float l1, l2;
    for (int n_local = 1; n_local <= 2; n_local++) {
        ct_trainer_options local = ct_trainer_default_options(), ranks = local;
        local.n_devices = size * n_local;
        ranks.comm = comm;
        ranks.n_devices = n_local;
        float *ref = dist_train_with(DIST_STANDARD_REFORMER, 0.1f, 20, 0, DIST_B, &local, &l1, &n1);
        float *w = dist_train_with(DIST_STANDARD_REFORMER, 0.1f, 20, rank * rows, rows, &ranks, &l2, &n2);
        double rel = ref && w && n1 == n2 ? dist_rel_diff(ref, w, n1) : INFINITY;
        if (rank == 0)
            printf("ReformerLM, dropout 0.1, 20 steps: %d ranks x %d device(s) vs 1 process x %d devices: relative "
                   "weight difference %.3g, loss %.5f vs %.5f\n", size, n_local, size * n_local, rel, l2, l1);
        CHECK_MSG(rel <= 1e-5, "dropout over ranks x %d devices: rel diff %g", n_local, rel);
        free(ref);
        free(w);
    }
    ct_trainer_options one = ct_trainer_default_options(), ranks = one;
    ranks.comm = comm;
    float *ref = dist_train_with(DIST_STANDARD_LSH_REFORMER, 0.0f, 20, 0, DIST_B, &one, &l1, &n1);
    float *w = dist_train_with(DIST_STANDARD_LSH_REFORMER, 0.0f, 20, rank * rows, rows, &ranks, &l2, &n2);
    double rel = ref && w && n1 == n2 ? dist_rel_diff(ref, w, n1) : INFINITY;
    if (rank == 0)
        printf("ReformerLM with LSH attention, 20 steps: %d ranks x 1 device vs 1 device x %d: relative weight "
               "difference %.3g, loss %.5f vs %.5f\n", size, DIST_B, rel, l2, l1);
    CHECK_MSG(rel <= 1e-5, "LSH over ranks: rel diff %g", rel);
    free(ref);
    free(w);
}

// Adasum over size ranks x 2 devices against one process with 2 size local
// devices: the same devices in the same global order (rank p's device d is
// device 2 p + d) with the same rows, keys and backward seeds
// (n_global W_d / W: with the global device count 4, each device's gradient
// is the mean over its rows when the loss weights are even), so the same
// vectors go into the same tree. A seed of n_local W_d / W or size W_d / W
// halves them (the mean's division makes up for it; Adasum has none).
static void compare_adasum_ranks_and_local_devices(void) {
    int rows = DIST_B / size;
    size_t n1, n2;
    float l1, l2;
    ct_trainer_options local = ct_trainer_default_options(), ranks = local;
    local.n_devices = size * 2;
    local.adasum = true;
    ranks.comm = comm;
    ranks.n_devices = 2;
    ranks.adasum = true;
    float *ref = dist_train(20, 0, DIST_B, &local, &l1, &n1);
    float *w = dist_train(20, rank * rows, rows, &ranks, &l2, &n2);
    double rel = ref && w && n1 == n2 ? dist_rel_diff(ref, w, n1) : INFINITY;
    if (rank == 0)
        printf("Adasum, 20 steps: %d ranks x 2 devices vs 1 process x %d devices: relative weight difference %.3g, "
               "loss %.5f vs %.5f\n", size, size * 2, rel, l2, l1);
    CHECK_MSG(rel <= 1e-6, "Adasum over ranks x 2 devices: rel diff %g", rel);
    free(ref);
    free(w);
}

// A rank built from another seed would train other initial weights: every
// rank refuses at construction, the odd one naming the initial key.
static void test_other_seed_refused(void) {
    int32_t tokens[DIST_B * DIST_T] = {0};
    float weights[DIST_B * DIST_T] = {0};
    int rows = DIST_B / size;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens), ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, rows, DIST_T, weights)};
    ct_layer *model = ct_serial(CT_LAYERS(ct_embedding(DIST_VOCAB, 4), ct_dense(DIST_VOCAB)));
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_trainer_options o = ct_trainer_default_options();
    o.comm = comm;
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = NULL;
    ct_error err;
    ct_key key = ct_key_from_seed(rank == size - 1 ? 6 : 5);
    ct_status st = ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), key, &dev, &o, &err);
    CHECK_MSG(st == CT_ERR_ARG, "rank %d: a trainer from another seed: status %d", rank, (int)st);
    const char *want = rank == size - 1 ? "initial key" : "another process builds another trainer";
    CHECK_MSG(strstr(err.msg, want) != NULL, "rank %d: '%s', not '%s'", rank, err.msg, want);
    printf("rank %d, a trainer from another seed on rank %d: %s\n", rank, size - 1, err.msg);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// The last rank builds its trainer with another setting that changes the
// collectives (Adasum, the memory-efficient trainer, other bucket bytes) or
// the update (clipping, a frozen weight): every rank refuses, the last
// naming the setting, before any step could mismatch a collective or let
// the replicas drift apart.
static void test_other_options_refused(void) {
    int32_t tokens[DIST_B * DIST_T] = {0};
    float weights[DIST_B * DIST_T] = {0};
    int rows = DIST_B / size;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens), ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, rows, DIST_T, weights)};
    static const char *const frozen[] = {"Serial/Dense[1]/bias"};
    static const char *const names[] = {"Adasum", "memory-efficient trainer", "gradient bucket bytes", "clip_grad_norm",
                                        "frozen weight floats"};
    for (int k = 0; k < 5; k++) {
        ct_layer *model = ct_serial(CT_LAYERS(ct_embedding(DIST_VOCAB, 4), ct_dense(DIST_VOCAB)));
        ct_layer *loss = ct_weighted_category_cross_entropy();
        ct_trainer_options o = ct_trainer_default_options();
        o.comm = comm;
        o.reversible.log_every = 0;
        if (rank == size - 1) {
            if (k == 0) o.adasum = true;
            if (k == 1) o.memory_efficient = true;
            if (k == 2) o.bucket_bytes = 4096;
            if (k == 3) o.clip_grad_norm = 1.0f;
            if (k == 4) {
                o.frozen = frozen;
                o.n_frozen = 1;
            }
        }
        ct_device dev = ct_device_cpu();
        ct_trainer *tr = NULL;
        ct_error err;
        ct_status st = ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(5),
                                      &dev, &o, &err);
        CHECK_MSG(st == CT_ERR_ARG, "rank %d: a trainer with another %s on rank %d: status %d", rank, names[k], size - 1,
                  (int)st);
        const char *want = rank == size - 1 ? names[k] : "another process builds another trainer";
        CHECK_MSG(st != CT_OK && strstr(err.msg, want) != NULL, "rank %d: '%s', not '%s'", rank,
                  st != CT_OK ? err.msg : "accepted", want);
        if (st != CT_OK) printf("rank %d, another %s on rank %d: %s\n", rank, names[k], size - 1, err.msg);
        ct_trainer_free(tr);
        ct_layer_free(model);
        ct_layer_free(loss);
        CHECK(dev.current_bytes == 0);
    }
}

// The memory-efficient trainer on every rank with n_local devices each
// against the standard one, `steps` steps. Without dropout or Adasum the
// reference is one device over the whole batch. With dropout, each device's
// key is the step key split by its global index (first device of its rank +
// local index), as the standard Trainer's over the same ranks and devices:
// the masks, so the weights, must match that. Adasum's combine is also the
// same ranks and devices'.
static void compare_reversible(int n_local, bool adasum, float dropout, int steps) {
    ct_trainer_options one = ct_trainer_default_options(), many = one;
    many.comm = comm;
    many.n_devices = n_local;
    many.adasum = adasum;
    int rows = DIST_B / size;
    size_t n1, n2;
    float l1, l2;
    bool same_devices = adasum || dropout > 0.0f;
    float *ref = same_devices
                     ? dist_train_with(DIST_STANDARD_REFORMER, dropout, steps, rank * rows, rows, &many, &l1, &n1)
                     : dist_train_with(DIST_STANDARD_REFORMER, dropout, steps, 0, DIST_B, &one, &l1, &n1);
    float *w = dist_train_with(DIST_REVERSIBLE_REFORMER, dropout, steps, rank * rows, rows, &many, &l2, &n2);
    CHECK(ref && w && n1 == n2);
    if (ref && w && n1 == n2) {
        double rel = dist_rel_diff(ref, w, n1);
        if (rank == 0)
            printf("ReformerLM, dropout %g, %d steps, memory-efficient trainer on %d ranks x %d devices%s vs standard "
                   "%s: relative weight difference %.3g, loss %.5f vs %.5f\n",
                   (double)dropout, steps, size, n_local, adasum ? " (Adasum)" : "",
                   same_devices ? "on the same devices" : "on 1 device", rel, l2, l1);
        CHECK_MSG(rel <= 1e-5, "dropout %g, %d devices per rank%s: rel diff %g", (double)dropout, n_local,
                  adasum ? ", Adasum" : "", rel);
        // Every rank ends with the same weights.
        float *all = malloc(n2 * (size_t)size * sizeof *all);
        ct_error err;
        CHECK_OK(ct_comm_allgather_f32(comm, w, all, n2, &err), &err);
        for (int r = 1; r < size; r++) CHECK(memcmp(all, all + (size_t)r * n2, n2 * sizeof *all) == 0);
        free(all);
    }
    free(ref);
    free(w);
}

// A layer that fails in backward on the rank that sets fail_rank (in
// forward on fail_forward_rank): the identity otherwise.
static int fail_rank = -1, fail_forward_rank = -1;
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static ct_status flaky_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    (void)l, (void)ic, (void)key, (void)err;
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}
static ct_status flaky_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    (void)c, (void)key;
    if (rank == fail_forward_rank)
        return ct_layer_fail(l, err, CT_ERR_STATE, "forward", "fails on purpose on rank %d", rank);
    out[0] = in[0];
    return CT_OK;
}
static ct_status flaky_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                                ct_error *err) {
    (void)c, (void)key;
    if (rank == fail_rank) return ct_layer_fail(l, err, CT_ERR_STATE, "backward", "fails on purpose on rank %d", rank);
    grad_in[0] = grad_out[0];
    return CT_OK;
}
static const ct_layer_vtable flaky_vt = {
    .type = "Flaky", .init = flaky_init, .forward = flaky_forward, .backward = flaky_backward};

// Where test_reversible_failure_stops_all puts the failing layer.
typedef enum fail_where {
    FAIL_IN_REVERSIBLE,  // inside a reversible layer's residual function
    FAIL_IN_LOSS,        // in the loss layer (the standard layers after the last reversible one)
    FAIL_IN_FIRST,       // in the first layer, which has no weights, with global clipping: after the
                         // last layer whose gradients are combined, before the deferred updates
} fail_where;

// The memory-efficient trainer over ranks: a layer that fails in the
// backward pass of one rank stops every rank in the same place, each with an
// error, long before the comm's deadline (no rank waits on the other), and
// every rank keeps the same weights.
static void test_reversible_failure_stops_all(fail_where where) {
    enum { D = 8 };
    int32_t tokens[DIST_B * DIST_T] = {0};
    float weights[DIST_B * DIST_T], features[DIST_B * DIST_T * D];
    for (int i = 0; i < DIST_B * DIST_T; i++) weights[i] = 1.0f;
    for (int i = 0; i < DIST_B * DIST_T * D; i++) features[i] = (float)(i % 7) * 0.1f;
    int rows = DIST_B / size;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens), ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, rows, DIST_T, weights)};
    ct_layer *flaky = ct_layer_new(&flaky_vt, "Flaky", 1, 1, NULL, NULL, 0);
    ct_layer *first = where == FAIL_IN_FIRST ? ct_serial(CT_LAYERS(flaky, ct_dup())) : ct_serial(CT_LAYERS(
                                                   ct_embedding(DIST_VOCAB, D), ct_dup()));
    if (where == FAIL_IN_FIRST) batch[0] = ct_tensor_3d(CT_DTYPE_F32, rows, DIST_T, D, features);
    ct_layer *last_half = where == FAIL_IN_REVERSIBLE ? ct_reversible_half_residual(CT_LAYERS(ct_dense(D), flaky))
                                                      : ct_reversible_half_residual(CT_LAYERS(ct_dense(D)));
    ct_layer *head = where == FAIL_IN_LOSS ? ct_serial(CT_LAYERS(ct_dense(DIST_VOCAB), flaky)) : ct_dense(DIST_VOCAB);
    ct_layer *model = ct_serial(CT_LAYERS(first, ct_reversible_half_residual(CT_LAYERS(ct_dense(D))),
                                          ct_reversible_swap(), last_half, ct_reversible_swap(),
                                          ct_concatenate(2, -1), head));
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_trainer_options o = ct_reversible_default_options();
    o.comm = comm;
    o.reversible.log_every = 0;
    if (where == FAIL_IN_FIRST) o.clip_grad_norm = 0.01f;  // global: updates deferred to the end
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()),
                                       ct_key_from_seed(1), &dev, &o, &err),
             &err);
    ct_step_stats s;
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(1), 1, 1e-3f, &s, &err), &err);
    fail_rank = size - 1;
    double t0 = now_s();
    ct_status st = ct_trainer_one_step(tr, batch, ct_key_from_seed(2), 2, 1e-3f, &s, &err);
    double dt = now_s() - t0;
    fail_rank = -1;
    CHECK(st != CT_OK);
    if (rank == size - 1) CHECK_MSG(strstr(err.msg, "fails on purpose") != NULL, "rank %d: %s", rank, err.msg);
    else CHECK_MSG(strstr(err.msg, "another process failed") != NULL, "rank %d: %s", rank, err.msg);
    CHECK_MSG(dt < 10.0, "rank %d took %.1f s to stop", rank, dt);  // the comm's deadline is 60 s
    static const char *const names[3] = {"in a reversible layer", "in the loss layer",
                                         "in the first layer, global clipping"};
    printf("rank %d, memory-efficient trainer, a layer failing on rank %d (%s): stopped in %.3f s: %s\n", rank,
           size - 1, names[where], dt, err.msg);
    // Every rank goes on from the same weights: the next step works everywhere.
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(3), 3, 1e-3f, &s, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    float *all = malloc(net->n_weights * (size_t)size * sizeof *all);
    CHECK_OK(ct_comm_allgather_f32(comm, net->weights, all, net->n_weights, &err), &err);
    for (int r = 1; r < size; r++)
        CHECK_MSG(memcmp(all, all + (size_t)r * net->n_weights, net->n_weights * sizeof *all) == 0,
                  "%s: rank %d's weights differ from rank 0's", names[where], r);
    free(all);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// The standard trainer over ranks, with small overlapped buckets (or two
// local devices, which combine after backward): a layer that fails in one
// rank's backward at step fail_step stops both ranks before the update, each
// with an error, long before the comm's deadline; the failing rank starts
// the buckets it did not reach (the planning pass at construction recorded
// them, so the very first step is no exception), so the other's allreduces
// complete. A layer failing in forward instead stops every rank at the loss
// weight sum, before any backward.
static void test_standard_failure_stops_all(int n_local, int fail_step, bool in_forward) {
    int32_t tokens[DIST_B * DIST_T] = {0};
    float weights[DIST_B * DIST_T];
    for (int i = 0; i < DIST_B * DIST_T; i++) weights[i] = 1.0f;
    int rows = DIST_B / size;
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens), ct_tensor_2d(CT_DTYPE_I32, rows, DIST_T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, rows, DIST_T, weights)};
    ct_layer *flaky = ct_layer_new(&flaky_vt, "Flaky", 1, 1, NULL, NULL, 0);
    // The failure comes halfway through backward: the dense layers after it
    // have finished (and sent their buckets), the ones before it have not.
    ct_layer *model = ct_serial(CT_LAYERS(ct_embedding(DIST_VOCAB, 8), ct_dense(8), ct_dense(8), flaky, ct_dense(8),
                                          ct_dense(DIST_VOCAB)));
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_trainer_options o = ct_trainer_default_options();
    o.comm = comm;
    o.n_devices = n_local;
    o.bucket_bytes = 64;  // a bucket per layer or so
    ct_device dev = ct_device_cpu();
    ct_trainer *tr;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(1),
                            &dev, &o, &err),
             &err);
    ct_step_stats s;
    for (int step = 1; step < fail_step; step++)
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed((uint64_t)step), step, 1e-3f, &s, &err), &err);
    *(in_forward ? &fail_forward_rank : &fail_rank) = size - 1;
    double t0 = now_s();
    ct_status st = ct_trainer_one_step(tr, batch, ct_key_from_seed((uint64_t)fail_step), fail_step, 1e-3f, &s, &err);
    double dt = now_s() - t0;
    fail_rank = fail_forward_rank = -1;
    CHECK(st != CT_OK);
    // The failed step waited for every bucket it started (the failing rank
    // starts the ones it did not reach): none is left in flight to write
    // into the next step's gradients.
    CHECK_MSG(ct_mpi_pending(comm) == 0, "rank %d: %d bucket allreduces left pending by the failed step", rank,
              ct_mpi_pending(comm));
    const char *others = in_forward ? "a device failed or the loss weights sum to nan" : "another process failed";
    if (rank == size - 1) CHECK_MSG(strstr(err.msg, "fails on purpose") != NULL, "rank %d: %s", rank, err.msg);
    else CHECK_MSG(strstr(err.msg, others) != NULL, "rank %d: %s", rank, err.msg);
    CHECK_MSG(dt < 10.0, "rank %d took %.1f s to stop", rank, dt);
    printf("rank %d, standard trainer, %d device(s) per rank, a layer failing in rank %d's %s at step %d: "
           "stopped in %.3f s: %s\n", rank, n_local, size - 1, in_forward ? "forward" : "backward", fail_step, dt,
           err.msg);
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(9), fail_step + 1, 1e-3f, &s, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    float *all = malloc(net->n_weights * (size_t)size * sizeof *all);
    CHECK_OK(ct_comm_allgather_f32(comm, net->weights, all, net->n_weights, &err), &err);
    for (int r = 1; r < size; r++)
        CHECK_MSG(memcmp(all, all + (size_t)r * net->n_weights, net->n_weights * sizeof *all) == 0,
                  "standard trainer: rank %d's weights differ from rank 0's", r);
    free(all);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// An eval whose forward fails on one rank only: every rank stops with an
// error long before the comm's deadline (the failing one with its own, the
// others saying another process failed), and the ranks' collectives are
// still in step afterwards.
static void test_eval_failure_stops_all(void) {
    ct_stream *s = copy_batches(3);
    ct_layer *flaky = ct_layer_new(&flaky_vt, "Flaky", 1, 1, NULL, NULL, 0);
    ct_layer *model = ct_serial(CT_LAYERS(ct_embedding(VOCAB, 8), flaky, ct_dense(VOCAB)));
    ct_layer *metric = ct_weighted_category_cross_entropy();
    ct_eval_task task = {.stream = s, .n_metrics = 1, .n_batches = 2, .metrics = {metric}, .metric_names = {"loss"}};
    ct_device dev = ct_device_cpu();
    ct_evaluator *ev = NULL;
    ct_net net;
    ct_error err;
    CHECK_OK(ct_evaluator_new(&ev, model, &task, comm, &dev, &err), &err);
    CHECK_OK(ct_evaluator_model_net(ev, &net, ct_key_from_seed(1), &err), &err);
    double v[1] = {NAN};
    CHECK_OK(ct_evaluator_run(ev, &net, ct_key_from_seed(2), v, &err), &err);
    CHECK(isfinite(v[0]) && v[0] > 0);
    fail_forward_rank = size - 1;
    double t0 = now_s();
    ct_status st = ct_evaluator_run(ev, &net, ct_key_from_seed(2), v, &err);
    double dt = now_s() - t0;
    fail_forward_rank = -1;
    CHECK(st != CT_OK);
    if (rank == size - 1) CHECK_MSG(strstr(err.msg, "fails on purpose") != NULL, "rank %d: %s", rank, err.msg);
    else CHECK_MSG(strstr(err.msg, "another process failed") != NULL, "rank %d: %s", rank, err.msg);
    CHECK_MSG(dt < 10.0, "rank %d took %.1f s to stop", rank, dt);  // the comm's deadline is 60 s
    printf("rank %d, eval with a layer failing in rank %d's forward: stopped in %.3f s: %s\n", rank, size - 1, dt,
           err.msg);
    // Still in step: each rank's number reaches every other.
    double sum = rank + 1;
    CHECK_OK(ct_comm_allreduce_f64(comm, &sum, 1, &err), &err);
    CHECK(sum == size * (size + 1) / 2.0);
    ct_evaluator_free(ev);
    ct_net_free(&net);
    ct_stream_free(s);
    ct_layer_free(model);
    ct_layer_free(metric);
    CHECK(dev.current_bytes == 0);
}

// The evaluator numbers each rank's rows in the global batch (as the
// trainer): LSHSelfAttention's per-example rotations make the eval over
// ranks the eval of one process with the whole batch.
static void test_eval_rows_numbered_globally(void) {
    ct_copy_task copy = {DIST_VOCAB, 5, false, 11, 0};  // sequences of DIST_T
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = DIST_B;
    ct_layer *model = dist_model(DIST_STANDARD_LSH_REFORMER, 0.0f), *metric = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_error err;
    double v[2] = {NAN, NAN};
    for (int over_ranks = 0; over_ranks < 2; over_ranks++) {
        ct_stream *s = NULL;
        CHECK_OK(ct_copy_stream_new(&s, &copy, &err), &err);
        CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
        ct_eval_task task = {.stream = s, .n_metrics = 1, .n_batches = 2, .metrics = {metric}};
        ct_evaluator *ev = NULL;
        ct_net net;
        CHECK_OK(ct_evaluator_new(&ev, model, &task, over_ranks ? comm : NULL, &dev, &err), &err);
        CHECK_OK(ct_evaluator_model_net(ev, &net, ct_key_from_seed(3), &err), &err);
        CHECK_OK(ct_evaluator_run(ev, &net, ct_key_from_seed(4), &v[over_ranks], &err), &err);
        ct_evaluator_free(ev);
        ct_net_free(&net);
        ct_stream_free(s);
    }
    if (rank == 0)
        printf("eval of ReformerLM with LSH attention: over %d ranks %.7f, one process with the whole batch %.7f\n",
               size, v[1], v[0]);
    CHECK_MSG(fabs(v[1] - v[0]) <= 1e-6 * fabs(v[0]), "rank %d: eval over ranks %.9g, alone %.9g", rank, v[1], v[0]);
    ct_layer_free(model);
    ct_layer_free(metric);
    CHECK(dev.current_bytes == 0);
}

// An eval batch that does not split over the ranks (3 rows over 2) is
// refused when the evaluator is made, on every rank, naming the fix: not at
// the first eval, after training has begun.
static void test_eval_batch_must_split(void) {
    ct_copy_task copy = {DIST_VOCAB, 5, false, 11, 0};
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 2 * size - 1;
    ct_layer *model = dist_model(DIST_STANDARD_TRANSFORMER, 0.0f), *metric = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_stream *s = NULL;
    CHECK_OK(ct_copy_stream_new(&s, &copy, &err), &err);
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    ct_eval_task task = {.stream = s, .n_metrics = 1, .n_batches = 1, .metrics = {metric}};
    ct_evaluator *ev = NULL;
    ct_status st = ct_evaluator_new(&ev, model, &task, comm, &dev, &err);
    char want[64];
    snprintf(want, sizeof want, "make the eval batch size a multiple of %d", size);
    CHECK_MSG(st == CT_ERR_SHAPE && strstr(err.msg, want), "rank %d: an eval batch of %d rows over %d ranks: %s", rank,
              bp.batch_size, size, st == CT_OK ? "accepted" : err.msg);
    if (rank == 0 && st != CT_OK) printf("eval batch of %d rows over %d ranks: %s\n", bp.batch_size, size, err.msg);
    ct_evaluator_free(ev);
    ct_stream_free(s);
    ct_layer_free(model);
    ct_layer_free(metric);
    CHECK(dev.current_bytes == 0);
}

// The loss-only eval over ranks where the last rank's pass fails (a negative
// loss weight in its rows): it fails with its own error, and every other
// rank fails too, not with a loss of its own rows alone.
static void test_eval_loss_failure_stops_all(void) {
    float x[2 * 3] = {0}, y[2] = {0}, w[2] = {1, rank == size - 1 ? -1.0f : 1.0f};
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 3, x), ct_tensor_2d(CT_DTYPE_F32, 2, 1, y),
                          ct_tensor_2d(CT_DTYPE_F32, 2, 1, w)};
    ct_layer *model = ct_dense(1), *loss = ct_l2_loss();
    ct_trainer_options o = ct_trainer_default_options();
    o.comm = comm;
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = NULL;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, ct_sgd_new(ct_sgd_default_params()), ct_key_from_seed(5), &dev,
                            &o, &err),
             &err);
    float l = 0;
    ct_status st = tr ? ct_trainer_eval_loss(tr, batch, ct_key_from_seed(6), &l, &err) : CT_ERR_STATE;
    const char *want = rank == size - 1 ? "weight [1] is -1" : "eval loss: a device failed";
    CHECK_MSG(st != CT_OK && strstr(err.msg, want), "rank %d: eval loss with a failing rank %d: %s", rank, size - 1,
              st == CT_OK ? "a loss of its own rows" : err.msg);
    if (st != CT_OK) printf("rank %d, eval loss, rank %d fails: %s\n", rank, size - 1, err.msg);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    CHECK(dev.current_bytes == 0);
}

// ---- the Loop over ranks: where only some ranks can fail ---------------------------

// A Loop of the copy task's TransformerLM over comm, writing to dir; *st its status.
typedef struct loop_run {
    ct_stream *train;
    ct_layer *model, *loss;
    ct_loop *loop;
} loop_run;

// A stop request (a signal) that reaches rank 0 only, after step
// stop_at_step (0: none).
static volatile sig_atomic_t stop_flag;
static int64_t stop_at_step;
static void stop_on_rank0(int64_t step, void *user) {
    (void)user;
    if (rank == 0 && step == stop_at_step) stop_flag = 1;
}

// ... training with optimizer opt (taken), or SGD when opt is NULL.
static ct_status loop_run_new_with(loop_run *r, const char *dir, ct_optimizer *opt, ct_error *err) {
    memset(r, 0, sizeof *r);
    r->train = copy_batches(1);
    r->model = small_lm(0.0f);
    r->loss = ct_weighted_category_cross_entropy();
    ct_train_task task = {r->train, r->loss, opt ? opt : ct_sgd_new(ct_sgd_default_params()), NULL, NULL, 0.1f};
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = dir;
    o.n_steps_per_checkpoint = 2;
    o.trainer.comm = comm;
    o.stop = &stop_flag;
    o.callbacks[0] = (ct_loop_callback){.on_step_end = stop_on_rank0};
    o.n_callbacks = 1;
    return ct_loop_new(&r->loop, r->model, &task, 1, NULL, &o, err);
}

static ct_status loop_run_new(loop_run *r, const char *dir, ct_error *err) {
    return loop_run_new_with(r, dir, NULL, err);
}

static void loop_run_free(loop_run *r) {
    ct_loop_free(r->loop);
    ct_stream_free(r->train);
    ct_layer_free(r->model);
    ct_layer_free(r->loss);
}

// After a failure some ranks saw and others did not: every rank's number
// reaches every other through each kind of collective (a rank that made
// one collective more or fewer would take another's message for its own).
static void check_in_step(const char *what) {
    ct_error err;
    double sum = rank + 1;
    CHECK_OK(ct_comm_allreduce_f64(comm, &sum, 1, &err), &err);
    CHECK_MSG(sum == size * (size + 1) / 2.0, "%s: allreduce gave %g", what, sum);
    int from_last = rank == size - 1 ? 4321 : -1;
    CHECK_OK(ct_comm_broadcast(comm, &from_last, sizeof from_last, size - 1, &err), &err);
    CHECK_MSG(from_last == 4321, "%s: broadcast gave %d", what, from_last);
    CHECK_OK(ct_comm_barrier(comm, &err), &err);
}

// Checks that st failed on every rank within a few seconds (the comm's
// deadline is 60 s), with own_error on rank `who` and others_error on the
// others, then that the ranks are still in step.
static void check_all_stopped(const char *what, ct_status st, const ct_error *err, double dt, int who,
                              const char *own_error, const char *others_error) {
    CHECK_MSG(st != CT_OK, "%s: rank %d went on", what, rank);
    const char *want = rank == who ? own_error : others_error;
    CHECK_MSG(strstr(err->msg, want) != NULL, "%s: rank %d: '%s', not '%s'", what, rank, err->msg, want);
    CHECK_MSG(dt < 10.0, "%s: rank %d took %.1f s to stop", what, rank, dt);
    printf("rank %d, %s: stopped in %.3f s: %s\n", rank, what, dt, err->msg);
    check_in_step(what);
}

// The chief finds no checkpoint that loads (a damaged one): every rank stops
// in ct_loop_new, and the ranks are still in step.
static void test_loop_chief_cannot_resume(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("damaged"));
    if (rank == 0) {
        CHECK(mkdir(dir, 0777) == 0);
        char m[1100];
        snprintf(m, sizeof m, "%s/model_1", dir);
        CHECK(mkdir(m, 0777) == 0);
        snprintf(m, sizeof m, "%s/model_1/manifest.json", dir);
        FILE *f = fopen(m, "w");
        CHECK(f != NULL);
        if (f) fputs("not a manifest", f), fclose(f);
    }
    ct_error err;
    CHECK_OK(ct_comm_barrier(comm, &err), &err);
    loop_run r;
    double t0 = now_s();
    ct_status st = loop_run_new(&r, dir, &err);
    check_all_stopped("a loop whose chief finds no checkpoint that loads", st, &err, now_s() - t0, 0,
                      "no checkpoint loads", "the chief could not find a checkpoint");
    loop_run_free(&r);
}

// The chief resumes from a checkpoint the other ranks do not see (each
// rank has its own output directory, as on hosts with no shared disk):
// every rank stops in ct_loop_new with an error, none waits.
static void test_loop_rank_cannot_resume(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path(rank == 0 ? "resume_chief" : "resume_other"));
    // Rank 0 alone (a comm of its own, the single one) writes model_2.
    if (rank == 0) {
        ct_comm *saved = comm;
        comm = NULL;  // loop_run_new: no comm, one process
        loop_run r;
        ct_error err;
        CHECK_OK(loop_run_new(&r, dir, &err), &err);
        if (r.loop) CHECK_OK(ct_loop_run(r.loop, 2, &err), &err);
        loop_run_free(&r);
        comm = saved;
    }
    loop_run r;
    ct_error err;
    CHECK_OK(ct_comm_barrier(comm, &err), &err);
    double t0 = now_s();
    ct_status st = loop_run_new(&r, dir, &err);
    check_all_stopped("a loop whose checkpoint only the chief sees", st, &err, now_s() - t0, size - 1,
                      "model_2", "another process could not load it");
    loop_run_free(&r);
}

// The chief cannot write a checkpoint at a step on the cadence (its output
// directory is gone, a file in its place): every rank stops at that step,
// none goes on to wait in the next one.
static void test_loop_chief_cannot_write(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("unwritable"));
    loop_run r;
    ct_error err;
    CHECK_OK(loop_run_new(&r, dir, &err), &err);
    if (!r.loop) {
        loop_run_free(&r);
        return;
    }
    CHECK_OK(ct_loop_run(r.loop, 1, &err), &err);  // model_1
    if (rank == 0) {
        // The directory goes (only the chief notices) and a file takes its place.
        char moved[1100];
        snprintf(moved, sizeof moved, "%s.moved", dir);
        CHECK(rename(dir, moved) == 0);
        FILE *f = fopen(dir, "w");
        CHECK(f != NULL);
        if (f) fclose(f);
    }
    CHECK_OK(ct_comm_barrier(comm, &err), &err);
    double t0 = now_s();
    ct_status st = ct_loop_run(r.loop, 4, &err);  // a checkpoint at step 2
    check_all_stopped("a loop whose chief cannot write a checkpoint", st, &err, now_s() - t0, 0,
                      "writing checkpoint model_2", "process 0 failed to write a checkpoint");
    CHECK_MSG(ct_loop_step(r.loop) == 2, "rank %d stopped at step %lld", rank, (long long)ct_loop_step(r.loop));
    loop_run_free(&r);
}

// A stop requested on rank 0 only (after step 2): every rank stops after
// the same step, with its checkpoint, and none waits on another.
static void test_loop_stop_on_one_rank(void) {
    loop_run r;
    ct_error err;
    stop_at_step = 2;
    CHECK_OK(loop_run_new(&r, tmp_path("stop"), &err), &err);
    if (r.loop) {
        CHECK_OK(ct_loop_run(r.loop, 5, &err), &err);
        CHECK_MSG(ct_loop_stopped(r.loop) && ct_loop_step(r.loop) == 2, "rank %d: stopped %d at step %lld", rank,
                  (int)ct_loop_stopped(r.loop), (long long)ct_loop_step(r.loop));
        if (rank == 0) printf("a stop requested on rank 0 only: every rank stopped after step %lld\n",
                              (long long)ct_loop_step(r.loop));
    }
    stop_flag = 0;
    stop_at_step = 0;
    loop_run_free(&r);
    check_in_step("a stop on one rank");
}

// The crc32 of every weight and optimizer slot of t (an independent check:
// one crc over the whole slabs), and whether every rank has rank 0's.
static bool same_as_rank0(const ct_trainer *t) {
    const ct_net *net = ct_trainer_net(t);
    size_t n_slots;
    const float *slots = ct_trainer_slots(t, &n_slots);
    uint32_t crc[2] = {(uint32_t)crc32_z(0, (const Bytef *)net->weights, net->n_weights * sizeof(float)),
                       (uint32_t)crc32_z(0, (const Bytef *)slots, n_slots * sizeof(float))};
    uint32_t chief[2] = {crc[0], crc[1]};
    ct_error err;
    CHECK_OK(ct_comm_broadcast(comm, chief, sizeof chief, 0, &err), &err);
    double differ = crc[0] != chief[0] || crc[1] != chief[1];
    CHECK_OK(ct_comm_allreduce_f64(comm, &differ, 1, &err), &err);
    return differ == 0;
}

// A copy that drifts apart (the last rank's first weight, or its first
// optimizer slot, changed behind the loop's back, as another CPU's rounding
// or a flipped bit would): at the next checkpoint the odd rank says which
// (a warning), rank 0 says how many differed, rank 0's weights and slots
// are copied to every rank, and the run goes on from one model. A weight:
// through ct_loop_run (the checkpoint at step 2; none differs at step 4). A
// slot: at once, in ct_loop_save_checkpoint (a step would carry the
// difference into the weights, which are compared first). last: the last
// parameter's slot (the crc compared last) instead of the first's.
static void test_loop_replicas_drifted(bool in_slots, bool last) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path(last ? "drift_last_slots" : in_slots ? "drift_slots" : "drift_weights"));
    loop_run r;
    ct_error err;
    CHECK_OK(loop_run_new_with(&r, dir, in_slots ? ct_adam_new(ct_adam_default_params()) : NULL, &err), &err);
    if (!r.loop) {
        loop_run_free(&r);
        return;
    }
    CHECK_OK(ct_loop_run(r.loop, 1, &err), &err);  // model_1, written while the copies agree
    const ct_trainer *t = ct_loop_trainer(r.loop);
    const ct_net *net = ct_trainer_net(t);
    CHECK(same_as_rank0(t));
    int p = last ? net->n_params - 1 : 0;
    if (rank == size - 1) {
        size_t off, cnt;
        ct_trainer_param_slots(t, p, &off, &cnt);
        float *x = in_slots ? ct_trainer_slots(t, NULL) + off : net->weights + net->params[p]->offset;
        *x += 1.0f;
    }
    CHECK(!same_as_rank0(t));
    capture c;
    capture_begin(&c);
    ct_status st = in_slots ? ct_loop_save_checkpoint(r.loop, &err) : ct_loop_run(r.loop, 4, &err);
    char *log = capture_end(&c);
    fputs(log, stderr);
    CHECK_OK(st, &err);
    CHECK(same_as_rank0(t));
    int64_t want = in_slots ? 1 : 4;
    CHECK_MSG(ct_loop_step(r.loop) == want, "rank %d at step %lld", rank, (long long)ct_loop_step(r.loop));
    char own[512];
    snprintf(own, sizeof own, "loop: step %d: process %d's %s of %s differ from process 0's", in_slots ? 1 : 2,
             size - 1, in_slots ? "optimizer slots" : "weights", net->params[p]->full_name);
    const char *want_log = rank == size - 1 ? own : rank == 0 ? "1 other process(es) hold weights or slots" : NULL;
    CHECK_MSG(want_log ? strstr(log, want_log) != NULL : strstr(log, "differ") == NULL, "rank %d logged: '%s'",
              rank, log);
    // Once: the copies agree from then on (no word at step 4's checkpoint).
    int copies = 0;
    for (const char *p = log; (p = strstr(p, "copied to every process")) != NULL; p++) copies++;
    CHECK_MSG(copies == (rank == 0 || rank == size - 1), "rank %d logged the copy %d times", rank, copies);
    free(log);
    loop_run_free(&r);
}

int main(void) {
    ct_error err;
    if (ct_comm_mpi_new(&comm, 60, &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    rank = ct_comm_rank(comm);
    size = ct_comm_size(comm);
    // One scratch directory for every rank: rank 0's.
    if (rank == 0) scratch_init("mpi_test_dist");
    if (ct_comm_broadcast(comm, g_tmp, sizeof g_tmp, 0, &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    CHECK(ct_comm_get_kind(comm) == CT_COMM_MPI && size >= 2);
    test_collectives();
    compare("MPI", 1, 0, 0);
    compare("MPI, small buckets", 1, 4096, 0);
    compare("MPI x local devices", 2, 0, 0);
    // A bucket of every layer, sent when the layer's gradients are said to
    // be final: with the loss in chunks, after its last chunk only.
    compare("MPI, one-float buckets, loss_chunk_size 5", 1, 4, 5);
    compare_shared_layer();
    test_adasum_over_ranks();
    test_adasum_devices_order();
    compare_adasum_ranks_and_local_devices();
    compare_keys_and_rows();
    test_other_seed_refused();
    test_other_options_refused();
    compare_reversible(1, false, 0.0f, 20);
    compare_reversible(2, false, 0.0f, 20);
    compare_reversible(2, true, 0.0f, 20);
    compare_reversible(1, false, 0.1f, 10);
    compare_reversible(2, false, 0.1f, 10);
    test_reversible_failure_stops_all(FAIL_IN_REVERSIBLE);
    test_reversible_failure_stops_all(FAIL_IN_LOSS);
    test_reversible_failure_stops_all(FAIL_IN_FIRST);
    test_standard_failure_stops_all(1, 2, false);
    test_standard_failure_stops_all(2, 2, false);
    test_standard_failure_stops_all(1, 1, false);
    test_standard_failure_stops_all(1, 2, true);
    test_eval_rows_numbered_globally();
    test_eval_failure_stops_all();
    test_eval_batch_must_split();
    test_eval_loss_failure_stops_all();
    test_loop_chief_cannot_resume();
    test_loop_rank_cannot_resume();
    test_loop_chief_cannot_write();
    test_loop_stop_on_one_rank();
    test_loop_replicas_drifted(false, false);
    test_loop_replicas_drifted(true, false);
    test_loop_replicas_drifted(true, true);
    // Every rank's verdict: the job fails if any rank failed.
    double failed = check_failed_;
    ct_comm_allreduce_f64(comm, &failed, 1, &err);
    int rc = rank == 0 ? check_summary("mpi_test_dist") : (check_failed_ ? 1 : 0);
    if (rank == 0 && failed > check_failed_) rc = 1;
    if (rank == 0 && failed == 0) ct_fs_remove_tree(g_tmp, NULL);
    ct_comm_free(comm);
    return rc;
}
