// The Trainer (see trainer.h): one step over local replicas and processes.
#include "ctrax/train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "train/train_internal.h"

// One local device: its own arena, run context, gradient slab and shard of
// the batch. Replica 0's gradient slab is the net's.
typedef struct replica {
    ct_arena arena;
    ct_ctx ctx;
    float *grads;
    float *state;  // the state slab it runs on: the net's (device 0) or its own copy
    ct_tensor shard[CT_LAYER_MAX_IO];
    ct_tensor loss_out;
    double weight;  // what its loss averaged over (ct_ctx.loss_weight)
    float seed;     // d loss / d (its loss), from the global weight
    ct_status status;
    ct_error err;
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
    // The buckets one step starts, in order (recorded in the first step that
    // completes; the same every step): a process whose backward fails starts
    // the ones it did not reach, so the others' collectives find theirs.
    ct_range *plan;
    int n_plan, n_started;
    bool planned;
    ct_status status;
    ct_error err;
} bucketer;

struct ct_trainer {
    ct_net net;         // Serial(model, loss) bound to its slabs
    ct_layer *model;    // one reference
    ct_optimizer *opt;  // owned
    ct_device *dev;
    ct_trainer_options opts;
    int n_global;       // devices over all processes
    int first_global;   // global index of this process's device 0
    ct_comm *comm;      // opts.comm, or own_comm
    ct_comm *own_comm;
    replica *replicas;  // opts.n_devices of them
    float *slots;       // optimizer slot slab
    size_t n_slot_floats;
    size_t *slot_offsets;  // per net.params[i], into slots (n_params + 1 entries)
    bool *frozen;          // per net.params[i]
    ct_range *ranges;      // per net.params[i]: its slab range (for Adasum)
    float *gather;         // Adasum across processes: every device's gradients
    size_t gather_floats;
    float *state_before;   // the state slab as the step found it (put back after a non-finite step)
    bucketer bk;
};

ct_trainer_options ct_trainer_default_options(void) {
    return (ct_trainer_options){.n_devices = 1, .bucket_bytes = (size_t)4 << 20};
}

bool ct_trainer_options_frozen(const ct_trainer_options *o, const char *name) {
    for (int i = 0; i < o->n_frozen; i++)
        if (strncmp(name, o->frozen[i], strlen(o->frozen[i])) == 0) return true;
    return false;
}

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

static void bucket_start(ct_trainer *t, size_t lo, size_t hi) {
    bucketer *b = &t->bk;
    if (hi <= lo || b->status != CT_OK) return;
    if (!b->planned) {
        b->plan = ct_realloc(b->plan, (size_t)(b->n_plan + 1) * sizeof *b->plan);
        b->plan[b->n_plan++] = (ct_range){lo, hi - lo};
    }
    b->n_started++;
    b->status = ct_comm_allreduce_start(t->comm, t->net.grads + lo, hi - lo, &b->err);
}

// A layer finished a backward use: mark its params, start what is complete.
static void on_weight_grads(void *user, const ct_layer *l) {
    ct_trainer *t = user;
    bucketer *b = &t->bk;
    const ct_net *net = &t->net;
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

static void bucketer_reset(ct_trainer *t) {
    bucketer *b = &t->bk;
    memcpy(b->uses_left, b->uses, (size_t)t->net.n_params * sizeof *b->uses);
    memset(b->ready, 0, (size_t)t->net.n_params * sizeof *b->ready);
    b->next_param = t->net.n_params;
    b->sent = t->net.n_weights;
    b->n_started = 0;
    if (!b->planned) b->n_plan = 0;  // a step that did not complete leaves no plan
    b->status = CT_OK;
}

// ---- the batch over local devices (shared with the ReversibleTrainer) ------------

ct_status ct_train_device_sigs(const char *who, const ct_tensor *batch_sigs, int n_batch, int n_local, ct_tensor *sigs,
                               ct_error *err) {
    for (int i = 0; i < n_batch && i < CT_LAYER_MAX_IO; i++) {
        const ct_tensor *b = &batch_sigs[i];
        if (b->ndim < 1 || b->shape[0] % n_local != 0) {
            char a[CT_SIG_STR_MAX];
            return ct_error_set(err, CT_ERR_SHAPE, "%s: batch item %d %s does not split over %d devices along axis 0",
                                who, i, ct_tensor_sig_str(b, a, sizeof a), n_local);
        }
        sigs[i] = ct_tensor_split_rows(b, n_local, 0);
        sigs[i].data = NULL;
    }
    return CT_OK;
}

ct_status ct_train_agree_on_failure(ct_comm *comm, ct_status failed, const char *who, const char *where,
                                    ct_error *err) {
    double flag = failed != CT_OK ? 1.0 : 0.0;
    ct_status cst = ct_comm_allreduce_f64(comm, &flag, 1, failed == CT_OK ? err : NULL);
    if (failed != CT_OK) return failed;
    if (cst != CT_OK) return cst;
    if (flag == 0) return CT_OK;
    return ct_error_set(err, CT_ERR_STATE,
                        "%s: a device of another process failed (its error is in that process's output); stopped %s",
                        who, where);
}

// ---- new / free ----------------------------------------------------------------

ct_status ct_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs, int n_batch,
                         ct_optimizer *opt, ct_key init_key, ct_device *dev, const ct_trainer_options *opts,
                         ct_error *err) {
    *out = NULL;
    ct_trainer *t = ct_calloc(1, sizeof *t);
    t->opt = opt;
    t->dev = dev;
    t->model = ct_layer_ref(model);
    t->opts = opts ? *opts : ct_trainer_default_options();
    ct_status st = CT_OK;
    if (t->opts.n_devices < 1 || t->opts.n_devices > CT_MAX_LOCAL_DEVICES) {
        st = ct_error_set(err, CT_ERR_ARG, "trainer: n_devices is %d, must be 1 to %d", t->opts.n_devices,
                          CT_MAX_LOCAL_DEVICES);
        t->opts.n_devices = 1;
    }
    int n_local = t->opts.n_devices;
    t->replicas = ct_calloc((size_t)n_local, sizeof *t->replicas);
    for (int d = 0; d < n_local; d++) {
        ct_arena_init(&t->replicas[d].arena, dev);
        ct_ctx_init(&t->replicas[d].ctx, &t->replicas[d].arena);
    }
    if (st != CT_OK) goto fail;
    t->comm = t->opts.comm ? t->opts.comm : (t->own_comm = ct_comm_single_new());
    t->n_global = n_local * ct_comm_size(t->comm);
    t->first_global = n_local * ct_comm_rank(t->comm);

    // The net sees one device's share of the batch.
    ct_tensor sigs[CT_LAYER_MAX_IO];
    if ((st = ct_train_device_sigs("trainer", batch_sigs, n_batch, n_local, sigs, err)) != CT_OK) goto fail;
    // Unnamed, so the model's weights are named as in a net of their own.
    ct_layer *root = ct_layer_rename(ct_serial(CT_LAYERS(ct_layer_ref(model), ct_layer_ref(loss))), "");
    st = ct_net_init(&t->net, root, sigs, n_batch, init_key, dev, err);
    ct_layer_free(root);  // the net holds its own reference
    if (st != CT_OK) goto fail;
    if (t->net.n_out != 1 || t->net.out_sigs[0].ndim != 0 || t->net.out_sigs[0].dtype != CT_DTYPE_F32) {
        st = ct_error_set(err, CT_ERR_SHAPE, "trainer: the loss layer %s must leave one f32 scalar on the stack",
                          loss->name);
        goto fail;
    }
    ct_net *net = &t->net;
    size_t wbytes = net->n_weights * sizeof(float);
    for (int d = 0; d < n_local; d++) {
        replica *r = &t->replicas[d];
        ct_net_bind(net, &r->ctx, true);
        if (d == 0) r->grads = net->grads;
        else if ((st = ct_device_alloc(dev, wbytes, "replica gradient slab", (void **)&r->grads, err)) != CT_OK)
            goto fail;
        r->ctx.grads = r->grads;
        // Layer state follows device 0, as Trax keeps the first replica's;
        // the others run on a copy, so no two threads write one slab.
        r->state = d > 0 && net->n_state ? ct_calloc(net->n_state, sizeof(float)) : net->state;
        r->ctx.state = r->state;
    }

    // The slot slab: each weight's slots in slab order; frozen weights have none.
    t->slot_offsets = ct_calloc((size_t)net->n_params + 1, sizeof *t->slot_offsets);
    t->frozen = ct_calloc((size_t)net->n_params + 1, sizeof *t->frozen);
    t->ranges = ct_calloc((size_t)net->n_params + 1, sizeof *t->ranges);
    for (int i = 0; i < net->n_params; i++) {
        t->frozen[i] = ct_trainer_options_frozen(&t->opts, net->params[i]->full_name);
        t->slot_offsets[i] = t->n_slot_floats;
        if (!t->frozen[i]) t->n_slot_floats += ct_optimizer_slot_floats(opt, &net->params[i]->sig);
        t->ranges[i] = (ct_range){net->params[i]->offset, (size_t)ct_tensor_numel(&net->params[i]->sig)};
    }
    t->slot_offsets[net->n_params] = t->n_slot_floats;
    st = ct_device_alloc(dev, t->n_slot_floats * sizeof(float), "optimizer slots", (void **)&t->slots, err);
    if (st != CT_OK) goto fail;
    for (int i = 0; i < net->n_params; i++)
        if (!t->frozen[i]) ct_optimizer_init_slots(opt, &net->params[i]->sig, t->slots + t->slot_offsets[i]);

    // Overlapped buckets need finished gradients in the net's slab as
    // backward goes: one local device, and an engine with something to
    // overlap.
    if (!t->opts.adasum && n_local == 1 && ct_comm_get_kind(t->comm) == CT_COMM_MPI && net->n_params > 0) {
        bucketer *b = &t->bk;
        b->active = true;
        b->uses = ct_calloc((size_t)net->n_params, sizeof *b->uses);
        b->uses_left = ct_calloc((size_t)net->n_params, sizeof *b->uses_left);
        b->ready = ct_calloc((size_t)net->n_params, sizeof *b->ready);
        b->bucket_floats = t->opts.bucket_bytes / sizeof(float);
        if (b->bucket_floats == 0) b->bucket_floats = 1;
        count_uses(net, net->root, b->uses);
        t->replicas[0].ctx.on_weight_grads = on_weight_grads;
        t->replicas[0].ctx.on_weight_grads_user = t;
    }
    if (net->n_state) {
        st = ct_device_alloc(dev, net->n_state * sizeof(float), "state before the step", (void **)&t->state_before,
                             err);
        if (st != CT_OK) goto fail;
    }
    if (t->opts.adasum && ct_comm_size(t->comm) > 1) {
        t->gather_floats = (size_t)ct_comm_size(t->comm) * n_local * net->n_weights;
        st = ct_device_alloc(dev, t->gather_floats * sizeof(float), "Adasum gather buffer", (void **)&t->gather, err);
        if (st != CT_OK) goto fail;
    }
    *out = t;
    return CT_OK;
fail:
    ct_trainer_free(t);
    return st;
}

void ct_trainer_free(ct_trainer *t) {
    if (!t) return;
    size_t wbytes = t->net.n_weights * sizeof(float);
    for (int d = 0; d < t->opts.n_devices; d++) {
        replica *r = &t->replicas[d];
        if (d > 0) ct_device_free(t->dev, r->grads, wbytes);
        if (d > 0 && r->state != t->net.state) ct_free(r->state);
        ct_ctx_free(&r->ctx);
        ct_arena_free(&r->arena);
    }
    ct_free(t->replicas);
    ct_device_free(t->dev, t->gather, t->gather_floats * sizeof(float));
    ct_device_free(t->dev, t->slots, t->n_slot_floats * sizeof(float));
    ct_device_free(t->dev, t->state_before, t->net.n_state * sizeof(float));
    ct_free(t->slot_offsets);
    ct_free(t->frozen);
    ct_free(t->ranges);
    ct_free(t->bk.uses);
    ct_free(t->bk.uses_left);
    ct_free(t->bk.ready);
    ct_free(t->bk.plan);
    ct_net_free(&t->net);
    ct_layer_free(t->model);
    ct_optimizer_free(t->opt);
    ct_comm_free(t->own_comm);
    ct_free(t);
}

// A value for a message: NaN without its sign bit, which printf shows
// ("-nan") though it means nothing.
static double shown(double v) { return isnan(v) ? fabs(v) : v; }

// ---- one step ------------------------------------------------------------------

// sum x^2 over n floats, accumulated in double in a fixed order.
static double sum_squares(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

ct_status ct_train_check_batch(const char *who, const ct_net *net, const ct_tensor *batch, int n_local,
                               ct_error *err) {
    for (int i = 0; i < net->n_in; i++) {
        const ct_tensor *b = &batch[i], *s = &net->in_sigs[i];
        char a[CT_SIG_STR_MAX], c[CT_SIG_STR_MAX];
        if (b->dtype != s->dtype || b->ndim != s->ndim)
            return ct_error_set(err, CT_ERR_SHAPE, "%s: batch item %d is %s, the trainer was built for %s per device",
                                who, i, ct_tensor_sig_str(b, a, sizeof a), ct_tensor_sig_str(s, c, sizeof c));
        if (b->shape[0] % n_local != 0 || b->shape[0] != batch[0].shape[0])
            return ct_error_set(err, CT_ERR_SHAPE,
                                "%s: batch item %d %s: its batch size %lld does not split evenly over %d local devices",
                                who, i, ct_tensor_sig_str(b, a, sizeof a), (long long)b->shape[0], n_local);
    }
    return CT_OK;
}

static void replica_forward(ct_trainer *t, int d, const ct_tensor *batch, ct_key key) {
    replica *r = &t->replicas[d];
    const ct_net *net = &t->net;
    int n_local = t->opts.n_devices;
    for (int i = 0; i < net->n_in; i++) r->shard[i] = ct_tensor_split_rows(&batch[i], n_local, d);
    memset(r->grads, 0, net->n_weights * sizeof(float));
    r->ctx.tape_len = 0;
    r->ctx.loss_weight = -1;  // "not said"
    r->status = ct_layer_forward(net->root, &r->ctx, r->shard, &r->loss_out, key, &r->err);
    // A loss layer that does not say what it averaged over counts as one.
    r->weight = r->ctx.loss_weight >= 0 ? r->ctx.loss_weight : 1.0;
}

static void replica_backward(ct_trainer *t, int d, ct_key key) {
    replica *r = &t->replicas[d];
    ct_tensor grad_out = ct_tensor_sig(&r->loss_out), grad_in[CT_LAYER_MAX_IO];
    grad_out.data = &r->seed;
    r->status = ct_layer_backward(t->net.root, &r->ctx, &grad_out, grad_in, key, &r->err);
    if (r->status == CT_OK) CT_ASSERT(r->ctx.tape_len == 0);  // every push was popped
}

// The first failing replica's error, or CT_OK.
static ct_status replicas_status(ct_trainer *t, ct_error *err) {
    for (int d = 0; d < t->opts.n_devices; d++) {
        replica *r = &t->replicas[d];
        if (r->status != CT_OK) {
            if (err) *err = r->err;
            if (t->n_global > 1) ct_error_prefix(err, "device %d", t->first_global + d);
            return r->status;
        }
    }
    return CT_OK;
}

// Sums the replicas' gradients into replica 0's (the net's) in device order.
static void reduce_local(ct_trainer *t) {
    int n_local = t->opts.n_devices;
    float *dst = t->net.grads;
    int64_t n = (int64_t)t->net.n_weights;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        float s = dst[i];
        for (int d = 1; d < n_local; d++) s += t->replicas[d].grads[i];
        dst[i] = s;
    }
}

// Adasum over every device of every process, in global device order.
static ct_status combine_adasum(ct_trainer *t, ct_error *err) {
    float *local[CT_MAX_LOCAL_DEVICES];
    for (int d = 0; d < t->opts.n_devices; d++) local[d] = t->replicas[d].grads;
    return ct_adasum_devices(t->comm, local, t->opts.n_devices, t->net.n_weights, t->ranges, t->net.n_params,
                             t->gather, t->net.grads, err);
}

// The mean of the gradients over all devices, into the net's slab.
static ct_status combine_mean(ct_trainer *t, ct_error *err) {
    ct_net *net = &t->net;
    if (t->opts.n_devices > 1) reduce_local(t);
    if (t->bk.active) {
        bucket_start(t, 0, t->bk.sent);  // what is left, down to the bottom
        ct_status st = ct_comm_allreduce_wait(t->comm, t->bk.status == CT_OK ? err : NULL);
        if (t->bk.status != CT_OK) {
            if (err) *err = t->bk.err;
            return t->bk.status;
        }
        CT_TRY(st);
        t->bk.planned = true;
    } else {
        CT_TRY(ct_comm_allreduce_f32(t->comm, net->grads, net->n_weights, err));
    }
    if (t->n_global > 1) {
        float inv = 1.0f / (float)t->n_global;
        for (size_t i = 0; i < net->n_weights; i++) net->grads[i] *= inv;
    }
    return CT_OK;
}

// Forward on every replica (threads when there are several; kernels then
// run single-threaded inside each).
static void forward_all(ct_trainer *t, const ct_tensor *batch, const ct_key *keys) {
    int n_local = t->opts.n_devices;
    // The other replicas start from device 0's state (copied before the
    // threads start: device 0's forward writes it).
    for (int d = 1; d < n_local && t->net.n_state; d++)
        memcpy(t->replicas[d].state, t->net.state, t->net.n_state * sizeof(float));
    if (n_local == 1) replica_forward(t, 0, batch, keys[0]);
    else {
#pragma omp parallel for num_threads(n_local) schedule(static, 1)
        for (int d = 0; d < n_local; d++) replica_forward(t, d, batch, keys[d]);
    }
}

static void backward_all(ct_trainer *t, const ct_key *keys) {
    int n_local = t->opts.n_devices;
    if (n_local == 1) replica_backward(t, 0, keys[0]);
    else {
#pragma omp parallel for num_threads(n_local) schedule(static, 1)
        for (int d = 0; d < n_local; d++) replica_backward(t, d, keys[d]);
    }
}

// After a pass of the checking re-run: the first replica, in device order,
// whose pass failed, described into found (its layer, or why the re-run
// itself failed). False if every replica finished.
static bool first_finding(const ct_trainer *t, ct_error *found) {
    for (int d = 0; d < t->opts.n_devices; d++) {
        const replica *r = &t->replicas[d];
        if (r->status == CT_OK) continue;
        char dev[32] = "";
        if (t->n_global > 1) snprintf(dev, sizeof dev, " (device %d)", t->first_global + d);
        *found = r->err;
        ct_error_prefix(found, "%s%s", r->status == CT_ERR_NONFINITE ? "first non-finite value" : "the checking re-run failed",
                        dev);
        return true;
    }
    return false;
}

// The step went non-finite (its loss, or, with grads, its combined
// gradient): nothing was updated; the state goes back to what the step
// found, and the step runs again on the same batch, keys and state in
// anomaly mode (ct_ctx.check_finite) to find the first layer whose output
// or gradient went non-finite, forward first, then backward. Local only (no
// collectives): every process decided alike from combined values, and each
// names what its own devices found. Weights, slots and state are left as
// before the step.
static ct_status nonfinite_step(ct_trainer *t, const ct_tensor *batch, const ct_key *keys, bool grads, double value,
                                ct_error *err) {
    ct_net *net = &t->net;
    int n_local = t->opts.n_devices;
    ct_error found;
    ct_error_set(&found, CT_ERR_NONFINITE, "every layer's outputs and gradients on this process's devices are finite: the "
                                  "non-finite value came from combining them (an overflow in the sum over "
                                  "devices) or from another process's devices");
    if (net->n_state) memcpy(net->state, t->state_before, net->n_state * sizeof(float));
    // A NaN in the data is no layer's doing.
    bool bad_batch = false;
    for (int i = 0; i < net->n_in && !bad_batch; i++) {
        const ct_tensor *b = &batch[i];
        if (b->dtype != CT_DTYPE_F32) continue;
        int64_t n = ct_tensor_numel(b);
        for (int64_t k = 0; k < n; k++)
            if (!isfinite(ct_f32(b)[k])) {
                ct_error_set(&found, CT_ERR_NONFINITE, "batch item %d is %g at element %lld", i,
                             shown(ct_f32(b)[k]), (long long)k);
                bad_batch = true;
                break;
            }
    }
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
        if (!first_finding(t, &found) && grads) {
            backward_all(t, keys);
            first_finding(t, &found);
        }
    }
    for (int d = 0; d < n_local; d++) {
        t->replicas[d].ctx.check_finite = false;
        t->replicas[d].ctx.on_weight_grads = on_grads;
    }
    if (net->n_state) memcpy(net->state, t->state_before, net->n_state * sizeof(float));
    if (grads)
        return ct_error_set(err, CT_ERR_NONFINITE, "non-finite gradient (global L2 norm %g): %s", shown(sqrt(value)), found.msg);
    return ct_error_set(err, CT_ERR_NONFINITE, "non-finite loss (%g): %s", shown(value), found.msg);
}

ct_status ct_trainer_one_step(ct_trainer *t, const ct_tensor *batch, ct_key key, int64_t step, float learning_rate,
                              ct_step_stats *stats, ct_error *err) {
    ct_net *net = &t->net;
    int n_local = t->opts.n_devices;
    CT_TRY(ct_train_check_batch("trainer", net, batch, n_local, err));
    ct_key keys[CT_MAX_LOCAL_DEVICES];
    for (int d = 0; d < n_local; d++) keys[d] = t->n_global > 1 ? ct_key_split(key, (uint32_t)(t->first_global + d)) : key;
    // A non-finite step puts the state back (layers write it in forward).
    if (net->n_state) memcpy(t->state_before, net->state, net->n_state * sizeof(float));

    forward_all(t, batch, keys);
    ct_status st = replicas_status(t, err);

    // The global weight W and loss, then each replica's backward seed.
    double sums[2] = {0, 0};  // sum of W_d, sum of L_d * W_d
    for (int d = 0; d < n_local && st == CT_OK; d++) {
        replica *r = &t->replicas[d];
        sums[0] += r->weight;
        sums[1] += (double)*ct_f32(&r->loss_out) * r->weight;
    }
    // Every process takes part in the collectives, even one that failed, so
    // a failure cannot leave the others waiting: it sends a NaN.
    if (st != CT_OK) sums[0] = NAN;
    ct_status cst = ct_comm_allreduce_f64(t->comm, sums, 2, st == CT_OK ? err : NULL);
    if (st == CT_OK && cst != CT_OK) st = cst;
    if (st == CT_OK && !(sums[0] > 0))
        st = ct_error_set(err, CT_ERR_STATE,
                          "trainer: a replica failed or the loss weights sum to %g over all devices", sums[0]);
    if (st != CT_OK) goto done;
    // The loss over every device of every process: each process stops here
    // alike, before any backward or collective of gradients.
    if (!isfinite(sums[1] / sums[0])) {
        st = nonfinite_step(t, batch, keys, false, sums[1] / sums[0], err);
        goto done;
    }
    for (int d = 0; d < n_local; d++)
        t->replicas[d].seed = (float)((double)t->n_global * t->replicas[d].weight / sums[0]);

    if (t->bk.active) bucketer_reset(t);
    backward_all(t, keys);
    // Combine the gradients over all devices: the mean, or Adasum. After a
    // failure here, with other processes, this process still takes part in
    // the combine (with whatever gradients it has), then every process
    // learns of the failure before any updates.
    ct_status failed = replicas_status(t, err);
    bool many_processes = ct_comm_size(t->comm) > 1;
    if (failed == CT_OK) st = t->opts.adasum ? combine_adasum(t, err) : combine_mean(t, err);
    else if (!many_processes) st = failed;
    else if (!t->bk.active) st = t->opts.adasum ? combine_adasum(t, NULL) : combine_mean(t, NULL);
    else if (t->bk.planned) {
        // Start the buckets the others start, then wait for them all.
        for (int i = t->bk.n_started; i < t->bk.n_plan; i++)
            bucket_start(t, t->bk.plan[i].offset, t->bk.plan[i].offset + t->bk.plan[i].length);
        st = ct_comm_allreduce_wait(t->comm, NULL);
    } else {
        st = failed;  // the first step: no plan of the buckets yet; the others stop at the comm's deadline
    }
    if (st == CT_OK && many_processes)
        st = ct_train_agree_on_failure(t->comm, failed, "trainer", "before the update", err);
    if (st == CT_OK) st = failed;
    if (st != CT_OK) goto done;

    for (int i = 0; i < net->n_params; i++)
        if (t->frozen[i]) memset(net->grads + t->ranges[i].offset, 0, t->ranges[i].length * sizeof(float));
    double g2 = sum_squares(net->grads, net->n_weights);
    // The combined gradient is the same on every process, so all stop here
    // alike; a non-finite value makes g2 non-finite (finite floats cannot
    // overflow a double sum of squares), so a healthy step checks nothing
    // more.
    if (!isfinite(g2)) {
        st = nonfinite_step(t, batch, keys, true, g2, err);
        goto done;
    }
    double w2 = sum_squares(net->weights, net->n_weights);
    if (t->opts.clip_grad_norm > 0) {
        float factor = ct_clip_factor((float)sqrt(g2), t->opts.clip_grad_norm);
        if (factor != 1.0f)
            for (size_t i = 0; i < net->n_weights; i++) net->grads[i] *= factor;
    }
    for (int i = 0; i < net->n_params; i++) {
        const ct_param *p = net->params[i];
        if (t->frozen[i]) continue;
        ct_optimizer_update(t->opt, step, learning_rate, &p->sig, net->weights + p->offset, net->grads + p->offset,
                            t->slots + t->slot_offsets[i]);
    }
    if (stats) {
        stats->loss = (float)(sums[1] / sums[0]);
        stats->gradients_l2 = (float)sqrt(g2);
        stats->weights_l2 = (float)sqrt(w2);
    }
done:
    for (int d = 0; d < n_local; d++) ct_arena_reset(&t->replicas[d].arena);
    return st;
}

const ct_net *ct_trainer_net(const ct_trainer *t) { return &t->net; }
ct_layer *ct_trainer_model(const ct_trainer *t) { return t->model; }
int ct_trainer_local_devices(const ct_trainer *t) { return t->opts.n_devices; }
int ct_trainer_global_devices(const ct_trainer *t) { return t->n_global; }

float *ct_trainer_slots(const ct_trainer *t, size_t *n_floats) {
    if (n_floats) *n_floats = t->n_slot_floats;
    return t->slots;
}

void ct_trainer_param_slots(const ct_trainer *t, int i, size_t *offset, size_t *n_floats) {
    CT_ASSERT(i >= 0 && i < t->net.n_params);
    *offset = t->slot_offsets[i];
    *n_floats = t->slot_offsets[i + 1] - t->slot_offsets[i];
}

bool ct_trainer_param_frozen(const ct_trainer *t, int i) {
    CT_ASSERT(i >= 0 && i < t->net.n_params);
    return t->frozen[i];
}

ct_optimizer *ct_trainer_optimizer(const ct_trainer *t) { return t->opt; }

size_t ct_trainer_arena_bytes(const ct_trainer *t) {
    size_t n = 0;
    for (int d = 0; d < t->opts.n_devices; d++) n += ct_arena_capacity(&t->replicas[d].arena);
    return n;
}
