/* The tcp transport (src/transport/tcp.h) between real rank processes over real sockets, each case
 * over TCP and over UNIX-domain sockets (param "tcp" / "unix"): set-up through a FileStore for
 * worlds 2 to 4 (IPv4 and IPv6), messages of every size with iovecs, tag
 * matching out of order, any-source receives, unexpected messages, length mismatches, a peer
 * killed with SIGKILL, timeouts, aborts, orderly closes, refused handshakes, and no fd or thread
 * left after destroy (the harness checks both after every case). The cases every transport passes
 * are written once in tests/support/transport_util.c; the shm transport runs them too. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <tdist/store.h>
#include <tdist/testing.h>

#include "../support/transport_util.h"
#include "base/clock.h"
#include "transport/tcp.h"

#define BOTH .params = "unix,tcp"

static int same_host(const td_test_ctx *ctx)
{
    return strcmp(ctx->param, "tcp") == 0 ? TD_TCP_SAME_HOST_TCP : TD_TCP_SAME_HOST_UNIX;
}

static td_status create(const td_test_ctx *ctx, const td_transport_setup *setup, td_transport **out)
{
    td_tcp_options o = {.setup = *setup, .same_host = same_host(ctx)};
    return tcp_transport_create(&o, out);
}

static tu_world open_world(td_test_ctx *ctx, const char *bind_host, int64_t timeout_ms)
{
    tu_world w = {0};
    w.ctx = ctx;
    w.store = tu_store_open(ctx->store_path);
    td_tcp_options o = {.setup = tu_setup(ctx, w.store, timeout_ms, "test"), .bind_host = bind_host,
                        .same_host = same_host(ctx)};
    TD_CHECK_OK(tcp_transport_create(&o, &w.t));
    TD_CHECK_EQ(w.t->rank, ctx->rank);
    TD_CHECK_EQ(w.t->size, ctx->world_size);
    for (int r = 0; r < ctx->world_size; r++)
        if (r != ctx->rank)
            TD_CHECK_EQ(tcp_transport_peer_is_local(w.t, r), same_host(ctx) == TD_TCP_SAME_HOST_UNIX);
    return w;
}

static void connect_body(td_test_ctx *ctx)
{
    tu_world w = open_world(ctx, NULL, 0);
    tu_all_pairs(ctx, w.t, 1000);
    tu_world_close(&w);
}

TD_TEST(connect_world_2, .world_size = 2, BOTH) { connect_body(ctx); }
TD_TEST(connect_world_3, .world_size = 3, BOTH) { connect_body(ctx); }
TD_TEST(connect_world_4, .world_size = 4, BOTH) { connect_body(ctx); }

TD_TEST(connect_world_1, .world_size = 1)
{
    tu_world w = open_world(ctx, NULL, 0);
    tu_case_world_1(&w);
    tu_world_close(&w);
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
    tu_world w = open_world(ctx, "::1", 0);
    tu_all_pairs(ctx, w.t, 5000);
    char key[64];
    snprintf(key, sizeof key, "tcp/1/addr/%d", ctx->rank);
    void *v = NULL;
    size_t n = 0;
    TD_CHECK_OK(td_store_get(w.store, key, &v, &n));
    TD_CHECK_MSG(strncmp(v, "[::1]:", 6) == 0, "published address '%s' is not bracketed IPv6", (char *)v);
    free(v);
    tu_world_close(&w);
}

TD_TEST(connect_socket_ifname, .world_size = 2, BOTH)
{
    /* TDIST_SOCKET_IFNAME picks the interface; "lo" always exists. The library only reads the
     * environment; the test's rank processes are single-threaded here. */
    setenv("TDIST_SOCKET_IFNAME", "lo", 1);
    tu_world w = open_world(ctx, NULL, 0);
    tu_all_pairs(ctx, w.t, 10);
    tu_world_close(&w);
    setenv("TDIST_SOCKET_IFNAME", "tdist-no-such-if0", 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/store2", ctx->tmpdir);
    td_store *store = tu_store_open(path);
    td_transport_setup g = tu_setup(ctx, store, 5000, NULL);
    td_transport *t = NULL;
    TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID, "interface 'tdist-no-such-if0', which does not exist");
    unsetenv("TDIST_SOCKET_IFNAME");
    tu_store_close(ctx, store, path);
}

/* The cases every transport passes (transport_util.h), over TCP and UNIX-domain sockets; the
 * stalled peer of "timeout" learns at once that its connection was cut. */
static tu_world open_default(td_test_ctx *ctx) { return open_world(ctx, NULL, 0); }

static const size_t message_sizes[] = {0, 1, 2, 7, 4095, 16385, 65537, 3 * 1024 * 1024 + 3};

TU_TRANSPORT_CASES(open_default, message_sizes, TD_ERR_PEER_LOST, "Connection to rank 1 lost", BOTH)

/* A rank that destroys its transport says goodbye: the others fail only what involves it and
 * keep talking among themselves. */
TD_TEST(orderly_close, .world_size = 3, BOTH)
{
    tu_world w = open_world(ctx, NULL, 0);
    tu_all_pairs(ctx, w.t, 64);
    if (ctx->rank == 2) {
        tu_barrier(ctx, w.store, "synced");
        tu_world_close(&w);
        return;
    }
    tu_barrier(ctx, w.store, "synced");
    tu_check_after_close(&w);
    tu_world_close(&w);
}

TD_TEST(setup_timeout, .world_size = 2, BOTH) { tu_case_setup_timeout(ctx, create); }
TD_TEST(create_destroy_repeatedly, .world_size = 3, BOTH) { tu_case_create_destroy_repeatedly(ctx, create); }

/* A rank with another auth token is refused with a clear message; the refusing rank times out
 * naming the refusal. */
TD_TEST(auth_token_mismatch, .world_size = 2, BOTH)
{
    setenv("TDIST_AUTH_TOKEN", ctx->rank == 0 ? "secret-a" : "secret-b", 1);
    td_store *store = tu_store_open(ctx->store_path);
    td_transport_setup g = tu_setup(ctx, store, 3000, "g");
    td_transport *t = NULL;
    if (ctx->rank == 0)
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID,
                     "rank 1 refused the connection from rank 0: authentication failed");
    else
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_TIMEOUT, "no connection yet with rank 0; last refused");
    unsetenv("TDIST_AUTH_TOKEN");
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}

/* The same token on both sides is accepted. */
TD_TEST(auth_token_match, .world_size = 2, BOTH)
{
    setenv("TDIST_AUTH_TOKEN", "shared-secret", 1);
    tu_world w = open_world(ctx, NULL, 0);
    unsetenv("TDIST_AUTH_TOKEN");
    tu_all_pairs(ctx, w.t, 10);
    tu_world_close(&w);
}

/* ---- single-copy transfers (sends to surely posted receives, 64 KiB and up, over UNIX-domain
 * sockets) -------------------------------------------------------------------------------------- */

#define COLL_TAG(x) ((UINT64_C(1) << 63) | (uint64_t)(x)) /* the tags collectives use */

/* Large collective-tagged messages in both directions at once, from and into several pieces:
 * single copy over "unix", the stream over "tcp"; the same bytes either way. */
TD_TEST(rendezvous_sizes, .world_size = 2, BOTH)
{
    tu_world w = open_world(ctx, NULL, 0);
    int peer = 1 - ctx->rank;
    const size_t sizes[] = {65535, 65536, 65537, 1024 * 1024 + 3, 5 * 1024 * 1024};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t len = sizes[si];
        unsigned char *out = malloc(len), *in = malloc(len + 1);
        for (size_t i = 0; i < len; i++)
            out[i] = tu_pattern(ctx->rank, peer, i);
        in[len] = 0xEE;
        size_t a = len / 3, b = len / 2;
        struct iovec siov[3] = {{out, a}, {out + a, len - a - len / 5}, {out + len - len / 5, len / 5}};
        struct iovec riov[2] = {{in, b}, {in + b, len - b}};
        td_xfer xs[2];
        xs[0].on_done = xs[1].on_done = NULL;
        TD_CHECK_OK(transport_irecv(w.t, peer, COLL_TAG(si), riov, 2, tu_after_ms(30000), &xs[0]));
        TD_CHECK_OK(transport_isend_posted(w.t, peer, COLL_TAG(si), siov, 3, tu_after_ms(30000), &xs[1]));
        TD_CHECK_OK(transport_wait_all(w.t, xs, 2, tu_after_ms(30000)));
        TD_CHECK_EQ(xs[0].nbytes, len);
        TD_CHECK_EQ(xs[1].nbytes, len);
        for (size_t i = 0; i < len; i++)
            TD_CHECK_MSG(in[i] == tu_pattern(peer, ctx->rank, i), "size %zu: byte %zu differs", len, i);
        TD_CHECK(in[len] == 0xEE);
        free(out);
        free(in);
    }
    tu_world_close(&w);
}

/* The receive comes after the message was announced; a receive of another size fails alone (and
 * the send completes); several messages with one tag keep their order. */
TD_TEST(rendezvous_late_and_mismatched, .world_size = 2, BOTH)
{
    tu_world w = open_world(ctx, NULL, 0);
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
            TD_CHECK_OK(transport_isend1_posted(w.t, 1, COLL_TAG(7), bufs[i], len, tu_after_ms(30000), &xs[i]));
        }
        xs[N].on_done = NULL;
        TD_CHECK_OK(transport_isend1_posted(w.t, 1, COLL_TAG(8), bufs[0], len, tu_after_ms(30000), &xs[N]));
        TD_CHECK_OK(td_store_set_str(w.store, "announced", "1"));
        TD_CHECK_OK(transport_wait_all(w.t, xs, N + 1, tu_after_ms(30000)));
    } else {
        const char *k = "announced";
        TD_CHECK_OK(td_store_wait(w.store, &k, 1, 30000));
        clock_sleep_ms(50);
        for (int i = 0; i < N; i++) {
            TD_CHECK_OK(transport_recv(w.t, 0, COLL_TAG(7), bufs[i], len, tu_after_ms(30000)));
            for (size_t j = 0; j < len; j += 997)
                TD_CHECK_EQ(bufs[i][j], 'a' + i);
        }
        TD_CHECK_ERR(transport_recv(w.t, 0, COLL_TAG(8), bufs[0], len - 1, tu_after_ms(30000)), TD_ERR_INVALID,
                     "rank 0 sent 200000 bytes");
    }
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    tu_barrier(ctx, w.store, "done");
    tu_world_close(&w);
}

/* A rank dies while a large message waits in its peer's memory for it: the sender's send fails
 * at once, naming it. (Over TCP the send completes into the socket buffers instead.) */
TD_TEST(rendezvous_reader_killed, .world_size = 2, .skip_return_code_check = true, .allow_leftovers = true,
        .params = "unix")
{
    tu_world w = open_world(ctx, NULL, 0);
    tu_all_pairs(ctx, w.t, 10);
    tu_barrier(ctx, w.store, "ready");
    if (ctx->rank == 1) {
        clock_sleep_ms(200);
        raise(SIGKILL);
    }
    size_t len = 1 << 20;
    char *buf = calloc(1, len);
    int64_t t0 = clock_now_ns();
    td_xfer x = {.on_done = NULL};
    TD_CHECK_OK(transport_isend1_posted(w.t, 1, COLL_TAG(1), buf, len, tu_after_ms(60000), &x));
    TD_CHECK_ERR(transport_wait(w.t, &x, tu_after_ms(60000)), TD_ERR_PEER_LOST, "Connection to rank 1 lost");
    TD_CHECK(tu_since_s(t0) < 2.2);
    free(buf);
    w.keep_store = true;
    tu_world_close(&w);
}

TD_TEST_MAIN()
