// Config values: freeing, copying, and writing them back as gin text.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/internal.h"
#include "ctrax/core/memory.h"

const char *ct_config_kind_name(ct_config_kind kind) {
    switch (kind) {
    case CT_CONFIG_NONE: return "None";
    case CT_CONFIG_BOOL: return "a bool";
    case CT_CONFIG_INT: return "an int";
    case CT_CONFIG_FLOAT: return "a float";
    case CT_CONFIG_STRING: return "a string";
    case CT_CONFIG_REFERENCE: return "a reference";
    case CT_CONFIG_MACRO: return "a macro";
    case CT_CONFIG_LIST: return "a list";
    case CT_CONFIG_TUPLE: return "a tuple";
    case CT_CONFIG_DICT: return "a dict";
    }
    return "a value";
}

static int n_items(const ct_config_value *v) { return v->kind == CT_CONFIG_DICT ? 2 * v->n : v->n; }

void cfg_value_free(ct_config_value *v) {
    if (!v) return;
    for (int i = 0; i < n_items(v); i++) cfg_value_free(&v->items[i]);
    ct_free(v->items);
    ct_free(v->s);
    v->items = NULL;
    v->s = NULL;
    v->n = 0;
}

bool cfg_value_has_macro(const ct_config_value *v) {
    if (v->kind == CT_CONFIG_MACRO) return true;
    for (int i = 0; i < n_items(v); i++)
        if (cfg_value_has_macro(&v->items[i])) return true;
    return false;
}

// ---- cfg_buf ------------------------------------------------------------------------

void cfg_buf_put(cfg_buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        b->s = ct_realloc(b->s, cap);
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void cfg_buf_puts(cfg_buf *b, const char *s) { cfg_buf_put(b, s, strlen(s)); }

void cfg_buf_printf(cfg_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        cfg_buf_put(b, small, (size_t)n);
        return;
    }
    char *big = ct_malloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    cfg_buf_put(b, big, (size_t)n);
    ct_free(big);
}

// The shortest decimal that reads back as the same double, written as
// Python's repr writes it (fixed for exponents -4..15, else scientific), with
// a '.' or an exponent so that it reads back as a float and not an int.
static void put_float(cfg_buf *b, double f) {
    char s[48];
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(s, sizeof s, "%.*e", prec - 1, f);
        if (strtod(s, NULL) == f) break;
    }
    snprintf(s, sizeof s, "%.*e", prec - 1, f);
    const char *e = strchr(s, 'e');
    int exp = e ? atoi(e + 1) : 0;
    if (isfinite(f) && exp >= -4 && exp < 16) {
        int decimals = prec - 1 - exp;
        snprintf(s, sizeof s, "%.*f", decimals > 0 ? decimals : 0, f);
    }
    if (!strpbrk(s, ".eEn")) strcat(s, ".0");  // "n": inf and nan never parse, but keep them readable
    cfg_buf_puts(b, s);
}

static void put_string(cfg_buf *b, const char *s) {
    cfg_buf_put(b, "'", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char e[8];
        switch (*p) {
        case '\\': cfg_buf_puts(b, "\\\\"); break;
        case '\'': cfg_buf_puts(b, "\\'"); break;
        case '\n': cfg_buf_puts(b, "\\n"); break;
        case '\t': cfg_buf_puts(b, "\\t"); break;
        case '\r': cfg_buf_puts(b, "\\r"); break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                snprintf(e, sizeof e, "\\x%02x", *p);
                cfg_buf_puts(b, e);
            } else {
                cfg_buf_put(b, (const char *)p, 1);
            }
        }
    }
    cfg_buf_put(b, "'", 1);
}

void cfg_buf_value(cfg_buf *b, const ct_config_value *v) {
    switch (v->kind) {
    case CT_CONFIG_NONE: cfg_buf_puts(b, "None"); break;
    case CT_CONFIG_BOOL: cfg_buf_puts(b, v->b ? "True" : "False"); break;
    case CT_CONFIG_INT: cfg_buf_printf(b, "%lld", (long long)v->i); break;
    case CT_CONFIG_FLOAT: put_float(b, v->f); break;
    case CT_CONFIG_STRING: put_string(b, v->s); break;
    case CT_CONFIG_REFERENCE: cfg_buf_printf(b, "@%s%s", v->s, v->call ? "()" : ""); break;
    case CT_CONFIG_MACRO: cfg_buf_printf(b, "%%%s", v->s); break;
    case CT_CONFIG_LIST:
    case CT_CONFIG_TUPLE:
        cfg_buf_puts(b, v->kind == CT_CONFIG_LIST ? "[" : "(");
        for (int i = 0; i < v->n; i++) {
            if (i) cfg_buf_puts(b, ", ");
            cfg_buf_value(b, &v->items[i]);
        }
        if (v->kind == CT_CONFIG_TUPLE && v->n == 1) cfg_buf_puts(b, ",");
        cfg_buf_puts(b, v->kind == CT_CONFIG_LIST ? "]" : ")");
        break;
    case CT_CONFIG_DICT:
        cfg_buf_puts(b, "{");
        for (int i = 0; i < v->n; i++) {
            if (i) cfg_buf_puts(b, ", ");
            cfg_buf_value(b, &v->items[2 * i]);
            cfg_buf_puts(b, ": ");
            cfg_buf_value(b, &v->items[2 * i + 1]);
        }
        cfg_buf_puts(b, "}");
        break;
    }
}

char *ct_config_value_to_gin(const ct_config_value *v) {
    cfg_buf b = {0};
    cfg_buf_value(&b, v);
    if (!b.s) cfg_buf_puts(&b, "");
    return b.s;
}
