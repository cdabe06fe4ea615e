/* Fork-safety helpers (fork.h): the guard that objects owning threads check at their entry
 * points, and the fork generation counter that objects rebuildable after fork compare. */
#include "base/fork.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "base/error.h"

static atomic_uint_fast64_t generation;
/* This process's pid, kept current by the fork handler, so that the guard costs a load instead of
 * a getpid system call on every operation. (A raw clone() that bypasses the handler is not
 * supported, as everywhere in tdist.) */
_Atomic pid_t fork_pid;

static void child_after_fork(void)
{
    atomic_store(&fork_pid, getpid());
    atomic_fetch_add(&generation, 1);
}

__attribute__((constructor)) static void fork_register(void)
{
    atomic_store(&fork_pid, getpid());
    pthread_atfork(NULL, NULL, child_after_fork);
}

uint64_t fork_generation(void) { return atomic_load_explicit(&generation, memory_order_relaxed); }

void fork_guard_init(td_fork_guard *g) { g->pid = atomic_load_explicit(&fork_pid, memory_order_relaxed); }

td_status fork_guard_check(const td_fork_guard *g, const char *what)
{
    if (fork_guard_ok(g))
        return TD_OK;
    pid_t self = atomic_load_explicit(&fork_pid, memory_order_relaxed);
    return error_fmt(TD_ERR_UNSUPPORTED,
                    "Unable to use %s in a forked child process (pid %d): it was created in process %d before "
                    "fork, and its threads do not survive fork. Create it in the child, or start the child with "
                    "the spawn start method.",
                    what, (int)self, (int)g->pid);
}
