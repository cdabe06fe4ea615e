/* RPC calls as the seed makes them, across real worker processes: the builtin tensor functions
 * called on another worker (test_add, test_scalar_add, test_nonzero), many futures at once with
 * wait_all and collect_all (test_py_tensors_multi_async_call, _run_uneven_workload), sticky
 * errors (test_future_wait_twice), a future's then() callback that makes an RPC of its own, and
 * tensors inside containers (test_py_tensors_in_container: two references to one tensor arrive as
 * one tensor). Workers are "worker<rank>", the destination of most calls the next rank. */
#include <stdio.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc_util.h"

/* ---- the functions workers call -------------------------------------------------------------- */

/* same_tensor(list): whether items 0 and 1 of the list are one tensor object on the callee. */
static td_status fn_same_tensor(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    if (td_rpc_bind("same_tensor", "pair", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    *result = td_value_bool(td_value_get_tensor(td_value_at(p[0], 0)) == td_value_get_tensor(td_value_at(p[0], 1)));
    return TD_OK;
}

static void rpc_up(td_test_ctx *ctx)
{
    const rpc_test_function fns[] = {{"raise_value_error", rpc_test_raise, NULL, NULL},
                                     {"same_tensor", fn_same_tensor, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    rpc_test_init(ctx, NULL);
}

static td_rpc_dest next_worker(td_test_ctx *ctx) { return td_rpc_to_id((ctx->rank + 1) % ctx->world_size); }

static td_tensor *filled(int64_t n, double v)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(n, n), v, &t));
    return t;
}

/* ---- builtins on another worker ---------------------------------------------------------------- */

TD_TEST(builtin_add_scalar_add_nonzero, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    int64_t n = ctx->rank + 1;
    /* test_add: ones(n, n) + ones(n, n) */
    td_tensor *ones = filled(n, 1), *twos = filled(n, 2);
    td_value *args = td_value_tuple_of(2, td_value_tensor(ones), td_value_tensor(ones)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, next_worker(ctx), "aten::add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(td_tensor_equal(td_value_get_tensor(r), twos));
    td_value_release(r);
    td_value_release(args);
    /* test_scalar_add: ones(n, n) + n, the scalar a Python int */
    td_tensor *expect = filled(n, (double)(1 + n));
    args = td_value_tuple_of(2, td_value_tensor(ones), td_value_int(n));
    TD_CHECK_OK(td_rpc_sync(NULL, next_worker(ctx), "aten::add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(td_tensor_equal(td_value_get_tensor(r), expect));
    td_value_release(r);
    td_value_release(args);
    /* test_nonzero: ones(4, 4) with x[rank][rank] = 0 has 15 nonzero entries, an int64 [15, 2] */
    td_tensor *x = filled(4, 1);
    ((float *)td_tensor_data(x))[ctx->rank * 4 + ctx->rank] = 0;
    args = td_value_tuple_of(1, td_value_tensor(x));
    TD_CHECK_OK(td_rpc_sync(NULL, next_worker(ctx), "aten::nonzero", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    td_tensor *nz = td_value_get_tensor(r);
    TD_CHECK_EQ(td_tensor_dtype(nz), TD_INT64);
    TD_CHECK_EQ(td_tensor_ndim(nz), 2);
    TD_CHECK_EQ(td_tensor_size(nz, 0), 15);
    TD_CHECK_EQ(td_tensor_size(nz, 1), 2);
    td_value_release(r);
    td_value_release(args);
    /* A builtin's own error arrives as a remote RuntimeError with the tensor layer's message. */
    td_tensor *two_by_two = filled(2, 1), *other = filled(3, 1);
    args = td_value_tuple_of(2, td_value_tensor(two_by_two), td_value_tensor(other));
    TD_CHECK_ERR(td_rpc_sync(NULL, next_worker(ctx), "aten::add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r),
                 TD_ERR_REMOTE, "must match the size of tensor b");
    td_value_release(args);
    td_tensor_release(other);
    td_tensor_release(two_by_two);
    td_tensor_release(x);
    td_tensor_release(expect);
    td_tensor_release(twos);
    td_tensor_release(ones);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- many futures ------------------------------------------------------------------------------ */

/* test_py_tensors_multi_async_call: 100 calls in flight, sizes 0..99; wait_all keeps their order. */
TD_TEST(py_tensors_multi_async_call, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    enum { N = 100 };
    td_future *fs[N];
    for (int j = 0; j < N; j++) {
        td_tensor *t = filled(j, 1);
        td_value *args = td_value_tuple_of(2, td_value_tensor(t), td_value_int(2));
        TD_CHECK_OK(td_rpc_async(NULL, next_worker(ctx), "aten::mul", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &fs[j]));
        td_value_release(args);
        td_tensor_release(t);
    }
    TD_CHECK_OK(td_future_wait_all(fs, N, 0));
    for (int j = 0; j < N; j++) {
        td_tensor *expect = filled(j, 2);
        TD_CHECK(td_tensor_equal(td_value_get_tensor(td_future_value(fs[j])), expect));
        td_tensor_release(expect);
        td_future_release(fs[j]);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* collect_all over RPC futures, some failing (_run_uneven_workload collects, then waits each). */
TD_TEST(collect_all_rpc_futures, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    enum { N = 30 };
    td_future *fs[N];
    td_tensor *t = filled(2, 21);
    td_value *args = td_value_tuple_of(2, td_value_tensor(t), td_value_tensor(t));
    td_tensor_release(t);
    for (int j = 0; j < N; j++)
        TD_CHECK_OK(td_rpc_async(NULL, next_worker(ctx), j % 3 == 2 ? "raise_value_error" : "aten::add",
                                 j % 3 == 2 ? NULL : args, NULL,
                                 TD_RPC_DEFAULT_TIMEOUT, &fs[j]));
    td_value_release(args);
    td_future *all = td_future_collect_all(fs, N);
    TD_CHECK_OK(td_future_wait(all, 0));
    for (int j = 0; j < N; j++) {
        TD_CHECK(td_future_is_completed(fs[j]));
        if (j % 3 == 2) {
            TD_CHECK_EQ(td_future_status(fs[j]), TD_ERR_REMOTE);
            TD_CHECK_CONTAINS(td_future_error_type(fs[j]), "ValueError");
        } else {
            TD_CHECK_OK(td_future_status(fs[j]));
        }
        td_future_release(fs[j]);
    }
    td_future_release(all);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_future_wait_twice: 20 failing calls; wait_all fails with the ValueError, and every future
 * fails the same way on each later wait. */
TD_TEST(future_wait_twice, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    enum { N = 20 };
    td_future *fs[N];
    for (int j = 0; j < N; j++)
        TD_CHECK_OK(td_rpc_async(NULL, next_worker(ctx), "raise_value_error", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &fs[j]));
    TD_CHECK_ERR(td_future_wait_all(fs, N, 0), TD_ERR_REMOTE, "Expected error");
    for (int j = 0; j < N; j++) {
        for (int k = 0; k < 2; k++) {
            TD_CHECK_ERR(td_future_wait(fs[j], 0), TD_ERR_REMOTE, "Expected error");
            TD_CHECK_CONTAINS(td_future_error_type(fs[j]), "ValueError");
        }
        td_future_release(fs[j]);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- callbacks that make calls ------------------------------------------------------------------- */

/* then(): with the parent's result, one more RPC, to the worker after the next (async_add_chained
 * and callbacks that issue RPCs). */
static td_status then_add_again(td_future *parent, void *arg, td_value **result)
{
    if (td_future_status(parent) != TD_OK)
        return td_future_propagate_error(parent);
    const int64_t *to = arg;
    td_value *args = td_value_tuple_of(2, td_value_retain(td_future_value(parent)), td_value_int(100));
    td_status st = td_rpc_sync(NULL, td_rpc_to_id(*to), "aten::add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, result);
    td_value_release(args);
    return st;
}

TD_TEST(then_callback_makes_rpc, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    td_tensor *ones = filled(2, 1), *expect = filled(2, 102);
    td_value *args = td_value_tuple_of(2, td_value_tensor(ones), td_value_tensor(ones));
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, next_worker(ctx), "aten::add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    int64_t after_next = (ctx->rank + 2) % ctx->world_size;
    td_future *chained = td_future_then(f, then_add_again, &after_next);
    TD_CHECK_OK(td_future_wait(chained, 0));
    TD_CHECK(td_tensor_equal(td_value_get_tensor(td_future_value(chained)), expect));
    td_future_release(chained);
    td_future_release(f);
    /* A failed parent: the child fails with the parent's error and type. */
    TD_CHECK_OK(td_rpc_async(NULL, next_worker(ctx), "raise_value_error", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    chained = td_future_then(f, then_add_again, &after_next);
    TD_CHECK_ERR(td_future_wait(chained, 0), TD_ERR_REMOTE, "Expected error");
    TD_CHECK_CONTAINS(td_future_error_type(chained), "ValueError");
    td_future_release(chained);
    td_future_release(f);
    td_value_release(args);
    td_tensor_release(expect);
    td_tensor_release(ones);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_callback_none: then() without a function fails its child at once, with the reason. */
TD_TEST(callback_none, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, next_worker(ctx), "raise_value_error", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    td_future *child = td_future_then(f, NULL, NULL);
    TD_CHECK(td_future_is_completed(child));
    TD_CHECK_ERR(td_future_wait(child, 0), TD_ERR_INVALID, "td_future_then: fn is NULL");
    td_future_release(child);
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "Expected error");
    td_future_release(f);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- values ------------------------------------------------------------------------------------ */

/* test_py_tensors_in_container: a list holding one tensor twice arrives holding one tensor twice
 * (the codec keeps identity within a message), on another worker and on oneself. */
TD_TEST(py_tensors_in_container, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_tensor *t = filled(3, 7);
    td_value *pair = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(pair, td_value_tensor(t)));
    TD_CHECK_OK(td_value_list_append(pair, td_value_tensor(t)));
    td_value *args = td_value_tuple_of(1, pair);
    td_rpc_dest dests[2] = {next_worker(ctx), td_rpc_to_id(ctx->rank)};
    for (int d = 0; d < 2; d++) {
        td_value *r = NULL;
        TD_CHECK_OK(td_rpc_sync(NULL, dests[d], "same_tensor", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
        TD_CHECK(td_value_get_bool(r));
        td_value_release(r);
    }
    td_value_release(args);
    td_tensor_release(t);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST_MAIN()
