/* The mpi backend's own behaviour, under the real mpirun (each case's parameter is "mpi", so CTest
 * runs it as `tdist-mpiexec -n N test_mpi --td-external <case>/mpi`; the collective suite of
 * tests/pg covers every collective): ranks from MPI and PyTorch's warning, capability queries, MPI
 * errors returned with MPI's words (not aborting the job), NaN through MIN/MAX, blocking calls
 * handed to MPI with no work record beside ones that take the usual path, the nonblocking
 * mode and a collective abandoned at the group's timeout, MPI serialized below
 * MPI_THREAD_MULTIPLE (collectives of several groups in program order), funneled mode below
 * MPI_THREAD_SERIALIZED (a plain MPI_Init program's MPI), an MPI the program initialized itself,
 * and env:// from mpirun's variables with the tcp backend (tdist issue 7). */
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mpi.h>

#include <tdist/pg.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "launch_util.h"

static const char *under_mpirun(const char *param)
{
    (void)param;
    if (!td_backend_available("mpi"))
        return "Test requires backend mpi to be available";
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") && !getenv("SLURM_NTASKS"))
        return "Test runs only under an MPI launcher: mpirun -np N test_mpi --td-external <case>/mpi";
    return NULL;
}

static td_pg *make_group(td_test_ctx *ctx, int64_t timeout_ms)
{
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "mpi";
    o.timeout_ms = timeout_ms ? timeout_ms : 60000;
    o.debug_level = "OFF";
    td_pg *pg = NULL;
    TD_CHECK_OK(td_pg_create(&o, &pg));
    TD_CHECK_EQ(td_pg_rank(pg), ctx->rank);
    TD_CHECK_EQ(td_pg_size(pg), ctx->world_size);
    return pg;
}

/* MPI's threads and files before the leak baseline: one group made and destroyed. */
static void mpi_setup(td_test_ctx *ctx)
{
    td_pg *pg = make_group(ctx, 0);
    TD_CHECK_OK(td_pg_barrier(pg, NULL));
    td_pg_destroy(pg);
}

#define MPI_TEST(name, ws, ...)                                                                             \
    TD_TEST(name, .world_size = (ws), .params = "mpi", .static_skip = under_mpirun, .timeout_s = 60,        \
            __VA_ARGS__)

static td_tensor *filled(td_dtype dt, int64_t n, double v)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(dt, TD_SHAPE(n), v, &t));
    return t;
}

static double at(const td_tensor *t, int64_t i)
{
    double v = 0;
    TD_CHECK_OK(td_tensor_get_f64(t, &i, &v));
    return v;
}

/* Runs fn with stderr going to a pipe, and returns what it wrote (malloc'd). */
static char *capture_stderr(void (*fn)(void *arg), void *arg)
{
    int p[2];
    TD_CHECK(pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
    fflush(stderr);
    int saved = fcntl(2, F_DUPFD_CLOEXEC, 3);
    TD_CHECK(saved >= 0);
    TD_CHECK(dup2(p[1], 2) == 2);
    fn(arg);
    fflush(stderr);
    TD_CHECK(dup2(saved, 2) == 2);
    close(saved);
    close(p[1]);
    char *out = calloc(1, 65536);
    ssize_t n = read(p[0], out, 65535);
    out[n > 0 ? n : 0] = '\0';
    close(p[0]);
    return out;
}

/* ---- ranks from MPI, queries ---------------------------------------------------------------- */

typedef struct create_arg {
    int rank, world_size;
    td_pg *pg;
} create_arg;

static void create_with(void *p)
{
    create_arg *a = p;
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "mpi";
    o.init_method = "env://"; /* ignored: MPI assigns the ranks, no rendezvous happens */
    o.rank = a->rank;
    o.world_size = a->world_size;
    o.timeout_ms = 60000;
    TD_CHECK_OK(td_pg_create(&o, &a->pg));
}

MPI_TEST(ranks_from_mpi, 2, .setup = mpi_setup)
{
    /* Other values than MPI's: ignored, with PyTorch's warning. */
    create_arg a = {5, 9, NULL};
    char *err = capture_stderr(create_with, &a);
    TD_CHECK_CONTAINS(err, "For MPI backend, world_size (9) and rank (5) are ignored since they are assigned by the "
                           "MPI runtime.");
    free(err);
    TD_CHECK_EQ(td_pg_rank(a.pg), ctx->rank);
    TD_CHECK_EQ(td_pg_size(a.pg), 2);
    TD_CHECK_STR_EQ(td_pg_backend(a.pg), "mpi");
    td_pg_destroy(a.pg);
    /* The same values as MPI's, or none: no warning. */
    create_arg b = {ctx->rank, 2, NULL};
    err = capture_stderr(create_with, &b);
    TD_CHECK_MSG(!strstr(err, "are ignored"), "unexpected warning: %s", err);
    free(err);
    td_pg *pg = b.pg;

    /* Every dtype and reduce op the kernels define is supported, float16/bfloat16 included. */
    TD_CHECK(td_backend_available("mpi"));
    TD_CHECK_OK(td_pg_supports(pg, "all_reduce", TD_FLOAT16, TD_PREMUL_SUM));
    TD_CHECK_OK(td_pg_supports(pg, "reduce_scatter", TD_BFLOAT16, TD_MAX));
    TD_CHECK_OK(td_pg_supports(pg, "all_reduce", TD_COMPLEX128, TD_AVG));
    TD_CHECK_OK(td_pg_supports(pg, "reduce", TD_BOOL, TD_BXOR));
    TD_CHECK_OK(td_pg_supports(pg, "all_to_all_single", TD_INT8, TD_SUM));
    TD_CHECK_OK(td_pg_supports(pg, "recv", TD_COMPLEX64, TD_SUM));
    TD_CHECK_ERR(td_pg_supports(pg, "all_reduce", TD_FLOAT32, TD_BAND), TD_ERR_UNSUPPORTED, "BAND");

    /* monitored_barrier needs a store the ranks share; an mpi group has none of its own. */
    TD_CHECK_ERR(td_pg_monitored_barrier(pg, 1000, false), TD_ERR_UNSUPPORTED,
                 "monitored_barrier runs over the group's store, and this mpi group has no store its ranks share");
    td_pg_destroy(pg);
}

/* ---- MPI errors come back as td_status, with MPI's words ------------------------------------ */

MPI_TEST(mpi_errors_return, 2, .setup = mpi_setup)
{
    int me = ctx->rank;
    /* A receive smaller than the message: MPI_ERR_TRUNCATE, returned (MPI_ERRORS_RETURN), not fatal
     * to the job; the group that saw it fails, a new one works. */
    td_pg *pg = make_group(ctx, 0);
    td_tensor *eight = filled(TD_FLOAT32, 8, 1), *four = filled(TD_FLOAT32, 4, 0);
    if (me == 0) {
        TD_CHECK_OK(td_pg_send(pg, eight, 1, 1, NULL));
    } else {
        TD_CHECK_ERR(td_pg_recv(pg, four, 0, 1, NULL, NULL), TD_ERR_INVALID, "mpi backend: recv #1 failed: ");
        TD_CHECK_CONTAINS(td_last_error(), "truncated");
        TD_CHECK_ERR(td_pg_barrier(pg, NULL), TD_ERR_INVALID, "truncated"); /* the group stays failed */
    }
    td_pg_destroy(pg);

    /* A receive larger than the message: the size check names both. */
    pg = make_group(ctx, 0);
    if (me == 0)
        TD_CHECK_OK(td_pg_send(pg, four, 1, 2, NULL));
    else
        TD_CHECK_ERR(td_pg_recv(pg, eight, 0, 2, NULL, NULL), TD_ERR_INVALID,
                     "mpi backend: rank 0 sent 4 float32 elements (tag 2), but the receive expects 8");
    td_pg_destroy(pg);

    pg = make_group(ctx, 0);
    TD_CHECK_OK(td_pg_all_reduce(pg, eight, TD_OP_SUM, NULL));
    TD_CHECK_NEAR(at(eight, 7), 2, 0);
    td_pg_destroy(pg);
    td_tensor_release(eight);
    td_tensor_release(four);
}

/* ---- NaN through MIN and MAX, as tdist's kernels (MPI's own ops need not propagate it) -------- */

MPI_TEST(nan_min_max, 2, .setup = mpi_setup)
{
    td_pg *pg = make_group(ctx, 0);
    const td_dtype dts[] = {TD_FLOAT32, TD_FLOAT64, TD_FLOAT16, TD_BFLOAT16};
    const td_op ops[] = {TD_OP_MIN, TD_OP_MAX};
    for (size_t d = 0; d < 4; d++) {
        for (size_t k = 0; k < 2; k++) {
            td_tensor *t = filled(dts[d], 3, 1 + ctx->rank);
            int64_t nan_at = ctx->rank; /* rank 0's NaN at 0, rank 1's at 1; 2 has none */
            TD_CHECK_OK(td_tensor_set_f64(t, &nan_at, NAN));
            TD_CHECK_OK(td_pg_all_reduce(pg, t, ops[k], NULL));
            TD_CHECK_MSG(isnan(at(t, 0)) && isnan(at(t, 1)), "%s %s: NaN lost (%g, %g)", td_dtype_name(dts[d]),
                         td_reduce_op_name(ops[k].kind), at(t, 0), at(t, 1));
            TD_CHECK_NEAR(at(t, 2), ops[k].kind == TD_MIN ? 1 : 2, 0);
            td_tensor_release(t);
        }
    }
    td_pg_destroy(pg);
}

/* ---- blocking collectives handed to MPI on the caller's thread, with no work record ----------- */

typedef struct seq_log {
    pthread_mutex_t mu;
    int n;
    char name[32];
    uint64_t seq;
    bool is_async;
} seq_log;

static void on_seq(const td_pg_trace_event *e, void *arg)
{
    seq_log *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n++ == 0) {
        snprintf(l->name, sizeof l->name, "%s", e->name);
        l->seq = e->seq;
        l->is_async = e->is_async;
    }
    pthread_mutex_unlock(&l->mu);
}

/* A blocking all_reduce or broadcast of a contiguous tensor on an idle group is handed to MPI on
 * the caller's thread (TD_BACKEND_CAP_CALLER_THREAD); asynchronous calls, with a work handle, mix
 * with them on one group in program order, and the group's numbering counts both. */
MPI_TEST(blocking_calls_without_work_records, 2, .setup = mpi_setup)
{
    int me = ctx->rank;
    td_pg *pg = make_group(ctx, 0);
    td_tensor *t = filled(TD_FLOAT32, 1000, me + 1);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_AVG, NULL)); /* 1.5 */
    TD_CHECK_NEAR(at(t, 999), 1.5, 0);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_PREMUL_SUM(2.0), NULL)); /* 6 */
    TD_CHECK_NEAR(at(t, 0), 6, 0);
    td_tensor *r = filled(TD_FLOAT64, 7, me * 10);
    TD_CHECK_OK(td_pg_broadcast(pg, r, 1, NULL));
    TD_CHECK_NEAR(at(r, 6), 10, 0);

    /* An asynchronous all_reduce queued ahead of a blocking broadcast of the same tensor: the
     * broadcast waits its turn. In the other order every rank would end with rank 0's 0. */
    td_tensor *a = filled(TD_INT64, 5000, me);
    td_future *f = NULL;
    TD_CHECK_OK(td_pg_all_reduce(pg, a, TD_OP_SUM, &f));
    TD_CHECK_OK(td_pg_broadcast(pg, a, 0, NULL));
    TD_CHECK_OK(td_future_wait(f, 60000));
    td_future_release(f);
    TD_CHECK_NEAR(at(a, 4999), 1, 0);

    /* A non-contiguous tensor takes the work path (a contiguous temporary, copied back). */
    td_tensor *m = NULL, *mt = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(4, 6), me + 1, &m));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &mt));
    TD_CHECK(!td_tensor_is_contiguous(mt));
    TD_CHECK_OK(td_pg_all_reduce(pg, mt, TD_OP_MAX, NULL));
    int64_t last[2] = {3, 5};
    double v = 0;
    TD_CHECK_OK(td_tensor_get_f64(m, last, &v));
    TD_CHECK_NEAR(v, 2, 0);

    /* Six collectives so far: a trace set now reports the next blocking all_reduce (a traced call
     * takes the work path) as the group's seventh. */
    seq_log log = {.mu = PTHREAD_MUTEX_INITIALIZER};
    td_pg_set_trace_callback(pg, on_seq, &log);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    for (int i = 0; i < 5000; i++) { /* the event arrives on the callback thread */
        pthread_mutex_lock(&log.mu);
        int n = log.n;
        pthread_mutex_unlock(&log.mu);
        if (n)
            break;
        struct timespec d = {0, 2000000};
        nanosleep(&d, NULL);
    }
    td_pg_set_trace_callback(pg, NULL, NULL);
    pthread_mutex_lock(&log.mu);
    TD_CHECK_EQ(log.n, 1);
    TD_CHECK_STR_EQ(log.name, "mpi:all_reduce");
    TD_CHECK_EQ(log.seq, 7);
    TD_CHECK(!log.is_async);
    pthread_mutex_unlock(&log.mu);
    TD_CHECK_NEAR(at(t, 0), 12, 0);

    /* Untraced again: straight to MPI. */
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_MIN, NULL));
    TD_CHECK_NEAR(at(t, 0), 12, 0);
    td_pg_destroy(pg);
    td_tensor_release(t);
    td_tensor_release(r);
    td_tensor_release(a);
    td_tensor_release(mt);
    td_tensor_release(m);
}

/* ---- the nonblocking mode, and a collective abandoned at the group's timeout ------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* See below. volatile: an optimizer drops a store nothing reads, and LeakSanitizer would then
 * report the buffer as leaked. */
static td_tensor *volatile g_abandoned;

MPI_TEST(nonblocking_collectives, 3, .setup = mpi_setup)
{
    int ws = ctx->world_size, me = ctx->rank;
    setenv("TDIST_MPI_COLLECTIVES", "nonblocking", 1);
    td_pg *pg = make_group(ctx, 0), *side = make_group(ctx, 0);
    td_pg *slow = make_group(ctx, 1500);
    unsetenv("TDIST_MPI_COLLECTIVES");

    /* Collectives in flight together, with p2p between them, all complete with the right values. */
    enum { N = 6 };
    td_tensor *ts[N];
    td_future *fs[N + 2];
    for (int k = 0; k < N; k++) {
        ts[k] = filled(TD_FLOAT64, 1000 + 4000 * k, me + k);
        TD_CHECK_OK(td_pg_all_reduce(pg, ts[k], k % 2 ? TD_OP_AVG : TD_OP_SUM, &fs[k]));
    }
    td_tensor *out = filled(TD_INT32, 5, 0), *in = filled(TD_INT32, 5, me);
    TD_CHECK_OK(td_pg_send(pg, in, (me + 1) % ws, 4, &fs[N]));
    TD_CHECK_OK(td_pg_recv(pg, out, (me + ws - 1) % ws, 4, NULL, &fs[N + 1]));
    TD_CHECK_OK(td_future_wait_all(fs, N + 2, 60000));
    for (int k = 0; k < N; k++) {
        double sum = 0;
        for (int r = 0; r < ws; r++)
            sum += r + k;
        TD_CHECK_NEAR(at(ts[k], 999), k % 2 ? sum / ws : sum, 1e-9);
        td_future_release(fs[k]);
        td_tensor_release(ts[k]);
    }
    TD_CHECK_NEAR(at(out, 4), (me + ws - 1) % ws, 0);
    td_future_release(fs[N]);
    td_future_release(fs[N + 1]);

    /* Rank 0 runs a collective the others join only later: it fails at the group's timeout with
     * the watchdog's words, instead of waiting; the others then join and MPI completes it. */
    td_tensor *late = filled(TD_FLOAT32, 64, 1);
    if (me == 0) {
        int64_t t0 = now_ms();
        TD_CHECK_ERR(td_pg_all_reduce(slow, late, TD_OP_SUM, NULL), TD_ERR_TIMEOUT,
                     "[Rank 0] Watchdog caught collective operation timeout: WorkMPI(SeqNum=1, OpType=ALLREDUCE");
        int64_t took = now_ms() - t0;
        TD_CHECK_MSG(took >= 1400 && took < 20000, "timed out after %lld ms", (long long)took);
        TD_CHECK_OK(td_pg_barrier(side, NULL));
    } else {
        TD_CHECK_OK(td_pg_barrier(side, NULL));
        TD_CHECK_OK(td_pg_all_reduce(slow, late, TD_OP_SUM, NULL));
        TD_CHECK_NEAR(at(late, 63), ws, 0);
    }
    TD_CHECK_OK(td_pg_barrier(side, NULL));
    td_pg_destroy(slow);
    /* MPI cannot take back the abandoned request: on rank 0 it may still write into its buffer
     * until MPI finishes it (docs/collectives.md), so that buffer lives as long as the process. */
    if (me == 0)
        g_abandoned = late;
    else
        td_tensor_release(late);
    td_tensor_release(in);
    td_tensor_release(out);
    td_pg_destroy(side);
    td_pg_destroy(pg);
}

/* ---- MPI below MPI_THREAD_MULTIPLE ---------------------------------------------------------- */

static void serialized_setup(td_test_ctx *ctx)
{
    setenv("TDIST_MPI_THREAD_LEVEL", "serialized", 1); /* read once, when tdist initializes MPI */
    mpi_setup(ctx);
}

MPI_TEST(serialized_thread_level, 3, .setup = serialized_setup)
{
    int provided = -1;
    MPI_Query_thread(&provided);
    TD_CHECK_EQ(provided, MPI_THREAD_SERIALIZED);
    int ws = ctx->world_size, me = ctx->rank;
    td_pg *pg = make_group(ctx, 0);
    /* Everything still works with one MPI call at a time: p2p in flight with collectives. */
    td_tensor *a = filled(TD_FLOAT32, 100000, me), *got = filled(TD_FLOAT32, 100000, -1);
    td_future *f[3];
    TD_CHECK_OK(td_pg_recv(pg, got, TD_ANY_SOURCE, 7, NULL, &f[0]));
    TD_CHECK_OK(td_pg_send(pg, a, (me + 1) % ws, 7, &f[1]));
    td_tensor *b = filled(TD_BFLOAT16, 33, 1);
    TD_CHECK_OK(td_pg_all_reduce(pg, b, TD_OP_SUM, &f[2]));
    TD_CHECK_OK(td_future_wait_all(f, 3, 60000));
    TD_CHECK_EQ(td_value_get_int(td_future_value(f[0])), (me + ws - 1) % ws);
    TD_CHECK_NEAR(at(got, 99999), (me + ws - 1) % ws, 0);
    TD_CHECK_NEAR(at(b, 32), ws, 0);
    for (int i = 0; i < 3; i++)
        td_future_release(f[i]);
    int sub_ranks[] = {0, 2};
    td_pg *sub = NULL;
    TD_CHECK_OK(td_pg_new_group(pg, sub_ranks, 2, NULL, &sub));
    if (me != 1) {
        TD_CHECK_OK(td_pg_all_reduce(sub, b, TD_OP_MAX, NULL));
        TD_CHECK_NEAR(at(b, 0), ws, 0);
    }
    td_pg_destroy(sub);
    td_pg_destroy(pg);
    td_tensor_release(a);
    td_tensor_release(got);
    td_tensor_release(b);
}

/* Below MPI_THREAD_MULTIPLE a blocking MPI call holds the process's MPI lock until the peers
 * arrive, so the collectives of different groups must start in the same order on every rank: an
 * asynchronous all_reduce on one group, then a blocking one on another, with the ranks skewed in
 * time, would hang if a group's worker ran the first while the caller ran the second. */
MPI_TEST(serialized_groups_keep_program_order, 3, .setup = serialized_setup)
{
    int me = ctx->rank;
    td_pg *pg = make_group(ctx, 0);
    int all[] = {0, 1, 2};
    td_pg *other = NULL;
    TD_CHECK_OK(td_pg_new_group(pg, all, 3, NULL, &other));
    td_tensor *big = filled(TD_FLOAT32, 1 << 16, 0), *small = filled(TD_INT64, 4, 0);
    for (int i = 0; i < 40; i++) {
        TD_CHECK_OK(td_tensor_fill(big, me + i));
        TD_CHECK_OK(td_tensor_fill(small, me));
        td_future *f = NULL;
        TD_CHECK_OK(td_pg_all_reduce(pg, big, TD_OP_SUM, &f));
        if ((i + me) % 3 == 0) {
            struct timespec d = {0, 200000}; /* one rank late to the second group */
            nanosleep(&d, NULL);
        }
        TD_CHECK_OK(td_pg_all_reduce(other, small, TD_OP_SUM, NULL));
        TD_CHECK_OK(td_future_wait(f, 30000));
        td_future_release(f);
        TD_CHECK_NEAR(at(small, 3), 3, 0);
        TD_CHECK_NEAR(at(big, (1 << 16) - 1), 3 + 3 * i, 0);
    }
    td_tensor_release(big);
    td_tensor_release(small);
    td_pg_destroy(other);
    td_pg_destroy(pg);
}

/* ---- an MPI the program initialized ------------------------------------------------------- */

static void finalize_at_exit(void) { MPI_Finalize(); }

static void program_init_multiple(td_test_ctx *ctx)
{
    int provided = -1;
    TD_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) == MPI_SUCCESS);
    atexit(finalize_at_exit); /* the program's MPI: the program finalizes it */
    mpi_setup(ctx);
}

MPI_TEST(program_initialized_mpi, 2, .setup = program_init_multiple)
{
    td_pg *pg = make_group(ctx, 0);
    td_tensor *t = filled(TD_INT64, 10, ctx->rank + 1);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_PRODUCT, NULL));
    TD_CHECK_NEAR(at(t, 9), 2, 0);
    td_tensor_release(t);
    /* The program's own MPI calls keep working beside tdist's, on its own communicator. */
    int x = ctx->rank + 1, sum = 0;
    TD_CHECK(MPI_Allreduce(&x, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) == MPI_SUCCESS);
    TD_CHECK_EQ(sum, 3);
    td_pg_destroy(pg);
    /* tdist left the program's MPI as it was: initialized, and MPI_COMM_WORLD's error handler. */
    int initialized = 0, finalized = 1;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    TD_CHECK(initialized && !finalized);
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(MPI_COMM_WORLD, &eh);
    TD_CHECK(eh == MPI_ERRORS_ARE_FATAL);
    MPI_Errhandler_free(&eh);
}

/* ---- MPI below MPI_THREAD_SERIALIZED: funneled mode ----------------------------------------- */

/* Everything on the thread that initialized MPI: collectives blocking and asynchronous, sends
 * posted before the matching receives on both sides (their futures complete only while a waiter
 * drives MPI: there is no progress thread), a large message, an any-source receive, a batch, a
 * subgroup; then an operation from another thread fails with the rule instead of calling MPI. */
typedef struct off_thread {
    td_pg *pg;
    td_status st;
    char msg[512];
} off_thread;

static void *all_reduce_off_thread(void *arg)
{
    off_thread *o = arg;
    td_tensor *t = filled(TD_FLOAT32, 4, 1);
    o->st = td_pg_all_reduce(o->pg, t, TD_OP_SUM, NULL);
    snprintf(o->msg, sizeof o->msg, "%s", td_last_error());
    td_tensor_release(t);
    return NULL;
}

static void funneled_body(td_test_ctx *ctx, int want_level)
{
    int provided = -1;
    MPI_Query_thread(&provided);
    if (provided >= MPI_THREAD_SERIALIZED)
        TD_SKIP(TD_SKIP_GENERIC, "this MPI gives MPI_THREAD_SERIALIZED or more when asked for less");
    TD_CHECK_EQ(provided, want_level);
    int ws = ctx->world_size, me = ctx->rank, next = (me + 1) % ws, prev = (me + ws - 1) % ws;
    td_pg *pg = make_group(ctx, 0);
    td_tensor *t = filled(TD_FLOAT32, 1000, me + 1);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    TD_CHECK_NEAR(at(t, 999), ws * (ws + 1) / 2, 0);
    td_future *f[4];
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_MAX, &f[0]));
    TD_CHECK_OK(td_future_wait(f[0], 60000));
    td_future_release(f[0]);
    TD_CHECK_NEAR(at(t, 0), ws * (ws + 1) / 2, 0);

    /* 4 MiB each way: MPI's rendezvous protocol, which moves only while both sides call MPI. */
    int64_t n = 1 << 20;
    td_tensor *out = filled(TD_FLOAT32, n, me), *in = filled(TD_FLOAT32, n, -1), *small = filled(TD_INT64, 3, me);
    td_tensor *any = filled(TD_INT64, 3, -1);
    TD_CHECK_OK(td_pg_send(pg, out, next, 3, &f[0]));
    TD_CHECK_OK(td_pg_send(pg, small, next, 4, &f[1]));
    TD_CHECK_OK(td_pg_recv(pg, in, prev, 3, NULL, &f[2]));
    TD_CHECK_OK(td_future_wait_all(f, 3, 60000));
    TD_CHECK_NEAR(at(in, n - 1), prev, 0);
    int sender = -1;
    TD_CHECK_OK(td_pg_recv(pg, any, TD_ANY_SOURCE, 4, &sender, NULL));
    TD_CHECK_EQ(sender, prev);
    TD_CHECK_NEAR(at(any, 2), prev, 0);
    for (int i = 0; i < 3; i++)
        td_future_release(f[i]);

    td_p2p_op ops[2] = {{.is_send = true, .tensor = small, .peer = prev, .tag = 5},
                        {.is_send = false, .tensor = any, .peer = next, .tag = 5}};
    TD_CHECK_OK(td_pg_batch_isend_irecv(pg, ops, 2, f));
    TD_CHECK_OK(td_future_wait_all(f, 2, 60000));
    TD_CHECK_NEAR(at(any, 0), next, 0);
    td_future_release(f[0]);
    td_future_release(f[1]);

    int sub_ranks[] = {0, ws - 1};
    td_pg *sub = NULL;
    TD_CHECK_OK(td_pg_new_group(pg, sub_ranks, 2, NULL, &sub));
    if (me == 0 || me == ws - 1) {
        TD_CHECK_OK(td_tensor_fill(small, me));
        TD_CHECK_OK(td_pg_broadcast(sub, small, 1, NULL));
        TD_CHECK_NEAR(at(small, 1), ws - 1, 0);
    }
    td_pg_destroy(sub);

    /* Off the MPI thread: the operation fails without reaching MPI, and so does its group (its
     * ranks' sequences of collectives no longer agree); other groups go on. */
    td_pg *side = NULL;
    int all[8];
    for (int i = 0; i < ws; i++)
        all[i] = i;
    TD_CHECK_OK(td_pg_new_group(pg, all, ws, NULL, &side));
    off_thread o = {.pg = side};
    pthread_t th;
    TD_CHECK(pthread_create(&th, NULL, all_reduce_off_thread, &o) == 0);
    TD_CHECK(pthread_join(th, NULL) == 0);
    TD_CHECK_EQ(o.st, TD_ERR_INVALID);
    TD_CHECK(strstr(o.msg, "tdist calls MPI only on the thread that initialized it, and the all_reduce came from "
                           "another thread") != NULL);
    TD_CHECK_ERR(td_pg_barrier(side, NULL), TD_ERR_INVALID, "came from another thread");
    td_pg_destroy(side);
    TD_CHECK_OK(td_pg_barrier(pg, NULL));
    /* A late peer: the others drive for longer than the waiters' spin (20 ms), then sleep between
     * rounds, in a blocking call and on a future. */
    struct timespec late = {0, 60 * 1000 * 1000};
    for (int round = 0; round < 2; round++) {
        if (me == 0)
            nanosleep(&late, NULL);
        TD_CHECK_OK(td_tensor_fill(small, 1));
        if (round == 0) {
            TD_CHECK_OK(td_pg_all_reduce(pg, small, TD_OP_SUM, NULL));
        } else {
            TD_CHECK_OK(td_pg_all_reduce(pg, small, TD_OP_SUM, &f[0]));
            TD_CHECK_OK(td_future_wait(f[0], 60000));
            td_future_release(f[0]);
        }
        TD_CHECK_NEAR(at(small, 2), ws, 0);
    }
    td_tensor_release(t);
    td_tensor_release(out);
    td_tensor_release(in);
    td_tensor_release(small);
    td_tensor_release(any);
    td_pg_destroy(pg);
}

static void program_init_single(td_test_ctx *ctx)
{
    TD_CHECK(MPI_Init(NULL, NULL) == MPI_SUCCESS); /* a plain MPI program: MPI_THREAD_SINGLE */
    atexit(finalize_at_exit);
    mpi_setup(ctx);
}

MPI_TEST(program_initialized_single_thread, 3, .setup = program_init_single)
{
    funneled_body(ctx, MPI_THREAD_SINGLE);
}

static void funneled_nonblocking_setup(td_test_ctx *ctx)
{
    /* Read once, when tdist initializes MPI / creates a group. Nonblocking collectives too wait in
     * the list that waiters drive. */
    setenv("TDIST_MPI_THREAD_LEVEL", "funneled", 1);
    setenv("TDIST_MPI_COLLECTIVES", "nonblocking", 1);
    setenv("TDIST_MPI_SPIN_US", "0", 1);
    mpi_setup(ctx);
}

MPI_TEST(funneled_thread_level_nonblocking, 2, .setup = funneled_nonblocking_setup)
{
    funneled_body(ctx, MPI_THREAD_FUNNELED);
}

/* ---- env:// from mpirun's variables, with the tcp backend (tdist issue 7) -------------------- */

MPI_TEST(env_rendezvous_under_mpirun, 3)
{
    TD_CHECK(getenv("RANK") == NULL && getenv("WORLD_SIZE") == NULL); /* mpirun sets only its own */
    int port = launch_test_port(ctx, "master_port");
    char s[16];
    snprintf(s, sizeof s, "%d", port);
    setenv("MASTER_PORT", s, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "tcp";
    o.timeout_ms = 60000; /* init_method NULL: env:// */
    TD_CHECK_OK(td_init_process_group(&o));
    TD_CHECK_EQ(td_get_rank(), atoi(getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK") : "-1"));
    TD_CHECK_EQ(td_get_world_size(), 3);
    td_tensor *t = filled(TD_FLOAT32, 7, 1);
    TD_CHECK_OK(td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL));
    TD_CHECK_NEAR(at(t, 6), 3, 0);
    td_tensor_release(t);
    TD_CHECK_OK(td_pg_barrier(NULL, NULL));
    launch_test_port_done(ctx, "master_port");
    td_destroy_process_group();
}

TD_TEST_MAIN()
