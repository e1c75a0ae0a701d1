// metrics.jsonl, the bundle of a run's summaries, Trax's log line and the
// terminal progress line.
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "ctrax/core/log.h"
#include "core/clock.h"
#include "core/fs.h"
#include "ctrax/core/memory.h"
#include "train/summary_internal.h"

// ---- metrics.jsonl ---------------------------------------------------------

// The shortest decimal that reads back as v: as a float when v is one (most
// metrics are), else as a double.
static void format_number(char *buf, size_t cap, double v) {
    float f = (float)v;
    if ((double)f == v) {
        for (int p = 6; p <= 9; p++) {
            snprintf(buf, cap, "%.*g", p, v);
            if ((float)strtod(buf, NULL) == f) return;
        }
    }
    for (int p = 15; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

// A JSON string literal (quoted, escaped), malloc'ed.
static char *json_string(const char *s) {
    cJSON *j = cJSON_CreateString(s);
    char *out = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    return out;
}

size_t ct_metrics_format_line(char *buf, size_t cap, int64_t step, const char *mode, const char *metric, double value) {
    char *m = json_string(mode), *k = json_string(metric);
    char num[64];
    if (isnan(value)) snprintf(num, sizeof num, "null, \"nonfinite\": \"nan\"");
    else if (isinf(value)) snprintf(num, sizeof num, "null, \"nonfinite\": \"%s\"", value > 0 ? "inf" : "-inf");
    else format_number(num, sizeof num, value);
    int n = snprintf(buf, cap, "{\"step\": %" PRId64 ", \"mode\": %s, \"metric\": %s, \"value\": %s}\n", step,
                     m ? m : "\"\"", k ? k : "\"\"", num);
    free(m);
    free(k);
    return n < 0 ? 0 : (size_t)n;
}

struct ct_metrics_writer {
    int fd;
    char *path;
    char *buf;
    size_t n, cap;
    bool need_newline;  // the file ends in a line cut short: start on a new line
};

ct_status ct_metrics_writer_open(ct_metrics_writer **out, const char *path, ct_error *err) {
    CT_ASSERT(out && path);
    *out = NULL;
    int fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ct_metrics_writer *w = ct_calloc(1, sizeof *w);
    w->path = ct_strdup(path);
    w->fd = fd;
    off_t end = lseek(w->fd, 0, SEEK_END);
    char last = '\n';
    if (end > 0 && pread(w->fd, &last, 1, end - 1) == 1) w->need_newline = last != '\n';
    *out = w;
    return CT_OK;
}

ct_status ct_metrics_writer_add(ct_metrics_writer *w, int64_t step, const char *mode, const char *metric, double value,
                                ct_error *err) {
    CT_ASSERT(w && mode && metric);
    // JSON text is UTF-8: a name that is not would make the line one that
    // readers (and ct_metrics_truncate_after) refuse. Refused before a byte
    // is buffered; the buffer itself is bookkeeping (memory.h).
    CT_TRY(ct_utf8_check_name(mode, "mode", w->path, err));
    CT_TRY(ct_utf8_check_name(metric, "metric name", w->path, err));
    size_t need = ct_metrics_format_line(NULL, 0, step, mode, metric, value) + (w->need_newline ? 1 : 0);
    if (w->n + need + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->n + need + 1) cap *= 2;
        w->buf = ct_realloc(w->buf, cap);  // lines of one logged step: bookkeeping
        w->cap = cap;
    }
    if (w->need_newline) {
        w->buf[w->n++] = '\n';
        w->need_newline = false;
    }
    w->n += ct_metrics_format_line(w->buf + w->n, w->cap - w->n, step, mode, metric, value);
    return CT_OK;
}

ct_status ct_metrics_writer_flush(ct_metrics_writer *w, ct_error *err) {
    CT_ASSERT(w);
    size_t done = 0;
    ct_status s = ct_fs_write_from(w->fd, w->buf, w->n, &done, w->path, err);
    // Keep what did not go out, to try again.
    if (done) memmove(w->buf, w->buf + done, w->n - done);
    w->n -= done;
    CT_TRY(s);
    if (fsync(w->fd) != 0) return ct_error_set(err, CT_ERR_IO, "%s: fsync failed: %s", w->path, strerror(errno));
    return CT_OK;
}

ct_status ct_metrics_writer_close(ct_metrics_writer *w, ct_error *err) {
    if (!w) return CT_OK;
    ct_status s = ct_fs_close(w->fd, w->path, ct_metrics_writer_flush(w, err), err);
    ct_free(w->buf);
    ct_free(w->path);
    ct_free(w);
    return s;
}

// The "step" of one line, false if the line is not a metrics object (a line
// with a key twice is not one either: ct_json_parse refuses it).
static bool line_step(const char *line, size_t n, int64_t *step) {
    cJSON *j = ct_json_parse(line, n, "metrics.jsonl", NULL);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
    bool ok = cJSON_IsObject(j) && cJSON_IsNumber(s) && fabs(s->valuedouble) < 9.2e18;
    if (ok) *step = (int64_t)s->valuedouble;
    cJSON_Delete(j);
    return ok;
}

// metrics.jsonl grows with the run (a long one passes CT_FS_READ_MAX), so it
// is read a line at a time. A line ctrax writes holds a step, a mode, a
// metric name and a number; one of a MiB or more is none of those (junk, or
// the NUL bytes a crash can leave where the file was extended), and is
// dropped as a line cut short is, without holding it in memory.
#define METRICS_LINE_MAX ((size_t)1 << 20)

// One pass over the file from its start. With out < 0 it only looks, and
// stops at the first line that a rewrite would change (*changed). With out
// it writes the lines kept there, through obuf (METRICS_LINE_MAX + 1 bytes),
// and counts the lines dropped and, of those, the torn ones.
static ct_status filter_lines(ct_fs_lines *r, int64_t step, int out, const char *out_path, char *obuf, bool *changed,
                              int64_t *dropped, int64_t *torn, ct_error *err) {
    if (lseek(r->fd, 0, SEEK_SET) != 0)
        return ct_error_set(err, CT_ERR_IO, "%s: cannot seek: %s", r->path, strerror(errno));
    r->start = r->end = 0;
    r->eof = false;
    *changed = false;
    *dropped = *torn = 0;
    size_t o = 0;
    for (;;) {
        const char *line = NULL;
        size_t len = 0;
        bool nl = false, more = false;
        CT_TRY(ct_fs_lines_next(r, &line, &len, &nl, &more, err));
        if (!more) break;
        bool blank = line != NULL;
        for (size_t i = 0; line && i < len; i++) blank = blank && (line[i] == ' ' || line[i] == '\r');
        int64_t s;
        bool parsed = line && line_step(line, len, &s), keep = parsed && s <= step;
        if (keep) {
            *changed |= !nl;  // a whole line that lost its newline
            if (out >= 0) {
                if (o + len + 1 > METRICS_LINE_MAX + 1) {
                    CT_TRY(ct_fs_write_all(out, obuf, o, out_path, err));
                    o = 0;
                }
                memcpy(obuf + o, line, len);
                o += len;
                obuf[o++] = '\n';
            }
        } else {
            *changed = true;
            if (!blank) {
                (*dropped)++;
                *torn += !parsed;  // a step past the cut parses; anything else is torn
            }
        }
        if (*changed && out < 0) return CT_OK;
    }
    return out >= 0 ? ct_fs_write_all(out, obuf, o, out_path, err) : CT_OK;
}

ct_status ct_metrics_truncate_after(const char *path, int64_t step, int64_t *n_dropped, ct_error *err) {
    CT_ASSERT(path);
    if (n_dropped) *n_dropped = 0;
    if (access(path, F_OK) != 0) return CT_OK;
    ct_fs_lines r = {.path = path, .cap = METRICS_LINE_MAX};
    struct stat sb;
    CT_TRY(ct_fs_open_regular(path, &r.fd, &sb, err));
    // Two buffers of a fixed size, whatever the file's: bookkeeping (memory.h).
    r.buf = ct_malloc(METRICS_LINE_MAX);
    char *obuf = ct_malloc(METRICS_LINE_MAX + 1);
    bool changed;
    int64_t dropped, torn;
    // The first pass only reads, up to the first line to drop: a resume
    // with nothing past its step writes nothing. The second writes the kept
    // lines to a new file that replaces the old one atomically (a crash in
    // between leaves the old file whole).
    ct_status st = filter_lines(&r, step, -1, NULL, NULL, &changed, &dropped, &torn, err);
    if (st == CT_OK && changed) {
        char tmp[CT_FS_PATH_CAP];
        int out;
        st = ct_fs_atomic_begin(path, &out, tmp, err);
        if (st == CT_OK) {
            st = filter_lines(&r, step, out, tmp, obuf, &changed, &dropped, &torn, err);
            st = ct_fs_atomic_end(path, out, tmp, st, err);
        }
        if (st == CT_OK && torn)
            ct_log(CT_LOG_WARN, "%s: dropped %" PRId64 " line(s) that do not parse (cut short by a crash?)", path,
                   torn);
        if (st == CT_OK && n_dropped) *n_dropped = dropped;
    }
    close(r.fd);
    ct_free(r.buf);
    ct_free(obuf);
    return st;
}

// ---- all summaries of a run ------------------------------------------------

const char *ct_summary_mode_name(ct_summary_mode mode) { return mode == CT_SUMMARY_EVAL ? "eval" : "train"; }

struct ct_summary {
    ct_metrics_writer *metrics;
    ct_tb_writer *tb[2];
};

ct_status ct_summary_close(ct_summary *s, ct_error *err) {
    if (!s) return CT_OK;
    ct_status st = ct_metrics_writer_close(s->metrics, err);
    for (int i = 0; i < 2; i++) {
        ct_status r = ct_tb_writer_close(s->tb[i], st == CT_OK ? err : NULL);
        if (st == CT_OK) st = r;
    }
    ct_free(s);
    return st;
}

ct_status ct_summary_open(ct_summary **out, const char *output_dir, int64_t resume_step, ct_error *err) {
    CT_ASSERT(out && output_dir && resume_step >= 0);
    *out = NULL;
    size_t cap = strlen(output_dir) + 32;
    char *path = ct_malloc(cap);
    ct_summary *s = ct_calloc(1, sizeof *s);
    ct_status st = ct_fs_mkdirs(output_dir, err);
    if (st == CT_OK) {
        snprintf(path, cap, "%s/metrics.jsonl", output_dir);
        int64_t dropped = 0;
        st = ct_metrics_truncate_after(path, resume_step, &dropped, err);
        if (st == CT_OK && dropped > 0)
            ct_log(CT_LOG_INFO, "%s: removed %" PRId64 " line(s) past step %" PRId64 ", where the run resumes", path,
                   dropped, resume_step);
    }
    if (st == CT_OK) st = ct_metrics_writer_open(&s->metrics, path, err);
    for (int i = 0; i < 2 && st == CT_OK; i++) {
        snprintf(path, cap, "%s/%s", output_dir, ct_summary_mode_name((ct_summary_mode)i));
        st = ct_tb_writer_open(&s->tb[i], path, err);
        if (st == CT_OK) st = ct_tb_writer_session_start(s->tb[i], resume_step + 1, err);
        if (st == CT_OK) st = ct_tb_writer_flush(s->tb[i], err);
    }
    ct_free(path);
    if (st != CT_OK) {
        ct_summary_close(s, NULL);
        return st;
    }
    *out = s;
    return CT_OK;
}

ct_status ct_summary_scalar(ct_summary *s, ct_summary_mode mode, int64_t step, const char *tag, double value,
                            ct_error *err) {
    CT_ASSERT(s && tag && (mode == CT_SUMMARY_TRAIN || mode == CT_SUMMARY_EVAL));
    CT_TRY(ct_metrics_writer_add(s->metrics, step, ct_summary_mode_name(mode), tag, value, err));
    return ct_tb_writer_scalar(s->tb[mode], tag, step, (float)value, err);
}

ct_status ct_summary_flush(ct_summary *s, ct_error *err) {
    CT_ASSERT(s);
    CT_TRY(ct_metrics_writer_flush(s->metrics, err));
    for (int i = 0; i < 2; i++) CT_TRY(ct_tb_writer_flush(s->tb[i], err));
    return CT_OK;
}

// ---- terminal output ------------------------------------------------------

size_t ct_format_step_line(char *buf, size_t cap, int64_t step, const char *mode, const char *name, int name_width,
                           double value) {
    // Trax: 'Step % 6d: %s' % (step, '%s %s | % .8f' % (mode.ljust(5), name.rjust(width), value))
    int n = snprintf(buf, cap, "Step % 6" PRId64 ": %-5s %*s | % .8f", step, mode, name_width, name, value);
    return n < 0 ? 0 : (size_t)n;
}

static int fmt_rate(char *buf, size_t cap, double r) {
    if (r < 0 || !isfinite(r)) return snprintf(buf, cap, "-");
    if (r >= 1e6) return snprintf(buf, cap, "%.2fM", r / 1e6);
    if (r >= 1e3) return snprintf(buf, cap, "%.2fk", r / 1e3);
    return snprintf(buf, cap, "%.2f", r);
}

static int fmt_eta(char *buf, size_t cap, double s) {
    if (s < 0 || !isfinite(s) || s > 1e9) return snprintf(buf, cap, "-");
    long long t = (long long)(s + 0.5);
    if (t >= 3600) return snprintf(buf, cap, "%lldh%02lldm%02llds", t / 3600, t / 60 % 60, t % 60);
    if (t >= 60) return snprintf(buf, cap, "%lldm%02llds", t / 60, t % 60);
    return snprintf(buf, cap, "%llds", t);
}

size_t ct_progress_format(char *buf, size_t cap, int64_t step, int64_t total, double loss, double steps_per_s,
                          double tokens_per_s, double eta_s) {
    char sps[32], tps[32], eta[32];
    fmt_rate(sps, sizeof sps, steps_per_s);
    fmt_rate(tps, sizeof tps, tokens_per_s);
    fmt_eta(eta, sizeof eta, eta_s);
    int n = snprintf(buf, cap, "step %" PRId64 "/%" PRId64 " | loss %.4f | %s steps/s | %s tokens/s | ETA %s", step,
                     total, loss, sps, tps, eta);
    return n < 0 ? 0 : (size_t)n;
}

struct ct_progress {
    FILE *f;
    bool tty;
    bool started, drawn;
    int64_t total, step0, tokens;
    double t0, last_draw, log_interval;
};

ct_progress *ct_progress_new(FILE *stream, int64_t total_steps, double log_interval_s) {
    ct_progress *p = ct_calloc(1, sizeof *p);
    p->f = stream ? stream : stderr;
    p->tty = isatty(fileno(p->f)) == 1;
    p->total = total_steps;
    p->log_interval = log_interval_s;
    return p;
}

void ct_progress_free(ct_progress *p) { ct_free(p); }
bool ct_progress_active(const ct_progress *p) { return p && p->tty; }

void ct_progress_update(ct_progress *p, int64_t step, double loss, int64_t tokens) {
    if (!p) return;
    double t = ct_now_s();
    if (!p->started) {
        // Rates count from here: the work of this first step happened before.
        p->started = true;
        p->t0 = p->last_draw = t;
        p->step0 = step;
        p->tokens = 0;
    } else p->tokens += tokens;
    if (p->tty ? p->drawn && t - p->last_draw < 0.1 && step < p->total
               : t - p->last_draw < p->log_interval || step >= p->total)
        return;
    double dt = t - p->t0;
    double sps = dt > 0 && step > p->step0 ? (double)(step - p->step0) / dt : -1;
    double tps = dt > 0 && step > p->step0 ? (double)p->tokens / dt : -1;
    double eta = sps > 0 ? (double)(p->total - step) / sps : -1;
    char line[256];
    ct_progress_format(line, sizeof line, step, p->total, loss, sps, tps, eta);
    if (p->tty) fprintf(p->f, "\r%s\033[K", line);
    else fprintf(p->f, "%s\n", line);
    fflush(p->f);
    p->drawn = p->tty;
    p->last_draw = t;
}

void ct_progress_clear(ct_progress *p) {
    if (!p || !p->tty || !p->drawn) return;
    fputs("\r\033[K", p->f);
    fflush(p->f);
    p->drawn = false;
}

void ct_progress_finish(ct_progress *p) {
    if (!p || !p->tty || !p->drawn) return;
    fputc('\n', p->f);
    fflush(p->f);
    p->drawn = false;
}
