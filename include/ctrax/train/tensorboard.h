// TensorBoard event files.
//
// An event file is a sequence of TFRecords: u64 length (LE), u32 masked
// crc32c of the length bytes, the data, u32 masked crc32c of the data, where
// masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The first record is an
// Event {wall_time, file_version: "brain.Event:2"}; each scalar is an Event
// {wall_time, step, summary {value {tag, simple_value}}}, protobuf-encoded.
#ifndef CTRAX_TRAIN_TENSORBOARD_H
#define CTRAX_TRAIN_TENSORBOARD_H

#include <stdint.h>

#include "ctrax/core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_tb_writer ct_tb_writer;

// Creates logdir (mkdir -p) and logdir/events.out.tfevents.<unix time>.<host>
// (with a suffix .001 to .999 if that name exists, so that names sort in the
// order the files were made), and writes the file_version record.
ct_status ct_tb_writer_open(ct_tb_writer **out, const char *logdir, ct_error *err);
// tag is a proto3 string, which must be UTF-8: one that is not is CT_ERR_ARG
// (naming the byte), and nothing is written.
ct_status ct_tb_writer_scalar(ct_tb_writer *w, const char *tag, int64_t step, float value, ct_error *err);
// A SessionLog START at step: TensorBoard then drops the scalars of earlier
// writers at steps >= step (what a run that died wrote past its checkpoint).
ct_status ct_tb_writer_session_start(ct_tb_writer *w, int64_t step, ct_error *err);
// Scalars and session starts are buffered in memory (their write errors show
// here); flush writes what is buffered and fsyncs.
ct_status ct_tb_writer_flush(ct_tb_writer *w, ct_error *err);
// Flushes and closes; frees w whatever happens. NULL is a no-op.
ct_status ct_tb_writer_close(ct_tb_writer *w, ct_error *err);
const char *ct_tb_writer_path(const ct_tb_writer *w);

#ifdef __cplusplus
}
#endif
#endif
