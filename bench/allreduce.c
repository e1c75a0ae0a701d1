// Allreduce bandwidth of ctrax's comm layer against raw MPI_Allreduce, for
// buffers from 1 MB to 256 MB. Run under mpirun (bench/run_dist.sh does):
//   mpirun -np 2 build/bench_allreduce
// Prints, per size, the median time of each and the ratio of their
// bandwidths (comm / raw; 1.0 = the same speed) as the median over the
// repeats of each back-to-back pair's ratio: a pair shares the machine's
// load of the moment, which on a shared machine swings the times by more
// than the difference being measured.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/ctrax.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

int main(void) {
    ct_comm *comm;
    ct_error err;
    if (ct_comm_mpi_new(&comm, 600, &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rank = ct_comm_rank(comm), size = ct_comm_size(comm);
    if (rank == 0)
        printf("allreduce over %d processes: ctrax comm vs raw MPI_Allreduce (medians over the repeats)\n"
               "%10s %8s %12s %12s %20s\n",
               size, "MB", "repeats", "raw ms", "comm ms", "comm/raw bandwidth");
    for (size_t mb = 1; mb <= 256; mb *= 2) {
        size_t n = mb * (1 << 20) / sizeof(float);
        float *buf = malloc(n * sizeof *buf);
        for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 97);
        int repeats = mb <= 64 ? 15 : 7;  // a median over enough to steady it on a shared machine
        double raw[16], ours[16];
        for (int r = 0; r < repeats; r++) {
            // Alternate the two so machine noise hits both alike.
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            raw[r] = MPI_Wtime() - t0;
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
            if (ct_comm_allreduce_f32(comm, buf, n, &err) != CT_OK) {
                fprintf(stderr, "%s\n", err.msg);
                ct_comm_abort(comm, 1);
            }
            ours[r] = MPI_Wtime() - t0;
        }
        // Each rank's times differ a little; take rank 0's.
        double ratio[16];
        for (int r = 0; r < repeats; r++) ratio[r] = raw[r] / ours[r];
        double r_med = median(raw, repeats), o_med = median(ours, repeats), ratio_med = median(ratio, repeats);
        if (rank == 0) printf("%10zu %8d %12.2f %12.2f %20.3f\n", mb, repeats, 1e3 * r_med, 1e3 * o_med, ratio_med);
        free(buf);
    }
    ct_comm_free(comm);
    return 0;
}
