// The memory-efficient ReversibleTrainer (see reversible_trainer.h).
//
// Device memory during a step, all on t->b.dev:
//   stage[2]   the weights (and, when updating, the slots) of the layer whose
//              turn it is and of the next one (copy_weights only), shared by
//              the local replicas;
//   per local replica:
//     grad_buf   the gradient of the layer whose turn it is;
//     the pool   buffers for the items on its data stack and gradient
//                stack, reference-counted (an item that passes through a
//                layer unchanged shares its buffer), reused from step to step;
//     the arena  one layer's activations: reset after every layer, once the
//                layer's results have been moved into pool buffers;
//   gather     Adasum over processes only: every device's gradient of one
//              layer.
// None of it depends on the number of layers, except the inputs standard
// layers keep from forward to backward (one set per block).
#include "ctrax/train/reversible_trainer.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ctrax/core/log.h"
#include "ctrax/layers/combinators.h"
#include "ctrax/layers/reversible.h"
#include "train/train_internal.h"

#define RT_STACK_MAX (2 * CT_LAYER_MAX_IO)

typedef enum rt_kind { RT_STANDARD, RT_REVERSIBLE, RT_LOSS } rt_kind;

// A layer the trainer runs itself, with its place in Serial(model, loss).
typedef ct_train_leaf rt_leaf;

// An item on the data or gradient stack. buf is its pool buffer, or -1 when
// the data is the caller's batch or NULL (a zero gradient).
typedef struct rt_item {
    ct_tensor t;
    int buf;
} rt_item;

// One trainer layer.
typedef struct rt_unit {
    rt_kind kind;
    rt_leaf *leaves;
    int n_leaves;
    int n_in, n_out;
    size_t w_begin, w_end;        // weight slab range, in floats
    size_t s_begin, s_end;        // state slab range
    size_t slot_begin, slot_end;  // slot slab range
    int p_begin, p_end;           // its weights in net.params
    ct_range *ranges;             // per weight: its range in the layer's gradient (Adasum)
    char *desc;
    int stat;                     // index of its first stat, or -1
} rt_unit;

typedef struct rt_buf {
    void *data;
    size_t bytes;
    int refs;
} rt_buf;

// One local device: what a turn runs on. Turns run on every replica at
// once (threads), each on its own rows of the batch with its own key.
typedef struct rt_replica {
    ct_arena arena;
    ct_ctx ctx;
    float *grad_buf;  // the gradient of the layer whose turn it is
    rt_buf *pool;
    int n_pool;
    rt_item vals[RT_STACK_MAX], grads[RT_STACK_MAX];
    int depth;
    ct_tensor shard[CT_LAYER_MAX_IO];  // its rows of the batch
    ct_key key;                        // this step's key for this device
    rt_item *saved;  // [n_units][CT_LAYER_MAX_IO]: a standard layer's inputs, kept from forward to backward
    float *state;    // the state slab it runs on: the net's (device 0) or its own copy
    float *state_before, *state_after;  // state slabs around each layer's forward (for its recomputation)
    ct_train_dev dv;  // loss, weight, seed, status
    ct_tensor part_in[CT_LAYER_MAX_IO];  // the chunked loss's inputs, from the loss's forward to its backward
    size_t arena_plan;  // its arena's high-water mark, from the planning pass (bytes)
} rt_replica;

// Where a turn's weights and slots are: a device staging pair (copy_weights)
// or the host slabs themselves.
typedef struct rt_stage {
    float *w, *s;
} rt_stage;

typedef struct rt_copy {
    float *dst;
    const float *src;
    size_t n;
} rt_copy;

// The helper thread that stages the next turn's range. Without a thread,
// posting a job runs it at once.
typedef struct rt_prefetch {
    bool threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rt_copy jobs[2];
    bool pending, quit;
} rt_prefetch;

// A turn of one step: a layer's forward, or its update (loss and backward).
typedef struct rt_turn {
    int unit;
    bool backward;  // the loss layer or a backward turn: stage the slots too
} rt_turn;

typedef struct rt_trainer {
    ct_trainer b;             // the shared part (train_internal.h); b.slab_dev is &host
    ct_reversible_options opt;  // b.opts.reversible
    ct_device host;           // weights, state, slots: see ct_trainer_host
    float *host_grads;        // CT_CLIP_GLOBAL only
    float *kept_grads;        // opt.keep_grads only: the last step's gradients

    rt_unit *units;
    int n_units;
    rt_turn *turns;
    int n_turns;
    size_t max_w, max_slots;  // floats of the largest layer
    int loss_head;            // chunked loss: the loss layer's leaves before the chunked part (b.chunked)

    rt_replica *replicas;   // b.n_local
    float *gather;          // Adasum over processes: (n_local, n_proc, max_w)
    size_t gather_floats;

    rt_stage stage[2];
    rt_prefetch pf;
    const ct_tensor *batch;  // this step's (local) batch
    int n_batch;

    ct_layer_stat *stats;
    int n_stats;

    // A step gone non-finite: the turn where it was found (the loss turn for
    // the loss), and the loss or that layer's squared gradient norm.
    int nf_turn;
    bool nf_loss;
    double nf_value;
} rt_trainer;

// A slab pointer for code that indexes by global slab offsets
// (ct_weight(c, l, i) = c->weights + offset) over a buffer that holds only
// the range starting at begin. Computed on integers: the pointer lies
// outside the buffer, and only begin.. offsets are ever read through it.
static float *rebase(float *buf, size_t begin) {
    return (float *)((uintptr_t)buf - begin * sizeof(float));
}

// ---- prefetch thread --------------------------------------------------------

static void run_copies(const rt_copy *jobs) {
    for (int i = 0; i < 2; i++)
        if (jobs[i].n) memcpy(jobs[i].dst, jobs[i].src, jobs[i].n * sizeof(float));
}

static void *prefetch_main(void *arg) {
    rt_prefetch *pf = arg;
    pthread_mutex_lock(&pf->mu);
    for (;;) {
        while (!pf->pending && !pf->quit) pthread_cond_wait(&pf->cv, &pf->mu);
        if (pf->quit) break;
        rt_copy jobs[2] = {pf->jobs[0], pf->jobs[1]};
        pthread_mutex_unlock(&pf->mu);
        run_copies(jobs);
        pthread_mutex_lock(&pf->mu);
        pf->pending = false;
        pthread_cond_broadcast(&pf->cv);
    }
    pthread_mutex_unlock(&pf->mu);
    return NULL;
}

static void prefetch_start(rt_prefetch *pf, bool threaded) {
    memset(pf, 0, sizeof *pf);
    pf->threaded = threaded;
    if (!threaded) return;
    pthread_mutex_init(&pf->mu, NULL);
    pthread_cond_init(&pf->cv, NULL);
    if (pthread_create(&pf->thread, NULL, prefetch_main, pf) != 0) {
        // No thread: copy in the caller, which gives the same results.
        pthread_mutex_destroy(&pf->mu);
        pthread_cond_destroy(&pf->cv);
        pf->threaded = false;
        ct_log(CT_LOG_WARN, "reversible trainer: no prefetch thread, staging copies run in turn");
    }
}

static void prefetch_wait(rt_prefetch *pf) {
    if (!pf->threaded) return;
    pthread_mutex_lock(&pf->mu);
    while (pf->pending) pthread_cond_wait(&pf->cv, &pf->mu);
    pthread_mutex_unlock(&pf->mu);
}

static void prefetch_post(rt_prefetch *pf, rt_copy a, rt_copy b) {
    rt_copy jobs[2] = {a, b};
    if (!pf->threaded) {
        run_copies(jobs);
        return;
    }
    pthread_mutex_lock(&pf->mu);
    CT_ASSERT(!pf->pending);
    pf->jobs[0] = a;
    pf->jobs[1] = b;
    pf->pending = true;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
}

static void prefetch_stop(rt_prefetch *pf) {
    if (!pf->threaded) return;
    pthread_mutex_lock(&pf->mu);
    pf->quit = true;
    pthread_cond_broadcast(&pf->cv);
    pthread_mutex_unlock(&pf->mu);
    pthread_join(pf->thread, NULL);
    pthread_mutex_destroy(&pf->mu);
    pthread_cond_destroy(&pf->cv);
    pf->threaded = false;
}

// ---- the stack-item pool -------------------------------------------------------

static ct_status pool_acquire(rt_trainer *t, rt_replica *r, size_t bytes, int *out, ct_error *err) {
    for (int i = 0; i < r->n_pool; i++)
        if (r->pool[i].refs == 0 && r->pool[i].bytes == bytes) {
            r->pool[i].refs = 1;
            *out = i;
            return CT_OK;
        }
    void *data;
    CT_TRY(ct_device_alloc(t->b.dev, bytes, "reversible trainer stack item", &data, err));
    // Grows during the first step only: later steps reuse the buffers.
    r->pool = ct_realloc(r->pool, (size_t)(r->n_pool + 1) * sizeof *r->pool);
    r->pool[r->n_pool] = (rt_buf){data, bytes, 1};
    *out = r->n_pool++;
    return CT_OK;
}

static void pool_release(rt_replica *r, int buf) {
    if (buf < 0) return;
    CT_ASSERT(r->pool[buf].refs > 0);
    r->pool[buf].refs--;
}

static void pool_free_all(rt_trainer *t, rt_replica *r) {
    for (int i = 0; i < r->n_pool; i++) ct_device_free(t->b.dev, r->pool[i].data, r->pool[i].bytes);
    ct_free(r->pool);
    r->pool = NULL;
    r->n_pool = 0;
}

static bool inside(const void *p, const void *base, size_t bytes) {
    return (const char *)p >= (const char *)base && (const char *)p < (const char *)base + bytes;
}

// Turns a layer's results into stack items: data already in a live pool
// buffer or in the replica's rows of the batch is shared; anything else
// (the arena) is copied into a pool buffer, since the arena is about to be
// reset. Results that repeat one another share one copy.
static ct_status adopt(rt_trainer *t, rt_replica *r, const ct_tensor *res, int n, rt_item *items,
                       ct_error *err) {
    for (int i = 0; i < n; i++) {
        items[i] = (rt_item){res[i], -1};
        const void *p = res[i].data;
        size_t bytes = ct_tensor_nbytes(&res[i]);
        if (!p || bytes == 0) continue;
        int found = -2;
        for (int j = 0; j < i && found == -2; j++)
            if (res[j].data == p && items[j].buf >= 0 && ct_tensor_nbytes(&res[j]) >= bytes) {
                found = items[j].buf;
                items[i].t.data = items[j].t.data;
            }
        for (int b = 0; b < r->n_pool && found == -2; b++)
            if (r->pool[b].refs > 0 && inside(p, r->pool[b].data, r->pool[b].bytes)) found = b;
        for (int b = 0; b < t->n_batch && found == -2; b++)
            if (inside(p, r->shard[b].data, ct_tensor_nbytes(&r->shard[b]))) found = -1;
        if (found >= 0) {
            r->pool[found].refs++;
            items[i].buf = found;
            continue;
        }
        if (found == -1) continue;
        int b;
        ct_status st = pool_acquire(t, r, bytes, &b, err);
        if (st != CT_OK) {
            for (int j = 0; j < i; j++) pool_release(r, items[j].buf);
            return st;
        }
        memcpy(r->pool[b].data, p, bytes);
        items[i].t.data = r->pool[b].data;
        items[i].buf = b;
    }
    return CT_OK;
}

// Replaces the top n_pop items of stack (depth items, top at 0) by n_push.
static void items_replace(rt_item *stack, int depth, int n_pop, const rt_item *top, int n_push) {
    CT_ASSERT(depth - n_pop + n_push <= RT_STACK_MAX);
    memmove(stack + n_push, stack + n_pop, (size_t)(depth - n_pop) * sizeof *stack);
    memcpy(stack, top, (size_t)n_push * sizeof *stack);
}

// ---- building: leaves and units ------------------------------------------------

static bool contains_reversible(const ct_layer *l) {
    if (ct_layer_is_reversible(l)) return true;
    for (int i = 0; i < l->n_sub; i++)
        if (contains_reversible(l->sub[i])) return true;
    return false;
}

// Serial and ReversibleSerial run their sublayers in order over the stack,
// so a run of their sublayers is the same computation (Branch and Residual
// are Serials too).
static bool runs_in_order(const ct_layer *l) {
    return strcmp(l->vt->type, "Serial") == 0 || strcmp(l->vt->type, "ReversibleSerial") == 0;
}

typedef struct leaf_list {
    rt_leaf *v;
    int n;
} leaf_list;

// split_model: the model (root's child 0) is cut into its top-level layers
// even without reversible ones, so the chunked loss finds its tail there.
static ct_status flatten(ct_layer *l, uint32_t *path, int depth, bool root, bool split_model, leaf_list *out,
                         ct_error *err) {
    bool model = split_model && depth == 1 && path[0] == 0;
    if (root || (runs_in_order(l) && (contains_reversible(l) || model))) {
        if (depth >= CT_TRAIN_PATH_MAX)
            return ct_error_set(err, CT_ERR_ARG, "reversible trainer: layer %s is nested deeper than %d",
                                l->path, CT_TRAIN_PATH_MAX);
        for (int i = 0; i < l->n_sub; i++) {
            path[depth] = (uint32_t)i;
            CT_TRY(flatten(l->sub[i], path, depth + 1, false, split_model, out, err));
        }
        return CT_OK;
    }
    out->v = ct_realloc(out->v, (size_t)(out->n + 1) * sizeof *out->v);
    rt_leaf *leaf = &out->v[out->n++];
    memset(leaf, 0, sizeof *leaf);
    leaf->layer = l;
    leaf->depth = depth;
    memcpy(leaf->path, path, (size_t)depth * sizeof *path);
    return CT_OK;
}

// Every weight reachable from l must lie in u's weight range, every state
// in its state range: a weight shared with another trainer layer would be
// outside this layer's staged range, a state outside the range its
// recomputation puts back (the other layer's would undo this one's update).
static ct_status check_owned(const ct_layer *l, const rt_unit *u, int unit, ct_error *err) {
    for (int i = 0; i < l->n_weights; i++) {
        size_t off = l->weights[i].offset;
        if (off < u->w_begin || off >= u->w_end)
            return ct_error_set(err, CT_ERR_ARG,
                                "reversible trainer: weight %s is shared between trainer layer %d and "
                                "another one (weights may be shared only within one layer)",
                                l->weights[i].full_name, unit);
    }
    for (int i = 0; i < l->n_states; i++) {
        size_t off = l->states[i].offset;
        if (off < u->s_begin || off >= u->s_end)
            return ct_error_set(err, CT_ERR_ARG,
                                "reversible trainer: state %s is shared between trainer layer %d and "
                                "another one (layers with state may be shared only within one layer)",
                                l->states[i].full_name, unit);
    }
    for (int i = 0; i < l->n_sub; i++) CT_TRY(check_owned(l->sub[i], u, unit, err));
    return CT_OK;
}

static char *describe(const rt_unit *u) {
    const char *kind = u->kind == RT_STANDARD ? "standard" : u->kind == RT_REVERSIBLE ? "reversible" : "loss";
    size_t len = strlen(kind) + 3;
    for (int i = 0; i < u->n_leaves; i++) {
        const ct_layer *l = u->leaves[i].layer;
        len += strlen(u->kind == RT_REVERSIBLE ? l->path : l->name) + 2;
    }
    char *s = ct_malloc(len);
    int n = snprintf(s, len, "%s:", kind);
    for (int i = 0; i < u->n_leaves; i++) {
        const ct_layer *l = u->leaves[i].layer;
        n += snprintf(s + n, len - (size_t)n, "%s %s", i ? "," : "", u->kind == RT_REVERSIBLE ? l->path : l->name);
    }
    return s;
}

static void add_unit(rt_trainer *t, rt_kind kind, const rt_leaf *leaves, int n) {
    t->units = ct_realloc(t->units, (size_t)(t->n_units + 1) * sizeof *t->units);
    rt_unit *u = &t->units[t->n_units++];
    memset(u, 0, sizeof *u);
    u->kind = kind;
    u->n_leaves = n;
    if (n) {
        u->leaves = ct_malloc((size_t)n * sizeof *u->leaves);
        memcpy(u->leaves, leaves, (size_t)n * sizeof *leaves);
    }
    u->stat = -1;
}

// Groups leaves into units as Trax's extract_reversible_blocks: a block is
// the standard leaves before a run of reversible ones, then that run; the
// standard leaves after the last reversible one join the loss.
static void make_units(rt_trainer *t, const leaf_list *leaves) {
    int i = 0;
    while (i < leaves->n) {
        int std_begin = i;
        while (i < leaves->n && !ct_layer_is_reversible(leaves->v[i].layer)) i++;
        if (i == leaves->n) {
            add_unit(t, RT_LOSS, leaves->v + std_begin, i - std_begin);
            return;
        }
        add_unit(t, RT_STANDARD, leaves->v + std_begin, i - std_begin);
        while (i < leaves->n && ct_layer_is_reversible(leaves->v[i].layer)) add_unit(t, RT_REVERSIBLE, leaves->v + i++, 1);
    }
}

// Unit k's stack arity: the deepest its leaves reach, as a Serial's; checks
// the stack inside it and on the trainer's stack (depth items before it).
static ct_status unit_arity(rt_unit *u, int k, int depth, ct_error *err) {
    int running_max = 0, running = 0;
    for (int i = 0; i < u->n_leaves; i++) {
        running += u->leaves[i].layer->n_in;
        if (running > running_max) running_max = running;
        running -= u->leaves[i].layer->n_out;
    }
    // The stack inside the layer, starting from its n_in items.
    for (int i = 0, used = 0; i < u->n_leaves; i++) {
        used += u->leaves[i].layer->n_in - u->leaves[i].layer->n_out;
        if (running_max - used > RT_STACK_MAX)
            return ct_error_set(err, CT_ERR_ARG, "reversible trainer: layer %d builds a stack deeper than %d", k,
                                RT_STACK_MAX);
    }
    u->n_in = running_max;
    u->n_out = running_max - running;
    if (u->n_in > CT_LAYER_MAX_IO || u->n_out > CT_LAYER_MAX_IO || u->n_in > depth ||
        depth - u->n_in + u->n_out > RT_STACK_MAX)
        return ct_error_set(err, CT_ERR_ARG, "reversible trainer: layer %d (%d in, %d out) does not fit the "
                            "stack of %d items", k, u->n_in, u->n_out, depth);
    return CT_OK;
}

// Unit k's weight and state ranges (after the cursors: no sharing with an
// earlier unit), its params, slots and per-weight gradient ranges.
static ct_status unit_ranges(rt_trainer *t, rt_unit *u, int k, size_t *w_cursor, size_t *s_cursor, ct_error *err) {
    const ct_net *net = &t->b.net;
    u->w_begin = u->w_end = *w_cursor;
    u->s_begin = u->s_end = *s_cursor;
    if (u->n_leaves) {
        for (int i = 0; i < u->n_leaves; i++) {
            const ct_layer *l = u->leaves[i].layer;
            // Only a leaf with weights (state) places the range: a weightless
            // layer used again (one Swap instance for every swap) keeps the
            // empty range of its first use, before the cursor.
            bool has_w = l->w_end > l->w_begin, has_s = l->s_end > l->s_begin;
            if ((has_w && l->w_begin < *w_cursor) || (has_s && l->s_begin < *s_cursor))
                return ct_error_set(err, CT_ERR_ARG,
                                    "reversible trainer: layer %d (%s) shares weights or state with an earlier "
                                    "layer", k, l->path);
            if (has_w && l->w_end > u->w_end) u->w_end = l->w_end;
            if (has_s && l->s_end > u->s_end) u->s_end = l->s_end;
        }
        for (int i = 0; i < u->n_leaves; i++) CT_TRY(check_owned(u->leaves[i].layer, u, k, err));
        *w_cursor = u->w_end;
        *s_cursor = u->s_end;
    }
    u->p_begin = 0;
    while (u->p_begin < net->n_params && net->params[u->p_begin]->offset < u->w_begin) u->p_begin++;
    u->p_end = u->p_begin;
    while (u->p_end < net->n_params && net->params[u->p_end]->offset < u->w_end) u->p_end++;
    u->slot_begin = t->b.slot_offsets[u->p_begin];
    u->slot_end = t->b.slot_offsets[u->p_end];
    if (u->w_end - u->w_begin > t->max_w) t->max_w = u->w_end - u->w_begin;
    if (u->slot_end - u->slot_begin > t->max_slots) t->max_slots = u->slot_end - u->slot_begin;
    int n_own = u->p_end - u->p_begin;
    u->ranges = ct_calloc((size_t)(n_own ? n_own : 1), sizeof *u->ranges);
    for (int p = u->p_begin; p < u->p_end; p++)
        u->ranges[p - u->p_begin] = (ct_range){net->params[p]->offset - u->w_begin, t->b.ranges[p].length};
    return CT_OK;
}

// The stats' names (n_stats of them), and the turns: forward through all
// but the loss, the loss, backward.
static void name_stats_and_turns(rt_trainer *t, int n_stats) {
    t->stats = ct_calloc((size_t)(n_stats ? n_stats : 1), sizeof *t->stats);
    t->n_stats = n_stats;
    for (int k = 0; k < t->n_units; k++) {
        rt_unit *u = &t->units[k];
        if (u->stat < 0) continue;
        int s = u->stat;
        if (u->p_end > u->p_begin) {
            snprintf(t->stats[s++].name, sizeof t->stats[0].name, "layer%d/gradients_l2", k);
            snprintf(t->stats[s++].name, sizeof t->stats[0].name, "layer%d/weights_l2", k);
        }
        if (u->kind == RT_LOSS) snprintf(t->stats[s].name, sizeof t->stats[0].name, "layer%d/loss", k);
    }
    int L = t->n_units;
    t->turns = ct_malloc((size_t)(2 * L) * sizeof *t->turns);
    t->n_turns = 0;
    for (int k = 0; k < L - 1; k++) t->turns[t->n_turns++] = (rt_turn){k, false};
    t->turns[t->n_turns++] = (rt_turn){L - 1, true};
    for (int k = L - 2; k >= 0; k--) t->turns[t->n_turns++] = (rt_turn){k, true};
}

// Lays out ranges, stack arity and stats of every unit; checks the stack
// stays within bounds and no weight is shared between units.
static ct_status plan_units(rt_trainer *t, ct_error *err) {
    const ct_net *net = &t->b.net;
    int depth = net->n_in, n_stats = 0;
    size_t w_cursor = 0, s_cursor = 0;
    for (int k = 0; k < t->n_units; k++) {
        rt_unit *u = &t->units[k];
        CT_TRY(unit_arity(u, k, depth, err));
        depth += u->n_out - u->n_in;
        CT_TRY(unit_ranges(t, u, k, &w_cursor, &s_cursor, err));
        if (u->p_end > u->p_begin) {
            u->stat = n_stats;
            n_stats += 2;
        }
        if (u->kind == RT_LOSS) {
            if (u->stat < 0) u->stat = n_stats;
            n_stats++;
        }
        u->desc = describe(u);
    }
    if (w_cursor != net->n_weights)
        return ct_error_set(err, CT_ERR_ARG, "reversible trainer: the layers cover %zu of %zu weights", w_cursor,
                            net->n_weights);
    name_stats_and_turns(t, n_stats);
    return CT_OK;
}

// ---- construction ------------------------------------------------------------------

// Replica r's rows of the batch (views), and its keys: the step key split by
// its global device index when there are several devices, as the standard
// Trainer's.
static void replica_begin_step(rt_trainer *t, rt_replica *r, int d, const ct_tensor *batch, ct_key key) {
    for (int i = 0; i < t->n_batch; i++) r->shard[i] = ct_tensor_split_rows(&batch[i], t->b.n_local, d);
    r->key = t->b.n_global > 1 ? ct_key_split(key, (uint32_t)(t->b.first_global + d)) : key;
    r->depth = t->n_batch;
    for (int i = 0; i < t->n_batch; i++) r->vals[i] = (rt_item){r->shard[i], -1};
    // Device 0 runs on the net's state; the others on a copy of it.
    if (d > 0 && t->b.net.n_state) memcpy(r->state, t->b.net.state, t->b.net.n_state * sizeof(float));
    r->dv.status = CT_OK;
}

static ct_status rt_one_step(ct_trainer *base, const ct_tensor *batch, ct_key key, int64_t step, float lr,
                             ct_step_stats *stats, ct_error *err);
static ct_status plan_step(rt_trainer *t, const ct_tensor *batch_sigs, ct_error *err);
static void rt_free(ct_trainer *base);
static const ct_trainer_vt rt_vt = {"reversible trainer", rt_one_step, rt_free};

// Cuts the net into units and plans them; the last must be the loss.
static ct_status make_plan(rt_trainer *t, const ct_layer *loss, ct_error *err) {
    leaf_list leaves = {NULL, 0};
    uint32_t path[CT_TRAIN_PATH_MAX];
    const ct_chunked_loss *cl = &t->b.chunked;
    ct_status st = flatten(t->b.net.root, path, 0, true, cl->rows > 0, &leaves, err);
    if (st == CT_OK) make_units(t, &leaves);
    ct_free(leaves.v);
    CT_TRY(st);
    const rt_unit *u = &t->units[t->n_units - 1];
    if (u->kind != RT_LOSS)
        return ct_error_set(err, CT_ERR_ARG, "reversible trainer: the last layer must be a standard loss, not "
                            "reversible (%s, in the loss %s)", u->leaves[u->n_leaves - 1].layer->path, loss->name);
    if (cl->rows) {
        // The loss layer ends with the chunked part: the model's row-wise
        // tail (top-level layers after the last reversible one) and the loss.
        int n_part = cl->n_leaves - cl->first;
        bool ends_with = u->n_leaves >= n_part;
        for (int j = 0; ends_with && j < n_part; j++)
            ends_with = u->leaves[u->n_leaves - n_part + j].layer == cl->leaves[cl->first + j].layer;
        if (!ends_with)
            return ct_error_set(err, CT_ERR_ARG,
                                "reversible trainer: loss_chunk_size %lld: the loss layer does not end with the "
                                "model's row-wise tail from %s and the loss %s",
                                (long long)cl->rows, cl->leaves[cl->first].layer->path, loss->name);
        t->loss_head = u->n_leaves - n_part;
    }
    return plan_units(t, err);
}

// Each replica's kept inputs and state slabs (device 0 runs on the net's).
static void replicas_init(rt_trainer *t) {
    size_t n_state = t->b.net.n_state;
    for (int d = 0; d < t->b.n_local; d++) {
        rt_replica *r = &t->replicas[d];
        r->saved = ct_malloc((size_t)t->n_units * CT_LAYER_MAX_IO * sizeof *r->saved);
        for (int i = 0; i < t->n_units * CT_LAYER_MAX_IO; i++) r->saved[i].buf = -1;
        r->state = t->b.net.state;
        if (n_state) {
            if (d > 0) r->state = ct_calloc(n_state, sizeof(float));
            r->state_before = ct_calloc(n_state, sizeof(float));
            r->state_after = ct_calloc(n_state, sizeof(float));
        }
        r->ctx.state = r->state;
        r->ctx.train = true;
    }
}

// The host gradient slabs: the net's goes (gradients live on the device one
// layer at a time) unless keep_grads keeps it; CT_CLIP_GLOBAL's.
static ct_status host_grads_init(rt_trainer *t, ct_error *err) {
    ct_net *net = &t->b.net;
    if (t->opt.keep_grads) t->kept_grads = net->grads;
    else ct_device_free(&t->host, net->grads, net->n_weights * sizeof(float));
    net->grads = NULL;
    if (t->b.opts.clip_grad_norm > 0.0f && t->opt.clip_mode == CT_CLIP_GLOBAL)
        CT_TRY(ct_device_alloc(&t->host, net->n_weights * sizeof(float), "gradient slab (global clipping)",
                               (void **)&t->host_grads, err));
    return CT_OK;
}

ct_status ct_reversible_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs,
                                    int n_batch, ct_optimizer *opt, ct_key init_key, ct_device *dev,
                                    const ct_trainer_options *opts, ct_error *err) {
    *out = NULL;
    rt_trainer *t = ct_calloc(1, sizeof *t);
    t->host = ct_device_cpu();
    prefetch_start(&t->pf, false);
    // The standard Trainer's net and slot slab, on the host.
    ct_status st = ct_train_base_init(&t->b, &rt_vt, model, loss, batch_sigs, n_batch, opt, init_key, dev, &t->host,
                                      opts, err);
    t->b.opts.memory_efficient = true;
    t->opt = t->b.opts.reversible;
    t->replicas = ct_calloc((size_t)t->b.n_local, sizeof *t->replicas);
    for (int d = 0; d < t->b.n_local; d++)
        ct_train_dev_init(&t->b, d, &t->replicas[d].dv, &t->replicas[d].arena, &t->replicas[d].ctx);
    if (st == CT_OK && t->opt.clip_mode != CT_CLIP_GLOBAL && t->opt.clip_mode != CT_CLIP_PER_LAYER)
        st = ct_error_set(err, CT_ERR_ARG, "reversible trainer: clip mode %d is invalid", (int)t->opt.clip_mode);
    if (st == CT_OK) st = host_grads_init(t, err);
    if (st == CT_OK) st = make_plan(t, loss, err);
    if (st != CT_OK) {
        rt_free(&t->b);
        return st;
    }
    replicas_init(t);
    if (t->b.opts.adasum && ct_comm_size(t->b.comm) > 1)
        t->gather_floats = (size_t)ct_comm_size(t->b.comm) * (size_t)t->b.n_local * t->max_w;
    prefetch_start(&t->pf, t->opt.copy_weights && t->opt.prefetch);
    if ((st = plan_step(t, batch_sigs, err)) != CT_OK) {
        rt_free(&t->b);
        return st;
    }
    *out = &t->b;
    return CT_OK;
}

ct_status ct_trainer_new_blocks(ct_trainer **out, const ct_reversible_block *blocks, int n_blocks, ct_layer *loss,
                                const ct_tensor *batch_sigs, int n_batch, ct_optimizer *opt, ct_key init_key,
                                ct_device *dev, const ct_trainer_options *opts, ct_error *err) {
    *out = NULL;
    // The counts size the layer list below: a negative one would make it
    // too short for the other block's layers. opt is ours, as on any failure.
    ct_status st = CT_OK;
    if (n_blocks < 0 || (n_blocks > 0 && !blocks))
        st = ct_error_set(err, CT_ERR_ARG, "reversible trainer: %d blocks%s", n_blocks,
                          n_blocks < 0 ? " (must be >= 0)" : ", but no block array");
    int n = 0;
    for (int b = 0; st == CT_OK && b < n_blocks; b++) {
        const ct_reversible_block *k = &blocks[b];
        bool bad = k->n_std < 0 || k->n_rev < 0 || (k->n_std > 0 && !k->std) || (k->n_rev > 0 && !k->rev);
        for (int i = 0; !bad && i < k->n_std; i++) bad = !k->std[i];
        for (int i = 0; !bad && i < k->n_rev; i++) bad = !k->rev[i];
        if (bad)
            st = ct_error_set(err, CT_ERR_ARG,
                              "reversible trainer: block %d has %d standard and %d reversible layers (counts must "
                              "be >= 0, with that many non-NULL layers)",
                              b, k->n_std, k->n_rev);
        n += k->n_std + k->n_rev;
    }
    if (st != CT_OK) {
        ct_optimizer_free(opt);
        return st;
    }
    ct_layer **layers = ct_malloc((size_t)(n ? n : 1) * sizeof *layers);
    n = 0;
    for (int b = 0; b < n_blocks; b++) {
        for (int i = 0; i < blocks[b].n_std; i++) layers[n++] = ct_layer_ref(blocks[b].std[i]);
        for (int i = 0; i < blocks[b].n_rev; i++) layers[n++] = ct_layer_ref(blocks[b].rev[i]);
    }
    ct_layer *model = ct_serial(n, layers);
    ct_free(layers);
    st = ct_reversible_trainer_new(out, model, loss, batch_sigs, n_batch, opt, init_key, dev, opts, err);
    ct_layer_free(model);
    return st;
}

// Gives back every device buffer (the next step allocates them again).
static void free_device_buffers(rt_trainer *t) {
    for (int b = 0; b < 2; b++) {
        ct_device_free(t->b.dev, t->stage[b].w, t->max_w * sizeof(float));
        ct_device_free(t->b.dev, t->stage[b].s, t->max_slots * sizeof(float));
        t->stage[b].w = t->stage[b].s = NULL;
    }
    ct_device_free(t->b.dev, t->gather, t->gather_floats * sizeof(float));
    t->gather = NULL;
    for (int d = 0; d < t->b.n_local; d++) {
        rt_replica *r = &t->replicas[d];
        ct_device_free(t->b.dev, r->grad_buf, t->max_w * sizeof(float));
        r->grad_buf = NULL;
        pool_free_all(t, r);
        ct_arena_free(&r->arena);
    }
}

static void rt_free(ct_trainer *base) {
    rt_trainer *t = (rt_trainer *)base;
    prefetch_stop(&t->pf);
    if (t->replicas) free_device_buffers(t);
    for (int d = 0; t->replicas && d < t->b.n_local; d++) {
        rt_replica *r = &t->replicas[d];
        ct_ctx_free(&r->ctx);
        ct_free(r->saved);
        if (d > 0) ct_free(r->state);
        ct_free(r->state_before);
        ct_free(r->state_after);
    }
    ct_free(t->replicas);
    for (int k = 0; k < t->n_units; k++) {
        ct_free(t->units[k].leaves);
        ct_free(t->units[k].ranges);
        ct_free(t->units[k].desc);
    }
    ct_free(t->units);
    ct_free(t->turns);
    ct_free(t->stats);
    ct_device_free(&t->host, t->host_grads, t->b.net.n_weights * sizeof(float));
    ct_device_free(&t->host, t->kept_grads, t->b.net.n_weights * sizeof(float));
    ct_train_base_free(&t->b);
    ct_free(t);
}

// ---- one step ------------------------------------------------------------------------

static ct_status ensure_device_buffers(rt_trainer *t, ct_error *err) {
    if (t->opt.copy_weights)
        for (int b = 0; b < 2; b++) {
            if (!t->stage[b].w)
                CT_TRY(ct_device_alloc(t->b.dev, t->max_w * sizeof(float), "staged layer weights",
                                       (void **)&t->stage[b].w, err));
            if (!t->stage[b].s)
                CT_TRY(ct_device_alloc(t->b.dev, t->max_slots * sizeof(float), "staged layer optimizer slots",
                                       (void **)&t->stage[b].s, err));
        }
    if (t->gather_floats && !t->gather)
        CT_TRY(ct_device_alloc(t->b.dev, t->gather_floats * sizeof(float), "Adasum gather buffer (one layer)",
                               (void **)&t->gather, err));
    for (int d = 0; d < t->b.n_local; d++) {
        rt_replica *r = &t->replicas[d];
        if (!r->grad_buf)
            CT_TRY(ct_device_alloc(t->b.dev, t->max_w * sizeof(float), "layer gradients", (void **)&r->grad_buf,
                                   err));
        // One block of the planned size (free_device_each_step gave it back).
        if (!r->arena.measure_base) CT_TRY(ct_arena_reserve(&r->arena, r->arena_plan, err));
    }
    return CT_OK;
}

static bool defers_updates(const rt_trainer *t) {
    return t->b.opts.clip_grad_norm > 0.0f && t->opt.clip_mode == CT_CLIP_GLOBAL;
}

// Where turn k's weights and slots are.
static rt_stage stage_of(const rt_trainer *t, int k) {
    const rt_unit *u = &t->units[t->turns[k].unit];
    if (!t->opt.copy_weights) return (rt_stage){t->b.net.weights + u->w_begin, t->b.slots + u->slot_begin};
    return t->stage[k % 2];
}

// Starts staging turn k's range into its buffer.
static void stage_post(rt_trainer *t, int k) {
    if (!t->opt.copy_weights) return;
    const rt_turn *turn = &t->turns[k];
    const rt_unit *u = &t->units[turn->unit];
    rt_stage s = stage_of(t, k);
    rt_copy w = {s.w, t->b.net.weights + u->w_begin, u->w_end - u->w_begin};
    // Slots only for a turn that updates (not a forward, nor a backward whose
    // update waits for the global norm).
    bool update = turn->backward && !defers_updates(t);
    rt_copy slots = {s.s, t->b.slots + u->slot_begin, update ? u->slot_end - u->slot_begin : 0};
    prefetch_post(&t->pf, w, slots);
}

// Binds replica r's ctx to unit u's staged weights and its gradient buffer
// (zeroed for a turn that computes gradients).
static void bind_unit(rt_replica *r, const rt_unit *u, rt_stage s, bool grads) {
    r->ctx.weights = rebase(s.w, u->w_begin);
    r->ctx.grads = rebase(r->grad_buf, u->w_begin);
    r->ctx.state = r->state;
    r->ctx.train = true;
    r->ctx.record = grads;
    ct_tape_truncate(&r->ctx, 0);
    if (grads && u->w_end > u->w_begin) memset(r->grad_buf, 0, (u->w_end - u->w_begin) * sizeof(float));
}

// The key a leaf gets inside Serial(model, loss) from the replica's key.
static ct_key leaf_key(const rt_replica *r, const rt_leaf *leaf) { return ct_train_leaf_key(r->key, leaf); }

// Runs unit u's leaves over a stack whose top is top (its n_in items
// forward, its n_out gradients backward, in reverse), as a Serial would;
// res gets what the unit leaves (n_out outputs, or n_in input gradients).
static ct_status leaves_run(const rt_replica *r, rt_unit *u, ct_ctx *c, bool backward, const ct_tensor *top,
                            ct_tensor *res, ct_error *err) {
    return ct_train_leaves_run(u->leaves, u->n_leaves, r->key, c, backward, top, backward ? u->n_out : u->n_in, res,
                               NULL, err);
}

static void tensors_of(const rt_item *items, int n, ct_tensor *out) {
    for (int i = 0; i < n; i++) out[i] = items[i].t;
}

// Copies unit u's range of the state between the replica's state slab and
// one of its saved slabs.
static void copy_state(const rt_replica *r, const rt_unit *u, float *saved, bool to_state) {
    size_t n = u->s_end - u->s_begin;
    if (!n) return;
    if (to_state) memcpy(r->state + u->s_begin, saved + u->s_begin, n * sizeof(float));
    else memcpy(saved + u->s_begin, r->state + u->s_begin, n * sizeof(float));
}

// Forward of a standard or reversible layer, without a tape.
static ct_status forward_turn(rt_trainer *t, rt_replica *r, rt_unit *u, rt_stage s, ct_error *err) {
    ct_ctx *c = &r->ctx;
    bind_unit(r, u, s, false);
    ct_tensor in[CT_LAYER_MAX_IO], out[CT_LAYER_MAX_IO];
    tensors_of(r->vals, u->n_in, in);
    rt_item *saved = r->saved + (u - t->units) * CT_LAYER_MAX_IO;
    if (u->kind == RT_STANDARD)
        for (int i = 0; i < u->n_in; i++) {
            saved[i] = r->vals[i];
            if (saved[i].buf >= 0) r->pool[saved[i].buf].refs++;
        }
    // The state before this forward (put back after a non-finite step) and
    // after it (what the recomputation in backward starts from).
    bool keep_state = r->state_before != NULL;
    if (keep_state) copy_state(r, u, r->state_before, false);
    ct_status st = u->kind == RT_REVERSIBLE
                       ? ct_layer_forward(u->leaves[0].layer, c, in, out, leaf_key(r, &u->leaves[0]), err)
                       : leaves_run(r, u, c, false, in, out, err);
    if (keep_state) copy_state(r, u, r->state_after, false);
    rt_item items[CT_LAYER_MAX_IO];
    if (st == CT_OK) st = adopt(t, r, out, u->n_out, items, err);
    ct_arena_reset(&r->arena);
    if (st != CT_OK) return st;
    for (int i = 0; i < u->n_in; i++) pool_release(r, r->vals[i].buf);
    items_replace(r->vals, r->depth, u->n_in, items, u->n_out);
    r->depth += u->n_out - u->n_in;
    return CT_OK;
}

// The loss layer's forward, with the tape: the loss and what it averaged
// over. Its backward waits for the global weight.
static ct_status loss_forward(rt_trainer *t, rt_replica *r, rt_unit *u, rt_stage s, ct_error *err) {
    ct_ctx *c = &r->ctx;
    bind_unit(r, u, s, true);
    c->loss_weight = -1;  // "not said"
    // Not needed by backward (the tape has what it needs), but with it
    // state_before holds the whole state as the step found it, to put back
    // after a non-finite step.
    if (r->state_before) copy_state(r, u, r->state_before, false);
    ct_tensor in[CT_LAYER_MAX_IO];
    tensors_of(r->vals, u->n_in, in);
    const ct_chunked_loss *cl = &t->b.chunked;
    if (cl->rows) {
        // The leaves before the chunked part with the tape, then its chunks
        // without (backward runs them again).
        CT_TRY(ct_train_leaves_run(u->leaves, t->loss_head, r->key, c, false, in, u->n_in, r->part_in, NULL, err));
        return ct_chunked_loss_forward(cl, c, r->part_in, r->key, &r->dv.loss_out, &r->dv.weight, err);
    }
    CT_TRY(leaves_run(r, u, c, false, in, &r->dv.loss_out, err));
    // A loss layer that does not say what it averaged over counts as one.
    r->dv.weight = c->loss_weight >= 0 ? c->loss_weight : 1.0;
    return CT_OK;
}

// The loss layer's backward from the seed; its input gradients start the
// gradient stack.
static ct_status loss_backward(rt_trainer *t, rt_replica *r, rt_unit *u, ct_error *err) {
    ct_ctx *c = &r->ctx;
    ct_tensor gout = ct_tensor_sig(&r->dv.loss_out), gin[CT_LAYER_MAX_IO], gpart[CT_LAYER_MAX_IO];
    gout.data = &r->dv.seed;
    const ct_chunked_loss *cl = &t->b.chunked;
    ct_status st;
    if (cl->rows) {
        st = ct_chunked_loss_backward(cl, c, r->part_in, r->key, r->dv.seed, r->dv.weight, gpart, err);
        if (st == CT_OK)
            st = ct_train_leaves_run(u->leaves, t->loss_head, r->key, c, true, gpart, cl->n_in, gin, NULL, err);
    } else {
        st = leaves_run(r, u, c, true, &gout, gin, err);
    }
    rt_item items[CT_LAYER_MAX_IO];
    if (st == CT_OK) st = adopt(t, r, gin, u->n_in, items, err);
    ct_arena_reset(&r->arena);
    if (st != CT_OK) return st;
    CT_ASSERT(c->tape_len == 0);
    memcpy(r->grads, items, (size_t)u->n_in * sizeof *items);
    for (int i = u->n_in; i < r->depth; i++) r->grads[i] = (rt_item){ct_tensor_sig(&r->vals[i].t), -1};
    return CT_OK;
}

// Backward of a reversible layer (reverse_and_grad) or a standard one (its
// forward again from the kept inputs, with the tape, then backward).
static ct_status backward_turn(rt_trainer *t, rt_replica *r, rt_unit *u, rt_stage s, ct_error *err) {
    ct_ctx *c = &r->ctx;
    bind_unit(r, u, s, true);
    ct_tensor out[CT_LAYER_MAX_IO], gout[CT_LAYER_MAX_IO], in[CT_LAYER_MAX_IO], gin[CT_LAYER_MAX_IO];
    tensors_of(r->vals, u->n_out, out);
    tensors_of(r->grads, u->n_out, gout);
    rt_item *saved = r->saved + (u - t->units) * CT_LAYER_MAX_IO;
    ct_status st;
    // The recomputation sees the state the forward left (Trax's order: a
    // layer recognises its own recomputation by it, as LSHSelfAttention
    // reuses its stored buckets) and leaves that state as it was.
    bool keep_state = r->state_after != NULL;
    if (keep_state) copy_state(r, u, r->state_after, true);
    if (u->kind == RT_REVERSIBLE) {
        st = ct_layer_reverse_and_grad(u->leaves[0].layer, c, out, gout, in, gin, leaf_key(r, &u->leaves[0]), err);
        // Its sublayers were checked inside (ct_layer_forward/backward); not
        // the sum it makes of their gradients.
        if (st == CT_OK && c->check_finite) st = ct_ctx_check_grads(c, u->leaves[0].layer, gin, err);
    } else {
        tensors_of(saved, u->n_in, in);
        ct_tensor recomputed[CT_LAYER_MAX_IO];
        st = leaves_run(r, u, c, false, in, recomputed, err);
        if (st == CT_OK) st = leaves_run(r, u, c, true, gout, gin, err);
    }
    if (keep_state) copy_state(r, u, r->state_after, true);
    rt_item vitems[CT_LAYER_MAX_IO], gitems[CT_LAYER_MAX_IO];
    if (st == CT_OK && u->kind == RT_REVERSIBLE) st = adopt(t, r, in, u->n_in, vitems, err);
    if (st == CT_OK) {
        st = adopt(t, r, gin, u->n_in, gitems, err);
        if (st != CT_OK && u->kind == RT_REVERSIBLE)
            for (int i = 0; i < u->n_in; i++) pool_release(r, vitems[i].buf);
    }
    ct_arena_reset(&r->arena);
    if (st != CT_OK) return st;
    CT_ASSERT(c->tape_len == 0);
    if (u->kind == RT_STANDARD) {
        // The kept inputs go back on the stack, with their references.
        memcpy(vitems, saved, (size_t)u->n_in * sizeof *vitems);
        for (int i = 0; i < u->n_in; i++) saved[i].buf = -1;
    }
    for (int i = 0; i < u->n_out; i++) {
        pool_release(r, r->vals[i].buf);
        pool_release(r, r->grads[i].buf);
    }
    items_replace(r->vals, r->depth, u->n_out, vitems, u->n_in);
    items_replace(r->grads, r->depth, u->n_out, gitems, u->n_in);
    r->depth += u->n_in - u->n_out;
    return CT_OK;
}

// What one turn does on one replica.
typedef enum rt_phase { RT_FORWARD, RT_LOSS_FORWARD, RT_LOSS_BACKWARD, RT_BACKWARD } rt_phase;

static void replica_turn(rt_trainer *t, int d, rt_phase phase, rt_unit *u, rt_stage s) {
    rt_replica *r = &t->replicas[d];
    switch (phase) {
    case RT_FORWARD: r->dv.status = forward_turn(t, r, u, s, &r->dv.err); break;
    case RT_LOSS_FORWARD: r->dv.status = loss_forward(t, r, u, s, &r->dv.err); break;
    case RT_LOSS_BACKWARD: r->dv.status = loss_backward(t, r, u, &r->dv.err); break;
    case RT_BACKWARD: r->dv.status = backward_turn(t, r, u, s, &r->dv.err); break;
    }
}

// Runs a phase of unit u's turn on every local replica (threads when there
// are several; kernels then run single-threaded inside each). Returns the
// first failing replica's error.
static ct_status run_replicas(rt_trainer *t, rt_phase phase, rt_unit *u, rt_stage s, ct_error *err) {
    if (t->b.n_local == 1) replica_turn(t, 0, phase, u, s);
    else {
#pragma omp parallel for num_threads(t->b.n_local) schedule(static, 1)
        for (int d = 0; d < t->b.n_local; d++) replica_turn(t, d, phase, u, s);
    }
    return ct_train_devices_status(&t->b, err);
}

// The loss turn's first half: forward on every device (unless this process
// already failed), then the global weight W over every device of every
// process and each device's backward seed n_global * W_d / W (as the
// standard Trainer). *loss gets the loss over the global batch. Every
// process takes part in the sum, even one that failed (here or in an
// earlier layer), so a failure cannot leave the others waiting: it sends a
// NaN, and every process stops here.
static ct_status loss_forward_and_sum(rt_trainer *t, rt_unit *u, rt_stage s, ct_status failed, float *loss,
                                      ct_error *err) {
    ct_status st = failed != CT_OK ? failed : run_replicas(t, RT_LOSS_FORWARD, u, s, err);
    double mean;
    CT_TRY(ct_train_global_loss(&t->b, st, &mean, err));
    *loss = (float)mean;
    // The loss over every device of every process: each process stops here
    // alike, before any backward or update.
    if (!isfinite(mean)) {
        t->nf_loss = true;
        t->nf_value = mean;
        return ct_error_set(err, CT_ERR_NONFINITE, "non-finite loss (%g)", ct_train_shown(t->nf_value));
    }
    return CT_OK;
}

// Unit u's gradient over every device of every process, into device 0's
// gradient buffer: the mean (local replicas summed in device order, then
// the processes' sums added, then divided by the device count; the
// standard Trainer's arithmetic), or Adasum.
static ct_status combine_grads(rt_trainer *t, const rt_unit *u, ct_error *err) {
    size_t nw = u->w_end - u->w_begin;
    float *local[CT_MAX_LOCAL_DEVICES];
    for (int d = 0; d < t->b.n_local; d++) local[d] = t->replicas[d].grad_buf;
    if (t->b.opts.adasum)
        return ct_adasum_devices(t->b.comm, local, t->b.n_local, nw, u->ranges, u->p_end - u->p_begin, t->gather,
                                 local[0], err);
    return ct_train_mean(&t->b, local, nw, true, err);
}

// Applies the optimizer to unit u's weights (staged in s) from grad
// (unit-relative), skipping frozen weights.
static void apply_updates(rt_trainer *t, const rt_unit *u, rt_stage s, float *grad, int64_t step,
                          float lr) {
    ct_profile *profile = t->b.opts.profile;
    double start = profile ? ct_profile_begin(profile) : 0.0;
    for (int p = u->p_begin; p < u->p_end; p++) {
        if (t->b.frozen[p]) continue;
        const ct_param *param = t->b.net.params[p];
        size_t off = param->offset - u->w_begin;
        ct_optimizer_update(t->b.opt, step, lr, &param->sig, s.w + off, grad + off,
                            s.s + (t->b.slot_offsets[p] - u->slot_begin));
    }
    if (profile) ct_profile_end(profile, CT_PROFILE_OPTIMIZER, false, start);
    if (t->kept_grads) memcpy(t->kept_grads + u->w_begin, grad, (u->w_end - u->w_begin) * sizeof(float));
}

// Norms of unit u's combined gradient (in device 0's buffer; frozen weights'
// gradients dropped first) and weights, then, unless the update waits for
// the global norm, its optimizer update and the write-back. A non-finite
// gradient norm (the same on every process: the gradient is combined)
// stops it before the update with CT_ERR_NONFINITE: the norm is computed
// anyway, so a healthy step checks nothing more.
static ct_status update_unit(rt_trainer *t, const rt_unit *u, rt_stage s, int64_t step, float lr,
                             double *g2, double *w2) {
    size_t nw = u->w_end - u->w_begin;
    float *grad = t->replicas[0].grad_buf;
    *g2 = ct_train_drop_frozen(&t->b, grad, u->w_begin, nw, u->p_begin, u->p_end);
    if (!isfinite(*g2)) return CT_ERR_NONFINITE;
    *w2 = ct_train_sum_squares(s.w, nw);
    if (defers_updates(t)) {
        memcpy(t->host_grads + u->w_begin, grad, nw * sizeof(float));
        return CT_OK;
    }
    float clip = t->b.opts.clip_grad_norm;
    if (clip > 0.0f && t->opt.clip_mode == CT_CLIP_PER_LAYER) ct_train_clip(grad, nw, sqrt(*g2), clip);
    apply_updates(t, u, s, grad, step, lr);
    if (t->opt.copy_weights) {
        memcpy(t->b.net.weights + u->w_begin, s.w, nw * sizeof(float));
        memcpy(t->b.slots + u->slot_begin, s.s, (u->slot_end - u->slot_begin) * sizeof(float));
    }
    return CT_OK;
}

// CT_CLIP_GLOBAL's second pass: every layer's update with its gradient
// scaled by min(1, clip / global norm).
static void deferred_updates(rt_trainer *t, int64_t step, float lr, double global_norm) {
    float scale = ct_clip_factor(global_norm, t->b.opts.clip_grad_norm);
    float *grad = t->replicas[0].grad_buf;
    for (int k = 0; k < t->n_units; k++) {
        const rt_unit *u = &t->units[k];
        size_t nw = u->w_end - u->w_begin, ns = u->slot_end - u->slot_begin;
        if (!nw) continue;
        rt_stage s = {t->b.net.weights + u->w_begin, t->b.slots + u->slot_begin};
        if (t->opt.copy_weights) {
            s = t->stage[0];
            memcpy(s.w, t->b.net.weights + u->w_begin, nw * sizeof(float));
            memcpy(s.s, t->b.slots + u->slot_begin, ns * sizeof(float));
        }
        for (size_t i = 0; i < nw; i++) grad[i] = t->host_grads[u->w_begin + i] * scale;
        apply_updates(t, u, s, grad, step, lr);
        if (t->opt.copy_weights) {
            memcpy(t->b.net.weights + u->w_begin, s.w, nw * sizeof(float));
            memcpy(t->b.slots + u->slot_begin, s.s, ns * sizeof(float));
        }
    }
}

static double rss_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1.0;
    long pages_total = 0, pages_resident = 0;
    int n = fscanf(f, "%ld %ld", &pages_total, &pages_resident);
    fclose(f);
    if (n != 2) return -1.0;
    return (double)pages_resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}

static void log_memory(const rt_trainer *t, int64_t step, const char *when) {
    if (t->opt.log_every <= 0 || step % t->opt.log_every != 1 % t->opt.log_every) return;
    ct_log(CT_LOG_INFO,
           "reversible trainer step %lld, %s: host memory (RSS) %.1f MiB; host slabs %.1f MiB; device %.1f MiB "
           "now, %.1f MiB peak",
           (long long)step, when, rss_mib(), (double)t->host.current_bytes / 1048576.0,
           (double)t->b.dev->current_bytes / 1048576.0, (double)t->b.dev->peak_bytes / 1048576.0);
}

// Drops every stack item and kept input (after a failure or at the end).
static void clear_stacks(rt_trainer *t) {
    for (int d = 0; d < t->b.n_local; d++) {
        rt_replica *r = &t->replicas[d];
        for (int i = 0; i < r->n_pool; i++) r->pool[i].refs = 0;
        for (int i = 0; i < t->n_units * CT_LAYER_MAX_IO; i++) r->saved[i].buf = -1;
        r->depth = 0;
        ct_tape_truncate(&r->ctx, 0);
        ct_arena_reset(&r->arena);
    }
}

// Runs the step's turns. A failure on this process (failed, or in a turn)
// stops the computing, but the process still joins the step's next
// collective (the loss layer's weight sum, or the failure flag each layer
// sends before its gradients are combined), where every process learns of
// it and returns; so no process is left waiting on another.
static ct_status run_turns(rt_trainer *t, int64_t step, float lr, ct_status failed, float *loss,
                           double *g2, double *w2, ct_error *err) {
    bool many_processes = ct_comm_size(t->b.comm) > 1;
    ct_status st = CT_OK;
    // Staging only while this process computes (after a failure of
    // ensure_device_buffers there may be no staging buffers).
    if (failed == CT_OK) stage_post(t, 0);
    for (int k = 0; k < t->n_turns && st == CT_OK; k++) {
        prefetch_wait(&t->pf);
        if (k + 1 < t->n_turns && failed == CT_OK) stage_post(t, k + 1);
        int unit = t->turns[k].unit;
        rt_unit *u = &t->units[unit];
        rt_stage s = stage_of(t, k);
        bool backward = t->turns[k].backward, has_weights = u->p_end > u->p_begin;
        rt_phase phase = !backward ? RT_FORWARD : u->kind == RT_LOSS ? RT_LOSS_BACKWARD : RT_BACKWARD;
        if (u->kind == RT_LOSS && (st = loss_forward_and_sum(t, u, s, failed, loss, err)) != CT_OK) {
            if (st == CT_ERR_NONFINITE) t->nf_turn = k;
            break;
        }
        if (failed == CT_OK) {
            failed = run_replicas(t, phase, u, s, err);
            if (failed != CT_OK && !many_processes) st = failed;
        }
        if (u->kind == RT_LOSS && st == CT_OK) log_memory(t, step, "loss layer done");
        if (!backward || st != CT_OK) continue;
        // Each layer's gradients are combined over processes: first every
        // process says whether it failed.
        if (has_weights && many_processes) {
            char where[48];
            snprintf(where, sizeof where, "before layer %d's update", unit);
            if ((st = ct_train_agree_on_failure(&t->b, failed, where, err)) != CT_OK) continue;
        }
        if (failed != CT_OK) continue;  // this process stops at the next collective
        // Each layer's gradient is combined before its update, so every
        // process updates alike.
        if (has_weights && (st = combine_grads(t, u, err)) != CT_OK) continue;
        double ug2 = 0, uw2 = 0;
        if (has_weights && (st = update_unit(t, u, s, step, lr, &ug2, &uw2)) != CT_OK) {
            t->nf_turn = k;
            t->nf_value = ug2;
            continue;
        }
        *g2 += ug2;
        *w2 += uw2;
        if (u->stat >= 0) {
            int i = u->stat;
            if (has_weights) {
                t->stats[i++].value = (float)sqrt(ug2);
                t->stats[i++].value = (float)sqrt(uw2);
            }
            if (u->kind == RT_LOSS) t->stats[i].value = *loss;
        }
    }
    prefetch_wait(&t->pf);
    // A failure after the last layer with weights: every process learns of
    // it before any applies the deferred (globally clipped) updates.
    if (st == CT_OK && many_processes)
        st = ct_train_agree_on_failure(&t->b, failed, "at the end of the step", err);
    if (st == CT_OK) st = failed;
    if (st == CT_OK && defers_updates(t)) deferred_updates(t, step, lr, sqrt(*g2));
    return st;
}

// Puts back the state as the step found it: replica 0 runs on the net's
// state, and its state_before holds each layer's range as it was before
// that layer's forward (the loss layer's too), which changes no other
// layer's range. Every forward ran before any non-finite value is found.
static void restore_state(rt_trainer *t) {
    if (t->b.net.n_state) memcpy(t->b.net.state, t->replicas[0].state_before, t->b.net.n_state * sizeof(float));
}

// Turn k of a step again on every replica, without collectives or updates
// (the non-finite search and the planning pass): the loss unit runs its
// forward, then its backward when loss_backward.
static ct_status rerun_turn(rt_trainer *t, int k, bool loss_backward) {
    stage_post(t, k);
    prefetch_wait(&t->pf);
    rt_unit *u = &t->units[t->turns[k].unit];
    rt_stage s = stage_of(t, k);
    if (u->kind != RT_LOSS) return run_replicas(t, t->turns[k].backward ? RT_BACKWARD : RT_FORWARD, u, s, NULL);
    ct_status st = run_replicas(t, RT_LOSS_FORWARD, u, s, NULL);
    if (st == CT_OK && loss_backward) st = run_replicas(t, RT_LOSS_BACKWARD, u, s, NULL);
    return st;
}

// The step went non-finite at turn t->nf_turn (its loss, or a layer's
// combined gradient): the state goes back to what the step found, and turns
// 0..nf_turn run again on the same batch, keys and state in anomaly mode
// (ct_ctx.check_finite), with no collective and no update, to find the
// first layer whose output or gradient went non-finite. Each process
// decided alike from combined values and names what its own devices found.
static ct_status nonfinite_step(rt_trainer *t, const ct_tensor *batch, ct_key key, ct_error *err) {
    const rt_unit *bad = &t->units[t->turns[t->nf_turn].unit];
    ct_error found;
    // Layers after the bad one with weights not frozen already made their
    // update (fused updates: each as its backward ends), and the re-run sees
    // their new weights.
    int first_updated = -1, last_updated = -1;
    for (int k = (int)(bad - t->units) + 1; k < t->n_units && !t->nf_loss && !defers_updates(t); k++)
        for (int p = t->units[k].p_begin; p < t->units[k].p_end; p++)
            if (!t->b.frozen[p]) {
                if (first_updated < 0) first_updated = k;
                last_updated = k;
                break;
            }
    clear_stacks(t);
    restore_state(t);
    // st becomes the first finding.
    ct_status st = ct_train_nonfinite_begin(batch, t->n_batch, &found) ? CT_ERR_NONFINITE : CT_OK;
    for (int d = 0; d < t->b.n_local && st == CT_OK; d++) {
        replica_begin_step(t, &t->replicas[d], d, batch, key);
        t->replicas[d].ctx.check_finite = true;
    }
    for (int k = 0; k <= t->nf_turn && st == CT_OK; k++) {
        // The seeds are the failed step's: the loss's backward runs only
        // when its loss was finite, so they were computed.
        st = rerun_turn(t, k, !t->nf_loss);
        if (st != CT_OK) ct_train_first_finding(&t->b, &found);
    }
    for (int d = 0; d < t->b.n_local; d++) t->replicas[d].ctx.check_finite = false;
    clear_stacks(t);
    restore_state(t);
    if (t->nf_loss) return ct_error_set(err, CT_ERR_NONFINITE, "non-finite loss (%g): %s", ct_train_shown(t->nf_value), found.msg);
    char updated[96] = "";
    if (first_updated >= 0 && first_updated == last_updated)
        snprintf(updated, sizeof updated, ", after this step had updated trainer layer %d", first_updated);
    else if (first_updated >= 0)
        snprintf(updated, sizeof updated, ", after this step had updated trainer layers %d to %d", first_updated,
                 last_updated);
    // CT_ERR_NONFINITE promises that nothing was updated (a Loop may skip
    // such a step); a partly applied step is a failed state instead.
    return ct_error_set(err, first_updated >= 0 ? CT_ERR_STATE : CT_ERR_NONFINITE,
                        "non-finite gradient (L2 norm %g) in trainer layer %d%s: %s", ct_train_shown(sqrt(t->nf_value)),
                        (int)(bad - t->units), updated, found.msg);
}

// The device parts of the plan (see ct_memory_plan), with the buffers the
// planning pass left.
static void plan_parts(rt_trainer *t) {
    ct_memory_plan *p = &t->b.plan;
    size_t n_local = (size_t)t->b.n_local;
    size_t wbytes = ct_train_padded(t->max_w * sizeof(float));
    p->weights = t->opt.copy_weights ? 2 * wbytes : 0;
    p->slots = t->opt.copy_weights ? 2 * ct_train_padded(t->max_slots * sizeof(float)) : 0;
    p->grads = n_local * wbytes;
    p->state = 0;
    p->stack = 0;
    for (int d = 0; d < t->b.n_local; d++)
        for (int i = 0; i < t->replicas[d].n_pool; i++) p->stack += ct_train_padded(t->replicas[d].pool[i].bytes);
    p->scratch = ct_train_padded(t->gather_floats * sizeof(float));
    p->device_bytes = p->weights + p->slots + p->grads + p->activations + p->stack + p->scratch;
    p->host_bytes = t->host.current_bytes;
}

// Every turn of one step on zeros (seeds 0) with the arenas measuring, as
// nonfinite_step re-runs them: no collective, no update, no write-back.
static ct_status plan_turns(rt_trainer *t, const ct_tensor *zeros) {
    ct_status st = CT_OK;
    for (int d = 0; d < t->b.n_local; d++) {
        replica_begin_step(t, &t->replicas[d], d, zeros, ct_key_from_seed(0));
        t->replicas[d].dv.seed = 0.0f;
    }
    for (int k = 0; k < t->n_turns && st == CT_OK; k++) {
        st = rerun_turn(t, k, true);
    }
    return st;
}

// The planning pass (see ct_memory_plan): the device buffers, the stack
// items one step needs, and each arena as one block of its high-water mark.
// The state goes back to what init left; weights and slots are not written.
static ct_status plan_step(rt_trainer *t, const ct_tensor *batch_sigs, ct_error *err) {
    const ct_net *net = &t->b.net;
    ct_tensor zeros[CT_LAYER_MAX_IO];
    ct_arena *arenas[CT_MAX_LOCAL_DEVICES];
    CT_TRY(ct_train_plan_batch(batch_sigs, net->n_in, zeros, err));
    ct_status st = ensure_device_buffers(t, err);
    for (int d = 0; d < t->b.n_local; d++) {
        arenas[d] = &t->replicas[d].arena;
        if (st == CT_OK) st = ct_arena_measure_begin(arenas[d], err);
    }
    t->batch = zeros;
    t->n_batch = net->n_in;
    if (st == CT_OK && (st = plan_turns(t, zeros)) != CT_OK) {
        ct_train_devices_status(&t->b, err);
        ct_error_prefix(err, "reversible trainer: planning pass (one step's turns on zeros)");
    }
    clear_stacks(t);
    restore_state(t);
    t->batch = NULL;
    t->n_batch = 0;
    ct_train_plan_batch_free(zeros, net->n_in);
    ct_status pst = ct_train_plan_arenas(&t->b, arenas, st == CT_OK ? err : NULL);
    CT_TRY(st);
    CT_TRY(pst);
    for (int d = 0; d < t->b.n_local; d++) t->replicas[d].arena_plan = ct_arena_capacity(arenas[d]);
    plan_parts(t);
    if (t->opt.free_device_each_step) free_device_buffers(t);
    return CT_OK;
}

static ct_status rt_one_step(ct_trainer *base, const ct_tensor *batch, ct_key key, int64_t step, float learning_rate,
                             ct_step_stats *stats, ct_error *err) {
    rt_trainer *t = (rt_trainer *)base;
    const ct_net *net = &t->b.net;
    CT_TRY(ct_train_check_batch(&t->b, batch, err));
    log_memory(t, step, "forward");
    // A failure here still goes through the turns, to the first collective.
    ct_status st = ensure_device_buffers(t, err);
    float loss = 0.0f;
    double g2 = 0.0, w2 = 0.0;
    t->batch = batch;
    t->n_batch = net->n_in;
    for (int d = 0; d < t->b.n_local; d++) replica_begin_step(t, &t->replicas[d], d, batch, key);
    t->nf_turn = -1;
    t->nf_loss = false;
    st = run_turns(t, step, learning_rate, st, &loss, &g2, &w2, err);
    if (st == CT_ERR_NONFINITE && t->nf_turn >= 0) st = nonfinite_step(t, batch, key, err);
    clear_stacks(t);
    t->batch = NULL;
    t->n_batch = 0;
    if (t->opt.free_device_each_step) free_device_buffers(t);
    if (st != CT_OK) return st;
    log_memory(t, step, "backward done");
    t->b.grads = t->kept_grads;
    if (stats) {
        stats->loss = loss;
        stats->gradients_l2 = (float)sqrt(g2);
        stats->weights_l2 = (float)sqrt(w2);
    }
    return CT_OK;
}

// ---- accessors -------------------------------------------------------------------------

static const rt_trainer *as_rt(const ct_trainer *t) { return t->vt == &rt_vt ? (const rt_trainer *)t : NULL; }

const ct_layer_stat *ct_trainer_layer_stats(const ct_trainer *t, int *n) {
    const rt_trainer *r = as_rt(t);
    if (n) *n = r ? r->n_stats : 0;
    return r ? r->stats : NULL;
}

int ct_trainer_n_layers(const ct_trainer *t) { return as_rt(t) ? as_rt(t)->n_units : 0; }

const char *ct_trainer_layer_desc(const ct_trainer *t, int i) {
    CT_ASSERT(i >= 0 && i < ct_trainer_n_layers(t));
    return as_rt(t)->units[i].desc;
}

const ct_device *ct_trainer_host(const ct_trainer *t) { return t->slab_dev; }
