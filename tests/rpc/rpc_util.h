/* Set-up shared by the RPC tests: registering a test binary's functions, and starting the default
 * agent of a rank as rpc_test.py's dist_init does ("worker<rank>", the harness's file store). */
#ifndef TDIST_TESTS_RPC_UTIL_H
#define TDIST_TESTS_RPC_UTIL_H

#include <stddef.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

/* A function a test registers: fn or async_fn, and the arg td_rpc_call_arg gives back. */
typedef struct rpc_test_function {
    const char *name;
    td_rpc_fn fn;
    td_rpc_async_fn async_fn;
    void *arg;
} rpc_test_function;

/* Functions several test binaries register (under the names each binary's tests call):
 * add_ints(a, b): a + b, Python's binding and TypeErrors;
 * callee_id(): the id of the worker running it;
 * raise([type, message]): fails with type (default "ValueError") and message ("Expected error");
 * async_raise(): an async function that raises RuntimeError "Expected error" instead of returning
 * a future. */
td_status rpc_test_add_ints(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
td_status rpc_test_callee_id(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
td_status rpc_test_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
td_future *rpc_test_async_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs);

/* Registers the n functions (a name already registered in this process is kept). */
void rpc_test_register(const rpc_test_function *fns, size_t n);
/* The options dist_init uses: the harness's store URL, everything else default. */
td_rpc_options rpc_test_options(const td_test_ctx *ctx);
/* Starts the default agent as "worker<rank>" with o (NULL: rpc_test_options). */
void rpc_test_init(const td_test_ctx *ctx, const td_rpc_options *o);

#endif
