/* The TCPStore server under attack (issue 23, items 1-3), scripted with raw sockets against a real
 * server: the tdist-store program (whose RSS is read from /proc/<pid>/status) or the in-process one.
 *   - a MULTI_GET of 60,000 copies of a 64 KiB value (a 3.7 GiB reply) gets an ERROR naming the
 *     reply limit; the server lives, its RSS stays flat, and it serves a normal client;
 *   - with a secret, a 500 MiB SET header before the handshake is refused from its header: the body is
 *     never received (RSS flat) and the log names the peer;
 *   - connections that do not send HELLO within TDIST_STORE_HANDSHAKE_TIMEOUT are closed, and an
 *     authenticated idle one is not;
 *   - hundreds of idle connections against a server with few descriptors do not keep a real client
 *     out. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/store.h>
#include <tdist/testing.h>

#include "store/store_proto.h"
#include "store/tcp_core.h"
#include "store/tcp_store.h"
#include "util.h"

extern char **environ;

#define MiB ((size_t)1 << 20)

/* ---- raw sockets ---------------------------------------------------------------------------------- */

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TD_CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TD_CHECK_MSG(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect: %s", strerror(errno));
    return fd;
}

static void raw_send(int fd, const void *p, size_t n) { TD_CHECK(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n); }

/* A HELLO with a fixed nonce, into b: enough for a server without a secret. */
static void hello_bytes(td_buf *b)
{
    uint8_t nonce[AUTH_NONCE_LEN];
    memset(nonce, 0x5a, sizeof nonce);
    store_put_hello(b, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, nonce, AUTH_NONCE_LEN);
}

static void raw_hello(int fd)
{
    td_buf b = TD_BUF_INIT;
    hello_bytes(&b);
    raw_send(fd, b.data, b.len);
    buf_free(&b);
}

static void read_exact(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        TD_CHECK_MSG(poll(&pf, 1, 20000) == 1, "no reply from the server within 20 s");
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        TD_CHECK_MSG(r > 0, "the server closed the connection (%s)", r < 0 ? strerror(errno) : "EOF");
        got += (size_t)r;
    }
}

/* Reads one reply; returns its kind and (NUL-terminated, malloc'd) body. */
static uint8_t read_reply(int fd, char **body, size_t *len)
{
    uint8_t hdr[TD_STORE_HEADER_LEN];
    read_exact(fd, hdr, sizeof hdr);
    uint8_t kind;
    uint64_t n;
    store_parse_header(hdr, &kind, &n);
    TD_CHECK(n < 64 * MiB);
    *body = malloc((size_t)n + 1);
    read_exact(fd, *body, (size_t)n);
    (*body)[n] = '\0';
    *len = (size_t)n;
    return kind;
}

static void expect_reply_ok(int fd)
{
    char *body;
    size_t len;
    TD_CHECK_EQ(read_reply(fd, &body, &len), TD_STORE_REPLY_OK);
    free(body);
}

static void ping(int fd)
{
    uint8_t hdr[TD_STORE_HEADER_LEN] = {TD_STORE_CMD_PING};
    raw_send(fd, hdr, sizeof hdr);
    expect_reply_ok(fd);
}

/* Waits until the server closes fd (at most timeout_s); returns the seconds it took. */
static double wait_closed(int fd, double timeout_s)
{
    double t0 = now_s();
    for (;;) {
        double left = timeout_s - (now_s() - t0);
        TD_CHECK_MSG(left > 0, "the server did not close the connection within %.1f s", timeout_s);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, (int)(left * 1000) + 1);
        if (r <= 0)
            continue;
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE)))
            return now_s() - t0;
    }
}

static bool is_closed_now(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int pr = poll(&p, 1, 0);
    if (pr != 1)
        return false;
    char tmp[64];
    ssize_t n = recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

static td_store *connect_port(int port, const char *token)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.timeout_ms = 20000;
    o.wait_for_workers = false;
    o.auth_token = token;
    td_store *s = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &s));
    return s;
}

static void still_serving(td_store *good, const char *key)
{
    TD_CHECK_OK(td_store_set_str(good, key, key));
    char *t = get_str(good, key);
    TD_CHECK_STR_EQ(t, key);
    free(t);
}

/* ---- the tdist-store program ---------------------------------------------------------------------- */

#ifdef TDIST_STORE_BIN
typedef struct tool {
    pid_t pid;
    int port;
    int err_fd;
} tool;

/* Starts tdist-store on 127.0.0.1 (its environment is ours) and reads its port. nofile > 0 lowers
 * its open-files limit once it listens (it raises its soft limit to the hard one as it starts). */
static tool start_tool(rlim_t nofile)
{
    static const char *const args[] = {"--host", "127.0.0.1", "--port", "0", NULL};
    tool t = {0, 0, -1};
    int out_fd = -1;
    t.pid = store_tool_spawn(TDIST_STORE_BIN, args, &t.port, &out_fd, &t.err_fd);
    close(out_fd);
    if (nofile) {
        struct rlimit low = {nofile, nofile};
        TD_CHECK_MSG(prlimit(t.pid, RLIMIT_NOFILE, &low, NULL) == 0, "prlimit: %s", strerror(errno));
    }
    return t;
}

static bool tool_alive(const tool *t)
{
    int status;
    return waitpid(t->pid, &status, WNOHANG) == 0;
}

/* VmRSS of the program, bytes. */
static size_t tool_rss(const tool *t)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)t->pid);
    FILE *f = fopen(path, "r");
    TD_CHECK(f != NULL);
    size_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %zu kB", &kb) == 1)
            break;
    fclose(f);
    TD_CHECK(kb > 0);
    return kb * 1024;
}

/* Stops the program (SIGTERM), checks it exits 0 and returns what it logged on stderr (free it). */
static char *stop_tool(tool *t)
{
    TD_CHECK(kill(t->pid, SIGTERM) == 0);
    td_buf log = TD_BUF_INIT;
    for (;;) {
        struct pollfd p = {.fd = t->err_fd, .events = POLLIN};
        if (poll(&p, 1, 30000) != 1)
            break;
        char tmp[4096];
        ssize_t r = read(t->err_fd, tmp, sizeof tmp);
        if (r <= 0)
            break;
        if (log.len < 4 * MiB)
            buf_append(&log, tmp, (size_t)r);
    }
    close(t->err_fd);
    int status = 0;
    TD_CHECK(waitpid(t->pid, &status, 0) == t->pid);
    TD_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "tdist-store ended with status 0x%x", status);
    buf_putc(&log, '\0');
    return buf_steal(&log);
}

TD_TEST(multi_get_of_60000_copies_gets_an_error_and_the_server_lives, .timeout_s = 120)
{
    tool t = start_tool(0);
    td_store *good = connect_port(t.port, NULL);
    char *big = malloc(64 << 10);
    memset(big, 'x', 64 << 10);
    TD_CHECK_OK(td_store_set(good, "big", big, 64 << 10));
    size_t rss0 = tool_rss(&t);

    int fd = raw_connect(t.port);
    raw_hello(fd);
    expect_reply_ok(fd);
    /* 60,000 x (8 + 64 KiB): a 3.7 GiB reply, asked for in a 360 KB request. */
    td_buf b = TD_BUF_INIT;
    size_t off = store_msg_begin(&b, TD_STORE_CMD_MULTI_GET);
    buf_put_u32(&b, 60000);
    for (int i = 0; i < 60000; i++)
        store_put_key(&b, "/", "big", 3);
    store_msg_end(&b, off);
    raw_send(fd, b.data, b.len);
    buf_free(&b);
    char *body;
    size_t len;
    TD_CHECK_EQ(read_reply(fd, &body, &len), TD_STORE_REPLY_ERROR);
    TD_CHECK(len > 4);
    TD_CHECK_CONTAINS(body + 4, "reply limit");
    TD_CHECK_CONTAINS(body + 4, "TDIST_STORE_MAX_REPLY");
    free(body);
    /* The connection stays, and so does the server, its memory flat. */
    ping(fd);
    close(fd);
    TD_CHECK(tool_alive(&t));
    size_t rss1 = tool_rss(&t);
    TD_CHECK_MSG(rss1 < rss0 + 64 * MiB, "RSS grew from %zu to %zu bytes", rss0, rss1);
    void *v = NULL;
    size_t n = 0;
    TD_CHECK_OK(td_store_get(good, "big", &v, &n));
    TD_CHECK_EQ(n, (size_t)64 << 10);
    TD_CHECK(memcmp(v, big, n) == 0);
    free(v);
    /* Through the client too: a MULTI_GET under the limit still works. */
    const char *keys[] = {"big", "big", "big"};
    void *vals[3];
    size_t lens[3];
    TD_CHECK_OK(td_store_multi_get(good, keys, 3, vals, lens));
    for (int i = 0; i < 3; i++) {
        TD_CHECK_EQ(lens[i], (size_t)64 << 10);
        free(vals[i]);
    }
    td_store_release(good);
    free(big);
    char *log = stop_tool(&t);
    free(log);
}

TD_TEST(pre_hello_500mib_set_is_refused_from_its_header, .timeout_s = 120)
{
    setenv("TDIST_AUTH_TOKEN", "s3cret", 1);
    tool t = start_tool(0);
    unsetenv("TDIST_AUTH_TOKEN");
    size_t rss0 = tool_rss(&t);
    char *junk = calloc(1, MiB);
    for (int k = 0; k < 3; k++) {
        int fd = raw_connect(t.port);
        uint64_t body = (uint64_t)500 * MiB;
        uint8_t hdr[TD_STORE_HEADER_LEN] = {TD_STORE_CMD_SET};
        for (int i = 0; i < 8; i++)
            hdr[1 + i] = (uint8_t)(body >> (8 * i));
        raw_send(fd, hdr, sizeof hdr);
        /* Push what the socket takes of the body; the server closes as soon as the header is in. */
        for (int i = 0; i < 64; i++) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 2000) != 1 || (p.revents & (POLLERR | POLLHUP)))
                break;
            if (send(fd, junk, MiB, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
                break;
        }
        wait_closed(fd, 20);
        close(fd);
    }
    /* A HELLO that claims more than a handshake's worth is refused from its header too. */
    int fd = raw_connect(t.port);
    uint8_t hdr[TD_STORE_HEADER_LEN] = {TD_STORE_CMD_HELLO, 0, 0, 0x10}; /* 1 MiB */
    raw_send(fd, hdr, sizeof hdr);
    wait_closed(fd, 20);
    close(fd);
    free(junk);
    TD_CHECK(tool_alive(&t));
    size_t rss1 = tool_rss(&t);
    TD_CHECK_MSG(rss1 < rss0 + 64 * MiB, "RSS grew from %zu to %zu bytes", rss0, rss1);
    /* The job's clients still get in. */
    td_store *good = connect_port(t.port, "s3cret");
    still_serving(good, "after");
    td_store_release(good);
    char *log = stop_tool(&t);
    TD_CHECK_CONTAINS(log, "closing the connection from 127.0.0.1:");
    TD_CHECK_CONTAINS(log, "SET request before the handshake");
    TD_CHECK_CONTAINS(log, "larger than a handshake may be");
    free(log);
}

TD_TEST(many_idle_connections_do_not_keep_a_real_client_out, .timeout_s = 120)
{
    /* The program gets 64 descriptors once it listens: the flood runs it out of them, and the
     * oldest connections without a handshake make room for newer ones. */
    setenv("TDIST_STORE_HANDSHAKE_TIMEOUT", "60s", 1);
    tool t = start_tool(64);
    unsetenv("TDIST_STORE_HANDSHAKE_TIMEOUT");
    struct rlimit rl;
    TD_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < 2048 && rl.rlim_max >= 2048) {
        rl.rlim_cur = 2048;
        TD_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    int nidle = rl.rlim_cur >= 2048 ? 1000 : 400;
    /* 30 authenticated but idle connections, then a flood of connections that say nothing:
     * together more than the program's descriptors. */
    int authed[30];
    for (int i = 0; i < 30; i++) {
        authed[i] = raw_connect(t.port);
        raw_hello(authed[i]);
        expect_reply_ok(authed[i]);
    }
    int *idle = malloc(sizeof *idle * (size_t)nidle);
    for (int i = 0; i < nidle; i++)
        idle[i] = raw_connect(t.port);
    td_store *good = connect_port(t.port, NULL);
    still_serving(good, "joined");
    /* The authenticated ones were kept; the idle ones were closed, all but the newest few. */
    for (int i = 0; i < 30; i++) {
        ping(authed[i]);
        close(authed[i]);
    }
    sleep_s(0.2);
    int closed = 0;
    for (int i = 0; i < nidle; i++) {
        closed += is_closed_now(idle[i]);
        close(idle[i]);
    }
    free(idle);
    TD_CHECK_MSG(closed >= nidle - 40, "only %d of %d idle connections were closed", closed, nidle);
    still_serving(good, "still");
    td_store_release(good);
    TD_CHECK(tool_alive(&t));
    char *log = stop_tool(&t);
    TD_CHECK_CONTAINS(log, "closed to free a file descriptor");
    free(log);
}

/* A client halfway through its HELLO when a flood of silent connections runs the program out of
 * descriptors keeps its connection: the silent ones make room, oldest first (before, the oldest
 * connection without a handshake went, whatever it had sent - the real client's, when it came in
 * through the local listener ahead of the flood's queue). */
TD_TEST(a_client_mid_handshake_outlives_a_flood_of_silent_ones, .timeout_s = 120)
{
    setenv("TDIST_STORE_HANDSHAKE_TIMEOUT", "60s", 1);
    tool t = start_tool(64);
    unsetenv("TDIST_STORE_HANDSHAKE_TIMEOUT");
    int talking = raw_connect(t.port);
    td_buf b = TD_BUF_INIT;
    hello_bytes(&b);
    raw_send(talking, b.data, 5); /* part of the header: not a request yet */
    sleep_s(0.2);
    enum { NSILENT = 150 }; /* more than the program's 64 descriptors */
    int silent[NSILENT];
    for (int i = 0; i < NSILENT; i++)
        silent[i] = raw_connect(t.port);
    /* Until the program has taken in the whole flood: all but its last descriptors' worth closed. */
    bool gone[NSILENT] = {false};
    int closed = 0;
    for (double t0 = now_s(); closed < NSILENT - 64 && now_s() - t0 < 60; sleep_s(0.01))
        for (int i = 0; i < NSILENT; i++)
            if (!gone[i] && is_closed_now(silent[i])) {
                gone[i] = true;
                closed++;
            }
    TD_CHECK_MSG(closed >= NSILENT - 64, "only %d of %d silent connections were closed", closed, NSILENT);
    raw_send(talking, b.data + 5, b.len - 5);
    buf_free(&b);
    expect_reply_ok(talking); /* the rest of the HELLO on the same connection: answered */
    ping(talking);
    for (int i = 0; i < NSILENT; i++)
        close(silent[i]);
    close(talking);
    TD_CHECK(tool_alive(&t));
    char *log = stop_tool(&t);
    TD_CHECK_CONTAINS(log, "closed to free a file descriptor");
    free(log);
}
#endif

/* ---- the in-process server ------------------------------------------------------------------------- */

TD_TEST(idle_connections_are_closed_after_the_handshake_timeout, .timeout_s = 60)
{
    setenv("TDIST_STORE_HANDSHAKE_TIMEOUT", "300ms", 1);
    td_store *master = tcp_master(ctx, 1, 30000);
    unsetenv("TDIST_STORE_HANDSHAKE_TIMEOUT");
    unpublish(ctx, "port");
    int port = td_tcp_store_port(master);
    int silent[5], slow[5];
    for (int i = 0; i < 5; i++) {
        silent[i] = raw_connect(port);
        slow[i] = raw_connect(port);
        uint8_t part[5] = {TD_STORE_CMD_HELLO, 16}; /* a HELLO that never completes */
        raw_send(slow[i], part, sizeof part);
    }
    int authed = raw_connect(port);
    raw_hello(authed);
    expect_reply_ok(authed);
    for (int i = 0; i < 5; i++) {
        double t1 = wait_closed(silent[i], 10), t2 = wait_closed(slow[i], 10);
        TD_CHECK_MSG(t1 < 5 && t2 < 5, "closed after %.2f s and %.2f s", t1, t2);
        close(silent[i]);
        close(slow[i]);
    }
    /* A connection past its handshake may stay idle. */
    sleep_s(0.6);
    TD_CHECK(!is_closed_now(authed));
    ping(authed);
    close(authed);
    /* The stats are a snapshot the server thread takes after each batch. */
    td_store_server_stats st;
    double end = now_s() + 10;
    do {
        sleep_s(0.01);
        TD_CHECK(tcp_store_server_stats(master, &st));
    } while ((st.pending != 0 || st.connections != 1) && now_s() < end);
    TD_CHECK_EQ(st.dropped, 10);
    TD_CHECK_EQ(st.pending, 0);
    still_serving(master, "k");
    td_store_release(master);
}

TD_TEST(multi_get_over_the_reply_limit_is_refused_through_the_client, .timeout_s = 60)
{
    setenv("TDIST_STORE_MAX_REPLY", "1M", 1);
    td_store *master = tcp_master(ctx, 1, 30000);
    unsetenv("TDIST_STORE_MAX_REPLY");
    unpublish(ctx, "port");
    td_store *c = connect_port(td_tcp_store_port(master), NULL);
    char *v = calloc(1, 64 << 10);
    TD_CHECK_OK(td_store_set(c, "v", v, 64 << 10));
    /* 20 x 64 KiB is over 1 MiB; 10 x 64 KiB is under. */
    const char *keys[20];
    void *vals[20];
    size_t lens[20];
    for (int i = 0; i < 20; i++)
        keys[i] = "v";
    td_status s = td_store_multi_get(c, keys, 20, vals, lens);
    TD_CHECK(s != TD_OK);
    TD_CHECK_CONTAINS(td_last_error(), "reply limit of 1048576 bytes");
    TD_CHECK_OK(td_store_multi_get(c, keys, 10, vals, lens));
    for (int i = 0; i < 10; i++)
        free(vals[i]);
    /* The connection stays. */
    still_serving(c, "after");
    free(v);
    td_store_release(c);
    td_store_release(master);
}

/* Found by fuzz/fuzz_store_request: processing a connection before any byte arrived offset the
 * null pointer of its empty input buffer (undefined behaviour, fatal under UBSan). */
TD_TEST(processing_a_connection_with_no_input_yet_does_nothing, .timeout_s = 30)
{
    (void)ctx;
    td_store_limits lim = {.max_key = 64, .max_value = 4096};
    for (int with_token = 0; with_token < 2; with_token++) {
        auth_key key;
        TD_CHECK_OK(auth_key_init(with_token ? "tk" : "", &key));
        td_store_core *core = store_core_new(&lim, &key);
        td_store_conn *c = store_core_attach(core, NULL);
        TD_CHECK_OK(store_core_process(core, c));
        TD_CHECK(store_core_pop_dirty(core) == NULL);
        store_core_detach(core, c);
        store_core_free(core);
    }
}

TD_TEST_MAIN()
