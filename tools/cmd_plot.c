// ctrax plot: an SVG of the train and eval curves in metrics.jsonl.
//
// The SVG is written by hand: one panel per metric, each with its axes, tick
// labels, grid, a legend and one polyline per mode (train, eval) through the
// finite values in step order. Values that are null in metrics.jsonl (NaN or
// infinite) are left out of the line and marked with a red cross at the top
// of the panel. Each polyline carries data-metric, data-mode and data-points
// attributes, so a test (or a script) can find the curves without rendering.
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "commands.h"
#include "ctrax/core/memory.h"
#include "ctrax/train/checkpoint.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrax plot METRICS_JSONL_OR_OUTPUT_DIR [-o OUT.svg] [--metrics a,b]\n"
            "\n"
            "Draws the loss and metric curves of a training run (its metrics.jsonl) as an\n"
            "SVG: one panel per metric, the train and eval values against the step.\n"
            "\n"
            "options:\n"
            "  -o, --output FILE   where to write the SVG; '-' is stdout\n"
            "                      [metrics.svg beside metrics.jsonl]\n"
            "  --metrics a,b       the metrics to draw, by name ('loss' or 'metrics/loss');\n"
            "                      'all' draws every metric, training/* too [every metrics/*]\n"
            "  -h, --help          show this help\n");
}

// ---- reading metrics.jsonl --------------------------------------------------------

typedef struct point {
    int64_t step;
    double value;  // NAN for null
} point;

// What a stretch of steps keeps of its values: the finite values of the
// smallest and the largest step and the smallest and the largest value
// (the points a pixel column of the curve shows: where it enters, its
// extent, spikes included, and where it leaves), and a count and the range
// of steps of those that are not finite. A reduced series is bins of these,
// and a curve is drawn through one per pixel column.
typedef struct bin {
    point first, last, lo, hi;  // valid when n > 0
    int64_t n;                  // finite values
    int64_t n_bad;              // values that are not finite
    int64_t bad_first, bad_last;
} bin;

// Adds n values that are not finite, at steps first to last.
static void bin_add_bad(bin *b, int64_t first, int64_t last, int64_t n) {
    b->bad_first = b->n_bad && b->bad_first < first ? b->bad_first : first;
    b->bad_last = b->n_bad && b->bad_last > last ? b->bad_last : last;
    b->n_bad += n;
}

// Adds one value. A step already held by a slot is a step written again:
// the later value replaces the earlier there. (A reduced series cannot see
// a step written again whose earlier value it no longer holds: that step
// counts twice, and the bin's extreme is the slots' after a replacement.
// Only a run's metrics.jsonl that was not cut back on resume has such steps.)
static void bin_add(bin *b, point p) {
    if (!isfinite(p.value)) {
        bin_add_bad(b, p.step, p.step, 1);
        return;
    }
    if (!b->n) {
        b->first = b->last = b->lo = b->hi = p;
        b->n = 1;
        return;
    }
    point *slot[4] = {&b->first, &b->last, &b->lo, &b->hi};
    bool again = false;
    for (int i = 0; i < 4; i++)
        if (slot[i]->step == p.step) {
            slot[i]->value = p.value;
            again = true;
        }
    if (again) {  // lo and hi are again the extremes of what the slots hold
        for (int i = 0; i < 4; i++) {
            if (slot[i]->value < b->lo.value) b->lo = *slot[i];
            if (slot[i]->value > b->hi.value) b->hi = *slot[i];
        }
    } else {
        b->n++;
    }
    if (p.step < b->first.step) b->first = p;
    if (p.step > b->last.step) b->last = p;
    if (p.value < b->lo.value) b->lo = p;
    if (p.value > b->hi.value) b->hi = p;
}

// The finite values b holds (n > 0), each step once, in step order: first
// and last are the ends, lo and hi between. Their count (1 to 4).
static int bin_points(const bin *b, point out[4]) {
    const bool lo_first = b->lo.step <= b->hi.step;
    const point ps[4] = {b->first, lo_first ? b->lo : b->hi, lo_first ? b->hi : b->lo, b->last};
    int n = 0;
    for (int k = 0; k < 4; k++)
        if (k == 0 || ps[k].step != ps[k - 1].step) out[n++] = ps[k];
    return n;
}

// A series is kept as it was read while it has at most PLOT_EXACT_MAX
// values (128 KiB; every run's eval curves, and a train curve to some 80k
// steps logging every 10); past that it is reduced to PLOT_BINS bins of a
// power-of-two count of steps each, which widen as its steps spread: 192
// KiB a series whatever the file's length. The bins cover the series'
// steps in at least PLOT_BINS / 2 of them, some 2.4 to a pixel column of
// the plot (PANEL_W - PAD_L - PAD_R, 428). A column then draws what one
// drawn from every value draws but where a bin straddles its edge and that
// bin's extreme lies in the next column (a million noisy steps: 1% of the
// curve's pixels at its noise's edge, where 1024 bins lost 2.5%; spikes,
// the extremes of their bins, stay).
#define PLOT_EXACT_MAX 8192
#define PLOT_BINS 2048

typedef struct series {
    char *metric, *mode;
    point *p;  // exact: the values in the order read (in step order once sorted)
    int n, cap;
    bin *bins;  // reduced (p NULL): bin i holds steps [origin + i * width, + width)
    int64_t origin, width;
    int64_t step_lo, step_hi;  // reduced: the range of its steps
    // Once read (series_finish): values (each step once), the finite ones,
    // the range of the steps and of the finite values.
    int64_t count, finite, first_step, last_step;
    double vmin, vmax;
} series;

typedef struct metrics {
    series *s;
    int n, cap;
} metrics;

// A run logs a few dozen series; a file with thousands is not one to draw
// (each new line scans the series, each panel is drawn: 20,000 names took
// 13 s and made a 37 MB SVG).
#define PLOT_MAX_SERIES 1024
#define PLOT_MAX_PANELS 64

// The series of (metric, mode), made if new; NULL after a message when
// memory runs out (their count comes from the file) or there would be more
// than PLOT_MAX_SERIES.
static series *find_series(metrics *m, const char *metric, const char *mode) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->s[i].metric, metric) && !strcmp(m->s[i].mode, mode)) return &m->s[i];
    if (m->n == PLOT_MAX_SERIES) {
        fprintf(stderr, "ctrax plot: more than %d (metric, mode) series: not a metrics file of a run\n",
                PLOT_MAX_SERIES);
        return NULL;
    }
    series *grown = ctrax_grow("plot", m->s, m->n, &m->cap, sizeof *m->s, 16, "the list of series");
    if (!grown) return NULL;
    m->s = grown;
    series *s = &m->s[m->n++];
    memset(s, 0, sizeof *s);
    s->metric = ct_strdup(metric);  // names: bookkeeping (memory.h)
    s->mode = ct_strdup(mode);
    return s;
}

static void metrics_free(metrics *m) {
    for (int i = 0; i < m->n; i++) {
        free(m->s[i].metric);
        free(m->s[i].mode);
        free(m->s[i].p);
        free(m->s[i].bins);
    }
    free(m->s);
}

typedef struct tagged {
    point p;
    int index;  // the order lines came in
} tagged;

static int cmp_tagged(const void *a, const void *b) {
    const tagged *x = a, *y = b;
    if (x->p.step != y->p.step) return x->p.step < y->p.step ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

// Sorts by step, keeping the last value written for a step (a resumed run
// may have written a step twice before metrics.jsonl was truncated). False
// after a message when memory runs out.
static bool sort_series(series *s) {
    tagged *t = ctrax_malloc("plot", (size_t)s->n * sizeof *t, "sorting a series");
    if (!t) return false;
    for (int i = 0; i < s->n; i++) t[i] = (tagged){s->p[i], i};
    qsort(t, (size_t)s->n, sizeof *t, cmp_tagged);
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        if (n > 0 && s->p[n - 1].step == t[i].p.step) s->p[n - 1] = t[i].p;
        else s->p[n++] = t[i].p;
    }
    s->n = n;
    free(t);
    return true;
}

// a / b rounded down (b > 0): steps may be negative.
static int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0); }

// A step a bin holds (every bin with something in it has one).
static int64_t bin_step(const bin *b) { return b->n ? b->first.step : b->bad_first; }

// Makes the bins cover the steps [lo, hi] (|steps| <= 2^53, so nothing
// overflows): the width doubles until they fit in PLOT_BINS bins, and the
// bins move, leaving half the room to spare on each side, so steps read in
// any order move them O(log) times. False after a message when memory runs out.
static bool bins_cover(series *s, int64_t lo, int64_t hi) {
    int64_t w = s->width ? s->width : 1;
    while (floor_div(hi, w) - floor_div(lo, w) >= PLOT_BINS) w *= 2;
    int64_t used = floor_div(hi, w) - floor_div(lo, w) + 1;
    int64_t origin = (floor_div(lo, w) - (PLOT_BINS - used) / 2) * w;
    bin *b = ctrax_malloc("plot", PLOT_BINS * sizeof *b, "the bins of a series");
    if (!b) return false;
    memset(b, 0, PLOT_BINS * sizeof *b);
    // A bin of the old width lies in one of the new (w is a multiple of
    // it, origin of w): it merges whole.
    for (int i = 0; s->bins && i < PLOT_BINS; i++) {
        const bin *old = &s->bins[i];
        if (!old->n && !old->n_bad) continue;
        bin *to = &b[(bin_step(old) - origin) / w];
        if (old->n) {
            point ps[4];
            int64_t n0 = to->n;
            for (int k = 0, n = bin_points(old, ps); k < n; k++) bin_add(to, ps[k]);
            to->n = n0 + old->n;  // the slots' count is not the bin's
        }
        if (old->n_bad) bin_add_bad(to, old->bad_first, old->bad_last, old->n_bad);
    }
    free(s->bins);
    s->bins = b;
    s->origin = origin;
    s->width = w;
    return true;
}

// Adds one value to a reduced series.
static bool bins_add(series *s, point p) {
    int64_t lo = p.step < s->step_lo ? p.step : s->step_lo, hi = p.step > s->step_hi ? p.step : s->step_hi;
    if ((p.step < s->origin || p.step >= s->origin + PLOT_BINS * s->width) && !bins_cover(s, lo, hi)) return false;
    s->step_lo = lo;
    s->step_hi = hi;
    bin_add(&s->bins[(p.step - s->origin) / s->width], p);
    return true;
}

// Adds one value to s: kept as it is while s is small, then into its bins.
// False after a message when memory runs out.
static bool series_add(series *s, point p) {
    if (!s->bins && s->n == PLOT_EXACT_MAX) {
        if (!sort_series(s)) return false;  // steps written again may leave room
        if (s->n == PLOT_EXACT_MAX) {
            s->step_lo = s->p[0].step;
            s->step_hi = s->p[s->n - 1].step;
            if (!bins_cover(s, s->step_lo, s->step_hi)) return false;
            for (int i = 0; i < s->n; i++) bin_add(&s->bins[(s->p[i].step - s->origin) / s->width], s->p[i]);
            free(s->p);
            s->p = NULL;
            s->n = s->cap = 0;
        }
    }
    if (s->bins) return bins_add(s, p);
    point *grown = ctrax_grow("plot", s->p, s->n, &s->cap, sizeof *s->p, 64, "a series' points");
    if (!grown) return false;
    s->p = grown;
    s->p[s->n++] = p;
    return true;
}

// Calls fn with what s holds in step order: every value of an exact
// series (n 1, last its step); the kept points of each bin of a reduced
// one (its finite slots, each step once), then the bin's values that are
// not finite as one point: n of them, at steps p.step to last.
typedef void (*point_fn)(void *ctx, point p, int64_t n, int64_t last);

static void series_each(const series *s, point_fn fn, void *ctx) {
    for (int i = 0; i < s->n; i++) fn(ctx, s->p[i], 1, s->p[i].step);
    for (int i = 0; s->bins && i < PLOT_BINS; i++) {
        const bin *b = &s->bins[i];
        point ps[4];
        for (int k = 0, n = b->n ? bin_points(b, ps) : 0; k < n; k++) fn(ctx, ps[k], 1, ps[k].step);
        if (b->n_bad) fn(ctx, (point){b->bad_first, NAN}, b->n_bad, b->bad_last);
    }
}

// The counts and ranges of a series, once it is read.
static void series_finish(series *s) {
    s->count = s->finite = 0;
    s->first_step = INT64_MAX;
    s->last_step = INT64_MIN;
    s->vmin = INFINITY;
    s->vmax = -INFINITY;
    for (int i = 0; i < s->n; i++) {
        const point *p = &s->p[i];
        s->count++;
        if (isfinite(p->value)) {
            s->finite++;
            s->vmin = fmin(s->vmin, p->value);
            s->vmax = fmax(s->vmax, p->value);
        }
        s->first_step = p->step < s->first_step ? p->step : s->first_step;
        s->last_step = p->step > s->last_step ? p->step : s->last_step;
    }
    for (int i = 0; s->bins && i < PLOT_BINS; i++) {
        const bin *b = &s->bins[i];
        s->count += b->n + b->n_bad;
        s->finite += b->n;
        if (b->n) {
            s->vmin = fmin(s->vmin, b->lo.value);
            s->vmax = fmax(s->vmax, b->hi.value);
        }
    }
    if (s->bins) {
        s->first_step = s->step_lo;
        s->last_step = s->step_hi;
    }
}

// What read_metrics skipped: how many lines, and the first one and why.
typedef struct skips {
    int64_t n, first_line;
    char first_why[CT_ERROR_MSG_MAX];
} skips;

// A line of a MiB or more is no metrics line (ct_metrics_truncate_after
// drops such lines too): it is skipped without being held.
#define PLOT_LINE_MAX ((size_t)1 << 20)

static void skip(skips *sk, int64_t line_no, const char *why) {
    if (!sk->n++) {
        sk->first_line = line_no;
        snprintf(sk->first_why, sizeof sk->first_why, "%s", why);
    }
}

// Adds the metrics line `line` (n bytes, number line_no of path) to m, or
// counts it in sk when it is not one (a NUL in it too: a file a crash left
// zeros in). False after a message when memory runs out.
static bool read_line(const char *path, const char *line, size_t n, int64_t line_no, metrics *m, skips *sk) {
    size_t blank = 0;
    while (blank < n && (line[blank] == ' ' || line[blank] == '\t' || line[blank] == '\r')) blank++;
    if (blank == n) return true;
    char what[4200];
    snprintf(what, sizeof what, "%s:%lld", path, (long long)line_no);
    ct_error perr = {0};
    cJSON *o = ct_json_parse(line, n, what, &perr);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(o, "mode");
    const cJSON *metric = cJSON_GetObjectItemCaseSensitive(o, "metric");
    const cJSON *value = cJSON_GetObjectItemCaseSensitive(o, "value");
    // A step beyond int64 (or 2^53, where doubles stop being exact) is no step.
    if (!cJSON_IsNumber(step) || !(fabs(step->valuedouble) <= 9007199254740992.0) || !cJSON_IsString(mode) ||
        !cJSON_IsString(metric) || !(cJSON_IsNumber(value) || cJSON_IsNull(value))) {
        skip(sk, line_no, o ? "not a metrics line" : perr.msg);
        cJSON_Delete(o);
        return true;
    }
    series *s = find_series(m, metric->valuestring, mode->valuestring);
    bool ok = s && series_add(s, (point){(int64_t)step->valuedouble, cJSON_IsNumber(value) ? value->valuedouble : NAN});
    cJSON_Delete(o);
    return ok;
}

// Reads path into m a line at a time, in memory bounded whatever its
// length; lines that are not metrics lines are skipped with a warning (the
// last one may be cut short while a run writes it).
static int read_metrics(const char *path, metrics *m) {
    ct_error err;
    ct_fs_lines r = {.path = path, .cap = PLOT_LINE_MAX};
    struct stat sb;
    if (ct_fs_open_regular(path, &r.fd, &sb, &err) != CT_OK) {
        fprintf(stderr, "ctrax plot: %s\n", err.msg);
        return CTRAX_EXIT_ERROR;
    }
    r.buf = ctrax_malloc("plot", PLOT_LINE_MAX, "reading metrics.jsonl");
    int64_t line_no = 0;
    skips sk = {0};
    bool ok = r.buf != NULL;
    while (ok) {
        const char *line;
        size_t len;
        bool nl, more;
        if (ct_fs_lines_next(&r, &line, &len, &nl, &more, &err) != CT_OK) {
            fprintf(stderr, "ctrax plot: %s\n", err.msg);
            ok = false;
        }
        if (!ok || !more) break;
        line_no++;
        if (!line) {
            char why[64];
            snprintf(why, sizeof why, "longer than %zu bytes", PLOT_LINE_MAX - 1);
            skip(&sk, line_no, why);
            continue;
        }
        ok = read_line(path, line, len, line_no, m, &sk);
    }
    close(r.fd);
    free(r.buf);
    if (ok && sk.n)
        fprintf(stderr,
                "ctrax plot: %s: skipped %lld line(s) that are not metrics lines (the first: line %lld: %s)\n",
                path, (long long)sk.n, (long long)sk.first_line, sk.first_why);
    for (int i = 0; ok && i < m->n; i++) {
        ok = m->s[i].bins || sort_series(&m->s[i]);
        series_finish(&m->s[i]);
    }
    return ok ? CTRAX_EXIT_OK : CTRAX_EXIT_ERROR;
}

// ---- choosing the panels ------------------------------------------------------------

typedef struct names {
    const char **v;
    int n, cap;
} names;

static bool names_has(const names *ns, const char *s) {
    for (int i = 0; i < ns->n; i++)
        if (!strcmp(ns->v[i], s)) return true;
    return false;
}

static void names_add(names *ns, const char *s) {
    if (names_has(ns, s)) return;
    if (ns->n == ns->cap) {  // at most one per series, which are already held: bookkeeping (memory.h)
        ns->cap = ns->cap ? 2 * ns->cap : 16;
        ns->v = ct_realloc(ns->v, (size_t)ns->cap * sizeof *ns->v);
    }
    ns->v[ns->n++] = s;
}

static bool metric_known(const metrics *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->s[i].metric, name)) return true;
    return false;
}

static int choose_panels_of(const metrics *m, const char *request, const char *path, names *out);

// The panels: the requested metrics, or every metrics/* one (loss first);
// at most PLOT_MAX_PANELS.
static int choose_panels(const metrics *m, const char *request, const char *path, names *out) {
    int rc = choose_panels_of(m, request, path, out);
    if (rc == CTRAX_EXIT_OK && out->n > PLOT_MAX_PANELS) {
        fprintf(stderr, "ctrax plot: %s: %d metrics to draw, at most %d panels: choose them with --metrics a,b,...\n",
                path, out->n, PLOT_MAX_PANELS);
        return CTRAX_EXIT_ERROR;
    }
    return rc;
}

static int choose_panels_of(const metrics *m, const char *request, const char *path, names *out) {
    if (!request) {
        if (metric_known(m, "metrics/loss")) names_add(out, "metrics/loss");
        for (int i = 0; i < m->n; i++)
            if (!strncmp(m->s[i].metric, "metrics/", 8)) names_add(out, m->s[i].metric);
        if (out->n == 0) {
            fprintf(stderr, "ctrax plot: %s has no metrics/* values%s\n", path,
                    m->n ? " (--metrics all draws the others)" : "");
            return CTRAX_EXIT_ERROR;
        }
        return CTRAX_EXIT_OK;
    }
    if (!strcmp(request, "all")) {
        for (int i = 0; i < m->n; i++) names_add(out, m->s[i].metric);
        if (out->n == 0) {
            fprintf(stderr, "ctrax plot: %s holds no metrics\n", path);
            return CTRAX_EXIT_ERROR;
        }
        return CTRAX_EXIT_OK;
    }
    const char *p = request;
    while (*p) {
        size_t len = strcspn(p, ",");
        char want[256];
        snprintf(want, sizeof want, "%.*s", (int)(len < 200 ? len : 200), p);
        char prefixed[300];
        snprintf(prefixed, sizeof prefixed, "metrics/%s", want);
        const char *found = NULL;
        for (int i = 0; i < m->n && !found; i++)
            if (!strcmp(m->s[i].metric, want)) found = m->s[i].metric;
        for (int i = 0; i < m->n && !found; i++)
            if (!strcmp(m->s[i].metric, prefixed)) found = m->s[i].metric;
        if (!found) {
            // The file's names may be anyone's: escape sequences as '?'.
            fprintf(stderr, "ctrax plot: %s has no metric '%s'; it has:", path, want);
            names all = {0};
            for (int i = 0; i < m->n; i++) names_add(&all, m->s[i].metric);
            for (int i = 0; i < all.n; i++) {
                fputc(' ', stderr);
                ctrax_put_text(stderr, all.v[i]);
            }
            fprintf(stderr, "\n");
            free(all.v);
            return CTRAX_EXIT_ERROR;
        }
        names_add(out, found);
        p += len;
        if (*p == ',') p++;
    }
    return CTRAX_EXIT_OK;
}

// ---- SVG ------------------------------------------------------------------------------

// The SVG as it is written; its size follows the file's points, so its
// growth is checked: after a failure (failed set, s freed) put does nothing.
typedef struct buf {
    char *s;
    size_t n, cap;
    bool failed;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    while (!b->failed) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->s && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *grown = ctrax_malloc("plot", cap, "the SVG");
        if (grown && b->n) memcpy(grown, b->s, b->n);
        free(b->s);
        b->s = grown;
        b->cap = grown ? cap : 0;
        b->failed = !grown;
    }
}

// Text as XML character data or an attribute value: markup characters
// escaped, control characters (which XML 1.0 forbids) and bytes that are not
// valid UTF-8 replaced by '?'.
static void put_text(buf *b, const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    size_t left = strlen(s);
    while (*u) {
        unsigned c = *u;
        if (c >= 0x80) {
            size_t k = ct_utf8_len(u, left);
            put(b, "%.*s", k ? (int)k : 1, k ? (const char *)u : "?");
            u += k ? k : 1;
            left -= k ? k : 1;
            continue;
        }
        switch (c) {
        case '&': put(b, "&amp;"); break;
        case '<': put(b, "&lt;"); break;
        case '>': put(b, "&gt;"); break;
        case '"': put(b, "&quot;"); break;
        case '\'': put(b, "&apos;"); break;
        default: put(b, "%c", c < 0x20 || c == 0x7f ? '?' : (char)c);
        }
        u++;
        left--;
    }
}

// Ticks at multiples of a 1, 2 or 5 step, about `target` of them in [lo, hi].
typedef struct ticks {
    double first, step;
    int n;
} ticks;

static ticks nice_ticks(double lo, double hi, int target, bool integer) {
    ticks t = {lo, 1, 1};
    double range = hi - lo;
    if (!(range > 0)) return t;
    double raw = range / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
    t.step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
    if (integer && t.step < 1) t.step = 1;
    t.first = ceil(lo / t.step - 1e-9) * t.step;
    double n = floor((hi - t.first) / t.step + 1e-9) + 1;
    if (!isfinite(t.first) || !(n >= 1 && n <= 50)) return (ticks){lo, 1, 1};  // values near the limits of a double
    t.n = (int)n;
    return t;
}

static void tick_label(char *s, size_t cap, double v, double step) {
    if (fabs(v) < step * 1e-9) v = 0;  // no "-0" or "1e-17"
    double a = fabs(v);
    if (a != 0 && (a >= 1e6 || a < 1e-4)) {
        snprintf(s, cap, "%.3g", v);
        return;
    }
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    if (decimals > 8) decimals = 8;
    snprintf(s, cap, "%.*f", decimals, v);
}

static const char *mode_color(const char *mode, int index) {
    static const char *other[] = {"#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    if (!strcmp(mode, "train")) return "#1f77b4";
    if (!strcmp(mode, "eval")) return "#ff7f0e";
    return other[index % 5];
}

enum { PANEL_W = 520, PANEL_H = 320, PAD_L = 72, PAD_R = 20, PAD_T = 40, PAD_B = 46, HEADER = 46, GAP = 16 };
#define MARKERS_UP_TO 60  // points per series drawn as dots as well

// A panel's plot area on the page and the ranges it shows.
typedef struct frame {
    double x0, y0, pw, ph;  // top left, width and height of the plot area
    double xmin, xmax, ymin, ymax;
} frame;

static double px(const frame *f, double step) { return f->x0 + (step - f->xmin) / (f->xmax - f->xmin) * f->pw; }
// Halves keep differences of values near the limits of a double finite.
static double py(const frame *f, double v) {
    return f->y0 + f->ph - (v / 2 - f->ymin / 2) / (f->ymax / 2 - f->ymin / 2) * f->ph;
}

// The ranges over every mode's finite values of the ns series in ss, with
// a margin of 5% (10% of the value for a flat line).
static void panel_ranges(frame *f, const series *const *ss, int ns) {
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (int i = 0; i < ns; i++) {
        xmin = fmin(xmin, (double)ss[i]->first_step);
        xmax = fmax(xmax, (double)ss[i]->last_step);
        ymin = fmin(ymin, ss[i]->vmin);
        ymax = fmax(ymax, ss[i]->vmax);
    }
    if (!(xmin <= xmax)) xmin = 0, xmax = 1;
    if (xmin == xmax) xmin -= 1, xmax += 1;
    if (!(ymin <= ymax)) ymin = 0, ymax = 1;
    double d = ymin == ymax ? (fabs(ymin) > 0 ? fabs(ymin) * 0.1 : 1) : (ymax / 2 - ymin / 2) * 0.1;
    f->xmin = xmin;
    f->xmax = xmax;
    f->ymin = fmax(ymin - d, -DBL_MAX);
    f->ymax = fmin(ymax + d, DBL_MAX);
}

// Grid lines, the frame, tick labels and the x label.
static void draw_axes(buf *b, const frame *f) {
    ticks tx = nice_ticks(f->xmin, f->xmax, 6, true), ty = nice_ticks(f->ymin, f->ymax, 6, false);
    put(b, "<g class=\"grid\" stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
    for (int i = 0; i < tx.n; i++) {
        double x = px(f, tx.first + i * tx.step);
        put(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, f->y0, x, f->y0 + f->ph);
    }
    for (int i = 0; i < ty.n; i++) {
        double y = py(f, ty.first + i * ty.step);
        put(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", f->x0, y, f->x0 + f->pw, y);
    }
    put(b, "</g>\n");
    put(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#555555\"/>\n", f->x0,
        f->y0, f->pw, f->ph);
    put(b, "<g class=\"x-ticks\" font-size=\"11\" text-anchor=\"middle\" fill=\"#333333\">\n");
    for (int i = 0; i < tx.n; i++) {
        char s[48];
        double v = tx.first + i * tx.step;
        tick_label(s, sizeof s, v, tx.step);
        put(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", px(f, v), f->y0 + f->ph + 16, s);
    }
    put(b, "</g>\n<g class=\"y-ticks\" font-size=\"11\" text-anchor=\"end\" fill=\"#333333\">\n");
    for (int i = 0; i < ty.n; i++) {
        char s[48];
        double v = ty.first + i * ty.step;
        tick_label(s, sizeof s, v, ty.step);
        put(b, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", f->x0 - 6, py(f, v) + 4, s);
    }
    put(b, "</g>\n");
    put(b, "<text class=\"x-label\" x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">step</text>\n",
        f->x0 + f->pw / 2, f->y0 + f->ph + 36);
}

// The pixel columns of a plot, each with what it shows of one series.
enum { PLOT_COLUMNS = PANEL_W - PAD_L - PAD_R };
typedef struct columns {
    const frame *f;
    bin c[PLOT_COLUMNS];
} columns;

static void column_add(void *ctx, point p, int64_t n, int64_t last) {
    columns *cs = ctx;
    // The column of x as the SVG writes it (one decimal; x0 is whole): a
    // point rounded across a column's edge is drawn in the next one.
    double x = floor(round((px(cs->f, (double)p.step) - cs->f->x0) * 10) / 10);  // in [0, PLOT_COLUMNS]
    int i = x < 0 ? 0 : x >= PLOT_COLUMNS ? PLOT_COLUMNS - 1 : (int)x;
    if (isfinite(p.value)) bin_add(&cs->c[i], p);
    else bin_add_bad(&cs->c[i], p.step, last, n);  // in the column of the first
}

typedef struct marker_ctx {
    buf *b;
    const frame *f;
} marker_ctx;

static void put_marker(void *ctx, point p, int64_t n, int64_t last) {
    (void)n, (void)last;
    const marker_ctx *mc = ctx;
    if (isfinite(p.value))
        put(mc->b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\"/>\n", px(mc->f, (double)p.step), py(mc->f, p.value));
}

// One series: a polyline through its finite values, dots where there are
// few points, and crosses at the top for values that are not finite. Each
// pixel column draws its first, lowest, highest and last value (in step
// order) and one cross: a curve of a million steps looks as one through
// every value, spikes included, in at most 4 points a column. A column of
// at most 4 values (every curve of up to some 400 values) draws them all.
static void draw_curve(buf *b, const frame *f, const char *metric, const series *s, const char *color) {
    columns cs = {.f = f};  // 37 KiB
    series_each(s, column_add, &cs);
    put(b, "<polyline class=\"curve\" data-metric=\"");
    put_text(b, metric);
    put(b, "\" data-mode=\"");
    put_text(b, s->mode);
    put(b, "\" data-points=\"%lld\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"",
        (long long)s->finite, color);
    int j = 0;
    for (int i = 0; i < PLOT_COLUMNS; i++) {
        point ps[4];
        for (int k = 0, n = cs.c[i].n ? bin_points(&cs.c[i], ps) : 0; k < n; k++)
            put(b, "%s%.1f,%.1f", j++ ? " " : "", px(f, (double)ps[k].step), py(f, ps[k].value));
    }
    put(b, "\"/>\n");
    if (s->finite <= MARKERS_UP_TO) {
        put(b, "<g class=\"markers\" fill=\"%s\">\n", color);
        marker_ctx mc = {b, f};
        series_each(s, put_marker, &mc);
        put(b, "</g>\n");
    }
    if (s->finite == s->count) return;
    put(b, "<g class=\"nonfinite\" stroke=\"#d62728\" stroke-width=\"1.5\">\n");
    for (int i = 0; i < PLOT_COLUMNS; i++) {
        const bin *c = &cs.c[i];
        if (!c->n_bad) continue;
        double x = px(f, (double)c->bad_first), y = f->y0 + 6;
        put(b, "<path d=\"M%.1f %.1fl6 6m0 -6l-6 6\">", x - 3, y - 3);
        if (c->n_bad == 1) put(b, "<title>step %lld: not finite</title></path>\n", (long long)c->bad_first);
        else
            put(b, "<title>steps %lld to %lld: %lld values not finite</title></path>\n", (long long)c->bad_first,
                (long long)c->bad_last, (long long)c->n_bad);
    }
    put(b, "</g>\n");
}

// The legend, top right of the panel at (ox, oy): a line and "mode (n)"
// per curve, right to left (about 7 px a character at 12 px), the first row
// stopping short of the title (which ends near title_end), more rows below
// it as the width runs out, and "+N more" on the last row that fits above
// the plot's bottom: many modes once ran off the panel's left edge.
static void draw_legend(buf *b, const series *const *ss, int ns, double ox, double oy, double title_end) {
    const double right = ox + PANEL_W - PAD_R, bottom = oy + PANEL_H - PAD_B, row = 16;
    double lx = right, y = oy + 18, left = title_end + 12;
    for (int k = ns - 1; k >= 0; k--) {
        char label[96];
        snprintf(label, sizeof label, "%s (%lld)", ss[k]->mode, (long long)ss[k]->count);
        size_t fits = (size_t)((right - (ox + PAD_L) - 26) / 7);  // characters in a row
        if (strlen(label) > fits) memcpy(label + fits - 3, "...", 4);  // a mode's name is anyone's length
        double w = 7.0 * (double)strlen(label) + 26;
        if (lx - w < left && lx < right) {  // a new row
            y += row;
            lx = right;
            left = ox + PAD_L;
            if (y + row + 4 > bottom) {  // no room for a row after this one: say how many are left
                put(b, "<g class=\"legend-more\"><text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" "
                       "text-anchor=\"end\">+%d more</text></g>\n",
                    right, y + 4, k + 1);
                return;
            }
        }
        lx -= w;
        put(b, "<g class=\"legend\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
               "stroke-width=\"2.5\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">",
            lx, y, lx + 16, y, mode_color(ss[k]->mode, k), lx + 20, y + 4);
        put_text(b, label);
        put(b, "</text></g>\n");
    }
}

static void draw_panel(buf *b, const metrics *m, const char *metric, double ox, double oy) {
    frame f = {.x0 = ox + PAD_L, .y0 = oy + PAD_T, .pw = PANEL_W - PAD_L - PAD_R, .ph = PANEL_H - PAD_T - PAD_B};
    // Every mode of the metric (a cap here once drew 32 of 40 modes, and
    // the summary still listed all 40).
    const series *ss[PLOT_MAX_SERIES];
    int ns = 0;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->s[i].metric, metric)) ss[ns++] = &m->s[i];
    panel_ranges(&f, ss, ns);
    put(b, "<g class=\"panel\" data-metric=\"");
    put_text(b, metric);
    put(b, "\">\n");
    put(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#dddddd\"/>\n", ox, oy,
        PANEL_W, PANEL_H);
    put(b, "<text class=\"panel-title\" x=\"%.1f\" y=\"%.1f\" font-size=\"14\" font-weight=\"bold\">", f.x0, oy + 22);
    put_text(b, metric);
    put(b, "</text>\n");
    draw_axes(b, &f);
    for (int k = 0; k < ns; k++) draw_curve(b, &f, metric, ss[k], mode_color(ss[k]->mode, k));
    draw_legend(b, ss, ns, ox, oy, f.x0 + 8.5 * (double)strlen(metric));  // the title: 14 px bold
    put(b, "</g>\n");
}

static char *render_svg(const metrics *m, const names *panels, const char *title) {
    int cols = panels->n > 1 ? 2 : 1, rows = (panels->n + cols - 1) / cols;
    int width = GAP + cols * (PANEL_W + GAP), height = HEADER + rows * (PANEL_H + GAP);
    buf b = {0};
    put(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    put(&b,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
        "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
        width, height, width, height);
    put(&b, "<title>");
    put_text(&b, title);
    put(&b, "</title>\n<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", width, height);
    put(&b, "<text class=\"title\" x=\"%d\" y=\"30\" font-size=\"18\" text-anchor=\"middle\">", width / 2);
    put_text(&b, title);
    put(&b, "</text>\n");
    for (int i = 0; i < panels->n; i++)
        draw_panel(&b, m, panels->v[i], GAP + (i % cols) * (PANEL_W + GAP), HEADER + (i / cols) * (PANEL_H + GAP));
    put(&b, "</svg>\n");
    return b.s;  // NULL when memory ran out (put said so)
}

// ---- the command ---------------------------------------------------------------------

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// Are a and b one file (a link or a name for the other)?
static bool same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int plot(const char *input, const char *output, const char *request) {
    char jsonl[4096], out_path[4096];
    // A path cut short would name another file (and the SVG another place).
    int n = is_dir(input) ? snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", input)
                          : snprintf(jsonl, sizeof jsonl, "%s", input);
    if (n < 0 || (size_t)n >= sizeof jsonl) {
        fprintf(stderr, "ctrax plot: %.100s...: the path is longer than %zu bytes\n", input, sizeof jsonl - 1);
        return CTRAX_EXIT_ERROR;
    }
    if (!output) {
        const char *slash = strrchr(jsonl, '/');
        n = slash ? snprintf(out_path, sizeof out_path, "%.*s/metrics.svg", (int)(slash - jsonl), jsonl)
                  : snprintf(out_path, sizeof out_path, "metrics.svg");
        if (n < 0 || (size_t)n >= sizeof out_path) {
            fprintf(stderr, "ctrax plot: %.100s...: the SVG's path beside it is longer than %zu bytes (give -o)\n",
                    jsonl, sizeof out_path - 1);
            return CTRAX_EXIT_ERROR;
        }
        output = out_path;
    }
    // -o naming the metrics file would replace a run's metrics by the SVG.
    if (strcmp(output, "-") && same_file(jsonl, output)) {
        fprintf(stderr, "ctrax plot: -o %s is the metrics file it reads: refusing to write the SVG over it\n", output);
        return CTRAX_EXIT_ERROR;
    }
    metrics m = {0};
    names panels = {0};
    int rc = read_metrics(jsonl, &m);
    if (rc == CTRAX_EXIT_OK) rc = choose_panels(&m, request, jsonl, &panels);
    if (rc != CTRAX_EXIT_OK) goto done;

    char title[4200];
    snprintf(title, sizeof title, "ctrax: %s", jsonl);
    char *svg = render_svg(&m, &panels, title);
    if (!svg) {
        rc = CTRAX_EXIT_ERROR;
        goto done;
    }
    bool to_stdout = !strcmp(output, "-");
    ct_error err;
    if (to_stdout) {
        fputs(svg, stdout);
        if (ctrax_flush_stdout("plot") != CTRAX_EXIT_OK) rc = CTRAX_EXIT_ERROR;
    } else if (ct_fs_write_atomic(output, svg, strlen(svg), &err) != CT_OK) {
        fprintf(stderr, "ctrax plot: %s\n", err.msg);
        rc = CTRAX_EXIT_ERROR;
    }
    free(svg);
    if (rc == CTRAX_EXIT_OK) {
        // What was drawn, on stdout unless the SVG went there; the file's
        // names as ctrax_put_text writes them (no escape sequences).
        FILE *f = to_stdout ? stderr : stdout;
        fprintf(f, "wrote %s: %d panel(s)\n", to_stdout ? "the SVG to stdout" : output, panels.n);
        for (int i = 0; i < panels.n; i++) {
            fputs("  ", f);
            ctrax_put_text(f, panels.v[i]);
            fputc(':', f);
            const char *sep = " ";  // the panel's series: "train ...; eval ..."
            for (int k = 0; k < m.n; k++)
                if (!strcmp(m.s[k].metric, panels.v[i])) {
                    fputs(sep, f);
                    sep = "; ";
                    ctrax_put_text(f, m.s[k].mode);
                    fprintf(f, " %lld point(s), steps %lld to %lld", (long long)m.s[k].count,
                            (long long)m.s[k].first_step, (long long)m.s[k].last_step);
                }
            fprintf(f, "\n");
        }
        if (!to_stdout) rc = ctrax_flush_stdout("plot");
    }
done:
    free(panels.v);
    metrics_free(&m);
    return rc;
}

// --metrics: names separated by commas, none empty.
static int check_metrics(const char *cmd, const char *v) {
    if (!v[0] || v[0] == ',' || strstr(v, ",,") || v[strlen(v) - 1] == ',') {
        ctrax_usage_error(cmd, "--metrics expects names separated by commas, got '%s'", v);
        return -1;
    }
    return 0;
}

int ctrax_cmd_plot(int argc, char **argv) {
    const char *input, *output = NULL, *request = NULL;
    const ctrax_option options[] = {{"-o", "--output", &output, NULL}, {"--metrics", NULL, &request, check_metrics}};
    const ctrax_args args = {"plot", usage, options, 2, "metrics file", "METRICS_JSONL_OR_OUTPUT_DIR"};
    int rc = ctrax_parse_args(&args, argc, argv, &input);
    if (rc >= 0) return rc;
    if (output && !output[0]) return ctrax_usage_error("plot", "-o expects a file name");
    return plot(input, output, request);
}
