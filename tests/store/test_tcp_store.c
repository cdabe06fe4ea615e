/* TCPStore specifics (spec/c10d.md C4, T21, T23, T35): the master and its clients with
 * wait_for_workers and its timeout message, many concurrent clients and server-side waits, a
 * server killed under load, hostile bytes from raw sockets, the job secret's proofs both ways
 * (recorded proofs refused, the secret never on the wire) and the version handshake, IPv6, connect retry and its message, and the standalone tdist-store program. */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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

#include "net/auth.h"
#include "store/store_proto.h"
#include "store/tcp_store.h"
#include "util.h"

extern char **environ;

/* ---- master, clients, wait_for_workers ---------------------------------------------------------- */

TD_TEST(master_and_clients_wait_for_workers, .world_size = 4, .timeout_s = 60)
{
    td_store *s = ctx->rank == 0 ? tcp_master(ctx, 4, 30000) : tcp_client(ctx, 4, 30000);
    /* Once every constructor returned, all four counted themselves in "init/". */
    int64_t n = 0;
    TD_CHECK_OK(td_store_num_keys(s, &n));
    TD_CHECK(n >= 1);
    TD_CHECK(td_tcp_store_port(s) > 0);
    TD_CHECK_EQ(td_tcp_store_port(s), read_published_int(ctx, "port"));
    char key[32];
    snprintf(key, sizeof key, "rank%d", ctx->rank);
    TD_CHECK_OK(td_store_set_str(s, key, "here"));
    store_barrier(s, "b1", 4);
    const char *keys[] = {"rank0", "rank1", "rank2", "rank3"};
    bool ready = false;
    TD_CHECK_OK(td_store_check(s, keys, 4, &ready));
    TD_CHECK(ready);
    /* init/ + rank0..3 + b1 + b1/done; no rank makes a key until all counted (they meet on the
     * existing b1 counter). */
    TD_CHECK_OK(td_store_num_keys(s, &n));
    TD_CHECK_EQ(n, 7);
    counter_barrier(s, "b1", 8);
    store_barrier(s, "b2", 4);
    if (ctx->rank == 0) {
        /* Serve until every client is gone. */
        td_store_server_stats st;
        TD_CHECK(tcp_store_server_stats(s, &st));
        double end = now_s() + 30;
        while (st.connections > 1 && now_s() < end) {
            sleep_s(0.01);
            tcp_store_server_stats(s, &st);
        }
        TD_CHECK_EQ(st.connections, 1);
        unpublish(ctx, "port");
    }
    td_store_release(s);
}

TD_TEST(wait_for_workers_timeout_two_of_four, .world_size = 4, .timeout_s = 60)
{
    /* A FileStore coordinates the ranks around the TCPStore under test. */
    td_store *fs = NULL;
    TD_CHECK_OK(td_file_store_create(ctx->store_path, 4, &fs));
    if (ctx->rank == 0) {
        td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
        o.host = "127.0.0.1";
        o.port = 0;
        o.is_master = true;
        o.world_size = 4;
        o.timeout_ms = 2000;
        o.on_listening = publish_port_hook;
        o.on_listening_arg = (void *)ctx;
        td_store *s = NULL;
        double t0 = now_s();
        TD_CHECK_ERR(td_tcp_store_create(&o, &s), TD_ERR_TIMEOUT,
                     "Timed out after 2 seconds waiting for clients. 2/4 clients joined.");
        double dt = now_s() - t0;
        TD_CHECK_STR_EQ(td_last_error(), "Timed out after 2 seconds waiting for clients. 2/4 clients joined.");
        TD_CHECK_MSG(dt >= 2.0 && dt <= 3.0, "timed out after %.3f s", dt);
        TD_CHECK(s == NULL);
        unpublish(ctx, "port");
        store_barrier(fs, "master_done", 4);
    } else if (ctx->rank == 1) {
        td_store *s = tcp_client(ctx, 4, 30000);
        /* Stay connected until the master gave up. */
        store_barrier(fs, "master_done", 4);
        td_store_release(s);
    } else {
        store_barrier(fs, "master_done", 4);
    }
    td_store_release(fs);
}

/* ---- many clients --------------------------------------------------------------------------------- */

#define CLIENT_THREADS 64
#define ADDS_EACH 1000

typedef struct adder {
    const td_test_ctx *ctx;
    td_store *store;
    int port;
} adder;

static td_store *connect_port(int port, int64_t timeout_ms)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.timeout_ms = timeout_ms;
    o.wait_for_workers = false;
    td_store *s = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &s));
    return s;
}

static void *adder_main(void *p)
{
    adder *a = p;
    for (int i = 0; i < ADDS_EACH; i++)
        TD_CHECK_OK(td_store_add(a->store, "sum", 1, NULL));
    return NULL;
}

/* 4 processes x 64 threads, each with its own connection: 256 clients x 1,000 adds. */
TD_TEST(clients_256_times_1000_adds, .world_size = 4, .timeout_s = 240)
{
    td_store *s = ctx->rank == 0 ? tcp_master(ctx, 4, 120000) : tcp_client(ctx, 4, 120000);
    int port = td_tcp_store_port(s);
    adder a[CLIENT_THREADS];
    pthread_t th[CLIENT_THREADS];
    for (int i = 0; i < CLIENT_THREADS; i++)
        a[i] = (adder){ctx, connect_port(port, 120000), port};
    store_barrier(s, "connected", 4);
    for (int i = 0; i < CLIENT_THREADS; i++)
        TD_CHECK(pthread_create(&th[i], NULL, adder_main, &a[i]) == 0);
    for (int i = 0; i < CLIENT_THREADS; i++) {
        pthread_join(th[i], NULL);
        td_store_release(a[i].store);
    }
    store_barrier(s, "added", 4);
    char *t = get_str(s, "sum");
    TD_CHECK_EQ(strtoll(t, NULL, 10), 4LL * CLIENT_THREADS * ADDS_EACH);
    free(t);
    store_barrier(s, "checked", 4);
    if (ctx->rank == 0) {
        td_store_server_stats st;
        double end = now_s() + 30;
        do {
            sleep_s(0.01);
            tcp_store_server_stats(s, &st);
        } while (st.connections > 1 && now_s() < end);
        unpublish(ctx, "port");
    }
    td_store_release(s);
}

static void raise_nofile(size_t want)
{
    struct rlimit rl;
    TD_CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    if (rl.rlim_cur < want) {
        if (rl.rlim_max < want)
            TD_SKIP(TD_SKIP_GENERIC, "the open-files hard limit is too low for 1,000 connections");
        rl.rlim_cur = want;
        TD_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
}

#define HANDLES_PER_RANK 256
#define WAITERS_PER_RANK 16

static void *waiter_main(void *p)
{
    td_store *s = p;
    const char *keys[] = {"go"};
    TD_CHECK_OK(td_store_wait(s, keys, 1, TD_STORE_TIMEOUT_DEFAULT));
    char *t = get_str(s, "go");
    TD_CHECK_STR_EQ(t, "now");
    free(t);
    return NULL;
}

/* 1,024 connections at once (4 x 256, plus each rank's own), all served; then 64 requests parked
 * on the server (its statistics show them waiting, no client polls) and released by one set. */
TD_TEST(thousand_concurrent_clients_and_parked_waits, .world_size = 4, .timeout_s = 240)
{
    raise_nofile(4096);
    td_store *s = ctx->rank == 0 ? tcp_master(ctx, 4, 120000) : tcp_client(ctx, 4, 120000);
    int port = td_tcp_store_port(s);
    td_store **h = calloc(HANDLES_PER_RANK, sizeof *h);
    for (int i = 0; i < HANDLES_PER_RANK; i++) {
        h[i] = connect_port(port, 120000);
        char key[64];
        snprintf(key, sizeof key, "c/%d/%d", ctx->rank, i);
        TD_CHECK_OK(td_store_set_str(h[i], key, key));
    }
    store_barrier(s, "all_connected", 4);
    if (ctx->rank == 0) {
        td_store_server_stats st;
        TD_CHECK(tcp_store_server_stats(s, &st));
        TD_CHECK_MSG(st.connections >= 4 * HANDLES_PER_RANK + 4, "server has %llu connections",
                     (unsigned long long)st.connections);
    }
    /* Every connection is served while all are open. */
    for (int i = 0; i < HANDLES_PER_RANK; i++) {
        char key[64];
        snprintf(key, sizeof key, "c/%d/%d", (ctx->rank + 1) % 4, i);
        char *t = get_str(h[i], key);
        TD_CHECK_STR_EQ(t, key);
        free(t);
    }
    pthread_t th[WAITERS_PER_RANK];
    for (int i = 0; i < WAITERS_PER_RANK; i++)
        TD_CHECK(pthread_create(&th[i], NULL, waiter_main, h[i]) == 0);
    if (ctx->rank == 0) {
        td_store_server_stats st;
        double end = now_s() + 60;
        do {
            sleep_s(0.01);
            tcp_store_server_stats(s, &st);
        } while (st.parked < 4 * WAITERS_PER_RANK && now_s() < end);
        TD_CHECK_EQ(st.parked, 4 * WAITERS_PER_RANK);
        TD_CHECK_OK(td_store_set_str(s, "go", "now"));
    }
    for (int i = 0; i < WAITERS_PER_RANK; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < HANDLES_PER_RANK; i++)
        td_store_release(h[i]);
    free(h);
    store_barrier(s, "done", 4);
    if (ctx->rank == 0) {
        td_store_server_stats st;
        double end = now_s() + 30;
        do {
            sleep_s(0.01);
            tcp_store_server_stats(s, &st);
        } while (st.connections > 1 && now_s() < end);
        TD_CHECK_EQ(st.parked, 0);
        unpublish(ctx, "port");
    }
    td_store_release(s);
}

/* ---- the standalone server, and killing it under load ---------------------------------------------- */

#ifdef TDIST_STORE_BIN
static pid_t spawn_store_tool(const char *const *args, int *port, int *out_fd, int *err_fd)
{
    return store_tool_spawn(TDIST_STORE_BIN, args, port, out_fd, err_fd);
}

/* Reads what is left on fd until EOF (at most size - 1 bytes). */
static void read_all(int fd, char *buf, size_t size)
{
    size_t len = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 30000) != 1)
            break;
        ssize_t r = read(fd, buf + len, size - 1 - len);
        if (r <= 0)
            break;
        len += (size_t)r;
        if (len == size - 1)
            break;
    }
    buf[len] = '\0';
}

TD_TEST(tdist_store_program_waits_for_workers_and_stops_on_sigterm, .timeout_s = 60)
{
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--world-size", "2", "--wait-for-workers",
                          "--timeout", "30", NULL};
    int port, out, err;
    pid_t pid = spawn_store_tool(args, &port, &out, &err);
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.world_size = 2;
    o.timeout_ms = 30000;
    td_store *a = NULL, *b = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &a));
    TD_CHECK_OK(td_tcp_store_create(&o, &b));
    TD_CHECK_OK(td_store_set_str(a, "k", "v"));
    char *t = get_str(b, "k");
    TD_CHECK_STR_EQ(t, "v");
    free(t);
    char line[256] = "";
    size_t len = 0;
    while (len < sizeof line - 1) {
        struct pollfd p = {.fd = out, .events = POLLIN};
        TD_CHECK(poll(&p, 1, 30000) == 1);
        TD_CHECK(read(out, line + len, 1) == 1);
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
    TD_CHECK_STR_EQ(line, "tdist-store: all 2 workers joined");
    TD_CHECK(kill(pid, SIGTERM) == 0);
    int status = 0;
    TD_CHECK(waitpid(pid, &status, 0) == pid);
    TD_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "tdist-store exit status 0x%x", status);
    char msg[1024];
    read_all(err, msg, sizeof msg);
    TD_CHECK_CONTAINS(msg, "stopping on");
    /* The clients see the server gone. */
    TD_CHECK_ERR(td_store_set_str(a, "k", "v2"), TD_ERR_PEER_LOST, "lost the connection");
    td_store_release(a);
    td_store_release(b);
    close(out);
    close(err);
}

TD_TEST(tdist_store_program_worker_timeout, .timeout_s = 60)
{
    const char *args[] = {"--host=127.0.0.1", "--port=0", "--world-size=3", "--wait-for-workers", "--timeout=1", NULL};
    int port, out, err;
    pid_t pid = spawn_store_tool(args, &port, &out, &err);
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.world_size = 3;
    o.timeout_ms = 30000;
    td_store *a = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &a));
    int status = 0;
    TD_CHECK(waitpid(pid, &status, 0) == pid);
    TD_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 1, "tdist-store exit status 0x%x", status);
    char msg[1024];
    read_all(err, msg, sizeof msg);
    TD_CHECK_CONTAINS(msg, "Timed out after 1 seconds waiting for clients. 1/3 clients joined.");
    td_store_release(a);
    close(out);
    close(err);
}

typedef struct loader {
    td_store *store;
    bool parked; /* a blocked get instead of adds */
    td_status status;
    double failed_at, started_at;
    char message[512];
} loader;

static void *loader_main(void *p)
{
    loader *l = p;
    l->started_at = now_s();
    td_status s;
    if (l->parked) {
        void *v = NULL;
        size_t n;
        s = td_store_get(l->store, "never", &v, &n);
        free(v);
    } else {
        int64_t i = 0;
        while ((s = td_store_add(l->store, "load", 1, &i)) == TD_OK) {
        }
    }
    l->status = s;
    l->failed_at = now_s();
    snprintf(l->message, sizeof l->message, "%s", td_last_error());
    return NULL;
}

#define LOADERS 6

/* A server that dies under load fails every client call at once: adds in flight and gets parked on
 * the server, with TD_ERR_PEER_LOST (or IO), well before their 60 s timeout; later calls too. */
TD_TEST(server_killed_under_load_fails_every_client_promptly, .world_size = 4, .timeout_s = 120)
{
    if (ctx->rank == 0) {
        const char *args[] = {"--host", "127.0.0.1", "--port", "0", NULL};
        int port, out, err;
        pid_t pid = spawn_store_tool(args, &port, &out, &err);
        publish_int(ctx, "port", port);
        td_store *s = connect_port(port, 60000);
        int64_t loaded = 0;
        double end = now_s() + 60;
        while (loaded < 3 && now_s() < end) {
            sleep_s(0.01);
            TD_CHECK_OK(td_store_add(s, "loaded", 0, &loaded));
        }
        TD_CHECK_EQ(loaded, 3);
        sleep_s(0.2);
        TD_CHECK(kill(pid, SIGKILL) == 0);
        int status;
        TD_CHECK(waitpid(pid, &status, 0) == pid);
        TD_CHECK_ERR(td_store_add(s, "loaded", 0, &loaded), TD_ERR_PEER_LOST, NULL);
        td_store_release(s);
        close(out);
        close(err);
        read_published_int(ctx, "clients_done_1");
        read_published_int(ctx, "clients_done_2");
        read_published_int(ctx, "clients_done_3");
        unpublish(ctx, "port");
        for (int r = 1; r < 4; r++) {
            char name[32];
            snprintf(name, sizeof name, "clients_done_%d", r);
            unpublish(ctx, name);
        }
        return;
    }
    int port = read_published_int(ctx, "port");
    loader l[LOADERS];
    pthread_t th[LOADERS];
    for (int i = 0; i < LOADERS; i++) {
        l[i] = (loader){.store = connect_port(port, 60000), .parked = i % 2 == 1};
        TD_CHECK(pthread_create(&th[i], NULL, loader_main, &l[i]) == 0);
    }
    td_store *s = connect_port(port, 60000);
    int64_t n = 0;
    while (n < 100) {
        sleep_s(0.01);
        TD_CHECK_OK(td_store_add(s, "load", 0, &n));
    }
    TD_CHECK_OK(td_store_add(s, "loaded", 1, NULL));
    for (int i = 0; i < LOADERS; i++)
        pthread_join(th[i], NULL);
    double first = 1e300, last = 0;
    for (int i = 0; i < LOADERS; i++) {
        TD_CHECK_MSG(l[i].status == TD_ERR_PEER_LOST || l[i].status == TD_ERR_IO,
                     "loader %d ended with %s: %s", i, td_status_str(l[i].status), l[i].message);
        TD_CHECK_CONTAINS(l[i].message, "127.0.0.1");
        if (l[i].failed_at < first)
            first = l[i].failed_at;
        if (l[i].failed_at > last)
            last = l[i].failed_at;
        TD_CHECK_MSG(l[i].failed_at - l[i].started_at < 30, "loader %d hung for %.1f s", i,
                     l[i].failed_at - l[i].started_at);
        /* Later calls fail at once too. */
        double t0 = now_s();
        TD_CHECK_ERR(td_store_set_str(l[i].store, "x", "y"), TD_ERR_PEER_LOST, "was lost earlier");
        TD_CHECK(now_s() - t0 < 1);
        td_store_release(l[i].store);
    }
    TD_CHECK_MSG(last - first < 5, "clients noticed the dead server %.2f s apart", last - first);
    td_store_release(s);
    char name[32];
    snprintf(name, sizeof name, "clients_done_%d", ctx->rank);
    publish_int(ctx, name, 1);
}
#endif

/* ---- hostile bytes --------------------------------------------------------------------------------- */

static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TD_CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TD_CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    return fd;
}

static void raw_send(int fd, const void *p, size_t n) { TD_CHECK(send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n); }

/* A HELLO with the given nonce (32 bytes), or a fixed one. */
static void raw_hello_nonce(int fd, uint32_t magic, uint32_t version, const uint8_t *nonce)
{
    uint8_t fixed[AUTH_NONCE_LEN];
    memset(fixed, 0x5a, sizeof fixed);
    td_buf b = TD_BUF_INIT;
    store_put_hello(&b, magic, version, nonce ? nonce : fixed, AUTH_NONCE_LEN);
    raw_send(fd, b.data, b.len);
    buf_free(&b);
}

/* Reads until the server closes the connection; returns the bytes it sent before (up to size). */
static size_t expect_closed(int fd, char *buf, size_t size)
{
    size_t len = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        TD_CHECK_MSG(poll(&p, 1, 20000) == 1, "the server did not close the connection");
        char tmp[4096];
        ssize_t n = recv(fd, tmp, sizeof tmp, 0);
        if (n == 0 || (n < 0 && errno == ECONNRESET))
            break;
        TD_CHECK(n > 0);
        size_t take = (size_t)n < size - len ? (size_t)n : size - len;
        memcpy(buf + len, tmp, take);
        len += take;
    }
    close(fd);
    return len;
}

static void still_serving(td_store *good, int i)
{
    char key[32], *t;
    snprintf(key, sizeof key, "alive%d", i);
    TD_CHECK_OK(td_store_set_str(good, key, key));
    t = get_str(good, key);
    TD_CHECK_STR_EQ(t, key);
    free(t);
}

TD_TEST(garbage_and_oversize_requests_close_only_their_connection, .timeout_s = 60)
{
    td_store *master = tcp_master(ctx, 1, 30000);
    unpublish(ctx, "port");
    int port = td_tcp_store_port(master);
    td_store *good = connect_port(port, 30000);
    still_serving(good, 0);
    char buf[512];

    /* A partial request that never completes must not hold anyone up. */
    int slow = raw_connect(port);
    raw_hello_nonce(slow, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, NULL);
    uint8_t partial[TD_STORE_HEADER_LEN + 10] = {TD_STORE_CMD_SET, 0xe8, 0x03};
    raw_send(slow, partial, sizeof partial);

    /* 1: garbage */
    int fd = raw_connect(port);
    raw_send(fd, "\xff\xfeGARBAGE garbage garbage", 25);
    expect_closed(fd, buf, sizeof buf);
    still_serving(good, 1);
    /* 2: an oversize body length after a good HELLO */
    fd = raw_connect(port);
    raw_hello_nonce(fd, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, NULL);
    uint8_t huge[TD_STORE_HEADER_LEN] = {TD_STORE_CMD_SET, 0, 0, 0, 0, 0, 1, 0, 0}; /* 2^40 bytes */
    raw_send(fd, huge, sizeof huge);
    expect_closed(fd, buf, sizeof buf);
    still_serving(good, 2);
    /* 3: a HELLO with the wrong magic */
    fd = raw_connect(port);
    raw_hello_nonce(fd, 0x12345678, TD_STORE_PROTO_VERSION, NULL);
    expect_closed(fd, buf, sizeof buf);
    /* 4: a request before HELLO */
    fd = raw_connect(port);
    td_buf b = TD_BUF_INIT;
    size_t off = store_msg_begin(&b, TD_STORE_CMD_SET);
    store_put_key(&b, "", "k", 1);
    store_put_value(&b, "v", 1);
    store_msg_end(&b, off);
    raw_send(fd, b.data, b.len);
    expect_closed(fd, buf, sizeof buf);
    /* 5: a key length that runs past its request */
    fd = raw_connect(port);
    raw_hello_nonce(fd, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, NULL);
    b.len = 0;
    off = store_msg_begin(&b, TD_STORE_CMD_GET);
    buf_put_u32(&b, 1u << 20);
    buf_append(&b, "short", 5);
    store_msg_end(&b, off);
    raw_send(fd, b.data, b.len);
    expect_closed(fd, buf, sizeof buf);
    /* 6: a request other than CANCEL while a GET is parked */
    fd = raw_connect(port);
    raw_hello_nonce(fd, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, NULL);
    b.len = 0;
    off = store_msg_begin(&b, TD_STORE_CMD_GET);
    store_put_key(&b, "", "absent", 6);
    store_msg_end(&b, off);
    off = store_msg_begin(&b, TD_STORE_CMD_NUM_KEYS);
    store_msg_end(&b, off);
    raw_send(fd, b.data, b.len);
    expect_closed(fd, buf, sizeof buf);
    buf_free(&b);
    still_serving(good, 3);

    td_store_server_stats st;
    TD_CHECK(tcp_store_server_stats(master, &st));
    TD_CHECK_EQ(st.dropped, 6);
    TD_CHECK_EQ(st.parked, 0);
    close(slow);
    td_store_release(good);
    td_store_release(master);
}

TD_TEST(version_handshake_refuses_other_versions, .timeout_s = 60)
{
    td_store *master = tcp_master(ctx, 1, 30000);
    unpublish(ctx, "port");
    int fd = raw_connect(td_tcp_store_port(master));
    raw_hello_nonce(fd, TD_STORE_PROTO_MAGIC, 99, NULL);
    char buf[512];
    size_t n = expect_closed(fd, buf, sizeof buf - 1);
    TD_CHECK(n > TD_STORE_HEADER_LEN + 4);
    TD_CHECK_EQ((uint8_t)buf[0], TD_STORE_REPLY_ERROR);
    buf[n] = '\0';
    TD_CHECK_CONTAINS(buf + TD_STORE_HEADER_LEN + 4, "unsupported TCPStore protocol version 99");
    td_store_release(master);
}

static td_store *auth_master(const char *secret)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_master = true;
    o.world_size = 1;
    o.timeout_ms = 30000;
    o.auth_token = secret;
    td_store *master = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &master));
    return master;
}

static td_status auth_client(int port, const char *secret, td_store **c)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.world_size = -1;
    o.timeout_ms = 10000;
    o.auth_token = secret;
    *c = NULL;
    return td_tcp_store_create(&o, c);
}

TD_TEST(secret_proved_both_ways, .timeout_s = 60)
{
    td_store *master = auth_master("s3cret");
    int port = td_tcp_store_port(master);
    td_store *c = NULL;
    /* The server cannot prove a secret the client does not share: the client refuses first. */
    TD_CHECK_ERR(auth_client(port, "wrong", &c), TD_ERR_INVALID, "authentication failed");
    TD_CHECK_CONTAINS(td_last_error(), "could not prove it holds this process's TDIST_AUTH_TOKEN");
    TD_CHECK_ERR(auth_client(port, "", &c), TD_ERR_INVALID, "requires the job's secret; set TDIST_AUTH_TOKEN");
    /* From the environment, as ranks get it. */
    setenv("TDIST_AUTH_TOKEN", "s3cret", 1);
    TD_CHECK_OK(auth_client(port, NULL, &c));
    unsetenv("TDIST_AUTH_TOKEN");
    TD_CHECK_OK(td_store_set_str(c, "k", "v"));
    char *t = get_str(master, "k");
    TD_CHECK_STR_EQ(t, "v");
    free(t);
    td_store_release(c);
    td_store_release(master);
    /* A client with a secret does not trust a server without one. */
    master = auth_master("");
    TD_CHECK_ERR(auth_client(td_tcp_store_port(master), "s3cret", &c), TD_ERR_INVALID,
                 "does not authenticate (it has no TDIST_AUTH_TOKEN) but this process has one");
    td_store_release(master);
}

/* Reads one reply (header and body) into buf; returns the body length. */
static size_t raw_reply(int fd, uint8_t *buf, size_t size)
{
    size_t got = 0, need = TD_STORE_HEADER_LEN;
    while (got < need) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        TD_CHECK_MSG(poll(&p, 1, 20000) == 1, "no reply within 20 s");
        ssize_t n = recv(fd, buf + got, need - got, 0);
        TD_CHECK_MSG(n > 0, "the server closed the connection");
        got += (size_t)n;
        if (got == TD_STORE_HEADER_LEN) {
            need += (size_t)store_get_u64(buf + 1);
            TD_CHECK(need <= size);
        }
    }
    return need - TD_STORE_HEADER_LEN;
}

static void raw_auth(int fd, const uint8_t mac[AUTH_MAC_LEN])
{
    td_buf b = TD_BUF_INIT;
    size_t off = store_msg_begin(&b, TD_STORE_CMD_AUTH);
    buf_put_u32(&b, AUTH_MAC_LEN);
    buf_append(&b, mac, AUTH_MAC_LEN);
    store_msg_end(&b, off);
    raw_send(fd, b.data, b.len);
    buf_free(&b);
}

/* HELLO with nonce; returns the server's nonce from its answer (which must ask for proof). */
static void raw_challenge(int fd, const uint8_t nonce[AUTH_NONCE_LEN], uint8_t server_nonce[AUTH_NONCE_LEN])
{
    raw_hello_nonce(fd, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, nonce);
    uint8_t r[256];
    size_t n = raw_reply(fd, r, sizeof r);
    TD_CHECK_EQ(r[0], TD_STORE_REPLY_OK);
    TD_CHECK_EQ(n, (size_t)(21 + AUTH_NONCE_LEN + AUTH_MAC_LEN));
    TD_CHECK_EQ(r[TD_STORE_HEADER_LEN + 20], 1);
    memcpy(server_nonce, r + TD_STORE_HEADER_LEN + 21, AUTH_NONCE_LEN);
    /* The secret is nowhere in the answer. */
    TD_CHECK(memmem(r, TD_STORE_HEADER_LEN + n, "s3cret", 6) == NULL);
}

/* A proof recorded on one connection is worth nothing on another (the server's nonce is fresh),
 * and nothing but AUTH is taken before it: the attacks on a server that holds a secret. */
TD_TEST(recorded_proofs_and_requests_before_auth_are_refused, .timeout_s = 60)
{
    td_store *master = auth_master("s3cret");
    int port = td_tcp_store_port(master);
    auth_key key;
    TD_CHECK_OK(auth_key_init("s3cret", &key));
    uint8_t nonce[AUTH_NONCE_LEN], sn1[AUTH_NONCE_LEN], sn2[AUTH_NONCE_LEN], mac[AUTH_MAC_LEN];
    memset(nonce, 7, sizeof nonce);
    /* A genuine handshake, done by hand with the key: admitted. */
    int fd1 = raw_connect(port);
    raw_challenge(fd1, nonce, sn1);
    auth_part parts[2] = {{sn1, AUTH_NONCE_LEN}, {nonce, AUTH_NONCE_LEN}};
    auth_prove(&key, "tdist store client", parts, 2, mac);
    raw_auth(fd1, mac);
    uint8_t r[1024];
    TD_CHECK_EQ(raw_reply(fd1, r, sizeof r), (size_t)0);
    TD_CHECK_EQ(r[0], TD_STORE_REPLY_OK);
    /* Its proof replayed on a second connection with the same client nonce: refused. */
    int fd2 = raw_connect(port);
    raw_challenge(fd2, nonce, sn2);
    TD_CHECK(memcmp(sn1, sn2, AUTH_NONCE_LEN) != 0);
    raw_auth(fd2, mac);
    char buf[512];
    size_t n = expect_closed(fd2, buf, sizeof buf - 1);
    buf[n] = '\0';
    TD_CHECK(n > TD_STORE_HEADER_LEN + 4);
    TD_CHECK_EQ((uint8_t)buf[0], TD_STORE_REPLY_ERROR);
    TD_CHECK_CONTAINS(buf + TD_STORE_HEADER_LEN + 4, "does not match the server's");
    /* A SET after HELLO but before AUTH: closed from its header. */
    int fd3 = raw_connect(port);
    raw_challenge(fd3, nonce, sn2);
    uint8_t set[TD_STORE_HEADER_LEN] = {TD_STORE_CMD_SET, 0, 0, 0, 0, 0, 1, 0, 0};
    raw_send(fd3, set, sizeof set);
    expect_closed(fd3, buf, sizeof buf);
    close(fd1);
    td_store_server_stats st;
    TD_CHECK(tcp_store_server_stats(master, &st));
    TD_CHECK_EQ(st.dropped, 2);
    td_store_release(master);
}

typedef struct capture {
    int listen_fd;
    uint8_t got[4096];
    size_t len;
} capture;

/* Accepts one connection, keeps what it sends until it closes or 4 KiB, then closes. */
static void *capture_hello(void *p)
{
    capture *c = p;
    int fd = accept(c->listen_fd, NULL, NULL);
    if (fd < 0)
        return NULL;
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    while (c->len < sizeof c->got && poll(&pf, 1, 500) == 1) {
        ssize_t n = recv(fd, c->got + c->len, sizeof c->got - c->len, 0);
        if (n <= 0)
            break;
        c->len += (size_t)n;
    }
    close(fd);
    return NULL;
}

/* What a client with a secret sends to whoever listens at the store's address: a HELLO with a
 * nonce, and not the secret. */
TD_TEST(the_secret_never_travels, .timeout_s = 60)
{
    (void)ctx;
    capture c = {.listen_fd = socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    TD_CHECK(bind(c.listen_fd, (struct sockaddr *)&a, sizeof a) == 0);
    TD_CHECK(listen(c.listen_fd, 4) == 0);
    TD_CHECK(getsockname(c.listen_fd, (struct sockaddr *)&a, &alen) == 0);
    pthread_t th;
    TD_CHECK(pthread_create(&th, NULL, capture_hello, &c) == 0);
    setenv("TDIST_STORE_UNIX", "0", 1);
    td_store *s = NULL;
    TD_CHECK(auth_client(ntohs(a.sin_port), "s3cret-that-must-not-travel", &s) != TD_OK);
    unsetenv("TDIST_STORE_UNIX");
    pthread_join(th, NULL);
    close(c.listen_fd);
    TD_CHECK_EQ(c.len, (size_t)(TD_STORE_HEADER_LEN + 12 + AUTH_NONCE_LEN));
    TD_CHECK_EQ(c.got[0], TD_STORE_CMD_HELLO);
    TD_CHECK(memmem(c.got, c.len, "s3cret", 6) == NULL);
}

TD_TEST(ipv6_loopback, .timeout_s = 60)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "::1";
    o.port = 0;
    o.is_master = true;
    o.world_size = 1;
    o.timeout_ms = 10000;
    td_store *master = NULL;
    td_status s = td_tcp_store_create(&o, &master);
    if (s != TD_OK && strstr(td_last_error(), "cannot listen"))
        TD_SKIP(TD_SKIP_GENERIC, "no IPv6 loopback on this machine");
    TD_CHECK_OK(s);
    o.is_master = false;
    o.port = td_tcp_store_port(master);
    td_store *c = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &c));
    TD_CHECK_OK(td_store_set_str(c, "v6", "yes"));
    char *t = get_str(master, "v6");
    TD_CHECK_STR_EQ(t, "yes");
    free(t);
    td_store_release(c);
    td_store_release(master);
}

TD_TEST(connect_timeout_names_address_and_last_error, .timeout_s = 60)
{
    /* A bound socket that does not listen: connections to its port are refused, and no other
     * program can take the port meanwhile. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TD_CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    socklen_t len = sizeof a;
    TD_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    int port = ntohs(a.sin_port);
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.timeout_ms = 700;
    td_store *c = NULL;
    double t0 = now_s();
    TD_CHECK_ERR(td_tcp_store_create(&o, &c), TD_ERR_TIMEOUT, "Connection refused");
    double dt = now_s() - t0;
    char where[64];
    snprintf(where, sizeof where, "connecting to 127.0.0.1:%d: ", port);
    TD_CHECK_CONTAINS(td_last_error(), where);
    TD_CHECK_MSG(dt >= 0.7 && dt <= 1.7, "gave up after %.3f s", dt);
    close(fd);
    /* Bad arguments fail at once. */
    o.port = 70000;
    TD_CHECK_ERR(td_tcp_store_create(&o, &c), TD_ERR_INVALID, "port must have value from 0 to 65535 but was 70000.");
    o.port = 0;
    TD_CHECK_ERR(td_tcp_store_create(&o, &c), TD_ERR_INVALID, "needs the master's port");
    o.port = 1;
    o.host = "no-such-host.invalid";
    TD_CHECK_ERR(td_tcp_store_create(&o, &c), TD_ERR_NOT_FOUND, "cannot resolve host 'no-such-host.invalid'");
}

TD_TEST(oversize_key_and_value_rejected_by_client, .timeout_s = 60)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_master = true;
    o.world_size = 1;
    o.timeout_ms = 10000;
    o.max_key_len = 100;
    o.max_value_len = 1000;
    td_store *s = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &s));
    char key[200];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    TD_CHECK_ERR(td_store_set_str(s, key, "v"), TD_ERR_INVALID, "exceeds the server's limit of 100 bytes");
    char val[2000];
    memset(val, 'v', sizeof val);
    TD_CHECK_ERR(td_store_set(s, "k", val, sizeof val), TD_ERR_INVALID, "exceeds the server's limit of 1000 bytes");
    TD_CHECK_OK(td_store_set(s, "k", val, 1000));
    /* Appends past the limit are refused by the server, which keeps the connection. */
    TD_CHECK_ERR(td_store_append(s, "k", "x", 1), TD_ERR_INVALID, "over the server's limit of 1000 bytes");
    void *v;
    size_t n;
    TD_CHECK_OK(td_store_get(s, "k", &v, &n));
    TD_CHECK_EQ(n, 1000);
    free(v);
    td_store_release(s);
}

/* A blocked get that times out is cancelled on the server: it is no longer parked, and a value
 * set later does not arrive as a stale answer to the next call. */
TD_TEST(timeout_cancels_the_parked_request, .timeout_s = 60)
{
    td_store *s = tcp_master(ctx, 1, 500);
    unpublish(ctx, "port");
    void *v = NULL;
    size_t n;
    TD_CHECK_ERR(td_store_get(s, "late", &v, &n), TD_ERR_TIMEOUT, "Socket Timeout");
    td_store_server_stats st;
    double end = now_s() + 10;
    do {
        tcp_store_server_stats(s, &st);
    } while (st.parked != 0 && now_s() < end);
    TD_CHECK_EQ(st.parked, 0);
    TD_CHECK_OK(td_store_set_str(s, "late", "value"));
    int64_t c = 0;
    TD_CHECK_OK(td_store_add(s, "counter", 7, &c));
    TD_CHECK_EQ(c, 7);
    char *t = get_str(s, "late");
    TD_CHECK_STR_EQ(t, "value");
    free(t);
    td_store_release(s);
}

typedef struct mute_server {
    int listen_fd;
    int conn_fd;
} mute_server;

/* A server that answers HELLO, then reads the next request and never answers it. */
static void *mute_main(void *p)
{
    mute_server *m = p;
    m->conn_fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    TD_CHECK(m->conn_fd >= 0);
    uint8_t hdr[TD_STORE_HEADER_LEN], body[4096];
    TD_CHECK(recv(m->conn_fd, hdr, sizeof hdr, MSG_WAITALL) == (ssize_t)sizeof hdr);
    size_t n = (size_t)store_get_u64(hdr + 1);
    TD_CHECK(n <= sizeof body && recv(m->conn_fd, body, n, MSG_WAITALL) == (ssize_t)n);
    td_buf b = TD_BUF_INIT;
    size_t off = store_msg_begin(&b, TD_STORE_REPLY_OK);
    buf_put_u32(&b, TD_STORE_PROTO_VERSION);
    buf_put_u64(&b, 1 << 16);
    buf_put_u64(&b, 1 << 20);
    buf_put_u8(&b, 0); /* no secret */
    store_msg_end(&b, off);
    raw_send(m->conn_fd, b.data, b.len);
    buf_free(&b);
    return NULL;
}

/* A request the server never answers times out ("Socket Timeout") and drops the connection; the
 * next call tries to reconnect, and a server that is gone by then fails it at once instead of
 * after the store's timeout. */
TD_TEST(unanswered_request_times_out_and_a_gone_server_is_not_waited_for, .timeout_s = 60)
{
    mute_server m = {-1, -1};
    int port = 0;
    m.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TD_CHECK(bind(m.listen_fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(m.listen_fd, 4) == 0);
    socklen_t len = sizeof a;
    TD_CHECK(getsockname(m.listen_fd, (struct sockaddr *)&a, &len) == 0);
    port = ntohs(a.sin_port);
    pthread_t th;
    TD_CHECK(pthread_create(&th, NULL, mute_main, &m) == 0);
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = port;
    o.timeout_ms = 500;
    o.wait_for_workers = false;
    td_store *c = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &c));
    pthread_join(th, NULL);
    double t0 = now_s();
    TD_CHECK_ERR(td_store_add(c, "k", 1, NULL), TD_ERR_TIMEOUT, "Socket Timeout");
    double dt = now_s() - t0;
    TD_CHECK_MSG(dt >= 0.5 && dt <= 1.5, "timed out after %.3f s", dt);
    /* The server goes away; the store's timeout is long, the failure must not be. */
    close(m.conn_fd);
    close(m.listen_fd);
    TD_CHECK_OK(td_store_set_timeout(c, 60000));
    t0 = now_s();
    TD_CHECK_ERR(td_store_add(c, "k", 1, NULL), TD_ERR_PEER_LOST, "cannot reconnect to the server at 127.0.0.1:");
    TD_CHECK_MSG(now_s() - t0 < 5, "took %.3f s to give up", now_s() - t0);
    TD_CHECK_ERR(td_store_add(c, "k", 1, NULL), TD_ERR_PEER_LOST, "was lost earlier");
    td_store_release(c);
}

/* Same-host clients use the local socket, unless TDIST_STORE_UNIX=0; clients that name the
 * host by one of its interface addresses get it too when the server is bound to the wildcard. */
TD_TEST(same_host_clients_use_the_local_socket, .timeout_s = 60)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = NULL; /* every interface */
    o.port = 0;
    o.is_master = true;
    o.world_size = 1;
    o.timeout_ms = 10000;
    td_store *master = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &master));
    td_store_server_stats st;
    TD_CHECK(tcp_store_server_stats(master, &st));
    TD_CHECK_EQ(st.accepted_local, 1);
    o.is_master = false;
    o.port = td_tcp_store_port(master);
    o.world_size = -1;
    /* An interface address of this host, if it has one besides loopback. */
    struct ifaddrs *ifs = NULL;
    char ip[INET_ADDRSTRLEN] = "";
    TD_CHECK(getifaddrs(&ifs) == 0);
    for (struct ifaddrs *i = ifs; i && !ip[0]; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        const struct sockaddr_in *in = (const struct sockaddr_in *)i->ifa_addr;
        if ((ntohl(in->sin_addr.s_addr) >> 24) != 127)
            inet_ntop(AF_INET, &in->sin_addr, ip, sizeof ip);
    }
    freeifaddrs(ifs);
    uint64_t want_local = 1;
    td_store *c = NULL;
    if (ip[0]) {
        o.host = ip;
        TD_CHECK_OK(td_tcp_store_create(&o, &c));
        TD_CHECK_OK(td_store_set_str(c, "via", ip));
        td_store_release(c);
        want_local++;
    }
    setenv("TDIST_STORE_UNIX", "0", 1);
    o.host = "127.0.0.1";
    TD_CHECK_OK(td_tcp_store_create(&o, &c));
    unsetenv("TDIST_STORE_UNIX");
    TD_CHECK_OK(td_store_set_str(c, "via", "tcp"));
    TD_CHECK(tcp_store_server_stats(master, &st));
    TD_CHECK_EQ(st.accepted_local, want_local);
    TD_CHECK_EQ(st.accepted, want_local + 1);
    td_store_release(c);
    td_store_release(master);
}

TD_TEST_MAIN()
