#include "ctrax/core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void default_abort(const char *file, int line, const char *msg) {
    fprintf(stderr, "ctrax: fatal: %s:%d: %s\n", file, line, msg);
    abort();
}

// One of the two mutable globals (see DESIGN.md): set once by the program.
static ct_abort_fn g_abort_handler = default_abort;

void ct_set_abort_handler(ct_abort_fn fn) { g_abort_handler = fn ? fn : default_abort; }

_Noreturn void ct_abort(const char *file, int line, const char *fmt, ...) {
    char msg[CT_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    g_abort_handler(file, line, msg);
    abort();  // a handler must not return; make sure of it
}

// Copies the len bytes of src into dst (cap bytes, 0-terminated). A message
// too long keeps its start (what failed) and its end (why: errno's text, the
// value refused), and puts " ... " for the middle, which is where long paths
// are; a cut never splits a UTF-8 character.
static void fit(char *dst, size_t cap, const char *src, size_t len) {
    static const char gap[] = " ... ";
    if (len < cap) {
        memcpy(dst, src, len);
        dst[len] = '\0';
        return;
    }
    size_t head = cap / 4, tail = cap - 1 - head - (sizeof gap - 1);
    while (head > 0 && (src[head] & 0xC0) == 0x80) head--;  // src[head] starts the next character
    size_t from = len - tail;
    while (from < len && (src[from] & 0xC0) == 0x80) from++;
    memcpy(dst, src, head);
    memcpy(dst + head, gap, sizeof gap - 1);
    memcpy(dst + head + sizeof gap - 1, src + from, len - from);
    dst[head + sizeof gap - 1 + len - from] = '\0';
}

void ct_text_printable(char *s) {
    for (unsigned char *u = (unsigned char *)s; *u; u++) {
        if (u[0] == 0xC2 && u[1] >= 0x80 && u[1] <= 0x9F) {  // a C1 control, in UTF-8
            u[0] = u[1] = '?';
            u++;
        } else if ((*u < 0x20 && *u != '\n' && *u != '\t') || *u == 0x7F) {
            *u = '?';
        }
    }
}

ct_status ct_error_setv(ct_error *err, ct_status code, const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    char *whole = n >= (int)sizeof err->msg ? malloc((size_t)n + 1) : NULL;
    if (whole) {  // without memory the message keeps its start only
        vsnprintf(whole, (size_t)n + 1, fmt, again);
        fit(err->msg, sizeof err->msg, whole, (size_t)n);
        free(whole);
    }
    va_end(again);
    ct_text_printable(err->msg);
    return code;
}

ct_status ct_error_set(ct_error *err, ct_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ct_error_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

// Puts prefix and ": " in front of err->msg, fitted as ct_error_setv fits.
static void prepend(ct_error *err, const char *prefix, size_t plen) {
    size_t olen = strlen(err->msg), n = plen + 2 + olen;
    char *whole = malloc(n + 1);
    if (!whole) return;  // the message stays without its context
    memcpy(whole, prefix, plen);
    memcpy(whole + plen, ": ", 2);
    memcpy(whole + plen + 2, err->msg, olen + 1);
    fit(err->msg, sizeof err->msg, whole, n);
    free(whole);
    ct_text_printable(err->msg);
}

ct_status ct_error_prefix(ct_error *err, const char *fmt, ...) {
    if (!err) return CT_OK;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *prefix = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (prefix) {
        vsnprintf(prefix, (size_t)n + 1, fmt, again);
        prepend(err, prefix, (size_t)n);
        free(prefix);
    }
    va_end(again);
    va_end(ap);
    return err->code;
}

void ct_error_clear(ct_error *err) {
    if (!err) return;
    err->code = CT_OK;
    err->msg[0] = '\0';
}

const char *ct_status_name(ct_status code) {
    switch (code) {
    case CT_OK: return "ok";
    case CT_ERR_ARG: return "invalid argument";
    case CT_ERR_SHAPE: return "shape error";
    case CT_ERR_MEMORY: return "out of memory";
    case CT_ERR_IO: return "i/o error";
    case CT_ERR_FORMAT: return "format error";
    case CT_ERR_STATE: return "invalid state";
    case CT_ERR_NONFINITE: return "non-finite value";
    }
    return "unknown status";
}
