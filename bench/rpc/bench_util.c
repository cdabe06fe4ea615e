/* bench_util.h: the clock, the median, the exit on error and the temporary FileStore of the RPC
 * benchmarks. */
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <tdist/status.h>

static char g_dir[96], g_store_path[128], g_url[160];

static void remove_store(void)
{
    if (g_store_path[0])
        unlink(g_store_path);
    if (g_dir[0])
        rmdir(g_dir);
}

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

double bench_median(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void bench_die(const char *prog, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", prog, what, td_last_error());
    exit(1);
}

const char *bench_store_url(const char *prog)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/%s.XXXXXX", prog);
    if (!mkdtemp(g_dir)) {
        g_dir[0] = '\0';
        fprintf(stderr, "%s: mkdtemp: cannot make a folder for the store\n", prog);
        exit(1);
    }
    atexit(remove_store);
    snprintf(g_store_path, sizeof g_store_path, "%s/store", g_dir);
    snprintf(g_url, sizeof g_url, "file://%s", g_store_path);
    return g_url;
}
