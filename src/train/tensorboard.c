// TensorBoard event files: TFRecord framing and a hand-written protobuf
// encoder for the few messages a scalar needs.
//
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3;
//                Summary summary = 5; SessionLog session_log = 7; }
//   Summary    { repeated Value value = 1; }
//   Value      { string tag = 1; float simple_value = 2; }
//   SessionLog { enum Status status = 1; }   START = 1
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fs.h"
#include "core/json.h"
#include "ctrax/core/memory.h"
#include "train/summary_internal.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "event files are written as the little-endian host holds them");

// Bitwise CRC-32C (reflected polynomial 0x82f63b78). Records are a few dozen
// bytes, so a table buys nothing.
uint32_t ct_crc32c(const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = ct_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ---- protobuf encoding --------------------------------------------------------

// A growing byte buffer: events are a few dozen bytes, so running out of
// memory here aborts (memory.h's bookkeeping rule).
typedef struct pb {
    unsigned char *p;
    size_t n, cap;
} pb;

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static void pb_bytes(pb *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        b->p = ct_realloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void pb_varint(pb *b, uint64_t v) {
    unsigned char buf[10];
    size_t n = 0;
    do {
        buf[n++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, buf, n);
}

static void pb_key(pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_double(pb *b, int field, double v) {
    pb_key(b, field, WIRE_FIXED64);
    pb_bytes(b, &v, 8);  // IEEE 754, little-endian
}

static void pb_float(pb *b, int field, float v) {
    pb_key(b, field, WIRE_FIXED32);
    pb_bytes(b, &v, 4);
}

static void pb_int64(pb *b, int field, int64_t v) {
    pb_key(b, field, WIRE_VARINT);
    pb_varint(b, (uint64_t)v);  // negatives take ten bytes, as protobuf's int64 does
}

static void pb_len(pb *b, int field, const void *data, size_t n) {
    pb_key(b, field, WIRE_LEN);
    pb_varint(b, n);
    pb_bytes(b, data, n);
}

static void pb_free(pb *b) { ct_free(b->p); }

// ---- the writer -----------------------------------------------------------

struct ct_tb_writer {
    int fd;
    char *path;
    pb out;  // records not yet written to the file
};

const char *ct_tb_writer_path(const ct_tb_writer *w) { return w->path; }

// Buffers one record; ct_tb_writer_flush writes the buffer.
static void add_record(ct_tb_writer *w, const pb *event) {
    unsigned char head[12];
    uint64_t len = event->n;
    memcpy(head, &len, 8);
    uint32_t c = masked_crc(head, 8);
    memcpy(head + 8, &c, 4);
    uint32_t dc = masked_crc(event->p, event->n);
    pb_bytes(&w->out, head, 12);
    pb_bytes(&w->out, event->p, event->n);
    pb_bytes(&w->out, &dc, 4);
}

ct_status ct_tb_writer_open(ct_tb_writer **out, const char *logdir, ct_error *err) {
    CT_ASSERT(out && logdir);
    *out = NULL;
    CT_TRY(ct_fs_mkdirs(logdir, err));
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    for (char *p = host; *p; p++)
        if (*p == '/') *p = '_';
    ct_tb_writer *w = ct_calloc(1, sizeof *w);
    size_t cap = strlen(logdir) + strlen(host) + 64;
    w->path = ct_malloc(cap);
    long long t = (long long)time(NULL);
    w->fd = -1;
    // Writers opened in the same second take the suffixes .001 to .999:
    // TensorBoard reads a directory's event files in name order, and with
    // .10 sorted before .2, run 2's SessionLog START, read after run 10's
    // file, would purge the steps run 10 logged.
    for (int k = 0; k < 1000 && w->fd < 0; k++) {
        if (k == 0) snprintf(w->path, cap, "%s/events.out.tfevents.%lld.%s", logdir, t, host);
        else snprintf(w->path, cap, "%s/events.out.tfevents.%lld.%s.%03d", logdir, t, host, k);
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (w->fd < 0 && errno != EEXIST) break;
    }
    if (w->fd < 0) {
        ct_status s = ct_error_set(err, CT_ERR_IO, "%s: cannot create: %s", w->path, strerror(errno));
        ct_free(w->path);
        ct_free(w);
        return s;
    }
    pb e = {0};
    pb_double(&e, 1, ct_wall_time_s());
    pb_len(&e, 3, "brain.Event:2", 13);
    add_record(w, &e);
    pb_free(&e);
    ct_status s = ct_tb_writer_flush(w, err);
    if (s != CT_OK) {
        ct_tb_writer_close(w, NULL);
        return s;
    }
    *out = w;
    return CT_OK;
}

// Buffers the Event {wall_time, step, <field>: payload}.
static void add_event(ct_tb_writer *w, int64_t step, int field, const pb *payload) {
    pb e = {0};
    pb_double(&e, 1, ct_wall_time_s());
    pb_int64(&e, 2, step);
    pb_len(&e, field, payload->p, payload->n);
    add_record(w, &e);
    pb_free(&e);
}

ct_status ct_tb_writer_scalar(ct_tb_writer *w, const char *tag, int64_t step, float value, ct_error *err) {
    CT_ASSERT(w && tag);
    // Value.tag is a proto3 string, which must be UTF-8: TensorBoard's
    // reader refuses the record (and the rest of the file with it).
    CT_TRY(ct_utf8_check_name(tag, "tag", w->path, err));
    // Buffered: write errors come from ct_tb_writer_flush.
    pb v = {0}, summary = {0};
    pb_len(&v, 1, tag, strlen(tag));
    pb_float(&v, 2, value);
    pb_len(&summary, 1, v.p, v.n);
    add_event(w, step, 5, &summary);  // Event.summary
    pb_free(&v);
    pb_free(&summary);
    return CT_OK;
}

ct_status ct_tb_writer_session_start(ct_tb_writer *w, int64_t step, ct_error *err) {
    CT_ASSERT(w);
    (void)err;  // buffered, as a scalar
    pb log = {0};
    pb_key(&log, 1, WIRE_VARINT);
    pb_varint(&log, 1);  // SessionLog.START
    add_event(w, step, 7, &log);  // Event.session_log
    pb_free(&log);
    return CT_OK;
}

ct_status ct_tb_writer_flush(ct_tb_writer *w, ct_error *err) {
    CT_ASSERT(w);
    size_t done = 0;
    ct_status s = ct_fs_write_from(w->fd, w->out.p, w->out.n, &done, w->path, err);
    // Only what did not go out is kept for the next try: a record written
    // twice, or cut in two, would end TensorBoard's reading of the file there.
    if (done) memmove(w->out.p, w->out.p + done, w->out.n - done);
    w->out.n -= done;
    CT_TRY(s);
    if (fsync(w->fd) != 0) return ct_error_set(err, CT_ERR_IO, "%s: fsync failed: %s", w->path, strerror(errno));
    return CT_OK;
}

ct_status ct_tb_writer_close(ct_tb_writer *w, ct_error *err) {
    if (!w) return CT_OK;
    ct_status s = ct_fs_close(w->fd, w->path, ct_tb_writer_flush(w, err), err);
    pb_free(&w->out);
    ct_free(w->path);
    ct_free(w);
    return s;
}
