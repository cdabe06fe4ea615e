/* The function registry and what functions use to act like Python ones (src/rpc/registry.c):
 * register, look up, refuse duplicates, unregister, also from several threads at once;
 * td_rpc_raise and the thread-local type name the agent reads back; every rule of td_rpc_bind with
 * Python's exact TypeError messages; worker names as PyTorch checks them, and worker infos as
 * values. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "base/error.h"
#include "rpc/registry.h"

static td_status fn_one(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    *result = td_value_int(1);
    return TD_OK;
}

static td_status fn_two(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    *result = td_value_int(2);
    return TD_OK;
}

static td_future *fn_async(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    return td_future_completed(td_value_int(3));
}

/* ---- registry ------------------------------------------------------------------------------ */

TD_TEST(register_lookup_unregister)
{
    int tag = 0;
    rpc_function f;
    TD_CHECK(!rpc_registry_lookup("my_function", &f));
    TD_CHECK_OK(td_rpc_register("my_function", fn_one, &tag));
    TD_CHECK(rpc_registry_lookup("my_function", &f));
    TD_CHECK(f.fn == fn_one);
    TD_CHECK(f.async_fn == NULL);
    TD_CHECK(f.arg == &tag);

    TD_CHECK_ERR(td_rpc_register("my_function", fn_two, NULL), TD_ERR_ALREADY,
                 "RPC function 'my_function' is already registered");
    TD_CHECK_ERR(td_rpc_register_async("my_function", fn_async, NULL), TD_ERR_ALREADY, "already registered");
    TD_CHECK(rpc_registry_lookup("my_function", &f));
    TD_CHECK(f.fn == fn_one); /* the first registration stays */

    TD_CHECK_OK(td_rpc_register_async("async_fn", fn_async, NULL));
    TD_CHECK(rpc_registry_lookup("async_fn", &f));
    TD_CHECK(f.fn == NULL);
    TD_CHECK(f.async_fn == fn_async);
    TD_CHECK(f.arg == NULL);

    /* Names: 1..255 bytes, any characters (builtins are "aten::add"). */
    char name[300];
    memset(name, 'n', sizeof name);
    name[255] = '\0';
    TD_CHECK_OK(td_rpc_register(name, fn_two, NULL));
    TD_CHECK(rpc_registry_lookup(name, &f));
    name[255] = 'n';
    name[256] = '\0';
    TD_CHECK_ERR(td_rpc_register(name, fn_two, NULL), TD_ERR_INVALID, "must be 1 to 255 bytes long");
    TD_CHECK(!rpc_registry_lookup(name, &f));
    TD_CHECK_ERR(td_rpc_register("", fn_two, NULL), TD_ERR_INVALID, "an empty one");
    TD_CHECK_ERR(td_rpc_register(NULL, fn_two, NULL), TD_ERR_INVALID, "NULL");
    TD_CHECK_ERR(td_rpc_register("null_fn", NULL, NULL), TD_ERR_INVALID, "function pointer is NULL");
    TD_CHECK_ERR(td_rpc_register_async("null_fn", NULL, NULL), TD_ERR_INVALID, "function pointer is NULL");
    TD_CHECK(!rpc_registry_lookup("", &f));
    TD_CHECK(!rpc_registry_lookup(NULL, &f));
    TD_CHECK_OK(td_rpc_register("aten::my_op", fn_two, NULL));
    TD_CHECK(rpc_registry_lookup("aten::my_op", &f) && f.fn == fn_two);

    /* Unregistering frees the name for another function. */
    TD_CHECK_OK(td_rpc_unregister("my_function"));
    TD_CHECK(!rpc_registry_lookup("my_function", &f));
    TD_CHECK_ERR(td_rpc_unregister("my_function"), TD_ERR_NOT_FOUND, "no RPC function named 'my_function'");
    TD_CHECK_OK(td_rpc_register("my_function", fn_two, NULL));
    TD_CHECK(rpc_registry_lookup("my_function", &f) && f.fn == fn_two);

    name[255] = '\0';
    const char *all[] = {"my_function", "async_fn", name, "aten::my_op"};
    for (size_t i = 0; i < 4; i++)
        TD_CHECK_OK(td_rpc_unregister(all[i]));
    TD_CHECK(!rpc_registry_lookup("async_fn", &f));
}

typedef struct worker_arg {
    int index;
    int failures;
} worker_arg;

static void *register_many(void *p)
{
    worker_arg *w = p;
    char name[32];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 100; i++) {
            snprintf(name, sizeof name, "t%d_f%d", w->index, i);
            if (td_rpc_register(name, fn_one, w) != TD_OK)
                w->failures++;
        }
        /* Everyone's names are looked up while others change the map. */
        for (int i = 0; i < 100; i++) {
            rpc_function f;
            snprintf(name, sizeof name, "t%d_f%d", w->index, i);
            if (!rpc_registry_lookup(name, &f) || f.arg != w)
                w->failures++;
            snprintf(name, sizeof name, "shared_%d", i);
            if (!rpc_registry_lookup(name, &f) || f.fn != fn_two)
                w->failures++;
        }
        for (int i = 0; i < 100; i++) {
            snprintf(name, sizeof name, "t%d_f%d", w->index, i);
            if (td_rpc_unregister(name) != TD_OK)
                w->failures++;
        }
    }
    return NULL;
}

TD_TEST(registry_threads)
{
    char name[32];
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "shared_%d", i);
        TD_CHECK_OK(td_rpc_register(name, fn_two, NULL));
    }
    pthread_t threads[4];
    worker_arg args[4];
    for (int t = 0; t < 4; t++) {
        args[t] = (worker_arg){t, 0};
        TD_CHECK(pthread_create(&threads[t], NULL, register_many, &args[t]) == 0);
    }
    for (int t = 0; t < 4; t++) {
        pthread_join(threads[t], NULL);
        TD_CHECK_EQ(args[t].failures, 0);
    }
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "shared_%d", i);
        TD_CHECK_OK(td_rpc_unregister(name));
    }
}

/* ---- td_rpc_raise -------------------------------------------------------------------------- */

static void *raised_elsewhere(void *p)
{
    *(const char **)p = error_type();
    return NULL;
}

TD_TEST(raise_records_type)
{
    error_clear();
    TD_CHECK(error_type() == NULL);
    TD_CHECK_EQ(td_rpc_raise("ValueError", "Expected error %d", 7), TD_ERR_REMOTE);
    TD_CHECK_STR_EQ(td_last_error(), "Expected error 7");
    TD_CHECK_STR_EQ(error_type(), "ValueError");

    /* The type is the calling thread's. */
    const char *other = "unset";
    pthread_t t;
    TD_CHECK(pthread_create(&t, NULL, raised_elsewhere, &other) == 0);
    pthread_join(t, NULL);
    TD_CHECK(other == NULL);

    /* The last raise wins; a reset forgets it. */
    TD_CHECK_EQ(td_rpc_raise("AttributeError", "'Foo' object has no attribute 'bar'"), TD_ERR_REMOTE);
    TD_CHECK_STR_EQ(error_type(), "AttributeError");
    error_clear();
    TD_CHECK(error_type() == NULL);

    /* No type: RuntimeError; a very long type name is cut, not overrun. */
    TD_CHECK_EQ(td_rpc_raise(NULL, "plain"), TD_ERR_REMOTE);
    TD_CHECK_STR_EQ(error_type(), "RuntimeError");
    TD_CHECK_EQ(td_rpc_raise("", "plain"), TD_ERR_REMOTE);
    TD_CHECK_STR_EQ(error_type(), "RuntimeError");
    char long_type[400];
    memset(long_type, 'E', sizeof long_type - 1);
    long_type[sizeof long_type - 1] = '\0';
    TD_CHECK_EQ(td_rpc_raise(long_type, "x"), TD_ERR_REMOTE);
    TD_CHECK_EQ(strlen(error_type()), 127);
    TD_CHECK(strncmp(error_type(), long_type, 127) == 0);
    error_clear();
}

/* ---- td_rpc_bind --------------------------------------------------------------------------- */

/* The call must fail with Python's TypeError, worded exactly so. */
#define CHECK_TYPE_ERROR(expr, text)                         \
    do {                                                     \
        error_clear();                                  \
        TD_CHECK_ERR((expr), TD_ERR_REMOTE, NULL);           \
        TD_CHECK_STR_EQ(td_last_error(), (text));            \
        TD_CHECK_STR_EQ(error_type(), "TypeError");     \
    } while (0)

static td_value *ints(size_t n)
{
    td_value *t = td_value_tuple_new(n);
    for (size_t i = 0; i < n; i++)
        td_value_set(t, i, td_value_int((int64_t)i + 1));
    return t;
}

static td_value *kw_of(const char *a, const char *b)
{
    td_value *d = td_value_dict_new();
    if (a)
        td_value_dict_set_str(d, a, td_value_int(10));
    if (b)
        td_value_dict_set_str(d, b, td_value_int(20));
    return d;
}

TD_TEST(bind_rules)
{
    const td_value *out[8];
    td_value *a0 = ints(0), *a1 = ints(1), *a2 = ints(2), *a3 = ints(3), *a4 = ints(4);

    /* All positional; all by keyword, in any order; a mix. */
    TD_CHECK_OK(td_rpc_bind("my_function", "a,b,c", a3, NULL, out));
    TD_CHECK_EQ(td_value_get_int(out[0]), 1);
    TD_CHECK_EQ(td_value_get_int(out[2]), 3);
    td_value *kcb = kw_of("c", "b");
    TD_CHECK_OK(td_rpc_bind("my_function", "a,b,c", a1, kcb, out));
    TD_CHECK_EQ(td_value_get_int(out[0]), 1);
    TD_CHECK_EQ(td_value_get_int(out[1]), 20);
    TD_CHECK_EQ(td_value_get_int(out[2]), 10);
    td_value *kab = kw_of("a", "b");
    td_value *kc = kw_of("c", NULL);
    td_value *kabc = td_value_dict_new();
    td_value_dict_set_str(kabc, "c", td_value_int(3));
    td_value_dict_set_str(kabc, "a", td_value_int(1));
    td_value_dict_set_str(kabc, "b", td_value_int(2));
    TD_CHECK_OK(td_rpc_bind("my_function", "a, b, c", a0, kabc, out));
    TD_CHECK_EQ(td_value_get_int(out[0]), 1);
    TD_CHECK_EQ(td_value_get_int(out[1]), 2);
    TD_CHECK_EQ(td_value_get_int(out[2]), 3);

    /* Args as a list, as callers may pass them. */
    td_value *list = td_value_list_new();
    td_value_list_append(list, td_value_string("x"));
    TD_CHECK_OK(td_rpc_bind("f", "s", list, NULL, out));
    TD_CHECK_STR_EQ(td_value_get_string(out[0], NULL), "x");

    /* Optional parameters: absent is NULL, given positionally or by keyword. */
    TD_CHECK_OK(td_rpc_bind("my_function", "a,b,c=x", a2, NULL, out));
    TD_CHECK(out[2] == NULL);
    TD_CHECK_OK(td_rpc_bind("my_function", "a,b,c=None", a3, NULL, out));
    TD_CHECK_EQ(td_value_get_int(out[2]), 3);
    TD_CHECK_OK(td_rpc_bind("my_function", "a,b=1,c=2", a1, kc, out));
    TD_CHECK(out[1] == NULL);
    TD_CHECK_EQ(td_value_get_int(out[2]), 10);
    TD_CHECK_OK(td_rpc_bind("no_args", "", NULL, NULL, NULL));
    td_value *no_kw = td_value_dict_new();
    TD_CHECK_OK(td_rpc_bind("no_args", "", a0, no_kw, out));
    td_value_release(no_kw);

    /* Missing: one, two, three (Python's list forms). */
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a2, NULL, out),
                     "my_function() missing 1 required positional argument: 'c'");
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a1, NULL, out),
                     "my_function() missing 2 required positional arguments: 'b' and 'c'");
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", NULL, NULL, out),
                     "my_function() missing 3 required positional arguments: 'a', 'b', and 'c'");
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c,d=0", a0, kc, out),
                     "my_function() missing 2 required positional arguments: 'a' and 'b'");
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a0, kab, out),
                     "my_function() missing 1 required positional argument: 'c'");

    /* Too many positionals, worded by the parameter count and defaults. */
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a4, NULL, out),
                     "my_function() takes 3 positional arguments but 4 were given");
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c=x", a4, NULL, out),
                     "my_function() takes from 2 to 3 positional arguments but 4 were given");
    CHECK_TYPE_ERROR(td_rpc_bind("no_result", "a", a2, NULL, out),
                     "no_result() takes 1 positional argument but 2 were given");
    CHECK_TYPE_ERROR(td_rpc_bind("no_args", "", a1, NULL, out), "no_args() takes 0 positional arguments but 1 was given");
    CHECK_TYPE_ERROR(td_rpc_bind("f", "a=1", a2, NULL, out), "f() takes from 0 to 1 positional arguments but 2 were given");

    /* Keywords: unknown, doubled; both found before the positional count is checked (CPython's order). */
    td_value *kd = kw_of("d", NULL);
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a3, kd, out),
                     "my_function() got an unexpected keyword argument 'd'");
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a4, kd, out),
                     "my_function() got an unexpected keyword argument 'd'");
    td_value *ka = kw_of("a", NULL);
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a1, ka, out),
                     "my_function() got multiple values for argument 'a'");
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a4, ka, out),
                     "my_function() got multiple values for argument 'a'");
    td_value *kint = td_value_dict_new();
    td_value_dict_set(kint, td_value_int(1), td_value_int(2));
    CHECK_TYPE_ERROR(td_rpc_bind("my_function", "a,b,c", a3, kint, out), "my_function() keywords must be strings");

    /* A malformed parameter list is the program's error, not the caller's. */
    error_clear();
    TD_CHECK_ERR(td_rpc_bind("f", "a,,b", a2, NULL, out), TD_ERR_INVALID, "parameter 2 of f() in \"a,,b\" has no name");
    TD_CHECK_ERR(td_rpc_bind("f", "a=1,b", a2, NULL, out), TD_ERR_INVALID, "'b' without a default follows one with");
    TD_CHECK_ERR(td_rpc_bind("f", "a,a", a2, NULL, out), TD_ERR_INVALID, "duplicate parameter 'a'");
    TD_CHECK_ERR(td_rpc_bind("f", "a,", a1, NULL, out), TD_ERR_INVALID, "ends with a comma");
    TD_CHECK_ERR(td_rpc_bind("f", "=1", a1, NULL, out), TD_ERR_INVALID, "has no name");
    TD_CHECK_ERR(td_rpc_bind("f", "a", kd, NULL, out), TD_ERR_INVALID, "args of f() must be a tuple or a list, not dict");
    TD_CHECK_ERR(td_rpc_bind("f", "a", a1, a1, out), TD_ERR_INVALID, "kwargs of f() must be a dict, not tuple");
    TD_CHECK(error_type() == NULL);

    td_value *all[] = {a0, a1, a2, a3, a4, kcb, kab, kc, kabc, list, kd, ka, kint};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_value_release(all[i]);
}

/* ---- worker infos -------------------------------------------------------------------------- */

#define BAD_NAME_PREFIX \
    "Worker name must match ^[A-Za-z0-9-_:]*$, and must be non-empty and shorter than 128 chars, but got "

TD_TEST(worker_info_names)
{
    td_worker_info info;
    char n127[128], n128[129], n500[501];
    memset(n127, 'a', 127);
    n127[127] = '\0';
    memset(n128, 'b', 128);
    n128[128] = '\0';
    memset(n500, 'c', 500);
    n500[500] = '\0';

    const char *good[] = {"worker0", "a:b-c_d", "A", "0", "-", "_", ":", n127};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        TD_CHECK_OK(td_worker_info_make(good[i], (int64_t)i, &info));
        TD_CHECK_STR_EQ(info.name, good[i]);
        TD_CHECK_EQ(info.id, (int64_t)i);
    }
    const char *bad[] = {"abc*", " ", "", n128, n500, "worker 0", "w\xc3\xa9", "a.b", "a/b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[700];
        snprintf(want, sizeof want, BAD_NAME_PREFIX "%s", bad[i]);
        TD_CHECK_ERR(td_worker_info_make(bad[i], 0, &info), TD_ERR_INVALID, NULL);
        TD_CHECK_STR_EQ(td_last_error(), want);
    }
    TD_CHECK_ERR(td_worker_info_make(NULL, 0, &info), TD_ERR_INVALID, "must be non-empty");

    /* Ids are int16 in PyTorch. */
    TD_CHECK_OK(td_worker_info_make("w", 32767, &info));
    TD_CHECK_OK(td_worker_info_make("w", -1, &info));
    TD_CHECK_ERR(td_worker_info_make("w", 32768, &info), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "RPC worker id 32768 out of bound of int16_t.");
}

TD_TEST(worker_info_equality_and_values)
{
    td_worker_info a, b, c, d;
    TD_CHECK_OK(td_worker_info_make("worker1", 1, &a));
    TD_CHECK_OK(td_worker_info_make("worker1", 1, &b));
    TD_CHECK_OK(td_worker_info_make("worker1", 2, &c));
    TD_CHECK_OK(td_worker_info_make("worker2", 1, &d));
    TD_CHECK(td_worker_info_equal(&a, &b));
    TD_CHECK(!td_worker_info_equal(&a, &c));
    TD_CHECK(!td_worker_info_equal(&a, &d));
    TD_CHECK(!td_worker_info_equal(&a, NULL));

    /* As a value, through the codec, and back. */
    td_value *v = td_worker_info_value(&a);
    TD_CHECK_EQ(td_value_record_tag(v), TD_REC_WORKER_INFO);
    void *bytes;
    size_t len;
    TD_CHECK_OK(td_value_encode_bytes(v, &bytes, &len));
    td_value *decoded;
    TD_CHECK_OK(td_value_decode(bytes, len, &decoded));
    free(bytes);
    TD_CHECK(td_value_equal(v, decoded));
    td_worker_info back;
    memset(&back, 0x7F, sizeof back);
    TD_CHECK_OK(td_worker_info_from_value(decoded, &back));
    TD_CHECK(td_worker_info_equal(&a, &back));
    TD_CHECK_STR_EQ(back.name, "worker1");
    TD_CHECK_EQ(back.id, 1);
    /* The same worker, reached two ways, makes equal (so hash-equal) values. */
    td_value *v2 = td_worker_info_value(&b);
    TD_CHECK(td_value_equal(v, v2));
    TD_CHECK(td_value_hash(v) == td_value_hash(v2));

    /* What a peer could send instead. */
    td_value *num = td_value_int(1);
    td_value *err = td_value_error("ValueError", "x");
    td_value *swapped = td_value_record_of(TD_REC_WORKER_INFO, 2, td_value_int(1), td_value_string("worker1"));
    td_value *three = td_value_record_of(TD_REC_WORKER_INFO, 3, td_value_string("w"), td_value_int(1), td_value_none());
    td_value *bad_name = td_value_worker_info("bad name", 1);
    td_value *nul_name = td_value_record_of(TD_REC_WORKER_INFO, 2, td_value_string_n("w\0x", 3), td_value_int(1));
    td_value *big_id = td_value_worker_info("w", 1 << 20);
    TD_CHECK_ERR(td_worker_info_from_value(num, &back), TD_ERR_INVALID, "expected a WorkerInfo");
    TD_CHECK_ERR(td_worker_info_from_value(NULL, &back), TD_ERR_INVALID, "got none");
    TD_CHECK_ERR(td_worker_info_from_value(err, &back), TD_ERR_INVALID, "a record of another tag");
    TD_CHECK_ERR(td_worker_info_from_value(swapped, &back), TD_ERR_INVALID, "(name: string, id: int)");
    TD_CHECK_ERR(td_worker_info_from_value(three, &back), TD_ERR_INVALID, "(name: string, id: int)");
    TD_CHECK_ERR(td_worker_info_from_value(bad_name, &back), TD_ERR_INVALID, BAD_NAME_PREFIX "bad name");
    TD_CHECK_ERR(td_worker_info_from_value(nul_name, &back), TD_ERR_INVALID, "NUL byte");
    TD_CHECK_ERR(td_worker_info_from_value(big_id, &back), TD_ERR_INVALID, "out of bound of int16_t");

    td_value *all[] = {v, v2, decoded, num, err, swapped, three, bad_name, nul_name, big_id};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_value_release(all[i]);
}

TD_TEST_MAIN()
