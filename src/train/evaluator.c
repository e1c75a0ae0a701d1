// The evaluator (see evaluator.h).
#include "ctrax/train/evaluator.h"

#include <math.h>
#include <string.h>

#include "ctrax/layers/layer_author.h"
#include "train/train_internal.h"

struct ct_evaluator {
    ct_layer *model;  // one reference
    ct_eval_task task;  // with one reference to each metric layer
    ct_comm *comm;
    ct_device *dev;
    int rank, n_proc;
    ct_net metric_nets[CT_EVAL_MAX_METRICS];  // initialized at the first run
    bool metrics_ready;
    ct_arena arena;  // the model's outputs and the metrics
    bool planned;    // the arena is one block sized by the first batch (run_batch)
    ct_ctx metric_ctx;
    ct_ctx model_ctx;  // the model on the caller's net, eval mode
};

ct_status ct_evaluator_new(ct_evaluator **out, ct_layer *model, const ct_eval_task *task, ct_comm *comm,
                           ct_device *dev, ct_error *err) {
    *out = NULL;
    if (task->n_metrics < 1 || task->n_metrics > CT_EVAL_MAX_METRICS || !task->stream)
        return ct_error_set(err, CT_ERR_ARG, "loop: the eval task needs a stream (%s) and 1 to %d metrics (%d)",
                            task->stream ? "given" : "none", CT_EVAL_MAX_METRICS, task->n_metrics);
    // Each batch splits over the processes: said now, not at the first eval
    // after training has begun.
    int n_proc = comm ? ct_comm_size(comm) : 1;
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    for (int i = 0, n = ct_stream_signature(task->stream, sigs); i < n; i++) {
        if (sigs[i].ndim < 1 || sigs[i].shape[0] <= 0 || sigs[i].shape[0] % n_proc == 0) continue;
        char sig[CT_SIG_STR_MAX];
        return ct_error_set(err, CT_ERR_SHAPE,
                            "eval: the eval batch's item %d %s does not split over %d processes: make the eval batch "
                            "size a multiple of %d",
                            i, ct_tensor_sig_str(&sigs[i], sig, sizeof sig), n_proc, n_proc);
    }
    ct_evaluator *e = ct_calloc(1, sizeof *e);
    e->model = ct_layer_ref(model);
    e->task = *task;
    if (e->task.n_batches < 1) e->task.n_batches = 1;
    for (int m = 0; m < e->task.n_metrics; m++) ct_layer_ref(e->task.metrics[m]);
    e->comm = comm;
    e->dev = dev;
    e->rank = comm ? ct_comm_rank(comm) : 0;
    e->n_proc = comm ? ct_comm_size(comm) : 1;
    ct_arena_init(&e->arena, dev);
    ct_ctx_init(&e->metric_ctx, &e->arena);
    ct_ctx_init(&e->model_ctx, &e->arena);
    *out = e;
    return CT_OK;
}

void ct_evaluator_free(ct_evaluator *e) {
    if (!e) return;
    for (int m = 0; m < CT_EVAL_MAX_METRICS; m++) ct_net_free(&e->metric_nets[m]);
    for (int m = 0; m < e->task.n_metrics; m++) ct_layer_free(e->task.metrics[m]);
    ct_ctx_free(&e->metric_ctx);
    ct_ctx_free(&e->model_ctx);
    ct_arena_free(&e->arena);
    ct_layer_free(e->model);
    ct_free(e);
}

int ct_evaluator_n_metrics(const ct_evaluator *e) { return e->task.n_metrics; }
ct_stream *ct_evaluator_stream(const ct_evaluator *e) { return e->task.stream; }

const char *ct_evaluator_metric_name(const ct_evaluator *e, int m) {
    CT_ASSERT(m >= 0 && m < e->task.n_metrics);
    return e->task.metric_names[m] ? e->task.metric_names[m] : e->task.metrics[m]->name;
}

// The next global batch and this process's rows of it (views).
static ct_status next_rows(ct_evaluator *e, ct_batch *global, ct_tensor *out, ct_error *err) {
    CT_TRY(ct_stream_next(e->task.stream, global, err));
    if (global->n == 0) return ct_error_set(err, CT_ERR_STATE, "eval: the eval stream ran out of data");
    return ct_train_local_rows(global, e->rank, e->n_proc, out, err);
}

ct_status ct_evaluator_model_net(ct_evaluator *e, ct_net *net, ct_key init_key, ct_error *err) {
    ct_batch global;
    ct_tensor local[CT_BATCH_MAX_TENSORS];
    ct_stream_cursor start = ct_stream_get_cursor(e->task.stream);
    CT_TRY(next_rows(e, &global, local, err));
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    for (int i = 0; i < global.n; i++) sigs[i] = ct_tensor_sig(&local[i]);
    CT_TRY(ct_stream_set_cursor(e->task.stream, start, err));
    if (global.n < e->model->n_in)
        return ct_error_set(err, CT_ERR_SHAPE, "eval: the model %s takes %d inputs, the eval batch has %d",
                            e->model->name, e->model->n_in, global.n);
    return ct_net_init(net, e->model, sigs, e->model->n_in, init_key, e->dev, err);
}

static ct_status init_metrics(ct_evaluator *e, const ct_tensor *in, int n, ct_error *err) {
    ct_tensor sigs[CT_LAYER_MAX_IO];
    for (int i = 0; i < n; i++) sigs[i] = ct_tensor_sig(&in[i]);
    for (int m = 0; m < e->task.n_metrics; m++) {
        ct_layer *layer = e->task.metrics[m];
        if (layer->n_in > n)
            return ct_error_set(err, CT_ERR_ARG, "eval: metric %s takes %d inputs, the model and batch give %d",
                                layer->name, layer->n_in, n);
        CT_TRY(ct_net_init(&e->metric_nets[m], layer, sigs, layer->n_in, ct_key_from_seed(0), e->dev, err));
        const ct_net *mn = &e->metric_nets[m];
        if (mn->n_weights || mn->n_out != 1 || mn->out_sigs[0].ndim != 0)
            return ct_error_set(err, CT_ERR_ARG, "eval: metric %s must be weightless and give one scalar", layer->name);
    }
    e->metrics_ready = true;
    return CT_OK;
}

// One batch: this process's rows through the model, then each metric;
// sums[2m] += value * weight, sums[2m+1] += weight. The rows are numbered
// in the global batch (ct_ctx.first_row), so per-example randomness (LSH's
// rotations) is what one process draws for the whole batch.
static ct_status run_batch(ct_evaluator *e, const ct_net *net, ct_key key, double *sums, ct_error *err) {
    ct_batch global;
    ct_tensor batch[CT_BATCH_MAX_TENSORS], outputs[CT_LAYER_MAX_IO], in[CT_LAYER_MAX_IO];
    CT_TRY(next_rows(e, &global, batch, err));
    // The first batch runs on a measured arena, which is then reserved at
    // its high-water mark, as the trainers plan theirs: only on a planned
    // arena can the Serial walks give back what each sublayer consumed
    // (ct_arena_keep does nothing on blocks chained while growing), so an
    // unplanned eval held every layer's activations at once (a 24-layer
    // reversible model: 666 MiB of RSS against training's 162).
    bool measure = !e->planned;
    ct_status st = measure ? ct_arena_measure_begin(&e->arena, err) : CT_OK;
    if (st != CT_OK) return st;
    e->model_ctx.first_row = (int64_t)e->rank * batch[0].shape[0];
    ct_net_bind(net, &e->model_ctx, false);
    st = ct_layer_forward(e->model, &e->model_ctx, batch, outputs, key, err);
    int n = 0;
    for (int i = 0; i < e->model->n_out; i++) in[n++] = outputs[i];
    for (int i = e->model->n_in; i < global.n && n < CT_LAYER_MAX_IO; i++) in[n++] = batch[i];
    if (st == CT_OK && !e->metrics_ready) st = init_metrics(e, in, n, err);
    for (int m = 0; st == CT_OK && m < e->task.n_metrics; m++) {
        ct_tensor value;
        ct_net_bind(&e->metric_nets[m], &e->metric_ctx, false);
        e->metric_ctx.loss_weight = -1;
        st = ct_layer_forward(e->metric_nets[m].root, &e->metric_ctx, in, &value, key, err);
        if (st != CT_OK) break;
        double w = e->metric_ctx.loss_weight >= 0 ? e->metric_ctx.loss_weight : 1.0;
        sums[2 * m] += (double)*ct_f32(&value) * w;
        sums[2 * m + 1] += w;
    }
    if (measure) {
        size_t high = ct_arena_measure_end(&e->arena);
        e->planned = true;
        if (st == CT_OK) st = ct_arena_reserve(&e->arena, high, err);
    } else {
        ct_arena_reset(&e->arena);
    }
    return st;
}

ct_status ct_evaluator_run(ct_evaluator *e, const ct_net *net, ct_key key, double *values, ct_error *err) {
    // The metrics' sums, then how many processes failed: a process whose
    // batch failed still joins the sum, so no process waits on it (or takes
    // its next collective for this one) and every one stops here.
    int n = 2 * e->task.n_metrics;
    double sums[2 * CT_EVAL_MAX_METRICS + 1] = {0};
    ct_status st = CT_OK;
    // A key per batch, as Trax draws a fresh one for each. Only a layer that
    // draws in eval mode sees it, and none of ctrax's own does: dropout is
    // off, and LSHSelfAttention's rotations come from its hash state (its
    // key and count of forwards, REFORMER.md section 2), not from this key.
    for (int b = 0; b < e->task.n_batches && st == CT_OK; b++)
        st = run_batch(e, net, ct_key_fold_in(key, (uint32_t)b), sums, err);
    if (e->comm) {
        sums[n] = st != CT_OK;
        ct_status cst = ct_comm_allreduce_f64(e->comm, sums, (size_t)n + 1, st == CT_OK ? err : NULL);
        CT_TRY(st);
        CT_TRY(cst);
        if (sums[n] > 0)
            return ct_error_set(err, CT_ERR_STATE,
                                "eval: another process failed (its error is in that process's output)");
    }
    CT_TRY(st);
    for (int m = 0; m < e->task.n_metrics; m++) values[m] = sums[2 * m + 1] > 0 ? sums[2 * m] / sums[2 * m + 1] : NAN;
    return CT_OK;
}
