/* Monotonic time and deadlines (base/clock.h) and deadline waits on condition variables
 * (base/thread.h). Bounds are loose on purpose: the machine is shared. */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#include <tdist/testing.h>

#include "base/clock.h"
#include "base/thread.h"

TD_TEST(clock_is_monotonic_and_sleeps_at_least)
{
    int64_t prev = clock_now_ns();
    for (int i = 0; i < 1000; i++) {
        int64_t t = clock_now_ns();
        TD_CHECK(t >= prev);
        prev = t;
    }
    int64_t t0 = clock_now_ns();
    clock_sleep_ms(20);
    TD_CHECK(clock_now_ns() - t0 >= 20 * 1000000LL);
    TD_CHECK(clock_now_ms() >= t0 / 1000000);
    clock_sleep_ns(0);
    clock_sleep_ns(-5);
    int64_t wall = clock_wall_ns() / 1000000000;
    int64_t sys = (int64_t)time(NULL);
    TD_CHECK(wall >= sys - 5 && wall <= sys + 5);
}

TD_TEST(no_deadline)
{
    TD_CHECK_EQ(deadline_after_ms(0), TD_DEADLINE_NONE);
    TD_CHECK_EQ(deadline_after_ms(-1), TD_DEADLINE_NONE);
    TD_CHECK_EQ(deadline_after_ms(INT64_MAX), TD_DEADLINE_NONE);
    TD_CHECK(!deadline_passed(TD_DEADLINE_NONE));
    TD_CHECK_EQ(deadline_poll_ms(TD_DEADLINE_NONE), -1);
    TD_CHECK_EQ(deadline_left_ms(TD_DEADLINE_NONE), INT64_MAX);
    struct timespec ts = deadline_timespec(TD_DEADLINE_NONE);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    TD_CHECK(ts.tv_sec > now.tv_sec + 3600); /* far away, but representable */
}

TD_TEST(deadlines_count_down)
{
    int64_t d = deadline_after_ms(60000);
    TD_CHECK(!deadline_passed(d));
    int64_t left = deadline_left_ms(d);
    TD_CHECK(left > 0 && left <= 60000);
    int p = deadline_poll_ms(d);
    TD_CHECK(p > 0 && p <= 60000);
    struct timespec ts = deadline_timespec(d);
    TD_CHECK_EQ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec, d);

    int64_t soon = deadline_after_ms(10);
    clock_sleep_ms(30);
    TD_CHECK(deadline_passed(soon));
    TD_CHECK_EQ(deadline_left_ms(soon), 0);
    TD_CHECK_EQ(deadline_poll_ms(soon), 0);

    /* poll's int is clamped */
    int64_t far = clock_now_ns() + (int64_t)INT32_MAX * 4 * 1000000;
    TD_CHECK_EQ(deadline_poll_ms(far), INT32_MAX);
    /* a partial millisecond rounds up, so a poll never returns before the deadline */
    int64_t half = clock_now_ns() + 1500000;
    TD_CHECK(deadline_left_ms(half) >= 1);
}

typedef struct waiter {
    pthread_mutex_t m;
    pthread_cond_t c;
    bool flag;
} waiter;

static void *signal_later(void *arg)
{
    waiter *w = arg;
    clock_sleep_ms(20);
    pthread_mutex_lock(&w->m);
    w->flag = true;
    pthread_cond_signal(&w->c);
    pthread_mutex_unlock(&w->m);
    return NULL;
}

TD_TEST(cond_wait_until)
{
    waiter w = {.flag = false};
    thread_mutex_init(&w.m);
    thread_cond_init(&w.c);

    pthread_mutex_lock(&w.m);
    int64_t t0 = clock_now_ns();
    bool signalled = true;
    while (signalled)
        signalled = thread_cond_wait_until(&w.c, &w.m, deadline_after_ms(20)); /* nobody signals */
    TD_CHECK(clock_now_ns() - t0 >= 20 * 1000000LL);
    pthread_mutex_unlock(&w.m);

    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, signal_later, &w), 0);
    pthread_mutex_lock(&w.m);
    int64_t deadline = deadline_after_ms(60000);
    while (!w.flag && thread_cond_wait_until(&w.c, &w.m, deadline)) {
    }
    TD_CHECK(w.flag);
    pthread_mutex_unlock(&w.m);
    pthread_join(t, NULL);
    pthread_cond_destroy(&w.c);
    pthread_mutex_destroy(&w.m);
}
