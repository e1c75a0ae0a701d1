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

ct_status ct_error_setv(ct_error *err, ct_status code, const char *fmt, va_list ap) {
    if (!err) return code;
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

ct_status ct_error_set(ct_error *err, ct_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ct_error_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

// Puts prefix (already formatted) and ": " in front of err->msg, cutting
// what does not fit.
static void prepend(ct_error *err, const char *prefix) {
    size_t plen = strlen(prefix), olen = strlen(err->msg);
    if (plen + 2 >= sizeof err->msg) plen = sizeof err->msg - 3;
    if (plen + 2 + olen >= sizeof err->msg) olen = sizeof err->msg - plen - 3;
    memmove(err->msg + plen + 2, err->msg, olen);
    memcpy(err->msg, prefix, plen);
    err->msg[plen] = ':';
    err->msg[plen + 1] = ' ';
    err->msg[plen + 2 + olen] = '\0';
}

ct_status ct_error_prefix(ct_error *err, const char *fmt, ...) {
    if (!err) return CT_OK;
    ct_error prefix;
    va_list ap;
    va_start(ap, fmt);
    ct_error_setv(&prefix, err->code, fmt, ap);
    va_end(ap);
    prepend(err, prefix.msg);
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
