// Clocks, in seconds as doubles.
#ifndef CTRAX_CORE_CLOCK_H
#define CTRAX_CORE_CLOCK_H

// Monotonic time (CLOCK_MONOTONIC): for rates and intervals.
double ct_now_s(void);
// Wall-clock time since the Unix epoch (CLOCK_REALTIME): for timestamps.
double ct_wall_time_s(void);

#endif
