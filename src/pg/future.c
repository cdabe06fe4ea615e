/* td_future (tdist/future.h): the completion handle of collectives, receives and, later, RPCs.
 *
 * A future is a mutex-protected state (pending, done, failed) plus a condition variable for
 * waiters and a list of callbacks. Completion happens once; it wakes the waiters and hands the
 * callbacks to the executor (executor.h), which runs them on its own thread when a group or agent
 * holds it, so they never run on the I/O thread that completed the future. then() is a callback
 * that completes a child future with the function's result. A failure carries a type name (the
 * Python exception class, which RPC keeps across workers); none stored means "RuntimeError".
 *
 * td_future_wait_all and td_future_collect_all watch many futures at once. collect_all is callbacks
 * and a countdown. wait_all cannot use callbacks (they may run on the executor thread, which may be
 * the one waiting), so a future also keeps a list of multi-waiters: each completion (or a new
 * driver) bumps every listed waiter's counter and wakes it, right in the completing thread, which is
 * cheap enough for an I/O thread and runs no user code.
 *
 * A future may have a driver (pg_future_set_driver, from td_work_set_driver): the progress function
 * of a backend that at times has no thread of its own to advance its operations. A waiter then
 * calls it in a loop instead of just blocking, and td_future_is_completed calls it once. */
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/future.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/ref.h"
#include "base/thread.h"
#include "pg/executor.h"
#include "pg/future.h"
#include "pg/pg_impl.h"

enum { FUT_PENDING = 0, FUT_DONE = 1, FUT_FAILED = 2 };

typedef struct fut_cb {
    void (*cb)(td_future *f, void *arg);
    void *arg;
    struct fut_cb *next;
} fut_cb;

/* One td_future_wait_all call: woken by any of its futures' completions. */
typedef struct multi_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t events; /* completions and new drivers so far, under mu */
} multi_wait;

/* A multi_wait's entry in one future's list (owned by the wait_all call, linked under f->mu). */
typedef struct fut_waiter {
    multi_wait *wait;
    struct fut_waiter *next;
    bool linked;
    bool drive_done; /* its driver said it is not needed (as in wait_locked) */
} fut_waiter;

struct td_future {
    td_ref ref;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int state;
    td_status status;
    char *error;
    char *error_type; /* NULL: "RuntimeError" */
    td_value *value;
    fut_cb *cbs, *cbs_tail;
    fut_waiter *waiters; /* wait_all calls watching f, while pending */
    bool (*_Atomic drive)(void); /* see pg_future_set_driver; NULL for none */
    struct td_future *pool_next; /* in the pool of released futures */
};

/* One callback handed to the executor: keeps the future alive until the callback ran. */
typedef struct fut_run {
    td_future *f;
    void (*cb)(td_future *f, void *arg);
    void *arg;
} fut_run;

/* Released futures are kept for reuse (a mutex and a condition variable, idle, can serve again),
 * so that an operation's future costs no allocation after warm-up. Each thread keeps a few for
 * itself, without a lock: a blocking call makes its future and releases it on the caller's thread.
 * The rest go to a shared pool, and so do a thread's own when it ends. */
#define FUTURE_POOL_MAX 256
#define FUTURE_CACHE_MAX 4
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static td_future *g_pool;
static int g_pool_len;
static __thread td_future *t_cache;
static __thread int t_cache_len;
static __thread bool t_cache_registered;
static pthread_key_t g_cache_key;
static pthread_once_t g_cache_once = PTHREAD_ONCE_INIT;

static void future_free(td_future *f)
{
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
}

/* f, reset, to the shared pool (or freed when the pool is full). */
static void pool_put(td_future *f)
{
    pthread_mutex_lock(&g_pool_mu);
    if (g_pool_len < FUTURE_POOL_MAX) {
        f->pool_next = g_pool;
        g_pool = f;
        g_pool_len++;
        f = NULL;
    }
    pthread_mutex_unlock(&g_pool_mu);
    if (f)
        future_free(f);
}

/* Thread exit: the thread's cache goes to the shared pool. */
static void cache_flush(void *unused)
{
    (void)unused;
    while (t_cache) {
        td_future *f = t_cache;
        t_cache = f->pool_next;
        pool_put(f);
    }
    t_cache_len = 0;
}

static void cache_key_init(void)
{
    if (pthread_key_create(&g_cache_key, cache_flush) != 0)
        abort();
}

td_future *td_future_new(void)
{
    td_future *f = t_cache;
    if (f) {
        t_cache = f->pool_next;
        t_cache_len--;
    } else {
        pthread_mutex_lock(&g_pool_mu);
        f = g_pool;
        if (f) {
            g_pool = f->pool_next;
            g_pool_len--;
        }
        pthread_mutex_unlock(&g_pool_mu);
    }
    if (!f) {
        f = TD_NEW(td_future);
        thread_mutex_init(&f->mu);
        thread_cond_init(&f->cv);
    }
    f->pool_next = NULL;
    ref_init(&f->ref);
    atomic_store(&f->state, FUT_PENDING);
    f->status = TD_OK;
    f->drive = NULL;
    return f;
}

/* With f->mu held: wakes every wait_all call watching f; unlinks them when f completed, since
 * they must not be touched after f->mu is released (their entries may be gone then). */
static void notify_waiters_locked(td_future *f, bool unlink)
{
    for (fut_waiter *w = f->waiters; w; w = w->next) {
        pthread_mutex_lock(&w->wait->mu);
        w->wait->events++;
        pthread_cond_broadcast(&w->wait->cv);
        pthread_mutex_unlock(&w->wait->mu);
        if (unlink)
            w->linked = false;
    }
    if (unlink)
        f->waiters = NULL;
}

void pg_future_set_driver(td_future *f, bool (*drive)(void))
{
    pthread_mutex_lock(&f->mu);
    f->drive = drive;
    pthread_cond_broadcast(&f->cv); /* a waiter already blocked starts driving */
    notify_waiters_locked(f, false);
    pthread_mutex_unlock(&f->mu);
}

td_future *td_future_completed(td_value *value)
{
    td_future *f = td_future_new();
    td_future_set_result(f, value);
    return f;
}

td_future *td_future_failed(td_status status, const char *message)
{
    td_future *f = td_future_new();
    td_future_set_error(f, status, "%s", message ? message : "");
    return f;
}

td_future *td_future_retain(td_future *f)
{
    if (f)
        ref_inc(&f->ref);
    return f;
}

void td_future_release(td_future *f)
{
    if (!f || !ref_dec(&f->ref))
        return;
    /* A pending future's callbacks can no longer run: drop them (their args are the caller's). */
    for (fut_cb *c = f->cbs; c;) {
        fut_cb *next = c->next;
        free(c);
        c = next;
    }
    td_value_release(f->value);
    free(f->error);
    free(f->error_type);
    f->cbs = f->cbs_tail = NULL;
    f->value = NULL;
    f->error = NULL;
    f->error_type = NULL;
    if (t_cache_len < FUTURE_CACHE_MAX) {
        if (!t_cache_registered) { /* so that cache_flush runs when this thread ends */
            pthread_once(&g_cache_once, cache_key_init);
            pthread_setspecific(g_cache_key, (void *)1);
            t_cache_registered = true;
        }
        f->pool_next = t_cache;
        t_cache = f;
        t_cache_len++;
        return;
    }
    pool_put(f);
}

static void run_one(void *p)
{
    fut_run *r = p;
    r->cb(r->f, r->arg);
    td_future_release(r->f);
    free(r);
}

static executor_item *make_item(td_future *f, void (*cb)(td_future *, void *), void *arg)
{
    fut_run *r = alloc_or_die(sizeof *r);
    r->f = td_future_retain(f);
    r->cb = cb;
    r->arg = arg;
    executor_item *it = TD_NEW(executor_item);
    it->fn = run_one;
    it->arg = r;
    return it;
}

/* Completes f; takes value, message and type. */
static td_status complete(td_future *f, int state, td_status status, char *message, char *type, td_value *value)
{
    pthread_mutex_lock(&f->mu);
    if (atomic_load(&f->state) != FUT_PENDING) {
        pthread_mutex_unlock(&f->mu);
        td_value_release(value);
        free(message);
        free(type);
        return error_fmt(TD_ERR_ALREADY, "The future was already completed (a future completes exactly once)");
    }
    f->status = status;
    f->error = message;
    f->error_type = type;
    f->value = value;
    fut_cb *cbs = f->cbs;
    f->cbs = f->cbs_tail = NULL;
    atomic_store(&f->state, state);
    pthread_cond_broadcast(&f->cv);
    if (f->waiters)
        notify_waiters_locked(f, true);
    /* The waiters may release f as soon as it is unlocked. Without callbacks this function does
     * not touch it again; with them, a reference keeps it alive while their executor items (each
     * holding its own) are built. */
    if (cbs)
        td_future_retain(f);
    pthread_mutex_unlock(&f->mu);
    if (!cbs)
        return TD_OK;
    executor_item *head = NULL, **tail = &head;
    while (cbs) {
        fut_cb *next = cbs->next;
        *tail = make_item(f, cbs->cb, cbs->arg);
        tail = &(*tail)->next;
        free(cbs);
        cbs = next;
    }
    executor_dispatch(head);
    td_future_release(f);
    return TD_OK;
}

td_status td_future_set_result(td_future *f, td_value *value)
{
    if (!f) {
        td_value_release(value);
        return error_fmt(TD_ERR_INVALID, "td_future_set_result: future is NULL");
    }
    return complete(f, FUT_DONE, TD_OK, NULL, NULL, value);
}

__attribute__((format(printf, 4, 0))) static td_status fail_v(td_future *f, td_status status, const char *type_name,
                                                             const char *fmt, va_list ap)
{
    if (status == TD_OK)
        status = TD_ERR_INTERNAL;
    char *msg = NULL;
    if (!fmt)
        msg = alloc_strdup("");
    else if (vasprintf(&msg, fmt, ap) < 0)
        msg = alloc_strdup("(error message lost: out of memory)");
    char *type = type_name && *type_name ? alloc_strdup(type_name) : NULL;
    return complete(f, FUT_FAILED, status, msg, type, NULL);
}

td_status td_future_set_error(td_future *f, td_status status, const char *fmt, ...)
{
    if (!f)
        return error_fmt(TD_ERR_INVALID, "td_future_set_error: future is NULL");
    va_list ap;
    va_start(ap, fmt);
    td_status st = fail_v(f, status, NULL, fmt, ap);
    va_end(ap);
    return st;
}

td_status td_future_set_typed_error(td_future *f, td_status status, const char *type_name, const char *fmt, ...)
{
    if (!f)
        return error_fmt(TD_ERR_INVALID, "td_future_set_typed_error: future is NULL");
    va_list ap;
    va_start(ap, fmt);
    td_status st = fail_v(f, status, type_name, fmt, ap);
    va_end(ap);
    return st;
}

static bool future_done(const void *f);

/* With f->mu held: waits until f completes or the deadline passes, driving it once it has a
 * driver; true when completed. */
static bool wait_locked(td_future *f, int64_t deadline_ns)
{
    bool driven = false;
    while (atomic_load(&f->state) == FUT_PENDING) {
        if (f->drive && !driven) {
            driven = true;
            if (pg_drive_wait_locked(f->drive, &f->mu, &f->cv, future_done, f, deadline_ns))
                return true;
            continue;
        }
        if (!thread_cond_wait_until(&f->cv, &f->mu, deadline_ns) && atomic_load(&f->state) == FUT_PENDING)
            return false;
    }
    return true;
}

bool pg_drive_wait_locked(bool (*drive)(void), pthread_mutex_t *mu, pthread_cond_t *cv, bool (*done)(const void *),
                          const void *arg, int64_t deadline_ns)
{
    int64_t start = clock_now_ns(), sleep_ns = 0;
    for (;;) {
        pthread_mutex_unlock(mu);
        bool driving = drive();
        pthread_mutex_lock(mu);
        if (done(arg))
            return true;
        int64_t now = clock_now_ns();
        if (!driving || now >= deadline_ns)
            return false;
        if (now - start < PG_DRIVE_SPIN_NS) {
            pthread_mutex_unlock(mu);
            sched_yield();
            pthread_mutex_lock(mu);
            continue;
        }
        sleep_ns = sleep_ns ? sleep_ns * 2 : 2000;
        if (sleep_ns > PG_DRIVE_SLEEP_MAX_NS)
            sleep_ns = PG_DRIVE_SLEEP_MAX_NS;
        thread_cond_wait_until(cv, mu, now + sleep_ns < deadline_ns ? now + sleep_ns : deadline_ns);
    }
}

static bool future_done(const void *f) { return atomic_load(&((const td_future *)f)->state) != FUT_PENDING; }

static td_status wait_until(td_future *f, int64_t deadline_ns, int64_t timeout_ms)
{
    if (!f)
        return error_fmt(TD_ERR_INVALID, "td_future_wait: future is NULL");
    bool done = atomic_load(&f->state) != FUT_PENDING; /* complete() stored it last */
    if (!done) {
        thread_blocking(true);
        pthread_mutex_lock(&f->mu);
        done = wait_locked(f, deadline_ns);
        pthread_mutex_unlock(&f->mu);
        thread_blocking(false);
    }
    if (!done)
        return error_fmt(TD_ERR_TIMEOUT, "Timed out after %lld ms waiting for the future to complete",
                        (long long)timeout_ms);
    if (atomic_load(&f->state) == FUT_FAILED)
        return error_set(f->status, f->error ? f->error : "");
    return TD_OK;
}

td_status td_future_wait(td_future *f, int64_t timeout_ms)
{
    return wait_until(f, deadline_after_ms(timeout_ms), timeout_ms);
}

/* The index of the first failed future in fs, or -1 with *pending set to how many are pending. */
static int scan_all(td_future *const *fs, int n, int *pending)
{
    int left = 0;
    for (int i = 0; i < n; i++) {
        int state = atomic_load(&fs[i]->state);
        if (state == FUT_FAILED)
            return i;
        left += state == FUT_PENDING;
    }
    *pending = left;
    return -1;
}

/* td_future_wait_all once some future is pending: watches them all through one multi_wait. */
static td_status wait_all_slow(td_future *const *fs, int n, int64_t deadline_ns, int64_t timeout_ms)
{
    multi_wait mw = {.events = 0};
    thread_mutex_init(&mw.mu);
    thread_cond_init(&mw.cv);
    fut_waiter local[8];
    fut_waiter *ws = n <= 8 ? local : TD_NEW_ARRAY(fut_waiter, n);
    for (int i = 0; i < n; i++) {
        td_future *f = fs[i];
        ws[i] = (fut_waiter){.wait = &mw};
        pthread_mutex_lock(&f->mu);
        if (atomic_load(&f->state) == FUT_PENDING) {
            ws[i].next = f->waiters;
            f->waiters = &ws[i];
            ws[i].linked = true;
        }
        pthread_mutex_unlock(&f->mu);
    }

    int failed = -1, pending = n;
    int64_t start = clock_now_ns(), sleep_ns = 0;
    thread_blocking(true);
    for (;;) {
        /* Read before the scan: whatever completes after it bumps events and ends the wait below. */
        pthread_mutex_lock(&mw.mu);
        uint64_t seen = mw.events;
        pthread_mutex_unlock(&mw.mu);
        failed = scan_all(fs, n, &pending);
        if (failed >= 0 || pending == 0 || deadline_passed(deadline_ns))
            break;
        /* As wait_locked: a pending future's driver is called until it says it is not needed; many
         * futures share one driver (a backend's progress), called once per round. */
        bool driving = false, last_result = false;
        bool (*last)(void) = NULL;
        for (int i = 0; i < n; i++) {
            bool (*drive)(void) = fs[i]->drive;
            if (!drive || ws[i].drive_done || atomic_load(&fs[i]->state) != FUT_PENDING)
                continue;
            if (drive != last) {
                last = drive;
                last_result = drive();
            }
            if (last_result)
                driving = true;
            else
                ws[i].drive_done = true;
        }
        int64_t until = deadline_ns;
        if (driving) {
            int64_t now = clock_now_ns();
            if (now - start < PG_DRIVE_SPIN_NS) {
                sched_yield();
                continue;
            }
            sleep_ns = sleep_ns ? sleep_ns * 2 : 2000;
            if (sleep_ns > PG_DRIVE_SLEEP_MAX_NS)
                sleep_ns = PG_DRIVE_SLEEP_MAX_NS;
            if (now + sleep_ns < until)
                until = now + sleep_ns;
        }
        pthread_mutex_lock(&mw.mu);
        while (mw.events == seen && thread_cond_wait_until(&mw.cv, &mw.mu, until)) {
        }
        pthread_mutex_unlock(&mw.mu);
    }
    thread_blocking(false);

    /* Under each f->mu, even for a completed f: its completion may still be notifying mw. */
    for (int i = 0; i < n; i++) {
        td_future *f = fs[i];
        pthread_mutex_lock(&f->mu);
        if (ws[i].linked) {
            fut_waiter **p = &f->waiters;
            while (*p != &ws[i])
                p = &(*p)->next;
            *p = ws[i].next;
        }
        pthread_mutex_unlock(&f->mu);
    }
    if (ws != local)
        free(ws);
    pthread_mutex_destroy(&mw.mu);
    pthread_cond_destroy(&mw.cv);

    if (failed >= 0)
        return error_set(fs[failed]->status, fs[failed]->error ? fs[failed]->error : "");
    if (pending > 0)
        return error_fmt(TD_ERR_TIMEOUT,
                         "Timed out after %lld ms waiting for the futures to complete (%d of %d still pending)",
                         (long long)timeout_ms, pending, n);
    return TD_OK;
}

td_status td_future_wait_all(td_future *const *fs, int n, int64_t timeout_ms)
{
    int64_t deadline = deadline_after_ms(timeout_ms);
    if (n < 0 || (n > 0 && !fs))
        return error_fmt(TD_ERR_INVALID, "td_future_wait_all: %s", n < 0 ? "n is negative" : "futures is NULL");
    for (int i = 0; i < n; i++)
        if (!fs[i])
            return error_fmt(TD_ERR_INVALID, "td_future_wait_all: future %d is NULL", i);
    int pending = 0;
    int failed = scan_all(fs, n, &pending);
    if (failed >= 0)
        return error_set(fs[failed]->status, fs[failed]->error ? fs[failed]->error : "");
    if (pending == 0)
        return TD_OK;
    return wait_all_slow(fs, n, deadline, timeout_ms);
}

/* td_future_collect_all: the inputs, held until the last completes; left counts them plus one for
 * the setup, so that nothing completes before every callback is in place. */
/* Each input is held from the call until its own completion (the caller may drop its reference
 * meanwhile), the count by the inputs left plus one for the set-up. */
typedef struct collect_ctx {
    td_future *all;
    _Atomic int left;
} collect_ctx;

static void collect_one(td_future *input, void *p)
{
    collect_ctx *c = p;
    td_future_release(input); /* the reference taken for it below (NULL: the set-up's turn) */
    if (atomic_fetch_sub(&c->left, 1) != 1)
        return;
    td_future_set_result(c->all, NULL);
    td_future_release(c->all);
    free(c);
}

td_future *td_future_collect_all(td_future *const *fs, int n)
{
    if (n < 0 || (n > 0 && !fs))
        return td_future_failed(TD_ERR_INVALID, n < 0 ? "td_future_collect_all: n is negative"
                                                      : "td_future_collect_all: futures is NULL");
    for (int i = 0; i < n; i++) {
        if (!fs[i]) {
            char msg[64];
            snprintf(msg, sizeof msg, "td_future_collect_all: future %d is NULL", i);
            return td_future_failed(TD_ERR_INVALID, msg);
        }
    }
    td_future *all = td_future_new();
    collect_ctx *c = TD_NEW(collect_ctx);
    c->all = td_future_retain(all);
    atomic_init(&c->left, n + 1);
    for (int i = 0; i < n; i++)
        td_future_add_callback(td_future_retain(fs[i]), collect_one, c);
    collect_one(NULL, c);
    return all;
}

bool td_future_is_completed(const td_future *f)
{
    if (!f)
        return false;
    bool (*drive)(void) = f->drive;
    if (atomic_load(&f->state) == FUT_PENDING && drive)
        drive();
    return atomic_load(&f->state) != FUT_PENDING;
}

td_status td_future_status(const td_future *f)
{
    return f && atomic_load(&f->state) == FUT_FAILED ? f->status : TD_OK;
}

const char *td_future_error(const td_future *f)
{
    return f && atomic_load(&f->state) == FUT_FAILED ? f->error : NULL;
}

const char *td_future_error_type(const td_future *f)
{
    if (!f || atomic_load(&f->state) != FUT_FAILED)
        return NULL;
    return f->error_type ? f->error_type : "RuntimeError";
}

td_value *td_future_value(const td_future *f)
{
    return f && atomic_load(&f->state) == FUT_DONE ? f->value : NULL;
}

void td_future_add_callback(td_future *f, void (*cb)(td_future *f, void *arg), void *arg)
{
    if (!f || !cb)
        return;
    pthread_mutex_lock(&f->mu);
    if (atomic_load(&f->state) == FUT_PENDING) {
        fut_cb *c = TD_NEW(fut_cb);
        c->cb = cb;
        c->arg = arg;
        if (f->cbs_tail)
            f->cbs_tail->next = c;
        else
            f->cbs = c;
        f->cbs_tail = c;
        pthread_mutex_unlock(&f->mu);
        return;
    }
    pthread_mutex_unlock(&f->mu);
    cb(f, arg);
}

typedef struct then_ctx {
    td_future *child;
    td_status (*fn)(td_future *parent, void *arg, td_value **result);
    void *arg;
} then_ctx;

td_status td_future_propagate_error(const td_future *failed)
{
    if (!failed)
        return error_fmt(TD_ERR_INVALID, "td_future_propagate_error: future is NULL");
    if (atomic_load(&failed->state) != FUT_FAILED)
        return TD_OK;
    return error_set_typed(failed->status, failed->error_type, failed->error ? failed->error : "");
}

static void then_cb(td_future *parent, void *p)
{
    then_ctx *c = p;
    td_value *result = NULL;
    td_status st = c->fn(parent, c->arg, &result);
    if (st == TD_OK) {
        td_future_set_result(c->child, result);
    } else {
        td_value_release(result);
        /* The type of fn's failure, if it has one (td_future_propagate_error, td_rpc_raise). */
        td_future_set_typed_error(c->child, st, error_type(), "%s", td_last_error());
    }
    td_future_release(c->child);
    free(c);
}

td_future *td_future_then(td_future *f, td_status (*fn)(td_future *parent, void *arg, td_value **result),
                          void *arg)
{
    td_future *child = td_future_new();
    if (!f || !fn) {
        td_future_set_error(child, TD_ERR_INVALID, "td_future_then: %s is NULL", f ? "fn" : "future");
        return child;
    }
    then_ctx *c = alloc_or_die(sizeof *c);
    c->child = td_future_retain(child);
    c->fn = fn;
    c->arg = arg;
    td_future_add_callback(f, then_cb, c);
    return child;
}
