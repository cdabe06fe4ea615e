/* The RPC agent's pool: the threads that run called functions (agent_impl.h).
 *
 * Work is a FIFO of closures under one mutex. Threads start on demand up to the base size (the
 * agent's num_worker_threads), and run at most `concurrency` pieces of work at once (half the cores
 * this process may use, at least one: the I/O threads and the callers need the rest). More would
 * not finish short calls sooner, only make the threads take turns on the cores and on the queue's
 * lock, which costs more than the call. Work queued beyond that waits for a running thread to come
 * back for it. A function may block, though, on a nested call back into this worker for example:
 * - in a tdist wait (td_future_wait and the like), the thread says so (base/thread.h, blocking
 *   notices), stops counting as running, and another thread is woken for the queued work at once;
 * - anywhere else, the agent's I/O thread calls rpc_pool_tick at least every RPC_POOL_STALL_MS
 *   while work is queued, and when work has waited that long with no thread taking any, one more
 *   is woken, or started (up to RPC_POOL_CAP), so a pool whose every thread is blocked cannot
 *   deadlock. Calls that block outside tdist thus get a thread each, one every 1-2 RPC_POOL_STALL_MS.
 * Threads beyond the base size exit after RPC_POOL_IDLE_EXIT_MS idle; exited threads are joined by
 * the next start or by rpc_pool_stop, so none is left behind.
 *
 * An idle thread first polls for work for its spin budget (agent_impl.h, "Waiting"), so that a
 * call arriving soon after the last one needs no wake-up; only one thread spins at a time, and a
 * submit wakes a sleeper only when no thread spins and fewer than `concurrency` run. The spinner
 * also polls the agent's lanes (channel.c), so a call through one reaches a thread with no wake-up. */
#include <stdlib.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"
#include "rpc/agent_impl.h"

void rpc_pool_init(rpc_pool *p, int base)
{
    thread_mutex_init(&p->mu);
    thread_cond_init(&p->cv);
    p->head = p->tail = NULL;
    p->queued = 0;
    p->base = base < 1 ? 1 : base;
    p->cap = p->base > RPC_POOL_CAP ? p->base : RPC_POOL_CAP;
    p->nthreads = p->idle = p->running = p->waking = 0;
    p->concurrency = samehost_cpus_available() / 2;
    if (p->concurrency < 1)
        p->concurrency = 1;
    p->taken = p->taken_seen = 0;
    p->stalled_since_ns = 0;
    p->stop = false;
    p->spinners = 0;
    p->lanes = NULL;
    atomic_init(&p->avail, 0);
    atomic_init(&p->stopping, false);
    p->threads.items = NULL;
    p->threads.len = p->threads.cap = 0;
    p->spin.spin_ns = 0; /* no spinning until the agent sets p->spin up */
}

static __thread const rpc_pool *tl_pool; /* the pool whose thread this is */

bool rpc_pool_is_current(const rpc_pool *p) { return tl_pool == p; }

static void pool_spawn(rpc_pool *p);

/* p->mu held: wakes a sleeping thread for queued work or, when none sleeps, starts one while the
 * pool has fewer than `limit` threads. */
static void pool_wake_one(rpc_pool *p, int limit)
{
    if (p->idle > p->waking) {
        p->waking++;
        pthread_cond_signal(&p->cv);
    } else if (p->nthreads < limit) {
        pool_spawn(p);
    }
}

/* p->mu held: whether queued work should have another thread now. */
static bool pool_wants_thread(const rpc_pool *p)
{
    return p->head && p->spinners == 0 && p->running + p->waking < p->concurrency;
}

/* The blocking notice of a pool thread (base/thread.h): a blocked thread does not count as running,
 * so the work it would have taken gets another thread. */
static void pool_blocked(void *ctx, bool blocked)
{
    rpc_pool *p = ctx;
    pthread_mutex_lock(&p->mu);
    if (blocked) {
        p->running--;
        if (pool_wants_thread(p)) {
            TD_LOG_DEBUG("RPC pool: blocked thread hands off (%d threads)", p->nthreads);
            pool_wake_one(p, p->cap);
        }
    } else {
        p->running++;
    }
    pthread_mutex_unlock(&p->mu);
}

/* Polls, without the lock, until work is queued or the pool stops (true) or the budget of a wait
 * that began at start is spent (false). */
static bool pool_spin(rpc_pool *p, int64_t start)
{
    int64_t end = start + samehost_spin_budget(&p->spin);
    if (end <= start)
        return false;
    /* It polls the agent's lanes too: a call that comes through one is delivered here, to this
     * pool's queue, and taken by this thread, with no wake-up. */
    size_t lanes = p->lanes ? rpc_lanes_enter(p->lanes) : 0;
    bool got;
    for (;;) {
        if (atomic_load_explicit(&p->avail, memory_order_acquire) > 0 || atomic_load(&p->stopping)) {
            got = true;
            break;
        }
        int64_t now = clock_now_ns();
        if (now >= end) {
            got = false;
            break;
        }
        if (lanes > 0 && rpc_lanes_poll(p->lanes))
            continue;
        samehost_spin_pause(&p->spin, now - start);
    }
    if (p->lanes)
        rpc_lanes_leave(p->lanes, lanes);
    return got;
}

static void *pool_main(void *arg)
{
    rpc_pool_thread *self = arg;
    rpc_pool *p = self->pool;
    tl_pool = p;
    thread_set_block_hook(pool_blocked, p); /* only the work it runs waits in tdist */
    pthread_mutex_lock(&p->mu);
    if (p->waking > 0)
        p->waking--; /* started for work (pool_spawn): looking at the queue now */
    for (;;) {
        bool spun = false, slept = false;
        int64_t wait_start = 0;
        while (!p->head && !p->stop) {
            if (!spun && p->spinners == 0) {
                spun = true;
                wait_start = clock_now_ns();
                p->spinners++;
                pthread_mutex_unlock(&p->mu);
                pool_spin(p, wait_start);
                pthread_mutex_lock(&p->mu);
                p->spinners--;
                continue;
            }
            slept = true;
            p->idle++;
            bool woke = thread_cond_wait_until(&p->cv, &p->mu, deadline_after_ms(RPC_POOL_IDLE_EXIT_MS));
            p->idle--;
            if (p->waking > 0)
                p->waking--;
            if (!woke && !p->head && !p->stop && p->nthreads > p->base)
                goto out;
        }
        if (spun)
            samehost_spin_result(&p->spin, slept, wait_start);
        if (!p->head)
            break; /* stopping, and nothing left that may run */
        rpc_work *w = p->head;
        p->head = w->next;
        if (!p->head)
            p->tail = NULL;
        p->queued--;
        atomic_store_explicit(&p->avail, p->queued, memory_order_relaxed);
        p->taken++;
        p->running++;
        if (pool_wants_thread(p))
            pool_wake_one(p, p->base);
        pthread_mutex_unlock(&p->mu);
        w->fn(w->arg);
        free(w);
        pthread_mutex_lock(&p->mu);
        p->running--;
    }
out:
    p->nthreads--;
    self->exited = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Joins the threads that exited (p->mu held; they no longer touch the pool once exited is set,
 * apart from returning). */
static void pool_reap(rpc_pool *p)
{
    for (size_t i = 0; i < p->threads.len;) {
        rpc_pool_thread *t = p->threads.items[i];
        if (t->exited) {
            thread_join(t->thread);
            free(t);
            p->threads.items[i] = p->threads.items[--p->threads.len];
        } else {
            i++;
        }
    }
}

/* p->mu held. */
static void pool_spawn(rpc_pool *p)
{
    pool_reap(p);
    rpc_pool_thread *t = TD_NEW(rpc_pool_thread);
    t->pool = p;
    if (thread_start(&t->thread, "tdist-rpc-pool", pool_main, t) != TD_OK) {
        TD_LOG_WARN("RPC pool: cannot start another thread: %s", td_last_error());
        free(t);
        return;
    }
    p->nthreads++;
    p->waking++; /* until it looks at the queue */
    TD_VEC_PUSH(&p->threads, t);
}

td_status rpc_pool_submit(rpc_pool *p, void (*fn)(void *), void (*drop)(void *), void *arg)
{
    rpc_work *w = TD_NEW(rpc_work);
    w->fn = fn;
    w->drop = drop;
    w->arg = arg;
    pthread_mutex_lock(&p->mu);
    if (p->stop) {
        pthread_mutex_unlock(&p->mu);
        free(w);
        return error_fmt(TD_ERR_CLOSED, "the RPC agent is shutting down");
    }
    if (p->tail)
        p->tail->next = w;
    else
        p->head = w;
    p->tail = w;
    p->queued++;
    atomic_store_explicit(&p->avail, p->queued, memory_order_release);
    /* A spinner takes the work without a wake-up; it cannot miss it, as it checks the queue under
     * the lock before it sleeps. */
    if (pool_wants_thread(p))
        pool_wake_one(p, p->base);
    pthread_mutex_unlock(&p->mu);
    return TD_OK;
}

void rpc_pool_tick(rpc_pool *p)
{
    pthread_mutex_lock(&p->mu);
    int64_t now = clock_now_ns();
    if (!p->head) {
        p->stalled_since_ns = 0;
    } else if (p->taken != p->taken_seen || p->stalled_since_ns == 0) {
        p->stalled_since_ns = now; /* work waits, but a thread took some since the last tick */
    } else if (!p->stop && p->spinners == 0 && p->waking == 0 &&
               now - p->stalled_since_ns >= (int64_t)RPC_POOL_STALL_MS * 1000000) {
        TD_LOG_DEBUG("RPC pool: %d threads, none free, with %zu calls waiting: waking another", p->nthreads,
                     p->queued);
        pool_wake_one(p, p->cap);
        p->stalled_since_ns = now;
    }
    p->taken_seen = p->taken;
    pthread_mutex_unlock(&p->mu);
}

void rpc_pool_stop(rpc_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    atomic_store(&p->stopping, true);
    rpc_work *w = p->head;
    p->head = p->tail = NULL;
    p->queued = 0;
    atomic_store(&p->avail, 0);
    pthread_cond_broadcast(&p->cv);
    while (p->nthreads > 0)
        pthread_cond_wait(&p->cv, &p->mu);
    pool_reap(p);
    pthread_mutex_unlock(&p->mu);
    while (w) {
        rpc_work *next = w->next;
        if (w->drop)
            w->drop(w->arg);
        free(w);
        w = next;
    }
}

void rpc_pool_destroy(rpc_pool *p)
{
    free(p->threads.items);
    p->threads.items = NULL;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
}

void rpc_pool_counts(rpc_pool *p, int *nthreads, int *idle, size_t *queued)
{
    pthread_mutex_lock(&p->mu);
    *nthreads = p->nthreads;
    *idle = p->idle;
    *queued = p->queued;
    pthread_mutex_unlock(&p->mu);
}
