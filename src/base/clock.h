/* Internal monotonic time and deadlines.
 *
 * Timeouts in tdist are int64 milliseconds; a deadline is an absolute CLOCK_MONOTONIC time in
 * nanoseconds, with TD_DEADLINE_NONE for "no timeout" (a timeout of 0 in stores and groups). */
#ifndef TDIST_BASE_CLOCK_H
#define TDIST_BASE_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define TD_DEADLINE_NONE INT64_MAX

int64_t clock_now_ns(void);
static inline int64_t clock_now_ms(void) { return clock_now_ns() / 1000000; }
/* CLOCK_MONOTONIC read from the kernel's last tick (CLOCK_MONOTONIC_COARSE) plus the tick's length:
 * never earlier than clock_now_ns() at the call, later by at most a tick (1 to 4 ms), and a few times
 * cheaper to read. For stamps that deadlines and the watchdog use at millisecond precision. */
int64_t clock_coarse_ns(void);
/* Wall-clock time in nanoseconds since the epoch, for timestamps shown to people. */
int64_t clock_wall_ns(void);

/* timeout_ms <= 0 means no deadline (the store and group convention). */
int64_t deadline_after_ms(int64_t timeout_ms);
/* The same from a time already read (saves a clock read on hot paths). */
int64_t deadline_at(int64_t now_ns, int64_t timeout_ms);
bool deadline_passed(int64_t deadline_ns);
/* Milliseconds left, rounded up, clamped to [0, INT32_MAX]; -1 for no deadline (poll's "forever"). */
int deadline_poll_ms(int64_t deadline_ns);
/* Milliseconds left (0 when passed); INT64_MAX for no deadline. */
int64_t deadline_left_ms(int64_t deadline_ns);
/* The CLOCK_MONOTONIC timespec for a deadline, for pthread_cond_timedwait on a condition variable
 * made by thread_cond_init (base/thread.h). */
struct timespec deadline_timespec(int64_t deadline_ns);

void clock_sleep_ms(int64_t ms);
void clock_sleep_ns(int64_t ns);

#endif
