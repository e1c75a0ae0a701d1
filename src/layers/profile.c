// Self time by layer name (profile.h).
#include "ctrax/layers/profile.h"

#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "ctrax/core/memory.h"

// A model names few kinds of layers (a TransformerLM about 15): past this
// many the rest share one row. Spans nest as deep as the layer tree; past
// CT_PROFILE_DEPTH the deeper ones count their whole time as their own.
#define CT_PROFILE_ROWS 128
#define CT_PROFILE_DEPTH 64
#define CT_PROFILE_OTHERS "(other layers)"

struct ct_profile {
    ct_profile_row rows[CT_PROFILE_ROWS];
    int n_rows;
    // child[d]: the time the open span at depth d has spent in its
    // sub-spans so far.
    double child[CT_PROFILE_DEPTH];
    int depth;
    // Spans count only inside a step (ct_profile_step_begin .. _end): a
    // trainer's passes at construction are not a step's.
    bool in_step;
    int64_t steps;
    double step_seconds;
};

ct_profile *ct_profile_new(void) { return ct_calloc(1, sizeof(ct_profile)); }

void ct_profile_free(ct_profile *p) { ct_free(p); }

const ct_profile_row *ct_profile_rows(const ct_profile *p, int *n) {
    *n = p->n_rows;
    return p->rows;
}

int64_t ct_profile_steps(const ct_profile *p, double *seconds) {
    if (seconds) *seconds = p->step_seconds;
    return p->steps;
}

static ct_profile_row *row_of(ct_profile *p, const char *name) {
    for (int i = 0; i < p->n_rows; i++)
        if (!strncmp(p->rows[i].name, name, sizeof p->rows[i].name - 1)) return &p->rows[i];
    if (p->n_rows >= CT_PROFILE_ROWS - 1 && strcmp(name, CT_PROFILE_OTHERS)) return row_of(p, CT_PROFILE_OTHERS);
    ct_profile_row *r = &p->rows[p->n_rows++];
    snprintf(r->name, sizeof r->name, "%s", name);
    return r;
}

double ct_profile_begin(ct_profile *p) {
    if (!p->in_step) return 0.0;
    if (p->depth < CT_PROFILE_DEPTH) p->child[p->depth] = 0.0;
    p->depth++;
    return ct_now_s();
}

void ct_profile_end(ct_profile *p, const char *name, bool backward, double start) {
    if (!p->in_step) return;
    double spent = ct_now_s() - start;
    p->depth--;
    double own = p->depth < CT_PROFILE_DEPTH ? spent - p->child[p->depth] : spent;
    if (p->depth > 0 && p->depth <= CT_PROFILE_DEPTH) p->child[p->depth - 1] += spent;
    ct_profile_row *r = row_of(p, name[0] ? name : "(unnamed)");
    r->calls[backward]++;
    r->seconds[backward] += own;
}

double ct_profile_step_begin(ct_profile *p) {
    p->in_step = true;
    p->depth = 0;
    return ct_now_s();
}

void ct_profile_step_end(ct_profile *p, double start) {
    p->in_step = false;
    p->steps++;
    p->step_seconds += ct_now_s() - start;
}

static int by_time(const void *a, const void *b) {
    const ct_profile_row *x = a, *y = b;
    double tx = x->seconds[0] + x->seconds[1], ty = y->seconds[0] + y->seconds[1];
    return tx < ty ? 1 : tx > ty ? -1 : strcmp(x->name, y->name);
}

void ct_profile_print(const ct_profile *p, FILE *f) {
    if (p->steps < 1) {
        fprintf(f, "profile: no training step was counted\n");
        return;
    }
    ct_profile_row sorted[CT_PROFILE_ROWS];
    memcpy(sorted, p->rows, (size_t)p->n_rows * sizeof *sorted);
    qsort(sorted, (size_t)p->n_rows, sizeof *sorted, by_time);
    double steps = (double)p->steps, step_ms = 1e3 * p->step_seconds / steps, in_rows = 0;
    fprintf(f, "profile of %lld training steps, %.3f ms a step (self time: each layer's own, its sublayers' out):\n",
            (long long)p->steps, step_ms);
    fprintf(f, "  %-31s %10s %11s %11s %11s %7s\n", "name", "calls/step", "forward ms", "backward ms", "ms/step",
            "share");
    for (int i = 0; i < p->n_rows; i++) {
        const ct_profile_row *r = &sorted[i];
        double fwd = 1e3 * r->seconds[0] / steps, bwd = 1e3 * r->seconds[1] / steps;
        in_rows += fwd + bwd;
        fprintf(f, "  %-31s %10.1f %11.3f %11.3f %11.3f %6.1f%%\n", r->name,
                (double)(r->calls[0] + r->calls[1]) / steps, fwd, bwd, fwd + bwd,
                step_ms > 0 ? 100.0 * (fwd + bwd) / step_ms : 0.0);
    }
    // Splitting the batch, combining and checking gradients, the loss's
    // bookkeeping: the step's time outside every row.
    double rest = step_ms - in_rows;
    fprintf(f, "  %-31s %10s %11s %11s %11.3f %6.1f%%\n", "(rest of the step)", "", "", "", rest,
            step_ms > 0 ? 100.0 * rest / step_ms : 0.0);
}
