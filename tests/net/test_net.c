/* The net layer (src/net): host:port parsing and printing, listening on port 0 and reading the
 * port back, connecting with retry until a listener appears or the deadline passes (and the
 * message then), the whole-buffer I/O helpers: partial transfers, timeouts, a closed peer; and the
 * secret's proofs (net/auth.h) against an independent computation of the documented format. */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/clock.h"
#include "base/error.h"
#include "net/addr.h"
#include "net/auth.h"
#include "net/io.h"
#include "net/socket.h"

static double now_s(void) { return (double)clock_now_ns() / 1e9; }

static void split_ok(const char *s, const char *host, int port)
{
    char *h = NULL;
    int p = -2;
    TD_CHECK_OK(net_split_hostport(s, &h, &p));
    TD_CHECK_MSG(strcmp(h, host) == 0 && p == port, "'%s' -> '%s' %d, want '%s' %d", s, h, p, host, port);
    free(h);
}

TD_TEST(split_and_format_host_port)
{
    split_ok("10.0.0.1:29500", "10.0.0.1", 29500);
    split_ok("node7:0", "node7", 0);
    split_ok("node7", "node7", -1);
    split_ok("[::1]:80", "::1", 80);
    split_ok("[fe80::1%eth0]:65535", "fe80::1%eth0", 65535);
    split_ok("[::1]", "::1", -1);
    split_ok("::1", "::1", -1);
    split_ok("", "", -1);
    char *h = NULL;
    int p;
    TD_CHECK_ERR(net_split_hostport("host:65536", &h, &p), TD_ERR_INVALID, "invalid port");
    TD_CHECK_ERR(net_split_hostport("host:12a", &h, &p), TD_ERR_INVALID, "invalid port");
    TD_CHECK_ERR(net_split_hostport("host:", &h, &p), TD_ERR_INVALID, "invalid port");
    TD_CHECK_ERR(net_split_hostport("[::1", &h, &p), TD_ERR_INVALID, "without a matching");
    TD_CHECK_ERR(net_split_hostport("[::1]x", &h, &p), TD_ERR_INVALID, "after ']'");
    TD_CHECK(h == NULL);
    char out[TD_ADDR_STRLEN];
    net_format_hostport("::1", 5, out, sizeof out);
    TD_CHECK_STR_EQ(out, "[::1]:5");
    net_format_hostport("a.b", 5, out, sizeof out);
    TD_CHECK_STR_EQ(out, "a.b:5");
}

TD_TEST(resolve_names_and_literals)
{
    td_addr *a = NULL;
    size_t n = 0;
    TD_CHECK_OK(net_resolve("127.0.0.1", 1234, false, &a, &n));
    TD_CHECK(n >= 1);
    char s[TD_ADDR_STRLEN];
    addr_str(&a[0], s, sizeof s);
    TD_CHECK_STR_EQ(s, "127.0.0.1:1234");
    TD_CHECK(addr_is_loopback(&a[0]));
    TD_CHECK_EQ(addr_port(&a[0]), 1234);
    free(a);
    TD_CHECK_OK(net_resolve("localhost", 7, false, &a, &n));
    TD_CHECK(n >= 1 && addr_is_loopback(&a[0]));
    free(a);
    TD_CHECK_ERR(net_resolve("no-such-host.invalid", 1, false, &a, &n), TD_ERR_NOT_FOUND,
                 "cannot resolve host 'no-such-host.invalid'");
    TD_CHECK(a == NULL && n == 0);
}

TD_TEST(listen_port_zero_reads_back_the_port)
{
    int fd = -1, port = 0;
    TD_CHECK_OK(net_listen("127.0.0.1", 0, 0, &fd, &port));
    TD_CHECK(port > 0);
    td_addr local;
    TD_CHECK_OK(net_local_addr(fd, &local));
    TD_CHECK_EQ(addr_port(&local), port);
    /* The port is taken: a second listener on it fails naming the address and errno. */
    int fd2 = -1;
    char want[64];
    snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%d: Address already in use", port);
    TD_CHECK_ERR(net_listen("127.0.0.1", port, 0, &fd2, NULL), TD_ERR_IO, want);
    close(fd);
    /* Every interface, dual stack where there is IPv6. */
    TD_CHECK_OK(net_listen(NULL, 0, 16, &fd, &port));
    int c = -1;
    TD_CHECK_OK(net_connect("127.0.0.1", port, deadline_after_ms(5000), &c));
    close(c);
    close(fd);
    TD_CHECK_ERR(net_listen("127.0.0.1", 65536, 0, &fd, NULL), TD_ERR_INVALID,
                 "port must have value from 0 to 65535 but was 65536.");
}

typedef struct late_listener {
    int fd;
    double delay;
} late_listener;

static void *listen_later(void *p)
{
    late_listener *l = p;
    struct timespec ts = {0, (long)(l->delay * 1e9)};
    nanosleep(&ts, NULL);
    TD_CHECK(listen(l->fd, 16) == 0);
    return NULL;
}

/* A client started before its server retries until the server listens. */
TD_TEST(connect_retries_until_the_listener_appears)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TD_CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    TD_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    late_listener l = {fd, 0.4};
    pthread_t th;
    TD_CHECK(pthread_create(&th, NULL, listen_later, &l) == 0);
    double t0 = now_s();
    int c = -1;
    TD_CHECK_OK(net_connect("127.0.0.1", ntohs(a.sin_port), deadline_after_ms(20000), &c));
    TD_CHECK(now_s() - t0 >= 0.3);
    pthread_join(th, NULL);
    close(c);
    close(fd);
}

TD_TEST(connect_timeout_message_names_address_and_error)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0)
        TD_SKIP(TD_SKIP_GENERIC, "no IPv6 loopback on this machine");
    socklen_t len = sizeof a;
    TD_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    int port = ntohs(a.sin6_port);
    int c = -1;
    double t0 = now_s();
    TD_CHECK_ERR(net_connect("::1", port, deadline_after_ms(600), &c), TD_ERR_TIMEOUT, "Connection refused");
    double dt = now_s() - t0;
    char want[96];
    snprintf(want, sizeof want, "connecting to [::1]:%d: Connection refused", port);
    TD_CHECK_CONTAINS(td_last_error(), want);
    TD_CHECK_CONTAINS(td_last_error(), "timed out after ");
    TD_CHECK_MSG(dt >= 0.6 && dt < 1.6, "gave up after %.3f s", dt);
    TD_CHECK(c == -1);
    close(fd);
}

typedef struct pump {
    int fd;
    size_t len;
    unsigned char *data;
    td_status status;
} pump;

static void *send_pieces(void *p)
{
    pump *s = p;
    /* Many iovecs, of odd sizes, through a small socket buffer: partial writes all along. */
    struct iovec iov[64];
    size_t off = 0;
    int n = 0;
    while (off < s->len && n < 64) {
        size_t piece = n == 63 ? s->len - off : (size_t)(1 + (n * 7919) % 200000);
        if (piece > s->len - off)
            piece = s->len - off;
        iov[n].iov_base = s->data + off;
        iov[n].iov_len = piece;
        off += piece;
        n++;
    }
    s->status = net_sendv_all(s->fd, iov, n, deadline_after_ms(30000));
    return NULL;
}

TD_TEST(vectored_io_survives_partial_transfers)
{
    int sv[2];
    TD_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    size_t len = (size_t)6 << 20;
    unsigned char *src = malloc(len), *dst = malloc(len);
    for (size_t i = 0; i < len; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 9));
    pump p = {sv[0], len, src, TD_ERR_INTERNAL};
    pthread_t th;
    TD_CHECK(pthread_create(&th, NULL, send_pieces, &p) == 0);
    /* Receive into three uneven iovecs. */
    struct iovec iov[3] = {{dst, 1}, {dst + 1, 3 << 20}, {dst + 1 + (3 << 20), len - 1 - (3 << 20)}};
    TD_CHECK_OK(net_recvv_all(sv[1], iov, 3, deadline_after_ms(30000)));
    pthread_join(th, NULL);
    TD_CHECK_OK(p.status);
    TD_CHECK(memcmp(src, dst, len) == 0);
    free(src);
    free(dst);
    close(sv[0]);
    close(sv[1]);
}

TD_TEST(recv_timeout_and_closed_peer)
{
    int sv[2];
    TD_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    char buf[16];
    double t0 = now_s();
    TD_CHECK_ERR(net_recv_all(sv[1], buf, 4, deadline_after_ms(300)), TD_ERR_TIMEOUT, "timed out");
    double dt = now_s() - t0;
    TD_CHECK_MSG(dt >= 0.3 && dt < 1.3, "timed out after %.3f s", dt);
    /* Half a message, then the peer goes away. */
    TD_CHECK_OK(net_send_all(sv[0], "ab", 2, deadline_after_ms(1000)));
    close(sv[0]);
    TD_CHECK_ERR(net_recv_all(sv[1], buf, 4, deadline_after_ms(5000)), TD_ERR_PEER_LOST,
                 "connection closed by peer");
    /* Sending to a closed peer fails without SIGPIPE. */
    TD_CHECK_ERR(net_send_all(sv[1], "x", 1, deadline_after_ms(1000)), TD_ERR_PEER_LOST, "connection lost");
    close(sv[1]);
    /* recv_some returns what is there. */
    TD_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) == 0);
    TD_CHECK_OK(net_send_all(sv[0], "hello", 5, deadline_after_ms(1000)));
    size_t got = 0;
    TD_CHECK_OK(net_recv_some(sv[1], buf, sizeof buf, &got, deadline_after_ms(1000)));
    TD_CHECK_EQ(got, 5);
    TD_CHECK_OK(net_wait(sv[0], POLLOUT, deadline_after_ms(1000)));
    close(sv[0]);
    close(sv[1]);
}

/* The proof is the documented HMAC-SHA256 framing (docs/protocols.md, "Authentication"): the
 * expected bytes were computed with Python's hmac module, so a change to the framing - which
 * would make tdist builds unable to talk to each other - fails here. */
TD_TEST(auth_proofs_follow_the_documented_format)
{
    auth_key k, same, other, none;
    TD_CHECK_OK(auth_key_init("job-secret", &k));
    TD_CHECK_OK(auth_key_init("job-secret", &same));
    TD_CHECK_OK(auth_key_init("job-secreT", &other));
    TD_CHECK_OK(auth_key_init("", &none));
    TD_CHECK(k.on && other.on && !none.on);
    auth_part parts[2] = {{"abc", 3}, {"", 0}};
    uint8_t mac[AUTH_MAC_LEN];
    auth_prove(&k, "tdist test", parts, 2, mac);
    static const uint8_t want[AUTH_MAC_LEN] = {
        0x6c, 0xf0, 0x07, 0x03, 0x6c, 0x79, 0xa9, 0xdb, 0x51, 0x64, 0x43, 0x5c, 0x65, 0xb5, 0xc3, 0x0f,
        0x24, 0x29, 0xb7, 0x80, 0xd4, 0x9c, 0xf3, 0x72, 0x8e, 0xa1, 0x26, 0xe6, 0xef, 0xe3, 0x0a, 0x9d};
    TD_CHECK(memcmp(mac, want, sizeof want) == 0);
    TD_CHECK(auth_check(&same, "tdist test", parts, 2, mac));
    TD_CHECK(!auth_check(&other, "tdist test", parts, 2, mac));
    TD_CHECK(!auth_check(&k, "tdist tesT", parts, 2, mac));
    /* Moving a byte from one part into the next changes the proof (lengths are covered). */
    auth_part shifted[2] = {{"ab", 2}, {"c", 1}};
    TD_CHECK(!auth_check(&k, "tdist test", shifted, 2, mac));
    mac[31] ^= 1;
    TD_CHECK(!auth_check(&k, "tdist test", parts, 2, mac));
    /* Nonces differ from call to call. */
    uint8_t a[AUTH_NONCE_LEN], b[AUTH_NONCE_LEN];
    auth_nonce(a);
    auth_nonce(b);
    TD_CHECK(memcmp(a, b, sizeof a) != 0);
    char *big = malloc(AUTH_MAX_SECRET + 2);
    memset(big, 'x', AUTH_MAX_SECRET + 1);
    big[AUTH_MAX_SECRET + 1] = '\0';
    TD_CHECK_ERR(auth_key_init(big, &k), TD_ERR_INVALID, "longer than 4096 bytes");
    big[AUTH_MAX_SECRET] = '\0';
    TD_CHECK_OK(auth_key_init(big, &k));
    free(big);
}

TD_TEST_MAIN()
