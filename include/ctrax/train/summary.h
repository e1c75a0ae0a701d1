// Summaries: metrics.jsonl, TensorBoard event files, the terminal progress
// line and Trax's log line.
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
#include <stdio.h>

#include "ctrax/core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- metrics.jsonl ---------------------------------------------------------

typedef struct ct_metrics_writer ct_metrics_writer;

// Opens path for appending (creates it). Lines are buffered until flush.
ct_status ct_metrics_writer_open(ct_metrics_writer **out, const char *path, ct_error *err);
// Adds one line. mode is "train" or "eval" (any string is accepted).
ct_status ct_metrics_writer_add(ct_metrics_writer *w, int64_t step, const char *mode, const char *metric, double value,
                                ct_error *err);
// Appends the buffered lines and fsyncs the file.
ct_status ct_metrics_writer_flush(ct_metrics_writer *w, ct_error *err);
// Flushes and closes; frees w whatever happens. NULL is a no-op.
ct_status ct_metrics_writer_close(ct_metrics_writer *w, ct_error *err);

// Rewrites path atomically keeping only the lines whose step is <= step (a
// line that does not parse, such as one cut short by a crash, is dropped with
// a warning). Call it before opening a writer on path. A missing file is fine.
// n_dropped (may be NULL) gets the number of lines removed.
ct_status ct_metrics_truncate_after(const char *path, int64_t step, int64_t *n_dropped, ct_error *err);

// Formats one metrics.jsonl line (with its '\n') into buf; returns its length,
// or the length it would need (as snprintf).
size_t ct_metrics_format_line(char *buf, size_t cap, int64_t step, const char *mode, const char *metric, double value);

// ---- TensorBoard -----------------------------------------------------------
//
// An event file is a sequence of TFRecords: u64 length (LE), u32 masked
// crc32c of the length bytes, the data, u32 masked crc32c of the data, where
// masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The first record is an
// Event {wall_time, file_version: "brain.Event:2"}; each scalar is an Event
// {wall_time, step, summary {value {tag, simple_value}}}, protobuf-encoded.

typedef struct ct_tb_writer ct_tb_writer;

// Creates logdir (mkdir -p) and logdir/events.out.tfevents.<unix time>.<host>
// (with a numeric suffix if that name exists), and writes the file_version record.
ct_status ct_tb_writer_open(ct_tb_writer **out, const char *logdir, ct_error *err);
ct_status ct_tb_writer_scalar(ct_tb_writer *w, const char *tag, int64_t step, float value, ct_error *err);
// A SessionLog START at step: TensorBoard then drops the scalars of earlier
// writers at steps >= step (what a run that died wrote past its checkpoint).
ct_status ct_tb_writer_session_start(ct_tb_writer *w, int64_t step, ct_error *err);
// Writes what is buffered and fsyncs.
ct_status ct_tb_writer_flush(ct_tb_writer *w, ct_error *err);
// Flushes and closes; frees w whatever happens. NULL is a no-op.
ct_status ct_tb_writer_close(ct_tb_writer *w, ct_error *err);
const char *ct_tb_writer_path(const ct_tb_writer *w);

// CRC-32C (Castagnoli), as TFRecord uses it; ct_crc32c("123456789", 9) = 0xe3069283.
uint32_t ct_crc32c(const void *data, size_t n);

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
// (TRAIN, 100, "metrics/loss", 2.3456).
ct_status ct_summary_scalar(ct_summary *s, ct_summary_mode mode, int64_t step, const char *tag, double value,
                            ct_error *err);
// Makes everything written so far durable (call it once per logged step).
ct_status ct_summary_flush(ct_summary *s, ct_error *err);
ct_status ct_summary_close(ct_summary *s, ct_error *err);

// ---- terminal output ------------------------------------------------------

// Trax's log line: "Step %6d: %-5s %*s | % .8f" with the name right-justified
// to name_width, e.g. "Step    100: train loss |  2.34560000". Returns the
// length (as snprintf).
size_t ct_format_step_line(char *buf, size_t cap, int64_t step, const char *mode, const char *name, int name_width,
                           double value);

// A live progress line, redrawn in place with '\r'. It draws only when the
// stream is a terminal; on anything else every call is a no-op.
typedef struct ct_progress ct_progress;

// stream NULL means stderr. total_steps is the last step of the run.
ct_progress *ct_progress_new(FILE *stream, int64_t total_steps);
void ct_progress_free(ct_progress *p);
bool ct_progress_active(const ct_progress *p);
// After step `step` finished with this loss, having processed `tokens` tokens
// in the steps since the previous update. Rates are measured from the first
// update on; the line is redrawn at most every 0.1 s and always at the last
// step.
void ct_progress_update(ct_progress *p, int64_t step, double loss, int64_t tokens);
// Erases the line, so a log line can be printed; the next update redraws it.
void ct_progress_clear(ct_progress *p);
// Ends the line with a newline (the last state stays on screen).
void ct_progress_finish(ct_progress *p);

// The progress line's text: "step 120/1000 | loss 2.3456 | 8.50 steps/s |
// 4.35k tokens/s | ETA 1m43s". A rate < 0 is shown as "-"; eta_s < 0 as "ETA -".
size_t ct_progress_format(char *buf, size_t cap, int64_t step, int64_t total, double loss, double steps_per_s,
                          double tokens_per_s, double eta_s);

#ifdef __cplusplus
}
#endif
#endif
