/* The one monotonic clock: milliseconds since an arbitrary start
 * (CLOCK_MONOTONIC), for timings, deadlines and heartbeats. Not wall time
 * (logs and job records use the realtime clock themselves). */
#ifndef DITD_ENGINE_CORE_CLOCK_H
#define DITD_ENGINE_CORE_CLOCK_H

#include <time.h>

static inline double ditd_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

#endif
