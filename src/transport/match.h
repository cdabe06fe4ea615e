/* Internal to the transports (tcp.c, shm.c): the half of a progress engine that does not depend on
 * how bytes move. It holds the send queues, the posted receives (per peer and any-source) and
 * the unexpected messages, matches an arriving message to its receive in posting order, buffers
 * what nobody asked for yet (in a size-class pool that only grows while warming up), completes
 * xfers (callbacks run after the lock is let go), and fails them: on a length mismatch or a
 * collective that the sender describes otherwise (transport.h), when a peer closes, and when the
 * transport aborts (timeouts, lost peers), with the messages every transport gives. A transport
 * embeds a td_match, guards it with its mutex (mu), and keeps what is really its own: sockets and
 * framing (tcp) or rings and futexes (shm).
 *
 * Matching rules (transport.h): a message from peer p with tag t goes to the earlier-posted of
 * p's first receive with tag t and the first any-source receive with tag t; a receive posted
 * later takes the earliest-arrived unexpected message with its tag (from its peer, or from any
 * peer by arrival order). */
#ifndef TDIST_TRANSPORT_MATCH_H
#define TDIST_TRANSPORT_MATCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

#define TD_MATCH_POOL_CLASSES 48
/* The unexpected-message buffers a process keeps for reuse, in all its transports together: a
 * buffer of a size class is kept for the next message of that class (no fresh pages to fault in)
 * while the kept ones total at most MATCH_POOL_BUDGET bytes; none larger than MATCH_POOL_LARGEST
 * is kept. The rest go back to malloc, so a long job's memory stays flat. */
#define MATCH_POOL_BUDGET ((size_t)32 << 20)
#define MATCH_POOL_LARGEST ((size_t)8 << 20)

/* A send xfer's kind flag: the transport's own frame (not a user's): never completed, never
 * timed out; the transport reclaims it. */
#define TD_XFER_OWN 0x20

/* Xfers with callbacks completed under the lock; their callbacks run after it is let go. */
typedef struct td_done {
    td_xfer *head, *tail;
    int completed; /* every completion, with or without a callback */
} td_done;

#define TD_DONE_INIT {NULL, NULL, 0}

/* A message that arrived (or is arriving) before its receive was posted. */
typedef struct td_unexp {
    struct td_unexp *next;
    uint64_t tag;
    uint64_t arrival;
    size_t len;
    size_t got;
    char *buf;
    size_t cap; /* grows with what arrived, never far ahead of it */
    /* The transport's own kind (tcp: an RTS whose payload waits in the sender's memory): the
     * payload is not in buf, extra describes it, and take_own delivers it. */
    bool own;
    bool has_desc;     /* it came with a collective's descriptor, desc */
    td_coll_desc desc;
    uint64_t extra[]; /* extra_bytes (match_init) */
} td_unexp;

typedef struct td_match_peer {
    int rank;
    td_xfer *sq_head, *sq_tail;         /* sends not yet handed over whole (the first maybe in part) */
    td_xfer *posted_head, *posted_tail; /* receives posted for this peer */
    td_unexp *uq_head, *uq_tail;        /* unexpected messages, in arrival order */
    td_xfer *rx;                        /* the message arriving now goes into this receive ... */
    td_unexp *ru;                       /* ... or this unexpected buffer; neither: it is dropped */
    uint64_t unexp_bytes;               /* announced lengths of the queued unexpected messages */
} td_match_peer;

typedef struct td_match td_match;

struct td_match {
    const char *name; /* "tcp", "shm": for messages */
    int rank, size;
    int *global_ranks; /* NULL: the group ranks */
    pthread_mutex_t mu; /* guards all of it, and the transport's own state */
    td_match_peer *peers;
    td_xfer *any_head, *any_tail;
    uint64_t order;   /* posting order of receives */
    uint64_t arrival; /* arrival order of unexpected messages */
    bool aborted;
    td_status abort_status;
    char abort_msg[TD_XFER_ERROR_MAX];
    bool stop;        /* the transport's threads are to end */
    bool poller_busy; /* a waiting thread drives progress */
    int xfer_sleepers; /* threads asleep on an xfer while another polls */
    int pending;       /* posted and not completed */
    int pending_cb;    /* of which with a callback */
    /* The transport's abort (first call wins): records the failure with match_fail_all, tells
     * the peers, wakes its threads. Runs with mu held. */
    void (*abort_locked)(td_match *m, td_status status, const char *msg, td_done *done);
    /* Delivers an unexpected message of the transport's own kind (u->own) to receive x: u is
     * unlinked and x->peer set; take_own frees u. NULL when there are none. */
    void (*take_own)(td_match *m, td_match_peer *p, td_unexp *u, td_xfer *x, td_done *done);
    /* pools */
    int pool_min_class;
    size_t unexp_size;
    td_unexp *free_unexp;
    void *pool[TD_MATCH_POOL_CLASSES]; /* kept buffers of each size class, within MATCH_POOL_BUDGET */
    uint64_t unexp_limit; /* unexpected bytes buffered per peer at most (TDIST_MAX_UNEXPECTED_BYTES) */
    /* counters, for the transports' debug logs */
    uint64_t n_unexpected_msgs, n_copied_out;
};

/* pool_min_class: the smallest buffer of the pool is 1 << pool_min_class bytes; extra_bytes: of
 * each td_unexp's extra. global_ranks (size entries, may be NULL) is copied. */
void match_init(td_match *m, const char *name, int rank, int size, const int *global_ranks, int pool_min_class,
                   size_t extra_bytes);
/* Whether a message of len bytes from p, which no receive was posted for, may be buffered: the
 * unexpected messages queued from one peer announce TDIST_MAX_UNEXPECTED_BYTES (1 GiB) at most.
 * When not, td_last_error() says so for the transport to fail the peer with. */
bool match_unexp_admit(td_match *m, const td_match_peer *p, uint64_t len);
/* The bytes the process's transports keep in their pools now (at most MATCH_POOL_BUDGET). */
size_t match_pool_bytes(void);
/* Frees the queues' buffers, the pools and the peers (every xfer must have completed). */
void match_free(td_match *m);

static inline int match_grank(const td_match *m, int r) { return m->global_ranks ? m->global_ranks[r] : r; }

/* ---- completion --------------------------------------------------------------------------------- */

/* Completes x with (status, msg): at once when it has no callback, else queued on done. */
void match_complete(td_match *m, td_xfer *x, td_status status, const char *msg, td_done *done);
void match_completef(td_match *m, td_xfer *x, td_status status, td_done *done, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Completes x successfully with all its bytes moved. */
static inline void match_finish(td_match *m, td_xfer *x, td_done *done)
{
    x->nbytes = x->total;
    match_complete(m, x, TD_OK, NULL, done);
}
/* Runs the queued callbacks (without the lock) and empties done. */
void match_run_callbacks(td_done *done);

static inline void match_push(td_xfer **head, td_xfer **tail, td_xfer *x)
{
    x->next = NULL;
    if (*tail)
        (*tail)->next = x;
    else
        *head = x;
    *tail = x;
}

static inline void match_push_front(td_xfer **head, td_xfer **tail, td_xfer *x)
{
    x->next = *head;
    *head = x;
    if (!*tail)
        *tail = x;
}

/* Removes x (which must be in the list) given its predecessor. */
static inline void match_unlink(td_xfer **head, td_xfer **tail, td_xfer *prev, td_xfer *x)
{
    if (prev)
        prev->next = x->next;
    else
        *head = x->next;
    if (*tail == x)
        *tail = prev;
    x->next = NULL;
}

/* ---- posting ------------------------------------------------------------------------------------ */

/* Queues send x behind p's sends; returns whether the queue was empty (the caller then starts
 * writing). */
bool match_post_send(td_match *m, td_match_peer *p, td_xfer *x);
/* Posts receive x from peer (or TD_TRANSPORT_ANY): it takes the earliest matching unexpected
 * message, or waits in its queue (*queued). peer_gone: the peer said goodbye and sends no more;
 * a receive that nothing already here can satisfy is then refused (error set, x not posted). */
td_status match_post_recv(td_match *m, int peer, td_xfer *x, bool peer_gone, td_done *done, bool *queued);
/* Why a post is refused: the abort, or the peer's goodbye (error set). */
td_status match_refused(td_match *m, const td_match_peer *p);

/* ---- arriving messages -------------------------------------------------------------------------- */

/* The posted receive that a message (p, tag) goes to, unlinked, or NULL. */
td_xfer *match_posted(td_match *m, td_match_peer *p, uint64_t tag);
/* A message (p, tag, len; desc: the collective's descriptor it carries, NULL where the transport
 * carries none, which is then not compared) reached the
 * front of p's stream: its posted receive becomes p->rx and true is returned, or false with p->rx
 * NULL when there is none (match_desc_unposted has then checked desc against p's receives). A
 * posted receive of another collective description or of another length fails (the payload is
 * dropped: true with p->rx NULL). p->ru is reset either way. */
bool match_arrived(td_match *m, td_match_peer *p, uint64_t tag, uint64_t len, const td_coll_desc *desc,
                   td_done *done);
/* Whether a message from p described as desc (a collective's; NULL: not compared) may go to x:
 * false when x's collective is described otherwise, after failing x with TD_ERR_INVALID and both
 * descriptions (transport.h). */
bool match_desc_check(td_match *m, td_xfer *x, const td_match_peer *p, const td_coll_desc *desc, td_done *done);
/* A message of a collective (tag, desc) that no receive was posted for: fails a receive posted
 * from p for another step of that collective that describes it otherwise. */
void match_desc_unposted(td_match *m, td_match_peer *p, uint64_t tag, const td_coll_desc *desc, td_done *done);
/* A new unexpected-message record (arrival numbered, with the descriptor desc, which may be NULL),
 * not yet queued; no buffer yet. */
td_unexp *match_unexp_new(td_match *m, uint64_t tag, size_t len, const td_coll_desc *desc);
/* Appends u to p's unexpected messages. */
void match_unexp_queue(td_match *m, td_match_peer *p, td_unexp *u);
/* Makes room for n more bytes in u's buffer (it follows the bytes that came, so a header that
 * claims a huge length costs nothing until they come). False when out of memory (error set). */
bool match_unexp_room(td_match *m, td_unexp *u, size_t n);
/* Returns u (unlinked) and its buffer to the pools. */
void match_unexp_free(td_match *m, td_unexp *u);
/* The message into p->rx is complete (or the one into p->ru, which stays queued). */
void match_message_done(td_match *m, td_match_peer *p, td_done *done);
/* Fails x: the message (from p, tag, len bytes) does not fit it. */
void match_mismatch(td_match *m, td_xfer *x, const td_match_peer *p, uint64_t tag, size_t len, td_done *done);

/* ---- failure ------------------------------------------------------------------------------------ */

/* Completes every xfer of a list with (status, msg); the transport's own (TD_XFER_OWN) are only
 * dropped from it. */
void match_fail_list(td_match *m, td_xfer **head, td_xfer **tail, td_status status, const char *msg,
                        td_done *done);
/* For abort_locked: records the failure and fails every pending xfer. */
void match_fail_all(td_match *m, td_status status, const char *msg, td_done *done);
/* "Connection to rank R lost: rank R closed its end (...)" into buf. */
void match_closed_msg(const td_match *m, const td_match_peer *p, char *buf, size_t size);
/* p said goodbye: fails what can only complete through it (the rest of the group goes on). */
void match_peer_closed(td_match *m, td_match_peer *p, td_done *done);
/* The transport's abort op: m->abort_locked under the lock, then the callbacks. message NULL: the
 * status's name. */
void match_abort(td_match *m, td_status status, const char *message);
/* Aborts (m->abort_locked) with a formatted message. */
void match_abortf(td_match *m, td_status status, td_done *done, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Aborts with TD_ERR_PEER_LOST: "Connection to rank R lost: <why>". */
void match_lost(td_match *m, const td_match_peer *p, td_done *done, const char *why);
/* Aborts with TD_ERR_TIMEOUT naming x. */
void match_timeout(td_match *m, const td_xfer *x, td_done *done);
/* The earliest deadline of the pending xfers (TD_DEADLINE_NONE if none) and whose. */
int64_t match_earliest(td_match *m, td_xfer **which);

/* ---- waiting ------------------------------------------------------------------------------------ */

/* The start of a transport's wait. False with *result: x was done, or another thread drove
 * progress (this one slept on x) until x completed or its deadline passed (then the transport
 * timed out). True: this thread is the poller now (poller_busy set, mu held). *dl: the deadline
 * that applies (the earlier of x's and the wait's). */
bool match_wait_begin(td_match *m, td_xfer *x, int64_t deadline_ns, int64_t *dl, td_status *result);

/* ---- iovec copies ------------------------------------------------------------------------------- */

/* Copies n bytes from src into x's buffers at offset off. */
void xfer_copy_in(td_xfer *x, size_t off, const char *src, size_t n);
/* Copies n bytes of x's buffers from offset off into dst. */
void xfer_copy_out(const td_xfer *x, size_t off, char *dst, size_t n);
/* The part of x's buffers from offset skip on, at most limit bytes, as iov entries (at most max);
 * returns their count. */
int xfer_iov_from(const td_xfer *x, size_t skip, size_t limit, struct iovec *iov, int max);

#endif
