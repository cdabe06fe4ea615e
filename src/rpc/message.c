/* The RPC message envelope (message.h; docs/protocols.md, "RPC messages"): the fixed header's wire
 * form and its checks, outgoing messages as iovecs (the header, then the td_value codec's pieces,
 * which point into the payload's tensors), payload decoding as views of the received storage, and
 * the shapes of call and error payloads, and the fixed forms of the hello and its answer. The agent frames every message it sends or receives with
 * these functions; nothing here does I/O or keeps state. */
#include "rpc/message.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/le.h"

/* Header field offsets (docs/protocols.md). */
enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 4,
    OFF_TYPE = 6,
    OFF_FLAGS = 8,
    OFF_RESERVED = 10,
    OFF_SENDER = 12,
    OFF_ID = 16,
    OFF_TIMEOUT = 24,
    OFF_RREF_OWNER = 32,
    OFF_RREF_LOCAL = 40,
    OFF_FORK_OWNER = 48,
    OFF_FORK_LOCAL = 56,
    OFF_AUTOGRAD_CONTEXT = 64,
    OFF_AUTOGRAD_MESSAGE = 72,
    OFF_PAYLOAD_LEN = 80,
    HEADER_END = 88,
};
_Static_assert(HEADER_END == RPC_HEADER_BYTES, "RPC_HEADER_BYTES must match the header layout");
_Static_assert(8 + RPC_AUTH_NONCE_BYTES + RPC_AUTH_PROOF_BYTES == RPC_HELLO_PAYLOAD, "the hello's layout");
_Static_assert(8 + RPC_AUTH_PROOF_BYTES == RPC_ANSWER_PAYLOAD, "the answer's layout");

static const char *msg_type_name(unsigned type)
{
    switch (type) {
    case RPC_MSG_CALL: return "call";
    case RPC_MSG_REPLY: return "reply";
    case RPC_MSG_ERROR: return "error";
    case RPC_MSG_CONTROL: return "control";
    default: return NULL;
    }
}

void rpc_header_write(const rpc_header *h, void *out)
{
    uint8_t *p = out;
    memset(p, 0, RPC_HEADER_BYTES);
    le_put(p + OFF_MAGIC, RPC_MAGIC, 4);
    le_put(p + OFF_VERSION, RPC_VERSION, 2);
    le_put(p + OFF_TYPE, h->type, 2);
    le_put(p + OFF_FLAGS, h->flags, 2);
    le_put(p + OFF_SENDER, h->sender, 4);
    le_put(p + OFF_ID, h->id, 8);
    le_put(p + OFF_TIMEOUT, (uint64_t)h->timeout_ms, 8);
    le_put(p + OFF_RREF_OWNER, (uint64_t)h->rref_owner, 8);
    le_put(p + OFF_RREF_LOCAL, (uint64_t)h->rref_local, 8);
    le_put(p + OFF_FORK_OWNER, (uint64_t)h->fork_owner, 8);
    le_put(p + OFF_FORK_LOCAL, (uint64_t)h->fork_local, 8);
    le_put(p + OFF_AUTOGRAD_CONTEXT, (uint64_t)h->autograd_context, 8);
    le_put(p + OFF_AUTOGRAD_MESSAGE, (uint64_t)h->autograd_message, 8);
    le_put(p + OFF_PAYLOAD_LEN, h->payload_len, 8);
}

td_status rpc_header_read(const void *in, uint64_t max_payload, rpc_header *h)
{
    if (!in || !h)
        return error_fmt(TD_ERR_INVALID, "rpc_header_read: NULL argument");
    const uint8_t *p = in;
    uint32_t magic = (uint32_t)le_get(p + OFF_MAGIC, 4);
    if (magic != RPC_MAGIC)
        return error_fmt(TD_ERR_INVALID,
                         "RPC message has bad magic 0x%08x (expected 0x%08x, \"TRPC\"): the peer is not a tdist RPC "
                         "agent, or the stream lost its framing",
                         (unsigned)magic, (unsigned)RPC_MAGIC);
    unsigned version = (unsigned)le_get(p + OFF_VERSION, 2);
    if (version != RPC_VERSION)
        return error_fmt(TD_ERR_INVALID, "RPC message of version %u; this tdist speaks version %d", version,
                         RPC_VERSION);
    unsigned type = (unsigned)le_get(p + OFF_TYPE, 2);
    const char *tname = msg_type_name(type);
    if (type < 1 || type > RPC_MSG_TYPE_MAX || !tname)
        return error_fmt(TD_ERR_INVALID, "RPC message of unknown type %u (this tdist knows types 1..%d)", type,
                         RPC_MSG_CONTROL);
    unsigned flags = (unsigned)le_get(p + OFF_FLAGS, 2);
    if (flags & ~(unsigned)RPC_FLAGS_KNOWN)
        return error_fmt(TD_ERR_INVALID, "RPC %s message has unknown flags 0x%x (known flags: 0x%x)", tname, flags,
                         (unsigned)RPC_FLAGS_KNOWN);
    unsigned reserved = (unsigned)le_get(p + OFF_RESERVED, 2);
    if (reserved != 0)
        return error_fmt(TD_ERR_INVALID, "RPC %s message has reserved header field 0x%x at byte %d; it must be 0",
                         tname, reserved, OFF_RESERVED);
    uint64_t payload_len = le_get(p + OFF_PAYLOAD_LEN, 8);
    if (payload_len > max_payload)
        return error_fmt(TD_ERR_INVALID,
                         "RPC %s message declares a payload of %llu bytes, more than the limit of %llu bytes", tname,
                         (unsigned long long)payload_len, (unsigned long long)max_payload);
    h->type = (uint16_t)type;
    h->flags = (uint16_t)flags;
    h->sender = (uint32_t)le_get(p + OFF_SENDER, 4);
    h->id = le_get(p + OFF_ID, 8);
    h->timeout_ms = (int64_t)le_get(p + OFF_TIMEOUT, 8);
    h->rref_owner = (int64_t)le_get(p + OFF_RREF_OWNER, 8);
    h->rref_local = (int64_t)le_get(p + OFF_RREF_LOCAL, 8);
    h->fork_owner = (int64_t)le_get(p + OFF_FORK_OWNER, 8);
    h->fork_local = (int64_t)le_get(p + OFF_FORK_LOCAL, 8);
    h->autograd_context = (int64_t)le_get(p + OFF_AUTOGRAD_CONTEXT, 8);
    h->autograd_message = (int64_t)le_get(p + OFF_AUTOGRAD_MESSAGE, 8);
    h->payload_len = payload_len;
    return TD_OK;
}

/* ---- the hello and its answer --------------------------------------------------------------- */

void rpc_hello_write(const rpc_hello *h, uint8_t out[RPC_HELLO_PAYLOAD])
{
    le_put(out, h->auth_flags, 4);
    le_put(out + 4, h->features, 4);
    memcpy(out + 8, h->nonce, RPC_AUTH_NONCE_BYTES);
    memcpy(out + 8 + RPC_AUTH_NONCE_BYTES, h->proof, RPC_AUTH_PROOF_BYTES);
}

td_status rpc_hello_read(const uint8_t in[RPC_HELLO_PAYLOAD], rpc_hello *h)
{
    uint32_t flags = (uint32_t)le_get(in, 4), features = (uint32_t)le_get(in + 4, 4);
    if (flags & ~(uint32_t)RPC_AUTH_HAS_SECRET)
        return error_fmt(TD_ERR_INVALID, "RPC hello has unknown auth flags 0x%x (known flags: 0x%x)", (unsigned)flags,
                         (unsigned)RPC_AUTH_HAS_SECRET);
    if (features & ~(uint32_t)RPC_HELLO_FEATURES_KNOWN)
        return error_fmt(TD_ERR_INVALID, "RPC hello has unknown features 0x%x (known features: 0x%x)",
                         (unsigned)features, (unsigned)RPC_HELLO_FEATURES_KNOWN);
    h->auth_flags = flags;
    h->features = features;
    memcpy(h->nonce, in + 8, RPC_AUTH_NONCE_BYTES);
    memcpy(h->proof, in + 8 + RPC_AUTH_NONCE_BYTES, RPC_AUTH_PROOF_BYTES);
    return TD_OK;
}

void rpc_answer_write(const rpc_answer *a, uint8_t out[RPC_ANSWER_PAYLOAD])
{
    le_put(out, a->status, 4);
    le_put(out + 4, a->auth_flags, 4);
    memcpy(out + 8, a->proof, RPC_AUTH_PROOF_BYTES);
}

td_status rpc_answer_read(const uint8_t in[RPC_ANSWER_PAYLOAD], rpc_answer *a)
{
    uint32_t status = (uint32_t)le_get(in, 4), flags = (uint32_t)le_get(in + 4, 4);
    if (status > RPC_ANSWER_STATUS_MAX)
        return error_fmt(TD_ERR_INVALID, "RPC hello answered with unknown status %u (known: 0..%d)", (unsigned)status,
                         RPC_ANSWER_STATUS_MAX);
    if (flags & ~(uint32_t)RPC_AUTH_HAS_SECRET)
        return error_fmt(TD_ERR_INVALID, "RPC hello answered with unknown auth flags 0x%x (known flags: 0x%x)",
                         (unsigned)flags, (unsigned)RPC_AUTH_HAS_SECRET);
    a->status = status;
    a->auth_flags = flags;
    memcpy(a->proof, in + 8, RPC_AUTH_PROOF_BYTES);
    return TD_OK;
}

/* ---- single-copy pieces -------------------------------------------------------------------- */

size_t rpc_pieces_write(const rpc_pieces *p, uint8_t *out)
{
    le_put(out, p->count, 4);
    le_put(out + 4, 0, 4);
    uint8_t *e = out + RPC_PIECES_HEAD;
    for (uint32_t i = 0; i < p->count; i++, e += RPC_PIECE_BYTES) {
        le_put(e, p->piece[i].offset, 8);
        le_put(e + 8, p->piece[i].len, 8);
        le_put(e + 16, p->piece[i].addr, 8);
    }
    return RPC_PIECES_HEAD + (size_t)p->count * RPC_PIECE_BYTES;
}

td_status rpc_pieces_count(const uint8_t *head, uint32_t *count)
{
    uint32_t n = (uint32_t)le_get(head, 4), reserved = (uint32_t)le_get(head + 4, 4);
    if (n < 1 || n > RPC_PIECES_MAX)
        return error_fmt(TD_ERR_INVALID, "RPC piece table of %u pieces (1 to %d)", (unsigned)n, RPC_PIECES_MAX);
    if (reserved != 0)
        return error_fmt(TD_ERR_INVALID, "RPC piece table has reserved field 0x%x; it must be 0", (unsigned)reserved);
    *count = n;
    return TD_OK;
}

td_status rpc_pieces_read(const uint8_t *entries, uint32_t count, uint64_t payload_len, rpc_pieces *p)
{
    if (count < 1 || count > RPC_PIECES_MAX)
        return error_fmt(TD_ERR_INVALID, "RPC piece table of %u pieces (1 to %d)", (unsigned)count, RPC_PIECES_MAX);
    p->count = count;
    p->bytes = 0;
    uint64_t end = 0;
    for (uint32_t i = 0; i < count; i++, entries += RPC_PIECE_BYTES) {
        rpc_piece *q = &p->piece[i];
        q->offset = le_get(entries, 8);
        q->len = le_get(entries + 8, 8);
        q->addr = le_get(entries + 16, 8);
        if (q->len == 0 || q->offset < end || q->offset > payload_len || q->len > payload_len - q->offset)
            return error_fmt(TD_ERR_INVALID,
                             "RPC piece %u (bytes %llu to %llu) is empty, out of order or outside the payload of "
                             "%llu bytes",
                             (unsigned)i, (unsigned long long)q->offset, (unsigned long long)(q->offset + q->len),
                             (unsigned long long)payload_len);
        if (q->addr > UINT64_MAX - q->len)
            return error_fmt(TD_ERR_INVALID, "RPC piece %u's address range wraps around", (unsigned)i);
        end = q->offset + q->len;
        p->bytes += q->len;
    }
    return TD_OK;
}

uint64_t rpc_pieces_place(const rpc_pieces *p, uint64_t payload_len, uint64_t inline_off, uint64_t *room)
{
    uint64_t at = inline_off;
    for (uint32_t i = 0; i < p->count; i++) {
        if (p->piece[i].offset > at) {
            *room = p->piece[i].offset - at;
            return at;
        }
        at += p->piece[i].len;
    }
    *room = payload_len - at;
    return at;
}

/* ---- outgoing messages --------------------------------------------------------------------- */

struct rpc_outgoing {
    uint8_t header[RPC_HEADER_BYTES];
    td_encoded *encoded; /* NULL: no payload */
    struct iovec *iov;   /* the header, then the encoded payload's pieces */
    size_t iov_count;
    size_t size;
};

td_status rpc_outgoing_make(const rpc_header *h, const td_value *payload, rpc_outgoing **out)
{
    if (!h || !out)
        return error_fmt(TD_ERR_INVALID, "rpc_outgoing_make: NULL argument");
    td_encoded *encoded = NULL;
    size_t payload_len = 0, piece_count = 0;
    const struct iovec *pieces = NULL;
    if (payload) {
        td_status st = td_value_encode(payload, &encoded);
        if (st != TD_OK)
            return error_prefix(st, "encoding the payload of an RPC %s message",
                                msg_type_name(h->type) ? msg_type_name(h->type) : "unknown");
        payload_len = td_encoded_size(encoded);
        pieces = td_encoded_iov(encoded, &piece_count);
    }
    rpc_outgoing *m = TD_NEW(rpc_outgoing);
    rpc_header filled = *h;
    filled.payload_len = payload_len;
    rpc_header_write(&filled, m->header);
    m->encoded = encoded;
    m->iov_count = 1 + piece_count;
    m->iov = TD_NEW_ARRAY(struct iovec, m->iov_count);
    m->iov[0].iov_base = m->header;
    m->iov[0].iov_len = RPC_HEADER_BYTES;
    if (piece_count)
        memcpy(m->iov + 1, pieces, piece_count * sizeof *pieces);
    m->size = RPC_HEADER_BYTES + payload_len;
    *out = m;
    return TD_OK;
}

size_t rpc_outgoing_size(const rpc_outgoing *m) { return m ? m->size : 0; }

const struct iovec *rpc_outgoing_iov(const rpc_outgoing *m, size_t *count)
{
    if (count)
        *count = m ? m->iov_count : 0;
    return m ? m->iov : NULL;
}

void rpc_outgoing_free(rpc_outgoing *m)
{
    if (!m)
        return;
    td_encoded_free(m->encoded);
    free(m->iov);
    free(m);
}

void rpc_outgoing_pieces(const rpc_outgoing *m, size_t min, rpc_pieces *p, uint8_t hdr[RPC_HEADER_BYTES],
                         uint8_t table[RPC_PIECES_WIRE_MAX], struct iovec *iov, size_t *count)
{
    p->count = 0;
    p->bytes = 0;
    size_t n = 2;
    uint64_t offset = 0;
    for (size_t i = 1; i < m->iov_count; i++) {
        const struct iovec *v = &m->iov[i];
        if (v->iov_len >= min && p->count < RPC_PIECES_MAX) {
            p->piece[p->count++] = (rpc_piece){offset, v->iov_len, (uint64_t)(uintptr_t)v->iov_base};
            p->bytes += v->iov_len;
        } else {
            iov[n++] = *v;
        }
        offset += v->iov_len;
    }
    if (p->count == 0)
        return;
    memcpy(hdr, m->header, RPC_HEADER_BYTES);
    uint16_t flags = (uint16_t)le_get(hdr + OFF_FLAGS, 2);
    le_put(hdr + OFF_FLAGS, flags | RPC_FLAG_PIECES, 2);
    iov[0] = (struct iovec){hdr, RPC_HEADER_BYTES};
    iov[1] = (struct iovec){table, rpc_pieces_write(p, table)};
    *count = n;
}

/* ---- incoming payloads --------------------------------------------------------------------- */

static void release_parent_storage(void *ctx) { td_storage_release(ctx); }

td_status rpc_payload_decode(const rpc_header *h, td_storage *payload, td_value **out)
{
    if (!h || !out)
        return error_fmt(TD_ERR_INVALID, "rpc_payload_decode: NULL argument");
    *out = NULL;
    const char *tname = msg_type_name(h->type) ? msg_type_name(h->type) : "unknown";
    if (h->payload_len == 0)
        return TD_OK; /* no payload: None */
    size_t have = payload ? td_storage_nbytes(payload) : 0;
    if (have < h->payload_len)
        return error_fmt(TD_ERR_INVALID, "RPC %s message %llu: payload of %llu bytes but only %zu bytes were given",
                         tname, (unsigned long long)h->id, (unsigned long long)h->payload_len, have);
    /* The codec wants exactly the message's bytes; a larger receive buffer is viewed through a
     * storage over its first payload_len bytes that keeps the buffer alive. */
    td_storage *message = payload;
    if (have > h->payload_len) {
        td_storage_retain(payload);
        td_status st = td_storage_wrap(td_storage_data(payload), (size_t)h->payload_len, release_parent_storage,
                                       payload, &message);
        if (st != TD_OK) {
            td_storage_release(payload);
            return st;
        }
    } else {
        td_storage_retain(message);
    }
    td_status st = td_value_decode_storage(message, out);
    td_storage_release(message);
    if (st != TD_OK)
        return error_prefix(st, "RPC %s message %llu from worker %u", tname, (unsigned long long)h->id,
                            (unsigned)h->sender);
    return TD_OK;
}

/* ---- payload shapes ------------------------------------------------------------------------ */

/* A non-string key fails with the position of the first one. */
static td_status check_string_keys(const td_value *dict, const char *what)
{
    size_t n = td_value_len(dict);
    for (size_t i = 0; i < n; i++) {
        const td_value *key = td_value_dict_key_at(dict, i);
        if (td_value_kind_of(key) != TD_VAL_STRING)
            return error_fmt(TD_ERR_INVALID, "%s: keyword argument names must be strings, not %s (key %zu)", what,
                             td_value_kind_name(td_value_kind_of(key)), i);
    }
    return TD_OK;
}

td_status rpc_call_payload(const char *fn, const td_value *args, const td_value *kwargs, td_value **out)
{
    static const char what[] = "RPC call";
    if (!out)
        return error_fmt(TD_ERR_INVALID, "rpc_call_payload: NULL out");
    if (!fn || !*fn)
        return error_fmt(TD_ERR_INVALID, "%s: the function name is %s", what, fn ? "empty" : "NULL");
    td_value_kind ak = args ? td_value_kind_of(args) : TD_VAL_TUPLE;
    if (ak != TD_VAL_TUPLE && ak != TD_VAL_LIST)
        return error_fmt(TD_ERR_INVALID, "%s of '%s': args must be a tuple or a list (or NULL), not %s", what, fn,
                         td_value_kind_name(ak));
    if (kwargs) {
        if (td_value_kind_of(kwargs) != TD_VAL_DICT)
            return error_fmt(TD_ERR_INVALID, "%s of '%s': kwargs must be a dict (or NULL), not %s", what, fn,
                             td_value_kind_name(td_value_kind_of(kwargs)));
        TD_TRY(check_string_keys(kwargs, what));
    }
    td_value *arg_tuple;
    if (args && ak == TD_VAL_TUPLE) {
        arg_tuple = td_value_retain((td_value *)args);
    } else {
        size_t n = td_value_len(args);
        arg_tuple = td_value_tuple_new(n);
        for (size_t i = 0; i < n; i++)
            td_value_set(arg_tuple, i, td_value_retain(td_value_at(args, i)));
    }
    td_value *kw = kwargs ? td_value_retain((td_value *)kwargs) : td_value_dict_new();
    *out = td_value_tuple_of(3, td_value_string(fn), arg_tuple, kw);
    return TD_OK;
}

td_status rpc_call_parts(const td_value *payload, const char **fn, const td_value **args, const td_value **kwargs)
{
    static const char what[] = "malformed RPC call payload";
    if (td_value_kind_of(payload) != TD_VAL_TUPLE || td_value_len(payload) != 3)
        return error_fmt(TD_ERR_INVALID, "%s: expected a tuple (function name, args, kwargs), got %s of length %zu", what,
                         td_value_kind_name(td_value_kind_of(payload)), td_value_len(payload));
    const td_value *name = td_value_at(payload, 0), *a = td_value_at(payload, 1), *kw = td_value_at(payload, 2);
    if (td_value_kind_of(name) != TD_VAL_STRING)
        return error_fmt(TD_ERR_INVALID, "%s: the function name is %s, not a string", what,
                         td_value_kind_name(td_value_kind_of(name)));
    size_t name_len;
    const char *name_str = td_value_get_string(name, &name_len);
    if (name_len == 0 || strlen(name_str) != name_len)
        return error_fmt(TD_ERR_INVALID, "%s: the function name is %s", what,
                         name_len ? "not a C string (it holds a NUL byte)" : "empty");
    if (td_value_kind_of(a) != TD_VAL_TUPLE)
        return error_fmt(TD_ERR_INVALID, "%s for '%s': args is %s, not a tuple", what, name_str,
                         td_value_kind_name(td_value_kind_of(a)));
    if (td_value_kind_of(kw) != TD_VAL_DICT)
        return error_fmt(TD_ERR_INVALID, "%s for '%s': kwargs is %s, not a dict", what, name_str,
                         td_value_kind_name(td_value_kind_of(kw)));
    TD_TRY(check_string_keys(kw, what));
    if (fn)
        *fn = name_str;
    if (args)
        *args = a;
    if (kwargs)
        *kwargs = kw;
    return TD_OK;
}

td_value *rpc_error_payload(const char *type_name, const char *message)
{
    return td_value_error(type_name && *type_name ? type_name : "RuntimeError", message ? message : "");
}

td_status rpc_error_parts(const td_value *payload, const char **type_name, const char **message)
{
    static const char what[] = "malformed RPC error payload";
    if (td_value_kind_of(payload) != TD_VAL_RECORD || td_value_record_tag(payload) != TD_REC_ERROR)
        return error_fmt(TD_ERR_INVALID, "%s: expected an error record (tag %d), got %s", what, TD_REC_ERROR,
                         td_value_kind_of(payload) == TD_VAL_RECORD ? "a record of another tag"
                                                                    : td_value_kind_name(td_value_kind_of(payload)));
    /* Later fields (the origin worker, a trace) are allowed, so a newer peer may add them. */
    if (td_value_len(payload) < 2)
        return error_fmt(TD_ERR_INVALID, "%s: the record has %zu fields, expected (type name, message)", what,
                         td_value_len(payload));
    const td_value *t = td_value_at(payload, 0), *m = td_value_at(payload, 1);
    if (td_value_kind_of(t) != TD_VAL_STRING || td_value_kind_of(m) != TD_VAL_STRING)
        return error_fmt(TD_ERR_INVALID, "%s: type name and message must be strings, got %s and %s", what,
                         td_value_kind_name(td_value_kind_of(t)), td_value_kind_name(td_value_kind_of(m)));
    size_t tlen;
    const char *tstr = td_value_get_string(t, &tlen);
    if (tlen == 0 || strlen(tstr) != tlen)
        return error_fmt(TD_ERR_INVALID, "%s: the type name is %s", what,
                         tlen ? "not a C string (it holds a NUL byte)" : "empty");
    if (type_name)
        *type_name = tstr;
    if (message)
        *message = td_value_get_string(m, NULL);
    return TD_OK;
}
