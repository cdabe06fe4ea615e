/* Thread helpers (base/thread.h): names (Linux keeps 15 characters), the signal mask of started
 * threads, thread counting, process identity. */
#include <pthread.h>
#include <signal.h>
#include <string.h>
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
    td_thread_get_name(p->name, sizeof p->name);
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
    int before = td_thread_count();
    TD_CHECK(before >= 1);
    probe p = {.gate = &gate};
    pthread_t t;
    TD_CHECK_OK(td_thread_start(&t, "td-a-very-long-thread-name", probe_main, &p));
    int64_t deadline = td_deadline_after_ms(30000);
    while (td_thread_count() != before + 1 && !td_deadline_passed(deadline))
        td_sleep_ms(1);
    TD_CHECK_EQ(td_thread_count(), before + 1);
    pthread_mutex_unlock(&gate);
    td_thread_join(t);
    TD_CHECK_STR_EQ(p.name, "td-a-very-long-"); /* 15 characters */
    TD_CHECK(p.int_blocked && p.term_blocked);
    TD_CHECK(!p.segv_blocked);
    TD_CHECK(!p.dump_blocked);
    /* the joined thread is gone from /proc */
    while (td_thread_count() != before && !td_deadline_passed(deadline))
        td_sleep_ms(1);
    TD_CHECK_EQ(td_thread_count(), before);
    pthread_mutex_destroy(&gate);
}

static void *rename_self(void *arg)
{
    char *out = arg;
    td_thread_set_name("exactly15chars!");
    td_thread_get_name(out, 32);
    td_thread_set_name("sixteen-chars-xx");
    td_thread_get_name(out + 32, 32);
    td_thread_get_name(out + 64, 4); /* a short buffer is cut, not overrun */
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
    TD_CHECK_ERR(td_thread_set_name(NULL), TD_ERR_INVALID, "thread name must not be NULL");
}

TD_TEST(process_id)
{
    TD_CHECK_EQ(td_process_id(), getpid());
}
