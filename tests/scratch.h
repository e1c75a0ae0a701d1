// A scratch directory for one test program, and where the tests' Python
// readers are (shared by the tests that write files and read them back).
#ifndef CTRAX_TESTS_SCRATCH_H
#define CTRAX_TESTS_SCRATCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char g_tmp[1024];        // this run's scratch directory
static char g_tests_dir[1024];  // where the python readers are

// Makes $TMPDIR/ctrax_<program>_XXXXXX (or under /tmp) and finds the tests
// directory ($CTRAX_TESTS_DIR, or this header's own directory).
static inline void scratch_init(const char *program) {
    const char *env = getenv("CTRAX_TESTS_DIR");
    if (env) snprintf(g_tests_dir, sizeof g_tests_dir, "%s", env);
    else {
        snprintf(g_tests_dir, sizeof g_tests_dir, "%s", __FILE__);
        char *slash = strrchr(g_tests_dir, '/');
        if (slash) *slash = '\0';
        else snprintf(g_tests_dir, sizeof g_tests_dir, "tests");
    }
    const char *t = getenv("TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/ctrax_%s_XXXXXX", t && t[0] ? t : "/tmp", program);
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        exit(1);
    }
}

// A path in the scratch directory, in one of 8 rotating buffers: copy it to
// keep it past the next few calls.
static inline const char *tmp_path(const char *rel) {
    static char buf[8][2048];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_tmp, rel);
    return buf[k];
}

#endif
