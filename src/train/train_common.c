// What both trainers share (see train_internal.h), and the ct_trainer calls
// that do not depend on which step runs.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/train/checkpoint.h"
#include "kernels/cpu/optim.h"
#include "train/train_internal.h"

ct_trainer_options ct_trainer_default_options(void) {
    return (ct_trainer_options){.n_devices = 1,
                                .bucket_bytes = (size_t)4 << 20,
                                .reversible = {.prefetch = true, .clip_mode = CT_CLIP_GLOBAL, .log_every = 100}};
}

ct_trainer_options ct_reversible_default_options(void) {
    ct_trainer_options o = ct_trainer_default_options();
    o.memory_efficient = true;
    return o;
}

static bool options_frozen(const ct_trainer_options *o, const char *name) {
    for (int i = 0; i < o->n_frozen; i++)
        if (strncmp(name, o->frozen[i], strlen(o->frozen[i])) == 0) return true;
    return false;
}

ct_status ct_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs, int n_batch,
                         ct_optimizer *opt, ct_key init_key, ct_device *dev, const ct_trainer_options *opts,
                         ct_error *err) {
    if (opts && opts->memory_efficient)
        return ct_reversible_trainer_new(out, model, loss, batch_sigs, n_batch, opt, init_key, dev, opts, err);
    return ct_standard_trainer_new(out, model, loss, batch_sigs, n_batch, opt, init_key, dev, opts, err);
}

void ct_trainer_free(ct_trainer *t) {
    if (t) t->vt->free(t);
}

ct_status ct_trainer_one_step(ct_trainer *t, const ct_tensor *batch, ct_key key, int64_t step, float learning_rate,
                              ct_step_stats *stats, ct_error *err) {
    if (step < 0)
        return ct_error_set(err, CT_ERR_ARG, "ct_trainer_one_step: step %lld is negative (the optimizers' bias "
                            "corrections use step + 1, which must be at least 1)", (long long)step);
    if (!t->opts.profile) return t->vt->one_step(t, batch, key, step, learning_rate, stats, err);
    double start = ct_profile_step_begin(t->opts.profile);
    ct_status st = t->vt->one_step(t, batch, key, step, learning_rate, stats, err);
    ct_profile_step_end(t->opts.profile, start);
    return st;
}

// ---- construction ----------------------------------------------------------------

// sigs[i]: what one of n_local devices sees of batch_sigs[i] (axis 0 divided).
static ct_status device_sigs(const char *who, const ct_tensor *batch_sigs, int n_batch, int n_local, ct_tensor *sigs,
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

// opt's slot slab for t's weights, into s: each weight's slots in slab
// order, frozen weights (t->frozen) none, on t->slab_dev (counted there).
// On failure s holds what was made (the offsets; slots NULL) for the caller
// to free.
static ct_status alloc_slots(ct_trainer *t, ct_optimizer *opt, ct_trainer_opt_state *s, ct_error *err) {
    const ct_net *net = &t->net;
    *s = (ct_trainer_opt_state){.opt = opt};
    s->slot_offsets = ct_calloc((size_t)net->n_params + 1, sizeof *s->slot_offsets);
    for (int i = 0; i < net->n_params; i++) {
        s->slot_offsets[i] = s->n_slot_floats;
        if (!t->frozen[i]) s->n_slot_floats += ct_optimizer_slot_floats(opt, &net->params[i]->sig);
    }
    s->slot_offsets[net->n_params] = s->n_slot_floats;
    CT_TRY(ct_device_alloc(t->slab_dev, s->n_slot_floats * sizeof(float), "optimizer slots", (void **)&s->slots, err));
    for (int i = 0; i < net->n_params; i++)
        if (!t->frozen[i]) ct_optimizer_init_slots(opt, &net->params[i]->sig, s->slots + s->slot_offsets[i]);
    return CT_OK;
}

// The trainer's own slot slab (t->opt's), after which weights are frozen.
static ct_status layout_slots(ct_trainer *t, ct_error *err) {
    const ct_net *net = &t->net;
    t->frozen = ct_calloc((size_t)net->n_params + 1, sizeof *t->frozen);
    t->ranges = ct_calloc((size_t)net->n_params + 1, sizeof *t->ranges);
    for (int i = 0; i < net->n_params; i++) {
        t->frozen[i] = options_frozen(&t->opts, net->params[i]->full_name);
        t->ranges[i] = (ct_range){net->params[i]->offset, (size_t)ct_tensor_numel(&net->params[i]->sig)};
    }
    ct_trainer_opt_state own;
    ct_status st = alloc_slots(t, t->opt, &own, err);
    // Even on failure: ct_train_base_free frees what was made.
    t->slots = own.slots;
    t->n_slot_floats = own.n_slot_floats;
    t->slot_offsets = own.slot_offsets;
    return st;
}

// Every process must build the same trainer: a process with other weights
// (another model) would send gradient buckets of other sizes (MPI then
// corrupts memory), as would one with other bucket bytes, or one that
// combines by Adasum or runs the memory-efficient trainer (other
// collectives) where the others do not; one with another batch, optimizer,
// initial key, clipping or frozen weights would train on other rows from
// other weights, or update them otherwise, silently. Each compares its shape
// with the chief's, and all learn whether any differs.
enum { N_SAME = 13 };
static ct_status same_everywhere(ct_trainer *t, ct_key init_key, int n_batch, ct_error *err) {
    if (ct_comm_size(t->comm) <= 1) return CT_OK;
    uint64_t frozen_floats = 0;
    for (int i = 0; i < t->net.n_params; i++)
        if (t->frozen[i]) frozen_floats += t->ranges[i].length;
    uint32_t clip_bits;
    memcpy(&clip_bits, &t->opts.clip_grad_norm, sizeof clip_bits);
    const ct_trainer_options *o = &t->opts;
    uint64_t mine[N_SAME] = {t->net.n_weights, t->net.n_params, t->n_slot_floats, (uint64_t)t->n_local,
                             (uint64_t)n_batch, (uint64_t)t->device_rows, (uint64_t)init_key.w[0] << 32 | init_key.w[1],
                             o->memory_efficient, o->adasum, o->bucket_bytes,
                             clip_bits, o->memory_efficient ? (uint64_t)o->reversible.clip_mode : 0, frozen_floats};
    uint64_t chief[N_SAME];
    memcpy(chief, mine, sizeof chief);
    CT_TRY(ct_comm_broadcast(t->comm, chief, sizeof chief, 0, err));
    static const char *what[N_SAME] = {"weights", "parameters", "optimizer slot floats", "local devices",
                                       "batch items", "rows per device", "initial key (train.random_seed)",
                                       "memory-efficient trainer", "Adasum", "gradient bucket bytes",
                                       "clip_grad_norm (its float bits)", "reversible.clip_mode",
                                       "frozen weight floats"};
    int bad = -1;
    for (int i = 0; i < N_SAME && bad < 0; i++)
        if (mine[i] != chief[i]) bad = i;
    double n_bad = bad >= 0;
    CT_TRY(ct_comm_allreduce_f64(t->comm, &n_bad, 1, err));
    if (bad >= 0)
        return ct_error_set(err, CT_ERR_ARG,
                            "%s: process %d builds another trainer than process 0 (%s: %llu here, %llu on process 0): "
                            "every process must run the same config",
                            t->vt->who, ct_comm_rank(t->comm), what[bad], (unsigned long long)mine[bad],
                            (unsigned long long)chief[bad]);
    if (n_bad > 0)
        return ct_error_set(err, CT_ERR_ARG,
                            "%s: another process builds another trainer than process 0 (its error is in its output): "
                            "every process must run the same config", t->vt->who);
    return CT_OK;
}

ct_status ct_train_base_init(ct_trainer *t, const ct_trainer_vt *vt, ct_layer *model, ct_layer *loss,
                             const ct_tensor *batch_sigs, int n_batch, ct_optimizer *opt, ct_key init_key,
                             ct_device *dev, ct_device *slab_dev, const ct_trainer_options *opts, ct_error *err) {
    t->vt = vt;
    t->opt = opt;
    t->dev = dev;
    t->slab_dev = slab_dev;
    t->model = ct_layer_ref(model);
    t->opts = opts ? *opts : ct_trainer_default_options();
    t->n_local = t->opts.n_devices;
    if (t->n_local < 1 || t->n_local > CT_MAX_LOCAL_DEVICES) {
        t->n_local = t->opts.n_devices = 1;
        return ct_error_set(err, CT_ERR_ARG, "%s: n_devices is %d, must be 1 to %d", vt->who,
                            opts ? opts->n_devices : 1, CT_MAX_LOCAL_DEVICES);
    }
    // Negative or NaN would skip clipping in one trainer and flip the
    // gradients' sign in ct_clip_grad_norm: refused in both.
    if (!(t->opts.clip_grad_norm >= 0.0f))
        return ct_error_set(err, CT_ERR_ARG, "%s: clip_grad_norm is %g, must be >= 0 (0: no clipping)", vt->who,
                            (double)t->opts.clip_grad_norm);
    t->comm = t->opts.comm ? t->opts.comm : (t->own_comm = ct_comm_single_new());
    t->n_global = t->n_local * ct_comm_size(t->comm);
    t->first_global = t->n_local * ct_comm_rank(t->comm);

    // The net sees one device's share of the batch.
    ct_tensor sigs[CT_LAYER_MAX_IO];
    CT_TRY(device_sigs(vt->who, batch_sigs, n_batch, t->n_local, sigs, err));
    t->device_rows = n_batch > 0 ? sigs[0].shape[0] : 0;
    // Unnamed, so the model's weights are named as in a net of their own.
    ct_layer *root = ct_layer_rename(ct_serial(CT_LAYERS(ct_layer_ref(model), ct_layer_ref(loss))), "");
    ct_status st = ct_net_init(&t->net, root, sigs, n_batch, init_key, slab_dev, err);
    ct_layer_free(root);  // the net holds its own reference
    CT_TRY(st);
    if (t->net.n_out != 1 || t->net.out_sigs[0].ndim != 0 || t->net.out_sigs[0].dtype != CT_DTYPE_F32)
        return ct_error_set(err, CT_ERR_SHAPE, "%s: the loss layer %s must leave one f32 scalar on the stack", vt->who,
                            loss->name);
    CT_TRY(ct_chunked_loss_init(t, err));
    CT_TRY(layout_slots(t, err));
    return same_everywhere(t, init_key, n_batch, err);
}

void ct_train_dev_init(ct_trainer *t, int d, ct_train_dev *dev, ct_arena *arena, ct_ctx *ctx) {
    ct_arena_init(arena, t->dev);
    ct_ctx_init(ctx, arena);
    ctx->first_row = (int64_t)(t->first_global + d) * t->device_rows;
    ctx->profile = d == 0 ? t->opts.profile : NULL;  // the devices run alike: one is timed
    dev->arena = arena;
    t->devs[d] = dev;
}

void ct_train_base_free(ct_trainer *t) {
    ct_device_free(t->slab_dev, t->slots, t->n_slot_floats * sizeof(float));
    ct_free(t->slot_offsets);
    ct_free(t->frozen);
    ct_free(t->ranges);
    if (t->eval_ready) {
        ct_ctx_free(&t->eval_ctx);
        ct_arena_free(&t->eval_arena);
    }
    ct_chunked_loss_free(&t->chunked);
    ct_net_free(&t->net);
    ct_layer_free(t->model);
    ct_optimizer_free(t->opt);
    ct_comm_free(t->own_comm);
}

// ---- a step's shared parts ---------------------------------------------------------

ct_status ct_train_local_rows(const ct_batch *global, int rank, int n_proc, ct_tensor *out, ct_error *err) {
    for (int i = 0; i < global->n; i++) {
        ct_tensor t = global->t[i];
        if (t.ndim < 1 || t.shape[0] % n_proc != 0) {
            char s[CT_SIG_STR_MAX];
            return ct_error_set(err, CT_ERR_SHAPE, "loop: batch item %d %s does not split over %d processes", i,
                                ct_tensor_sig_str(&t, s, sizeof s), n_proc);
        }
        out[i] = ct_tensor_split_rows(&t, n_proc, rank);
    }
    return CT_OK;
}

ct_status ct_train_check_batch(const ct_trainer *t, const ct_tensor *batch, ct_error *err) {
    const ct_net *net = &t->net;
    for (int i = 0; i < net->n_in; i++) {
        const ct_tensor *b = &batch[i], *s = &net->in_sigs[i];
        char a[CT_SIG_STR_MAX], c[CT_SIG_STR_MAX];
        if (b->dtype != s->dtype || b->ndim != s->ndim)
            return ct_error_set(err, CT_ERR_SHAPE, "%s: batch item %d is %s, the trainer was built for %s per device",
                                t->vt->who, i, ct_tensor_sig_str(b, a, sizeof a), ct_tensor_sig_str(s, c, sizeof c));
        if (b->shape[0] != batch[0].shape[0])
            return ct_error_set(err, CT_ERR_SHAPE, "%s: batch item %d %s has %lld rows, item 0 has %lld (one batch size)",
                                t->vt->who, i, ct_tensor_sig_str(b, a, sizeof a), (long long)b->shape[0],
                                (long long)batch[0].shape[0]);
        if (b->shape[0] % t->n_local != 0)
            return ct_error_set(err, CT_ERR_SHAPE,
                                "%s: batch item %d %s: its batch size %lld does not split evenly over %d local devices",
                                t->vt->who, i, ct_tensor_sig_str(b, a, sizeof a), (long long)b->shape[0], t->n_local);
    }
    return CT_OK;
}

ct_status ct_train_global_loss(ct_trainer *t, ct_status failed, double *mean, ct_error *err) {
    ct_status st = failed;
    double sums[2] = {0, 0};  // sum of W_d, sum of L_d * W_d
    for (int d = 0; d < t->n_local && st == CT_OK; d++) {
        sums[0] += t->devs[d]->weight;
        sums[1] += (double)*ct_f32(&t->devs[d]->loss_out) * t->devs[d]->weight;
    }
    if (st != CT_OK) sums[0] = NAN;
    ct_status cst = ct_comm_allreduce_f64(t->comm, sums, 2, st == CT_OK ? err : NULL);
    if (st == CT_OK && cst != CT_OK) st = cst;
    if (st == CT_OK && !(sums[0] > 0))
        st = ct_error_set(err, CT_ERR_STATE, "%s: a device failed or the loss weights sum to %g over all devices",
                          t->vt->who, sums[0]);
    CT_TRY(st);
    *mean = sums[1] / sums[0];
    for (int d = 0; d < t->n_local; d++) t->devs[d]->seed = (float)((double)t->n_global * t->devs[d]->weight / sums[0]);
    return CT_OK;
}

ct_status ct_train_devices_status(const ct_trainer *t, ct_error *err) {
    for (int d = 0; d < t->n_local; d++) {
        const ct_train_dev *v = t->devs[d];
        if (v->status != CT_OK) {
            if (err) *err = v->err;
            if (t->n_global > 1) ct_error_prefix(err, "device %d", t->first_global + d);
            return v->status;
        }
    }
    return CT_OK;
}

void ct_train_divide(const ct_trainer *t, float *g, size_t n) {
    if (t->n_global <= 1) return;
    // A division, as Trax's psum / n: times a rounded 1/3 is 1 ulp off for
    // about a third of the values.
    float count = (float)t->n_global;
    for (size_t i = 0; i < n; i++) g[i] /= count;
}

ct_status ct_train_mean(const ct_trainer *t, float *const *grads, size_t n, bool allreduce, ct_error *err) {
    float *dst = grads[0];
    if (t->n_local > 1) {
        int64_t m = (int64_t)n;
#pragma omp parallel for schedule(static) if (m > 65536)
        for (int64_t i = 0; i < m; i++) {
            float s = dst[i];
            for (int d = 1; d < t->n_local; d++) s += grads[d][i];
            dst[i] = s;
        }
    }
    if (!allreduce) return CT_OK;
    CT_TRY(ct_comm_allreduce_f32(t->comm, dst, n, err));
    ct_train_divide(t, dst, n);
    return CT_OK;
}

double ct_train_sum_squares(const float *x, size_t n) { return ct_sum_squares(x, (int64_t)n); }

double ct_train_drop_frozen(const ct_trainer *t, float *grad, size_t base, size_t n, int p_begin, int p_end) {
    for (int p = p_begin; p < p_end; p++)
        if (t->frozen[p]) memset(grad + (t->ranges[p].offset - base), 0, t->ranges[p].length * sizeof(float));
    return ct_train_sum_squares(grad, n);
}

void ct_train_clip(float *g, size_t n, double norm, float clip) {
    float factor = ct_clip_factor(norm, clip);
    if (factor != 1.0f)
        for (size_t i = 0; i < n; i++) g[i] *= factor;
}

ct_status ct_train_agree(ct_comm *comm, ct_status failed, ct_error *err, const char *fmt, ...) {
    double flag = failed != CT_OK ? 1.0 : 0.0;
    ct_status cst = ct_comm_allreduce_f64(comm, &flag, 1, failed == CT_OK ? err : NULL);
    if (failed != CT_OK) return failed;
    if (cst != CT_OK) return cst;
    if (flag == 0) return CT_OK;
    va_list ap;
    va_start(ap, fmt);
    ct_error_setv(err, CT_ERR_STATE, fmt, ap);
    va_end(ap);
    return CT_ERR_STATE;
}

ct_status ct_train_agree_on_failure(const ct_trainer *t, ct_status failed, const char *where, ct_error *err) {
    return ct_train_agree(t->comm, failed, err,
                          "%s: a device of another process failed (its error is in that process's output); stopped %s",
                          t->vt->who, where);
}

ct_key ct_train_step_key(ct_key loop_key, int64_t step) {
    ct_key k = ct_key_fold_in(ct_key_split(loop_key, 1), (uint32_t)step);
    uint32_t high = (uint32_t)((uint64_t)step >> 32);
    return high ? ct_key_fold_in(k, high) : k;
}

double ct_train_shown(double v) { return isnan(v) ? fabs(v) : v; }

bool ct_train_nonfinite_begin(const ct_tensor *batch, int n_batch, ct_error *found) {
    ct_error_set(found, CT_ERR_NONFINITE, "every layer's outputs and gradients on this process's devices are finite: "
                                          "the non-finite value came from combining them (an overflow in the sum over "
                                          "devices) or from another process's devices");
    for (int i = 0; i < n_batch; i++) {
        const ct_tensor *b = &batch[i];
        if (b->dtype != CT_DTYPE_F32) continue;
        int64_t n = ct_tensor_numel(b), k = 0;
        while (k < n && isfinite(ct_f32(b)[k])) k++;
        if (k < n) {  // a NaN in the data is no layer's doing
            ct_error_set(found, CT_ERR_NONFINITE, "batch item %d is %g at element %lld", i, ct_train_shown(ct_f32(b)[k]),
                         (long long)k);
            return true;
        }
    }
    return false;
}

bool ct_train_first_finding(const ct_trainer *t, ct_error *found) {
    for (int d = 0; d < t->n_local; d++) {
        const ct_train_dev *v = t->devs[d];
        if (v->status == CT_OK) continue;
        char dev[32] = "";
        if (t->n_global > 1) snprintf(dev, sizeof dev, " (device %d)", t->first_global + d);
        *found = v->err;
        ct_error_prefix(found, "%s%s", v->status == CT_ERR_NONFINITE ? "first non-finite value" : "the checking re-run failed",
                        dev);
        return true;
    }
    return false;
}

// ---- loss-only evaluation ----------------------------------------------------------

// Each local device's rows in turn on one eval-mode context, then the
// weighted mean over every device of every process. The state is put back.
ct_status ct_trainer_eval_loss(ct_trainer *t, const ct_tensor *batch, ct_key key, float *loss, ct_error *err) {
    const ct_net *net = &t->net;
    ct_status st = ct_train_check_batch(t, batch, err);
    // The first call is measured and the arena then reserved at its
    // high-water mark, as the evaluator's (evaluator.c: run_batch): on a
    // planned arena the stack walks give back each layer's activations.
    bool measure = !t->eval_ready && st == CT_OK;
    if (!t->eval_ready) {
        ct_arena_init(&t->eval_arena, t->dev);
        ct_ctx_init(&t->eval_ctx, &t->eval_arena);
        t->eval_ready = true;
    }
    if (measure) {
        st = ct_arena_measure_begin(&t->eval_arena, err);
        measure = st == CT_OK;  // measure_end only after a begin
    }
    float *state = net->n_state && st == CT_OK ? ct_malloc(net->n_state * sizeof(float)) : NULL;
    if (state) memcpy(state, net->state, net->n_state * sizeof(float));
    double sums[2] = {0, 0};  // sum of W_d, sum of L_d * W_d
    for (int d = 0; d < t->n_local && st == CT_OK; d++) {
        ct_tensor shard[CT_LAYER_MAX_IO], out;
        for (int i = 0; i < net->n_in; i++) shard[i] = ct_tensor_split_rows(&batch[i], t->n_local, d);
        // Each device from the same state, as the step's replicas.
        if (state && d > 0) memcpy(net->state, state, net->n_state * sizeof(float));
        ct_net_bind(net, &t->eval_ctx, false);
        // Rows numbered in this batch (evals take any batch size), not the
        // construction batch's device_rows: per-example draws (LSH's
        // rotations) are then those one device makes for the whole batch.
        t->eval_ctx.first_row = (int64_t)(t->first_global + d) * (net->n_in > 0 ? shard[0].shape[0] : 0);
        t->eval_ctx.loss_weight = -1;
        ct_key k = t->n_global > 1 ? ct_key_split(key, (uint32_t)(t->first_global + d)) : key;
        double w = 1.0;
        if (t->chunked.rows) {
            // As the step: the logits never exist at once here either.
            ct_tensor part_in[CT_LAYER_MAX_IO];
            st = ct_chunked_loss_net_forward(&t->chunked, &t->eval_ctx, shard, net->n_in, k, part_in, &out, &w, err);
        } else {
            st = ct_layer_forward(net->root, &t->eval_ctx, shard, &out, k, err);
            if (t->eval_ctx.loss_weight >= 0) w = t->eval_ctx.loss_weight;
        }
        if (st == CT_OK) {
            sums[0] += w;
            sums[1] += (double)*ct_f32(&out) * w;
        }
        ct_arena_reset(&t->eval_arena);
    }
    if (measure) {
        size_t high = ct_arena_measure_end(&t->eval_arena);
        if (st == CT_OK) st = ct_arena_reserve(&t->eval_arena, high, err);
    }
    if (state) memcpy(net->state, state, net->n_state * sizeof(float));
    ct_free(state);
    if (st != CT_OK) sums[0] = NAN;  // every process joins the sum, so none waits
    ct_status cst = ct_comm_allreduce_f64(t->comm, sums, 2, st == CT_OK ? err : NULL);
    CT_TRY(st);
    CT_TRY(cst);
    if (!(sums[0] > 0))
        return ct_error_set(err, CT_ERR_STATE, "%s: eval loss: a device failed or the loss weights sum to %g",
                            t->vt->who, sums[0]);
    *loss = (float)(sums[1] / sums[0]);
    return CT_OK;
}

// ---- other optimizers for the same weights ----------------------------------------

// Frees what s holds, without touching t's plan (t is read only for slots).
static void release_state(ct_trainer *t, ct_trainer_opt_state *s) {
    if (s->slots) ct_device_free(t->slab_dev, s->slots, s->n_slot_floats * sizeof(float));
    ct_free(s->slot_offsets);
    ct_optimizer_free(s->opt);
    memset(s, 0, sizeof *s);
}

ct_status ct_trainer_opt_state_new(ct_trainer *t, ct_optimizer *opt, ct_trainer_opt_state *out, ct_error *err) {
    memset(out, 0, sizeof *out);
    CT_ASSERT(opt != NULL);
    if (t->opts.memory_efficient) {
        ct_status st = ct_error_set(err, CT_ERR_ARG,
                                    "%s: a second optimizer for its weights (%s, e.g. a train task's own) needs the "
                                    "standard trainer: the memory-efficient one (ct_trainer_options.memory_efficient) "
                                    "stages each layer's slots at ranges fixed when it is built",
                                    t->vt->who, ct_optimizer_name(opt));
        ct_optimizer_free(opt);
        return st;
    }
    ct_status st = alloc_slots(t, opt, out, err);
    if (st != CT_OK) {
        ct_error_prefix(err, "%s: a second optimizer for its weights (%s)", t->vt->who, ct_optimizer_name(opt));
        release_state(t, out);
        return st;
    }
    // On the slab device, which is dev for the standard trainer: the plan
    // stays what dev holds.
    t->plan.slots += ct_train_padded(out->n_slot_floats * sizeof(float));
    t->plan.device_bytes += ct_train_padded(out->n_slot_floats * sizeof(float));
    return CT_OK;
}

void ct_trainer_opt_state_free(ct_trainer *t, ct_trainer_opt_state *s) {
    if (s->slots) {  // none (SGD, or only an optimizer): nothing of t's to touch, t may be NULL
        t->plan.slots -= ct_train_padded(s->n_slot_floats * sizeof(float));
        t->plan.device_bytes -= ct_train_padded(s->n_slot_floats * sizeof(float));
    }
    release_state(t, s);
}

void ct_trainer_swap_optimizer(ct_trainer *t, ct_trainer_opt_state *s) {
    // Every reader (the step's update, the accessors, the checkpoint
    // tensors) takes these four afresh; the memory-efficient trainer keeps
    // ranges of its own, and has no state to swap (ct_trainer_opt_state_new).
    CT_ASSERT(s->opt && !t->opts.memory_efficient);
    ct_trainer_opt_state mine = {t->opt, t->slots, t->n_slot_floats, t->slot_offsets};
    t->opt = s->opt;
    t->slots = s->slots;
    t->n_slot_floats = s->n_slot_floats;
    t->slot_offsets = s->slot_offsets;
    *s = mine;
}

// ---- weights, slots and state by name ----------------------------------------------

const ct_net *ct_trainer_net(const ct_trainer *t) { return &t->net; }
const float *ct_trainer_grads(const ct_trainer *t) { return t->grads; }
ct_optimizer *ct_trainer_optimizer(const ct_trainer *t) { return t->opt; }
int ct_trainer_global_devices(const ct_trainer *t) { return t->n_global; }
bool ct_trainer_memory_efficient(const ct_trainer *t) { return t->opts.memory_efficient; }
size_t ct_trainer_arena_bytes(const ct_trainer *t) {
    size_t n = 0;
    for (int d = 0; d < t->n_local; d++) n += ct_arena_capacity(t->devs[d]->arena);
    return n;
}

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

static int param_index(const ct_param *const *params, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!strcmp(params[i]->full_name, name)) return i;
    return -1;
}

ct_status ct_trainer_tensor(const ct_trainer *t, ct_trainer_part part, const char *name, ct_tensor *out,
                            ct_error *err) {
    const ct_net *net = &t->net;
    bool state = part == CT_PART_STATE;
    int i = state ? param_index((const ct_param *const *)net->state_params, net->n_state_params, name)
                  : param_index((const ct_param *const *)net->params, net->n_params, name);
    if (i < 0)
        return ct_error_set(err, CT_ERR_ARG, "%s: the model has no %s named '%s'", t->vt->who,
                            state ? "state tensor" : "weight", name);
    if (part == CT_PART_GRAD && !t->grads)
        return ct_error_set(err, CT_ERR_STATE, "%s: no gradient of '%s' kept (%s)", t->vt->who, name,
                            t->opts.memory_efficient ? "set reversible.keep_grads" : "no step taken yet");
    const ct_param *p = state ? net->state_params[i] : net->params[i];
    *out = p->sig;
    if (part == CT_PART_WEIGHT) out->data = net->weights + p->offset;
    else if (part == CT_PART_GRAD) out->data = (float *)t->grads + p->offset;
    else if (part == CT_PART_STATE) out->data = net->state + p->offset;
    else {
        size_t off, cnt;
        ct_trainer_param_slots(t, i, &off, &cnt);
        *out = ct_tensor_1d(CT_DTYPE_F32, (int64_t)cnt, t->slots + off);
    }
    return CT_OK;
}

// ---- save, restore and load ----------------------------------------------------------

// The weights and state of the net, named by their layer paths.
static ct_named_tensor *weight_tensors(const ct_net *net, int *n) {
    *n = net->n_params + net->n_state_params;
    ct_named_tensor *t = ct_calloc((size_t)*n + 1, sizeof *t);
    for (int i = 0; i < *n; i++) {
        bool w = i < net->n_params;
        const ct_param *p = w ? net->params[i] : net->state_params[i - net->n_params];
        t[i].name = p->full_name;
        t[i].tensor = p->sig;
        t[i].tensor.data = (w ? net->weights : net->state) + p->offset;
    }
    return t;
}

void ct_trainer_checkpoint_tensors(const ct_trainer *t, ct_named_tensor **weights, int *n_weights,
                                   ct_named_tensor **slots, int *n_slots) {
    const ct_net *net = &t->net;
    *weights = weight_tensors(net, n_weights);
    ct_named_tensor *s = ct_calloc((size_t)net->n_params + 1, sizeof *s);
    int n = 0;
    for (int i = 0; i < net->n_params; i++) {
        size_t off, cnt;
        ct_trainer_param_slots(t, i, &off, &cnt);
        if (cnt == 0) continue;
        s[n].name = net->params[i]->full_name;
        s[n++].tensor = ct_tensor_1d(CT_DTYPE_F32, (int64_t)cnt, t->slots + off);
    }
    *slots = s;
    *n_slots = n;
}

ct_status ct_net_load_checkpoint(const ct_net *net, const ct_checkpoint *c, ct_load_mode mode, ct_error *err) {
    int n;
    ct_named_tensor *wt = weight_tensors(net, &n);  // weights first, then state
    ct_tensor_request *reqs = ct_calloc((size_t)n + 1, sizeof *reqs);
    // A cache (LSH's buckets, sized for the rows of the net that wrote it)
    // found at another shape keeps its initial value: it is recomputed.
    for (int i = 0; i < n; i++)
        reqs[i] = (ct_tensor_request){.file = "weights.safetensors", .name = wt[i].name, .dest = wt[i].tensor,
                                      .cache = i >= net->n_params && net->state_params[i - net->n_params]->cache};
    ct_status st = ct_checkpoint_load(c, reqs, n, mode, err);
    ct_free(reqs);
    ct_free(wt);
    return st;
}

ct_status ct_trainer_load_checkpoint(ct_trainer *t, const ct_checkpoint *c, ct_load_mode mode, ct_error *err) {
    return ct_net_load_checkpoint(&t->net, c, mode, err);
}

// Checks every tensor of wt against the file (index[i]: its place there, or
// -1 when it is skipped by name); the first problem goes to err.
static ct_status match_file(const ct_safetensors *f, const ct_named_tensor *wt, int n, ct_load_mode mode, int *index,
                            int *matched, ct_error *err) {
    const char *path = ct_safetensors_path(f);
    *matched = 0;
    for (int i = 0; i < n; i++) {
        int k = index[i] = ct_safetensors_find(f, wt[i].name);
        ct_tensor have = k >= 0 ? ct_safetensors_tensor(f, k) : wt[i].tensor;
        bool same = k >= 0 && ct_tensor_same_sig(&have, &wt[i].tensor);
        if (same) {
            (*matched)++;
            continue;
        }
        index[i] = -1;
        if (mode == CT_LOAD_BY_NAME) continue;
        char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
        if (k < 0) return ct_error_set(err, CT_ERR_SHAPE, "%s: tensor '%s' is not in the file", path, wt[i].name);
        return ct_error_set(err, CT_ERR_SHAPE, "%s: tensor '%s' is %s in the file, the trainer's is %s", path,
                            wt[i].name, ct_tensor_sig_str(&have, a, sizeof a), ct_tensor_sig_str(&wt[i].tensor, b, sizeof b));
    }
    if (mode == CT_LOAD_EXACT && *matched != ct_safetensors_count(f))
        return ct_error_set(err, CT_ERR_SHAPE, "%s: holds %d tensors, the trainer has %d weights and state tensors",
                            path, ct_safetensors_count(f), n);
    if (n > 0 && *matched == 0)
        return ct_error_set(err, CT_ERR_SHAPE, "%s: none of the trainer's %d tensors is in the file", path, n);
    return CT_OK;
}

ct_status ct_trainer_load_safetensors(ct_trainer *t, const char *path, ct_load_mode mode, ct_error *err) {
    ct_safetensors *f;
    CT_TRY(ct_safetensors_open(&f, path, err));
    int n, matched;
    ct_named_tensor *wt = weight_tensors(&t->net, &n);
    int *index = ct_calloc((size_t)n + 1, sizeof *index);
    ct_status st = match_file(f, wt, n, mode, index, &matched, err);
    for (int i = 0; i < n && st == CT_OK; i++) {  // everything checked: now copy
        if (index[i] < 0) continue;
        ct_tensor have = ct_safetensors_tensor(f, index[i]);
        if (ct_tensor_nbytes(&have) > 0) memcpy(wt[i].tensor.data, have.data, ct_tensor_nbytes(&have));
    }
    ct_free(index);
    ct_free(wt);
    ct_safetensors_close(f);
    return st;
}

// ---- the memory plan -------------------------------------------------------------------

size_t ct_train_padded(size_t bytes) { return (bytes + 63) / 64 * 64; }

ct_status ct_train_plan_batch(const ct_tensor *sigs, int n, ct_tensor *out, ct_error *err) {
    for (int i = 0; i < n; i++) out[i].data = NULL;
    for (int i = 0; i < n; i++) {
        out[i] = ct_tensor_sig(&sigs[i]);
        size_t bytes = ct_tensor_nbytes(&out[i]);
        out[i].data = ct_calloc_checked(bytes ? bytes : 1, 1, err, "the planning pass's batch item %d", i);
        if (!out[i].data) {
            ct_train_plan_batch_free(out, i);
            return CT_ERR_MEMORY;
        }
        if (out[i].dtype == CT_DTYPE_F32)
            for (int64_t k = 0; k < ct_tensor_numel(&out[i]); k++) ct_f32(&out[i])[k] = 1.0f;
    }
    return CT_OK;
}

void ct_train_plan_batch_free(ct_tensor *batch, int n) {
    for (int i = 0; i < n; i++) {
        ct_free(batch[i].data);
        batch[i].data = NULL;
    }
}

ct_status ct_train_plan_arenas(ct_trainer *t, ct_arena *const *arenas, ct_error *err) {
    // Every measure ends first: the counted pages go before the blocks come.
    size_t high[CT_MAX_LOCAL_DEVICES];
    for (int d = 0; d < t->n_local; d++) high[d] = ct_arena_measure_end(arenas[d]);
    t->plan.activations = 0;
    for (int d = 0; d < t->n_local; d++) {
        CT_TRY(ct_arena_reserve(arenas[d], high[d], err));
        t->plan.activations += ct_arena_device_bytes(arenas[d]);
    }
    return CT_OK;
}

const ct_memory_plan *ct_trainer_memory_plan(const ct_trainer *t) { return &t->plan; }

char *ct_memory_plan_format(const ct_memory_plan *p, char *buf, size_t len) {
    const double mib = 1048576.0;
    int n = snprintf(buf, len,
                     "memory plan: weights %.1f MiB, gradients %.1f MiB, optimizer slots %.1f MiB, state %.1f MiB, "
                     "activations (arena) %.1f MiB",
                     (double)p->weights / mib, (double)p->grads / mib, (double)p->slots / mib, (double)p->state / mib,
                     (double)p->activations / mib);
    if (n < 0 || (size_t)n >= len) return buf;
    if (p->stack) n += snprintf(buf + n, len - (size_t)n, ", stack items %.1f MiB", (double)p->stack / mib);
    if (n < 0 || (size_t)n >= len) return buf;
    if (p->scratch) n += snprintf(buf + n, len - (size_t)n, ", Adasum gather %.1f MiB", (double)p->scratch / mib);
    if (n < 0 || (size_t)n >= len) return buf;
    n += snprintf(buf + n, len - (size_t)n, "; device total %.1f MiB", (double)p->device_bytes / mib);
    if (n < 0 || (size_t)n >= len) return buf;
    if (p->host_bytes) snprintf(buf + n, len - (size_t)n, "; host %.1f MiB", (double)p->host_bytes / mib);
    return buf;
}

// ---- leaves ----------------------------------------------------------------------------

ct_key ct_train_leaf_key(ct_key key, const ct_train_leaf *leaf) {
    for (int d = 0; d < leaf->depth; d++) key = ct_key_split(key, leaf->path[d]);
    return key;
}

ct_status ct_train_leaves_run(const ct_train_leaf *leaves, int n, ct_key key, ct_ctx *c, bool backward,
                              const ct_tensor *top, int depth, ct_tensor *res, int *res_depth, ct_error *err) {
    ct_tensor stack[2 * CT_LAYER_MAX_IO], outs[CT_LAYER_MAX_IO];
    CT_ASSERT(depth <= 2 * CT_LAYER_MAX_IO);
    memcpy(stack, top, (size_t)depth * sizeof *stack);
    for (int k = 0; k < n; k++) {
        const ct_train_leaf *leaf = &leaves[backward ? n - 1 - k : k];
        ct_layer *l = leaf->layer;
        int n_pop = backward ? l->n_out : l->n_in, n_push = backward ? l->n_in : l->n_out;
        CT_ASSERT(n_pop <= depth && depth - n_pop + n_push <= 2 * CT_LAYER_MAX_IO);
        CT_TRY(backward ? ct_layer_backward(l, c, stack, outs, ct_train_leaf_key(key, leaf), err)
                        : ct_layer_forward(l, c, stack, outs, ct_train_leaf_key(key, leaf), err));
        memmove(stack + n_push, stack + n_pop, (size_t)(depth - n_pop) * sizeof *stack);
        memcpy(stack, outs, (size_t)n_push * sizeof *stack);
        depth += n_push - n_pop;
    }
    CT_ASSERT(depth <= CT_LAYER_MAX_IO);
    memcpy(res, stack, (size_t)depth * sizeof *res);
    if (res_depth) *res_depth = depth;
    return CT_OK;
}

// ---- the chunked loss ------------------------------------------------------------------

// Layers that act on each row (the last axis) alone, so a chunk of rows
// gives those rows' outputs: recognised by type, and the weightless
// activations (ct_fn layers, type "Fn") by their built-in names.
static bool row_wise(const ct_layer *l) {
    static const char *const types[] = {"LayerNorm", "Dense", "Dropout"};
    static const char *const fns[] = {"Relu", "Gelu", "FastGelu", "Tanh", "Sigmoid", "LogSoftmax", "Softmax"};
    if (l->n_in != 1 || l->n_out != 1) return false;
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (strcmp(l->vt->type, types[i]) == 0) return true;
    if (strcmp(l->vt->type, "Fn") != 0) return false;
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
        if (strcmp(l->name, fns[i]) == 0) return true;
    return false;
}

// Losses whose value is a weighted mean over rows, sum(x_r w_r) / sum(w_r),
// reporting sum(w_r) (or the row count) in ct_ctx.loss_weight.
static bool row_mean_loss(const ct_layer *l) {
    return strcmp(l->vt->type, "WeightedCategoryCrossEntropy") == 0 || strcmp(l->vt->type, "CrossEntropyLoss") == 0;
}

void ct_chunked_loss_free(ct_chunked_loss *cl) {
    ct_free(cl->leaves);
    memset(cl, 0, sizeof *cl);
}

ct_status ct_chunked_loss_init(ct_trainer *t, ct_error *err) {
    ct_chunked_loss *cl = &t->chunked;
    int64_t rows = t->opts.loss_chunk_size;
    memset(cl, 0, sizeof *cl);
    if (rows == 0) return CT_OK;
    const char *who = t->vt->who;
    if (rows < 0)
        return ct_error_set(err, CT_ERR_ARG, "%s: loss_chunk_size is %lld, must be >= 0", who, (long long)rows);
    ct_layer *root = t->net.root, *model = root->sub[0], *loss = root->sub[1];
    CT_ASSERT(root->n_sub == 2);
    if (!row_mean_loss(loss))
        return ct_error_set(err, CT_ERR_ARG,
                            "%s: loss_chunk_size %lld: the loss %s (type %s) is not a mean over rows "
                            "(WeightedCategoryCrossEntropy or CrossEntropyLoss): set loss_chunk_size 0",
                            who, (long long)rows, loss->name, loss->vt->type);
    bool serial = strcmp(model->vt->type, "Serial") == 0;
    int n_model = serial ? model->n_sub : 1;
    cl->leaves = ct_calloc((size_t)n_model + 1, sizeof *cl->leaves);
    for (int i = 0; i < n_model; i++) {
        ct_train_leaf *leaf = &cl->leaves[i];
        leaf->layer = serial ? model->sub[i] : model;
        leaf->path[0] = 0;
        leaf->path[1] = (uint32_t)i;
        leaf->depth = serial ? 2 : 1;
    }
    cl->leaves[n_model] = (ct_train_leaf){.layer = loss, .depth = 1, .path = {1}};
    cl->n_leaves = n_model + 1;
    cl->first = n_model;
    while (cl->first > 0 && row_wise(cl->leaves[cl->first - 1].layer)) cl->first--;
    ct_status st = CT_OK;
    if (cl->first == n_model) {
        const ct_layer *last = cl->leaves[n_model - 1].layer;
        st = ct_error_set(err, CT_ERR_ARG,
                          "%s: loss_chunk_size %lld: the model %s ends with %s (type %s), not a layer that acts on "
                          "each row alone (LayerNorm, Dense, Dropout, Relu, Gelu, Tanh, Sigmoid, LogSoftmax, "
                          "Softmax): nothing to chunk; set loss_chunk_size 0",
                          who, (long long)rows, model->name, last->path, last->vt->type);
        ct_chunked_loss_free(cl);
        return st;
    }
    // The tail's input (..., D) and the loss's targets and weights must
    // have the same rows: the targets' shape is the input's without D.
    const ct_layer *head = cl->leaves[cl->first].layer;
    const ct_tensor *x = &head->in_sigs[0];
    cl->n_in = loss->n_in;
    char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim < 2)
        st = ct_error_set(err, CT_ERR_SHAPE, "%s: loss_chunk_size %lld: the tail's input (into %s) is %s, expected f32 "
                          "(..., D) rows", who, (long long)rows, head->path, ct_tensor_sig_str(x, a, sizeof a));
    for (int i = 1; i < loss->n_in && st == CT_OK; i++) {
        const ct_tensor *y = &loss->in_sigs[i];
        bool same = y->ndim == x->ndim - 1;
        for (int k = 0; same && k < y->ndim; k++) same = y->shape[k] == x->shape[k];
        if (!same)
            st = ct_error_set(err, CT_ERR_SHAPE,
                              "%s: loss_chunk_size %lld: the loss %s's input %d %s does not have the rows of the "
                              "tail's input %s (into %s)",
                              who, (long long)rows, loss->path, i, ct_tensor_sig_str(y, a, sizeof a),
                              ct_tensor_sig_str(x, b, sizeof b), head->path);
    }
    if (st != CT_OK) ct_chunked_loss_free(cl);
    else cl->rows = rows;
    return st;
}

// Rows [r0, r0 + n) of the part's input i (a view): the first as (n, D),
// the others (targets, weights) as (n).
static ct_tensor chunk_of(const ct_tensor *in, int i, int64_t r0, int64_t n) {
    int64_t d = i == 0 ? in->shape[in->ndim - 1] : 1;
    int64_t shape[2] = {n, d};
    char *data = (char *)in->data + (size_t)(r0 * d) * ct_dtype_size(in->dtype);
    return ct_tensor_make(in->dtype, i == 0 ? 2 : 1, shape, data);
}

static int64_t part_rows(const ct_tensor *in) { return ct_tensor_dims_product(in, 0, in->ndim - 1); }

// The key of chunk i of n: the layer's own for a single chunk.
static ct_key chunk_key(ct_key key, int64_t i, int64_t n) { return n == 1 ? key : ct_key_split(key, (uint32_t)i); }

// Runs the part's leaves on chunk i forward: its loss in *out, its weight in
// c->loss_weight. The tail's leaves get their keys split by chunk; the loss
// (no randomness) its own.
static ct_status chunk_forward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *in, ct_key key, int64_t i,
                               int64_t n_chunks, ct_tensor *out, ct_error *err) {
    int64_t rows = part_rows(&in[0]), r0 = i * cl->rows, n = rows - r0 < cl->rows ? rows - r0 : cl->rows;
    ct_tensor stack[CT_LAYER_MAX_IO];
    for (int k = 0; k < cl->n_in; k++) stack[k] = chunk_of(&in[k], k, r0, n);
    for (int k = cl->first; k < cl->n_leaves; k++) {
        const ct_train_leaf *leaf = &cl->leaves[k];
        ct_key lk = chunk_key(ct_train_leaf_key(key, leaf), i, n_chunks);
        ct_tensor y;
        CT_TRY(ct_layer_forward(leaf->layer, c, stack, &y, lk, err));
        stack[0] = y;
    }
    *out = stack[0];
    return CT_OK;
}

ct_status ct_chunked_loss_forward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *in, ct_key key,
                                  ct_tensor *loss, double *weight, ct_error *err) {
    int64_t rows = part_rows(&in[0]), n_chunks = rows > 0 ? (rows - 1) / cl->rows + 1 : 0;
    *loss = ct_tensor_make(CT_DTYPE_F32, 0, NULL, NULL);
    CT_TRY(ct_ctx_alloc(c, loss, err));
    bool record = c->record;
    c->record = false;
    double sum_w = 0, sum_lw = 0;
    ct_status st = CT_OK;
    for (int64_t i = 0; i < n_chunks && st == CT_OK; i++) {
        ct_arena_mark mark = ct_arena_get_mark(c->arena);
        ct_tensor out;
        c->loss_weight = -1;
        st = chunk_forward(cl, c, in, key, i, n_chunks, &out, err);
        if (st == CT_OK) {
            double w = c->loss_weight >= 0 ? c->loss_weight : 1.0;
            sum_w += w;
            sum_lw += (double)*ct_f32(&out) * w;
        }
        ct_arena_reset_to(c->arena, mark);
    }
    c->record = record;
    CT_TRY(st);
    // As the loss layer: the mean over nothing (every weight 0) is 0.
    *ct_f32(loss) = (float)(sum_w != 0 ? sum_lw / sum_w : 0.0);
    *weight = sum_w;
    c->loss_weight = sum_w;
    return CT_OK;
}

ct_status ct_chunked_loss_backward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *in, ct_key key, float seed,
                                   double weight, ct_tensor *grad_in, ct_error *err) {
    int64_t rows = part_rows(&in[0]), n_chunks = rows > 0 ? (rows - 1) / cl->rows + 1 : 0;
    int64_t d = in[0].shape[in[0].ndim - 1];
    for (int k = 0; k < cl->n_in; k++) grad_in[k] = ct_tensor_sig(&in[k]);
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    float *dx = grad_in[0].data;
    bool record = c->record;
    void (*on_grads)(void *, const ct_layer *) = c->on_weight_grads;
    c->record = true;
    ct_status st = CT_OK;
    for (int64_t i = 0; i < n_chunks && st == CT_OK; i++) {
        int64_t r0 = i * cl->rows, n = rows - r0 < cl->rows ? rows - r0 : cl->rows;
        ct_arena_mark mark = ct_arena_get_mark(c->arena);
        // A trainer sending finished gradients hears of each layer once, as
        // after one backward: when its last chunk is done.
        c->on_weight_grads = i == n_chunks - 1 ? on_grads : NULL;
        ct_tensor out;
        c->loss_weight = -1;
        st = chunk_forward(cl, c, in, key, i, n_chunks, &out, err);
        // d (sum_c L_c W_c / W) / d L_c = W_c / W.
        double w = c->loss_weight >= 0 ? c->loss_weight : 1.0;
        float g = weight != 0 ? (float)((double)seed * w / weight) : 0.0f;
        ct_tensor gout = ct_tensor_sig(&out), gin[CT_LAYER_MAX_IO];
        gout.data = &g;
        for (int k = cl->n_leaves - 1; k >= cl->first && st == CT_OK; k--) {
            const ct_train_leaf *leaf = &cl->leaves[k];
            ct_key lk = chunk_key(ct_train_leaf_key(key, leaf), i, n_chunks);
            st = ct_layer_backward(leaf->layer, c, &gout, gin, lk, err);
            gout = gin[0];
        }
        if (st == CT_OK) {
            if (gout.data) memcpy(dx + r0 * d, gout.data, (size_t)(n * d) * sizeof(float));
            else memset(dx + r0 * d, 0, (size_t)(n * d) * sizeof(float));
        }
        ct_arena_reset_to(c->arena, mark);
    }
    c->record = record;
    c->on_weight_grads = on_grads;
    return st;
}

ct_status ct_chunked_loss_net_forward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *batch, int n_batch,
                                      ct_key key, ct_tensor *part_in, ct_tensor *loss, double *weight,
                                      ct_error *err) {
    int depth;
    CT_TRY(ct_train_leaves_run(cl->leaves, cl->first, key, c, false, batch, n_batch, part_in, &depth, err));
    CT_ASSERT(depth == cl->n_in);
    return ct_chunked_loss_forward(cl, c, part_in, key, loss, weight, err);
}

ct_status ct_chunked_loss_net_backward(const ct_chunked_loss *cl, ct_ctx *c, const ct_tensor *part_in, int n_batch,
                                       ct_key key, float seed, double weight, ct_error *err) {
    ct_tensor g[CT_LAYER_MAX_IO], gin[CT_LAYER_MAX_IO];
    int depth;
    CT_TRY(ct_chunked_loss_backward(cl, c, part_in, key, seed, weight, g, err));
    CT_TRY(ct_train_leaves_run(cl->leaves, cl->first, key, c, true, g, cl->n_in, gin, &depth, err));
    CT_ASSERT(depth == n_batch);
    return CT_OK;
}
