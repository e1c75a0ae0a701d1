#include "ctrax/core/log.h"

#include <stdarg.h>
#include <stdio.h>

// One of the two mutable globals (see DESIGN.md).
static ct_log_level g_log_level = CT_LOG_INFO;

void ct_log_set_level(ct_log_level level) { g_log_level = level; }
ct_log_level ct_log_get_level(void) { return g_log_level; }

void ct_log(ct_log_level level, const char *fmt, ...) {
    if (level < g_log_level) return;
    static const char *const names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "[ctrax %s] ", names[level < CT_LOG_OFF ? level : CT_LOG_ERROR]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}
