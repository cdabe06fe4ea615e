/* The shm transport (src/transport/shm.h) between real rank processes over real shared memory:
 * set-up through a FileStore for worlds 1 to 4, messages of every size (larger than the ring too)
 * with iovecs, tag matching out of order, any-source receives, unexpected messages (large ones
 * drained by the transport's thread), length mismatches, callbacks with nobody waiting, a peer
 * killed with SIGKILL (survivors fail within 2 s naming it, nothing is left in /dev/shm), timeouts,
 * aborts relayed to the peers, orderly closes, refused hellos (different settings, another host),
 * four ranks sharing one core, and no fd, thread or segment left after destroy (the harness checks
 * fds, threads and /dev/shm after every case). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "shm_util.h"

#define after_ms shm_test_after_ms
#define since_s shm_test_since_s
#define pattern shm_test_pattern

static void connect_body(td_test_ctx *ctx)
{
    shm_world w = shm_test_open(ctx, 0);
    shm_test_all_pairs(ctx, w.t, 1000);
    shm_test_all_pairs(ctx, w.t, 1 << 20); /* four times the ring */
    shm_test_close(&w);
}

TD_TEST(connect_world_2, .world_size = 2) { connect_body(ctx); }
TD_TEST(connect_world_3, .world_size = 3) { connect_body(ctx); }
TD_TEST(connect_world_4, .world_size = 4) { connect_body(ctx); }
TD_TEST(connect_world_8, .world_size = 8, .timeout_s = 120) { connect_body(ctx); }

TD_TEST(connect_world_1, .world_size = 1)
{
    shm_world w = shm_test_open(ctx, 0);
    td_xfer x = {0};
    TD_CHECK_ERR(td_transport_isend1(w.t, 0, 1, "x", 1, after_ms(1000), &x), TD_ERR_INVALID, "invalid peer rank 0");
    shm_test_close(&w);
}

/* Sizes 0, 1, odd, and larger than the ring, gathered from and scattered into several buffers, in
 * both directions at once. */
TD_TEST(sizes_and_iovecs, .world_size = 2)
{
    shm_world w = shm_test_open(ctx, 0);
    int peer = 1 - ctx->rank;
    const size_t sizes[] = {0, 1, 2, 7, 15, 16, 17, 4095, 65537, 262144, 262145, 3 * 1024 * 1024 + 3};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t len = sizes[si];
        unsigned char *out = malloc(len + 3), *in = malloc(len + 3);
        for (size_t i = 0; i < len; i++)
            out[i] = pattern(ctx->rank, peer, i);
        memset(in, 0xEE, len + 3);
        size_t a = len / 3, b = len / 2;
        struct iovec siov[3] = {{out, a}, {out + a, len - a - len / 5}, {out + len - len / 5, len / 5}};
        struct iovec riov[3] = {{in, b}, {in + b, 0}, {in + b, len - b}};
        td_xfer xs[2];
        xs[0].on_done = xs[1].on_done = NULL;
        TD_CHECK_OK(td_transport_irecv(w.t, peer, si, riov, 3, after_ms(30000), &xs[0]));
        TD_CHECK_OK(td_transport_isend(w.t, peer, si, siov, 3, after_ms(30000), &xs[1]));
        TD_CHECK_OK(td_transport_wait_all(w.t, xs, 2, after_ms(30000)));
        TD_CHECK_EQ(xs[0].nbytes, len);
        TD_CHECK_EQ(xs[1].nbytes, len);
        TD_CHECK_EQ(xs[0].peer, peer);
        for (size_t i = 0; i < len; i++)
            TD_CHECK_MSG(in[i] == pattern(peer, ctx->rank, i), "size %zu: byte %zu differs", len, i);
        TD_CHECK(in[len] == 0xEE);
        free(out);
        free(in);
    }
    shm_test_close(&w);
}

/* Receives posted in another order than the sends; several messages with one tag arrive in order;
 * receives posted before anything is sent wait in their queue. */
TD_TEST(tag_matching_out_of_order, .world_size = 2)
{
    shm_world w = shm_test_open(ctx, 0);
    if (ctx->rank == 0) {
        for (int tag = 1; tag <= 6; tag++) {
            int v[2] = {tag, tag * 100};
            TD_CHECK_OK(td_transport_send(w.t, 1, (uint64_t)tag, v, sizeof v, after_ms(30000)));
        }
        for (int i = 0; i < 5; i++)
            TD_CHECK_OK(td_transport_send(w.t, 1, 77, &i, sizeof i, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 1000, "go", 2, after_ms(30000)));
    } else {
        int v[2];
        TD_CHECK_OK(td_transport_recv(w.t, 0, 6, v, sizeof v, after_ms(30000)));
        TD_CHECK(v[0] == 6 && v[1] == 600);
        const int order[] = {3, 1, 5, 2, 4};
        for (int i = 0; i < 5; i++) {
            TD_CHECK_OK(td_transport_recv(w.t, 0, (uint64_t)order[i], v, sizeof v, after_ms(30000)));
            TD_CHECK(v[0] == order[i] && v[1] == order[i] * 100);
        }
        for (int i = 0; i < 5; i++) {
            int x = -1;
            TD_CHECK_OK(td_transport_recv(w.t, 0, 77, &x, sizeof x, after_ms(30000)));
            TD_CHECK_EQ(x, i);
        }
        char go[2];
        TD_CHECK_OK(td_transport_recv(w.t, 0, 1000, go, 2, after_ms(30000)));
    }
    if (ctx->rank == 1) {
        td_xfer xs[3];
        int vals[3] = {-1, -1, -1};
        for (int i = 0; i < 3; i++) {
            xs[i].on_done = NULL;
            TD_CHECK_OK(td_transport_irecv1(w.t, 0, (uint64_t)(20 + (2 - i)), &vals[i], sizeof(int), after_ms(30000),
                                            &xs[i]));
        }
        TD_CHECK_OK(td_transport_send(w.t, 0, 1001, "ready", 5, after_ms(30000)));
        TD_CHECK_OK(td_transport_wait_all(w.t, xs, 3, after_ms(30000)));
        TD_CHECK(vals[0] == 22 && vals[1] == 21 && vals[2] == 20);
    } else {
        char r[5];
        TD_CHECK_OK(td_transport_recv(w.t, 1, 1001, r, 5, after_ms(30000)));
        for (int tag = 20; tag <= 22; tag++)
            TD_CHECK_OK(td_transport_send(w.t, 1, (uint64_t)tag, &tag, sizeof tag, after_ms(30000)));
    }
    shm_test_close(&w);
}

/* Any-source receives take messages from whichever rank sends; a specific receive posted earlier
 * wins over an any-source one for its sender. */
TD_TEST(any_source, .world_size = 4)
{
    shm_world w = shm_test_open(ctx, 0);
    if (ctx->rank == 0) {
        int got[4] = {0};
        for (int i = 0; i < 3; i++) {
            td_xfer x = {0};
            int v[2] = {-1, -1};
            TD_CHECK_OK(td_transport_irecv1(w.t, TD_TRANSPORT_ANY, 9, v, sizeof v, after_ms(30000), &x));
            TD_CHECK_OK(td_transport_wait(w.t, &x, after_ms(30000)));
            TD_CHECK(x.peer >= 1 && x.peer <= 3);
            TD_CHECK_EQ(v[0], x.peer);
            TD_CHECK_EQ(v[1], x.peer * 11);
            got[x.peer]++;
        }
        TD_CHECK(got[1] == 1 && got[2] == 1 && got[3] == 1);
        td_xfer xs[2];
        int a = -1, b = -1;
        xs[0].on_done = xs[1].on_done = NULL;
        TD_CHECK_OK(td_transport_irecv1(w.t, 2, 10, &a, sizeof a, after_ms(30000), &xs[0]));
        TD_CHECK_OK(td_transport_irecv1(w.t, TD_TRANSPORT_ANY, 10, &b, sizeof b, after_ms(30000), &xs[1]));
        TD_CHECK_OK(td_transport_send(w.t, 2, 11, "go", 2, after_ms(30000)));
        TD_CHECK_OK(td_transport_wait_all(w.t, xs, 2, after_ms(30000)));
        TD_CHECK_EQ(a, 2);
        TD_CHECK_EQ(xs[0].peer, 2);
        TD_CHECK_EQ(b, 102);
        TD_CHECK_EQ(xs[1].peer, 2);
    } else {
        int v[2] = {ctx->rank, ctx->rank * 11};
        TD_CHECK_OK(td_transport_send(w.t, 0, 9, v, sizeof v, after_ms(30000)));
        if (ctx->rank == 2) {
            char go[2];
            TD_CHECK_OK(td_transport_recv(w.t, 0, 11, go, 2, after_ms(30000)));
            int x = 2, y = 102;
            TD_CHECK_OK(td_transport_send(w.t, 0, 10, &x, sizeof x, after_ms(30000)));
            TD_CHECK_OK(td_transport_send(w.t, 0, 10, &y, sizeof y, after_ms(30000)));
        }
    }
    shm_test_barrier(ctx, w.store, "done");
    shm_test_close(&w);
}

/* Messages sent before their receive is posted: the sends complete although nothing is posted
 * (the receiver's thread drains the ring into buffers when it fills), large ones included. */
TD_TEST(unexpected_messages, .world_size = 2)
{
    shm_world w = shm_test_open(ctx, 0);
    const size_t sizes[] = {0, 5, 1000, 70000, 8 * 1024 * 1024};
    enum { N = sizeof sizes / sizeof sizes[0] };
    unsigned char *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(sizes[i] + 1);
        for (size_t j = 0; j < sizes[i]; j++)
            bufs[i][j] = ctx->rank == 0 ? pattern(0, i, j) : 0;
    }
    if (ctx->rank == 0) {
        td_xfer xs[N];
        for (int i = 0; i < N; i++) {
            xs[i].on_done = NULL;
            TD_CHECK_OK(td_transport_isend1(w.t, 1, (uint64_t)(N - i), bufs[i], sizes[i], after_ms(30000), &xs[i]));
        }
        TD_CHECK_OK(td_transport_wait_all(w.t, xs, N, after_ms(30000)));
        TD_CHECK_OK(td_store_set_str(w.store, "sent", "1"));
    } else {
        const char *k = "sent";
        TD_CHECK_OK(td_store_wait(w.store, &k, 1, 30000));
        for (int i = N - 1; i >= 0; i--) {
            TD_CHECK_OK(td_transport_recv(w.t, 0, (uint64_t)(N - i), bufs[i], sizes[i], after_ms(30000)));
            for (size_t j = 0; j < sizes[i]; j++)
                TD_CHECK_MSG(bufs[i][j] == pattern(0, i, j), "message %d byte %zu differs", i, j);
        }
    }
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    shm_test_barrier(ctx, w.store, "done");
    shm_test_close(&w);
}

/* A receive of the wrong size fails alone, naming both sizes; the ring carries on. */
TD_TEST(length_mismatch, .world_size = 2)
{
    shm_world w = shm_test_open(ctx, 0);
    if (ctx->rank == 0) {
        char b[12] = "abcdefghijk";
        TD_CHECK_OK(td_transport_send(w.t, 1, 5, b, 12, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 6, b, 3, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 7, b, 12, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 8, b, 4, after_ms(30000)));
        TD_CHECK_OK(td_store_set_str(w.store, "sent", "1"));
    } else {
        char b[64];
        TD_CHECK_ERR(td_transport_recv(w.t, 0, 5, b, 8, after_ms(30000)), TD_ERR_INVALID,
                     "rank 0 sent 12 bytes (tag 5) to a receive of 8 bytes");
        TD_CHECK_OK(td_transport_recv(w.t, 0, 6, b, 3, after_ms(30000)));
        TD_CHECK(memcmp(b, "abc", 3) == 0);
        const char *k = "sent";
        TD_CHECK_OK(td_store_wait(w.store, &k, 1, 30000));
        TD_CHECK_OK(td_transport_recv(w.t, 0, 8, b, 4, after_ms(30000))); /* tag 7 is pulled out of the way */
        TD_CHECK_ERR(td_transport_recv(w.t, 0, 7, b, 20, after_ms(30000)), TD_ERR_INVALID,
                     "sent 12 bytes (tag 7) to a receive of 20 bytes");
    }
    shm_test_barrier(ctx, w.store, "done");
    shm_test_close(&w);
}

/* Rank 2 dies by SIGKILL: every survivor fails within 2 seconds with TD_ERR_PEER_LOST naming it,
 * also while waiting on a different peer, and so does every later operation. */
TD_TEST(peer_killed, .world_size = 3, .skip_return_code_check = true, .allow_leftovers = true)
{
    shm_world w = shm_test_open(ctx, 0);
    shm_test_all_pairs(ctx, w.t, 100);
    shm_test_barrier(ctx, w.store, "ready");
    if (ctx->rank == 2) {
        td_sleep_ms(300);
        raise(SIGKILL);
    }
    int peer = ctx->rank == 0 ? 1 : 2;
    char b[4];
    int64_t t0 = td_now_ns();
    TD_CHECK_ERR(td_transport_recv(w.t, peer, 3, b, 4, after_ms(60000)), TD_ERR_PEER_LOST, "Connection to rank 2 lost");
    double dt = since_s(t0);
    TD_CHECK_MSG(dt < 2.3, "the loss of rank 2 took %.2f s to notice (the kill came at 0.3 s)", dt);
    TD_CHECK_ERR(td_transport_send(w.t, 1 - ctx->rank, 3, b, 4, after_ms(60000)), TD_ERR_PEER_LOST,
                 "Connection to rank 2 lost");
    TD_CHECK_ERR(td_transport_recv(w.t, TD_TRANSPORT_ANY, 3, b, 4, after_ms(60000)), TD_ERR_PEER_LOST,
                 "Connection to rank 2 lost");
    shm_test_no_segments();
    w.keep_store = true;
    shm_test_close(&w);
}

/* A receive whose peer stalls fails at its deadline with TD_ERR_TIMEOUT; the abort is relayed and
 * the stalled peer fails at once with the same cause. */
TD_TEST(timeout, .world_size = 2)
{
    shm_world w = shm_test_open(ctx, 0);
    char b[4];
    if (ctx->rank == 1) {
        int64_t t0 = td_now_ns();
        TD_CHECK_ERR(td_transport_recv(w.t, 0, 1, b, 4, after_ms(300)), TD_ERR_TIMEOUT,
                     "Timed out waiting for a receive from rank 0 (4 bytes, tag 1)");
        double dt = since_s(t0);
        TD_CHECK_MSG(dt >= 0.29 && dt < 10, "timed out after %.2f s", dt);
        TD_CHECK_ERR(td_transport_send(w.t, 0, 1, b, 4, after_ms(300)), TD_ERR_TIMEOUT, "Timed out");
    } else {
        int64_t t0 = td_now_ns();
        TD_CHECK_ERR(td_transport_recv(w.t, 1, 2, b, 4, after_ms(60000)), TD_ERR_TIMEOUT,
                     "Timed out waiting for a receive from rank 0");
        TD_CHECK(since_s(t0) < 10);
    }
    shm_test_close(&w);
}

static void *abort_later(void *arg)
{
    td_sleep_ms(100);
    td_transport_abort(arg, TD_ERR_CLOSED, "aborted by the test");
    return NULL;
}

/* abort fails what is pending (from another thread, waking the waiter) and everything later. */
TD_TEST(abort_wakes_waiters, .world_size = 2)
{
    shm_world w = shm_test_open(ctx, 0);
    char b[4];
    td_xfer x = {0};
    TD_CHECK_OK(td_transport_irecv1(w.t, 1 - ctx->rank, 1, b, 4, after_ms(60000), &x));
    pthread_t th;
    TD_CHECK(pthread_create(&th, NULL, abort_later, w.t) == 0);
    int64_t t0 = td_now_ns();
    TD_CHECK_ERR(td_transport_wait(w.t, &x, after_ms(60000)), TD_ERR_CLOSED, "aborted by the test");
    TD_CHECK(since_s(t0) < 10);
    pthread_join(th, NULL);
    TD_CHECK_ERR(td_transport_send(w.t, 1 - ctx->rank, 1, b, 4, after_ms(1000)), TD_ERR_CLOSED, "aborted by the test");
    TD_CHECK_ERR(td_transport_recv(w.t, 1 - ctx->rank, 1, b, 4, after_ms(1000)), TD_ERR_CLOSED, "aborted by the test");
    shm_test_barrier(ctx, w.store, "done");
    shm_test_close(&w);
}

/* A rank that destroys its transport says goodbye: what it sent before still arrives, the others
 * fail only what involves it and keep talking among themselves. */
TD_TEST(orderly_close, .world_size = 3)
{
    shm_world w = shm_test_open(ctx, 0);
    shm_test_all_pairs(ctx, w.t, 64);
    if (ctx->rank == 2) {
        int v = 2222;
        TD_CHECK_OK(td_transport_send(w.t, 0, 9, &v, sizeof v, after_ms(30000)));
        shm_test_barrier(ctx, w.store, "sent");
        td_transport_destroy(w.t);
        shm_test_barrier(ctx, w.store, "synced");
        shm_test_close_store(ctx, w.store, ctx->store_path);
        return;
    }
    shm_test_barrier(ctx, w.store, "sent");
    shm_test_barrier(ctx, w.store, "synced");
    char b[4];
    if (ctx->rank == 0) {
        int v = 0;
        TD_CHECK_OK(td_transport_recv(w.t, 2, 9, &v, sizeof v, after_ms(30000)));
        TD_CHECK_EQ(v, 2222);
    }
    TD_CHECK_ERR(td_transport_recv(w.t, 2, 1, b, 4, after_ms(30000)), TD_ERR_PEER_LOST, "rank 2 closed its end");
    for (int i = 0; i < 3; i++) {
        int v = ctx->rank * 10 + i, got = -1;
        TD_CHECK_OK(td_transport_sendrecv(w.t, 1 - ctx->rank, &v, sizeof v, 1 - ctx->rank, &got, sizeof got, 5,
                                          after_ms(30000)));
        TD_CHECK_EQ(got, (1 - ctx->rank) * 10 + i);
    }
    TD_CHECK_ERR(td_transport_send(w.t, 2, 1, b, 4, after_ms(30000)), TD_ERR_PEER_LOST, "rank 2 closed its end");
    shm_test_close(&w);
}

typedef struct cb_state {
    pthread_mutex_t mu;
    int done;
    td_status status[4];
} cb_state;

static void on_done(td_xfer *x, void *arg)
{
    cb_state *s = arg;
    pthread_mutex_lock(&s->mu);
    s->status[s->done++] = x->status;
    pthread_mutex_unlock(&s->mu);
}

/* Large isend/irecv pairs posted in opposite orders on the two sides, completed by callbacks with
 * nobody waiting: the transport's thread moves everything. */
TD_TEST(callbacks_any_order, .world_size = 2)
{
    shm_world w = shm_test_open(ctx, 0);
    size_t len = 6 * 1024 * 1024;
    unsigned char *out = malloc(len), *in = malloc(len);
    for (size_t i = 0; i < len; i++)
        out[i] = pattern(ctx->rank, 0, i);
    cb_state s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    td_xfer xs[2];
    for (int i = 0; i < 2; i++) {
        xs[i].on_done = on_done;
        xs[i].arg = &s;
    }
    int peer = 1 - ctx->rank;
    if (ctx->rank == 0) {
        TD_CHECK_OK(td_transport_isend1(w.t, peer, 1, out, len, after_ms(30000), &xs[0]));
        TD_CHECK_OK(td_transport_irecv1(w.t, peer, 2, in, len, after_ms(30000), &xs[1]));
    } else {
        TD_CHECK_OK(td_transport_isend1(w.t, peer, 2, out, len, after_ms(30000), &xs[0]));
        TD_CHECK_OK(td_transport_irecv1(w.t, peer, 1, in, len, after_ms(30000), &xs[1]));
    }
    int64_t t0 = td_now_ns();
    for (;;) {
        pthread_mutex_lock(&s.mu);
        int d = s.done;
        pthread_mutex_unlock(&s.mu);
        if (d == 2)
            break;
        TD_CHECK_MSG(since_s(t0) < 30, "the callbacks did not come");
        td_sleep_ms(1);
    }
    TD_CHECK(s.status[0] == TD_OK && s.status[1] == TD_OK);
    for (size_t i = 0; i < len; i++)
        TD_CHECK_MSG(in[i] == pattern(peer, 0, i), "byte %zu differs", i);
    free(out);
    free(in);
    shm_test_barrier(ctx, w.store, "done");
    shm_test_close(&w);
}

/* Ranks with different ring sizes refuse each other with a message that names the variables. */
TD_TEST(layout_mismatch, .world_size = 2)
{
    setenv("TDIST_SHM_RING", ctx->rank == 0 ? "64K" : "128K", 1);
    td_store *store = shm_test_open_store(ctx->store_path);
    td_shm_options o = {.setup.store = store, .setup.rank = ctx->rank, .setup.size = 2, .setup.timeout_ms = 3000,
                        .setup.group_name = "g"};
    td_transport *t = NULL;
    if (ctx->rank == 0)
        TD_CHECK_ERR(td_shm_transport_create(&o, &t), TD_ERR_INVALID, "TDIST_SHM_RING");
    else
        TD_CHECK_ERR(td_shm_transport_create(&o, &t), TD_ERR_TIMEOUT, "no connection yet with rank 0; last refused");
    unsetenv("TDIST_SHM_RING");
    shm_test_no_segments();
    shm_test_barrier(ctx, store, "done");
    shm_test_close_store(ctx, store, ctx->store_path);
}

/* Ranks that count as different hosts (TDIST_HOST_ID) cannot share memory: a clear error that
 * names the other rank and points to the auto backend. */
TD_TEST(other_host_refused, .world_size = 2)
{
    setenv("TDIST_HOST_ID", ctx->rank == 0 ? "hostA" : "hostB", 1);
    td_store *store = shm_test_open_store(ctx->store_path);
    td_shm_options o = {.setup.store = store, .setup.rank = ctx->rank, .setup.size = 2, .setup.timeout_ms = 10000,
                        .setup.group_name = "g"};
    td_transport *t = NULL;
    char want[64];
    snprintf(want, sizeof want, "but rank %d is on another host", 1 - ctx->rank);
    TD_CHECK_ERR(td_shm_transport_create(&o, &t), TD_ERR_INVALID, want);
    TD_CHECK_CONTAINS(td_last_error(), "auto backend");
    unsetenv("TDIST_HOST_ID");
    shm_test_barrier(ctx, store, "done");
    shm_test_close_store(ctx, store, ctx->store_path);
}

/* A rank that never shows up: set-up fails at the timeout naming it. */
TD_TEST(setup_timeout, .world_size = 2)
{
    td_store *store = shm_test_open_store(ctx->store_path);
    if (ctx->rank == 0) {
        td_shm_options o = {.setup.store = store, .setup.rank = 0, .setup.size = 3, .setup.timeout_ms = 500,
                            .setup.group_name = "g"};
        td_transport *t = NULL;
        TD_CHECK_ERR(td_shm_transport_create(&o, &t), TD_ERR_TIMEOUT, "rank 1");
        shm_test_no_segments();
    }
    shm_test_barrier(ctx, store, "done");
    shm_test_close_store(ctx, store, ctx->store_path);
}

/* Four ranks on one core: every exchange still completes (the waits yield and then sleep). */
TD_TEST(four_ranks_one_core, .world_size = 4, .timeout_s = 120)
{
    shm_test_one_core();
    shm_world w = shm_test_open(ctx, 0);
    int64_t t0 = td_now_ns();
    for (int i = 0; i < 300; i++)
        shm_test_all_pairs(ctx, w.t, (size_t)(i % 7) * 1000);
    shm_test_all_pairs(ctx, w.t, 3 << 20);
    double dt = since_s(t0);
    TD_CHECK_MSG(dt < 60, "300 exchanges among 4 ranks on one core took %.1f s", dt);
    shm_test_barrier(ctx, w.store, "done");
    shm_test_close(&w);
}

/* Groups made and destroyed again and again on one store: no fd, thread or segment stays behind,
 * and a new group never reads an old one's addresses. */
TD_TEST(create_destroy_repeatedly, .world_size = 3)
{
    td_store *store = shm_test_open_store(ctx->store_path);
    for (int i = 0; i < 8; i++) {
        td_shm_options o = {.setup.store = store, .setup.rank = ctx->rank, .setup.size = 3, .setup.timeout_ms = 30000,
                            .setup.group_name = "again"};
        td_transport *t = NULL;
        TD_CHECK_OK(td_shm_transport_create(&o, &t));
        shm_test_all_pairs(ctx, t, (size_t)i * 1000);
        td_transport_destroy(t);
        shm_test_no_segments();
    }
    shm_test_barrier(ctx, store, "done");
    shm_test_close_store(ctx, store, ctx->store_path);
}

TD_TEST_MAIN()
