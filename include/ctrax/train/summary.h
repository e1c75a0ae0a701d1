// Summaries: metrics.jsonl, and ct_summary, which writes each scalar of a run
// to metrics.jsonl and to TensorBoard event files (tensorboard.h).
//
// A training run's output directory gets
//
//   metrics.jsonl                         one JSON object per line:
//                                         {"step": 100, "mode": "train", "metric": "metrics/loss", "value": 2.3456}
//   train/events.out.tfevents.<t>.<host>  TensorBoard scalars of the train mode
//   eval/events.out.tfevents.<t>.<host>   ... and of the eval mode
//
// A value that is not finite is written as "value": null with "nonfinite":
// "nan", "inf" or "-inf" beside it (JSON has no NaN). A value that is exactly
// a float is written with the fewest digits that give the float back
// (2.3456f -> 2.3456), any other double with the fewest that give the double.
//
// Resuming: metrics of steps after the checkpoint resumed from were written by
// the run that died; ct_metrics_truncate_after drops them, and a SessionLog
// START event (ct_tb_writer_session_start) makes TensorBoard discard the
// orphaned scalars of those steps. ct_summary_open does both.
#ifndef CTRAX_TRAIN_SUMMARY_H
#define CTRAX_TRAIN_SUMMARY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrax/core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- metrics.jsonl ---------------------------------------------------------

typedef struct ct_metrics_writer ct_metrics_writer;

// Opens path for appending (creates it). Lines are buffered until flush.
ct_status ct_metrics_writer_open(ct_metrics_writer **out, const char *path, ct_error *err);
// Adds one line. mode is "train" or "eval" (any string is accepted). A mode
// or metric that is not valid UTF-8 (JSON text is UTF-8) is CT_ERR_ARG,
// naming the byte, and adds nothing.
ct_status ct_metrics_writer_add(ct_metrics_writer *w, int64_t step, const char *mode, const char *metric, double value,
                                ct_error *err);
// Appends the buffered lines and fsyncs the file.
ct_status ct_metrics_writer_flush(ct_metrics_writer *w, ct_error *err);
// Flushes and closes; frees w whatever happens. NULL is a no-op.
ct_status ct_metrics_writer_close(ct_metrics_writer *w, ct_error *err);

// Rewrites path atomically keeping only the lines whose step is <= step (a
// line that does not parse, such as one cut short by a crash, or one of a
// MiB or more, is dropped with a warning). The file is streamed, so its size
// is not bounded by memory, and left as it is when nothing changes. Call it
// before opening a writer on path. A missing file is fine. n_dropped (may be
// NULL) gets the number of lines removed.
ct_status ct_metrics_truncate_after(const char *path, int64_t step, int64_t *n_dropped, ct_error *err);


// ---- all summaries of a run ------------------------------------------------

typedef enum ct_summary_mode { CT_SUMMARY_TRAIN = 0, CT_SUMMARY_EVAL = 1 } ct_summary_mode;

const char *ct_summary_mode_name(ct_summary_mode mode);  // "train", "eval"

typedef struct ct_summary ct_summary;

// Opens <output_dir>/metrics.jsonl and TensorBoard writers in
// <output_dir>/train and <output_dir>/eval. resume_step is the step of the
// checkpoint the run continues from (0 for a fresh run): metrics.jsonl loses
// its lines past it and each event file starts with a SessionLog START at
// resume_step + 1.
ct_status ct_summary_open(ct_summary **out, const char *output_dir, int64_t resume_step, ct_error *err);
// One scalar to metrics.jsonl and to the mode's event file, e.g.
// (TRAIN, 100, "metrics/loss", 2.3456). A tag that is not valid UTF-8 is
// CT_ERR_ARG and reaches neither file.
ct_status ct_summary_scalar(ct_summary *s, ct_summary_mode mode, int64_t step, const char *tag, double value,
                            ct_error *err);
// Makes everything written so far durable (call it once per logged step).
ct_status ct_summary_flush(ct_summary *s, ct_error *err);
ct_status ct_summary_close(ct_summary *s, ct_error *err);

#ifdef __cplusplus
}
#endif
#endif
