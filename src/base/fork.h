/* Internal fork-safety helpers.
 *
 * A forked child has a copy of its parent's memory but only the thread that called fork: objects
 * that own threads (a process group's workers, an RPC agent, a pool) would wait forever on threads
 * that are not there, and locks another thread held at fork stay locked. Such objects embed a
 * td_fork_guard taken at creation and call fork_guard_check at each entry point, which turns
 * that deadlock into a clear error in the child:
 *
 *   if (fork_guard_check(&pg->guard, "process group") != TD_OK) return TD_ERR_UNSUPPORTED;
 *
 * Objects that can be rebuilt after fork (locks and caches with no threads) compare
 * fork_generation() instead and re-initialize themselves. */
#ifndef TDIST_BASE_FORK_H
#define TDIST_BASE_FORK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/status.h>

typedef struct td_fork_guard {
    pid_t pid; /* the process that created the object */
} td_fork_guard;

void fork_guard_init(td_fork_guard *g);
/* TD_OK in the creating process; in a forked child TD_ERR_UNSUPPORTED with "Unable to use <what>
 * in a forked child process (pid N): it was created in process M before fork, and its threads do
 * not survive fork. Create it in the child, or start the child with the spawn start method." */
td_status fork_guard_check(const td_fork_guard *g, const char *what);
/* Whether fork_guard_check passes, inline for hot paths. */
extern _Atomic pid_t fork_pid; /* this process's (fork.c) */
static inline bool fork_guard_ok(const td_fork_guard *g)
{
    return g->pid == atomic_load_explicit(&fork_pid, memory_order_relaxed);
}

/* A counter incremented in every child right after fork (pthread_atfork), so objects can tell
 * cheaply whether they were inherited. */
uint64_t fork_generation(void);

#endif
