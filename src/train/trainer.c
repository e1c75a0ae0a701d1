// The standard Trainer's step (see trainer.h): one step over local replicas
// and processes. What both trainers share is in train_common.c.
#include "ctrax/train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/bulk.h"
#include "train/train_internal.h"

// One local device: its own arena, run context, gradient slab and shard of
// the batch. Replica 0's gradient slab is the net's.
typedef struct replica {
    ct_arena arena;
    ct_ctx ctx;
    float *grads;
    float *state;  // the state slab it runs on: the net's (device 0) or its own copy
    ct_tensor shard[CT_LAYER_MAX_IO];
    ct_tensor part_in[CT_LAYER_MAX_IO];  // the chunked loss's inputs, from forward to backward
    ct_train_dev dv;  // loss, weight, seed, status
} replica;

// Sends gradient buckets to the comm while backward goes on (one local
// device only): params become ready as backward finishes their layers, in
// roughly decreasing slab order; a bucket [cursor, sent) is started once
// every param in it is ready and it holds at least bucket_floats.
typedef struct bucketer {
    bool active;
    int *uses;        // per param: backward uses per step (a layer used twice: 2)
    int *uses_left;   // per param: backward uses still to come this step
    bool *ready;      // per param
    int next_param;   // params [next_param, n) are ready
    size_t sent;      // floats [sent, n_weights) are started
    size_t bucket_floats;
    // The buckets one step starts, in order (recorded by the planning pass
    // at construction, whose backward walks the layers as every step's
    // does): a process whose backward fails, the first step's too, starts
    // the ones it did not reach, so the others' collectives find theirs.
    ct_range *plan;
    int n_plan, n_started;
    bool planned;
    bool planning;  // the planning pass: buckets are recorded, none is sent
    ct_status status;
    ct_error err;
} bucketer;

typedef struct std_trainer {
    ct_trainer b;       // the shared part (train_internal.h)
    replica *replicas;  // b.n_local of them
    float *gather;      // Adasum across processes: every device's gradients
    size_t gather_floats;
    float *state_before;  // the state slab as the step found it (put back after a non-finite step)
    bucketer bk;
} std_trainer;

// ---- buckets -----------------------------------------------------------------

// The index in net.params of a layer's first own weight (params are sorted
// by offset, and a layer's own weights are contiguous).
static int first_param_of(const ct_net *net, const ct_layer *l) {
    size_t off = l->weights[0].offset;
    int lo = 0, hi = net->n_params - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (net->params[mid]->offset < off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static void count_uses(const ct_net *net, const ct_layer *l, int *uses) {
    if (l->n_weights > 0) {
        int p = first_param_of(net, l);
        for (int i = 0; i < l->n_weights; i++) uses[p + i]++;
    }
    for (int i = 0; i < l->n_sub; i++) count_uses(net, l->sub[i], uses);
}

static void bucket_start(std_trainer *t, size_t lo, size_t hi) {
    bucketer *b = &t->bk;
    if (hi <= lo || b->status != CT_OK) return;
    if (!b->planned) {
        b->plan = ct_realloc(b->plan, (size_t)(b->n_plan + 1) * sizeof *b->plan);
        b->plan[b->n_plan++] = (ct_range){lo, hi - lo};
    }
    if (b->planning) return;
    b->n_started++;
    b->status = ct_comm_allreduce_start(t->b.comm, t->b.net.grads + lo, hi - lo, &b->err);
}

// A layer finished a backward use: mark its params, start what is complete.
static void on_weight_grads(void *user, const ct_layer *l) {
    std_trainer *t = user;
    bucketer *b = &t->bk;
    const ct_net *net = &t->b.net;
    int p = first_param_of(net, l);
    for (int i = 0; i < l->n_weights; i++)
        if (--b->uses_left[p + i] == 0) b->ready[p + i] = true;
    while (b->next_param > 0 && b->ready[b->next_param - 1]) b->next_param--;
    size_t cursor = b->next_param < net->n_params ? net->params[b->next_param]->offset : net->n_weights;
    if (b->sent - cursor >= b->bucket_floats) {
        bucket_start(t, cursor, b->sent);
        b->sent = cursor;
    }
}

static void bucketer_reset(std_trainer *t) {
    bucketer *b = &t->bk;
    memcpy(b->uses_left, b->uses, (size_t)t->b.net.n_params * sizeof *b->uses);
    memset(b->ready, 0, (size_t)t->b.net.n_params * sizeof *b->ready);
    b->next_param = t->b.net.n_params;
    b->sent = t->b.net.n_weights;
    b->n_started = 0;
    if (!b->planned) b->n_plan = 0;  // a pass that did not complete leaves no plan
    b->status = CT_OK;
}

// ---- new / free ----------------------------------------------------------------

static ct_status std_one_step(ct_trainer *base, const ct_tensor *batch, ct_key key, int64_t step, float lr,
                              ct_step_stats *stats, ct_error *err);
static void std_free(ct_trainer *base);
static const ct_trainer_vt std_vt = {"trainer", std_one_step, std_free};

// Overlapped buckets need finished gradients in the net's slab as backward
// goes: one local device, and an engine with something to overlap.
static void bucketer_init(std_trainer *t) {
    const ct_net *net = &t->b.net;
    if (t->b.opts.adasum || t->b.n_local != 1 || ct_comm_get_kind(t->b.comm) != CT_COMM_MPI || net->n_params == 0)
        return;
    bucketer *b = &t->bk;
    b->active = true;
    b->uses = ct_calloc((size_t)net->n_params, sizeof *b->uses);
    b->uses_left = ct_calloc((size_t)net->n_params, sizeof *b->uses_left);
    b->ready = ct_calloc((size_t)net->n_params, sizeof *b->ready);
    b->bucket_floats = t->b.opts.bucket_bytes / sizeof(float);
    if (b->bucket_floats == 0) b->bucket_floats = 1;
    count_uses(net, net->root, b->uses);
    t->replicas[0].ctx.on_weight_grads = on_weight_grads;
    t->replicas[0].ctx.on_weight_grads_user = t;
}

// Each replica's context on the net, its gradient slab (replica 0's is the
// net's) and its state slab.
static ct_status replicas_init(std_trainer *t, ct_error *err) {
    ct_net *net = &t->b.net;
    for (int d = 0; d < t->b.n_local; d++) {
        replica *r = &t->replicas[d];
        ct_net_bind(net, &r->ctx, true);
        if (d == 0) r->grads = net->grads;
        else CT_TRY(ct_device_alloc(t->b.dev, net->n_weights * sizeof(float), "replica gradient slab", (void **)&r->grads, err));
        r->ctx.grads = r->grads;
        // Layer state follows device 0, as Trax keeps the first replica's;
        // the others run on a copy, so no two threads write one slab.
        r->state = d > 0 && net->n_state ? ct_calloc(net->n_state, sizeof(float)) : net->state;
        r->ctx.state = r->state;
    }
    return CT_OK;
}

static void forward_all(std_trainer *t, const ct_tensor *batch, const ct_key *keys);
static void backward_all(std_trainer *t, const ct_key *keys);

// The device parts of the plan other than the arenas (see ct_memory_plan).
static void plan_slabs(std_trainer *t) {
    const ct_net *net = &t->b.net;
    ct_memory_plan *p = &t->b.plan;
    size_t wbytes = ct_train_padded(net->n_weights * sizeof(float));
    p->weights = wbytes;
    p->grads = (size_t)t->b.n_local * wbytes;
    p->slots = ct_train_padded(t->b.n_slot_floats * sizeof(float));
    p->state = (t->state_before ? 2 : 1) * ct_train_padded(net->n_state * sizeof(float));
    p->scratch = ct_train_padded(t->gather_floats * sizeof(float));
    p->device_bytes = p->weights + p->grads + p->slots + p->state + p->activations + p->scratch;
}

// The planning pass: one step's forward and backward on zeros (seed 0),
// with the arenas measuring, then one block each of the high-water mark.
// The overlapped buckets are recorded (bucketer.plan), but none goes to the
// comm, and no update runs; the state goes back to what init left, and
// forward zeroes the gradients again at step 1, so the steps are bitwise as
// without it.
static ct_status plan_step(std_trainer *t, const ct_tensor *batch_sigs, ct_error *err) {
    ct_net *net = &t->b.net;
    int n_local = t->b.n_local;
    ct_tensor zeros[CT_LAYER_MAX_IO];
    ct_arena *arenas[CT_MAX_LOCAL_DEVICES];
    ct_key keys[CT_MAX_LOCAL_DEVICES];
    CT_TRY(ct_train_plan_batch(batch_sigs, net->n_in, zeros, err));
    if (net->n_state) memcpy(t->state_before, net->state, net->n_state * sizeof(float));
    ct_status st = CT_OK;
    for (int d = 0; d < n_local; d++) {
        arenas[d] = &t->replicas[d].arena;
        keys[d] = ct_key_from_seed(0);
        t->replicas[d].dv.seed = 0.0f;
        if (st == CT_OK) st = ct_arena_measure_begin(arenas[d], err);
    }
    if (st == CT_OK) {
        forward_all(t, zeros, keys);
        st = ct_train_devices_status(&t->b, err);
    }
    if (st == CT_OK) {
        t->bk.planning = true;
        if (t->bk.active) bucketer_reset(t);
        backward_all(t, keys);
        st = ct_train_devices_status(&t->b, err);
        if (st == CT_OK && t->bk.active) {
            bucket_start(t, 0, t->bk.sent);  // what is left, as combine does
            t->bk.planned = true;
        }
        t->bk.planning = false;
    }
    for (int d = 0; d < n_local; d++) {
        ct_arena_reset(arenas[d]);
        memset(t->replicas[d].grads, 0, net->n_weights * sizeof(float));
    }
    if (net->n_state) memcpy(net->state, t->state_before, net->n_state * sizeof(float));
    ct_train_plan_batch_free(zeros, net->n_in);
    ct_status pst = ct_train_plan_arenas(&t->b, arenas, st == CT_OK ? err : NULL);
    if (st != CT_OK) ct_error_prefix(err, "trainer: planning pass (one step's forward and backward on zeros)");
    CT_TRY(st);
    CT_TRY(pst);
    plan_slabs(t);
    return CT_OK;
}

ct_status ct_standard_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs,
                                  int n_batch, ct_optimizer *opt, ct_key init_key, ct_device *dev,
                                  const ct_trainer_options *opts, ct_error *err) {
    *out = NULL;
    std_trainer *t = ct_calloc(1, sizeof *t);
    ct_status st = ct_train_base_init(&t->b, &std_vt, model, loss, batch_sigs, n_batch, opt, init_key, dev, dev, opts, err);
    t->replicas = ct_calloc((size_t)t->b.n_local, sizeof *t->replicas);
    for (int d = 0; d < t->b.n_local; d++)
        ct_train_dev_init(&t->b, d, &t->replicas[d].dv, &t->replicas[d].arena, &t->replicas[d].ctx);
    if (st == CT_OK) st = replicas_init(t, err);
    if (st != CT_OK) goto fail;
    bucketer_init(t);
    const ct_net *net = &t->b.net;
    if (net->n_state) {
        st = ct_device_alloc(dev, net->n_state * sizeof(float), "state before the step", (void **)&t->state_before,
                             err);
        if (st != CT_OK) goto fail;
    }
    if (t->b.opts.adasum && ct_comm_size(t->b.comm) > 1) {
        t->gather_floats = (size_t)ct_comm_size(t->b.comm) * t->b.n_local * net->n_weights;
        st = ct_device_alloc(dev, t->gather_floats * sizeof(float), "Adasum gather buffer", (void **)&t->gather, err);
        if (st != CT_OK) goto fail;
    }
    if ((st = plan_step(t, batch_sigs, err)) != CT_OK) goto fail;
    *out = &t->b;
    return CT_OK;
fail:
    std_free(&t->b);
    return st;
}

static void std_free(ct_trainer *base) {
    std_trainer *t = (std_trainer *)base;
    size_t wbytes = t->b.net.n_weights * sizeof(float);
    for (int d = 0; t->replicas && d < t->b.n_local; d++) {
        replica *r = &t->replicas[d];
        if (d > 0) ct_device_free(t->b.dev, r->grads, wbytes);
        if (d > 0 && r->state != t->b.net.state) ct_free(r->state);
        ct_ctx_free(&r->ctx);
        ct_arena_free(&r->arena);
    }
    ct_free(t->replicas);
    ct_device_free(t->b.dev, t->gather, t->gather_floats * sizeof(float));
    ct_device_free(t->b.dev, t->state_before, t->b.net.n_state * sizeof(float));
    ct_free(t->bk.uses);
    ct_free(t->bk.uses_left);
    ct_free(t->bk.ready);
    ct_free(t->bk.plan);
    ct_train_base_free(&t->b);
    ct_free(t);
}

// ---- one step ------------------------------------------------------------------

static void replica_forward(std_trainer *t, int d, const ct_tensor *batch, ct_key key) {
    replica *r = &t->replicas[d];
    const ct_net *net = &t->b.net;
    for (int i = 0; i < net->n_in; i++) r->shard[i] = ct_tensor_split_rows(&batch[i], t->b.n_local, d);
    ct_bulk_zero(r->grads, net->n_weights * sizeof(float));
    ct_tape_truncate(&r->ctx, 0);
    r->ctx.loss_weight = -1;  // "not said"
    if (t->b.chunked.rows) {
        r->dv.status = ct_chunked_loss_net_forward(&t->b.chunked, &r->ctx, r->shard, net->n_in, key, r->part_in,
                                                   &r->dv.loss_out, &r->dv.weight, &r->dv.err);
        return;
    }
    r->dv.status = ct_layer_forward(net->root, &r->ctx, r->shard, &r->dv.loss_out, key, &r->dv.err);
    // A loss layer that does not say what it averaged over counts as one.
    r->dv.weight = r->ctx.loss_weight >= 0 ? r->ctx.loss_weight : 1.0;
}

static void replica_backward(std_trainer *t, int d, ct_key key) {
    replica *r = &t->replicas[d];
    ct_tensor grad_out = ct_tensor_sig(&r->dv.loss_out), grad_in[CT_LAYER_MAX_IO];
    grad_out.data = &r->dv.seed;
    if (t->b.chunked.rows)
        r->dv.status = ct_chunked_loss_net_backward(&t->b.chunked, &r->ctx, r->part_in, t->b.net.n_in, key,
                                                    r->dv.seed, r->dv.weight, &r->dv.err);
    else r->dv.status = ct_layer_backward(t->b.net.root, &r->ctx, &grad_out, grad_in, key, &r->dv.err);
    if (r->dv.status == CT_OK) CT_ASSERT(r->ctx.tape_len == 0);  // every push was popped
}

// Adasum or the mean over every device of every process, into the net's slab.
static ct_status combine(std_trainer *t, ct_error *err) {
    ct_net *net = &t->b.net;
    float *local[CT_MAX_LOCAL_DEVICES];
    for (int d = 0; d < t->b.n_local; d++) local[d] = t->replicas[d].grads;
    if (t->b.opts.adasum)
        return ct_adasum_devices(t->b.comm, local, t->b.n_local, net->n_weights, t->b.ranges, net->n_params, t->gather,
                                 net->grads, err);
    if (!t->bk.active) return ct_train_mean(&t->b, local, net->n_weights, true, err);
    bucket_start(t, 0, t->bk.sent);  // what is left, down to the bottom
    ct_status st = ct_comm_allreduce_wait(t->b.comm, t->bk.status == CT_OK ? err : NULL);
    if (t->bk.status != CT_OK) {
        if (err) *err = t->bk.err;
        return t->bk.status;
    }
    CT_TRY(st);
    ct_train_divide(&t->b, net->grads, net->n_weights);
    return CT_OK;
}

// Forward on every replica (threads when there are several; kernels then
// run single-threaded inside each).
static void forward_all(std_trainer *t, const ct_tensor *batch, const ct_key *keys) {
    int n_local = t->b.n_local;
    // The other replicas start from device 0's state (copied before the
    // threads start: device 0's forward writes it).
    for (int d = 1; d < n_local && t->b.net.n_state; d++)
        memcpy(t->replicas[d].state, t->b.net.state, t->b.net.n_state * sizeof(float));
    if (n_local == 1) replica_forward(t, 0, batch, keys[0]);
    else {
#pragma omp parallel for num_threads(n_local) schedule(static, 1)
        for (int d = 0; d < n_local; d++) replica_forward(t, d, batch, keys[d]);
    }
}

static void backward_all(std_trainer *t, const ct_key *keys) {
    int n_local = t->b.n_local;
    if (n_local == 1) replica_backward(t, 0, keys[0]);
    else {
#pragma omp parallel for num_threads(n_local) schedule(static, 1)
        for (int d = 0; d < n_local; d++) replica_backward(t, d, keys[d]);
    }
}

// The step went non-finite (its loss, or, with grads, its combined
// gradient): nothing was updated; the state goes back to what the step
// found, and the step runs again on the same batch, keys and state in
// anomaly mode (ct_ctx.check_finite) to find the first layer whose output
// or gradient went non-finite, forward first, then backward. Local only (no
// collectives): every process decided alike from combined values, and each
// names what its own devices found. Weights, slots and state are left as
// before the step.
static ct_status nonfinite_step(std_trainer *t, const ct_tensor *batch, const ct_key *keys, bool grads, double value,
                                ct_error *err) {
    ct_net *net = &t->b.net;
    int n_local = t->b.n_local;
    ct_error found;
    if (net->n_state) memcpy(net->state, t->state_before, net->n_state * sizeof(float));
    bool bad_batch = ct_train_nonfinite_begin(batch, net->n_in, &found);
    // The re-run sends no gradient buckets: the other processes are not in it.
    void (*on_grads)(void *, const ct_layer *) = t->replicas[0].ctx.on_weight_grads;
    for (int d = 0; d < n_local; d++) {
        ct_arena_reset(&t->replicas[d].arena);
        t->replicas[d].ctx.check_finite = true;
        t->replicas[d].ctx.on_weight_grads = NULL;
    }
    if (!bad_batch) {
        forward_all(t, batch, keys);
        // The seeds are the failed step's (backward runs only when its loss
        // was finite, so they were computed).
        if (!ct_train_first_finding(&t->b, &found) && grads) {
            backward_all(t, keys);
            ct_train_first_finding(&t->b, &found);
        }
    }
    for (int d = 0; d < n_local; d++) {
        t->replicas[d].ctx.check_finite = false;
        t->replicas[d].ctx.on_weight_grads = on_grads;
    }
    if (net->n_state) memcpy(net->state, t->state_before, net->n_state * sizeof(float));
    if (grads)
        return ct_error_set(err, CT_ERR_NONFINITE, "non-finite gradient (global L2 norm %g): %s",
                            ct_train_shown(sqrt(value)), found.msg);
    return ct_error_set(err, CT_ERR_NONFINITE, "non-finite loss (%g): %s", ct_train_shown(value), found.msg);
}

// Combines the gradients over all devices: the mean, or Adasum. After a
// failure (failed) with other processes, this process still takes part in
// the combine (with whatever gradients it has), then every process learns
// of the failure before any updates.
static ct_status combine_or_fail(std_trainer *t, ct_status failed, ct_error *err) {
    bool many_processes = ct_comm_size(t->b.comm) > 1;
    ct_status st;
    if (failed == CT_OK) st = combine(t, err);
    else if (!many_processes) st = failed;
    else if (!t->bk.active) st = combine(t, NULL);
    else if (t->bk.planned) {
        // Start the buckets the others start, then wait for them all.
        for (int i = t->bk.n_started; i < t->bk.n_plan; i++)
            bucket_start(t, t->bk.plan[i].offset, t->bk.plan[i].offset + t->bk.plan[i].length);
        st = ct_comm_allreduce_wait(t->b.comm, NULL);
    } else {
        st = failed;  // no plan: the planning pass failed, and with it the trainer's construction
    }
    if (st == CT_OK && many_processes) st = ct_train_agree_on_failure(&t->b, failed, "before the update", err);
    return st == CT_OK ? failed : st;
}

// The update from the combined gradients; *g2 their squared norm (before
// clipping; non-finite: nothing updated, CT_ERR_NONFINITE).
static ct_status update(std_trainer *t, int64_t step, float lr, double *g2, double *w2) {
    ct_net *net = &t->b.net;
    *g2 = ct_train_drop_frozen(&t->b, net->grads, 0, net->n_weights, 0, net->n_params);
    // The combined gradient is the same on every process, so all stop here
    // alike; a non-finite value makes g2 non-finite (finite floats cannot
    // overflow a double sum of squares), so a healthy step checks nothing
    // more.
    if (!isfinite(*g2)) return CT_ERR_NONFINITE;
    *w2 = ct_train_sum_squares(net->weights, net->n_weights);
    if (t->b.opts.clip_grad_norm > 0) ct_train_clip(net->grads, net->n_weights, sqrt(*g2), t->b.opts.clip_grad_norm);
    ct_profile *profile = t->b.opts.profile;
    double start = profile ? ct_profile_begin(profile) : 0.0;
    for (int i = 0; i < net->n_params; i++) {
        const ct_param *p = net->params[i];
        if (t->b.frozen[i]) continue;
        ct_optimizer_update(t->b.opt, step, lr, &p->sig, net->weights + p->offset, net->grads + p->offset,
                            t->b.slots + t->b.slot_offsets[i]);
    }
    if (profile) ct_profile_end(profile, CT_PROFILE_OPTIMIZER, false, start);
    t->b.grads = net->grads;
    return CT_OK;
}

static ct_status std_one_step(ct_trainer *base, const ct_tensor *batch, ct_key key, int64_t step, float lr,
                              ct_step_stats *stats, ct_error *err) {
    std_trainer *t = (std_trainer *)base;
    ct_net *net = &t->b.net;
    int n_local = t->b.n_local;
    CT_TRY(ct_train_check_batch(&t->b, batch, err));
    ct_key keys[CT_MAX_LOCAL_DEVICES];
    for (int d = 0; d < n_local; d++)
        keys[d] = t->b.n_global > 1 ? ct_key_split(key, (uint32_t)(t->b.first_global + d)) : key;
    // A non-finite step puts the state back (layers write it in forward).
    if (net->n_state) memcpy(t->state_before, net->state, net->n_state * sizeof(float));

    forward_all(t, batch, keys);
    // The loss over every device of every process: each process stops here
    // alike, before any backward or collective of gradients.
    double loss = 0, g2 = 0, w2 = 0;
    ct_status st = ct_train_global_loss(&t->b, ct_train_devices_status(&t->b, err), &loss, err);
    if (st == CT_OK && !isfinite(loss)) st = nonfinite_step(t, batch, keys, false, loss, err);
    if (st != CT_OK) goto done;

    if (t->bk.active) bucketer_reset(t);
    backward_all(t, keys);
    if ((st = combine_or_fail(t, ct_train_devices_status(&t->b, err), err)) != CT_OK) goto done;
    if (update(t, step, lr, &g2, &w2) != CT_OK) {
        st = nonfinite_step(t, batch, keys, true, g2, err);
        goto done;
    }
    if (stats) {
        stats->loss = (float)loss;
        stats->gradients_l2 = (float)sqrt(g2);
        stats->weights_l2 = (float)sqrt(w2);
    }
done:
    for (int d = 0; d < n_local; d++) ct_arena_reset(&t->replicas[d].arena);
    return st;
}
