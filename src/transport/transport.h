/* The transport interface: point-to-point byte movement between the ranks of one group.
 *
 * The collective algorithms (src/coll) are written once against this interface, as Gloo writes its
 * algorithms over transport pairs; tcp (sockets) implements it now and shm (shared-memory rings)
 * will later, so a new transport gets every algorithm and a new algorithm runs on every transport.
 *
 * Model: tagged messages. isend posts a message of some bytes (gathered from an iovec) to a peer
 * under a 64-bit tag; irecv posts a buffer (an iovec) for the message with that tag from that peer
 * (or TD_ANY_SOURCE). Messages between one pair with one tag match in posting order. A message must
 * fill the posted receive exactly: a length mismatch fails that receive with TD_ERR_INVALID naming
 * both lengths. Operations complete asynchronously; the caller owns each td_xfer (typically on its
 * stack, or in a preallocated array so the hot path allocates nothing) and waits on it, or gets a
 * callback on the transport's progress thread (keep it short: no blocking, no user code).
 *
 * Failure: when a peer's connection breaks, every pending and later operation involving that peer
 * fails with TD_ERR_PEER_LOST and a message naming the rank ("Connection to rank 2 lost: ..."), and
 * any-source receives fail too. abort() fails everything, for destroy and for group-level failures.
 *
 * Tags: the pg layer gives each collective a distinct tag space (sequence number in the high bits)
 * and p2p user tags their own space, so algorithms only pick small step numbers.
 */
#ifndef TDIST_TRANSPORT_TRANSPORT_H
#define TDIST_TRANSPORT_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <tdist/status.h>

typedef struct td_store td_store;
typedef struct td_transport td_transport;
typedef struct td_xfer td_xfer;

#define TD_XFER_MAX_IOV 4

/* One posted operation. Fill the public part through td_transport_isend/irecv; read the result
 * after completion. The private part belongs to the transport until completion. */
struct td_xfer {
    /* results, valid once `done` is true */
    td_status status;
    int peer;         /* the actual peer (for any-source receives) */
    size_t nbytes;    /* bytes moved */
    /* optional completion callback, run on the progress thread */
    void (*on_done)(td_xfer *x, void *arg);
    void *arg;
    /* private */
    _Atomic int done_flag;
    int kind; /* send or recv */
    uint64_t tag;
    struct iovec iov[TD_XFER_MAX_IOV];
    int iovcnt;
    size_t total;
    size_t progress;
    td_xfer *next;
    char error[256];
};

typedef struct td_transport_ops {
    const char *name;
    td_status (*isend)(td_transport *t, int peer, uint64_t tag, td_xfer *x);
    td_status (*irecv)(td_transport *t, int peer, uint64_t tag, td_xfer *x);
    /* Waits for x until the deadline (CLOCK_MONOTONIC ns; INT64_MAX none). TD_ERR_TIMEOUT leaves x
     * pending; the caller must then abort the transport before reusing x's memory. */
    td_status (*wait)(td_transport *t, td_xfer *x, int64_t deadline_ns);
    void (*abort)(td_transport *t, td_status status, const char *message);
    void (*destroy)(td_transport *t);
} td_transport_ops;

struct td_transport {
    const td_transport_ops *ops;
    int rank;
    int size;
};

/* Helpers over the ops: set up x from an iovec and post it. */
td_status td_transport_isend(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                             td_xfer *x);
td_status td_transport_irecv(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                             td_xfer *x);
td_status td_transport_wait(td_transport *t, td_xfer *x, int64_t deadline_ns);
/* Blocking conveniences for algorithm code. */
td_status td_transport_send(td_transport *t, int peer, uint64_t tag, const void *buf, size_t len,
                            int64_t deadline_ns);
td_status td_transport_recv(td_transport *t, int peer, uint64_t tag, void *buf, size_t len, int64_t deadline_ns);
/* Simultaneous send to one peer and receive from another (the step of ring algorithms). */
td_status td_transport_sendrecv(td_transport *t, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                                size_t rlen, uint64_t tag, int64_t deadline_ns);

#endif
