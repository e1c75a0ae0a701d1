#include "core/clock.h"

#include <time.h>

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ct_now_s(void) { return clock_s(CLOCK_MONOTONIC); }
double ct_wall_time_s(void) { return clock_s(CLOCK_REALTIME); }
