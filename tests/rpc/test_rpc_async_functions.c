/* Asynchronous RPC functions (spec/rpc_part2.md C7, @rpc.functions.async_execution): the callee's
 * function returns a future and the reply goes when that future completes, without holding a pool
 * thread. The forms the seed uses: a future the function makes itself and completes from a
 * callback (async_add_with_future_ctor), then() chains of 1 and 20 steps (async_add_chained,
 * async_add_chained_multi), an async function calling another on a third worker
 * (async_add_nested), a fan-out of 20 calls completing one future (async_add_multi_fanout), and
 * the failures (raising, returning no future). Also, from the same part of the seed: state kept by a
 * function between calls (test_expected_src), a None result (test_py_no_return_result), heavy
 * functions under stress (test_stress_heavy_rpc), and RPC beside a process group on one
 * init_method in both orders, with a call in flight while the group forms (test_init_pg_then_rpc,
 * test_init_rpc_then_pg, test_deadlock). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/pg.h>
#include <tdist/rpc.h>
#include <tdist/rref.h>
#include <tdist/testing.h>

#include "rpc_util.h"

#define NUM 20
#define STEP 3

static td_value *int_args(int64_t a, int64_t b) { return td_value_tuple_of(2, td_value_int(a), td_value_int(b)); }

/* The worker after this one, in a world of n. */
static td_rpc_dest next_of(td_rpc_call *call, int hops)
{
    td_worker_info me;
    size_t n = 0;
    td_rpc_worker_info(td_rpc_call_agent(call), NULL, &me);
    td_rpc_worker_infos(td_rpc_call_agent(call), NULL, 0, &n);
    return td_rpc_to_id((me.id + hops) % (int64_t)n);
}

/* ---- async_add_with_future_ctor: a future of its own, completed from the nested call's callback */

static void complete_plus_step(td_future *nested, void *arg)
{
    td_future *mine = arg;
    if (td_future_status(nested) != TD_OK)
        td_future_set_typed_error(mine, td_future_status(nested), td_future_error_type(nested), "%s",
                                  td_future_error(nested));
    else
        td_future_set_result(mine, td_value_int(td_value_get_int(td_future_value(nested)) + STEP));
    td_future_release(mine);
}

static td_future *fn_async_add_with_future_ctor(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)kwargs;
    td_future *nested = NULL, *mine = td_future_new();
    if (td_rpc_async(td_rpc_call_agent(call), next_of(call, 1), "add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &nested) !=
        TD_OK) {
        td_future_release(mine);
        return NULL;
    }
    td_future_add_callback(nested, complete_plus_step, td_future_retain(mine));
    td_future_release(nested);
    return mine;
}

/* ---- async_add_chained(_multi): num then() steps, each adding STEP */

static td_status then_plus_step(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    if (td_future_status(parent) != TD_OK)
        return td_future_propagate_error(parent);
    *result = td_value_int(td_value_get_int(td_future_value(parent)) + STEP);
    return TD_OK;
}

static td_future *chained(td_rpc_call *call, const td_value *args, int num)
{
    td_future *f = NULL;
    if (td_rpc_async(td_rpc_call_agent(call), next_of(call, 1), "add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f) != TD_OK)
        return NULL;
    for (int i = 0; i < num; i++) {
        td_future *child = td_future_then(f, then_plus_step, NULL);
        td_future_release(f);
        f = child;
    }
    return f;
}

static td_future *fn_async_add_chained(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)kwargs;
    return chained(call, args, 1);
}

static td_future *fn_async_add_chained_multi(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)kwargs;
    return chained(call, args, NUM);
}

/* async_then_raise: a then() step of the reply's future raises a typed error, which must reach
 * the caller with its type. */
static td_status then_raise(td_future *parent, void *arg, td_value **result)
{
    (void)parent;
    (void)arg;
    (void)result;
    return td_rpc_raise("ValueError", "Expected error in then");
}

static td_future *fn_async_then_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)kwargs;
    td_future *f = NULL;
    if (td_rpc_async(td_rpc_call_agent(call), next_of(call, 1), "add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f) != TD_OK)
        return NULL;
    td_future *child = td_future_then(f, then_raise, NULL);
    td_future_release(f);
    return child;
}

/* ---- async_add_nested: async calling async, on the worker after next */

static td_future *fn_async_add_nested(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)kwargs;
    td_future *f = NULL;
    if (td_rpc_async(td_rpc_call_agent(call), next_of(call, 1), "async_add_chained", args, NULL, TD_RPC_DEFAULT_TIMEOUT,
                     &f) != TD_OK)
        return NULL;
    return f;
}

/* ---- async_add_multi_fanout: NUM calls; a locked counter completes one future with x + NUM * STEP */

typedef struct fanout {
    pthread_mutex_t mu;
    int remaining;
    int64_t sum;
    td_future *ret;
} fanout;

static void fanout_one(td_future *f, void *arg)
{
    fanout *fo = arg;
    pthread_mutex_lock(&fo->mu);
    fo->sum += td_future_status(f) == TD_OK ? td_value_get_int(td_future_value(f)) : -1000000;
    bool last = --fo->remaining == 0;
    pthread_mutex_unlock(&fo->mu);
    if (last) {
        td_future_set_result(fo->ret, td_value_int(fo->sum));
        td_future_release(fo->ret);
        pthread_mutex_destroy(&fo->mu);
        free(fo);
    }
}

static td_future *fn_async_add_multi_fanout(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)kwargs;
    fanout *fo = calloc(1, sizeof *fo);
    pthread_mutex_init(&fo->mu, NULL);
    fo->remaining = NUM;
    fo->ret = td_future_new();
    td_future *ret = td_future_retain(fo->ret);
    /* x + NUM * STEP: the first call adds x to STEP, the others 0 to STEP */
    for (int i = 0; i < NUM; i++) {
        td_value *a = int_args(i == 0 ? td_value_get_int(td_value_at(args, 0)) : 0, STEP);
        td_future *f = NULL;
        if (td_rpc_async(td_rpc_call_agent(call), next_of(call, 1), "add", a, NULL, TD_RPC_DEFAULT_TIMEOUT, &f) != TD_OK)
            f = td_future_failed(TD_ERR_INTERNAL, td_last_error());
        td_value_release(a);
        td_future_add_callback(f, fanout_one, fo);
        td_future_release(f);
    }
    return ret;
}

/* ---- failures ---------------------------------------------------------------------------------- */

/* ---- test_expected_src: state kept between calls, through the registration's arg -------------- */

static td_status fn_set_value(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)kwargs;
    (void)result;
    td_future *value_future = td_rpc_call_arg(call);
    return td_future_set_result(value_future, td_value_retain(td_value_at(args, 0)));
}

static td_status fn_no_result(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = NULL; /* None */
    return TD_OK;
}

/* heavy_rpc: 99 in-place multiply/divide passes over a 100x100 tensor, then 0. */
static td_status fn_heavy_rpc(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_tensor *t = td_value_get_tensor(td_value_at(args, 0));
    float *d = td_tensor_data(t);
    for (int i = 1; i < 100; i++)
        for (int64_t k = 0; k < td_tensor_numel(t); k++) {
            d[k] *= (float)i;
            d[k] /= (float)(i + 1);
        }
    *result = td_value_int(0);
    return TD_OK;
}

static void slow_ms(int ms)
{
    struct timespec d = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&d, NULL);
}

static td_status fn_slow_add(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    slow_ms(1000);
    return rpc_test_add_ints(call, args, kwargs, result);
}

static td_future *g_value_future; /* test_expected_src's VALUE_FUTURE, one per worker process */

static void register_all(void)
{
    if (!g_value_future)
        g_value_future = td_future_new();
    const rpc_test_function fns[] = {
        {"async_add_with_future_ctor", NULL, fn_async_add_with_future_ctor, NULL},
        {"async_add_chained", NULL, fn_async_add_chained, NULL},
        {"async_add_chained_multi", NULL, fn_async_add_chained_multi, NULL},
        {"async_add_nested", NULL, fn_async_add_nested, NULL},
        {"async_add_multi_fanout", NULL, fn_async_add_multi_fanout, NULL},
        {"async_raise", NULL, rpc_test_async_raise, NULL},
        {"async_then_raise", NULL, fn_async_then_raise, NULL},
        {"add", rpc_test_add_ints, NULL, NULL},
        {"set_value", fn_set_value, NULL, g_value_future},
        {"no_result", fn_no_result, NULL, NULL},
        {"heavy_rpc", fn_heavy_rpc, NULL, NULL},
        {"slow_add", fn_slow_add, NULL, NULL},
    };
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
}

static void rpc_up(td_test_ctx *ctx)
{
    register_all();
    rpc_test_init(ctx, NULL);
}

static int64_t call_int(td_test_ctx *ctx, const char *fn, int64_t a, int64_t b)
{
    td_value *args = int_args(a, b), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id((ctx->rank + 1) % ctx->world_size), fn, args, NULL,
                            TD_RPC_DEFAULT_TIMEOUT, &r));
    int64_t v = td_value_get_int(r);
    td_value_release(r);
    td_value_release(args);
    return v;
}

/* ---- tests ------------------------------------------------------------------------------------- */

TD_TEST(async_function_forms, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    int64_t x = ctx->rank + 1;
    TD_CHECK_EQ(call_int(ctx, "async_add_with_future_ctor", x, x), 2 * x + STEP);
    TD_CHECK_EQ(call_int(ctx, "async_add_chained", x, x), 2 * x + STEP);
    TD_CHECK_EQ(call_int(ctx, "async_add_chained_multi", x, 0), x + NUM * STEP);
    TD_CHECK_EQ(call_int(ctx, "async_add_nested", x, x), 2 * x + STEP);
    TD_CHECK_EQ(call_int(ctx, "async_add_multi_fanout", x, 0), x + NUM * STEP);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* The same through remote() (test_async_function_*_remote, test_return_future_remote): the owner
 * keeps what the async function's future completes with; to_here fetches it. */
static int64_t remote_int(td_test_ctx *ctx, const char *fn, int64_t a, int64_t b)
{
    td_value *args = int_args(a, b), *r = NULL;
    td_rref *rref = NULL;
    TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id((ctx->rank + 1) % ctx->world_size), fn, args, NULL,
                              TD_RPC_DEFAULT_TIMEOUT, &rref));
    TD_CHECK_OK(td_rref_to_here(rref, TD_RPC_DEFAULT_TIMEOUT, &r));
    int64_t v = td_value_get_int(r);
    td_value_release(r);
    td_rref_release(rref);
    td_value_release(args);
    return v;
}

TD_TEST(async_function_forms_remote, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    int64_t x = ctx->rank + 1;
    TD_CHECK_EQ(remote_int(ctx, "async_add_with_future_ctor", x, x), 2 * x + STEP);
    TD_CHECK_EQ(remote_int(ctx, "async_add_chained", x, x), 2 * x + STEP);
    TD_CHECK_EQ(remote_int(ctx, "async_add_chained_multi", x, 0), x + NUM * STEP);
    TD_CHECK_EQ(remote_int(ctx, "async_add_nested", x, x), 2 * x + STEP);
    TD_CHECK_EQ(remote_int(ctx, "async_add_multi_fanout", x, 0), x + NUM * STEP);
    /* A raise, in the function or in a then() step: the creation and to_here fail with it. */
    const char *raising[] = {"async_raise", "async_then_raise"};
    for (int i = 0; i < 2; i++) {
        td_value *args = i ? int_args(1, 2) : NULL, *r = NULL;
        td_rref *rref = NULL;
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id((ctx->rank + 1) % ctx->world_size), raising[i], args, NULL,
                                  TD_RPC_DEFAULT_TIMEOUT, &rref));
        td_future *created = td_rref_get_future(rref);
        TD_CHECK_ERR(td_future_wait(created, 0), TD_ERR_REMOTE, i ? "Expected error in then" : "Expected error");
        TD_CHECK_CONTAINS(td_future_error_type(created), i ? "ValueError" : "RuntimeError");
        TD_CHECK_ERR(td_rref_to_here(rref, TD_RPC_DEFAULT_TIMEOUT, &r), TD_ERR_REMOTE,
                     i ? "Expected error in then" : "Expected error");
        td_future_release(created);
        td_rref_release(rref);
        td_value_release(args);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* Twenty async calls of each form in flight at once, served by a pool of one thread: an async
 * function holds no pool thread while its future is pending. Were it held, the pool would have to
 * grow a thread for each pending call (pool.c); a loaded machine that keeps the one thread off
 * its core for RPC_POOL_STALL_MS while calls wait may still get it a helper or two. */
TD_TEST(async_functions_hold_no_thread, .world_size = 3, .timeout_s = 60)
{
    register_all();
    td_rpc_options o = rpc_test_options(ctx);
    o.num_worker_threads = 1;
    rpc_test_init(ctx, &o);
    td_future *fs[NUM];
    td_value *args = int_args(1, 0);
    for (int i = 0; i < NUM; i++)
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id((ctx->rank + 1) % ctx->world_size),
                                 i % 2 ? "async_add_chained_multi" : "async_add_multi_fanout", args, NULL,
                                 TD_RPC_DEFAULT_TIMEOUT, &fs[i]));
    td_value_release(args);
    TD_CHECK_OK(td_future_wait_all(fs, NUM, 30000));
    for (int i = 0; i < NUM; i++) {
        TD_CHECK_EQ(td_value_get_int(td_future_value(fs[i])), 1 + NUM * STEP);
        td_future_release(fs[i]);
    }
    td_value *info = NULL;
    TD_CHECK_OK(td_rpc_debug_info(NULL, &info));
    int64_t pool_size = strtoll(td_value_get_string(td_value_dict_get_str(info, "agent.thread_pool_size"), NULL), NULL, 10);
    TD_CHECK_MSG(pool_size >= 1 && pool_size <= 4, "the pool grew to %lld threads for %d async calls", (long long)pool_size,
                 NUM);
    td_value_release(info);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_async_function_raise / _wrong_return_type: a raise arrives typed; returning no future
 * without raising is a RuntimeError. */
TD_TEST(async_function_raise, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id((ctx->rank + 1) % 2), "async_raise", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT,
                             &f));
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "Expected error");
    TD_CHECK_CONTAINS(td_future_error_type(f), "RuntimeError");
    td_future_release(f);
    /* Raised in a then() step of the future the function returned: the type still arrives. */
    td_value *args = int_args(1, 2);
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id((ctx->rank + 1) % 2), "async_then_raise", args, NULL,
                             TD_RPC_DEFAULT_TIMEOUT, &f));
    td_value_release(args);
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "Expected error in then");
    TD_CHECK_CONTAINS(td_future_error_type(f), "ValueError");
    td_future_release(f);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_expected_src: each worker's predecessor sets its value future through a function. */
TD_TEST(expected_src, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    td_value *args = td_value_tuple_of(1, td_value_int(ctx->rank)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id((ctx->rank + 1) % ctx->world_size), "set_value", args, NULL,
                            TD_RPC_DEFAULT_TIMEOUT, &r));
    td_value_release(args);
    TD_CHECK_OK(td_future_wait(g_value_future, 10000));
    TD_CHECK_EQ(td_value_get_int(td_future_value(g_value_future)), (ctx->rank - 1 + ctx->world_size) % ctx->world_size);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_future_release(g_value_future);
    g_value_future = NULL;
}

/* test_py_no_return_result: a function returning None gives the caller None (NULL). */
TD_TEST(py_no_return_result, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_value *sentinel = td_value_int(7), *r = sentinel; /* must be overwritten */
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id((ctx->rank + 1) % 2), "no_result", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(r != sentinel);
    TD_CHECK(r == NULL || td_value_kind_of(r) == TD_VAL_NONE);
    td_value_release(r);
    td_value_release(sentinel);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_stress_heavy_rpc: 20 heavy calls in flight, every result 0. */
TD_TEST(stress_heavy_rpc, .world_size = 2, .timeout_s = 120)
{
    rpc_up(ctx);
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(100, 100), &t));
    td_value *args = td_value_tuple_of(1, td_value_tensor(t));
    td_future *fs[NUM];
    for (int i = 0; i < NUM; i++)
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id((ctx->rank + 1) % 2), "heavy_rpc", args, NULL, TD_RPC_DEFAULT_TIMEOUT,
                                 &fs[i]));
    TD_CHECK_OK(td_future_wait_all(fs, NUM, 0));
    for (int i = 0; i < NUM; i++) {
        TD_CHECK_EQ(td_value_get_int(td_future_value(fs[i])), 0);
        td_future_release(fs[i]);
    }
    /* The caller's tensor is untouched (the callee worked on its own copy). */
    TD_CHECK_EQ(((float *)td_tensor_data(t))[0], 1.0f);
    td_value_release(args);
    td_tensor_release(t);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- RPC beside a process group on the same init_method ------------------------------------------ */

static td_pg *pg_up(td_test_ctx *ctx, const char *url)
{
    td_pg_options po = TD_PG_OPTIONS_INIT;
    po.backend = "tcp";
    po.init_method = url;
    po.rank = ctx->rank;
    po.world_size = ctx->world_size;
    td_pg *pg = NULL;
    TD_CHECK_OK(td_pg_create(&po, &pg));
    return pg;
}

static void pg_check(td_test_ctx *ctx, td_pg *pg)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(4), 1, &t));
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    TD_CHECK_EQ(((float *)td_tensor_data(t))[3], (float)ctx->world_size);
    td_tensor_release(t);
}

/* Both on the harness's one file store: RPC keeps its keys under a prefix of its own. */
TD_TEST(init_pg_then_rpc, .world_size = 2, .timeout_s = 60)
{
    td_pg *pg = pg_up(ctx, ctx->init_url);
    rpc_up(ctx);
    TD_CHECK_EQ(call_int(ctx, "add", 2, 3), 5);
    pg_check(ctx, pg);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_pg_destroy(pg);
}

TD_TEST(init_rpc_then_pg, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_pg *pg = pg_up(ctx, ctx->init_url);
    TD_CHECK_EQ(call_int(ctx, "add", 2, 3), 5);
    pg_check(ctx, pg);
    td_pg_destroy(pg);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_deadlock: worker1 waits for a slow call to worker2 while worker2's main thread is blocked
 * forming a process group that worker1 joins only after its call returns. */
TD_TEST(deadlock, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        td_value *args = int_args(1, 1), *r = NULL;
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(2), "slow_add", args, NULL, 15000, &r));
        TD_CHECK_EQ(td_value_get_int(r), 2);
        td_value_release(r);
        td_value_release(args);
    }
    char url[1100];
    snprintf(url, sizeof url, "%s_pg", ctx->init_url);
    td_pg *pg = pg_up(ctx, url);
    pg_check(ctx, pg);
    td_pg_destroy(pg);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST_MAIN()
