/* Internal: the TCPStore server, one epoll thread serving the store's state machine (tcp_core.h).
 *
 * The master rank runs one inside its process (tcp_store.c); tools/tdist-store runs one as a
 * program. The thread is named "td-store-srv", and store_server_stop wakes it through an
 * eventfd, joins it and closes every connection. */
#ifndef TDIST_STORE_TCP_SERVER_H
#define TDIST_STORE_TCP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

typedef struct td_store_server td_store_server;

typedef struct td_store_server_options {
    const char *host;       /* address to bind; NULL or "": every interface */
    int port;               /* 0: a free port */
    const char *auth_token; /* NULL: $TDIST_AUTH_TOKEN; "": none */
    size_t max_key_len;     /* 0: $TDIST_STORE_MAX_KEY or 64 KiB */
    size_t max_value_len;   /* 0: $TDIST_STORE_MAX_VALUE or 512 MiB */
    /* The hardening limits take 0 for $TDIST_STORE_MAX_REPLY (1 GiB, or max value + 4 KiB if
     * larger), $TDIST_STORE_HANDSHAKE_TIMEOUT (5 s) and $TDIST_STORE_MAX_PENDING (1024, and at most
     * half the open-files limit), and their defaults when those are unset. */
    uint64_t max_reply_len;       /* largest reply built for one request */
    int64_t handshake_timeout_ms; /* a connection not past the handshake by then is closed */
    int64_t max_pending;          /* connections not past the handshake; beyond, the oldest goes */
} td_store_server_options;

td_status store_server_start(const td_store_server_options *options, td_store_server **server);
/* Stops the thread, closes every connection (clients see the server go) and frees. NULL is ignored. */
void store_server_stop(td_store_server *server);
int store_server_port(const td_store_server *server);
/* The bound address as text, e.g. "0.0.0.0:29500" or "[::]:41234". */
const char *store_server_address(const td_store_server *server);

typedef struct td_store_server_stats {
    uint64_t connections; /* open now */
    uint64_t accepted;    /* since start */
    uint64_t accepted_local; /* of which through the same-host socket */
    uint64_t dropped;     /* connections closed for a malformed, oversize or refused request, or
                           * no handshake in time, or evicted over the pending cap */
    uint64_t pending;     /* open now and not past the handshake yet */
    uint64_t keys;
    uint64_t parked;      /* requests waiting for keys */
} td_store_server_stats;

/* A snapshot, updated by the server thread after each batch of events. */
void store_server_get_stats(const td_store_server *server, td_store_server_stats *stats);

#endif
