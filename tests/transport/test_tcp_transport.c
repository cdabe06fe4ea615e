/* The tcp transport (src/transport/tcp.h) between real rank processes over real sockets, each case
 * over TCP and over UNIX-domain sockets (param "tcp" / "unix"): set-up through a FileStore for
 * worlds 2 to 4 (IPv4 and IPv6), messages of every size with iovecs, tag
 * matching out of order, any-source receives, unexpected messages, length mismatches, a peer
 * killed with SIGKILL, timeouts, aborts, orderly closes, refused handshakes, and no fd or thread
 * left after destroy (the harness checks both after every case). */
#include <pthread.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <tdist/store.h>
#include <tdist/testing.h>

#include "base/clock.h"
#include "transport/tcp.h"

/* FileStore counts its handles out with two separate updates, so when ranks close at the same
 * moment the last-handle cleanup can miss and leave the file behind. These tests therefore open it
 * as "never removed" and remove it themselves once every rank has let go (marker files). */
static td_store *open_store(const char *path)
{
    td_store *s = NULL;
    TD_CHECK_OK(td_file_store_create(path, -1, &s));
    return s;
}

static void close_store(const td_test_ctx *ctx, td_store *s, const char *path)
{
    td_store_release(s);
    char mark[1100];
    if (ctx->rank != 0) {
        snprintf(mark, sizeof mark, "%s.released.%d", path, ctx->rank);
        int fd = open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        if (fd >= 0)
            close(fd);
        return;
    }
    for (int r = 1; r < ctx->world_size; r++) {
        snprintf(mark, sizeof mark, "%s.released.%d", path, r);
        for (int i = 0; i < 60000 && access(mark, F_OK) != 0; i++)
            td_sleep_ms(1);
        unlink(mark);
    }
    unlink(path);
}

static int64_t after_ms(int64_t ms) { return td_now_ns() + ms * 1000000; }
static double since_s(int64_t t0) { return (double)(td_now_ns() - t0) / 1e9; }

typedef struct tw {
    td_store *store;
    td_transport *t;
    const td_test_ctx *ctx;
    bool keep_store; /* a rank died: leave the file (the case allows leftovers) */
} tw;

#define BOTH .params = "unix,tcp"

static int same_host(const td_test_ctx *ctx)
{
    return strcmp(ctx->param, "tcp") == 0 ? TD_TCP_SAME_HOST_TCP : TD_TCP_SAME_HOST_UNIX;
}

static tw open_world(td_test_ctx *ctx, const char *bind_host, int64_t timeout_ms)
{
    tw w = {0};
    w.ctx = ctx;
    w.store = open_store(ctx->store_path);
    td_tcp_options o = {
        .setup.store = w.store,
        .setup.rank = ctx->rank,
        .setup.size = ctx->world_size,
        .setup.timeout_ms = timeout_ms ? timeout_ms : 30000,
        .setup.group_name = "test",
        .bind_host = bind_host,
        .same_host = same_host(ctx),
    };
    TD_CHECK_OK(td_tcp_transport_create(&o, &w.t));
    TD_CHECK_EQ(w.t->rank, ctx->rank);
    TD_CHECK_EQ(w.t->size, ctx->world_size);
    for (int r = 0; r < ctx->world_size; r++)
        if (r != ctx->rank)
            TD_CHECK_EQ(td_tcp_transport_peer_is_local(w.t, r), same_host(ctx) == TD_TCP_SAME_HOST_UNIX);
    return w;
}

static void close_world(tw *w)
{
    td_transport_destroy(w->t);
    if (w->keep_store)
        td_store_release(w->store);
    else
        close_store(w->ctx, w->store, w->ctx->store_path);
}

/* Every rank sets its key, then waits for everyone's (a barrier that does not use the transport). */
static void store_barrier(td_test_ctx *ctx, td_store *store, const char *name)
{
    char key[64], keys[8][64];
    const char *kp[8];
    snprintf(key, sizeof key, "%s/%d", name, ctx->rank);
    TD_CHECK_OK(td_store_set_str(store, key, "1"));
    for (int r = 0; r < ctx->world_size; r++) {
        snprintf(keys[r], sizeof keys[r], "%s/%d", name, r);
        kp[r] = keys[r];
    }
    TD_CHECK_OK(td_store_wait(store, kp, (size_t)ctx->world_size, 30000));
}

static unsigned char pattern(int from, int to, size_t i) { return (unsigned char)(from * 31 + to * 7 + i * 13 + (i >> 9)); }

/* A ring exchange over every connection: each rank sends to every other and receives from each. */
static void all_pairs(td_test_ctx *ctx, td_transport *t, size_t len)
{
    int n = ctx->world_size, me = ctx->rank;
    unsigned char *out = malloc(len + 1), *in = malloc((len + 1) * (size_t)n);
    td_xfer xs[16];
    int k = 0;
    for (size_t i = 0; i < len; i++)
        out[i] = pattern(me, 0, i);
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        xs[k].on_done = NULL;
        TD_CHECK_OK(td_transport_irecv1(t, p, 42, in + (size_t)p * (len + 1), len, after_ms(30000), &xs[k++]));
        xs[k].on_done = NULL;
        TD_CHECK_OK(td_transport_isend1(t, p, 42, out, len, after_ms(30000), &xs[k++]));
    }
    TD_CHECK_OK(td_transport_wait_all(t, xs, k, after_ms(30000)));
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        for (size_t i = 0; i < len; i++)
            TD_CHECK_MSG(in[(size_t)p * (len + 1) + i] == pattern(p, 0, i), "byte %zu from rank %d is wrong", i, p);
    }
    for (int i = 0; i < k; i += 2)
        TD_CHECK_EQ(xs[i].peer, i / 2 + (i / 2 >= me));
    free(out);
    free(in);
}

static void connect_body(td_test_ctx *ctx)
{
    tw w = open_world(ctx, NULL, 0);
    all_pairs(ctx, w.t, 1000);
    close_world(&w);
}

TD_TEST(connect_world_2, .world_size = 2, BOTH) { connect_body(ctx); }
TD_TEST(connect_world_3, .world_size = 3, BOTH) { connect_body(ctx); }
TD_TEST(connect_world_4, .world_size = 4, BOTH) { connect_body(ctx); }

TD_TEST(connect_world_1, .world_size = 1)
{
    tw w = open_world(ctx, NULL, 0);
    td_xfer x = {0};
    TD_CHECK_ERR(td_transport_isend1(w.t, 0, 1, "x", 1, after_ms(1000), &x), TD_ERR_INVALID, "invalid peer rank 0");
    close_world(&w);
}

static bool ipv6_loopback(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

TD_TEST(connect_ipv6, .world_size = 3, BOTH)
{
    if (!ipv6_loopback())
        TD_SKIP(TD_SKIP_GENERIC, "no IPv6 loopback");
    tw w = open_world(ctx, "::1", 0);
    all_pairs(ctx, w.t, 5000);
    char key[64];
    snprintf(key, sizeof key, "tcp/1/addr/%d", ctx->rank);
    void *v = NULL;
    size_t n = 0;
    TD_CHECK_OK(td_store_get(w.store, key, &v, &n));
    TD_CHECK_MSG(strncmp(v, "[::1]:", 6) == 0, "published address '%s' is not bracketed IPv6", (char *)v);
    free(v);
    close_world(&w);
}

TD_TEST(connect_socket_ifname, .world_size = 2, BOTH)
{
    /* TDIST_SOCKET_IFNAME picks the interface; "lo" always exists. The library only reads the
     * environment; the test's rank processes are single-threaded here. */
    setenv("TDIST_SOCKET_IFNAME", "lo", 1);
    tw w = open_world(ctx, NULL, 0);
    all_pairs(ctx, w.t, 10);
    close_world(&w);
    setenv("TDIST_SOCKET_IFNAME", "tdist-no-such-if0", 1);
    td_store *store;
    char path[1024];
    snprintf(path, sizeof path, "%s/store2", ctx->tmpdir);
    store = open_store(path);
    td_tcp_options o = {.setup.store = store, .setup.rank = ctx->rank, .setup.size = ctx->world_size,
                        .setup.timeout_ms = 5000,
                        .same_host = same_host(ctx)};
    td_transport *t = NULL;
    TD_CHECK_ERR(td_tcp_transport_create(&o, &t), TD_ERR_INVALID, "interface 'tdist-no-such-if0', which does not exist");
    unsetenv("TDIST_SOCKET_IFNAME");
    close_store(ctx, store, path);
}

/* Messages of sizes 0, 1, odd and large, gathered from and scattered into several buffers, in
 * both directions at once. */
TD_TEST(sizes_and_iovecs, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    int peer = 1 - ctx->rank;
    const size_t sizes[] = {0, 1, 2, 7, 4095, 16385, 65537, 3 * 1024 * 1024 + 3};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t len = sizes[si];
        unsigned char *out = malloc(len + 3), *in = malloc(len + 3);
        for (size_t i = 0; i < len; i++)
            out[i] = pattern(ctx->rank, peer, i);
        memset(in, 0xEE, len + 3);
        /* Three pieces of uneven sizes on both sides, cut at different places. */
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
    close_world(&w);
}

/* Receives posted in another order than the sends, some before and some after the data came;
 * several messages with one tag arrive in order. */
TD_TEST(tag_matching_out_of_order, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    if (ctx->rank == 0) {
        for (int tag = 1; tag <= 6; tag++) {
            int v[2] = {tag, tag * 100};
            TD_CHECK_OK(td_transport_send(w.t, 1, (uint64_t)tag, v, sizeof v, after_ms(30000)));
        }
        for (int i = 0; i < 5; i++)
            TD_CHECK_OK(td_transport_send(w.t, 1, 77, &i, sizeof i, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 1000, "go", 2, after_ms(30000)));
    } else {
        /* Tag 6 first: it comes last, so tags 1..5 arrive unexpected meanwhile. */
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
    /* Posted before anything is sent: receives wait in their queue. */
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
    close_world(&w);
}

/* Any-source receives take messages from whichever rank sends; a specific receive posted earlier
 * wins over an any-source one for its sender. */
TD_TEST(any_source, .world_size = 4, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
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
        /* A specific receive from 2 and an any-source one, both posted before the data. */
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
    store_barrier(ctx, w.store, "done");
    close_world(&w);
}

/* Messages that arrive before their receive is posted are buffered by the I/O thread (the sends
 * complete although nothing is posted yet), large ones included. */
TD_TEST(unexpected_messages, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
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
    store_barrier(ctx, w.store, "done");
    close_world(&w);
}

/* A receive of the wrong size fails alone, naming both sizes; the connection carries on. */
TD_TEST(length_mismatch, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    if (ctx->rank == 0) {
        char b[12] = "abcdefghijk";
        TD_CHECK_OK(td_transport_send(w.t, 1, 5, b, 12, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 6, b, 3, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 7, b, 12, after_ms(30000)));
        TD_CHECK_OK(td_transport_send(w.t, 1, 8, b, 4, after_ms(30000)));
    } else {
        char b[64];
        /* Posted first: the payload is discarded as it arrives. */
        TD_CHECK_ERR(td_transport_recv(w.t, 0, 5, b, 8, after_ms(30000)), TD_ERR_INVALID,
                     "rank 0 sent 12 bytes (tag 5) to a receive of 8 bytes");
        TD_CHECK_OK(td_transport_recv(w.t, 0, 6, b, 3, after_ms(30000)));
        TD_CHECK(memcmp(b, "abc", 3) == 0);
        /* Posted after the message came (unexpected): same error. */
        TD_CHECK_OK(td_transport_recv(w.t, 0, 8, b, 4, after_ms(30000)));
        TD_CHECK_ERR(td_transport_recv(w.t, 0, 7, b, 20, after_ms(30000)), TD_ERR_INVALID,
                     "sent 12 bytes (tag 7) to a receive of 20 bytes");
    }
    store_barrier(ctx, w.store, "done");
    close_world(&w);
}

/* Rank 2 dies by SIGKILL: every survivor fails at once (well within 2 seconds) with
 * TD_ERR_PEER_LOST naming it, also while waiting on a different peer, and so does every later
 * operation. */
TD_TEST(peer_killed, .world_size = 3, .skip_return_code_check = true, .allow_leftovers = true, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    all_pairs(ctx, w.t, 100);
    store_barrier(ctx, w.store, "ready");
    if (ctx->rank == 2) {
        td_sleep_ms(300);
        raise(SIGKILL);
    }
    /* Rank 0 waits on rank 1, which never sends; rank 1 waits on rank 2. */
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
    w.keep_store = true;
    close_world(&w);
}

/* A receive whose peer stalls fails at its deadline with TD_ERR_TIMEOUT; the transport is then
 * broken, and the stalled peer learns it at once (PEER_LOST naming the rank that timed out). */
TD_TEST(timeout, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    char b[4];
    if (ctx->rank == 1) {
        int64_t t0 = td_now_ns();
        TD_CHECK_ERR(td_transport_recv(w.t, 0, 1, b, 4, after_ms(300)), TD_ERR_TIMEOUT,
                     "Timed out waiting for a receive from rank 0 (4 bytes, tag 1)");
        double dt = since_s(t0);
        TD_CHECK_MSG(dt >= 0.29 && dt < 10, "timed out after %.2f s", dt);
        TD_CHECK_ERR(td_transport_send(w.t, 0, 1, b, 4, after_ms(300)), TD_ERR_TIMEOUT, "Timed out");
    } else {
        TD_CHECK_ERR(td_transport_recv(w.t, 1, 2, b, 4, after_ms(60000)), TD_ERR_PEER_LOST, "Connection to rank 1 lost");
    }
    close_world(&w);
}

static void *abort_later(void *arg)
{
    td_sleep_ms(100);
    td_transport_abort(arg, TD_ERR_CLOSED, "aborted by the test");
    return NULL;
}

/* abort fails what is pending (from another thread, waking the waiter) and everything later. */
TD_TEST(abort_wakes_waiters, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
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
    store_barrier(ctx, w.store, "done");
    close_world(&w);
}

/* A rank that destroys its transport says goodbye: the others fail only what involves it and
 * keep talking among themselves. */
TD_TEST(orderly_close, .world_size = 3, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    all_pairs(ctx, w.t, 64);
    if (ctx->rank == 2) {
        store_barrier(ctx, w.store, "synced");
        close_world(&w);
        return;
    }
    store_barrier(ctx, w.store, "synced");
    char b[4];
    TD_CHECK_ERR(td_transport_recv(w.t, 2, 1, b, 4, after_ms(30000)), TD_ERR_PEER_LOST,
                 "rank 2 closed its end");
    for (int i = 0; i < 3; i++) {
        int v = ctx->rank * 10 + i, got = -1;
        TD_CHECK_OK(td_transport_sendrecv(w.t, 1 - ctx->rank, &v, sizeof v, 1 - ctx->rank, &got, sizeof got, 5,
                                          after_ms(30000)));
        TD_CHECK_EQ(got, (1 - ctx->rank) * 10 + i);
    }
    TD_CHECK_ERR(td_transport_send(w.t, 2, 1, b, 4, after_ms(30000)), TD_ERR_PEER_LOST, "rank 2 closed its end");
    close_world(&w);
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
 * nobody waiting: the I/O thread moves everything. */
TD_TEST(callbacks_any_order, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
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
    store_barrier(ctx, w.store, "done");
    close_world(&w);
}

/* A rank with another auth token is refused with a clear message; the refusing rank times out
 * naming the refusal. */
TD_TEST(auth_token_mismatch, .world_size = 2, BOTH)
{
    setenv("TDIST_AUTH_TOKEN", ctx->rank == 0 ? "secret-a" : "secret-b", 1);
    td_store *store;
    store = open_store(ctx->store_path);
    td_tcp_options o = {.setup.store = store, .setup.rank = ctx->rank, .setup.size = 2, .setup.timeout_ms = 3000,
                        .setup.group_name = "g",
                        .same_host = same_host(ctx)};
    td_transport *t = NULL;
    if (ctx->rank == 0)
        TD_CHECK_ERR(td_tcp_transport_create(&o, &t), TD_ERR_INVALID,
                     "rank 1 refused the connection from rank 0: authentication failed");
    else
        TD_CHECK_ERR(td_tcp_transport_create(&o, &t), TD_ERR_TIMEOUT, "no connection yet with rank 0; last refused");
    unsetenv("TDIST_AUTH_TOKEN");
    store_barrier(ctx, store, "done");
    close_store(ctx, store, ctx->store_path);
}

/* The same token on both sides is accepted. */
TD_TEST(auth_token_match, .world_size = 2, BOTH)
{
    setenv("TDIST_AUTH_TOKEN", "shared-secret", 1);
    tw w = open_world(ctx, NULL, 0);
    unsetenv("TDIST_AUTH_TOKEN");
    all_pairs(ctx, w.t, 10);
    close_world(&w);
}

/* A rank that never shows up: set-up fails at the timeout naming it. */
TD_TEST(setup_timeout, .world_size = 2, BOTH)
{
    td_store *store;
    store = open_store(ctx->store_path);
    if (ctx->rank == 0) {
        td_tcp_options o = {.setup.store = store, .setup.rank = 0, .setup.size = 3, .setup.timeout_ms = 500,
                            .setup.group_name = "g",
                            .same_host = same_host(ctx)};
        td_transport *t = NULL;
        TD_CHECK_ERR(td_tcp_transport_create(&o, &t), TD_ERR_TIMEOUT, "rank 1");
    }
    store_barrier(ctx, store, "done");
    close_store(ctx, store, ctx->store_path);
}

/* ---- single-copy transfers (collective tags, 64 KiB and up, over UNIX-domain sockets) ---------- */

#define COLL_TAG(x) ((UINT64_C(1) << 63) | (uint64_t)(x))

/* Large collective-tagged messages in both directions at once, from and into several pieces:
 * single copy over "unix", the stream over "tcp"; the same bytes either way. */
TD_TEST(rendezvous_sizes, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    int peer = 1 - ctx->rank;
    const size_t sizes[] = {65535, 65536, 65537, 1024 * 1024 + 3, 5 * 1024 * 1024};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t len = sizes[si];
        unsigned char *out = malloc(len), *in = malloc(len + 1);
        for (size_t i = 0; i < len; i++)
            out[i] = pattern(ctx->rank, peer, i);
        in[len] = 0xEE;
        size_t a = len / 3, b = len / 2;
        struct iovec siov[3] = {{out, a}, {out + a, len - a - len / 5}, {out + len - len / 5, len / 5}};
        struct iovec riov[2] = {{in, b}, {in + b, len - b}};
        td_xfer xs[2];
        xs[0].on_done = xs[1].on_done = NULL;
        TD_CHECK_OK(td_transport_irecv(w.t, peer, COLL_TAG(si), riov, 2, after_ms(30000), &xs[0]));
        TD_CHECK_OK(td_transport_isend(w.t, peer, COLL_TAG(si), siov, 3, after_ms(30000), &xs[1]));
        TD_CHECK_OK(td_transport_wait_all(w.t, xs, 2, after_ms(30000)));
        TD_CHECK_EQ(xs[0].nbytes, len);
        TD_CHECK_EQ(xs[1].nbytes, len);
        for (size_t i = 0; i < len; i++)
            TD_CHECK_MSG(in[i] == pattern(peer, ctx->rank, i), "size %zu: byte %zu differs", len, i);
        TD_CHECK(in[len] == 0xEE);
        free(out);
        free(in);
    }
    close_world(&w);
}

/* The receive comes after the message was announced; a receive of another size fails alone (and
 * the send completes); several messages with one tag keep their order. */
TD_TEST(rendezvous_late_and_mismatched, .world_size = 2, BOTH)
{
    tw w = open_world(ctx, NULL, 0);
    size_t len = 200000;
    enum { N = 3 };
    unsigned char *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(len);
        memset(bufs[i], ctx->rank == 0 ? 'a' + i : 0, len);
    }
    if (ctx->rank == 0) {
        td_xfer xs[N + 1];
        for (int i = 0; i < N; i++) {
            xs[i].on_done = NULL;
            TD_CHECK_OK(td_transport_isend1(w.t, 1, COLL_TAG(7), bufs[i], len, after_ms(30000), &xs[i]));
        }
        xs[N].on_done = NULL;
        TD_CHECK_OK(td_transport_isend1(w.t, 1, COLL_TAG(8), bufs[0], len, after_ms(30000), &xs[N]));
        TD_CHECK_OK(td_store_set_str(w.store, "announced", "1"));
        TD_CHECK_OK(td_transport_wait_all(w.t, xs, N + 1, after_ms(30000)));
    } else {
        const char *k = "announced";
        TD_CHECK_OK(td_store_wait(w.store, &k, 1, 30000));
        td_sleep_ms(50);
        for (int i = 0; i < N; i++) {
            TD_CHECK_OK(td_transport_recv(w.t, 0, COLL_TAG(7), bufs[i], len, after_ms(30000)));
            for (size_t j = 0; j < len; j += 997)
                TD_CHECK_EQ(bufs[i][j], 'a' + i);
        }
        TD_CHECK_ERR(td_transport_recv(w.t, 0, COLL_TAG(8), bufs[0], len - 1, after_ms(30000)), TD_ERR_INVALID,
                     "rank 0 sent 200000 bytes");
    }
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    store_barrier(ctx, w.store, "done");
    close_world(&w);
}

/* A rank dies while a large message waits in its peer's memory for it: the sender's send fails
 * at once, naming it. (Over TCP the send completes into the socket buffers instead.) */
TD_TEST(rendezvous_reader_killed, .world_size = 2, .skip_return_code_check = true, .allow_leftovers = true,
        .params = "unix")
{
    tw w = open_world(ctx, NULL, 0);
    all_pairs(ctx, w.t, 10);
    store_barrier(ctx, w.store, "ready");
    if (ctx->rank == 1) {
        td_sleep_ms(200);
        raise(SIGKILL);
    }
    size_t len = 1 << 20;
    char *buf = calloc(1, len);
    int64_t t0 = td_now_ns();
    TD_CHECK_ERR(td_transport_send(w.t, 1, COLL_TAG(1), buf, len, after_ms(60000)), TD_ERR_PEER_LOST,
                 "Connection to rank 1 lost");
    TD_CHECK(since_s(t0) < 2.2);
    free(buf);
    w.keep_store = true;
    close_world(&w);
}

/* Groups made and destroyed again and again on one store: no fd or thread stays behind (the
 * harness compares both around the body), and a new group never reads an old one's addresses. */
TD_TEST(create_destroy_repeatedly, .world_size = 3, BOTH)
{
    td_store *store;
    store = open_store(ctx->store_path);
    for (int i = 0; i < 8; i++) {
        td_tcp_options o = {.setup.store = store, .setup.rank = ctx->rank, .setup.size = 3, .setup.timeout_ms = 30000,
                            .setup.group_name = "again",
                            .same_host = same_host(ctx)};
        td_transport *t = NULL;
        TD_CHECK_OK(td_tcp_transport_create(&o, &t));
        all_pairs(ctx, t, (size_t)i * 1000);
        td_transport_destroy(t);
    }
    store_barrier(ctx, store, "done");
    close_store(ctx, store, ctx->store_path);
}

TD_TEST_MAIN()
