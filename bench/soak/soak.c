/* tdist-soak: a long randomized run of every collective, checked element by element, with the
 * process's memory watched (issue 23: "a soak run outside CI").
 *
 *   tdrun --standalone --nproc-per-node 4 tdist-soak --backend tcp --minutes 30
 *   <build>/tdist-mpiexec -n 4 tdist-soak --backend mpi --minutes 30
 *   tdist-soak --backend threaded --nproc 4 --minutes 30        (ranks as threads of this process)
 *
 * Every rank draws the same sequence of steps from one seeded generator (--seed, printed at the
 * start: a failure replays with the same seed and world). A step is a collective or a ring of
 * sends and receives, a dtype, a reduce op, a size (log-uniform up to --max-elems, most steps
 * small), a root, a group (the world or one of the subgroups made at the start; ranks outside it
 * skip the step), a layout (some steps run on strided views) and blocking or asynchronous (up to
 * --inflight operations stay in flight before they are waited for together). Inputs are small
 * integers computed from (seed, step, rank, slot, index), so every rank knows every other rank's
 * input and every output element is compared with its exact value: sums of small integers, products
 * of 1, -1 and 2, AVG of inputs whose sum divides by the group size stay exact in every dtype,
 * float16 and bfloat16 included. A wrong element prints the step's whole description and exits 1.
 *
 * Memory: RSS (/proc/self/statm) is sampled every --check-every steps; the sample after the first
 * 10% of the run is the warm-up's, and the end's may exceed it by at most --max-growth-mib. Each
 * rank ends with one line a script reads:
 *   SOAK rank=0 backend=tcp world=4 seed=... steps=... ops=... bytes=... seconds=... steps_per_s=...
 *        rss_warm_kib=... rss_peak_kib=... rss_end_kib=... growth_kib=... result=ok
 * (result: ok, wrong, error or rss_growth). Exit status 0 only when every check passed; 2 for a bad
 * command line. Uses only the public API. */
#include <inttypes.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tdist/backend.h>
#include <tdist/future.h>
#include <tdist/pg.h>
#include <tdist/store.h>
#include <tdist/tensor.h>

#define MAX_WORLD 64
#define MAX_GROUPS 8
#define MAX_TENSORS (2 * MAX_WORLD + 2)
#define MAX_COALESCED 3

/* ---- options ------------------------------------------------------------------------------- */

typedef struct soak_options {
    const char *backend;
    double seconds;      /* run time; the run ends at the first check after it */
    int64_t steps;       /* > 0: exactly this many steps instead */
    uint64_t seed;
    bool seed_given;
    int64_t max_elems;   /* largest tensor, in elements */
    int inflight;        /* async operations in flight before a wait-all */
    int check_every;     /* steps between stop checks and RSS samples */
    double max_growth_mib;
    int nproc;           /* threaded backend: rank threads */
    int64_t timeout_ms;
    double progress_s;   /* seconds between rank 0's progress lines; 0: none */
    bool prelude;        /* every collective at the largest size on every group first */
} soak_options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tdist-soak [--backend NAME] [--minutes M | --seconds S | --steps N] [--seed N]\n"
            "                  [--max-elems N] [--inflight N] [--check-every N] [--max-growth-mib M]\n"
            "                  [--nproc N] [--timeout-ms MS] [--progress S] [--no-prelude]\n"
            "  --backend NAME       tcp, shm, auto (default), mpi (under mpiexec), threaded (ranks as threads)\n"
            "  --minutes, --seconds how long to run (default 1 minute); --steps N runs exactly N steps\n"
            "  --seed N             the generator's seed (default: from the clock; printed at the start)\n"
            "  --max-elems N        largest tensor in elements (default 4194304)\n"
            "  --inflight N         asynchronous operations in flight before waiting for them (default 4)\n"
            "  --check-every N      steps between stop checks and RSS samples (default 16)\n"
            "  --max-growth-mib M   allowed RSS growth from the end of the warm-up (10%% of the run) to the end (64)\n"
            "  --nproc N            threaded backend: rank threads (default 4)\n"
            "  --timeout-ms MS      the groups' timeout (default 120000)\n"
            "  --progress S         seconds between progress lines (default 60; 0: none)\n"
            "  --no-prelude         skip the prelude (every collective at --max-elems on every group, run first\n"
            "                       so that buffers kept at their largest size are full before the warm-up)\n");
}

static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tdist-soak: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    usage(stderr);
    exit(2);
}

static double number_arg(const char *flag, const char *s, double lo, double hi)
{
    char *end;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || !(v >= lo && v <= hi))
        bad_usage("%s wants a number between %g and %g, got '%s'", flag, lo, hi, s ? s : "");
    return v;
}

static void parse(int argc, char **argv, soak_options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--no-prelude") == 0) {
            o->prelude = false;
            continue;
        }
        if (strcmp(a, "--backend") == 0)
            o->backend = v;
        else if (strcmp(a, "--minutes") == 0)
            o->seconds = 60 * number_arg(a, v, 0, 1e6);
        else if (strcmp(a, "--seconds") == 0)
            o->seconds = number_arg(a, v, 0, 1e8);
        else if (strcmp(a, "--steps") == 0)
            o->steps = (int64_t)number_arg(a, v, 1, 1e15);
        else if (strcmp(a, "--seed") == 0) {
            char *end;
            o->seed = v ? strtoull(v, &end, 0) : 0;
            if (!v || end == v || *end)
                bad_usage("--seed wants an integer, got '%s'", v ? v : "");
            o->seed_given = true;
        } else if (strcmp(a, "--max-elems") == 0)
            o->max_elems = (int64_t)number_arg(a, v, 1, 1 << 28);
        else if (strcmp(a, "--inflight") == 0)
            o->inflight = (int)number_arg(a, v, 1, 64);
        else if (strcmp(a, "--check-every") == 0)
            o->check_every = (int)number_arg(a, v, 1, 1 << 20);
        else if (strcmp(a, "--max-growth-mib") == 0)
            o->max_growth_mib = number_arg(a, v, 0, 1 << 20);
        else if (strcmp(a, "--nproc") == 0)
            o->nproc = (int)number_arg(a, v, 1, MAX_WORLD);
        else if (strcmp(a, "--progress") == 0)
            o->progress_s = number_arg(a, v, 0, 1e9);
        else if (strcmp(a, "--timeout-ms") == 0)
            o->timeout_ms = (int64_t)number_arg(a, v, 1, 1e9);
        else
            bad_usage("unknown argument '%s'", a);
        if (!v)
            bad_usage("%s needs a value", a);
        i++;
    }
    if (!o->backend)
        bad_usage("--backend needs a value");
}

/* ---- the generator and the values ---------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct rng {
    uint64_t state;
} rng;

static uint64_t rng_next(rng *r)
{
    r->state += 0x9e3779b97f4a7c15ull;
    return mix64(r->state);
}

static uint64_t rng_below(rng *r, uint64_t n)
{
    return n ? rng_next(r) % n : 0;
}

static double rng_unit(rng *r)
{
    return (double)(rng_next(r) >> 11) * 0x1p-53;
}

/* ---- steps --------------------------------------------------------------------------------- */

typedef enum coll {
    C_ALL_REDUCE,
    C_ALL_REDUCE_COALESCED,
    C_REDUCE,
    C_BROADCAST,
    C_ALL_GATHER,
    C_ALL_GATHER_INTO_TENSOR,
    C_GATHER,
    C_SCATTER,
    C_REDUCE_SCATTER,
    C_REDUCE_SCATTER_TENSOR,
    C_ALL_TO_ALL,
    C_ALL_TO_ALL_SINGLE,
    C_BARRIER,
    C_SEND_RECV,
    C_BATCH_ISEND_IRECV,
    C_COUNT
} coll;

static const struct {
    const char *name;     /* td_pg_supports's name */
    int weight;           /* how often it is drawn, relative */
    bool reduces;         /* takes a reduce op */
    bool p2p;             /* needs two members */
} colls[C_COUNT] = {
    [C_ALL_REDUCE] = {"all_reduce", 6, true, false},
    [C_ALL_REDUCE_COALESCED] = {"all_reduce_coalesced", 2, true, false},
    [C_REDUCE] = {"reduce", 3, true, false},
    [C_BROADCAST] = {"broadcast", 3, false, false},
    [C_ALL_GATHER] = {"all_gather", 2, false, false},
    [C_ALL_GATHER_INTO_TENSOR] = {"all_gather_into_tensor", 2, false, false},
    [C_GATHER] = {"gather", 2, false, false},
    [C_SCATTER] = {"scatter", 2, false, false},
    [C_REDUCE_SCATTER] = {"reduce_scatter", 2, true, false},
    [C_REDUCE_SCATTER_TENSOR] = {"reduce_scatter_tensor", 2, true, false},
    [C_ALL_TO_ALL] = {"all_to_all", 2, false, false},
    [C_ALL_TO_ALL_SINGLE] = {"all_to_all_single", 2, false, false},
    [C_BARRIER] = {"barrier", 1, false, false},
    [C_SEND_RECV] = {"send", 2, false, true},
    [C_BATCH_ISEND_IRECV] = {"send", 2, false, true},
};

static const char *coll_label(coll c)
{
    return c == C_SEND_RECV ? "send_recv_ring" : c == C_BATCH_ISEND_IRECV ? "batch_isend_irecv_ring" : colls[c].name;
}

static const td_dtype dtypes[] = {TD_BOOL, TD_UINT8, TD_INT8, TD_INT32, TD_INT64,
                                  TD_FLOAT16, TD_BFLOAT16, TD_FLOAT32, TD_FLOAT64};
static const td_reduce_op reduce_ops[] = {TD_SUM, TD_PRODUCT, TD_MIN, TD_MAX, TD_BAND, TD_BOR, TD_BXOR, TD_AVG};

/* One step as every rank draws it. Member indices (0..gsize-1) are group ranks. */
typedef struct step_plan {
    int64_t step;
    uint64_t key;       /* the step's part of every input value */
    coll coll;
    td_dtype dtype;
    td_reduce_op op;    /* TD_SUM where the collective takes none */
    int group;          /* 0: the world */
    int gsize;
    const int *members; /* global ranks, gsize of them */
    int root;           /* group rank */
    bool async;
    bool strided;       /* all_reduce, reduce, broadcast: a view with stride 2 */
    int64_t count;      /* elements of the rank's tensor (a chunk for the gather/scatter family) */
    int ncoalesced;
    int64_t coalesced[MAX_COALESCED];
    int64_t split[MAX_WORLD][MAX_WORLD]; /* all_to_all: elements member i sends member j */
} step_plan;

/* ---- one rank's state ---------------------------------------------------------------------- */

typedef struct pending_op {
    step_plan plan;
    td_tensor *t[MAX_TENSORS];
    td_future *works[2];
    int nworks;
    size_t bytes;
} pending_op;

typedef struct soak_rank {
    const soak_options *o;
    td_pg *world;
    int rank, world_size;
    uint64_t seed;
    int ngroups;
    td_pg *groups[MAX_GROUPS];  /* [0]: the world (borrowed) */
    int group_size[MAX_GROUPS];
    int group_members[MAX_GROUPS][MAX_WORLD];
    int my_index[MAX_GROUPS];   /* this rank's group rank, -1 when not a member */
    pending_op *pending;        /* o->inflight slots */
    int npending;
    size_t pending_bytes;
    int64_t steps, ops;
    double bytes;
    long rss_warm_kib, rss_peak_kib, rss_end_kib;
    bool threaded;
    char result[16];
} soak_rank;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages_total = 0, pages_resident = 0;
    if (!f)
        return -1;
    if (fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2)
        pages_resident = -1;
    fclose(f);
    return pages_resident < 0 ? -1 : pages_resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void print_summary(soak_rank *s, double seconds)
{
    long growth = s->rss_end_kib - s->rss_warm_kib;
    printf("SOAK rank=%d backend=%s world=%d seed=%" PRIu64 " steps=%" PRId64 " ops=%" PRId64
           " bytes=%.0f seconds=%.1f steps_per_s=%.1f rss_warm_kib=%ld rss_peak_kib=%ld rss_end_kib=%ld"
           " growth_kib=%ld result=%s\n",
           s->rank, s->o->backend, s->world_size, s->seed, s->steps, s->ops, s->bytes, seconds,
           seconds > 0 ? (double)s->steps / seconds : 0.0, s->rss_warm_kib, s->rss_peak_kib, s->rss_end_kib, growth,
           s->result);
    fflush(stdout);
}

static void describe(const step_plan *p, char *buf, size_t len)
{
    int n = snprintf(buf, len, "step %" PRId64 " %s dtype=%s op=%s count=%" PRId64 " group=%d{", p->step,
                     coll_label(p->coll), td_dtype_name(p->dtype), td_reduce_op_name(p->op), p->count, p->group);
    for (int i = 0; i < p->gsize && n > 0 && (size_t)n < len; i++)
        n += snprintf(buf + n, len - (size_t)n, "%s%d", i ? "," : "", p->members[i]);
    if (n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, "} root=%d %s%s", p->root, p->async ? "async" : "blocking",
                 p->strided ? " strided" : "");
}

/* A failed step: the line that reproduces it, the summary, and the end of this rank (of every rank
 * thread with the threaded backend, which td_threaded_abort_all wakes). */
static int fail_step(soak_rank *s, const step_plan *p, const char *result, const char *fmt, ...)
{
    char what[512], msg[512];
    describe(p, what, sizeof what);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("SOAK FAIL rank=%d backend=%s seed=%" PRIu64 " %s: %s\n", s->rank, s->o->backend, s->seed, what, msg);
    snprintf(s->result, sizeof s->result, "%s", result);
    s->rss_end_kib = rss_kib();
    print_summary(s, 0);
    if (s->threaded) {
        td_threaded_abort_all("tdist-soak: another rank thread failed");
        return 1;
    }
    fflush(stderr);
    _exit(1); /* the others are stopped by the launcher; their groups would only wait for us */
}

/* ---- values -------------------------------------------------------------------------------- */

/* The input of global rank src in tensor `slot` at element i: a small integer whose range depends
 * on the reduce op, so that the exact result is representable in every dtype. */
static int64_t value_of(const step_plan *p, int src, int slot, int64_t i)
{
    uint64_t h = mix64(p->key ^ ((uint64_t)(src + 1) << 56) ^ ((uint64_t)(slot + 1) << 44) ^ (uint64_t)i);
    bool is_bool = p->dtype == TD_BOOL, is_unsigned = p->dtype == TD_UINT8;
    if (is_bool)
        return p->op == TD_PRODUCT ? (h % 8) != 0 : (int64_t)(h & 1);
    switch (p->op) {
    case TD_SUM:
        return is_unsigned ? (int64_t)(h % 9) : (int64_t)(h % 17) - 8;
    case TD_PRODUCT:
        return is_unsigned ? 1 + (int64_t)(h % 2) : (int64_t[]){1, -1, 2}[h % 3];
    case TD_BAND:
    case TD_BOR:
    case TD_BXOR:
        return is_unsigned ? (int64_t)(h & 0xff) : (int64_t)(int8_t)(h & 0xff);
    case TD_AVG: {
        /* gsize * base plus offsets that sum to 0 over the group: the sum divides by gsize, so the
         * mean (the sum of the bases) is exact whether a backend divides or multiplies by 1/gsize */
        int index = 0;
        while (index < p->gsize && p->members[index] != src)
            index++;
        return p->gsize * ((int64_t)(h % 17) - 8) + (2 * index - (p->gsize - 1));
    }
    default: /* MIN, MAX, and the data of the collectives that do not reduce */
        return is_unsigned ? (int64_t)(h & 0xff) : (int64_t)(h % 201) - 100;
    }
}

/* The reduction over the group's members of their inputs in `slot` at element i. */
static int64_t reduced_of(const step_plan *p, int slot, int64_t i)
{
    bool is_bool = p->dtype == TD_BOOL;
    int64_t acc = value_of(p, p->members[0], slot, i);
    for (int m = 1; m < p->gsize; m++) {
        int64_t v = value_of(p, p->members[m], slot, i);
        switch (p->op) {
        case TD_SUM:
        case TD_AVG:
            acc = is_bool ? (acc | v) : acc + v;
            break;
        case TD_PRODUCT:
            acc = is_bool ? (acc & v) : acc * v;
            break;
        case TD_MIN:
            acc = v < acc ? v : acc;
            break;
        case TD_MAX:
            acc = v > acc ? v : acc;
            break;
        case TD_BAND:
            acc &= v;
            break;
        case TD_BOR:
            acc |= v;
            break;
        case TD_BXOR:
            acc ^= v;
            break;
        default:
            break;
        }
    }
    return p->op == TD_AVG ? acc / p->gsize : acc;
}

static void store_elem(void *base, td_dtype dtype, int64_t i, int64_t v)
{
    switch (dtype) {
    case TD_BOOL:
        ((uint8_t *)base)[i] = v != 0;
        break;
    case TD_UINT8:
        ((uint8_t *)base)[i] = (uint8_t)v;
        break;
    case TD_INT8:
        ((int8_t *)base)[i] = (int8_t)v;
        break;
    case TD_INT32:
        ((int32_t *)base)[i] = (int32_t)v;
        break;
    case TD_INT64:
        ((int64_t *)base)[i] = v;
        break;
    case TD_FLOAT16:
        ((uint16_t *)base)[i] = td_float_to_half((float)v);
        break;
    case TD_BFLOAT16:
        ((uint16_t *)base)[i] = td_float_to_bfloat16((float)v);
        break;
    case TD_FLOAT32:
        ((float *)base)[i] = (float)v;
        break;
    case TD_FLOAT64:
        ((double *)base)[i] = (double)v;
        break;
    default:
        break;
    }
}

static double load_elem(const void *base, td_dtype dtype, int64_t i)
{
    switch (dtype) {
    case TD_BOOL:
    case TD_UINT8:
        return ((const uint8_t *)base)[i];
    case TD_INT8:
        return ((const int8_t *)base)[i];
    case TD_INT32:
        return ((const int32_t *)base)[i];
    case TD_INT64:
        return (double)((const int64_t *)base)[i];
    case TD_FLOAT16:
        return td_half_to_float(((const uint16_t *)base)[i]);
    case TD_BFLOAT16:
        return td_bfloat16_to_float(((const uint16_t *)base)[i]);
    case TD_FLOAT32:
        return ((const float *)base)[i];
    case TD_FLOAT64:
        return ((const double *)base)[i];
    default:
        return NAN;
    }
}

/* Where the values of a range of elements come from: one rank's input, or the group's reduction. */
typedef struct source {
    bool reduced;
    int src;  /* global rank, when not reduced */
    int slot;
} source;

static int64_t expected_of(const step_plan *p, source from, int64_t i)
{
    return from.reduced ? reduced_of(p, from.slot, i) : value_of(p, from.src, from.slot, i);
}

/* Writes n elements of t from element `first` on (t 1-D, any stride) with rank src's slot. */
static void fill(const step_plan *p, td_tensor *t, int64_t first, int64_t n, int src, int slot)
{
    if (n <= 0)
        return;
    char *data = td_tensor_data(t);
    int64_t stride = td_tensor_stride(t, 0);
    for (int64_t i = 0; i < n; i++)
        store_elem(data, p->dtype, (first + i) * stride, value_of(p, src, slot, i));
}

/* Compares n elements of t from element `first` with their expected values; names the first wrong
 * one. */
static int check(soak_rank *s, const step_plan *p, const char *what, const td_tensor *t, int64_t first, int64_t n,
                 source from)
{
    if (n <= 0)
        return 0;
    const char *data = td_tensor_data(t);
    int64_t stride = td_tensor_stride(t, 0);
    for (int64_t i = 0; i < n; i++) {
        int64_t want = expected_of(p, from, i);
        double got = load_elem(data, p->dtype, (first + i) * stride);
        if (got != (double)want) {
            int64_t bad = 0;
            for (int64_t k = i; k < n; k++)
                bad += load_elem(data, p->dtype, (first + k) * stride) != (double)expected_of(p, from, k);
            return fail_step(s, p, "wrong",
                             "%s: element %" PRId64 " is %g, expected %" PRId64 " (%s%d, slot %d); %" PRId64
                             " of the %" PRId64 " elements from there on are wrong",
                             what, first + i, got, want, from.reduced ? "reduction" : "from rank ",
                             from.reduced ? p->gsize : from.src, from.slot, bad, n - i);
        }
    }
    return 0;
}

/* ---- drawing a step ------------------------------------------------------------------------ */

static int64_t draw_count(rng *r, int64_t max_elems)
{
    if (rng_below(r, 50) == 0)
        return 0;
    /* log-uniform with the exponent's density falling as u^3: half the steps under ~10 elements,
     * a few percent in the MiB range */
    double top = log2((double)max_elems);
    double u = rng_unit(r);
    double e = top * u * u * u;
    int64_t lo = (int64_t)exp2(floor(e));
    int64_t n = lo + (int64_t)rng_below(r, (uint64_t)lo);
    return n > max_elems ? max_elems : n;
}

static bool supported(soak_rank *s, coll c, td_dtype dtype, td_reduce_op op)
{
    if (colls[c].reduces && td_reduce_check(op, dtype) != TD_OK)
        return false;
    if (td_pg_supports(s->world, colls[c].name, dtype, op) != TD_OK)
        return false;
    return !colls[c].p2p || td_pg_supports(s->world, "recv", dtype, op) == TD_OK;
}

static void draw_step(soak_rank *s, rng *r, int64_t step, step_plan *p)
{
    memset(p, 0, sizeof *p);
    p->step = step;
    p->key = mix64(s->seed ^ mix64((uint64_t)step));
    int total = 0;
    for (int c = 0; c < C_COUNT; c++)
        total += colls[c].weight;
    for (;;) {
        int pick = (int)rng_below(r, (uint64_t)total);
        int c = 0;
        while (pick >= colls[c].weight)
            pick -= colls[c++].weight;
        p->coll = (coll)c;
        p->group = s->ngroups == 1 || rng_below(r, 2) == 0 ? 0 : 1 + (int)rng_below(r, (uint64_t)(s->ngroups - 1));
        p->gsize = s->group_size[p->group];
        if (colls[c].p2p && p->gsize < 2)
            continue;
        p->dtype = dtypes[rng_below(r, sizeof dtypes / sizeof *dtypes)];
        p->op = colls[c].reduces ? reduce_ops[rng_below(r, sizeof reduce_ops / sizeof *reduce_ops)] : TD_SUM;
        if (supported(s, p->coll, p->dtype, p->op))
            break;
    }
    p->members = s->group_members[p->group];
    p->root = (int)rng_below(r, (uint64_t)p->gsize);
    p->async = rng_below(r, 2) == 0;
    p->strided = (p->coll == C_ALL_REDUCE || p->coll == C_REDUCE || p->coll == C_BROADCAST) && rng_below(r, 8) == 0;
    int64_t count = draw_count(r, s->o->max_elems);
    switch (p->coll) {
    case C_ALL_GATHER:
    case C_ALL_GATHER_INTO_TENSOR:
    case C_GATHER:
    case C_SCATTER:
    case C_REDUCE_SCATTER:
    case C_REDUCE_SCATTER_TENSOR:
        p->count = count / p->gsize; /* the whole stays within --max-elems */
        break;
    case C_ALL_TO_ALL:
    case C_ALL_TO_ALL_SINGLE: {
        int64_t chunk = count / p->gsize;
        bool even = rng_below(r, 2) == 0; /* all_to_all_single then passes NULL splits */
        for (int i = 0; i < p->gsize; i++)
            for (int j = 0; j < p->gsize; j++)
                p->split[i][j] = even ? chunk : (int64_t)rng_below(r, (uint64_t)chunk + 1);
        p->count = even ? chunk : -1;
        break;
    }
    case C_ALL_REDUCE_COALESCED:
        /* the tensors are flattened into one buffer: their total stays within --max-elems too */
        p->ncoalesced = 1 + (int)rng_below(r, MAX_COALESCED);
        for (int i = 0; i < p->ncoalesced; i++)
            p->coalesced[i] = draw_count(r, s->o->max_elems / p->ncoalesced);
        p->count = p->coalesced[0];
        break;
    case C_BARRIER:
        p->count = 0;
        break;
    default:
        p->count = count;
    }
}

/* The prelude's step k: collective k % C_COUNT on group k / C_COUNT, float64 (else the widest
 * dtype the backend takes), SUM, the largest size, blocking. */
static bool prelude_step(soak_rank *s, int64_t k, step_plan *p)
{
    memset(p, 0, sizeof *p);
    p->coll = (coll)(k % C_COUNT);
    p->group = (int)(k / C_COUNT);
    p->gsize = s->group_size[p->group];
    p->members = s->group_members[p->group];
    p->step = -1 - k;
    p->key = mix64(s->seed ^ mix64((uint64_t)p->step));
    p->op = TD_SUM;
    if (p->coll == C_BARRIER || (colls[p->coll].p2p && p->gsize < 2))
        return false;
    static const td_dtype widest[] = {TD_FLOAT64, TD_INT64, TD_FLOAT32, TD_INT32};
    size_t d = 0;
    while (d < sizeof widest / sizeof *widest && !supported(s, p->coll, widest[d], TD_SUM))
        d++;
    if (d == sizeof widest / sizeof *widest)
        return false;
    p->dtype = widest[d];
    p->root = p->gsize - 1;
    int64_t count = s->o->max_elems;
    p->count = count;
    switch (p->coll) {
    case C_ALL_GATHER:
    case C_ALL_GATHER_INTO_TENSOR:
    case C_GATHER:
    case C_SCATTER:
    case C_REDUCE_SCATTER:
    case C_REDUCE_SCATTER_TENSOR:
        p->count = count / p->gsize;
        break;
    case C_ALL_TO_ALL:
    case C_ALL_TO_ALL_SINGLE:
        p->count = count / p->gsize;
        for (int i = 0; i < p->gsize; i++)
            for (int j = 0; j < p->gsize; j++)
                p->split[i][j] = p->count;
        break;
    case C_ALL_REDUCE_COALESCED:
        p->ncoalesced = 1;
        p->coalesced[0] = count;
        break;
    default:
        break;
    }
    return true;
}

/* ---- issuing and checking ------------------------------------------------------------------ */

static int api_failed(soak_rank *s, const step_plan *p, const char *call)
{
    return fail_step(s, p, "error", "%s: %s", call, td_last_error());
}

static int new_tensor(soak_rank *s, pending_op *op, int index, int64_t n)
{
    td_tensor *t;
    if (td_tensor_empty(op->plan.dtype, TD_SHAPE(n), &t) != TD_OK)
        return api_failed(s, &op->plan, "td_tensor_empty");
    /* poison, so that an element nobody wrote cannot pass for a right one (0xA5 bytes are no
     * integer in a floating dtype, and no bool) */
    if (n)
        memset(td_tensor_data(t), 0xA5, td_tensor_nbytes(t));
    op->t[index] = t;
    op->bytes += td_tensor_nbytes(t);
    return 0;
}

/* A 1-D view with stride 2 over column 0 of an [n, 2] tensor kept in t[index + 1], whose column 1
 * holds the rank's slot-9 values (checked untouched afterwards). */
static int new_strided(soak_rank *s, pending_op *op, int index, int64_t n)
{
    step_plan *p = &op->plan;
    td_tensor *base, *view, *other;
    if (td_tensor_empty(p->dtype, TD_SHAPE(n, 2), &base) != TD_OK)
        return api_failed(s, p, "td_tensor_empty");
    if (td_tensor_select(base, 1, 0, &view) != TD_OK || td_tensor_select(base, 1, 1, &other) != TD_OK)
        return api_failed(s, p, "td_tensor_select");
    memset(td_tensor_data(base), 0xA5, td_tensor_nbytes(base));
    fill(p, other, 0, n, s->rank, 9);
    td_tensor_release(other);
    op->t[index] = view;
    op->t[index + 1] = base;
    op->bytes += td_tensor_nbytes(view);
    return 0;
}

static int check_strided_rest(soak_rank *s, const step_plan *p, const pending_op *op, int index, int64_t n)
{
    if (!p->strided || n == 0)
        return 0;
    td_tensor *other;
    if (td_tensor_select(op->t[index + 1], 1, 1, &other) != TD_OK)
        return api_failed(s, p, "td_tensor_select");
    int rc = check(s, p, "the untouched column of the strided tensor", other, 0, n, (source){false, s->rank, 9});
    td_tensor_release(other);
    return rc;
}

static int64_t total_of(const int64_t *counts, int n)
{
    int64_t sum = 0;
    for (int i = 0; i < n; i++)
        sum += counts[i];
    return sum;
}

/* Creates the step's tensors, fills the inputs and issues it (blocking or not). */
static int issue(soak_rank *s, pending_op *op)
{
    step_plan *p = &op->plan;
    int me = s->my_index[p->group], g = p->gsize;
    td_pg *pg = s->groups[p->group];
    td_future **work = p->async ? &op->works[0] : NULL;
    op->nworks = p->async ? 1 : 0;
    td_status st = TD_OK;
    const char *call = coll_label(p->coll);
    int64_t n = p->count;
    switch (p->coll) {
    case C_ALL_REDUCE:
    case C_REDUCE:
    case C_BROADCAST:
        if ((p->strided ? new_strided(s, op, 0, n) : new_tensor(s, op, 0, n)))
            return 1;
        fill(p, op->t[0], 0, n, s->rank, p->coll == C_BROADCAST && me != p->root ? 7 : 0);
        if (p->coll == C_ALL_REDUCE)
            st = td_pg_all_reduce(pg, op->t[0], td_op_of(p->op), work);
        else if (p->coll == C_REDUCE)
            st = td_pg_reduce(pg, op->t[0], p->root, td_op_of(p->op), work);
        else
            st = td_pg_broadcast(pg, op->t[0], p->root, work);
        break;
    case C_ALL_REDUCE_COALESCED:
        for (int i = 0; i < p->ncoalesced; i++) {
            if (new_tensor(s, op, i, p->coalesced[i]))
                return 1;
            fill(p, op->t[i], 0, p->coalesced[i], s->rank, i);
        }
        st = td_pg_all_reduce_coalesced(pg, op->t, p->ncoalesced, td_op_of(p->op), work);
        break;
    case C_ALL_GATHER:
    case C_GATHER:
        if (new_tensor(s, op, 0, n))
            return 1;
        fill(p, op->t[0], 0, n, s->rank, 0);
        if (p->coll == C_ALL_GATHER || me == p->root)
            for (int r = 0; r < g; r++)
                if (new_tensor(s, op, 1 + r, n))
                    return 1;
        if (p->coll == C_ALL_GATHER)
            st = td_pg_all_gather(pg, op->t + 1, op->t[0], work);
        else
            st = td_pg_gather(pg, me == p->root ? op->t + 1 : NULL, op->t[0], p->root, work);
        break;
    case C_ALL_GATHER_INTO_TENSOR:
        if (new_tensor(s, op, 0, n) || new_tensor(s, op, 1, n * g))
            return 1;
        fill(p, op->t[0], 0, n, s->rank, 0);
        st = td_pg_all_gather_into_tensor(pg, op->t[1], op->t[0], work);
        break;
    case C_SCATTER:
        if (new_tensor(s, op, 0, n))
            return 1;
        if (me == p->root)
            for (int r = 0; r < g; r++) {
                if (new_tensor(s, op, 1 + r, n))
                    return 1;
                fill(p, op->t[1 + r], 0, n, s->rank, r);
            }
        st = td_pg_scatter(pg, op->t[0], me == p->root ? op->t + 1 : NULL, p->root, work);
        break;
    case C_REDUCE_SCATTER:
        if (new_tensor(s, op, 0, n))
            return 1;
        for (int r = 0; r < g; r++) {
            if (new_tensor(s, op, 1 + r, n))
                return 1;
            fill(p, op->t[1 + r], 0, n, s->rank, r);
        }
        st = td_pg_reduce_scatter(pg, op->t[0], op->t + 1, td_op_of(p->op), work);
        break;
    case C_REDUCE_SCATTER_TENSOR:
        if (new_tensor(s, op, 0, n) || new_tensor(s, op, 1, n * g))
            return 1;
        for (int r = 0; r < g; r++)
            fill(p, op->t[1], r * n, n, s->rank, r);
        st = td_pg_reduce_scatter_tensor(pg, op->t[0], op->t[1], td_op_of(p->op), work);
        break;
    case C_ALL_TO_ALL:
        for (int r = 0; r < g; r++) {
            if (new_tensor(s, op, r, p->split[me][r]) || new_tensor(s, op, g + r, p->split[r][me]))
                return 1;
            fill(p, op->t[r], 0, p->split[me][r], s->rank, r);
        }
        st = td_pg_all_to_all(pg, op->t + g, op->t, work);
        break;
    case C_ALL_TO_ALL_SINGLE: {
        int64_t in_splits[MAX_WORLD], out_splits[MAX_WORLD];
        for (int r = 0; r < g; r++) {
            in_splits[r] = p->split[me][r];
            out_splits[r] = p->split[r][me];
        }
        if (new_tensor(s, op, 0, total_of(in_splits, g)) || new_tensor(s, op, 1, total_of(out_splits, g)))
            return 1;
        for (int r = 0, at = 0; r < g; at += (int)in_splits[r], r++)
            fill(p, op->t[0], at, in_splits[r], s->rank, r);
        bool even = p->count >= 0;
        st = td_pg_all_to_all_single(pg, op->t[1], op->t[0], even ? NULL : out_splits, even ? NULL : in_splits, work);
        break;
    }
    case C_BARRIER:
        st = td_pg_barrier(pg, work);
        break;
    case C_SEND_RECV:
    case C_BATCH_ISEND_IRECV: {
        int next = (me + 1) % g, prev = (me + g - 1) % g;
        int tag = (int)((p->step < 0 ? 30000 - p->step : p->step) % 32000); /* prelude steps are negative */
        if (new_tensor(s, op, 0, n) || new_tensor(s, op, 1, n))
            return 1;
        fill(p, op->t[0], 0, n, s->rank, 0);
        if (p->coll == C_BATCH_ISEND_IRECV) {
            td_p2p_op ops[2] = {{true, op->t[0], next, tag}, {false, op->t[1], prev, tag}};
            op->nworks = 2;
            st = td_pg_batch_isend_irecv(pg, ops, 2, op->works);
            if (st == TD_OK && !p->async) {
                st = td_future_wait_all(op->works, 2, 0);
                call = "batch_isend_irecv (wait)";
            }
        } else {
            /* the send is always posted first and asynchronously: two blocking sends around a
             * ring would wait for each other */
            op->nworks = p->async ? 2 : 1;
            st = td_pg_send(pg, op->t[0], next, tag, &op->works[0]);
            if (st == TD_OK)
                st = td_pg_recv(pg, op->t[1], prev, tag, NULL, p->async ? &op->works[1] : NULL);
            if (st == TD_OK && !p->async) {
                st = td_future_wait(op->works[0], 0);
                call = "send (wait)";
            }
        }
        break;
    }
    default:
        break;
    }
    if (st != TD_OK)
        return api_failed(s, p, call);
    return 0;
}

static int check_done(soak_rank *s, pending_op *op)
{
    const step_plan *p = &op->plan;
    int me = s->my_index[p->group], g = p->gsize;
    int64_t n = p->count;
    int src_root = p->members[p->root];
    int rc = 0;
    switch (p->coll) {
    case C_ALL_REDUCE:
        rc = check(s, p, "the all_reduced tensor", op->t[0], 0, n, (source){true, 0, 0});
        rc = rc ? rc : check_strided_rest(s, p, op, 0, n);
        break;
    case C_REDUCE:
        rc = check(s, p, me == p->root ? "the root's reduced tensor" : "a non-root's tensor (must keep its values)",
                   op->t[0], 0, n, me == p->root ? (source){true, 0, 0} : (source){false, s->rank, 0});
        rc = rc ? rc : check_strided_rest(s, p, op, 0, n);
        break;
    case C_BROADCAST:
        rc = check(s, p, "the broadcast tensor", op->t[0], 0, n, (source){false, src_root, 0});
        rc = rc ? rc : check_strided_rest(s, p, op, 0, n);
        break;
    case C_ALL_REDUCE_COALESCED:
        for (int i = 0; i < p->ncoalesced && !rc; i++)
            rc = check(s, p, "a coalesced tensor", op->t[i], 0, p->coalesced[i], (source){true, 0, i});
        break;
    case C_ALL_GATHER:
    case C_GATHER:
        if (p->coll == C_ALL_GATHER || me == p->root)
            for (int r = 0; r < g && !rc; r++)
                rc = check(s, p, "an output of the gather", op->t[1 + r], 0, n, (source){false, p->members[r], 0});
        rc = rc ? rc : check(s, p, "the gather's input (must be unchanged)", op->t[0], 0, n, (source){false, s->rank, 0});
        break;
    case C_ALL_GATHER_INTO_TENSOR:
        for (int r = 0; r < g && !rc; r++)
            rc = check(s, p, "a chunk of the gathered tensor", op->t[1], r * n, n, (source){false, p->members[r], 0});
        break;
    case C_SCATTER:
        rc = check(s, p, "the scattered chunk", op->t[0], 0, n, (source){false, src_root, me});
        break;
    case C_REDUCE_SCATTER:
    case C_REDUCE_SCATTER_TENSOR:
        rc = check(s, p, "the reduce_scattered chunk", op->t[0], 0, n, (source){true, 0, me});
        break;
    case C_ALL_TO_ALL:
        for (int r = 0; r < g && !rc; r++)
            rc = check(s, p, "an all_to_all output", op->t[g + r], 0, p->split[r][me], (source){false, p->members[r], me});
        break;
    case C_ALL_TO_ALL_SINGLE:
        for (int r = 0, at = 0; r < g && !rc; at += (int)p->split[r][me], r++)
            rc = check(s, p, "a slice of the all_to_all_single output", op->t[1], at, p->split[r][me],
                       (source){false, p->members[r], me});
        break;
    case C_SEND_RECV:
    case C_BATCH_ISEND_IRECV:
        rc = check(s, p, "the received tensor", op->t[1], 0, n, (source){false, p->members[(me + g - 1) % g], 0});
        break;
    default:
        break;
    }
    return rc;
}

static void release_op(soak_rank *s, pending_op *op)
{
    for (int i = 0; i < MAX_TENSORS; i++)
        td_tensor_release(op->t[i]);
    for (int i = 0; i < op->nworks; i++)
        td_future_release(op->works[i]);
    s->bytes += (double)op->bytes;
    memset(op, 0, sizeof *op);
}

/* Waits for every operation in flight, then checks each. */
static int drain(soak_rank *s)
{
    for (int i = 0; i < s->npending; i++) {
        pending_op *op = &s->pending[i];
        for (int w = 0; w < op->nworks; w++)
            if (td_future_wait(op->works[w], 0) != TD_OK)
                return fail_step(s, &op->plan, "error", "waiting for its work: %s",
                                 td_future_error(op->works[w]) ? td_future_error(op->works[w]) : td_last_error());
        if (check_done(s, op))
            return 1;
        release_op(s, op);
    }
    s->npending = 0;
    s->pending_bytes = 0;
    return 0;
}

/* ---- one rank ------------------------------------------------------------------------------ */

static int make_groups(soak_rank *s)
{
    /* The world plus subgroups of a 4-rank world (members past a smaller world are dropped, lists
     * left with no member or repeating another are skipped); {1} exercises a group of one. */
    static const int lists[][4] = {{0, 1, -1}, {2, 3, -1}, {0, 2, 3, -1}, {1, 3, -1}, {1, -1}, {1, 2, 3, -1}};
    s->groups[0] = s->world;
    s->group_size[0] = s->world_size;
    for (int r = 0; r < s->world_size; r++)
        s->group_members[0][r] = r;
    s->my_index[0] = s->rank;
    s->ngroups = 1;
    for (size_t l = 0; l < sizeof lists / sizeof *lists && s->ngroups < MAX_GROUPS; l++) {
        int ranks[4], n = 0;
        for (int k = 0; k < 4 && lists[l][k] >= 0; k++)
            if (lists[l][k] < s->world_size)
                ranks[n++] = lists[l][k];
        bool repeat = n == 0 || n == s->world_size;
        for (int gi = 1; gi < s->ngroups && !repeat; gi++)
            repeat = s->group_size[gi] == n && memcmp(s->group_members[gi], ranks, sizeof(int) * (size_t)n) == 0;
        if (repeat)
            continue;
        int gi = s->ngroups;
        if (td_pg_new_group(s->world, ranks, n, NULL, &s->groups[gi]) != TD_OK) {
            fprintf(stderr, "tdist-soak: [rank %d] new_group: %s\n", s->rank, td_last_error());
            return 1;
        }
        s->ngroups++;
        s->group_size[gi] = n;
        memcpy(s->group_members[gi], ranks, sizeof(int) * (size_t)n);
        s->my_index[gi] = -1;
        for (int k = 0; k < n; k++)
            if (ranks[k] == s->rank)
                s->my_index[gi] = k;
    }
    return 0;
}

/* Agrees on a seed (rank 0's) and on when to stop: an all_reduce MAX of each rank's "time is up". */
static int world_int64(soak_rank *s, int64_t *value, bool max)
{
    td_tensor *t;
    if (td_tensor_full(TD_INT64, TD_SHAPE(1), 0, &t) != TD_OK)
        return 1;
    *(int64_t *)td_tensor_data(t) = *value;
    td_status st = max ? td_pg_all_reduce(s->world, t, TD_OP_MAX, NULL) : td_pg_broadcast(s->world, t, 0, NULL);
    *value = *(int64_t *)td_tensor_data(t);
    td_tensor_release(t);
    if (st != TD_OK)
        fprintf(stderr, "tdist-soak: [rank %d] %s: %s\n", s->rank, max ? "stop check" : "seed broadcast", td_last_error());
    return st != TD_OK;
}

static int soak_rank_run(const soak_options *o, td_pg *world, bool threaded)
{
    soak_rank *s = calloc(1, sizeof *s);
    s->o = o;
    s->world = world;
    s->threaded = threaded;
    s->rank = td_pg_rank(world);
    s->world_size = td_pg_size(world);
    snprintf(s->result, sizeof s->result, "ok");
    if (s->world_size > MAX_WORLD) {
        fprintf(stderr, "tdist-soak: at most %d ranks\n", MAX_WORLD);
        free(s);
        return 2;
    }
    int64_t seed = (int64_t)o->seed;
    if (world_int64(s, &seed, false) || make_groups(s)) {
        free(s);
        return 1;
    }
    s->seed = (uint64_t)seed;
    if (s->rank == 0) {
        printf("soak: backend %s, %d ranks, seed %" PRIu64 ", %s %g, max %" PRId64 " elements, %d groups:", o->backend,
               s->world_size, s->seed, o->steps ? "steps" : "seconds", o->steps ? (double)o->steps : o->seconds,
               o->max_elems, s->ngroups);
        for (int gi = 0; gi < s->ngroups; gi++) {
            printf(" {");
            for (int k = 0; k < s->group_size[gi]; k++)
                printf("%s%d", k ? "," : "", s->group_members[gi][k]);
            printf("}");
        }
        printf("\n");
        fflush(stdout);
    }
    s->pending = calloc((size_t)o->inflight, sizeof *s->pending);
    /* The collectives keep per-group buffers grown to the largest message they have seen (their
     * scratch, so that nothing is allocated per operation after warm-up): one step of every kind at
     * the largest size on every group fills them before the run, so that the RSS growth measured
     * afterwards is what the run itself adds. */
    double prelude_start = now_s();
    for (int64_t k = 0; o->prelude && k < (int64_t)s->ngroups * C_COUNT; k++) {
        step_plan pre;
        if (!prelude_step(s, k, &pre) || s->my_index[pre.group] < 0)
            continue;
        pending_op *op = &s->pending[0];
        op->plan = pre;
        if (issue(s, op) || check_done(s, op)) {
            free(s->pending);
            free(s);
            return 1;
        }
        release_op(s, op);
    }
    s->bytes = 0;
    /* every rank starts its clock together, or steps/s would differ by the prelude's skew */
    if (td_pg_barrier(s->world, NULL) != TD_OK) {
        fprintf(stderr, "tdist-soak: [rank %d] barrier after the prelude: %s\n", s->rank, td_last_error());
        free(s->pending);
        free(s);
        return 1;
    }
    if (s->rank == 0 && o->prelude) {
        printf("soak: prelude (every collective at %" PRId64 " elements on every group) took %.1f s; rss %ld KiB\n",
               o->max_elems, now_s() - prelude_start, rss_kib());
        fflush(stdout);
    }
    rng r = {s->seed};
    double start = now_s(), last_progress = start;
    double warm_at = start + 0.1 * o->seconds;
    bool warm = false;
    int rc = 0;
    step_plan plan;
    for (int64_t step = 0;; step++) {
        if (step % o->check_every == 0) {
            /* sampled with nothing of ours in flight, so that it measures what tdist keeps */
            if (drain(s)) {
                rc = 1;
                break;
            }
            long rss = rss_kib();
            double t = now_s();
            if (!warm && (o->steps ? step >= o->steps / 10 : t >= warm_at)) {
                warm = true;
                s->rss_warm_kib = rss;
            }
            if (warm && rss > s->rss_peak_kib)
                s->rss_peak_kib = rss;
            int64_t stop = o->steps ? step >= o->steps : t - start >= o->seconds;
            if (!o->steps && world_int64(s, &stop, true)) {
                rc = 1;
                snprintf(s->result, sizeof s->result, "error");
                break;
            }
            if (stop)
                break;
            if (s->rank == 0 && o->progress_s > 0 && t - last_progress >= o->progress_s) {
                last_progress = t;
                struct mallinfo2 mi = mallinfo2();
                printf("soak: %.1f min, %" PRId64 " steps, %.2f GB, rss %ld KiB; malloc: %zu KiB in use, %zu KiB "
                       "mmapped, %zu KiB free in its heaps\n",
                       (t - start) / 60, step, s->bytes / 1e9, rss, mi.uordblks >> 10, mi.hblkhd >> 10, mi.fordblks >> 10);
                fflush(stdout);
            }
        } else if (o->steps && step >= o->steps) {
            break;
        }
        draw_step(s, &r, step, &plan);
        s->steps++;
        if (s->my_index[plan.group] < 0)
            continue;
        s->ops++;
        pending_op *op = &s->pending[s->npending];
        op->plan = plan;
        if (issue(s, op)) {
            rc = 1;
            break;
        }
        if (!plan.async) {
            if (check_done(s, op)) {
                rc = 1;
                break;
            }
            release_op(s, op);
            continue;
        }
        s->npending++;
        s->pending_bytes += op->bytes;
        /* a bound on memory in flight too, or a few large async steps would dominate the RSS */
        if ((s->npending == o->inflight || s->pending_bytes > ((size_t)96 << 20)) && drain(s)) {
            rc = 1;
            break;
        }
    }
    double seconds = now_s() - start;
    if (!rc && drain(s))
        rc = 1;
    if (!rc) {
        s->rss_end_kib = rss_kib();
        if (!warm)
            s->rss_warm_kib = s->rss_end_kib;
        if (s->rss_end_kib > s->rss_peak_kib)
            s->rss_peak_kib = s->rss_end_kib;
        if ((double)(s->rss_end_kib - s->rss_warm_kib) > o->max_growth_mib * 1024) {
            printf("SOAK FAIL rank=%d backend=%s seed=%" PRIu64 ": RSS grew by %ld KiB after the warm-up, more than "
                   "--max-growth-mib %g\n",
                   s->rank, o->backend, s->seed, s->rss_end_kib - s->rss_warm_kib, o->max_growth_mib);
            snprintf(s->result, sizeof s->result, "rss_growth");
            rc = 1;
        }
        print_summary(s, seconds);
    }
    if (rc && threaded)
        td_threaded_abort_all("tdist-soak: another rank thread failed");
    if (!rc)
        for (int gi = 1; gi < s->ngroups; gi++)
            td_pg_destroy(s->groups[gi]);
    free(s->pending);
    free(s);
    return rc;
}

/* ---- ranks as processes or as threads ------------------------------------------------------ */

static td_pg_options group_options(const soak_options *o)
{
    td_pg_options po = TD_PG_OPTIONS_INIT;
    po.backend = o->backend;
    po.timeout_ms = o->timeout_ms;
    return po;
}

typedef struct rank_thread {
    const soak_options *o;
    td_store *store;
    int rank;
    int rc;
    pthread_t thread;
} rank_thread;

static void *rank_thread_main(void *arg)
{
    rank_thread *t = arg;
    td_pg_options po = group_options(t->o);
    po.store = t->store;
    po.rank = t->rank;
    po.world_size = t->o->nproc;
    td_pg *world = NULL;
    if (td_pg_create(&po, &world) != TD_OK) {
        fprintf(stderr, "tdist-soak: [rank %d] creating the threaded group: %s\n", t->rank, td_last_error());
        td_threaded_abort_all("tdist-soak: another rank thread could not create its group");
        t->rc = 1;
        return NULL;
    }
    t->rc = soak_rank_run(t->o, world, true);
    td_pg_destroy(world);
    return NULL;
}

static int run_threads(const soak_options *o)
{
    td_store *store = NULL;
    if (td_hash_store_create(&store) != TD_OK) {
        fprintf(stderr, "tdist-soak: %s\n", td_last_error());
        return 1;
    }
    rank_thread threads[MAX_WORLD];
    int started = 0, rc = 0;
    for (; started < o->nproc; started++) {
        threads[started] = (rank_thread){.o = o, .store = store, .rank = started};
        if (pthread_create(&threads[started].thread, NULL, rank_thread_main, &threads[started]) != 0) {
            fprintf(stderr, "tdist-soak: could not start rank thread %d\n", started);
            td_threaded_abort_all("tdist-soak: could not start every rank thread");
            rc = 1;
            break;
        }
    }
    for (int i = 0; i < started; i++) {
        pthread_join(threads[i].thread, NULL);
        rc = threads[i].rc > rc ? threads[i].rc : rc;
    }
    td_store_release(store);
    return rc;
}

int main(int argc, char **argv)
{
    soak_options o = {
        .backend = "auto",
        .seconds = 60,
        .max_elems = 4 << 20,
        .inflight = 4,
        .check_every = 16,
        .max_growth_mib = 64,
        .nproc = 4,
        .timeout_ms = 120000,
        .progress_s = 60,
        .prelude = true,
    };
    parse(argc, argv, &o);
    /* Large buffers straight from mmap and back at free: glibc's adaptive threshold would keep the
     * largest freed tensors in the heap, and the RSS would then measure malloc's caching, not
     * tdist's memory. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    if (!o.seed_given) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        o.seed = mix64((uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid()) >> 1;
    }
    if (strcmp(o.backend, "threaded") == 0)
        return run_threads(&o);
    td_pg_options po = group_options(&o);
    if (strcmp(o.backend, "mpi") != 0)
        po.init_method = "env://";
    td_pg *world = NULL;
    if (td_pg_create(&po, &world) != TD_OK) {
        fprintf(stderr, "tdist-soak: creating the %s process group: %s\n", o.backend, td_last_error());
        return 1;
    }
    int rc = soak_rank_run(&o, world, false);
    td_pg_destroy(world);
    return rc;
}
