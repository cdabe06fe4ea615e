/* Internal: the TCPStore server's state machine, without sockets.
 *
 * The core owns the key-value map, the connections' protocol state and the server-side wait lists:
 * a GET, WAIT or MULTI_GET on a missing key parks its connection on that key, and the write that
 * creates the key answers it. The epoll loop (tcp_server.c) moves bytes between sockets and each
 * connection's input and output buffers; the fuzz target drives the same core with fake
 * connections. Not thread-safe: one thread (the server's) owns a core. */
#ifndef TDIST_STORE_TCP_CORE_H
#define TDIST_STORE_TCP_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#include "base/buf.h"
#include "net/auth.h"
#include "store/store_proto.h"

typedef struct td_store_core td_store_core;
typedef struct td_store_conn td_store_conn;

/* Until it has authenticated, a connection may send only HELLO and then (when the server holds a
 * secret) AUTH, each body at most this many bytes (magic, version, a length and a nonce or proof of
 * at most TD_STORE_MAX_AUTH_FIELD): anything else is refused from the header, before any body is
 * received. */
#define TD_STORE_HELLO_MAX_BODY (12u + TD_STORE_MAX_AUTH_FIELD)
/* Default largest reply the server builds for one request (TDIST_STORE_MAX_REPLY): 1 GiB, or max
 * value + 4 KiB when that is larger, so that any one value can always be read back. */
#define TD_STORE_DEFAULT_MAX_REPLY ((uint64_t)1 << 30)

/* key: the job's secret clients must prove they hold (key->on false, or NULL: none). The reply
 * limit starts at TD_STORE_DEFAULT_MAX_REPLY (or max value + 4 KiB if larger). */
td_store_core *store_core_new(const td_store_limits *lim, const auth_key *key);
/* A reply (GET, COMPARE_SET, MULTI_GET) whose body would be larger than max_reply bytes is not
 * built: the client gets an ERROR naming the limit and the connection stays. */
void store_core_set_max_reply(td_store_core *core, uint64_t max_reply);
uint64_t store_core_max_reply(const td_store_core *core);
/* Frees the core and every connection still attached. */
void store_core_free(td_store_core *core);

td_store_conn *store_core_attach(td_store_core *core, void *user);
/* Removes a connection (closed by either side), dropping its parked request. */
void store_core_detach(td_store_core *core, td_store_conn *conn);
void *store_conn_user(const td_store_conn *conn);

/* Received bytes go at the end of this buffer. */
td_buf *store_conn_input(td_store_conn *conn);
/* How many more bytes the partially received request needs (0 when unknown), so the reader can
 * size one receive for a large value. */
size_t store_conn_input_want(const td_store_conn *conn);
/* Handles every complete request in the input. An error (message set) means the connection must
 * be closed: malformed, oversize or unknown requests, or requests out of protocol order. */
td_status store_core_process(td_store_core *core, td_store_conn *conn);

/* Pending output; store_conn_output_done drops n sent bytes. */
const uint8_t *store_conn_output(const td_store_conn *conn, size_t *len);
void store_conn_output_done(td_store_conn *conn, size_t n);
/* The connection must be closed once its output is sent (it was refused in the handshake). */
bool store_conn_closing(const td_store_conn *conn);
/* The handshake is done: HELLO accepted and, when the server holds a secret, AUTH's proof checked. */
bool store_conn_authenticated(const td_store_conn *conn);
/* How many more bytes may be received before the connection authenticates (the rest of a HELLO or
 * AUTH of at most TD_STORE_HELLO_MAX_BODY); SIZE_MAX once it has. */
size_t store_conn_preauth_room(const td_store_conn *conn);
/* Reading should pause: the peer is not taking its answers. */
bool store_conn_backlogged(const td_store_conn *conn);

/* Connections that got output since the last call (the one processed and the waiters its writes
 * answered), one at a time; NULL when none is left. */
td_store_conn *store_core_pop_dirty(td_store_core *core);

size_t store_core_num_conns(const td_store_core *core);
td_store_conn *store_core_conn(const td_store_core *core, size_t i);
size_t store_core_num_keys(const td_store_core *core);
size_t store_core_num_parked(const td_store_core *core);

#endif
