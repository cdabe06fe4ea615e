/* The td_value wire format: round trips of every kind and of random nested values through both
 * encode paths (iovecs, flat bytes) and both decode paths (copying, zero-copy views of the
 * message), the size of encoded views, the layout of views (narrowed, transposed, expanded,
 * offset views keep their strides; sparse views of large spans are packed), the same-tensor memo,
 * and malformed input: every truncation, single-byte corruptions, huge declared counts and
 * lengths, bad versions and magic, strided views reaching outside their buffer, and depth bombs,
 * each of which must fail cleanly with TD_ERR_INVALID. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>
#include <tdist/value.h>

#include "tensor/codec.h"
#include "value_gen.h"

/* ---- helpers ------------------------------------------------------------------------------ */

static td_storage *storage_of(const void *data, size_t len)
{
    td_storage *s;
    TD_CHECK_OK(td_storage_new(len, &s));
    if (len)
        memcpy(td_storage_data(s), data, len);
    return s;
}

/* Calls fn on every tensor in v. */
static void each_tensor(const td_value *v, void (*fn)(td_tensor *t, void *arg), void *arg)
{
    switch (td_value_kind_of(v)) {
    case TD_VAL_TENSOR:
        fn(td_value_get_tensor(v), arg);
        break;
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        for (size_t i = 0; i < td_value_len(v); i++)
            each_tensor(td_value_at(v, i), fn, arg);
        break;
    case TD_VAL_DICT:
        for (size_t i = 0; i < td_value_len(v); i++) {
            each_tensor(td_value_dict_key_at(v, i), fn, arg);
            each_tensor(td_value_dict_value_at(v, i), fn, arg);
        }
        break;
    default:
        break;
    }
}

typedef struct tensor_list {
    td_tensor *t[4096];
    size_t n;
} tensor_list;

static void collect_tensor(td_tensor *t, void *arg)
{
    tensor_list *l = arg;
    if (l->n < sizeof l->t / sizeof l->t[0])
        l->t[l->n++] = t;
}

/* Whether the codec sends t with its strides: a non-contiguous view whose span (element 0 to its
 * last element) is under 8 KiB or under twice its elements' bytes, and at least 1/1024 of them;
 * other views are packed. */
static bool sent_strided(const td_tensor *t)
{
    if (td_tensor_numel(t) == 0 || td_tensor_is_contiguous(t))
        return false;
    int64_t last = 0;
    for (int i = 0; i < td_tensor_ndim(t); i++)
        last += (td_tensor_sizes(t)[i] - 1) * td_tensor_strides(t)[i];
    size_t span = (size_t)(last + 1) * td_dtype_size(td_tensor_dtype(t));
    size_t nbytes = td_tensor_nbytes(t);
    return !(span >= 8192 && span >= 2 * nbytes) && nbytes <= span * 1024;
}

/* Every decoded tensor has the layout its original was sent with: the original's strides for a
 * strided view, contiguous otherwise. */
static void check_layouts(const td_value *orig, const td_value *dec, const char *what)
{
    tensor_list *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    each_tensor(orig, collect_tensor, a);
    each_tensor(dec, collect_tensor, b);
    TD_CHECK_EQ(a->n, b->n);
    for (size_t i = 0; i < a->n && i < b->n; i++) {
        const td_tensor *o = a->t[i], *d = b->t[i];
        int nd = td_tensor_ndim(o);
        if (sent_strided(o))
            TD_CHECK_MSG(memcmp(td_tensor_strides(o), td_tensor_strides(d), sizeof(int64_t) * (size_t)nd) == 0,
                         "%s: tensor %zu lost its strides", what, i);
        else
            TD_CHECK_MSG(td_tensor_is_contiguous(d), "%s: tensor %zu is not contiguous", what, i);
    }
    free(a);
    free(b);
}

/* Zero-copy tensors are views of the message storage, their first element 64-byte aligned (it
 * starts the buffer, whatever the strides). */
static void check_in_message(td_tensor *t, void *arg)
{
    td_storage *msg = arg;
    if (td_tensor_numel(t)) {
        TD_CHECK(td_tensor_storage(t) == msg);
        TD_CHECK_EQ((uintptr_t)td_tensor_data(t) % TD_VALUE_CODEC_ALIGN, 0);
    }
}

/* Encodes v by both paths (checking they agree) and returns the flat message. */
static void *encode(const td_value *v, size_t *len)
{
    td_encoded *e;
    TD_CHECK_OK(td_value_encode(v, &e));
    size_t n, total = 0;
    const struct iovec *iov = td_encoded_iov(e, &n);
    for (size_t i = 0; i < n; i++)
        total += iov[i].iov_len;
    TD_CHECK_EQ(total, td_encoded_size(e));
    void *flat = malloc(total);
    td_encoded_flatten(e, flat);
    td_encoded_free(e);
    void *bytes;
    size_t blen;
    TD_CHECK_OK(td_value_encode_bytes(v, &bytes, &blen));
    TD_CHECK_EQ(blen, total);
    TD_CHECK(memcmp(bytes, flat, total) == 0);
    free(bytes);
    *len = total;
    return flat;
}

/* Both decode paths give a value equal to v with the layouts it was sent with, and re-encoding
 * the result gives the same bytes. */
static void check_round_trip(const td_value *v, const char *what)
{
    size_t len;
    void *msg = encode(v, &len);

    td_value *d1;
    TD_CHECK_OK(td_value_decode(msg, len, &d1));
    TD_CHECK_MSG(td_value_equal(v, d1), "%s: decoded value differs", what);
    check_layouts(v, d1, what);
    size_t len2;
    void *again = encode(d1, &len2);
    TD_CHECK_MSG(len2 == len && memcmp(again, msg, len) == 0, "%s: re-encoding changed the bytes", what);
    free(again);
    td_value_release(d1);

    td_storage *s = storage_of(msg, len);
    td_value *d2;
    TD_CHECK_OK(td_value_decode_storage(s, &d2));
    each_tensor(d2, check_in_message, s);
    td_storage_release(s); /* the tensors keep it alive */
    TD_CHECK_MSG(td_value_equal(v, d2), "%s: zero-copy decoded value differs", what);
    check_layouts(v, d2, what);
    td_value_release(d2);
    free(msg);
}

/* Both decode paths fail with TD_ERR_INVALID and a message containing substr (NULL: any). */
static void expect_invalid(const void *msg, size_t len, const char *substr)
{
    td_value *v = NULL;
    TD_CHECK_ERR(td_value_decode(msg, len, &v), TD_ERR_INVALID, substr);
    TD_CHECK(v == NULL);
    td_storage *s = storage_of(msg, len);
    TD_CHECK_ERR(td_value_decode_storage(s, &v), TD_ERR_INVALID, substr);
    td_storage_release(s);
}

/* Decoding may succeed or fail, but only with TD_ERR_INVALID; a success re-encodes. */
static void decode_any(const void *msg, size_t len)
{
    td_value *v = NULL;
    td_status st = td_value_decode(msg, len, &v);
    TD_CHECK_MSG(st == TD_OK || st == TD_ERR_INVALID, "decode returned %s: %s", td_status_str(st), td_last_error());
    if (st == TD_OK) {
        void *b;
        size_t n;
        TD_CHECK_OK(td_value_encode_bytes(v, &b, &n));
        free(b);
        td_value_release(v);
    }
    td_storage *s = storage_of(msg, len);
    st = td_value_decode_storage(s, &v);
    td_storage_release(s);
    TD_CHECK_MSG(st == TD_OK || st == TD_ERR_INVALID, "decode_storage returned %s: %s", td_status_str(st),
                 td_last_error());
    if (st == TD_OK)
        td_value_release(v);
}

/* A hand-made message: the structure bytes, then nbuf zero-filled buffers of the given lengths. */
typedef struct msg {
    unsigned char *data;
    size_t len;
} crafted;

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static crafted make_msg(const unsigned char *st, size_t slen, size_t nbuf, const size_t *blens)
{
    size_t pos = 32 + slen + 16 * nbuf, offs[8];
    for (size_t i = 0; i < nbuf; i++) {
        offs[i] = (pos + 63) / 64 * 64;
        pos = offs[i] + blens[i];
    }
    crafted m = {calloc(1, pos), pos};
    put_le(m.data, TD_VALUE_CODEC_MAGIC, 4);
    put_le(m.data + 4, TD_VALUE_CODEC_VERSION, 2);
    put_le(m.data + 8, slen, 8);
    put_le(m.data + 16, nbuf, 4);
    put_le(m.data + 24, pos, 8);
    memcpy(m.data + 32, st, slen);
    for (size_t i = 0; i < nbuf; i++) {
        put_le(m.data + 32 + slen + 16 * i, offs[i], 8);
        put_le(m.data + 32 + slen + 16 * i + 8, blens[i], 8);
    }
    return m;
}

static size_t put_varint(unsigned char *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}

static void expect_invalid_struct(const unsigned char *st, size_t slen, size_t nbuf, const size_t *blens,
                                  const char *substr)
{
    crafted m = make_msg(st, slen, nbuf, blens);
    expect_invalid(m.data, m.len, substr);
    free(m.data);
}

static td_value *sample_value(void)
{
    /* Every kind once, a view, a shared tensor and a tensor dict key. */
    td_tensor *t, *col;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 0, 12, 1, &t));
    td_tensor *m;
    TD_CHECK_OK(td_tensor_view(t, TD_SHAPE(3, 4), &m));
    TD_CHECK_OK(td_tensor_select(m, 1, 2, &col));
    td_value *d = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(d, "t", td_value_tensor(t)));
    TD_CHECK_OK(td_value_dict_set(d, td_value_tensor(m), td_value_tensor(col)));
    TD_CHECK_OK(td_value_dict_set(d, td_value_tuple_of(2, td_value_int(-5), td_value_bytes("k", 1)),
                                  td_value_complex(1, -1)));
    td_value *v = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(v, td_value_none()));
    TD_CHECK_OK(td_value_list_append(v, td_value_bool(true)));
    TD_CHECK_OK(td_value_list_append(v, td_value_int(300)));
    TD_CHECK_OK(td_value_list_append(v, td_value_double(-2.5)));
    TD_CHECK_OK(td_value_list_append(v, td_value_string("hello")));
    TD_CHECK_OK(td_value_list_append(v, d));
    TD_CHECK_OK(td_value_list_append(v, td_value_worker_info("w1", 1)));
    TD_CHECK_OK(td_value_list_append(v, td_value_tensor(t)));
    td_tensor_release(t);
    td_tensor_release(m);
    td_tensor_release(col);
    return v;
}

/* ---- round trips -------------------------------------------------------------------------- */

TD_TEST(every_kind_round_trips)
{
    td_value *vals[] = {
        td_value_none(),
        td_value_bool(false),
        td_value_bool(true),
        td_value_int(0),
        td_value_int(INT64_MIN),
        td_value_int(INT64_MAX),
        td_value_double(-0.0),
        td_value_double(1e308),
        td_value_complex(-1.5, 2.25),
        td_value_string(""),
        td_value_string_n("nul\0inside", 10),
        td_value_bytes("\x00\x01\xff", 3),
        td_value_list_new(),
        td_value_tuple_new(0),
        td_value_dict_new(),
        td_value_record_new(0xffffffffu, 0),
        td_value_error("KeyError", "missing"),
        td_value_device((td_device){TD_DEVICE_CPU, -1}),
        sample_value(),
    };
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        char *what = td_value_format(vals[i]);
        check_round_trip(vals[i], what);
        free(what);
        td_value_release(vals[i]);
    }
    for (int dt = 0; dt < TD_DTYPE_COUNT; dt++) {
        td_shape shapes[] = {TD_SHAPE_SCALAR, TD_SHAPE(0), TD_SHAPE(3, 0, 2), TD_SHAPE(2, 3)};
        for (size_t i = 0; i < 4; i++) {
            td_tensor *t;
            TD_CHECK_OK(td_tensor_ones((td_dtype)dt, shapes[i], &t));
            td_value *v = td_value_tensor(t);
            check_round_trip(v, td_dtype_name((td_dtype)dt));
            td_value_release(v);
            td_tensor_release(t);
        }
    }
}

TD_TEST(random_nested_values_round_trip)
{
    int views[6] = {0};
    for (uint64_t seed = 1; seed <= 300; seed++) {
        value_gen g;
        value_gen_init(&g, seed * 7777, 5);
        td_value *v = value_gen_value(&g);
        char what[64];
        snprintf(what, sizeof what, "seed %llu", (unsigned long long)seed * 7777);
        check_round_trip(v, what);
        td_value_release(v);
        value_gen_free(&g);
        /* Tensors on their own, so that every kind of view is covered whatever the nesting. */
        int kind;
        td_tensor *t = value_gen_tensor(&g, &kind);
        views[kind]++;
        v = td_value_tuple_of(2, td_value_tensor(t), td_value_tensor(t));
        check_round_trip(v, what);
        td_value_release(v);
        td_tensor_release(t);
    }
    for (int k = 0; k < 6; k++)
        TD_CHECK_MSG(views[k] > 10, "view kind %d generated only %d times", k, views[k]);
}

TD_TEST(a_view_sends_only_its_bytes)
{
    td_tensor *big, *rows, *col;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(1000, 1000), &big)); /* 4 MB */
    TD_CHECK_OK(td_tensor_narrow(big, 0, 500, 2, &rows));                 /* contiguous, 8 KB */
    TD_CHECK_OK(td_tensor_select(big, 1, 7, &col));                       /* strided, 4 KB */

    td_value *v = td_value_tensor(rows);
    td_encoded *e;
    TD_CHECK_OK(td_value_encode(v, &e));
    TD_CHECK(td_encoded_size(e) <= 2000 * 4 + 256);
    size_t n;
    const struct iovec *iov = td_encoded_iov(e, &n);
    bool points_into_storage = false;
    for (size_t i = 0; i < n; i++)
        if (iov[i].iov_base == td_tensor_data(rows) && iov[i].iov_len == 8000)
            points_into_storage = true;
    TD_CHECK_MSG(points_into_storage, "a contiguous view was copied instead of sent from its storage");
    td_encoded_free(e);
    td_value_release(v);

    v = td_value_tensor(col);
    TD_CHECK_OK(td_value_encode(v, &e));
    TD_CHECK(td_encoded_size(e) <= 1000 * 4 + 256);
    td_encoded_free(e);
    check_round_trip(v, "column view");
    td_value_release(v);
    td_tensor_release(col);
    td_tensor_release(rows);
    td_tensor_release(big);
}

TD_TEST(the_same_tensor_decodes_as_one_tensor)
{
    td_tensor *t, *view;
    TD_CHECK_OK(td_tensor_arange(TD_INT32, 0, 6, 1, &t));
    TD_CHECK_OK(td_tensor_narrow(t, 0, 1, 3, &view));
    td_value *d = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set(d, td_value_tensor(t), td_value_string("key")));
    td_value *v = td_value_tuple_of(4, td_value_tensor(t), td_value_tensor(t), td_value_tensor(view), d);
    size_t len;
    void *msg = encode(v, &len);
    TD_CHECK(len < 32 + 64 + 3 * 64); /* t's bytes once, the view's once */

    td_value *out;
    TD_CHECK_OK(td_value_decode(msg, len, &out));
    td_tensor *a = td_value_get_tensor(td_value_at(out, 0)), *b = td_value_get_tensor(td_value_at(out, 1));
    td_tensor *c = td_value_get_tensor(td_value_at(out, 2));
    TD_CHECK(a == b && a != c);
    /* The dict key is that same tensor, so lookup by identity finds it. */
    td_value *probe = td_value_tensor(a);
    TD_CHECK(td_value_dict_get(td_value_at(out, 3), probe) != NULL);
    td_value_release(probe);
    TD_CHECK(td_value_equal(v, out));
    td_value_release(out);

    td_storage *s = storage_of(msg, len);
    TD_CHECK_OK(td_value_decode_storage(s, &out));
    TD_CHECK(td_value_get_tensor(td_value_at(out, 0)) == td_value_get_tensor(td_value_at(out, 1)));
    td_value_release(out);
    td_storage_release(s);
    free(msg);
    td_value_release(v);
    td_tensor_release(view);
    td_tensor_release(t);
}

TD_TEST(zero_copy_tensors_share_the_message)
{
    td_tensor *t;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT64, TD_SHAPE(4), 1.5, &t));
    td_value *v = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(v, td_value_tensor(t)));
    size_t len;
    void *msg = encode(v, &len);
    td_storage *s = storage_of(msg, len);
    td_value *out;
    TD_CHECK_OK(td_value_decode_storage(s, &out));
    td_tensor *o = td_value_get_tensor(td_value_at(out, 0));
    double *p = td_tensor_data(o);
    TD_CHECK((char *)p >= (char *)td_storage_data(s) && (char *)p < (char *)td_storage_data(s) + len);
    p[0] = 7; /* writes land in the message */
    int64_t i0 = 0;
    double x;
    TD_CHECK_OK(td_tensor_get_f64(o, &i0, &x));
    TD_CHECK(x == 7);
    td_storage_release(s);
    td_value_release(out);
    td_value_release(v);
    td_tensor_release(t);
    free(msg);

    /* A reader learns the whole length from the header alone. */
    size_t total = 0;
    v = td_value_int(1);
    TD_CHECK_OK(td_value_encode_bytes(v, &msg, &len));
    TD_CHECK_OK(value_codec_message_size(msg, 32, &total));
    TD_CHECK_EQ(total, len);
    td_value_release(v);
    free(msg);
}

/* ---- views keep their layout ------------------------------------------------------------- */

/* Encodes t alone, checking that its buffer is sent straight from its storage (span_bytes from
 * element 0) and that it round-trips; returns the flat message. */
static void *encode_view(td_tensor *t, size_t span_bytes, size_t *len)
{
    td_value *v = td_value_tensor(t);
    td_encoded *e;
    TD_CHECK_OK(td_value_encode(v, &e));
    size_t n;
    const struct iovec *iov = td_encoded_iov(e, &n);
    bool from_storage = false;
    for (size_t i = 0; i < n; i++)
        if (iov[i].iov_base == td_tensor_data(t) && iov[i].iov_len == span_bytes)
            from_storage = true;
    TD_CHECK_MSG(from_storage, "the view's span was copied instead of sent from its storage");
    td_encoded_free(e);
    void *msg = encode(v, len);
    TD_CHECK_EQ(((unsigned char *)msg)[32], TD_VTAG_TENSOR_STRIDED);
    check_round_trip(v, "view");
    td_value_release(v);
    return msg;
}

/* Both decode paths give a tensor equal to t with the given strides, its first element at the
 * start of the received span: offset 0 in its own storage of span_bytes when copied. */
static void check_decoded_view(const void *msg, size_t len, const td_tensor *t, const int64_t *strides,
                               size_t span_bytes)
{
    size_t sbytes = sizeof(int64_t) * (size_t)td_tensor_ndim(t);
    td_value *out;
    TD_CHECK_OK(td_value_decode(msg, len, &out));
    td_tensor *d = td_value_get_tensor(out);
    TD_CHECK(!td_tensor_is_contiguous(d));
    TD_CHECK(td_tensor_equal(d, t));
    TD_CHECK(memcmp(td_tensor_strides(d), strides, sbytes) == 0);
    TD_CHECK_EQ(td_tensor_offset(d), 0);
    TD_CHECK_EQ(td_storage_nbytes(td_tensor_storage(d)), span_bytes);
    td_value_release(out);

    td_storage *s = storage_of(msg, len);
    TD_CHECK_OK(td_value_decode_storage(s, &out));
    d = td_value_get_tensor(out);
    TD_CHECK(td_tensor_storage(d) == s);
    TD_CHECK(!td_tensor_is_contiguous(d));
    TD_CHECK(td_tensor_equal(d, t));
    TD_CHECK(memcmp(td_tensor_strides(d), strides, sbytes) == 0);
    TD_CHECK_EQ((size_t)td_tensor_offset(d) * td_dtype_size(td_tensor_dtype(t)) % TD_VALUE_CODEC_ALIGN, 0);
    td_value_release(out);
    td_storage_release(s);
}

TD_TEST(a_narrowed_view_keeps_its_strides)
{
    /* test_non_cont_tensors: rand(5, 5).narrow(1, 2, 2) and its contiguous copy. */
    td_tensor *base, *m, *view, *cont;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 0, 25, 1, &base));
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(5, 5), &m));
    TD_CHECK_OK(td_tensor_narrow(m, 1, 2, 2, &view));
    TD_CHECK(!td_tensor_is_contiguous(view));
    TD_CHECK_OK(td_tensor_contiguous(view, &cont));
    size_t len;
    void *msg = encode_view(view, (4 * 5 + 1 + 1) * 4, &len); /* elements 2 to 23 of the storage */
    /* The node as docs/protocols.md gives it: sizes, strides, offset in the span, buffer 0, cpu:-1. */
    static const unsigned char node[] = {TD_VTAG_TENSOR_STRIDED, TD_FLOAT32, 2, 5, 2, 5, 1, 0, 0, TD_DEVICE_CPU, 1};
    TD_CHECK(memcmp((unsigned char *)msg + 32, node, sizeof node) == 0);
    check_decoded_view(msg, len, view, (const int64_t[]){5, 1}, 88);
    free(msg);

    /* Together in one message: the view stays a view, the copy stays contiguous. */
    td_value *v = td_value_tuple_of(2, td_value_tensor(view), td_value_tensor(cont)), *out;
    msg = encode(v, &len);
    TD_CHECK_OK(td_value_decode(msg, len, &out));
    td_tensor *a = td_value_get_tensor(td_value_at(out, 0)), *b = td_value_get_tensor(td_value_at(out, 1));
    TD_CHECK(!td_tensor_is_contiguous(a));
    TD_CHECK(td_tensor_is_contiguous(b));
    TD_CHECK(td_tensor_equal(a, b));
    td_value_release(out);
    check_round_trip(v, "view and its contiguous copy");
    free(msg);
    td_value_release(v);
    td_tensor_release(cont);
    td_tensor_release(view);
    td_tensor_release(m);
    td_tensor_release(base);
}

TD_TEST(a_transposed_view_keeps_its_strides)
{
    td_tensor *base, *m, *tr;
    TD_CHECK_OK(td_tensor_arange(TD_INT64, 0, 12, 1, &base));
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(3, 4), &m));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &tr));
    size_t len;
    void *msg = encode_view(tr, 12 * 8, &len); /* dense: the span is exactly its elements */
    check_decoded_view(msg, len, tr, (const int64_t[]){1, 4}, 96);
    td_value *out;
    TD_CHECK_OK(td_value_decode(msg, len, &out));
    int64_t x;
    TD_CHECK_OK(td_tensor_get_i64(td_value_get_tensor(out), (const int64_t[]){3, 1}, &x));
    TD_CHECK_EQ(x, 7); /* tr[3][1] = m[1][3] */
    td_value_release(out);
    free(msg);
    td_tensor_release(tr);
    td_tensor_release(m);
    td_tensor_release(base);
}

TD_TEST(an_expanded_view_sends_its_storage_once)
{
    td_tensor *row, *r2, *wide, *one, *all;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT64, 0, 3, 1, &row));
    TD_CHECK_OK(td_tensor_view(row, TD_SHAPE(1, 3), &r2));
    TD_CHECK_OK(td_tensor_expand(r2, TD_SHAPE(1000, 3), &wide)); /* 24000 bytes of elements */
    size_t len;
    void *msg = encode_view(wide, 3 * 8, &len);
    TD_CHECK(len <= 256);
    check_decoded_view(msg, len, wide, (const int64_t[]){0, 1}, 24);
    free(msg);

    /* One element repeated 1024 times, the most a strided view may repeat its span, ... */
    TD_CHECK_OK(td_tensor_full(TD_INT32, TD_SHAPE(1), 9, &one));
    TD_CHECK_OK(td_tensor_expand(one, TD_SHAPE(32, 32), &all));
    msg = encode_view(all, 4, &len);
    check_decoded_view(msg, len, all, (const int64_t[]){0, 0}, 4);
    free(msg);
    td_tensor_release(all);
    /* ... and once more is packed: 1056 elements travel and arrive contiguous. */
    TD_CHECK_OK(td_tensor_expand(one, TD_SHAPE(32, 33), &all));
    td_value *v = td_value_tensor(all);
    msg = encode(v, &len);
    TD_CHECK_EQ(((unsigned char *)msg)[32], TD_VTAG_TENSOR);
    TD_CHECK(len >= 32 * 33 * 4);
    check_round_trip(v, "expanded past the repeat bound");
    free(msg);
    td_value_release(v);
    td_tensor_release(all);
    td_tensor_release(one);
    td_tensor_release(wide);
    td_tensor_release(r2);
    td_tensor_release(row);
}

TD_TEST(a_view_with_a_storage_offset_sends_only_its_span)
{
    td_tensor *base, *m, *rows, *block, *crows;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 0, 40, 1, &base));
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(5, 8), &m));
    TD_CHECK_OK(td_tensor_narrow(m, 0, 1, 3, &rows));
    TD_CHECK_OK(td_tensor_narrow(rows, 1, 2, 4, &block)); /* offset 10, elements 10 to 29 */
    TD_CHECK_EQ(td_tensor_offset(block), 10);
    size_t len;
    void *msg = encode_view(block, 20 * 4, &len);
    check_decoded_view(msg, len, block, (const int64_t[]){8, 1}, 80);
    free(msg);

    /* A contiguous view with an offset is a plain tensor node of just its elements. */
    TD_CHECK_OK(td_tensor_narrow(m, 0, 2, 2, &crows));
    td_value *v = td_value_tensor(crows), *out;
    msg = encode(v, &len);
    TD_CHECK_EQ(((unsigned char *)msg)[32], TD_VTAG_TENSOR);
    TD_CHECK_OK(td_value_decode(msg, len, &out));
    TD_CHECK(td_tensor_is_contiguous(td_value_get_tensor(out)));
    TD_CHECK_EQ(td_tensor_offset(td_value_get_tensor(out)), 0);
    TD_CHECK(td_tensor_equal(td_value_get_tensor(out), crows));
    td_value_release(out);
    free(msg);
    td_value_release(v);
    td_tensor_release(crows);
    td_tensor_release(block);
    td_tensor_release(rows);
    td_tensor_release(m);
    td_tensor_release(base);
}

TD_TEST(sparse_views_of_large_spans_are_packed)
{
    td_tensor *narrow_m, *wide_m, *col_small, *col_large;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(64, 16), &narrow_m));
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(64, 64), &wide_m));
    TD_CHECK_OK(td_tensor_select(narrow_m, 1, 3, &col_small)); /* span 4036 bytes: under 8 KiB */
    TD_CHECK_OK(td_tensor_select(wide_m, 1, 3, &col_large));   /* span 16132 bytes for 256 */
    size_t len;
    void *msg = encode_view(col_small, (63 * 16 + 1) * 4, &len);
    free(msg);
    td_value *v = td_value_tensor(col_large);
    msg = encode(v, &len);
    TD_CHECK_EQ(((unsigned char *)msg)[32], TD_VTAG_TENSOR);
    TD_CHECK(len <= 64 * 4 + 256);
    check_round_trip(v, "packed column");
    free(msg);
    td_value_release(v);
    td_tensor_release(col_large);
    td_tensor_release(col_small);
    td_tensor_release(wide_m);
    td_tensor_release(narrow_m);
}

TD_TEST(contiguous_tensors_keep_their_version_1_bytes)
{
    /* arange(6, int32).view(2, 3) as the version-1 format gave it, built by hand. */
    td_tensor *base, *m;
    TD_CHECK_OK(td_tensor_arange(TD_INT32, 0, 6, 1, &base));
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(2, 3), &m));
    unsigned char st[] = {TD_VTAG_TENSOR, TD_INT32, 2, 2, 3, 0, TD_DEVICE_CPU, 1};
    size_t blen[1] = {24};
    crafted want = make_msg(st, sizeof st, 1, blen);
    memcpy(want.data + want.len - 24, td_tensor_data(m), 24);
    td_value *v = td_value_tensor(m);
    size_t len;
    void *msg = encode(v, &len);
    TD_CHECK_EQ(len, want.len);
    TD_CHECK(len == want.len && memcmp(msg, want.data, len) == 0);
    free(msg);
    free(want.data);
    td_value_release(v);
    td_tensor_release(m);
    td_tensor_release(base);
}

TD_TEST(views_keep_identity_but_not_a_shared_storage)
{
    /* Two references to one view decode as one tensor; two views of one storage decode as two
     * tensors on two storages, as before strides were kept. */
    td_tensor *base, *m, *a, *b;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 0, 16, 1, &base));
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(4, 4), &m));
    TD_CHECK_OK(td_tensor_narrow(m, 1, 0, 2, &a));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &b));
    td_value *v = td_value_tuple_of(3, td_value_tensor(a), td_value_tensor(a), td_value_tensor(b)), *out;
    size_t len;
    void *msg = encode(v, &len);
    TD_CHECK_OK(td_value_decode(msg, len, &out));
    td_tensor *x = td_value_get_tensor(td_value_at(out, 0)), *y = td_value_get_tensor(td_value_at(out, 1));
    td_tensor *z = td_value_get_tensor(td_value_at(out, 2));
    TD_CHECK(x == y && x != z);
    TD_CHECK(td_tensor_storage(x) != td_tensor_storage(z));
    TD_CHECK(!td_tensor_is_contiguous(x) && !td_tensor_is_contiguous(z));
    TD_CHECK(td_value_equal(v, out));
    td_value_release(out);
    free(msg);
    td_value_release(v);
    td_tensor_release(b);
    td_tensor_release(a);
    td_tensor_release(m);
    td_tensor_release(base);
}

TD_TEST(encoding_refuses_values_too_deep)
{
    td_value *v = td_value_int(0);
    for (int i = 0; i < TD_VALUE_MAX_DEPTH + 5; i++) {
        td_value *l = td_value_list_new();
        TD_CHECK_OK(td_value_list_append(l, v));
        v = l;
    }
    td_encoded *e = NULL;
    TD_CHECK_ERR(td_value_encode(v, &e), TD_ERR_INVALID, "nested deeper than 512 levels");
    TD_CHECK(e == NULL);
    td_value_release(v);

    /* A list that holds itself: a cycle made by hand fails the same way. */
    td_value *l = td_value_list_new();
    TD_CHECK_OK(td_value_list_append(l, td_value_retain(l)));
    void *b;
    size_t n;
    TD_CHECK_ERR(td_value_encode_bytes(l, &b, &n), TD_ERR_INVALID, "a cycle?");
    TD_CHECK_OK(td_value_set(l, 0, td_value_none())); /* break it to free it */
    td_value_release(l);
}

/* ---- malformed input ---------------------------------------------------------------------- */

TD_TEST(every_truncation_fails_cleanly)
{
    td_value *v = sample_value();
    size_t len;
    unsigned char *m = encode(v, &len);
    for (size_t k = 0; k < len; k++)
        expect_invalid(m, k, NULL);
    /* Truncated structure sections inside consistent headers reach every node reader. */
    size_t slen = (size_t)m[8] | (size_t)m[9] << 8, nbuf = m[16];
    size_t blens[8];
    for (size_t i = 0; i < nbuf; i++)
        blens[i] = (size_t)m[32 + slen + 16 * i + 8] | (size_t)m[32 + slen + 16 * i + 9] << 8;
    for (size_t k = 0; k < slen; k++)
        expect_invalid_struct(m + 32, k, nbuf, blens, NULL);
    free(m);
    td_value_release(v);
}

/* A random value whose message is between min and max bytes. */
static td_value *random_value_sized(uint64_t *seed, size_t min, size_t max)
{
    for (;; (*seed)++) {
        value_gen g;
        value_gen_init(&g, *seed, 3);
        td_value *v = value_gen_value(&g);
        value_gen_free(&g);
        size_t len;
        free(encode(v, &len));
        if (len >= min && len <= max)
            return v;
        td_value_release(v);
    }
}

TD_TEST(single_byte_corruptions_never_crash)
{
    uint64_t seed = 31;
    size_t total = 0;
    for (int round = 0; round < 3; round++) {
        td_value *v = round == 0 ? sample_value() : random_value_sized(&seed, 300, 3000);
        seed++;
        size_t len;
        unsigned char *m = encode(v, &len);
        total += len;
        for (size_t i = 0; i < len; i++) {
            unsigned char orig = m[i];
            const unsigned char repl[] = {orig ^ 0x01, orig ^ 0x80, 0x00, 0xff, (unsigned char)(orig + 1)};
            for (size_t r = 0; r < sizeof repl; r++) {
                m[i] = repl[r];
                decode_any(m, len);
            }
            m[i] = orig;
        }
        free(m);
        td_value_release(v);
    }
    TD_CHECK(total >= 900);
}

TD_TEST(header_errors_name_the_problem)
{
    td_value *v = sample_value();
    size_t len;
    unsigned char *m = encode(v, &len);
    td_value_release(v);
    unsigned char *c = malloc(len);

#define CORRUPT(off, val, nbytes, substr)     \
    do {                                      \
        memcpy(c, m, len);                    \
        put_le(c + (off), (val), (nbytes));   \
        expect_invalid(c, len, substr);       \
    } while (0)

    CORRUPT(0, 0x12345678, 4, "invalid td_value message at byte 0: bad magic 0x12345678");
    CORRUPT(4, 7, 2, "unsupported td_value codec version 7 (this build reads version 1)");
    CORRUPT(6, 1, 2, "at byte 6: unknown flags 0x0001");
    CORRUPT(8, UINT64_MAX, 8, "at byte 8: structure section of 18446744073709551615 bytes exceeds");
    CORRUPT(16, 0xffffffff, 4, "at byte 16: buffer table of 4294967295 entries exceeds");
    CORRUPT(20, 1, 4, "at byte 20: reserved header field is not zero");
    CORRUPT(24, len + 1, 8, "at byte 24: the header declares");
#undef CORRUPT
    expect_invalid(m, 10, "the message has 10 bytes, fewer than the 32-byte header");
    expect_invalid(NULL, 0, "fewer than the 32-byte header");
    free(c);
    free(m);
}

TD_TEST(huge_declared_counts_fail_before_allocating)
{
    unsigned char st[64];
    size_t n;
    static const struct {
        unsigned char tag;
        const char *want;
    } counted[] = {
        {TD_VTAG_LIST, "list of 1152921504606846976 items cannot fit in the 0 bytes left"},
        {TD_VTAG_TUPLE, "tuple of 1152921504606846976 items cannot fit"},
        {TD_VTAG_DICT, "dict of 1152921504606846976 entries cannot fit"},
        {TD_VTAG_STRING, "string of 1152921504606846976 items cannot fit"},
        {TD_VTAG_BYTES, "bytes of 1152921504606846976 items cannot fit"},
    };
    for (size_t i = 0; i < sizeof counted / sizeof *counted; i++) {
        st[0] = counted[i].tag;
        n = 1 + put_varint(st + 1, 1ull << 60);
        expect_invalid_struct(st, n, 0, NULL, counted[i].want);
    }
    /* Record: a tag past 32 bits, then a huge field count. */
    st[0] = TD_VTAG_RECORD;
    n = 1 + put_varint(st + 1, 1ull << 32);
    expect_invalid_struct(st, n, 0, NULL, "record tag 4294967296 does not fit in 32 bits");
    n = 1 + put_varint(st + 1, 5);
    n += put_varint(st + n, UINT64_MAX);
    expect_invalid_struct(st, n, 0, NULL, "record of 18446744073709551615 items cannot fit");
    /* An eleven-byte varint. */
    st[0] = TD_VTAG_INT;
    memset(st + 1, 0xff, 10);
    st[11] = 0x01;
    expect_invalid_struct(st, 12, 0, NULL, "at byte 33: int does not fit in 64 bits");
    /* A tensor whose shape claims more elements than anything could hold. */
    size_t blens[2] = {8, 8};
    n = 0;
    st[n++] = TD_VTAG_TENSOR;
    st[n++] = TD_FLOAT32;
    st[n++] = 3;
    for (int i = 0; i < 3; i++)
        n += put_varint(st + n, 1ull << 40);
    st[n++] = 0, st[n++] = 0, st[n++] = 0;
    expect_invalid_struct(st, n, 1, blens, "tensor shape's element count overflows");
}

/* A structure holding one tensor node with the given fields, then what follows it. */
static size_t tensor_node(unsigned char *st, int dtype, int ndim, const uint64_t *sizes, uint64_t buf, int devtype)
{
    size_t n = 0;
    st[n++] = TD_VTAG_TENSOR;
    st[n++] = (unsigned char)dtype;
    st[n++] = (unsigned char)ndim;
    for (int i = 0; i < ndim && i < 20; i++)
        n += put_varint(st + n, sizes[i]);
    n += put_varint(st + n, buf);
    st[n++] = (unsigned char)devtype;
    st[n++] = 0;
    return n;
}

TD_TEST(bad_tensor_nodes_are_refused)
{
    unsigned char st[256];
    uint64_t sizes[20] = {2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    size_t one[1] = {8}, two[2] = {8, 8};
    size_t n = tensor_node(st, TD_FLOAT32, 1, sizes, 0, 0);
    crafted ok = make_msg(st, n, 1, one);
    td_value *v;
    TD_CHECK_OK(td_value_decode(ok.data, ok.len, &v)); /* the baseline is valid */
    td_value_release(v);
    free(ok.data);

    n = tensor_node(st, TD_DTYPE_COUNT, 1, sizes, 0, 0);
    expect_invalid_struct(st, n, 1, one, "at byte 33: invalid tensor dtype 12");
    n = tensor_node(st, TD_FLOAT32, 17, sizes, 0, 0);
    expect_invalid_struct(st, n, 1, one, "tensor has 17 dimensions, more than TD_MAX_DIMS (16)");
    n = tensor_node(st, TD_FLOAT64, 1, sizes, 0, 0);
    expect_invalid_struct(st, n, 1, one, "tensor of 2 float64 elements needs 16 bytes but buffer 0 holds 8");
    n = tensor_node(st, TD_FLOAT32, 1, sizes, 1, 0);
    expect_invalid_struct(st, n, 1, one, "tensor buffer index 1 out of range (the message has 1 buffers)");
    n = tensor_node(st, TD_FLOAT32, 1, sizes, 0, 9);
    expect_invalid_struct(st, n, 1, one, "invalid tensor device type 9");
    /* One buffer behind two tensors: refused, or a small message could claim many copies. */
    st[0] = TD_VTAG_LIST;
    st[1] = 2;
    n = 2 + tensor_node(st + 2, TD_FLOAT32, 1, sizes, 0, 0);
    n += tensor_node(st + n, TD_FLOAT32, 1, sizes, 0, 0);
    expect_invalid_struct(st, n, 2, two, "buffer 0 backs a second tensor");
    /* A buffer no tensor uses. */
    n = tensor_node(st, TD_FLOAT32, 1, sizes, 0, 0);
    expect_invalid_struct(st, n, 2, two, "buffer 1 backs no tensor");
    /* A reference to a tensor not yet seen. */
    st[0] = TD_VTAG_TENSOR_REF;
    st[1] = 0;
    expect_invalid_struct(st, 2, 0, NULL, "reference to tensor 0, but only 0 tensors came before it");

    /* Buffer table entries: misaligned, overlapping the table, past the end. */
    n = tensor_node(st, TD_FLOAT32, 1, sizes, 0, 0);
    crafted m = make_msg(st, n, 1, one);
    size_t entry = 32 + n;
    unsigned char *c = malloc(m.len);
    memcpy(c, m.data, m.len);
    put_le(c + entry, 65, 8);
    expect_invalid(c, m.len, "buffer 0 offset 65 is not a multiple of 64");
    memcpy(c, m.data, m.len);
    put_le(c + entry, 0, 8);
    expect_invalid(c, m.len, "buffer 0 offset 0 is outside");
    memcpy(c, m.data, m.len);
    put_le(c + entry + 8, UINT64_MAX, 8);
    expect_invalid(c, m.len, "runs past the message end");
    free(c);
    free(m.data);
}

/* A structure holding one strided tensor node (float32 unless dtype says otherwise). */
static size_t strided_node(unsigned char *st, int ndim, const uint64_t *sizes, const uint64_t *strides,
                           uint64_t offset)
{
    size_t n = 0;
    st[n++] = TD_VTAG_TENSOR_STRIDED;
    st[n++] = TD_FLOAT32;
    st[n++] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++)
        n += put_varint(st + n, sizes[i]);
    for (int i = 0; i < ndim; i++)
        n += put_varint(st + n, strides[i]);
    n += put_varint(st + n, offset);
    st[n++] = 0; /* buffer 0 */
    st[n++] = TD_DEVICE_CPU;
    st[n++] = 1;
    return n;
}

TD_TEST(bad_strided_nodes_are_refused)
{
    unsigned char st[128];
    uint64_t sizes[2] = {2, 2}, strides[2] = {3, 1};
    /* The baseline: a 2x2 view with row stride 3 reaches element 4, so its span is 20 bytes. */
    size_t n = strided_node(st, 2, sizes, strides, 0);
    crafted ok = make_msg(st, n, 1, (size_t[]){20});
    for (int i = 0; i < 5; i++)
        put_le(ok.data + ok.len - 20 + 4 * i, 0x3f800000u * (i == 4), 4); /* element 4 is 1.0f */
    td_value *v;
    TD_CHECK_OK(td_value_decode(ok.data, ok.len, &v));
    td_tensor *t = td_value_get_tensor(v);
    TD_CHECK_EQ(td_tensor_strides(t)[0], 3);
    double x;
    TD_CHECK_OK(td_tensor_get_f64(t, (const int64_t[]){1, 1}, &x));
    TD_CHECK(x == 1.0);
    td_value_release(v);
    free(ok.data);
    /* An offset inside the span is accepted when the view still ends at the buffer's end. */
    n = strided_node(st, 2, sizes, strides, 1);
    ok = make_msg(st, n, 1, (size_t[]){24});
    TD_CHECK_OK(td_value_decode(ok.data, ok.len, &v));
    TD_CHECK_EQ(td_tensor_offset(td_value_get_tensor(v)), 1);
    td_value_release(v);
    free(ok.data);

    /* Reaching past the buffer, or a buffer longer than the view reaches. */
    n = strided_node(st, 2, sizes, strides, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){16}, "strided float32 tensor at offset 0 needs 20 bytes of span but "
                                                    "buffer 0 holds 16");
    expect_invalid_struct(st, n, 1, (size_t[]){24}, "needs 20 bytes of span but buffer 0 holds 24");
    n = strided_node(st, 2, sizes, strides, 1);
    expect_invalid_struct(st, n, 1, (size_t[]){20}, "at offset 1 needs 24 bytes of span but buffer 0 holds 20");
    strides[0] = 30;
    n = strided_node(st, 2, sizes, strides, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){20}, "needs 128 bytes of span but buffer 0 holds 20");
    /* Overflows: stride x size, the sum with the offset, and the byte count. */
    strides[0] = (uint64_t)1 << 62;
    sizes[0] = 4;
    n = strided_node(st, 2, sizes, strides, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){20}, "strided float32 tensor's last element overflows");
    strides[0] = 3;
    sizes[0] = 2;
    n = strided_node(st, 2, sizes, strides, INT64_MAX);
    expect_invalid_struct(st, n, 1, (size_t[]){20}, "last element overflows (offset 9223372036854775807)");
    n = strided_node(st, 2, sizes, strides, (uint64_t)1 << 61); /* fits, but not in this buffer */
    expect_invalid_struct(st, n, 1, (size_t[]){20}, "needs 9223372036854775828 bytes of span");
    /* Fields out of int64's range. */
    n = strided_node(st, 2, sizes, strides, (uint64_t)1 << 63);
    expect_invalid_struct(st, n, 1, (size_t[]){20}, "tensor offset 9223372036854775808 is too large");
    strides[1] = (uint64_t)1 << 63;
    n = strided_node(st, 2, sizes, strides, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){20}, "tensor stride 9223372036854775808 is too large");
    strides[1] = 1;
    /* No elements: the writer never sends an empty view strided. */
    sizes[0] = 0;
    n = strided_node(st, 2, sizes, strides, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){0}, "strided tensor node with no elements");
    sizes[0] = 2;
    /* Truncated in the strides. */
    n = strided_node(st, 2, sizes, strides, 0);
    expect_invalid_struct(st, 6, 0, NULL, "truncated tensor stride");
    /* A broadcast view may repeat its span at most 1024 times: 4 bytes stand for 1024 floats at
     * most, never for 2^40 (or a shape whose byte count overflows). */
    uint64_t big[2] = {1024, 1}, zero[2] = {0, 0};
    n = strided_node(st, 2, big, zero, 0);
    ok = make_msg(st, n, 1, (size_t[]){4});
    TD_CHECK_OK(td_value_decode(ok.data, ok.len, &v));
    TD_CHECK_EQ(td_tensor_numel(td_value_get_tensor(v)), 1024);
    TD_CHECK_EQ(td_storage_nbytes(td_tensor_storage(td_value_get_tensor(v))), 4);
    td_value_release(v);
    free(ok.data);
    big[0] = 1025;
    n = strided_node(st, 2, big, zero, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){4},
                          "strided tensor of 1025 float32 elements repeats its 4-byte span more than 1024 times");
    big[0] = (uint64_t)1 << 40;
    n = strided_node(st, 2, big, zero, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){4}, "repeats its 4-byte span more than 1024 times");
    big[0] = (uint64_t)1 << 62;
    big[1] = 1;
    n = strided_node(st, 2, big, zero, 0);
    expect_invalid_struct(st, n, 1, (size_t[]){4}, "repeats its 4-byte span more than 1024 times");
}

TD_TEST(bad_structure_is_refused)
{
    unsigned char st[64];
    st[0] = 0x0f;
    expect_invalid_struct(st, 1, 0, NULL, "at byte 32: unknown value tag 0x0f");
    st[0] = TD_VTAG_NONE;
    st[1] = TD_VTAG_NONE;
    expect_invalid_struct(st, 2, 0, NULL, "at byte 33: 1 bytes left over in the structure section");
    /* {[]: None}: an unhashable key. */
    size_t n = 0;
    st[n++] = TD_VTAG_DICT, st[n++] = 1, st[n++] = TD_VTAG_LIST, st[n++] = 0, st[n++] = TD_VTAG_NONE;
    expect_invalid_struct(st, n, 0, NULL, "at byte 34: unhashable dict key of type list");
    /* {1: None, 1: None}: a duplicate key. */
    n = 0;
    st[n++] = TD_VTAG_DICT, st[n++] = 2;
    st[n++] = TD_VTAG_INT, st[n++] = 2, st[n++] = TD_VTAG_NONE;
    st[n++] = TD_VTAG_INT, st[n++] = 2, st[n++] = TD_VTAG_NONE;
    expect_invalid_struct(st, n, 0, NULL, "at byte 37: duplicate dict key");
    st[0] = TD_VTAG_DOUBLE;
    expect_invalid_struct(st, 5, 0, NULL, "truncated double");
}

TD_TEST(depth_bomb_is_refused)
{
    /* 100000 nested one-item lists around a None: 200 KB that would recurse 100000 deep. */
    size_t levels = 100000;
    unsigned char *st = malloc(2 * levels + 1);
    for (size_t i = 0; i < levels; i++)
        st[2 * i] = TD_VTAG_LIST, st[2 * i + 1] = 1;
    st[2 * levels] = TD_VTAG_NONE;
    expect_invalid_struct(st, 2 * levels + 1, 0, NULL, "values nested deeper than 512 levels");
    /* Exactly at the bound decodes. */
    size_t ok = TD_VALUE_MAX_DEPTH - 1;
    st[2 * ok] = TD_VTAG_NONE;
    crafted m = make_msg(st, 2 * ok + 1, 0, NULL);
    td_value *v;
    TD_CHECK_OK(td_value_decode(m.data, m.len, &v));
    td_value_release(v);
    free(m.data);
    free(st);
}

/* Not run by default: writes the fuzz seed corpus (fuzz/corpus/fuzz_value_decode) into the
 * directory named by TDIST_VALUE_SEED_DIR. */
TD_TEST(write_fuzz_seeds, .hidden = true)
{
    const char *dir = getenv("TDIST_VALUE_SEED_DIR");
    TD_CHECK_MSG(dir != NULL, "set TDIST_VALUE_SEED_DIR");
    td_value *seeds[9];
    int n = 0;
    seeds[n++] = td_value_int(42);
    seeds[n++] = td_value_tuple_of(3, td_value_string("a"), td_value_double(2.5), td_value_bytes("\x00\x01", 2));
    seeds[n++] = td_value_worker_info("worker0", 0);
    seeds[n++] = sample_value();
    for (uint64_t seed = 11; n < 8; seed++)
        seeds[n++] = random_value_sized(&seed, 200, 4096);
    /* Strided nodes of every sort: narrowed, transposed, expanded. */
    td_tensor *base, *m, *nar, *tr, *ex;
    TD_CHECK_OK(td_tensor_arange(TD_INT16, 0, 20, 1, &base));
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(4, 5), &m));
    TD_CHECK_OK(td_tensor_narrow(m, 1, 1, 3, &nar));
    TD_CHECK_OK(td_tensor_transpose(m, 0, 1, &tr));
    TD_CHECK_OK(td_tensor_narrow(m, 0, 2, 1, &ex));
    td_tensor *ex2;
    TD_CHECK_OK(td_tensor_expand(ex, TD_SHAPE(3, 5), &ex2));
    seeds[n++] = td_value_tuple_of(3, td_value_tensor(nar), td_value_tensor(tr), td_value_tensor(ex2));
    td_tensor_release(ex2);
    td_tensor_release(ex);
    td_tensor_release(tr);
    td_tensor_release(nar);
    td_tensor_release(m);
    td_tensor_release(base);
    for (int i = 0; i < n; i++) {
        size_t len;
        void *b = encode(seeds[i], &len);
        char path[4096];
        snprintf(path, sizeof path, "%s/seed-%d.bin", dir, i);
        FILE *f = fopen(path, "wb");
        TD_CHECK_MSG(f != NULL, "cannot write %s", path);
        TD_CHECK(fwrite(b, 1, len, f) == len);
        fclose(f);
        free(b);
        td_value_release(seeds[i]);
    }
}

TD_TEST_MAIN()
