/* td_future (tdist/future.h): completion once, waits with timeouts, errors and their types,
 * sticky failures, callbacks (their order and threads), then-chaining with type propagation,
 * wait_all's early exit, collect_all, and the callback executor's lifetime. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "pg/future.h"
#include "pg/pg_impl.h"
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
    /* The wait ends when f completes; its callback runs on the executor after that, in its own
     * time: let it log first, so that entry 0 is f's and entry 1 the all_reduce's. */
    for (int i = 0; i < 5000 && log_count(&l) < 1; i++)
        sleep_ms(2);
    TD_CHECK_EQ(log_count(&l), 1);

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
    /* collect_all counts down in callbacks, here on the executor thread. */
    td_future *later = td_future_new();
    td_future *pair[2] = {w, later};
    td_future *both = td_future_collect_all(pair, 2);
    TD_CHECK(!td_future_is_completed(both));
    TD_CHECK_EQ(pthread_create(&th, NULL, complete_later, later), 0);
    TD_CHECK_OK(td_future_wait(both, 10000));
    pthread_join(th, NULL);
    TD_CHECK_OK(td_future_wait_all(pair, 2, 10000));
    TD_CHECK_STR_EQ(td_value_get_string(td_future_value(later), NULL), "done");
    td_future_release(both);
    td_future_release(later);
    td_future_release(w);
    td_future_release(f);
    td_tensor_release(t);
    pg_test_done(ctx, pg); /* the harness then checks that no thread is left */
}

/* ---- completing futures from another thread --------------------------------------------------- */

/* One completion: a result (status TD_OK, value) or a typed failure. */
typedef struct completion {
    td_future *f;
    td_status status;
    const char *type;
    const char *message;
    int64_t value;
} completion;

typedef struct completer {
    pthread_t thread;
    completion *items;
    int n;
} completer;

static void *completer_main(void *p)
{
    completer *c = p;
    for (int i = 0; i < c->n; i++) {
        completion *it = &c->items[i];
        if (it->status == TD_OK)
            td_future_set_result(it->f, td_value_int(it->value));
        else
            td_future_set_typed_error(it->f, it->status, it->type, "%s", it->message);
        td_future_release(it->f);
    }
    return NULL;
}

/* Completes items[0..n) in order on a new thread, which holds its own reference to each future
 * (so the caller may release its own). */
static bool completer_start(completer *c, completion *items, int n)
{
    c->items = items;
    c->n = n;
    for (int i = 0; i < n; i++)
        td_future_retain(items[i].f);
    return pthread_create(&c->thread, NULL, completer_main, c) == 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

TD_TEST(future_typed_errors)
{
    td_future *f = td_future_new();
    TD_CHECK(td_future_error_type(f) == NULL);
    TD_CHECK(td_future_error_type(NULL) == NULL);
    TD_CHECK_ERR(td_future_set_typed_error(NULL, TD_ERR_REMOTE, "ValueError", "x"), TD_ERR_INVALID, "NULL");

    /* Failed from another thread while this one waits. */
    completion c1[] = {{f, TD_ERR_REMOTE, "ValueError", "Expected error", 0}};
    completer th;
    TD_CHECK(completer_start(&th, c1, 1));
    TD_CHECK_ERR(td_future_wait(f, 10000), TD_ERR_REMOTE, "Expected error");
    pthread_join(th.thread, NULL);
    TD_CHECK_STR_EQ(td_future_error_type(f), "ValueError");
    TD_CHECK_STR_EQ(td_future_error(f), "Expected error");
    TD_CHECK_EQ(td_future_status(f), TD_ERR_REMOTE);

    /* A second completion, of any kind, fails and changes nothing. */
    TD_CHECK_ERR(td_future_set_typed_error(f, TD_ERR_IO, "TypeError", "late %d", 2), TD_ERR_ALREADY,
                 "completes exactly once");
    TD_CHECK_ERR(td_future_set_error(f, TD_ERR_IO, "late"), TD_ERR_ALREADY, "completes exactly once");
    TD_CHECK_ERR(td_future_set_result(f, td_value_int(1)), TD_ERR_ALREADY, "completes exactly once");
    TD_CHECK_STR_EQ(td_future_error_type(f), "ValueError");
    TD_CHECK_STR_EQ(td_future_error(f), "Expected error");
    TD_CHECK_EQ(td_future_status(f), TD_ERR_REMOTE);
    TD_CHECK(td_future_value(f) == NULL);

    /* Failures without a type are RuntimeErrors; successes and pending futures have no type. */
    td_future *plain = td_future_new();
    TD_CHECK_OK(td_future_set_error(plain, TD_ERR_IO, "disk %s", "gone"));
    TD_CHECK_STR_EQ(td_future_error_type(plain), "RuntimeError");
    td_future *failed = td_future_failed(TD_ERR_PEER_LOST, "worker1 died");
    TD_CHECK_STR_EQ(td_future_error_type(failed), "RuntimeError");
    td_future *untyped = td_future_new();
    TD_CHECK_OK(td_future_set_typed_error(untyped, TD_ERR_REMOTE, NULL, "no type"));
    TD_CHECK_STR_EQ(td_future_error_type(untyped), "RuntimeError");
    td_future *empty = td_future_new();
    TD_CHECK_OK(td_future_set_typed_error(empty, TD_OK, "", "status OK is not a failure code"));
    TD_CHECK_STR_EQ(td_future_error_type(empty), "RuntimeError");
    TD_CHECK_EQ(td_future_status(empty), TD_ERR_INTERNAL);
    td_future *ok = td_future_completed(td_value_int(3));
    TD_CHECK(td_future_error_type(ok) == NULL);
    /* A user type name is kept as given, and a released typed future's pooled successor has none. */
    td_future *custom = td_future_new();
    TD_CHECK_OK(td_future_set_typed_error(custom, TD_ERR_REMOTE, "CustomException", "custom"));
    TD_CHECK_STR_EQ(td_future_error_type(custom), "CustomException");
    td_future_release(custom);
    td_future *reused = td_future_new();
    TD_CHECK(td_future_error_type(reused) == NULL);
    TD_CHECK_OK(td_future_set_error(reused, TD_ERR_IO, "again"));
    TD_CHECK_STR_EQ(td_future_error_type(reused), "RuntimeError");

    td_future *all[] = {f, plain, failed, untyped, empty, ok, reused};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_future_release(all[i]);
}

/* Errors are sticky (spec C7, test_future_wait_twice): 20 calls fail with ValueError; wait_all
 * returns the error, and then every wait on every future returns the same code, message and type,
 * each time, whatever the thread's message was in between. */
TD_TEST(future_errors_sticky)
{
    enum { N = 20 };
    td_future *fs[N];
    completion items[N];
    for (int i = 0; i < N; i++) {
        fs[i] = td_future_new();
        items[i] = (completion){fs[i], TD_ERR_REMOTE, "ValueError", "Expected error", 0};
    }
    completer th;
    TD_CHECK(completer_start(&th, items, N));
    TD_CHECK_ERR(td_future_wait_all(fs, N, 10000), TD_ERR_REMOTE, "Expected error");
    pthread_join(th.thread, NULL);
    for (int i = 0; i < N; i++) {
        for (int round = 0; round < 2; round++) {
            TD_CHECK_EQ(td_future_wait(fs[i], 10000), TD_ERR_REMOTE);
            TD_CHECK_STR_EQ(td_last_error(), "Expected error");
            TD_CHECK_STR_EQ(td_future_error_type(fs[i]), "ValueError");
            error_fmt(TD_ERR_INVALID, "something else failed meanwhile");
        }
    }
    TD_CHECK_ERR(td_future_wait_all(fs, N, 0), TD_ERR_REMOTE, "Expected error");
    TD_CHECK_ERR(td_future_wait_all(fs, N, 0), TD_ERR_REMOTE, "Expected error");
    for (int i = 0; i < N; i++)
        td_future_release(fs[i]);
}

/* ---- callback order ------------------------------------------------------------------------- */

typedef struct order_log {
    pthread_mutex_t mu;
    int ids[32];
    pthread_t threads[32];
    int n;
} order_log;

typedef struct order_entry {
    order_log *log;
    int id;
} order_entry;

static void order_record(order_log *l, int id)
{
    pthread_mutex_lock(&l->mu);
    if (l->n < 32) {
        l->threads[l->n] = pthread_self();
        l->ids[l->n++] = id;
    }
    pthread_mutex_unlock(&l->mu);
}

static void order_cb(td_future *f, void *arg)
{
    (void)f;
    order_entry *e = arg;
    order_record(e->log, e->id);
}

static td_status order_then(td_future *parent, void *arg, td_value **result)
{
    order_entry *e = arg;
    order_record(e->log, e->id);
    if (td_future_status(parent) != TD_OK)
        return td_future_propagate_error(parent);
    *result = td_value_int(e->id);
    return TD_OK;
}

TD_TEST(future_callback_order)
{
    enum { N = 12 };
    order_log l = {.mu = PTHREAD_MUTEX_INITIALIZER};
    order_entry e[N + 1];
    td_future *children[N];
    td_future *f = td_future_new();
    /* Plain callbacks and then() functions, interleaved, run in the order they were added. */
    for (int i = 0; i < N; i++) {
        e[i] = (order_entry){&l, i};
        children[i] = NULL;
        if (i % 3 == 2)
            children[i] = td_future_then(f, order_then, &e[i]);
        else
            td_future_add_callback(f, order_cb, &e[i]);
    }
    TD_CHECK_EQ(l.n, 0);
    completion items[] = {{f, TD_OK, NULL, NULL, 5}};
    completer th;
    TD_CHECK(completer_start(&th, items, 1));
    pthread_join(th.thread, NULL); /* no executor: the callbacks ran in the completing thread */
    TD_CHECK_EQ(l.n, N);
    for (int i = 0; i < N; i++) {
        TD_CHECK_EQ(l.ids[i], i);
        TD_CHECK(pthread_equal(l.threads[i], th.thread));
    }
    for (int i = 2; i < N; i += 3) {
        TD_CHECK_OK(td_future_wait(children[i], 0));
        TD_CHECK_EQ(td_value_get_int(td_future_value(children[i])), i);
        td_future_release(children[i]);
    }
    /* Added to a completed future: runs at once, in this thread, after the others. */
    e[N] = (order_entry){&l, N};
    td_future_add_callback(f, order_cb, &e[N]);
    TD_CHECK_EQ(l.n, N + 1);
    TD_CHECK_EQ(l.ids[N], N);
    TD_CHECK(pthread_equal(l.threads[N], pthread_self()));
    td_future_release(f);
}

/* ---- then() and error types ----------------------------------------------------------------- */

static td_status pass_on(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    if (td_future_status(parent) != TD_OK)
        return td_future_propagate_error(parent);
    *result = td_value_int(td_value_get_int(td_future_value(parent)) * 2);
    return TD_OK;
}

static td_status pass_on_with_context(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    (void)result;
    td_status st = td_future_propagate_error(parent);
    return st == TD_OK ? TD_OK : error_prefix(st, "in step 2");
}

/* Copies the parent's code and message by hand: that is a new failure, a RuntimeError. */
static td_status copy_by_hand(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    (void)result;
    return error_set(td_future_status(parent), td_future_error(parent));
}

/* Notes a propagation, then fails differently: the child is a RuntimeError. */
static td_status propagate_then_fail(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    (void)result;
    td_future_propagate_error(parent);
    return error_fmt(TD_ERR_INVALID, "a different failure");
}

TD_TEST(future_then_error_types)
{
    td_future *parent = td_future_new();
    td_future *c1 = td_future_then(parent, pass_on, NULL);
    td_future *c2 = td_future_then(c1, pass_on, NULL);
    td_future *c3 = td_future_then(c2, pass_on, NULL);
    td_future *with_context = td_future_then(parent, pass_on_with_context, NULL);
    td_future *by_hand = td_future_then(parent, copy_by_hand, NULL);
    td_future *other = td_future_then(parent, propagate_then_fail, NULL);
    td_future *own = td_future_then(parent, fail_with, NULL);
    completion items[] = {
        {parent, TD_ERR_REMOTE, "TypeError", "my_function() missing 1 required positional argument: 'c'", 0}};
    completer th;
    TD_CHECK(completer_start(&th, items, 1));
    TD_CHECK_ERR(td_future_wait(c3, 10000), TD_ERR_REMOTE, "missing 1 required positional argument");
    pthread_join(th.thread, NULL);
    td_future *chain[] = {c1, c2, c3};
    for (int i = 0; i < 3; i++) {
        TD_CHECK_STR_EQ(td_future_error_type(chain[i]), "TypeError");
        TD_CHECK_STR_EQ(td_future_error(chain[i]), td_future_error(parent));
        TD_CHECK_EQ(td_future_status(chain[i]), TD_ERR_REMOTE);
    }
    TD_CHECK_ERR(td_future_wait(with_context, 0), TD_ERR_REMOTE, "in step 2: my_function() missing");
    TD_CHECK_STR_EQ(td_future_error_type(with_context), "TypeError");
    TD_CHECK_ERR(td_future_wait(by_hand, 0), TD_ERR_REMOTE, "missing 1 required");
    TD_CHECK_STR_EQ(td_future_error_type(by_hand), "RuntimeError");
    TD_CHECK_ERR(td_future_wait(other, 0), TD_ERR_INVALID, "a different failure");
    TD_CHECK_STR_EQ(td_future_error_type(other), "RuntimeError");
    TD_CHECK_ERR(td_future_wait(own, 0), TD_ERR_INVALID, "then failed on purpose");
    TD_CHECK_STR_EQ(td_future_error_type(own), "RuntimeError");

    /* Success flows through the same functions; propagating a success notes nothing. */
    td_future *good = td_future_completed(td_value_int(5));
    TD_CHECK_OK(td_future_propagate_error(good));
    td_future *g1 = td_future_then(good, pass_on, NULL);
    td_future *g2 = td_future_then(g1, pass_on, NULL);
    TD_CHECK_OK(td_future_wait(g2, 0));
    TD_CHECK_EQ(td_value_get_int(td_future_value(g2)), 20);
    TD_CHECK_ERR(td_future_propagate_error(NULL), TD_ERR_INVALID, "NULL");

    /* A note made outside a then() function does not type a later then() child that fails with
     * the same code. */
    td_future *typed_invalid = td_future_new();
    td_future_set_typed_error(typed_invalid, TD_ERR_INVALID, "ValueError", "noted");
    TD_CHECK_EQ(td_future_propagate_error(typed_invalid), TD_ERR_INVALID);
    td_future *fresh = td_future_then(good, fail_with, NULL);
    TD_CHECK_ERR(td_future_wait(fresh, 0), TD_ERR_INVALID, "then failed on purpose");
    TD_CHECK_STR_EQ(td_future_error_type(fresh), "RuntimeError");

    td_future *all[] = {parent, c1, c2, c3, with_context, by_hand, other, own, good, g1, g2, typed_invalid, fresh};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_future_release(all[i]);
}

/* ---- wait_all ------------------------------------------------------------------------------- */

TD_TEST(future_wait_all_early_exit)
{
    TD_CHECK_OK(td_future_wait_all(NULL, 0, 0));
    TD_CHECK_ERR(td_future_wait_all(NULL, 1, 0), TD_ERR_INVALID, "NULL");
    TD_CHECK_ERR(td_future_wait_all(NULL, -1, 0), TD_ERR_INVALID, "negative");
    td_future *with_null[2] = {td_future_completed(NULL), NULL};
    TD_CHECK_ERR(td_future_wait_all(with_null, 2, 0), TD_ERR_INVALID, "future 1 is NULL");
    td_future_release(with_null[0]);

    /* Several failed already: the first in index order. */
    td_future *done[3] = {td_future_completed(td_value_int(1)), td_future_failed(TD_ERR_IO, "first"),
                          td_future_failed(TD_ERR_REMOTE, "second")};
    TD_CHECK_ERR(td_future_wait_all(done, 3, 0), TD_ERR_IO, "first");

    /* A failure ends the wait at once, although earlier and later futures stay pending (no
     * timeout: a wait for all of them would never end). */
    enum { N = 20 };
    td_future *fs[N];
    for (int i = 0; i < N; i++)
        fs[i] = td_future_new();
    td_future *mixed[2] = {fs[0], done[1]};
    TD_CHECK_ERR(td_future_wait_all(mixed, 2, 0), TD_ERR_IO, "first");
    TD_CHECK(!td_future_is_completed(fs[0]));
    /* The same with the failure arriving from another thread while this one waits, with few
     * futures (waiters on the stack) and many (on the heap). */
    int sizes[2] = {3, N};
    for (int k = 0; k < 2; k++) {
        int n = sizes[k], bad = n - 2;
        completion items[] = {{fs[bad], TD_ERR_REMOTE, "ValueError", "Expected error", 0}};
        completer th;
        int64_t t0 = now_ms();
        TD_CHECK(completer_start(&th, items, 1));
        TD_CHECK_ERR(td_future_wait_all(fs, n, 60000), TD_ERR_REMOTE, "Expected error");
        TD_CHECK(now_ms() - t0 < 30000);
        pthread_join(th.thread, NULL);
        for (int i = 0; i < n; i++)
            TD_CHECK_EQ(td_future_is_completed(fs[i]), i == bad);
        /* Released after completing: a new future from the pool for the next round. */
        td_future_release(fs[bad]);
        fs[bad] = td_future_new();
    }
    /* The waits above left nothing behind in the futures they watched: completing them now (under
     * ASan) touches no freed waiter. */
    completion items[N];
    for (int i = 0; i < N; i++)
        items[i] = (completion){fs[N - 1 - i], TD_OK, NULL, NULL, N - 1 - i};
    completer th;
    TD_CHECK(completer_start(&th, items, N));
    TD_CHECK_OK(td_future_wait_all(fs, N, 60000)); /* completed in reverse order: all succeeded */
    pthread_join(th.thread, NULL);
    for (int i = 0; i < N; i++)
        TD_CHECK_EQ(td_value_get_int(td_future_value(fs[i])), i);

    /* The timeout covers the whole wait. */
    td_future *p[3] = {fs[0], td_future_new(), td_future_new()};
    int64_t t0 = now_ms();
    TD_CHECK_ERR(td_future_wait_all(p, 3, 50), TD_ERR_TIMEOUT, "Timed out after 50 ms");
    TD_CHECK_CONTAINS(td_last_error(), "2 of 3 still pending");
    int64_t took = now_ms() - t0;
    TD_CHECK_MSG(took >= 45 && took < 5000, "wait_all(50 ms) took %lld ms", (long long)took);
    td_future_release(p[1]);
    td_future_release(p[2]);
    for (int i = 0; i < N; i++)
        td_future_release(fs[i]);
    for (int i = 0; i < 3; i++)
        td_future_release(done[i]);
}

/* A backend without its own progress thread gives its futures a driver; wait_all calls it. */
static td_future *_Atomic g_driven;
static atomic_int g_drive_calls;

static bool drive_third_time(void)
{
    if (atomic_fetch_add(&g_drive_calls, 1) + 1 == 3) {
        td_future *f = atomic_exchange(&g_driven, NULL);
        if (f)
            td_future_set_result(f, td_value_int(33));
    }
    return true;
}

TD_TEST(future_wait_all_drives)
{
    td_future *driven = td_future_new();
    atomic_store(&g_drive_calls, 0);
    atomic_store(&g_driven, driven);
    pg_future_set_driver(driven, drive_third_time);
    td_future *fs[2] = {td_future_completed(NULL), driven};
    TD_CHECK_OK(td_future_wait_all(fs, 2, 60000));
    TD_CHECK(atomic_load(&g_drive_calls) >= 3);
    TD_CHECK_EQ(td_value_get_int(td_future_value(driven)), 33);
    td_future_release(fs[0]);
    td_future_release(driven);
}

/* ---- collect_all ---------------------------------------------------------------------------- */

TD_TEST(future_collect_all)
{
    td_future *none = td_future_collect_all(NULL, 0);
    TD_CHECK(td_future_is_completed(none));
    TD_CHECK_OK(td_future_wait(none, 0));
    TD_CHECK(td_future_value(none) == NULL);
    td_future *neg = td_future_collect_all(NULL, -1);
    TD_CHECK_ERR(td_future_wait(neg, 0), TD_ERR_INVALID, "negative");
    td_future *holes[2] = {none, NULL};
    td_future *bad = td_future_collect_all(holes, 2);
    TD_CHECK_ERR(td_future_wait(bad, 0), TD_ERR_INVALID, "future 1 is NULL");

    /* 30 futures (spec C8's uneven workload), one completed already, some failing: the combined
     * future completes, without an error, only once the last has completed. */
    enum { N = 30 };
    td_future *fs[N];
    completion first[N - 2], last[1];
    for (int i = 0; i < N; i++)
        fs[i] = td_future_new();
    TD_CHECK_OK(td_future_set_result(fs[0], td_value_int(0)));
    for (int i = 1; i < N - 1; i++)
        first[i - 1] = i % 4 == 0 ? (completion){fs[i], TD_ERR_REMOTE, "ValueError", "Expected error", 0}
                                  : (completion){fs[i], TD_OK, NULL, NULL, i};
    last[0] = (completion){fs[N - 1], TD_OK, NULL, NULL, N - 1};
    td_future *all = td_future_collect_all(fs, N);
    /* It holds the inputs: the odd ones are released here, and live on until it completes. */
    td_future *kept[N];
    for (int i = 0; i < N; i++) {
        kept[i] = i % 2 ? NULL : fs[i];
        if (i % 2)
            td_future_release(fs[i]);
    }
    completer th;
    TD_CHECK(completer_start(&th, first, N - 2));
    pthread_join(th.thread, NULL);
    TD_CHECK(!td_future_is_completed(all));
    TD_CHECK_ERR(td_future_wait(all, 20), TD_ERR_TIMEOUT, NULL);
    TD_CHECK(completer_start(&th, last, 1));
    TD_CHECK_OK(td_future_wait(all, 60000));
    pthread_join(th.thread, NULL);
    TD_CHECK_EQ(td_future_status(all), TD_OK);
    TD_CHECK(td_future_value(all) == NULL);
    TD_CHECK(td_future_error_type(all) == NULL);
    for (int i = 0; i < N; i += 2) {
        if (i % 4 == 0 && i > 0) {
            TD_CHECK_ERR(td_future_wait(kept[i], 0), TD_ERR_REMOTE, "Expected error");
            TD_CHECK_STR_EQ(td_future_error_type(kept[i]), "ValueError");
        } else {
            TD_CHECK_OK(td_future_wait(kept[i], 0));
            TD_CHECK_EQ(td_value_get_int(td_future_value(kept[i])), i);
        }
        td_future_release(kept[i]);
    }
    td_future_release(all);
    td_future_release(bad);
    td_future_release(neg);
    td_future_release(none);
}

TD_TEST_MAIN()
