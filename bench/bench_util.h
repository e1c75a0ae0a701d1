// What the benchmarks share: the process's memory and clocks (Linux).
#ifndef CTRAX_BENCH_UTIL_H
#define CTRAX_BENCH_UTIL_H

#include <stdio.h>
#include <time.h>

// Resident and peak resident set size (VmRSS, VmHWM) in bytes, from
// /proc/self/status; 0 where unknown.
static inline void bench_rss(size_t *now, size_t *peak) {
    *now = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned long kb;
        if (sscanf(line, "VmRSS: %lu kB", &kb) == 1) *now = kb * 1024;
        if (sscanf(line, "VmHWM: %lu kB", &kb) == 1) *peak = kb * 1024;
    }
    fclose(f);
}

// Seconds on clock id (CLOCK_MONOTONIC: wall; CLOCK_PROCESS_CPUTIME_ID: CPU).
static inline double bench_clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
