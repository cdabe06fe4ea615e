/* Internal: what modules that complete futures may do to a td_future beyond tdist/future.h. */
#ifndef TDIST_PG_FUTURE_H
#define TDIST_PG_FUTURE_H

#include <stdbool.h>

#include <tdist/future.h>

/* Gives f a driver, which waiters on f (td_future_wait, wait_all, is_completed) call in a loop
 * while it returns true and f is pending: the progress function of whatever completes f, run on
 * the waiting thread (pg_impl.h, pg_drive_wait_locked). Returning false ends the driving of that
 * wait, which then blocks until a completion. A waiter already blocked picks it up. */
void pg_future_set_driver(td_future *f, bool (*drive)(void));

#endif
