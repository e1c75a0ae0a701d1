#include "ctrax/core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "ctrax/core/error.h"

// One of the two mutable globals (see DESIGN.md).
static ct_log_level g_log_level = CT_LOG_INFO;

void ct_log_set_level(ct_log_level level) { g_log_level = level; }
ct_log_level ct_log_get_level(void) { return g_log_level; }

void ct_log(ct_log_level level, const char *fmt, ...) {
    if (level < g_log_level) return;
    static const char *const names[] = {"debug", "info", "warn", "error"};
    // Formatted first, so outside names in it are made printable
    // (ct_text_printable); a line past the buffer is formatted again whole.
    char line[1024], *text = line;
    va_list ap, again;
    va_start(ap, fmt);
    va_copy(again, ap);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    if (n >= (int)sizeof line && (text = malloc((size_t)n + 1)) != NULL) vsnprintf(text, (size_t)n + 1, fmt, again);
    if (!text) text = line;  // without memory the line keeps its start
    va_end(again);
    va_end(ap);
    ct_text_printable(text);
    fprintf(stderr, "[ctrax %s] %s\n", names[level < CT_LOG_OFF ? level : CT_LOG_ERROR], n < 0 ? "" : text);
    if (text != line) free(text);
}
