// A minimal test harness: CHECK records a failure with file and line and goes
// on; check_summary prints "N passed, N failed" and gives the exit code.
#ifndef CTRAX_TESTS_CHECK_H
#define CTRAX_TESTS_CHECK_H

#include <math.h>
#include <stdio.h>
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

// A call that returns ct_status must succeed; prints the error if not.
#define CHECK_OK(expr, errp)                                                      \
    do {                                                                          \
        ct_status st_ = (expr);                                                   \
        CHECK_MSG(st_ == CT_OK, "%s", (errp)->msg);                               \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                     \
    do {                                                                          \
        double a_ = (a), b_ = (b);                                                \
        CHECK_MSG(fabs(a_ - b_) <= (tol), "%.9g vs %.9g (tol %g)", a_, b_, (double)(tol)); \
    } while (0)

static inline int check_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed_, check_failed_);
    return check_failed_ ? 1 : 0;
}

#endif
