/* The callback executor (executor.h): one named thread, "td-callbacks", that runs the callbacks of
 * futures completed on I/O threads.
 *
 * Its life is counted by holds (process groups and RPC agents take one each): the first hold
 * starts the thread, the last release stops and joins it after the queue is drained, so a test that
 * destroys its groups leaves no thread behind. A release from the executor thread itself (a
 * callback that destroys the last group) cannot join itself: that thread is marked to stop once
 * idle and the next hold or release, or the library's destructor, joins it. While a stopping
 * thread drains, a newly started one may run items too; callbacks of different futures were never
 * ordered with each other. */
#include "pg/executor.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/alloc.h"
#include "base/thread.h"

typedef struct exec_thread {
    pthread_t th;
    bool stop;
    struct exec_thread *next;
} exec_thread;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_holds;
static exec_thread *g_cur;     /* the thread serving the holders */
static exec_thread *g_zombies; /* stopped from their own thread; to be joined */
static executor_item *g_head, *g_tail;
static __thread bool tl_on_executor;

static void *exec_main(void *p)
{
    exec_thread *self = p;
    tl_on_executor = true;
    pthread_mutex_lock(&g_mu);
    for (;;) {
        executor_item *it = g_head;
        if (it) {
            g_head = it->next;
            if (!g_head)
                g_tail = NULL;
            pthread_mutex_unlock(&g_mu);
            it->fn(it->arg);
            free(it);
            pthread_mutex_lock(&g_mu);
            continue;
        }
        if (self->stop)
            break;
        pthread_cond_wait(&g_cv, &g_mu);
    }
    pthread_mutex_unlock(&g_mu);
    return NULL;
}

/* Joins the threads that stopped themselves; never called with g_mu held (they may need it). */
static void join_zombies(void)
{
    pthread_mutex_lock(&g_mu);
    exec_thread *z = g_zombies;
    g_zombies = NULL;
    pthread_mutex_unlock(&g_mu);
    while (z) {
        exec_thread *next = z->next;
        thread_join(z->th);
        free(z);
        z = next;
    }
}

td_status executor_hold(void)
{
    if (!tl_on_executor)
        join_zombies();
    pthread_mutex_lock(&g_mu);
    if (!g_cur) {
        exec_thread *t = TD_NEW(exec_thread);
        td_status st = thread_start(&t->th, "td-callbacks", exec_main, t);
        if (st != TD_OK) {
            pthread_mutex_unlock(&g_mu);
            free(t);
            return st;
        }
        g_cur = t;
    }
    g_holds++;
    pthread_mutex_unlock(&g_mu);
    return TD_OK;
}

void executor_release(void)
{
    pthread_mutex_lock(&g_mu);
    exec_thread *t = NULL;
    if (--g_holds == 0 && g_cur) {
        t = g_cur;
        g_cur = NULL;
        t->stop = true;
        pthread_cond_broadcast(&g_cv);
        if (pthread_equal(t->th, pthread_self())) {
            t->next = g_zombies;
            g_zombies = t;
            t = NULL;
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (t) {
        thread_join(t->th);
        free(t);
    }
    if (!tl_on_executor)
        join_zombies();
}

void executor_dispatch(executor_item *items)
{
    if (!items)
        return;
    executor_item *last = items;
    while (last->next)
        last = last->next;
    pthread_mutex_lock(&g_mu);
    if (g_cur) {
        if (g_tail)
            g_tail->next = items;
        else
            g_head = items;
        g_tail = last;
        pthread_cond_broadcast(&g_cv);
        pthread_mutex_unlock(&g_mu);
        return;
    }
    pthread_mutex_unlock(&g_mu);
    while (items) {
        executor_item *next = items->next;
        items->fn(items->arg);
        free(items);
        items = next;
    }
}

bool executor_is_current(void) { return tl_on_executor; }

__attribute__((destructor)) static void executor_at_exit(void)
{
    if (!tl_on_executor)
        join_zombies();
}
