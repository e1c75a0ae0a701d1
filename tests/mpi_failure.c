// A data-parallel run in which one rank fails on purpose (see
// mpi_failure_test.sh): `mpi_failure kill` has rank 1 SIGKILL itself at
// step 5, `mpi_failure hang` has it SIGSTOP itself (alive but silent). The
// job must end with a clear message, not hang. `mpi_failure hang_buckets`
// hangs as `hang` does while the steps sum through the bucketed allreduce
// (ct_comm_allreduce_start/wait, whose wait has its own deadline) instead of
// the blocking one (watched by the watchdog thread), then finds the comm
// refusing another collective.
#include <signal.h>
#include <unistd.h>

#include "dist_common.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: mpi_failure kill|hang|hang_buckets TIMEOUT_S\n");
        return 2;
    }
    ct_comm *comm;
    ct_error err;
    if (ct_comm_mpi_new(&comm, atof(argv[2]), &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rank = ct_comm_rank(comm);
    bool buckets = strcmp(argv[1], "hang_buckets") == 0;
    float buf[1024];
    for (int step = 1; step <= 1000; step++) {
        if (rank == 1 && step == 5) {
            fprintf(stderr, "rank 1: %s myself at step 5\n", argv[1][0] == 'k' ? "killing" : "stopping");
            raise(argv[1][0] == 'k' ? SIGKILL : SIGSTOP);
        }
        for (int i = 0; i < 1024; i++) buf[i] = (float)step;
        // Two buckets, as the trainer starts one per group of layers.
        ct_status st = buckets ? ct_comm_allreduce_start(comm, buf, 512, &err) : CT_OK;
        if (buckets && st == CT_OK) st = ct_comm_allreduce_start(comm, buf + 512, 512, &err);
        if (buckets && st == CT_OK) st = ct_comm_allreduce_wait(comm, &err);
        if (!buckets) st = ct_comm_allreduce_f32(comm, buf, 1024, &err);
        if (st != CT_OK) {
            fprintf(stderr, "ctrax: step %d: %s\n", step, err.msg);
            // The buckets' requests may still be in flight: the comm now
            // refuses any collective, saying why.
            if (buckets && ct_comm_allreduce_start(comm, buf, 512, &err) == CT_ERR_STATE)
                fprintf(stderr, "ctrax: after it: %s\n", err.msg);
            ct_comm_abort(comm, 1);
        }
        usleep(20000);
    }
    ct_comm_free(comm);
    return 0;
}
