// The evaluator: a model's metrics on an eval stream, with no optimizer and
// no trainer. Used by the Loop (its evals) and by `ctrax eval`.
//
// Each batch of the stream is the global batch: every process takes its own
// rows of it (process p of P: rows [p B/P, (p+1) B/P)), all at once, numbered
// in the global batch (ct_ctx.first_row). The model runs alone
// in eval mode (dropout off) on the weights of a net the caller gives; each
// metric layer is applied to [model outputs, the batch's other tensors...].
// Metrics are averaged over every batch, device and process, weighted by
// what each averages over (tokens, for a weighted loss; ct_ctx.loss_weight).
#ifndef CTRAX_TRAIN_EVALUATOR_H
#define CTRAX_TRAIN_EVALUATOR_H

#include "ctrax/core/error.h"
#include "ctrax/data/stream.h"
#include "ctrax/dist/comm.h"
#include "ctrax/layers/layer.h"

#ifdef __cplusplus
extern "C" {
#endif

// An evaluation: n_batches batches of the stream, each metric layer applied
// to [model output, the batch's other tensors...]. The metric layers are
// weightless scalars (losses and accuracies); names default to the layers'.
#define CT_EVAL_MAX_METRICS 16
typedef struct ct_eval_task {
    ct_stream *stream;
    ct_layer *metrics[CT_EVAL_MAX_METRICS];
    const char *metric_names[CT_EVAL_MAX_METRICS];
    int n_metrics;
    int n_batches;  // 1
} ct_eval_task;

typedef struct ct_evaluator ct_evaluator;

// Checks the task (a stream, 1 to CT_EVAL_MAX_METRICS metrics) and takes
// references to model and the metric layers; the stream is not owned (it
// must outlive the evaluator) and names are not copied. comm: the processes
// to average over (NULL: this one alone; not owned). dev counts the bytes of
// the model's outputs and the metrics.
ct_status ct_evaluator_new(ct_evaluator **out, ct_layer *model, const ct_eval_task *task, ct_comm *comm,
                           ct_device *dev, ct_error *err);
void ct_evaluator_free(ct_evaluator *e);

// Initializes net for the model alone, for the signatures of one piece of
// this process's rows of the stream's next batch (the stream then goes back to where it
// was), with init_key: for a caller with no trainer (`ctrax eval`), which
// then loads the weights into it by name.
ct_status ct_evaluator_model_net(ct_evaluator *e, ct_net *net, ct_key init_key, ct_error *err);

// Runs the task's n_batches batches with the model on net's weights (a net
// whose slabs hold the model's weights: the trainer's, or one from
// ct_evaluator_model_net) and writes each metric's average to values[m]
// (NaN when nothing was weighed). Batch b runs with ct_key_fold_in(key, b). Every process calls it; when one fails
// (its error), every other one returns an error too (CT_ERR_STATE).
ct_status ct_evaluator_run(ct_evaluator *e, const ct_net *net, ct_key key, double *values, ct_error *err);

// Metric m's name (its layer's, unless the task named it).
int ct_evaluator_n_metrics(const ct_evaluator *e);
const char *ct_evaluator_metric_name(const ct_evaluator *e, int m);
// The stream (for its cursor in checkpoints).
ct_stream *ct_evaluator_stream(const ct_evaluator *e);

#ifdef __cplusplus
}
#endif
#endif
