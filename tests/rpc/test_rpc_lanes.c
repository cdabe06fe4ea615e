/* Same-host messages through lanes (rpc/channel.c, agent_impl.h's rpc_cma): every message between
 * two workers of one host is written into the channel's shared segment in entries, read by
 * whichever thread of the reader polls (its I/O thread, an idle pool thread, a td_rpc_sync caller),
 * and the socket only rings a reader that sleeps. Each case runs with lanes (param "lanes") and
 * with TDIST_RPC_LANES=0 (param "socket"), and with single copy off so that large messages go
 * through the lane too: messages of every size around the entry size and the lane's, both
 * directions at once with many calls in flight (several writers and readers of one lane), and
 * calls to a worker whose threads all sleep (the bell), and callers that wait on an asynchronous
 * call's future taking replies from the lane themselves, as td_rpc_sync's do. A worker whose lane words make no sense
 * (written here through the channel's internals, as a broken or hostile peer would) loses its
 * connection: the reader closes it and calls fail on both sides, without a hang. A worker killed
 * while its peers' writers wait for room in its lane is
 * test_rpc_single_copy.killed_worker_mid_transfer/off. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc/agent_impl.h"
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

static void echo_checked(int to, int64_t n, int seed)
{
    td_tensor *t = rpc_test_pattern(n, seed);
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
        sent[i] = rpc_test_pattern(sizes[i % 6], 100 * ctx->rank + i);
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

TD_TEST(waiting_callers_take_replies_themselves, .world_size = 2, .timeout_s = 120, .params = "lanes,socket")
{
    rpc_up(ctx);
    if (ctx->rank == 0) {
        /* td_future_wait and td_future_wait_all on rpc_async futures poll the lanes (the call's
         * driver) before they sleep. Whether a poll or the I/O thread gets a reply first is up to
         * the scheduler, so this repeats until a poll did; the replies are checked each time. */
        enum { N = 4 };
        const int64_t before = rpc_test_debug_int("agent.lane_takes_by_callers"); /* td_rpc_sync's, set-up */
        for (int round = 0;
             round < 2000 && (!lanes_param(ctx) || rpc_test_debug_int("agent.lane_takes_by_callers") == before);
             round++) {
            td_tensor *sent[N];
            td_future *fs[N];
            for (int i = 0; i < N; i++) {
                sent[i] = rpc_test_pattern(64 * i, round + i);
                td_value *args = td_value_tuple_of(1, td_value_tensor(sent[i]));
                TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(1), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &fs[i]));
                td_value_release(args);
            }
            TD_CHECK_OK(td_future_wait(fs[0], 0));
            TD_CHECK_OK(td_future_wait_all(fs + 1, N - 1, 0));
            for (int i = 0; i < N; i++) {
                TD_CHECK(td_tensor_equal(td_value_get_tensor(td_future_value(fs[i])), sent[i]));
                td_future_release(fs[i]);
                td_tensor_release(sent[i]);
            }
            if (!lanes_param(ctx) && round == 50)
                break;
        }
        int64_t takes = rpc_test_debug_int("agent.lane_takes_by_callers") - before;
        TD_CHECK_MSG(lanes_param(ctx) ? takes > 0 : takes == 0, "waiting callers took lane messages %lld times (%s)",
                     (long long)takes, ctx->param);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST(a_malformed_lane_closes_the_connection, .world_size = 2, .timeout_s = 60, .params = "lanes")
{
    rpc_up(ctx);
    echo_checked(1 - ctx->rank, 100, 1);
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 30000));
    /* worker1 says, through a file, when it expects nothing more from worker0. */
    char go[1024];
    snprintf(go, sizeof go, "%s/lane_go", ctx->tmpdir);
    if (ctx->rank == 1) {
        echo_checked(0, 8, 2);
        FILE *f = fopen(go, "w");
        TD_CHECK(f != NULL);
        fclose(f);
    } else {
        for (int i = 0; i < 2000 && access(go, F_OK) != 0; i++)
            rpc_test_sleep_ms(10);
        TD_CHECK_MSG(access(go, F_OK) == 0, "worker1 never said go");
        TD_CHECK_EQ(unlink(go), 0);
        /* A head 3 bytes ahead of the last entry, in the lane and in the writer's own copy (so
         * that anything it might still write keeps it wrong): no whole entry can end there. Then
         * a bell, in case worker1's threads sleep. */
        rpc_channel *ch = rpc_test_default_agent()->peers[1].chan;
        TD_CHECK(ch && ch->lanes);
        pthread_mutex_lock(&ch->send_mu);
        ch->lane_w.head += 3;
        atomic_store(&ch->lane_w.lane->head, ch->lane_w.head);
        uint8_t bell = 1;
        TD_CHECK_EQ(send(ch->fd, &bell, 1, MSG_NOSIGNAL), 1);
        pthread_mutex_unlock(&ch->send_mu);
    }
    /* Both ends lose the connection, with no call in flight: worker1 closes it, worker0 sees it
     * closed. Then calls fail at once, naming the peer (and on worker1, why). */
    rpc_test_wait_debug("agent.num_lane_channels", 0, 20000);
    td_value *r = NULL, *args = td_value_tuple_of(1, td_value_int(1));
    td_status st = td_rpc_sync(NULL, td_rpc_to_id(1 - ctx->rank), "echo", args, NULL, 5000, &r);
    char why[TD_ERROR_MAX];
    snprintf(why, sizeof why, "%s", st == TD_OK ? "" : td_last_error());
    td_value_release(args);
    td_value_release(r);
    TD_CHECK_EQ(st, TD_ERR_PEER_LOST);
    char peer[32];
    snprintf(peer, sizeof peer, "worker%d", 1 - ctx->rank);
    TD_CHECK_MSG(strstr(why, peer) != NULL, "the error does not name %s: %s", peer, why);
    if (ctx->rank == 1)
        TD_CHECK_MSG(strstr(why, "a malformed lane") != NULL, "worker1's error gives another reason: %s", why);
    TD_CHECK_OK(td_rpc_shutdown(false, 0));
}

TD_TEST_MAIN()
