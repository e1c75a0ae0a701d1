// stderr into a file while a call runs, to see the warnings it logs:
//   capture c; capture_begin(&c); ...; char *text = capture_end(&c); ... free(text);
#ifndef CTRAX_TESTS_CAPTURE_H
#define CTRAX_TESTS_CAPTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct capture {
    int saved;
    FILE *f;
} capture;

static inline void capture_begin(capture *c) {
    fflush(stderr);
    c->f = tmpfile();
    c->saved = dup(2);
    dup2(fileno(c->f), 2);
}

// What was written to stderr since capture_begin (the caller frees it).
static inline char *capture_end(capture *c) {
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    long n = ftell(c->f);
    char *s = calloc((size_t)n + 1, 1);
    rewind(c->f);
    if (fread(s, 1, (size_t)n, c->f) != (size_t)n) s[0] = '\0';
    fclose(c->f);
    return s;
}

#endif
