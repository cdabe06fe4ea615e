/* The RPC profiler (tdist/profiler.h, spec/rpc_part1.md C17, C12's type query) across real worker
 * processes, named after the seed tests it ports: the event of each call mode with a UDF and a
 * builtin (key, count 1, node ids, the user scope "foo" containing the call, the callee's events
 * merged under the key), remote() also to oneself, the remote events of a function doing several
 * ops on every other worker, nested keys through an async function over two hops, scopes inside
 * the remote function against the same function run locally, input shapes and memory, the Chrome
 * trace (checked as JSON), what a stopped profiler or another thread's records (nothing), the API's
 * errors, and the RRef type query counted through its events (one RPC over 1 + 10 queries). As in
 * the seed, worker1 profiles and the other workers serve. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tdist/profiler.h>
#include <tdist/rpc.h>
#include <tdist/rref.h>
#include <tdist/testing.h>

#include "rpc_util.h"

#define REMOTE_OP "#remote_op: "

/* Returns the status of expr when it failed. */
#define TRY(expr)                      \
    do {                               \
        td_status try_st_ = (expr);    \
        if (try_st_ != TD_OK)          \
            return try_st_;            \
    } while (0)

/* ---- helpers ------------------------------------------------------------------------------------ */

static td_tensor *filled(td_shape shape, double v)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, shape, v, &t));
    return t;
}

typedef struct event_list {
    td_profiler_event *items;
    size_t len;
} event_list;

static event_list events_of(td_profiler *p)
{
    event_list l = {NULL, 0};
    TD_CHECK_OK(td_profiler_events(p, &l.items, &l.len));
    return l;
}

/* How many events are named name (prefix: start with it); *first: the first one's index. */
static size_t count_events(const event_list *l, const char *name, bool prefix, size_t *first)
{
    size_t n = 0;
    for (size_t i = 0; i < l->len; i++) {
        bool hit = prefix ? strncmp(l->items[i].name, name, strlen(name)) == 0 : strcmp(l->items[i].name, name) == 0;
        if (hit && n++ == 0 && first)
            *first = i;
    }
    return n;
}

/* The one event named name; fails the test unless there is exactly one. */
static const td_profiler_event *the_event(const event_list *l, const char *name, size_t *index)
{
    size_t at = 0, n = count_events(l, name, false, &at);
    TD_CHECK_MSG(n == 1, "%zu events named '%s', expected 1", n, name);
    if (index)
        *index = at;
    return &l->items[at];
}

static bool contains(const td_profiler_event *outer, const td_profiler_event *inner)
{
    return outer->start_ns <= inner->start_ns && inner->end_ns <= outer->end_ns;
}

static void dump(const event_list *l)
{
    for (size_t i = 0; i < l->len; i++)
        fprintf(stderr, "  [%zu] %s node=%lld remote=%d\n", i, l->items[i].name, (long long)l->items[i].node_id,
                l->items[i].is_remote);
}

static void worker_name(int rank, char *out, size_t size) { snprintf(out, size, "worker%d", rank); }

/* ---- the functions workers call --------------------------------------------------------------- */

/* prof_udf(a, b): a + b inside a user scope "udf_scope". */
static td_status fn_prof_udf(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    TRY(td_rpc_bind("prof_udf", "a,b", args, kwargs, p));
    td_record_function_enter("udf_scope");
    *result = td_value_int(td_value_get_int(p[0]) + td_value_get_int(p[1]));
    return td_record_function_exit();
}

/* The ops of the seed's udf_with_torch_ops, each in a scope named as torch's profiler names it
 * (the spec's oracle for a library whose tensor ops do not record themselves):
 * t1 = ones(1); t2 = ones(1); t3 = add(t1, t2); t4 = mul(t3, t3); t5 = relu(t4); sigmoid(t5). */
static const char *const ops_expected[] = {"aten::ones", "aten::add",       "aten::mul",
                                           "aten::relu", "aten::clamp_min", "aten::sigmoid"};

static td_tensor *map_floats(const td_tensor *in, float (*fn)(float))
{
    td_tensor *out = NULL;
    if (td_tensor_clone(in, &out) != TD_OK)
        return NULL;
    float *d = td_tensor_data(out);
    for (int64_t i = 0; i < td_tensor_numel(out); i++)
        d[i] = fn(d[i]);
    return out;
}
static float relu_f(float x) { return x > 0 ? x : 0; }
static float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

static td_status udf_with_ops_body(td_tensor **out)
{
    td_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL, *t4 = NULL, *t5 = NULL;
    td_record_function_enter("aten::ones");
    td_status st = td_tensor_ones(TD_FLOAT32, TD_SHAPE(1), &t1);
    td_record_function_exit();
    td_record_function_enter("aten::ones");
    if (st == TD_OK)
        st = td_tensor_ones(TD_FLOAT32, TD_SHAPE(1), &t2);
    td_record_function_exit();
    td_record_function_enter("aten::add");
    if (st == TD_OK)
        st = td_tensor_add(t1, t2, &t3);
    td_record_function_exit();
    td_record_function_enter("aten::mul");
    if (st == TD_OK)
        st = td_tensor_mul(t3, t3, &t4);
    td_record_function_exit();
    td_record_function_enter("aten::relu");
    td_record_function_enter("aten::clamp_min");
    if (st == TD_OK && !(t5 = map_floats(t4, relu_f)))
        st = TD_ERR_NOMEM;
    td_record_function_exit();
    td_record_function_exit();
    td_record_function_enter("aten::sigmoid");
    if (st == TD_OK && !(*out = map_floats(t5, sigmoid_f)))
        st = TD_ERR_NOMEM;
    td_record_function_exit();
    td_tensor_release(t1);
    td_tensor_release(t2);
    td_tensor_release(t3);
    td_tensor_release(t4);
    td_tensor_release(t5);
    return st;
}

static td_status fn_udf_with_ops(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    td_tensor *t = NULL;
    TRY(udf_with_ops_body(&t));
    *result = td_value_tensor(t);
    td_tensor_release(t);
    return TD_OK;
}

/* slow_add(a, b): sleeps, then a + b (tensors) in a scope "aten::add". */
static td_status fn_slow_add(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    TRY(td_rpc_bind("slow_add", "a,b", args, kwargs, p));
    rpc_test_sleep_ms(200);
    td_tensor *sum = NULL;
    td_record_function_enter("aten::add");
    td_status st = td_tensor_add(td_value_get_tensor(p[0]), td_value_get_tensor(p[1]), &sum);
    td_record_function_exit();
    TRY(st);
    *result = td_value_tensor(sum);
    td_tensor_release(sum);
    return TD_OK;
}

/* slow_async_add(to, a, b): an async function whose result is slow_add(a, b) on worker `to`. */
static td_future *fn_slow_async_add(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    const td_value *p[3];
    if (td_rpc_bind("slow_async_add", "to,a,b", args, kwargs, p) != TD_OK)
        return NULL;
    td_value *fwd = td_value_tuple_of(2, td_value_retain((td_value *)p[1]), td_value_retain((td_value *)p[2]));
    td_future *f = NULL;
    td_status st = td_rpc_async(td_rpc_call_agent(call), td_rpc_to_value(p[0]), "slow_add", fwd, NULL,
                                TD_RPC_DEFAULT_TIMEOUT, &f);
    td_value_release(fwd);
    return st == TD_OK ? f : NULL;
}

/* forward_udf(): a scope "##forward##" with two child scopes, as the seed's remote module. */
static void forward_body(void)
{
    td_record_function_enter("##forward##");
    td_record_function_enter("child_linear");
    rpc_test_sleep_ms(2);
    td_record_function_exit();
    td_record_function_enter("child_relu");
    rpc_test_sleep_ms(2);
    td_record_function_exit();
    td_record_function_exit();
}

static td_status fn_forward_udf(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    forward_body();
    *result = td_value_int(1);
    return TD_OK;
}

static void rpc_up(td_test_ctx *ctx)
{
    const rpc_test_function fns[] = {
        {"prof_udf", fn_prof_udf, NULL, NULL},     {"udf_with_ops", fn_udf_with_ops, NULL, NULL},
        {"slow_add", fn_slow_add, NULL, NULL},     {"slow_async_add", NULL, fn_slow_async_add, NULL},
        {"forward_udf", fn_forward_udf, NULL, NULL},
    };
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    rpc_test_init(ctx, NULL);
}

/* ---- one call of each mode ---------------------------------------------------------------------- */

typedef enum call_mode { MODE_SYNC, MODE_ASYNC, MODE_REMOTE } call_mode;
static const char *const mode_names[] = {"sync", "async", "remote"};

/* _profiler_test_with_rpc: worker1 profiles one call of fn(args) to dst in mode, inside a scope
 * "foo", and checks the call's event (one, named by the key, node id 1, inside foo and after it in
 * the list), the callee's event remote_name merged under the key (one, node id dst, inside the
 * call), that nothing else was recorded, and the result (expect: an int, or a tensor's every
 * element when is_tensor). */
static void profile_one(td_test_ctx *ctx, call_mode mode, int dst, const char *fn, td_value *args,
                        const char *remote_name, double expect, bool is_tensor)
{
    if (ctx->rank == 1) {
        td_profiler *p = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        td_record_function_enter("foo");
        td_value *result = NULL;
        td_rref *rref = NULL;
        if (mode == MODE_SYNC) {
            TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(dst), fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &result));
        } else if (mode == MODE_ASYNC) {
            td_future *f = NULL;
            TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
            TD_CHECK_OK(td_future_wait(f, 0));
            result = td_future_value(f) ? td_value_retain(td_future_value(f)) : NULL;
            td_future_release(f);
        } else {
            TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(dst), fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &rref));
            td_future *created = td_rref_get_future(rref); /* the owner's creation reply */
            TD_CHECK_OK(td_future_wait(created, 0));
            td_future_release(created);
        }
        TD_CHECK_OK(td_record_function_exit());
        TD_CHECK_OK(td_profiler_stop(p));
        if (rref) {
            TD_CHECK_OK(td_rref_to_here(rref, TD_RPC_DEFAULT_TIMEOUT, &result));
            td_rref_release(rref);
        }
        if (is_tensor) {
            td_tensor *t = td_value_get_tensor(result);
            for (int64_t i = 0; i < td_tensor_numel(t); i++)
                TD_CHECK_NEAR(((const float *)td_tensor_data(t))[i], expect, 1e-6);
        } else {
            TD_CHECK_EQ(td_value_get_int(result), (long long)expect);
        }
        td_value_release(result);

        char me[32], callee[32], key[256], remote[512];
        worker_name(1, me, sizeof me);
        worker_name(dst, callee, sizeof callee);
        snprintf(key, sizeof key, "rpc_%s#%s(%s -> %s)", mode_names[mode], fn, me, callee);
        snprintf(remote, sizeof remote, "%s" REMOTE_OP "%s", key, remote_name);
        event_list l = events_of(p);
        size_t at_rpc = 0, at_foo = 0;
        const td_profiler_event *rpc = the_event(&l, key, &at_rpc), *foo = the_event(&l, "foo", &at_foo);
        const td_profiler_event *rem = the_event(&l, remote, NULL);
        TD_CHECK_EQ(rpc->node_id, 1);
        TD_CHECK(!rpc->is_remote);
        TD_CHECK(rpc->end_ns > rpc->start_ns);
        TD_CHECK_EQ(foo->node_id, 1);
        TD_CHECK(!foo->is_remote);
        TD_CHECK_MSG(contains(foo, rpc), "the scope foo does not contain the RPC's range");
        TD_CHECK(at_foo < at_rpc);
        TD_CHECK(rem->is_remote);
        TD_CHECK_EQ(rem->node_id, dst);
        TD_CHECK_MSG(contains(rpc, rem), "the remote event lies outside the RPC's range");
        /* Only these: the call's key prefixes every other event. */
        size_t under_key = count_events(&l, key, true, NULL);
        if (l.len != under_key + 1)
            dump(&l);
        TD_CHECK_EQ(l.len, under_key + 1);
        td_profiler_events_free(l.items);
        td_profiler_free(p);
    }
    td_value_release(args);
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

static td_value *udf_args(void) { return td_value_tuple_of(2, td_value_int(2), td_value_int(3)); }

static td_value *add_args(void)
{
    td_tensor *t = filled(TD_SHAPE(2, 2), 1);
    td_value *args = td_value_tuple_of(2, td_value_tensor(t), td_value_tensor(t));
    td_tensor_release(t);
    return args;
}

TD_TEST(profiler_with_sync_rpc_udf, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    profile_one(ctx, MODE_SYNC, 0, "prof_udf", udf_args(), "udf_scope", 5, false);
}

TD_TEST(profiler_with_sync_rpc_builtin, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    profile_one(ctx, MODE_SYNC, 0, "aten::add", add_args(), "aten::add", 2, true);
}

TD_TEST(profiler_with_async_rpc_udf, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    profile_one(ctx, MODE_ASYNC, 2, "prof_udf", udf_args(), "udf_scope", 5, false);
}

TD_TEST(profiler_with_async_rpc_builtin, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    profile_one(ctx, MODE_ASYNC, 0, "aten::add", add_args(), "aten::add", 2, true);
}

TD_TEST(profiler_with_remote_udf, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    profile_one(ctx, MODE_REMOTE, 0, "prof_udf", udf_args(), "udf_scope", 5, false);
}

TD_TEST(profiler_with_remote_builtin, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    profile_one(ctx, MODE_REMOTE, 0, "aten::add", add_args(), "aten::add", 2, true);
}

/* remote() to oneself is profiled too, through the loopback. */
TD_TEST(profiler_with_remote_udf_to_self, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    profile_one(ctx, MODE_REMOTE, 1, "prof_udf", udf_args(), "udf_scope", 5, false);
}

/* ---- remote events ------------------------------------------------------------------------------ */

/* test_profiler_remote_events_profiled: udf_with_ops on every other worker; the remote events
 * under each call's key are exactly the expected ops (ones twice), with that worker's node id. */
TD_TEST(profiler_remote_events_profiled, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        td_profiler *p = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        td_future *fs[4] = {NULL};
        for (int dst = 0; dst < ctx->world_size; dst++)
            if (dst != 1)
                TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(dst), "udf_with_ops", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT,
                                         &fs[dst]));
        for (int dst = 0; dst < ctx->world_size; dst++) {
            if (dst == 1)
                continue;
            TD_CHECK_OK(td_future_wait(fs[dst], 0));
            td_tensor *t = td_value_get_tensor(td_future_value(fs[dst]));
            TD_CHECK_NEAR(((const float *)td_tensor_data(t))[0], 1.0 / (1.0 + exp(-4.0)), 1e-5);
            td_future_release(fs[dst]);
        }
        TD_CHECK_OK(td_profiler_stop(p));
        event_list l = events_of(p);
        for (int dst = 0; dst < ctx->world_size; dst++) {
            if (dst == 1)
                continue;
            char prefix[256];
            snprintf(prefix, sizeof prefix, "rpc_async#udf_with_ops(worker1 -> worker%d)", dst);
            const td_profiler_event *rpc = the_event(&l, prefix, NULL);
            TD_CHECK_EQ(rpc->node_id, 1);
            strcat(prefix, REMOTE_OP);
            size_t n = count_events(&l, prefix, true, NULL);
            TD_CHECK_EQ(n, 7); /* ones, ones, add, mul, relu, clamp_min, sigmoid */
            for (size_t i = 0; i < l.len; i++) {
                if (strncmp(l.items[i].name, prefix, strlen(prefix)) != 0)
                    continue;
                const char *op = l.items[i].name + strlen(prefix);
                bool known = false;
                for (size_t k = 0; k < sizeof ops_expected / sizeof ops_expected[0]; k++)
                    known |= strcmp(op, ops_expected[k]) == 0;
                TD_CHECK_MSG(known, "unexpected remote event %s", op);
                TD_CHECK(l.items[i].is_remote);
                TD_CHECK_EQ(l.items[i].node_id, dst);
            }
            for (size_t k = 0; k < sizeof ops_expected / sizeof ops_expected[0]; k++) {
                char name[512];
                snprintf(name, sizeof name, "%s%s", prefix, ops_expected[k]);
                TD_CHECK_EQ(count_events(&l, name, false, NULL), strcmp(ops_expected[k], "aten::ones") == 0 ? 2 : 1);
            }
        }
        td_profiler_events_free(l.items);
        td_profiler_free(p);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_rpc_profiling_async_function: worker1 -> worker2 (async slow_async_add) -> worker3
 * (slow_add): the keys compose over the two hops, each event with the id of the worker that
 * recorded it. */
TD_TEST(rpc_profiling_async_function, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        td_tensor *ones = filled(TD_SHAPE(2), 1);
        td_value *args = td_value_tuple_of(3, td_value_string("worker3"), td_value_tensor(ones), td_value_tensor(ones));
        td_profiler *p = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        td_future *f = NULL;
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_name("worker2"), "slow_async_add", args, NULL, 20000, &f));
        TD_CHECK_OK(td_future_wait(f, 0));
        TD_CHECK_OK(td_profiler_stop(p));
        TD_CHECK_NEAR(((const float *)td_tensor_data(td_value_get_tensor(td_future_value(f))))[1], 2.0, 1e-6);
        td_future_release(f);
        td_value_release(args);
        td_tensor_release(ones);

        event_list l = events_of(p);
        const char *outer = "rpc_async#slow_async_add(worker1 -> worker2)";
        const char *hop = "rpc_async#slow_async_add(worker1 -> worker2)" REMOTE_OP
                          "rpc_async#slow_add(worker2 -> worker3)";
        const char *add = "rpc_async#slow_async_add(worker1 -> worker2)" REMOTE_OP
                          "rpc_async#slow_add(worker2 -> worker3)" REMOTE_OP "aten::add";
        const td_profiler_event *e1 = the_event(&l, outer, NULL), *e2 = the_event(&l, hop, NULL),
                                *e3 = the_event(&l, add, NULL);
        TD_CHECK_EQ(e1->node_id, 1);
        TD_CHECK(!e1->is_remote);
        TD_CHECK_EQ(e2->node_id, 2);
        TD_CHECK(e2->is_remote);
        TD_CHECK_EQ(e3->node_id, 3);
        TD_CHECK(e3->is_remote);
        TD_CHECK(contains(e1, e2) && contains(e2, e3));
        TD_CHECK(e2->end_ns - e2->start_ns >= 200 * 1000000LL); /* slow_add sleeps 200 ms */
        td_profiler_events_free(l.items);
        td_profiler_free(p);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* The name of the scope event's children: the events of l (under prefix when it is not NULL,
 * which is stripped) that lie inside parent, other than parent. */
static size_t children_of(const event_list *l, const td_profiler_event *parent, const char *prefix,
                          const char **names, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < l->len; i++) {
        const td_profiler_event *e = &l->items[i];
        if (e == parent || !contains(parent, e))
            continue;
        if (prefix && strncmp(e->name, prefix, strlen(prefix)) != 0)
            continue;
        if (n < cap)
            names[n] = e->name + (prefix ? strlen(prefix) : 0);
        n++;
    }
    return n;
}

/* test_rpc_profiling_remote_record_function: a scope "##forward##" inside the remote function
 * appears once, with the callee's node id, and its remote children (prefix stripped) are among the
 * children of the same scope run locally. */
TD_TEST(rpc_profiling_remote_record_function, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        td_profiler *p = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        td_record_function_enter("foo");
        td_future *f = NULL;
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(0), "forward_udf", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
        TD_CHECK_OK(td_future_wait(f, 0));
        td_future_release(f);
        TD_CHECK_OK(td_record_function_exit());
        forward_body(); /* the same scopes, run here */
        TD_CHECK_OK(td_profiler_stop(p));

        event_list l = events_of(p);
        const char *key = "rpc_async#forward_udf(worker1 -> worker0)";
        const char *prefix = "rpc_async#forward_udf(worker1 -> worker0)" REMOTE_OP;
        char remote_forward[256];
        snprintf(remote_forward, sizeof remote_forward, "%s##forward##", prefix);
        TD_CHECK_EQ(count_events(&l, "##forward##", true, NULL), 1); /* the local one */
        const td_profiler_event *rf = the_event(&l, remote_forward, NULL), *local = the_event(&l, "##forward##", NULL);
        TD_CHECK_EQ(rf->node_id, 0);
        TD_CHECK(rf->is_remote);
        TD_CHECK(contains(the_event(&l, "foo", NULL), the_event(&l, key, NULL)));
        const char *remote_children[8], *local_children[8];
        size_t nr = children_of(&l, rf, prefix, remote_children, 8);
        size_t nl = children_of(&l, local, NULL, local_children, 8);
        TD_CHECK_EQ(nr, 2);
        TD_CHECK_EQ(nl, 2);
        for (size_t i = 0; i < nr; i++) {
            bool found = false;
            for (size_t j = 0; j < nl; j++)
                found |= strcmp(remote_children[i], local_children[j]) == 0;
            TD_CHECK_MSG(found, "remote child %s is not a local child of ##forward##", remote_children[i]);
        }
        td_profiler_events_free(l.items);
        td_profiler_free(p);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- shapes and memory -------------------------------------------------------------------------- */

/* Worker1 profiles aten::add(ones(100), ones(100)) on worker0 with o: *p the profiler, *l its
 * events, *add the remote aten::add among them. */
static void profile_add(const td_profiler_options *o, td_profiler **p, event_list *l, const td_profiler_event **add)
{
    td_tensor *t = filled(TD_SHAPE(100), 1);
    td_value *args = td_value_tuple_of(2, td_value_tensor(t), td_value_tensor(t)), *r = NULL;
    TD_CHECK_OK(td_profiler_start(o, p));
    TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(0), "aten::add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK_OK(td_profiler_stop(*p));
    TD_CHECK_EQ(td_tensor_numel(td_value_get_tensor(r)), 100);
    td_value_release(r);
    td_value_release(args);
    td_tensor_release(t);
    *l = events_of(*p);
    *add = the_event(l, "rpc_sync#aten::add(worker1 -> worker0)" REMOTE_OP "aten::add", NULL);
}

/* test_profiler_rpc_record_shapes: the remote aten::add's input shapes are the local inputs'. */
TD_TEST(profiler_rpc_record_shapes, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        td_profiler_options o;
        td_profiler_options_init(&o);
        o.record_shapes = true;
        td_profiler *p = NULL;
        event_list l;
        const td_profiler_event *add = NULL;
        profile_add(&o, &p, &l, &add);
        TD_CHECK_EQ(add->num_inputs, 2);
        for (size_t i = 0; i < 2; i++) {
            TD_CHECK_EQ(add->input_shapes[i].ndim, 1);
            TD_CHECK_EQ(add->input_shapes[i].d[0], 100);
        }
        td_profiler_events_free(l.items);
        td_profiler_free(p);
        /* Without record_shapes: none. */
        profile_add(NULL, &p, &l, &add);
        TD_CHECK_EQ(add->num_inputs, 0);
        td_profiler_events_free(l.items);
        td_profiler_free(p);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* test_profiler_rpc_memory: with profile_memory the events' memory is not all 0 (aten::add made
 * 400 bytes), without it all 0. */
TD_TEST(profiler_rpc_memory, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        for (int with = 1; with >= 0; with--) {
            td_profiler_options o;
            td_profiler_options_init(&o);
            o.profile_memory = with;
            td_profiler *p = NULL;
            event_list l;
            const td_profiler_event *add = NULL;
            profile_add(&o, &p, &l, &add);
            bool any = false;
            for (size_t i = 0; i < l.len; i++)
                any |= l.items[i].cpu_memory_usage != 0;
            TD_CHECK_EQ(any, with);
            TD_CHECK_EQ(add->cpu_memory_usage, with ? 400 : 0);
            td_profiler_events_free(l.items);
            td_profiler_free(p);
        }
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- Chrome trace ------------------------------------------------------------------------------- */

/* A strict JSON checker (RFC 8259 values), enough to know that chrome://tracing will parse it. */
typedef struct json_in {
    const char *s;
    size_t at, len;
} json_in;

static void json_ws(json_in *j)
{
    while (j->at < j->len && j->s[j->at] && strchr(" \t\r\n", j->s[j->at]))
        j->at++;
}

static bool json_value(json_in *j, int depth);

static bool json_string_ok(json_in *j)
{
    if (j->at >= j->len || j->s[j->at] != '"')
        return false;
    for (j->at++; j->at < j->len; j->at++) {
        unsigned char c = (unsigned char)j->s[j->at];
        if (c == '"') {
            j->at++;
            return true;
        }
        if (c < 0x20)
            return false;
        if (c == '\\') {
            if (++j->at >= j->len)
                return false;
            char e = j->s[j->at];
            if (e == 'u') {
                for (int k = 0; k < 4; k++)
                    if (++j->at >= j->len || !j->s[j->at] || !strchr("0123456789abcdefABCDEF", j->s[j->at]))
                        return false;
            } else if (!e || !strchr("\"\\/bfnrt", e)) {
                return false;
            }
        }
    }
    return false;
}

static bool json_digit(const json_in *j) { return j->at < j->len && j->s[j->at] >= '0' && j->s[j->at] <= '9'; }

static bool json_number_ok(json_in *j)
{
    if (j->at < j->len && j->s[j->at] == '-')
        j->at++;
    if (!json_digit(j))
        return false;
    if (j->s[j->at] == '0')
        j->at++;
    else
        while (json_digit(j))
            j->at++;
    if (j->at < j->len && j->s[j->at] == '.') {
        j->at++;
        if (!json_digit(j))
            return false;
        while (json_digit(j))
            j->at++;
    }
    if (j->at < j->len && (j->s[j->at] == 'e' || j->s[j->at] == 'E')) {
        j->at++;
        if (j->at < j->len && (j->s[j->at] == '+' || j->s[j->at] == '-'))
            j->at++;
        if (!json_digit(j))
            return false;
        while (json_digit(j))
            j->at++;
    }
    return true;
}

static bool json_value(json_in *j, int depth)
{
    if (depth > 64)
        return false;
    json_ws(j);
    if (j->at >= j->len)
        return false;
    char c = j->s[j->at];
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->at++;
        json_ws(j);
        if (j->at < j->len && j->s[j->at] == close) {
            j->at++;
            return true;
        }
        for (;;) {
            if (c == '{') {
                json_ws(j);
                if (!json_string_ok(j))
                    return false;
                json_ws(j);
                if (j->at >= j->len || j->s[j->at++] != ':')
                    return false;
            }
            if (!json_value(j, depth + 1))
                return false;
            json_ws(j);
            if (j->at >= j->len)
                return false;
            char d = j->s[j->at++];
            if (d == close)
                return true;
            if (d != ',')
                return false;
        }
    }
    if (c == '"')
        return json_string_ok(j);
    for (const char *const *w = (const char *const[]){"true", "false", "null", NULL}; *w; w++) {
        if (j->len - j->at >= strlen(*w) && strncmp(j->s + j->at, *w, strlen(*w)) == 0) {
            j->at += strlen(*w);
            return true;
        }
    }
    return json_number_ok(j);
}

static bool json_valid(const char *s, size_t len)
{
    if (len == SIZE_MAX)
        len = strlen(s);
    json_in j = {s, 0, len};
    if (!json_value(&j, 0))
        return false;
    json_ws(&j);
    return j.at == len;
}

static size_t count_substr(const char *s, const char *sub)
{
    size_t n = 0;
    for (const char *p = strstr(s, sub); p; p = strstr(p + 1, sub))
        n++;
    return n;
}

/* test_profiler_export_trace: the trace is valid JSON, an array of complete events with the
 * expected names (the call's and its remote ops', and "async"), one track per worker. */
TD_TEST(profiler_export_trace, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        TD_CHECK(json_valid("[{\"a\": [1, -2.5, 3e2, true, null, \"x\\\"y\\u00e9\"]}, {}, []]", SIZE_MAX));
        TD_CHECK(!json_valid("[{\"a\": 1,}]", SIZE_MAX));
        TD_CHECK(!json_valid("[\"a\" \"b\"]", SIZE_MAX));
        TD_CHECK(!json_valid("[01]", SIZE_MAX));
        TD_CHECK(!json_valid("[1.]", SIZE_MAX));
        TD_CHECK(!json_valid("[\"a\tb\"]", SIZE_MAX));
        TD_CHECK(!json_valid("[1] x", SIZE_MAX));
        td_profiler *p = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        td_record_function_enter("scope \"quoted\"\t\\");
        td_future *f = NULL;
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(0), "udf_with_ops", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
        TD_CHECK_OK(td_future_wait(f, 0));
        td_future_release(f);
        TD_CHECK_OK(td_record_function_exit());
        TD_CHECK_OK(td_profiler_stop(p));
        char path[] = "/tmp/tdist_trace_XXXXXX";
        int fd = mkstemp(path);
        TD_CHECK(fd >= 0);
        close(fd);
        TD_CHECK_OK(td_profiler_export_chrome_trace(p, path));
        FILE *in = fopen(path, "r");
        TD_CHECK(in != NULL);
        char *text = calloc(1, 1 << 20);
        size_t len = fread(text, 1, (1 << 20) - 1, in);
        fclose(in);
        unlink(path);
        TD_CHECK_MSG(json_valid(text, len), "the trace is not valid JSON:\n%s", text);
        json_in j = {text, 0, len};
        json_ws(&j);
        TD_CHECK(text[j.at] == '[');
        TD_CHECK_CONTAINS(text, "\"name\": \"rpc_async#udf_with_ops(worker1 -> worker0)\"");
        for (size_t k = 0; k < sizeof ops_expected / sizeof ops_expected[0]; k++) {
            char name[256];
            snprintf(name, sizeof name, "\"name\": \"rpc_async#udf_with_ops(worker1 -> worker0)" REMOTE_OP "%s\"",
                     ops_expected[k]);
            TD_CHECK_CONTAINS(text, name);
        }
        TD_CHECK_CONTAINS(text, "async");
        TD_CHECK_CONTAINS(text, "\"name\": \"scope \\\"quoted\\\"\\u0009\\\\\"");
        event_list l = events_of(p);
        TD_CHECK_EQ(count_substr(text, "\"ph\": \"X\""), l.len); /* every event, as a complete event */
        TD_CHECK_EQ(l.len, 9);                                    /* the scope, the call, 7 remote ops */
        TD_CHECK_EQ(count_substr(text, "\"ph\": \"M\""), 2);      /* a track for each worker */
        TD_CHECK_CONTAINS(text, "\"pid\": 0, \"tid\": 0, \"args\": {\"name\": \"worker 0\"}");
        TD_CHECK_CONTAINS(text, "\"pid\": 1, \"tid\": 0, \"args\": {\"name\": \"worker 1\"}");
        td_profiler_events_free(l.items);
        free(text);
        td_profiler_free(p);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- what is not recorded ----------------------------------------------------------------------- */

typedef struct thread_call {
    td_status st;
    int64_t value;
} thread_call;

static void *call_from_thread(void *arg)
{
    thread_call *c = arg;
    td_value *args = udf_args(), *r = NULL;
    c->st = td_rpc_sync(NULL, td_rpc_to_id(0), "prof_udf", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r);
    c->value = r ? td_value_get_int(r) : -1;
    td_value_release(r);
    td_value_release(args);
    return NULL;
}

/* Calls made while no profiler records on the calling thread leave no event: after stop, from
 * another thread while this one profiles, and scopes opened while disabled. */
TD_TEST(profiler_disabled_records_nothing, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        td_profiler *p = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        TD_CHECK_OK(td_profiler_stop(p));
        td_value *args = udf_args(), *r = NULL;
        td_record_function_enter("after_stop");
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(0), "prof_udf", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
        TD_CHECK_OK(td_record_function_exit());
        TD_CHECK_EQ(td_value_get_int(r), 5);
        td_value_release(r);
        event_list l = events_of(p);
        TD_CHECK_EQ(l.len, 0);
        TD_CHECK(l.items == NULL);
        td_profiler_free(p);

        /* Another thread's calls are not this thread's profile. */
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        thread_call c = {TD_ERR_INTERNAL, 0};
        pthread_t t;
        TD_CHECK_EQ(pthread_create(&t, NULL, call_from_thread, &c), 0);
        pthread_join(t, NULL);
        TD_CHECK_OK(c.st);
        TD_CHECK_EQ(c.value, 5);
        TD_CHECK_OK(td_profiler_stop(p));
        l = events_of(p);
        TD_CHECK_EQ(l.len, 0);
        td_profiler_free(p);

        /* A scope opened before start is not recorded; one opened during is, also when closed
         * after stop. */
        td_record_function_enter("before");
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        td_record_function_enter("during");
        TD_CHECK_OK(td_profiler_stop(p));
        TD_CHECK_OK(td_record_function_exit());
        TD_CHECK_OK(td_record_function_exit());
        l = events_of(p);
        TD_CHECK_EQ(l.len, 1);
        TD_CHECK_STR_EQ(l.items[0].name, "during");
        TD_CHECK_EQ(l.items[0].node_id, 1);
        td_profiler_events_free(l.items);
        td_profiler_free(p);
        td_value_release(args);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

static void *stop_elsewhere(void *arg)
{
    td_status *st = arg;
    *st = td_profiler_stop(NULL);
    return NULL;
}

typedef struct stop_args {
    td_profiler *p;
    td_status st;
} stop_args;

static void *stop_other(void *arg)
{
    stop_args *s = arg;
    s->st = td_profiler_stop(s->p);
    return NULL;
}

/* The API's errors and nesting, without RPC (node id -1). */
TD_TEST(profiler_api, .world_size = 1, .timeout_s = 30)
{
    (void)ctx;
    td_profiler *p = NULL, *q = NULL;
    TD_CHECK_ERR(td_record_function_exit(), TD_ERR_INVALID, "no scope is open");
    TD_CHECK_OK(td_profiler_start(NULL, &p));
    TD_CHECK_ERR(td_profiler_start(NULL, &q), TD_ERR_ALREADY, "Profiler is already enabled on this thread");
    TD_CHECK(q == NULL);
    stop_args s = {p, TD_OK};
    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, stop_other, &s), 0);
    pthread_join(t, NULL);
    TD_CHECK_EQ(s.st, TD_ERR_INVALID);
    td_status st = TD_OK;
    TD_CHECK_EQ(pthread_create(&t, NULL, stop_elsewhere, &st), 0);
    pthread_join(t, NULL);
    TD_CHECK_EQ(st, TD_ERR_INVALID);
    td_record_function_enter("outer");
    td_record_function_enter("inner");
    rpc_test_sleep_ms(1);
    TD_CHECK_OK(td_record_function_exit());
    TD_CHECK_OK(td_record_function_exit());
    TD_CHECK_OK(td_profiler_stop(p));
    TD_CHECK_ERR(td_profiler_stop(p), TD_ERR_INVALID, "not running");
    event_list l = events_of(p);
    TD_CHECK_EQ(l.len, 2);
    TD_CHECK_STR_EQ(l.items[0].name, "outer"); /* the enclosing scope first */
    TD_CHECK_STR_EQ(l.items[1].name, "inner");
    TD_CHECK(contains(&l.items[0], &l.items[1]));
    TD_CHECK(l.items[1].end_ns - l.items[1].start_ns >= 1000000);
    TD_CHECK_EQ(l.items[0].node_id, -1);
    TD_CHECK(l.items[0].thread_id > 0 && l.items[0].thread_id == l.items[1].thread_id);
    TD_CHECK_EQ(l.items[0].num_inputs, 0);
    td_profiler_events_free(l.items);
    TD_CHECK_ERR(td_profiler_export_chrome_trace(p, "/nonexistent-dir/trace.json"), TD_ERR_IO, "trace");
    td_profiler_free(p);
    /* Free while running stops it, so a new one can start here. */
    TD_CHECK_OK(td_profiler_start(NULL, &p));
    td_profiler_free(p);
    TD_CHECK_OK(td_profiler_start(NULL, &p));
    TD_CHECK_OK(td_profiler_stop(p));
    td_profiler_free(p);
}

/* ---- the RRef type query ------------------------------------------------------------------------ */

/* _test_rref_type: the first type query of a user RRef is one RPC, rpc_async#_rref_typeof_on_owner;
 * ten more are answered from the cache (no event). An owner's query makes none. */
TD_TEST(rref_type_query_profiled_once, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    if (ctx->rank == 1) {
        td_tensor *t = filled(TD_SHAPE(2), 1);
        td_value *args = td_value_tuple_of(2, td_value_tensor(t), td_value_int(1));
        td_rref *user = NULL, *owner = NULL;
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(0), "aten::add", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &user));
        td_value *v = td_value_int(7);
        TD_CHECK_OK(td_rref_create(NULL, v, &owner));
        td_value_release(v);
        td_profiler *p = NULL;
        TD_CHECK_OK(td_profiler_start(NULL, &p));
        for (int i = 0; i < 11; i++) {
            const char *type = NULL;
            TD_CHECK_OK(td_rref_get_type(user, TD_RPC_DEFAULT_TIMEOUT, &type));
            TD_CHECK_STR_EQ(type, "Tensor");
            TD_CHECK_OK(td_rref_get_type(owner, TD_RPC_DEFAULT_TIMEOUT, &type));
            TD_CHECK_STR_EQ(type, "int");
        }
        TD_CHECK_OK(td_profiler_stop(p));
        event_list l = events_of(p);
        size_t first = 0;
        TD_CHECK_EQ(count_events(&l, "rpc_async#_rref_typeof_on_owner", true, &first), 1);
        TD_CHECK_STR_EQ(l.items[first].name, "rpc_async#_rref_typeof_on_owner(worker1 -> worker0)");
        TD_CHECK_EQ(l.items[first].node_id, 1);
        TD_CHECK_EQ(l.len, 1);
        td_profiler_events_free(l.items);
        td_profiler_free(p);
        td_rref_release(owner);
        td_rref_release(user);
        td_value_release(args);
        td_tensor_release(t);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST_MAIN()
