// Communication between the replicas of a data-parallel run.
//
// One interface, three engines:
//   single  one replica; every collective is a no-op.
//   local   n replicas that are threads of one process (ct_comm_local_new
//           makes the group; each thread uses its own handle). Collectives
//           meet at a barrier and combine in a fixed order, so results are
//           the same bits on every run.
//   mpi     one replica per MPI process (Open MPI); the engine beyond one
//           machine. Every wait has a deadline: the bucket allreduces are
//           non-blocking and polled, and end with an error naming the
//           operation and the rank; the plain allreduce is MPI's blocking one
//           (faster in Open MPI than its non-blocking one), watched by a
//           thread that calls the abort handler at the deadline. Either way a
//           dead or hung peer stops the job with a message, never a hang.
//           A wait that gives up leaves MPI requests that may still write
//           into their buffers, so the handle then refuses every collective
//           (CT_ERR_STATE, naming the first failure): end the job.
// A handle is used by one thread at a time. Collectives must be called by
// every member of the group in the same order.
#ifndef CTRAX_DIST_COMM_H
#define CTRAX_DIST_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "ctrax/core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_comm ct_comm;

typedef enum ct_comm_kind {
    CT_COMM_SINGLE = 0,
    CT_COMM_LOCAL = 1,
    CT_COMM_MPI = 2,
} ct_comm_kind;

// Constructors follow the rule of ctrax/ctrax.h: the caller owns what they
// make (free with ct_comm_free); on failure nothing is left allocated and
// the out handles are NULL (ct_comm_local_new with n out of range writes
// none: out may hold fewer than n).

// The single-replica comm. Cannot fail (out of memory aborts).
ct_comm *ct_comm_single_new(void);
// A group of n thread replicas, 1..CT_COMM_LOCAL_MAX: writes n handles into
// out[0..n) (handle i is rank i). Free each with ct_comm_free; the group goes
// with the last one. CT_ERR_ARG for n out of range, CT_ERR_STATE when the
// group's barrier cannot be made.
#define CT_COMM_LOCAL_MAX 1024
ct_status ct_comm_local_new(ct_comm **out, int n, ct_error *err);
// The MPI comm over MPI_COMM_WORLD. Calls MPI_Init_thread if MPI is not
// initialized yet (and MPI_Finalize when freed, or when this call fails
// after it, if it did). timeout_s bounds every collective's wait (0: 300 s).
ct_status ct_comm_mpi_new(ct_comm **out, double timeout_s, ct_error *err);
// True when this process was started by mpirun (OMPI_COMM_WORLD_SIZE set).
int ct_comm_mpi_launched(void);
void ct_comm_free(ct_comm *c);
// Ends every process of the job (MPI_Abort) after a failure that leaves
// the others unable to go on; a program calls it, the library never does.
// Does nothing on the single and local engines.
void ct_comm_abort(ct_comm *c, int code);

ct_comm_kind ct_comm_get_kind(const ct_comm *c);
int ct_comm_rank(const ct_comm *c);
int ct_comm_size(const ct_comm *c);

// In place: every member's buf becomes the elementwise sum over members.
ct_status ct_comm_allreduce_f32(ct_comm *c, float *buf, size_t n, ct_error *err);
ct_status ct_comm_allreduce_f64(ct_comm *c, double *buf, size_t n, ct_error *err);
// Every member's out (n floats each, in member order) gets all members' in.
// out holds size * n floats.
ct_status ct_comm_allgather_f32(ct_comm *c, const float *in, float *out, size_t n, ct_error *err);
// root's bytes are copied to every member's buf.
ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t bytes, int root, ct_error *err);
ct_status ct_comm_barrier(ct_comm *c, ct_error *err);

// ---- Bucketed allreduce that overlaps computation ---------------------------
//
// ct_comm_allreduce_start begins summing buf (n floats) and returns at once;
// ct_comm_allreduce_wait waits for every started sum of this handle. The
// trainer starts one per layer bucket as soon as backward has finished the
// bucket's gradients, so the network works while backward goes on. On the
// single and local engines start does the work itself (nothing to overlap).
ct_status ct_comm_allreduce_start(ct_comm *c, float *buf, size_t n, ct_error *err);
ct_status ct_comm_allreduce_wait(ct_comm *c, ct_error *err);

// ---- Adasum ---------------------------------------------------------------
//
// Combines k gradient vectors the Adasum way: for two vectors a and b,
//   (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
// (a zero vector leaves the other as it is), dot products in double, applied
// per tensor: ranges[i] = {offset, length} of tensor i within the vectors.
// Vectors are combined pairwise in a fixed tree (0+1, 2+3, ..., then the
// results likewise; an odd one out moves up unchanged), so any k works, not
// only powers of two. The result is written to vecs[0]; the others are
// clobbered. Orthogonal vectors add up; equal ones average.
typedef struct ct_range {
    size_t offset, length;
} ct_range;
void ct_adasum(float **vecs, int k, const ct_range *ranges, int n_ranges);
// Adasum over every device of every process of comm, in global device order
// (device p * n_local + d is process p's local device d): local[d] holds
// local device d's n floats. With several processes the vectors are first
// gathered into gather (n_local * size * n floats; else unused). The result
// goes to out (which may be local[0]); local vectors may be clobbered.
ct_status ct_adasum_devices(ct_comm *comm, float *const *local, int n_local, size_t n, const ct_range *ranges,
                            int n_ranges, float *gather, float *out, ct_error *err);

#ifdef __cplusplus
}
#endif
#endif
