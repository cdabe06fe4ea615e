/* The RPC message envelope (src/rpc/message.c): the header's wire form byte by byte and every
 * rejection of a bad one, call payloads with tensors through the whole send path (iovecs that point
 * into the tensors, flattened into a received storage and decoded as views of it), payloads that
 * carry nothing, the shapes a call or error payload must have, and corrupt payloads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>
#include <tdist/value.h>

#include "rpc/message.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static rpc_header sample_header(void)
{
    rpc_header h;
    memset(&h, 0, sizeof h);
    h.type = RPC_MSG_CALL;
    h.flags = RPC_FLAG_REPLY_WANTED | RPC_FLAG_RREF;
    h.sender = 0xA1B2C3D4u;
    h.id = 0x0102030405060708ull;
    h.timeout_ms = 60000;
    h.rref_owner = -2;
    h.rref_local = 11;
    h.fork_owner = 3;
    h.fork_local = -4;
    h.autograd_context = INT64_MIN;
    h.autograd_message = INT64_MAX;
    h.payload_len = 4096;
    return h;
}

static uint64_t le_at(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void put_at(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* What a receiver does: the header from the first iovec(s), the payload into a storage of its own
 * (extra spare bytes at its end, as a receive buffer may have). */
static td_storage *receive(const rpc_outgoing *m, size_t spare, rpc_header *h)
{
    size_t count;
    const struct iovec *iov = rpc_outgoing_iov(m, &count);
    TD_CHECK(count >= 1);
    TD_CHECK_EQ(iov[0].iov_len, RPC_HEADER_BYTES);
    size_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += iov[i].iov_len;
    TD_CHECK_EQ(total, rpc_outgoing_size(m));
    TD_CHECK_OK(rpc_header_read(iov[0].iov_base, 1u << 30, h));
    TD_CHECK_EQ(h->payload_len, total - RPC_HEADER_BYTES);
    td_storage *s;
    TD_CHECK_OK(td_storage_new(total - RPC_HEADER_BYTES + spare, &s));
    uint8_t *dst = td_storage_data(s);
    for (size_t i = 1; i < count; i++) {
        memcpy(dst, iov[i].iov_base, iov[i].iov_len);
        dst += iov[i].iov_len;
    }
    memset(dst, 0xEE, spare);
    return s;
}

/* Whether some payload iovec starts exactly at p (the tensor's bytes were not copied). */
static bool iov_points_at(const rpc_outgoing *m, const void *p)
{
    size_t count;
    const struct iovec *iov = rpc_outgoing_iov(m, &count);
    for (size_t i = 1; i < count; i++)
        if (iov[i].iov_base == p)
            return true;
    return false;
}

/* ---- header -------------------------------------------------------------------------------- */

TD_TEST(header_round_trip)
{
    rpc_header h = sample_header(), back;
    uint8_t wire[RPC_HEADER_BYTES];
    memset(wire, 0xCC, sizeof wire);
    rpc_header_write(&h, wire);
    /* The documented layout (docs/protocols.md, "RPC messages"). */
    TD_CHECK(memcmp(wire, "TRPC", 4) == 0);
    TD_CHECK_EQ(le_at(wire + 4, 2), RPC_VERSION);
    TD_CHECK_EQ(le_at(wire + 6, 2), RPC_MSG_CALL);
    TD_CHECK_EQ(le_at(wire + 8, 2), RPC_FLAG_REPLY_WANTED | RPC_FLAG_RREF);
    TD_CHECK_EQ(le_at(wire + 10, 2), 0);
    TD_CHECK_EQ(le_at(wire + 12, 4), 0xA1B2C3D4u);
    TD_CHECK(le_at(wire + 16, 8) == 0x0102030405060708ull);
    TD_CHECK_EQ((int64_t)le_at(wire + 24, 8), 60000);
    TD_CHECK_EQ((int64_t)le_at(wire + 32, 8), -2);
    TD_CHECK_EQ((int64_t)le_at(wire + 56, 8), -4);
    TD_CHECK((int64_t)le_at(wire + 64, 8) == INT64_MIN);
    TD_CHECK((int64_t)le_at(wire + 72, 8) == INT64_MAX);
    TD_CHECK_EQ(le_at(wire + 80, 8), 4096);

    memset(&back, 0x5A, sizeof back);
    TD_CHECK_OK(rpc_header_read(wire, 4096, &back));
    TD_CHECK_EQ(back.type, h.type);
    TD_CHECK_EQ(back.flags, h.flags);
    TD_CHECK_EQ(back.sender, h.sender);
    TD_CHECK(back.id == h.id);
    TD_CHECK_EQ(back.timeout_ms, h.timeout_ms);
    TD_CHECK_EQ(back.rref_owner, h.rref_owner);
    TD_CHECK_EQ(back.rref_local, h.rref_local);
    TD_CHECK_EQ(back.fork_owner, h.fork_owner);
    TD_CHECK_EQ(back.fork_local, h.fork_local);
    TD_CHECK(back.autograd_context == h.autograd_context);
    TD_CHECK(back.autograd_message == h.autograd_message);
    TD_CHECK(back.payload_len == h.payload_len);

    /* Writing what was read gives the same bytes: the form is canonical. */
    uint8_t again[RPC_HEADER_BYTES];
    rpc_header_write(&back, again);
    TD_CHECK(memcmp(wire, again, sizeof wire) == 0);

    /* Every defined type and every known flag is accepted. */
    for (unsigned t = RPC_MSG_CALL; t <= RPC_MSG_CONTROL; t++) {
        h.type = (uint16_t)t;
        h.flags = RPC_FLAGS_KNOWN;
        rpc_header_write(&h, wire);
        TD_CHECK_OK(rpc_header_read(wire, UINT64_MAX, &back));
        TD_CHECK_EQ(back.type, t);
        TD_CHECK_EQ(back.flags, RPC_FLAGS_KNOWN);
    }
}

TD_TEST(header_rejections)
{
    rpc_header h = sample_header(), back;
    uint8_t good[RPC_HEADER_BYTES], bad[RPC_HEADER_BYTES];
    rpc_header_write(&h, good);

    memcpy(bad, good, sizeof bad);
    bad[0] = 'X';
    TD_CHECK_ERR(rpc_header_read(bad, UINT64_MAX, &back), TD_ERR_INVALID, "bad magic");

    memcpy(bad, good, sizeof bad);
    /* Version 1 (a hello without proofs, never answered) is an older tdist's. */
    put_at(bad + 4, 1, 2);
    TD_CHECK_ERR(rpc_header_read(bad, UINT64_MAX, &back), TD_ERR_INVALID, NULL);
    TD_CHECK_STR_EQ(td_last_error(), "RPC message of version 1; this tdist speaks version 5");
    put_at(bad + 4, 0, 2);
    TD_CHECK_ERR(rpc_header_read(bad, UINT64_MAX, &back), TD_ERR_INVALID, "RPC message of version 0;");

    /* Types: 0, a reserved one within 1..RPC_MSG_TYPE_MAX, and one beyond it. */
    const unsigned bad_types[] = {0, RPC_MSG_CONTROL + 1, 16, RPC_MSG_TYPE_MAX, RPC_MSG_TYPE_MAX + 1, 0xFFFF};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        memcpy(bad, good, sizeof bad);
        put_at(bad + 6, bad_types[i], 2);
        char want[64];
        snprintf(want, sizeof want, "unknown type %u", bad_types[i]);
        TD_CHECK_ERR(rpc_header_read(bad, UINT64_MAX, &back), TD_ERR_INVALID, want);
    }

    memcpy(bad, good, sizeof bad);
    put_at(bad + 8, RPC_FLAGS_KNOWN + 1u, 2);
    TD_CHECK_ERR(rpc_header_read(bad, UINT64_MAX, &back), TD_ERR_INVALID, "unknown flags 0x20");
    put_at(bad + 8, 0x8001, 2);
    TD_CHECK_ERR(rpc_header_read(bad, UINT64_MAX, &back), TD_ERR_INVALID, "unknown flags 0x8001");

    memcpy(bad, good, sizeof bad);
    put_at(bad + 10, 1, 2);
    TD_CHECK_ERR(rpc_header_read(bad, UINT64_MAX, &back), TD_ERR_INVALID, "reserved header field");

    /* The payload limit: equal passes, one more fails, and a huge declared length fails before
     * anything could be allocated for it. */
    TD_CHECK_OK(rpc_header_read(good, 4096, &back));
    TD_CHECK_ERR(rpc_header_read(good, 4095, &back), TD_ERR_INVALID,
                 "declares a payload of 4096 bytes, more than the limit of 4095 bytes");
    memcpy(bad, good, sizeof bad);
    put_at(bad + 80, UINT64_MAX, 8);
    TD_CHECK_ERR(rpc_header_read(bad, 1u << 30, &back), TD_ERR_INVALID, "18446744073709551615 bytes");
}

/* ---- call payloads ------------------------------------------------------------------------- */

TD_TEST(call_payload_with_tensors)
{
    /* A contiguous float32 matrix, a transposed (non-contiguous) int64 view, and a narrowed view
     * that starts at an offset into its storage. */
    td_tensor *mat, *base, *transposed, *narrowed;
    TD_CHECK_OK(td_tensor_arange(TD_FLOAT32, 0, 6, 1, &mat));
    td_tensor *mat23;
    TD_CHECK_OK(td_tensor_view(mat, TD_SHAPE(2, 3), &mat23));
    td_tensor_release(mat);
    TD_CHECK_OK(td_tensor_arange(TD_INT64, 0, 12, 1, &base));
    td_tensor *base34;
    TD_CHECK_OK(td_tensor_view(base, TD_SHAPE(3, 4), &base34));
    TD_CHECK_OK(td_tensor_transpose(base34, 0, 1, &transposed));
    TD_CHECK(!td_tensor_is_contiguous(transposed));
    TD_CHECK_OK(td_tensor_narrow(base34, 0, 1, 2, &narrowed));
    TD_CHECK_EQ(td_tensor_offset(narrowed), 4);

    td_value *args = td_value_list_new();
    td_value_list_append(args, td_value_tensor(mat23));
    td_value_list_append(args, td_value_tensor(transposed));
    td_value_list_append(args, td_value_int(7));
    td_value *kwargs = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set_str(kwargs, "scale", td_value_double(2.5)));
    TD_CHECK_OK(td_value_dict_set_str(kwargs, "rows", td_value_tensor(narrowed)));

    td_value *payload;
    TD_CHECK_OK(rpc_call_payload("my_tensor_function", args, kwargs, &payload));
    rpc_header h = sample_header();
    h.payload_len = 12345; /* filled in by rpc_outgoing_make */
    rpc_outgoing *m;
    TD_CHECK_OK(rpc_outgoing_make(&h, payload, &m));
    /* Every tensor goes out straight from its memory, the transposed view as its storage span. */
    TD_CHECK(iov_points_at(m, td_tensor_data(mat23)));
    TD_CHECK(iov_points_at(m, td_tensor_data(narrowed)));
    TD_CHECK(iov_points_at(m, td_tensor_data(transposed)));

    for (size_t spare = 0; spare <= 100; spare += 100) {
        rpc_header got;
        td_storage *s = receive(m, spare, &got);
        TD_CHECK_EQ(got.type, RPC_MSG_CALL);
        TD_CHECK(got.id == h.id);
        td_value *decoded;
        TD_CHECK_OK(rpc_payload_decode(&got, s, &decoded));
        const uint8_t *lo = td_storage_data(s), *hi = lo + td_storage_nbytes(s);
        td_storage_release(s); /* the decoded tensors keep the message alive */

        const char *fn;
        const td_value *dargs, *dkwargs;
        TD_CHECK_OK(rpc_call_parts(decoded, &fn, &dargs, &dkwargs));
        TD_CHECK_STR_EQ(fn, "my_tensor_function");
        TD_CHECK_EQ(td_value_kind_of(dargs), TD_VAL_TUPLE); /* the list became a tuple */
        TD_CHECK_EQ(td_value_len(dargs), 3);
        TD_CHECK_EQ(td_value_get_int(td_value_at(dargs, 2)), 7);
        TD_CHECK_EQ(td_value_len(dkwargs), 2);
        TD_CHECK_STR_EQ(td_value_get_string(td_value_dict_key_at(dkwargs, 0), NULL), "scale");
        TD_CHECK(td_value_get_double(td_value_dict_get_str(dkwargs, "scale")) == 2.5);

        td_tensor *t0 = td_value_get_tensor(td_value_at(dargs, 0));
        td_tensor *t1 = td_value_get_tensor(td_value_at(dargs, 1));
        td_tensor *t2 = td_value_get_tensor(td_value_dict_get_str(dkwargs, "rows"));
        TD_CHECK(t0 && t1 && t2);
        TD_CHECK_EQ(td_tensor_dtype(t0), TD_FLOAT32);
        TD_CHECK_EQ(td_tensor_ndim(t0), 2);
        TD_CHECK_EQ(td_tensor_size(t0, 0), 2);
        TD_CHECK_EQ(td_tensor_size(t0, 1), 3);
        TD_CHECK(td_tensor_equal(t0, mat23));
        /* The view keeps its layout (the codec sends the storage span it covers, here all 12
         * elements, with its strides): shape 4x3, strides (1, 4), not contiguous. */
        TD_CHECK_EQ(td_tensor_dtype(t1), TD_INT64);
        TD_CHECK_EQ(td_tensor_size(t1, 0), 4);
        TD_CHECK_EQ(td_tensor_size(t1, 1), 3);
        TD_CHECK_EQ(td_tensor_stride(t1, 0), 1);
        TD_CHECK_EQ(td_tensor_stride(t1, 1), 4);
        TD_CHECK(!td_tensor_is_contiguous(t1));
        TD_CHECK(td_tensor_equal(t1, transposed));
        int64_t idx[2] = {3, 1}, val;
        TD_CHECK_OK(td_tensor_get_i64(t1, idx, &val));
        TD_CHECK_EQ(val, 7); /* base34[1][3] */
        /* The narrowed view: only its 2 rows travel, starting at its first element. */
        TD_CHECK_EQ(td_tensor_size(t2, 0), 2);
        TD_CHECK_EQ(td_tensor_size(t2, 1), 4);
        TD_CHECK(td_tensor_equal(t2, narrowed));
        int64_t first;
        int64_t zero2[2] = {0, 0};
        TD_CHECK_OK(td_tensor_get_i64(t2, zero2, &first));
        TD_CHECK_EQ(first, 4);
        /* Zero-copy: the tensors are views into the received bytes. */
        const uint8_t *d0 = td_tensor_data(t0), *d1 = td_tensor_data(t1), *d2 = td_tensor_data(t2);
        TD_CHECK(d0 >= lo && d0 < hi && d1 >= lo && d1 < hi && d2 >= lo && d2 < hi);
        td_value_release(decoded);
    }

    /* A storage shorter than the declared payload is refused. */
    rpc_header got;
    td_storage *s = receive(m, 0, &got);
    got.payload_len += 1;
    td_value *sentinel = td_value_int(5), *none = sentinel; /* reset to NULL on failure */
    TD_CHECK_ERR(rpc_payload_decode(&got, s, &none), TD_ERR_INVALID, "only");
    TD_CHECK(none == NULL);
    td_value_release(sentinel);
    td_storage_release(s);

    rpc_outgoing_free(m);
    td_value_release(payload);
    td_value_release(kwargs);
    td_value_release(args);
    td_tensor_release(narrowed);
    td_tensor_release(transposed);
    td_tensor_release(base34);
    td_tensor_release(base);
    td_tensor_release(mat23);
}

TD_TEST(call_payload_argument_kinds)
{
    td_value *p;
    const char *fn;
    const td_value *a, *kw;

    /* NULL args and kwargs: an empty tuple and an empty dict. */
    TD_CHECK_OK(rpc_call_payload("f", NULL, NULL, &p));
    TD_CHECK_OK(rpc_call_parts(p, &fn, &a, &kw));
    TD_CHECK_STR_EQ(fn, "f");
    TD_CHECK_EQ(td_value_kind_of(a), TD_VAL_TUPLE);
    TD_CHECK_EQ(td_value_len(a), 0);
    TD_CHECK_EQ(td_value_kind_of(kw), TD_VAL_DICT);
    TD_CHECK_EQ(td_value_len(kw), 0);
    char *text = td_value_format(p);
    TD_CHECK_STR_EQ(text, "('f', (), {})");
    free(text);
    td_value_release(p);

    /* A tuple goes in as it is; an empty list becomes an empty tuple. */
    td_value *tuple = td_value_tuple_of(2, td_value_int(1), td_value_string("x"));
    TD_CHECK_OK(rpc_call_payload("g", tuple, NULL, &p));
    TD_CHECK_OK(rpc_call_parts(p, NULL, &a, NULL));
    TD_CHECK(td_value_equal(a, tuple));
    td_value_release(p);
    td_value *list = td_value_list_new();
    TD_CHECK_OK(rpc_call_payload("g", list, NULL, &p));
    TD_CHECK_OK(rpc_call_parts(p, NULL, &a, NULL));
    TD_CHECK_EQ(td_value_kind_of(a), TD_VAL_TUPLE);
    td_value_release(p);

    /* Wrong kinds, each named. */
    td_value *num = td_value_int(3);
    TD_CHECK_ERR(rpc_call_payload("f", num, NULL, &p), TD_ERR_INVALID,
                 "args must be a tuple or a list (or NULL), not int");
    TD_CHECK_ERR(rpc_call_payload("f", NULL, list, &p), TD_ERR_INVALID, "kwargs must be a dict (or NULL), not list");
    td_value *int_keys = td_value_dict_new();
    TD_CHECK_OK(td_value_dict_set(int_keys, td_value_int(1), td_value_int(2)));
    TD_CHECK_ERR(rpc_call_payload("f", NULL, int_keys, &p), TD_ERR_INVALID,
                 "keyword argument names must be strings, not int (key 0)");
    TD_CHECK_ERR(rpc_call_payload(NULL, NULL, NULL, &p), TD_ERR_INVALID, "function name is NULL");
    TD_CHECK_ERR(rpc_call_payload("", NULL, NULL, &p), TD_ERR_INVALID, "function name is empty");

    /* Malformed call payloads as a peer could send them. */
    TD_CHECK_ERR(rpc_call_parts(num, &fn, &a, &kw), TD_ERR_INVALID, "expected a tuple (function name, args, kwargs)");
    TD_CHECK_ERR(rpc_call_parts(NULL, &fn, &a, &kw), TD_ERR_INVALID, "got none of length 0");
    td_value *two = td_value_tuple_of(2, td_value_string("f"), td_value_tuple_new(0));
    TD_CHECK_ERR(rpc_call_parts(two, &fn, &a, &kw), TD_ERR_INVALID, "of length 2");
    td_value *bad_name = td_value_tuple_of(3, td_value_int(1), td_value_tuple_new(0), td_value_dict_new());
    TD_CHECK_ERR(rpc_call_parts(bad_name, &fn, &a, &kw), TD_ERR_INVALID, "the function name is int, not a string");
    td_value *empty_name = td_value_tuple_of(3, td_value_string(""), td_value_tuple_new(0), td_value_dict_new());
    TD_CHECK_ERR(rpc_call_parts(empty_name, &fn, &a, &kw), TD_ERR_INVALID, "the function name is empty");
    td_value *nul_name = td_value_tuple_of(3, td_value_string_n("a\0b", 3), td_value_tuple_new(0), td_value_dict_new());
    TD_CHECK_ERR(rpc_call_parts(nul_name, &fn, &a, &kw), TD_ERR_INVALID, "NUL byte");
    td_value *list_args = td_value_tuple_of(3, td_value_string("f"), td_value_list_new(), td_value_dict_new());
    TD_CHECK_ERR(rpc_call_parts(list_args, &fn, &a, &kw), TD_ERR_INVALID, "args is list, not a tuple");
    td_value *bad_kw = td_value_tuple_of(3, td_value_string("f"), td_value_tuple_new(0), td_value_list_new());
    TD_CHECK_ERR(rpc_call_parts(bad_kw, &fn, &a, &kw), TD_ERR_INVALID, "kwargs is list, not a dict");
    td_value *kw_keys = td_value_tuple_of(3, td_value_string("f"), td_value_tuple_new(0), td_value_retain(int_keys));
    TD_CHECK_ERR(rpc_call_parts(kw_keys, &fn, &a, &kw), TD_ERR_INVALID, "keyword argument names must be strings");

    td_value *all[] = {tuple, list, num, int_keys, two, bad_name, empty_name, nul_name, list_args, bad_kw, kw_keys};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_value_release(all[i]);
}

/* ---- replies without payload, errors, corrupt payloads ------------------------------------- */

TD_TEST(empty_payload)
{
    rpc_header h = sample_header();
    h.type = RPC_MSG_REPLY;
    rpc_outgoing *m;
    TD_CHECK_OK(rpc_outgoing_make(&h, NULL, &m));
    TD_CHECK_EQ(rpc_outgoing_size(m), RPC_HEADER_BYTES);
    size_t count;
    rpc_outgoing_iov(m, &count);
    TD_CHECK_EQ(count, 1);
    rpc_header got;
    td_storage *s = receive(m, 0, &got);
    TD_CHECK_EQ(got.payload_len, 0);
    td_value *sentinel = td_value_int(1), *v = sentinel;
    TD_CHECK_OK(rpc_payload_decode(&got, s, &v));
    TD_CHECK(v == NULL); /* None */
    td_value_release(sentinel);
    TD_CHECK_OK(rpc_payload_decode(&got, NULL, &v));
    TD_CHECK(v == NULL);
    td_storage_release(s);
    rpc_outgoing_free(m);
    rpc_outgoing_free(NULL);

    /* An explicit None is a payload like any other. */
    td_value *none = td_value_none();
    TD_CHECK_OK(rpc_outgoing_make(&h, none, &m));
    TD_CHECK(rpc_outgoing_size(m) > RPC_HEADER_BYTES);
    s = receive(m, 0, &got);
    TD_CHECK_OK(rpc_payload_decode(&got, s, &v));
    TD_CHECK(v != NULL && td_value_kind_of(v) == TD_VAL_NONE);
    td_value_release(v);
    td_storage_release(s);
    rpc_outgoing_free(m);
    td_value_release(none);
}

TD_TEST(error_payload)
{
    td_value *e = rpc_error_payload("ValueError", "Expected error");
    rpc_header h = sample_header();
    h.type = RPC_MSG_ERROR;
    h.flags = 0;
    rpc_outgoing *m;
    TD_CHECK_OK(rpc_outgoing_make(&h, e, &m));
    rpc_header got;
    td_storage *s = receive(m, 0, &got);
    TD_CHECK_EQ(got.type, RPC_MSG_ERROR);
    td_value *decoded;
    TD_CHECK_OK(rpc_payload_decode(&got, s, &decoded));
    TD_CHECK_EQ(td_value_record_tag(decoded), TD_REC_ERROR);
    const char *type, *message;
    TD_CHECK_OK(rpc_error_parts(decoded, &type, &message));
    TD_CHECK_STR_EQ(type, "ValueError");
    TD_CHECK_STR_EQ(message, "Expected error");
    td_value_release(decoded);
    td_storage_release(s);
    rpc_outgoing_free(m);
    td_value_release(e);

    /* No type name: RuntimeError; no message: "". */
    e = rpc_error_payload(NULL, NULL);
    TD_CHECK_OK(rpc_error_parts(e, &type, &message));
    TD_CHECK_STR_EQ(type, "RuntimeError");
    TD_CHECK_STR_EQ(message, "");
    td_value_release(e);

    /* Extra trailing fields (a newer peer's origin or trace) are ignored. */
    td_value *longer = td_value_record_of(TD_REC_ERROR, 3, td_value_string("TypeError"), td_value_string("m"),
                                          td_value_worker_info("worker1", 1));
    TD_CHECK_OK(rpc_error_parts(longer, &type, &message));
    TD_CHECK_STR_EQ(type, "TypeError");

    td_value *not_record = td_value_string("ValueError");
    td_value *other_tag = td_value_worker_info("worker0", 0);
    td_value *one_field = td_value_record_of(TD_REC_ERROR, 1, td_value_string("ValueError"));
    td_value *int_message = td_value_record_of(TD_REC_ERROR, 2, td_value_string("ValueError"), td_value_int(3));
    td_value *empty_type = td_value_record_of(TD_REC_ERROR, 2, td_value_string(""), td_value_string("m"));
    TD_CHECK_ERR(rpc_error_parts(not_record, &type, &message), TD_ERR_INVALID, "expected an error record");
    TD_CHECK_ERR(rpc_error_parts(other_tag, &type, &message), TD_ERR_INVALID, "record of another tag");
    TD_CHECK_ERR(rpc_error_parts(one_field, &type, &message), TD_ERR_INVALID, "has 1 fields");
    TD_CHECK_ERR(rpc_error_parts(int_message, &type, &message), TD_ERR_INVALID, "must be strings");
    TD_CHECK_ERR(rpc_error_parts(empty_type, &type, &message), TD_ERR_INVALID, "type name is empty");
    td_value *all[] = {longer, not_record, other_tag, one_field, int_message, empty_type};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        td_value_release(all[i]);
}

TD_TEST(corrupt_payload)
{
    td_value *p;
    TD_CHECK_OK(rpc_call_payload("f", NULL, NULL, &p));
    rpc_header h = sample_header();
    h.id = 42;
    h.sender = 3;
    rpc_outgoing *m;
    TD_CHECK_OK(rpc_outgoing_make(&h, p, &m));
    rpc_header got;
    td_storage *s = receive(m, 0, &got);
    /* Each byte flipped in turn: decoding fails cleanly or yields some value, never crashes. */
    uint8_t *bytes = td_storage_data(s);
    for (size_t i = 0; i < got.payload_len; i++) {
        bytes[i] ^= 0xFF;
        td_value *v = NULL;
        td_status st = rpc_payload_decode(&got, s, &v);
        TD_CHECK(st == TD_OK || st == TD_ERR_INVALID);
        if (st == TD_OK) {
            const char *fn;
            st = rpc_call_parts(v, &fn, NULL, NULL);
            TD_CHECK(st == TD_OK || st == TD_ERR_INVALID);
            td_value_release(v);
        }
        bytes[i] ^= 0xFF;
    }
    /* The error names the message it came from. */
    bytes[0] ^= 0xFF;
    td_value *v;
    TD_CHECK_ERR(rpc_payload_decode(&got, s, &v), TD_ERR_INVALID, "RPC call message 42 from worker 3: ");
    td_storage_release(s);
    rpc_outgoing_free(m);
    td_value_release(p);
}

/* The hello and its answer (docs/protocols.md, "Connections and the hello"): fixed little-endian
 * layouts that round-trip, and readers that refuse unknown flags, statuses and reserved bits. */
TD_TEST(hello_and_answer_forms)
{
    rpc_hello hello = {.auth_flags = RPC_AUTH_HAS_SECRET}, hback;
    for (int i = 0; i < RPC_AUTH_NONCE_BYTES; i++)
        hello.nonce[i] = (uint8_t)i;
    for (int i = 0; i < RPC_AUTH_PROOF_BYTES; i++)
        hello.proof[i] = (uint8_t)(0x80 + i);
    uint8_t hw[RPC_HELLO_PAYLOAD];
    rpc_hello_write(&hello, hw);
    TD_CHECK_EQ(le_at(hw, 4), RPC_AUTH_HAS_SECRET);
    TD_CHECK_EQ(le_at(hw + 4, 4), 0);
    TD_CHECK(memcmp(hw + 8, hello.nonce, 32) == 0 && memcmp(hw + 40, hello.proof, 32) == 0);
    TD_CHECK_OK(rpc_hello_read(hw, &hback));
    TD_CHECK(memcmp(&hback, &hello, sizeof hello) == 0);
    put_at(hw, 2, 4);
    TD_CHECK_ERR(rpc_hello_read(hw, &hback), TD_ERR_INVALID, "RPC hello has unknown auth flags 0x2");
    put_at(hw, 0, 4);
    put_at(hw + 4, RPC_HELLO_CMA, 4);
    TD_CHECK_OK(rpc_hello_read(hw, &hback));
    TD_CHECK_EQ(hback.features, RPC_HELLO_CMA);
    put_at(hw + 4, 2, 4);
    TD_CHECK_ERR(rpc_hello_read(hw, &hback), TD_ERR_INVALID, "RPC hello has unknown features 0x2");

    rpc_answer ans = {.status = RPC_ANSWER_ADMITTED, .auth_flags = RPC_AUTH_HAS_SECRET}, aback;
    memset(ans.proof, 0x5a, sizeof ans.proof);
    uint8_t aw[RPC_ANSWER_PAYLOAD];
    rpc_answer_write(&ans, aw);
    TD_CHECK_EQ(le_at(aw, 4), 0);
    TD_CHECK_EQ(le_at(aw + 4, 4), 1);
    TD_CHECK_OK(rpc_answer_read(aw, &aback));
    TD_CHECK(memcmp(&aback, &ans, sizeof ans) == 0);
    for (unsigned st = RPC_ANSWER_NEEDS_SECRET; st <= RPC_ANSWER_STATUS_MAX; st++) {
        put_at(aw, st, 4);
        TD_CHECK_OK(rpc_answer_read(aw, &aback));
        TD_CHECK_EQ(aback.status, st);
    }
    put_at(aw, RPC_ANSWER_STATUS_MAX + 1, 4);
    TD_CHECK_ERR(rpc_answer_read(aw, &aback), TD_ERR_INVALID, "unknown status 4");
    put_at(aw, 0, 4);
    put_at(aw + 4, 0x10, 4);
    TD_CHECK_ERR(rpc_answer_read(aw, &aback), TD_ERR_INVALID, "unknown auth flags 0x10");
}

/* The single-copy form of a message: which iovecs become pieces, the table's wire form and its
 * checks, and where the stream's bytes go around the pieces. */
TD_TEST(piece_tables)
{
    /* A payload of three large tensors between small values. */
    td_tensor *t[3];
    td_value *list = td_value_list_new();
    for (int i = 0; i < 3; i++) {
        TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(70000 + i), i, &t[i]));
        TD_CHECK_OK(td_value_list_append(list, td_value_int(i)));
        TD_CHECK_OK(td_value_list_append(list, td_value_tensor(t[i])));
    }
    rpc_header h = sample_header();
    rpc_outgoing *m = NULL;
    TD_CHECK_OK(rpc_outgoing_make(&h, list, &m));
    size_t count = 0;
    rpc_outgoing_iov(m, &count);
    struct iovec iov[64];
    TD_CHECK(count + 1 <= 64);
    rpc_pieces p;
    uint8_t hdr[RPC_HEADER_BYTES], table[RPC_PIECES_WIRE_MAX];
    size_t n = 0;
    rpc_outgoing_pieces(m, 1u << 30, &p, hdr, table, iov, &n);
    TD_CHECK_EQ(p.count, 0u); /* none that large */
    rpc_outgoing_pieces(m, 256 << 10, &p, hdr, table, iov, &n);
    TD_CHECK_EQ(p.count, 3u);
    TD_CHECK_EQ(n, 2 + (count - 1 - 3)); /* header, table, the payload iovecs that stay inline */
    rpc_header back;
    TD_CHECK_OK(rpc_header_read(hdr, UINT64_MAX, &back));
    TD_CHECK(back.flags & RPC_FLAG_PIECES);
    uint64_t payload_len = rpc_outgoing_size(m) - RPC_HEADER_BYTES;
    TD_CHECK_EQ(back.payload_len, payload_len);
    for (int i = 0; i < 3; i++) {
        TD_CHECK_EQ(p.piece[i].addr, (uint64_t)(uintptr_t)td_tensor_data(t[i]));
        TD_CHECK_EQ(p.piece[i].len, (uint64_t)(70000 + i) * 4);
    }
    TD_CHECK_EQ(iov[1].iov_len, (size_t)(RPC_PIECES_HEAD + 3 * RPC_PIECE_BYTES));
    uint32_t c = 0;
    TD_CHECK_OK(rpc_pieces_count(table, &c));
    TD_CHECK_EQ(c, 3u);
    rpc_pieces q;
    TD_CHECK_OK(rpc_pieces_read(table + RPC_PIECES_HEAD, c, payload_len, &q));
    TD_CHECK(memcmp(q.piece, p.piece, sizeof(rpc_piece) * 3) == 0);
    TD_CHECK_EQ(q.bytes, p.bytes);
    /* The stream's bytes fill the gaps between the pieces, in order: each stream byte's place and
     * room agree with a walk over the payload's bytes. */
    uint64_t inline_off = 0;
    for (uint64_t at = 0; at < payload_len;) {
        uint32_t k = 0;
        while (k < q.count && !(at >= q.piece[k].offset && at < q.piece[k].offset + q.piece[k].len))
            k++;
        if (k < q.count) {
            at = q.piece[k].offset + q.piece[k].len;
            continue;
        }
        uint64_t run = 0;
        while (at + run < payload_len) {
            uint32_t j2 = 0;
            while (j2 < q.count && q.piece[j2].offset != at + run)
                j2++;
            if (j2 < q.count)
                break;
            run++;
        }
        uint64_t room = 0;
        TD_CHECK_EQ(rpc_pieces_place(&q, payload_len, inline_off, &room), at);
        TD_CHECK_EQ(room, run);
        inline_off += run;
        at += run;
    }
    TD_CHECK_EQ(inline_off, payload_len - q.bytes);

    /* What a reader refuses: counts, order, overlap, bounds, empty pieces, wrapping addresses. */
    uint8_t head[RPC_PIECES_HEAD] = {0};
    TD_CHECK_ERR(rpc_pieces_count(head, &c), TD_ERR_INVALID, "RPC piece table of 0 pieces (1 to 8)");
    put_at(head, RPC_PIECES_MAX + 1, 4);
    TD_CHECK_ERR(rpc_pieces_count(head, &c), TD_ERR_INVALID, "RPC piece table of 9 pieces");
    put_at(head, 1, 4);
    put_at(head + 4, 7, 4);
    TD_CHECK_ERR(rpc_pieces_count(head, &c), TD_ERR_INVALID, "reserved field 0x7");
    uint8_t e[2 * RPC_PIECE_BYTES];
    const struct {
        uint64_t off0, len0, off1, len1, addr1;
        const char *want;
    } bad[] = {
        {0, 0, 10, 1, 1, "RPC piece 0 (bytes 0 to 0) is empty"},
        {0, 10, 5, 10, 1, "RPC piece 1 (bytes 5 to 15) is empty, out of order or outside the payload of 100 bytes"},
        {0, 10, 95, 10, 1, "RPC piece 1 (bytes 95 to 105)"},
        {0, 10, 101, 1, 1, "RPC piece 1 (bytes 101 to 102)"},
        {0, 10, 20, 10, UINT64_MAX - 3, "RPC piece 1's address range wraps around"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put_at(e, bad[i].off0, 8);
        put_at(e + 8, bad[i].len0, 8);
        put_at(e + 16, 4096, 8);
        put_at(e + 24, bad[i].off1, 8);
        put_at(e + 32, bad[i].len1, 8);
        put_at(e + 40, bad[i].addr1, 8);
        TD_CHECK_ERR(rpc_pieces_read(e, 2, 100, &q), TD_ERR_INVALID, bad[i].want);
    }
    rpc_outgoing_free(m);
    td_value_release(list);
    for (int i = 0; i < 3; i++)
        td_tensor_release(t[i]);
}

TD_TEST_MAIN()
