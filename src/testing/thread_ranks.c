/* Threaded mode: the ranks of a case as threads of one child process (c10d's
 * MultiThreadedTestCase). The parent supervises that process like a one-rank case, so a hung thread
 * still ends in a clean timeout verdict (C cannot kill a thread).
 *
 * Each rank thread has its own td_test_ctx and a jmp_buf at its entry: a failed check records
 * "Thread R exited with exception:\n<message>\n" and unwinds the thread with longjmp; a skip
 * records its code. The first failure or skip marks the test aborted and calls the abort hooks
 * once, so that ranks blocked in a collective of the threaded backend wake up (c10d's
 * ProcessLocalGroup.exception_handle). Each rank thread has its own default group (pg_impl.h's
 * pg_world, as c10d's ThreadLocalWorld): td_init_process_group and the calls that name no group
 * act on the rank's own, and whatever the rank left in it is destroyed when its thread ends, also
 * after a failed check, so that its peers see it leave. After all threads are joined the process
 * reports with the threaded decision table (C13): errors (in the order they happened) -> exit 10
 * with their text; else a TEST_SKIPS code -> that exit code; else (also for any other code, trap
 * T16) a pass. */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/log.h"
#include "base/thread.h"
#include "base/vec.h"
#include "pg/pg_impl.h"
#include "testing/harness.h"

typedef struct rank_thread {
    td_test_ctx ctx;
    pthread_t thread;
    jmp_buf unwind;
    atomic_bool finished;
} rank_thread;

typedef struct outcome {
    int rank;
    bool error;
    int skip_code;
    char *message; /* error text, formatted */
} outcome;

typedef struct hook {
    void (*fn)(void *);
    void *arg;
} hook;

static struct {
    pthread_mutex_t lock;
    td_test_case *test_case;
    rank_thread *ranks;
    int nranks;
    atomic_bool aborted;
    TD_VEC(outcome) outcomes; /* in the order they happened */
    TD_VEC(hook) hooks;
} g_thr = {.lock = PTHREAD_MUTEX_INITIALIZER};

static __thread rank_thread *tl_self;

static void trigger_abort(void)
{
    pthread_mutex_lock(&g_thr.lock);
    if (atomic_load(&g_thr.aborted)) {
        pthread_mutex_unlock(&g_thr.lock);
        return;
    }
    atomic_store(&g_thr.aborted, true);
    size_t n = g_thr.hooks.len;
    hook *copy = n ? alloc_zeroed(n, sizeof *copy) : NULL;
    if (n)
        memcpy(copy, g_thr.hooks.items, n * sizeof *copy);
    pthread_mutex_unlock(&g_thr.lock);
    for (size_t i = 0; i < n; i++)
        copy[i].fn(copy[i].arg);
    free(copy);
}

static void record(outcome o)
{
    pthread_mutex_lock(&g_thr.lock);
    TD_VEC_PUSH(&g_thr.outcomes, o);
    pthread_mutex_unlock(&g_thr.lock);
}

void harness_threaded_fail(char *message)
{
    rank_thread *self = tl_self;
    if (!self)
        return;
    int rank = self->ctx.rank;
    harness_log(NULL, "Caught exception: \n%s exiting thread %d", message, rank);
    record((outcome){.rank = rank, .error = true, .message = alloc_printf("Thread %d exited with exception:\n%s\n", rank, message)});
    free(message);
    trigger_abort();
    longjmp(self->unwind, 1);
}

void harness_threaded_skip(int code, const char *reason)
{
    rank_thread *self = tl_self;
    if (!self)
        return;
    harness_log(NULL, "Thread %d skipping test %s for following reason: %s", self->ctx.rank, self->ctx.name,
                   reason ? reason : "");
    record((outcome){.rank = self->ctx.rank, .skip_code = code});
    trigger_abort();
    longjmp(self->unwind, 1);
}

bool harness_threaded_aborted(void) { return atomic_load(&g_thr.aborted); }

void harness_threaded_add_hook(void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&g_thr.lock);
    TD_VEC_PUSH(&g_thr.hooks, ((hook){fn, arg}));
    bool already = atomic_load(&g_thr.aborted);
    pthread_mutex_unlock(&g_thr.lock);
    if (already)
        fn(arg);
}

void harness_threaded_remove_hook(void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&g_thr.lock);
    for (size_t i = 0; i < g_thr.hooks.len; i++)
        if (g_thr.hooks.items[i].fn == fn && g_thr.hooks.items[i].arg == arg) {
            TD_VEC_SWAP_REMOVE(&g_thr.hooks, i);
            break;
        }
    pthread_mutex_unlock(&g_thr.lock);
}

bool harness_threaded_pending(td_buf *out)
{
    pthread_mutex_lock(&g_thr.lock);
    bool threaded = g_thr.ranks != NULL;
    for (int i = 0; threaded && i < g_thr.nranks; i++)
        if (!atomic_load(&g_thr.ranks[i].finished))
            buf_printf(out, "%s%d", out->len ? " " : "", i);
    pthread_mutex_unlock(&g_thr.lock);
    return threaded;
}

static void *rank_main(void *arg)
{
    rank_thread *self = arg;
    /* Named here, before anything runs: threads the rank starts inherit the name it has then. */
    char name[16];
    snprintf(name, sizeof name, "td-rank-%d", self->ctx.rank % 100000);
    thread_set_name(name);
    tl_self = self;
    stacks_set_thread_rank(self->ctx.rank);
    log_set_rank(self->ctx.rank);
    pg_thread_world_begin();
    if (setjmp(self->unwind) == 0)
        g_thr.test_case->fn(&self->ctx);
    /* Also after a failed check: the group the rank left goes, and its peers see it leave. */
    pg_thread_world_end();
    tl_self = NULL;
    atomic_store(&self->finished, true);
    return NULL;
}

int harness_threaded_main(td_test_case *c, const td_test_ctx *proto, int ctl_fd)
{
    (void)ctl_fd;
    int n = proto->world_size;
    td_leak_snapshot before = {0};
    if (!c->no_leak_check)
        leak_snapshot_take(&before);
    g_thr.test_case = c;
    g_thr.nranks = n;
    rank_thread *ranks = alloc_zeroed((size_t)n, sizeof *ranks);
    int started = 0;
    for (int i = 0; i < n; i++) {
        ranks[i].ctx = *proto;
        ranks[i].ctx.rank = i;
        atomic_init(&ranks[i].finished, false);
    }
    pthread_mutex_lock(&g_thr.lock);
    g_thr.ranks = ranks;
    pthread_mutex_unlock(&g_thr.lock);
    char *start_error = NULL;
    for (int i = 0; i < n; i++) {
        int rc = pthread_create(&ranks[i].thread, NULL, rank_main, &ranks[i]);
        if (rc != 0) {
            start_error = alloc_printf("could not start the thread of rank %d: %s", i, strerror(rc));
            break;
        }
        started++;
    }
    if (start_error)
        trigger_abort();
    for (int i = 0; i < started; i++)
        pthread_join(ranks[i].thread, NULL);
    if (start_error)
        harness_fail_process(start_error);

    td_buf errors = TD_BUF_INIT;
    int skip_code = 0;
    for (size_t i = 0; i < g_thr.outcomes.len; i++) {
        outcome *o = &g_thr.outcomes.items[i];
        if (o->error)
            buf_append_str(&errors, o->message);
        else if (skip_code == 0)
            skip_code = o->skip_code;
    }
    if (errors.len)
        harness_fail_process(errors.data);
    if (skip_code > 0 && td_skip_message(skip_code)) {
        fflush(stdout);
        fflush(stderr);
        _exit(skip_code);
    }
    buf_free(&errors);
    for (size_t i = 0; i < g_thr.outcomes.len; i++)
        free(g_thr.outcomes.items[i].message);
    TD_VEC_FREE(&g_thr.outcomes);
    TD_VEC_FREE(&g_thr.hooks);
    pthread_mutex_lock(&g_thr.lock);
    g_thr.ranks = NULL;
    pthread_mutex_unlock(&g_thr.lock);
    free(ranks);
    if (!c->no_leak_check) {
        char *leak = leak_check(&before, leak_grace_ms(c));
        leak_snapshot_free(&before);
        if (leak)
            harness_fail_process(leak);
    }
    return 0;
}
