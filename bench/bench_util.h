/* What the transformer benchmarks (bench_flux.c, bench_sd3.c, bench_wan.c)
 * share: the clock (wall time, or with --cpu-time the process's CPU time
 * over its threads: one rank only, far less noisy on a machine shared by
 * more runnable threads than cores), the median of the reps, and the
 * per-axis, per-collective calls and bytes a mesh's comm layer counted
 * (engine/parallel/comm.h). A header of static helpers: each benchmark is
 * one program. */
#ifndef DITD_BENCH_UTIL_H
#define DITD_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/parallel/comm.h"
#include "engine/parallel/mesh.h"

static int g_cpu_time, g_threads = 1; /* --cpu-time; the threads it divides by */

static inline double bench_now_ms(void)
{
    struct timespec ts;
    clock_gettime(g_cpu_time ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return ((double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6) / (g_cpu_time ? g_threads : 1);
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v (n values) and returns their median. */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct bench_stats {
    uint64_t calls[DITD_AXIS_COUNT][DITD_COLL_COUNT];
    uint64_t bytes[DITD_AXIS_COUNT][DITD_COLL_COUNT];
    double ms;
} bench_stats;

/* The mesh's counters since the last ditd_mesh_stats_reset (zeros
 * without a mesh). */
static inline void stats_take(const ditd_mesh *mesh, bench_stats *s)
{
    memset(s, 0, sizeof *s);
    if (!mesh)
        return;
    for (int a = 0; a < DITD_AXIS_COUNT; a++) {
        const ditd_comm_stat *st = ditd_comm_stats(ditd_mesh_comm(mesh, (ditd_mesh_axis)a));
        for (int k = 0; k < DITD_COLL_COUNT; k++) {
            s->calls[a][k] = st[k].calls;
            s->bytes[a][k] = st[k].bytes;
            s->ms += st[k].ms;
        }
    }
}

#endif
