/* Large payloads between worker processes of one host, which travel single-copy (rpc/channel.c,
 * agent_impl.h's rpc_cma): the caller's tensors of 256 KiB and up are read by the callee straight
 * from the caller's memory, and the reply's by the caller from the callee's, the sender writing
 * chunks of it into the reader meanwhile (a shared copy) when it is 1 MiB or more. Each case runs
 * with single copy and shared copies (param "on"), single copy alone (TDIST_RPC_CMA_SHARE=0, param
 * "noshare") and TDIST_RPC_CMA=0 (param "off", everything through the socket), and checks every
 * byte: sizes around the threshold, a payload with more large parts than a piece
 * table holds, a strided view, calls in flight at once, and a reply that the caller changes after
 * it arrived (no aliasing with the callee's tensor). The debug counters tell which path ran. A
 * worker killed while large calls to it and replies from it are in flight (so that peers wait for
 * it to read their memory, or read its memory as it dies) fails those calls on every peer within
 * 2 s, naming it; the peers go on with each other. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc_util.h"

static _Atomic int echo_kill_at; /* echo_or_die: the call that kills this worker (0: none) */
static _Atomic int echo_calls;
static char kill_time_path[1024];

/* echo_or_die(x): echo, except that the echo_kill_at-th call writes the time and SIGKILLs this
 * worker while other calls and replies are in flight. */
static td_status fn_echo_or_die(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    int n = atomic_fetch_add(&echo_calls, 1) + 1;
    if (n == atomic_load(&echo_kill_at))
        rpc_test_die_noting_time(kill_time_path);
    return rpc_test_echo(call, args, kwargs, result);
}

static void rpc_up(td_test_ctx *ctx)
{
    if (strcmp(ctx->param, "off") == 0)
        setenv("TDIST_RPC_CMA", "0", 1);
    if (strcmp(ctx->param, "noshare") == 0)
        setenv("TDIST_RPC_CMA_SHARE", "0", 1);
    const rpc_test_function fns[] = {{"echo", rpc_test_echo, NULL, NULL}, {"echo_or_die", fn_echo_or_die, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    rpc_test_init(ctx, NULL);
}

/* n float32 elements, element i = seed + i (exact in float32 below 2^24). */
static td_tensor *numbered(int64_t n, int seed)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(n), &t));
    float *d = td_tensor_data(t);
    for (int64_t i = 0; i < n; i++)
        d[i] = (float)((seed + i) % (1 << 24));
    return t;
}

static td_value *echo(td_test_ctx *ctx, td_value *x)
{
    td_value *args = td_value_tuple_of(1, x), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(1 - ctx->rank), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    td_value_release(args);
    return r;
}

TD_TEST(large_payloads_round_trip, .world_size = 2, .timeout_s = 120, .params = "on,noshare,off")
{
    rpc_up(ctx);
    bool single_copy = strcmp(ctx->param, "off") != 0, share = strcmp(ctx->param, "on") == 0;
    if (ctx->rank == 0) {
        /* Sizes in bytes around the 256 KiB threshold, odd ones, and 16 MiB (4 MiB under
         * ThreadSanitizer). */
#ifdef TDIST_TSAN
        const int64_t largest = (4 << 20) / 4;
#else
        const int64_t largest = (16 << 20) / 4;
#endif
        const int64_t elems[] = {1, (256 << 10) / 4 - 1, (256 << 10) / 4, (1 << 20) / 4 + 3, largest};
        for (size_t i = 0; i < sizeof elems / sizeof elems[0]; i++) {
            td_tensor *t = numbered(elems[i], (int)i);
            td_value *r = echo(ctx, td_value_tensor(t));
            TD_CHECK_MSG(td_tensor_equal(td_value_get_tensor(r), t), "%lld elements came back different",
                         (long long)elems[i]);
            /* The reply is the caller's own: changing it leaves the sent tensor as it was. */
            TD_CHECK_OK(td_tensor_fill(td_value_get_tensor(r), -1));
            td_tensor *again = numbered(elems[i], (int)i);
            TD_CHECK(td_tensor_equal(t, again));
            td_tensor_release(again);
            td_value_release(r);
            td_tensor_release(t);
        }
        /* More large parts than a piece table holds, and small ones between them. */
        enum { PARTS = 11 };
        td_tensor *parts[PARTS];
        td_value *list = td_value_list_new();
        for (int i = 0; i < PARTS; i++) {
            parts[i] = numbered(i % 2 ? 300 * 1024 / 4 : 10 + i, 1000 * i);
            TD_CHECK_OK(td_value_list_append(list, td_value_tensor(parts[i])));
        }
        td_value *r = echo(ctx, list);
        TD_CHECK_EQ(td_value_len(r), (size_t)PARTS);
        for (int i = 0; i < PARTS; i++) {
            TD_CHECK_MSG(td_tensor_equal(td_value_get_tensor(td_value_at(r, (size_t)i)), parts[i]), "part %d differs",
                         i);
            td_tensor_release(parts[i]);
        }
        td_value_release(r);
        /* A strided view of a large tensor: it keeps its layout and its values. */
        td_tensor *big = numbered(1024 * 1024, 7), *square = NULL, *view = NULL;
        TD_CHECK_OK(td_tensor_view(big, TD_SHAPE(1024, 1024), &square));
        TD_CHECK_OK(td_tensor_narrow(square, 1, 1, 600, &view));
        r = echo(ctx, td_value_tensor(view));
        TD_CHECK(td_tensor_equal(td_value_get_tensor(r), view));
        td_value_release(r);
        td_tensor_release(view);
        td_tensor_release(square);
        td_tensor_release(big);
        /* Calls in flight together, each with its own large tensor. */
        enum { N = 8 };
        td_future *fs[N];
        td_tensor *sent[N];
        for (int i = 0; i < N; i++) {
            sent[i] = numbered(512 * 1024 / 4 + i, 50 * i);
            td_value *args = td_value_tuple_of(1, td_value_tensor(sent[i]));
            TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(1), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &fs[i]));
            td_value_release(args);
        }
        TD_CHECK_OK(td_future_wait_all(fs, N, 0));
        for (int i = 0; i < N; i++) {
            TD_CHECK(td_tensor_equal(td_value_get_tensor(td_future_value(fs[i])), sent[i]));
            td_future_release(fs[i]);
            td_tensor_release(sent[i]);
        }
        /* Shared copies: the caller writes into the callee while the callee reads (the call), and
         * the callee into the caller (the reply). Whether a sender comes to write before its
         * reader claimed every chunk is up to the scheduler, so this repeats until both did. */
        td_tensor *t = numbered(largest, 3);
        for (int i = 0; i < 200 && share && !(rpc_test_debug_int("agent.single_copy_chunks_written_to_peers") > 0 &&
                                            rpc_test_debug_int("agent.single_copy_chunks_written_by_peers") > 0);
             i++) {
            td_value *back = echo(ctx, td_value_tensor(t));
            TD_CHECK(td_tensor_equal(td_value_get_tensor(back), t));
            td_value_release(back);
        }
        td_tensor_release(t);
        int64_t to_peer = rpc_test_debug_int("agent.single_copy_chunks_written_to_peers");
        int64_t by_peer = rpc_test_debug_int("agent.single_copy_chunks_written_by_peers");
        TD_CHECK_MSG(share ? to_peer > 0 && by_peer > 0 : to_peer == 0 && by_peer == 0,
                     "worker0 wrote %lld chunks into worker1 and worker1 %lld into worker0 (param %s)",
                     (long long)to_peer, (long long)by_peer, ctx->param);
    }
    /* Both workers read large parts (worker1 the calls, worker0 the replies), single-copy only when on. */
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 30000));
    TD_CHECK_EQ(rpc_test_debug_int("agent.num_single_copy_channels"), single_copy ? 1 : 0);
    int64_t received = rpc_test_debug_int("agent.single_copy_messages_received");
    TD_CHECK_MSG(single_copy ? received > 0 : received == 0, "%lld messages arrived single-copy with TDIST_RPC_CMA %s",
                 (long long)received, ctx->param);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST(killed_worker_mid_transfer, .world_size = 3, .timeout_s = 120, .params = "on,noshare,off",
        .skip_return_code_check = true, .allow_leftovers = true)
{
    snprintf(kill_time_path, sizeof kill_time_path, "%s/kill_time", ctx->tmpdir);
    if (ctx->rank == 2)
        atomic_store(&echo_kill_at, 5);
    rpc_up(ctx);
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 30000));
    if (ctx->rank == 2) {
        for (;;) /* serves until its fifth call kills it */
            rpc_test_sleep_ms(1000);
    }
    /* Workers 0 and 1 each keep 6 calls of 8 MiB (1 MiB under ThreadSanitizer, whose checks of
     * every element take seconds) in flight to worker2. */
    enum { N = 6 };
#ifdef TDIST_TSAN
    const int64_t elems = (1 << 20) / 4;
#else
    const int64_t elems = (8 << 20) / 4;
#endif
    td_tensor *t = numbered(elems, ctx->rank);
    td_value *args = td_value_tuple_of(1, td_value_tensor(t));
    td_future *fs[N];
    for (int i = 0; i < N; i++)
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(2), "echo_or_die", args, NULL, 0, &fs[i]));
    /* All waited for first, the time taken then: checking the results comes after. */
    td_status st[N];
    char why[N][256];
    for (int i = 0; i < N; i++) {
        st[i] = td_future_wait(fs[i], 30000);
        snprintf(why[i], sizeof why[i], "%s", st[i] == TD_OK ? "" : td_last_error());
    }
    int64_t since = rpc_test_ms_since_death(kill_time_path);
    int failed = 0;
    for (int i = 0; i < N; i++) {
        if (st[i] != TD_OK) {
            TD_CHECK_EQ(st[i], TD_ERR_PEER_LOST);
            TD_CHECK_MSG(strstr(why[i], "worker2") != NULL, "call %d's error does not name worker2: %s", i, why[i]);
            failed++;
        } else {
            TD_CHECK(td_tensor_equal(td_value_get_tensor(td_future_value(fs[i])), t));
        }
        td_future_release(fs[i]);
    }
    TD_CHECK_MSG(failed > 0, "none of worker %d's calls failed", ctx->rank);
    TD_CHECK_MSG(since < 2000, "the calls failed %lld ms after the kill", (long long)since);
    /* The survivors go on, large payloads included. */
    td_value *r = echo(ctx, td_value_tensor(t));
    TD_CHECK(td_tensor_equal(td_value_get_tensor(r), t));
    td_value_release(r);
    td_value_release(args);
    td_tensor_release(t);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST_MAIN()
