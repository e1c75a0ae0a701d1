// The config: bindings and macros checked against the registry, queries
// that record what the program used, builders, and the operative config.
#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"
#include "core/index.h"
#include "ctrax/core/log.h"
#include "ctrax/core/memory.h"

#define MAX_MACRO_DEPTH 32  // macros defined through macros
#define MAX_STRUCT_BYTES 512

typedef struct binding {
    char *name;   // "scope/Name" (ctrax name)
    char *scope;  // "" or "a/b"
    const cfg_def *def;
    const cfg_param *param;
    ct_config_value value;  // as written
    const char *file;
    int line, col;
    bool used, override;
} binding;

typedef struct macro {
    char *name;
    ct_config_value value;
    bool override;
} macro;

// One parameter the program queried, with the value it got.
typedef struct record {
    char *name;  // "scope/Name"
    const cfg_def *def;
    const cfg_param *param;
    const ct_config_value *value;  // one of cfg->owned
} record;

struct ct_config {
    binding *bindings;
    int n_bindings, cap_bindings;
    ct_index binding_index;  // macros and bindings by name: a lookup is a few probes
    macro *macros;
    int n_macros, cap_macros;
    ct_index macro_index;
    record *records;
    int n_records, cap_records;
    ct_config_value **owned;  // every value a query returned; freed with cfg
    int n_owned, cap_owned;
    char **strings;  // interned source names
    int n_strings, cap_strings;
    char **includes;  // the include stack (real paths)
    int n_includes, cap_includes;
    int n_included;  // every include parsed, for CFG_MAX_INCLUDES
    char **warned;  // warnings already given (cfg_warn_once)
    int n_warned, cap_warned;
};

// snprintf that may cut its output (messages are capped by ct_error anyway).
static void fmt_into(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fmt_into(char *buf, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

static void *grow(void *p, int *cap, int need, size_t size) {
    if (need <= *cap) return p;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    *cap = c;
    return ct_realloc(p, (size_t)c * size);
}

static char *dup_n(const char *s, size_t n) {
    char *d = ct_malloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

ct_config *ct_config_new(void) { return ct_calloc(1, sizeof(ct_config)); }

void ct_config_free(ct_config *cfg) {
    if (!cfg) return;
    for (int i = 0; i < cfg->n_bindings; i++) {
        ct_free(cfg->bindings[i].name);
        ct_free(cfg->bindings[i].scope);
        cfg_value_free(&cfg->bindings[i].value);
    }
    for (int i = 0; i < cfg->n_macros; i++) {
        ct_free(cfg->macros[i].name);
        cfg_value_free(&cfg->macros[i].value);
    }
    for (int i = 0; i < cfg->n_records; i++) ct_free(cfg->records[i].name);
    for (int i = 0; i < cfg->n_owned; i++) {
        cfg_value_free(cfg->owned[i]);
        ct_free(cfg->owned[i]);
    }
    for (int i = 0; i < cfg->n_strings; i++) ct_free(cfg->strings[i]);
    for (int i = 0; i < cfg->n_includes; i++) ct_free(cfg->includes[i]);
    for (int i = 0; i < cfg->n_warned; i++) ct_free(cfg->warned[i]);
    ct_free(cfg->warned);
    ct_free(cfg->bindings);
    ct_free(cfg->macros);
    ct_index_free(&cfg->binding_index);
    ct_index_free(&cfg->macro_index);
    ct_free(cfg->records);
    ct_free(cfg->owned);
    ct_free(cfg->strings);
    ct_free(cfg->includes);
    ct_free(cfg);
}

const char *cfg_intern(ct_config *cfg, const char *s) {
    for (int i = 0; i < cfg->n_strings; i++)
        if (!strcmp(cfg->strings[i], s)) return cfg->strings[i];
    cfg->strings = grow(cfg->strings, &cfg->cap_strings, cfg->n_strings + 1, sizeof *cfg->strings);
    cfg->strings[cfg->n_strings] = ct_strdup(s);
    return cfg->strings[cfg->n_strings++];
}

void cfg_warn_once(ct_config *cfg, const char *msg) {
    for (int i = 0; i < cfg->n_warned; i++)
        if (!strcmp(cfg->warned[i], msg)) return;
    cfg->warned = grow(cfg->warned, &cfg->cap_warned, cfg->n_warned + 1, sizeof *cfg->warned);
    cfg->warned[cfg->n_warned++] = ct_strdup(msg);
    ct_log(CT_LOG_WARN, "%s", msg);
}

int cfg_include_push(ct_config *cfg, const char *real_path, int max_depth) {
    for (int i = 0; i < cfg->n_includes; i++)
        if (!strcmp(cfg->includes[i], real_path)) return -1;
    if (cfg->n_includes >= max_depth) return -2;
    if (cfg->n_included >= CFG_MAX_INCLUDES) return -3;
    cfg->n_included++;
    cfg->includes = grow(cfg->includes, &cfg->cap_includes, cfg->n_includes + 1, sizeof *cfg->includes);
    cfg->includes[cfg->n_includes++] = ct_strdup(real_path);
    return 0;
}

void cfg_include_pop(ct_config *cfg) {
    CT_ASSERT(cfg->n_includes > 0);
    ct_free(cfg->includes[--cfg->n_includes]);
}

void cfg_include_chain(const ct_config *cfg, const char *real_path, cfg_buf *out) {
    int from = 0;
    for (int i = 0; i < cfg->n_includes; i++)
        if (!strcmp(cfg->includes[i], real_path)) from = i;
    for (int i = from; i < cfg->n_includes; i++) cfg_buf_printf(out, "%s -> ", cfg->includes[i]);
}

// ---- Names --------------------------------------------------------------------------------

// Optimal string alignment distance (Levenshtein plus adjacent
// transpositions), ignoring case. Long strings are cut at 128 characters.
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 128) n = 128;
    if (m > 128) m = 128;
    int *d = ct_malloc((n + 1) * (m + 1) * sizeof *d);
#define D(i, j) d[(i) * (m + 1) + (j)]
    for (size_t i = 0; i <= n; i++) D(i, 0) = (int)i;
    for (size_t j = 0; j <= m; j++) D(0, j) = (int)j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = D(i - 1, j - 1) + (ca != cb);
            if (D(i - 1, j) + 1 < best) best = D(i - 1, j) + 1;
            if (D(i, j - 1) + 1 < best) best = D(i, j - 1) + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) && tolower((unsigned char)a[i - 2]) == cb &&
                D(i - 2, j - 2) + 1 < best)
                best = D(i - 2, j - 2) + 1;
            D(i, j) = best;
        }
    }
    int r = D(n, m);
#undef D
    ct_free(d);
    return r;
}

const char *cfg_closest(const char *s, const char *const *cands, int n) {
    const char *best = NULL;
    int best_d = INT_MAX;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(s, cands[i]);
        if (d < best_d) {
            best_d = d;
            best = cands[i];
        }
    }
    return best;
}

// Does module (as written before ".Name") name one of mods, a module under
// one of them, or a dotted tail of one ("optimizers" of "trax.optimizers")?
static bool module_matches(const char *mods, const char *module, size_t len) {
    const char *m = mods;
    while (m && *m) {
        size_t ml = strcspn(m, " ");
        if (len == ml && !memcmp(module, m, ml)) return true;
        if (len > ml && !memcmp(module, m, ml) && module[ml] == '.') return true;
        if (len < ml && !memcmp(m + ml - len, module, len) && m[ml - len - 1] == '.') return true;
        m += ml;
        while (*m == ' ') m++;
    }
    return false;
}

// Is w one of the space-separated words of list (NULL: none)?
static bool has_word(const char *list, const char *w) {
    size_t wl = strlen(w);
    for (const char *a = list; a && *a;) {
        size_t al = strcspn(a, " ");
        if (al == wl && !memcmp(a, w, wl)) return true;
        a += al;
        while (*a == ' ') a++;
    }
    return false;
}

static int count_words(const char *list) {
    int n = 0;
    for (const char *a = list; a && *a;) {
        a += strcspn(a, " ");
        while (*a == ' ') a++;
        n++;
    }
    return n;
}

const cfg_def *cfg_lookup(const char *name, char *why, size_t why_len) {
    int n;
    const cfg_def *defs = cfg_registry(&n);
    const char *dot = strrchr(name, '.');
    const char *short_name = dot ? dot + 1 : name;
    const cfg_def *d = NULL;
    for (int i = 0; i < n && !d; i++)
        if (!strcmp(defs[i].name, short_name) || has_word(defs[i].aliases, short_name)) d = &defs[i];
    if (!d) {
        // Candidates: every name and alias.
        int n_names = n;
        for (int i = 0; i < n; i++) n_names += count_words(defs[i].aliases);
        const char **names = ct_malloc((size_t)n_names * sizeof *names);
        char **alias_names = ct_malloc((size_t)n_names * sizeof *alias_names);
        int k = 0, n_alias = 0;
        for (int i = 0; i < n; i++) {
            names[k++] = defs[i].name;
            for (const char *a = defs[i].aliases; a && *a;) {
                size_t al = strcspn(a, " ");
                alias_names[n_alias] = dup_n(a, al);
                names[k++] = alias_names[n_alias++];
                a += al;
                while (*a == ' ') a++;
            }
        }
        const char *c = cfg_closest(short_name, names, k), *trax = cfg_trax_missing(name);
        if (trax) fmt_into(why, why_len, "'%.100s' %s", name, trax);
        else fmt_into(why, why_len, "unknown configurable '%.100s' (did you mean '%s'?)", name, c ? c : "?");
        for (int i = 0; i < n_alias; i++) ct_free(alias_names[i]);
        ct_free(alias_names);
        ct_free(names);
        return NULL;
    }
    if (!dot || module_matches(d->modules, name, (size_t)(dot - name))) return d;
    if (!d->modules) {
        fmt_into(why, why_len, "'%.100s': %s has no Trax module name: write '%s'", name, d->name, d->name);
    } else {
        int ml = (int)strcspn(d->modules, " ");
        fmt_into(why, why_len, "'%.100s': %s is in %.*s, not in %.*s (write '%s' or '%.*s.%s')", name, d->name, ml,
                 d->modules, (int)(dot - name) > 80 ? 80 : (int)(dot - name), name, d->name, ml, d->modules,
                 d->name);
    }
    return NULL;
}

const cfg_param *cfg_def_param(const cfg_def *d, const char *param) {
    for (int i = 0; i < d->n_params; i++)
        if (!strcmp(d->params[i].name, param)) return &d->params[i];
    return NULL;
}

// "TransformerLM has no parameter 'x' (did you mean 'y'?; its parameters: ...)"
static void unknown_param(const cfg_def *d, const char *param, char *why, size_t len) {
    if (d->n_params == 0) {
        fmt_into(why, len, "%s has no parameter '%.100s' (it takes none)", d->name, param);
        return;
    }
    // The names in order while they fit in about 300 characters, whole,
    // then how many more: a list cut mid-name reads as a name.
    enum { LIST_MAX = 300 };
    const char **names = ct_malloc((size_t)d->n_params * sizeof *names);
    cfg_buf all = {0};
    int more = 0;
    for (int i = 0; i < d->n_params; i++) {
        names[i] = d->params[i].name;
        if (more || all.len + strlen(names[i]) + 2 > LIST_MAX) more++;
        else cfg_buf_printf(&all, "%s%s", i ? ", " : "", names[i]);
    }
    if (more) cfg_buf_printf(&all, " and %d more", more);
    fmt_into(why, len, "%s has no parameter '%.100s' (did you mean '%s'? %s takes: %s)", d->name, param,
             cfg_closest(param, names, d->n_params), d->name, all.s);
    ct_free(all.s);
    ct_free(names);
}

// Splits "a/b/Name" at its last '/': scope "a/b" (or "") and the rest.
static void split_scope(const char *s, char **scope, const char **rest) {
    const char *slash = strrchr(s, '/');
    *scope = slash ? dup_n(s, (size_t)(slash - s)) : ct_strdup("");
    *rest = slash ? slash + 1 : s;
}

static char *scoped_name(const char *scope, const char *name) {
    cfg_buf b = {0};
    if (scope[0]) cfg_buf_printf(&b, "%s/", scope);
    cfg_buf_puts(&b, name);
    return b.s;
}

// Rewrites every reference in v to its ctrax name ("scope/Name").
static ct_status canonicalize_refs(ct_config_value *v, ct_error *err) {
    if (v->kind == CT_CONFIG_REFERENCE) {
        char *scope;
        const char *rest;
        split_scope(v->s, &scope, &rest);
        char why[CT_ERROR_MSG_MAX / 2];
        const cfg_def *d = strchr(scope, '.') ? NULL : cfg_lookup(rest, why, sizeof why);
        if (strchr(scope, '.')) fmt_into(why, sizeof why, "scope '%.100s' is not a name", scope);
        if (!d) {
            ct_free(scope);
            return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s", v->file, v->line, v->col, why);
        }
        char *s = scoped_name(scope, d->name);
        ct_free(scope);
        ct_free(v->s);
        v->s = s;
    }
    int n = v->kind == CT_CONFIG_DICT ? 2 * v->n : v->n;
    for (int i = 0; i < n; i++) CT_TRY(canonicalize_refs(&v->items[i], err));
    return CT_OK;
}

static const cfg_def *def_of_ref(const char *s) {
    const char *slash = strrchr(s, '/');
    const char *name = slash ? slash + 1 : s;
    int n;
    const cfg_def *defs = cfg_registry(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(defs[i].name, name)) return &defs[i];
    return NULL;
}

const char *cfg_scoped_ref(ct_config *cfg, const char *holder, const char *ref) {
    const char *slash = strrchr(holder, '/');
    if (!slash || strchr(ref, '/')) return ref;
    cfg_buf b = {0};
    cfg_buf_put(&b, holder, (size_t)(slash - holder) + 1);  // "scope/"
    cfg_buf_puts(&b, ref);
    const char *s = cfg_intern(cfg, b.s);
    ct_free(b.s);
    return s;
}

// ---- Type and range checks ------------------------------------------------------------------

static void value_text(const ct_config_value *v, char *buf, size_t len) {
    char *s = ct_config_value_to_gin(v);
    if (strlen(s) > 60) fmt_into(buf, len, "%.57s...", s);
    else fmt_into(buf, len, "%s", s);
    ct_free(s);
}

// "a model or an optimizer": the kinds p's references may name.
static void ref_kinds_text(const cfg_param *p, cfg_buf *out) {
    for (int k = 0; k < CFG_N_KINDS; k++)
        if (p->ref_kinds & CFG_KIND_BIT(k))
            cfg_buf_printf(out, "%s%s", out->len ? " or " : "", cfg_kind_name((cfg_kind)k));
}

// Checks v (macros resolved) against p; on failure writes why ("expects an
// int, got 'x' (a string)") and returns false.
static bool check_value(const cfg_param *p, const ct_config_value *v, char *why, size_t len) {
    char text[80];
    value_text(v, text, sizeof text);
    if (v->kind == CT_CONFIG_NONE) {
        if (p->none_ok) return true;
        fmt_into(why, len, "expects %s, got None (it cannot be None)", cfg_type_name(p->type));
        return false;
    }
    bool ok = false;
    double x = 0;
    switch (p->type) {
    case CFG_INT:
        ok = v->kind == CT_CONFIG_INT ||
             (v->kind == CT_CONFIG_FLOAT && v->f == floor(v->f) && fabs(v->f) < 9.2e18);
        x = v->kind == CT_CONFIG_INT ? (double)v->i : v->f;
        break;
    case CFG_FLOAT:
        ok = v->kind == CT_CONFIG_INT || v->kind == CT_CONFIG_FLOAT;
        x = v->kind == CT_CONFIG_INT ? (double)v->i : v->f;
        break;
    case CFG_BOOL: ok = v->kind == CT_CONFIG_BOOL; break;
    // A string row with ref_kinds also takes @Name of those kinds, as its
    // name (RNNLM.rnn_cell = @GRUCell is 'GRUCell').
    case CFG_STRING: ok = v->kind == CT_CONFIG_STRING || (p->ref_kinds && v->kind == CT_CONFIG_REFERENCE && !v->call); break;
    case CFG_LIST: ok = v->kind == CT_CONFIG_LIST || v->kind == CT_CONFIG_TUPLE; break;
    case CFG_REFERENCE: ok = v->kind == CT_CONFIG_REFERENCE; break;
    case CFG_ANY: ok = true; break;
    }
    if (!ok) {
        fmt_into(why, len, "expects %s, got %s (%s)", cfg_type_name(p->type), text, ct_config_kind_name(v->kind));
        return false;
    }
    if (v->kind == CT_CONFIG_REFERENCE && (p->type == CFG_REFERENCE || p->type == CFG_STRING)) {
        const cfg_def *d = def_of_ref(v->s);
        if (d && !(p->ref_kinds & CFG_KIND_BIT(d->kind))) {
            cfg_buf kinds = {0};
            ref_kinds_text(p, &kinds);
            fmt_into(why, len, "expects a reference to %s, got %s (%s)", kinds.s ? kinds.s : "nothing", text,
                     cfg_kind_name(d->kind));
            ct_free(kinds.s);
            return false;
        }
    }
    // A list row with ref_kinds holds references of those kinds only
    // (train.metrics: loss or metric layers, not a model or an optimizer).
    for (int i = 0; p->type == CFG_LIST && p->ref_kinds && i < v->n; i++) {
        const ct_config_value *it = &v->items[i];
        const cfg_def *d = it->kind == CT_CONFIG_REFERENCE ? def_of_ref(it->s) : NULL;
        if (d && (p->ref_kinds & CFG_KIND_BIT(d->kind))) continue;
        char item[80];
        value_text(it, item, sizeof item);
        cfg_buf kinds = {0};
        ref_kinds_text(p, &kinds);
        fmt_into(why, len, "expects a list of references to %s, item %d is %s (%s) at %s:%d:%d", kinds.s, i, item,
                 d ? cfg_kind_name(d->kind) : ct_config_kind_name(it->kind), it->file, it->line, it->col);
        ct_free(kinds.s);
        return false;
    }
    if (p->type == CFG_INT || p->type == CFG_FLOAT) {
        if (p->lo < p->hi) {
            if (x < p->lo || (p->lo_open && x <= p->lo)) {
                fmt_into(why, len, "must be %s %.10g, got %s", p->lo_open ? ">" : ">=", p->lo, text);
                return false;
            }
            if (x > p->hi || (p->hi_open && x >= p->hi)) {
                fmt_into(why, len, "must be %s %.10g, got %s", p->hi_open ? "<" : "<=", p->hi, text);
                return false;
            }
        }
        if (p->type == CFG_INT && p->has_field && p->field_size == sizeof(int) && (x > INT_MAX || x < INT_MIN)) {
            fmt_into(why, len, "must fit in a C int, got %s", text);
            return false;
        }
        // A float field holds a float32: a value past its range would be
        // inf, one that rounds to 0 would silently turn the setting off.
        if (p->type == CFG_FLOAT && p->has_field && p->field_size == sizeof(float)) {
            if (fabs(x) >= 0x1.ffffffp127) {  // FLT_MAX and half an ulp: what rounds to inf
                fmt_into(why, len,
                         "must fit in a float32, got %s, which overflows it to inf (its largest value is %.8g)", text,
                         (double)FLT_MAX);
                return false;
            }
            if (x != 0 && (float)x == 0) {
                fmt_into(why, len, "got %s, which underflows a float32 to 0 (its smallest nonzero value is %.2g)", text,
                         (double)FLT_TRUE_MIN);
                return false;
            }
        }
    }
    return true;
}

// An int where the parameter is a float, or an integral float where it is
// an int, becomes the parameter's type.
static void normalize(const cfg_param *p, ct_config_value *v) {
    if (p->type == CFG_INT && v->kind == CT_CONFIG_FLOAT) {
        v->kind = CT_CONFIG_INT;
        v->i = (int64_t)v->f;
    } else if (p->type == CFG_FLOAT && v->kind == CT_CONFIG_INT) {
        v->kind = CT_CONFIG_FLOAT;
        v->f = (double)v->i;
    }
}

// ---- Macros ---------------------------------------------------------------------------------

static bool same_macro(const void *cfg, int at, const void *name) {
    return !strcmp(((const ct_config *)cfg)->macros[at].name, name);
}

static macro *find_macro(ct_config *cfg, const char *name) {
    int at = ct_index_find(&cfg->macro_index, ct_hash_str(name), same_macro, cfg, name);
    return at < 0 ? NULL : &cfg->macros[at];
}

// A deep copy of v with its macros replaced by their values; *budget counts
// the values made, so that macros that double at each level stop early.
static ct_status resolve_in(ct_config *cfg, const ct_config_value *v, ct_config_value *out, int depth, long *budget,
                            ct_error *err) {
    memset(out, 0, sizeof *out);
    if (--*budget < 0) return CT_ERR_ARG;  // said by resolve, at the value as written
    if (v->kind == CT_CONFIG_MACRO) {
        macro *m = find_macro(cfg, v->s);
        if (!m) {
            const char **names = ct_malloc((size_t)(cfg->n_macros + 1) * sizeof *names);
            for (int i = 0; i < cfg->n_macros; i++) names[i] = cfg->macros[i].name;
            const char *c = cfg_closest(v->s, names, cfg->n_macros);
            ct_status st;
            if (c)
                st = ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: undefined macro %%%.100s (did you mean %%%s?)", v->file,
                                  v->line, v->col, v->s, c);
            else
                st = ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: undefined macro %%%.100s (no macro is defined)",
                                  v->file, v->line, v->col, v->s);
            ct_free(names);
            return st;
        }
        if (depth >= MAX_MACRO_DEPTH)
            return ct_error_set(err, CT_ERR_ARG,
                                "%s:%d:%d: macro %%%.100s: macros refer to macros more than %d deep (a cycle?)",
                                v->file, v->line, v->col, v->s, MAX_MACRO_DEPTH);
        // The reference is replaced by its value: it is no item of its own
        // (%B of the parser's most items was refused). Depth bounds the refunds.
        ++*budget;
        return resolve_in(cfg, &m->value, out, depth + 1, budget, err);
    }
    *out = *v;
    out->s = v->s ? ct_strdup(v->s) : NULL;
    out->items = NULL;
    int n = v->kind == CT_CONFIG_DICT ? 2 * v->n : v->n;
    out->n = 0;
    if (n == 0) {
        out->n = v->n;
        return CT_OK;
    }
    out->items = ct_calloc((size_t)n, sizeof *out->items);
    for (int i = 0; i < n; i++) {
        ct_status st = resolve_in(cfg, &v->items[i], &out->items[i], depth, budget, err);
        if (st != CT_OK) {
            for (int j = 0; j <= i; j++) cfg_value_free(&out->items[j]);
            ct_free(out->items);
            out->items = NULL;
            ct_free(out->s);
            out->s = NULL;
            return st;
        }
    }
    out->n = v->n;
    return CT_OK;
}

static ct_status resolve(ct_config *cfg, const ct_config_value *v, ct_config_value *out, ct_error *err) {
    // v and its items: the parser refuses a value of more items as written,
    // so only macros run past this.
    long budget = CFG_MAX_VALUE_NODES + 1;
    ct_status st = resolve_in(cfg, v, out, 0, &budget, err);
    // Where the count ran out is somewhere inside a macro's value; the
    // author needs the value that uses the macros.
    if (budget < 0)
        return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: the value expands to more than %d items through macros",
                            v->file, v->line, v->col, CFG_MAX_VALUE_NODES);
    return st;
}

// ---- Bindings -------------------------------------------------------------------------------

typedef struct binding_key {
    const char *scope;
    const cfg_def *def;
    const cfg_param *param;
} binding_key;

static uint64_t binding_hash(const binding_key *k) {
    uint64_t h = ct_hash_str(k->scope);
    h = ct_hash_bytes(h, &k->def, sizeof k->def);
    return ct_hash_bytes(h, &k->param, sizeof k->param);
}

static bool same_binding(const void *cfg, int at, const void *key) {
    const binding *b = &((const ct_config *)cfg)->bindings[at];
    const binding_key *k = key;
    return b->def == k->def && b->param == k->param && !strcmp(b->scope, k->scope);
}

static binding *find_binding(ct_config *cfg, const char *scope, const cfg_def *d, const cfg_param *p) {
    binding_key k = {scope, d, p};
    int at = ct_index_find(&cfg->binding_index, binding_hash(&k), same_binding, cfg, &k);
    return at < 0 ? NULL : &cfg->bindings[at];
}

// The binding a query of scope/d.p reads: the most specific scope first.
static binding *lookup_binding(ct_config *cfg, const char *scope, const cfg_def *d, const cfg_param *p) {
    char *s = ct_strdup(scope);
    binding *b = NULL;
    for (;;) {
        b = find_binding(cfg, s, d, p);
        if (b || !s[0]) break;
        char *slash = strrchr(s, '/');
        if (slash) *slash = '\0';
        else s[0] = '\0';
    }
    ct_free(s);
    return b;
}

// Checks a resolved value of binding b; on failure sets err with b's place.
static ct_status check_binding(const binding *b, const ct_config_value *v, ct_error *err) {
    char why[CT_ERROR_MSG_MAX / 2];
    if (check_value(b->param, v, why, sizeof why)) return CT_OK;
    if (v->file != b->file || v->line != b->line)
        return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.%s %s (the value is at %s:%d:%d)", b->file, b->line, b->col,
                            b->name, b->param->name, why, v->file, v->line, v->col);
    return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.%s %s", b->file, b->line, b->col, b->name, b->param->name, why);
}

static ct_status bind_macro(ct_config *cfg, const char *key, const char *file, int line, int col,
                            ct_config_value *value, bool override, ct_error *err) {
    (void)file, (void)line, (void)col;
    macro *m = find_macro(cfg, key);
    if (m && m->override && !override) return CT_OK;  // an override wins
    if (!m) {
        cfg->macros = grow(cfg->macros, &cfg->cap_macros, cfg->n_macros + 1, sizeof *cfg->macros);
        m = &cfg->macros[cfg->n_macros++];
        memset(m, 0, sizeof *m);
        m->name = ct_strdup(key);
        ct_index_add(&cfg->macro_index, cfg->n_macros - 1, ct_hash_str(key));
    }
    cfg_value_free(&m->value);
    m->value = *value;
    memset(value, 0, sizeof *value);
    m->override = override;
    (void)err;
    return CT_OK;
}

ct_status cfg_bind(ct_config *cfg, const char *key, const char *file, int line, int col, ct_config_value *value,
                   bool override, ct_error *err) {
    CT_TRY(canonicalize_refs(value, err));
    char *scope;
    const char *rest;
    split_scope(key, &scope, &rest);
    const char *dot = strrchr(rest, '.');
    if (!dot) {
        ct_status st = scope[0] ? ct_error_set(err, CT_ERR_FORMAT,
                                               "%s:%d:%d: '%.100s' is not a binding: expected scope/Name.param = value",
                                               file, line, col, key)
                                : bind_macro(cfg, key, file, line, col, value, override, err);
        ct_free(scope);
        return st;
    }
    if (strchr(scope, '.')) {
        ct_free(scope);
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s:%d:%d: '%.100s': a scope is a plain name, expected scope/Name.param", file, line, col,
                            key);
    }
    char *conf = dup_n(rest, (size_t)(dot - rest));
    const char *pname = dot + 1;
    char why[CT_ERROR_MSG_MAX / 2 + 64];
    const cfg_def *d = cfg_lookup(conf, why, sizeof why);
    const cfg_param *p = d ? cfg_def_param(d, pname) : NULL;
    if (d && !p) unknown_param(d, pname, why, sizeof why);
    ct_free(conf);
    if (!p) {
        ct_free(scope);
        return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s", file, line, col, why);
    }
    binding nb = {.name = scoped_name(scope, d->name), .scope = scope, .def = d, .param = p, .value = *value,
                  .file = file, .line = line, .col = col, .override = override};
    memset(value, 0, sizeof *value);
    ct_status st = cfg_value_has_macro(&nb.value) ? CT_OK : check_binding(&nb, &nb.value, err);
    if (st == CT_OK) normalize(p, &nb.value);
    binding *old = find_binding(cfg, scope, d, p);
    if (st != CT_OK || (old && old->override && !override)) {  // an override wins
        ct_free(nb.name);
        ct_free(nb.scope);
        cfg_value_free(&nb.value);
        return st;
    }
    if (old) {
        ct_free(old->name);
        ct_free(old->scope);
        cfg_value_free(&old->value);
        *old = nb;
    } else {
        cfg->bindings = grow(cfg->bindings, &cfg->cap_bindings, cfg->n_bindings + 1, sizeof *cfg->bindings);
        cfg->bindings[cfg->n_bindings++] = nb;
        binding_key k = {nb.scope, d, p};
        ct_index_add(&cfg->binding_index, cfg->n_bindings - 1, binding_hash(&k));
    }
    return CT_OK;
}

// ---- Building a config ----------------------------------------------------------------------

ct_status ct_config_parse_file(ct_config *cfg, const char *path, ct_error *err) {
    return cfg_parse_file(cfg, path, false, err);
}

ct_status ct_config_parse_text(ct_config *cfg, const char *text, size_t len, const char *source, ct_error *err) {
    return cfg_parse(cfg, text, len, source, false, err);
}

ct_status ct_config_set(ct_config *cfg, const char *text, ct_error *err) {
    return cfg_parse(cfg, text, strlen(text), "--set", true, err);
}

ct_status ct_config_validate(ct_config *cfg, ct_error *err) {
    for (int i = 0; i < cfg->n_macros; i++) {
        ct_config_value r;
        ct_status st = resolve(cfg, &cfg->macros[i].value, &r, err);
        cfg_value_free(&r);
        CT_TRY(st);
    }
    for (int i = 0; i < cfg->n_bindings; i++) {
        binding *b = &cfg->bindings[i];
        ct_config_value r;
        ct_status st = resolve(cfg, &b->value, &r, err);
        if (st == CT_OK) st = check_binding(b, &r, err);
        cfg_value_free(&r);
        CT_TRY(st);
    }
    return CT_OK;
}

// ---- Queries --------------------------------------------------------------------------------

static void record_query(ct_config *cfg, const char *name, const cfg_def *d, const cfg_param *p,
                         const ct_config_value *v) {
    for (int i = 0; i < cfg->n_records; i++) {
        record *r = &cfg->records[i];
        if (r->param == p && !strcmp(r->name, name)) {
            r->value = v;
            return;
        }
    }
    cfg->records = grow(cfg->records, &cfg->cap_records, cfg->n_records + 1, sizeof *cfg->records);
    cfg->records[cfg->n_records++] = (record){.name = ct_strdup(name), .def = d, .param = p, .value = v};
}

static ct_status query_target(const char *name, const char *param, char **scope, const cfg_def **d,
                              const cfg_param **p, ct_error *err);

void cfg_record_value(ct_config *cfg, const char *name, const char *param, const ct_config_value *v) {
    char *scope;
    const cfg_def *d;
    const cfg_param *p;
    if (query_target(name, param, &scope, &d, &p, NULL) != CT_OK) return;
    char *full = scoped_name(scope, d->name);
    record_query(cfg, full, d, p, v);
    ct_free(full);
    ct_free(scope);
}

void cfg_record_string(ct_config *cfg, const char *name, const char *param, const char *s) {
    ct_config_value *v = ct_calloc(1, sizeof *v);
    *v = (ct_config_value){.kind = CT_CONFIG_STRING, .s = ct_strdup(s), .file = cfg_intern(cfg, "<default>")};
    cfg->owned = grow(cfg->owned, &cfg->cap_owned, cfg->n_owned + 1, sizeof *cfg->owned);
    cfg->owned[cfg->n_owned++] = v;
    cfg_record_value(cfg, name, param, v);
}

void cfg_record_int(ct_config *cfg, const char *name, const char *param, int64_t i) {
    ct_config_value *v = ct_calloc(1, sizeof *v);
    *v = (ct_config_value){.kind = CT_CONFIG_INT, .i = i, .file = cfg_intern(cfg, "<default>")};
    cfg->owned = grow(cfg->owned, &cfg->cap_owned, cfg->n_owned + 1, sizeof *cfg->owned);
    cfg->owned[cfg->n_owned++] = v;
    cfg_record_value(cfg, name, param, v);
}

// Finds the configurable and parameter a query names; errors are the
// program's bugs (CT_ERR_STATE).
static ct_status query_target(const char *name, const char *param, char **scope, const cfg_def **d,
                              const cfg_param **p, ct_error *err) {
    const char *rest;
    split_scope(name, scope, &rest);
    char why[CT_ERROR_MSG_MAX / 2 + 64];
    *d = cfg_lookup(rest, why, sizeof why);
    *p = *d ? cfg_def_param(*d, param) : NULL;
    if (*d && !*p) unknown_param(*d, param, why, sizeof why);
    if (!*p) {
        ct_free(*scope);
        *scope = NULL;
        return ct_error_set(err, CT_ERR_STATE, "config query %.100s.%.100s: %s (register it in src/config/registry.c)",
                            name, param, why);
    }
    return CT_OK;
}

// The query behind every getter. defv (consumed) is the value when unbound.
static ct_status query(ct_config *cfg, const char *name, const char *param, cfg_type want, ct_config_value *defv,
                       const ct_config_value **out, ct_error *err) {
    char *scope;
    const cfg_def *d;
    const cfg_param *p;
    ct_status st = query_target(name, param, &scope, &d, &p, err);
    if (st != CT_OK) {
        cfg_value_free(defv);
        return st;
    }
    if (p->type != want) {
        ct_free(scope);
        cfg_value_free(defv);
        return ct_error_set(err, CT_ERR_STATE, "config query %s.%s: the parameter is %s, read as %s", d->name, p->name,
                            cfg_type_name(p->type), cfg_type_name(want));
    }
    binding *b = lookup_binding(cfg, scope, d, p);
    ct_config_value *v = ct_calloc(1, sizeof *v);
    if (b) {
        b->used = true;
        cfg_value_free(defv);
        st = resolve(cfg, &b->value, v, err);
        if (st == CT_OK) st = check_binding(b, v, err);
        if (st != CT_OK) {
            cfg_value_free(v);
            ct_free(v);
            ct_free(scope);
            return st;
        }
        normalize(p, v);
    } else {
        *v = *defv;
        normalize(p, v);
    }
    cfg->owned = grow(cfg->owned, &cfg->cap_owned, cfg->n_owned + 1, sizeof *cfg->owned);
    cfg->owned[cfg->n_owned++] = v;
    char *full = scoped_name(scope, d->name);
    record_query(cfg, full, d, p, v);
    ct_free(full);
    ct_free(scope);
    *out = v;
    return CT_OK;
}

static ct_config_value default_value(ct_config *cfg, ct_config_kind kind) {
    return (ct_config_value){.kind = kind, .file = cfg_intern(cfg, "<default>"), .line = 0, .col = 0};
}

// A query of a scalar getter: dv is the value when unbound (its kind and
// number); *v is NULL for None (the getter's def then).
static ct_status query_scalar(ct_config *cfg, const char *name, const char *param, cfg_type want, ct_config_value dv,
                              const ct_config_value **v, ct_error *err) {
    dv.file = cfg_intern(cfg, "<default>");
    CT_TRY(query(cfg, name, param, want, &dv, v, err));
    if ((*v)->kind == CT_CONFIG_NONE) *v = NULL;
    return CT_OK;
}

ct_status ct_config_get_int(ct_config *cfg, const char *name, const char *param, int64_t def, int64_t *out,
                            ct_error *err) {
    const ct_config_value *v;
    CT_TRY(query_scalar(cfg, name, param, CFG_INT, (ct_config_value){.kind = CT_CONFIG_INT, .i = def}, &v, err));
    *out = v ? v->i : def;
    return CT_OK;
}

ct_status ct_config_get_float(ct_config *cfg, const char *name, const char *param, double def, double *out,
                              ct_error *err) {
    const ct_config_value *v;
    CT_TRY(query_scalar(cfg, name, param, CFG_FLOAT, (ct_config_value){.kind = CT_CONFIG_FLOAT, .f = def}, &v, err));
    *out = v ? v->f : def;
    return CT_OK;
}

ct_status ct_config_get_bool(ct_config *cfg, const char *name, const char *param, bool def, bool *out,
                             ct_error *err) {
    const ct_config_value *v;
    CT_TRY(query_scalar(cfg, name, param, CFG_BOOL, (ct_config_value){.kind = CT_CONFIG_BOOL, .b = def}, &v, err));
    *out = v ? v->b : def;
    return CT_OK;
}

ct_status ct_config_get_string(ct_config *cfg, const char *name, const char *param, const char *def,
                               const char **out, ct_error *err) {
    ct_config_value dv = default_value(cfg, def ? CT_CONFIG_STRING : CT_CONFIG_NONE);
    dv.s = def ? ct_strdup(def) : NULL;
    const ct_config_value *v;
    CT_TRY(query(cfg, name, param, CFG_STRING, &dv, &v, err));
    *out = v->kind == CT_CONFIG_STRING ? v->s : NULL;
    return CT_OK;
}

ct_status ct_config_get_list(ct_config *cfg, const char *name, const char *param, const char *def,
                             const ct_config_value **out, ct_error *err) {
    ct_config_value dv = default_value(cfg, CT_CONFIG_NONE);
    if (def) {
        ct_status st = cfg_parse_value(cfg, def, "<default>", &dv, err);
        if (st == CT_OK) st = canonicalize_refs(&dv, err);
        if (st != CT_OK) {
            cfg_value_free(&dv);
            return ct_error_prefix(err, "config query %s.%s: default", name, param);
        }
    }
    const ct_config_value *v;
    CT_TRY(query(cfg, name, param, CFG_LIST, &dv, &v, err));
    *out = v->kind == CT_CONFIG_NONE ? NULL : v;
    return CT_OK;
}

ct_status ct_config_get_int_list(ct_config *cfg, const char *name, const char *param, const int64_t *def,
                                 int n_def, int64_t *out, int max, int *n, ct_error *err) {
    ct_config_value dv = default_value(cfg, def ? CT_CONFIG_LIST : CT_CONFIG_NONE);
    if (def) {
        dv.n = n_def;
        dv.items = n_def ? ct_calloc((size_t)n_def, sizeof *dv.items) : NULL;
        for (int i = 0; i < n_def; i++) {
            dv.items[i] = default_value(cfg, CT_CONFIG_INT);
            dv.items[i].i = def[i];
        }
    }
    const ct_config_value *v;
    CT_TRY(query(cfg, name, param, CFG_LIST, &dv, &v, err));
    *n = 0;
    if (v->kind == CT_CONFIG_NONE) return CT_OK;
    if (v->n > max)
        return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.%s has %d items, at most %d are allowed", v->file, v->line,
                            v->col, name, param, v->n, max);
    for (int i = 0; i < v->n; i++) {
        const ct_config_value *it = &v->items[i];
        if (it->kind != CT_CONFIG_INT) {
            char text[80];
            value_text(it, text, sizeof text);
            return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: %s.%s expects a list of ints, item %d is %s (%s)", it->file,
                                it->line, it->col, name, param, i, text, ct_config_kind_name(it->kind));
        }
        out[i] = it->i;
    }
    *n = v->n;
    return CT_OK;
}

ct_status ct_config_get_reference(ct_config *cfg, const char *name, const char *param, const char *def,
                                  const char **out, ct_error *err) {
    ct_config_value dv = default_value(cfg, def ? CT_CONFIG_REFERENCE : CT_CONFIG_NONE);
    if (def) {
        dv.s = ct_strdup(def);
        ct_status st = canonicalize_refs(&dv, err);
        if (st != CT_OK) {
            cfg_value_free(&dv);
            return ct_error_prefix(err, "config query %s.%s: default", name, param);
        }
    }
    const ct_config_value *v;
    CT_TRY(query(cfg, name, param, CFG_REFERENCE, &dv, &v, err));
    *out = v->kind == CT_CONFIG_REFERENCE ? v->s : NULL;
    return CT_OK;
}

// The shortest decimal that reads back as the float f, as a double: 0.1f
// is written 0.1, not 0.10000000149011612.
static double float_as_decimal(float f) {
    char s[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(s, sizeof s, "%.*g", prec, (double)f);
        if ((float)strtod(s, NULL) == f) break;
    }
    return strtod(s, NULL);
}

// The value of p's field in the params struct at buf: a new value (a string
// is copied).
static ct_config_value field_value(const cfg_param *p, const unsigned char *buf) {
    ct_config_value v = {0};
    const unsigned char *f = buf + p->field;
    if (p->type == CFG_INT) {
        int64_t x;
        if (p->field_size == sizeof(int64_t)) {
            memcpy(&x, f, sizeof x);
        } else {
            CT_ASSERT(p->field_size == sizeof(int));
            int y;
            memcpy(&y, f, sizeof y);
            x = y;
        }
        // A nullable int whose stored value lies outside its own range
        // stands for None (LSHSelfAttention.max_length_for_buckets: 0), so
        // the operative config writes None, which parses back.
        if (p->none_ok && ((double)x < p->lo || (double)x > p->hi)) {
            v.kind = CT_CONFIG_NONE;
        } else {
            v.kind = CT_CONFIG_INT;
            v.i = x;
        }
    } else if (p->type == CFG_FLOAT && p->field_size == sizeof(double)) {
        double x;
        memcpy(&x, f, sizeof x);
        v.kind = CT_CONFIG_FLOAT;
        v.f = x;
    } else if (p->type == CFG_FLOAT) {
        CT_ASSERT(p->field_size == sizeof(float));
        float x;
        memcpy(&x, f, sizeof x);
        v.kind = CT_CONFIG_FLOAT;
        v.f = float_as_decimal(x);
    } else if (p->type == CFG_BOOL) {
        CT_ASSERT(p->field_size == sizeof(bool));
        bool x;
        memcpy(&x, f, sizeof x);
        v.kind = CT_CONFIG_BOOL;
        v.b = x;
    } else {
        // A string, or a reference (a configurable's name).
        CT_ASSERT((p->type == CFG_STRING || p->type == CFG_REFERENCE) && p->field_size == sizeof(const char *));
        const char *x;
        memcpy(&x, f, sizeof x);
        v.kind = !x ? CT_CONFIG_NONE : p->type == CFG_STRING ? CT_CONFIG_STRING : CT_CONFIG_REFERENCE;
        v.s = x ? ct_strdup(x) : NULL;
    }
    return v;
}

// Writes v (of p's type, not None) into p's field of the struct at buf. A
// string field points at v's text.
static void set_field(const cfg_param *p, unsigned char *buf, const ct_config_value *v) {
    unsigned char *f = buf + p->field;
    if (p->type == CFG_INT && p->field_size == sizeof(int64_t)) {
        memcpy(f, &v->i, sizeof v->i);
    } else if (p->type == CFG_INT) {
        int x = (int)v->i;
        memcpy(f, &x, sizeof x);
    } else if (p->type == CFG_FLOAT && p->field_size == sizeof(double)) {
        memcpy(f, &v->f, sizeof v->f);
    } else if (p->type == CFG_FLOAT) {
        float x = (float)v->f;
        memcpy(f, &x, sizeof x);
    } else if (p->type == CFG_BOOL) {
        memcpy(f, &v->b, sizeof v->b);
    } else {
        const char *x = v->s;
        memcpy(f, &x, sizeof x);
    }
}

ct_status cfg_query_default(ct_config *cfg, const char *name, const char *param, const ct_config_value **out,
                            ct_error *err) {
    char *scope;
    const cfg_def *d;
    const cfg_param *p;
    CT_TRY(query_target(name, param, &scope, &d, &p, err));
    if (p->required && !lookup_binding(cfg, scope, d, p)) {
        char *full = scoped_name(scope, d->name);
        ct_free(scope);
        ct_status st = ct_error_set(err, CT_ERR_ARG, "%s.%s is not set and has no default: bind it in the config",
                                    full, p->name);
        ct_free(full);
        return st;
    }
    ct_free(scope);
    ct_config_value dv = default_value(cfg, CT_CONFIG_NONE);
    ct_status st = CT_OK;
    if (p->default_gin) {
        st = cfg_parse_value(cfg, p->default_gin, "<default>", &dv, err);
    } else if (p->has_field && d->defaults) {
        alignas(max_align_t) unsigned char buf[MAX_STRUCT_BYTES];
        CT_ASSERT(d->struct_size <= sizeof buf);
        d->defaults(buf);
        ct_config_value v = field_value(p, buf);
        v.file = dv.file;
        dv = v;
    } else if (!p->required) {
        return ct_error_set(err, CT_ERR_STATE, "%s.%s has no default in the registry", d->name, p->name);
    }
    if (st == CT_OK) st = canonicalize_refs(&dv, err);
    if (st != CT_OK) {
        cfg_value_free(&dv);
        return ct_error_prefix(err, "registry default of %s.%s", d->name, p->name);
    }
    return query(cfg, name, param, p->type, &dv, out, err);
}

void ct_config_where(const ct_config *cfg, const char *name, const char *param, char *buf, size_t len) {
    cfg_where(cfg, name, param, buf, len);
}

void cfg_where(const ct_config *cfg, const char *name, const char *param, char *buf, size_t len) {
    buf[0] = '\0';
    char *scope;
    const cfg_def *d;
    const cfg_param *p;
    if (query_target(name, param, &scope, &d, &p, NULL) != CT_OK) return;
    binding *b = lookup_binding((ct_config *)cfg, scope, d, p);
    if (b) fmt_into(buf, len, "%s:%d:%d: ", b->file, b->line, b->col);
    ct_free(scope);
}

void cfg_setting_text(ct_config *cfg, const char *name, const char *param, const char *value, char *buf, size_t len) {
    char where[300];
    cfg_where(cfg, name, param, where, sizeof where);
    const ct_config_value *v;
    char *text = NULL;
    if (!value && cfg_query_default(cfg, name, param, &v, NULL) == CT_OK) text = ct_config_value_to_gin(v);
    snprintf(buf, len, "%s%s.%s = %.60s%s", where, name, param, value ? value : text ? text : "?",
             where[0] || value ? "" : " (its default)");
    ct_free(text);
}

// ---- Builders -------------------------------------------------------------------------------

// Fills a struct-backed configurable's params struct from its defaults and
// the config, and runs its check.
ct_status cfg_fill_struct(ct_config *cfg, const char *name, const cfg_def *d, void *buf, ct_error *err) {
    CT_ASSERT(d->struct_size <= MAX_STRUCT_BYTES);
    d->defaults(buf);
    for (int i = 0; i < d->n_params; i++) {
        const cfg_param *p = &d->params[i];
        if (!p->has_field) continue;
        const ct_config_value *v;
        CT_TRY(cfg_query_default(cfg, name, p->name, &v, err));
        if (v->kind == CT_CONFIG_NONE) continue;  // keeps the default
        set_field(p, buf, v);
    }
    if (d->fill) CT_TRY(d->fill(cfg, name, buf, err));
    return d->check ? d->check(cfg, name, buf, err) : CT_OK;
}

static const cfg_def *builder_target(const char *name, ct_error *err) {
    char *scope;
    const char *rest;
    split_scope(name, &scope, &rest);
    ct_free(scope);
    char why[CT_ERROR_MSG_MAX / 2];
    const cfg_def *d = cfg_lookup(rest, why, sizeof why);
    if (!d) ct_error_set(err, CT_ERR_ARG, "%s", why);
    return d;
}

static ct_status build_layer(ct_config *cfg, const char *name, bool model_only, ct_layer **out, ct_error *err) {
    *out = NULL;
    const cfg_def *d = builder_target(name, err);
    if (!d) return CT_ERR_ARG;
    if ((model_only && d->kind != CFG_MODEL) || (d->kind != CFG_MODEL && d->kind != CFG_LAYER))
        return ct_error_set(err, CT_ERR_ARG, "%s is %s, not %s", name, cfg_kind_name(d->kind),
                            model_only ? "a model" : "a layer");
    // A model too big for the machine is refused before its layer tree is
    // built (a tree of 10^8 blocks would itself run out of memory).
    if (d->build_layer) {
        if (d->plan) CT_TRY(cfg_check_model_memory(cfg, name, d, NULL, err));
        return d->build_layer(cfg, name, out, err);
    }
    if (d->make_layer) {
        *out = d->make_layer();
        return CT_OK;
    }
    if (!d->new_layer) return ct_error_set(err, CT_ERR_STATE, "%s has no builder yet", d->name);
    alignas(max_align_t) unsigned char buf[MAX_STRUCT_BYTES];
    CT_TRY(cfg_fill_struct(cfg, name, d, buf, err));
    if (d->plan) CT_TRY(cfg_check_model_memory(cfg, name, d, buf, err));
    *out = d->new_layer(buf);
    return CT_OK;
}

ct_status ct_config_build_model(ct_config *cfg, const char *name, ct_layer **out, ct_error *err) {
    return build_layer(cfg, name, true, out, err);
}

ct_status ct_config_build_layer(ct_config *cfg, const char *name, ct_layer **out, ct_error *err) {
    return build_layer(cfg, name, false, out, err);
}

ct_status ct_config_build_optimizer(ct_config *cfg, const char *name, ct_optimizer **out, ct_error *err) {
    *out = NULL;
    const cfg_def *d = builder_target(name, err);
    if (!d) return CT_ERR_ARG;
    if (d->kind != CFG_OPTIMIZER || !d->new_optimizer)
        return ct_error_set(err, CT_ERR_ARG, "%s is %s, not an optimizer%s", name, cfg_kind_name(d->kind),
                            d->kind == CFG_OPTIMIZER ? " with a builder" : "");
    alignas(max_align_t) unsigned char buf[MAX_STRUCT_BYTES];
    CT_TRY(cfg_fill_struct(cfg, name, d, buf, err));
    *out = d->new_optimizer(buf);
    return CT_OK;
}

// Reads every setting of the settings configurable name into out (its
// struct, size bytes).
static ct_status read_settings(ct_config *cfg, const char *name, void *out, size_t size, ct_error *err) {
    int n;
    const cfg_def *defs = cfg_registry(&n), *d = NULL;
    for (int i = 0; i < n && !d; i++)
        if (!strcmp(defs[i].name, name)) d = &defs[i];
    CT_ASSERT(d && d->kind == CFG_SETTINGS && d->struct_size == size);
    return cfg_fill_struct(cfg, name, d, out, err);
}

ct_train_settings ct_train_default_settings(void) { return (ct_train_settings){CT_TRAIN_SETTINGS(CT_PARAM_DEFAULT)}; }
ct_loop_settings ct_loop_default_settings(void) { return (ct_loop_settings){CT_LOOP_SETTINGS(CT_PARAM_DEFAULT)}; }

ct_status ct_config_read_train(ct_config *cfg, ct_train_settings *out, ct_error *err) {
    return read_settings(cfg, "train", out, sizeof *out, err);
}

ct_status ct_config_read_loop(ct_config *cfg, ct_loop_settings *out, ct_error *err) {
    return read_settings(cfg, "Loop", out, sizeof *out, err);
}

// The parameter of d a constructor's message is about: the first whose name
// is a word of msg (multifactor's factor errors blame factors).
static const cfg_param *blame(const cfg_def *d, const char *msg) {
    const cfg_param *factors = cfg_def_param(d, "factors");
    if (factors && (strstr(msg, "factor '") || strstr(msg, " factors"))) return factors;
    for (int i = 0; i < d->n_params; i++) {
        const char *name = d->params[i].name;
        size_t n = strlen(name);
        for (const char *m = strstr(msg, name); m; m = strstr(m + 1, name)) {
            bool start = m == msg || !(isalnum((unsigned char)m[-1]) || m[-1] == '_');
            bool end = !(isalnum((unsigned char)m[n]) || m[n] == '_');
            if (start && end) return &d->params[i];
        }
    }
    return NULL;
}

// Says where the parameter a schedule's constructor refused is bound (its
// message names the schedule).
static void blame_binding(ct_config *cfg, const char *name, const cfg_def *d, ct_error *err) {
    const cfg_param *p = err ? blame(d, err->msg) : NULL;
    char where[300] = "";
    if (p) cfg_where(cfg, name, p->name, where, sizeof where);
    size_t n = strlen(where);
    if (n >= 2) {
        where[n - 2] = '\0';  // ct_error_prefix adds the ": "
        ct_error_prefix(err, "%s", where);
    }
}

ct_status ct_config_build_schedule(ct_config *cfg, const char *name, ct_schedule **out, ct_error *err) {
    *out = NULL;
    const cfg_def *d = builder_target(name, err);
    if (!d) return CT_ERR_ARG;
    if (d->kind != CFG_SCHEDULE || !d->new_schedule)
        return ct_error_set(err, CT_ERR_ARG, "%s is %s, not a learning-rate schedule", name, cfg_kind_name(d->kind));
    alignas(max_align_t) unsigned char buf[MAX_STRUCT_BYTES];
    CT_TRY(cfg_fill_struct(cfg, name, d, buf, err));
    ct_status st = d->new_schedule(buf, out, err);
    if (st != CT_OK) {
        *out = NULL;
        blame_binding(cfg, name, d, err);
    }
    return st;
}

ct_status ct_config_build_inputs(ct_config *cfg, const char *name, int64_t batch_size, uint64_t seed,
                                 ct_stream **train, ct_stream **eval, ct_error *err) {
    *train = NULL;
    *eval = NULL;
    const cfg_def *d = builder_target(name, err);
    if (!d) return CT_ERR_ARG;
    if (d->kind != CFG_INPUT || !d->build_inputs)
        return ct_error_set(err, CT_ERR_ARG, "%s is %s, not an input", name, cfg_kind_name(d->kind));
    if (batch_size < 1 || batch_size > (1 << 24))
        return ct_error_set(err, CT_ERR_ARG, "%s: batch_size %lld is out of range (1 to 2^24)", name,
                            (long long)batch_size);
    // An input that sets its own batch size (Trax's sequence_copy_inputs.batch_size,
    // per process as Trax's is per host) is asked for that one x the processes:
    // ct_config_read_train gives it as train.batch_size.
    if (cfg_def_param(d, "batch_size")) {
        const ct_config_value *v, *procs;
        CT_TRY(cfg_query_default(cfg, name, "batch_size", &v, err));
        CT_TRY(cfg_query_default(cfg, "train", "n_processes", &procs, err));
        if (v->kind == CT_CONFIG_INT && v->i * procs->i != batch_size) {
            char where[300];
            cfg_where(cfg, name, "batch_size", where, sizeof where);
            char times[64] = "";
            if (procs->i > 1) snprintf(times, sizeof times, " (x %lld processes)", (long long)procs->i);
            return ct_error_set(err, CT_ERR_ARG, "%s%s.batch_size = %lld%s, but batches of %lld were asked for", where,
                                name, (long long)v->i, times, (long long)batch_size);
        }
    }
    ct_status st = d->build_inputs(cfg, name, (int)batch_size, seed, train, eval, err);
    if (st != CT_OK) {
        ct_stream_free(*train);
        ct_stream_free(*eval);
        *train = NULL;
        *eval = NULL;
    }
    return st;
}

// ---- Bindings and the operative config ------------------------------------------------------

int ct_config_n_bindings(const ct_config *cfg) { return cfg->n_bindings; }

ct_config_binding_info ct_config_binding_at(const ct_config *cfg, int i) {
    CT_ASSERT(i >= 0 && i < cfg->n_bindings);
    const binding *b = &cfg->bindings[i];
    return (ct_config_binding_info){.name = b->name, .param = b->param->name, .value = &b->value, .file = b->file,
                                    .line = b->line, .used = b->used, .override = b->override};
}

static int record_cmp(const void *a, const void *b) {
    const record *x = *(const record *const *)a, *y = *(const record *const *)b;
    int c = strcmp(x->def->name, y->def->name);
    if (!c) c = strcmp(x->name, y->name);
    if (!c) c = strcmp(x->param->name, y->param->name);
    return c;
}

char *ct_config_operative_text(const ct_config *cfg) {
    cfg_buf b = {0};
    cfg_buf_puts(&b,
                 "# The operative config: every parameter the program used, with the value it\n"
                 "# used (from a config file, --set, or the default).\n");
    const record **rs = ct_malloc((size_t)(cfg->n_records + 1) * sizeof *rs);
    for (int i = 0; i < cfg->n_records; i++) rs[i] = &cfg->records[i];
    qsort(rs, (size_t)cfg->n_records, sizeof *rs, record_cmp);
    for (int i = 0; i < cfg->n_records; i++) {
        if (i == 0 || strcmp(rs[i]->name, rs[i - 1]->name))
            cfg_buf_printf(&b,
                           "\n# Parameters for %s:\n# "
                           "==============================================================================\n",
                           rs[i]->name);
        cfg_buf_printf(&b, "%s.%s = ", rs[i]->name, rs[i]->param->name);
        cfg_buf_value(&b, rs[i]->value);
        cfg_buf_puts(&b, "\n");
    }
    ct_free(rs);
    return b.s;
}

ct_status ct_config_write_operative(const ct_config *cfg, const char *path, ct_error *err) {
    char *text = ct_config_operative_text(cfg);
    FILE *f = fopen(path, "w");
    if (!f) {
        ct_free(text);
        return ct_error_set(err, CT_ERR_IO, "cannot write the operative config '%s': %s", path, strerror(errno));
    }
    size_t n = strlen(text);
    bool ok = fwrite(text, 1, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    ct_free(text);
    if (!ok) return ct_error_set(err, CT_ERR_IO, "cannot write the operative config '%s': %s", path, strerror(errno));
    return CT_OK;
}

char *ct_config_registry_text(void) {
    int n;
    const cfg_def *defs = cfg_registry(&n);
    cfg_buf b = {0};
    cfg_buf_puts(&b, "# Every configurable ctrax knows, with its parameters and defaults.\n");
    for (int i = 0; i < n; i++) {
        const cfg_def *d = &defs[i];
        cfg_buf_printf(&b, "\n# %s: %s", d->name, cfg_kind_name(d->kind));
        if (d->modules) cfg_buf_printf(&b, " (Trax: %.*s.%s)", (int)strcspn(d->modules, " "), d->modules, d->name);
        cfg_buf_puts(&b, "\n");
        if (d->doc) cfg_buf_printf(&b, "#   %s\n", d->doc);
        if (d->aliases) cfg_buf_printf(&b, "#   also called: %s\n", d->aliases);
        alignas(max_align_t) unsigned char buf[MAX_STRUCT_BYTES];
        if (d->defaults) d->defaults(buf);
        for (int j = 0; j < d->n_params; j++) {
            const cfg_param *p = &d->params[j];
            cfg_buf tail = {0};
            cfg_buf_printf(&tail, "  # %s", cfg_type_name(p->type));
            if (p->none_ok) cfg_buf_puts(&tail, " or None");
            if (p->lo < p->hi) {
                if (isinf(p->hi)) cfg_buf_printf(&tail, ", %s %.10g", p->lo_open ? ">" : ">=", p->lo);
                else cfg_buf_printf(&tail, ", in [%.10g, %.10g%s", p->lo, p->hi, p->hi_open ? ")" : "]");
            }
            if (p->doc) cfg_buf_printf(&tail, "; %s", p->doc);
            if (p->required) {
                cfg_buf_printf(&b, "# %s.%s = (required: no default)%s\n", d->name, p->name, tail.s);
            } else if (p->default_gin) {
                cfg_buf_printf(&b, "%s.%s = %s%s\n", d->name, p->name, p->default_gin, tail.s);
            } else if (p->has_field && d->defaults) {
                ct_config_value v = field_value(p, buf);
                cfg_buf_printf(&b, "%s.%s = ", d->name, p->name);
                cfg_buf_value(&b, &v);
                cfg_buf_printf(&b, "%s\n", tail.s);
                cfg_value_free(&v);
            } else {
                cfg_buf_printf(&b, "# %s.%s = (the program's default)%s\n", d->name, p->name, tail.s);
            }
            ct_free(tail.s);
        }
    }
    return b.s;
}
