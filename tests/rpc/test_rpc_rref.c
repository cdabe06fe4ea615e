/* Remote references (tdist/rref.h) as rpc_test.py uses them, across real worker processes: the
 * string forms and deterministic ids (test_rref_str, test_local_value_not_on_owner), owners and
 * users passing RRefs to each other, to third workers and to themselves (test_pass_local_rrefs,
 * test_py_rref_args*, test_remote_same_worker, test_self_remote_rref_as_*, test_nested_rref,
 * test_rref_forward_chain, test_return_local_rrefs), methods called through rref.owner()
 * (test_call_method_on_rref), the reference-count protocol's counters
 * (test_rref_context_debug_info), leak detection at graceful shutdown (test_rref_leak,
 * test_ignore_rref_leak), type queries (_test_rref_type*), creation failures and timeouts
 * (test_remote_with_exception, test_rref_timeout), use after shutdown, and a stress test of forks
 * and deletes racing each other. Every test ends with a graceful shutdown that checks for leaked
 * forks (rpc_test_options turns the leak check on, as dist_init does). Workers are "worker<rank>". */
#include <errno.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/rpc.h>
#include <tdist/rref.h>
#include <tdist/testing.h>

#include "rpc/rref.h"
#include "rpc_util.h"

#define MYCLASS_TAG (TD_REC_USER + 1)

/* ---- small helpers --------------------------------------------------------------------------- */

static int next_rank(const td_test_ctx *ctx, int k) { return (ctx->rank + k) % ctx->world_size; }

static td_tensor *filled(int64_t rows, int64_t cols, double v)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(rows, cols), v, &t));
    return t;
}

/* A value holding a rows x cols float tensor filled with v. */
static td_value *tensor_value(int64_t rows, int64_t cols, double v)
{
    td_tensor *t = filled(rows, cols, v);
    td_value *val = td_value_tensor(t);
    td_tensor_release(t);
    return val;
}

/* v is a rows x cols tensor whose every element is fill. */
static void check_filled(const td_value *v, int64_t rows, int64_t cols, double fill)
{
    TD_CHECK_MSG(v != NULL && td_value_kind_of(v) == TD_VAL_TENSOR, "expected a tensor, got %s",
                 v ? td_value_kind_name(td_value_kind_of(v)) : "None");
    td_tensor *got = td_value_get_tensor(v), *want = filled(rows, cols, fill);
    char *text = td_value_format(v);
    TD_CHECK_MSG(td_tensor_equal(got, want), "expected a %lldx%lld tensor of %g, got %s", (long long)rows,
                 (long long)cols, fill, text);
    free(text);
    td_tensor_release(want);
}

static void check_int(const td_value *v, int64_t want)
{
    TD_CHECK_MSG(v != NULL && td_value_kind_of(v) == TD_VAL_INT, "expected int %lld, got %s", (long long)want,
                 v ? td_value_kind_name(td_value_kind_of(v)) : "None");
    TD_CHECK_EQ(td_value_get_int(v), want);
}

/* st failed and td_last_error() contains substr. */
#define CHECK_FAILS_WITH(expr, substr)                                                                        \
    do {                                                                                                      \
        td_status chk_st_ = (expr);                                                                           \
        TD_CHECK_MSG(chk_st_ != TD_OK, "%s succeeded, expected an error containing \"%s\"", #expr, (substr)); \
        TD_CHECK_CONTAINS(td_last_error(), (substr));                                                         \
    } while (0)

/* td_rpc_remote on the default agent with the default timeout; args taken (NULL: none). */
static td_rref *remote_on(td_rpc_dest to, const char *fn, td_value *args)
{
    td_rref *r = NULL;
    TD_CHECK_OK(td_rpc_remote(NULL, to, fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(r != NULL);
    td_value_release(args);
    return r;
}

static td_rref *local_rref(td_value *v /* taken */)
{
    td_rref *r = NULL;
    TD_CHECK_OK(td_rref_create(NULL, v, &r));
    TD_CHECK(r != NULL);
    td_value_release(v);
    return r;
}

/* to_here with the default timeout; a new reference. */
static td_value *fetch(td_rref *r)
{
    td_value *v = NULL;
    TD_CHECK_OK(td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, &v));
    return v;
}

static td_value *sync_call(td_rpc_dest to, const char *fn, td_value *args /* taken */)
{
    td_value *res = NULL;
    TD_CHECK_OK(td_rpc_sync(NULL, to, fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &res));
    td_value_release(args);
    return res;
}

static const char *rref_str(const td_rref *r, char *buf, size_t size)
{
    size_t n = td_rref_to_string(r, buf, size);
    TD_CHECK(n < size);
    return buf;
}

static td_rpc_dest owner_dest(const td_rref *r, td_worker_info *info)
{
    TD_CHECK_OK(td_rref_owner(r, info));
    return td_rpc_to_info(info);
}

/* a + b as Python adds ints and tensors (tensor + tensor, tensor + int, int + int). */
static td_status value_add(const td_value *a, const td_value *b, td_value **out)
{
    td_value_kind ka = a ? td_value_kind_of(a) : TD_VAL_NONE, kb = b ? td_value_kind_of(b) : TD_VAL_NONE;
    td_tensor *t = NULL;
    td_status st;
    if (ka == TD_VAL_INT && kb == TD_VAL_INT) {
        *out = td_value_int(td_value_get_int(a) + td_value_get_int(b));
        return TD_OK;
    }
    if (ka == TD_VAL_TENSOR && kb == TD_VAL_TENSOR)
        st = td_tensor_add(td_value_get_tensor(a), td_value_get_tensor(b), &t);
    else if (ka == TD_VAL_TENSOR && kb == TD_VAL_INT)
        st = td_tensor_add_scalar(td_value_get_tensor(a), td_scalar_int(td_value_get_int(b)), &t);
    else if (ka == TD_VAL_INT && kb == TD_VAL_TENSOR)
        st = td_tensor_add_scalar(td_value_get_tensor(b), td_scalar_int(td_value_get_int(a)), &t);
    else
        return td_rpc_raise("TypeError", "unsupported operand type(s) for +: '%s' and '%s'", td_value_kind_name(ka),
                            td_value_kind_name(kb));
    if (st != TD_OK)
        return st;
    *out = td_value_tensor(t);
    td_tensor_release(t);
    return TD_OK;
}

/* The RRef an argument holds, or a TypeError. */
static td_status arg_rref(const td_value *v, const char *fn, td_rref **r)
{
    *r = v ? td_value_get_rref(v) : NULL;
    if (*r == NULL)
        return td_rpc_raise("TypeError", "%s() expects an RRef, got %s", fn,
                            v ? td_value_kind_name(td_value_kind_of(v)) : "None");
    return TD_OK;
}

/* A received user RRef must be confirmed before the function runs (waitForThreadLocalPendingRRefs). */
static td_status require_confirmed(td_rref *r, const char *fn)
{
    if (!td_rref_confirmed_by_owner(r)) {
        char buf[256];
        td_rref_to_string(r, buf, sizeof buf);
        return td_rpc_raise("RuntimeError", "%s() ran before %s was confirmed by its owner", fn, buf);
    }
    return TD_OK;
}

/* ---- the functions workers call -------------------------------------------------------------- */

/* my_function(a, b, c): a + b + c */
static td_status fn_my_function(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[3];
    td_status st = td_rpc_bind("my_function", "a,b,c", args, kwargs, p);
    if (st != TD_OK)
        return st;
    td_value *ab = NULL;
    if ((st = value_add(p[0], p[1], &ab)) != TD_OK)
        return st;
    st = value_add(ab, p[2], result);
    td_value_release(ab);
    return st;
}

/* identity(x): x */
static td_status fn_identity(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    td_status st = td_rpc_bind("identity", "x", args, kwargs, p);
    if (st == TD_OK)
        *result = td_value_retain((td_value *)p[0]);
    return st;
}

/* my_rref_function(rref_a, rref_b): rref_a.to_here() + rref_b.to_here() */
static td_status fn_my_rref_function(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                     td_value **result)
{
    (void)call;
    const td_value *p[2];
    td_status st = td_rpc_bind("my_rref_function", "rref_a,rref_b", args, kwargs, p);
    if (st != TD_OK)
        return st;
    td_rref *a, *b;
    if ((st = arg_rref(p[0], "my_rref_function", &a)) != TD_OK || (st = arg_rref(p[1], "my_rref_function", &b)) != TD_OK)
        return st;
    if ((st = require_confirmed(a, "my_rref_function")) != TD_OK || (st = require_confirmed(b, "my_rref_function")) != TD_OK)
        return st;
    td_value *va = NULL, *vb = NULL;
    if ((st = td_rref_to_here(a, TD_RPC_DEFAULT_TIMEOUT, &va)) == TD_OK &&
        (st = td_rref_to_here(b, TD_RPC_DEFAULT_TIMEOUT, &vb)) == TD_OK)
        st = value_add(va, vb, result);
    td_value_release(va);
    td_value_release(vb);
    return st;
}

/* add_rref_to_value(rref, value): rref.to_here() + value */
static td_status fn_add_rref_to_value(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                      td_value **result)
{
    (void)call;
    const td_value *p[2];
    td_status st = td_rpc_bind("add_rref_to_value", "rref,value", args, kwargs, p);
    if (st != TD_OK)
        return st;
    td_rref *r;
    if ((st = arg_rref(p[0], "add_rref_to_value", &r)) != TD_OK || (st = require_confirmed(r, "add_rref_to_value")) != TD_OK)
        return st;
    td_value *v = NULL;
    if ((st = td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, &v)) == TD_OK)
        st = value_add(v, p[1], result);
    td_value_release(v);
    return st;
}

/* check_rref_confirmed(rref): rref.confirmed_by_owner() */
static td_status fn_check_rref_confirmed(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                         td_value **result)
{
    (void)call;
    const td_value *p[1];
    td_status st = td_rpc_bind("check_rref_confirmed", "rref", args, kwargs, p);
    td_rref *r;
    if (st != TD_OK || (st = arg_rref(p[0], "check_rref_confirmed", &r)) != TD_OK)
        return st;
    *result = td_value_bool(td_rref_confirmed_by_owner(r));
    return TD_OK;
}

/* MyClass(a): a record (a,) */
static td_status fn_myclass(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    td_status st = td_rpc_bind("MyClass", "a", args, kwargs, p);
    if (st == TD_OK)
        *result = td_value_record_of(MYCLASS_TAG, 1, td_value_retain((td_value *)p[0]));
    return st;
}

static td_value *myclass_new(int64_t a) { return td_value_record_of(MYCLASS_TAG, 1, td_value_int(a)); }

/* get_rref_list(values): [RRef(MyClass(a)) for a in values] */
static td_status fn_get_rref_list(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    const td_value *p[1];
    td_status st = td_rpc_bind("get_rref_list", "values", args, kwargs, p);
    if (st != TD_OK)
        return st;
    td_value *list = td_value_list_new();
    for (size_t i = 0; i < td_value_len(p[0]); i++) {
        td_value *obj = myclass_new(td_value_get_int(td_value_at(p[0], i)));
        td_rref *r = NULL;
        st = td_rref_create(td_rpc_call_agent(call), obj, &r);
        td_value_release(obj);
        if (st != TD_OK) {
            td_value_release(list);
            return st;
        }
        td_value_list_append(list, td_rref_value(r));
        td_rref_release(r);
    }
    *result = list;
    return TD_OK;
}

/* _call_method_on_rref(method, rref, *args): method(rref.local_value(), *args), for MyClass's
 * increment_value and get_value (the state stays on the owner). */
static td_status fn_call_method_on_rref(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                        td_value **result)
{
    (void)call;
    (void)kwargs;
    if (td_value_len(args) < 2)
        return td_rpc_raise("TypeError", "_call_method_on_rref() takes at least 2 arguments");
    const char *method = td_value_get_string(td_value_at(args, 0), NULL);
    td_rref *r;
    td_status st = arg_rref(td_value_at(args, 1), "_call_method_on_rref", &r);
    if (st != TD_OK)
        return st;
    td_value *obj = NULL;
    if ((st = td_rref_local_value(r, &obj)) != TD_OK)
        return st;
    if (td_value_kind_of(obj) != TD_VAL_RECORD || td_value_record_tag(obj) != MYCLASS_TAG) {
        td_value_release(obj);
        return td_rpc_raise("TypeError", "_call_method_on_rref() expects a MyClass");
    }
    int64_t a = td_value_get_int(td_value_at(obj, 0));
    if (method && strcmp(method, "increment_value") == 0 && td_value_len(args) == 3) {
        td_value_set(obj, 0, td_value_int(a + td_value_get_int(td_value_at(args, 2))));
        *result = NULL;
    } else if (method && strcmp(method, "get_value") == 0) {
        *result = td_value_int(a);
    } else {
        st = td_rpc_raise("AttributeError", "type object 'MyClass' has no attribute '%s'", method ? method : "?");
    }
    td_value_release(obj);
    return st;
}

/* set_global_rref(rref) / clear_global_rref(): the callee keeps the RRef in a global. */
static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static td_rref *global_rref;

static td_status fn_set_global_rref(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)result;
    const td_value *p[1];
    td_status st = td_rpc_bind("set_global_rref", "rref", args, kwargs, p);
    td_rref *r;
    if (st != TD_OK || (st = arg_rref(p[0], "set_global_rref", &r)) != TD_OK)
        return st;
    pthread_mutex_lock(&global_lock);
    td_rref *old = global_rref;
    global_rref = td_rref_retain(r);
    pthread_mutex_unlock(&global_lock);
    td_rref_release(old);
    return TD_OK;
}

static td_status fn_clear_global_rref(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                      td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    (void)result;
    pthread_mutex_lock(&global_lock);
    td_rref *old = global_rref;
    global_rref = NULL;
    pthread_mutex_unlock(&global_lock);
    td_rref_release(old);
    return TD_OK;
}

/* _slow_add(x, y): sleeps 1 s, then x + y */
static td_status fn_slow_add(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    td_status st = td_rpc_bind("_slow_add", "x,y", args, kwargs, p);
    if (st != TD_OK)
        return st;
    rpc_test_sleep_ms(1000);
    return value_add(p[0], p[1], result);
}

/* my_sleep_func(seconds): sleeps, returns 1 */
static td_status fn_my_sleep_func(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    td_status st = td_rpc_bind("my_sleep_func", "seconds", args, kwargs, p);
    if (st != TD_OK)
        return st;
    rpc_test_sleep_ms((int)(td_value_get_int(p[0]) * 1000));
    *result = td_value_int(1);
    return TD_OK;
}

/* nested_rref(dst): (remote(dst, add, (ones(2, 2), 1)), remote(dst, add, (ones(2, 2), 2))) */
static td_status fn_nested_rref(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    const td_value *p[1];
    td_status st = td_rpc_bind("nested_rref", "dst", args, kwargs, p);
    if (st != TD_OK)
        return st;
    td_rref *r[2] = {NULL, NULL};
    for (int i = 0; i < 2 && st == TD_OK; i++) {
        td_value *a = td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(i + 1));
        st = td_rpc_remote(td_rpc_call_agent(call), td_rpc_to_value(p[0]), "aten::add", a, NULL,
                           TD_RPC_DEFAULT_TIMEOUT, &r[i]);
        td_value_release(a);
    }
    if (st == TD_OK)
        *result = td_value_tuple_of(2, td_rref_value(r[0]), td_rref_value(r[1]));
    td_rref_release(r[0]);
    td_rref_release(r[1]);
    return st;
}

/* rref_forward_chain(dst, world_size, rref, ttl): [remote(dst, rref_forward_chain, (next, ws, rref,
 * ttl - 1))] while ttl > 0, else rref.to_here(). */
static td_status forward_chain(td_rpc_agent *agent, int64_t dst, int64_t world_size, const td_value *rref_v,
                               int64_t ttl, td_value **result)
{
    if (ttl > 0) {
        td_value *a = td_value_tuple_of(4, td_value_int((dst + 1) % world_size), td_value_int(world_size),
                                        td_value_retain((td_value *)rref_v), td_value_int(ttl - 1));
        td_rref *ret = NULL;
        td_status st = td_rpc_remote(agent, td_rpc_to_id(dst), "rref_forward_chain", a, NULL, TD_RPC_DEFAULT_TIMEOUT,
                                     &ret);
        td_value_release(a);
        if (st != TD_OK)
            return st;
        td_value *list = td_value_list_new();
        td_value_list_append(list, td_rref_value(ret));
        td_rref_release(ret);
        *result = list;
        return TD_OK;
    }
    td_rref *r;
    td_status st = arg_rref(rref_v, "rref_forward_chain", &r);
    if (st == TD_OK)
        st = td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, result);
    return st;
}

static td_status fn_rref_forward_chain(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                       td_value **result)
{
    const td_value *p[4];
    td_status st = td_rpc_bind("rref_forward_chain", "dst,world_size,rref,ttl", args, kwargs, p);
    if (st != TD_OK)
        return st;
    return forward_chain(td_rpc_call_agent(call), td_value_get_int(p[0]), td_value_get_int(p[1]), p[2],
                         td_value_get_int(p[3]), result);
}

/* rpc_return_rref(dst): remote(dst, add, (ones(2, 2), 1)) */
static td_status fn_rpc_return_rref(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                    td_value **result)
{
    const td_value *p[1];
    td_status st = td_rpc_bind("rpc_return_rref", "dst", args, kwargs, p);
    if (st != TD_OK)
        return st;
    td_value *a = td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1));
    td_rref *r = NULL;
    st = td_rpc_remote(td_rpc_call_agent(call), td_rpc_to_value(p[0]), "aten::add", a, NULL, TD_RPC_DEFAULT_TIMEOUT, &r);
    td_value_release(a);
    if (st == TD_OK)
        *result = td_rref_value(r);
    td_rref_release(r);
    return st;
}

/* ---- the stress test's functions --------------------------------------------------------------- */

/* relay(rref, hops, expect, delay_us): after a short delay, passes rref on to the next worker
 * (hops - 1) or, at the end, fetches it; returns the value, which must equal expect. */
static td_status fn_relay(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    const td_value *p[4];
    td_status st = td_rpc_bind("relay", "rref,hops,expect,delay_us", args, kwargs, p);
    td_rref *r;
    if (st != TD_OK || (st = arg_rref(p[0], "relay", &r)) != TD_OK || (st = require_confirmed(r, "relay")) != TD_OK)
        return st;
    int64_t delay_us = td_value_get_int(p[3]);
    if (delay_us > 0) {
        struct timespec ts = {0, (long)delay_us * 1000L};
        nanosleep(&ts, NULL);
    }
    td_rpc_agent *agent = td_rpc_call_agent(call);
    int64_t hops = td_value_get_int(p[1]);
    if (hops > 0) {
        td_worker_info me;
        if ((st = td_rpc_worker_info(agent, NULL, &me)) != TD_OK)
            return st;
        size_t n = 0;
        td_worker_info infos[8];
        if ((st = td_rpc_worker_infos(agent, infos, 8, &n)) != TD_OK)
            return st;
        td_value *a = td_value_tuple_of(4, td_value_retain((td_value *)p[0]), td_value_int(hops - 1),
                                        td_value_retain((td_value *)p[2]), td_value_int(delay_us / 2));
        st = td_rpc_sync(agent, td_rpc_to_id((me.id + 1) % (int64_t)n), "relay", a, NULL, TD_RPC_DEFAULT_TIMEOUT, result);
        td_value_release(a);
        return st;
    }
    if ((st = td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, result)) != TD_OK)
        return st;
    if (!*result || !td_value_equal(*result, p[2])) {
        char *got = *result ? td_value_format(*result) : NULL;
        st = td_rpc_raise("RuntimeError", "relay fetched %s, expected %lld", got ? got : "None",
                          (long long)td_value_get_int(p[2]));
        free(got);
        td_value_release(*result);
        *result = NULL;
    }
    return st;
}

/* stash(rref) keeps the RRef on the callee until drop_stash(). */
static pthread_mutex_t stash_lock = PTHREAD_MUTEX_INITIALIZER;
static td_rref *stash[512];
static int stash_n;

static td_status fn_stash(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)result;
    const td_value *p[1];
    td_status st = td_rpc_bind("stash", "rref", args, kwargs, p);
    td_rref *r;
    if (st != TD_OK || (st = arg_rref(p[0], "stash", &r)) != TD_OK)
        return st;
    pthread_mutex_lock(&stash_lock);
    if (stash_n < (int)(sizeof stash / sizeof stash[0]))
        stash[stash_n++] = td_rref_retain(r);
    else
        st = td_rpc_raise("RuntimeError", "stash full");
    pthread_mutex_unlock(&stash_lock);
    return st;
}

static int drop_stash(void)
{
    pthread_mutex_lock(&stash_lock);
    int n = stash_n;
    for (int i = 0; i < n; i++)
        td_rref_release(stash[i]);
    stash_n = 0;
    pthread_mutex_unlock(&stash_lock);
    return n;
}

/* ---- set-up ------------------------------------------------------------------------------------ */

static void register_functions(void)
{
    const rpc_test_function fns[] = {
        {"my_function", fn_my_function, NULL, NULL},
        {"identity", fn_identity, NULL, NULL},
        {"my_rref_function", fn_my_rref_function, NULL, NULL},
        {"add_rref_to_value", fn_add_rref_to_value, NULL, NULL},
        {"check_rref_confirmed", fn_check_rref_confirmed, NULL, NULL},
        {"MyClass", fn_myclass, NULL, NULL},
        {"get_rref_list", fn_get_rref_list, NULL, NULL},
        {"_call_method_on_rref", fn_call_method_on_rref, NULL, NULL},
        {"set_global_rref", fn_set_global_rref, NULL, NULL},
        {"clear_global_rref", fn_clear_global_rref, NULL, NULL},
        {"raise_func", rpc_test_raise, NULL, NULL},
        {"_slow_add", fn_slow_add, NULL, NULL},
        {"my_sleep_func", fn_my_sleep_func, NULL, NULL},
        {"nested_rref", fn_nested_rref, NULL, NULL},
        {"rref_forward_chain", fn_rref_forward_chain, NULL, NULL},
        {"rpc_return_rref", fn_rpc_return_rref, NULL, NULL},
        {"relay", fn_relay, NULL, NULL},
        {"stash", fn_stash, NULL, NULL},
    };
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    td_status st = td_rpc_register_type(MYCLASS_TAG, "MyClass");
    TD_CHECK_MSG(st == TD_OK || st == TD_ERR_ALREADY, "td_rpc_register_type: %s", td_last_error());
}

static void rpc_up(td_test_ctx *ctx)
{
    register_functions();
    rpc_test_init(ctx, NULL);
}

/* Every test ends here: its RRefs released, the counters settle, and the graceful shutdown (with
 * the leak check on) succeeds. */
static void rpc_down(void)
{
    rpc_test_wait_rrefs_flushed();
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

static void barrier(void) { TD_CHECK_OK(td_rpc_barrier(NULL, NULL, 0, 60000)); }

/* ---- C10: ids, string forms, owner and user ---------------------------------------------------- */

/* test_rref_str: the first id of a fresh agent is 0; remote() takes the RRef id before the fork id. */
TD_TEST(rref_str, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    char buf[256], want[256];
    td_rref *rref1 = local_rref(td_value_int(ctx->rank));
    snprintf(want, sizeof want, "OwnerRRef(GloballyUniqueId(created_on=%d, local_id=0))", ctx->rank);
    TD_CHECK_STR_EQ(rref_str(rref1, buf, sizeof buf), want);
    TD_CHECK(td_rref_is_owner(rref1));
    TD_CHECK(td_rref_confirmed_by_owner(rref1));

    td_rref *rref2 = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "aten::add",
                               td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1)));
    snprintf(want, sizeof want,
             "UserRRef(RRefId = GloballyUniqueId(created_on=%d, local_id=1), ForkId = GloballyUniqueId(created_on=%d, "
             "local_id=2))",
             ctx->rank, ctx->rank);
    TD_CHECK_STR_EQ(rref_str(rref2, buf, sizeof buf), want);
    TD_CHECK(!td_rref_is_owner(rref2));
    /* Truncation: the full length comes back, the buffer holds a NUL-terminated prefix. */
    char small[12];
    TD_CHECK_EQ(td_rref_to_string(rref2, small, sizeof small), strlen(want));
    TD_CHECK_EQ(strlen(small), sizeof small - 1);
    TD_CHECK(strncmp(small, want, sizeof small - 1) == 0);
    TD_CHECK_EQ(td_rref_to_string(rref2, NULL, 0), strlen(want));

    td_value *v = fetch(rref2);
    check_filled(v, 2, 2, 2);
    td_value_release(v);
    /* to_here returning does not mean the confirmation was processed: flush first. */
    rpc_test_wait_rrefs_flushed();
    TD_CHECK(td_rref_confirmed_by_owner(rref2));
    td_rref_release(rref2);
    td_rref_release(rref1);
    rpc_down();
}

/* test_local_rref_no_fork: RRef(35).local_value() == 35, with no message sent. */
TD_TEST(local_rref_no_fork, .world_size = 1, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = local_rref(td_value_int(35));
    td_value *v = NULL;
    TD_CHECK_OK(td_rref_local_value(r, &v));
    check_int(v, 35);
    td_value_release(v);
    v = fetch(r); /* to_here on the owner: the value itself */
    check_int(v, 35);
    td_value_release(v);
    td_worker_info owner, me;
    TD_CHECK_OK(td_rref_owner(r, &owner));
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    TD_CHECK(td_worker_info_equal(&owner, &me));
    TD_CHECK_STR_EQ(owner.name, "worker0");
    /* The creation future is completed at once, with None. */
    td_future *f = td_rref_get_future(r);
    TD_CHECK(f != NULL);
    TD_CHECK(td_future_is_completed(f));
    TD_CHECK_OK(td_future_status(f));
    TD_CHECK(td_future_value(f) == NULL);
    td_future_release(f);
    /* A never-shared owner RRef is not in the owner table. */
    TD_CHECK_EQ(rpc_test_debug_int("num_owner_rrefs"), 0);
    TD_CHECK_EQ(rpc_test_debug_int("num_forks"), 0);
    td_rref_release(r);
    rpc_down();
}

/* test_local_value_not_on_owner: the exact error, with the first ids of a fresh agent (0 and 1). */
TD_TEST(local_value_not_on_owner, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    int next = next_rank(ctx, 1);
    td_rref *r = remote_on(td_rpc_to_id(next), "aten::add", td_value_tuple_of(2, tensor_value(1, 1, 1), tensor_value(1, 1, 1)));
    char want[512];
    snprintf(want, sizeof want,
             "For UserRRef(rref_id=GloballyUniqueId(created_on=%d, local_id=0), fork_id=GloballyUniqueId(created_on=%d, "
             "local_id=1)), can't call localValue() on user WorkerInfo(id=%d, name=worker%d). Call it on owner "
             "WorkerInfo(id=%d, name=worker%d)",
             ctx->rank, ctx->rank, ctx->rank, ctx->rank, next, next);
    td_value *v = NULL;
    CHECK_FAILS_WITH(td_rref_local_value(r, &v), want);
    TD_CHECK(v == NULL);
    td_worker_info owner;
    TD_CHECK_OK(td_rref_owner(r, &owner));
    TD_CHECK_EQ(owner.id, next);
    char name[32];
    snprintf(name, sizeof name, "worker%d", next);
    TD_CHECK_STR_EQ(owner.name, name);
    v = fetch(r);
    check_filled(v, 1, 1, 2);
    td_value_release(v);
    td_rref_release(r);
    rpc_down();
}

/* test_builtin_remote_self / test_self_py_udf_remote: remote() to oneself makes this worker the
 * owner; local_value works and returns the owner's value. */
TD_TEST(remote_self, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    td_rref *r = remote_on(td_rpc_to_info(&me), "aten::add", td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1)));
    TD_CHECK(td_rref_is_owner(r));
    td_future *f = td_rref_get_future(r);
    TD_CHECK_OK(td_future_wait(f, 0));
    td_future_release(f);
    td_value *v = NULL;
    TD_CHECK_OK(td_rref_local_value(r, &v));
    check_filled(v, 2, 2, 2);
    td_value_release(v);
    td_rref *u = remote_on(td_rpc_to_info(&me), "my_function",
                           td_value_tuple_of(3, tensor_value(2, 2, 1), td_value_int(1), td_value_int(3)));
    v = fetch(u);
    check_filled(v, 2, 2, 5);
    td_value_release(v);
    td_rref_release(u);
    td_rref_release(r);
    rpc_down();
}

/* test_rref_get_future: the creation future of a remote completes with None once the owner holds
 * the value; a received RRef's is completed at once. */
TD_TEST(rref_get_future, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "aten::add", td_value_tuple_of(2, tensor_value(1, 1, 1), td_value_int(1)));
    td_future *f = td_rref_get_future(r);
    TD_CHECK(f != NULL);
    TD_CHECK_OK(td_future_wait(f, 0));
    TD_CHECK(td_future_value(f) == NULL);
    td_future_release(f);
    td_value *v = fetch(r);
    check_filled(v, 1, 1, 2);
    td_value_release(v);
    /* A received RRef (returned by rpc_return_rref from the worker after next). */
    char dst[32];
    snprintf(dst, sizeof dst, "worker%d", next_rank(ctx, 2));
    td_value *ret = sync_call(td_rpc_to_id(next_rank(ctx, 1)), "rpc_return_rref", td_value_tuple_of(1, td_value_string(dst)));
    td_rref *got = td_value_get_rref(ret);
    TD_CHECK(got != NULL);
    f = td_rref_get_future(got);
    TD_CHECK(td_future_is_completed(f));
    TD_CHECK_OK(td_future_status(f));
    td_future_release(f);
    v = fetch(got);
    check_filled(v, 2, 2, 2);
    td_value_release(v);
    td_value_release(ret);
    td_rref_release(r);
    rpc_down();
}

/* test_remote_with_exception: the function's failure fails the creation future and to_here with
 * the remote ValueError; the remote call itself succeeded. */
TD_TEST(remote_with_exception, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "raise_func", NULL);
    td_future *f = td_rref_get_future(r);
    TD_CHECK_ERR(td_future_wait(f, 0), TD_ERR_REMOTE, "Expected error");
    TD_CHECK_STR_EQ(td_future_error_type(f), "ValueError");
    td_future_release(f);
    td_value *v = NULL;
    TD_CHECK_ERR(td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, &v), TD_ERR_REMOTE, "Expected error");
    TD_CHECK(v == NULL);
    td_rref_release(r);
    /* To oneself: the owner's creation fails the same way (a TypeError from argument binding). */
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    r = remote_on(td_rpc_to_info(&me), "my_function", td_value_tuple_of(1, td_value_int(10)));
    TD_CHECK_ERR(td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, &v), TD_ERR_REMOTE,
                 "my_function() missing 2 required positional arguments");
    td_rref_release(r);
    rpc_down();
}

/* ---- C11: sharing ------------------------------------------------------------------------------- */

/* test_return_local_rrefs: the callee returns RRefs it owns; the caller calls methods through
 * rref.owner(). */
TD_TEST(return_local_rrefs, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    int dst = next_rank(ctx, 1);
    td_value *values = td_value_list_new();
    for (int i = 1; i <= 3; i++)
        td_value_list_append(values, td_value_int(i));
    td_value *list = sync_call(td_rpc_to_id(dst), "get_rref_list", td_value_tuple_of(1, values));
    TD_CHECK_EQ(td_value_kind_of(list), TD_VAL_LIST);
    TD_CHECK_EQ(td_value_len(list), 3);
    for (size_t i = 0; i < 3; i++) {
        td_rref *r = td_value_get_rref(td_value_at(list, i));
        TD_CHECK(r != NULL);
        TD_CHECK(!td_rref_is_owner(r));
        td_worker_info owner;
        td_rpc_dest to = owner_dest(r, &owner);
        TD_CHECK_EQ(owner.id, dst);
        td_value *res = sync_call(to, "_call_method_on_rref",
                                  td_value_tuple_of(3, td_value_string("increment_value"), td_rref_value(r), td_value_int(10)));
        TD_CHECK(res == NULL);
    }
    for (size_t i = 0; i < 3; i++) {
        td_rref *r = td_value_get_rref(td_value_at(list, i));
        td_worker_info owner;
        td_value *res = sync_call(owner_dest(r, &owner), "_call_method_on_rref",
                                  td_value_tuple_of(2, td_value_string("get_value"), td_rref_value(r)));
        check_int(res, 11 + (int64_t)i);
        td_value_release(res);
    }
    td_value_release(list);
    rpc_down();
}

/* test_pass_local_rrefs: the owner passes RRef(40) to a user in all three modes; the user fetches
 * it back from the owner while the owner's caller waits. */
TD_TEST(pass_local_rrefs, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rpc_dest dst = td_rpc_to_id(next_rank(ctx, 1));
    td_rref *r = local_rref(td_value_int(40));
    td_value *res = sync_call(dst, "add_rref_to_value", td_value_tuple_of(2, td_rref_value(r), td_value_int(50)));
    check_int(res, 90);
    td_value_release(res);

    td_value *args = td_value_tuple_of(2, td_rref_value(r), td_value_int(50));
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, dst, "add_rref_to_value", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    TD_CHECK_OK(td_future_wait(f, 0));
    check_int(td_future_value(f), 90);
    td_future_release(f);

    td_rref *rr = remote_on(dst, "add_rref_to_value", args);
    res = fetch(rr);
    check_int(res, 90);
    td_value_release(res);
    td_rref_release(rr);
    td_rref_release(r);
    rpc_down();
}

/* test_py_rref_args: a user passes two RRefs to their owner, which resolves them to its own
 * values: (ones + 1) + (ones + 2). */
TD_TEST(py_rref_args, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rpc_dest dst = td_rpc_to_id(next_rank(ctx, 1));
    td_rref *a = remote_on(dst, "aten::add", td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1)));
    td_rref *b = remote_on(dst, "aten::add", td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(2)));
    td_rref *c = remote_on(dst, "my_rref_function", td_value_tuple_of(2, td_rref_value(a), td_rref_value(b)));
    td_value *v = fetch(c);
    check_filled(v, 2, 2, 5); /* ones * 2 + 3 */
    td_value_release(v);
    /* test_py_rpc_rref_args: the same through rpc_sync. */
    v = sync_call(dst, "my_rref_function", td_value_tuple_of(2, td_rref_value(a), td_rref_value(b)));
    check_filled(v, 2, 2, 5);
    td_value_release(v);
    td_rref_release(c);
    td_rref_release(b);
    td_rref_release(a);
    rpc_down();
}

/* test_py_rref_args_user_share: owner = rank + 1, user = rank + 2; the user gets child forks that
 * the owner confirms before my_rref_function runs. */
TD_TEST(py_rref_args_user_share, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rpc_dest owner = td_rpc_to_id(next_rank(ctx, 1)), user = td_rpc_to_id(next_rank(ctx, 2));
    td_rref *a = remote_on(owner, "my_function", td_value_tuple_of(3, tensor_value(2, 2, 1), td_value_int(1), td_value_int(2)));
    td_rref *b = remote_on(owner, "my_function", td_value_tuple_of(3, tensor_value(2, 2, 1), td_value_int(3), td_value_int(4)));
    td_rref *c = remote_on(user, "my_rref_function", td_value_tuple_of(2, td_rref_value(a), td_rref_value(b)));
    /* Dropping the parents right away: a delete must not overtake the child's fork. */
    td_rref_release(a);
    td_rref_release(b);
    td_value *v = fetch(c);
    check_filled(v, 2, 2, 12); /* ones * 2 + 10 */
    td_value_release(v);
    td_rref_release(c);
    rpc_down();
}

/* test_user_rrefs_confirmed (part 2 C8): owner = rank + 2, user = rank, callee = rank + 1; the
 * callee's copy is confirmed inside the function, in rpc_sync and remote. */
TD_TEST(user_rrefs_confirmed, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = remote_on(td_rpc_to_id(next_rank(ctx, 2)), "aten::add", td_value_tuple_of(2, td_value_int(3), td_value_int(4)));
    td_value *res = sync_call(td_rpc_to_id(next_rank(ctx, 1)), "check_rref_confirmed", td_value_tuple_of(1, td_rref_value(r)));
    TD_CHECK(res && td_value_kind_of(res) == TD_VAL_BOOL && td_value_get_bool(res));
    td_value_release(res);
    td_rref *rr = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "check_rref_confirmed", td_value_tuple_of(1, td_rref_value(r)));
    res = fetch(rr);
    TD_CHECK(res && td_value_kind_of(res) == TD_VAL_BOOL && td_value_get_bool(res));
    td_value_release(res);
    td_rref_release(rr);
    td_rref_release(r);
    rpc_down();
}

/* test_remote_same_worker: (ones(n, n) + 2) + (ones(n, n) + 1) on their owner. */
TD_TEST(remote_same_worker, .world_size = 4, .timeout_s = 60)
{
    rpc_up(ctx);
    int64_t n = ctx->rank + 1;
    td_rpc_dest dst = td_rpc_to_id(next_rank(ctx, 1));
    td_rref *a = remote_on(dst, "aten::add", td_value_tuple_of(2, tensor_value(n, n, 1), td_value_int(2)));
    td_rref *b = remote_on(dst, "aten::add", td_value_tuple_of(2, tensor_value(n, n, 1), td_value_int(1)));
    td_rref *c = remote_on(dst, "my_rref_function", td_value_tuple_of(2, td_rref_value(a), td_rref_value(b)));
    td_value *v = fetch(c);
    check_filled(v, n, n, 5);
    td_value_release(v);
    td_rref_release(c);
    td_rref_release(b);
    td_rref_release(a);
    rpc_down();
}

/* _self_remote_rref_as_rpc_arg: an RRef this worker owns (remote to self) passed in rpc_async and
 * rpc_sync to dst (itself, or the next worker). */
static void self_remote_rref_as_rpc_arg(td_rpc_dest dst)
{
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    /* x = ones(2, 2), y = 1, z = 3 */
    td_rref *r = remote_on(td_rpc_to_info(&me), "my_function",
                           td_value_tuple_of(3, tensor_value(2, 2, 1), td_value_int(1), td_value_int(3)));
    TD_CHECK(td_rref_is_owner(r));
    td_value *args = td_value_tuple_of(2, td_rref_value(r), tensor_value(2, 2, 1));
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, dst, "add_rref_to_value", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    td_value_release(args);
    td_value *ret = sync_call(dst, "add_rref_to_value", td_value_tuple_of(2, td_rref_value(r), tensor_value(2, 2, 2)));
    check_filled(ret, 2, 2, 7); /* x + y + z + x + y */
    td_value_release(ret);
    TD_CHECK_OK(td_future_wait(f, 0));
    check_filled(td_future_value(f), 2, 2, 6); /* x + y + z + x */
    td_future_release(f);
    td_rref_release(r);
}

/* _self_remote_rref_as_remote_arg: the same through remote(). */
static void self_remote_rref_as_remote_arg(td_rpc_dest dst)
{
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    td_rref *r = remote_on(td_rpc_to_info(&me), "my_function",
                           td_value_tuple_of(3, tensor_value(2, 2, 1), td_value_int(1), td_value_int(3)));
    td_rref *ret = remote_on(dst, "add_rref_to_value", td_value_tuple_of(2, td_rref_value(r), tensor_value(2, 2, 1)));
    td_value *v = fetch(ret);
    check_filled(v, 2, 2, 6);
    td_value_release(v);
    td_rref_release(ret);
    td_rref_release(r);
}

TD_TEST(self_remote_rref_as_self_rpc_arg, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    self_remote_rref_as_rpc_arg(td_rpc_to_info(&me));
    rpc_down();
    /* owner -> itself: the fork added while encoding is dropped on receipt, so no leak fires (the
     * shutdown above checked). */
}

TD_TEST(self_remote_rref_as_rpc_arg, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    self_remote_rref_as_rpc_arg(td_rpc_to_id(next_rank(ctx, 1)));
    rpc_down();
}

TD_TEST(self_remote_rref_as_self_remote_arg, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    self_remote_rref_as_remote_arg(td_rpc_to_info(&me));
    rpc_down();
}

TD_TEST(self_remote_rref_as_remote_arg, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    self_remote_rref_as_remote_arg(td_rpc_to_id(next_rank(ctx, 1)));
    rpc_down();
}

/* test_rref_forward_chain: the RRef travels ttl = 8 hops, each hop returning [RRef of the next]. */
TD_TEST(rref_forward_chain, .world_size = 4, .timeout_s = 90)
{
    rpc_up(ctx);
    enum { TTL = 8 };
    int64_t n = ctx->rank + 1;
    int dst = next_rank(ctx, 1);
    td_rref *r = remote_on(td_rpc_to_id(dst), "aten::add", td_value_tuple_of(2, tensor_value(n, n, 1), td_value_int(1)));
    td_value *rv = td_rref_value(r);
    td_value *ret = NULL;
    td_rpc_agent *agent = rpc_test_default_agent();
    TD_CHECK_OK(forward_chain(agent, dst, ctx->world_size, rv, TTL, &ret));
    td_value_release(rv);
    for (int i = 0; i < TTL; i++) {
        TD_CHECK_MSG(ret && td_value_kind_of(ret) == TD_VAL_LIST, "hop %d: expected a list", i);
        TD_CHECK_EQ(td_value_len(ret), 1);
        td_rref *inner = td_value_get_rref(td_value_at(ret, 0));
        TD_CHECK(inner != NULL);
        td_value *next = fetch(inner);
        td_value_release(ret);
        ret = next;
    }
    check_filled(ret, n, n, 2);
    td_value_release(ret);
    td_rref_release(r);
    rpc_down();
}

/* test_nested_rref: a remote function returns a tuple of two RRefs owned by a third worker. */
static void nested_rref_once(td_test_ctx *ctx, td_rref **out)
{
    char dst2[32];
    snprintf(dst2, sizeof dst2, "worker%d", next_rank(ctx, 2));
    *out = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "nested_rref", td_value_tuple_of(1, td_value_string(dst2)));
}

static void check_nested(td_test_ctx *ctx, td_rref *rref_of_rrefs)
{
    td_value *rrefs = fetch(rref_of_rrefs);
    TD_CHECK(rrefs != NULL);
    TD_CHECK_EQ(td_value_len(rrefs), 2);
    for (size_t i = 0; i < 2; i++) {
        td_rref *r = td_value_get_rref(td_value_at(rrefs, i));
        TD_CHECK(r != NULL);
        td_worker_info owner;
        TD_CHECK_OK(td_rref_owner(r, &owner));
        TD_CHECK_EQ(owner.id, next_rank(ctx, 2));
        td_value *v = fetch(r);
        check_filled(v, 2, 2, 2 + (double)i);
        td_value_release(v);
    }
    td_value_release(rrefs);
}

TD_TEST(nested_rref, .world_size = 3, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = NULL;
    nested_rref_once(ctx, &r);
    check_nested(ctx, r);
    td_rref_release(r);
    rpc_down();
}

/* test_nested_rref_stress: 20 at once. */
TD_TEST(nested_rref_stress, .world_size = 4, .timeout_s = 120)
{
    rpc_up(ctx);
    enum { N = 20 };
    td_rref *all[N];
    for (int i = 0; i < N; i++)
        nested_rref_once(ctx, &all[i]);
    for (int i = 0; i < N; i++) {
        check_nested(ctx, all[i]);
        td_rref_release(all[i]);
    }
    rpc_down();
}

/* test_call_method_on_rref: MyClass(10), incremented by 2, 5 and 7 through rref.owner() in the
 * three modes, is 24. */
TD_TEST(call_method_on_rref, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rpc_dest dst = td_rpc_to_id(next_rank(ctx, 1));
    td_rref *r = remote_on(dst, "MyClass", td_value_tuple_of(1, td_value_int(10)));
    td_worker_info owner;
    td_rpc_dest to = owner_dest(r, &owner);
    TD_CHECK_EQ(owner.id, next_rank(ctx, 1));

    td_value *res = sync_call(to, "_call_method_on_rref",
                              td_value_tuple_of(3, td_value_string("increment_value"), td_rref_value(r), td_value_int(2)));
    TD_CHECK(res == NULL);

    td_value *args = td_value_tuple_of(3, td_value_string("increment_value"), td_rref_value(r), td_value_int(5));
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, to, "_call_method_on_rref", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    td_value_release(args);
    TD_CHECK_OK(td_future_wait(f, 0));
    TD_CHECK(td_future_value(f) == NULL);
    td_future_release(f);

    td_rref *rr = remote_on(to, "_call_method_on_rref",
                            td_value_tuple_of(3, td_value_string("increment_value"), td_rref_value(r), td_value_int(7)));
    res = fetch(rr);
    TD_CHECK(res == NULL);
    td_rref_release(rr);

    res = sync_call(dst, "_call_method_on_rref", td_value_tuple_of(2, td_value_string("get_value"), td_rref_value(r)));
    check_int(res, 24);
    td_value_release(res);
    td_rref_release(r);
    rpc_down();
}

/* test_owner_equality: owners compare as WorkerInfos. */
TD_TEST(owner_equality, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *a = local_rref(td_value_int(40)), *b = local_rref(td_value_int(50));
    td_rpc_dest other = td_rpc_to_id(next_rank(ctx, 1));
    td_rref *other_a = remote_on(other, "aten::add", td_value_tuple_of(2, tensor_value(1, 1, 1), td_value_int(1)));
    td_rref *other_b = remote_on(other, "aten::add", td_value_tuple_of(2, tensor_value(1, 1, 1), td_value_int(1)));
    td_value *v = fetch(other_a);
    td_value_release(v);
    v = fetch(other_b);
    td_value_release(v);

    td_worker_info oa, ob, ooa, oob, me;
    TD_CHECK_OK(td_rref_owner(a, &oa));
    TD_CHECK_OK(td_rref_owner(b, &ob));
    TD_CHECK_OK(td_rref_owner(other_a, &ooa));
    TD_CHECK_OK(td_rref_owner(other_b, &oob));
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    td_value *oa_v = td_worker_info_value(&oa), *twenty_three = td_value_int(23);
    TD_CHECK(!td_value_equal(oa_v, twenty_three)); /* a.owner() != 23 */
    td_value_release(twenty_three);
    td_value_release(oa_v);
    TD_CHECK(td_worker_info_equal(&ooa, &oob));
    TD_CHECK(!td_worker_info_equal(&oa, &ooa));
    TD_CHECK(td_worker_info_equal(&ooa, &ooa));
    TD_CHECK(td_worker_info_equal(&oa, &oa));
    TD_CHECK(td_worker_info_equal(&oa, &ob));
    TD_CHECK(td_worker_info_equal(&oa, &me));
    TD_CHECK_EQ(ooa.id, next_rank(ctx, 1));
    /* As values (the seed's dict keys): equal owners are equal values with equal hashes. */
    td_value *va = td_worker_info_value(&oa), *vb = td_worker_info_value(&ob), *voa = td_worker_info_value(&ooa);
    TD_CHECK(td_value_equal(va, vb));
    TD_CHECK(!td_value_equal(va, voa));
    TD_CHECK_EQ(td_value_hash(va), td_value_hash(vb));
    td_value_release(va);
    td_value_release(vb);
    td_value_release(voa);
    td_rref_release(other_b);
    td_rref_release(other_a);
    td_rref_release(b);
    td_rref_release(a);
    rpc_down();
}

/* ---- C11: the counters and leaks ----------------------------------------------------------------- */

/* test_rref_context_debug_info: the four checks, each between barriers. */
TD_TEST(rref_context_debug_info, .world_size = 4, .timeout_s = 120)
{
    rpc_up(ctx);
    td_rpc_dest dst = td_rpc_to_id(next_rank(ctx, 1));
    /* 1. A local RRef not shared yet is not in the owner table. */
    td_rref *rref1 = local_rref(td_value_int(ctx->rank));
    TD_CHECK_EQ(rpc_test_debug_int("num_owner_rrefs"), 0);
    TD_CHECK_EQ(rpc_test_debug_int("num_pending_users"), 0);
    (void)rpc_test_debug_int("num_forks");
    (void)rpc_test_debug_int("num_pending_futures");
    barrier();

    /* 2. Shared with the next worker, which keeps it in a global: one owner RRef here. */
    td_value *res = sync_call(dst, "set_global_rref", td_value_tuple_of(1, td_rref_value(rref1)));
    TD_CHECK(res == NULL);
    rpc_test_wait_rrefs_flushed();
    barrier();
    TD_CHECK_EQ(rpc_test_debug_int("num_owner_rrefs"), 1);
    TD_CHECK_EQ(rpc_test_debug_int("num_pending_users"), 0);
    TD_CHECK_EQ(rpc_test_debug_int("num_forks"), 1);
    barrier();

    /* 3. The holder drops it: the delete comes back and the owner forgets it (asynchronously). */
    res = sync_call(dst, "clear_global_rref", NULL);
    TD_CHECK(res == NULL);
    rpc_test_wait_debug("num_owner_rrefs", 0, 20000);
    TD_CHECK_EQ(rpc_test_debug_int("num_forks"), 0); /* before the barrier: then the remotes of step 4 come */
    barrier();

    /* 4. Two remotes to the next worker: every worker owns its predecessor's two results. */
    td_rref *rref2 = remote_on(dst, "aten::add", td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1)));
    td_rref *rref3 = remote_on(dst, "aten::add", td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1)));
    td_value *v = fetch(rref2);
    check_filled(v, 2, 2, 2);
    td_value_release(v);
    v = fetch(rref3);
    check_filled(v, 2, 2, 2);
    td_value_release(v);
    rpc_test_wait_rrefs_flushed();
    barrier();
    TD_CHECK_EQ(rpc_test_debug_int("num_owner_rrefs"), 2);
    TD_CHECK_EQ(rpc_test_debug_int("num_pending_users"), 0);
    TD_CHECK_EQ(rpc_test_debug_int("num_forks"), 2);
    barrier();

    /* Releasing the users empties every owner table. */
    td_rref_release(rref2);
    td_rref_release(rref3);
    td_rref_release(rref1);
    rpc_test_wait_owners_and_forks(0, 0);
    barrier();
    rpc_down();
}

/* _test_rref_leak: the user deletes of graceful shutdown are skipped, so every worker still has
 * its predecessor's fork at the leak check. */
static void rref_leak(td_test_ctx *ctx, bool ignore_leak)
{
    register_functions();
    td_rpc_options o = rpc_test_options(ctx);
    o.ignore_rref_leak = ignore_leak;
    rpc_test_init(ctx, &o);
    barrier();
    td_rref *r = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "aten::add",
                           td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1)));
    rpc_rref_testing_skip_user_deletes(rpc_test_default_agent(), true);
    if (ignore_leak) {
        TD_CHECK_OK(td_rpc_shutdown(true, 0));
    } else {
        int prev = (ctx->rank + ctx->world_size - 1) % ctx->world_size;
        char want[256];
        snprintf(want, sizeof want,
                 "Leaking RRef GloballyUniqueId(created_on=%d, local_id=0) with fork Id GloballyUniqueId(created_on=%d, "
                 "local_id=1)",
                 prev, prev);
        td_status st = td_rpc_shutdown(true, 0);
        TD_CHECK_MSG(st != TD_OK, "graceful shutdown with a leaked fork succeeded");
        TD_CHECK_CONTAINS(td_last_error(), "Leaking RRef");
        TD_CHECK_CONTAINS(td_last_error(), want);
    }
    /* The agent is gone either way: RPC is not initialized, and releasing the RRef is safe. */
    TD_CHECK_ERR(td_rpc_shutdown(true, 0), TD_ERR_NOT_INIT, "RPC has not been initialized");
    td_rref_release(r);
}

TD_TEST(rref_leak, .world_size = 2, .timeout_s = 60) { rref_leak(ctx, false); }

TD_TEST(ignore_rref_leak, .world_size = 2, .timeout_s = 60) { rref_leak(ctx, true); }

/* The library's default ignores leaks (as PyTorch's _ignore_rref_leak = True). */
TD_TEST(rref_leak_default_ignored, .world_size = 1, .timeout_s = 30)
{
    (void)ctx;
    td_rpc_options o;
    td_rpc_options_init(&o);
    TD_CHECK(o.ignore_rref_leak);
}

/* ---- C12: type queries -------------------------------------------------------------------------- */

/* _test_rref_type(blocking): one query to the owner, then the cached answer; async gives the same
 * future every time. */
static void rref_type(td_test_ctx *ctx, bool blocking)
{
    rpc_up(ctx);
    td_rpc_agent *agent = rpc_test_default_agent();
    td_rpc_dest dst = td_rpc_to_id(next_rank(ctx, 1));
    td_rref *r = remote_on(dst, "aten::add", td_value_tuple_of(2, tensor_value(1, 2, 1), td_value_int(1)));
    uint64_t q0 = rpc_rref_testing_type_queries(agent);
    td_future *first = NULL;
    const char *t = NULL;
    if (blocking) {
        TD_CHECK_OK(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &t));
    } else {
        first = td_rref_get_type_async(r, TD_RPC_DEFAULT_TIMEOUT);
        TD_CHECK(first != NULL);
        TD_CHECK_OK(td_future_wait(first, 0));
        TD_CHECK_EQ(td_value_kind_of(td_future_value(first)), TD_VAL_STRING);
        t = td_value_get_string(td_future_value(first), NULL);
    }
    TD_CHECK_STR_EQ(t, "Tensor");
    TD_CHECK_EQ(rpc_rref_testing_type_queries(agent), q0 + 1);
    for (int i = 0; i < 10; i++) {
        if (blocking) {
            t = NULL;
            TD_CHECK_OK(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &t));
        } else {
            td_future *f = td_rref_get_type_async(r, TD_RPC_DEFAULT_TIMEOUT);
            TD_CHECK(f == first);
            TD_CHECK_OK(td_future_wait(f, 0));
            t = td_value_get_string(td_future_value(f), NULL);
            td_future_release(f);
        }
        TD_CHECK_STR_EQ(t, "Tensor");
    }
    TD_CHECK_EQ(rpc_rref_testing_type_queries(agent), q0 + 1);
    td_future_release(first);

    td_rref *obj = remote_on(dst, "MyClass", td_value_tuple_of(1, td_value_int(0)));
    if (blocking) {
        TD_CHECK_OK(td_rref_get_type(obj, TD_RPC_DEFAULT_TIMEOUT, &t));
        TD_CHECK_STR_EQ(t, "MyClass");
    } else {
        td_future *f = td_rref_get_type_async(obj, TD_RPC_DEFAULT_TIMEOUT);
        TD_CHECK_OK(td_future_wait(f, 0));
        TD_CHECK_STR_EQ(td_value_get_string(td_future_value(f), NULL), "MyClass");
        td_future_release(f);
    }
    TD_CHECK_EQ(rpc_rref_testing_type_queries(agent), q0 + 2);
    td_rref_release(obj);
    td_rref_release(r);
    rpc_down();
}

TD_TEST(rref_type_blocking, .world_size = 2, .timeout_s = 60) { rref_type(ctx, true); }

TD_TEST(rref_type_non_blocking, .world_size = 2, .timeout_s = 60) { rref_type(ctx, false); }

/* _test_rref_type_owner: on the owner the type is known; no query is sent, and async still gives
 * a (completed) future. */
static void rref_type_owner(td_test_ctx *ctx, bool blocking)
{
    rpc_up(ctx);
    td_rpc_agent *agent = rpc_test_default_agent();
    td_tensor *ones = filled(1, 2, 1), *two = NULL;
    TD_CHECK_OK(td_tensor_add_scalar(ones, td_scalar_int(1), &two));
    td_rref *rs[3];
    rs[0] = local_rref(td_value_tensor(two));
    rs[1] = local_rref(myclass_new(0));
    td_worker_info me;
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, &me));
    rs[2] = remote_on(td_rpc_to_info(&me), "aten::add", td_value_tuple_of(2, td_value_tensor(ones), td_value_int(1)));
    const char *want[3] = {"Tensor", "MyClass", "Tensor"};
    for (int i = 0; i < 3; i++) {
        if (blocking) {
            const char *t = NULL;
            TD_CHECK_OK(td_rref_get_type(rs[i], TD_RPC_DEFAULT_TIMEOUT, &t));
            TD_CHECK_STR_EQ(t, want[i]);
        } else {
            td_future *f = td_rref_get_type_async(rs[i], TD_RPC_DEFAULT_TIMEOUT);
            TD_CHECK(f != NULL);
            TD_CHECK_OK(td_future_wait(f, 0));
            TD_CHECK_STR_EQ(td_value_get_string(td_future_value(f), NULL), want[i]);
            td_future_release(f);
        }
    }
    TD_CHECK_EQ(rpc_rref_testing_type_queries(agent), 0);
    for (int i = 0; i < 3; i++)
        td_rref_release(rs[i]);
    td_tensor_release(two);
    td_tensor_release(ones);
    rpc_down();
}

TD_TEST(rref_type_owner_blocking, .world_size = 1, .timeout_s = 60) { rref_type_owner(ctx, true); }

TD_TEST(rref_type_owner_non_blocking, .world_size = 1, .timeout_s = 60) { rref_type_owner(ctx, false); }

/* The type names of values (tdist/rref.h's list). */
TD_TEST(rpc_type_names, .world_size = 1, .timeout_s = 30)
{
    (void)ctx;
    register_functions();
    struct {
        td_value *v;
        const char *name;
    } cases[] = {
        {tensor_value(1, 1, 0), "Tensor"},
        {td_value_int(1), "int"},
        {td_value_double(1.5), "float"},
        {td_value_bool(true), "bool"},
        {td_value_string("s"), "str"},
        {td_value_bytes("b", 1), "bytes"},
        {td_value_complex(1, 2), "complex"},
        {td_value_none(), "NoneType"},
        {td_value_list_new(), "list"},
        {td_value_tuple_of(1, td_value_int(1)), "tuple"},
        {td_value_dict_new(), "dict"},
        {td_value_worker_info("worker0", 0), "WorkerInfo"},
        {myclass_new(3), "MyClass"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TD_CHECK_STR_EQ(td_rpc_type_name(cases[i].v), cases[i].name);
        td_value_release(cases[i].v);
    }
    /* An unnamed record tag: "object", as for any Python object of an unknown class. */
    td_value *rec = td_value_record_of(TD_REC_USER + 77, 1, td_value_int(1));
    TD_CHECK_STR_EQ(td_rpc_type_name(rec), "object");
    td_value_release(rec);
    /* A tag keeps its name. */
    TD_CHECK_EQ(td_rpc_register_type(MYCLASS_TAG, "OtherName"), TD_ERR_ALREADY);
}

/* An RRef held in a value is an "RRef" (needs an agent to create one). */
TD_TEST(rref_value_roundtrip, .world_size = 1, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = local_rref(td_value_int(5));
    td_value *v = td_rref_value(r);
    TD_CHECK(td_value_get_rref(v) == r);
    TD_CHECK_STR_EQ(td_rpc_type_name(v), "RRef");
    td_value *i = td_value_int(5);
    TD_CHECK(td_value_get_rref(i) == NULL);
    td_value_release(i);
    /* The value keeps r alive after the caller's reference goes. */
    td_rref *extra = td_rref_retain(r);
    TD_CHECK(extra == r);
    td_rref_release(extra);
    td_rref_release(r);
    td_value *got = NULL;
    TD_CHECK_OK(td_rref_local_value(td_value_get_rref(v), &got));
    check_int(got, 5);
    td_value_release(got);
    td_value_release(v);
    td_rref_release(NULL); /* ignored */
    rpc_down();
}

/* _test_rref_type_with_error: the creation's ValueError fails the type query (blocking: at once;
 * async: through the future), and a failure is not cached. */
TD_TEST(rref_type_with_error, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rpc_dest dst = td_rpc_to_id(next_rank(ctx, 1));
    td_rref *r = remote_on(dst, "raise_func", NULL);
    const char *t = NULL;
    CHECK_FAILS_WITH(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &t), "Expected error");

    td_rref *r2 = remote_on(dst, "raise_func", NULL);
    td_future *f = td_rref_get_type_async(r2, TD_RPC_DEFAULT_TIMEOUT);
    TD_CHECK(f != NULL);
    CHECK_FAILS_WITH(td_future_wait(f, 0), "Expected error");
    TD_CHECK_STR_EQ(td_future_error_type(f), "ValueError");
    /* Not cached: the next call gives a new future, failing the same way. */
    td_future *g = td_rref_get_type_async(r2, TD_RPC_DEFAULT_TIMEOUT);
    TD_CHECK(g != NULL);
    TD_CHECK(g != f);
    CHECK_FAILS_WITH(td_future_wait(g, 0), "Expected error");
    TD_CHECK_STR_EQ(td_future_error_type(g), "ValueError");
    td_future_release(g);
    td_future_release(f);
    td_rref_release(r2);
    td_rref_release(r);
    rpc_down();
}

/* test_rref_type_slow_init: the owner's function sleeps 1 s; the query waits for the value. */
TD_TEST(rref_type_slow_init, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    double t0 = rpc_test_now_s();
    td_rref *r = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "_slow_add", td_value_tuple_of(2, tensor_value(1, 2, 1), td_value_int(1)));
    const char *t = NULL;
    TD_CHECK_OK(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &t));
    TD_CHECK_STR_EQ(t, "Tensor");
    TD_CHECK_MSG(rpc_test_now_s() - t0 >= 0.9, "the type came back after %.3f s, before the 1 s creation ended", rpc_test_now_s() - t0);
    td_value *v = fetch(r);
    check_filled(v, 1, 2, 2);
    td_value_release(v);
    td_rref_release(r);
    rpc_down();
}

/* ---- part 2 C5 / C8: creation timeout, use after shutdown --------------------------------------- */

/* test_rref_timeout: rank 0's remote (a 2 s function, 10 ms timeout) fails its creation future;
 * to_here and the type query then fail with the creation timeout; the owner still ends up with
 * the value and one fork, and the graceful shutdown cleans it up without a leak. */
TD_TEST(rref_timeout, .world_size = 2, .timeout_s = 90)
{
    rpc_up(ctx);
    td_rref *r = NULL;
    if (ctx->rank == 0) {
        td_value *args = td_value_tuple_of(1, td_value_int(2));
        TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(1), "my_sleep_func", args, NULL, 10, &r));
        td_value_release(args);
        td_future *f = td_rref_get_future(r);
        TD_CHECK_EQ(td_future_wait(f, 0), TD_ERR_TIMEOUT);
        rpc_test_wait_rrefs_flushed();
        td_value *v = NULL;
        CHECK_FAILS_WITH(td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, &v),
                         "RRef creation via rpc.remote() timed out, and it is possible that the RRef on the owner node "
                         "does not exist.");
        TD_CHECK(v == NULL);
        const char *t = NULL;
        CHECK_FAILS_WITH(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &t), "RRef creation via rpc.remote() timed out");
        /* The creation future itself fails with the call's timeout (get_timeout_error_regex()). */
        TD_CHECK_CONTAINS(td_future_error(f),
                          "RPC ran for more than set timeout (10 ms) and will now be marked with an error");
        td_future_release(f);
    } else {
        /* wait_until_owners_and_forks_on_rank(1, 1, rank=1) */
        rpc_test_wait_owners_and_forks(1, 1);
    }
    barrier();
    td_rref_release(r); /* NULL on rank 1 */
    rpc_down();
}

/* A remote() with a timeout that its function meets succeeds (the timeout covers creation only). */
TD_TEST(remote_timeout_not_reached, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = NULL;
    td_value *args = td_value_tuple_of(1, td_value_int(0));
    TD_CHECK_OK(td_rpc_remote(NULL, td_rpc_to_id(next_rank(ctx, 1)), "my_sleep_func", args, NULL, 10000, &r));
    td_value_release(args);
    td_value *v = fetch(r);
    check_int(v, 1);
    td_value_release(v);
    td_rref_release(r);
    rpc_down();
}

/* test_use_rref_after_shutdown: using an RRef after the agent shut down fails with "RPC has not
 * been initialized..."; releasing it is safe. */
/* A user RRef sent to a worker that died: the call fails with TD_ERR_PEER_LOST, the fork it made
 * for the dead worker stops counting as a pending child (no acceptance will come), and the
 * graceful shutdown without a timeout still ends instead of waiting for it forever. */
TD_TEST(rref_sent_to_lost_worker, .world_size = 3, .timeout_s = 60, .skip_return_code_check = true,
        .allow_leftovers = true)
{
    rpc_up(ctx);
    td_rref *r = NULL;
    if (ctx->rank == 0) {
        r = remote_on(td_rpc_to_id(1), "aten::add", td_value_tuple_of(2, tensor_value(2, 2, 1), td_value_int(1)));
        td_value *v = fetch(r);
        td_value_release(v);
    }
    barrier();
    if (ctx->rank == 2)
        raise(SIGKILL);
    if (ctx->rank == 0) {
        /* Until the death is seen, then once more with the RRef in the arguments. */
        td_status st = TD_OK;
        for (int i = 0; i < 600 && st != TD_ERR_PEER_LOST; i++) {
            st = td_rpc_sync(NULL, td_rpc_to_id(2), "identity", NULL, NULL, 1000, NULL);
            if (st != TD_ERR_PEER_LOST)
                rpc_test_sleep_ms(50);
        }
        TD_CHECK_EQ(st, TD_ERR_PEER_LOST);
        td_value *args = td_value_tuple_of(1, td_rref_value(r));
        TD_CHECK_ERR(td_rpc_sync(NULL, td_rpc_to_id(2), "identity", args, NULL, -1, NULL), TD_ERR_PEER_LOST,
                     "worker2");
        td_value_release(args);
        td_rref_release(r);
    }
    rpc_down();
}

TD_TEST(use_rref_after_shutdown, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    int64_t n = ctx->rank + 1;
    td_rref *r = remote_on(td_rpc_to_id(next_rank(ctx, 1)), "aten::add",
                           td_value_tuple_of(2, tensor_value(n, n, 1), tensor_value(n, n, 1)));
    td_rref *local = local_rref(td_value_int(7));
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
    td_value *v = NULL;
    CHECK_FAILS_WITH(td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, &v), "RPC has not been initialized");
    TD_CHECK(v == NULL);
    td_value *res = NULL;
    CHECK_FAILS_WITH(td_rref_rpc_sync(r, "size", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &res), "RPC has not been initialized");
    const char *t = NULL;
    CHECK_FAILS_WITH(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &t), "RPC has not been initialized");
    /* Passing it on: the call fails as RPC is down. */
    td_value *args = td_value_tuple_of(1, td_rref_value(r));
    CHECK_FAILS_WITH(td_rpc_sync(NULL, td_rpc_to_id(next_rank(ctx, 1)), "identity", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &res),
                     "RPC has not been initialized");
    td_value_release(args);
    td_rref *r2 = NULL;
    CHECK_FAILS_WITH(td_rpc_remote(NULL, td_rpc_to_id(0), "identity", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r2),
                     "RPC has not been initialized");
    TD_CHECK(r2 == NULL);
    td_value *seven = td_value_int(7);
    CHECK_FAILS_WITH(td_rref_create(NULL, seven, &r2), "RPC has not been initialized");
    TD_CHECK(r2 == NULL);
    td_value_release(seven);
    td_rref_release(local);
    td_rref_release(r);
}

/* ---- stress: forks and deletes racing ------------------------------------------------------------ */

/* Each worker makes 40 RRefs (half owned here, half by others, some created by a remote still
 * running), passes each through a chain of 0..3 workers (user -> user, user -> owner, owner ->
 * itself) with small delays, stashes some on other workers, and drops its own references at
 * once, while the calls are in flight. Every chain must fetch its value, and every owner table
 * must drain. */
TD_TEST(rref_fork_delete_stress, .world_size = 4, .timeout_s = 180)
{
    rpc_up(ctx);
    enum { N = 40 };
    unsigned seed = 1234u + (unsigned)ctx->rank;
    td_future *calls[2 * N];
    int ncalls = 0;
    int64_t expect[2 * N];
    for (int i = 0; i < N; i++) {
        int64_t value = ctx->rank * 1000 + i;
        td_rref *r;
        if (i % 2 == 0)
            r = local_rref(td_value_int(value));
        else
            r = remote_on(td_rpc_to_id((ctx->rank + 1 + i) % ctx->world_size), i % 4 == 1 ? "_slow_add" : "identity",
                          i % 4 == 1 ? td_value_tuple_of(2, td_value_int(value), td_value_int(0))
                                     : td_value_tuple_of(1, td_value_int(value)));
        int hops = rand_r(&seed) % 4;
        int to = rand_r(&seed) % ctx->world_size;
        td_value *args = td_value_tuple_of(4, td_rref_value(r), td_value_int(hops), td_value_int(value),
                                           td_value_int(rand_r(&seed) % 3000));
        TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(to), "relay", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &calls[ncalls]));
        expect[ncalls++] = value;
        td_value_release(args);
        if (i % 3 == 0) {
            args = td_value_tuple_of(1, td_rref_value(r));
            TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(rand_r(&seed) % ctx->world_size), "stash", args, NULL,
                                     TD_RPC_DEFAULT_TIMEOUT, &calls[ncalls]));
            expect[ncalls++] = -1;
            td_value_release(args);
        }
        td_rref_release(r); /* while the calls holding it are in flight */
    }
    TD_CHECK_OK(td_future_wait_all(calls, ncalls, 120000));
    for (int i = 0; i < ncalls; i++) {
        if (expect[i] >= 0)
            check_int(td_future_value(calls[i]), expect[i]);
        else
            TD_CHECK(td_future_value(calls[i]) == NULL);
        td_future_release(calls[i]);
    }
    rpc_test_wait_rrefs_flushed();
    barrier();
    /* Every worker's stash goes; the owners must end with nothing. */
    (void)drop_stash();
    rpc_test_wait_owners_and_forks(0, 0);
    barrier();
    rpc_down();
}

TD_TEST_MAIN()
