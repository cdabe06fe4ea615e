/* tdist-bench: the measuring loop of one rank and rank 0's output.
 *
 * For each size: first the check (fill the inputs, run once, count wrong elements on every rank and
 * sum them), then the timing, which every peer program in bench/peers repeats exactly:
 *   1. one call, timed; the slowest rank's time t1 (an all_reduce MAX) sets the warm-up:
 *      ceil(50 ms / t1) calls (1 to 1000), unless --warmup says how many;
 *   2. the warm-up calls, timed together; their mean (slowest rank) estimates one call, and sets
 *      the iterations: --time divided by it, at least --min-iters (unless --iters says how many);
 *   3. the iterations in --batches batches of k calls: a barrier, then k blocking calls back to
 *      back; each rank's batch time divided by k is its mean per call in that batch;
 *   4. per batch the slowest rank's mean (an all_reduce MAX), and the reported time is the median
 *      over the batches.
 * So the time is a median over batches of the slowest rank's mean per call. A batch starts at a
 * barrier, and ranks leave a barrier a few microseconds apart; k calls per batch spread that
 * skew over k (for small messages k is in the thousands). Every rank computes the same counts from
 * the same agreed values, so the ranks never disagree on how many calls to make. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "bench.h"

#define MAX_ITERS 10000000

typedef struct row {
    uint64_t bytes;
    int64_t count;
    double time_us;
    int64_t wrong; /* -1: not checked */
    int64_t iters;
} row;

static double secs(void) { return (double)clock_now_ns() * 1e-9; }

/* Every rank gets the elementwise maximum (or sum) of v over the ranks. */
static td_status agree(td_pg *pg, double *v, int n, td_op op)
{
    td_tensor *t = NULL;
    TD_TRY(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(n), v, &t));
    td_status s = td_pg_all_reduce(pg, t, op, NULL);
    if (s == TD_OK)
        s = td_tensor_read(t, v, (size_t)n * sizeof *v);
    td_tensor_release(t);
    return s;
}

static td_status run_calls(bench_case *c, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        TD_TRY(bench_case_run(c));
    return TD_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int64_t clamp64(double v, int64_t lo, int64_t hi)
{
    if (!(v >= (double)lo))
        return lo;
    if (v >= (double)hi)
        return hi;
    return (int64_t)ceil(v);
}

static td_status measure(const bench_options *o, td_pg *pg, bench_case *c, row *r)
{
    r->wrong = -1;
    if (o->check) {
        bench_case_fill(c);
        TD_TRY(bench_case_run(c));
        double w = (double)bench_case_wrong(c);
        TD_TRY(agree(pg, &w, 1, TD_OP_SUM));
        r->wrong = (int64_t)w;
    }
    double t0 = secs();
    TD_TRY(bench_case_run(c));
    double t1 = secs() - t0;
    TD_TRY(agree(pg, &t1, 1, TD_OP_MAX));
    int64_t warmup = o->warmup >= 0 ? o->warmup : clamp64(0.05 / fmax(t1, 1e-9), 1, 1000);
    double est = t1;
    if (warmup > 0) {
        t0 = secs();
        TD_TRY(run_calls(c, warmup));
        est = (secs() - t0) / (double)warmup;
        TD_TRY(agree(pg, &est, 1, TD_OP_MAX));
    }
    int64_t iters = o->iters > 0 ? o->iters : clamp64(o->time_s / fmax(est, 1e-9), o->min_iters, MAX_ITERS);
    int batches = iters < o->batches ? (int)iters : o->batches;
    int64_t k = (iters + batches - 1) / batches;
    double *times = calloc((size_t)batches, sizeof *times);
    if (!times)
        return error_fmt(TD_ERR_NOMEM, "tdist-bench: out of memory");
    td_status s = TD_OK;
    for (int b = 0; b < batches && s == TD_OK; b++) {
        s = td_pg_barrier(pg, NULL);
        if (s != TD_OK)
            break;
        t0 = secs();
        s = run_calls(c, k);
        times[b] = (secs() - t0) / (double)k;
    }
    if (s == TD_OK)
        s = agree(pg, times, batches, TD_OP_MAX);
    if (s == TD_OK) {
        qsort(times, (size_t)batches, sizeof *times, cmp_double);
        double med = batches % 2 ? times[batches / 2] : 0.5 * (times[batches / 2 - 1] + times[batches / 2]);
        r->time_us = med * 1e6;
        r->iters = k * batches;
    }
    free(times);
    return s;
}

static const char *redop_text(const bench_options *o)
{
    return bench_op_reduces(o->op) ? td_reduce_op_name(o->redop) : "none";
}

static bool rooted(bench_op op)
{
    return op == BENCH_BROADCAST || op == BENCH_REDUCE || op == BENCH_GATHER || op == BENCH_SCATTER;
}

static const char *busbw_formula(bench_op op)
{
    switch (op) {
    case BENCH_ALL_REDUCE: return "2(n-1)/n";
    case BENCH_BROADCAST:
    case BENCH_REDUCE:
    case BENCH_SEND_RECV: return "1";
    case BENCH_BARRIER: return "0";
    default: return "(n-1)/n";
    }
}

static void print_header(const bench_options *o, int world)
{
    if (!o->header)
        return;
    if (o->csv) {
        printf("impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters\n");
        return;
    }
    const char *algo = getenv("TDIST_ALGO");
    printf("# tdist-bench: %s, %d ranks, backend %s, dtype %s, reduce op %s, root %d, TDIST_ALGO %s\n",
           bench_op_name(o->op), world, o->backend, td_dtype_name(o->dtype), redop_text(o), rooted(o->op) ? o->root : -1,
           algo && *algo ? algo : "auto");
    if (o->op == BENCH_SEND_RECV)
        printf("# time: half a ping-pong round trip between ranks 0 and 1 (median of %d batches)\n", o->batches);
    else
        printf("# time: median of %d batches of the slowest rank's mean time per call (barrier before each batch)\n",
               o->batches);
    printf("# algbw = size / time; busbw = algbw x %s (nccl-tests); GB/s = 1e9 bytes/s\n#\n", busbw_formula(o->op));
    printf("# %10s %12s %9s %7s %5s %11s %12s %12s %8s %9s\n", "size", "count", "type", "redop", "root", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters");
    fflush(stdout);
}

static void print_row(const bench_options *o, int world, const row *r)
{
    double t = r->time_us;
    if (o->op == BENCH_SEND_RECV)
        t /= 2; /* one way */
    double algbw = t > 0 ? (double)r->bytes / (t * 1e-6) / 1e9 : 0;
    double busbw = algbw * bench_busbw_factor(o->op, world);
    int root = rooted(o->op) ? o->root : -1;
    char wrong[32];
    if (r->wrong < 0)
        snprintf(wrong, sizeof wrong, "N/A");
    else
        snprintf(wrong, sizeof wrong, "%" PRId64, r->wrong);
    if (o->csv)
        printf("%s,%s,%d,%s,%s,%d,%" PRIu64 ",%" PRId64 ",%.3f,%.6f,%.6f,%s,%" PRId64 "\n", o->impl, bench_op_name(o->op),
               world, td_dtype_name(o->dtype), redop_text(o), root, r->bytes, r->count, t, algbw, busbw, wrong,
               r->iters);
    else
        printf("  %10" PRIu64 " %12" PRId64 " %9s %7s %5d %11.2f %12.3f %12.3f %8s %9" PRId64 "\n", r->bytes, r->count,
               td_dtype_name(o->dtype), redop_text(o), root, t, algbw, busbw, wrong, r->iters);
    fflush(stdout);
}

int bench_run_rank(const bench_options *o, td_pg *pg)
{
    int rank = td_pg_rank(pg), world = td_pg_size(pg);
    bench_case *c = NULL;
    td_status s = bench_case_create(o, pg, &c);
    if (s != TD_OK) {
        fprintf(stderr, "tdist-bench: [rank %d] allocating buffers of %" PRIu64 " bytes: %s\n", rank, o->max_bytes,
                td_last_error());
        return 1;
    }
    if (rank == 0)
        print_header(o, world);
    int64_t total_wrong = 0;
    double busbw_sum = 0;
    int rows = 0;
    uint64_t last = UINT64_MAX;
    uint64_t req = o->op == BENCH_BARRIER ? 0 : o->min_bytes;
    for (;;) {
        row r = {0};
        s = bench_case_resize(c, req, &r.bytes, &r.count);
        if (s == TD_OK && r.bytes != last) {
            s = measure(o, pg, c, &r);
            if (s == TD_OK && rank == 0) {
                print_row(o, world, &r);
                double t = o->op == BENCH_SEND_RECV ? r.time_us / 2 : r.time_us;
                busbw_sum += t > 0 ? (double)r.bytes / (t * 1e-6) / 1e9 * bench_busbw_factor(o->op, world) : 0;
                rows++;
            }
            if (r.wrong > 0)
                total_wrong += r.wrong;
            last = r.bytes;
        }
        if (s != TD_OK) {
            fprintf(stderr, "tdist-bench: [rank %d] %s of %" PRIu64 " bytes failed: %s\n", rank, bench_op_name(o->op),
                    req, td_last_error());
            bench_case_destroy(c);
            return 1;
        }
        if (o->op == BENCH_BARRIER || req >= o->max_bytes)
            break;
        double next = o->step_bytes ? (double)req + (double)o->step_bytes : floor((double)req * o->factor + 0.5);
        req = next <= (double)req ? req + 1 : (uint64_t)next;
        if (req > o->max_bytes)
            break;
    }
    if (rank == 0 && !o->csv && o->header) {
        printf("# wrong elements: %" PRId64 " (%s)\n", total_wrong, o->check ? (total_wrong ? "FAILED" : "OK") : "not checked");
        if (o->op != BENCH_BARRIER)
            printf("# average bus bandwidth: %.3f GB/s\n#\n", rows ? busbw_sum / rows : 0.0);
        fflush(stdout);
    }
    bench_case_destroy(c);
    return total_wrong ? 3 : 0;
}
