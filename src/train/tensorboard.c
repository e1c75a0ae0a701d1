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

#include "ctrax/train/checkpoint.h"
#include "ctrax/train/summary.h"

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

typedef struct pb {
    unsigned char *p;
    size_t n, cap;
    bool oom;
} pb;

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static void pb_bytes(pb *b, const void *data, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
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

static void pb_free(pb *b) { free(b->p); }

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---- the writer -----------------------------------------------------------

struct ct_tb_writer {
    FILE *f;
    char *path;
};

const char *ct_tb_writer_path(const ct_tb_writer *w) { return w->path; }

static ct_status write_record(ct_tb_writer *w, const pb *event, ct_error *err) {
    if (event->oom) return ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory encoding an event", w->path);
    unsigned char head[12];
    uint64_t len = event->n;
    memcpy(head, &len, 8);
    uint32_t c = masked_crc(head, 8);
    memcpy(head + 8, &c, 4);
    uint32_t dc = masked_crc(event->p, event->n);
    if (fwrite(head, 1, 12, w->f) != 12 || fwrite(event->p, 1, event->n, w->f) != event->n ||
        fwrite(&dc, 1, 4, w->f) != 4)
        return ct_error_set(err, CT_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    return CT_OK;
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
    ct_tb_writer *w = calloc(1, sizeof *w);
    if (!w) return ct_error_set(err, CT_ERR_MEMORY, "out of memory");
    size_t cap = strlen(logdir) + strlen(host) + 64;
    w->path = malloc(cap);
    if (!w->path) {
        free(w);
        return ct_error_set(err, CT_ERR_MEMORY, "out of memory");
    }
    long long t = (long long)time(NULL);
    int fd = -1;
    for (int k = 0; k < 1000 && fd < 0; k++) {
        if (k == 0) snprintf(w->path, cap, "%s/events.out.tfevents.%lld.%s", logdir, t, host);
        else snprintf(w->path, cap, "%s/events.out.tfevents.%lld.%s.%d", logdir, t, host, k);
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        ct_status s = ct_error_set(err, CT_ERR_IO, "%s: cannot create: %s", w->path, strerror(errno));
        if (fd >= 0) close(fd);
        free(w->path);
        free(w);
        return s;
    }
    pb e = {0};
    pb_double(&e, 1, wall_time());
    pb_len(&e, 3, "brain.Event:2", 13);
    ct_status s = write_record(w, &e, err);
    pb_free(&e);
    if (s == CT_OK) s = ct_tb_writer_flush(w, err);
    if (s != CT_OK) {
        ct_tb_writer_close(w, NULL);
        return s;
    }
    *out = w;
    return CT_OK;
}

ct_status ct_tb_writer_scalar(ct_tb_writer *w, const char *tag, int64_t step, float value, ct_error *err) {
    CT_ASSERT(w && tag);
    pb v = {0}, summary = {0}, e = {0};
    pb_len(&v, 1, tag, strlen(tag));
    pb_float(&v, 2, value);
    pb_len(&summary, 1, v.p, v.n);
    pb_double(&e, 1, wall_time());
    pb_int64(&e, 2, step);
    pb_len(&e, 5, summary.p, summary.n);
    e.oom |= v.oom || summary.oom;
    ct_status s = write_record(w, &e, err);
    pb_free(&v);
    pb_free(&summary);
    pb_free(&e);
    return s;
}

ct_status ct_tb_writer_session_start(ct_tb_writer *w, int64_t step, ct_error *err) {
    CT_ASSERT(w);
    pb log = {0}, e = {0};
    pb_key(&log, 1, WIRE_VARINT);
    pb_varint(&log, 1);  // SessionLog.START
    pb_double(&e, 1, wall_time());
    pb_int64(&e, 2, step);
    pb_len(&e, 7, log.p, log.n);
    e.oom |= log.oom;
    ct_status s = write_record(w, &e, err);
    pb_free(&log);
    pb_free(&e);
    return s;
}

ct_status ct_tb_writer_flush(ct_tb_writer *w, ct_error *err) {
    CT_ASSERT(w);
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)
        return ct_error_set(err, CT_ERR_IO, "%s: flush failed: %s", w->path, strerror(errno));
    return CT_OK;
}

ct_status ct_tb_writer_close(ct_tb_writer *w, ct_error *err) {
    if (!w) return CT_OK;
    ct_status s = ct_tb_writer_flush(w, err);
    if (fclose(w->f) != 0 && s == CT_OK)
        s = ct_error_set(err, CT_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    free(w->path);
    free(w);
    return s;
}
