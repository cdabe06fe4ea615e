/* The RPC agent's pool: the threads that run called functions (agent_impl.h).
 *
 * Work is a FIFO of closures under one mutex. Threads start on demand up to the base size (the
 * agent's num_worker_threads). A function may block, on a nested call back into this worker
 * for example, so a pool whose every thread is blocked while work waits would deadlock; the
 * agent's I/O thread calls rpc_pool_tick at least every RPC_TICK_MS, and when work waited through
 * a whole tick with no thread taking any, one more thread starts (up to RPC_POOL_CAP). Threads
 * beyond the base size exit after RPC_POOL_IDLE_EXIT_MS idle; exited threads are joined by the
 * next start or by rpc_pool_stop, so none is left behind.
 *
 * An idle thread first polls for work for its spin budget (agent_impl.h, "Waiting"), so that a
 * call arriving soon after the last one needs no wake-up; only one thread spins at a time, and a
 * submit wakes a sleeper only when the spinner cannot take all the work queued. */
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
    p->nthreads = p->idle = p->busy = 0;
    p->taken = p->taken_seen = 0;
    p->stop = false;
    p->spinners = 0;
    atomic_init(&p->avail, 0);
    atomic_init(&p->stopping, false);
    p->threads.items = NULL;
    p->threads.len = p->threads.cap = 0;
    p->spin.spin_ns = 0; /* no spinning until the agent sets p->spin up */
}

static __thread const rpc_pool *tl_pool; /* the pool whose thread this is */

bool rpc_pool_is_current(const rpc_pool *p) { return tl_pool == p; }

/* Polls, without the lock, until work is queued or the pool stops (true) or the budget of a wait
 * that began at start is spent (false). */
static bool pool_spin(rpc_pool *p, int64_t start)
{
    int64_t end = start + samehost_spin_budget(&p->spin);
    for (;;) {
        if (atomic_load_explicit(&p->avail, memory_order_acquire) > 0 || atomic_load(&p->stopping))
            return true;
        int64_t now = clock_now_ns();
        if (now >= end)
            return false;
        samehost_spin_pause(&p->spin, now - start);
    }
}

static void *pool_main(void *arg)
{
    rpc_pool_thread *self = arg;
    rpc_pool *p = self->pool;
    tl_pool = p;
    pthread_mutex_lock(&p->mu);
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
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        w->fn(w->arg);
        free(w);
        pthread_mutex_lock(&p->mu);
        p->busy--;
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
    if ((size_t)(p->idle + p->spinners) < p->queued && p->nthreads < p->base)
        pool_spawn(p);
    /* The spinner takes the work without a wake-up; it cannot miss it, as it checks the queue
     * under the lock before it sleeps. */
    if ((size_t)p->spinners < p->queued)
        pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return TD_OK;
}

void rpc_pool_tick(rpc_pool *p)
{
    pthread_mutex_lock(&p->mu);
    if (!p->stop && p->head && p->idle + p->spinners == 0 && p->taken == p->taken_seen && p->nthreads < p->cap) {
        TD_LOG_DEBUG("RPC pool: all %d threads are blocked with %zu calls waiting: starting another",
                     p->nthreads, p->queued);
        pool_spawn(p);
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
