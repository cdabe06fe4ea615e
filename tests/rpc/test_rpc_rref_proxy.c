/* RRef proxies (tdist/rref.h: td_rref_rpc_sync, td_rref_rpc_async, td_rref_remote), as
 * rpc_test.py calls rref.rpc_sync().m(), rref.rpc_async().m() and rref.remote().m(): the library's
 * Tensor methods (test_rref_proxy_tensor, _self, test_rref_proxy_reuse), a registered class kept
 * on its owner with state (test_rref_proxy_class, _self), a missing method failing on the caller
 * (test_rref_proxy_non_exist), and timeouts of proxies and type queries against a slow owner
 * (test_rref_proxy_timeout, test_rref_get_type_timeout). MyClass is a record with tag
 * TD_REC_USER + 1 named "MyClass", its methods registered with td_rpc_register_method. Every test
 * ends with a graceful shutdown that checks for leaked forks. */
#include <errno.h>
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

/* ---- helpers ----------------------------------------------------------------------------------- */

static td_tensor *filled(td_shape shape, double v)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, shape, v, &t));
    return t;
}

static td_value *tensor_value(td_shape shape, double v)
{
    td_tensor *t = filled(shape, v);
    td_value *val = td_value_tensor(t);
    td_tensor_release(t);
    return val;
}

static void check_tensor(const td_value *v, td_shape shape, double fill)
{
    TD_CHECK_MSG(v != NULL && td_value_kind_of(v) == TD_VAL_TENSOR, "expected a tensor, got %s",
                 v ? td_value_kind_name(td_value_kind_of(v)) : "None");
    td_tensor *want = filled(shape, fill);
    char *text = td_value_format(v);
    TD_CHECK_MSG(td_tensor_equal(td_value_get_tensor(v), want), "expected a tensor of %g with %d dims, got %s", fill,
                 shape.ndim, text);
    free(text);
    td_tensor_release(want);
}

static void check_int(const td_value *v, int64_t want)
{
    TD_CHECK_MSG(v != NULL && td_value_kind_of(v) == TD_VAL_INT, "expected int %lld, got %s", (long long)want,
                 v ? td_value_kind_name(td_value_kind_of(v)) : "None");
    TD_CHECK_EQ(td_value_get_int(v), want);
}

static void check_bool(const td_value *v, bool want)
{
    TD_CHECK_MSG(v != NULL && td_value_kind_of(v) == TD_VAL_BOOL, "expected bool, got %s",
                 v ? td_value_kind_name(td_value_kind_of(v)) : "None");
    TD_CHECK_EQ(td_value_get_bool(v), want);
}

/* torch.Size: a sequence of ints (a tuple, or a list) equal to dims. */
static void check_size(const td_value *v, int n, const int64_t *dims)
{
    TD_CHECK_MSG(v != NULL && (td_value_kind_of(v) == TD_VAL_TUPLE || td_value_kind_of(v) == TD_VAL_LIST),
                 "expected a size tuple, got %s", v ? td_value_kind_name(td_value_kind_of(v)) : "None");
    TD_CHECK_EQ(td_value_len(v), n);
    for (int i = 0; i < n; i++)
        check_int(td_value_at(v, (size_t)i), dims[i]);
}

#define CHECK_FAILS_WITH(expr, substr)                                                                        \
    do {                                                                                                      \
        td_status chk_st_ = (expr);                                                                           \
        TD_CHECK_MSG(chk_st_ != TD_OK, "%s succeeded, expected an error containing \"%s\"", #expr, (substr)); \
        TD_CHECK_CONTAINS(td_last_error(), (substr));                                                         \
    } while (0)

static td_rref *remote_on(td_rpc_dest to, const char *fn, td_value *args /* taken */)
{
    td_rref *r = NULL;
    TD_CHECK_OK(td_rpc_remote(NULL, to, fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
    TD_CHECK(r != NULL);
    td_value_release(args);
    return r;
}

static td_value *fetch(td_rref *r)
{
    td_value *v = NULL;
    TD_CHECK_OK(td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, &v));
    return v;
}

/* The three proxies, each returning the method's result (a new reference; NULL for None). */
typedef enum { MODE_SYNC, MODE_ASYNC, MODE_REMOTE } proxy_mode;
static const char *const mode_names[] = {"rpc_sync", "rpc_async", "remote"};

static td_value *proxy_call(td_rref *r, proxy_mode mode, const char *method, td_value *args /* taken; NULL: none */)
{
    td_value *res = NULL;
    td_test_breadcrumb("%s().%s()", mode_names[mode], method);
    if (mode == MODE_SYNC) {
        TD_CHECK_OK(td_rref_rpc_sync(r, method, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &res));
    } else if (mode == MODE_ASYNC) {
        td_future *f = NULL;
        TD_CHECK_OK(td_rref_rpc_async(r, method, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
        TD_CHECK(f != NULL);
        TD_CHECK_OK(td_future_wait(f, 0));
        res = td_future_value(f) ? td_value_retain(td_future_value(f)) : NULL;
        td_future_release(f);
    } else {
        td_rref *out = NULL;
        TD_CHECK_OK(td_rref_remote(r, method, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &out));
        TD_CHECK(out != NULL);
        res = fetch(out);
        td_rref_release(out);
    }
    td_value_release(args);
    return res;
}

/* ---- MyClass ------------------------------------------------------------------------------------- */

static td_value *myclass_new(int64_t a) { return td_value_record_of(MYCLASS_TAG, 1, td_value_int(a)); }

/* The owner's MyClass, first argument of every method. */
static td_status self_arg(const td_value *args, const char *method, td_value **self)
{
    *self = td_value_len(args) > 0 ? td_value_at(args, 0) : NULL;
    if (!*self || td_value_kind_of(*self) != TD_VAL_RECORD || td_value_record_tag(*self) != MYCLASS_TAG)
        return td_rpc_raise("TypeError", "MyClass.%s() expects a MyClass as its first argument", method);
    return TD_OK;
}

/* MyClass(a, delay=None): a truthy delay sleeps 2 s first (MyClass(delay=True)). */
static td_status fn_myclass(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    td_status st = td_rpc_bind("MyClass", "a,delay=x", args, kwargs, p);
    if (st != TD_OK)
        return st;
    if (p[1] && td_value_kind_of(p[1]) == TD_VAL_BOOL && td_value_get_bool(p[1]))
        rpc_test_sleep_ms(2000);
    *result = td_value_record_of(MYCLASS_TAG, 1, td_value_retain((td_value *)p[0]));
    return TD_OK;
}

static td_status m_get_value(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_value *self;
    td_status st = self_arg(args, "get_value", &self);
    if (st == TD_OK)
        *result = td_value_int(td_value_get_int(td_value_at(self, 0)));
    return st;
}

/* increment_value(inc): self.a += inc, on the owner's value itself. */
static td_status m_increment_value(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_value *self;
    td_status st = self_arg(args, "increment_value", &self);
    if (st != TD_OK)
        return st;
    if (td_value_len(args) != 2)
        return td_rpc_raise("TypeError", "increment_value() takes 2 positional arguments but %zu were given",
                            td_value_len(args));
    td_value_set(self, 0, td_value_int(td_value_get_int(td_value_at(self, 0)) + td_value_get_int(td_value_at(args, 1))));
    *result = NULL;
    return TD_OK;
}

static td_status m_my_instance_method(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                      td_value **result)
{
    (void)call;
    (void)kwargs;
    td_value *self;
    td_status st = self_arg(args, "my_instance_method", &self);
    if (st == TD_OK)
        *result = td_value_int(td_value_get_int(td_value_at(self, 0)) + td_value_get_int(td_value_at(args, 1)));
    return st;
}

/* my_static_method(f): f > 10 */
static td_status m_my_static_method(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_value *self;
    td_status st = self_arg(args, "my_static_method", &self);
    if (st == TD_OK)
        *result = td_value_bool(td_value_get_int(td_value_at(args, 1)) > 10);
    return st;
}

/* my_class_method(d, e): d + e (an int and a tensor) */
static td_status m_my_class_method(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_value *self;
    td_status st = self_arg(args, "my_class_method", &self);
    if (st != TD_OK)
        return st;
    if (td_value_len(args) != 3 || td_value_kind_of(td_value_at(args, 2)) != TD_VAL_TENSOR)
        return td_rpc_raise("TypeError", "my_class_method(d, e) expects an int and a tensor");
    td_tensor *t = NULL;
    st = td_tensor_add_scalar(td_value_get_tensor(td_value_at(args, 2)), td_scalar_int(td_value_get_int(td_value_at(args, 1))),
                              &t);
    if (st == TD_OK) {
        *result = td_value_tensor(t);
        td_tensor_release(t);
    }
    return st;
}

/* my_slow_method(t): sleeps 1.5 s, then self.a + t */
static td_status m_my_slow_method(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    td_value *self;
    td_status st = self_arg(args, "my_slow_method", &self);
    if (st != TD_OK)
        return st;
    rpc_test_sleep_ms(1500);
    *result = td_value_int(td_value_get_int(td_value_at(self, 0)) + td_value_get_int(td_value_at(args, 1)));
    return TD_OK;
}

/* async_double_value(): an async method, a future completed with 2 * self.a */
static td_future *m_async_double_value(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)call;
    (void)kwargs;
    td_value *self;
    if (self_arg(args, "async_double_value", &self) != TD_OK)
        return NULL;
    return td_future_completed(td_value_int(2 * td_value_get_int(td_value_at(self, 0))));
}

/* my_function(a, b, c): a + b + c for a tensor a and ints b, c */
static td_status fn_my_function(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[3];
    td_status st = td_rpc_bind("my_function", "a,b,c", args, kwargs, p);
    if (st != TD_OK)
        return st;
    if (td_value_kind_of(p[0]) != TD_VAL_TENSOR)
        return td_rpc_raise("TypeError", "my_function expects a tensor first");
    td_tensor *t = NULL;
    st = td_tensor_add_scalar(td_value_get_tensor(p[0]), td_scalar_int(td_value_get_int(p[1]) + td_value_get_int(p[2])), &t);
    if (st == TD_OK) {
        *result = td_value_tensor(t);
        td_tensor_release(t);
    }
    return st;
}

static void register_all(void)
{
    const rpc_test_function fns[] = {{"MyClass", fn_myclass, NULL, NULL}, {"my_function", fn_my_function, NULL, NULL}};
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    td_status st = td_rpc_register_type(MYCLASS_TAG, "MyClass");
    TD_CHECK_MSG(st == TD_OK || st == TD_ERR_ALREADY, "td_rpc_register_type: %s", td_last_error());
    const struct {
        const char *name;
        td_rpc_fn fn;
    } methods[] = {{"get_value", m_get_value},
                   {"increment_value", m_increment_value},
                   {"my_instance_method", m_my_instance_method},
                   {"my_static_method", m_my_static_method},
                   {"my_class_method", m_my_class_method},
                   {"my_slow_method", m_my_slow_method}};
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        st = td_rpc_register_method("MyClass", methods[i].name, methods[i].fn, NULL);
        TD_CHECK_MSG(st == TD_OK || st == TD_ERR_ALREADY, "td_rpc_register_method %s: %s", methods[i].name,
                     td_last_error());
    }
    st = td_rpc_register_method_async("MyClass", "async_double_value", m_async_double_value, NULL);
    TD_CHECK_MSG(st == TD_OK || st == TD_ERR_ALREADY, "td_rpc_register_method_async: %s", td_last_error());
}

static void rpc_up(td_test_ctx *ctx)
{
    register_all();
    rpc_test_init(ctx, NULL);
}

static void rpc_down(void)
{
    rpc_test_wait_rrefs_flushed();
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

static td_rpc_dest next_worker(const td_test_ctx *ctx) { return td_rpc_to_id((ctx->rank + 1) % ctx->world_size); }

static td_rpc_dest self_worker(td_worker_info *me)
{
    TD_CHECK_OK(td_rpc_worker_info(NULL, NULL, me));
    return td_rpc_to_info(me);
}

/* ---- Tensor -------------------------------------------------------------------------------------- */

/* _test_rref_proxy_tensor: my_function(ones(2, 2), 1, 3) is ones + 4; size() in rpc_sync, add(1)
 * in rpc_async, view(1, 4) in remote. */
static void rref_proxy_tensor(td_rpc_dest dst)
{
    td_rref *r = remote_on(dst, "my_function", td_value_tuple_of(3, tensor_value(TD_SHAPE(2, 2), 1), td_value_int(1),
                                                                   td_value_int(3)));
    const int64_t dims[] = {2, 2};
    td_value *v = proxy_call(r, MODE_SYNC, "size", NULL);
    check_size(v, 2, dims);
    td_value_release(v);
    v = proxy_call(r, MODE_ASYNC, "add", td_value_tuple_of(1, td_value_int(1)));
    check_tensor(v, TD_SHAPE(2, 2), 6);
    td_value_release(v);
    v = proxy_call(r, MODE_REMOTE, "view", td_value_tuple_of(2, td_value_int(1), td_value_int(4)));
    check_tensor(v, TD_SHAPE(1, 4), 5);
    td_value_release(v);
    /* The owner's value is unchanged by add (it returns a new tensor). */
    v = fetch(r);
    check_tensor(v, TD_SHAPE(2, 2), 5);
    td_value_release(v);
    td_rref_release(r);
}

TD_TEST(rref_proxy_tensor, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    rref_proxy_tensor(next_worker(ctx));
    rpc_down();
}

TD_TEST(rref_proxy_tensor_self, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info me;
    rref_proxy_tensor(self_worker(&me));
    rpc_down();
}

/* test_rref_proxy_reuse: the same RRef through each proxy several times. */
TD_TEST(rref_proxy_reuse, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *r = remote_on(next_worker(ctx), "my_function",
                           td_value_tuple_of(3, tensor_value(TD_SHAPE(2, 2), 1), td_value_int(1), td_value_int(3)));
    const int64_t dims[] = {2, 2};
    static const struct {
        int add;
        int view_ndim;
        int64_t view[2];
    } per_mode[] = {{1, 2, {1, 4}}, {3, 2, {4, 1}}, {5, 1, {-1, 0}}};
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "size", NULL);
        check_size(v, 2, dims);
        td_value_release(v);
        v = proxy_call(r, (proxy_mode)m, "add", td_value_tuple_of(1, td_value_int(per_mode[m].add)));
        check_tensor(v, TD_SHAPE(2, 2), 5 + per_mode[m].add);
        td_value_release(v);
        td_value *view_args = per_mode[m].view_ndim == 2
                                  ? td_value_tuple_of(2, td_value_int(per_mode[m].view[0]), td_value_int(per_mode[m].view[1]))
                                  : td_value_tuple_of(1, td_value_int(per_mode[m].view[0]));
        v = proxy_call(r, (proxy_mode)m, "view", view_args);
        if (per_mode[m].view_ndim == 2)
            check_tensor(v, TD_SHAPE(per_mode[m].view[0], per_mode[m].view[1]), 5);
        else
            check_tensor(v, TD_SHAPE(4), 5);
        td_value_release(v);
    }
    td_rref_release(r);
    rpc_down();
}

/* ---- MyClass ------------------------------------------------------------------------------------- */

/* _test_rref_proxy_class: MyClass(7) on dst; get_value, increment_value (None, state kept on the
 * owner: 7 -> 10), instance, static and class methods, each in the three modes. */
static void rref_proxy_class(td_rpc_dest dst)
{
    td_rref *r = remote_on(dst, "MyClass", td_value_tuple_of(1, td_value_int(7)));
    const char *type = NULL;
    TD_CHECK_OK(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &type));
    TD_CHECK_STR_EQ(type, "MyClass");
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "get_value", NULL);
        check_int(v, 7);
        td_value_release(v);
    }
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "increment_value", td_value_tuple_of(1, td_value_int(1)));
        TD_CHECK_MSG(v == NULL, "%s().increment_value(1) returned a value, expected None", mode_names[m]);
    }
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "get_value", NULL);
        check_int(v, 10);
        td_value_release(v);
    }
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "my_instance_method", td_value_tuple_of(1, td_value_int(2 + m)));
        check_int(v, 10 + 2 + m);
        td_value_release(v);
    }
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "my_static_method", td_value_tuple_of(1, td_value_int(9 + m)));
        check_bool(v, 9 + m > 10);
        td_value_release(v);
    }
    /* my_class_method(2, zeros(2, 2)), (2, ones(3, 3)), (2, ones(4, 4)) */
    static const struct {
        int64_t n;
        double fill;
    } cls[] = {{2, 0}, {3, 1}, {4, 1}};
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "my_class_method",
                                 td_value_tuple_of(2, td_value_int(2), tensor_value(TD_SHAPE(cls[m].n, cls[m].n), cls[m].fill)));
        check_tensor(v, TD_SHAPE(cls[m].n, cls[m].n), cls[m].fill + 2);
        td_value_release(v);
    }
    /* An async method (td_rpc_register_method_async). */
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        td_value *v = proxy_call(r, (proxy_mode)m, "async_double_value", NULL);
        check_int(v, 20);
        td_value_release(v);
    }
    td_rref_release(r);
}

TD_TEST(rref_proxy_class, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    rref_proxy_class(next_worker(ctx));
    rpc_down();
}

TD_TEST(rref_proxy_class_self, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_worker_info me;
    rref_proxy_class(self_worker(&me));
    rpc_down();
}

/* Proxies on an RRef made here with td_rref_create (RRef(MyClass(3))): the calls go to oneself. */
TD_TEST(rref_proxy_local_rref, .world_size = 1, .timeout_s = 60)
{
    rpc_up(ctx);
    td_value *obj = myclass_new(3);
    td_rref *r = NULL;
    TD_CHECK_OK(td_rref_create(NULL, obj, &r));
    td_value *v = proxy_call(r, MODE_SYNC, "increment_value", td_value_tuple_of(1, td_value_int(4)));
    TD_CHECK(v == NULL);
    /* The owner's value is the one changed: the caller's record is the RRef's value. */
    check_int(td_value_at(obj, 0), 7);
    td_value_release(obj);
    for (int m = MODE_SYNC; m <= MODE_REMOTE; m++) {
        v = proxy_call(r, (proxy_mode)m, "get_value", NULL);
        check_int(v, 7);
        td_value_release(v);
    }
    td_rref_release(r);
    rpc_down();
}

/* Method registration: a taken name fails with TD_ERR_ALREADY (also the library's Tensor methods,
 * with an agent running). */
TD_TEST(register_method_twice, .world_size = 1, .timeout_s = 30)
{
    rpc_up(ctx);
    TD_CHECK_EQ(td_rpc_register_method("MyClass", "get_value", m_get_value, NULL), TD_ERR_ALREADY);
    TD_CHECK_EQ(td_rpc_register_method_async("MyClass", "async_double_value", m_async_double_value, NULL), TD_ERR_ALREADY);
    TD_CHECK_EQ(td_rpc_register_method("Tensor", "size", m_get_value, NULL), TD_ERR_ALREADY); /* the library's */
    TD_CHECK_OK(td_rpc_register_method("MyClass", "a_new_method", m_get_value, NULL));
    rpc_down();
}

/* ---- missing methods ------------------------------------------------------------------------------ */

/* test_rref_proxy_non_exist: the lookup runs on the caller, against the RRef's type: sync and
 * remote fail at once, async through its future, each with AttributeError "type object 'T' has
 * no attribute 'non_exist'". */
static void rref_proxy_non_exist(td_rref *r, const char *type)
{
    char want[128];
    snprintf(want, sizeof want, "type object '%s' has no attribute 'non_exist'", type);
    td_value *res = NULL;
    CHECK_FAILS_WITH(td_rref_rpc_sync(r, "non_exist", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &res), want);
    TD_CHECK(res == NULL);
    td_rref *out = NULL;
    CHECK_FAILS_WITH(td_rref_remote(r, "non_exist", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &out), want);
    TD_CHECK(out == NULL);
    td_future *f = NULL;
    TD_CHECK_OK(td_rref_rpc_async(r, "non_exist", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    TD_CHECK(f != NULL);
    CHECK_FAILS_WITH(td_future_wait(f, 0), want);
    TD_CHECK_STR_EQ(td_future_error_type(f), "AttributeError");
    TD_CHECK_CONTAINS(td_future_error(f), "has no attribute 'non_exist'");
    td_future_release(f);
}

TD_TEST(rref_proxy_non_exist, .world_size = 2, .timeout_s = 60)
{
    rpc_up(ctx);
    td_rref *t = remote_on(next_worker(ctx), "my_function",
                           td_value_tuple_of(3, tensor_value(TD_SHAPE(2, 2), 1), td_value_int(1), td_value_int(3)));
    rref_proxy_non_exist(t, "Tensor");
    td_rref *c = remote_on(next_worker(ctx), "MyClass", td_value_tuple_of(1, td_value_int(1)));
    rref_proxy_non_exist(c, "MyClass");
    /* A method of another type is missing too: get_value is MyClass's, not Tensor's. */
    td_value *res = NULL;
    CHECK_FAILS_WITH(td_rref_rpc_sync(t, "get_value", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &res),
                     "type object 'Tensor' has no attribute 'get_value'");
    /* The RRefs still work afterwards. */
    td_value *v = proxy_call(c, MODE_SYNC, "get_value", NULL);
    check_int(v, 1);
    td_value_release(v);
    td_rref_release(c);
    td_rref_release(t);
    rpc_down();
}

TD_TEST(rref_proxy_non_exist_self, .world_size = 1, .timeout_s = 60)
{
    rpc_up(ctx);
    td_value *obj = myclass_new(1);
    td_rref *c = NULL;
    TD_CHECK_OK(td_rref_create(NULL, obj, &c));
    td_value_release(obj);
    rref_proxy_non_exist(c, "MyClass");
    td_rref_release(c);
    rpc_down();
}

/* ---- timeouts (part 2 C5) ----------------------------------------------------------------------- */

#define TIMEOUT_MSG "RPC ran for more than set timeout"

/* test_rref_proxy_timeout: a slow method (1.5 s) with a 200 ms timeout fails in each mode; a slow
 * constructor (2 s) fails a proxy with a short timeout already at the type query, synchronously for
 * rpc_sync and remote. */
TD_TEST(rref_proxy_timeout, .world_size = 2, .timeout_s = 90)
{
    rpc_up(ctx);
    td_rref *r = remote_on(next_worker(ctx), "MyClass", td_value_tuple_of(1, td_value_int(5)));
    const char *type = NULL;
    TD_CHECK_OK(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &type));
    td_value *args = td_value_tuple_of(1, td_value_int(1)), *res = NULL;
    CHECK_FAILS_WITH(td_rref_rpc_sync(r, "my_slow_method", args, NULL, 200, &res), TIMEOUT_MSG);
    td_future *f = NULL;
    TD_CHECK_OK(td_rref_rpc_async(r, "my_slow_method", args, NULL, 200, &f));
    CHECK_FAILS_WITH(td_future_wait(f, 0), TIMEOUT_MSG);
    td_future_release(f);
    td_rref *out = NULL;
    TD_CHECK_OK(td_rref_remote(r, "my_slow_method", args, NULL, 200, &out));
    f = td_rref_get_future(out); /* the seed: result._get_future().wait() raises the timeout */
    TD_CHECK_EQ(td_future_wait(f, 0), TD_ERR_TIMEOUT);
    CHECK_FAILS_WITH(td_rref_to_here(out, TD_RPC_DEFAULT_TIMEOUT, &res), "RRef creation via rpc.remote() timed out");
    TD_CHECK_CONTAINS(td_future_error(f), TIMEOUT_MSG);
    td_future_release(f);
    td_rref_release(out);
    /* With no timeout it completes: 5 + 1. */
    TD_CHECK_OK(td_rref_rpc_sync(r, "my_slow_method", args, NULL, TD_RPC_NO_TIMEOUT, &res));
    check_int(res, 6);
    td_value_release(res);
    res = NULL;

    /* A slow constructor: the type query times out first. */
    td_value *ctor = td_value_tuple_of(2, td_value_int(1), td_value_bool(true));
    td_rref *slow = remote_on(next_worker(ctx), "MyClass", ctor);
    double t0 = rpc_test_now_s();
    CHECK_FAILS_WITH(td_rref_rpc_sync(slow, "get_value", NULL, NULL, 100, &res), TIMEOUT_MSG);
    TD_CHECK(res == NULL);
    CHECK_FAILS_WITH(td_rref_remote(slow, "get_value", NULL, NULL, 100, &out), TIMEOUT_MSG);
    TD_CHECK(out == NULL);
    TD_CHECK_MSG(rpc_test_now_s() - t0 < 1.5, "the timed-out proxies took %.2f s", rpc_test_now_s() - t0);
    TD_CHECK_OK(td_rref_rpc_async(slow, "get_value", NULL, NULL, 100, &f));
    CHECK_FAILS_WITH(td_future_wait(f, 0), TIMEOUT_MSG);
    td_future_release(f);
    /* Once it exists, the same proxy with the default timeout works. */
    td_value *v = proxy_call(slow, MODE_SYNC, "get_value", NULL);
    check_int(v, 1);
    td_value_release(v);
    td_value_release(args);
    td_rref_release(slow);
    td_rref_release(r);
    rpc_down();
}

/* test_rref_get_type_timeout_blocking / _non_blocking: MyClass(delay=True) takes 2 s; a 500 ms
 * type query times out, blocking or through its future. */
static void rref_get_type_timeout(td_test_ctx *ctx, bool blocking)
{
    rpc_up(ctx);
    td_rref *r = remote_on(next_worker(ctx), "MyClass", td_value_tuple_of(2, td_value_int(1), td_value_bool(true)));
    if (blocking) {
        const char *t = NULL;
        CHECK_FAILS_WITH(td_rref_get_type(r, 500, &t), TIMEOUT_MSG);
    } else {
        td_future *f = td_rref_get_type_async(r, 500);
        TD_CHECK(f != NULL);
        CHECK_FAILS_WITH(td_future_wait(f, 0), TIMEOUT_MSG);
        td_future_release(f);
    }
    /* The failure is not cached: a later query gets the type. */
    const char *t = NULL;
    TD_CHECK_OK(td_rref_get_type(r, TD_RPC_DEFAULT_TIMEOUT, &t));
    TD_CHECK_STR_EQ(t, "MyClass");
    td_rref_release(r);
    rpc_down();
}

TD_TEST(rref_get_type_timeout_blocking, .world_size = 2, .timeout_s = 60) { rref_get_type_timeout(ctx, true); }

TD_TEST(rref_get_type_timeout_non_blocking, .world_size = 2, .timeout_s = 60) { rref_get_type_timeout(ctx, false); }

TD_TEST_MAIN()
