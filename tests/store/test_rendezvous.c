/* Rendezvous (spec/c10d.md C3): c10d's error messages for each missing part of each URL kind, the
 * handler registry, and env://, tcp:// and file:// end to end with four rank processes. The TCP
 * cases never probe for a free port: rank 0 first starts a multi-tenant master on port 0 and
 * publishes the port, and its own rendezvous then shares that server, as c10d's multi_tenant does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/store.h>
#include <tdist/testing.h>

#include "base/clock.h"

#include "util.h"

#define E "Error initializing torch.distributed using "

static void expect_error(const char *url, int rank, int world, td_status code, const char *msg)
{
    td_store *s = (td_store *)0x1;
    int r = -7, w = -7;
    td_status got = td_rendezvous(url, rank, world, 1000, &s, &r, &w);
    TD_CHECK_MSG(got == code, "%s: got %s (%s), want %s", url, td_status_str(got), td_last_error(),
                 td_status_str(code));
    TD_CHECK_MSG(strcmp(td_last_error(), msg) == 0, "%s:\n  got  '%s'\n  want '%s'", url, td_last_error(), msg);
    TD_CHECK(s == NULL);
}

TD_TEST(url_errors_use_c10d_messages, .timeout_s = 60)
{
    expect_error("tcp://127.0.0.1?rank=0&world_size=1", -1, -1, TD_ERR_INVALID, E "tcp:// rendezvous: port number missing");
    expect_error("tcp://127.0.0.1:0", 0, 1, TD_ERR_INVALID, E "tcp:// rendezvous: port number missing");
    expect_error("tcp://127.0.0.1:1234?world_size=1", -1, -1, TD_ERR_INVALID, E "tcp:// rendezvous: rank parameter missing");
    expect_error("tcp://127.0.0.1:1234", 0, -1, TD_ERR_INVALID, E "tcp:// rendezvous: world size parameter missing");
    expect_error("tcp://127.0.0.1:1234?rank=x&world_size=1", -1, -1, TD_ERR_INVALID,
                 E "tcp:// rendezvous: rank must be an integer from 0 to 2147483647, got 'x'");
    expect_error("file://", 0, 1, TD_ERR_INVALID, E "file:// rendezvous: path missing");
    expect_error("file:///tmp/tdist-nothing?world_size=1", -1, -1, TD_ERR_INVALID, E "file:// rendezvous: rank parameter missing");
    expect_error("file:///tmp/tdist-nothing", 0, -1, TD_ERR_INVALID, E "file:// rendezvous: world size parameter missing");
    expect_error("foo://bar", 0, 1, TD_ERR_INVALID, "No rendezvous handler for foo://");
    expect_error("/just/a/path", 0, 1, TD_ERR_INVALID, "No rendezvous handler for ://");
    expect_error("file:///tmp/x?rank=0", 0, 1, TD_ERR_INVALID,
                 "The url: file:///tmp/x?rank=0 has node-specific arguments(rank, world_size) already.");
    expect_error("file:///tmp/x?world_size=2", -1, 2, TD_ERR_INVALID,
                 "The url: file:///tmp/x?world_size=2 has node-specific arguments(rank, world_size) already.");
}

/* A rank outside the world fails at once with a message naming where the numbers came from, where it
 * used to wait at the store for the whole timeout (issue 22's fail-fast startup). */
TD_TEST(rank_out_of_range_fails_at_once, .timeout_s = 60)
{
    int64_t t0 = clock_now_ns();
    expect_error("tcp://127.0.0.1:1234", 4, 4, TD_ERR_INVALID,
                 E "tcp:// rendezvous: rank 4 is out of range for world size 4 (ranks are 0 to 3); check the URL's rank "
                   "and world_size");
    expect_error("file:///tmp/tdist-nothing?rank=7&world_size=2", -1, -1, TD_ERR_INVALID,
                 E "file:// rendezvous: rank 7 is out of range for world size 2 (ranks are 0 to 1); check the URL's "
                   "rank and world_size");
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_PORT", "1234", 1);
    expect_error("env://", -1, -1, TD_ERR_INVALID,
                 E "env:// rendezvous: rank 3 is out of range for world size 2 (ranks are 0 to 1); check RANK and "
                   "WORLD_SIZE");
    TD_CHECK((clock_now_ns() - t0) / 1000000 < 5000);
}

TD_TEST(env_errors_use_c10d_messages, .timeout_s = 60)
{
    /* The harness sets RANK, WORLD_SIZE and MASTER_ADDR and leaves MASTER_PORT unset, as c10d's
     * TestDistBackend does. */
    unsetenv("MASTER_PORT");
    expect_error("env://", -1, -1, TD_ERR_INVALID, E "env:// rendezvous: environment variable MASTER_PORT expected, but not set");
    unsetenv("RANK");
    expect_error("env://", -1, -1, TD_ERR_INVALID, E "env:// rendezvous: environment variable RANK expected, but not set");
    unsetenv("WORLD_SIZE");
    expect_error("env://", 0, -1, TD_ERR_INVALID, E "env:// rendezvous: environment variable WORLD_SIZE expected, but not set");
    expect_error("env://?world_size=1", 0, -1, TD_ERR_INVALID,
                 "The url: env://?world_size=1 has node-specific arguments(rank, world_size) already.");
    setenv("MASTER_ADDR", "", 1); /* empty counts as unset, as in c10d */
    expect_error("env://", 0, 1, TD_ERR_INVALID, E "env:// rendezvous: environment variable MASTER_ADDR expected, but not set");
    unsetenv("MASTER_ADDR");
    expect_error("env://?rank=0&world_size=1", -1, -1, TD_ERR_INVALID,
                 E "env:// rendezvous: environment variable MASTER_ADDR expected, but not set");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "70000", 1);
    expect_error("env://", 0, 1, TD_ERR_INVALID, "port must have value from 0 to 65535 but was 70000.");
    setenv("MASTER_PORT", "-1", 1);
    expect_error("env://", 0, 1, TD_ERR_INVALID, "port must have value from 0 to 65535 but was -1.");
    setenv("MASTER_PORT", "http", 1);
    expect_error("env://", 0, 1, TD_ERR_INVALID, E "env:// rendezvous: MASTER_PORT must be an integer, got 'http'");
}

static td_status mem_handler(const char *url, int64_t timeout_ms, void *arg, td_store **store, int *rank, int *world)
{
    char r[16], w[16];
    if (!td_rendezvous_url_param(url, "rank", r, sizeof r) || !td_rendezvous_url_param(url, "world_size", w, sizeof w))
        return TD_ERR_INVALID;
    *rank = atoi(r);
    *world = atoi(w);
    ++*(int *)arg;
    return td_hash_store_create(store);
}

TD_TEST(registry_adds_schemes_and_refuses_duplicates, .timeout_s = 60)
{
    int calls = 0;
    TD_CHECK_ERR(td_rendezvous_register("env", mem_handler, &calls), TD_ERR_ALREADY,
                 "Rendezvous handler for env:// already registered");
    TD_CHECK_ERR(td_rendezvous_register("bad scheme", mem_handler, &calls), TD_ERR_INVALID, "not a URL scheme");
    TD_CHECK_OK(td_rendezvous_register("mem", mem_handler, &calls));
    TD_CHECK_ERR(td_rendezvous_register("mem", mem_handler, &calls), TD_ERR_ALREADY,
                 "Rendezvous handler for mem:// already registered");
    td_store *s = NULL;
    int r = -1, w = -1;
    TD_CHECK_OK(td_rendezvous("mem://anything?x=1#frag", 2, 5, 4321, &s, &r, &w));
    TD_CHECK_EQ(r, 2);
    TD_CHECK_EQ(w, 5);
    TD_CHECK_EQ(calls, 1);
    TD_CHECK_EQ(td_store_get_timeout(s), 4321);
    td_store_release(s);
    TD_CHECK_OK(td_rendezvous("mem://?rank=1&world_size=3", -1, -1, 0, &s, &r, &w));
    TD_CHECK_EQ(r, 1);
    TD_CHECK_EQ(w, 3);
    TD_CHECK_EQ(td_store_get_timeout(s), 0);
    td_store_release(s);
    char v[8];
    TD_CHECK(td_rendezvous_url_param("x://h?a=1&bb=22&c", "bb", v, sizeof v) && strcmp(v, "22") == 0);
    TD_CHECK(td_rendezvous_url_param("x://h?a=1&bb=22&c", "c", v, sizeof v) && strcmp(v, "") == 0);
    TD_CHECK(!td_rendezvous_url_param("x://h?a=1&bb=22&c", "b", v, sizeof v));
    TD_CHECK(!td_rendezvous_url_param("x://h#a=1", "a", v, sizeof v));
}

static void check_world(td_test_ctx *ctx, td_store *s, int r, int w)
{
    TD_CHECK_EQ(r, ctx->rank);
    TD_CHECK_EQ(w, ctx->world_size);
    char key[32];
    snprintf(key, sizeof key, "hello/%d", r);
    TD_CHECK_OK(td_store_set_str(s, key, "hi"));
    const char *keys[] = {"hello/0", "hello/1", "hello/2", "hello/3"};
    TD_CHECK_OK(td_store_wait(s, keys, 4, TD_STORE_TIMEOUT_DEFAULT));
    int64_t n = 0;
    TD_CHECK_OK(td_store_add(s, "sum", r + 1, &n));
    store_barrier(s, "b", w);
    char *t = get_str(s, "sum");
    TD_CHECK_STR_EQ(t, "10");
    free(t);
}

TD_TEST(file_url_four_ranks, .world_size = 4, .timeout_s = 60)
{
    td_store *s = NULL;
    int r, w;
    TD_CHECK_OK(td_rendezvous(ctx->init_url, ctx->rank, ctx->world_size, 30000, &s, &r, &w));
    check_world(ctx, s, r, w);
    store_barrier(s, "end", 4);
    td_store_release(s);
}

/* Rank 0's multi-tenant master on port 0, whose port the ranks then put in their URL. */
static td_store *pre_master(td_test_ctx *ctx, int *port)
{
    if (ctx->rank != 0) {
        *port = read_published_int(ctx, "port");
        return NULL;
    }
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_master = true;
    o.multi_tenant = true;
    o.wait_for_workers = false;
    o.timeout_ms = 30000;
    td_store *s = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &s));
    *port = td_tcp_store_port(s);
    publish_int(ctx, "port", *port);
    return s;
}

/* Clients count themselves out, then the master (which serves them) closes last. */
static void finish_tcp(td_test_ctx *ctx, td_store *s, td_store *pre)
{
    if (ctx->rank == 0) {
        int64_t n = 0;
        while (n < 3) {
            sleep_s(0.005);
            TD_CHECK_OK(td_store_add(s, "released", 0, &n));
        }
        unpublish(ctx, "port");
    } else {
        TD_CHECK_OK(td_store_add(s, "released", 1, NULL));
    }
    td_store_release(s);
    td_store_release(pre);
}

TD_TEST(tcp_url_four_ranks, .world_size = 4, .timeout_s = 60)
{
    int port;
    td_store *pre = pre_master(ctx, &port);
    char url[128];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    td_store *s = NULL;
    int r, w;
    TD_CHECK_OK(td_rendezvous(url, ctx->rank, ctx->world_size, 30000, &s, &r, &w));
    TD_CHECK_EQ(td_tcp_store_port(s), port);
    check_world(ctx, s, r, w);
    /* init/ from the four rendezvous handles' wait_for_workers. */
    char *t = NULL;
    int64_t n = 0;
    TD_CHECK_OK(td_store_num_keys(s, &n));
    TD_CHECK(n >= 1 + 4 + 1 + 2);
    (void)t;
    finish_tcp(ctx, s, pre);
}

TD_TEST(env_url_four_ranks, .world_size = 4, .timeout_s = 60)
{
    int port;
    td_store *pre = pre_master(ctx, &port);
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    setenv("MASTER_PORT", p, 1);
    td_store *s = NULL;
    int r, w;
    /* RANK, WORLD_SIZE and MASTER_ADDR come from the harness's environment. */
    TD_CHECK_OK(td_rendezvous("env://", -1, -1, 30000, &s, &r, &w));
    check_world(ctx, s, r, w);
    finish_tcp(ctx, s, pre);
}

/* Ranks given different world sizes (ranks 0 and 1 say 3, rank 2 says 4) fail within 5 s instead
 * of waiting for each other until the store's timeout: the rank that disagrees with the first one
 * to join fails at once, rank 0 (the master, waiting for the others) reads why and fails, and a rank
 * that had already joined fails as soon as the master's server is gone. Who joins first is up to
 * the scheduler, so each rank accepts either side of the message. */
TD_TEST(world_sizes_disagree_fail_fast, .world_size = 3, .timeout_s = 60)
{
    int port;
    td_store *pre = pre_master(ctx, &port);
    char url[128];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    int world = ctx->rank == 2 ? 4 : 3;
    int64_t t0 = clock_now_ms();
    td_store *s = NULL;
    int r, w;
    td_status st = td_rendezvous(url, ctx->rank, world, 30000, &s, &r, &w);
    if (ctx->rank != 0) /* rank 0 keeps its server until ranks 1 and 2 have met it */
        publish_int(ctx, ctx->rank == 1 ? "met_1" : "met_2", 1);
    const char *want = "the ranks disagree about the world size: a rank started with world size ";
    if (st == TD_OK) {
        /* Only a client that agrees with the first to join (itself, if it came first) gets here,
         * not the master, which waits for everyone: its next call fails once the master is gone. */
        TD_CHECK_MSG(ctx->rank != 0, "rank 0 joined a world of %d", w);
        const char *keys[] = {"never"};
        st = td_store_wait(s, keys, 1, 30000);
        TD_CHECK_MSG(st == TD_ERR_PEER_LOST, "after the master failed: %s (%s)", td_status_str(st), td_last_error());
        td_store_release(s);
    } else {
        TD_CHECK_MSG(st == TD_ERR_INVALID, "rank %d: %s (%s)", ctx->rank, td_status_str(st), td_last_error());
        TD_CHECK_CONTAINS(td_last_error(), want);
        const char *other = strstr(td_last_error(), want) + strlen(want);
        TD_CHECK_MSG(strncmp(other, "4 joined the store at 127.0.0.1:", 32) == 0 ||
                         strncmp(other, "3 joined the store at 127.0.0.1:", 32) == 0,
                     "rank %d: %s", ctx->rank, td_last_error());
        TD_CHECK_CONTAINS(td_last_error(), "give every rank the same world size (WORLD_SIZE, or the URL's world_size)");
    }
    if (ctx->rank == 0) {
        /* The master's server goes only after the others have met it (as it would with the
         * master's own, unshared store, which ends with its failed rendezvous). */
        TD_CHECK_EQ(read_published_int(ctx, "met_1"), 1);
        TD_CHECK_EQ(read_published_int(ctx, "met_2"), 1);
        unpublish(ctx, "met_1");
        unpublish(ctx, "met_2");
        unpublish(ctx, "port");
        td_store_release(pre);
    }
    int64_t took = clock_now_ms() - t0;
    TD_CHECK_MSG(took < 5000, "rank %d took %lld ms to fail", ctx->rank, (long long)took);
}

/* world_size 0, no fixed size (PyTorch's world_size=None, for RPC's dynamic groups): rank 0's
 * TCPStore master returns without waiting for anyone, and a FileStore outlives its last user. */
TD_TEST(no_fixed_world_size, .timeout_s = 60)
{
    td_store *s = NULL;
    int r = -7, w = -7;
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "0", 1); /* the master binds any free port (tcp:// would call 0 missing) */
    TD_CHECK_OK(td_rendezvous("env://", 0, 0, 30000, &s, &r, &w));
    TD_CHECK_EQ(r, 0);
    TD_CHECK_EQ(w, 0);
    TD_CHECK_OK(td_store_set_str(s, "k", "v"));
    td_store_release(s);
    char url[1100];
    snprintf(url, sizeof url, "file://%s/nofixed", ctx->tmpdir);
    TD_CHECK_OK(td_rendezvous(url, 3, 0, 30000, &s, &r, &w));
    TD_CHECK_EQ(w, 0);
    TD_CHECK_OK(td_store_set_str(s, "k", "v"));
    td_store_release(s);
    char path[1100];
    snprintf(path, sizeof path, "%s/nofixed", ctx->tmpdir);
    TD_CHECK_MSG(access(path, F_OK) == 0, "the FileStore of no fixed size was removed by its only user");
    unlink(path);
}

TD_TEST(env_url_under_an_elastic_agent_store, .timeout_s = 60)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_master = true;
    o.wait_for_workers = false;
    o.timeout_ms = 30000;
    td_store *agent = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &agent));
    char p[16];
    snprintf(p, sizeof p, "%d", td_tcp_store_port(agent));
    setenv("MASTER_PORT", p, 1);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
    td_store *s = NULL;
    int r, w;
    TD_CHECK_OK(td_rendezvous("env://", 0, 1, 30000, &s, &r, &w));
    TD_CHECK_OK(td_store_set_str(s, "k", "v"));
    char *t = get_str(agent, "/worker/attempt_3/k");
    TD_CHECK_STR_EQ(t, "v");
    free(t);
    unsetenv("TORCHELASTIC_RESTART_COUNT");
    td_store *s2 = NULL;
    TD_CHECK_ERR(td_rendezvous("env://", 0, 1, 30000, &s2, &r, &w), TD_ERR_INVALID,
                 "environment variable TORCHELASTIC_RESTART_COUNT expected, but not set");
    td_store_release(s);
    td_store_release(agent);
}

TD_TEST_MAIN()
