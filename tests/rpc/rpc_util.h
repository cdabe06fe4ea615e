/* Set-up shared by the RPC tests: registering a test binary's functions, and starting the default
 * agent of a rank as rpc_test.py's dist_init does ("worker<rank>", the harness's file store). */
#ifndef TDIST_TESTS_RPC_UTIL_H
#define TDIST_TESTS_RPC_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdint.h>

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
 * echo(x): x itself;
 * raise([type, message]): fails with type (default "ValueError") and message ("Expected error");
 * async_raise(): an async function that raises RuntimeError "Expected error" instead of returning
 * a future. */
td_status rpc_test_add_ints(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
td_status rpc_test_echo(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
td_status rpc_test_callee_id(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
td_status rpc_test_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result);
td_future *rpc_test_async_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs);

/* n bytes, byte i = (seed + i * 7) mod 251, as a uint8 tensor (a payload whose every byte is
 * checked when it comes back). */
td_tensor *rpc_test_pattern(int64_t n, int seed);

/* How many fds this process has open (-1: /proc/self/fd unreadable), for tests that check that a
 * failed init or a shutdown gives every one back. */
int rpc_test_open_fds(void);

/* Registers the n functions (a name already registered in this process is kept). */
void rpc_test_register(const rpc_test_function *fns, size_t n);
/* The options dist_init uses: the harness's store URL, leaks of RRefs checked at graceful shutdown
 * (dist_init sets _ignore_rref_leak = False for every test), everything else default. */
td_rpc_options rpc_test_options(const td_test_ctx *ctx);
/* Starts the default agent as "worker<rank>" with o (NULL: rpc_test_options). */
void rpc_test_init(const td_test_ctx *ctx, const td_rpc_options *o);

/* ---- RRef helpers (the seed's dist_utils) ------------------------------------------------------ */

/* The default agent, borrowed (valid until td_rpc_shutdown), for the internal test hooks. */
td_rpc_agent *rpc_test_default_agent(void);
/* A counter of td_rpc_debug_info (string values, as _rref_context_get_debug_info's) as a number;
 * fails the test when the key is missing or not a decimal string. */
int64_t rpc_test_debug_int(const char *key);
/* Polls key every 100 ms until it equals want; fails the test after timeout_ms with the last value. */
void rpc_test_wait_debug(const char *key, int64_t want, int64_t timeout_ms);
/* wait_until_pending_futures_and_users_flushed: num_pending_futures and num_pending_users reach 0
 * (polled every 100 ms, 20 s at most). */
void rpc_test_wait_rrefs_flushed(void);
/* wait_until_owners_and_forks_on_rank for this worker: num_owner_rrefs == owners and num_forks ==
 * forks (polled every 100 ms, 20 s at most). */
void rpc_test_wait_owners_and_forks(int64_t owners, int64_t forks);

/* A worker that kills itself for a test: writes the monotonic time to path, then SIGKILLs this
 * process. The survivors learn how long ago that was (fails the test when path is unreadable). */
void rpc_test_die_noting_time(const char *path);
int64_t rpc_test_ms_since_death(const char *path);

/* Sleeps ms milliseconds (resumed after signals); the monotonic clock in seconds. */
void rpc_test_sleep_ms(int64_t ms);
double rpc_test_now_s(void);

#endif
