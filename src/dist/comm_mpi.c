// The MPI engine, on a private copy of MPI_COMM_WORLD. Every wait has a
// deadline, so a dead or hung peer ends the job with a message instead of a
// hang: the bucket allreduces that overlap backward are non-blocking and
// polled against the deadline (an error returned); the plain allreduce is
// MPI's blocking one, which Open MPI runs with faster algorithms than its
// non-blocking one, watched by a thread that calls the abort handler when
// the deadline passes (a blocked MPI call cannot return an error).
#include <stdbool.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrax/core/memory.h"
#include "dist/comm_internal.h"

struct mpi_state {
    MPI_Comm comm;      // our own communicator, errors returned to us
    double timeout_s;   // longest wait for one collective
    int finalize;       // we called MPI_Init, so we call MPI_Finalize
    MPI_Request *pending;  // started bucket allreduces
    int n_pending, cap_pending;
    // The watchdog of blocking calls: armed with a deadline around each one.
    pthread_t watchdog;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool armed, quit;
    double deadline;
    const char *op;
    int rank, size;
    // Set when a wait gave up (its deadline or an MPI error) on requests
    // that may still be in flight: MPI may yet write into their buffers, so
    // every later collective is refused with it instead of starting.
    char broken[160];
};

int ct_comm_mpi_launched(void) { return getenv("OMPI_COMM_WORLD_SIZE") != NULL; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *watchdog_main(void *arg) {
    mpi_state *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->quit) {
        if (!m->armed) {
            pthread_cond_wait(&m->cv, &m->mu);
            continue;
        }
        double left = m->deadline - now_s();
        if (left <= 0)
            ct_abort(__FILE__, __LINE__,
                     "MPI %s on rank %d of %d did not finish within %.0f s: another rank died or hangs", m->op,
                     m->rank, m->size, m->timeout_s);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double until = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + left;
        ts.tv_sec = (time_t)until;
        ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

// Arms the watchdog for op (NULL: disarms it); quit ends its thread.
static void tell_watchdog(mpi_state *m, const char *op, bool quit) {
    pthread_mutex_lock(&m->mu);
    m->armed = op != NULL;
    m->op = op;
    m->deadline = now_s() + m->timeout_s;
    m->quit = quit;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

static void watch(mpi_state *m, const char *op) { tell_watchdog(m, op, false); }

static ct_status mpi_fail(ct_comm *c, int code, const char *op, ct_error *err) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    return ct_error_set(err, CT_ERR_IO, "MPI %s failed on rank %d of %d: %s", op, c->rank, c->size, msg);
}

// A wait that gave up: the comm is unusable from now on (mpi_state.broken).
static ct_status give_up(ct_comm *c, ct_status st, const ct_error *err) {
    snprintf(c->mpi->broken, sizeof c->mpi->broken, "%.159s", err ? err->msg : "an earlier collective failed");
    return st;
}

// CT_OK, or why the comm can run no more collectives.
static ct_status usable(ct_comm *c, ct_error *err) {
    const mpi_state *m = c->mpi;
    if (!m->broken[0]) return CT_OK;
    return ct_error_set(err, CT_ERR_STATE,
                        "MPI comm on rank %d of %d is unusable after an earlier collective failed (%s): its "
                        "requests may still write into their buffers; end the job",
                        c->rank, c->size, m->broken);
}

// Waits for n requests until the deadline. Spins on MPI_Testall (MPI makes
// progress inside it), sleeping a little between tries once the wait is long.
static ct_status wait_all(ct_comm *c, MPI_Request *reqs, int n, const char *op, ct_error *err) {
    mpi_state *m = c->mpi;
    double start = now_s();
    long tries = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS) return give_up(c, mpi_fail(c, rc, op, err), err);
        if (done) return CT_OK;
        if (++tries > 1000) {
            struct timespec nap = {0, 50 * 1000};
            nanosleep(&nap, NULL);
            if (now_s() - start > m->timeout_s)
                return give_up(c,
                               ct_error_set(err, CT_ERR_IO,
                                            "MPI %s on rank %d of %d did not finish within %.0f s: another rank "
                                            "died or hangs",
                                            op, c->rank, c->size, m->timeout_s),
                               err);
        }
    }
}

// Our communicator and the watchdog's thread; on failure, undoes what it made.
static ct_status mpi_state_init(mpi_state *m, int *rank, int *size, ct_error *err) {
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (rc != MPI_SUCCESS) return ct_error_set(err, CT_ERR_IO, "MPI_Comm_dup of MPI_COMM_WORLD failed (error %d)", rc);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, rank);
    MPI_Comm_size(m->comm, size);
    m->rank = *rank;
    m->size = *size;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&m->mu, NULL);
    rc = pthread_create(&m->watchdog, NULL, watchdog_main, m);
    if (rc == 0) return CT_OK;
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    MPI_Comm_free(&m->comm);
    return ct_error_set(err, CT_ERR_STATE, "MPI comm: cannot start the watchdog thread: %s", strerror(rc));
}

ct_status ct_comm_mpi_new(ct_comm **out, double timeout_s, ct_error *err) {
    *out = NULL;
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized) return ct_error_set(err, CT_ERR_STATE, "MPI was already finalized in this process");
    int we_init = 0;
    if (!initialized) {
        int provided;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return ct_error_set(err, CT_ERR_IO, "MPI_Init_thread failed (is this run under mpirun?)");
        we_init = 1;
    }
    ct_comm *c = ct_calloc(1, sizeof *c);
    mpi_state *m = ct_calloc(1, sizeof *m);
    c->kind = CT_COMM_MPI;
    c->mpi = m;
    m->timeout_s = timeout_s > 0 ? timeout_s : 300.0;
    m->finalize = we_init;
    ct_status st = mpi_state_init(m, &c->rank, &c->size, err);
    if (st != CT_OK) {
        if (we_init) MPI_Finalize();
        ct_free(m);
        ct_free(c);
        return st;
    }
    *out = c;
    return CT_OK;
}

void ct_comm_abort(ct_comm *c, int code) {
    if (c && c->kind == CT_COMM_MPI) MPI_Abort(MPI_COMM_WORLD, code);
}

void ct_mpi_free(ct_comm *c) {
    mpi_state *m = c->mpi;
    if (!m) return;
    tell_watchdog(m, NULL, true);
    pthread_join(m->watchdog, NULL);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    MPI_Comm_free(&m->comm);
    if (m->finalize) MPI_Finalize();
    ct_free(m->pending);
    ct_free(m);
}

ct_status ct_mpi_allreduce(ct_comm *c, void *buf, size_t n, int is_f64, ct_error *err) {
    CT_TRY(usable(c, err));
    // MPI counts are int: large buffers go in pieces of at most 2^30 elements.
    size_t step = (size_t)1 << 30, elem = is_f64 ? sizeof(double) : sizeof(float);
    for (size_t off = 0; off < n; off += step) {
        int count = (int)(n - off < step ? n - off : step);
        watch(c->mpi, "allreduce");
        int rc = MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * elem, count, is_f64 ? MPI_DOUBLE : MPI_FLOAT,
                               MPI_SUM, c->mpi->comm);
        watch(c->mpi, NULL);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allreduce", err);
    }
    return CT_OK;
}

ct_status ct_mpi_allgather_f32(ct_comm *c, const float *in, float *out, size_t n, ct_error *err) {
    CT_TRY(usable(c, err));
    if (n > (size_t)1 << 30) return ct_error_set(err, CT_ERR_ARG, "allgather of %zu floats: more than 2^30", n);
    MPI_Request req;
    int rc = MPI_Iallgather(in, (int)n, MPI_FLOAT, out, (int)n, MPI_FLOAT, c->mpi->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allgather", err);
    return wait_all(c, &req, 1, "allgather", err);
}

ct_status ct_mpi_broadcast(ct_comm *c, void *buf, size_t bytes, int root, ct_error *err) {
    CT_TRY(usable(c, err));
    size_t step = (size_t)1 << 30;
    for (size_t off = 0; off < bytes || (bytes == 0 && off == 0); off += step) {
        int count = (int)(bytes - off < step ? bytes - off : step);
        MPI_Request req;
        int rc = MPI_Ibcast((char *)buf + off, count, MPI_BYTE, root, c->mpi->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "broadcast", err);
        CT_TRY(wait_all(c, &req, 1, "broadcast", err));
        if (bytes == 0) break;
    }
    return CT_OK;
}

ct_status ct_mpi_barrier(ct_comm *c, ct_error *err) {
    CT_TRY(usable(c, err));
    MPI_Request req;
    int rc = MPI_Ibarrier(c->mpi->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "barrier", err);
    return wait_all(c, &req, 1, "barrier", err);
}

ct_status ct_mpi_allreduce_start(ct_comm *c, float *buf, size_t n, ct_error *err) {
    mpi_state *m = c->mpi;
    CT_TRY(usable(c, err));
    if (n > (size_t)1 << 30) return ct_error_set(err, CT_ERR_ARG, "bucket of %zu floats: more than 2^30", n);
    if (m->n_pending == m->cap_pending) {
        // Grows during the first step only: later steps start as many buckets.
        m->cap_pending = m->cap_pending ? 2 * m->cap_pending : 64;
        m->pending = ct_realloc(m->pending, (size_t)m->cap_pending * sizeof *m->pending);
    }
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, m->comm, &m->pending[m->n_pending]);
    if (rc != MPI_SUCCESS) return mpi_fail(c, rc, "allreduce (bucket)", err);
    m->n_pending++;
    // Let MPI move the data along while backward goes on.
    int flag;
    MPI_Testall(m->n_pending, m->pending, &flag, MPI_STATUSES_IGNORE);
    return CT_OK;
}

int ct_mpi_pending(const ct_comm *c) { return c->mpi->n_pending; }

ct_status ct_mpi_allreduce_wait(ct_comm *c, ct_error *err) {
    mpi_state *m = c->mpi;
    // Started before the comm broke or not, none is waited for again.
    ct_status st = m->broken[0] ? usable(c, err) : wait_all(c, m->pending, m->n_pending, "allreduce (buckets)", err);
    m->n_pending = 0;
    return st;
}
