/* The process-wide side of the mpi backend (mpi_impl.h): MPI itself, and the progress thread that
 * completes the requests the groups post.
 *
 * MPI is initialized once, on first use: MPI_Init_thread asking for MPI_THREAD_MULTIPLE (or the
 * level TDIST_MPI_THREAD_LEVEL names), with MPI_ERRORS_RETURN on MPI_COMM_WORLD so that a failure
 * becomes a td_status instead of aborting the job, and MPI_Finalize registered with atexit, as
 * PyTorch's ProcessGroupMPI does. A program that initialized MPI itself keeps its MPI (and its
 * finalization). At MPI_THREAD_SERIALIZED or above, tdist calls MPI from the group's worker, the
 * progress thread and the threads that issue operations; below MPI_THREAD_MULTIPLE every MPI call
 * tdist makes goes through one recursive lock (mpi_enter), held only for the call.
 *
 * Below MPI_THREAD_SERIALIZED (an MPI the program initialized with MPI_Init, or
 * TDIST_MPI_THREAD_LEVEL=single or funneled) only the thread that initialized MPI may call it:
 * tdist then calls MPI on that thread alone ("funneled mode"). Every operation of an mpi group must
 * be issued there (mpi_check_thread fails the others); there is no progress thread: requests that
 * did not finish at once wait in a list that waiters drive with mpi_rt_progress (td_work_set_driver),
 * called on that thread by whoever waits on their futures. At MPI_THREAD_SINGLE Open MPI takes
 * none of its own locks, as for a plain MPI_Init program (it takes them at every level above).
 *
 * The progress thread owns every posted request that did not finish at once: it MPI_Testsome's
 * them, hands each finished one to mpi_op_complete, and cancels receives of aborted groups. While
 * requests are outstanding it polls, yielding the CPU between rounds; once nothing came or finished
 * for 20 ms and only sends and receives are out, it sleeps between rounds, up to
 * TDIST_MPI_POLL_MAX_US, so that ranks waiting for a slow peer on shared cores do not starve the
 * others (a collective is polled until it ends); with none it sleeps until a request comes. It runs
 * while any mpi group exists: the first group starts it, the last one's destroy stops and joins
 * it. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backends/mpi/mpi_impl.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"

/* ---- MPI itself --------------------------------------------------------------------------- */

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool g_ready;   /* MPI is initialized and adopted */
static bool g_we_initialized;  /* so we finalize it at exit */
static int g_provided;
bool mpi_funneled_mode;
pthread_t mpi_main_thread;
static pthread_mutex_t g_serial = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP; /* below MPI_THREAD_MULTIPLE */

static const char *level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown thread level";
    }
}

/* MPI below MPI_THREAD_MULTIPLE, not in funneled mode (where only the MPI thread calls MPI and
 * there is nothing to serialize): mpi_enter takes g_serial. */
bool mpi_serialized;

void mpi_serial_lock(void) { pthread_mutex_lock(&g_serial); }
void mpi_serial_unlock(void) { pthread_mutex_unlock(&g_serial); }

bool mpi_thread_multiple(void) { return g_provided >= MPI_THREAD_MULTIPLE; }

bool mpi_funneled(void) { return atomic_load_explicit(&g_ready, memory_order_acquire) && mpi_funneled_mode; }

td_status mpi_check_thread(const char *what)
{
    if (mpi_on_mpi_thread())
        return TD_OK;
    return error_fmt(TD_ERR_INVALID,
                    "mpi backend: MPI provides %s, so tdist calls MPI only on the thread that initialized it, "
                    "and %s came from another thread: issue every operation of mpi groups on that thread, or "
                    "initialize MPI with MPI_THREAD_SERIALIZED or higher (TDIST_MPI_THREAD_LEVEL)",
                    level_name(g_provided), what);
}

char *mpi_error_text(int code, const char *what, td_status *status)
{
    char text[MPI_MAX_ERROR_STRING + 1];
    int len = 0, cls = MPI_ERR_UNKNOWN, initialized = 0, finalized = 0;
    /* Open MPI aborts the job when MPI_Error_string is called outside MPI's lifetime. */
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    mpi_enter();
    if (!initialized || finalized || MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        len = snprintf(text, sizeof text, "MPI error %d", code);
    if (initialized && !finalized)
        MPI_Error_class(code, &cls);
    else
        cls = code;
    mpi_leave();
    text[len < 0 ? 0 : len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = '\0';
    switch (cls) {
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_COMM:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_TRUNCATE: *status = TD_ERR_INVALID; break;
    case MPI_ERR_NO_MEM: *status = TD_ERR_NOMEM; break;
    case MPI_ERR_UNSUPPORTED_OPERATION: *status = TD_ERR_UNSUPPORTED; break;
    default: *status = TD_ERR_IO; break;
    }
    return alloc_printf("%s failed: %s (MPI error class %d)", what, text, cls);
}

td_status mpi_error(int code, const char *what)
{
    td_status st;
    char *msg = mpi_error_text(code, what, &st);
    error_set(st, msg);
    free(msg);
    return st;
}

static void rt_atexit(void);

static td_status requested_level(int *level)
{
    static const char *const names[] = {"single", "funneled", "serialized", "multiple", NULL};
    int idx = 3;
    TD_TRY(env_get_enum("TDIST_MPI_THREAD_LEVEL", names, 3, &idx));
    static const int levels[] = {MPI_THREAD_SINGLE, MPI_THREAD_FUNNELED, MPI_THREAD_SERIALIZED, MPI_THREAD_MULTIPLE};
    *level = levels[idx];
    return TD_OK;
}

static td_status init_locked(void)
{
    int finalized = 0, initialized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return error_fmt(TD_ERR_CLOSED, "mpi backend: MPI has been finalized in this process; MPI cannot be "
                                       "initialized again");
    MPI_Initialized(&initialized);
    if (!initialized) {
        int want;
        TD_TRY(requested_level(&want));
        int rc = MPI_Init_thread(NULL, NULL, want, &g_provided);
        if (rc != MPI_SUCCESS)
            return mpi_error(rc, "mpi backend: MPI_Init_thread");
        g_we_initialized = true;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        atexit(rt_atexit);
    } else {
        MPI_Query_thread(&g_provided);
    }
    if (g_provided < MPI_THREAD_SERIALIZED) {
        int is_main = 0;
        MPI_Is_thread_main(&is_main);
        if (!is_main)
            return error_fmt(TD_ERR_UNSUPPORTED,
                            "mpi backend: MPI provides %s, so only the thread that initialized MPI may call it, "
                            "and this is another thread: make the first mpi group on that thread, or initialize "
                            "MPI with MPI_THREAD_SERIALIZED or higher",
                            level_name(g_provided));
        mpi_funneled_mode = true;
        mpi_main_thread = pthread_self();
    }
    mpi_serialized = g_provided < MPI_THREAD_MULTIPLE && !mpi_funneled_mode;
    atomic_store_explicit(&g_ready, true, memory_order_release);
    if (mpi_funneled_mode)
        TD_LOG_INFO("mpi backend: MPI provides %s; tdist calls MPI only on this thread, where every operation of "
                    "mpi groups must be issued", level_name(g_provided));
    else if (!mpi_thread_multiple())
        TD_LOG_INFO("mpi backend: MPI provides %s; tdist serializes its MPI calls", level_name(g_provided));
    return TD_OK;
}

td_status mpi_rt_init(void)
{
    pthread_mutex_lock(&g_init_mu);
    td_status st = atomic_load(&g_ready) ? TD_OK : init_locked();
    pthread_mutex_unlock(&g_init_mu);
    if (st != TD_OK)
        return st;
    return mpi_types_init();
}

/* ---- op records ----------------------------------------------------------------------------- */

static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static mpi_op *g_pool;

void mpi_op_reset(mpi_op *op)
{
    void *scratch[2] = {op->scratch[0], op->scratch[1]};
    size_t cap[2] = {op->scratch_cap[0], op->scratch_cap[1]}, ints_cap = op->ints_cap;
    int *ints = op->ints;
    memset(op, 0, sizeof *op);
    memcpy(op->scratch, scratch, sizeof scratch);
    memcpy(op->scratch_cap, cap, sizeof cap);
    op->ints = ints;
    op->ints_cap = ints_cap;
}

void mpi_op_free(mpi_op *op)
{
    if (!op)
        return;
    free(op->scratch[0]);
    free(op->scratch[1]);
    free(op->ints);
    free(op);
}

mpi_op *mpi_op_get(void)
{
    pthread_mutex_lock(&g_pool_mu);
    mpi_op *op = g_pool;
    if (op)
        g_pool = op->next;
    pthread_mutex_unlock(&g_pool_mu);
    if (!op)
        return TD_NEW(mpi_op);
    mpi_op_reset(op);
    return op;
}

void mpi_op_put(mpi_op *op)
{
    pthread_mutex_lock(&g_pool_mu);
    op->next = g_pool;
    g_pool = op;
    pthread_mutex_unlock(&g_pool_mu);
}

void *mpi_op_scratch(mpi_op *op, int i, size_t bytes)
{
    if (bytes == 0)
        bytes = 1; /* a valid pointer even for empty blocks */
    if (bytes > op->scratch_cap[i]) {
        void *p = NULL;
        if (alloc_try_aligned(64, bytes, "mpi backend scratch buffer", &p) != TD_OK)
            return NULL;
        free(op->scratch[i]);
        op->scratch[i] = p;
        op->scratch_cap[i] = bytes;
    }
    return op->scratch[i];
}

/* ---- the progress thread ---------------------------------------------------------------------- */

/* Poll without sleeping this long after the last request came or finished: nonblocking
 * collectives (Open MPI's libnbc) and large messages advance only inside MPI calls, so a sleeping
 * poller slows them down; a request that waits longer most likely waits for a slow peer. */
#define POLL_SPIN_NS (20 * 1000 * 1000)
#define POLL_DEFAULT_MAX_US 200

static pthread_mutex_t g_life_mu = PTHREAD_MUTEX_INITIALIZER; /* start / stop (held across the join) */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;      /* the fields below */
static pthread_cond_t g_cv;
static pthread_once_t g_cv_once = PTHREAD_ONCE_INIT;
static int g_holds;
static bool g_running, g_stop;
static pthread_t g_thread;
static mpi_op *g_incoming;

static void cv_init(void) { thread_cond_init(&g_cv); }

typedef struct active_set {
    size_t n, cap;
    MPI_Request *reqs;
    mpi_op **ops;
    int *idx;
    MPI_Status *sts;
    bool *cancelled; /* MPI_Cancel issued for the op at this index */
} active_set;

static void active_add(active_set *a, mpi_op *op)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->reqs = alloc_resize(a->reqs, a->cap * sizeof *a->reqs);
        a->ops = alloc_resize(a->ops, a->cap * sizeof *a->ops);
        a->idx = alloc_resize(a->idx, a->cap * sizeof *a->idx);
        a->sts = alloc_resize(a->sts, a->cap * sizeof *a->sts);
        a->cancelled = alloc_resize(a->cancelled, a->cap * sizeof *a->cancelled);
    }
    a->reqs[a->n] = op->req;
    a->ops[a->n] = op;
    a->cancelled[a->n] = false;
    a->n++;
}

/* Drops the entries whose op was handed on (NULL), keeping the order of the rest. */
static void active_compact(active_set *a)
{
    size_t k = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (!a->ops[i])
            continue;
        a->reqs[k] = a->reqs[i];
        a->ops[k] = a->ops[i];
        a->cancelled[k] = a->cancelled[i];
        k++;
    }
    a->n = k;
}

static void active_free(active_set *a)
{
    free(a->reqs);
    free(a->ops);
    free(a->idx);
    free(a->sts);
    free(a->cancelled);
}

/* Receives of aborted groups will never be matched by a peer that failed: cancel them. (Sends and
 * collectives cannot be cancelled portably; MPI finishes them or the job ends.) Only this thread
 * touches a request once it is tracked, so the cancel does not race a test. */
static void cancel_aborted(active_set *a)
{
    for (size_t i = 0; i < a->n; i++) {
        if (a->cancelled[i] || atomic_load(&a->ops[i]->state) != MPI_OP_ABORTED)
            continue;
        a->cancelled[i] = true;
        if (a->ops[i]->coll.kind == TD_COLL_RECV) {
            mpi_enter();
            MPI_Cancel(&a->reqs[i]);
            mpi_leave();
        }
    }
}

/* A nonblocking collective in flight: every rank has called it (or will soon), and it advances only
 * while someone calls MPI, so it is polled until it ends. */
static bool has_collective(const active_set *a)
{
    for (size_t i = 0; i < a->n; i++) {
        const mpi_op *op = a->ops[i];
        if (op->coll.kind != TD_COLL_SEND && op->coll.kind != TD_COLL_RECV &&
            atomic_load(&op->state) != MPI_OP_ABORTED)
            return true;
    }
    return false;
}

static int64_t poll_max_ns(void)
{
    int64_t us = POLL_DEFAULT_MAX_US;
    if (env_get_int("TDIST_MPI_POLL_MAX_US", POLL_DEFAULT_MAX_US, 0, 100000, &us) != TD_OK)
        us = POLL_DEFAULT_MAX_US;
    return us * 1000;
}

/* One MPI_Testsome over a's requests: completes the ops whose requests finished (and, when the
 * call itself fails, every op: their requests are abandoned) and drops them from a. Returns how
 * many it completed. */
static int test_round(active_set *a)
{
    cancel_aborted(a);
    int done = 0;
    mpi_enter();
    int rc = MPI_Testsome((int)a->n, a->reqs, &done, a->idx, a->sts);
    mpi_leave();
    if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        for (size_t i = 0; i < a->n; i++) {
            a->ops[i]->status.MPI_ERROR = rc;
            mpi_op_complete(a->ops[i]);
            a->ops[i] = NULL;
        }
        done = (int)a->n;
    } else {
        if (done == MPI_UNDEFINED)
            done = 0;
        for (int k = 0; k < done; k++) {
            mpi_op *op = a->ops[a->idx[k]];
            op->status = a->sts[k];
            if (rc == MPI_SUCCESS)
                op->status.MPI_ERROR = MPI_SUCCESS;
            a->ops[a->idx[k]] = NULL;
            mpi_op_complete(op);
        }
    }
    active_compact(a);
    return done;
}

/* Funneled mode: the requests in flight, touched only on the MPI thread. */
static active_set g_caller;
static bool g_caller_busy; /* a round is running (completion never re-enters it, but be sure) */

void mpi_rt_track(mpi_op *op)
{
    if (mpi_funneled()) { /* on the MPI thread: submit runs nowhere else */
        active_add(&g_caller, op);
        return;
    }
    pthread_mutex_lock(&g_mu);
    op->next = g_incoming;
    g_incoming = op;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

bool mpi_rt_progress(void)
{
    if (!mpi_funneled())
        return false;
    if (g_caller.n && !g_caller_busy && mpi_on_mpi_thread()) {
        g_caller_busy = true;
        test_round(&g_caller);
        g_caller_busy = false;
    }
    return true;
}

static void *progress_main(void *arg)
{
    (void)arg;
    active_set a = {0};
    int64_t max_sleep = poll_max_ns(), sleep_ns = 0, last_done = clock_now_ns();
    pthread_mutex_lock(&g_mu);
    for (;;) {
        while (g_incoming) {
            mpi_op *op = g_incoming;
            g_incoming = op->next;
            op->next = NULL;
            active_add(&a, op);
            last_done = clock_now_ns();
        }
        if (g_stop || a.n == 0) {
            if (g_stop)
                break;
            pthread_cond_wait(&g_cv, &g_mu);
            continue;
        }
        pthread_mutex_unlock(&g_mu);

        int done = test_round(&a);
        int64_t now = clock_now_ns();
        if (done > 0) {
            last_done = now;
            sleep_ns = 0;
        }
        pthread_mutex_lock(&g_mu);
        if (g_incoming || g_stop || a.n == 0)
            continue;
        if (now - last_done < POLL_SPIN_NS || max_sleep == 0 || has_collective(&a)) {
            pthread_mutex_unlock(&g_mu);
            sched_yield();
            pthread_mutex_lock(&g_mu);
            continue;
        }
        sleep_ns = sleep_ns ? sleep_ns * 2 : 2000;
        if (sleep_ns > max_sleep)
            sleep_ns = max_sleep;
        thread_cond_wait_until(&g_cv, &g_mu, now + sleep_ns);
    }
    /* Stopping with requests still out (only aborted ones can be: every group is gone): keep them
     * for the next thread. */
    for (size_t i = 0; i < a.n; i++) {
        a.ops[i]->req = a.reqs[i];
        a.ops[i]->next = g_incoming;
        g_incoming = a.ops[i];
    }
    pthread_mutex_unlock(&g_mu);
    active_free(&a);
    return NULL;
}

static void stop_thread_locked_life(void)
{
    if (!g_running)
        return;
    pthread_mutex_lock(&g_mu);
    g_stop = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    thread_join(g_thread);
    pthread_mutex_lock(&g_mu);
    g_stop = false;
    g_running = false;
    pthread_mutex_unlock(&g_mu);
}

td_status mpi_rt_acquire(void)
{
    TD_TRY(mpi_rt_init());
    pthread_once(&g_cv_once, cv_init);
    pthread_mutex_lock(&g_life_mu);
    td_status st = TD_OK;
    if (g_holds == 0 && !g_running && !mpi_funneled()) {
        st = thread_start(&g_thread, "td-mpi-progress", progress_main, NULL);
        g_running = st == TD_OK;
    }
    if (st == TD_OK)
        g_holds++;
    pthread_mutex_unlock(&g_life_mu);
    return st;
}

void mpi_rt_release(void)
{
    pthread_mutex_lock(&g_life_mu);
    if (--g_holds == 0)
        stop_thread_locked_life();
    pthread_mutex_unlock(&g_life_mu);
}

static void rt_atexit(void)
{
    /* Groups the program never destroyed: their progress thread must not run into MPI_Finalize. */
    pthread_mutex_lock(&g_life_mu);
    stop_thread_locked_life();
    pthread_mutex_unlock(&g_life_mu);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        mpi_enter();
        MPI_Finalize();
        mpi_leave();
    }
}
