/* The tcp transport's progress engine: tagged messages over one non-blocking TCP socket per peer.
 *
 * Each message is a 16-byte header (tag, length; docs/protocols.md "tcp transport") and its payload.
 * Sends are written by the posting thread straight from the caller's memory (sendmsg over the
 * xfer's iovec, header included); what the socket does not take at once is queued and finished on
 * EPOLLOUT. Receives are matched per (peer, tag) in posting order when the header arrives (the
 * shared matching engine, match.h): if a receive is posted, the payload is read straight into its
 * iovec (readv, with a small staging buffer appended so that one call also picks up the next
 * headers and small payloads); if not, it goes into an unexpected-message buffer and is copied out
 * when the receive is posted.
 *
 * Who does the I/O: all sockets sit in one "inner" epoll set. A thread that waits on an xfer
 * becomes the poller: it busy-polls the inner set briefly, then sleeps in it, handling whatever
 * arrives, so a blocking algorithm's messages need no thread hand-off. When no thread waits, the I/O
 * thread does the same: it sleeps on an "outer" epoll set that holds the inner set (one-shot) and an
 * eventfd. A poller disarms the inner set in the outer one while it polls, so the I/O thread is not
 * woken for messages the poller handles, and re-arms it when it leaves. All state is guarded by one
 * mutex, held only around non-blocking socket calls, never across a wait.
 *
 * Failures: a broken stream (EOF without a goodbye, reset, a malformed header) aborts the transport
 * with TD_ERR_PEER_LOST naming the rank; a peer's goodbye frame (sent by an orderly destroy) fails
 * only what involves that peer. An orderly destroy therefore must not lose its goodbye: it writes it
 * behind every message it sent, waiting for room if need be (say_goodbye). Deadlines are enforced by
 * the poller for its own xfer and by the I/O thread (which sleeps until the earliest pending
 * deadline) for everything else. */
#include "transport/tcp.h"
#include "transport/match.h"
#include "transport/samehost.h"
#include "transport/tcp_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"

#define HDR_SIZE TD_TCP_HDR_SIZE
#define STAGE_SIZE (16 * 1024)
#define MAX_EVENTS 64
#define SEND_IOV_MAX 64
#define READ_ROUNDS 16 /* reads per peer per event, so one busy peer cannot starve the others */
#define POOL_MIN_CLASS 6 /* unexpected-message buffers of 64 bytes and up */
#define SPIN_MAX_BYTES (64 * 1024)
#define CTRL_MAX TD_TCP_CTRL_MAX
#define CMA_MIN ((size_t)64 << 10) /* smaller collective messages go inline */
#define FRAME_BUFS 12
#define BYE_WAIT_S 10 /* how long a destroy waits for a peer that reads nothing to take its goodbye */

/* A send xfer's kind flag: the message goes as an RTS (the peer reads it from this process's
 * memory). The transport's own control frames (a FIN) are TD_XFER_OWN. */
enum { XFER_KIND_RTS = 0x10 };

enum { RX_HEADER = 0, RX_PAYLOAD = 1 };

/* A control frame of the transport's own (a FIN), queued on a send stream like a message. */
typedef struct ctrl_msg {
    td_xfer x;
    uint8_t payload[TD_TCP_RTS_MAX];
    struct ctrl_msg *next_free;
    struct ctrl_msg *all_next;
} ctrl_msg;

typedef struct peer {
    td_match_peer *queues; /* its queues, and where the arriving payload goes */
    int fd;
    bool bye;        /* the peer sent its goodbye: no more messages from it */
    bool closed;     /* no more I/O on this socket (removed from the poll set) */
    bool broken;     /* a send was abandoned mid-message: the stream cannot carry more frames */
    bool out_armed;  /* EPOLLOUT requested */
    /* same-host single-copy transfers (process_vm_readv), agreed in the handshake */
    pid_t pid;
    bool cma_send;   /* the peer can read this process's memory: large collective sends go as RTS */
    bool cma_recv;   /* this process can read the peer's */
    /* sending */
    td_xfer *await_head, *await_tail; /* RTS sent, waiting for the peer's FIN */
    /* receiving (q->rx or q->ru is the payload's target; neither: discard, or a control frame) */
    int rx_state;
    size_t remaining;
    uint64_t rx_tag;
    size_t rx_len;
    bool in_control; /* the payload being read is a control frame's, into ctrl */
    size_t ctrl_got;
    uint8_t ctrl[CTRL_MAX];
    char *stage;
    size_t stage_off, stage_len;
    /* an orderly destroy: what it still owes the peer (queued FINs, then the goodbye) */
    td_buf owed;
    size_t owed_off;
} peer;

typedef struct tcp_transport {
    td_transport base;
    td_match match; /* its mutex guards everything */
    peer *peers;
    int inner_ep, outer_ep, efd_io, efd_poll;
    bool armed;       /* the inner set is armed in the outer one */
    pthread_t io_thread;
    bool io_started;
    int64_t spin_ns;
    ctrl_msg *free_ctrl, *all_ctrl;
    uint64_t next_cookie;
    /* Holds guard_value while the transport lives and is not aborted. Every RTS names it, and a
     * reader checks it after copying: an abort clears it before failing the sends, so a reader
     * never takes bytes that the sender's caller may already have reused. */
    _Atomic uint64_t guard;
    uint64_t guard_value;
    /* counters, logged at destroy (TDIST_LOG_LEVEL=DEBUG): where received payload bytes went */
    uint64_t n_direct, n_staged, n_unexpected, n_cma;
} tcp_transport;

static const td_transport_ops tcp_ops;

/* ---- small helpers ---------------------------------------------------------------------------- */

static tcp_transport *of_match(td_match *m) { return (tcp_transport *)((char *)m - offsetof(tcp_transport, match)); }

static int grank(const tcp_transport *t, const peer *p) { return match_grank(&t->match, p->queues->rank); }

static void wake_fd(int fd)
{
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof one);
    (void)n; /* a full counter already means "wake up" */
}

static void drain_fd(int fd)
{
    uint64_t v;
    ssize_t n = read(fd, &v, sizeof v);
    (void)n;
}

/* With the lock held, after completing xfers: the poller may be asleep on one of them. */
static void wake_poller(tcp_transport *t, const td_done *done)
{
    if (t->match.poller_busy && done->completed)
        wake_fd(t->efd_poll);
}

/* ---- failure ---------------------------------------------------------------------------------- */

static ctrl_msg *ctrl_get(tcp_transport *t)
{
    ctrl_msg *c = t->free_ctrl;
    if (c) {
        t->free_ctrl = c->next_free;
    } else {
        c = TD_NEW(ctrl_msg);
        c->all_next = t->all_ctrl;
        t->all_ctrl = c;
    }
    return c;
}

static void ctrl_put(tcp_transport *t, td_xfer *x)
{
    ctrl_msg *c = (ctrl_msg *)x;
    c->next_free = t->free_ctrl;
    t->free_ctrl = c;
}

static void set_armed(tcp_transport *t, bool arm)
{
    struct epoll_event ev = {.events = EPOLLONESHOT | (arm ? EPOLLIN : 0), .data.u32 = 0};
    epoll_ctl(t->outer_ep, EPOLL_CTL_MOD, t->inner_ep, &ev);
    t->armed = arm;
}

/* Writes a control frame if the stream is at a message boundary and the socket takes it whole at
 * once (it is small); otherwise the stream is marked broken. Best effort: used only on the way
 * out. */
static void send_control(peer *p, int type, td_status status, const char *msg)
{
    if (p->closed || p->broken || p->bye || p->queues->sq_head)
        return;
    uint8_t f[TD_TCP_CTRL_FRAME_MAX];
    size_t len = tcp_control_encode(f, type, status, msg);
    ssize_t n = send(p->fd, f, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != (ssize_t)len)
        p->broken = true;
}

static bool keep_owed(tcp_transport *t, peer *p);
static void read_peer(tcp_transport *t, peer *p, td_done *done);

static void abort_locked(td_match *m, td_status status, const char *msg, td_done *done)
{
    tcp_transport *t = of_match(m);
    if (m->aborted)
        return;
    atomic_store(&t->guard, 0);
    for (int r = 0; r < m->size; r++) {
        peer *p = &t->peers[r];
        if (r == m->rank)
            continue;
        bool kept = status == TD_ERR_CLOSED && !p->closed && !p->bye && keep_owed(t, p);
        if (p->queues->sq_head && p->queues->sq_head->progress > 0 && !kept)
            p->broken = true;
        match_fail_list(m, &p->await_head, &p->await_tail, status, msg, done);
    }
    match_fail_all(m, status, msg, done);
    /* A failure (not an orderly close) is passed on: the peers learn of it at once instead of at
     * their timeouts, and with its cause, so that every survivor of a dead rank names that rank
     * and not the one that told it. A stream that cannot carry the frame is just cut. */
    for (int r = 0; r < m->size && status != TD_ERR_CLOSED; r++) {
        peer *p = &t->peers[r];
        if (r != m->rank && p->fd >= 0 && !p->closed) {
            send_control(p, TD_TCP_CTRL_ABORT, status, msg);
            shutdown(p->fd, p->broken ? SHUT_RDWR : SHUT_WR);
        }
    }
    m->stop = true;
    wake_fd(t->efd_io);
    wake_fd(t->efd_poll);
}

/* The peer said goodbye: fail what can only complete through it; the rest of the group goes on. */
static void peer_said_bye(tcp_transport *t, peer *p, td_done *done)
{
    char msg[TD_XFER_ERROR_MAX];
    match_closed_msg(&t->match, p->queues, msg, sizeof msg);
    p->bye = true;
    match_fail_list(&t->match, &p->await_head, &p->await_tail, TD_ERR_PEER_LOST, msg, done);
    match_peer_closed(&t->match, p->queues, done);
}

static void peer_close(tcp_transport *t, peer *p)
{
    if (p->closed)
        return;
    p->closed = true;
    epoll_ctl(t->inner_ep, EPOLL_CTL_DEL, p->fd, NULL);
}

/* The stream broke (or carried garbage): abort, unless the peer had said goodbye before EOF. */
static void peer_lost(tcp_transport *t, peer *p, td_done *done, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void peer_lost(tcp_transport *t, peer *p, td_done *done, const char *fmt, ...)
{
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    peer_close(t, p);
    match_lost(&t->match, p->queues, done, why);
}

/* ---- sending ---------------------------------------------------------------------------------- */

static void set_out(tcp_transport *t, peer *p, bool on)
{
    if (p->out_armed == on || p->closed)
        return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0),
                             .data.u32 = (uint32_t)p->queues->rank};
    epoll_ctl(t->inner_ep, EPOLL_CTL_MOD, p->fd, &ev);
    p->out_armed = on;
}

static bool is_rts(const td_xfer *x) { return (x->kind & XFER_KIND_RTS) != 0; }

/* Bytes x occupies on the wire: header (with a collective's descriptor) and payload, or header and
 * RTS. */
static size_t wire_len(const td_xfer *x)
{
    return is_rts(x) ? HDR_SIZE + TD_TCP_RTS_FIXED + 16 * (size_t)x->iovcnt : tcp_header_size(x->tag) + x->total;
}

/* The frame's first bytes (header; for an RTS also its descriptor) into f; returns their count. */
static size_t frame_prefix(const tcp_transport *t, const td_xfer *x, uint8_t *f)
{
    if (!is_rts(x)) {
        tcp_header_encode(f, x->tag, x->total);
        if (!transport_tag_is_coll(x->tag))
            return HDR_SIZE;
        tcp_desc_encode(f + HDR_SIZE, x->desc);
        return HDR_SIZE + TD_TCP_DESC_SIZE;
    }
    uint64_t addr[TD_XFER_MAX_IOV], len[TD_XFER_MAX_IOV];
    for (int i = 0; i < x->iovcnt; i++) {
        addr[i] = (uint64_t)(uintptr_t)x->iov[i].iov_base;
        len[i] = x->iov[i].iov_len;
    }
    size_t n = tcp_rts_encode(f + HDR_SIZE, x->tag, x->order, (uint64_t)(uintptr_t)&t->guard, t->guard_value,
                              x->desc, addr, len, x->iovcnt);
    tcp_header_encode(f, TD_TAG_RESERVED, n);
    return HDR_SIZE + n;
}

/* Writes as much of p's send queue as the socket takes, several messages per call. A message that
 * went out whole completes, except an RTS, which waits for the peer's FIN. */
static void flush_sends(tcp_transport *t, peer *p, td_done *done)
{
    td_match_peer *q = p->queues;
    uint8_t frames[FRAME_BUFS][HDR_SIZE + TD_TCP_RTS_MAX];
    while (q->sq_head && !t->match.aborted) {
        struct iovec iov[SEND_IOV_MAX];
        int cnt = 0, nf = 0;
        size_t want = 0;
        for (td_xfer *x = q->sq_head; x && nf < FRAME_BUFS && cnt + 1 + TD_XFER_MAX_IOV <= SEND_IOV_MAX;
             x = x->next, nf++) {
            size_t pre = frame_prefix(t, x, frames[nf]);
            if (x->progress < pre) {
                iov[cnt].iov_base = frames[nf] + x->progress;
                iov[cnt].iov_len = pre - x->progress;
                want += iov[cnt].iov_len;
                cnt++;
            }
            if (is_rts(x))
                continue;
            size_t skip = x->progress > pre ? x->progress - pre : 0;
            int k = xfer_iov_from(x, skip, SIZE_MAX, iov + cnt, SEND_IOV_MAX - cnt);
            for (int i = 0; i < k; i++)
                want += iov[cnt + i].iov_len;
            cnt += k;
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t n = sendmsg(p->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                set_out(t, p, true);
                return;
            }
            int err = errno;
            /* A peer that failed closes after its abort frame: read what it sent first, so that
             * its cause, not the broken pipe, is what this rank reports. */
            if (err == EPIPE || err == ECONNRESET)
                read_peer(t, p, done);
            if (!t->match.aborted)
                peer_lost(t, p, done, "sending failed: %s", strerror(err));
            return;
        }
        size_t left = (size_t)n;
        while (q->sq_head) {
            td_xfer *x = q->sq_head;
            size_t need = wire_len(x) - x->progress;
            if (left < need) {
                x->progress += left;
                break;
            }
            left -= need;
            x->progress = wire_len(x);
            q->sq_head = x->next;
            if (!q->sq_head)
                q->sq_tail = NULL;
            if (x->kind & TD_XFER_OWN)
                ctrl_put(t, x);
            else if (is_rts(x))
                match_push(&p->await_head, &p->await_tail, x);
            else
                match_finish(&t->match, x, done);
        }
        if ((size_t)n < want) {
            set_out(t, p, true);
            return;
        }
    }
    set_out(t, p, false);
}

/* Queues one of the transport's own control frames (payload of len bytes) behind p's sends. */
static void queue_control(tcp_transport *t, peer *p, const uint8_t *payload, size_t len, td_done *done)
{
    if (p->closed || p->broken || p->bye)
        return;
    ctrl_msg *c = ctrl_get(t);
    memcpy(c->payload, payload, len);
    memset(&c->x, 0, sizeof c->x);
    c->x.kind = TD_XFER_OWN;
    c->x.tag = TD_TAG_RESERVED;
    c->x.deadline_ns = TD_DEADLINE_NONE;
    c->x.iov[0].iov_base = c->payload;
    c->x.iov[0].iov_len = len;
    c->x.iovcnt = 1;
    c->x.total = len;
    bool idle = p->queues->sq_head == NULL;
    match_push(&p->queues->sq_head, &p->queues->sq_tail, &c->x);
    if (idle)
        flush_sends(t, p, done);
}

/* At an orderly close, before the sends are failed: the rest of the control frames still queued
 * for p (FINs: the peer's sends complete only at them) goes into p->owed, for say_goodbye. False,
 * keeping nothing, when a message is half-written: the stream can carry no more frames. */
static bool keep_owed(tcp_transport *t, peer *p)
{
    td_xfer *x = p->queues->sq_head;
    if (x && x->progress > 0 && !(x->kind & TD_XFER_OWN))
        return false;
    for (; x; x = x->next) {
        if (!(x->kind & TD_XFER_OWN))
            continue; /* not written at all: failed, and the frames behind it go on */
        uint8_t f[HDR_SIZE + TD_TCP_RTS_MAX];
        size_t len = frame_prefix(t, x, f);
        memcpy(f + len, x->iov[0].iov_base, x->total);
        len += x->total;
        buf_append(&p->owed, f + x->progress, len - x->progress);
    }
    return true;
}

/* ---- single-copy transfers between processes of one host ---------------------------------------
 * A large collective message to a same-host peer goes as an RTS that names its pieces in the
 * sender's memory; the receiver copies them straight into its posted buffer with the same-host
 * layer's single-copy read (samehost.h: one copy, no socket buffers) and answers with a FIN, which
 * completes the send. Both sides agreed in the handshake after checking that the copy works
 * (tcp_connect.c). */

_Static_assert(TD_TCP_RTS_MAX_IOV <= SAMEHOST_READ_MAX_PIECES, "an RTS names more pieces than a read takes");

/* A matched RTS: copy, complete the receive, and tell the sender it may reuse its buffer. */
static void rts_deliver(tcp_transport *t, peer *p, td_xfer *x, const td_tcp_control *c, td_done *done)
{
    td_status fin = TD_OK;
    if (x->total != c->total) {
        match_mismatch(&t->match, x, p->queues, c->tag, (size_t)c->total, done);
    } else {
        int err = samehost_read_into(p->pid, x, c->addr, c->len, c->iovcnt);
        if (err != ESRCH && !samehost_word_is(p->pid, c->guard_addr, c->guard_value)) {
            /* The sender aborted meanwhile (and may have freed the pieces: EFAULT): what was read
             * may not be the message. Its abort frame (or goodbye, or end of stream) comes next on
             * this stream and fails the receive with its cause, the one every other rank reports;
             * until then the receive waits where it was posted. */
            x->progress = 0;
            match_push_front(&p->queues->posted_head, &p->queues->posted_tail, x);
            return;
        }
        if (err == ESRCH) {
            /* The sender is gone: the same loss its socket will show, reported at once. */
            peer_lost(t, p, done, "the process exited (reading its message failed: %s)", strerror(err));
            /* x left the posted list already */
            match_complete(&t->match, x, t->match.abort_status, t->match.abort_msg, done);
            return;
        }
        if (err) {
            match_completef(&t->match, x, TD_ERR_IO, done,
                            "Reading a message of %zu bytes from rank %d's memory failed: %s", x->total, grank(t, p),
                            strerror(err));
            fin = TD_ERR_IO;
        } else {
            t->n_cma += x->total;
            match_finish(&t->match, x, done);
        }
    }
    uint8_t f[TD_TCP_RTS_MAX];
    size_t flen = tcp_fin_encode(f, c->cookie, fin);
    queue_control(t, p, f, flen, done);
}

/* An RTS that waited among the unexpected messages meets its receive (match.h, take_own). */
static void take_rts(td_match *m, td_match_peer *q, td_unexp *u, td_xfer *x, td_done *done)
{
    tcp_transport *t = of_match(m);
    rts_deliver(t, &t->peers[q->rank], x, (const td_tcp_control *)u->extra, done);
    match_unexp_free(m, u);
}

static void handle_rts(tcp_transport *t, peer *p, const td_tcp_control *c, td_done *done)
{
    if (!p->cma_recv) {
        peer_lost(t, p, done, "protocol error: an RTS on a connection that did not agree to them");
        return;
    }
    td_xfer *x = match_posted(&t->match, p->queues, c->tag);
    if (x) {
        /* A receive of a collective described otherwise fails, and its collective's abort fails
         * the send (no FIN). */
        if (match_desc_check(&t->match, x, p->queues, &c->desc, done))
            rts_deliver(t, p, x, c, done);
        return;
    }
    match_desc_unposted(&t->match, p->queues, c->tag, &c->desc, done);
    td_unexp *u = match_unexp_new(&t->match, c->tag, (size_t)c->total, &c->desc);
    u->own = true;
    memcpy(u->extra, c, sizeof *c);
    match_unexp_queue(&t->match, p->queues, u);
}

static void handle_fin(tcp_transport *t, peer *p, const td_tcp_control *c, td_done *done)
{
    td_xfer *prev = NULL, *x = p->await_head;
    while (x && x->order != c->cookie) {
        prev = x;
        x = x->next;
    }
    if (!x) {
        peer_lost(t, p, done, "protocol error: a FIN for no message in flight");
        return;
    }
    match_unlink(&p->await_head, &p->await_tail, prev, x);
    if (c->status == TD_OK)
        match_finish(&t->match, x, done);
    else
        match_completef(&t->match, x, c->status, done,
                           "Rank %d could not read a message of %zu bytes from this rank's memory", grank(t, p),
                           x->total);
}

/* ---- receiving -------------------------------------------------------------------------------- */

/* A complete control frame: the peer's goodbye, or its abort (relayed with its cause). */
static void handle_control(tcp_transport *t, peer *p, td_done *done)
{
    td_tcp_control c;
    int g = grank(t, p);
    if (!tcp_control_parse(p->ctrl, p->ctrl_got, TD_TCP_MAX_MESSAGE, &c)) {
        peer_lost(t, p, done, "protocol error: malformed control frame (type %u, %zu bytes)", p->ctrl[0], p->ctrl_got);
    } else if (c.type == TD_TCP_CTRL_BYE) {
        peer_said_bye(t, p, done);
    } else if (c.type == TD_TCP_CTRL_RTS) {
        handle_rts(t, p, &c, done);
    } else if (c.type == TD_TCP_CTRL_FIN) {
        handle_fin(t, p, &c, done);
    } else {
        p->bye = true; /* nothing more comes from it */
        if (c.status == TD_ERR_PEER_LOST || c.status == TD_ERR_INVALID) /* a lost rank, or collectives ranks
                                                                           disagree about: the same for all */
            match_abortf(&t->match, c.status, done, "%.*s (reported by rank %d)", (int)c.msg_len, c.msg, g);
        else
            match_abortf(&t->match, TD_ERR_PEER_LOST, done, "Connection to rank %d lost: rank %d failed: %.*s", g, g,
                            (int)c.msg_len, c.msg);
    }
}

static void finish_message(tcp_transport *t, peer *p, td_done *done)
{
    p->rx_state = RX_HEADER;
    if (p->in_control) {
        p->in_control = false;
        handle_control(t, p, done);
        return;
    }
    match_message_done(&t->match, p->queues, done);
}

/* A header arrived: pick where its payload goes. False when the stream must be dropped. */
static bool start_message(tcp_transport *t, peer *p, uint64_t tag, uint64_t len, const td_coll_desc *desc,
                          td_done *done)
{
    if (tag == TD_TAG_RESERVED) {
        if (len == 0 || len > CTRL_MAX) {
            peer_lost(t, p, done, "protocol error: control frame with a length of %llu", (unsigned long long)len);
            return false;
        }
        p->in_control = true;
        p->ctrl_got = 0;
        p->queues->rx = NULL;
        p->queues->ru = NULL;
        p->remaining = (size_t)len;
        p->rx_state = RX_PAYLOAD;
        return true;
    }
    if (p->bye) {
        peer_lost(t, p, done, "protocol error: a message after the goodbye frame");
        return false;
    }
    if (len > TD_TCP_MAX_MESSAGE) {
        peer_lost(t, p, done, "protocol error: a message of %llu bytes exceeds the limit of %llu",
                  (unsigned long long)len, (unsigned long long)TD_TCP_MAX_MESSAGE);
        return false;
    }
    p->rx_tag = tag;
    p->rx_len = (size_t)len;
    p->remaining = (size_t)len;
    if (!match_arrived(&t->match, p->queues, tag, len, desc, done)) {
        if (!match_unexp_admit(&t->match, p->queues, len)) {
            peer_lost(t, p, done, "%s", td_last_error());
            return false;
        }
        td_unexp *u = match_unexp_new(&t->match, tag, (size_t)len, desc);
        if (len && !match_unexp_room(&t->match, u, 1)) {
            match_unexp_free(&t->match, u);
            peer_lost(t, p, done, "cannot buffer an unexpected message of %llu bytes: %s", (unsigned long long)len,
                      td_last_error());
            return false;
        }
        match_unexp_queue(&t->match, p->queues, u);
        p->queues->ru = u;
    }
    if (len == 0)
        finish_message(t, p, done);
    else
        p->rx_state = RX_PAYLOAD;
    return true;
}

/* Room in p->queues->ru for the payload's next bytes; false (the stream dropped) when out of memory. */
static bool unexp_room(tcp_transport *t, peer *p, td_done *done)
{
    if (match_unexp_room(&t->match, p->queues->ru, 1))
        return true;
    peer_lost(t, p, done, "cannot buffer an unexpected message of %zu bytes: %s", p->queues->ru->len, td_last_error());
    return false;
}

/* Feeds the staged bytes through the framing. False when the stream was dropped. */
static bool consume_stage(tcp_transport *t, peer *p, td_done *done)
{
    td_match_peer *q = p->queues;
    while (p->stage_off < p->stage_len) {
        size_t avail = p->stage_len - p->stage_off;
        const char *s = p->stage + p->stage_off;
        if (p->rx_state == RX_HEADER) {
            if (avail < HDR_SIZE)
                break;
            uint64_t tag, len;
            tcp_header_decode((const uint8_t *)s, &tag, &len);
            size_t hs = tcp_header_size(tag);
            if (avail < hs)
                break;
            td_coll_desc desc;
            if (hs > HDR_SIZE)
                tcp_desc_decode((const uint8_t *)s + HDR_SIZE, &desc);
            p->stage_off += hs;
            if (!start_message(t, p, tag, len, hs > HDR_SIZE ? &desc : NULL, done))
                return false;
            continue;
        }
        size_t take = avail < p->remaining ? avail : p->remaining;
        if (p->in_control) {
            memcpy(p->ctrl + p->ctrl_got, s, take);
            p->ctrl_got += take;
        } else if (q->rx) {
            xfer_copy_in(q->rx, q->rx->progress, s, take);
            q->rx->progress += take;
            t->n_staged += take;
        } else if (q->ru) {
            if (!unexp_room(t, p, done))
                return false;
            size_t room = q->ru->cap - q->ru->got;
            if (take > room)
                take = room;
            memcpy(q->ru->buf + q->ru->got, s, take);
            q->ru->got += take;
            t->n_unexpected += take;
        }
        p->stage_off += take;
        p->remaining -= take;
        if (p->remaining == 0) {
            finish_message(t, p, done);
            if (t->match.aborted || p->closed)
                return false;
        }
    }
    if (p->stage_off == p->stage_len) {
        p->stage_off = p->stage_len = 0;
    } else if (p->stage_off > 0) {
        memmove(p->stage, p->stage + p->stage_off, p->stage_len - p->stage_off);
        p->stage_len -= p->stage_off;
        p->stage_off = 0;
    }
    return true;
}

static void read_peer(tcp_transport *t, peer *p, td_done *done)
{
    td_match_peer *q = p->queues;
    for (int round = 0; round < READ_ROUNDS && !p->closed && !t->match.aborted; round++) {
        if (!consume_stage(t, p, done))
            return;
        struct iovec iov[TD_XFER_MAX_IOV + 1];
        int cnt = 0;
        size_t direct = 0;
        if (p->rx_state == RX_PAYLOAD) {
            if (q->rx) {
                cnt = xfer_iov_from(q->rx, q->rx->progress, p->remaining, iov, TD_XFER_MAX_IOV);
                direct = p->remaining;
            } else if (q->ru) {
                if (!unexp_room(t, p, done))
                    return;
                size_t room = q->ru->cap - q->ru->got;
                iov[0].iov_base = q->ru->buf + q->ru->got;
                iov[0].iov_len = room < p->remaining ? room : p->remaining;
                cnt = 1;
                direct = iov[0].iov_len;
            }
        }
        iov[cnt].iov_base = p->stage + p->stage_len;
        iov[cnt].iov_len = STAGE_SIZE - p->stage_len;
        size_t want = direct + iov[cnt].iov_len;
        cnt++;
        ssize_t n = readv(p->fd, iov, cnt);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            peer_lost(t, p, done, "%s", strerror(errno));
            return;
        }
        if (n == 0) {
            if (p->bye) {
                peer_close(t, p);
                return;
            }
            if (p->rx_state == RX_PAYLOAD)
                peer_lost(t, p, done, "end of stream in the middle of a message (did the process exit or crash?)");
            else
                peer_lost(t, p, done, "end of stream (did the process exit or crash?)");
            return;
        }
        size_t d = (size_t)n < direct ? (size_t)n : direct;
        if (d) {
            if (q->rx) {
                q->rx->progress += d;
                t->n_direct += d;
            } else {
                q->ru->got += d;
                t->n_unexpected += d;
            }
            p->remaining -= d;
            if (p->remaining == 0)
                finish_message(t, p, done);
        }
        p->stage_len += (size_t)n - d;
        if ((size_t)n < want) {
            consume_stage(t, p, done);
            return;
        }
    }
}

/* ---- event handling --------------------------------------------------------------------------- */

static void handle_events(tcp_transport *t, struct epoll_event *evs, int n, td_done *done)
{
    for (int i = 0; i < n && !t->match.aborted; i++) {
        uint32_t idx = evs[i].data.u32;
        if (idx == (uint32_t)t->base.size) {
            drain_fd(t->efd_poll);
            continue;
        }
        peer *p = &t->peers[idx];
        if (p->closed)
            continue;
        uint32_t e = evs[i].events;
        if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
            read_peer(t, p, done);
        if (!t->match.aborted && !p->closed && (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && p->queues->sq_head)
            flush_sends(t, p, done);
    }
}

/* The earliest deadline of the pending xfers, RTS sends awaiting their FIN included. */
static int64_t earliest_deadline(tcp_transport *t, td_xfer **which)
{
    int64_t best = match_earliest(&t->match, which);
    for (int r = 0; r < t->base.size; r++) {
        for (td_xfer *x = t->peers[r].await_head; x; x = x->next) {
            if (x->deadline_ns < best) {
                best = x->deadline_ns;
                *which = x;
            }
        }
    }
    return best;
}

static void *io_main(void *arg)
{
    tcp_transport *t = arg;
    td_match *m = &t->match;
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        pthread_mutex_lock(&m->mu);
        td_xfer *which;
        int64_t dl = m->stop ? TD_DEADLINE_NONE : earliest_deadline(t, &which);
        bool stop = m->stop;
        pthread_mutex_unlock(&m->mu);
        if (stop)
            break;
        struct epoll_event oev[2];
        int n = epoll_wait(t->outer_ep, oev, 2, deadline_poll_ms(dl));
        bool inner = false;
        for (int i = 0; i < n; i++) {
            if (oev[i].data.u32 == 1)
                drain_fd(t->efd_io);
            else
                inner = true;
        }
        td_done done = TD_DONE_INIT;
        pthread_mutex_lock(&m->mu);
        if (inner) {
            t->armed = false; /* one-shot: the event disarmed it */
            if (!m->stop) {
                int k = epoll_wait(t->inner_ep, evs, MAX_EVENTS, 0);
                if (k > 0)
                    handle_events(t, evs, k, &done);
            }
        }
        if (!m->stop) {
            dl = earliest_deadline(t, &which);
            if (which && deadline_passed(dl))
                match_timeout(m, which, &done);
        }
        wake_poller(t, &done);
        if (!m->poller_busy && !t->armed && !m->stop)
            set_armed(t, true);
        pthread_mutex_unlock(&m->mu);
        match_run_callbacks(&done);
    }
    return NULL;
}

/* ---- ops -------------------------------------------------------------------------------------- */

static td_status tcp_isend(td_transport *base, int peer_rank, td_xfer *x)
{
    tcp_transport *t = (tcp_transport *)base;
    td_done done = TD_DONE_INIT;
    pthread_mutex_lock(&t->match.mu);
    peer *p = &t->peers[peer_rank];
    if (t->match.aborted || p->bye || p->closed || p->broken) {
        td_status s = match_refused(&t->match, p->queues);
        pthread_mutex_unlock(&t->match.mu);
        return s;
    }
    /* Only sends whose receives are surely posted (transport_isend1_posted): a user's send must
     * complete even if the receive comes much later. */
    if (p->cma_send && x->recv_posted && x->total >= CMA_MIN) {
        x->kind |= XFER_KIND_RTS;
        x->order = ++t->next_cookie;
    }
    if (match_post_send(&t->match, p->queues, x))
        flush_sends(t, p, &done);
    wake_poller(t, &done);
    pthread_mutex_unlock(&t->match.mu);
    match_run_callbacks(&done);
    return TD_OK;
}

static td_status tcp_irecv(td_transport *base, int peer_rank, td_xfer *x)
{
    tcp_transport *t = (tcp_transport *)base;
    td_done done = TD_DONE_INIT;
    pthread_mutex_lock(&t->match.mu);
    bool gone = peer_rank != TD_TRANSPORT_ANY && (t->peers[peer_rank].bye || t->peers[peer_rank].closed);
    bool queued;
    td_status s = match_post_recv(&t->match, peer_rank, x, gone, &done, &queued);
    wake_poller(t, &done);
    pthread_mutex_unlock(&t->match.mu);
    match_run_callbacks(&done);
    return s;
}

static td_status tcp_wait(td_transport *base, td_xfer *x, int64_t deadline_ns)
{
    tcp_transport *t = (tcp_transport *)base;
    td_match *m = &t->match;
    int64_t dl;
    td_status result;
    if (!match_wait_begin(m, x, deadline_ns, &dl, &result))
        return result;
    if (t->armed)
        set_armed(t, false);
    pthread_mutex_unlock(&m->mu);

    td_done done = TD_DONE_INIT;
    struct epoll_event evs[MAX_EVENTS];
    /* Busy-poll only for small messages, whose answer comes within microseconds; a large one takes
     * longer to arrive than the spin would last, and spinning would only steal the core from the
     * rank that is sending it. */
    int64_t spin_end = x->total <= SPIN_MAX_BYTES ? clock_now_ns() + t->spin_ns : 0;
    while (!xfer_done(x)) {
        int64_t now = clock_now_ns();
        if (now >= dl) {
            pthread_mutex_lock(&m->mu);
            if (!xfer_done(x))
                match_timeout(m, x, &done);
            pthread_mutex_unlock(&m->mu);
            match_run_callbacks(&done);
            break;
        }
        bool spinning = now < spin_end;
        int n = epoll_wait(t->inner_ep, evs, MAX_EVENTS, spinning ? 0 : deadline_poll_ms(dl));
        if (n == 0 && spinning)
            sched_yield(); /* with more ranks than cores, the sender may be waiting for this core */
        if (n > 0) {
            pthread_mutex_lock(&m->mu);
            handle_events(t, evs, n, &done);
            pthread_mutex_unlock(&m->mu);
            match_run_callbacks(&done);
        }
    }

    pthread_mutex_lock(&m->mu);
    m->poller_busy = false;
    if (!t->armed && !m->stop)
        set_armed(t, true);
    pthread_mutex_unlock(&m->mu);
    return xfer_result(x);
}

static void tcp_abort(td_transport *base, td_status status, const char *message)
{
    match_abort(&((tcp_transport *)base)->match, status, message);
}

/* ---- an orderly close --------------------------------------------------------------------------
 * A destroy owes each live peer its goodbye, behind every message it sent: a send completes once
 * the socket took it, so those messages may still fill the socket while the peer, alive and still
 * receiving them, is slow to read (descheduled on a busy host). A goodbye dropped then would make
 * the peer take the end of the stream for a crash and abort, failing receives whose messages had
 * all arrived. So the destroy waits for room, up to BYE_WAIT_S for a peer that reads nothing; it
 * drains (and drops) what comes in meanwhile, so that two ranks closing at once never wait on each
 * other. A peer whose stream ends or fails is closing too or gone, and needs nothing more. This
 * runs after the I/O thread stopped: nothing else touches the sockets. */

/* Writes what the socket takes of p->owed now; true while some of it is left. */
static bool owed_write(peer *p)
{
    while (p->owed_off < p->owed.len) {
        ssize_t n = send(p->fd, p->owed.data + p->owed_off, p->owed.len - p->owed_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p->owed_off += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return true;
        } else {
            p->owed_off = p->owed.len; /* the peer is gone */
            return false;
        }
    }
    return false;
}

static void owed_drain(peer *p)
{
    char sink[4096];
    for (;;) {
        ssize_t n = recv(p->fd, sink, sizeof sink, MSG_DONTWAIT);
        if (n > 0 || (n < 0 && errno == EINTR))
            continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            p->owed_off = p->owed.len; /* its end of stream (its own goodbye or abort) or a reset */
        return;
    }
}

static void say_goodbye(tcp_transport *t)
{
    int n = t->base.size, me = t->base.rank;
    uint8_t bye[TD_TCP_CTRL_FRAME_MAX];
    size_t bye_len = tcp_control_encode(bye, TD_TCP_CTRL_BYE, TD_OK, NULL);
    for (int r = 0; r < n; r++) {
        peer *p = &t->peers[r];
        if (r != me && !p->closed && !p->broken && !p->bye)
            buf_append(&p->owed, bye, bye_len);
    }
    struct pollfd *pf = TD_NEW_ARRAY(struct pollfd, (size_t)n);
    int *who = TD_NEW_ARRAY(int, (size_t)n);
    int64_t deadline = clock_now_ns() + BYE_WAIT_S * 1000000000LL;
    for (;;) {
        int k = 0;
        for (int r = 0; r < n; r++) {
            if (r != me && owed_write(&t->peers[r])) {
                pf[k] = (struct pollfd){.fd = t->peers[r].fd, .events = POLLIN | POLLOUT};
                who[k++] = r;
            }
        }
        if (k == 0)
            break;
        if (deadline_passed(deadline)) {
            for (int i = 0; i < k; i++)
                TD_LOG_WARN("tcp transport of rank %d: rank %d read nothing for %d s, so this rank closes "
                            "without its goodbye (rank %d will report the connection lost)",
                            match_grank(&t->match, me), match_grank(&t->match, who[i]), BYE_WAIT_S,
                            match_grank(&t->match, who[i]));
            break;
        }
        if (poll(pf, (nfds_t)k, deadline_poll_ms(deadline)) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < k; i++)
            if (pf[i].revents & (POLLIN | POLLHUP | POLLERR))
                owed_drain(&t->peers[who[i]]);
    }
    free(pf);
    free(who);
    for (int r = 0; r < n; r++)
        if (r != me && !t->peers[r].closed)
            shutdown(t->peers[r].fd, SHUT_WR);
}

static void free_transport(tcp_transport *t)
{
    for (int r = 0; t->peers && r < t->base.size; r++) {
        peer *p = &t->peers[r];
        if (p->fd >= 0) {
            /* Unread bytes would turn the close into a reset, which the peer could see before the
             * goodbye: drain what is there. */
            char sink[4096];
            while (!p->closed && recv(p->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
            }
            close(p->fd);
        }
        free(p->stage);
        buf_free(&p->owed);
    }
    for (ctrl_msg *c = t->all_ctrl; c;) {
        ctrl_msg *next = c->all_next;
        free(c);
        c = next;
    }
    if (t->inner_ep >= 0)
        close(t->inner_ep);
    if (t->outer_ep >= 0)
        close(t->outer_ep);
    if (t->efd_io >= 0)
        close(t->efd_io);
    if (t->efd_poll >= 0)
        close(t->efd_poll);
    match_free(&t->match);
    free(t->peers);
    free(t);
}

static void tcp_destroy(td_transport *base)
{
    tcp_transport *t = (tcp_transport *)base;
    tcp_abort(base, TD_ERR_CLOSED, "The process group was destroyed");
    TD_LOG_DEBUG("tcp transport of rank %d: received %llu bytes straight into posted buffers, %llu by "
                 "single copy from the sender's memory, %llu through the staging buffer, %llu into %llu "
                 "unexpected-message buffers (%llu copied out)",
                 match_grank(&t->match, t->base.rank), (unsigned long long)t->n_direct, (unsigned long long)t->n_cma,
                 (unsigned long long)t->n_staged, (unsigned long long)t->n_unexpected,
                 (unsigned long long)t->match.n_unexpected_msgs, (unsigned long long)t->match.n_copied_out);
    if (t->io_started)
        thread_join(t->io_thread);
    if (t->match.abort_status == TD_ERR_CLOSED)
        say_goodbye(t);
    free_transport(t);
}

bool tcp_transport_peer_is_local(td_transport *base, int r)
{
    tcp_transport *t = (tcp_transport *)base;
    if (r < 0 || r >= base->size || r == base->rank || t->peers[r].fd < 0)
        return false;
    int domain = 0;
    socklen_t len = sizeof domain;
    return getsockopt(t->peers[r].fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_UNIX;
}

static const td_transport_ops tcp_ops = {
    .name = "tcp",
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .wait = tcp_wait,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};

/* ---- creation --------------------------------------------------------------------------------- */

td_status tcp_transport_from_fds(int rank, int size, const int *fds, const int *global_ranks,
                                    td_transport **out)
{
    return tcp_transport_from_fds_ex(rank, size, fds, global_ranks, NULL, out);
}

td_status tcp_transport_from_fds_ex(int rank, int size, const int *fds, const int *global_ranks,
                                       const td_tcp_peer_info *info, td_transport **out)
{
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size) {
        for (int r = 0; r < size; r++)
            if (r != rank && fds[r] >= 0)
                close(fds[r]);
        return error_fmt(TD_ERR_INVALID, "invalid rank %d for a group of %d", rank, size);
    }
    tcp_transport *t = TD_NEW(tcp_transport);
    t->base.ops = &tcp_ops;
    t->base.rank = rank;
    t->base.size = size;
    match_init(&t->match, "tcp", rank, size, global_ranks, POOL_MIN_CLASS, sizeof(td_tcp_control));
    t->match.abort_locked = abort_locked;
    t->match.take_own = take_rts;
    t->inner_ep = t->outer_ep = t->efd_io = t->efd_poll = -1;
    t->peers = TD_NEW_ARRAY(peer, (size_t)size);
    for (int r = 0; r < size; r++) {
        t->peers[r].queues = &t->match.peers[r];
        t->peers[r].fd = r == rank ? -1 : fds[r];
        if (info && r != rank) {
            t->peers[r].pid = info[r].pid;
            t->peers[r].cma_send = info[r].cma_send;
            t->peers[r].cma_recv = info[r].cma_recv;
        }
    }
    if (getrandom(&t->guard_value, sizeof t->guard_value, 0) != sizeof t->guard_value || !t->guard_value)
        t->guard_value = (uint64_t)clock_now_ns() | 1;
    atomic_store(&t->guard, t->guard_value);
    int64_t spin_us = 50;
    td_status s = env_get_int("TDIST_TCP_SPIN_US", 50, 0, 1000000, &spin_us);
    if (s != TD_OK)
        goto fail;
    t->spin_ns = spin_us * 1000;

    t->inner_ep = epoll_create1(EPOLL_CLOEXEC);
    t->outer_ep = epoll_create1(EPOLL_CLOEXEC);
    t->efd_io = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    t->efd_poll = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->inner_ep < 0 || t->outer_ep < 0 || t->efd_io < 0 || t->efd_poll < 0) {
        s = error_errno(TD_ERR_IO, "creating the tcp transport's poll set");
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)size};
    if (epoll_ctl(t->inner_ep, EPOLL_CTL_ADD, t->efd_poll, &ev) != 0)
        goto fail_ctl;
    for (int r = 0; r < size; r++) {
        if (r == rank)
            continue;
        peer *p = &t->peers[r];
        if (p->fd < 0) {
            s = error_fmt(TD_ERR_INVALID, "no socket for rank %d", r);
            goto fail;
        }
        int fl = fcntl(p->fd, F_GETFL);
        if (fl < 0 || fcntl(p->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            s = error_errno(TD_ERR_IO, "making the socket to rank %d non-blocking", r);
            goto fail;
        }
        p->stage = alloc_or_die(STAGE_SIZE);
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u32 = (uint32_t)r;
        if (epoll_ctl(t->inner_ep, EPOLL_CTL_ADD, p->fd, &ev) != 0)
            goto fail_ctl;
    }
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.u32 = 0;
    if (epoll_ctl(t->outer_ep, EPOLL_CTL_ADD, t->inner_ep, &ev) != 0)
        goto fail_ctl;
    t->armed = true;
    ev.events = EPOLLIN;
    ev.data.u32 = 1;
    if (epoll_ctl(t->outer_ep, EPOLL_CTL_ADD, t->efd_io, &ev) != 0)
        goto fail_ctl;
    s = thread_start(&t->io_thread, "td-tcp-io", io_main, t);
    if (s != TD_OK)
        goto fail;
    t->io_started = true;
    *out = &t->base;
    return TD_OK;
fail_ctl:
    s = error_errno(TD_ERR_IO, "setting up the tcp transport's poll set");
fail:
    t->match.aborted = true;
    free_transport(t);
    return s;
}
