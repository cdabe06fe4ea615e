/* Encoders and parsers of the tcp transport's wire format (tcp_proto.h; docs/protocols.md, "tcp
 * transport"). Nothing here does I/O or allocates: the callers own the bytes, and the parsers only
 * point into them after checking every length against what is there and against the limits. */
#include "transport/tcp_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "net/addr.h"

#include "transport/transport.h"
#include "transport/wire.h"

/* ---- handshake -------------------------------------------------------------------------------- */

size_t tcp_hello_encode(uint8_t *b, const td_tcp_hello *h)
{
    wire_put32(b, TD_TCP_MAGIC);
    wire_put16(b + 4, h->version);
    wire_put16(b + 6, h->flags);
    wire_put32(b + 8, h->from);
    wire_put32(b + 12, h->to);
    wire_put32(b + 16, h->world);
    wire_put64(b + 20, h->nonce);
    wire_put32(b + 28, h->group_len);
    uint8_t *p = b + TD_TCP_HELLO_FIXED;
    if (h->group_len)
        memcpy(p, h->group, h->group_len);
    p += h->group_len;
    memcpy(p, h->conn_nonce, AUTH_NONCE_LEN);
    memcpy(p + AUTH_NONCE_LEN, h->proof, AUTH_MAC_LEN);
    return TD_TCP_HELLO_FIXED + h->group_len + TD_TCP_HELLO_TAIL;
}

td_tcp_parse tcp_hello_parse(const uint8_t *b, size_t n, td_tcp_hello *h, size_t *need, const char **why)
{
    *why = NULL;
    if (n >= 4 && wire_get32(b) != TD_TCP_MAGIC) {
        *why = "not a tdist tcp transport peer (bad magic)";
        return TD_TCP_PARSE_BAD;
    }
    if (n < TD_TCP_HELLO_FIXED) {
        *need = TD_TCP_HELLO_FIXED;
        return TD_TCP_PARSE_MORE;
    }
    memset(h, 0, sizeof *h);
    h->version = wire_get16(b + 4);
    h->flags = wire_get16(b + 6);
    h->from = wire_get32(b + 8);
    h->to = wire_get32(b + 12);
    h->world = wire_get32(b + 16);
    h->nonce = wire_get64(b + 20);
    if (h->version != TD_TCP_VERSION) {
        /* Another version's tail has another layout; what is here is enough to refuse it. */
        *need = TD_TCP_HELLO_FIXED;
        return TD_TCP_PARSE_OK;
    }
    uint32_t gl = wire_get32(b + 28);
    if (gl > TD_TCP_MAX_GROUP_NAME) {
        *why = "the hello's group name is over the limit";
        return TD_TCP_PARSE_BAD;
    }
    *need = TD_TCP_HELLO_FIXED + (size_t)gl + TD_TCP_HELLO_TAIL;
    if (n < *need)
        return TD_TCP_PARSE_MORE;
    h->group = (const char *)b + TD_TCP_HELLO_FIXED;
    h->group_len = gl;
    memcpy(h->conn_nonce, b + TD_TCP_HELLO_FIXED + gl, AUTH_NONCE_LEN);
    memcpy(h->proof, b + TD_TCP_HELLO_FIXED + gl + AUTH_NONCE_LEN, AUTH_MAC_LEN);
    return TD_TCP_PARSE_OK;
}

size_t tcp_reply_encode(uint8_t *b, int rank, int status, unsigned flags, const char *msg, const uint8_t *proof)
{
    size_t ml = wire_msg_len(msg, TD_TCP_MAX_REPLY_MSG);
    wire_put32(b, TD_TCP_MAGIC);
    wire_put16(b + 4, TD_TCP_VERSION);
    b[6] = (uint8_t)status;
    b[7] = (uint8_t)flags;
    wire_put32(b + 8, (uint32_t)rank);
    wire_put32(b + 12, (uint32_t)ml);
    if (ml)
        memcpy(b + TD_TCP_REPLY_FIXED, msg, ml);
    /* The proof trails the message, so that a peer of version 2 still reads a refusal's words. */
    if (proof)
        memcpy(b + TD_TCP_REPLY_FIXED + ml, proof, AUTH_MAC_LEN);
    else
        memset(b + TD_TCP_REPLY_FIXED + ml, 0, AUTH_MAC_LEN);
    return TD_TCP_REPLY_FIXED + ml + AUTH_MAC_LEN;
}

td_tcp_parse tcp_reply_parse(const uint8_t *b, size_t n, td_tcp_reply *r, size_t *need, const char **why)
{
    *why = NULL;
    if (n >= 4 && wire_get32(b) != TD_TCP_MAGIC) {
        *why = "malformed handshake answer (bad magic)";
        return TD_TCP_PARSE_BAD;
    }
    if (n < TD_TCP_REPLY_FIXED) {
        *need = TD_TCP_REPLY_FIXED;
        return TD_TCP_PARSE_MORE;
    }
    uint32_t ml = wire_get32(b + 12);
    if (ml > TD_TCP_MAX_REPLY_MSG) {
        *why = "malformed handshake answer (message over the limit)";
        return TD_TCP_PARSE_BAD;
    }
    uint16_t version = wire_get16(b + 4);
    *need = TD_TCP_REPLY_FIXED + (size_t)ml + (version == TD_TCP_VERSION ? AUTH_MAC_LEN : 0);
    if (n < *need)
        return TD_TCP_PARSE_MORE;
    memset(r, 0, sizeof *r);
    r->version = version;
    r->status = b[6];
    r->flags = b[7];
    r->rank = wire_get32(b + 8);
    r->msg = (const char *)b + TD_TCP_REPLY_FIXED;
    r->msg_len = ml;
    if (version == TD_TCP_VERSION)
        memcpy(r->proof, b + TD_TCP_REPLY_FIXED + ml, AUTH_MAC_LEN);
    return TD_TCP_PARSE_OK;
}

/* ---- frames ----------------------------------------------------------------------------------- */

void tcp_header_encode(uint8_t *b, uint64_t tag, uint64_t len)
{
    wire_put64(b, tag);
    wire_put64(b + 8, len);
}

void tcp_header_decode(const uint8_t *b, uint64_t *tag, uint64_t *len)
{
    *tag = wire_get64(b);
    *len = wire_get64(b + 8);
}

size_t tcp_header_size(uint64_t tag) { return TD_TCP_HDR_SIZE + (transport_tag_is_coll(tag) ? TD_TCP_DESC_SIZE : 0); }

void tcp_desc_encode(uint8_t *b, const td_coll_desc *d)
{
    static const td_coll_desc none;
    if (!d)
        d = &none;
    wire_put64(b, d->what);
    wire_put64(b + 8, d->count);
    wire_put64(b + 16, d->seq);
}

void tcp_desc_decode(const uint8_t *b, td_coll_desc *d)
{
    d->what = wire_get64(b);
    d->count = wire_get64(b + 8);
    d->seq = wire_get64(b + 16);
}

size_t tcp_control_encode(uint8_t *f, int type, td_status status, const char *msg)
{
    uint8_t *p = f + TD_TCP_HDR_SIZE;
    size_t len = 1;
    p[0] = (uint8_t)type;
    if (type == TD_TCP_CTRL_ABORT) {
        size_t ml = wire_msg_len(msg, TD_TCP_CTRL_MSG_MAX);
        wire_put32(p + 1, (uint32_t)(int32_t)status);
        wire_put16(p + 5, (uint16_t)ml);
        if (ml)
            memcpy(p + 7, msg, ml);
        len = 7 + ml;
    }
    tcp_header_encode(f, TD_TAG_RESERVED, len);
    return TD_TCP_HDR_SIZE + len;
}

bool tcp_control_parse(const uint8_t *p, size_t n, uint64_t max_message, td_tcp_control *c)
{
    memset(c, 0, sizeof *c);
    if (n < 1)
        return false;
    c->type = p[0];
    switch (c->type) {
    case TD_TCP_CTRL_BYE:
        return n == 1;
    case TD_TCP_CTRL_ABORT: {
        if (n < 7)
            return false;
        size_t ml = wire_get16(p + 5);
        if (n != 7 + ml || ml > TD_TCP_CTRL_MSG_MAX)
            return false;
        int32_t st = (int32_t)wire_get32(p + 1);
        /* Only a failure can be relayed: anything else is not a td_status an abort carries. */
        if (st >= 0 || st < -1000)
            return false;
        c->status = (td_status)st;
        c->msg = (const char *)p + 7;
        c->msg_len = ml;
        return true;
    }
    case TD_TCP_CTRL_RTS: {
        if (n < TD_TCP_RTS_FIXED)
            return false;
        c->tag = wire_get64(p + 1);
        c->cookie = wire_get64(p + 9);
        c->total = wire_get64(p + 17);
        c->guard_addr = wire_get64(p + 25);
        c->guard_value = wire_get64(p + 33);
        c->iovcnt = p[41];
        tcp_desc_decode(p + 42, &c->desc);
        if (c->iovcnt > TD_TCP_RTS_MAX_IOV || n != TD_TCP_RTS_FIXED + 16 * (size_t)c->iovcnt ||
            c->total > max_message)
            return false;
        uint64_t sum = 0;
        for (int i = 0; i < c->iovcnt; i++) {
            c->addr[i] = wire_get64(p + TD_TCP_RTS_FIXED + 16 * i);
            c->len[i] = wire_get64(p + TD_TCP_RTS_FIXED + 8 + 16 * i);
            if (c->len[i] > max_message || c->addr[i] + c->len[i] < c->addr[i])
                return false;
            sum += c->len[i];
        }
        return sum == c->total;
    }
    case TD_TCP_CTRL_FIN: {
        if (n != 13)
            return false;
        c->cookie = wire_get64(p + 1);
        int32_t st = (int32_t)wire_get32(p + 9);
        if (st > 0 || st < -1000)
            return false;
        c->status = (td_status)st;
        return true;
    }
    default:
        return false;
    }
}

size_t tcp_rts_encode(uint8_t *p, uint64_t tag, uint64_t cookie, uint64_t guard_addr, uint64_t guard_value,
                      const td_coll_desc *desc, const uint64_t *addr, const uint64_t *len, int iovcnt)
{
    uint64_t total = 0;
    p[0] = TD_TCP_CTRL_RTS;
    wire_put64(p + 1, tag);
    wire_put64(p + 9, cookie);
    wire_put64(p + 25, guard_addr);
    wire_put64(p + 33, guard_value);
    p[41] = (uint8_t)iovcnt;
    tcp_desc_encode(p + 42, desc);
    for (int i = 0; i < iovcnt; i++) {
        wire_put64(p + TD_TCP_RTS_FIXED + 16 * i, addr[i]);
        wire_put64(p + TD_TCP_RTS_FIXED + 8 + 16 * i, len[i]);
        total += len[i];
    }
    wire_put64(p + 17, total);
    return TD_TCP_RTS_FIXED + 16 * (size_t)iovcnt;
}

size_t tcp_fin_encode(uint8_t *p, uint64_t cookie, td_status status)
{
    p[0] = TD_TCP_CTRL_FIN;
    wire_put64(p + 1, cookie);
    wire_put32(p + 9, (uint32_t)(int32_t)status);
    return 13;
}

bool tcp_probe_parse(const uint8_t *m, uint64_t *addr, uint64_t *value)
{
    *addr = wire_get64(m + 8);
    *value = wire_get64(m + 16);
    return wire_get64(m) == TD_TCP_CMA_PROBE_MAGIC;
}

_Static_assert(TD_ADDR_STRLEN == 96, "the entry's sscanf widths follow TD_ADDR_STRLEN");

td_status tcp_entry_parse(const char *text, int grank, td_tcp_entry *e)
{
    char addr[TD_ADDR_STRLEN + 1];
    unsigned long long nonce = 0;
    e->host = NULL;
    e->port = -1;
    e->host_id[0] = '\0';
    snprintf(e->unix_name, sizeof e->unix_name, "-");
    if (sscanf(text, "%96s %llx %159s %63s", addr, &nonce, e->host_id, e->unix_name) < 2)
        return error_fmt(TD_ERR_INVALID, "rank %d's tcp address in the store is malformed", grank);
    e->nonce = nonce;
    td_status st = net_split_hostport(addr, &e->host, &e->port);
    if (st != TD_OK)
        return error_prefix(st, "rank %d's tcp address in the store", grank);
    if (e->port < 0) {
        free(e->host);
        e->host = NULL;
        st = error_fmt(TD_ERR_INVALID, "rank %d's tcp address '%s' has no port", grank, addr);
    }
    return st;
}

void tcp_entry_free(td_tcp_entry *e)
{
    free(e->host);
    e->host = NULL;
}
