/* Dynamic membership of RPC groups (spec/rpc_part2.md C12): workers created with world_size < 0
 * join a group one after another under the store's token, call and are called by the members that
 * were there before them, leave gracefully (the others drop them from their tables), and cannot be
 * mixed with a static group. Ported from rpc_test.py's test_dynamic_rpc_* and
 * test_dynamic_and_static_init_rpc_together. The workers of a case meet through one FileStore the
 * test opens (counted out by every rank, so the file goes with the last); joins are staggered: rank
 * 0 first, the others once it said so through the store. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <tdist/rpc.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "rpc_util.h"

static void register_functions(void)
{
    const rpc_test_function fns[] = {{"add_ints", rpc_test_add_ints, NULL, NULL},
                                     {"callee_id", rpc_test_callee_id, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
}

static td_store *open_store(td_test_ctx *ctx)
{
    td_store *s = NULL;
    TD_CHECK_OK(td_file_store_create(ctx->store_path, ctx->world_size, &s));
    return s;
}

/* Waits until the counter key reaches n (every rank adds one). */
static void store_barrier(td_store *s, const char *key, int64_t n)
{
    int64_t v = 0;
    TD_CHECK_OK(td_store_add(s, key, 1, &v));
    for (int i = 0; v < n; i++) {
        TD_CHECK_MSG(i < 3000, "barrier %s: %lld of %lld after 30 s", key, (long long)v, (long long)n);
        rpc_test_sleep_ms(10);
        TD_CHECK_OK(td_store_add(s, key, 0, &v));
    }
}

static void wait_key(td_store *s, const char *key)
{
    const char *k = key;
    TD_CHECK_OK(td_store_wait(s, &k, 1, 30000));
}

/* Joins the dynamic group as worker<rank>: rank 0 first, the others after it is up. */
static void join_staggered(td_test_ctx *ctx, td_store *s)
{
    register_functions();
    if (ctx->rank != 0)
        wait_key(s, "rank0_up");
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.store = s;
    char name[32];
    snprintf(name, sizeof name, "worker%d", ctx->rank);
    TD_CHECK_OK(td_rpc_init(name, ctx->rank, -1, &o));
    if (ctx->rank == 0)
        TD_CHECK_OK(td_store_set_str(s, "rank0_up", "1"));
}

static int64_t call_add(td_rpc_dest to, int64_t a, int64_t b)
{
    td_value *args = td_value_tuple_of(2, td_value_int(a), td_value_int(b)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, to, "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(r && td_value_kind_of(r) == TD_VAL_INT);
    int64_t v = td_value_get_int(r);
    td_value_release(r);
    td_value_release(args);
    return v;
}

/* test_dynamic_rpc_init_rpc: four workers join one by one; each then sees all four. */
TD_TEST(dynamic_rpc_init_rpc, .world_size = 4, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    join_staggered(ctx, s);
    store_barrier(s, "all_up", 4);
    td_worker_info infos[8];
    size_t n = 0;
    TD_CHECK_OK(td_rpc_worker_infos(NULL, infos, 8, &n));
    TD_CHECK_EQ(n, 4);
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "worker%zu", i);
        TD_CHECK_EQ(infos[i].id, (int64_t)i);
        TD_CHECK_STR_EQ(infos[i].name, name);
    }
    td_value *info = NULL;
    TD_CHECK_OK(td_rpc_debug_info(NULL, &info));
    TD_CHECK_STR_EQ(td_value_get_string(td_value_dict_get_str(info, "agent.world_size"), NULL), "4");
    td_value_release(info);
    store_barrier(s, "checked", 4); /* nobody leaves before everyone counted four */
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_store_release(s);
}

/* test_dynamic_rpc_new_rank_can_communicated_with_existing_rank: each newcomer calls rank 0, by name
 * and by id, right after joining. */
TD_TEST(dynamic_rpc_new_rank_can_communicate_with_existing_rank, .world_size = 4, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    join_staggered(ctx, s);
    if (ctx->rank != 0) {
        TD_CHECK_EQ(call_add(td_rpc_to_name("worker0"), ctx->rank, 10), ctx->rank + 10);
        TD_CHECK_EQ(call_add(td_rpc_to_id(0), ctx->rank, 20), ctx->rank + 20);
    }
    store_barrier(s, "done", 4);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_store_release(s);
}

/* test_dynamic_rpc_existing_rank_can_communicate_with_new_rank: rank 0, there first, calls every
 * worker that joined after it, as soon as each says it is up. */
TD_TEST(dynamic_rpc_existing_rank_can_communicate_with_new_rank, .world_size = 4, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    join_staggered(ctx, s);
    if (ctx->rank == 0) {
        for (int r = 1; r < 4; r++) {
            char key[32], name[32];
            snprintf(key, sizeof key, "joined/%d", r);
            snprintf(name, sizeof name, "worker%d", r);
            wait_key(s, key);
            td_value *v = NULL;
            TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_name(name), "callee_id", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &v));
            TD_CHECK(v && td_value_get_int(v) == r);
            td_value_release(v);
            TD_CHECK_EQ(call_add(td_rpc_to_id(r), r, 100), r + 100);
        }
    } else {
        char key[32];
        snprintf(key, sizeof key, "joined/%d", ctx->rank);
        TD_CHECK_OK(td_store_set_str(s, key, "1"));
    }
    store_barrier(s, "done", 4);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_store_release(s);
}

/* test_dynamic_rpc_init_rpc_without_rank: the rendezvous needs a rank, with every init method. */
TD_TEST(dynamic_rpc_init_rpc_without_rank, .world_size = 1, .timeout_s = 60)
{
    td_rpc_options o;
    td_rpc_options_init(&o);
    td_rpc_agent *a = NULL;
    o.init_method = ctx->init_url;
    TD_CHECK_ERR(td_rpc_agent_create("worker0", -1, -1, &o, &a), TD_ERR_INVALID,
                 "Error initializing torch.distributed using file:// rendezvous: rank parameter missing");
    o.init_method = "tcp://127.0.0.1:23456";
    TD_CHECK_ERR(td_rpc_agent_create("worker0", -1, -1, &o, &a), TD_ERR_INVALID,
                 "Error initializing torch.distributed using tcp:// rendezvous: rank parameter missing");
    o.init_method = "env://";
    unsetenv("RANK");
    TD_CHECK_ERR(td_rpc_agent_create("worker0", -1, -1, &o, &a), TD_ERR_INVALID,
                 "Error initializing torch.distributed using env:// rendezvous: environment variable RANK expected, "
                 "but not set");
    TD_CHECK(a == NULL);
}

/* test_dynamic_and_static_init_rpc_together: ranks 0-2 form a static world of three; rank 3 then
 * tries to join dynamically over the same store and fails, and the static world is unharmed. */
TD_TEST(dynamic_and_static_init_rpc_together, .world_size = 4, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    register_functions();
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.store = s;
    char name[32];
    snprintf(name, sizeof name, "worker%d", ctx->rank);
    if (ctx->rank < 3) {
        TD_CHECK_OK(td_rpc_init(name, ctx->rank, 3, &o));
        if (ctx->rank == 0)
            TD_CHECK_OK(td_store_set_str(s, "static_up", "1"));
        wait_key(s, "rank3_tried");
        TD_CHECK_EQ(call_add(td_rpc_to_id((ctx->rank + 1) % 3), 1, 2), 3);
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
    } else {
        wait_key(s, "static_up");
        TD_CHECK_ERR(td_rpc_init(name, ctx->rank, -1, &o), TD_ERR_INVALID,
                     "RPC group mixes statically and dynamically initialized members which is not supported. Static "
                     "group property is initialized as false and is trying to be set as true ");
        TD_CHECK_ERR(td_rpc_shutdown(true, 0), TD_ERR_NOT_INIT, "RPC has not been initialized");
        TD_CHECK_OK(td_store_set_str(s, "rank3_tried", "1"));
    }
    td_store_release(s);
}

/* A graceful leave: worker2 leaves; the others drop it (calls to it fail as to an unknown worker,
 * it is gone from the worker infos) and go on calling each other. Then worker2's id is free again:
 * a new worker joins with it. */
TD_TEST(dynamic_rpc_graceful_leave, .world_size = 3, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    join_staggered(ctx, s);
    store_barrier(s, "all_up", 3);
    if (ctx->rank == 2) {
        TD_CHECK_EQ(call_add(td_rpc_to_name("worker0"), 2, 3), 5);
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
        TD_CHECK_OK(td_store_set_str(s, "left", "1"));
        /* Back under another name with the same id. */
        wait_key(s, "checked");
        td_rpc_options o;
        td_rpc_options_init(&o);
        o.store = s;
        TD_CHECK_OK(td_rpc_init("newcomer", 2, -1, &o));
        TD_CHECK_EQ(call_add(td_rpc_to_name("worker1"), 7, 8), 15);
        TD_CHECK_OK(td_store_set_str(s, "rejoined", "1"));
    } else {
        wait_key(s, "left");
        td_worker_info infos[4];
        size_t n = 0;
        TD_CHECK_OK(td_rpc_worker_infos(NULL, infos, 4, &n));
        TD_CHECK_EQ(n, 2);
        TD_CHECK_EQ(infos[0].id, 0);
        TD_CHECK_EQ(infos[1].id, 1);
        td_value *args = td_value_tuple_of(2, td_value_int(1), td_value_int(1)), *r = NULL;
        TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_name("worker2"), "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r),
                     TD_ERR_NOT_FOUND, "could not find destination name worker2");
        TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(2), "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r),
                     TD_ERR_NOT_FOUND, "could not find destination id 2");
        td_value_release(args);
        td_worker_info w;
        TD_CHECK_ERR(td_rpc_worker_info(NULL, "worker2", &w), TD_ERR_NOT_FOUND, "could not find destination");
        TD_CHECK_EQ(call_add(td_rpc_to_id(1 - ctx->rank), ctx->rank, 40), ctx->rank + 40);
        store_barrier(s, "checked_count", 2);
        if (ctx->rank == 0)
            TD_CHECK_OK(td_store_set_str(s, "checked", "1"));
        wait_key(s, "rejoined");
        TD_CHECK_OK(td_rpc_worker_info_by_id(NULL, 2, &w));
        TD_CHECK_STR_EQ(w.name, "newcomer");
        TD_CHECK_EQ(call_add(td_rpc_to_name("newcomer"), ctx->rank, 50), ctx->rank + 50);
    }
    store_barrier(s, "done", 3);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_store_release(s);
}

/* A dynamic group over tcp://: rank 0 hosts the TCPStore (so it leaves last); the port is picked
 * by rank 0 and passed on through the harness's FileStore. */
TD_TEST(dynamic_rpc_tcp_init_method, .world_size = 3, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    register_functions();
    if (ctx->rank == 0) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        TD_CHECK(fd >= 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof sa;
        TD_CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
        TD_CHECK(getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
        close(fd);
        char port[16];
        snprintf(port, sizeof port, "%d", ntohs(sa.sin_port));
        TD_CHECK_OK(td_store_set_str(s, "port", port));
    }
    wait_key(s, "port");
    void *port = NULL;
    size_t port_len = 0;
    TD_CHECK_OK(td_store_get(s, "port", &port, &port_len));
    char url[64], name[32];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%s", (const char *)port);
    free(port);
    snprintf(name, sizeof name, "worker%d", ctx->rank);
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.init_method = url;
    if (ctx->rank != 0)
        wait_key(s, "rank0_up");
    TD_CHECK_OK(td_rpc_init(name, ctx->rank, -1, &o));
    if (ctx->rank == 0)
        TD_CHECK_OK(td_store_set_str(s, "rank0_up", "1"));
    store_barrier(s, "all_up", 3);
    TD_CHECK_EQ(call_add(td_rpc_to_id((ctx->rank + 1) % 3), ctx->rank, 1), ctx->rank + 1);
    store_barrier(s, "called", 3);
    if (ctx->rank == 0) {
        wait_key(s, "left/1");
        wait_key(s, "left/2");
        td_worker_info infos[4];
        size_t n = 0;
        TD_CHECK_OK(td_rpc_worker_infos(NULL, infos, 4, &n));
        TD_CHECK_EQ(n, 1);
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
    } else {
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
        char key[32];
        snprintf(key, sizeof key, "left/%d", ctx->rank);
        TD_CHECK_OK(td_store_set_str(s, key, "1"));
    }
    td_store_release(s);
}

/* A non-graceful shutdown just tears down: the members see the connection close, and a later
 * newcomer, finding the dead worker still in the store, joins anyway and sees it as lost. */
TD_TEST(dynamic_rpc_non_graceful_shutdown, .world_size = 3, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    register_functions();
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.store = s;
    td_value *args = td_value_tuple_of(2, td_value_int(1), td_value_int(2)), *r = NULL;
    if (ctx->rank == 0) {
        TD_CHECK_OK(td_rpc_init("worker0", 0, -1, &o));
        TD_CHECK_OK(td_store_set_str(s, "rank0_up", "1"));
        wait_key(s, "gone");
        td_status st = TD_OK;
        for (int i = 0; i < 500; i++) {
            st = td_rpc_sync(NULL, td_rpc_to_name("worker1"), "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r);
            td_value_release(r);
            r = NULL;
            if (st != TD_OK)
                break;
            rpc_test_sleep_ms(10);
        }
        TD_CHECK_EQ(st, TD_ERR_PEER_LOST);
        TD_CHECK_OK(td_store_set_str(s, "seen", "1"));
    } else if (ctx->rank == 1) {
        wait_key(s, "rank0_up");
        TD_CHECK_OK(td_rpc_init("worker1", 1, -1, &o));
        TD_CHECK_OK(td_rpc_shutdown(false, 0));
        TD_CHECK_OK(td_store_set_str(s, "gone", "1"));
    } else {
        wait_key(s, "seen");
        TD_CHECK_OK(td_rpc_init("worker2", 2, -1, &o));
        TD_CHECK_EQ(call_add(td_rpc_to_name("worker0"), 2, 2), 4);
        TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_name("worker1"), "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r),
                     TD_ERR_PEER_LOST, "worker1");
    }
    td_value_release(args);
    if (ctx->rank != 1) {
        store_barrier(s, "done", 2);
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
    }
    td_store_release(s);
}

/* A name already in the group is refused, and the refused worker leaves the group as it was. */
TD_TEST(dynamic_rpc_name_taken, .world_size = 2, .timeout_s = 60)
{
    td_store *s = open_store(ctx);
    register_functions();
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.store = s;
    if (ctx->rank == 0) {
        TD_CHECK_OK(td_rpc_init("worker0", 0, -1, &o));
        TD_CHECK_OK(td_store_set_str(s, "rank0_up", "1"));
        wait_key(s, "tried");
        size_t n = 0;
        td_worker_info infos[4];
        TD_CHECK_OK(td_rpc_worker_infos(NULL, infos, 4, &n));
        TD_CHECK_EQ(n, 1);
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
    } else {
        wait_key(s, "rank0_up");
        TD_CHECK_ERR(td_rpc_init("worker0", 1, -1, &o), TD_ERR_INVALID, "RPC worker name worker0 is not unique.");
        TD_CHECK_ERR(td_rpc_init("worker1", 0, -1, &o), TD_ERR_INVALID, "RPC worker id 0 is already taken");
        TD_CHECK_OK(td_store_set_str(s, "tried", "1"));
    }
    td_store_release(s);
}

TD_TEST_MAIN()
