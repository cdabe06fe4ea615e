/* tdist-bench: the measuring loop of one rank and rank 0's output.
 *
 * For each size: first the check (fill the inputs, run once, count wrong elements on every rank and
 * sum them), then the timing, which every peer program in bench/peers repeats exactly:
 *   1. one call, timed; the slowest rank's time t1 (an all_reduce MAX) sets the warm-up:
 *      ceil(50 ms / t1) calls (1 to 1000), unless --warmup says how many;
 *   2. the warm-up calls, timed together; their mean (slowest rank) estimates one call, and sets
 *      the iterations: --time divided by it, at least --min-iters (unless --iters says how many);
 *   3. the iterations (-n/--iters, or as many as --time allows) in --batches batches split as evenly
 *      as can be (the first ones take one call more): a barrier, then the batch's k blocking calls
 *      back to back; each rank's batch time divided by k is its mean per call in that batch;
 *   4. per batch the slowest rank's mean (an all_reduce MAX), and the reported time is the median
 *      over the batches.
 * So the time is a median over batches of the slowest rank's mean per call. A batch starts at a
 * barrier, and ranks leave a barrier a few microseconds apart; k calls per batch spread that
 * skew over k (for small messages k is in the thousands). Every rank computes the same counts from
 * the same agreed values, so the ranks never disagree on how many calls to make.
 *
 * A size is measured in each form the op has (bench_op_has): out of place, then in place, each
 * with its own check and timing. Rank 0 prints a row per size (per reduce op with -o all) with
 * both column sets, as nccl-tests does, "N/A" in the set of a form the op lacks. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "bench.h"

#define MAX_ITERS 10000000

/* One form of one size: its time, check and calls. */
typedef struct figures {
    double time_us;
    int64_t wrong; /* -1: not checked */
    int64_t iters;
} figures;

typedef struct row {
    uint64_t bytes;
    int64_t count;
    td_reduce_op redop;
    bool has[BENCH_PLACEMENTS]; /* the forms measured */
    figures form[BENCH_PLACEMENTS];
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

static td_status measure(const bench_options *o, td_pg *pg, bench_case *c, figures *f)
{
    f->wrong = -1;
    if (o->check) {
        bench_case_fill(c);
        TD_TRY(bench_case_run(c));
        double w = (double)bench_case_wrong(c);
        TD_TRY(agree(pg, &w, 1, TD_OP_SUM));
        f->wrong = (int64_t)w;
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
    double *times = calloc((size_t)batches, sizeof *times);
    if (!times)
        return error_fmt(TD_ERR_NOMEM, "tdist-bench: out of memory");
    td_status s = TD_OK;
    for (int b = 0; b < batches && s == TD_OK; b++) {
        int64_t k = iters / batches + (b < iters % batches);
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
        f->time_us = med * 1e6;
        f->iters = iters;
    }
    free(times);
    return s;
}

/* One size in every form the op has. */
static td_status measure_row(const bench_options *o, td_pg *pg, bench_case *c, uint64_t requested, row *r)
{
    for (int p = 0; p < BENCH_PLACEMENTS; p++) {
        r->has[p] = bench_op_has(o->op, (bench_placement)p);
        if (!r->has[p])
            continue;
        TD_TRY(bench_case_resize(c, requested, (bench_placement)p, &r->bytes, &r->count));
        TD_TRY(measure(o, pg, c, &r->form[p]));
    }
    return TD_OK;
}

/* The form whose figures fill the CSV's time_us..iters columns: out of place where the op has it
 * (what tdist-bench measured before it measured both), else in place. */
static bench_placement primary_form(bench_op op)
{
    return bench_op_has(op, BENCH_OUT_OF_PLACE) ? BENCH_OUT_OF_PLACE : BENCH_IN_PLACE;
}

static const char *redop_text(const bench_options *o, td_reduce_op redop)
{
    return bench_op_reduces(o->op) ? td_reduce_op_name(redop) : "none";
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

/* The time reported for one form (one way for send_recv's round trip) and its bandwidths. */
static void bandwidths(const bench_options *o, int world, uint64_t bytes, const figures *f, double *time_us,
                       double *algbw, double *busbw)
{
    *time_us = o->op == BENCH_SEND_RECV ? f->time_us / 2 : f->time_us;
    *algbw = *time_us > 0 ? (double)bytes / (*time_us * 1e-6) / 1e9 : 0;
    *busbw = *algbw * bench_busbw_factor(o->op, world);
}

static const char *wrong_text(const figures *f, char *buf, size_t size)
{
    if (f->wrong < 0)
        return "N/A";
    snprintf(buf, size, "%" PRId64, f->wrong);
    return buf;
}

#define SET_COLUMNS " %11s %12s %12s %8s %9s" /* time, algbw, busbw, #wrong, iters */
#define SET_WIDTH 57                            /* the characters SET_COLUMNS prints */
#define LEAD_WIDTH 49                           /* "# " or "  ", then size .. root */

static void print_header(const bench_options *o, int world)
{
    if (!o->header)
        return;
    if (o->csv) {
        printf("impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters,"
               "placement,inplace_time_us,inplace_algbw_gbs,inplace_busbw_gbs,inplace_wrong,inplace_iters\n");
        return;
    }
    const char *algo = getenv("TDIST_ALGO");
    printf("# tdist-bench: %s, %d ranks, backend %s, dtype %s, reduce op %s, root %d, TDIST_ALGO %s\n",
           bench_op_name(o->op), world, o->backend, td_dtype_name(o->dtype),
           o->all_redops && bench_op_reduces(o->op) ? "all" : redop_text(o, o->redop), rooted(o->op) ? o->root : -1,
           algo && *algo ? algo : "auto");
    if (o->op == BENCH_SEND_RECV)
        printf("# time: half a ping-pong round trip between ranks 0 and 1 (median of %d batches)\n", o->batches);
    else
        printf("# time: median of %d batches of the slowest rank's mean time per call (barrier before each batch)\n",
               o->batches);
    if (o->warmup >= 0)
        printf("# warm-up: %" PRId64 " calls per size and form\n", o->warmup);
    else
        printf("# warm-up: about 50 ms of calls per size and form (1 to 1000)\n");
    printf("# algbw = size / time; busbw = algbw x %s (nccl-tests); GB/s = 1e9 bytes/s\n", busbw_formula(o->op));
    printf("# forms: %s; N/A where the op has no such form\n#\n", bench_placement_note(o->op));
    /* The two set names centred over their columns, as nccl-tests labels them. */
    int out_len = (int)strlen("out-of-place"), in_len = (int)strlen("in-place");
    printf("#%*s%*s%*s\n", LEAD_WIDTH - 1, "", (SET_WIDTH + out_len) / 2, "out-of-place",
           SET_WIDTH - (SET_WIDTH + out_len) / 2 + (SET_WIDTH + in_len) / 2, "in-place");
    printf("# %10s %12s %9s %7s %5s" SET_COLUMNS SET_COLUMNS "\n", "size", "count", "type", "redop", "root", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters");
    fflush(stdout);
}

static void print_row(const bench_options *o, int world, const row *r)
{
    int root = rooted(o->op) ? o->root : -1;
    const char *redop = redop_text(o, r->redop);
    char wrong[32];
    double t, algbw, busbw;
    if (o->csv) {
        bench_placement main_form = primary_form(o->op);
        const figures *f = &r->form[main_form];
        bandwidths(o, world, r->bytes, f, &t, &algbw, &busbw);
        printf("%s,%s,%d,%s,%s,%d,%" PRIu64 ",%" PRId64 ",%.3f,%.6f,%.6f,%s,%" PRId64 ",%s", o->impl,
               bench_op_name(o->op), world, td_dtype_name(o->dtype), redop, root, r->bytes, r->count, t, algbw, busbw,
               wrong_text(f, wrong, sizeof wrong), f->iters, bench_placement_name(main_form));
        f = &r->form[BENCH_IN_PLACE];
        if (main_form != BENCH_IN_PLACE && r->has[BENCH_IN_PLACE]) {
            bandwidths(o, world, r->bytes, f, &t, &algbw, &busbw);
            printf(",%.3f,%.6f,%.6f,%s,%" PRId64 "\n", t, algbw, busbw, wrong_text(f, wrong, sizeof wrong), f->iters);
        } else {
            printf(",N/A,N/A,N/A,N/A,N/A\n");
        }
        fflush(stdout);
        return;
    }
    printf("  %10" PRIu64 " %12" PRId64 " %9s %7s %5d", r->bytes, r->count, td_dtype_name(o->dtype), redop, root);
    for (int p = 0; p < BENCH_PLACEMENTS; p++) {
        const figures *f = &r->form[p];
        if (!r->has[p]) {
            printf(SET_COLUMNS, "N/A", "N/A", "N/A", "N/A", "N/A");
            continue;
        }
        bandwidths(o, world, r->bytes, f, &t, &algbw, &busbw);
        printf(" %11.2f %12.3f %12.3f %8s %9" PRId64, t, algbw, busbw, wrong_text(f, wrong, sizeof wrong), f->iters);
    }
    printf("\n");
    fflush(stdout);
}

/* -o all: every reduce op of nccl-tests' set that the dtype and the backend take. */
static const td_reduce_op every_redop[] = {TD_SUM, TD_PRODUCT, TD_MIN, TD_MAX, TD_AVG};

static bool redop_runs(const bench_options *o, td_pg *pg, td_reduce_op redop)
{
    return td_reduce_check(redop, o->dtype) == TD_OK &&
           td_pg_supports(pg, bench_op_name(o->op), o->dtype, redop) == TD_OK;
}

int bench_run_rank(const bench_options *options, td_pg *pg)
{
    bench_options run = *options; /* the case reads run.redop, which -o all changes row by row */
    const bench_options *o = &run;
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
    bool all = o->all_redops && bench_op_reduces(o->op);
    const td_reduce_op *redops = all ? every_redop : &options->redop;
    int nredops = all ? (int)(sizeof every_redop / sizeof *every_redop) : 1;
    int64_t total_wrong = 0;
    double busbw_sum = 0;
    int figures_measured = 0;
    uint64_t last = UINT64_MAX;
    uint64_t req = o->op == BENCH_BARRIER ? 0 : o->min_bytes;
    for (;;) {
        uint64_t bytes;
        int64_t count;
        s = bench_case_resize(c, req, primary_form(o->op), &bytes, &count);
        for (int i = 0; s == TD_OK && bytes != last && i < nredops; i++) {
            if (all && !redop_runs(o, pg, redops[i]))
                continue;
            run.redop = redops[i];
            row r = {.redop = run.redop};
            s = measure_row(o, pg, c, req, &r);
            for (int p = 0; s == TD_OK && p < BENCH_PLACEMENTS; p++) {
                if (!r.has[p])
                    continue;
                double t, algbw, busbw;
                bandwidths(o, world, r.bytes, &r.form[p], &t, &algbw, &busbw);
                busbw_sum += busbw;
                figures_measured++;
                if (r.form[p].wrong > 0)
                    total_wrong += r.form[p].wrong;
            }
            if (s == TD_OK && rank == 0)
                print_row(o, world, &r);
        }
        if (s != TD_OK) {
            fprintf(stderr, "tdist-bench: [rank %d] %s of %" PRIu64 " bytes failed: %s\n", rank, bench_op_name(o->op),
                    req, td_last_error());
            bench_case_destroy(c);
            return 1;
        }
        last = bytes;
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
            printf("# average bus bandwidth: %.3f GB/s (over every form and size)\n#\n",
                   figures_measured ? busbw_sum / figures_measured : 0.0);
        fflush(stdout);
    }
    bench_case_destroy(c);
    return total_wrong ? 3 : 0;
}
