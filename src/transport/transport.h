/* The transport interface: point-to-point byte movement between the ranks of one group.
 *
 * The collective algorithms (src/coll) are written once against this interface, as Gloo writes its
 * algorithms over transport pairs; tcp (sockets, transport/tcp.h) and shm (shared-memory rings,
 * transport/shm.h) implement it, so a new transport gets every algorithm and a new algorithm runs
 * on every transport.
 *
 * Model: tagged messages. isend posts a message of some bytes (gathered from an iovec) to a peer
 * under a 64-bit tag; irecv posts a buffer (an iovec) for the message with that tag from that peer
 * (or TD_TRANSPORT_ANY). Messages between one pair with one tag match in posting order; an
 * any-source receive and a receive from the sender compete by posting order. A message must fill
 * the posted receive exactly: a length mismatch fails that receive (only that one) with
 * TD_ERR_INVALID naming both lengths. Operations complete asynchronously; the caller owns each
 * td_xfer (typically on its stack, or in a preallocated array so the hot path allocates nothing)
 * and either waits on it or gets a callback.
 *
 * Progress: the thread that waits drives the I/O itself while it waits (busy-polls briefly, then
 * sleeps in the transport's poll set), so a blocking algorithm needs no thread hand-off per
 * message; when nobody waits, the transport's own I/O thread makes progress. A callback (on_done)
 * therefore runs on whichever thread completed the operation: the I/O thread, a waiting thread, or
 * the posting thread itself when the operation completes at once. Keep it short and non-blocking,
 * never call back into the transport from it, and expect that the transport does not touch the
 * xfer after on_done returns (so the callback may recycle it). An xfer with a callback must not be
 * waited on.
 *
 * Deadlines: each operation carries a CLOCK_MONOTONIC deadline (TD_DEADLINE_NONE for none). When
 * one passes before the operation completes, the transport aborts itself with TD_ERR_TIMEOUT: a
 * stream with a half-done message cannot be reused, and a group whose member stalls has failed.
 *
 * Failure: when a peer's connection breaks (the process died, or sent malformed bytes), the whole
 * transport aborts with TD_ERR_PEER_LOST and a message naming the rank ("Connection to rank 2
 * lost: ..."): collectives need everyone, so an algorithm waiting on rank 1 learns at once that
 * rank 2 died. A peer that closes cleanly (destroys its transport) only fails the operations that
 * involve it. abort() fails everything, pending and later, with the given status and message.
 * Every xfer posted successfully completes exactly once, even on abort; wait returns only once it
 * has (so its memory may be reused as soon as wait returns).
 *
 * Tags: the backend gives each collective a distinct tag space (TD_TAG_COLL in coll/coll.h) and
 * user p2p tags their own, so algorithms only pick small step numbers. TD_TAG_RESERVED is the
 * transports' own (control frames) and cannot be posted.
 *
 * Collectives that ranks disagree about: a message under a collective's tag carries the
 * collective's descriptor (td_coll_desc, tdist/backend.h: kind, dtype, reduce op, root, count),
 * which the poster's transport has as coll_desc while the collective runs. The receiver compares
 * it with its own for that collective (any receive it posted, or posts, under the same collective
 * id, whatever the step) and on a difference fails that receive with TD_ERR_INVALID naming both
 * descriptions (td_coll_mismatch_format); the algorithm's abort then tells the other ranks. A rank
 * that only sends in a collective cannot learn of a disagreement before its call returns: it
 * fails at its next operation.
 */
#ifndef TDIST_TRANSPORT_TRANSPORT_H
#define TDIST_TRANSPORT_TRANSPORT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <tdist/collective.h>
#include <tdist/status.h>

#include "base/error.h"

typedef struct td_transport td_transport;
typedef struct td_xfer td_xfer;
typedef struct td_store td_store;
typedef struct samehost_set samehost_set;

#define TD_XFER_MAX_IOV 4
#define TD_TRANSPORT_ANY (-1)          /* any-source receives */
#define TD_TAG_RESERVED UINT64_MAX     /* control frames of the transport itself */
#define TD_XFER_ERROR_MAX 256

/* A collective's tags: the top bit, then the collective's id (its sequence number), then a step in
 * the low TD_TAG_STEP_BITS bits (coll/coll.h builds them). */
#define TD_TAG_COLL_BIT (UINT64_C(1) << 63)
#define TD_TAG_STEP_BITS 24

static inline bool transport_tag_is_coll(uint64_t tag) { return (tag & TD_TAG_COLL_BIT) && tag != TD_TAG_RESERVED; }
/* The collective a message under tag belongs to (its tag without the step). */
static inline uint64_t transport_tag_coll_id(uint64_t tag) { return tag >> TD_TAG_STEP_BITS; }

enum { TD_XFER_SEND = 1, TD_XFER_RECV = 2 };

/* One posted operation. Post it with transport_isend / transport_irecv; read the result after
 * completion. The private part belongs to the transport until completion. */
struct td_xfer {
    /* results, valid once xfer_done(x) */
    td_status status;
    int peer;         /* the actual peer (for any-source receives) */
    size_t nbytes;    /* bytes moved */
    char error[TD_XFER_ERROR_MAX]; /* the failure's message when status != TD_OK */
    /* optional completion callback (see the header comment) */
    void (*on_done)(td_xfer *x, void *arg);
    void *arg;
    /* private */
    atomic_int state; /* 0 pending, 1 done, 2 pending with a thread asleep on it */
    int kind;
    bool recv_posted; /* sends: the peer's receive is surely posted (transport_isend1_posted) */
    uint64_t tag;
    int64_t deadline_ns;
    uint64_t order;   /* posting order, for any-source matching */
    struct iovec iov[TD_XFER_MAX_IOV];
    int iovcnt;
    size_t total;
    size_t progress;
    td_xfer *next;
    const td_coll_desc *desc; /* a collective's message: its descriptor (the transport's coll_desc) */
};

static inline bool xfer_done(td_xfer *x)
{
    return atomic_load_explicit(&x->state, memory_order_acquire) == 1;
}

/* Makes x an xfer that completed successfully without being posted, for code that waits on arrays
 * of xfers where a step has nothing to move. Its callback is cleared. */
static inline void xfer_set_empty(td_xfer *x)
{
    x->on_done = NULL;
    x->status = TD_OK;
    x->nbytes = 0;
    atomic_store_explicit(&x->state, 1, memory_order_relaxed);
}

typedef struct td_transport_ops {
    const char *name;
    /* Post x (set up by the helpers below). A non-TD_OK return (the transport has failed, or the
     * peer closed) means x was not posted and will not complete; the message is in
     * td_last_error(). */
    td_status (*isend)(td_transport *t, int peer, td_xfer *x);
    td_status (*irecv)(td_transport *t, int peer, td_xfer *x);
    /* Drives progress until x completes, and returns x->status with td_last_error() set to
     * x->error on failure. If the deadline (CLOCK_MONOTONIC ns; TD_DEADLINE_NONE for none) passes
     * first, the transport aborts with TD_ERR_TIMEOUT, which completes x. */
    td_status (*wait)(td_transport *t, td_xfer *x, int64_t deadline_ns);
    /* Fails every pending and later operation with (status, message); the first abort wins.
     * TD_ERR_CLOSED means an orderly shutdown (the peers are told, and fail only what involves this
     * rank); any other status but TD_ERR_PEER_LOST (which every peer sees for itself) also breaks
     * the connections, so that the peers fail at once too. Never waits for peers. */
    void (*abort)(td_transport *t, td_status status, const char *message);
    /* Aborts with TD_ERR_CLOSED if not yet aborted, stops the transport's threads and frees it.
     * After an orderly close it tells the peers so behind what it sent them, which may wait for a
     * slow peer to read (tcp: up to 10 s for one that reads nothing; no wait for one that is gone). */
    void (*destroy)(td_transport *t);
} td_transport_ops;

struct td_transport {
    const td_transport_ops *ops;
    int rank;
    int size;
    /* The memory its ranks share on one host (samehost.h), for algorithms that use it directly
     * instead of sending messages (the shm backend's); NULL when the transport has none. */
    samehost_set *samehost;
    /* The descriptor of the collective running on this transport (coll_execute sets it for the
     * run; NULL: none), which transport_prepare gives the xfers under collective tags. */
    const td_coll_desc *coll_desc;
};

/* What a transport's set-up through a store takes: the first member (setup) of each transport's
 * options (tcp.h, shm.h). Every rank of the group passes the same store, prefix, group name and
 * size. */
typedef struct td_transport_setup {
    td_store *store;          /* rendezvous (borrowed; used only during create) */
    const char *key_prefix;   /* prefix of the transport's store keys; NULL: "<transport name>/" */
    int rank;
    int size;
    const int *global_ranks;  /* size entries, for messages ("rank 5"); NULL: the group ranks */
    int64_t timeout_ms;       /* set-up deadline; <= 0: none */
    const char *group_name;   /* checked in the handshake; NULL: "" */
} td_transport_setup;

/* The posting calls below are inline, so that an algorithm's send reaches the transport's own
 * code with one indirect call. transport_prepare sets up x from an iovec (at most TD_XFER_MAX_IOV
 * entries): x's callback fields (on_done, arg) are kept; everything else is reset. */
static inline td_status transport_prepare(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                         int64_t deadline_ns, td_xfer *x, int kind, bool recv_posted)
{
    if (iovcnt < 0 || iovcnt > TD_XFER_MAX_IOV)
        return error_fmt(TD_ERR_INVALID, "a transfer takes at most %d buffers, got %d", TD_XFER_MAX_IOV, iovcnt);
    if (tag == TD_TAG_RESERVED)
        return error_fmt(TD_ERR_INVALID, "tag %llu is reserved for the transport", (unsigned long long)tag);
    bool any_ok = kind == TD_XFER_RECV && peer == TD_TRANSPORT_ANY;
    if (!any_ok && (peer < 0 || peer >= t->size || peer == t->rank))
        return error_fmt(TD_ERR_INVALID, "invalid peer rank %d for rank %d in a group of %d", peer, t->rank, t->size);
    x->status = TD_OK;
    x->peer = peer;
    x->nbytes = 0;
    x->error[0] = '\0';
    atomic_store_explicit(&x->state, 0, memory_order_relaxed);
    x->kind = kind;
    x->recv_posted = recv_posted;
    x->tag = tag;
    x->desc = transport_tag_is_coll(tag) ? t->coll_desc : NULL;
    x->deadline_ns = deadline_ns;
    x->order = 0;
    x->total = 0;
    x->iovcnt = 0;
    for (int i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len == 0)
            continue;
        x->iov[x->iovcnt++] = iov[i];
        x->total += iov[i].iov_len;
    }
    x->progress = 0;
    x->next = NULL;
    return TD_OK;
}

static inline td_status transport_isend(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                             int64_t deadline_ns, td_xfer *x)
{
    TD_TRY(transport_prepare(t, peer, tag, iov, iovcnt, deadline_ns, x, TD_XFER_SEND, false));
    return t->ops->isend(t, peer, x);
}

static inline td_status transport_irecv(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                             int64_t deadline_ns, td_xfer *x)
{
    TD_TRY(transport_prepare(t, peer, tag, iov, iovcnt, deadline_ns, x, TD_XFER_RECV, false));
    return t->ops->irecv(t, peer, x);
}

/* One-buffer forms. */
static inline td_status transport_isend1(td_transport *t, int peer, uint64_t tag, const void *buf, size_t len,
                              int64_t deadline_ns, td_xfer *x)
{
    struct iovec iov = {(void *)buf, len};
    return transport_isend(t, peer, tag, &iov, 1, deadline_ns, x);
}

static inline td_status transport_irecv1(td_transport *t, int peer, uint64_t tag, void *buf, size_t len,
                              int64_t deadline_ns, td_xfer *x)
{
    struct iovec iov = {buf, len};
    return transport_irecv(t, peer, tag, &iov, 1, deadline_ns, x);
}

/* transport_isend for a message whose receive the peer posts without waiting for anything this
 * rank does after sending (every collective algorithm's): the transport may then hold the send
 * until the receiver pulls the data straight from this rank's memory (tcp's single-copy path on
 * one host). A user's send must not use it: it has to complete even if the receive comes later. */
static inline td_status transport_isend_posted(td_transport *t, int peer, uint64_t tag, const struct iovec *iov,
                                                  int iovcnt, int64_t deadline_ns, td_xfer *x)
{
    TD_TRY(transport_prepare(t, peer, tag, iov, iovcnt, deadline_ns, x, TD_XFER_SEND, true));
    return t->ops->isend(t, peer, x);
}

static inline td_status transport_isend1_posted(td_transport *t, int peer, uint64_t tag, const void *buf,
                                                   size_t len, int64_t deadline_ns, td_xfer *x)
{
    struct iovec iov = {(void *)buf, len};
    return transport_isend_posted(t, peer, tag, &iov, 1, deadline_ns, x);
}

/* Drives progress until x completes (td_transport_ops.wait). */
static inline td_status transport_wait(td_transport *t, td_xfer *x, int64_t deadline_ns)
{
    return t->ops->wait(t, x, deadline_ns);
}

/* Waits for all n (each completes even when one fails); returns the first failure in index order,
 * with its message. Entries never posted must not be passed. */
td_status transport_wait_all(td_transport *t, td_xfer *xs, int n, int64_t deadline_ns);
/* Blocking conveniences for algorithm code. */
td_status transport_send(td_transport *t, int peer, uint64_t tag, const void *buf, size_t len,
                            int64_t deadline_ns);
td_status transport_recv(td_transport *t, int peer, uint64_t tag, void *buf, size_t len, int64_t deadline_ns);
/* Simultaneous send to one peer and receive from another (the step of ring algorithms); recv_posted
 * as transport_isend1_posted says. */
td_status transport_sendrecv(td_transport *t, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                                size_t rlen, uint64_t tag, int64_t deadline_ns, bool recv_posted);
static inline void transport_abort(td_transport *t, td_status status, const char *message)
{
    t->ops->abort(t, status, message);
}
static inline void transport_destroy(td_transport *t)
{
    if (t)
        t->ops->destroy(t);
}

/* For transport implementations: record x's result and mark it done (waking a thread asleep on
 * it). Does not run on_done. */
void xfer_finish(td_xfer *x, td_status status, const char *message);
/* For wait implementations: sleep until x is done or the deadline passes (false then). */
bool xfer_sleep(td_xfer *x, int64_t deadline_ns);
/* For wait implementations: a done x's status, with td_last_error() set to its message on failure. */
td_status xfer_result(const td_xfer *x);

#endif
