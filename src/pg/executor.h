/* Internal: the callback executor, the one thread on which future callbacks run.
 *
 * Callbacks must never run on an I/O thread (a backend's progress thread, an RPC agent's reader),
 * so a future completed while the executor is held hands its callbacks to the executor thread.
 * Whatever owns I/O threads (a process group, an RPC agent) holds the executor for its lifetime:
 * the thread starts with the first hold and is stopped, after running what is queued, and joined
 * by the release that drops the last hold. With no holder, no I/O thread exists, so the completing
 * thread is an application thread and runs the callbacks itself. Nothing lingers between tests. */
#ifndef TDIST_PG_EXECUTOR_H
#define TDIST_PG_EXECUTOR_H

#include <stdbool.h>

#include <tdist/status.h>

typedef struct executor_item {
    void (*fn)(void *arg);
    void *arg;
    struct executor_item *next;
} executor_item;

/* Starts the thread if needed. Fails only when the thread cannot be started. */
td_status executor_hold(void);
/* Drops a hold; the last one drains the queue, stops the thread and joins it (unless called from
 * the executor thread itself, which then exits once idle and is joined by the next hold). */
void executor_release(void);
/* Runs a chain of items (linked through next, in order; each freed after it ran): on the executor
 * when it is held, else right here. Takes the items. */
void executor_dispatch(executor_item *items);
/* True on the executor thread. */
bool executor_is_current(void);

#endif
