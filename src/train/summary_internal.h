// Summary internals: the checksum of TensorBoard's records, the metrics.jsonl
// line, Trax's log line and the terminal progress line (used by the Loop and
// `ctrax eval`; internal to ctrax).
#ifndef CTRAX_TRAIN_SUMMARY_INTERNAL_H
#define CTRAX_TRAIN_SUMMARY_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctrax/train/summary.h"
#include "ctrax/train/tensorboard.h"

// CRC-32C (Castagnoli), as TFRecord uses it; ct_crc32c("123456789", 9) = 0xe3069283.
uint32_t ct_crc32c(const void *data, size_t n);

// Formats one metrics.jsonl line (with its '\n') into buf; returns its length,
// or the length it would need (as snprintf).
size_t ct_metrics_format_line(char *buf, size_t cap, int64_t step, const char *mode, const char *metric, double value);

// ---- terminal output ------------------------------------------------------

// Trax's log line: "Step %6d: %-5s %*s | % .8f" with the name right-justified
// to name_width, e.g. "Step    100: train loss |  2.34560000". Returns the
// length (as snprintf).
size_t ct_format_step_line(char *buf, size_t cap, int64_t step, const char *mode, const char *name, int name_width,
                           double value);

// A live progress line, redrawn in place with '\r' when the stream is a
// terminal. On anything else (a log file, a batch job's output) it is a
// plain line of its own every log_interval_s seconds at most, so that a long
// run's log shows it moving between evals; clear and finish then do nothing.
typedef struct ct_progress ct_progress;

// What the Loop passes as log_interval_s: a line a minute in a log.
#define CT_PROGRESS_LOG_INTERVAL_S 60.0

// stream NULL means stderr. total_steps is the last step of the run.
ct_progress *ct_progress_new(FILE *stream, int64_t total_steps, double log_interval_s);
void ct_progress_free(ct_progress *p);
// True when the line is drawn in place (a terminal): it must be cleared
// before other output.
bool ct_progress_active(const ct_progress *p);
// After step `step` finished with this loss, having processed `tokens` tokens
// in the steps since the previous update. Rates are measured from the first
// update on; on a terminal the line is redrawn at most every 0.1 s and
// always at the last step; elsewhere a line is written once log_interval_s
// has passed since the first update or the last line, never at the last
// step (the run's own log says it ended).
void ct_progress_update(ct_progress *p, int64_t step, double loss, int64_t tokens);
// Erases the line, so a log line can be printed; the next update redraws it.
void ct_progress_clear(ct_progress *p);
// Ends the line with a newline (the last state stays on screen).
void ct_progress_finish(ct_progress *p);

// The progress line's text: "step 120/1000 | loss 2.3456 | 8.50 steps/s |
// 4.35k tokens/s | ETA 1m43s". A rate < 0 is shown as "-"; eta_s < 0 as "ETA -".
size_t ct_progress_format(char *buf, size_t cap, int64_t step, int64_t total, double loss, double steps_per_s,
                          double tokens_per_s, double eta_s);

#endif
