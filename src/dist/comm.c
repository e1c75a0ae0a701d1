// The comm interface, and the single and local (threads) engines.
#include <string.h>

#include "ctrax/core/memory.h"
#include "dist/comm_internal.h"

ct_comm *ct_comm_single_new(void) {
    ct_comm *c = ct_calloc(1, sizeof *c);
    c->kind = CT_COMM_SINGLE;
    c->rank = 0;
    c->size = 1;
    return c;
}

ct_status ct_comm_local_new(ct_comm **out, int n, ct_error *err) {
    if (n < 1 || n > CT_COMM_LOCAL_MAX)
        return ct_error_set(err, CT_ERR_ARG, "local comm: %d replicas; expected 1..%d", n, CT_COMM_LOCAL_MAX);
    for (int i = 0; i < n; i++) out[i] = NULL;
    local_group *g = ct_calloc(1, sizeof *g);
    int rc = pthread_barrier_init(&g->barrier, NULL, (unsigned)n);
    if (rc != 0) {
        ct_free(g);
        return ct_error_set(err, CT_ERR_STATE, "local comm: cannot make a barrier for %d threads: %s", n, strerror(rc));
    }
    g->n = n;
    g->refs = n;
    g->slots = ct_calloc((size_t)n, sizeof *g->slots);
    pthread_mutex_init(&g->mu, NULL);
    for (int i = 0; i < n; i++) {
        ct_comm *c = ct_calloc(1, sizeof *c);
        c->kind = CT_COMM_LOCAL;
        c->rank = i;
        c->size = n;
        c->group = g;
        out[i] = c;
    }
    return CT_OK;
}

void ct_comm_free(ct_comm *c) {
    if (!c) return;
    if (c->kind == CT_COMM_LOCAL) {
        local_group *g = c->group;
        pthread_mutex_lock(&g->mu);
        int left = --g->refs;
        pthread_mutex_unlock(&g->mu);
        if (left == 0) {
            pthread_barrier_destroy(&g->barrier);
            pthread_mutex_destroy(&g->mu);
            ct_free(g->slots);
            ct_free(g);
        }
    } else if (c->kind == CT_COMM_MPI) {
        ct_mpi_free(c);
    }
    ct_free(c);
}

ct_comm_kind ct_comm_get_kind(const ct_comm *c) { return c->kind; }
int ct_comm_rank(const ct_comm *c) { return c->rank; }
int ct_comm_size(const ct_comm *c) { return c->size; }

// ---- local engine ----------------------------------------------------------------
//
// Each member puts its buffer in its slot and meets the others at the
// barrier; member r then combines elements [r*n/size, (r+1)*n/size) over
// all slots in rank order and writes the result into every slot, so the
// work is split and the sum order is fixed. A second barrier keeps slots
// alive until everyone is done.

static void local_allreduce(ct_comm *c, void *buf, size_t n, int is_f64) {
    local_group *g = c->group;
    g->slots[c->rank] = buf;
    pthread_barrier_wait(&g->barrier);
    size_t begin = n * (size_t)c->rank / (size_t)g->n, end = n * (size_t)(c->rank + 1) / (size_t)g->n;
    if (is_f64) {
        for (size_t i = begin; i < end; i++) {
            double s = 0;
            for (int r = 0; r < g->n; r++) s += ((double *)g->slots[r])[i];
            for (int r = 0; r < g->n; r++) ((double *)g->slots[r])[i] = s;
        }
    } else {
        for (size_t i = begin; i < end; i++) {
            float s = 0;
            for (int r = 0; r < g->n; r++) s += ((float *)g->slots[r])[i];
            for (int r = 0; r < g->n; r++) ((float *)g->slots[r])[i] = s;
        }
    }
    pthread_barrier_wait(&g->barrier);
}

static void local_allgather(ct_comm *c, const float *in, float *out, size_t n) {
    local_group *g = c->group;
    g->slots[c->rank] = (void *)in;
    pthread_barrier_wait(&g->barrier);
    for (int r = 0; r < g->n; r++) memcpy(out + (size_t)r * n, g->slots[r], n * sizeof *out);
    pthread_barrier_wait(&g->barrier);
}

static void local_broadcast(ct_comm *c, void *buf, size_t bytes, int root) {
    local_group *g = c->group;
    g->slots[c->rank] = buf;
    pthread_barrier_wait(&g->barrier);
    if (c->rank != root) memcpy(buf, g->slots[root], bytes);
    pthread_barrier_wait(&g->barrier);
}

// ---- dispatch --------------------------------------------------------------------

static ct_status allreduce(ct_comm *c, void *buf, size_t n, int is_f64, ct_error *err) {
    switch (c->kind) {
    case CT_COMM_SINGLE: return CT_OK;
    case CT_COMM_LOCAL: local_allreduce(c, buf, n, is_f64); return CT_OK;
    case CT_COMM_MPI: return ct_mpi_allreduce(c, buf, n, is_f64, err);
    }
    return CT_OK;
}

ct_status ct_comm_allreduce_f32(ct_comm *c, float *buf, size_t n, ct_error *err) { return allreduce(c, buf, n, 0, err); }
ct_status ct_comm_allreduce_f64(ct_comm *c, double *buf, size_t n, ct_error *err) { return allreduce(c, buf, n, 1, err); }

ct_status ct_comm_allgather_f32(ct_comm *c, const float *in, float *out, size_t n, ct_error *err) {
    switch (c->kind) {
    case CT_COMM_SINGLE:
        if (n) memmove(out, in, n * sizeof *out);
        return CT_OK;
    case CT_COMM_LOCAL: local_allgather(c, in, out, n); return CT_OK;
    case CT_COMM_MPI: return ct_mpi_allgather_f32(c, in, out, n, err);
    }
    return CT_OK;
}

ct_status ct_comm_broadcast(ct_comm *c, void *buf, size_t bytes, int root, ct_error *err) {
    if (root < 0 || root >= c->size)
        return ct_error_set(err, CT_ERR_ARG, "broadcast: root %d is not a rank of a group of %d", root, c->size);
    switch (c->kind) {
    case CT_COMM_SINGLE: return CT_OK;
    case CT_COMM_LOCAL: local_broadcast(c, buf, bytes, root); return CT_OK;
    case CT_COMM_MPI: return ct_mpi_broadcast(c, buf, bytes, root, err);
    }
    return CT_OK;
}

ct_status ct_comm_barrier(ct_comm *c, ct_error *err) {
    switch (c->kind) {
    case CT_COMM_SINGLE: return CT_OK;
    case CT_COMM_LOCAL: pthread_barrier_wait(&c->group->barrier); return CT_OK;
    case CT_COMM_MPI: return ct_mpi_barrier(c, err);
    }
    return CT_OK;
}

ct_status ct_comm_allreduce_start(ct_comm *c, float *buf, size_t n, ct_error *err) {
    if (c->kind == CT_COMM_MPI) return ct_mpi_allreduce_start(c, buf, n, err);
    return ct_comm_allreduce_f32(c, buf, n, err);
}

ct_status ct_comm_allreduce_wait(ct_comm *c, ct_error *err) {
    if (c->kind == CT_COMM_MPI) return ct_mpi_allreduce_wait(c, err);
    return CT_OK;
}
