// Prefetch: runs the wrapped stream on a background thread.
//
// A ring of n_ahead + 1 slots: the worker fills free slots in order with
// copies of inner's items; the caller takes them in the same order and holds
// one until its next call. Only the worker touches inner while it runs; a
// seek or free stops and joins it first. The caller's position counts the
// items it took, so the cursor is the same as without prefetch.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ctrax/core/memory.h"
#include "data/stream_internal.h"

typedef struct slot {
    ct_item item;
    ct_status status;  // of inner's next for this item
    bool end;          // inner had ended
    ct_error err;
} slot;

typedef struct prefetch {
    int n;  // slots
    slot *ring;
    int head;       // the next slot the caller takes
    int tail;       // the next slot the worker fills
    int filled;     // slots filled and not taken
    int held;       // the slot the caller holds, -1 none
    bool running;   // a worker thread exists (to be joined)
    bool stop;      // asks the worker to return
    bool finished;  // the caller took an end or an error: it repeats it
    slot *last;     // that end or error
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ct_stream *inner;
} prefetch;

static void *worker(void *arg) {
    prefetch *pf = arg;
    pthread_mutex_lock(&pf->mu);
    for (;;) {
        while (!pf->stop && pf->filled + (pf->held >= 0) >= pf->n) pthread_cond_wait(&pf->cv, &pf->mu);
        if (pf->stop) break;
        slot *sl = &pf->ring[pf->tail];
        pthread_mutex_unlock(&pf->mu);
        // The tail slot is neither filled nor held: the caller does not read it.
        ct_batch b;
        sl->status = ct_stream_next(pf->inner, &b, &sl->err);
        sl->end = sl->status == CT_OK && b.n == 0;
        if (sl->status == CT_OK && b.n > 0) ct_item_copy(&sl->item, &b);
        pthread_mutex_lock(&pf->mu);
        pf->tail = (pf->tail + 1) % pf->n;
        pf->filled++;
        pthread_cond_broadcast(&pf->cv);
        if (sl->status != CT_OK || sl->end) break;  // nothing follows an end or an error
    }
    pthread_mutex_unlock(&pf->mu);
    return NULL;
}

// Tells the worker that the caller released the slot it held, or that it
// must stop.
static void tell_worker(prefetch *pf, bool stop) {
    pthread_mutex_lock(&pf->mu);
    pf->held = -1;
    pf->stop = stop;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
}

static void stop_worker(prefetch *pf) {
    if (!pf->running) return;
    tell_worker(pf, true);
    pthread_join(pf->thread, NULL);
    pf->running = pf->stop = false;
}

static void reset_ring(prefetch *pf) {
    pf->head = pf->tail = pf->filled = 0;
    pf->held = -1;
    pf->finished = false;
    pf->last = NULL;
}

static ct_status prefetch_next(ct_stream *s, ct_batch *out, ct_error *err) {
    prefetch *pf = s->impl;
    if (pf->finished) {
        if (pf->last->status != CT_OK && err) *err = pf->last->err;
        return pf->last->status;
    }
    if (!pf->running) {
        int rc = pthread_create(&pf->thread, NULL, worker, pf);
        if (rc != 0) return ct_error_set(err, CT_ERR_STATE, "prefetch: cannot start its thread: %s", strerror(rc));
        pf->running = true;
    }
    tell_worker(pf, false);  // the item handed out last is released
    pthread_mutex_lock(&pf->mu);
    while (pf->filled == 0) pthread_cond_wait(&pf->cv, &pf->mu);
    slot *sl = &pf->ring[pf->head];
    pf->held = pf->head;
    pf->head = (pf->head + 1) % pf->n;
    pf->filled--;
    pthread_mutex_unlock(&pf->mu);
    if (sl->status != CT_OK || sl->end) {
        pf->finished = true;
        pf->last = sl;
        if (sl->status != CT_OK && err) *err = sl->err;
        return sl->status;
    }
    *out = sl->item.b;
    return CT_OK;
}

static ct_status prefetch_seek(ct_stream *s, int64_t position, ct_error *err) {
    prefetch *pf = s->impl;
    stop_worker(pf);
    reset_ring(pf);
    return ct_stream_seek(s->inner, position, err);
}

static void prefetch_free(ct_stream *s) {
    prefetch *pf = s->impl;
    stop_worker(pf);
    for (int i = 0; i < pf->n; i++) ct_item_free(&pf->ring[i].item);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->cv);
    ct_free(pf);
}

static void prefetch_describe(const ct_stream *s, char *buf, size_t len) {
    snprintf(buf, len, "prefetch(%d)", ((const prefetch *)s->impl)->n - 1);
}

static const ct_stream_ops prefetch_ops = {"prefetch", prefetch_next, prefetch_seek, prefetch_free, prefetch_describe};

ct_status ct_prefetch_stream_new(ct_stream **out, ct_stream *inner, int n_ahead, ct_error *err) {
    *out = NULL;
    CT_ASSERT(inner);
    if (n_ahead < 1 || n_ahead > 1024) {
        ct_stream_free(inner);
        return ct_error_set(err, CT_ERR_ARG, "prefetch: n_ahead is %d; expected 1..1024", n_ahead);
    }
    char *at = ct_calloc(1, ct_round16(sizeof(prefetch)) + (size_t)(n_ahead + 1) * sizeof(slot));
    prefetch *pf = ct_carve(&at, sizeof *pf);
    pf->n = n_ahead + 1;
    pf->ring = ct_carve(&at, (size_t)pf->n * sizeof *pf->ring);
    pf->inner = inner;
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->cv, NULL);
    reset_ring(pf);
    ct_stream *s = ct_stream_wrap(&prefetch_ops, inner, pf);
    // Prefetching changes nothing a cursor depends on: a cursor saved with
    // prefetch restores without it and the other way round.
    s->fingerprint = inner->fingerprint;
    *out = s;
    return CT_OK;
}
