// Status codes, error messages, and the abort handler.
//
// Library functions that can fail on user input return a ct_status and, when
// given a ct_error, write a message into it that names what failed and where
// (the layer path, the operation, the shapes involved). They never print and
// never exit. Programmer errors (a NULL where none is allowed, an index out of
// range in an internal call) go through CT_ASSERT, which calls the abort
// handler.
#ifndef CTRAX_CORE_ERROR_H
#define CTRAX_CORE_ERROR_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_status {
    CT_OK = 0,
    CT_ERR_ARG,     // an argument or hyperparameter is invalid
    CT_ERR_SHAPE,   // shapes or dtypes do not fit together
    CT_ERR_MEMORY,  // an allocation failed or a memory limit was hit
    CT_ERR_IO,      // a file could not be read or written
    CT_ERR_FORMAT,  // a file or stream holds something malformed
    CT_ERR_STATE,   // the call is not valid in the object's current state
    CT_ERR_NONFINITE,  // a loss, gradient or weight went NaN or infinite (nothing was updated)
} ct_status;

// A message longer than this keeps its start and its end, " ... " between
// (a path of hundreds of characters must not cut off the reason).
#define CT_ERROR_MSG_MAX 1024

// The message of the most recent failure. Pass NULL where a caller does not
// want it; the status code is returned either way.
typedef struct ct_error {
    ct_status code;
    char msg[CT_ERROR_MSG_MAX];
} ct_error;

// Messages name what came from outside (file, tensor and checkpoint names,
// config text): their control characters (C0 but newline and tab, DEL, and
// UTF-8's C1) are made '?' in place, so printing an error or a log line
// never sends a terminal escape sequence. ct_error_set, ct_error_prefix and
// ct_log do it; a program printing outside text itself may call it too.
void ct_text_printable(char *s);

// Sets err (if not NULL) to code and a printf-style message; returns code.
ct_status ct_error_set(ct_error *err, ct_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
// The same with a va_list, for functions that take a format of their own.
ct_status ct_error_setv(ct_error *err, ct_status code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

// Puts "prefix: " in front of the current message, to add context (a layer
// path, a file name) while an error travels up. Returns err->code (CT_OK for
// a NULL err).
ct_status ct_error_prefix(ct_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Clears err to CT_OK with an empty message.
void ct_error_clear(ct_error *err);

// Name of a status code, e.g. "shape error".
const char *ct_status_name(ct_status code);

// The abort handler: called by CT_ASSERT and on allocation failure of memory
// the library cannot do without. The default prints the message to stderr and
// calls abort(). A handler must not return.
typedef void (*ct_abort_fn)(const char *file, int line, const char *msg);
void ct_set_abort_handler(ct_abort_fn fn);
_Noreturn void ct_abort(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define CT_ASSERT(cond)                                                       \
    do {                                                                      \
        if (!(cond)) ct_abort(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)

// Propagates a failed status to the caller.
#define CT_TRY(expr)                          \
    do {                                      \
        ct_status ct_try_status_ = (expr);    \
        if (ct_try_status_ != CT_OK) return ct_try_status_; \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
