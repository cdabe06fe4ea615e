/* td_future (tdist/future.h): completion once, waits with timeouts, errors, callbacks and their
 * threads, then-chaining, wait_all, and the callback executor's lifetime. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "pg_util.h"

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

TD_TEST(future_basics)
{
    td_future *f = td_future_new();
    TD_CHECK(!td_future_is_completed(f));
    TD_CHECK_EQ(td_future_status(f), TD_OK);
    TD_CHECK(td_future_error(f) == NULL);
    TD_CHECK(td_future_value(f) == NULL);
    TD_CHECK_ERR(td_future_wait(f, 50), TD_ERR_TIMEOUT, "Timed out after 50 ms");
    TD_CHECK(!td_future_is_completed(f));
    TD_CHECK_OK(td_future_set_result(f, td_value_int(7)));
    TD_CHECK(td_future_is_completed(f));
    TD_CHECK_ERR(td_future_set_result(f, td_value_int(8)), TD_ERR_ALREADY, "completes exactly once");
    TD_CHECK_ERR(td_future_set_error(f, TD_ERR_IO, "late"), TD_ERR_ALREADY, NULL);
    TD_CHECK_OK(td_future_wait(f, 0));
    TD_CHECK_EQ(td_value_get_int(td_future_value(f)), 7);

    td_future *bad = td_future_failed(TD_ERR_PEER_LOST, "boom");
    TD_CHECK_ERR(td_future_wait(bad, 0), TD_ERR_PEER_LOST, "boom");
    TD_CHECK_STR_EQ(td_future_error(bad), "boom");
    TD_CHECK_EQ(td_future_status(bad), TD_ERR_PEER_LOST);
    TD_CHECK(td_future_value(bad) == NULL);

    td_future *none = td_future_completed(NULL);
    TD_CHECK_OK(td_future_wait(none, 10));
    TD_CHECK(td_future_value(none) == NULL);

    td_future *set[3] = {f, bad, none};
    TD_CHECK_ERR(td_future_wait_all(set, 3, 0), TD_ERR_PEER_LOST, "boom");
    td_future *pending = td_future_new();
    td_future *set2[2] = {f, pending};
    TD_CHECK_ERR(td_future_wait_all(set2, 2, 30), TD_ERR_TIMEOUT, NULL);
    td_future_set_error(pending, TD_ERR_REMOTE, "remote %d", 42);
    TD_CHECK_ERR(td_future_wait(pending, 0), TD_ERR_REMOTE, "remote 42");
    td_future *retained = td_future_retain(f);
    td_future_release(retained);
    td_future_release(pending);
    td_future_release(none);
    td_future_release(bad);
    td_future_release(f);
}

typedef struct cb_log {
    pthread_mutex_t mu;
    int order[8];
    int n;
    pthread_t thread[8];
    char name[8][16];
} cb_log;

static void log_cb(td_future *f, void *arg)
{
    (void)f;
    cb_log *l = arg;
    pthread_mutex_lock(&l->mu);
    if (l->n < 8) {
        l->thread[l->n] = pthread_self();
        pthread_getname_np(pthread_self(), l->name[l->n], sizeof l->name[0]);
        l->order[l->n] = l->n;
        l->n++;
    }
    pthread_mutex_unlock(&l->mu);
}

static int log_count(cb_log *l)
{
    pthread_mutex_lock(&l->mu);
    int n = l->n;
    pthread_mutex_unlock(&l->mu);
    return n;
}

static void *complete_later(void *arg)
{
    sleep_ms(20);
    td_future_set_result(arg, td_value_string("done"));
    return NULL;
}

static td_status plus_one(td_future *parent, void *arg, td_value **result)
{
    (*(int *)arg)++;
    if (td_future_status(parent) != TD_OK)
        return error_set(td_future_status(parent), td_future_error(parent));
    *result = td_value_int(td_value_get_int(td_future_value(parent)) + 1);
    return TD_OK;
}

static td_status fail_with(td_future *parent, void *arg, td_value **result)
{
    (void)parent;
    (void)result;
    (void)arg;
    return error_fmt(TD_ERR_INVALID, "then failed on purpose");
}

TD_TEST(future_callbacks_without_executor)
{
    /* No group exists: callbacks of a pending future run in the thread that completes it. */
    cb_log l = {.mu = PTHREAD_MUTEX_INITIALIZER};
    td_future *f = td_future_new();
    td_future_add_callback(f, log_cb, &l);
    td_future_add_callback(f, log_cb, &l);
    pthread_t th;
    TD_CHECK_EQ(pthread_create(&th, NULL, complete_later, f), 0);
    TD_CHECK_OK(td_future_wait(f, 10000));
    pthread_join(th, NULL);
    TD_CHECK_EQ(log_count(&l), 2);
    TD_CHECK(pthread_equal(l.thread[0], th) && pthread_equal(l.thread[1], th));
    TD_CHECK(l.order[0] == 0 && l.order[1] == 1);
    /* On a completed future the callback runs at once, here. */
    td_future_add_callback(f, log_cb, &l);
    TD_CHECK_EQ(log_count(&l), 3);
    TD_CHECK(pthread_equal(l.thread[2], pthread_self()));

    /* then: results flow, failures propagate, fn always runs once. */
    int calls = 0;
    td_future *p = td_future_new();
    td_future *c1 = td_future_then(p, plus_one, &calls);
    td_future *c2 = td_future_then(c1, plus_one, &calls);
    TD_CHECK(!td_future_is_completed(c2));
    TD_CHECK_OK(td_future_set_result(p, td_value_int(40)));
    TD_CHECK_OK(td_future_wait(c2, 10000));
    TD_CHECK_EQ(td_value_get_int(td_future_value(c2)), 42);
    TD_CHECK_EQ(calls, 2);
    td_future *q = td_future_failed(TD_ERR_TIMEOUT, "too slow");
    td_future *c3 = td_future_then(q, plus_one, &calls);
    TD_CHECK_EQ(calls, 3);
    TD_CHECK_ERR(td_future_wait(c3, 0), TD_ERR_TIMEOUT, "too slow");
    td_future *c4 = td_future_then(f, fail_with, NULL);
    TD_CHECK_ERR(td_future_wait(c4, 0), TD_ERR_INVALID, "then failed on purpose");
    td_future *all[] = {f, p, c1, c2, q, c3, c4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_future_release(all[i]);
}

/* With a group alive, callbacks run on the executor thread; it is joined when the group goes. */
TD_TEST(future_callbacks_on_executor, .world_size = 1, .params = TD_PG_THREAD_BACKENDS, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    cb_log l = {.mu = PTHREAD_MUTEX_INITIALIZER};
    td_future *f = td_future_new();
    td_future_add_callback(f, log_cb, &l);
    pthread_t th;
    TD_CHECK_EQ(pthread_create(&th, NULL, complete_later, f), 0);
    TD_CHECK_OK(td_future_wait(f, 10000));
    pthread_join(th, NULL);

    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(3), &t));
    td_future *w = NULL;
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, &w));
    td_future_add_callback(w, log_cb, &l);
    TD_CHECK_OK(td_future_wait(w, 10000));
    for (int i = 0; i < 5000 && log_count(&l) < 2; i++)
        sleep_ms(2);
    TD_CHECK_EQ(log_count(&l), 2);
    TD_CHECK_STR_EQ(l.name[0], "td-callbacks");
    TD_CHECK(!pthread_equal(l.thread[0], th));
    /* The all_reduce may have completed before the callback was added (then it ran here). */
    TD_CHECK(strcmp(l.name[1], "td-callbacks") == 0 || pthread_equal(l.thread[1], pthread_self()));
    td_future_release(w);
    td_future_release(f);
    td_tensor_release(t);
    pg_test_done(ctx, pg); /* the harness then checks that no thread is left */
}

TD_TEST_MAIN()
