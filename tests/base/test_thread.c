/* Thread helpers (base/thread.h): names (Linux keeps 15 characters), the signal mask of started
 * threads, thread counting, process identity, the scheduler slice. */
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/thread.h"

typedef struct probe {
    char name[32];
    bool int_blocked, term_blocked, segv_blocked, dump_blocked;
    int count_inside;
    pthread_mutex_t *gate;
} probe;

static void *probe_main(void *arg)
{
    probe *p = arg;
    thread_get_name(p->name, sizeof p->name);
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    p->int_blocked = sigismember(&cur, SIGINT);
    p->term_blocked = sigismember(&cur, SIGTERM);
    p->segv_blocked = sigismember(&cur, SIGSEGV);
    p->dump_blocked = sigismember(&cur, TD_STACK_DUMP_SIGNAL);
    pthread_mutex_lock(p->gate); /* held by the test until it has counted threads */
    pthread_mutex_unlock(p->gate);
    return NULL;
}

TD_TEST(started_threads_are_named_and_mask_signals)
{
    pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&gate);
    int before = thread_count();
    TD_CHECK(before >= 1);
    probe p = {.gate = &gate};
    pthread_t t;
    TD_CHECK_OK(thread_start(&t, "td-a-very-long-thread-name", probe_main, &p));
    int64_t deadline = deadline_after_ms(30000);
    while (thread_count() != before + 1 && !deadline_passed(deadline))
        clock_sleep_ms(1);
    TD_CHECK_EQ(thread_count(), before + 1);
    pthread_mutex_unlock(&gate);
    thread_join(t);
    TD_CHECK_STR_EQ(p.name, "td-a-very-long-"); /* 15 characters */
    TD_CHECK(p.int_blocked && p.term_blocked);
    TD_CHECK(!p.segv_blocked);
    TD_CHECK(!p.dump_blocked);
    /* the joined thread is gone from /proc */
    while (thread_count() != before && !deadline_passed(deadline))
        clock_sleep_ms(1);
    TD_CHECK_EQ(thread_count(), before);
    pthread_mutex_destroy(&gate);
}

static void *rename_self(void *arg)
{
    char *out = arg;
    thread_set_name("exactly15chars!");
    thread_get_name(out, 32);
    thread_set_name("sixteen-chars-xx");
    thread_get_name(out + 32, 32);
    thread_get_name(out + 64, 4); /* a short buffer is cut, not overrun */
    return NULL;
}

TD_TEST(set_and_get_name)
{
    char names[96] = {0};
    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, rename_self, names), 0);
    pthread_join(t, NULL);
    TD_CHECK_STR_EQ(names, "exactly15chars!");
    TD_CHECK_STR_EQ(names + 32, "sixteen-chars-x");
    TD_CHECK_STR_EQ(names + 64, "six");
    TD_CHECK_ERR(thread_set_name(NULL), TD_ERR_INVALID, "thread name must not be NULL");
}

TD_TEST(process_id)
{
    TD_CHECK_EQ(thread_process_id(), getpid());
}

typedef struct slice_probe {
    pid_t tid;
    int64_t before, after;
    bool granted;
} slice_probe;

static void *slice_main(void *arg)
{
    slice_probe *p = arg;
    p->tid = (pid_t)syscall(SYS_gettid);
    p->before = thread_slice(0);
    p->granted = thread_request_slice(250);
    p->after = thread_slice(0);
    return NULL;
}

/* The slice is the calling thread's own: another thread (here the test's) reads it by its id,
 * and the rest of the process keeps the kernel's default. */
TD_TEST(requested_slice_is_the_threads_own)
{
    slice_probe p = {0};
    pthread_t t;
    TD_CHECK_OK(thread_start(&t, "td-slice", slice_main, &p));
    thread_join(t);
    if (!p.granted || p.before <= 0 || p.after == p.before)
        TD_SKIP(TD_SKIP_GENERIC, "this kernel has no per-thread scheduler slice (EEVDF custom slices: Linux 6.12)");
    TD_CHECK_EQ(p.after, 250);
    TD_CHECK_EQ(thread_slice(0), p.before); /* this thread's is untouched */
    TD_CHECK(!thread_request_slice(0));
    TD_CHECK(!thread_request_slice(-5));
    TD_CHECK_EQ(thread_slice(0), p.before);
}

/* Another thread's name, by its id; a thread that has ended has none. */
TD_TEST(name_of_a_thread_by_id)
{
    slice_probe p = {0};
    pthread_t t;
    TD_CHECK_OK(thread_start(&t, "td-named-probe", slice_main, &p));
    thread_join(t);
    char mine[32], got[32];
    TD_CHECK_OK(thread_get_name(mine, sizeof mine));
    TD_CHECK(thread_name_of((pid_t)syscall(SYS_gettid), got, sizeof got));
    TD_CHECK_STR_EQ(got, mine);
    TD_CHECK(!thread_name_of(p.tid, got, sizeof got)); /* joined: gone from /proc */
    TD_CHECK_STR_EQ(got, "?");
}
