// Learning-rate schedules as Trax's lr_schedules (see schedules.h).
#include "ctrax/optim/schedules.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/core/memory.h"

typedef enum schedule_kind { KIND_CONSTANT, KIND_WARMUP, KIND_WARMUP_AND_RSQRT_DECAY, KIND_MULTIFACTOR } schedule_kind;

typedef enum factor {
    FACTOR_CONSTANT,
    FACTOR_TWO_CONSTANTS,
    FACTOR_LINEAR_WARMUP,
    FACTOR_RSQRT_DECAY,
    FACTOR_RSQRT_NORMALIZED_DECAY,
    FACTOR_DECAY_EVERY,
    FACTOR_COSINE_DECAY,
    N_FACTORS
} factor;

static const char *const factor_names[N_FACTORS] = {
    "constant",    "two_constants", "linear_warmup", "rsqrt_decay", "rsqrt_normalized_decay",
    "decay_every", "cosine_decay",
};

#define MAX_FACTORS 32

struct ct_schedule {
    schedule_kind kind;
    double value;        // constant's value, warmup's max_value
    int64_t n_warmup;    // warmup's n_warmup_steps
    ct_multifactor_params mf;  // mf.factors is NULL: the parsed factors are below
    int n_factors;
    factor factors[MAX_FACTORS];
};

ct_multifactor_params ct_multifactor_default_params(void) {
    return (ct_multifactor_params){CT_MULTIFACTOR_PARAMS(CT_PARAM_DEFAULT)};
}

static ct_schedule *schedule_alloc(schedule_kind kind) {
    ct_schedule *s = ct_calloc(1, sizeof *s);
    s->kind = kind;
    return s;
}

void ct_schedule_free(ct_schedule *s) { ct_free(s); }

ct_status ct_schedule_constant(double value, ct_schedule **out, ct_error *err) {
    if (!isfinite(value)) return ct_error_set(err, CT_ERR_ARG, "schedule constant: value %g is not finite", value);
    if (value < 0) return ct_error_set(err, CT_ERR_ARG, "schedule constant: value must be >= 0, got %g", value);
    *out = schedule_alloc(KIND_CONSTANT);
    (*out)->value = value;
    return CT_OK;
}

static ct_status warmup_new(schedule_kind kind, const char *name, int64_t n, double max_value, ct_schedule **out,
                            ct_error *err) {
    if (n < 0)
        return ct_error_set(err, CT_ERR_ARG, "schedule %s: n_warmup_steps must be >= 0, got %lld", name, (long long)n);
    if (!isfinite(max_value))
        return ct_error_set(err, CT_ERR_ARG, "schedule %s: max_value %g is not finite", name, max_value);
    if (max_value < 0)
        return ct_error_set(err, CT_ERR_ARG, "schedule %s: max_value must be >= 0, got %g", name, max_value);
    *out = schedule_alloc(kind);
    (*out)->value = max_value;
    (*out)->n_warmup = n;
    return CT_OK;
}

ct_status ct_schedule_warmup(int64_t n_warmup_steps, double max_value, ct_schedule **out, ct_error *err) {
    return warmup_new(KIND_WARMUP, "warmup", n_warmup_steps, max_value, out, err);
}

ct_status ct_schedule_warmup_and_rsqrt_decay(int64_t n_warmup_steps, double max_value, ct_schedule **out,
                                             ct_error *err) {
    return warmup_new(KIND_WARMUP_AND_RSQRT_DECAY, "warmup_and_rsqrt_decay", n_warmup_steps, max_value, out, err);
}

// Splits the factor string on '*' and strips each name, as Trax does.
static ct_status parse_factors(const char *text, ct_schedule *s, ct_error *err) {
    const char *p = text;
    for (;;) {
        const char *end = strchr(p, '*');
        if (!end) end = p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && isspace((unsigned char)*a)) a++;
        while (b > a && isspace((unsigned char)b[-1])) b--;
        size_t len = (size_t)(b - a);
        int found = -1;
        for (int f = 0; f < N_FACTORS; f++)
            if (strlen(factor_names[f]) == len && strncmp(factor_names[f], a, len) == 0) found = f;
        if (found < 0) {
            char known[256];
            size_t k = 0;
            for (int f = 0; f < N_FACTORS; f++)
                k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", f ? ", " : "", factor_names[f]);
            return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: unknown factor '%.*s' in '%s'; known: %s",
                                (int)len, a, text, known);
        }
        if (s->n_factors == MAX_FACTORS)
            return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: more than %d factors in '%s'", MAX_FACTORS,
                                text);
        s->factors[s->n_factors++] = (factor)found;
        if (*end == '\0') return CT_OK;
        p = end + 1;
    }
}

static bool uses(const ct_schedule *s, factor f) {
    for (int i = 0; i < s->n_factors; i++)
        if (s->factors[i] == f) return true;
    return false;
}

// The parameters the factors can use must let them compute (Trax would
// divide by zero or take a square root of a negative number instead).
static ct_status check_multifactor(const ct_schedule *s, const ct_multifactor_params *p, ct_error *err) {
    if (uses(s, FACTOR_LINEAR_WARMUP) && p->warmup_steps <= 0)
        return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: linear_warmup needs warmup_steps > 0, got %lld",
                            (long long)p->warmup_steps);
    if ((uses(s, FACTOR_RSQRT_DECAY) || uses(s, FACTOR_RSQRT_NORMALIZED_DECAY) || uses(s, FACTOR_COSINE_DECAY)) &&
        p->warmup_steps < 0)
        return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: warmup_steps must be >= 0, got %lld",
                            (long long)p->warmup_steps);
    if (uses(s, FACTOR_DECAY_EVERY) && p->steps_per_decay <= 0)
        return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: decay_every needs steps_per_decay > 0, got %lld",
                            (long long)p->steps_per_decay);
    if (uses(s, FACTOR_COSINE_DECAY) && p->steps_per_cycle <= 0)
        return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: cosine_decay needs steps_per_cycle > 0, got %lld",
                            (long long)p->steps_per_cycle);
    double values[] = {p->constant, p->decay_factor, p->second_constant, p->minimum};
    const char *names[] = {"constant", "decay_factor", "second_constant", "minimum"};
    for (int i = 0; i < 4; i++)
        if (!isfinite(values[i]))
            return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: %s %g is not finite", names[i], values[i]);
    // A negative factor makes a negative learning rate: the update would
    // climb the loss (decay_factor's sign would alternate).
    bool used[] = {uses(s, FACTOR_CONSTANT) || uses(s, FACTOR_TWO_CONSTANTS), uses(s, FACTOR_DECAY_EVERY),
                   uses(s, FACTOR_TWO_CONSTANTS)};
    for (int i = 0; i < 3; i++)
        if (used[i] && values[i] < 0)
            return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: %s must be >= 0, got %g", names[i],
                                values[i]);
    return CT_OK;
}

ct_status ct_schedule_multifactor(const ct_multifactor_params *p, ct_schedule **out, ct_error *err) {
    if (!p->factors) return ct_error_set(err, CT_ERR_ARG, "schedule multifactor: factors is NULL");
    ct_schedule *s = schedule_alloc(KIND_MULTIFACTOR);
    s->mf = *p;
    s->mf.factors = NULL;
    ct_status st = parse_factors(p->factors, s, err);
    if (st == CT_OK) st = check_multifactor(s, p, err);
    if (st != CT_OK) {
        ct_schedule_free(s);
        return st;
    }
    *out = s;
    return CT_OK;
}

// Python's a // b for b > 0.
static int64_t floor_div(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static double multifactor_value(const ct_schedule *s, int64_t step) {
    const ct_multifactor_params *p = &s->mf;
    double st = (double)step, ret = 1.0;
    for (int i = 0; i < s->n_factors; i++) {
        switch (s->factors[i]) {
        case FACTOR_CONSTANT:
            ret *= p->constant;
            break;
        case FACTOR_TWO_CONSTANTS:
            ret *= step < p->second_constant_step ? p->constant : p->second_constant;
            break;
        case FACTOR_LINEAR_WARMUP:
            ret *= fmin(1.0, st / (double)p->warmup_steps);
            break;
        case FACTOR_RSQRT_DECAY:
            ret /= sqrt(fmax(st, (double)p->warmup_steps));
            break;
        case FACTOR_RSQRT_NORMALIZED_DECAY:
            ret *= sqrt((double)p->warmup_steps);
            ret /= sqrt(fmax(st, (double)p->warmup_steps));
            break;
        case FACTOR_DECAY_EVERY:
            ret *= pow(p->decay_factor, (double)floor_div(step, p->steps_per_decay));
            break;
        case FACTOR_COSINE_DECAY: {
            double progress = fmax(0.0, (st - (double)p->warmup_steps) / (double)p->steps_per_cycle);
            ret *= 0.5 * (1.0 + cos(M_PI * fmod(progress, 1.0)));
            break;
        }
        case N_FACTORS:
            break;
        }
    }
    return ret <= p->minimum ? p->minimum : ret;
}

float ct_schedule_value(const ct_schedule *s, int64_t step) {
    double st = (double)step;
    switch (s->kind) {
    case KIND_CONSTANT:
        // Trax's constant is a body starting at step 1, after a warm-up from
        // (0, 0): only step 0 (never a Loop step) differs.
        return (float)(step < 1 ? st / 1.0 * s->value : s->value);
    // Trax's body or tail starts at n + 1: step <= n is the warm-up (n + 1
    // in int64 would overflow for n = INT64_MAX).
    case KIND_WARMUP: {
        double body_start = (double)s->n_warmup + 1.0;
        return (float)(step <= s->n_warmup ? st / body_start * s->value : s->value);
    }
    case KIND_WARMUP_AND_RSQRT_DECAY: {
        double tail_start = (double)s->n_warmup + 1.0;
        if (step <= s->n_warmup) return (float)(st / tail_start * s->value);
        return (float)(s->value * (sqrt(tail_start) / sqrt(st)));
    }
    case KIND_MULTIFACTOR:
        return (float)multifactor_value(s, step);
    }
    return 0.0f;
}

const char *ct_schedule_name(const ct_schedule *s) {
    switch (s->kind) {
    case KIND_CONSTANT:
        return "constant";
    case KIND_WARMUP:
        return "warmup";
    case KIND_WARMUP_AND_RSQRT_DECAY:
        return "warmup_and_rsqrt_decay";
    case KIND_MULTIFACTOR:
        return "multifactor";
    }
    return "?";
}

// snprintf into a growing description; keeps the length the text needs.
typedef struct desc {
    char *buf;
    size_t len, need;
} desc;

__attribute__((format(printf, 2, 3))) static void desc_add(desc *d, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t at = d->need < d->len ? d->need : d->len;
    int n = vsnprintf(d->buf ? d->buf + at : NULL, d->buf ? d->len - at : 0, fmt, ap);
    va_end(ap);
    if (n > 0) d->need += (size_t)n;
}

// The shortest %g form of x that reads back to x.
static void desc_double(desc *d, const char *name, double x) {
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x) break;
    }
    desc_add(d, "%s=%s", name, tmp);
}

size_t ct_schedule_describe(const ct_schedule *s, char *buf, size_t len) {
    desc d = {buf, len, 0};
    if (buf && len) buf[0] = '\0';
    desc_add(&d, "%s(", ct_schedule_name(s));
    switch (s->kind) {
    case KIND_CONSTANT:
        desc_double(&d, "value", s->value);
        break;
    case KIND_WARMUP:
    case KIND_WARMUP_AND_RSQRT_DECAY:
        desc_add(&d, "n_warmup_steps=%lld, ", (long long)s->n_warmup);
        desc_double(&d, "max_value", s->value);
        break;
    case KIND_MULTIFACTOR: {
        const ct_multifactor_params *p = &s->mf;
        desc_add(&d, "factors='");
        for (int i = 0; i < s->n_factors; i++) desc_add(&d, "%s%s", i ? " * " : "", factor_names[s->factors[i]]);
        desc_add(&d, "'");
        bool warm = uses(s, FACTOR_LINEAR_WARMUP) || uses(s, FACTOR_RSQRT_DECAY) ||
                    uses(s, FACTOR_RSQRT_NORMALIZED_DECAY) || uses(s, FACTOR_COSINE_DECAY);
        bool two = uses(s, FACTOR_TWO_CONSTANTS);
        if (uses(s, FACTOR_CONSTANT) || two) {
            desc_add(&d, ", ");
            desc_double(&d, "constant", p->constant);
        }
        if (warm) desc_add(&d, ", warmup_steps=%lld", (long long)p->warmup_steps);
        if (uses(s, FACTOR_DECAY_EVERY)) {
            desc_add(&d, ", ");
            desc_double(&d, "decay_factor", p->decay_factor);
            desc_add(&d, ", steps_per_decay=%lld", (long long)p->steps_per_decay);
        }
        if (uses(s, FACTOR_COSINE_DECAY)) desc_add(&d, ", steps_per_cycle=%lld", (long long)p->steps_per_cycle);
        if (two) {
            desc_add(&d, ", ");
            desc_double(&d, "second_constant", p->second_constant);
            desc_add(&d, ", second_constant_step=%lld", (long long)p->second_constant_step);
        }
        if (p->minimum != 0.0) {
            desc_add(&d, ", ");
            desc_double(&d, "minimum", p->minimum);
        }
        break;
    }
    }
    desc_add(&d, ")");
    return d.need;
}
