// Data parallelism across processes, run under `mpirun -np 2` (see
// CMakeLists.txt): the MPI comm engine, and the trainer over ranks against
// one device with the whole batch.
#include <time.h>

#include "dist_common.h"

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
    CHECK_OK(ct_comm_allreduce_wait(comm, &err), &err);
    CHECK(a[2] == 3.0f * size && b[1] == 20.0f * size);
    CHECK_OK(ct_comm_barrier(comm, &err), &err);
}

static void compare(const char *what, int n_local, size_t bucket_bytes) {
    ct_trainer_options one = ct_trainer_default_options(), many = one;
    many.comm = comm;
    many.n_devices = n_local;
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

// The memory-efficient trainer over ranks (x local devices) against the
// standard trainer on one device with the whole batch; and its Adasum over
// ranks against the standard trainer's.
static void compare_reversible(int n_local, bool adasum) {
    ct_trainer_options one = ct_trainer_default_options(), many = one;
    many.comm = comm;
    many.n_devices = n_local;
    many.adasum = adasum;
    int rows = DIST_B / size;
    size_t n1, n2;
    float l1, l2;
    float *ref = adasum ? dist_train_with(DIST_STANDARD_REFORMER, 0.0f, 20, rank * rows, rows, &many, &l1, &n1)
                        : dist_train_with(DIST_STANDARD_REFORMER, 0.0f, 20, 0, DIST_B, &one, &l1, &n1);
    float *w = dist_train_with(DIST_REVERSIBLE_REFORMER, 0.0f, 20, rank * rows, rows, &many, &l2, &n2);
    CHECK(ref && w && n1 == n2);
    if (ref && w && n1 == n2) {
        double rel = dist_rel_diff(ref, w, n1);
        if (rank == 0)
            printf("ReformerLM, 20 steps, memory-efficient trainer on %d ranks x %d devices%s vs standard %s: relative "
                   "weight difference %.3g, loss %.5f vs %.5f\n",
                   size, n_local, adasum ? " (Adasum)" : "", adasum ? "(same devices, Adasum)" : "on 1 device",
                   rel, l2, l1);
        CHECK_MSG(rel <= 1e-5, "rel diff %g", rel);
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

// A layer that fails in backward on the rank that sets fail_rank: the
// identity otherwise.
static int fail_rank = -1;
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
    (void)l, (void)c, (void)key, (void)err;
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
// rank's backward stops both ranks before the update, each with an error,
// long before the comm's deadline; the failing rank starts the buckets it
// did not reach, so the other's allreduces complete.
static void test_standard_failure_stops_all(int n_local) {
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
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(1), 1, 1e-3f, &s, &err), &err);
    fail_rank = size - 1;
    double t0 = now_s();
    ct_status st = ct_trainer_one_step(tr, batch, ct_key_from_seed(2), 2, 1e-3f, &s, &err);
    double dt = now_s() - t0;
    fail_rank = -1;
    CHECK(st != CT_OK);
    if (rank == size - 1) CHECK_MSG(strstr(err.msg, "fails on purpose") != NULL, "rank %d: %s", rank, err.msg);
    else CHECK_MSG(strstr(err.msg, "another process failed") != NULL, "rank %d: %s", rank, err.msg);
    CHECK_MSG(dt < 10.0, "rank %d took %.1f s to stop", rank, dt);
    printf("rank %d, standard trainer, %d device(s) per rank, a layer failing in rank %d's backward: stopped in "
           "%.3f s: %s\n", rank, n_local, size - 1, dt, err.msg);
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(3), 3, 1e-3f, &s, &err), &err);
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

int main(void) {
    ct_error err;
    if (ct_comm_mpi_new(&comm, 60, &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    rank = ct_comm_rank(comm);
    size = ct_comm_size(comm);
    CHECK(ct_comm_get_kind(comm) == CT_COMM_MPI && size >= 2);
    test_collectives();
    compare("MPI", 1, 0);
    compare("MPI, small buckets", 1, 4096);
    compare("MPI x local devices", 2, 0);
    test_adasum_over_ranks();
    compare_reversible(1, false);
    compare_reversible(2, false);
    compare_reversible(2, true);
    test_reversible_failure_stops_all(FAIL_IN_REVERSIBLE);
    test_reversible_failure_stops_all(FAIL_IN_LOSS);
    test_reversible_failure_stops_all(FAIL_IN_FIRST);
    test_standard_failure_stops_all(1);
    test_standard_failure_stops_all(2);
    // Every rank's verdict: the job fails if any rank failed.
    double failed = check_failed_;
    ct_comm_allreduce_f64(comm, &failed, 1, &err);
    int rc = rank == 0 ? check_summary("mpi_test_dist") : (check_failed_ ? 1 : 0);
    if (rank == 0 && failed > check_failed_) rc = 1;
    ct_comm_free(comm);
    return rc;
}
