// A leveled logger that writes to stderr. The level is one of the two mutable
// globals the library has (the other is the abort handler).
#ifndef CTRAX_CORE_LOG_H
#define CTRAX_CORE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_log_level {
    CT_LOG_DEBUG = 0,
    CT_LOG_INFO = 1,
    CT_LOG_WARN = 2,
    CT_LOG_ERROR = 3,
    CT_LOG_OFF = 4,
} ct_log_level;

void ct_log_set_level(ct_log_level level);
ct_log_level ct_log_get_level(void);
// Writes "[ctrax LEVEL] message\n" to stderr if level >= the set level.
void ct_log(ct_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
