/* The TCPStore wire format (store_proto.h, docs/protocols.md): the request parser the server runs on
 * bytes from the network, and the encoders both sides use. The parser is written as a bounded
 * cursor over the received bytes so that no length from a peer is used before it was checked
 * against what is there and against the configured limits. */
#include "store/store_proto.h"

#include <string.h>

#include "base/env.h"
#include "base/error.h"

td_status store_limits_resolve(size_t max_key, size_t max_value, td_store_limits *out)
{
    uint64_t k = max_key, v = max_value;
    if (!k) {
        const char *e = env_get_str("TDIST_STORE_MAX_KEY", NULL);
        k = TD_STORE_DEFAULT_MAX_KEY;
        if (e)
            TD_TRY(env_parse_size("TDIST_STORE_MAX_KEY", e, &k));
    }
    if (!v) {
        const char *e = env_get_str("TDIST_STORE_MAX_VALUE", NULL);
        v = TD_STORE_DEFAULT_MAX_VALUE;
        if (e)
            TD_TRY(env_parse_size("TDIST_STORE_MAX_VALUE", e, &v));
    }
    if (k < 1 || k > UINT32_MAX)
        return error_fmt(TD_ERR_INVALID, "the TCPStore key limit must be between 1 byte and 4 GiB, got %llu",
                        (unsigned long long)k);
    if (v > ((uint64_t)1 << 48))
        return error_fmt(TD_ERR_INVALID, "the TCPStore value limit must be at most 256 TiB, got %llu",
                        (unsigned long long)v);
    out->max_key = k;
    out->max_value = v;
    return TD_OK;
}

uint64_t store_max_body(const td_store_limits *lim)
{
    return lim->max_key + lim->max_value + TD_STORE_BODY_SLACK;
}

const char *store_cmd_name(int cmd)
{
    static const char *const names[] = {"?", "HELLO", "SET", "GET", "ADD", "COMPARE_SET", "DELETE_KEY", "CHECK",
                                        "NUM_KEYS", "WAIT", "CANCEL", "APPEND", "MULTI_GET", "MULTI_SET", "PING", "AUTH"};
    return cmd >= 1 && cmd <= TD_STORE_CMD_MAX_ ? names[cmd] : "unknown";
}

uint32_t store_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t store_get_u64(const uint8_t *p)
{
    return (uint64_t)store_get_u32(p) | (uint64_t)store_get_u32(p + 4) << 32;
}

void store_parse_header(const uint8_t *hdr, uint8_t *tag, uint64_t *body_len)
{
    *tag = hdr[0];
    *body_len = store_get_u64(hdr + 1);
}

/* A cursor over one request body. Each reader fails (returns false, sets why) instead of reading
 * past the end. */
typedef struct cursor {
    const uint8_t *p;
    size_t left;
    const td_store_limits *lim;
    const char *why;
} cursor;

static bool take(cursor *c, size_t n, const uint8_t **out)
{
    if (c->left < n) {
        c->why = "a field runs past the end of the request";
        return false;
    }
    *out = c->p;
    c->p += n;
    c->left -= n;
    return true;
}

static bool rd_u32(cursor *c, uint32_t *v)
{
    const uint8_t *p;
    if (!take(c, 4, &p))
        return false;
    *v = store_get_u32(p);
    return true;
}

static bool rd_u64(cursor *c, uint64_t *v)
{
    const uint8_t *p;
    if (!take(c, 8, &p))
        return false;
    *v = store_get_u64(p);
    return true;
}

static bool rd_key(cursor *c, td_store_slice *s)
{
    uint32_t n;
    if (!rd_u32(c, &n))
        return false;
    if (n > c->lim->max_key) {
        c->why = "a key is longer than the server's key limit";
        return false;
    }
    if (!take(c, n, &s->data))
        return false;
    s->len = n;
    return true;
}

static bool rd_value(cursor *c, td_store_slice *s)
{
    uint64_t n;
    if (!rd_u64(c, &n))
        return false;
    if (n > c->lim->max_value) {
        c->why = "a value is larger than the server's value limit";
        return false;
    }
    if (!take(c, (size_t)n, &s->data))
        return false;
    s->len = (size_t)n;
    return true;
}

/* A key count: each key needs at least its 4-byte length, so the count is bounded by the body. */
static bool rd_count(cursor *c, size_t min_bytes_each, size_t *n)
{
    uint32_t v;
    if (!rd_u32(c, &v))
        return false;
    if ((uint64_t)v * min_bytes_each > c->left) {
        c->why = "a key count is larger than the request can hold";
        return false;
    }
    if (v > TD_STORE_MAX_KEYS_PER_REQUEST) {
        c->why = "more than 1048576 keys in one request";
        return false;
    }
    *n = v;
    return true;
}

/* A HELLO's nonce or an AUTH's proof: u32 length (at most TD_STORE_MAX_AUTH_FIELD) + bytes. */
static bool rd_auth_field(cursor *c, const char *too_long, td_store_slice *out)
{
    uint32_t n;
    if (!rd_u32(c, &n))
        return false;
    if (n > TD_STORE_MAX_AUTH_FIELD) {
        c->why = too_long;
        return false;
    }
    if (!take(c, n, &out->data))
        return false;
    out->len = n;
    return true;
}

static bool parse_body(cursor *c, uint8_t cmd, td_store_slice_vec *ks, td_store_slice_vec *vs, td_store_request *r)
{
    uint64_t u;
    switch (cmd) {
    case TD_STORE_CMD_HELLO:
        return rd_u32(c, &r->magic) && rd_u32(c, &r->version) &&
               rd_auth_field(c, "the HELLO nonce is longer than 64 bytes", &r->auth);
    case TD_STORE_CMD_AUTH:
        return rd_auth_field(c, "the AUTH proof is longer than 64 bytes", &r->auth);
    case TD_STORE_CMD_SET:
    case TD_STORE_CMD_APPEND:
        return rd_key(c, &r->key) && rd_value(c, &r->value);
    case TD_STORE_CMD_GET:
    case TD_STORE_CMD_DELETE_KEY:
        return rd_key(c, &r->key);
    case TD_STORE_CMD_ADD:
        if (!rd_key(c, &r->key) || !rd_u64(c, &u))
            return false;
        r->delta = (int64_t)u;
        return true;
    case TD_STORE_CMD_COMPARE_SET:
        return rd_key(c, &r->key) && rd_value(c, &r->expected) && rd_value(c, &r->value);
    case TD_STORE_CMD_NUM_KEYS:
    case TD_STORE_CMD_CANCEL:
    case TD_STORE_CMD_PING:
        return true;
    case TD_STORE_CMD_CHECK:
    case TD_STORE_CMD_WAIT:
    case TD_STORE_CMD_MULTI_GET:
    case TD_STORE_CMD_MULTI_SET: {
        bool with_values = cmd == TD_STORE_CMD_MULTI_SET;
        size_t n;
        if (!rd_count(c, with_values ? 12 : 4, &n))
            return false;
        ks->len = 0;
        TD_VEC_RESERVE(ks, n);
        if (with_values) {
            vs->len = 0;
            TD_VEC_RESERVE(vs, n);
        }
        for (size_t i = 0; i < n; i++) {
            if (!rd_key(c, &ks->items[i]))
                return false;
            if (with_values && !rd_value(c, &vs->items[i]))
                return false;
        }
        ks->len = n;
        if (with_values)
            vs->len = n;
        r->nkeys = n;
        r->keys = ks->items;
        r->values = with_values ? vs->items : NULL;
        return true;
    }
    default:
        c->why = "unknown command";
        return false;
    }
}

td_status store_parse_request(const uint8_t *buf, size_t len, const td_store_limits *lim,
                                 td_store_slice_vec *keys_scratch, td_store_slice_vec *values_scratch,
                                 td_store_request *req, size_t *consumed, size_t *frame_len)
{
    *consumed = 0;
    *frame_len = 0;
    if (len < 1)
        return TD_OK;
    uint8_t cmd = buf[0];
    if (cmd < 1 || cmd > TD_STORE_CMD_MAX_)
        return error_fmt(TD_ERR_INVALID, "unknown request type %u (not a tdist TCPStore client, or a newer one?)",
                        cmd);
    if (len < TD_STORE_HEADER_LEN)
        return TD_OK;
    uint64_t body = store_get_u64(buf + 1);
    uint64_t max = store_max_body(lim);
    if (body > max)
        return error_fmt(TD_ERR_INVALID, "%s request of %llu bytes exceeds the limit of %llu bytes (max key %llu, max value %llu; see TDIST_STORE_MAX_KEY and TDIST_STORE_MAX_VALUE)",
                        store_cmd_name(cmd), (unsigned long long)body, (unsigned long long)max,
                        (unsigned long long)lim->max_key, (unsigned long long)lim->max_value);
    *frame_len = TD_STORE_HEADER_LEN + (size_t)body;
    if (len - TD_STORE_HEADER_LEN < body)
        return TD_OK;
    memset(req, 0, sizeof *req);
    req->cmd = cmd;
    cursor c = {.p = buf + TD_STORE_HEADER_LEN, .left = (size_t)body, .lim = lim, .why = NULL};
    if (!parse_body(&c, cmd, keys_scratch, values_scratch, req))
        return error_fmt(TD_ERR_INVALID, "malformed %s request: %s", store_cmd_name(cmd), c.why);
    if (c.left != 0)
        return error_fmt(TD_ERR_INVALID, "malformed %s request: %zu unexpected bytes after its fields",
                        store_cmd_name(cmd), c.left);
    *consumed = *frame_len;
    return TD_OK;
}

void store_put_hello(td_buf *b, uint32_t magic, uint32_t version, const void *nonce, uint32_t nonce_len)
{
    size_t off = store_msg_begin(b, TD_STORE_CMD_HELLO);
    buf_put_u32(b, magic);
    buf_put_u32(b, version);
    buf_put_u32(b, nonce_len);
    buf_append(b, nonce, nonce_len);
    store_msg_end(b, off);
}

size_t store_msg_begin(td_buf *b, uint8_t tag)
{
    size_t off = b->len;
    buf_put_u8(b, tag);
    buf_put_u64(b, 0);
    return off;
}

void store_msg_end(td_buf *b, size_t off)
{
    uint64_t body = b->len - off - TD_STORE_HEADER_LEN;
    uint8_t *p = (uint8_t *)b->data + off + 1;
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(body >> (8 * i));
}

void store_put_key(td_buf *b, const char *prefix, const void *key, size_t len)
{
    size_t plen = prefix ? strlen(prefix) : 0;
    buf_put_u32(b, (uint32_t)(plen + len));
    if (plen)
        buf_append(b, prefix, plen);
    buf_append(b, key, len);
}

void store_put_value(td_buf *b, const void *value, size_t len)
{
    buf_put_u64(b, (uint64_t)len);
    buf_append(b, value, len);
}

void store_put_i64(td_buf *b, int64_t v) { buf_put_u64(b, (uint64_t)v); }

td_status store_check_reply_header(const uint8_t *hdr, uint64_t max_body, uint8_t *kind, uint64_t *body_len)
{
    store_parse_header(hdr, kind, body_len);
    uint64_t limit = *kind == TD_STORE_REPLY_OK ? max_body : 65536;
    if (*kind > TD_STORE_REPLY_CANCELED)
        return error_fmt(TD_ERR_IO, "malformed reply: unknown kind %u", *kind);
    if (*body_len > limit)
        return error_fmt(TD_ERR_IO, "malformed reply: %llu bytes where at most %llu were expected",
                        (unsigned long long)*body_len, (unsigned long long)limit);
    return TD_OK;
}

td_status store_parse_values(const uint8_t *body, size_t len, size_t n, td_store_slice *out)
{
    if (len < 4 || store_get_u32(body) != n)
        return error_fmt(TD_ERR_IO, "malformed MULTI_GET reply: wrong value count");
    size_t off = 4;
    for (size_t i = 0; i < n; i++) {
        if (len - off < 8)
            return error_fmt(TD_ERR_IO, "malformed MULTI_GET reply: value %zu is cut off", i);
        uint64_t vlen = store_get_u64(body + off);
        off += 8;
        if (vlen > len - off)
            return error_fmt(TD_ERR_IO, "malformed MULTI_GET reply: value %zu runs past the end", i);
        out[i].data = body + off;
        out[i].len = (size_t)vlen;
        off += (size_t)vlen;
    }
    if (off != len)
        return error_fmt(TD_ERR_IO, "malformed MULTI_GET reply: %zu bytes after the values", len - off);
    return TD_OK;
}
