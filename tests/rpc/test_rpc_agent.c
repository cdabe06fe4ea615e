/* The RPC agent in real worker processes (spec/rpc_part1.md C1, C2, C4, C7, C9, C14-C16, C19;
 * rpc_part2.md C1, C2, C5, C7, C10, C11, C13). Each case is named after the rpc_test.py test it
 * ports. Workers are "worker<rank>" and meet through the harness's FileStore URL; the functions
 * they call are registered in every rank before init, as Python finds them by module and name. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <tdist/rpc.h>
#include <tdist/rref.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "rpc/message.h"
#include "rpc_util.h"

#define TRY(expr)                      \
    do {                               \
        td_status try_s_ = (expr);     \
        if (try_s_ != TD_OK)           \
            return try_s_;             \
    } while (0)

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


/* ---- the functions workers call -------------------------------------------------------------- */

/* Adds one to every element of a float32 tensor in place and returns it: the caller's copy must
 * not change, also on a self-call. */
static td_status fn_inc_tensor(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_tensor *t = td_value_get_tensor(td_value_at(args, 0));
    float *d = td_tensor_data(t);
    for (int64_t i = 0; i < td_tensor_numel(t); i++)
        d[i] += 1.0f;
    *result = td_value_tensor(t);
    return TD_OK;
}

static td_status fn_caller_name(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)args;
    (void)kwargs;
    *result = td_value_string(td_rpc_call_caller(call)->name);
    return TD_OK;
}

static td_status fn_zero(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = td_value_int(0);
    return TD_OK;
}

static td_status fn_sleep(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    rpc_test_sleep_ms(td_value_get_int(td_value_at(args, 0)));
    *result = td_value_int(0);
    return TD_OK;
}

/* nested_rpc(dst): calls back into dst (the caller) while the caller waits. */
static td_status fn_nested(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)kwargs;
    td_value *a = td_value_tuple_of(2, td_value_int(1), td_value_int(1));
    td_status st = td_rpc_sync(td_rpc_call_agent(call), td_rpc_to_value(td_value_at(args, 0)), "add_ints", a, NULL,
                               TD_RPC_DEFAULT_TIMEOUT, result);
    td_value_release(a);
    return st;
}

/* nested_default(name): as nested_rpc, through the default agent, as a PyTorch function calling
 * rpc.rpc_sync does. */
static td_status fn_nested_default(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_value *a = td_value_tuple_of(2, td_value_int(1), td_value_int(1));
    td_status st = td_rpc_sync(NULL, td_rpc_to_value(td_value_at(args, 0)), "add_ints", a, NULL,
                               TD_RPC_DEFAULT_TIMEOUT, result);
    td_value_release(a);
    return st;
}

/* chain(ttl): fire-and-forget to the next worker until ttl is 0, whose hop leaves a file. */
static td_status fn_chain(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)kwargs;
    int64_t ttl = td_value_get_int(td_value_at(args, 0));
    td_rpc_agent *agent = td_rpc_call_agent(call);
    if (ttl > 0) {
        td_worker_info me;
        size_t n = 0;
        TRY(td_rpc_worker_info(agent, NULL, &me));
        TRY(td_rpc_worker_infos(agent, NULL, 0, &n));
        td_value *a = td_value_tuple_of(1, td_value_int(ttl - 1));
        td_future *f = NULL;
        td_status st = td_rpc_async(agent, td_rpc_to_id((me.id + 1) % (int64_t)n), "chain", a, NULL,
                                    TD_RPC_DEFAULT_TIMEOUT, &f);
        td_value_release(a);
        td_future_release(f); /* nobody waits: graceful shutdown must */
        TRY(st);
    } else {
        char path[1024];
        snprintf(path, sizeof path, "%s/chain_done", getenv("TMPDIR"));
        rpc_test_sleep_ms(200);
        FILE *fp = fopen(path, "w");
        if (fp)
            fclose(fp);
    }
    *result = td_value_int(0);
    return TD_OK;
}

/* async_add(dst, a, b): the reply is the nested call's future. */
static td_future *fn_async_add(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)kwargs;
    td_value *a = td_value_tuple_of(2, td_value_retain(td_value_at(args, 1)), td_value_retain(td_value_at(args, 2)));
    td_future *f = NULL;
    td_status st = td_rpc_async(td_rpc_call_agent(call), td_rpc_to_value(td_value_at(args, 0)), "add_ints", a, NULL,
                                TD_RPC_DEFAULT_TIMEOUT, &f);
    td_value_release(a);
    return st == TD_OK ? f : NULL;
}

/* meet(n, tdist_wait): returns 1 once n calls of it are running at the same time on this worker (0
 * after 20 s without). Each waits either outside tdist (polling a counter between sleeps: the pool
 * cannot know the thread is blocked) or in td_future_wait on a future the n-th arrival completes. */
static atomic_int meet_arrived;
static td_future *meet_all_here;

static td_status fn_meet(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    int n = (int)td_value_get_int(td_value_at(args, 0));
    bool tdist_wait = td_value_get_bool(td_value_at(args, 1));
    int me = atomic_fetch_add(&meet_arrived, 1) + 1;
    bool met;
    if (tdist_wait) {
        if (me == n)
            TRY(td_future_set_result(meet_all_here, td_value_none()));
        met = td_future_wait(meet_all_here, 20000) == TD_OK;
    } else {
        int64_t t0 = now_ms();
        while (atomic_load(&meet_arrived) < n && now_ms() - t0 < 20000)
            rpc_test_sleep_ms(1);
        met = atomic_load(&meet_arrived) >= n;
    }
    *result = td_value_int(met);
    return TD_OK;
}

/* Tries to shut the default agent down from inside a function it runs; returns the status. */
static td_status fn_shutdown_inside(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    td_status st = td_rpc_shutdown(true, 0);
    *result = td_value_tuple_of(2, td_value_int(st), td_value_string(td_last_error()));
    return TD_OK;
}

static void register_functions(void)
{
    const rpc_test_function fns[] = {
        {"add_ints", rpc_test_add_ints, NULL, NULL},         {"inc_tensor", fn_inc_tensor, NULL, NULL},
        {"callee_id", rpc_test_callee_id, NULL, NULL},       {"caller_name", fn_caller_name, NULL, NULL},
        {"raise_func", rpc_test_raise, NULL, NULL},          {"light_rpc", fn_zero, NULL, NULL},
        {"sleep_ms", fn_sleep, NULL, NULL},            {"nested_rpc", fn_nested, NULL, NULL},
        {"nested_default", fn_nested_default, NULL, NULL},
        {"chain", fn_chain, NULL, NULL},               {"shutdown_inside", fn_shutdown_inside, NULL, NULL},
        {"async_add", NULL, fn_async_add, NULL},       {"async_raise", NULL, rpc_test_async_raise, NULL},
        {"meet", fn_meet, NULL, NULL},
    };
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
}

/* ---- set-up ----------------------------------------------------------------------------------- */

static td_rpc_options options(td_test_ctx *ctx)
{
    td_rpc_options o = rpc_test_options(ctx);
    o.tcp_only = strcmp(ctx->param, "tcp") == 0;
    return o;
}

static void rpc_up_with(td_test_ctx *ctx, const td_rpc_options *o)
{
    register_functions();
    rpc_test_init(ctx, o);
}

static void rpc_up(td_test_ctx *ctx)
{
    td_rpc_options o = options(ctx);
    rpc_up_with(ctx, &o);
}

static void rpc_down(void) { TD_CHECK_OK(td_rpc_shutdown(true, 0)); }

static td_value *ints(int64_t a, int64_t b) { return td_value_tuple_of(2, td_value_int(a), td_value_int(b)); }

static int64_t sync_int(td_rpc_dest to, const char *fn, int64_t a, int64_t b)
{
    td_value *args = ints(a, b), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, to, fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(r && td_value_kind_of(r) == TD_VAL_INT);
    int64_t v = td_value_get_int(r);
    td_value_release(r);
    td_value_release(args);
    return v;
}

static int64_t debug_int(const char *key)
{
    td_value *info = NULL;
    TD_CHECK_OK(td_rpc_debug_info(NULL, &info));
    td_value *v = td_value_dict_get_str(info, key);
    TD_CHECK_MSG(v != NULL, "debug info lacks %s", key);
    int64_t n = atoll(td_value_get_string(v, NULL));
    td_value_release(info);
    return n;
}

static void worker_name(int rank, char *out, size_t size) { snprintf(out, size, "worker%d", rank); }

/* ---- lifecycle and identity --------------------------------------------------------------------- */

TD_TEST(worker_id, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info me, peer;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    char name[32], peer_name[32];
    worker_name(ctx->rank, name, sizeof name);
    worker_name((ctx->rank + 1) % 2, peer_name, sizeof peer_name);
    TD_CHECK_STR_EQ(me.name, name);
    TD_CHECK_EQ(me.id, ctx->rank);
    TD_CHECK_OK(td_rpc_worker_info(NULL, peer_name, &peer));
    TD_CHECK_STR_EQ(peer.name, peer_name);
    TD_CHECK_EQ(peer.id, (ctx->rank + 1) % 2);
    TD_CHECK_ERR(td_rpc_worker_info(NULL, "worker9", &peer), TD_ERR_NOT_FOUND,
                 "could not find destination name worker9");
    rpc_down();
}

TD_TEST(get_worker_infos, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info infos[8];
    size_t n = 0;
    TD_CHECK_OK(td_rpc_worker_infos(NULL, infos, 8, &n));
    TD_CHECK_EQ(n, 4);
    for (int i = 0; i < 4; i++) {
        char name[32];
        worker_name(i, name, sizeof name);
        TD_CHECK_STR_EQ(infos[i].name, name);
        TD_CHECK_EQ(infos[i].id, i);
        td_worker_info by_id;
        TD_CHECK_OK(td_rpc_worker_info_by_id(NULL, i, &by_id));
        TD_CHECK(td_worker_info_equal(&by_id, &infos[i]));
    }
    rpc_down();
}

TD_TEST(world_size_one, .world_size = 1, .timeout_s = 60)
{
    register_functions();
    td_rpc_options o = options(ctx);
    TD_CHECK_OK(td_rpc_init("me", 0, 1, &o));
    TD_CHECK_EQ(sync_int(td_rpc_to_name("me"), "add_ints", 2, 3), 5);
    td_value *args = ints(4, 5);
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(0), "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    TD_CHECK_OK(td_future_wait(f, 0));
    TD_CHECK_EQ(td_value_get_int(td_future_value(f)), 9);
    td_future_release(f);
    /* remote() to "me": this worker owns the result. */
    td_rref *rref = NULL;
    td_value *v = NULL;
    TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_name("me"), "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &rref));
    TD_CHECK(td_rref_is_owner(rref));
    TD_CHECK_OK(td_rref_to_here(rref, TD_RPC_DEFAULT_TIMEOUT, &v));
    TD_CHECK_EQ(td_value_get_int(v), 9);
    td_value_release(v);
    td_rref_release(rref);
    td_value_release(args);
    /* A graceful shutdown waits for the calls still in flight, self-calls included. */
    args = td_value_tuple_of(1, td_value_int(300));
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(0), "sleep_ms", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    td_future_release(f);
    td_value_release(args);
    int64_t t0 = now_ms();
    rpc_down();
    TD_CHECK_MSG(now_ms() - t0 >= 250, "shutdown returned after %lld ms", (long long)(now_ms() - t0));
}

TD_TEST(reinit, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rpc_options o = options(ctx);
    TD_CHECK_ERR(td_rpc_init("worker0", ctx->rank, 2, &o), TD_ERR_ALREADY, "RPC is already initialized");
    /* The running agent stays usable. */
    TD_CHECK_EQ(sync_int(td_rpc_to_id((ctx->rank + 1) % 2), "add_ints", 1, 2), 3);
    rpc_down();
    /* After a shutdown, init works again (init_rpc_twice: a second rendezvous file). */
    char url[1100];
    snprintf(url, sizeof url, "%s_2", ctx->init_url);
    o.init_method = url;
    rpc_up_with(ctx, &o);
    TD_CHECK_EQ(sync_int(td_rpc_to_id((ctx->rank + 1) % 2), "add_ints", 3, 4), 7);
    rpc_down();
}

/* A function the agent runs cannot shut it down (shutdown waits for that very function): the call
 * is refused and the agent keeps running. */
TD_TEST(shutdown_inside_function_refused, .world_size = 1, .timeout_s = 60)
{
    rpc_up(ctx);
    td_value *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(0), "shutdown_inside", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK_EQ(td_value_get_int(td_value_at(r, 0)), TD_ERR_INVALID);
    TD_CHECK_CONTAINS(td_value_get_string(td_value_at(r, 1), NULL), "RPC shutdown called from a function the agent is running");
    td_value_release(r);
    TD_CHECK_EQ(sync_int(td_rpc_to_id(0), "add_ints", 1, 1), 2);
    rpc_down();
}

TD_TEST(shutdown_followed_by_rpc, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    TD_CHECK_EQ(sync_int(td_rpc_to_id((ctx->rank + 1) % 2), "add_ints", 1, 1), 2);
    rpc_down();
    td_value *args = ints(1, 1), *r = NULL;
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(0), "add_ints", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r),
                 TD_ERR_NOT_INIT, NULL);
    TD_CHECK(strncmp(td_last_error(), "RPC has not been initialized", 28) == 0);
    TD_CHECK_STR_EQ(td_last_error(), "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.");
    TD_CHECK_ERR(td_rpc_shutdown(true, 0), TD_ERR_NOT_INIT, "RPC has not been initialized");
    td_worker_info me;
    TD_CHECK_ERR(td_rpc_worker_info(NULL, NULL, &me), TD_ERR_NOT_INIT, "RPC has not been initialized");
    td_value_release(args);
}

TD_TEST(invalid_names, .world_size = 1, .timeout_s = 60)
{
    td_rpc_options o = options(ctx);
    const char *bad[] = {"abc*", " ", ""};
    for (size_t i = 0; i < 3; i++)
        TD_CHECK_ERR(td_rpc_init(bad[i], 0, 1, &o), TD_ERR_INVALID, "Worker name must match");
    char long_name[501];
    memset(long_name, 'a', 500);
    long_name[500] = 0;
    TD_CHECK_ERR(td_rpc_init(long_name, 0, 1, &o), TD_ERR_INVALID, "shorter than 128");
    /* A failed init leaves nothing running: init works afterwards. */
    register_functions();
    TD_CHECK_OK(td_rpc_init("a:b-c_d", 0, 1, &o));
    rpc_down();
}

TD_TEST(duplicate_name, .world_size = 4, .timeout_s = 60)
{
    register_functions();
    td_rpc_options o = options(ctx);
    TD_CHECK_ERR(td_rpc_init("duplicate_name", ctx->rank, 4, &o), TD_ERR_INVALID,
                 "RPC worker name duplicate_name is not unique. Workers 0 and 1 share the same name.");
    TD_CHECK_ERR(td_rpc_shutdown(true, 0), TD_ERR_NOT_INIT, NULL);
}

TD_TEST(duplicate_name_2, .world_size = 4, .timeout_s = 60)
{
    register_functions();
    td_rpc_options o = options(ctx);
    char name[32];
    worker_name(ctx->rank % 3, name, sizeof name);
    TD_CHECK_ERR(td_rpc_init(name, ctx->rank, 4, &o), TD_ERR_INVALID,
                 "RPC worker name worker0 is not unique. Workers 0 and 3 share the same name.");
}

/* ---- calls ------------------------------------------------------------------------------------- */

TD_TEST(add, .world_size = 4, .params = "unix,tcp", .timeout_s = 60)
{
    rpc_up(ctx);
    int dst = (ctx->rank + 1) % 4;
    TD_CHECK_EQ(sync_int(td_rpc_to_id(dst), "add_ints", ctx->rank, 10), ctx->rank + 10);
    TD_CHECK_EQ(sync_int(td_rpc_to_id(dst), "callee_id", 0, 0), dst);
    /* The callee knows its caller. */
    td_value *r = NULL;
    char me[32];
    worker_name(ctx->rank, me, sizeof me);
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(dst), "caller_name", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK_STR_EQ(td_value_get_string(r, NULL), me);
    td_value_release(r);
    /* Tensors go by value. */
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(3, 3), &t));
    td_value *args = td_value_tuple_of(1, td_value_tensor(t));
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(dst), "inc_tensor", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    const float *got = td_tensor_data(td_value_get_tensor(r));
    TD_CHECK_EQ(td_tensor_numel(td_value_get_tensor(r)), 9);
    TD_CHECK(got[0] == 2.0f && got[8] == 2.0f);
    TD_CHECK(((const float *)td_tensor_data(t))[0] == 1.0f);
    td_value_release(r);
    td_value_release(args);
    td_tensor_release(t);
    /* Same-host peers meet over the same-host layer's UNIX sockets unless TCP is forced. */
    bool tcp = strcmp(ctx->param, "tcp") == 0;
    TD_CHECK_EQ(debug_int("agent.num_unix_channels"), tcp ? 0 : 3);
    TD_CHECK_EQ(debug_int("agent.num_tcp_channels"), tcp ? 3 : 0);
    rpc_down();
}

TD_TEST(multi_rpc, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    int dst = (ctx->rank + 1) % 4;
    for (int i = 0; i < 20; i++)
        TD_CHECK_EQ(sync_int(td_rpc_to_id(dst), "add_ints", i, ctx->rank), i + ctx->rank);
    rpc_down();
}

TD_TEST(self_add, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    TD_CHECK_EQ(sync_int(td_rpc_to_info(&me), "add_ints", 2, 2), 4);
    TD_CHECK_EQ(sync_int(td_rpc_to_name(me.name), "add_ints", 2, 3), 5);
    TD_CHECK_EQ(sync_int(td_rpc_to_id(me.id), "add_ints", 2, 4), 6);
    td_value *dest = td_worker_info_value(&me);
    TD_CHECK_EQ(sync_int(td_rpc_to_value(dest), "add_ints", 2, 5), 7);
    td_value_release(dest);
    /* Self-calls copy their values: the callee's in-place change does not reach the caller. */
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(4), &t));
    td_value *args = td_value_tuple_of(1, td_value_tensor(t)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_info(&me), "inc_tensor", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(((const float *)td_tensor_data(td_value_get_tensor(r)))[3] == 2.0f);
    TD_CHECK(((const float *)td_tensor_data(t))[3] == 1.0f);
    TD_CHECK(td_value_get_tensor(r) != t);
    td_value_release(r);
    td_value_release(args);
    td_tensor_release(t);
    rpc_down();
}

TD_TEST(send_to_rank, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    int dst = (ctx->rank + 1) % 4;
    TD_CHECK_EQ(sync_int(td_rpc_to_id(dst), "callee_id", 0, 0), dst);
    td_value *args = ints(1, 1), *r = NULL;
    td_future *f = NULL;
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(5), "add_ints", args, NULL, -1, &r), TD_ERR_NOT_FOUND,
                 "could not find destination id 5");
    char want[128];
    snprintf(want, sizeof want, "name:worker%d,rank:%d could not find destination id -1", ctx->rank, ctx->rank);
    TD_CHECK_ERR(td_rpc_async(NULL, td_rpc_to_id(-1), "add_ints", args, NULL, -1, &f), TD_ERR_NOT_FOUND, want);
    TD_CHECK(f == NULL);
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_name("worker42"), "add_ints", args, NULL, -1, &r), TD_ERR_NOT_FOUND,
                 "could not find destination name worker42");
    td_value *half = td_value_double(1.5);
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_value(half), "add_ints", args, NULL, -1, &r), TD_ERR_INVALID,
                 "Cannot get WorkerInfo from name 1.5");
    td_value *as_int = td_value_int(dst);
    TD_CHECK_EQ(sync_int(td_rpc_to_value(as_int), "callee_id", 0, 0), dst);
    /* remote() by rank too, and to a rank that does not exist. */
    td_rref *rref = NULL;
    TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(dst), "callee_id", NULL, NULL, -1, &rref));
    TD_CHECK_OK(td_rref_to_here(rref, -1, &r));
    TD_CHECK_EQ(td_value_get_int(r), dst);
    td_value_release(r);
    td_rref_release(rref);
    TD_CHECK_ERR(td_rpc_remote(NULL, td_rpc_to_id(5), "callee_id", NULL, NULL, -1, &rref), TD_ERR_NOT_FOUND,
                 "could not find destination id 5");
    TD_CHECK(rref == NULL);
    td_value_release(as_int);
    td_value_release(half);
    td_value_release(args);
    rpc_down();
}

TD_TEST(async_add, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    int dst = (ctx->rank + 1) % 2;
    /* py_multi_async_call: two futures in flight to one worker. */
    td_future *fs[2];
    for (int i = 0; i < 2; i++) {
        td_value *args = ints(i, 100);
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "add_ints", args, NULL, -1, &fs[i]));
        td_value_release(args);
    }
    TD_CHECK_OK(td_future_wait_all(fs, 2, 0));
    for (int i = 0; i < 2; i++) {
        TD_CHECK_EQ(td_value_get_int(td_future_value(fs[i])), 100 + i);
        td_future_release(fs[i]);
    }
    /* An async function's reply comes when its future completes (here a call to a third party:
     * the caller itself). */
    char me[32];
    worker_name(ctx->rank, me, sizeof me);
    td_value *args = td_value_tuple_of(3, td_value_string(me), td_value_int(20), td_value_int(22)), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(dst), "async_add", args, NULL, -1, &r));
    TD_CHECK_EQ(td_value_get_int(r), 42);
    td_value_release(r);
    td_value_release(args);
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(dst), "async_raise", NULL, NULL, -1, &r), TD_ERR_REMOTE,
                 "Expected error");
    rpc_down();
}

/* ---- errors -------------------------------------------------------------------------------------- */

TD_TEST(py_raise_in_user_func, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    int dst = (ctx->rank + 1) % 2;
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "raise_func", NULL, NULL, -1, &f));
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "Expected error");
    char want[128];
    snprintf(want, sizeof want, "On WorkerInfo(id=%d, name=worker%d):\nValueError('Expected error')", dst, dst);
    TD_CHECK_STR_EQ(td_future_error(f), want);
    TD_CHECK_STR_EQ(td_future_error_type(f), "ValueError");
    /* Sticky: a second wait fails the same way. */
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, want);
    td_future_release(f);

    /* TypeError kept; other types become RuntimeError with the original in the message. */
    td_value *args = td_value_tuple_of(2, td_value_string("TypeError"), td_value_string("bad type"));
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "raise_func", args, NULL, -1, &f));
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "TypeError('bad type')");
    TD_CHECK_STR_EQ(td_future_error_type(f), "TypeError");
    td_future_release(f);
    td_value_release(args);
    args = td_value_tuple_of(2, td_value_string("CustomException"), td_value_string("custom"));
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "raise_func", args, NULL, -1, &f));
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "CustomException('custom')");
    TD_CHECK_STR_EQ(td_future_error_type(f), "RuntimeError");
    td_future_release(f);
    td_value_release(args);

    /* py_raise_in_user_func_escaped_str: newlines arrive as they were. */
    const char *escaped = "\nFirst line of error \n next line of error \n last line of error";
    args = td_value_tuple_of(2, td_value_string("ValueError"), td_value_string(escaped));
    td_value *r = NULL;
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(dst), "raise_func", args, NULL, -1, &r), TD_ERR_REMOTE, escaped);
    TD_CHECK(strstr(td_last_error(), "\\n") == NULL);
    td_value_release(args);

    /* A function the callee does not have (function_not_on_callee); the callee goes on serving. */
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(dst), "no_such_function", NULL, NULL, -1, &r), TD_ERR_REMOTE,
                 "RPC pickler does not serialize");
    TD_CHECK_CONTAINS(td_last_error(), "no_such_function");
    /* Argument binding errors are TypeErrors (py_function_exception). */
    args = td_value_tuple_of(1, td_value_int(10));
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "add_ints", args, NULL, -1, &f));
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "missing 1 required positional argument");
    TD_CHECK_STR_EQ(td_future_error_type(f), "TypeError");
    td_future_release(f);
    td_value_release(args);
    TD_CHECK_EQ(sync_int(td_rpc_to_id(dst), "add_ints", 1, 2), 3);
    rpc_down();
}

/* The callee logs a function's failure on its stderr (py_raise_in_user_func's captured stderr):
 * an inner case runs under the supervisor, which collects the ranks' output. */
TD_TEST(raise_logged_inner, .world_size = 2, .timeout_s = 30, .hidden = true)
{
    rpc_up(ctx);
    if (ctx->rank == 0) {
        td_value *r = NULL;
        TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(1), "raise_func", NULL, NULL, -1, &r), TD_ERR_REMOTE,
                     "Expected error");
    }
    rpc_down();
}

TD_TEST(py_raise_in_user_func_logged, .world_size = 1, .timeout_s = 60)
{
    (void)ctx;
    td_test_result r;
    TD_CHECK_OK(td_test_run("raise_logged_inner", &r));
    TD_CHECK_MSG(r.verdict == TD_TEST_PASS, "inner case: %s", r.message);
    TD_CHECK_CONTAINS(r.output, "[rank 1] [tdist ERROR] On WorkerInfo(id=1, name=worker1):");
    TD_CHECK_CONTAINS(r.output, "ValueError('Expected error')");
    td_test_result_free(&r);
}

/* ---- nested calls, stress -------------------------------------------------------------------- */

/* The callee calls back into the caller, which waits in rpc_sync: with one pool thread per worker
 * the pool must grow (every worker is both caller and callee here). */
TD_TEST(nested_rpc, .world_size = 3, .timeout_s = 60)
{
    td_rpc_options o = options(ctx);
    o.num_worker_threads = 1;
    rpc_up_with(ctx, &o);
    char me[32];
    worker_name(ctx->rank, me, sizeof me);
    td_value *args = td_value_tuple_of(1, td_value_string(me)), *r = NULL;
    for (int i = 0; i < 5; i++) {
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id((ctx->rank + 1) % 3), "nested_rpc", args, NULL, -1, &r));
        TD_CHECK_EQ(td_value_get_int(r), 2);
        td_value_release(r);
    }
    td_value_release(args);
    rpc_down();
}

/* Every worker calls the others the moment its td_rpc_init returns and shuts down as soon as its
 * own calls are answered, so calls reach workers still joining and workers already in their
 * graceful shutdown; the function they run calls back through the default agent, which must be
 * the agent throughout (it was published only after td_rpc_init returned and withdrawn when
 * td_rpc_shutdown began: "RPC has not been initialized" came back). Rounds of fresh rendezvous. */
TD_TEST(calls_reaching_a_joining_worker_see_its_default_agent, .world_size = 3, .timeout_s = 120)
{
    char me[32];
    worker_name(ctx->rank, me, sizeof me);
    td_value *args = td_value_tuple_of(1, td_value_string(me));
    for (int round = 0; round < 6; round++) {
        td_rpc_options o = options(ctx);
        char url[1100];
        snprintf(url, sizeof url, "%s_round%d", ctx->init_url, round);
        o.init_method = url;
        rpc_up_with(ctx, &o);
        td_future *f[2];
        for (int k = 0; k < 2; k++)
            TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id((ctx->rank + 1 + k) % 3), "nested_default", args, NULL,
                                     TD_RPC_DEFAULT_TIMEOUT, &f[k]));
        for (int k = 0; k < 2; k++) {
            TD_CHECK_OK(td_future_wait(f[k], 0));
            TD_CHECK_EQ(td_value_get_int(td_future_value(f[k])), 2);
            td_future_release(f[k]);
        }
        rpc_down();
    }
    td_value_release(args);
}

/* A self-call that calls itself again, on a pool of one thread: the second call needs a second
 * thread, which the pool starts; idle, the extra thread goes away again. */
TD_TEST(nested_rpc_self_pool_grows, .world_size = 1, .timeout_s = 60)
{
    td_rpc_options o = options(ctx);
    o.num_worker_threads = 1;
    register_functions();
    TD_CHECK_OK(td_rpc_init("me", 0, 1, &o));
    td_value *args = td_value_tuple_of(1, td_value_string("me")), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_name("me"), "nested_rpc", args, NULL, -1, &r));
    TD_CHECK_EQ(td_value_get_int(r), 2);
    td_value_release(r);
    td_value_release(args);
    TD_CHECK_EQ(debug_int("agent.thread_pool_size"), 2);
    int64_t t0 = now_ms();
    while (debug_int("agent.thread_pool_size") > 1 && now_ms() - t0 < 10000)
        rpc_test_sleep_ms(100);
    TD_CHECK_EQ(debug_int("agent.thread_pool_size"), 1);
    TD_CHECK_EQ(debug_int("agent.server_active_calls"), 0);
    rpc_down();
}

/* The pool runs only as many calls at once as it has cores for (pool.c), yet calls that block
 * must not keep the others waiting: MEET calls that each wait until all of them run get a thread
 * each, whether they block where the pool cannot see it or in a tdist wait, which says so. */
static void calls_that_wait_for_each_other(td_test_ctx *ctx, bool tdist_wait)
{
    enum { MEET = 12 };
    meet_all_here = td_future_new();
    rpc_up(ctx);
    if (ctx->rank == 0) {
        td_value *args = td_value_tuple_of(2, td_value_int(MEET), td_value_bool(tdist_wait));
        td_future *fs[MEET];
        for (int i = 0; i < MEET; i++)
            TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(1), "meet", args, NULL, 0, &fs[i]));
        for (int i = 0; i < MEET; i++) {
            TD_CHECK_OK(td_future_wait(fs[i], 0));
            TD_CHECK_MSG(td_value_get_int(td_future_value(fs[i])) == 1, "call %d did not meet the others", i);
            td_future_release(fs[i]);
        }
        td_value_release(args);
    }
    rpc_down();
    td_future_release(meet_all_here);
}

TD_TEST(calls_blocked_outside_tdist_each_get_a_thread, .world_size = 2, .timeout_s = 60)
{
    calls_that_wait_for_each_other(ctx, false);
}

TD_TEST(calls_blocked_in_a_tdist_wait_each_get_a_thread, .world_size = 2, .timeout_s = 60)
{
    calls_that_wait_for_each_other(ctx, true);
}

TD_TEST(stress_light_rpc, .world_size = 2, .params = "unix,tcp", .timeout_s = 120)
{
    rpc_up(ctx);
    enum { N = 1000 };
    td_future **fs = calloc(N, sizeof *fs);
    for (int i = 0; i < N; i++)
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id((ctx->rank + 1) % 2), "light_rpc", NULL, NULL, -1, &fs[i]));
    TD_CHECK_OK(td_future_wait_all(fs, N, 60000));
    for (int i = 0; i < N; i++) {
        TD_CHECK_EQ(td_value_get_int(td_future_value(fs[i])), 0);
        td_future_release(fs[i]);
    }
    free(fs);
    rpc_down();
}

/* ---- timeouts ------------------------------------------------------------------------------------ */

TD_TEST(rpc_timeouts, .world_size = 2, .timeout_s = 60)
{
    td_rpc_options o = options(ctx);
    o.rpc_timeout_ms = 300;
    rpc_up_with(ctx, &o);
    TD_CHECK_EQ(td_rpc_get_timeout(NULL), 300);
    int dst = (ctx->rank + 1) % 2;
    td_value *slow = td_value_tuple_of(1, td_value_int(600)), *r = NULL;
    /* Per-call timeout. */
    int64_t t0 = now_ms();
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(dst), "sleep_ms", slow, NULL, 100, &r), TD_ERR_TIMEOUT,
                 "RPC ran for more than set timeout (100 ms) and will now be marked with an error");
    int64_t took = now_ms() - t0;
    TD_CHECK_MSG(took >= 90 && took < 500, "the call timed out after %lld ms", (long long)took);
    /* The default (300 ms) applies to -1, and can be changed; 0 means none. */
    TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(dst), "sleep_ms", slow, NULL, -1, &r), TD_ERR_TIMEOUT, "(300 ms)");
    TD_CHECK_OK(td_rpc_set_timeout(NULL, 5000));
    TD_CHECK_EQ(td_rpc_get_timeout(NULL), 5000);
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(dst), "sleep_ms", slow, NULL, -1, &r));
    td_value_release(r);
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(dst), "sleep_ms", slow, NULL, 0, &r));
    td_value_release(r);
    TD_CHECK_ERR(td_rpc_set_timeout(NULL, -5), TD_ERR_INVALID, NULL);
    /* The late replies were dropped and the channel still works. */
    TD_CHECK_EQ(sync_int(td_rpc_to_id(dst), "add_ints", 20, 22), 42);
    td_value_release(slow);

    /* default_timeout_used: the timeout is taken when a call is sent. */
    td_value *brief = td_value_tuple_of(1, td_value_int(300));
    td_future *before = NULL, *after[10];
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "sleep_ms", brief, NULL, -1, &before));
    TD_CHECK_OK(td_rpc_set_timeout(NULL, 1));
    for (int i = 0; i < 10; i++)
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "sleep_ms", brief, NULL, -1, &after[i]));
    for (int i = 0; i < 10; i++) {
        TD_CHECK_ERR(td_future_wait(after[i], 0), TD_ERR_TIMEOUT, "RPC ran for more than set timeout (1 ms)");
        td_future_release(after[i]);
    }
    TD_CHECK_OK(td_future_wait(before, 0));
    td_future_release(before);
    td_value_release(brief);
    TD_CHECK_OK(td_rpc_set_timeout(NULL, 60000));
    rpc_down();
}

/* Bytes that do not come from a worker of this world: a connection with a bad header, or a hello
 * without the listener's nonce, is closed; the agent goes on serving. */
TD_TEST(refuses_strangers, .world_size = 1, .timeout_s = 60)
{
    (void)ctx;
    register_functions();
    td_store *store = NULL;
    TD_CHECK_OK(td_hash_store_create(&store));
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.store = store;
    o.tcp_only = true;
    td_rpc_agent *a = NULL;
    TD_CHECK_OK(td_rpc_agent_create("alpha", 0, 1, &o, &a));
    /* The first agent over this store: its entry is under rpc_prefix_1. */
    void *v = NULL;
    size_t len = 0;
    TD_CHECK_OK(td_store_get(store, "rpc_prefix_1/worker/0", &v, &len));
    char name[64], addr[300];
    TD_CHECK(sscanf(v, "%63s %299s", name, addr) == 2);
    free(v);
    TD_CHECK_STR_EQ(name, "alpha");
    char *colon = strrchr(addr, ':');
    TD_CHECK(colon != NULL);
    int port = atoi(colon + 1);
    int fds_before = rpc_test_open_fds();
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        TD_CHECK(fd >= 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        TD_CHECK(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
        unsigned char junk[RPC_HEADER_BYTES];
        memset(junk, 0xab, sizeof junk);
        if (attempt == 1) {
            /* A well-formed hello with a wrong nonce. */
            rpc_header h = {.type = RPC_MSG_CONTROL, .sender = 0, .id = 12345};
            rpc_header_write(&h, junk);
        }
        TD_CHECK(send(fd, junk, sizeof junk, MSG_NOSIGNAL) == (ssize_t)sizeof junk);
        char c;
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        TD_CHECK_MSG(recv(fd, &c, 1, 0) == 0, "the agent did not close a stranger's connection");
        close(fd);
    }
    /* The agent gave the refused connections' fds back at once, not at its shutdown. */
    int fds_now = rpc_test_open_fds();
    for (int i = 0; i < 200 && fds_now > fds_before; i++) {
        rpc_test_sleep_ms(10);
        fds_now = rpc_test_open_fds();
    }
    TD_CHECK_EQ(fds_now, fds_before);
    td_value *args = ints(2, 40), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(a, td_rpc_to_name("alpha"), "add_ints", args, NULL, -1, &r));
    TD_CHECK_EQ(td_value_get_int(r), 42);
    td_value_release(r);
    td_value_release(args);
    TD_CHECK_OK(td_rpc_agent_shutdown(a, true, 0));
    td_store_release(store);
}

/* ---- shutdown ------------------------------------------------------------------------------------ */

/* graceful_shutdown_with_uneven_workload: worker0 keeps the others busy after they asked to shut
 * down; they must serve it until it is done. */
TD_TEST(graceful_shutdown_with_uneven_workload, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 0) {
        for (int dst = 1; dst <= 2; dst++) {
            td_future *fs[10];
            td_value *args = td_value_tuple_of(1, td_value_int(30));
            for (int i = 0; i < 10; i++)
                TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "sleep_ms", args, NULL, -1, &fs[i]));
            TD_CHECK_OK(td_future_wait_all(fs, 10, 0));
            for (int i = 0; i < 10; i++)
                td_future_release(fs[i]);
            td_value_release(args);
        }
    }
    rpc_down();
}

/* multi_layer_nested_async_rpc: a fire-and-forget chain of 20 hops is still moving when every
 * body has returned; graceful shutdown waits for it. */
TD_TEST(multi_layer_nested_async_rpc, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 0) {
        td_value *args = td_value_tuple_of(1, td_value_int(20));
        td_future *f = NULL;
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(1), "chain", args, NULL, -1, &f));
        td_future_release(f);
        td_value_release(args);
    }
    rpc_down();
    if (ctx->rank == 0) {
        char path[1024];
        snprintf(path, sizeof path, "%s/chain_done", ctx->tmpdir);
        TD_CHECK_MSG(access(path, F_OK) == 0, "the chain had not ended when shutdown returned");
        unlink(path);
    }
}

/* A graceful shutdown that times out (a worker that does not come) returns the error, and the
 * local teardown still runs: the agent is gone. The late worker then finds its peer gone and
 * shuts down without waiting for it. */
TD_TEST(graceful_shutdown_timeout, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    TD_CHECK_EQ(sync_int(td_rpc_to_id((ctx->rank + 1) % 2), "add_ints", 1, 1), 2);
    if (ctx->rank == 1) {
        int64_t t0 = now_ms();
        TD_CHECK_ERR(td_rpc_shutdown(true, 200), TD_ERR_TIMEOUT, "Failed to respond to 'Shutdown Proceed' in time");
        TD_CHECK(now_ms() - t0 < 2000);
        TD_CHECK_ERR(td_rpc_shutdown(true, 0), TD_ERR_NOT_INIT, "RPC has not been initialized");
    } else {
        rpc_test_sleep_ms(1000);
        rpc_down();
    }
}

/* handle_send_exceptions: a worker that shut down (not gracefully) fails the calls sent to it,
 * through their futures; the others go on. */
TD_TEST(handle_send_exceptions, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    TD_CHECK_OK(td_rpc_set_timeout(NULL, 10000));
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 30000));
    if (ctx->rank == 2) {
        TD_CHECK_OK(td_rpc_shutdown(false, 0));
        return;
    }
    /* wait_until_node_failure */
    int64_t t0 = now_ms();
    for (;;) {
        td_value *r = NULL;
        td_status st = td_rpc_sync(NULL, td_rpc_to_id(2), "light_rpc", NULL, NULL, -1, &r);
        td_value_release(r);
        if (st != TD_OK) {
            TD_CHECK_MSG(st == TD_ERR_PEER_LOST, "got %s: %s", td_status_str(st), td_last_error());
            break;
        }
        TD_CHECK(now_ms() - t0 < 10000);
        rpc_test_sleep_ms(10);
    }
    td_value *args = ints(1, 1);
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_name("worker2"), "add_ints", args, NULL, -1, &f));
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_PEER_LOST, "worker2");
    td_future_release(f);
    td_value_release(args);
    TD_CHECK_EQ(sync_int(td_rpc_to_id(1 - ctx->rank), "add_ints", 2, 2), 4);
    /* local_shutdown_with_rpc: a barrier first, so that no call is still on its way. */
    const char *survivors[] = {"worker0", "worker1"};
    TD_CHECK_OK(td_rpc_barrier(NULL, survivors, 2, 30000));
    TD_CHECK_OK(td_rpc_shutdown(false, 0));
}

TD_TEST(local_shutdown, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    TD_CHECK_OK(td_rpc_shutdown(false, 0));
    TD_CHECK_ERR(td_rpc_shutdown(false, 0), TD_ERR_NOT_INIT, NULL);
}

/* Explicit handles: two agents in one process, each its own world. */
TD_TEST(two_agents_one_process, .world_size = 1, .timeout_s = 60)
{
    (void)ctx;
    register_functions();
    td_store *s1 = NULL, *s2 = NULL;
    TD_CHECK_OK(td_hash_store_create(&s1));
    TD_CHECK_OK(td_hash_store_create(&s2));
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.store = s1;
    td_rpc_agent *a1 = NULL, *a2 = NULL;
    TD_CHECK_OK(td_rpc_agent_create("alpha", 0, 1, &o, &a1));
    o.store = s2;
    TD_CHECK_OK(td_rpc_agent_create("beta", 0, 1, &o, &a2));
    td_value *args = ints(5, 6), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(a1, td_rpc_to_name("alpha"), "add_ints", args, NULL, -1, &r));
    TD_CHECK_EQ(td_value_get_int(r), 11);
    td_value_release(r);
    TD_CHECK_ERR(td_rpc_sync(a2, td_rpc_to_name("alpha"), "add_ints", args, NULL, -1, &r), TD_ERR_NOT_FOUND,
                 "name:beta,rank:0 could not find destination name alpha");
    td_value_release(args);
    /* No default agent meanwhile. */
    TD_CHECK_EQ(td_rpc_get_timeout(NULL), -1);
    TD_CHECK_CONTAINS(td_last_error(), "RPC has not been initialized");
    TD_CHECK_OK(td_rpc_agent_shutdown(a1, true, 0));
    TD_CHECK_OK(td_rpc_agent_shutdown(a2, false, 0));
    td_store_release(s1);
    td_store_release(s2);
}

/* Workers as threads of one process (the harness's threaded mode), each with its own handle:
 * their namespaces in the store agree although the process makes several agents. */
TD_TEST(threaded_agents, .world_size = 3, .threads = true, .timeout_s = 60)
{
    register_functions();
    td_rpc_options o = options(ctx);
    char name[32];
    worker_name(ctx->rank, name, sizeof name);
    td_rpc_agent *a = NULL;
    TD_CHECK_OK(td_rpc_agent_create(name, ctx->rank, ctx->world_size, &o, &a));
    td_value *args = ints(ctx->rank, 1), *r = NULL;
    TD_CHECK_OK(td_rpc_sync(a, td_rpc_to_id((ctx->rank + 1) % ctx->world_size), "add_ints", args, NULL, -1, &r));
    TD_CHECK_EQ(td_value_get_int(r), ctx->rank + 1);
    td_value_release(r);
    td_value_release(args);
    TD_CHECK_OK(td_rpc_agent_shutdown(a, true, 30000));
}

/* ---- failures ------------------------------------------------------------------------------------ */

/* A worker killed while the others stream calls to it: its pending calls fail naming it within
 * 2 s, later ones at once; the survivors keep calling each other and shut down. */
TD_TEST(killed_worker, .world_size = 3, .params = "unix,tcp", .timeout_s = 60, .skip_return_code_check = true,
        .allow_leftovers = true)
{
    rpc_up(ctx);
    char path[1024];
    snprintf(path, sizeof path, "%s/kill_time", ctx->tmpdir);
    /* Everyone is up and has talked to worker2 once. */
    TD_CHECK_EQ(sync_int(td_rpc_to_id(2), "add_ints", 1, 1), 2);
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 30000));
    if (ctx->rank == 2) {
        rpc_test_sleep_ms(300);
        rpc_test_die_noting_time(path);
    }
    int other = 1 - ctx->rank;
    td_value *slow = td_value_tuple_of(1, td_value_int(20000));
    enum { N = 8 };
    td_future *fs[N];
    for (int i = 0; i < N; i++)
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_name("worker2"), "sleep_ms", slow, NULL, 0, &fs[i]));
    for (int i = 0; i < N; i++) {
        TD_CHECK_ERR(td_future_wait(fs[i], 30000), TD_ERR_PEER_LOST, "worker2");
        td_future_release(fs[i]);
    }
    int64_t since = rpc_test_ms_since_death(path);
    TD_CHECK_MSG(since < 2000, "the calls failed %lld ms after the kill", (long long)since);
    /* Later calls to it fail at once, through their future. */
    td_future *f = NULL;
    int64_t t0 = now_ms();
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(2), "add_ints", slow, NULL, 0, &f));
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_PEER_LOST, "worker2 (id 2)");
    TD_CHECK(now_ms() - t0 < 1000);
    td_future_release(f);
    /* The survivors go on. */
    for (int i = 0; i < 10; i++)
        TD_CHECK_EQ(sync_int(td_rpc_to_id(other), "add_ints", i, 1), i + 1);
    td_value_release(slow);
    rpc_down();
}

/* ---- among workers, debug info ---------------------------------------------------------------- */

TD_TEST(all_gather, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    td_value *mine = td_value_int(ctx->rank), *g = NULL;
    TD_CHECK_OK(td_rpc_all_gather(NULL, mine, NULL, 0, -1, &g));
    TD_CHECK_EQ(td_value_len(g), 4);
    for (int i = 0; i < 4; i++) {
        char name[32];
        worker_name(i, name, sizeof name);
        TD_CHECK_EQ(td_value_get_int(td_value_dict_get_str(g, name)), i);
    }
    td_value_release(g);
    /* Twice in a row over the same set, and disjoint subsets concurrently. */
    TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, -1));
    const char *odd[] = {"worker1", "worker3"}, *even[] = {"worker2", "worker0"};
    TD_CHECK_OK(td_rpc_barrier(NULL, ctx->rank % 2 ? odd : even, 2, -1));
    const char *alone[] = {"worker0"};
    if (ctx->rank == 0)
        TD_CHECK_OK(td_rpc_barrier(NULL, alone, 1, -1));
    td_value_release(mine);
    rpc_down();
}

/* all_gather_timeout: a worker that does not come makes the others' _all_gather time out. */
TD_TEST(all_gather_timeout, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 0) {
        td_value *g = NULL;
        TD_CHECK_ERR(td_rpc_all_gather(NULL, NULL, NULL, 0, 100, &g), TD_ERR_TIMEOUT,
                     "timed out in _all_gather after 0.10 seconds");
        TD_CHECK(g == NULL);
    }
    rpc_down();
}

TD_TEST(debug_info, .world_size = 2, .timeout_s = 60)
{
    td_rpc_options o = options(ctx);
    o.num_worker_threads = 27;
    rpc_up_with(ctx, &o);
    TD_CHECK_EQ(sync_int(td_rpc_to_id((ctx->rank + 1) % 2), "add_ints", 1, 2), 3);
    td_value *info = NULL;
    TD_CHECK_OK(td_rpc_debug_info(NULL, &info));
    TD_CHECK_STR_EQ(td_value_get_string(td_value_dict_get_str(info, "agent.thread_pool_size"), NULL), "27");
    const char *keys[] = {"agent.num_pending_requests", "agent.num_idle_threads", "agent.client_active_calls",
                          "agent.server_active_calls", "agent.server_active_async_calls"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        td_value *v = td_value_dict_get_str(info, keys[i]);
        TD_CHECK_MSG(v && td_value_kind_of(v) == TD_VAL_STRING, "debug info lacks %s", keys[i]);
    }
    TD_CHECK_STR_EQ(td_value_get_string(td_value_dict_get_str(info, "agent.num_pending_requests"), NULL), "0");
    TD_CHECK(td_value_dict_get_str(info, "agent.gil_average_wait_time_us") == NULL);
    td_value_release(info);
    rpc_down();
}

TD_TEST_MAIN()
