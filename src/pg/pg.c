/* Process groups (tdist/pg.h): creation, subgroups, destruction, queries, and the worker that runs
 * each group's operations in issue order on its backend (tdist/backend.h).
 *
 * A call (collectives.c) checks its arguments on the caller's thread, builds a td_work and queues
 * it with pg_issue. The group's worker thread takes works in order, runs the DETAIL check when
 * asked (debug.c) and submits each to the backend, which completes it with td_work_done from any
 * thread. Completion copies results back into non-contiguous user tensors, fails the group when
 * the backend failed (a failed group fails every later call with the same error), and completes
 * the future. A call on an idle group may be handed over on the caller's thread instead, as the
 * backend's capabilities allow (tdist/backend.h): the same path, pg_submit, without the worker.
 * While idle the worker watches the deadlines of operations in flight: an operation
 * that outlives the group's timeout fails the group with c10d's watchdog message, and aborting the
 * backend fails everything else in flight, so nothing waits forever.
 *
 * Stores follow c10d: a rendezvous store gets the group's timeout and the prefix "default_pg"; each
 * group then works under "<group name>/" of that root store. */
#include <ctype.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/errfile.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"
#include "net/io.h"
#include "pg/executor.h"
#include "pg/future.h"
#include "pg/pg_impl.h"

/* ---- waiting --------------------------------------------------------------------------------- */

/* Handing an operation to the worker and its completion back costs two thread wake-ups; for short
 * operations both sides first spin briefly (DESIGN.md: spin, then sleep), with net/io.h's adaptive
 * policy: spins that do not pay off are skipped for exponentially more waits, so a loaded machine
 * soon stops spinning. TDIST_PG_SPIN_US sets the budget (0: never spin). */
#define PG_DEFAULT_SPIN_US 20
/* The worker's scheduler slice in microseconds (thread_request_slice; TDIST_WORKER_SLICE_US, 0:
 * the kernel's default). */
#define PG_DEFAULT_WORKER_SLICE_US 100

static int64_t spin_budget_ns(void)
{
    static _Atomic int64_t budget = -1;
    int64_t b = atomic_load(&budget);
    if (b < 0) {
        int64_t us = PG_DEFAULT_SPIN_US;
        if (env_get_int("TDIST_PG_SPIN_US", PG_DEFAULT_SPIN_US, 0, 1000000, &us) != TD_OK)
            us = PG_DEFAULT_SPIN_US;
        b = us * 1000;
        atomic_store(&budget, b);
    }
    return b;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spins until ready(arg) or the spin's budget passes; true when ready. */
static bool spin_until(td_net_spin *spin, bool (*ready)(const void *arg), const void *arg)
{
    if (ready(arg))
        return true;
    if (!net_spin_now(spin))
        return false;
    int64_t until = clock_now_ns() + spin->budget_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if (ready(arg)) {
                net_spin_result(spin, true);
                return true;
            }
            cpu_relax();
        }
        if (clock_now_ns() >= until) {
            net_spin_result(spin, false);
            return false;
        }
    }
}

static bool future_ready(const void *f) { return td_future_is_completed(f); }

static bool work_queued(const void *pg)
{
    return atomic_load_explicit(&((const td_pg *)pg)->gate, memory_order_acquire) & PG_GATE_QUEUED;
}

/* The calling thread's policy for waiting on the operations it issues. */
static td_net_spin *waiter_spin(void)
{
    static __thread td_net_spin spin;
    static __thread bool ready;
    if (!ready) {
        net_spin_init(&spin, spin_budget_ns());
        ready = true;
    }
    return &spin;
}

/* ---- works --------------------------------------------------------------------------------- */

/* Works are recycled through a small pool per group, so that the hot path allocates nothing
 * after warm-up: a recycled work keeps its block arrays (sized for the group) and its copy list. */
#define WORK_POOL_MAX 64

/* Drops the references w holds (tensors, result, future). The rest stays readable: a work still
 * on the in-flight list may be looked at by the worker's watchdog until it is unlinked. */
static void work_release_refs(td_work *w)
{
    for (size_t i = 0; i < w->copies.len; i++)
        td_tensor_release(w->copies.items[i].src);
    w->copies.len = 0;
    if (w->result) {
        td_value_release(w->result);
        w->result = NULL;
    }
    if (w->future) {
        td_future_release(w->future);
        w->future = NULL;
    }
}

static void work_destroy(td_work *w)
{
    work_release_refs(w);
    TD_VEC_FREE(&w->copies);
    free(w->in_blocks);
    free(w->in_counts);
    free(w->out_blocks);
    free(w->out_counts);
    free(w);
}

/* With pg->mu held: w (its references dropped, off the in-flight list) goes back to the pool. */
static void work_recycle_locked(td_pg *pg, td_work *w)
{
    if (pg->nfree_works >= WORK_POOL_MAX) {
        work_destroy(w);
        return;
    }
    /* The spare slot first: the next pg_work_new takes it without the group's lock (one blocking
     * call after another reuses one work). */
    td_work *none = NULL;
    if (atomic_compare_exchange_strong(&pg->spare_work, &none, w))
        return;
    w->next = pg->free_works;
    pg->free_works = w;
    pg->nfree_works++;
}

/* Frees what a work on its caller's stack (pg_work_init_local) holds. */
static void local_work_end(td_work *w)
{
    work_release_refs(w);
    if (w->copies.items)
        TD_VEC_FREE(&w->copies);
}

/* The same as work_recycle_locked, without the lock when the spare slot is free; a work on its
 * caller's stack is only emptied. */
static inline void work_recycle(td_pg *pg, td_work *w)
{
    if (w->on_stack) {
        if (w->copies.items || w->result || w->future) /* a blocking in-place call holds none */
            local_work_end(w);
        return;
    }
    work_release_refs(w);
    td_work *none = NULL;
    if (atomic_compare_exchange_strong(&pg->spare_work, &none, w))
        return;
    pthread_mutex_lock(&pg->mu);
    work_recycle_locked(pg, w);
    pthread_mutex_unlock(&pg->mu);
}

/* Sets every per-operation field of w (the rest, fp and the kept storage, is left as it is). */
static void work_init(td_work *w, td_pg *pg, pg_op op, td_coll_kind kind, td_dtype dtype, bool on_stack)
{
    w->pg = pg;
    w->future = NULL; /* made when the work is issued, unless handed over on the caller's thread */
    /* Field by field: the compiler makes a compound literal a string store, slower than these. */
    td_coll *c = &w->coll;
    c->kind = kind;
    c->dtype = dtype;
    c->op = TD_OP_SUM;
    c->root = c->peer = -1;
    c->tag = 0;
    c->seq = 0;
    c->deadline_ns = TD_DEADLINE_NONE;
    c->count = 0;
    c->in = NULL;
    c->out = NULL;
    c->in_blocks = NULL;
    c->in_counts = NULL;
    c->out_blocks = NULL;
    c->out_counts = NULL;
    w->reduce_op = TD_OP_SUM;
    w->op = op;
    w->seq = 0;
    w->issue_ns = 0;
    w->numel_in = w->numel_out = 0;
    w->is_p2p = kind == TD_COLL_SEND || kind == TD_COLL_RECV;
    w->nonfatal = w->value_sender = w->is_async = w->has_fp = false;
    w->on_stack = on_stack;
    w->result = NULL;
    w->next = w->iprev = w->inext = NULL;
    w->sync = NULL;
    w->fp.ndim = -1;
}

td_work *pg_work_new(td_pg *pg, pg_op op, td_coll_kind kind, td_dtype dtype)
{
    td_work *w = atomic_exchange(&pg->spare_work, NULL);
    if (!w) {
        pthread_mutex_lock(&pg->mu);
        w = pg->free_works;
        if (w) {
            pg->free_works = w->next;
            pg->nfree_works--;
        }
        pthread_mutex_unlock(&pg->mu);
    }
    if (!w)
        w = TD_NEW(td_work);
    work_init(w, pg, op, kind, dtype, false);
    return w;
}

td_work *pg_work_init_local(td_work *w, td_pg *pg, pg_op op, td_coll_kind kind, td_dtype dtype)
{
    work_init(w, pg, op, kind, dtype, true);
    w->in_blocks = NULL;
    w->in_counts = NULL;
    w->out_blocks = NULL;
    w->out_counts = NULL;
    w->copies.items = NULL;
    w->copies.len = w->copies.cap = 0;
    return w;
}

/* A work on its caller's stack that cannot be handed over on the caller's thread moves to the
 * heap (the worker or a completion thread may outlive nothing of the caller's, by contract). */
static td_work *work_to_heap(td_work *local)
{
    td_work *w = pg_work_new(local->pg, local->op, local->coll.kind, local->coll.dtype);
    TD_VEC_FREE(&w->copies);
    const void **in_blocks = w->in_blocks;
    size_t *in_counts = w->in_counts;
    void **out_blocks = w->out_blocks;
    size_t *out_counts = w->out_counts;
    *w = *local;
    w->on_stack = false;
    w->in_blocks = in_blocks; /* a local work has no block arrays (in-place calls only) */
    w->in_counts = in_counts;
    w->out_blocks = out_blocks;
    w->out_counts = out_counts;
    local->copies.items = NULL; /* the copy list moved with it */
    local->copies.len = local->copies.cap = 0;
    local->result = NULL;
    return w;
}

void pg_work_blocks(td_work *w, bool in, bool out)
{
    size_t n = (size_t)w->pg->size;
    if (in) {
        if (!w->in_blocks) {
            w->in_blocks = alloc_zeroed(n, sizeof(void *));
            w->in_counts = alloc_zeroed(n, sizeof(size_t));
        } else {
            memset(w->in_blocks, 0, n * sizeof(void *));
            memset(w->in_counts, 0, n * sizeof(size_t));
        }
        w->coll.in_blocks = w->in_blocks;
        w->coll.in_counts = w->in_counts;
    }
    if (out) {
        if (!w->out_blocks) {
            w->out_blocks = alloc_zeroed(n, sizeof(void *));
            w->out_counts = alloc_zeroed(n, sizeof(size_t));
        } else {
            memset(w->out_blocks, 0, n * sizeof(void *));
            memset(w->out_counts, 0, n * sizeof(size_t));
        }
        w->coll.out_blocks = w->out_blocks;
        w->coll.out_counts = w->out_counts;
    }
}

void pg_work_free(td_work *w)
{
    if (!w)
        return;
    if (w->on_stack) {
        local_work_end(w);
        return;
    }
    td_pg *pg = w->pg;
    work_release_refs(w);
    pthread_mutex_lock(&pg->mu);
    work_recycle_locked(pg, w);
    pthread_mutex_unlock(&pg->mu);
}

void pg_work_copy_back(td_work *w, td_tensor *dst, td_tensor *src)
{
    TD_VEC_PUSH(&w->copies, ((pg_copy){dst, src}));
}

void pg_work_keep(td_work *w, td_tensor *t) { pg_work_copy_back(w, NULL, t); }

/* "WorkTCP", "WorkThreaded": c10d's WorkNCCL naming for the group's backend. */
static void work_class(const td_pg *pg, char *out, size_t size)
{
    size_t n = strlen(pg->backend_name);
    snprintf(out, size, "Work%s", pg->backend_name);
    for (size_t i = 4; out[i]; i++)
        if (n <= 4 || i == 4)
            out[i] = (char)toupper((unsigned char)out[i]);
}

/* c10d's watchdog line for w, which ran past the group's timeout. malloc'd. */
static char *watchdog_message(const td_work *w)
{
    char cls[64];
    work_class(w->pg, cls, sizeof cls);
    return alloc_printf("[Rank %d] Watchdog caught collective operation timeout: %s(SeqNum=%llu, OpType=%s, "
                       "NumelIn=%lld, NumelOut=%lld, Timeout(ms)=%lld) ran for %lld milliseconds before timing out.",
                       w->pg->rank, cls, (unsigned long long)w->seq, pg_op_type_name(w->op),
                       (long long)w->numel_in, (long long)w->numel_out, (long long)w->pg->timeout_ms,
                       (long long)((clock_now_ns() - w->issue_ns) / 1000000));
}

void pg_fail_locked(td_pg *pg, td_status status, const char *message)
{
    if (pg->failed != TD_OK)
        return;
    pg->failed = status;
    atomic_fetch_or(&pg->gate, PG_GATE_CLOSED);
    pg->failed_msg = alloc_strdup(message);
    /* A real failure (not a group being destroyed): the launcher's summary shows it if the process
     * then exits non-zero. */
    if (status != TD_ERR_CLOSED && message)
        errfile_record(message);
    pthread_cond_broadcast(&pg->cv);
}

static void inflight_unlink_locked(td_pg *pg, td_work *w)
{
    if (w->iprev)
        w->iprev->inext = w->inext;
    else
        pg->inflight = w->inext;
    if (w->inext)
        w->inext->iprev = w->iprev;
    w->iprev = w->inext = NULL;
}

static void inflight_link_locked(td_pg *pg, td_work *w)
{
    w->iprev = NULL;
    w->inext = pg->inflight;
    if (pg->inflight)
        pg->inflight->iprev = w;
    pg->inflight = w;
}

/* A trace event on its way to the executor, with copies of everything it points to. */
typedef struct trace_item {
    void (*fn)(const td_pg_trace_event *event, void *arg);
    void *arg;
    td_pg_trace_event ev;
    char name[80];
    char group[64];
    int64_t shape[TD_MAX_DIMS];
} trace_item;

static void run_trace(void *p)
{
    trace_item *t = p;
    t->ev.name = t->name;
    t->ev.group_name = t->group;
    t->ev.shape = t->shape;
    t->fn(&t->ev, t->arg);
    free(t);
}

static executor_item *make_trace(const td_work *w, td_status status, void (*fn)(const td_pg_trace_event *, void *),
                                void *arg)
{
    trace_item *t = TD_NEW(trace_item);
    t->fn = fn;
    t->arg = arg;
    snprintf(t->name, sizeof t->name, "%s:%s", w->pg->backend_name, pg_op_api_name(w->op));
    snprintf(t->group, sizeof t->group, "%s", w->pg->name);
    t->ev = (td_pg_trace_event){
        .rank = w->pg->rank,
        .seq = w->seq,
        .is_async = w->is_async,
        .status = status,
        .dtype = w->coll.dtype,
        .numel_in = w->numel_in,
        .numel_out = w->numel_out,
        .ndim = (int)w->fp.ndim,
        .begin_ns = w->issue_ns,
        .end_ns = clock_now_ns(),
    };
    /* Issued before the callback was set, the work has a coarse stamp (pg_issue), which may read later. */
    if (t->ev.begin_ns > t->ev.end_ns)
        t->ev.begin_ns = t->ev.end_ns;
    if (t->ev.ndim > 0)
        memcpy(t->shape, w->fp.shape, sizeof(int64_t) * (size_t)t->ev.ndim);
    executor_item *it = TD_NEW(executor_item);
    it->fn = run_trace;
    it->arg = t;
    return it;
}

void td_pg_set_trace_callback(td_pg *pg, void (*fn)(const td_pg_trace_event *event, void *arg), void *arg)
{
    td_pg *g = NULL;
    if (pg_resolve(pg, "set_trace_callback", &g) != TD_OK)
        return;
    pthread_mutex_lock(&g->mu);
    __atomic_store_n(&g->trace_fn, fn, __ATOMIC_RELAXED);
    g->trace_arg = arg;
    pthread_mutex_unlock(&g->mu);
}

/* AVG ran as SUM: the ranks that hold the result divide it by the group's size. */
static td_status finish_avg(td_work *w, char **message)
{
    const td_coll *c = &w->coll;
    if (c->kind == TD_COLL_REDUCE && w->pg->rank != c->root)
        return TD_OK;
    td_status st = td_reduce_finish(TD_AVG, c->dtype, c->out, c->count, w->pg->size);
    if (st != TD_OK)
        *message = alloc_strdup(td_last_error());
    return st;
}

/* The pg_sync of the blocking call whose submit this thread is running (pg_run_on_caller). The
 * initial-exec model reads it at a fixed offset from the thread pointer, where the default model of
 * a shared library calls __tls_get_addr on every access (three per call). */
static __thread pg_sync *submitting_sync __attribute__((tls_model("initial-exec")));

/* pg_work_finish's general case. */
__attribute__((noinline)) static void work_finish(td_work *w, td_status status, int sender, char *message)
{
    td_pg *pg = w->pg;
    pg_sync *sync = w->sync;
    td_value *value = NULL;
    if (status == TD_OK && w->reduce_op.kind == TD_AVG)
        status = finish_avg(w, &message);
    if (status == TD_OK) {
        for (size_t i = 0; i < w->copies.len; i++) {
            pg_copy *c = &w->copies.items[i];
            if (c->dst && td_tensor_copy(c->dst, c->src) != TD_OK) {
                status = TD_ERR_INTERNAL;
                message = alloc_printf("%s: copying the result back failed: %s", pg_op_api_name(w->op),
                                      td_last_error());
                break;
            }
        }
    }
    if (status == TD_OK) {
        if (!sync)
            value = w->value_sender ? td_value_int(sender) : (w->result ? td_value_retain(w->result) : NULL);
    } else if (!message) {
        message = alloc_strdup(td_last_error()[0] ? td_last_error() : "unknown error");
    }
    if (status != TD_OK && pg->debug >= PG_DEBUG_INFO)
        log_emit(TD_LOG_INFO, "Process group %s: %s (SeqNum=%llu) failed: %s", pg->name, pg_op_type_name(w->op),
               (unsigned long long)w->seq, message);

    /* A successful operation with no trace callback takes the group's lock at most once, at the end. */
    if (status != TD_OK || pg_traced(pg)) {
        pthread_mutex_lock(&pg->mu);
        if (status != TD_OK && !w->nonfatal)
            pg_fail_locked(pg, status, message);
        executor_item *trace = pg->trace_fn && w->op != PG_OP_FINGERPRINT
                                  ? make_trace(w, status, pg->trace_fn, pg->trace_arg)
                                  : NULL;
        pthread_mutex_unlock(&pg->mu);
        executor_dispatch(trace);
    }

    if (sync) {
        /* The caller recycles w. Completed within submit on the caller's own thread, w is on no
         * list and nobody sleeps: no lock. */
        sync->status = status;
        sync->message = message;
        if (sync == submitting_sync) {
            atomic_store_explicit(&sync->done, true, memory_order_release);
            return;
        }
        pthread_mutex_lock(&pg->mu);
        if (w->iprev || pg->inflight == w)
            inflight_unlink_locked(pg, w);
        bool wake = sync->waiting || pg->stop;
        /* Last: once done, the caller's frame (sync) may be gone. */
        atomic_store_explicit(&sync->done, true, memory_order_release);
        if (wake)
            pthread_cond_broadcast(&pg->cv);
        pthread_mutex_unlock(&pg->mu);
        return;
    }
    if (status == TD_OK)
        td_future_set_result(w->future, value);
    else
        td_future_set_error(w->future, status, "%s", message);
    free(message);

    /* Last, in one step: once off the in-flight list, destroy may free the group. */
    work_release_refs(w);
    pthread_mutex_lock(&pg->mu);
    if (w->iprev || pg->inflight == w) {
        inflight_unlink_locked(pg, w);
        /* Only destroy waits for the list to drain; the idle worker's deadline stays safe (it
         * wakes at the old one and looks again), and waking it for every operation costs a
         * thread switch per call. */
        if (pg->stop)
            pthread_cond_broadcast(&pg->cv);
    }
    work_recycle_locked(pg, w);
    pthread_mutex_unlock(&pg->mu);
}

/* Kept small, so that the common case (see the first test) pays for no more than its tests: the
 * rest is work_finish. */
void pg_work_finish(td_work *w, td_status status, int sender, char *message)
{
    /* A blocking call completed within submit on its caller's thread, with nothing to do after the
     * backend: w is on no list and nobody sleeps, so the caller only needs to learn it is done. */
    pg_sync *sync = w->sync;
    if (__builtin_expect(status == TD_OK && sync != NULL && sync == submitting_sync && w->copies.len == 0 &&
                             w->reduce_op.kind != TD_AVG && !pg_traced(w->pg), 1)) {
        atomic_store_explicit(&sync->done, true, memory_order_release);
        return;
    }
    work_finish(w, status, sender, message);
}

/* td_work_done's failure: the message from fmt (else the thread's last error), with the
 * watchdog's line in front of a timeout. */
__attribute__((noinline, format(printf, 4, 0))) static void work_failed(td_work *w, td_status status, int sender,
                                                                         const char *fmt, va_list ap)
{
    char *msg = NULL;
    if (fmt && vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    if (!msg)
        msg = alloc_strdup(td_last_error()[0] ? td_last_error() : "unknown error");
    if (status == TD_ERR_TIMEOUT && !strstr(msg, "Watchdog caught")) {
        char *line = watchdog_message(w);
        char *full = alloc_printf("%s Cause: %s", line, msg);
        free(line);
        free(msg);
        msg = full;
    }
    work_finish(w, status, sender, msg);
}

void td_work_done(td_work *w, td_status status, int sender, const char *fmt, ...)
{
    if (!w)
        return;
    if (__builtin_expect(status == TD_OK, 1)) {
        pg_work_finish(w, TD_OK, sender, NULL);
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    work_failed(w, status, sender, fmt, ap);
    va_end(ap);
}

void td_work_set_driver(td_work *w, bool (*drive)(void))
{
    if (w->sync)
        w->sync->drive = drive; /* submit runs on the caller's thread, which reads it after */
    else
        pg_future_set_driver(w->future, drive);
}

/* ---- the hand-off path ---------------------------------------------------------------------- */

/* Every operation reaches the backend the same way: pg_issue hands it over on the caller's thread
 * when the group is idle and the backend's capabilities allow (pg_run_on_caller), else queues it
 * for the worker; either way the thread holding the gate's BUSY numbers it (pg_number) and gives it
 * to pg_submit, the one place that calls the backend's submit. */

static void log_op(td_pg *pg, const td_work *w)
{
    log_emit(TD_LOG_INFO, "Process group %s (%s): %s SeqNum=%llu, dtype=%s, NumelIn=%lld, NumelOut=%lld%s", pg->name,
           pg->backend_name, pg_op_type_name(w->op), (unsigned long long)w->seq, td_dtype_name(w->coll.dtype),
           (long long)w->numel_in, (long long)w->numel_out, w->is_p2p ? " (p2p)" : "");
}

/* The issue time serves the deadline and the watchdog, at millisecond precision; only a trace
 * callback, which reports durations, needs the precise clock. */
static void stamp_work(td_pg *pg, td_work *w, int64_t now)
{
    w->issue_ns = now;
    w->coll.deadline_ns = deadline_at(now, pg->timeout_ms);
}

static int64_t issue_time(const td_pg *pg) { return pg_traced(pg) ? clock_now_ns() : clock_coarse_ns(); }

/* By the BUSY holder, as w leaves the queue or is handed over on its caller's thread: the
 * group's operation numbers then follow the order in which operations reach the backend. */
static void pg_number(td_pg *pg, td_work *w)
{
    w->seq = w->is_p2p ? ++pg->last_p2p_seq : ++pg->last_op_seq;
    w->fp.seq = (int64_t)w->seq;
}

/* PREMUL_SUM runs as SUM on inputs scaled first: in place where the buffer is overwritten by the
 * result anyway (all_reduce, reduce: a non-root's is the front end's copy), into a temporary where
 * the input is the caller's (reduce_scatter's blocks). */
static td_status premul_inputs(td_work *w)
{
    td_coll *c = &w->coll;
    double factor = w->reduce_op.factor;
    if (c->count == 0)
        return TD_OK;
    if (c->kind != TD_COLL_REDUCE_SCATTER)
        return td_reduce_premul(c->dtype, c->out, c->in, c->count, factor);
    size_t n = (size_t)w->pg->size, bytes = c->count * td_dtype_size(c->dtype);
    td_tensor *scaled;
    TD_TRY(td_tensor_empty(c->dtype, TD_SHAPE((int64_t)(c->count * n)), &scaled));
    pg_work_keep(w, scaled);
    char *base = td_tensor_data(scaled);
    for (size_t r = 0; r < n; r++) {
        TD_TRY(td_reduce_premul(c->dtype, base + r * bytes, w->in_blocks[r], c->count, factor));
        w->in_blocks[r] = base + r * bytes;
    }
    return TD_OK;
}

/* DETAIL's check before a collective: all_gathers the fingerprints through the backend and compares
 * them. TD_OK, or an error with the mismatch message (or the exchange's own failure). */
static td_status detail_check(td_pg *pg, td_work *w)
{
    size_t words = PG_FP_WORDS;
    int64_t *all = alloc_zeroed((size_t)pg->size * words, sizeof(int64_t));
    td_work *iw = pg_work_new(pg, PG_OP_FINGERPRINT, TD_COLL_ALL_GATHER, TD_INT64);
    iw->seq = w->seq;
    iw->numel_in = (int64_t)words;
    iw->numel_out = (int64_t)words * pg->size;
    iw->coll.deadline_ns = w->coll.deadline_ns;
    iw->coll.count = words;
    iw->coll.in = &w->fp;
    pg_work_blocks(iw, false, true);
    for (int r = 0; r < pg->size; r++) {
        iw->out_blocks[r] = all + (size_t)r * words;
        iw->out_counts[r] = words;
    }
    td_status st = pg_run_internal(pg, iw);
    if (st == TD_OK)
        st = pg_fingerprints_compare((const pg_fingerprint *)all, pg->size);
    free(all);
    return st;
}

/* The one call of the backend's submit, by the BUSY holder: the DETAIL check, PREMUL_SUM's
 * scaling, the backend's sequence number and a collective's descriptor (what every rank must agree
 * on, which the transports check: tdist/backend.h), submit. */
__attribute__((always_inline)) static inline void pg_submit(td_pg *pg, td_work *w)
{
    if (__builtin_expect(pg->debug != PG_DEBUG_OFF, 0)) {
        if (w->op != PG_OP_FINGERPRINT)
            log_op(pg, w);
        if (pg->debug == PG_DEBUG_DETAIL && w->has_fp) {
            td_status st = detail_check(pg, w);
            if (st != TD_OK) {
                /* A mismatch fails only this call, on every rank alike; a failed exchange fails the group. */
                pthread_mutex_lock(&pg->mu);
                w->nonfatal = pg->failed == TD_OK;
                pthread_mutex_unlock(&pg->mu);
                pg_work_finish(w, st, -1, alloc_strdup(td_last_error()));
                return;
            }
        }
    }
    td_status st = TD_OK;
    if (__builtin_expect(w->reduce_op.kind == TD_PREMUL_SUM, 0))
        st = premul_inputs(w);
    if (st == TD_OK) {
        td_coll *c = &w->coll;
        if (w->is_p2p) {
            c->seq = ++pg->last_backend_p2p_seq;
        } else {
            c->seq = ++pg->last_backend_seq;
            int reduce = td_coll_kind_reduces(c->kind) ? (int)w->reduce_op.kind : -1;
            c->desc = td_coll_desc_make(c->kind, c->dtype, reduce, td_coll_kind_rooted(c->kind) ? c->root : -1,
                                        c->count, w->seq);
        }
        st = pg->ops->submit(pg->state, c, w);
    }
    if (st != TD_OK)
        pg_work_finish(w, st, -1, alloc_strdup(td_last_error()));
}

td_status pg_run_internal(td_pg *pg, td_work *w)
{
    td_future *f = td_future_retain(w->future = td_future_new());
    w->issue_ns = clock_now_ns();
    pthread_mutex_lock(&pg->mu);
    inflight_link_locked(pg, w);
    pthread_mutex_unlock(&pg->mu);
    pg_submit(pg, w);
    td_status st = td_future_wait(f, 0);
    td_future_release(f);
    return st;
}

/* Gives BUSY back after a hand-off on the caller's thread: one compare-and-swap when nobody waits
 * for it; else under the lock, waking the worker (queued works) or destroy. */
static void release_after_handoff(td_pg *pg)
{
    if (__builtin_expect(pg_release_idle(pg), 1))
        return;
    pthread_mutex_lock(&pg->mu);
    pg_release(pg);
    pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
}

static bool sync_done(const void *sync) { return atomic_load(&((const pg_sync *)sync)->done); }

/* A blocking call whose operation the backend did not complete within submit: w joins the
 * in-flight list (the worker watches its deadline), BUSY goes back, and the caller waits, driving
 * the backend where it asked for that (td_work_set_driver). */
static void wait_on_caller(td_pg *pg, td_work *w, pg_sync *sync)
{
    if (w->issue_ns == 0) /* TD_BACKEND_CAP_NO_DEADLINE: watched from now */
        stamp_work(pg, w, clock_coarse_ns());
    pthread_mutex_lock(&pg->mu);
    if (!atomic_load(&sync->done))
        inflight_link_locked(pg, w);
    pg_release(pg);
    pthread_cond_broadcast(&pg->cv);
    bool drive = sync->drive != NULL;
    while (!atomic_load(&sync->done)) {
        sync->waiting = true;
        if (drive) {
            drive = false;
            if (pg_drive_wait_locked(sync->drive, &pg->mu, &pg->cv, sync_done, sync, TD_DEADLINE_NONE))
                break;
            continue;
        }
        pthread_cond_wait(&pg->cv, &pg->mu);
    }
    pthread_mutex_unlock(&pg->mu);
}

/* pg_run_on_caller for an asynchronous call (or a send or receive): the work gets a future. */
__attribute__((noinline)) static td_status run_on_caller_async(td_pg *pg, td_work *w, td_future **fut)
{
    stamp_work(pg, w, issue_time(pg));
    td_future *f = td_future_retain(w->future = td_future_new());
    pthread_mutex_lock(&pg->mu);
    inflight_link_locked(pg, w);
    pthread_mutex_unlock(&pg->mu);
    pg_submit(pg, w);
    pthread_mutex_lock(&pg->mu);
    pg_release(pg);
    /* Issued by other threads meanwhile (the worker waits for us), or still in flight after
     * submit returned: the worker must watch its deadline. */
    if (pg->qhead || !td_future_is_completed(f) || pg->stop)
        pthread_cond_broadcast(&pg->cv);
    pthread_mutex_unlock(&pg->mu);
    if (fut) {
        *fut = f;
        return TD_OK;
    }
    td_status st = td_future_wait(f, 0);
    td_future_release(f);
    return st;
}

/* Hands w to the backend on the caller's thread, BUSY held (pg_issue claimed it on an idle,
 * healthy group): the worker would only take the operation, hand it over and hand the result
 * back, two thread switches that are most of a small operation's time. A blocking collective
 * gets its result in a pg_sync on this stack (no future, no lock when the backend completes it
 * within submit); an asynchronous call (TD_BACKEND_CAP_ASYNC_ON_CALLER) or a send or receive
 * gets a future, returned in *fut when the caller asked for one. */
__attribute__((always_inline)) static inline td_status pg_run_on_caller(td_pg *pg, td_work *w, td_future **fut)
{
    pg_number(pg, w);
    if (__builtin_expect(fut != NULL || w->is_p2p, 0))
        return run_on_caller_async(pg, w, fut);
    if (!(pg->caps & TD_BACKEND_CAP_NO_DEADLINE) || pg_traced(pg))
        stamp_work(pg, w, issue_time(pg));
    pg_sync sync = {.status = TD_OK};
    w->sync = &sync;
    submitting_sync = &sync;
    pg_submit(pg, w);
    submitting_sync = NULL;
    if (__builtin_expect(atomic_load_explicit(&sync.done, memory_order_acquire), 1)) {
        work_recycle(pg, w);
        release_after_handoff(pg);
    } else {
        wait_on_caller(pg, w, &sync);
        work_recycle(pg, w);
    }
    if (sync.status != TD_OK) {
        error_set(sync.status, sync.message ? sync.message : "");
        free(sync.message);
    }
    return sync.status;
}

/* With pg->mu held: w goes to the end of the worker's queue. */
static td_future *enqueue_locked(td_pg *pg, td_work *w, int64_t now)
{
    stamp_work(pg, w, now);
    td_future *f = td_future_retain(w->future = td_future_new());
    w->next = NULL;
    if (pg->qtail)
        pg->qtail->next = w;
    else
        pg->qhead = w;
    pg->qtail = w;
    return f;
}

/* pg_issue's other cases: several operations, a busy group, or a backend that wants the worker. */
__attribute__((noinline)) static td_status issue_queued(td_pg *pg, td_work **ws, int n, td_future **futs,
                                                        bool on_caller)
{
    td_future *local[8];
    td_future **fs = futs ? futs : (n <= 8 ? local : alloc_zeroed((size_t)n, sizeof *fs));
    int i = 0;
    /* Several operations (batch_isend_irecv) for a backend that takes them on the caller's thread:
     * each handed over here in turn, while the group stays idle. */
    bool batch_on_caller = n > 1 && (pg->caps & TD_BACKEND_CAP_ASYNC_ON_CALLER) && on_caller;
    for (; batch_on_caller && i < n && pg_claim(pg, PG_GATE_QUEUED | PG_GATE_CLOSED); i++)
        pg_run_on_caller(pg, ws[i], &fs[i]);
    for (int k = i; k < n; k++)
        if (ws[k]->on_stack)
            ws[k] = work_to_heap(ws[k]);
    pthread_mutex_lock(&pg->mu);
    if (i < n && (pg->failed != TD_OK || pg->stop)) {
        td_status st = pg->failed != TD_OK ? pg->failed : TD_ERR_CLOSED;
        char *msg = alloc_strdup(pg->failed != TD_OK ? pg->failed_msg : "The process group is being destroyed");
        pthread_mutex_unlock(&pg->mu);
        for (int k = i; k < n; k++)
            pg_work_free(ws[k]);
        for (int k = 0; k < i; k++)
            td_future_release(fs[k]);
        if (fs != local && fs != futs)
            free(fs);
        error_set(st, msg);
        free(msg);
        return st;
    }
    if (i < n) {
        int64_t now = issue_time(pg);
        for (; i < n; i++)
            fs[i] = enqueue_locked(pg, ws[i], now);
        atomic_fetch_or(&pg->gate, PG_GATE_QUEUED); /* also what an idle worker spins on */
        pthread_cond_broadcast(&pg->cv);
    }
    pthread_mutex_unlock(&pg->mu);
    if (futs)
        return TD_OK;
    spin_until(waiter_spin(), future_ready, fs[n - 1]);
    /* Every operation must be done before the caller's tensors are its own again, so each is
     * waited for (td_future_wait_all would return at the first failure); the first failure in
     * issue order is the call's, with its message. */
    int failed = -1;
    for (i = 0; i < n; i++)
        if (td_future_wait(fs[i], 0) != TD_OK && failed < 0)
            failed = i;
    td_status st = failed < 0 ? TD_OK : error_set(td_future_status(fs[failed]), td_future_error(fs[failed]));
    for (i = 0; i < n; i++)
        td_future_release(fs[i]);
    if (fs != local)
        free(fs);
    return st;
}

td_status pg_issue(td_pg *pg, td_work **ws, int n, td_future **futs)
{
    unsigned need = futs ? TD_BACKEND_CAP_CALLER_THREAD | TD_BACKEND_CAP_ASYNC_ON_CALLER : TD_BACKEND_CAP_CALLER_THREAD;
    bool on_caller = (pg->caps & need) == need;
    if (n == 1 && on_caller && pg_claim(pg, PG_GATE_QUEUED | PG_GATE_CLOSED))
        return pg_run_on_caller(pg, ws[0], futs);
    return issue_queued(pg, ws, n, futs, on_caller);
}

/* The worker thread: hands queued works to the backend in order, aborts the backend once the group
 * failed, and, while idle, watches the deadlines of what is in flight. */
static void *worker_main(void *arg)
{
    td_pg *pg = arg;
    log_set_rank(pg->global_rank);
    /* A short scheduler slice, so that a collective this thread runs while the application
     * computes (DDP's buckets during the backward) is not held a whole slice at each of its
     * wake-ups when the ranks share cores (docs/performance.md, "DDP against PyTorch DDP"). */
    int64_t slice_us = PG_DEFAULT_WORKER_SLICE_US;
    if (env_get_int("TDIST_WORKER_SLICE_US", PG_DEFAULT_WORKER_SLICE_US, 0, 100000, &slice_us) == TD_OK && slice_us > 0)
        thread_request_slice(slice_us);
    td_net_spin spin;
    net_spin_init(&spin, spin_budget_ns());
    bool spun = false; /* since the last work or wake-up */
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        if (pg->failed != TD_OK && !pg->backend_aborted) {
            pg->backend_aborted = true;
            pthread_mutex_unlock(&pg->mu);
            if (pg->ops->abort)
                pg->ops->abort(pg->state, pg->failed, pg->failed_msg);
            pthread_mutex_lock(&pg->mu);
            continue;
        }
        /* While a caller hands an operation to the backend on its own thread, queued work waits
         * its turn (that caller wakes us when it is done). */
        td_work *w = pg->qhead && pg_claim(pg, 0) ? pg->qhead : NULL;
        if (!w) {
            if (pg->stop && !pg->qhead)
                break;
            /* Idle: watch the deadlines of what is in flight (asynchronous p2p, say). */
            td_work *oldest = NULL;
            for (td_work *x = pg->inflight; x; x = x->inext)
                if (!oldest || x->coll.deadline_ns < oldest->coll.deadline_ns)
                    oldest = x;
            int64_t deadline = oldest && pg->failed == TD_OK ? oldest->coll.deadline_ns : TD_DEADLINE_NONE;
            if (deadline != TD_DEADLINE_NONE && deadline_passed(deadline)) {
                char *msg = watchdog_message(oldest);
                TD_LOG_ERROR("%s", msg);
                pg_fail_locked(pg, TD_ERR_TIMEOUT, msg);
                free(msg);
                continue;
            }
            if (!spun && !pg_busy(pg)) { /* and so nothing is queued (only its holder drops BUSY then) */
                spun = true;
                pthread_mutex_unlock(&pg->mu);
                spin_until(&spin, work_queued, pg);
                pthread_mutex_lock(&pg->mu);
                continue;
            }
            thread_cond_wait_until(&pg->cv, &pg->mu, deadline);
            spun = false;
            continue;
        }
        spun = false;
        pg->qhead = w->next;
        if (!pg->qhead) {
            pg->qtail = NULL;
            atomic_fetch_and(&pg->gate, ~(unsigned)PG_GATE_QUEUED);
        }
        pg_number(pg, w);
        if (pg->failed != TD_OK) {
            pg_release(pg);
            td_status st = pg->failed;
            char *msg = alloc_strdup(pg->failed_msg);
            pthread_mutex_unlock(&pg->mu);
            pg_work_finish(w, st, -1, msg);
            pthread_mutex_lock(&pg->mu);
            continue;
        }
        inflight_link_locked(pg, w);
        pthread_mutex_unlock(&pg->mu);
        pg_submit(pg, w);
        pthread_mutex_lock(&pg->mu);
        pg_release(pg);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

/* ---- creating groups ----------------------------------------------------------------------- */

static td_pg *pg_alloc(const char *name, const char *backend, int global_rank, const int *global_ranks, int nranks)
{
    td_pg *pg = TD_NEW(td_pg);
    fork_guard_init(&pg->guard);
    pg->name = alloc_strdup(name);
    pg->backend_name = alloc_strdup(backend);
    pg->rank = pg->size = -1;
    pg->global_rank = global_rank;
    pg->nranks = nranks;
    pg->global_ranks = alloc_or_die((size_t)nranks * sizeof(int));
    memcpy(pg->global_ranks, global_ranks, (size_t)nranks * sizeof(int));
    thread_mutex_init(&pg->mu);
    thread_cond_init(&pg->cv);
    return pg;
}

static void pg_free(td_pg *pg)
{
    td_work *spare = atomic_exchange(&pg->spare_work, NULL);
    if (spare)
        work_destroy(spare);
    while (pg->free_works) {
        td_work *w = pg->free_works;
        pg->free_works = w->next;
        work_destroy(w);
    }
    td_store_release(pg->store);
    td_store_release(pg->base_store);
    free(pg->failed_msg);
    free(pg->global_ranks);
    free(pg->backend_name);
    free(pg->name);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->cv);
    free(pg);
}

static const char *const debug_names[] = {"OFF", "INFO", "DETAIL"};

/* A root group of a backend whose runtime assigns the ranks (TD_BACKEND_CAP_RUNTIME_WORLD): its
 * rank and size, as create gave them. */
static void take_runtime_world(td_pg *pg, int rank, int size)
{
    pg->rank = pg->global_rank = rank;
    pg->size = pg->nranks = size;
    free(pg->global_ranks);
    pg->global_ranks = alloc_or_die((size_t)size * sizeof(int));
    for (int i = 0; i < size; i++)
        pg->global_ranks[i] = i;
}

/* Makes the member's side of a group: its store, the backend, the worker. Takes base_store. rank
 * -1: a root group whose rank and size the backend's runtime assigns. */
static td_status pg_start_member(td_pg *pg, const td_backend_ops *ops, td_store *base_store, int rank,
                                 int64_t timeout_ms, pg_debug_level debug, void *parent_state)
{
    pg->ops = ops;
    pg->caps = ops->caps;
    pg->member = true;
    pg->rank = rank;
    pg->size = rank < 0 ? -1 : pg->nranks;
    pg->timeout_ms = timeout_ms;
    pg->debug = debug;
    pg->base_store = base_store;
    char *prefix = alloc_printf("%s/", pg->name);
    td_status st = td_prefix_store_create(prefix, base_store, &pg->store);
    free(prefix);
    if (st != TD_OK)
        return st;
    TD_TRY(executor_hold());
    int world_rank = -1, world_size = -1;
    td_backend_args args = {
        .store = pg->store,
        .rank = rank,
        .size = pg->size,
        .global_ranks = rank < 0 ? NULL : pg->global_ranks,
        .timeout_ms = timeout_ms,
        .group_name = pg->name,
        .parent_state = parent_state,
        .caps = &pg->caps,
        .world_rank = rank < 0 ? &world_rank : NULL,
        .world_size = rank < 0 ? &world_size : NULL,
    };
    st = ops->create(&args, &pg->state);
    if (st != TD_OK) {
        executor_release();
        if (rank < 0) /* the runtime had no rank to give yet */
            return error_prefix(st, "Creating process group %s (backend %s)", pg->name, ops->name);
        return error_prefix(st, "Creating process group %s (backend %s, rank %d of %d)", pg->name, ops->name,
                               rank, pg->size);
    }
    if (rank < 0)
        take_runtime_world(pg, world_rank, world_size);
    char tname[16];
    snprintf(tname, sizeof tname, "td-pg-%s", pg->name);
    st = thread_start(&pg->worker, tname, worker_main, pg);
    if (st != TD_OK) {
        if (ops->abort)
            ops->abort(pg->state, TD_ERR_CLOSED, "process group creation failed");
        ops->destroy(pg->state);
        executor_release();
        return st;
    }
    pg->worker_started = true;
    if (debug >= PG_DEBUG_INFO)
        log_emit(TD_LOG_INFO,
               "Process group %s initialized: backend %s, rank %d of %d (global rank %d), timeout %lld ms. "
               "The debug level is set to %s.",
               pg->name, ops->name, pg->rank, pg->size, pg->global_rank, (long long)timeout_ms, debug_names[debug]);
    return TD_OK;
}

static td_status resolve_backend(const char *name, const td_backend_ops **ops)
{
    if (!name)
        name = env_get_str("TDIST_BACKEND", NULL);
    if (!name)
        name = "auto"; /* shared memory within a host, tcp between hosts */
    *ops = pg_find_backend(name);
    if (!*ops) {
        char *names = pg_backend_names();
        td_status st = error_fmt(TD_ERR_INVALID,
                                "Invalid backend: '%s'. Available backends: %s (td_register_backend adds others)",
                                name, names);
        free(names);
        return st;
    }
    return TD_OK;
}

static td_status resolve_timeout(int64_t timeout_ms, int64_t *out)
{
    if (timeout_ms < 0)
        return error_fmt(TD_ERR_INVALID, "Expected timeout argument to be a non-negative number of milliseconds, "
                                        "got %lld",
                        (long long)timeout_ms);
    if (timeout_ms > 0) {
        *out = timeout_ms;
        return TD_OK;
    }
    return env_get_duration_ms("TDIST_TIMEOUT_MS", TD_PG_DEFAULT_TIMEOUT_MS, 1, out);
}

/* A backend whose runtime assigns the ranks (TD_BACKEND_CAP_RUNTIME_WORLD): PyTorch's MPI branch
 * of init_process_group, which ignores the rank and world size it was given, with a warning. */
static void warn_runtime_world(const td_backend_ops *ops, int want_rank, int want_size, int rank, int size)
{
    if ((want_rank == -1 || want_rank == rank) && (want_size == -1 || want_size == size))
        return;
    char name[32];
    size_t i = 0;
    for (; ops->name[i] && i + 1 < sizeof name; i++)
        name[i] = (char)toupper((unsigned char)ops->name[i]);
    name[i] = '\0';
    log_emit(TD_LOG_WARN,
           "For %s backend, world_size (%d) and rank (%d) are ignored since they are assigned by the %s runtime.",
           name, want_size, want_rank, name);
}

td_status td_pg_create(const td_pg_options *options, td_pg **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_pg_create: out is NULL");
    *out = NULL;
    td_pg_options o = TD_PG_OPTIONS_INIT;
    if (options)
        o = *options;
    if (o.store && o.init_method)
        return error_fmt(TD_ERR_INVALID, "Cannot specify both init_method and store.");
    const td_backend_ops *ops;
    TD_TRY(resolve_backend(o.backend, &ops));
    int64_t timeout_ms;
    TD_TRY(resolve_timeout(o.timeout_ms, &timeout_ms));
    pg_debug_level debug;
    TD_TRY(pg_parse_debug_level(o.debug_level, &debug));

    td_store *base;
    int rank = o.rank, size = o.world_size;
    bool runtime_world = ops->caps & TD_BACKEND_CAP_RUNTIME_WORLD;
    if (o.store) {
        if (size <= 0)
            return error_fmt(TD_ERR_INVALID, "world_size must be positive if using store");
        if (rank < 0)
            return error_fmt(TD_ERR_INVALID, "rank must be non-negative if using store");
        base = td_store_retain(o.store);
    } else if (runtime_world) {
        TD_TRY(td_hash_store_create(&base)); /* the backend needs no store: nothing to meet through */
    } else {
        td_store *rdzv;
        TD_TRY(td_rendezvous(o.init_method ? o.init_method : "env://", rank, size, timeout_ms, &rdzv, &rank, &size));
        td_status st = td_store_set_timeout(rdzv, timeout_ms);
        if (st == TD_OK)
            st = td_prefix_store_create("default_pg", rdzv, &base);
        td_store_release(rdzv);
        if (st != TD_OK)
            return st;
    }
    if (runtime_world) {
        rank = -1; /* create gives them */
        size = 0;
    } else if (rank >= size) {
        td_store_release(base);
        return error_fmt(TD_ERR_INVALID, "Invalid rank %d: the rank must be in [0, %d) for a world size of %d", rank,
                        size, size);
    }
    int *ranks = alloc_or_die((size_t)size * sizeof(int));
    for (int i = 0; i < size; i++)
        ranks[i] = i;
    td_pg *pg = pg_alloc(o.group_name ? o.group_name : "0", ops->name, rank, ranks, size);
    free(ranks);
    pg->is_root = true;
    pg->local_store = runtime_world && !o.store;
    if (!runtime_world)
        log_set_rank(rank);
    td_status st = pg_start_member(pg, ops, base, rank, timeout_ms, debug, NULL);
    if (st != TD_OK) {
        pg_free(pg);
        return st;
    }
    if (runtime_world) {
        log_set_rank(pg->rank);
        warn_runtime_world(ops, o.rank, o.world_size, pg->rank, pg->size);
    }
    *out = pg;
    return TD_OK;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

td_status td_pg_new_group(td_pg *parent, const int *ranks, int n, const td_pg_options *options, td_pg **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "new_group: out is NULL");
    *out = NULL;
    td_pg *p;
    TD_TRY(pg_resolve(parent, "new_group", &p));
    if (n < 0 || (n > 0 && !ranks))
        return error_fmt(TD_ERR_INVALID, "new_group: ranks must be an array of n >= 0 ranks (NULL or n == 0: all)");
    if (n > p->size)
        return error_fmt(TD_ERR_INVALID,
                        "the new group's world size should be less or equal to the world size set by "
                        "init_process_group");
    int count = n > 0 ? n : p->size;
    int *sorted = alloc_or_die((size_t)count * sizeof(int));
    for (int i = 0; i < count; i++)
        sorted[i] = n > 0 ? ranks[i] : i;
    qsort(sorted, (size_t)count, sizeof(int), cmp_int);
    for (int i = 0; i < count; i++) {
        td_status st = TD_OK;
        if (sorted[i] < 0 || sorted[i] >= p->size)
            st = error_fmt(TD_ERR_INVALID,
                          "The new group's rank should be within the world_size set by init_process_group");
        else if (i > 0 && sorted[i] == sorted[i - 1])
            st = error_fmt(TD_ERR_INVALID, "new_group: rank %d appears more than once in ranks", sorted[i]);
        if (st != TD_OK) {
            free(sorted);
            return st;
        }
    }
    td_pg_options o = TD_PG_OPTIONS_INIT;
    if (options)
        o = *options;
    const td_backend_ops *ops = p->ops;
    if (o.backend)
        TD_TRY(resolve_backend(o.backend, &ops));
    int64_t timeout_ms = p->timeout_ms;
    if (o.timeout_ms)
        TD_TRY(resolve_timeout(o.timeout_ms, &timeout_ms));
    pg_debug_level debug = p->debug;
    if (o.debug_level)
        TD_TRY(pg_parse_debug_level(o.debug_level, &debug));

    /* Every member of the parent names the subgroup the same way, members of it or not. */
    pthread_mutex_lock(&p->mu);
    uint64_t id = ++p->child_count;
    pthread_mutex_unlock(&p->mu);
    char *name;
    if (o.group_name)
        name = alloc_strdup(o.group_name);
    else if (p->is_root)
        name = alloc_printf("%llu", (unsigned long long)id);
    else
        name = alloc_printf("%s.%llu", p->name, (unsigned long long)id);

    int my_rank = -1;
    int *globals = alloc_or_die((size_t)count * sizeof(int));
    for (int i = 0; i < count; i++) {
        globals[i] = p->global_ranks[sorted[i]];
        if (sorted[i] == p->rank)
            my_rank = i;
    }
    free(sorted);
    td_pg *g = pg_alloc(name, ops->name, p->global_rank, globals, count);
    g->local_store = p->local_store;
    free(name);
    free(globals);
    if (my_rank < 0) {
        g->timeout_ms = timeout_ms;
        g->debug = debug;
        *out = g;
        return TD_OK;
    }
    td_status st = pg_start_member(g, ops, td_store_retain(p->base_store), my_rank, timeout_ms, debug,
                                   ops == p->ops ? p->state : NULL);
    if (st != TD_OK) {
        pg_free(g);
        return st;
    }
    *out = g;
    return TD_OK;
}

/* ---- destroying ---------------------------------------------------------------------------- */

void pg_destroy_now(td_pg *pg)
{
    if (pg->member) {
        char *msg = alloc_printf("Process group %s was destroyed while the operation was pending", pg->name);
        pthread_mutex_lock(&pg->mu);
        pg->stop = true;
        pg_fail_locked(pg, TD_ERR_CLOSED, msg); /* closes the gate (it already was if the group had failed) */
        pthread_cond_broadcast(&pg->cv); /* also when the group had failed before */
        pthread_mutex_unlock(&pg->mu);
        /* Wakes a submit blocked on its peers; the worker then drains the queue with the error. */
        if (pg->ops->abort)
            pg->ops->abort(pg->state, TD_ERR_CLOSED, msg);
        free(msg);
        if (pg->worker_started)
            thread_join(pg->worker);
        pthread_mutex_lock(&pg->mu);
        while (pg->inflight || pg_busy(pg))
            pthread_cond_wait(&pg->cv, &pg->mu);
        pthread_mutex_unlock(&pg->mu);
        pg->ops->destroy(pg->state);
        executor_release();
        if (pg->debug >= PG_DEBUG_INFO)
            log_emit(TD_LOG_INFO, "Process group %s destroyed", pg->name);
    }
    pg_free(pg);
}

/* ---- queries ------------------------------------------------------------------------------- */

/* What a NULL group argument means; default_group.c, above this file, sets both. A harness rank
 * thread has a world of its own (its default group is only ever read and set by that thread);
 * every other thread uses the process's. One thread-local read on the collective path. */
static _Atomic(td_pg *) default_group;
static __thread pg_world *tl_world;

pg_world *pg_thread_world(void) { return tl_world; }

void pg_set_thread_world(pg_world *world) { tl_world = world; }

td_pg *pg_default_group(void)
{
    pg_world *own = tl_world;
    return own ? own->default_pg : atomic_load_explicit(&default_group, memory_order_acquire);
}

void pg_set_default_group(td_pg *pg) { atomic_store_explicit(&default_group, pg, memory_order_release); }

td_status pg_not_usable(td_pg *g, const char *opname)
{
    if (!g)
        return error_fmt(TD_ERR_NOT_INIT, "Default process group has not been initialized, please make sure to "
                                         "call init_process_group.");
    TD_TRY(fork_guard_check(&g->guard, "a process group"));
    if (!g->member)
        return error_fmt(TD_ERR_NOT_MEMBER, "Running %s on global rank %d which does not belong to the given group.",
                        opname, g->global_rank);
    return TD_OK;
}

static const td_pg *query_pg(const td_pg *pg) { return pg ? pg : pg_default_group(); }

int td_pg_rank(const td_pg *pg)
{
    pg = query_pg(pg);
    return pg ? pg->rank : -1;
}

int td_pg_size(const td_pg *pg)
{
    pg = query_pg(pg);
    return pg ? pg->size : -1;
}

const char *td_pg_name(const td_pg *pg)
{
    pg = query_pg(pg);
    return pg ? pg->name : NULL;
}

const char *td_pg_backend(const td_pg *pg)
{
    pg = query_pg(pg);
    return pg ? pg->backend_name : NULL;
}

int64_t td_pg_timeout_ms(const td_pg *pg)
{
    pg = query_pg(pg);
    return pg ? pg->timeout_ms : -1;
}

td_status td_pg_global_rank(const td_pg *pg, int group_rank, int *global_rank)
{
    const td_pg *g = query_pg(pg);
    if (!g)
        return error_fmt(TD_ERR_NOT_INIT, "Default process group has not been initialized, please make sure to "
                                         "call init_process_group.");
    if (group_rank < 0 || group_rank >= g->nranks)
        return error_fmt(TD_ERR_INVALID, "Group rank %d is not part of group %s", group_rank, g->name);
    if (global_rank)
        *global_rank = g->global_ranks[group_rank];
    return TD_OK;
}

td_status td_pg_group_rank(const td_pg *pg, int global_rank, int *group_rank)
{
    const td_pg *g = query_pg(pg);
    if (!g)
        return error_fmt(TD_ERR_NOT_INIT, "Default process group has not been initialized, please make sure to "
                                         "call init_process_group.");
    for (int i = 0; i < g->nranks; i++) {
        if (g->global_ranks[i] == global_rank) {
            if (group_rank)
                *group_rank = i;
            return TD_OK;
        }
    }
    return error_fmt(TD_ERR_INVALID, "Global rank %d is not part of group %s", global_rank, g->name);
}

const int *td_pg_ranks(const td_pg *pg, int *size)
{
    pg = query_pg(pg);
    if (size)
        *size = pg ? pg->nranks : 0;
    return pg ? pg->global_ranks : NULL;
}
