/* TCPStore (tdist/store.h): the client handle, and the server it starts on the master.
 *
 * Each handle is one TCP connection and a mutex; a call builds its request in a reused buffer,
 * sends it and reads the answer, so after warm-up a call allocates nothing but the value it
 * returns. User keys travel as "/" + key (c10d's key prefix), which keeps them apart from the
 * internal "init/" counter that wait_for_workers uses.
 *
 * Failure handling: timeouts are enforced here, not on the server. When a blocked GET, WAIT or
 * MULTI_GET reaches its deadline the client sends CANCEL and reads until the server's CANCELED
 * (dropping the real answer if it raced the cancel), then reports "Socket Timeout"; a connection
 * that cannot be resynchronized is closed and reopened by the next call. A connection the server
 * closed (its process died) fails this and every later call at once with TD_ERR_PEER_LOST. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"
#include "net/addr.h"
#include "net/auth.h"
#include "net/io.h"
#include "net/socket.h"
#include "store/store_impl.h"
#include "store/store_proto.h"
#include "store/tcp_server.h"
#include "store/tcp_store.h"

#define KEY_PREFIX "/"
#define INIT_KEY "init/"
/* How long a client waits for the server to confirm a CANCEL before dropping the connection. */
#define CANCEL_GRACE_MS 5000
#define WORKER_POLL_MS 10
#define WORKER_REPORT_MS 5000 /* how often a master waiting for ranks says how many are missing */
/* How long a handle tries to reopen a connection it dropped before declaring the server gone. */
#define RECONNECT_MS 2000
/* Sets sent without waiting for their answers, at most, before a set waits for them. */
#define MAX_UNACKED_SETS 1024

/* ---- the servers this process runs (shared per port when multi_tenant) -------------------------- */

typedef struct server_ref {
    td_store_server *server;
    int port;
    int refs;
    bool shared;
    struct server_ref *next;
} server_ref;

static pthread_mutex_t g_servers_mu = PTHREAD_MUTEX_INITIALIZER;
static server_ref *g_servers;

static td_status server_acquire(const td_tcp_store_options *o, server_ref **out)
{
    pthread_mutex_lock(&g_servers_mu);
    if (o->multi_tenant && o->port != 0) {
        for (server_ref *r = g_servers; r; r = r->next) {
            if (r->shared && r->port == o->port) {
                r->refs++;
                pthread_mutex_unlock(&g_servers_mu);
                *out = r;
                return TD_OK;
            }
        }
    }
    td_store_server_options so = {.host = o->host, .port = o->port, .auth_token = o->auth_token,
                                  .max_key_len = o->max_key_len, .max_value_len = o->max_value_len};
    td_store_server *srv = NULL;
    td_status s = store_server_start(&so, &srv);
    if (s != TD_OK) {
        pthread_mutex_unlock(&g_servers_mu);
        return s;
    }
    server_ref *r = TD_NEW(server_ref);
    r->server = srv;
    r->port = store_server_port(srv);
    r->refs = 1;
    r->shared = o->multi_tenant;
    r->next = g_servers;
    g_servers = r;
    pthread_mutex_unlock(&g_servers_mu);
    *out = r;
    return TD_OK;
}

static void server_release(server_ref *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&g_servers_mu);
    bool last = --r->refs == 0;
    if (last) {
        for (server_ref **p = &g_servers; *p; p = &(*p)->next) {
            if (*p == r) {
                *p = r->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&g_servers_mu);
    if (last) {
        store_server_stop(r->server);
        free(r);
    }
}

/* ---- the client ------------------------------------------------------------------------------- */

typedef struct tcp_store {
    td_store base;
    pthread_mutex_t mu;
    int fd;    /* -1: not connected (reconnects on the next call unless lost) */
    bool lost; /* the server closed the connection: it is gone */
    char lost_why[512];
    char *host;
    int port;
    char where[TD_ADDR_STRLEN + 64];
    auth_key key; /* the job's secret, proved in each connection's handshake */
    bool local; /* try the same-host socket before TCP */
    td_net_spin spin;
    uint32_t unacked;         /* answers of sets not read yet (they come before any later answer) */
    td_status set_error;      /* a refused set, reported by the next call */
    char set_error_msg[512];
    td_store_limits lim; /* the server's, from its HELLO answer */
    td_buf out;
    td_buf in;
    size_t in_off;
    server_ref *server;
} tcp_store;

static tcp_store *T(td_store *s) { return (tcp_store *)s; }

typedef struct reply {
    uint8_t kind;
    uint64_t len;
    const uint8_t *body; /* into t->in, valid until the next read */
    void *owned;         /* with direct: the body in its own malloc'd block (NUL-terminated) */
} reply;

static void disconnect(tcp_store *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    t->in.len = 0;
    t->in_off = 0;
    t->unacked = 0;
}

/* Called with the status of a failed socket call: records a lost server, drops the connection and
 * turns the message into one that says what the client was doing. */
static td_status io_failed(tcp_store *t, td_status s, const char *op)
{
    if (s == TD_ERR_PEER_LOST) {
        snprintf(t->lost_why, sizeof t->lost_why, "%s", td_last_error());
        t->lost = true;
        disconnect(t);
        return error_fmt(TD_ERR_PEER_LOST,
                        "TCPStore: lost the connection to the server at %s during %s (did the master process "
                        "exit?): %s",
                        t->where, op, t->lost_why);
    }
    disconnect(t);
    if (s == TD_ERR_TIMEOUT)
        return error_fmt(TD_ERR_TIMEOUT, "Socket Timeout");
    return error_prefix(s, "TCPStore: %s with the server at %s", op, t->where);
}

/* Makes the buffer hold at least n unread bytes. */
static td_status fill(tcp_store *t, size_t n, int64_t deadline)
{
    size_t have = t->in.len - t->in_off;
    if (have >= n)
        return TD_OK;
    if (t->in_off > 0) {
        if (have)
            memmove(t->in.data, t->in.data + t->in_off, have);
        t->in.len = have;
        t->in_off = 0;
    }
    size_t want = n > 65536 ? n : 65536;
    TD_TRY(buf_try_reserve(&t->in, want - t->in.len));
    while (t->in.len < n) {
        size_t got = 0;
        TD_TRY(net_recv_some_spin(t->fd, t->in.data + t->in.len, t->in.cap - 1 - t->in.len, &got, deadline,
                                     &t->spin));
        t->in.len += got;
    }
    return TD_OK;
}

/* Reads one reply. With direct, an OK body goes into its own block (r->owned) instead of the
 * buffer: large values are received once, into the memory handed to the caller. */
static td_status read_reply(tcp_store *t, int64_t deadline, uint64_t max_body, bool direct, reply *r)
{
    memset(r, 0, sizeof *r);
    /* Give back the memory of a huge earlier reply. */
    if (t->in_off == t->in.len && t->in.cap > ((size_t)4 << 20)) {
        buf_free(&t->in);
        t->in_off = 0;
    }
    TD_TRY(fill(t, TD_STORE_HEADER_LEN, deadline));
    TD_TRY(store_check_reply_header((const uint8_t *)t->in.data + t->in_off, max_body, &r->kind, &r->len));
    t->in_off += TD_STORE_HEADER_LEN;
    if (direct && r->kind == TD_STORE_REPLY_OK) {
        size_t len = (size_t)r->len;
        TD_TRY(alloc_try(len + 1, "TCPStore value", &r->owned));
        size_t have = t->in.len - t->in_off;
        size_t take = have < len ? have : len;
        memcpy(r->owned, t->in.data + t->in_off, take);
        t->in_off += take;
        td_status s = net_recv_all(t->fd, (char *)r->owned + take, len - take, deadline);
        if (s != TD_OK) {
            free(r->owned);
            r->owned = NULL;
            return s;
        }
        ((char *)r->owned)[len] = '\0';
        r->body = r->owned;
        return TD_OK;
    }
    TD_TRY(fill(t, (size_t)r->len, deadline));
    r->body = (const uint8_t *)t->in.data + t->in_off;
    t->in_off += (size_t)r->len;
    return TD_OK;
}

/* An ERROR reply as this thread's error. */
static td_status remote_error(tcp_store *t, const reply *r, const char *op)
{
    if (r->len < 4)
        return error_fmt(TD_ERR_IO, "TCPStore: malformed error reply from the server at %s", t->where);
    int32_t code = (int32_t)store_get_u32(r->body);
    if (code >= 0 || code < TD_ERR_INTERNAL)
        code = TD_ERR_REMOTE;
    return error_fmt((td_status)code, "TCPStore %s: %.*s", op, (int)(r->len - 4), (const char *)r->body + 4);
}

/* An ERROR answer to HELLO or AUTH: the server refused the connection. */
static td_status handshake_refused(tcp_store *t, const reply *r)
{
    td_status code = r->len >= 4 ? (td_status)(int32_t)store_get_u32(r->body) : TD_ERR_REMOTE;
    return error_fmt(code < 0 && code >= TD_ERR_INTERNAL ? code : TD_ERR_REMOTE,
                     "TCPStore server at %s refused the connection: %.*s", t->where,
                     (int)(r->len >= 4 ? r->len - 4 : 0), r->len >= 4 ? (const char *)r->body + 4 : "");
}

/* The handshake (docs/protocols.md, "TCPStore protocol"): HELLO with a fresh nonce; a server that
 * holds the secret answers with its nonce and its proof, which is checked before this client sends
 * its own proof (AUTH), so the secret is proved both ways and never travels. */
static td_status hello(tcp_store *t, int64_t deadline)
{
    uint8_t nonce[AUTH_NONCE_LEN];
    auth_nonce(nonce);
    t->out.len = 0;
    store_put_hello(&t->out, TD_STORE_PROTO_MAGIC, TD_STORE_PROTO_VERSION, nonce, AUTH_NONCE_LEN);
    TD_TRY(net_send_all(t->fd, t->out.data, t->out.len, deadline));
    reply r;
    TD_TRY(read_reply(t, deadline, 128, false, &r));
    if (r.kind == TD_STORE_REPLY_ERROR)
        return handshake_refused(t, &r);
    enum { FIXED = 21, WITH_AUTH = FIXED + AUTH_NONCE_LEN + AUTH_MAC_LEN };
    if (r.kind != TD_STORE_REPLY_OK || r.len < FIXED || r.len != (r.body[20] ? WITH_AUTH : FIXED))
        return error_fmt(TD_ERR_IO, "TCPStore: %s did not answer like a tdist TCPStore server", t->where);
    t->lim.max_key = store_get_u64(r.body + 4);
    t->lim.max_value = store_get_u64(r.body + 12);
    bool server_auth = r.body[20] != 0;
    if (!server_auth && !t->key.on)
        return TD_OK;
    if (!server_auth)
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: the TCPStore server at %s does not authenticate (it has no "
                         "TDIST_AUTH_TOKEN) but this process has one; start it with the job's secret",
                         t->where);
    if (!t->key.on)
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: the TCPStore server at %s requires the job's secret; set "
                         "TDIST_AUTH_TOKEN to it on every rank",
                         t->where);
    uint8_t server_nonce[AUTH_NONCE_LEN];
    memcpy(server_nonce, r.body + FIXED, AUTH_NONCE_LEN);
    auth_part parts[2] = {{nonce, AUTH_NONCE_LEN}, {server_nonce, AUTH_NONCE_LEN}};
    if (!auth_check(&t->key, "tdist store server", parts, 2, r.body + FIXED + AUTH_NONCE_LEN))
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: the TCPStore server at %s could not prove it holds this "
                         "process's TDIST_AUTH_TOKEN (the secrets differ)",
                         t->where);
    uint8_t mac[AUTH_MAC_LEN];
    parts[0] = (auth_part){server_nonce, AUTH_NONCE_LEN};
    parts[1] = (auth_part){nonce, AUTH_NONCE_LEN};
    auth_prove(&t->key, "tdist store client", parts, 2, mac);
    t->out.len = 0;
    size_t off = store_msg_begin(&t->out, TD_STORE_CMD_AUTH);
    buf_put_u32(&t->out, AUTH_MAC_LEN);
    buf_append(&t->out, mac, AUTH_MAC_LEN);
    store_msg_end(&t->out, off);
    TD_TRY(net_send_all(t->fd, t->out.data, t->out.len, deadline));
    TD_TRY(read_reply(t, deadline, 1024, false, &r));
    if (r.kind == TD_STORE_REPLY_ERROR)
        return handshake_refused(t, &r);
    if (r.kind != TD_STORE_REPLY_OK || r.len != 0)
        return error_fmt(TD_ERR_IO, "TCPStore: %s did not answer AUTH like a tdist TCPStore server", t->where);
    return TD_OK;
}

static td_status connect_server(tcp_store *t, int64_t deadline)
{
    td_status s = net_connect_ex(t->host, t->port, deadline, t->local ? "tdist-store" : NULL, &t->fd);
    if (s != TD_OK)
        return error_prefix(s, "TCPStore client");
    s = hello(t, deadline);
    if (s != TD_OK) {
        td_status code = s;
        if (s == TD_ERR_PEER_LOST || s == TD_ERR_TIMEOUT || s == TD_ERR_IO)
            error_prefix(s, "TCPStore: handshake with %s", t->where);
        disconnect(t);
        return code;
    }
    return TD_OK;
}

/* Makes sure there is a connection before a request. A connection dropped after a timeout is
 * reopened; a server that was there before and now refuses is taken as gone (no waiting out the
 * timeout for a server that died). */
static td_status ready(tcp_store *t, int64_t deadline)
{
    if (t->lost)
        return error_fmt(TD_ERR_PEER_LOST, "TCPStore: the connection to the server at %s was lost earlier (%s)",
                        t->where, t->lost_why);
    if (t->fd >= 0)
        return TD_OK;
    int64_t soon = deadline_after_ms(RECONNECT_MS);
    td_status s = connect_server(t, soon < deadline ? soon : deadline);
    if (s == TD_ERR_TIMEOUT || s == TD_ERR_IO) {
        snprintf(t->lost_why, sizeof t->lost_why, "%s", td_last_error());
        t->lost = true;
        return error_fmt(TD_ERR_PEER_LOST, "TCPStore: cannot reconnect to the server at %s: %s", t->where,
                        t->lost_why);
    }
    return s;
}

/* After a blocking request timed out: cancel it on the server and resynchronize the stream. */
static void cancel_parked(tcp_store *t)
{
    int64_t grace = deadline_after_ms(CANCEL_GRACE_MS);
    t->out.len = 0;
    size_t off = store_msg_begin(&t->out, TD_STORE_CMD_CANCEL);
    store_msg_end(&t->out, off);
    td_status s = net_send_all(t->fd, t->out.data, t->out.len, grace);
    while (s == TD_OK) {
        reply r;
        s = read_reply(t, grace, UINT64_MAX, false, &r);
        if (s == TD_OK && r.kind == TD_STORE_REPLY_CANCELED)
            return;
    }
    if (s == TD_ERR_PEER_LOST) {
        io_failed(t, s, "CANCEL");
        return;
    }
    disconnect(t);
}

/* Reads the answers of the sets sent without waiting; a refusal among them is kept for the next
 * call to report. */
static td_status drain_acks(tcp_store *t, int64_t deadline)
{
    while (t->unacked > 0) {
        reply r;
        TD_TRY(read_reply(t, deadline, 0, false, &r));
        t->unacked--;
        if (r.kind == TD_STORE_REPLY_ERROR) {
            if (t->set_error == TD_OK) {
                t->set_error = remote_error(t, &r, "SET");
                snprintf(t->set_error_msg, sizeof t->set_error_msg, "%s", td_last_error());
            }
        } else if (r.kind != TD_STORE_REPLY_OK) {
            return error_fmt(TD_ERR_IO, "unexpected reply kind %u to a SET", r.kind);
        }
    }
    return TD_OK;
}

/* The refusal of an earlier set, once: it replaces the current call's result. */
static td_status take_set_error(tcp_store *t)
{
    td_status s = t->set_error;
    t->set_error = TD_OK;
    return error_fmt(s, "an earlier set on this handle failed: %s", t->set_error_msg);
}

/* Sends the request in t->out and reads its reply. */
static td_status roundtrip(tcp_store *t, int cmd, int64_t deadline, uint64_t max_body, bool direct, reply *r)
{
    const char *op = store_cmd_name(cmd);
    uint64_t body = t->out.len - TD_STORE_HEADER_LEN;
    if (body > store_max_body(&t->lim))
        return error_fmt(TD_ERR_INVALID,
                        "TCPStore %s: the request is %" PRIu64 " bytes, over the server's limit of %" PRIu64
                        " (TDIST_STORE_MAX_VALUE on the server)",
                        op, body, store_max_body(&t->lim));
    td_status s = net_send_all(t->fd, t->out.data, t->out.len, deadline);
    if (s != TD_OK)
        return io_failed(t, s, op);
    s = drain_acks(t, deadline);
    if (s != TD_OK)
        return io_failed(t, s, op);
    s = read_reply(t, deadline, max_body, direct, r);
    if (s == TD_OK && t->set_error != TD_OK) {
        free(r->owned);
        r->owned = NULL;
        return take_set_error(t);
    }
    if (s == TD_OK) {
        if (r->kind == TD_STORE_REPLY_ERROR)
            return remote_error(t, r, op);
        if (r->kind != TD_STORE_REPLY_OK) {
            free(r->owned);
            r->owned = NULL;
            disconnect(t);
            return error_fmt(TD_ERR_IO, "TCPStore %s: unexpected reply kind %u from %s", op, r->kind, t->where);
        }
        return TD_OK;
    }
    bool parks = cmd == TD_STORE_CMD_GET || cmd == TD_STORE_CMD_WAIT || cmd == TD_STORE_CMD_MULTI_GET;
    if (s == TD_ERR_TIMEOUT && parks) {
        cancel_parked(t);
        return error_fmt(TD_ERR_TIMEOUT, "Socket Timeout");
    }
    return io_failed(t, s, op);
}

static td_status check_key(tcp_store *t, const char *prefix, size_t len)
{
    if (strlen(prefix) + len > t->lim.max_key)
        return error_fmt(TD_ERR_INVALID,
                        "TCPStore: a key of %zu bytes exceeds the server's limit of %" PRIu64
                        " bytes (TDIST_STORE_MAX_KEY)",
                        len, t->lim.max_key);
    return TD_OK;
}

static td_status check_value(tcp_store *t, size_t len)
{
    if (len > t->lim.max_value)
        return error_fmt(TD_ERR_INVALID,
                        "TCPStore: a value of %zu bytes exceeds the server's limit of %" PRIu64
                        " bytes (TDIST_STORE_MAX_VALUE)",
                        len, t->lim.max_value);
    return TD_OK;
}

static int64_t op_deadline(tcp_store *t) { return deadline_after_ms(store_timeout_of(&t->base)); }

/* Starts a request with one key; the caller holds t->mu and has a connection. */
static td_status begin_key_request(tcp_store *t, uint8_t cmd, const char *prefix, const char *key, size_t *off)
{
    size_t klen = strlen(key);
    TD_TRY(check_key(t, prefix, klen));
    t->out.len = 0;
    *off = store_msg_begin(&t->out, cmd);
    store_put_key(&t->out, prefix, key, klen);
    return TD_OK;
}

static td_status begin_keys_request(tcp_store *t, uint8_t cmd, const char *const *keys, size_t n, size_t *off)
{
    if (n > TD_STORE_MAX_KEYS_PER_REQUEST)
        return error_fmt(TD_ERR_INVALID, "TCPStore: at most %u keys per request, got %zu",
                        TD_STORE_MAX_KEYS_PER_REQUEST, n);
    for (size_t i = 0; i < n; i++)
        TD_TRY(check_key(t, KEY_PREFIX, strlen(keys[i])));
    t->out.len = 0;
    *off = store_msg_begin(&t->out, cmd);
    buf_put_u32(&t->out, (uint32_t)n);
    return TD_OK;
}

/* One request about one key and its reply: the shape of GET, ADD, COMPARE_SET, DELETE_KEY and
 * APPEND. The values (checked against the limit first) and then, for ADD, the delta follow the key.
 * Called with t->mu held; the reply's body lives in the handle's buffer until the next call. */
typedef struct {
    uint8_t cmd;
    const char *prefix, *key;
    int nval;
    const void *val[2];
    size_t len[2];
    const int64_t *delta;
    uint64_t max_body;
    bool owned; /* the reply's body is handed to the caller (r->owned) */
} key_request;

static td_status key_call(tcp_store *t, const key_request *q, int64_t deadline, reply *r)
{
    size_t off;
    td_status st = ready(t, deadline);
    for (int i = 0; st == TD_OK && i < q->nval; i++)
        st = check_value(t, q->len[i]);
    if (st == TD_OK)
        st = begin_key_request(t, q->cmd, q->prefix, q->key, &off);
    if (st != TD_OK)
        return st;
    for (int i = 0; i < q->nval; i++)
        store_put_value(&t->out, q->val[i], q->len[i]);
    if (q->delta)
        store_put_i64(&t->out, *q->delta);
    store_msg_end(&t->out, off);
    return roundtrip(t, q->cmd, deadline, q->max_body, q->owned, r);
}

/* A reply that must be a 64-bit integer (ADD, NUM_KEYS). */
static td_status reply_i64(tcp_store *t, const reply *r, const char *what, int64_t *out)
{
    if (r->len != 8)
        return error_fmt(TD_ERR_IO, "TCPStore %s: malformed reply from %s", what, t->where);
    *out = (int64_t)store_get_u64(r->body);
    return TD_OK;
}

static td_status add_raw(tcp_store *t, const char *prefix, const char *key, int64_t delta, int64_t *result)
{
    key_request q = {.cmd = TD_STORE_CMD_ADD, .prefix = prefix, .key = key, .delta = &delta, .max_body = 8};
    int64_t deadline = op_deadline(t);
    pthread_mutex_lock(&t->mu);
    reply r;
    td_status s = key_call(t, &q, deadline, &r);
    if (s == TD_OK)
        s = reply_i64(t, &r, "ADD", result);
    pthread_mutex_unlock(&t->mu);
    return s;
}

/* A set does not wait for its answer, as in c10d: it returns once the request is sent. The server
 * applies it before any later request of this handle, and the handle reads its answer with the
 * next call's (or at most MAX_UNACKED_SETS sets later). A set the server refuses (it can only run
 * out of memory: limits are checked here) fails that later call. */
static td_status tc_set(td_store *s, const char *key, const void *value, size_t len)
{
    tcp_store *t = T(s);
    int64_t deadline = op_deadline(t);
    pthread_mutex_lock(&t->mu);
    size_t off;
    td_status st = ready(t, deadline);
    if (st == TD_OK)
        st = check_value(t, len);
    if (st == TD_OK && t->unacked >= MAX_UNACKED_SETS) {
        st = drain_acks(t, deadline);
        if (st != TD_OK)
            st = io_failed(t, st, "SET");
    }
    if (st == TD_OK && t->set_error != TD_OK)
        st = take_set_error(t);
    if (st == TD_OK)
        st = begin_key_request(t, TD_STORE_CMD_SET, KEY_PREFIX, key, &off);
    if (st == TD_OK) {
        store_put_value(&t->out, value, len);
        store_msg_end(&t->out, off);
        st = net_send_all(t->fd, t->out.data, t->out.len, deadline);
        if (st == TD_OK)
            t->unacked++;
        else
            st = io_failed(t, st, "SET");
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

/* GET and COMPARE_SET answer with a value that the caller takes over. */
static td_status value_call(tcp_store *t, const key_request *q, void **value, size_t *len)
{
    int64_t deadline = op_deadline(t);
    pthread_mutex_lock(&t->mu);
    reply r;
    td_status st = key_call(t, q, deadline, &r);
    if (st == TD_OK) {
        *value = r.owned;
        *len = (size_t)r.len;
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

static td_status tc_get(td_store *s, const char *key, void **value, size_t *len)
{
    tcp_store *t = T(s);
    key_request q = {.cmd = TD_STORE_CMD_GET, .prefix = KEY_PREFIX, .key = key, .max_body = t->lim.max_value, .owned = true};
    return value_call(t, &q, value, len);
}

static td_status tc_add(td_store *s, const char *key, int64_t delta, int64_t *result)
{
    return add_raw(T(s), KEY_PREFIX, key, delta, result);
}

static td_status compare_set_raw(tcp_store *t, const char *prefix, const char *key, const void *expected,
                                 size_t expected_len, const void *desired, size_t desired_len, void **value, size_t *len)
{
    key_request q = {.cmd = TD_STORE_CMD_COMPARE_SET,
                     .prefix = prefix,
                     .key = key,
                     .nval = 2,
                     .val = {expected, desired},
                     .len = {expected_len, desired_len},
                     .max_body = t->lim.max_value,
                     .owned = true};
    return value_call(t, &q, value, len);
}

static td_status tc_compare_set(td_store *s, const char *key, const void *expected, size_t expected_len,
                                const void *desired, size_t desired_len, void **value, size_t *len)
{
    return compare_set_raw(T(s), KEY_PREFIX, key, expected, expected_len, desired, desired_len, value, len);
}

static td_status tc_delete_key(td_store *s, const char *key, bool *deleted)
{
    tcp_store *t = T(s);
    key_request q = {.cmd = TD_STORE_CMD_DELETE_KEY, .prefix = KEY_PREFIX, .key = key, .max_body = 1};
    int64_t deadline = op_deadline(t);
    pthread_mutex_lock(&t->mu);
    reply r;
    td_status st = key_call(t, &q, deadline, &r);
    if (st == TD_OK)
        *deleted = r.len == 1 && r.body[0] != 0;
    pthread_mutex_unlock(&t->mu);
    return st;
}

static td_status keys_call(tcp_store *t, uint8_t cmd, const char *const *keys, size_t n, int64_t deadline,
                           uint64_t max_body, reply *r)
{
    size_t off;
    td_status st = ready(t, deadline);
    if (st == TD_OK)
        st = begin_keys_request(t, cmd, keys, n, &off);
    if (st == TD_OK) {
        for (size_t i = 0; i < n; i++)
            store_put_key(&t->out, KEY_PREFIX, keys[i], strlen(keys[i]));
        store_msg_end(&t->out, off);
        st = roundtrip(t, cmd, deadline, max_body, false, r);
    }
    return st;
}

static td_status tc_check(td_store *s, const char *const *keys, size_t n, bool *ready_out)
{
    tcp_store *t = T(s);
    pthread_mutex_lock(&t->mu);
    reply r;
    td_status st = keys_call(t, TD_STORE_CMD_CHECK, keys, n, op_deadline(t), 1, &r);
    if (st == TD_OK)
        *ready_out = r.len == 1 && r.body[0] != 0;
    pthread_mutex_unlock(&t->mu);
    return st;
}

static td_status tc_wait(td_store *s, const char *const *keys, size_t n, int64_t timeout_ms)
{
    tcp_store *t = T(s);
    pthread_mutex_lock(&t->mu);
    reply r;
    td_status st = keys_call(t, TD_STORE_CMD_WAIT, keys, n, deadline_after_ms(timeout_ms), 0, &r);
    pthread_mutex_unlock(&t->mu);
    return st;
}

static td_status tc_num_keys(td_store *s, int64_t *count)
{
    tcp_store *t = T(s);
    int64_t deadline = op_deadline(t);
    pthread_mutex_lock(&t->mu);
    reply r;
    td_status st = ready(t, deadline);
    if (st == TD_OK) {
        t->out.len = 0;
        size_t off = store_msg_begin(&t->out, TD_STORE_CMD_NUM_KEYS);
        store_msg_end(&t->out, off);
        st = roundtrip(t, TD_STORE_CMD_NUM_KEYS, deadline, 8, false, &r);
    }
    if (st == TD_OK)
        st = reply_i64(t, &r, "NUM_KEYS", count);
    pthread_mutex_unlock(&t->mu);
    return st;
}

static td_status tc_append(td_store *s, const char *key, const void *value, size_t len)
{
    tcp_store *t = T(s);
    key_request q = {.cmd = TD_STORE_CMD_APPEND, .prefix = KEY_PREFIX, .key = key, .nval = 1, .val = {value}, .len = {len}};
    int64_t deadline = op_deadline(t);
    pthread_mutex_lock(&t->mu);
    reply r;
    td_status st = key_call(t, &q, deadline, &r);
    pthread_mutex_unlock(&t->mu);
    return st;
}

static td_status tc_multi_get(td_store *s, const char *const *keys, size_t n, void **values, size_t *lens)
{
    tcp_store *t = T(s);
    pthread_mutex_lock(&t->mu);
    reply r;
    uint64_t max_body = 4 + (uint64_t)n * (8 + t->lim.max_value);
    td_status st = keys_call(t, TD_STORE_CMD_MULTI_GET, keys, n, op_deadline(t), max_body, &r);
    td_store_slice *vals = NULL;
    if (st == TD_OK) {
        vals = TD_NEW_ARRAY(td_store_slice, n);
        st = store_parse_values(r.body, (size_t)r.len, n, vals);
        if (st != TD_OK)
            error_prefix(st, "TCPStore: from %s", t->where);
    }
    for (size_t i = 0; st == TD_OK && i < n; i++)
        st = store_copy_out(vals[i].data, vals[i].len, &values[i], &lens[i]);
    free(vals);
    pthread_mutex_unlock(&t->mu);
    return st;
}

static td_status tc_multi_set(td_store *s, const char *const *keys, const void *const *values, const size_t *lens,
                              size_t n)
{
    tcp_store *t = T(s);
    int64_t deadline = op_deadline(t);
    pthread_mutex_lock(&t->mu);
    size_t off;
    reply r;
    td_status st = ready(t, deadline);
    for (size_t i = 0; st == TD_OK && i < n; i++)
        st = check_value(t, lens[i]);
    if (st == TD_OK)
        st = begin_keys_request(t, TD_STORE_CMD_MULTI_SET, keys, n, &off);
    if (st == TD_OK) {
        for (size_t i = 0; i < n; i++) {
            store_put_key(&t->out, KEY_PREFIX, keys[i], strlen(keys[i]));
            store_put_value(&t->out, values[i], lens[i]);
        }
        store_msg_end(&t->out, off);
        st = roundtrip(t, TD_STORE_CMD_MULTI_SET, deadline, 0, false, &r);
    }
    pthread_mutex_unlock(&t->mu);
    return st;
}

static void tc_destroy(td_store *s)
{
    tcp_store *t = T(s);
    /* Read the answers of the last sets before closing: a TCP socket closed with unread data
     * resets the connection, and the server should see a plain close after the sets. */
    if (t->fd >= 0 && t->unacked > 0)
        drain_acks(t, deadline_after_ms(2000));
    disconnect(t);
    server_release(t->server);
    buf_free(&t->out);
    buf_free(&t->in);
    pthread_mutex_destroy(&t->mu);
    free(t->host);
    free(t);
}

static const td_store_ops tcp_store_ops = {
    .kind = "TCPStore",
    .set = tc_set,
    .get = tc_get,
    .add = tc_add,
    .compare_set = tc_compare_set,
    .delete_key = tc_delete_key,
    .check = tc_check,
    .num_keys = tc_num_keys,
    .wait = tc_wait,
    .append = tc_append,
    .multi_get = tc_multi_get,
    .multi_set = tc_multi_set,
    .destroy = tc_destroy,
};

int td_tcp_store_port(td_store *store)
{
    if (!store || store->ops != &tcp_store_ops)
        return -1;
    return T(store)->port;
}

bool tcp_store_server_stats(td_store *store, td_store_server_stats *stats)
{
    if (!store || store->ops != &tcp_store_ops || !T(store)->server)
        return false;
    store_server_get_stats(T(store)->server->server, stats);
    return true;
}

/* The message a rank that disagrees about the world size left in TD_STORE_INIT_ERROR_KEY, or NULL (malloc'd).
 * A COMPARE_SET whose expected and desired value is one NUL byte, which no message equals, reads
 * the key without blocking and without writing it. */
static td_status init_error(tcp_store *t, char **msg)
{
    *msg = NULL;
    void *v = NULL;
    size_t n = 0;
    TD_TRY(compare_set_raw(t, "", TD_STORE_INIT_ERROR_KEY, "", 1, "", 1, &v, &n));
    if (!(n == 1 && ((char *)v)[0] == '\0'))
        *msg = alloc_printf("%.*s", (int)n, (char *)v);
    free(v);
    return TD_OK;
}

/* Ranks started with different world sizes would wait for each other until the timeout (30 minutes
 * by default): every handle compares its world size with the first one's before it counts itself
 * in. One that differs fails at once and leaves its message where the master, polling for the
 * others, reads it and fails too; the master going away then fails the ranks that already joined. */
static td_status agree_world_size(tcp_store *t, int world_size)
{
    char mine[32];
    snprintf(mine, sizeof mine, "%d", world_size);
    void *v = NULL;
    size_t n = 0;
    TD_TRY(compare_set_raw(t, "", TD_STORE_INIT_WORLD_KEY, "", 0, mine, strlen(mine), &v, &n));
    bool same = n == strlen(mine) && memcmp(v, mine, n) == 0;
    char theirs[32];
    snprintf(theirs, sizeof theirs, "%.*s", (int)(n < 20 ? n : 20), (char *)v);
    free(v);
    if (same)
        return TD_OK;
    td_status st = error_fmt(TD_ERR_INVALID,
                             "the ranks disagree about the world size: a rank started with world size %d joined the "
                             "store at %s, where the first rank to join had world size %s; give every rank the same "
                             "world size (WORLD_SIZE, or the URL's world_size)",
                             world_size, t->where, theirs);
    char *msg = alloc_strdup(td_last_error());
    void *old = NULL;
    size_t old_len = 0;
    if (compare_set_raw(t, "", TD_STORE_INIT_ERROR_KEY, "", 0, msg, strlen(msg), &old, &old_len) == TD_OK)
        free(old);
    error_set(st, msg);
    free(msg);
    return st;
}

td_status tcp_store_workers_step(td_store *store, int world_size, int64_t start_ns, int64_t timeout_ms,
                                    int64_t *joined, bool *done)
{
    *done = false;
    if (!store || store->ops != &tcp_store_ops)
        return error_fmt(TD_ERR_INVALID, "tcp_store_workers_step: not a TCPStore");
    TD_TRY(add_raw(T(store), "", INIT_KEY, 0, joined));
    if (*joined >= world_size) {
        *done = true;
        return TD_OK;
    }
    char *disagreement = NULL;
    TD_TRY(init_error(T(store), &disagreement));
    if (disagreement) {
        td_status st = error_fmt(TD_ERR_INVALID, "%s", disagreement);
        free(disagreement);
        return st;
    }
    int64_t elapsed_ms = (clock_now_ns() - start_ns) / 1000000;
    if (timeout_ms > 0 && elapsed_ms >= timeout_ms)
        return error_fmt(TD_ERR_TIMEOUT, "Timed out after %lld seconds waiting for clients. %lld/%d clients joined.",
                        (long long)(elapsed_ms / 1000), (long long)*joined, world_size);
    return TD_OK;
}

/* c10d's waitForWorkers: every handle counts itself in "init/"; the master polls the count. */
static td_status wait_for_workers(tcp_store *t, bool master, int world_size)
{
    int64_t joined = 0;
    TD_TRY(agree_world_size(t, world_size));
    TD_TRY(add_raw(t, "", INIT_KEY, 1, &joined));
    if (!master)
        return TD_OK;
    int64_t start = clock_now_ns(), timeout = store_timeout_of(&t->base);
    int64_t next_report = start + (int64_t)WORKER_REPORT_MS * 1000000;
    for (;;) {
        bool done;
        TD_TRY(tcp_store_workers_step(&t->base, world_size, start, timeout, &joined, &done));
        if (done)
            return TD_OK;
        /* A rank that never arrives (a wrong MASTER_PORT, a node not started) shows at once in
         * the log instead of only at the timeout. */
        int64_t now = clock_now_ns();
        if (now >= next_report) {
            TD_LOG_WARN("store at %s:%d: waiting for %lld of %d ranks to join (%lld s so far, timeout %lld s)",
                        t->host, t->port, (long long)(world_size - joined), world_size,
                        (long long)((now - start) / 1000000000), (long long)(timeout / 1000));
            next_report = now + (int64_t)WORKER_REPORT_MS * 1000000;
        }
        clock_sleep_ms(WORKER_POLL_MS);
    }
}

td_status td_tcp_store_create(const td_tcp_store_options *o, td_store **store)
{
    if (!o || !store)
        return error_fmt(TD_ERR_INVALID, "td_tcp_store_create: options and store must not be NULL");
    *store = NULL;
    if (o->port < 0 || o->port > 65535)
        return error_fmt(TD_ERR_INVALID, "port must have value from 0 to 65535 but was %d.", o->port);
    if (o->timeout_ms < 0)
        return error_fmt(TD_ERR_INVALID, "td_tcp_store_create: timeout must be >= 0 ms (0: none), got %lld",
                        (long long)o->timeout_ms);
    if (!o->is_master && o->port == 0)
        return error_fmt(TD_ERR_INVALID, "td_tcp_store_create: a client needs the master's port (port 0 only means "
                                        "'pick one' on the master)");
    auth_key key;
    TD_TRY(auth_key_init(o->auth_token, &key));
    tcp_store *t = TD_NEW(tcp_store);
    store_init(&t->base, &tcp_store_ops, o->timeout_ms);
    thread_mutex_init(&t->mu);
    t->fd = -1;
    t->host = alloc_strdup(o->host && *o->host ? o->host : "127.0.0.1");
    t->port = o->port;
    t->key = key;
    int64_t deadline = deadline_after_ms(o->timeout_ms);
    td_status s;
    t->local = true;
    s = env_get_bool("TDIST_STORE_UNIX", true, &t->local);
    int64_t spin_us = 0;
    if (s == TD_OK)
        s = env_get_int("TDIST_STORE_SPIN_US", TD_STORE_DEFAULT_SPIN_US, 0, 1000000, &spin_us);
    net_spin_init(&t->spin, spin_us * 1000);
    if (s == TD_OK && o->is_master) {
        s = server_acquire(o, &t->server);
        if (s == TD_OK)
            t->port = t->server->port;
    }
    net_format_hostport(t->host, t->port, t->where, sizeof t->where);
    if (s == TD_OK && o->is_master && o->on_listening)
        o->on_listening(t->port, o->on_listening_arg);
    if (s == TD_OK) {
        pthread_mutex_lock(&t->mu);
        s = connect_server(t, deadline);
        pthread_mutex_unlock(&t->mu);
    }
    if (s == TD_OK && o->wait_for_workers && o->world_size > 0)
        s = wait_for_workers(t, o->is_master, o->world_size);
    if (s != TD_OK) {
        /* Keep the message: destroying may run code that sets its own. */
        char msg[TD_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        tc_destroy(&t->base);
        return error_set(s, msg);
    }
    *store = &t->base;
    return TD_OK;
}
