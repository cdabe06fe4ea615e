/* The tcp transport (src/transport/tcp.h) between real rank processes over real sockets, each case
 * over TCP and over UNIX-domain sockets (param "tcp" / "unix"): set-up through a FileStore for
 * worlds 2 to 4 (IPv4 and IPv6), messages of every size with iovecs, tag
 * matching out of order, any-source receives, unexpected messages, length mismatches, a peer
 * killed with SIGKILL, timeouts, aborts, orderly closes, refused handshakes, the job secret's
 * proofs (mismatch, one side only, an impostor, the secret's absence from the wire), and no fd or thread
 * left after destroy (the harness checks both after every case). The cases every transport passes
 * are written once in tests/support/transport_util.c; the shm transport runs them too. */
#include <poll.h>
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
#include "base/host.h"
#include "net/auth.h"
#include "net/io.h"
#include "net/socket.h"
#include "transport/samehost.h"
#include "transport/tcp.h"
#include "transport/tcp_proto.h"

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

/* ---- the job secret (TDIST_AUTH_TOKEN) ---------------------------------------------------------
 * Rank 0 connects to rank 1 and proves the secret in its hello; rank 1 proves it back in its
 * accept. A failure fails rank 0 at once with the message and rank 1 at its timeout, naming the
 * refusal; nobody hangs. */


TD_TEST(auth_secret_mismatch, .world_size = 2, BOTH)
{
    const char *why = "authentication failed: the connecting rank's TDIST_AUTH_TOKEN does not match rank 1's";
    char want0[256];
    snprintf(want0, sizeof want0, "rank 1 refused the connection from rank 0: %s", why);
    tu_case_auth_refused(ctx, create, "secret-a", "secret-b", want0, why);
}

TD_TEST(auth_secret_listener_only, .world_size = 2, BOTH)
{
    const char *why =
        "authentication failed: rank 1 requires the job's secret (TDIST_AUTH_TOKEN) and the connecting rank has none";
    char want0[256];
    snprintf(want0, sizeof want0, "rank 1 refused the connection from rank 0: %s", why);
    tu_case_auth_refused(ctx, create, NULL, "secret-b", want0, why);
}

TD_TEST(auth_secret_connector_only, .world_size = 2, BOTH)
{
    tu_case_auth_refused(ctx, create, "secret-a", NULL,
                 "authentication failed: rank 1 does not authenticate (it has no TDIST_AUTH_TOKEN) but this rank has one",
                 "authentication failed: rank 1 does not authenticate (it has no TDIST_AUTH_TOKEN) but the connecting "
                 "rank has one");
}

/* The same secret on every rank is accepted. */
TD_TEST(auth_secret_match, .world_size = 3, BOTH)
{
    setenv("TDIST_AUTH_TOKEN", "shared-secret", 1);
    tu_world w = open_world(ctx, NULL, 0);
    unsetenv("TDIST_AUTH_TOKEN");
    tu_all_pairs(ctx, w.t, 10);
    tu_world_close(&w);
}

#define WIRE_SECRET "tdist-wire-secret-5f3c9a1e-never-on-the-wire"

/* A connection to rank 1 as its entry names it: its UNIX socket under "unix", else TCP. */
static int connect_entry(const td_test_ctx *ctx, const td_tcp_entry *e)
{
    int fd = -1;
    if (strcmp(ctx->param, "unix") == 0) {
        TD_CHECK_MSG(strcmp(e->unix_name, "-") != 0, "rank 1 published no UNIX socket");
        fd = samehost_unix_connect(e->unix_name);
        TD_CHECK(fd >= 0);
    } else {
        TD_CHECK_OK(net_connect(e->host, e->port, tu_after_ms(10000), &fd));
    }
    TD_CHECK_OK(net_set_nonblocking(fd, true));
    return fd;
}

/* Reads a whole answer into b (TD_TCP_REPLY_MAX bytes). */
static size_t read_answer(int fd, uint8_t *b, td_tcp_reply *rep)
{
    size_t got = 0;
    for (;;) {
        size_t need = 0;
        const char *why = NULL;
        td_tcp_parse pr = tcp_reply_parse(b, got, rep, &need, &why);
        TD_CHECK_MSG(pr != TD_TCP_PARSE_BAD, "malformed answer: %s", why);
        if (pr == TD_TCP_PARSE_OK)
            return need;
        TD_CHECK_OK(net_recv_all(fd, b + got, need - got, tu_after_ms(10000)));
        got = need;
    }
}

/* An impostor that read rank 1's entry (address and nonce) but lacks the secret sends forged
 * hellos: no proof, a made-up proof, and a real proof over other bytes (taken from a genuine hello
 * whose nonce it then changed). Each is refused, no answer carries the secret, and the real group
 * forms after them. */
TD_TEST(auth_impostor_refused, .world_size = 2, BOTH)
{
    setenv("TDIST_AUTH_TOKEN", WIRE_SECRET, 1);
    if (ctx->rank == 1) {
        tu_world w = open_world(ctx, NULL, 0);
        tu_all_pairs(ctx, w.t, 100);
        tu_world_close(&w);
        unsetenv("TDIST_AUTH_TOKEN");
        return;
    }
    td_store *store = tu_store_open(ctx->store_path);
    const char *key = "tcp/1/addr/1";
    TD_CHECK_OK(td_store_wait(store, &key, 1, 30000));
    char *text = NULL;
    size_t n = 0;
    TD_CHECK_OK(td_store_get(store, key, (void **)&text, &n));
    text = realloc(text, n + 1);
    text[n] = '\0';
    td_tcp_entry e;
    TD_CHECK_OK(tcp_entry_parse(text, 1, &e));
    free(text);
    auth_key real;
    TD_CHECK_OK(auth_key_init(WIRE_SECRET, &real));
    static const struct {
        uint16_t flags;
        int proof; /* 0 zeros, 1 made up, 2 genuine then the nonce changed */
        const char *want;
    } forged[] = {
        {0, 0, "rank 1 requires the job's secret (TDIST_AUTH_TOKEN) and the connecting rank has none"},
        {TD_TCP_FLAG_AUTH, 1, "the connecting rank's TDIST_AUTH_TOKEN does not match rank 1's"},
        {TD_TCP_FLAG_AUTH, 2, "the connecting rank's TDIST_AUTH_TOKEN does not match rank 1's"},
    };
    for (size_t k = 0; k < sizeof forged / sizeof forged[0]; k++) {
        td_tcp_hello h = {.version = TD_TCP_VERSION, .flags = forged[k].flags, .from = 0, .to = 1, .world = 2,
                          .nonce = e.nonce, .group = "test", .group_len = 4};
        auth_nonce(h.conn_nonce);
        if (forged[k].proof == 1)
            auth_nonce(h.proof);
        uint8_t b[TD_TCP_HELLO_MAX];
        size_t len = tcp_hello_encode(b, &h);
        if (forged[k].proof == 2) {
            auth_part part = {b, len - AUTH_MAC_LEN};
            auth_prove(&real, "tdist tcp hello", &part, 1, b + len - AUTH_MAC_LEN);
            b[TD_TCP_HELLO_FIXED + h.group_len] ^= 1; /* the connector's nonce */
        }
        int fd = connect_entry(ctx, &e);
        TD_CHECK_OK(net_send_all(fd, b, len, tu_after_ms(10000)));
        uint8_t ab[TD_TCP_REPLY_MAX];
        td_tcp_reply rep;
        size_t alen = read_answer(fd, ab, &rep);
        close(fd);
        TD_CHECK_EQ(rep.status, TD_TCP_REPLY_REFUSED);
        TD_CHECK(rep.flags & TD_TCP_FLAG_AUTH);
        char msg[TD_TCP_MAX_REPLY_MSG + 1];
        memcpy(msg, rep.msg, rep.msg_len);
        msg[rep.msg_len] = '\0';
        TD_CHECK_CONTAINS(msg, forged[k].want);
        TD_CHECK(memmem(ab, alen, WIRE_SECRET, strlen(WIRE_SECRET)) == NULL);
    }
    tcp_entry_free(&e);
    explicit_bzero(&real, sizeof real);
    td_store_release(store);
    tu_world w = open_world(ctx, NULL, 0);
    tu_all_pairs(ctx, w.t, 100);
    tu_world_close(&w);
    unsetenv("TDIST_AUTH_TOKEN");
}

/* The secret never travels: rank 1 is a plain socket published as its address, which receives
 * rank 0's real hello (neither the secret nor the key made of it is in its bytes) and answers with
 * an accept whose proof is rank 0's own proof reflected: rank 0 refuses it. */
TD_TEST(auth_secret_not_on_wire, .world_size = 2, BOTH)
{
    td_store *store = tu_store_open(ctx->store_path);
    if (ctx->rank == 0) {
        setenv("TDIST_AUTH_TOKEN", WIRE_SECRET, 1);
        td_transport_setup g = tu_setup(ctx, store, 10000, "g");
        td_transport *t = NULL;
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID,
                     "authentication failed: rank 1 could not prove it holds this job's TDIST_AUTH_TOKEN");
        unsetenv("TDIST_AUTH_TOKEN");
        tu_barrier(ctx, store, "done");
        tu_store_close(ctx, store, ctx->store_path);
        return;
    }
    bool unix_sock = strcmp(ctx->param, "unix") == 0;
    int lfd = -1, port = 0, ufd = -1;
    TD_CHECK_OK(net_listen("127.0.0.1", 0, 4, &lfd, &port));
    char host_id[256] = "-", name[64] = "-";
    if (unix_sock) {
        host_identity(host_id, sizeof host_id);
        TD_CHECK(host_id[0]);
        snprintf(name, sizeof name, "tdist-test-capture-%d", (int)getpid());
        ufd = samehost_unix_listen(name, 4);
        TD_CHECK(ufd >= 0);
    }
    uint64_t nonce = UINT64_C(0x5eed0fc0ffee0042);
    char entry[512];
    snprintf(entry, sizeof entry, "127.0.0.1:%d %llx %s %s", port, (unsigned long long)nonce, host_id, name);
    TD_CHECK_OK(td_store_set_str(store, "tcp/1/addr/1", entry));
    int listener = unix_sock ? ufd : lfd;
    TD_CHECK_OK(net_wait(listener, POLLIN, tu_after_ms(20000)));
    int fd = accept(listener, NULL, NULL);
    TD_CHECK(fd >= 0);
    uint8_t b[TD_TCP_HELLO_MAX];
    size_t got = 0, need = 0;
    td_tcp_hello h;
    for (;;) {
        const char *why = NULL;
        td_tcp_parse pr = tcp_hello_parse(b, got, &h, &need, &why);
        TD_CHECK_MSG(pr != TD_TCP_PARSE_BAD, "malformed hello: %s", why);
        if (pr == TD_TCP_PARSE_OK)
            break;
        TD_CHECK_OK(net_recv_all(fd, b + got, need - got, tu_after_ms(10000)));
        got = need;
    }
    TD_CHECK_EQ(h.version, TD_TCP_VERSION);
    TD_CHECK(h.flags & TD_TCP_FLAG_AUTH);
    TD_CHECK_EQ(h.nonce, nonce);
    TD_CHECK(memmem(b, need, WIRE_SECRET, strlen(WIRE_SECRET)) == NULL);
    TD_CHECK(memmem(b, need, WIRE_SECRET, 8) == NULL);
    auth_key k;
    TD_CHECK_OK(auth_key_init(WIRE_SECRET, &k));
    TD_CHECK(memmem(b, need, k.key, sizeof k.key) == NULL);
    static const uint8_t zeros[AUTH_MAC_LEN];
    TD_CHECK(memcmp(h.proof, zeros, AUTH_MAC_LEN) != 0);
    uint8_t ab[TD_TCP_REPLY_MAX];
    size_t alen = tcp_reply_encode(ab, 1, TD_TCP_REPLY_OK, TD_TCP_FLAG_AUTH, NULL, h.proof);
    TD_CHECK_OK(net_send_all(fd, ab, alen, tu_after_ms(10000)));
    tu_barrier(ctx, store, "done");
    close(fd);
    close(lfd);
    if (ufd >= 0)
        close(ufd);
    tu_store_close(ctx, store, ctx->store_path);
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
