// Data parallelism across processes, run under `mpirun -np 2` (see
// CMakeLists.txt): the MPI comm engine, and the trainer over ranks against
// one device with the whole batch.
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
    float *ref = adasum ? dist_train_with(DIST_STANDARD_REFORMER, 20, rank * rows, rows, &many, &l1, &n1)
                        : dist_train_with(DIST_STANDARD_REFORMER, 20, 0, DIST_B, &one, &l1, &n1);
    float *w = dist_train_with(DIST_REVERSIBLE_REFORMER, 20, rank * rows, rows, &many, &l2, &n2);
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
    // Every rank's verdict: the job fails if any rank failed.
    double failed = check_failed_;
    ct_comm_allreduce_f64(comm, &failed, 1, &err);
    int rc = rank == 0 ? check_summary("mpi_test_dist") : (check_failed_ ? 1 : 0);
    if (rank == 0 && failed > check_failed_) rc = 1;
    ct_comm_free(comm);
    return rc;
}
