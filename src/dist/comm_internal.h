// The comm handle, shared by the engines in src/dist/.
#ifndef CTRAX_DIST_COMM_INTERNAL_H
#define CTRAX_DIST_COMM_INTERNAL_H

#include <pthread.h>

#include "ctrax/dist/comm.h"

// The shared state of a group of thread replicas.
typedef struct local_group {
    int n;
    int refs;  // handles not yet freed
    pthread_mutex_t mu;
    pthread_barrier_t barrier;
    void **slots;  // slots[rank]: the buffer each member passed to the current collective
} local_group;

typedef struct mpi_state mpi_state;

struct ct_comm {
    ct_comm_kind kind;
    int rank, size;
    local_group *group;  // CT_COMM_LOCAL
    mpi_state *mpi;      // CT_COMM_MPI
};

// The MPI engine's collectives (comm_mpi.c).
ct_status ct_mpi_allreduce(ct_comm *c, void *buf, size_t n, int is_f64, ct_error *err);
ct_status ct_mpi_allgather_f32(ct_comm *c, const float *in, float *out, size_t n, ct_error *err);
ct_status ct_mpi_broadcast(ct_comm *c, void *buf, size_t bytes, int root, ct_error *err);
ct_status ct_mpi_barrier(ct_comm *c, ct_error *err);
ct_status ct_mpi_allreduce_start(ct_comm *c, float *buf, size_t n, ct_error *err);
ct_status ct_mpi_allreduce_wait(ct_comm *c, ct_error *err);
// Bucket allreduces started and not yet waited for: 0 after every wait,
// which must leave none behind (tests check the bookkeeping through it).
int ct_mpi_pending(const ct_comm *c);
void ct_mpi_free(ct_comm *c);

#endif
