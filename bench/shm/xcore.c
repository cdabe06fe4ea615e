/* xcore: how far apart the host has put this machine's first two CPUs right now, for
 * bench/shm/sweep.sh (issue 25, docs/performance.md "The 4-32 MiB sweep"). Two threads pinned
 * to two CPUs bounce a cache line (the round trip, ns) and one reads 1 MiB that the other has just
 * written (GB/s): the path every same-host collective's data takes from one rank to another. On a
 * virtual machine the two figures move with the host's placement of its virtual CPUs: about 70 ns
 * and 60 GB/s on cores that share a cache, 500 ns and 12 GB/s on cores that do not.
 *
 *   xcore [CPU_A (the first allowed)] [CPU_B (the second allowed)]     prints rtt_ns,xfer_gbs
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUND_TRIPS 20000
#define XFER_BYTES ((size_t)1 << 20)
#define XFERS 10

static _Alignas(64) _Atomic long g_flag;
static char *g_buf;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void await(long v)
{
    while (atomic_load_explicit(&g_flag, memory_order_acquire) != v)
        ;
}

/* The second CPU: answers each round trip, then reads each buffer the first CPU wrote. */
static void *second(void *arg)
{
    (void)arg;
    for (long i = 0; i < ROUND_TRIPS; i++) {
        await(2 * i + 1);
        atomic_store_explicit(&g_flag, 2 * i + 2, memory_order_release);
    }
    volatile unsigned long sink = 0;
    for (long r = 0; r < XFERS; r++) {
        await(-(2 * r + 1));
        unsigned long sum = 0;
        for (size_t i = 0; i < XFER_BYTES; i += sizeof(unsigned long))
            sum += *(const unsigned long *)(g_buf + i);
        sink += sum;
        atomic_store_explicit(&g_flag, -(2 * r + 2), memory_order_release);
    }
    (void)sink;
    return NULL;
}

int main(int argc, char **argv)
{
    cpu_set_t allowed;
    int cpus[2] = {-1, -1}, n = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
            if (CPU_ISSET(c, &allowed))
                cpus[n++] = c;
    if (argc > 2) {
        cpus[0] = atoi(argv[1]);
        cpus[1] = atoi(argv[2]);
    } else if (n < 2) {
        fprintf(stderr, "xcore: needs two CPUs\n");
        return 2;
    }
    g_buf = aligned_alloc(64, XFER_BYTES);
    if (!g_buf || pin(cpus[0]) != 0) {
        fprintf(stderr, "xcore: cannot allocate or pin to CPU %d\n", cpus[0]);
        return 1;
    }
    memset(g_buf, 0, XFER_BYTES);
    /* The second thread starts on its CPU or not at all (a thread that failed to pin itself
     * would leave this one waiting for its answers forever). */
    cpu_set_t b;
    CPU_ZERO(&b);
    CPU_SET(cpus[1], &b);
    pthread_attr_t attr;
    pthread_t t;
    int rc = pthread_attr_init(&attr);
    if (rc == 0)
        rc = pthread_attr_setaffinity_np(&attr, sizeof b, &b);
    if (rc == 0)
        rc = pthread_create(&t, &attr, second, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        fprintf(stderr, "xcore: cannot start a thread on CPU %d: %s\n", cpus[1], strerror(rc));
        free(g_buf);
        return 1;
    }
    double t0 = now();
    for (long i = 0; i < ROUND_TRIPS; i++) {
        atomic_store_explicit(&g_flag, 2 * i + 1, memory_order_release);
        await(2 * i + 2);
    }
    double rtt = (now() - t0) / ROUND_TRIPS;
    double best = 1e30;
    for (long r = 0; r < XFERS; r++) {
        memset(g_buf, (int)r + 1, XFER_BYTES); /* the lines are now this CPU's, modified */
        double a = now();
        atomic_store_explicit(&g_flag, -(2 * r + 1), memory_order_release);
        await(-(2 * r + 2));
        double d = now() - a;
        if (d < best)
            best = d;
    }
    pthread_join(t, NULL);
    free(g_buf);
    printf("%.0f,%.2f\n", rtt * 1e9, (double)XFER_BYTES / best / 1e9);
    return 0;
}
