// A data-parallel run in which one rank fails on purpose (see
// mpi_failure_test.sh): `mpi_failure kill` has rank 1 SIGKILL itself at
// step 5, `mpi_failure hang` has it SIGSTOP itself (alive but silent). The
// job must end with a clear message, not hang.
#include <signal.h>
#include <unistd.h>

#include "dist_common.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: mpi_failure kill|hang TIMEOUT_S\n");
        return 2;
    }
    ct_comm *comm;
    ct_error err;
    if (ct_comm_mpi_new(&comm, atof(argv[2]), &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rank = ct_comm_rank(comm);
    float buf[1024];
    for (int step = 1; step <= 1000; step++) {
        if (rank == 1 && step == 5) {
            fprintf(stderr, "rank 1: %s myself at step 5\n", argv[1][0] == 'k' ? "killing" : "stopping");
            raise(argv[1][0] == 'k' ? SIGKILL : SIGSTOP);
        }
        for (int i = 0; i < 1024; i++) buf[i] = (float)step;
        if (ct_comm_allreduce_f32(comm, buf, 1024, &err) != CT_OK) {
            fprintf(stderr, "ctrax: step %d: %s\n", step, err.msg);
            ct_comm_abort(comm, 1);
        }
        usleep(20000);
    }
    ct_comm_free(comm);
    return 0;
}
