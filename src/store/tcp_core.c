/* The TCPStore server's state machine (tcp_core.h): keys and values, per-connection protocol state
 * and the wait lists that let the server hold blocked requests instead of having clients poll.
 *
 * Parking: a GET, WAIT or MULTI_GET whose keys are not all present copies its keys into the
 * connection and puts the connection on the wait list of each missing key. A write to a key takes
 * that key's list and re-examines each connection on it: it is answered if all its keys are now
 * present, else parked again on the ones still missing. A connection has at most one request in
 * flight while parked (clients send nothing but CANCEL then), so a parked request never delays
 * another client's. Timeouts are the client's business: it sends CANCEL when its deadline passes,
 * and the server needs no timers. */
#include "store/tcp_core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/map.h"
#include "base/vec.h"
#include "store/store_impl.h"

#define BACKLOG_BYTES ((size_t)4 << 20)

typedef struct sval {
    size_t len, cap;
    char data[];
} sval;

typedef struct key_ref {
    size_t off, len;
} key_ref;

typedef TD_VEC(td_store_conn *) conn_vec;

struct td_store_conn {
    void *user;
    td_buf in;
    td_buf out;
    size_t out_off;   /* bytes of out already sent */
    size_t want;      /* frame size of the partial request in `in`, when known */
    bool hello_done; /* HELLO accepted */
    bool authed;     /* and the client proved the secret (or the server has none) */
    uint8_t client_nonce[AUTH_NONCE_LEN], server_nonce[AUTH_NONCE_LEN];
    bool closing;
    bool dirty;
    uint8_t parked;   /* 0, or the command waiting: GET, WAIT or MULTI_GET */
    td_buf park_keys; /* the parked request's keys, back to back */
    TD_VEC(key_ref) park_refs;
    size_t index;     /* position in core->conns */
};

struct td_store_core {
    td_store_limits lim;
    uint64_t max_reply;
    auth_key key;
    td_map values;  /* key -> sval* */
    td_map waiters; /* key -> conn_vec* */
    conn_vec conns;
    conn_vec dirty;
    size_t parked;
    td_store_slice_vec ks, vs; /* parser scratch */
};

td_store_core *store_core_new(const td_store_limits *lim, const auth_key *key)
{
    td_store_core *c = TD_NEW(td_store_core);
    c->lim = *lim;
    c->max_reply = TD_STORE_DEFAULT_MAX_REPLY;
    if (lim->max_value + TD_STORE_BODY_SLACK > c->max_reply)
        c->max_reply = lim->max_value + TD_STORE_BODY_SLACK;
    if (key)
        c->key = *key;
    return c;
}

void store_core_set_max_reply(td_store_core *core, uint64_t max_reply) { core->max_reply = max_reply; }
uint64_t store_core_max_reply(const td_store_core *core) { return core->max_reply; }

static void free_conn(td_store_conn *c)
{
    buf_free(&c->in);
    buf_free(&c->out);
    buf_free(&c->park_keys);
    TD_VEC_FREE(&c->park_refs);
    free(c);
}

static void free_waitlist(void *p)
{
    conn_vec *v = p;
    TD_VEC_FREE(v);
    free(v);
}

void store_core_free(td_store_core *core)
{
    if (!core)
        return;
    for (size_t i = 0; i < core->conns.len; i++)
        free_conn(core->conns.items[i]);
    TD_VEC_FREE(&core->conns);
    TD_VEC_FREE(&core->dirty);
    map_free(&core->values, free);
    map_free(&core->waiters, free_waitlist);
    TD_VEC_FREE(&core->ks);
    TD_VEC_FREE(&core->vs);
    free(core);
}

td_store_conn *store_core_attach(td_store_core *core, void *user)
{
    td_store_conn *c = TD_NEW(td_store_conn);
    c->user = user;
    c->index = core->conns.len;
    TD_VEC_PUSH(&core->conns, c);
    return c;
}

void *store_conn_user(const td_store_conn *conn) { return conn->user; }
td_buf *store_conn_input(td_store_conn *conn) { return &conn->in; }

size_t store_conn_input_want(const td_store_conn *conn)
{
    return conn->want > conn->in.len ? conn->want - conn->in.len : 0;
}

const uint8_t *store_conn_output(const td_store_conn *conn, size_t *len)
{
    *len = conn->out.len - conn->out_off;
    return (const uint8_t *)conn->out.data + conn->out_off;
}

void store_conn_output_done(td_store_conn *conn, size_t n)
{
    conn->out_off += n;
    if (conn->out_off >= conn->out.len) {
        conn->out.len = 0;
        conn->out_off = 0;
        /* Give back the memory of a huge answer once it is sent. */
        if (conn->out.cap > BACKLOG_BYTES)
            buf_free(&conn->out);
    }
}

bool store_conn_closing(const td_store_conn *conn) { return conn->closing; }
bool store_conn_authenticated(const td_store_conn *conn) { return conn->authed; }

size_t store_conn_preauth_room(const td_store_conn *conn)
{
    if (conn->authed)
        return SIZE_MAX;
    size_t max = TD_STORE_HEADER_LEN + TD_STORE_HELLO_MAX_BODY;
    return conn->in.len < max ? max - conn->in.len : 0;
}

bool store_conn_backlogged(const td_store_conn *conn) { return conn->out.len - conn->out_off > BACKLOG_BYTES; }

td_store_conn *store_core_pop_dirty(td_store_core *core)
{
    if (core->dirty.len == 0)
        return NULL;
    td_store_conn *c = core->dirty.items[--core->dirty.len];
    c->dirty = false;
    return c;
}

size_t store_core_num_conns(const td_store_core *core) { return core->conns.len; }
td_store_conn *store_core_conn(const td_store_core *core, size_t i) { return core->conns.items[i]; }
/* The keys c10d would count: all but the client's own world-size bookkeeping (store_proto.h). */
size_t store_core_num_keys(const td_store_core *core)
{
    static const char *const hidden[] = {TD_STORE_INIT_WORLD_KEY, TD_STORE_INIT_ERROR_KEY};
    size_t n = core->values.len;
    for (size_t i = 0; i < sizeof hidden / sizeof *hidden; i++)
        n -= map_get(&core->values, hidden[i], strlen(hidden[i])) != NULL;
    return n;
}
size_t store_core_num_parked(const td_store_core *core) { return core->parked; }

/* ---- replies ------------------------------------------------------------------------------------ */

static void mark_dirty(td_store_core *core, td_store_conn *c)
{
    if (!c->dirty) {
        c->dirty = true;
        TD_VEC_PUSH(&core->dirty, c);
    }
}

static size_t reply_begin(td_store_core *core, td_store_conn *c, uint8_t kind)
{
    mark_dirty(core, c);
    return store_msg_begin(&c->out, kind);
}

static void reply_empty(td_store_core *core, td_store_conn *c, uint8_t kind)
{
    size_t off = reply_begin(core, c, kind);
    store_msg_end(&c->out, off);
}

/* An error answer for a request that was understood but failed (the connection stays). */
static void reply_error(td_store_core *core, td_store_conn *c, td_status code, const char *msg);

/* Makes room for an OK reply of body bytes, or answers an ERROR instead: a reply over the limit is
 * refused before anything is built, and an allocation that fails fails this request only. */
static bool reply_room(td_store_core *core, td_store_conn *c, const char *what, uint64_t body)
{
    if (body > core->max_reply) {
        char msg[256];
        snprintf(msg, sizeof msg, "the %s reply would be %llu bytes, over the server's reply limit of %llu bytes "
                 "(TDIST_STORE_MAX_REPLY); ask for fewer or smaller values at once", what,
                 (unsigned long long)body, (unsigned long long)core->max_reply);
        reply_error(core, c, TD_ERR_INVALID, msg);
        return false;
    }
    if (buf_try_reserve(&c->out, TD_STORE_HEADER_LEN + (size_t)body) != TD_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "the TCPStore server could not allocate the %s reply of %llu bytes: %s", what,
                 (unsigned long long)body, td_last_error());
        reply_error(core, c, TD_ERR_NOMEM, msg);
        return false;
    }
    return true;
}

static void reply_bytes(td_store_core *core, td_store_conn *c, const void *data, size_t len)
{
    if (!reply_room(core, c, "value", len))
        return;
    size_t off = reply_begin(core, c, TD_STORE_REPLY_OK);
    buf_append(&c->out, data, len);
    store_msg_end(&c->out, off);
}

static void reply_u8(td_store_core *core, td_store_conn *c, uint8_t v) { reply_bytes(core, c, &v, 1); }

static void reply_i64(td_store_core *core, td_store_conn *c, int64_t v)
{
    size_t off = reply_begin(core, c, TD_STORE_REPLY_OK);
    store_put_i64(&c->out, v);
    store_msg_end(&c->out, off);
}

static void reply_error(td_store_core *core, td_store_conn *c, td_status code, const char *msg)
{
    size_t off = reply_begin(core, c, TD_STORE_REPLY_ERROR);
    buf_put_u32(&c->out, (uint32_t)(int32_t)code);
    buf_append_str(&c->out, msg);
    store_msg_end(&c->out, off);
}

/* ---- values ------------------------------------------------------------------------------------- */

static sval *lookup(td_store_core *core, td_store_slice k) { return map_get(&core->values, k.data, k.len); }

/* Stores len bytes (from up to two pieces, for append) at key, reusing the old block when it fits. */
static td_status store_value(td_store_core *core, td_store_slice k, const void *a, size_t alen, const void *b,
                             size_t blen)
{
    sval *old = lookup(core, k);
    size_t len = alen + blen;
    if (len > core->lim.max_value)
        return error_fmt(TD_ERR_INVALID, "the value of key '%.*s' would be %zu bytes, over the server's limit of %llu "
                        "bytes (TDIST_STORE_MAX_VALUE)", (int)(k.len > 200 ? 200 : k.len), (const char *)k.data, len,
                        (unsigned long long)core->lim.max_value);
    if (old && old->cap >= len) {
        if (a != old->data && alen)
            memmove(old->data, a, alen);
        if (blen)
            memcpy(old->data + alen, b, blen);
        old->len = len;
        return TD_OK;
    }
    /* Appends grow the block geometrically so that n appends cost O(n) copies, not O(n^2). */
    size_t cap = len;
    if (blen && old && old->cap < core->lim.max_value / 2 && len < old->cap * 2)
        cap = old->cap * 2;
    sval *v = NULL;
    TD_TRY(alloc_try(sizeof *v + cap + 1, "TCPStore value", (void **)&v));
    v->len = len;
    v->cap = cap;
    if (alen)
        memcpy(v->data, a, alen);
    if (blen)
        memcpy(v->data + alen, b, blen);
    map_put(&core->values, k.data, k.len, v);
    free(old);
    return TD_OK;
}

/* ---- parking ------------------------------------------------------------------------------------ */

static td_store_slice park_key(const td_store_conn *c, size_t i)
{
    td_store_slice s = {(const uint8_t *)c->park_keys.data + c->park_refs.items[i].off, c->park_refs.items[i].len};
    return s;
}

static void answer_parked(td_store_core *core, td_store_conn *c)
{
    switch (c->parked) {
    case TD_STORE_CMD_GET: {
        sval *v = lookup(core, park_key(c, 0));
        reply_bytes(core, c, v->data, v->len);
        break;
    }
    case TD_STORE_CMD_WAIT:
        reply_empty(core, c, TD_STORE_REPLY_OK);
        break;
    case TD_STORE_CMD_MULTI_GET: {
        /* Sized before it is built: n copies of a large value must not make the server allocate
         * n times its size (at most 2^20 keys of at most 2^48 bytes: no overflow). */
        uint64_t body = 4;
        for (size_t i = 0; i < c->park_refs.len; i++)
            body += 8 + (uint64_t)lookup(core, park_key(c, i))->len;
        if (!reply_room(core, c, "MULTI_GET", body))
            break;
        size_t off = reply_begin(core, c, TD_STORE_REPLY_OK);
        buf_put_u32(&c->out, (uint32_t)c->park_refs.len);
        for (size_t i = 0; i < c->park_refs.len; i++) {
            sval *v = lookup(core, park_key(c, i));
            store_put_value(&c->out, v->data, v->len);
        }
        store_msg_end(&c->out, off);
        break;
    }
    default:
        break;
    }
}

static void waitlist_remove(td_store_core *core, td_store_slice k, td_store_conn *c)
{
    conn_vec *wl = map_get(&core->waiters, k.data, k.len);
    if (!wl)
        return;
    for (size_t i = 0; i < wl->len;) {
        if (wl->items[i] == c)
            TD_VEC_SWAP_REMOVE(wl, i);
        else
            i++;
    }
    if (wl->len == 0)
        free_waitlist(map_remove(&core->waiters, k.data, k.len));
}

/* Takes c off every wait list and clears its parked request. */
static void unpark(td_store_core *core, td_store_conn *c)
{
    if (!c->parked)
        return;
    for (size_t i = 0; i < c->park_refs.len; i++)
        waitlist_remove(core, park_key(c, i), c);
    c->parked = 0;
    c->park_refs.len = 0;
    buf_clear(&c->park_keys);
    core->parked--;
}

/* Answers c's request if all its keys exist, else puts it on the wait list of each missing key. */
static void try_answer(td_store_core *core, td_store_conn *c)
{
    bool all = true;
    for (size_t i = 0; i < c->park_refs.len; i++) {
        td_store_slice k = park_key(c, i);
        if (lookup(core, k))
            continue;
        all = false;
        conn_vec *wl = map_get(&core->waiters, k.data, k.len);
        if (!wl) {
            wl = TD_NEW(conn_vec);
            map_put(&core->waiters, k.data, k.len, wl);
        }
        TD_VEC_PUSH(wl, c);
    }
    if (all) {
        answer_parked(core, c);
        c->parked = 0;
        c->park_refs.len = 0;
        buf_clear(&c->park_keys);
        core->parked--;
    }
}

static void park(td_store_core *core, td_store_conn *c, uint8_t cmd, const td_store_slice *keys, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += keys[i].len;
    buf_clear(&c->park_keys);
    if (buf_try_reserve(&c->park_keys, total) != TD_OK) {
        reply_error(core, c, TD_ERR_NOMEM, td_last_error());
        return;
    }
    c->parked = cmd;
    core->parked++;
    c->park_refs.len = 0;
    for (size_t i = 0; i < n; i++) {
        key_ref r = {c->park_keys.len, keys[i].len};
        buf_append(&c->park_keys, keys[i].data, keys[i].len);
        TD_VEC_PUSH(&c->park_refs, r);
    }
    try_answer(core, c);
}

/* After a write to k: re-examine every connection waiting on it. */
static void wake(td_store_core *core, td_store_slice k)
{
    if (core->waiters.len == 0)
        return;
    conn_vec *wl = map_remove(&core->waiters, k.data, k.len);
    if (!wl)
        return;
    for (size_t i = 0; i < wl->len; i++) {
        td_store_conn *c = wl->items[i];
        if (!c->parked)
            continue; /* listed twice (a key repeated in its request) and already answered */
        uint8_t cmd = c->parked;
        /* Leave the other lists; try_answer re-registers on the keys still missing. */
        for (size_t j = 0; j < c->park_refs.len; j++)
            waitlist_remove(core, park_key(c, j), c);
        c->parked = cmd;
        try_answer(core, c);
    }
    free_waitlist(wl);
}

/* ---- requests ----------------------------------------------------------------------------------- */

static bool all_present(td_store_core *core, const td_store_slice *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!lookup(core, keys[i]))
            return false;
    return true;
}

static void shown_key(td_store_slice k, char *out, size_t size)
{
    size_t n = k.len < size - 1 ? k.len : size - 1;
    memcpy(out, k.data, n);
    out[n] = '\0';
}

/* Refuses the handshake: an ERROR the client reads, then the close. */
static td_status refuse(td_store_core *core, td_store_conn *c, td_status code, const char *msg)
{
    reply_error(core, c, code, msg);
    c->closing = true;
    return TD_OK;
}

static td_status handle_hello(td_store_core *core, td_store_conn *c, const td_store_request *r)
{
    if (c->hello_done)
        return error_fmt(TD_ERR_INVALID, "a second HELLO on one connection");
    if (r->magic != TD_STORE_PROTO_MAGIC)
        return error_fmt(TD_ERR_INVALID, "HELLO with a wrong magic number (not a tdist TCPStore client)");
    if (r->version != TD_STORE_PROTO_VERSION) {
        char msg[160];
        snprintf(msg, sizeof msg, "unsupported TCPStore protocol version %u; this server speaks version %u",
                 r->version, TD_STORE_PROTO_VERSION);
        return refuse(core, c, TD_ERR_UNSUPPORTED, msg);
    }
    if (r->auth.len != AUTH_NONCE_LEN)
        return refuse(core, c, TD_ERR_INVALID, "HELLO without a 32-byte client nonce");
    c->hello_done = true;
    c->authed = !core->key.on;
    size_t off = reply_begin(core, c, TD_STORE_REPLY_OK);
    buf_put_u32(&c->out, TD_STORE_PROTO_VERSION);
    buf_put_u64(&c->out, core->lim.max_key);
    buf_put_u64(&c->out, core->lim.max_value);
    buf_put_u8(&c->out, core->key.on);
    if (core->key.on) {
        /* The challenge, and this server's proof that it holds the secret: over the client's fresh
         * nonce, so a recorded answer proves nothing to another client. */
        memcpy(c->client_nonce, r->auth.data, AUTH_NONCE_LEN);
        auth_nonce(c->server_nonce);
        auth_part parts[2] = {{c->client_nonce, AUTH_NONCE_LEN}, {c->server_nonce, AUTH_NONCE_LEN}};
        uint8_t mac[AUTH_MAC_LEN];
        auth_prove(&core->key, "tdist store server", parts, 2, mac);
        buf_append(&c->out, c->server_nonce, AUTH_NONCE_LEN);
        buf_append(&c->out, mac, AUTH_MAC_LEN);
    }
    store_msg_end(&c->out, off);
    return TD_OK;
}

/* The client's proof, over this connection's server nonce (fresh) and its own. */
static td_status handle_auth(td_store_core *core, td_store_conn *c, const td_store_request *r)
{
    if (!c->hello_done || c->authed)
        return error_fmt(TD_ERR_INVALID, "AUTH %s", c->authed ? "on an authenticated connection" : "before HELLO");
    auth_part parts[2] = {{c->server_nonce, AUTH_NONCE_LEN}, {c->client_nonce, AUTH_NONCE_LEN}};
    if (r->auth.len != AUTH_MAC_LEN || !auth_check(&core->key, "tdist store client", parts, 2, r->auth.data))
        return refuse(core, c, TD_ERR_INVALID,
                      "authentication failed: the client's TDIST_AUTH_TOKEN does not match the server's");
    c->authed = true;
    reply_empty(core, c, TD_STORE_REPLY_OK);
    return TD_OK;
}

static td_status handle(td_store_core *core, td_store_conn *c, const td_store_request *r)
{
    if (r->cmd == TD_STORE_CMD_HELLO)
        return handle_hello(core, c, r);
    if (r->cmd == TD_STORE_CMD_AUTH)
        return handle_auth(core, c, r);
    if (!c->authed)
        return error_fmt(TD_ERR_INVALID, "%s request before the handshake", store_cmd_name(r->cmd));
    if (r->cmd == TD_STORE_CMD_CANCEL) {
        unpark(core, c);
        reply_empty(core, c, TD_STORE_REPLY_CANCELED);
        return TD_OK;
    }
    if (c->parked)
        return error_fmt(TD_ERR_INVALID, "%s request while a %s is pending (only CANCEL may follow a blocked request)",
                        store_cmd_name(r->cmd), store_cmd_name(c->parked));
    td_status s = TD_OK;
    switch (r->cmd) {
    case TD_STORE_CMD_SET:
        s = store_value(core, r->key, r->value.data, r->value.len, NULL, 0);
        if (s == TD_OK) {
            reply_empty(core, c, TD_STORE_REPLY_OK);
            wake(core, r->key);
        }
        break;
    case TD_STORE_CMD_APPEND: {
        sval *old = lookup(core, r->key);
        if (old && r->value.len > SIZE_MAX / 2) {
            s = error_fmt(TD_ERR_INVALID, "append too large");
            break;
        }
        s = old ? store_value(core, r->key, old->data, old->len, r->value.data, r->value.len)
                : store_value(core, r->key, r->value.data, r->value.len, NULL, 0);
        if (s == TD_OK) {
            reply_empty(core, c, TD_STORE_REPLY_OK);
            wake(core, r->key);
        }
        break;
    }
    case TD_STORE_CMD_GET: {
        sval *v = lookup(core, r->key);
        if (v)
            reply_bytes(core, c, v->data, v->len);
        else
            park(core, c, TD_STORE_CMD_GET, &r->key, 1);
        break;
    }
    case TD_STORE_CMD_ADD: {
        char key[256];
        shown_key(r->key, key, sizeof key);
        sval *v = lookup(core, r->key);
        int64_t cur = 0, next = 0;
        s = v ? store_parse_counter(key, v->data, v->len, &cur) : TD_OK;
        if (s == TD_OK)
            s = store_counter_add(key, cur, r->delta, &next);
        if (s == TD_OK) {
            char text[24];
            size_t n = store_format_counter(next, text);
            s = store_value(core, r->key, text, n, NULL, 0);
        }
        if (s == TD_OK) {
            reply_i64(core, c, next);
            wake(core, r->key);
        }
        break;
    }
    case TD_STORE_CMD_COMPARE_SET: {
        sval *v = lookup(core, r->key);
        bool write;
        const void *res;
        size_t res_len;
        store_compare_set_decide(v != NULL, v ? v->data : NULL, v ? v->len : 0, r->expected.data,
                                    r->expected.len, r->value.data, r->value.len, &write, &res, &res_len);
        if (!write) {
            reply_bytes(core, c, res, res_len);
            break;
        }
        /* Writing answers `desired`, which lives in the request, not in the value being replaced. */
        s = store_value(core, r->key, r->value.data, r->value.len, NULL, 0);
        if (s == TD_OK) {
            reply_bytes(core, c, r->value.data, r->value.len);
            wake(core, r->key);
        }
        break;
    }
    case TD_STORE_CMD_DELETE_KEY: {
        sval *v = map_remove(&core->values, r->key.data, r->key.len);
        reply_u8(core, c, v != NULL);
        free(v);
        break;
    }
    case TD_STORE_CMD_CHECK:
        reply_u8(core, c, all_present(core, r->keys, r->nkeys));
        break;
    case TD_STORE_CMD_NUM_KEYS:
        reply_i64(core, c, (int64_t)store_core_num_keys(core));
        break;
    case TD_STORE_CMD_WAIT:
    case TD_STORE_CMD_MULTI_GET:
        park(core, c, r->cmd, r->keys, r->nkeys);
        break;
    case TD_STORE_CMD_MULTI_SET:
        for (size_t i = 0; s == TD_OK && i < r->nkeys; i++)
            s = store_value(core, r->keys[i], r->values[i].data, r->values[i].len, NULL, 0);
        if (s == TD_OK) {
            reply_empty(core, c, TD_STORE_REPLY_OK);
            for (size_t i = 0; i < r->nkeys; i++)
                wake(core, r->keys[i]);
        }
        break;
    case TD_STORE_CMD_PING:
        reply_empty(core, c, TD_STORE_REPLY_OK);
        break;
    default:
        return error_fmt(TD_ERR_INVALID, "unknown request type %u", r->cmd);
    }
    if (s != TD_OK)
        reply_error(core, c, s, td_last_error());
    return TD_OK;
}

/* Before the handshake is done: only HELLO, then AUTH, each of at most TD_STORE_HELLO_MAX_BODY
 * bytes, judged from the first byte and the header, so that no body of another request is ever
 * received or buffered from a client that has not proved the secret. */
static td_status check_preauth(const td_store_conn *c, const uint8_t *p, size_t len)
{
    if (len < 1)
        return TD_OK;
    uint8_t next = c->hello_done ? TD_STORE_CMD_AUTH : TD_STORE_CMD_HELLO;
    if (p[0] != next)
        return error_fmt(TD_ERR_INVALID, "%s request before the handshake (only HELLO, then AUTH, are accepted)",
                         store_cmd_name(p[0]));
    if (len < TD_STORE_HEADER_LEN)
        return TD_OK;
    uint64_t body = store_get_u64(p + 1);
    if (body > TD_STORE_HELLO_MAX_BODY)
        return error_fmt(TD_ERR_INVALID, "%s of %llu bytes is larger than a handshake may be (%u bytes)",
                         store_cmd_name(p[0]), (unsigned long long)body, TD_STORE_HELLO_MAX_BODY);
    return TD_OK;
}

td_status store_core_process(td_store_core *core, td_store_conn *c)
{
    size_t off = 0;
    td_status s = TD_OK;
    /* A connection that has not received a byte yet has no input storage: parse an empty string
     * rather than offset a null pointer (undefined behaviour). */
    const uint8_t *in = c->in.data ? (const uint8_t *)c->in.data : (const uint8_t *)"";
    while (!c->closing && !store_conn_backlogged(c)) {
        if (!c->authed && (s = check_preauth(c, in + off, c->in.len - off)) != TD_OK)
            break;
        td_store_request req;
        size_t used = 0, frame = 0;
        s = store_parse_request(in + off, c->in.len - off, &core->lim, &core->ks,
                                   &core->vs, &req, &used, &frame);
        if (s != TD_OK || used == 0) {
            c->want = frame;
            break;
        }
        s = handle(core, c, &req);
        off += used;
        c->want = 0;
        if (s != TD_OK)
            break;
    }
    if (off)
        buf_consume(&c->in, off);
    return s;
}

void store_core_detach(td_store_core *core, td_store_conn *c)
{
    unpark(core, c);
    if (c->dirty) {
        for (size_t i = 0; i < core->dirty.len; i++) {
            if (core->dirty.items[i] == c) {
                TD_VEC_SWAP_REMOVE(&core->dirty, i);
                break;
            }
        }
    }
    size_t i = c->index;
    TD_VEC_SWAP_REMOVE(&core->conns, i);
    if (i < core->conns.len)
        core->conns.items[i]->index = i;
    free_conn(c);
}
