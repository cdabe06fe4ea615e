/* Named threads, monotonic condition variables and deadline waits (thread.h). */
#include "base/thread.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"

typedef struct start_ctx {
    void *(*fn)(void *);
    void *arg;
    char name[16];
} start_ctx;

static void *thread_trampoline(void *p)
{
    start_ctx ctx = *(start_ctx *)p;
    free(p);
    pthread_setname_np(pthread_self(), ctx.name);
    return ctx.fn(ctx.arg);
}

td_status thread_start(pthread_t *thread, const char *name, void *(*fn)(void *), void *arg)
{
    start_ctx *ctx = alloc_or_die(sizeof *ctx);
    ctx->fn = fn;
    ctx->arg = arg;
    snprintf(ctx->name, sizeof ctx->name, "%s", name);
    sigset_t all, old;
    sigfillset(&all);
    static const int keep[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        sigdelset(&all, keep[i]);
    sigdelset(&all, TD_STACK_DUMP_SIGNAL);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(thread, NULL, thread_trampoline, ctx);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        free(ctx);
        errno = rc;
        return error_errno(TD_ERR_IO, "starting thread '%s'", name);
    }
    return TD_OK;
}

/* struct sched_attr of sched_setattr(2), its first version (glibc before 2.41 has no wrapper). */
typedef struct sched_attr_v0 {
    uint32_t size, policy;
    uint64_t flags;
    int32_t nice;
    uint32_t priority;
    uint64_t runtime, deadline, period;
} sched_attr_v0;

static bool thread_sched_attr(pid_t tid, sched_attr_v0 *a)
{
#ifdef SYS_sched_getattr
    memset(a, 0, sizeof *a);
    return syscall(SYS_sched_getattr, tid, a, (unsigned)sizeof *a, 0u) == 0;
#else
    (void)tid, (void)a;
    return false;
#endif
}

bool thread_request_slice(int64_t us)
{
#ifdef SYS_sched_setattr
    sched_attr_v0 a;
    if (us <= 0 || !thread_sched_attr(0, &a) || (a.policy != SCHED_OTHER && a.policy != SCHED_BATCH))
        return false;
    a.size = sizeof a;
    a.flags &= 0x01; /* SCHED_FLAG_RESET_ON_FORK is kept; the other flags ask for changes */
    a.runtime = (uint64_t)us * 1000;
    return syscall(SYS_sched_setattr, 0, &a, 0u) == 0;
#else
    (void)us;
    return false;
#endif
}

int64_t thread_slice(pid_t tid)
{
    sched_attr_v0 a;
    if (!thread_sched_attr(tid, &a) || (a.policy != SCHED_OTHER && a.policy != SCHED_BATCH))
        return 0;
    return (int64_t)(a.runtime / 1000);
}

void thread_join(pthread_t thread) { pthread_join(thread, NULL); }

void thread_mutex_init(pthread_mutex_t *m) { pthread_mutex_init(m, NULL); }

void thread_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(c, &attr);
    pthread_condattr_destroy(&attr);
}

bool thread_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ns)
{
    if (deadline_ns == TD_DEADLINE_NONE) {
        pthread_cond_wait(c, m);
        return true;
    }
    struct timespec ts = deadline_timespec(deadline_ns);
    return pthread_cond_timedwait(c, m, &ts) != ETIMEDOUT;
}

td_status thread_set_name(const char *name)
{
    if (!name)
        return error_fmt(TD_ERR_INVALID, "thread name must not be NULL");
    char buf[16];
    snprintf(buf, sizeof buf, "%s", name);
    int rc = pthread_setname_np(pthread_self(), buf);
    if (rc != 0) {
        errno = rc;
        return error_errno(TD_ERR_IO, "pthread_setname_np(%s)", buf);
    }
    return TD_OK;
}

td_status thread_get_name(char *out, size_t size)
{
    char buf[16];
    int rc = pthread_getname_np(pthread_self(), buf, sizeof buf);
    if (rc != 0) {
        errno = rc;
        return error_errno(TD_ERR_IO, "pthread_getname_np");
    }
    snprintf(out, size, "%s", buf);
    return TD_OK;
}

bool thread_name_of(pid_t tid, char *out, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    FILE *f = fopen(path, "re");
    bool ok = f && fgets(out, (int)size, f);
    if (f)
        fclose(f);
    if (!ok)
        snprintf(out, size, "?");
    out[strcspn(out, "\n")] = '\0';
    return ok;
}

int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

pid_t thread_process_id(void) { return getpid(); }

static __thread thread_block_hook tl_block_hook;
static __thread void *tl_block_ctx;

void thread_set_block_hook(thread_block_hook fn, void *ctx)
{
    tl_block_hook = fn;
    tl_block_ctx = ctx;
}

void thread_blocking(bool blocked)
{
    if (tl_block_hook)
        tl_block_hook(tl_block_ctx, blocked);
}
