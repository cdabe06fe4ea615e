/* Internal thread helpers: named threads, monotonic condition variables, deadline waits.
 *
 * Every thread tdist starts is named (visible in top, gdb and the harness's stack dumps) and is
 * joined by its owner; the library never leaves a detached thread running. */
#ifndef TDIST_BASE_THREAD_H
#define TDIST_BASE_THREAD_H

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/status.h>

/* The real-time signal the test harness sends to every thread of a hung rank to collect its
 * stack (src/testing/stacks.c); thread_start leaves it unblocked. */
#define TD_STACK_DUMP_SIGNAL (SIGRTMIN + 5)

/* Starts fn(arg) on a new thread named `name` (at most 15 characters are kept). Signals are
 * blocked on the new thread so that they are delivered to the application's threads, except the
 * synchronous fault signals (so a crash on it prints its backtrace) and TD_STACK_DUMP_SIGNAL. */
td_status thread_start(pthread_t *thread, const char *name, void *(*fn)(void *), void *arg);
void thread_join(pthread_t thread);

void thread_mutex_init(pthread_mutex_t *m);
/* A condition variable on CLOCK_MONOTONIC, for thread_cond_wait_until. */
void thread_cond_init(pthread_cond_t *c);
/* Waits until signalled or the deadline (base/clock.h) passes; false on timeout. Spurious wakeups
 * return true: callers re-check their predicate in a loop. */
bool thread_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ns);

/* Sets / reads the calling thread's name (Linux keeps 15 characters plus the NUL). */
td_status thread_set_name(const char *name);
td_status thread_get_name(char *out, size_t size);
/* The name of this process's thread `tid` (from /proc/self/task/TID/comm); false, with out set to
 * "?", when there is no such thread (any more). */
bool thread_name_of(pid_t tid, char *out, size_t size);

/* Blocking notices. A thread that others count on to make progress (an RPC pool's thread) installs
 * a hook; tdist's own waits (td_future_wait and the like) call thread_blocking(true) before they
 * sleep and thread_blocking(false) once they return, so that the pool can let another thread take
 * the work this one would have taken. Without a hook, thread_blocking does nothing. */
typedef void (*thread_block_hook)(void *ctx, bool blocked);
void thread_set_block_hook(thread_block_hook fn, void *ctx);
void thread_blocking(bool blocked);

/* Asks the scheduler to run the calling thread in slices of at most `us` microseconds (Linux 6.12
 * and later, EEVDF's custom slice: sched_setattr's sched_runtime on a SCHED_OTHER or SCHED_BATCH
 * thread, no privilege needed; the kernel clamps it to 100 us..100 ms). A thread with a short slice
 * gets an early deadline, so when it wakes it preempts a thread that is computing instead of
 * waiting for that thread's slice (1.4 ms on a 2-CPU machine) to run out. For the threads that
 * move collectives while the application computes. The policy and nice value are kept. False where
 * the kernel has no such call or refuses it; older kernels accept and ignore it. */
bool thread_request_slice(int64_t us);
/* The scheduler slice of thread `tid` (0: the calling thread) in microseconds: the one it asked
 * for, or the kernel's default (a new thread inherits its creator's); 0 where it cannot tell. */
int64_t thread_slice(pid_t tid);

/* The number of threads in this process (from /proc/self/task), for leak checks. */
int thread_count(void);

/* Process identity for fork safety: objects record thread_process_id() at creation and refuse to be
 * used from a forked child, whose id differs. */
pid_t thread_process_id(void);

#endif
