/* Internal: the TCPStore wire protocol, version 1 (docs/protocols.md, "TCPStore protocol").
 *
 * Every message is a 9-byte header, u8 tag + u64 body length (little-endian), then the body.
 * Requests carry a command tag; responses a kind (OK, ERROR, CANCELED). Body fields are
 *   key    u32 length + bytes        (at most max_key bytes)
 *   value  u64 length + bytes        (at most max_value bytes)
 *   i64, u32, u8                     little-endian
 * A connection starts with HELLO (magic, version, the client's nonce); the server answers with its
 * version, limits and, when it holds the job's secret, its own nonce and proof of the secret, which
 * the client checks before proving its own with AUTH (net/auth.h); or an ERROR and a close.
 *
 * store_parse_request is a pure function over bytes (the server and fuzz/fuzz_store_request.c
 * both drive it): it never trusts a length before checking it against the bytes present and the
 * limits, and never allocates beyond the scratch arrays for multi-key requests. */
#ifndef TDIST_STORE_STORE_PROTO_H
#define TDIST_STORE_STORE_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#include "base/buf.h"
#include "base/vec.h"

#define TD_STORE_PROTO_MAGIC 0x54534454u /* "TDST" as little-endian bytes */
#define TD_STORE_PROTO_VERSION 2u /* 2: challenge-response (HELLO nonce, AUTH) instead of a token */
#define TD_STORE_HEADER_LEN 9
/* A HELLO's nonce or an AUTH's proof: this long at most (both are 32 bytes today). */
#define TD_STORE_MAX_AUTH_FIELD 64
/* Room in a request body beyond its keys and values, for lengths, counts and integers. */
#define TD_STORE_BODY_SLACK 4096
#define TD_STORE_MAX_KEYS_PER_REQUEST (1u << 20)
/* Keys the client keeps beside c10d's "init/" counter for its world-size check (tcp_store.c): the
 * first handle's world size, and why a handle disagreed with it. NUM_KEYS does not count them, so
 * num_keys stays c10d's. User keys travel as "/"+key and cannot meet them. */
#define TD_STORE_INIT_WORLD_KEY "init/world_size"
#define TD_STORE_INIT_ERROR_KEY "init/error"
/* Default busy-wait before sleeping, client and server (TDIST_STORE_SPIN_US; net/io.h). */
#define TD_STORE_DEFAULT_SPIN_US 50

enum td_store_cmd {
    TD_STORE_CMD_HELLO = 1,
    TD_STORE_CMD_SET = 2,
    TD_STORE_CMD_GET = 3,       /* parks until the key exists */
    TD_STORE_CMD_ADD = 4,
    TD_STORE_CMD_COMPARE_SET = 5,
    TD_STORE_CMD_DELETE_KEY = 6,
    TD_STORE_CMD_CHECK = 7,
    TD_STORE_CMD_NUM_KEYS = 8,
    TD_STORE_CMD_WAIT = 9,      /* parks until every key exists */
    TD_STORE_CMD_CANCEL = 10,   /* ends this connection's parked request */
    TD_STORE_CMD_APPEND = 11,
    TD_STORE_CMD_MULTI_GET = 12, /* parks until every key exists */
    TD_STORE_CMD_MULTI_SET = 13,
    TD_STORE_CMD_PING = 14,
    TD_STORE_CMD_AUTH = 15,     /* the client's proof of the secret, after HELLO */
    TD_STORE_CMD_MAX_ = 15,
};

enum td_store_reply_kind {
    TD_STORE_REPLY_OK = 0,
    TD_STORE_REPLY_ERROR = 1,    /* body: i32 td_status code, then the message text */
    TD_STORE_REPLY_CANCELED = 2, /* answer to CANCEL (after the parked request's reply, if it won) */
};

typedef struct td_store_limits {
    uint64_t max_key;
    uint64_t max_value;
} td_store_limits;

#define TD_STORE_DEFAULT_MAX_KEY ((uint64_t)64 << 10)
#define TD_STORE_DEFAULT_MAX_VALUE ((uint64_t)512 << 20)

/* Fills in zeros from TDIST_STORE_MAX_KEY / TDIST_STORE_MAX_VALUE or the defaults (64 KiB, 512 MiB). */
td_status store_limits_resolve(size_t max_key, size_t max_value, td_store_limits *out);
/* The largest request body the limits allow: one key, one value and the slack. */
uint64_t store_max_body(const td_store_limits *lim);

typedef struct td_store_slice {
    const uint8_t *data;
    size_t len;
} td_store_slice;

typedef TD_VEC(td_store_slice) td_store_slice_vec;

typedef struct td_store_request {
    uint8_t cmd;
    td_store_slice key;      /* SET GET ADD COMPARE_SET DELETE_KEY APPEND */
    td_store_slice value;    /* SET APPEND: the value; COMPARE_SET: desired */
    td_store_slice expected; /* COMPARE_SET */
    int64_t delta;           /* ADD */
    uint32_t magic, version; /* HELLO */
    td_store_slice auth;     /* HELLO: the client's nonce; AUTH: its proof */
    size_t nkeys;            /* CHECK WAIT MULTI_GET MULTI_SET */
    td_store_slice *keys;    /* into the scratch vector given to the parser */
    td_store_slice *values;  /* MULTI_SET */
} td_store_request;

/* Parses one request from the front of buf.
 *   TD_OK, *consumed > 0: *req holds it (slices point into buf).
 *   TD_OK, *consumed == 0: incomplete; *frame_len is the whole frame's size once the header is
 *     in (so the caller can reserve it), else 0.
 *   TD_ERR_INVALID: malformed, unknown or over the limits; the message says why, and the
 *     connection must be closed. */
td_status store_parse_request(const uint8_t *buf, size_t len, const td_store_limits *lim,
                                 td_store_slice_vec *keys_scratch, td_store_slice_vec *values_scratch,
                                 td_store_request *req, size_t *consumed, size_t *frame_len);

const char *store_cmd_name(int cmd);

/* ---- encoding (client requests, server replies) ------------------------------------------------ */

/* Starts a message with tag; returns the header's offset for store_msg_end. */
size_t store_msg_begin(td_buf *b, uint8_t tag);
/* Patches the body length of the message started at off. */
void store_msg_end(td_buf *b, size_t off);
void store_put_key(td_buf *b, const char *prefix, const void *key, size_t len);
void store_put_value(td_buf *b, const void *value, size_t len);
void store_put_i64(td_buf *b, int64_t v);
/* A whole HELLO (docs/protocols.md): magic, version and the client's nonce of nonce_len bytes. */
void store_put_hello(td_buf *b, uint32_t magic, uint32_t version, const void *nonce, uint32_t nonce_len);

/* Checks a reply header: a known kind, and a body no longer than max_body (OK replies) or 64 KiB
 * (others). TD_ERR_IO names what is wrong. */
td_status store_check_reply_header(const uint8_t *hdr, uint64_t max_body, uint8_t *kind, uint64_t *body_len);
/* Splits a MULTI_GET reply body (u32 count, then count x value) into n slices; the count must be n
 * and every length must fit in what is left. */
td_status store_parse_values(const uint8_t *body, size_t len, size_t n, td_store_slice *out);

/* Reads a response header: kind and body length. */
void store_parse_header(const uint8_t *hdr, uint8_t *tag, uint64_t *body_len);
uint32_t store_get_u32(const uint8_t *p);
uint64_t store_get_u64(const uint8_t *p);

#endif
