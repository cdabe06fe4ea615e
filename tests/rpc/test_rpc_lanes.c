/* Same-host messages through lanes (rpc/channel.c, agent_impl.h's rpc_cma): every message between
 * two workers of one host is written into the channel's shared segment in entries, read by
 * whichever thread of the reader polls (its I/O thread, an idle pool thread, a td_rpc_sync caller),
 * and the socket only rings a reader that sleeps. Each case runs with lanes (param "lanes") and
 * with TDIST_RPC_LANES=0 (param "socket"), and with single copy off so that large messages go
 * through the lane too: messages of every size around the entry size and the lane's, both
 * directions at once with many calls in flight (several writers and readers of one lane), and
 * calls to a worker whose threads all sleep (the bell). A worker killed while its peers' writers
 * wait for room in its lane is test_rpc_single_copy.killed_worker_mid_transfer/off. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc_util.h"

static bool lanes_param(const td_test_ctx *ctx) { return strcmp(ctx->param, "lanes") == 0; }

static void rpc_up(td_test_ctx *ctx)
{
    setenv("TDIST_RPC_CMA", "0", 1);
    if (!lanes_param(ctx))
        setenv("TDIST_RPC_LANES", "0", 1);
    const rpc_test_function fns[] = {{"echo", rpc_test_echo, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    rpc_test_init(ctx, NULL);
    TD_CHECK_EQ(rpc_test_debug_int("agent.num_lane_channels"), lanes_param(ctx) ? ctx->world_size - 1 : 0);
}

/* n bytes, byte i = (seed + i * 7) mod 251, as a uint8 tensor. */
static td_tensor *pattern(int64_t n, int seed)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty(TD_UINT8, TD_SHAPE(n), &t));
    uint8_t *d = td_tensor_data(t);
    for (int64_t i = 0; i < n; i++)
        d[i] = (uint8_t)((seed + i * 7) % 251);
    return t;
}

static void echo_checked(int to, int64_t n, int seed)
{
    td_tensor *t = pattern(n, seed);
    td_value *args = td_value_tuple_of(1, td_value_tensor(t)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(to), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK_MSG(r && td_tensor_equal(td_value_get_tensor(r), t), "%lld bytes came back different", (long long)n);
    td_value_release(r);
    td_value_release(args);
    td_tensor_release(t);
}

TD_TEST(messages_of_every_size, .world_size = 2, .timeout_s = 120, .params = "lanes,socket")
{
    rpc_up(ctx);
    if (ctx->rank == 0) {
        /* Around one entry (16 KiB), the lane (64 KiB), several lanes' worth, and 4 MiB. */
        const int64_t sizes[] = {0, 1, 7, 8, 1000, 16000, 16384, 16385, 32768, 65535, 65536, 65537, 200003, 4 << 20};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            echo_checked(1, sizes[i], (int)i);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST(both_directions_many_in_flight, .world_size = 2, .timeout_s = 120, .params = "lanes,socket")
{
    rpc_up(ctx);
    /* Both workers call each other at once, 48 calls in flight each, of sizes from nothing to
     * several lanes' worth: the lane's writers take turns, its readers too, and replies and calls
     * share it. Each reply is checked byte for byte. */
    enum { N = 48 };
    const int64_t sizes[] = {3, 9000, 16384, 70000, 150001, 0};
    td_tensor *sent[N];
    td_future *fs[N];
    for (int i = 0; i < N; i++) {
        sent[i] = pattern(sizes[i % 6], 100 * ctx->rank + i);
        td_value *args = td_value_tuple_of(1, td_value_tensor(sent[i]));
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(1 - ctx->rank), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT,
                                 &fs[i]));
        td_value_release(args);
    }
    /* Meanwhile, synchronous calls from this thread: it polls the lanes itself while it waits. */
    for (int i = 0; i < 20; i++)
        echo_checked(1 - ctx->rank, 100 * i, i);
    TD_CHECK_OK(td_future_wait_all(fs, N, 0));
    for (int i = 0; i < N; i++) {
        TD_CHECK_MSG(td_tensor_equal(td_value_get_tensor(td_future_value(fs[i])), sent[i]),
                     "call %d's reply differs", i);
        td_future_release(fs[i]);
        td_tensor_release(sent[i]);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST(calls_to_a_sleeping_worker, .world_size = 3, .timeout_s = 120, .params = "lanes,socket")
{
    rpc_up(ctx);
    /* Each call comes after a pause long enough for every thread of the callee to stop polling
     * and sleep: the writer must ring it. Workers 0 and 1 call worker 2 at once. */
    if (ctx->rank < 2) {
        for (int i = 0; i < 8; i++) {
            rpc_test_sleep_ms(120);
            echo_checked(2, 64 + i, i);
        }
        int64_t rung = rpc_test_debug_int("agent.lane_bells_rung");
        if (lanes_param(ctx))
            TD_CHECK_MSG(rung > 0, "8 calls to a sleeping worker rang no bell");
        else
            TD_CHECK_EQ(rung, 0);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST_MAIN()
