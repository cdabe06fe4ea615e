/* The RPC listener's authentication by the job's secret (TDIST_AUTH_TOKEN; docs/protocols.md,
 * "Connections and the hello"), with real agents: workers in processes that share a secret call
 * each other; workers whose secrets disagree fail their init with the reason, both sides, within
 * seconds; an impostor that read a listener's store entry (its addresses and nonce) but lacks the
 * secret is refused and logged, and the listener keeps serving; and a real hello, captured by a
 * test listener published as a worker's entry, carries a proof that checks under the documented
 * framing but not the secret's bytes. Each process sets its secret with setenv before its agent
 * starts, as the agent reads it once then. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <tdist/rpc.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "base/le.h"
#include "net/auth.h"
#include "rpc/message.h"
#include "rpc_util.h"
#include "transport/samehost.h"

#define HELLO_WIRE (RPC_HEADER_BYTES + RPC_HELLO_PAYLOAD)
#define ANSWER_WIRE (RPC_HEADER_BYTES + RPC_ANSWER_PAYLOAD)

static const rpc_test_function functions[] = {{"add_ints", rpc_test_add_ints, NULL, NULL}};

static void set_secret(const char *secret)
{
    if (secret)
        TD_CHECK(setenv("TDIST_AUTH_TOKEN", secret, 1) == 0);
    else
        TD_CHECK(unsetenv("TDIST_AUTH_TOKEN") == 0);
}


static int64_t add_on(td_rpc_agent *a, int to, int64_t x, int64_t y)
{
    td_value *args = td_value_tuple_of(2, td_value_int(x), td_value_int(y)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(a, td_rpc_to_id(to), "add_ints", args, NULL, -1, &r));
    int64_t v = td_value_get_int(r);
    td_value_release(r);
    td_value_release(args);
    return v;
}

/* ---- (a) one secret on every worker ------------------------------------------------------------ */

TD_TEST(same_secret, .world_size = 3, .params = "unix,tcp", .timeout_s = 60)
{
    set_secret("the job's secret, shared by every worker");
    rpc_test_register(functions, 1);
    td_rpc_options o = rpc_test_options(ctx);
    o.tcp_only = strcmp(ctx->param, "tcp") == 0;
    rpc_test_init(ctx, &o);
    for (int to = 0; to < ctx->world_size; to++)
        TD_CHECK_EQ(add_on(NULL, to, ctx->rank, 100), ctx->rank + 100);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- (b) secrets that disagree ----------------------------------------------------------------- */

/* Worker 0 connects to worker 1 (the lower id connects): each fails its init with its side of the
 * reason, the connector at once (the listener's answer says why), the listener once the refused
 * worker has not connected after all for RPC_AUTH_GRACE_MS (3 s); nothing waits for the join
 * timeout (a minute), and the failed init gives back every fd. */
TD_TEST(secrets_disagree, .world_size = 2, .params = "mismatch,connector_has_none,listener_has_none",
        .timeout_s = 60)
{
    const char *p = ctx->param, *secret, *want;
    bool connector = ctx->rank == 0;
    if (strcmp(p, "mismatch") == 0) {
        secret = connector ? "secret of worker 0" : "secret of worker 1";
        want = connector ? "authentication failed: TDIST_AUTH_TOKEN does not match worker worker1's (id 1)"
                         : "authentication failed: worker id 0's TDIST_AUTH_TOKEN does not match this worker's";
    } else if (strcmp(p, "connector_has_none") == 0) {
        secret = connector ? NULL : "secret of worker 1";
        want = connector ? "authentication failed: worker worker1 (id 1) requires the job's secret (TDIST_AUTH_TOKEN) "
                           "and the connecting worker has none"
                         : "authentication failed: worker id 0 connected without the job's secret (TDIST_AUTH_TOKEN), "
                           "which this worker requires";
    } else {
        secret = connector ? "secret of worker 0" : NULL;
        want = connector ? "authentication failed: worker worker1 (id 1) does not authenticate (it has no "
                           "TDIST_AUTH_TOKEN) but this worker has one"
                         : "authentication failed: worker id 0 has a TDIST_AUTH_TOKEN but this worker has none";
    }
    set_secret(secret);
    rpc_test_register(functions, 1);
    td_rpc_options o = rpc_test_options(ctx);
    char name[32];
    snprintf(name, sizeof name, "worker%d", ctx->rank);
    int fds_before = rpc_test_open_fds();
    double t0 = rpc_test_now_s();
    TD_CHECK_ERR(td_rpc_init(name, ctx->rank, ctx->world_size, &o), TD_ERR_INVALID, want);
    double took = rpc_test_now_s() - t0;
    TD_CHECK_MSG(took < 15.0, "init took %.1f s to fail", took);
    TD_CHECK_EQ(rpc_test_open_fds(), fds_before);
    /* Nothing half-made stays behind: no default agent. */
    TD_CHECK_ERR(td_rpc_shutdown(true, 0), TD_ERR_NOT_INIT, NULL);
}

/* A dynamic group's newcomer whose secret is not the group's fails its join with the reason and
 * leaves the group as it was: the next newcomer, with the group's secret, joins and finds only the
 * members. */
TD_TEST(dynamic_newcomer_wrong_secret, .world_size = 3, .timeout_s = 60)
{
    set_secret(ctx->rank == 1 ? "a stale secret" : "the group's secret");
    rpc_test_register(functions, 1);
    td_store *s = NULL;
    TD_CHECK_OK(td_file_store_create(ctx->store_path, ctx->world_size, &s));
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.store = s;
    char name[32];
    snprintf(name, sizeof name, "worker%d", ctx->rank);
    const char *wait_for[] = {NULL, "rank0_up", "tried"};
    if (wait_for[ctx->rank])
        TD_CHECK_OK(td_store_wait(s, &wait_for[ctx->rank], 1, 30000));
    if (ctx->rank == 1) {
        TD_CHECK_ERR(td_rpc_init(name, ctx->rank, -1, &o), TD_ERR_INVALID,
                     "authentication failed: TDIST_AUTH_TOKEN does not match worker worker0's (id 0)");
        TD_CHECK_OK(td_store_set_str(s, "tried", "1"));
        td_store_release(s);
        return;
    }
    TD_CHECK_OK(td_rpc_init(name, ctx->rank, -1, &o));
    if (ctx->rank == 0) {
        TD_CHECK_OK(td_store_set_str(s, "rank0_up", "1"));
        const char *k = "joined2";
        TD_CHECK_OK(td_store_wait(s, &k, 1, 30000));
    } else {
        TD_CHECK_EQ(add_on(NULL, 0, 20, 22), 42);
        TD_CHECK_OK(td_store_set_str(s, "joined2", "1"));
    }
    td_worker_info infos[4];
    size_t n = 0;
    TD_CHECK_OK(td_rpc_worker_infos(NULL, infos, 4, &n));
    TD_CHECK_EQ(n, 2);
    int64_t v = 0;
    TD_CHECK_OK(td_store_add(s, "checked", 1, &v));
    for (int i = 0; v < 2 && i < 3000; i++) {
        rpc_test_sleep_ms(10);
        TD_CHECK_OK(td_store_add(s, "checked", 0, &v));
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_store_release(s);
}

/* ---- (c) an impostor that read the store --------------------------------------------------------- */

typedef struct agent_start {
    const char *name;
    int rank, world_size;
    td_rpc_options o;
    td_rpc_agent *agent;
    td_status st;
    char error[512];
} agent_start;

static void *agent_start_main(void *arg)
{
    agent_start *s = arg;
    s->st = td_rpc_agent_create(s->name, s->rank, s->world_size, &s->o, &s->agent);
    if (s->st != TD_OK)
        snprintf(s->error, sizeof s->error, "%s", td_last_error());
    return NULL;
}

typedef struct store_entry {
    char name[64], addr[300], host[192], uname[96];
    unsigned long long nonce;
} store_entry;

static store_entry entry_read(td_store *store, const char *key)
{
    TD_CHECK_OK(td_store_wait(store, &key, 1, 30000));
    void *v = NULL;
    size_t len = 0;
    TD_CHECK_OK(td_store_get(store, key, &v, &len));
    store_entry e;
    TD_CHECK(sscanf(v, "%63s %299s %191s %95s %llx", e.name, e.addr, e.host, e.uname, &e.nonce) == 5);
    free(v);
    return e;
}

static int tcp_connect_to(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    TD_CHECK(colon != NULL);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    TD_CHECK(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    TD_CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    return fd;
}

static void recv_timeout(int fd, int seconds)
{
    struct timeval tv = {seconds, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static bool recv_exact(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n <= 0)
            return false;
        got += (size_t)n;
    }
    return true;
}

/* Sends a forged hello as worker 0 with the listener's nonce: without a secret, or claiming one
 * with a proof under another key. The listener answers why it refuses, then closes. */
static void impostor_try(int fd, uint64_t nonce, bool claims_secret, uint32_t want_status)
{
    uint8_t wire[HELLO_WIRE];
    rpc_header h = {.type = RPC_MSG_CONTROL, .sender = 0, .id = nonce, .payload_len = RPC_HELLO_PAYLOAD};
    rpc_header_write(&h, wire);
    rpc_hello hello = {.auth_flags = claims_secret ? RPC_AUTH_HAS_SECRET : 0};
    auth_nonce(hello.nonce);
    if (claims_secret) {
        auth_key guess;
        TD_CHECK_OK(auth_key_init("a guess at the secret", &guess));
        auth_part part = {hello.nonce, sizeof hello.nonce};
        auth_prove(&guess, "tdist rpc hello", &part, 1, hello.proof);
    }
    rpc_hello_write(&hello, wire + RPC_HEADER_BYTES);
    TD_CHECK(send(fd, wire, sizeof wire, MSG_NOSIGNAL) == (ssize_t)sizeof wire);
    recv_timeout(fd, 5);
    uint8_t answer[ANSWER_WIRE];
    TD_CHECK_MSG(recv_exact(fd, answer, sizeof answer), "the listener did not answer the forged hello");
    rpc_header ah;
    rpc_answer ans;
    TD_CHECK_OK(rpc_header_read(answer, RPC_ANSWER_PAYLOAD, &ah));
    TD_CHECK_OK(rpc_answer_read(answer + RPC_HEADER_BYTES, &ans));
    TD_CHECK_EQ(ans.status, want_status);
    char c;
    TD_CHECK_MSG(recv(fd, &c, 1, 0) == 0, "the listener did not close the impostor's connection");
    close(fd);
}

/* Worker 1 of a world of two starts, with the secret; an impostor that read its entry (TCP address,
 * same-host socket name, nonce) claims to be worker 0 before the real worker 0 comes, and again
 * after: refused each time (hello without a secret, hello with a wrong proof), the real worker 0
 * still joins (the refusal of an impostor does not fail the start) and both serve calls. */
TD_TEST(impostor_inner, .world_size = 1, .timeout_s = 60, .hidden = true)
{
    (void)ctx;
    set_secret("the real job's secret");
    rpc_test_register(functions, 1);
    td_store *store = NULL;
    TD_CHECK_OK(td_hash_store_create(&store));
    agent_start beta = {.name = "beta", .rank = 1, .world_size = 2};
    td_rpc_options_init(&beta.o);
    beta.o.store = store;
    pthread_t t;
    TD_CHECK(pthread_create(&t, NULL, agent_start_main, &beta) == 0);
    store_entry e = entry_read(store, "rpc_prefix_1/worker/1");
    TD_CHECK_STR_EQ(e.name, "beta");
    int fds_before = rpc_test_open_fds();
    impostor_try(tcp_connect_to(e.addr), e.nonce, false, RPC_ANSWER_NEEDS_SECRET);
    impostor_try(tcp_connect_to(e.addr), e.nonce, true, RPC_ANSWER_WRONG_SECRET);
    if (strcmp(e.uname, "-") != 0) {
        int fd = samehost_unix_connect(e.uname);
        TD_CHECK_MSG(fd >= 0, "cannot reach %s's same-host socket", e.name);
        impostor_try(fd, e.nonce, true, RPC_ANSWER_WRONG_SECRET);
    }

    agent_start alpha = {.name = "alpha", .rank = 0, .world_size = 2};
    td_rpc_options_init(&alpha.o);
    alpha.o.store = store;
    agent_start_main(&alpha);
    TD_CHECK_MSG(alpha.st == TD_OK, "alpha: %s", alpha.error);
    TD_CHECK(pthread_join(t, NULL) == 0);
    TD_CHECK_MSG(beta.st == TD_OK, "beta: %s", beta.error);
    TD_CHECK_EQ(add_on(alpha.agent, 1, 40, 2), 42);
    TD_CHECK_EQ(add_on(beta.agent, 0, 1, 2), 3);
    /* Once running, the same: refused, and the calls go on. */
    impostor_try(tcp_connect_to(e.addr), e.nonce, false, RPC_ANSWER_NEEDS_SECRET);
    TD_CHECK_EQ(add_on(alpha.agent, 1, 5, 6), 11);
    TD_CHECK_EQ(add_on(beta.agent, 0, 7, 8), 15);
    /* The refused connections' fds went back at once (alpha's own connection is new since). */
    int fds_now = rpc_test_open_fds();
    TD_CHECK_MSG(fds_now <= fds_before + 8, "%d fds open, %d before the impostor", fds_now, fds_before);
    TD_CHECK_OK(td_rpc_agent_shutdown(alpha.agent, false, 0));
    TD_CHECK_OK(td_rpc_agent_shutdown(beta.agent, false, 0));
    td_store_release(store);
}

TD_TEST(impostor_refused, .world_size = 1, .timeout_s = 90)
{
    (void)ctx;
    td_test_result r;
    TD_CHECK_OK(td_test_run("impostor_inner", &r));
    TD_CHECK_MSG(r.verdict == TD_TEST_PASS, "inner case: %s", r.message);
    /* The listener logged each refusal with where it came from and why. */
    TD_CHECK_CONTAINS(r.output, "RPC agent beta: refused a connection from 127.0.0.1:");
    TD_CHECK_CONTAINS(r.output, ": authentication failed: worker id 0 connected without the job's secret "
                                "(TDIST_AUTH_TOKEN), which this worker requires");
    TD_CHECK_CONTAINS(r.output, ": authentication failed: worker id 0's TDIST_AUTH_TOKEN does not match this worker's");
    td_test_result_free(&r);
}

/* ---- (d) the wire carries a proof, not the secret ----------------------------------------------- */

/* A test listener published as worker 1's entry receives a real hello from worker 0: it carries no
 * byte sequence of the secret (nor of the key made from it), and its proof is HMAC-SHA256 over the
 * documented parts. The listener's answer then decides worker 0's init: a right proof of the
 * secret admits, a wrong one fails it as a mismatch (worker 0 checks whom it reached). */
TD_TEST(secret_not_on_wire, .world_size = 1, .timeout_s = 60)
{
    (void)ctx;
    const char *secret = "wire-secret-7f3a9c1e5b";
    set_secret(secret);
    auth_key key;
    TD_CHECK_OK(auth_key_init(secret, &key));
    for (int round = 0; round < 2; round++) {
        bool right = round == 0;
        int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t slen = sizeof sa;
        TD_CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
        TD_CHECK(getsockname(lfd, (struct sockaddr *)&sa, &slen) == 0);
        const uint64_t nonce = 0x0123456789abcdefull + (uint64_t)round;
        td_store *store = NULL;
        TD_CHECK_OK(td_hash_store_create(&store));
        char entry[256];
        snprintf(entry, sizeof entry, "beta 127.0.0.1:%d - - %016llx", ntohs(sa.sin_port), (unsigned long long)nonce);
        TD_CHECK_OK(td_store_set_str(store, "rpc_prefix_1/worker/1", entry));

        agent_start alpha = {.name = "alpha", .rank = 0, .world_size = 2};
        td_rpc_options_init(&alpha.o);
        alpha.o.store = store;
        alpha.o.rpc_timeout_ms = 20000;
        pthread_t t;
        TD_CHECK(pthread_create(&t, NULL, agent_start_main, &alpha) == 0);
        int fd = accept(lfd, NULL, NULL);
        TD_CHECK(fd >= 0);
        recv_timeout(fd, 10);
        uint8_t wire[HELLO_WIRE];
        TD_CHECK(recv_exact(fd, wire, sizeof wire));

        TD_CHECK(memmem(wire, sizeof wire, secret, strlen(secret)) == NULL);
        for (size_t n = 0; n + 4 <= strlen(secret); n++)
            TD_CHECK_MSG(memmem(wire, sizeof wire, secret + n, 4) == NULL, "4 bytes of the secret at %zu on the wire", n);
        TD_CHECK(memmem(wire, sizeof wire, key.key, sizeof key.key) == NULL);
        rpc_header h;
        TD_CHECK_OK(rpc_header_read(wire, RPC_HELLO_PAYLOAD, &h));
        TD_CHECK_EQ(h.type, RPC_MSG_CONTROL);
        TD_CHECK_EQ(h.sender, 0);
        TD_CHECK_EQ(h.id, nonce);
        TD_CHECK_EQ(h.payload_len, RPC_HELLO_PAYLOAD);
        rpc_hello hello;
        TD_CHECK_OK(rpc_hello_read(wire + RPC_HEADER_BYTES, &hello));
        TD_CHECK_EQ(hello.auth_flags, RPC_AUTH_HAS_SECRET);
        /* docs/protocols.md: "tdist rpc hello" over u32 connector id, u32 listener id, u64 listener
         * nonce, the connector's nonce; integers little-endian. */
        uint8_t ids[8], lnonce[8];
        le_put(ids, 0, 4);
        le_put(ids + 4, 1, 4);
        le_put(lnonce, nonce, 8);
        auth_part parts[4] = {{ids, 4}, {ids + 4, 4}, {lnonce, 8}, {hello.nonce, sizeof hello.nonce}};
        TD_CHECK_MSG(auth_check(&key, "tdist rpc hello", parts, 4, hello.proof), "the hello's proof does not check");

        /* The answer: "tdist rpc accept" over the connector's nonce, u32 listener id, u64 nonce. */
        rpc_answer ans = {.status = RPC_ANSWER_ADMITTED, .auth_flags = RPC_AUTH_HAS_SECRET};
        auth_part acc[3] = {{hello.nonce, sizeof hello.nonce}, {ids + 4, 4}, {lnonce, 8}};
        auth_key wrong;
        TD_CHECK_OK(auth_key_init("not the secret", &wrong));
        auth_prove(right ? &key : &wrong, "tdist rpc accept", acc, 3, ans.proof);
        rpc_header ah = {.type = RPC_MSG_CONTROL, .sender = 1, .id = nonce, .payload_len = RPC_ANSWER_PAYLOAD};
        uint8_t answer[ANSWER_WIRE];
        rpc_header_write(&ah, answer);
        rpc_answer_write(&ans, answer + RPC_HEADER_BYTES);
        TD_CHECK(send(fd, answer, sizeof answer, MSG_NOSIGNAL) == (ssize_t)sizeof answer);
        TD_CHECK(pthread_join(t, NULL) == 0);
        if (right) {
            TD_CHECK_MSG(alpha.st == TD_OK, "alpha: %s", alpha.error);
            TD_CHECK_OK(td_rpc_agent_shutdown(alpha.agent, false, 0));
        } else {
            TD_CHECK_EQ(alpha.st, TD_ERR_INVALID);
            TD_CHECK_CONTAINS(alpha.error, "authentication failed: TDIST_AUTH_TOKEN does not match worker beta's (id 1)");
        }
        close(fd);
        close(lfd);
        td_store_release(store);
    }
}

TD_TEST_MAIN()
