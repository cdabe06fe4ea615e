/* shm_coll_bench: the shm backend's all_reduce without the process-group front end: the shared-
 * memory collectives (backends/shm/direct.h) called straight on the shm transport, in the ranks'
 * own threads, so that bench/shm/run.sh can show what the backend costs beside what a
 * td_pg_all_reduce call costs (tdist-bench), whose worker thread adds a hand-off per call.
 *
 *   shm_coll_bench -n RANKS [--min 8] [--max 64M] [--factor 2] [--time 0.3] [--batches 5]
 *
 * Measured as tools/tdist-bench/measure.c measures (float32 SUM, in place): for each size the
 * check (every rank fills 1 + (3 * rank + i) % 4 and counts the wrong elements of the sum), one
 * timed call whose slowest-rank time sets about 50 ms of warm-up, then --time seconds of calls in
 * --batches batches, each after a barrier; the time is the median over batches of the slowest
 * rank's mean per call. Prints tdist-bench's CSV columns with impl "tdist-shm-backend". The ranks
 * are forked before anything starts a thread, and meet through a FileStore in a temp dir. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/store.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "backends/shm/direct.h"
#include "transport/shm.h"

typedef struct bench {
    td_coll_ctx c;
    uint64_t seq;
    int rank, n;
} bench;

static td_status coll(bench *b, td_coll_kind kind, td_reduce_op op, td_dtype dt, void *buf, size_t count)
{
    td_coll c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.dtype = dt;
    c.op = td_op_of(op);
    c.count = count;
    c.in = c.out = buf;
    c.seq = ++b->seq;
    c.deadline_ns = clock_now_ns() + 600 * 1000000000LL;
    return shm_coll_run(&b->c, &c);
}

static double slowest(bench *b, double v)
{
    coll(b, TD_COLL_ALL_REDUCE, TD_MAX, TD_FLOAT64, &v, 1);
    return v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double run_calls(bench *b, float *buf, size_t count, long k)
{
    int64_t t0 = clock_now_ns();
    for (long i = 0; i < k; i++)
        if (coll(b, TD_COLL_ALL_REDUCE, TD_SUM, TD_FLOAT32, buf, count) != TD_OK) {
            fprintf(stderr, "shm_coll_bench: rank %d: %s\n", b->rank, td_last_error());
            exit(1);
        }
    return (double)(clock_now_ns() - t0) / 1e3;
}

static int rank_main(int rank, int n, const char *store_path, uint64_t min, uint64_t max, double factor, double secs,
                     int batches)
{
    td_store *store = NULL;
    if (td_file_store_create(store_path, n, &store) != TD_OK) {
        fprintf(stderr, "shm_coll_bench: %s\n", td_last_error());
        return 1;
    }
    td_shm_options o = {.setup.store = store, .setup.rank = rank, .setup.size = n, .setup.timeout_ms = 60000,
                        .setup.group_name = "bench"};
    td_transport *t = NULL;
    if (shm_transport_create(&o, &t) != TD_OK) {
        fprintf(stderr, "shm_coll_bench: rank %d: %s\n", rank, td_last_error());
        return 1;
    }
    bench b = {.rank = rank, .n = n};
    td_coll_config cfg;
    if (coll_config_from_env(&cfg) != TD_OK || coll_ctx_init(&b.c, t, &cfg) != TD_OK) {
        fprintf(stderr, "shm_coll_bench: %s\n", td_last_error());
        return 1;
    }
    float *buf = aligned_alloc(4096, ((size_t)max + 4095) / 4096 * 4096);
    double *times = calloc((size_t)batches, sizeof *times);
    if (rank == 0)
        printf("impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters\n");
    for (uint64_t size = min; size <= max; size = (uint64_t)ceil((double)size * factor)) {
        size_t count = size / 4;
        for (size_t i = 0; i < count; i++)
            buf[i] = (float)(1 + (3 * rank + (int)(i % 1000003)) % 4);
        coll(&b, TD_COLL_ALL_REDUCE, TD_SUM, TD_FLOAT32, buf, count);
        double wrong = 0;
        for (size_t i = 0; i < count; i++) {
            double want = 0;
            for (int r = 0; r < n; r++)
                want += 1 + (3 * r + (int)(i % 1000003)) % 4;
            wrong += buf[i] != (float)want;
        }
        coll(&b, TD_COLL_ALL_REDUCE, TD_SUM, TD_FLOAT64, &wrong, 1);
        double t1 = slowest(&b, run_calls(&b, buf, count, 1));
        long warm = (long)ceil(50000.0 / (t1 > 0.01 ? t1 : 0.01));
        warm = warm < 1 ? 1 : warm > 1000 ? 1000 : warm;
        double est = slowest(&b, run_calls(&b, buf, count, warm) / (double)warm);
        long iters = (long)(secs * 1e6 / (est > 0.01 ? est : 0.01));
        if (iters < batches)
            iters = batches;
        long k = iters / batches;
        for (int j = 0; j < batches; j++) {
            coll(&b, TD_COLL_BARRIER, TD_SUM, TD_FLOAT32, NULL, 0);
            times[j] = slowest(&b, run_calls(&b, buf, count, k) / (double)k);
        }
        qsort(times, (size_t)batches, sizeof *times, cmp_double);
        double us = batches % 2 ? times[batches / 2] : (times[batches / 2 - 1] + times[batches / 2]) / 2;
        double algbw = (double)size / (us * 1e-6) / 1e9;
        if (rank == 0) {
            printf("tdist-shm-backend,all_reduce,%d,float32,SUM,-1,%llu,%zu,%.3f,%.6f,%.6f,%.0f,%ld\n", n,
                   (unsigned long long)size, count, us, algbw, algbw * 2 * (n - 1) / n, wrong, k * batches);
            fflush(stdout);
        }
        if (size == max)
            break;
    }
    free(times);
    free(buf);
    coll_ctx_free(&b.c);
    transport_destroy(t);
    td_store_release(store);
    return 0;
}

static uint64_t size_arg(const char *s)
{
    uint64_t v = 0;
    if (env_parse_size("size", s, &v) != TD_OK) {
        fprintf(stderr, "shm_coll_bench: %s\n", td_last_error());
        exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    int n = 2, batches = 5;
    uint64_t min = 8, max = (uint64_t)64 << 20;
    double factor = 2, secs = 0.3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: shm_coll_bench -n RANKS [--min S] [--max S] [--factor F] [--time S] [--batches N]\n");
            return 2;
        }
        if (!strcmp(a, "-n"))
            n = atoi(v);
        else if (!strcmp(a, "--min"))
            min = size_arg(v);
        else if (!strcmp(a, "--max"))
            max = size_arg(v);
        else if (!strcmp(a, "--factor"))
            factor = atof(v);
        else if (!strcmp(a, "--time"))
            secs = atof(v);
        else if (!strcmp(a, "--batches"))
            batches = atoi(v);
        else {
            fprintf(stderr, "shm_coll_bench: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (n < 1 || n > 64 || min < 4 || max < min || factor <= 1 || batches < 1) {
        fprintf(stderr, "shm_coll_bench: bad arguments\n");
        return 2;
    }
    char dir[] = "/tmp/shm_coll_bench.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char path[128];
    snprintf(path, sizeof path, "%s/store", dir);
    fflush(stdout);
    pid_t pids[64];
    for (int r = 1; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(rank_main(r, n, path, min, max, factor, secs, batches));
    }
    int rc = rank_main(0, n, path, min, max, factor, secs, batches);
    for (int r = 1; r < n; r++) {
        int st = 0;
        waitpid(pids[r], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            rc = 1;
    }
    unlink(path);
    rmdir(dir);
    return rc;
}
