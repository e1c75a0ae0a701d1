// A minimal test harness: CHECK records a failure with file and line and goes
// on; check_summary prints "N passed, N failed" and gives the exit code.
//
// CHECK_OK is different: what follows a failed call usually uses its result
// (a NULL stream, an unset loop), so going on would crash and hide the
// message. It reports, prints the summary line and ends the program with
// status 1. CHECK_OK_OR(expr, errp, action) reports and runs action instead
// (`return`, `return NULL`, `goto done`), for a test that can clean up and
// let the next test run.
#ifndef CTRAX_TESTS_CHECK_H
#define CTRAX_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_passed_, check_failed_;

#define CHECK(cond)                                                               \
    do {                                                                          \
        if (cond) check_passed_++;                                                \
        else {                                                                    \
            check_failed_++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);       \
        }                                                                         \
    } while (0)

#define CHECK_MSG(cond, ...)                                                      \
    do {                                                                          \
        if (cond) check_passed_++;                                                \
        else {                                                                    \
            check_failed_++;                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
        }                                                                         \
    } while (0)

static inline int check_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

// Ends the program after a failed CHECK_OK: the summary line (named after the
// test's source file), then status 1. _Exit runs no atexit handlers, so a
// leak check does not bury the failure under the test's half-built objects.
static inline _Noreturn void check_stop_(const char *file, int line) {
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    int len = (int)strcspn(base, ".");
    fprintf(stderr, "STOP %s:%d: a CHECK_OK failed; the rest of the program is skipped\n", file, line);
    printf("%.*s: %d passed, %d failed (stopped at %s:%d)\n", len, base, check_passed_, check_failed_, base, line);
    fflush(stdout);
    fflush(stderr);
    _Exit(1);
}

// A call that returns ct_status must succeed: prints the error and runs
// action if not.
#define CHECK_OK_OR(expr, errp, action)                                           \
    do {                                                                          \
        ct_status st_ = (expr);                                                   \
        CHECK_MSG(st_ == CT_OK, "%s", (errp)->msg);                               \
        if (st_ != CT_OK) { action; }                                             \
    } while (0)

// A call that returns ct_status must succeed: prints the error and ends the
// program if not (see above).
#define CHECK_OK(expr, errp) CHECK_OK_OR(expr, errp, check_stop_(__FILE__, __LINE__))

// The larger of a running worst error m and a new error e, with a NaN e as
// +inf. fmax(m, NaN) is m, and `if (e > m) m = e` skips a NaN too, so a
// result that is NaN (a kernel that wrote NaN, or nothing) would read as an
// error of 0 and pass every bound; +inf fails them all.
static inline double check_worse(double m, double e) { return isnan(e) ? INFINITY : (e > m ? e : m); }

#define CHECK_NEAR(a, b, tol)                                                     \
    do {                                                                          \
        double a_ = (a), b_ = (b);                                                \
        CHECK_MSG(fabs(a_ - b_) <= (tol), "%.9g vs %.9g (tol %g)", a_, b_, (double)(tol)); \
    } while (0)

#endif
