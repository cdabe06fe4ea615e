/* The tcp transport: td_transport (transport/transport.h) over one TCP connection per pair of
 * ranks, set up through a store (tcp_connect.c) and driven by a progress engine (tcp.c).
 *
 * Wire format and handshake: docs/protocols.md, "tcp transport". Tuning (environment):
 *   TDIST_SOCKET_IFNAME   interface whose address each rank listens on (else GLOO_SOCKET_IFNAME or
 *                         NCCL_SOCKET_IFNAME, else the interface that reaches MASTER_ADDR, else
 *                         loopback)
 *   TDIST_AUTH_TOKEN      shared secret every connecting rank must present
 *   TDIST_TCP_SPIN_US     how long a waiting thread busy-polls before sleeping (default 50)
 *   TDIST_TCP_BUFFER      socket send/receive buffer size (default: the kernel's autotuning)
 *   TDIST_TCP_UNIX        0 turns off UNIX-domain sockets between ranks on the same host (default 1)
 *   TDIST_TCP_CMA         0 turns off single-copy transfers between them (default 1)
 *
 * Peers on the same host (same boot id and network namespace) talk over a UNIX-domain stream
 * socket instead of TCP loopback: same framing, same engine, about half the kernel time per byte
 * and half the latency. Any failure to use one falls back to TCP. Over such a socket, large
 * collective messages (tags with the top bit set, 64 KiB and up) go by single copy: the receiver
 * reads them from the sender's memory with process_vm_readv, once both sides checked it works.
 */
#ifndef TDIST_TRANSPORT_TCP_H
#define TDIST_TRANSPORT_TCP_H

#include <stdbool.h>
#include <stdint.h>

#include "transport/transport.h"

typedef struct td_tcp_options {
    td_transport_setup setup; /* key_prefix NULL: "tcp/" */
    const char *bind_host;    /* NULL: from the environment (see above) */
    int same_host;            /* TD_TCP_SAME_HOST_*: how to reach peers on this host */
    int cma;                  /* TD_TCP_CMA_*: single-copy transfers between processes of this host */
} td_tcp_options;

enum {
    TD_TCP_CMA_DEFAULT = 0, /* TDIST_TCP_CMA, else on (over UNIX-domain sockets only) */
    TD_TCP_CMA_ON = 1,
    TD_TCP_CMA_OFF = 2,
};

enum {
    TD_TCP_SAME_HOST_DEFAULT = 0, /* TDIST_TCP_UNIX, else UNIX-domain sockets */
    TD_TCP_SAME_HOST_UNIX = 1,
    TD_TCP_SAME_HOST_TCP = 2,     /* TCP loopback even on one host */
};

/* Listens, publishes this rank's address, connects to every peer (lower rank connects to higher)
 * and starts the I/O thread. Every rank of the group must call it with the same store, group name
 * and size. */
td_status tcp_transport_create(const td_tcp_options *options, td_transport **out);

/* A transport over sockets that are already connected and past the handshake: fds[peer] for every
 * peer (fds[rank] is ignored). Takes ownership of the fds, also on failure. global_ranks may be NULL. */
td_status tcp_transport_from_fds(int rank, int size, const int *fds, const int *global_ranks,
                                    td_transport **out);

/* What the handshake agreed with each peer, for tcp_transport_from_fds_ex. */
typedef struct td_tcp_peer_info {
    int pid;        /* the peer's process id, as this process sees it */
    bool cma_send;  /* the peer reads large collective messages from this process's memory */
    bool cma_recv;  /* this process reads them from the peer's */
} td_tcp_peer_info;

/* As tcp_transport_from_fds, with info[peer] (may be NULL: plain streams only). */
td_status tcp_transport_from_fds_ex(int rank, int size, const int *fds, const int *global_ranks,
                                       const td_tcp_peer_info *info, td_transport **out);

/* Whether the connection to peer is a UNIX-domain socket (a peer on this host). */
bool tcp_transport_peer_is_local(td_transport *t, int peer);

/* The largest message the transport accepts (a longer length in a header is a protocol error). */
#define TD_TCP_MAX_MESSAGE (UINT64_C(1) << 40)

#endif
