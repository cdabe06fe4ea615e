/* td_value semantics: every kind's constructors and accessors, sequences, dicts (insertion order,
 * replacement, lookup by an equal key, unhashable keys), equality and its agreement with hashing,
 * deep copies, and the printed form. The wire form is tested in test_value_codec.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>
#include <tdist/value.h>

#include "value_gen.h"

static td_tensor *int_tensor(int64_t a, int64_t b)
{
    td_tensor *t;
    int64_t data[2] = {a, b};
    TD_CHECK_OK(td_tensor_from_buffer(TD_INT64, TD_SHAPE(2), data, &t));
    return t;
}

static void check_format(td_value *v, const char *want)
{
    char *s = td_value_format(v);
    TD_CHECK_STR_EQ(s, want);
    free(s);
    td_value_release(v);
}

TD_TEST(scalars_round_trip_through_accessors)
{
    td_value *v = td_value_none();
    TD_CHECK_EQ(td_value_kind_of(v), TD_VAL_NONE);
    TD_CHECK_STR_EQ(td_value_kind_name(TD_VAL_NONE), "none");
    td_value_release(v);

    v = td_value_bool(true);
    TD_CHECK(td_value_kind_of(v) == TD_VAL_BOOL && td_value_get_bool(v));
    TD_CHECK_EQ(td_value_get_int(v), 0); /* wrong kind: zero value */
    td_value_release(v);

    v = td_value_int(INT64_MIN);
    TD_CHECK(td_value_get_int(v) == INT64_MIN);
    TD_CHECK_STR_EQ(td_value_kind_name(td_value_kind_of(v)), "int");
    td_value_release(v);

    v = td_value_double(-2.5);
    TD_CHECK(td_value_get_double(v) == -2.5);
    td_value_release(v);

    double re, im;
    v = td_value_complex(1.5, -3);
    td_value_get_complex(v, &re, &im);
    TD_CHECK(re == 1.5 && im == -3);
    td_value_release(v);

    size_t len;
    v = td_value_string_n("a\0b", 3);
    TD_CHECK_EQ(td_value_len(v), 3);
    const char *s = td_value_get_string(v, &len);
    TD_CHECK(len == 3 && memcmp(s, "a\0b", 4) == 0); /* NUL-terminated too */
    td_value_release(v);

    v = td_value_bytes("\xff\x00", 2);
    const unsigned char *b = td_value_get_bytes(v, &len);
    TD_CHECK(len == 2 && b[0] == 0xff && b[1] == 0);
    TD_CHECK(td_value_get_string(v, NULL)[0] == '\0'); /* a bytes value is not a string */
    td_value_release(v);

    td_tensor *t = int_tensor(1, 2);
    v = td_value_tensor(t);
    TD_CHECK(td_value_get_tensor(v) == t);
    td_tensor_release(t); /* the value holds its own reference */
    TD_CHECK_EQ(td_tensor_numel(td_value_get_tensor(v)), 2);
    td_value_release(v);
}

TD_TEST(sequences_take_references_and_check_indices)
{
    td_value *l = td_value_list_new();
    for (int i = 0; i < 100; i++)
        TD_CHECK_OK(td_value_list_append(l, td_value_int(i)));
    TD_CHECK_EQ(td_value_len(l), 100);
    TD_CHECK_EQ(td_value_get_int(td_value_at(l, 42)), 42);
    TD_CHECK(td_value_at(l, 100) == NULL);
    TD_CHECK_OK(td_value_set(l, 0, td_value_string("zero")));
    TD_CHECK_STR_EQ(td_value_get_string(td_value_at(l, 0), NULL), "zero");
    TD_CHECK_ERR(td_value_set(l, 100, td_value_none()), TD_ERR_INVALID, "list index 100 out of range (length 100)");

    td_value *t = td_value_tuple_of(2, td_value_int(1), td_value_string("a"));
    TD_CHECK_EQ(td_value_kind_of(t), TD_VAL_TUPLE);
    TD_CHECK_EQ(td_value_len(t), 2);
    TD_CHECK_ERR(td_value_list_append(t, td_value_none()), TD_ERR_INVALID, "expected a list, got tuple");
    td_value *empty = td_value_tuple_new(3);
    TD_CHECK_EQ(td_value_kind_of(td_value_at(empty, 2)), TD_VAL_NONE);
    td_value_release(empty);

    /* A value placed in two containers lives until both are gone. */
    td_value *shared = td_value_string("shared");
    TD_CHECK_OK(td_value_list_append(l, td_value_retain(shared)));
    TD_CHECK_OK(td_value_set(t, 0, shared));
    td_value_release(l);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_at(t, 0), NULL), "shared");
    td_value_release(t);

    td_value *r = td_value_worker_info("w0", 3);
    TD_CHECK_EQ(td_value_kind_of(r), TD_VAL_RECORD);
    TD_CHECK_EQ(td_value_record_tag(r), TD_REC_WORKER_INFO);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_at(r, 0), NULL), "w0");
    TD_CHECK_EQ(td_value_get_int(td_value_at(r, 1)), 3);
    td_value_release(r);
    r = td_value_error("ValueError", "boom");
    TD_CHECK_EQ(td_value_record_tag(r), TD_REC_ERROR);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_at(r, 1), NULL), "boom");
    td_value_release(r);
}

TD_TEST(dict_keeps_insertion_order_and_replaces_in_place)
{
    td_value *d = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(d, "b", td_value_int(1)));
    TD_CHECK_OK(td_value_dict_set_str(d, "a", td_value_int(2)));
    TD_CHECK_OK(td_value_dict_set(d, td_value_int(7), td_value_int(3)));
    TD_CHECK_OK(td_value_dict_set_str(d, "b", td_value_int(10))); /* replace: keeps its place */
    TD_CHECK_EQ(td_value_len(d), 3);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_dict_key_at(d, 0), NULL), "b");
    TD_CHECK_EQ(td_value_get_int(td_value_dict_value_at(d, 0)), 10);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_dict_key_at(d, 1), NULL), "a");
    TD_CHECK_EQ(td_value_get_int(td_value_dict_key_at(d, 2)), 7);
    TD_CHECK(td_value_dict_key_at(d, 3) == NULL);

    /* Lookup by an equal key, not the same object. */
    td_value *k = td_value_string("a");
    TD_CHECK_EQ(td_value_get_int(td_value_dict_get(d, k)), 2);
    td_value_release(k);
    TD_CHECK_EQ(td_value_get_int(td_value_dict_get_str(d, "b")), 10);
    TD_CHECK(td_value_dict_get_str(d, "c") == NULL);

    /* Different kinds are different keys: 7, 7.0, True, b'a' and 'a'. */
    k = td_value_double(7.0);
    TD_CHECK(td_value_dict_get(d, k) == NULL);
    td_value_release(k);
    TD_CHECK_OK(td_value_dict_set(d, td_value_double(7.0), td_value_string("seven")));
    TD_CHECK_OK(td_value_dict_set(d, td_value_bool(true), td_value_string("true")));
    TD_CHECK_OK(td_value_dict_set(d, td_value_int(1), td_value_string("one")));
    TD_CHECK_OK(td_value_dict_set(d, td_value_bytes("a", 1), td_value_string("bytes")));
    TD_CHECK_EQ(td_value_len(d), 7);
    /* -0.0 == 0.0, so they are one key. */
    TD_CHECK_OK(td_value_dict_set(d, td_value_double(0.0), td_value_int(0)));
    TD_CHECK_OK(td_value_dict_set(d, td_value_double(-0.0), td_value_int(1)));
    TD_CHECK_EQ(td_value_len(d), 8);

    /* Tuple keys, compared by contents. */
    TD_CHECK_OK(td_value_dict_set(d, td_value_tuple_of(2, td_value_int(1), td_value_string("x")), td_value_none()));
    k = td_value_tuple_of(2, td_value_int(1), td_value_string("x"));
    TD_CHECK(td_value_dict_get(d, k) != NULL);
    td_value_release(k);

    /* Unhashable keys are refused, and the setter still takes (frees) what it was given. */
    TD_CHECK_ERR(td_value_dict_set(d, td_value_list_new(), td_value_int(1)), TD_ERR_INVALID,
                 "unhashable type: 'list'");
    TD_CHECK_ERR(td_value_dict_set(d, td_value_tuple_of(1, td_value_dict_new()), td_value_int(1)), TD_ERR_INVALID,
                 "unhashable type: 'tuple'");
    k = td_value_tuple_of(2, td_value_none(), td_value_tuple_of(1, td_value_bytes("", 0)));
    TD_CHECK(td_value_is_hashable(k));
    td_value_release(k);
    td_value_release(d);
}

TD_TEST(dict_tensor_keys_are_by_identity)
{
    td_tensor *t1 = int_tensor(1, 2), *t2 = int_tensor(1, 2);
    td_value *d = td_value_dict_new();
    td_value *k1 = td_value_tensor(t1);
    TD_CHECK_OK(td_value_dict_set(d, td_value_retain(k1), td_value_string("one")));
    TD_CHECK_OK(td_value_dict_set(d, td_value_tensor(t2), td_value_string("two")));
    TD_CHECK_EQ(td_value_len(d), 2); /* equal values, different tensors */
    td_value *again = td_value_tensor(t1);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_dict_get(d, again), NULL), "one");
    TD_CHECK(td_value_equal(k1, again) && td_value_hash(k1) == td_value_hash(again));
    td_value_release(again);
    td_value_release(k1);
    td_tensor_release(t1);
    td_tensor_release(t2);
    td_value_release(d);
}

TD_TEST(large_dict_lookups)
{
    td_value *d = td_value_dict_new();
    for (int i = 0; i < 20000; i++)
        TD_CHECK_OK(td_value_dict_set(d, td_value_int(i * 7919), td_value_int(i)));
    TD_CHECK_EQ(td_value_len(d), 20000);
    for (int i = 0; i < 20000; i++) {
        td_value *k = td_value_int(i * 7919);
        TD_CHECK_EQ(td_value_get_int(td_value_dict_get(d, k)), i);
        TD_CHECK_EQ(td_value_get_int(td_value_dict_key_at(d, (size_t)i)), i * 7919);
        td_value_release(k);
    }
    td_value *k = td_value_int(-1);
    TD_CHECK(td_value_dict_get(d, k) == NULL);
    td_value_release(k);
    td_value_release(d);
}

TD_TEST(equality_and_hash_agree)
{
    /* Different kinds are never equal. */
    td_value *a = td_value_int(1), *b = td_value_double(1.0), *c = td_value_bool(true);
    TD_CHECK(!td_value_equal(a, b) && !td_value_equal(a, c) && !td_value_equal(b, c));
    td_value_release(a);
    td_value_release(b);
    td_value_release(c);
    a = td_value_list_new();
    b = td_value_tuple_new(0);
    TD_CHECK(!td_value_equal(a, b));
    td_value_release(a);
    td_value_release(b);
    /* NaN is not equal to itself (doubles compare with ==). */
    a = td_value_double(NAN);
    TD_CHECK(!td_value_equal(a, a));
    td_value_release(a);
    /* Records compare tags. */
    a = td_value_record_of(TD_REC_USER, 1, td_value_int(1));
    b = td_value_record_of(TD_REC_USER + 1, 1, td_value_int(1));
    TD_CHECK(!td_value_equal(a, b));
    td_value_release(a);
    td_value_release(b);

    /* Dicts compare as sets of entries, whatever their order; hashes agree. */
    a = td_value_dict_new();
    b = td_value_dict_new();
    for (int i = 0; i < 10; i++) {
        TD_CHECK_OK(td_value_dict_set(a, td_value_int(i), td_value_int(i * i)));
        TD_CHECK_OK(td_value_dict_set(b, td_value_int(9 - i), td_value_int((9 - i) * (9 - i))));
    }
    TD_CHECK(td_value_equal(a, b) && td_value_hash(a) == td_value_hash(b));
    TD_CHECK_OK(td_value_dict_set(b, td_value_int(0), td_value_int(1)));
    TD_CHECK(!td_value_equal(a, b));
    td_value_release(a);
    td_value_release(b);

    /* Tensors compare by value; equal tensors hash alike. */
    td_tensor *t1 = int_tensor(1, 2), *t2 = int_tensor(1, 2), *t3 = int_tensor(1, 3);
    a = td_value_tensor(t1);
    b = td_value_tensor(t2);
    c = td_value_tensor(t3);
    TD_CHECK(td_value_equal(a, b) && td_value_hash(a) == td_value_hash(b));
    TD_CHECK(!td_value_equal(a, c));
    td_value_release(a);
    td_value_release(b);
    td_value_release(c);
    /* Dicts keyed by different but equal tensors are equal. */
    a = td_value_dict_new();
    b = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set(a, td_value_tensor(t1), td_value_int(1)));
    TD_CHECK_OK(td_value_dict_set(a, td_value_tensor(t3), td_value_int(3)));
    TD_CHECK_OK(td_value_dict_set(b, td_value_tensor(t3), td_value_int(3)));
    TD_CHECK_OK(td_value_dict_set(b, td_value_tensor(t2), td_value_int(1)));
    TD_CHECK(td_value_equal(a, b) && td_value_hash(a) == td_value_hash(b));
    td_value_release(a);
    td_value_release(b);
    td_tensor_release(t1);
    td_tensor_release(t2);
    td_tensor_release(t3);

    /* Random values: each equals its deep copy, with the same hash; different seeds differ. */
    for (uint64_t seed = 1; seed <= 200; seed++) {
        value_gen g;
        value_gen_init(&g, seed, 4);
        td_value *v = value_gen_value(&g), *copy;
        TD_CHECK_OK(td_value_deep_copy(v, &copy));
        TD_CHECK_MSG(td_value_equal(v, copy), "seed %llu: copy differs", (unsigned long long)seed);
        TD_CHECK_MSG(td_value_hash(v) == td_value_hash(copy), "seed %llu: hash differs", (unsigned long long)seed);
        if (td_value_is_hashable(v))
            TD_CHECK(td_value_is_hashable(copy));
        td_value_release(copy);
        td_value_release(v);
        value_gen_free(&g);
    }
}

TD_TEST(deep_copy_is_independent)
{
    td_tensor *t = int_tensor(5, 6);
    td_value *v = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(v, td_value_tensor(t)));
    TD_CHECK_OK(td_value_list_append(v, td_value_tensor(t)));
    td_value *inner = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(inner, "k", td_value_list_new()));
    TD_CHECK_OK(td_value_list_append(v, inner));

    td_value *c;
    TD_CHECK_OK(td_value_deep_copy(v, &c));
    TD_CHECK(td_value_equal(v, c));
    td_tensor *ct = td_value_get_tensor(td_value_at(c, 0));
    TD_CHECK(ct != t && td_tensor_storage(ct) != td_tensor_storage(t));
    /* The same tensor twice stays one tensor in the copy. */
    TD_CHECK(td_value_get_tensor(td_value_at(c, 1)) == ct);

    int64_t idx = 0;
    TD_CHECK_OK(td_tensor_set_i64(ct, &idx, 99));
    TD_CHECK_OK(td_value_list_append(td_value_dict_get_str(td_value_at(c, 2), "k"), td_value_int(1)));
    int64_t got;
    TD_CHECK_OK(td_tensor_get_i64(t, &idx, &got));
    TD_CHECK_EQ(got, 5);
    TD_CHECK_EQ(td_value_len(td_value_dict_get_str(inner, "k")), 0);
    TD_CHECK(!td_value_equal(v, c));
    td_value_release(c);
    td_value_release(v);
    td_tensor_release(t);
}

TD_TEST(printed_forms_read_like_python)
{
    td_tensor *t = int_tensor(1, 2);
    td_value *d = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(d, "k", td_value_tensor(t)));
    td_tensor_release(t);
    td_value *v = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(v, td_value_int(1)));
    TD_CHECK_OK(td_value_list_append(v, td_value_string("a")));
    TD_CHECK_OK(td_value_list_append(v, td_value_tuple_of(2, td_value_double(2.5), td_value_none())));
    TD_CHECK_OK(td_value_list_append(v, d));
    check_format(v, "[1, 'a', (2.5, None), {'k': tensor([1, 2])}]");

    check_format(td_value_worker_info("w0", 0), "WorkerInfo(name='w0', id=0)");
    check_format(td_value_error("ValueError", "bad 'x'"), "Error(type='ValueError', message=\"bad 'x'\")");
    check_format(td_value_device((td_device){TD_DEVICE_CUDA, 1}), "device(type='cuda', index=1)");
    check_format(td_value_record_of(TD_REC_USER, 2, td_value_bool(true), td_value_bool(false)),
                 "Record1000(True, False)");
    check_format(td_value_record_of(TD_REC_WORKER_INFO, 1, td_value_int(3)), "WorkerInfo(3)");
    check_format(td_value_tuple_of(1, td_value_int(1)), "(1,)");
    check_format(td_value_tuple_new(0), "()");
    check_format(td_value_dict_new(), "{}");
    check_format(td_value_list_new(), "[]");

    /* Python's float repr. */
    static const struct {
        double d;
        const char *s;
    } floats[] = {
        {1.0, "1.0"},       {0.1, "0.1"},       {-0.0, "-0.0"},          {1e16, "1e+16"},
        {1e15, "1000000000000000.0"}, {1.5e-5, "1.5e-05"}, {0.0001, "0.0001"}, {123456789.0, "123456789.0"},
        {1.0 / 3, "0.3333333333333333"}, {INFINITY, "inf"}, {-INFINITY, "-inf"}, {NAN, "nan"},
        {1.7976931348623157e308, "1.7976931348623157e+308"}, {5e-324, "5e-324"},
    };
    for (size_t i = 0; i < sizeof floats / sizeof *floats; i++)
        check_format(td_value_double(floats[i].d), floats[i].s);
    check_format(td_value_complex(1, 2), "(1+2j)");
    check_format(td_value_complex(0, 2), "2j");
    check_format(td_value_complex(1.5, -0.5), "(1.5-0.5j)");
    check_format(td_value_complex(-0.0, 1), "(-0+1j)");

    /* Python's quoting and escapes. */
    check_format(td_value_string("it's"), "\"it's\"");
    check_format(td_value_string("a'b\"c"), "'a\\'b\"c'");
    check_format(td_value_string("tab\there\n\\"), "'tab\\there\\n\\\\'");
    check_format(td_value_string("caf\xc3\xa9"), "'caf\xc3\xa9'");
    check_format(td_value_bytes("\x00\xff" "a", 3), "b'\\x00\\xffa'");
    check_format(td_value_int(INT64_MIN), "-9223372036854775808");
    check_format(td_value_bool(false), "False");
}

TD_TEST(deep_values_are_bounded_not_fatal)
{
    /* 100000 levels: release, printing and copying must not recurse without bound. */
    td_value *v = td_value_int(0);
    for (int i = 0; i < 100000; i++) {
        td_value *l = td_value_list_new();
        TD_CHECK_OK(td_value_list_append(l, v));
        v = l;
    }
    char *s = td_value_format(v);
    TD_CHECK_CONTAINS(s, "[[[...]]]");
    free(s);
    td_value *c = NULL;
    TD_CHECK_ERR(td_value_deep_copy(v, &c), TD_ERR_INVALID, "nested deeper than 512 levels");
    TD_CHECK(c == NULL);
    (void)td_value_hash(v);
    TD_CHECK(!td_value_equal(v, v)); /* comparison gives up past the bound */
    td_value_release(v);

    /* Within the bound everything works. */
    v = td_value_int(0);
    for (int i = 1; i < TD_VALUE_MAX_DEPTH; i++) {
        td_value *l = td_value_list_new();
        TD_CHECK_OK(td_value_list_append(l, v));
        v = l;
    }
    TD_CHECK_OK(td_value_deep_copy(v, &c));
    TD_CHECK(td_value_equal(v, c) && td_value_hash(v) == td_value_hash(c));
    s = td_value_format(c);
    TD_CHECK(strstr(s, "...") == NULL && strstr(s, "[0]") != NULL);
    free(s);
    td_value_release(c);
    td_value_release(v);
}

TD_TEST_MAIN()
