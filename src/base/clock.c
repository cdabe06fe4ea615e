/* CLOCK_MONOTONIC time and the deadline arithmetic every blocking call in tdist uses. */
#include "base/clock.h"

#include <errno.h>
#include <stdatomic.h>

int64_t clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t clock_coarse_ns(void)
{
    static _Atomic int64_t tick_ns; /* the coarse clock's resolution, read once */
    int64_t tick = atomic_load_explicit(&tick_ns, memory_order_relaxed);
    if (tick == 0) {
        struct timespec res;
        if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0)
            return clock_now_ns();
        tick = (int64_t)res.tv_sec * 1000000000 + res.tv_nsec;
        atomic_store_explicit(&tick_ns, tick, memory_order_relaxed);
    }
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
        return clock_now_ns();
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + tick;
}

int64_t clock_wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t deadline_at(int64_t now_ns, int64_t timeout_ms)
{
    if (timeout_ms <= 0 || timeout_ms >= INT64_MAX / 2000000)
        return TD_DEADLINE_NONE;
    return now_ns + timeout_ms * 1000000;
}

int64_t deadline_after_ms(int64_t timeout_ms)
{
    if (timeout_ms <= 0 || timeout_ms >= INT64_MAX / 2000000)
        return TD_DEADLINE_NONE;
    return deadline_at(clock_now_ns(), timeout_ms);
}

bool deadline_passed(int64_t deadline_ns)
{
    return deadline_ns != TD_DEADLINE_NONE && clock_now_ns() >= deadline_ns;
}

int64_t deadline_left_ms(int64_t deadline_ns)
{
    if (deadline_ns == TD_DEADLINE_NONE)
        return INT64_MAX;
    int64_t left = deadline_ns - clock_now_ns();
    return left <= 0 ? 0 : (left + 999999) / 1000000;
}

int deadline_poll_ms(int64_t deadline_ns)
{
    if (deadline_ns == TD_DEADLINE_NONE)
        return -1;
    int64_t left = deadline_left_ms(deadline_ns);
    return left > INT32_MAX ? INT32_MAX : (int)left;
}

struct timespec deadline_timespec(int64_t deadline_ns)
{
    struct timespec ts;
    if (deadline_ns == TD_DEADLINE_NONE)
        deadline_ns = clock_now_ns() + (int64_t)3600 * 24 * 365 * 1000000000;
    ts.tv_sec = deadline_ns / 1000000000;
    ts.tv_nsec = deadline_ns % 1000000000;
    return ts;
}

void clock_sleep_ns(int64_t ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void clock_sleep_ms(int64_t ms) { clock_sleep_ns(ms * 1000000); }
