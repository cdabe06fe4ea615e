/* The tcp transport's progress engine: tagged messages over one non-blocking TCP socket per peer.
 *
 * Each message is a 16-byte header (tag, length; docs/protocols.md "tcp transport") and its payload.
 * Sends are written by the posting thread straight from the caller's memory (sendmsg over the
 * xfer's iovec, header included); what the socket does not take at once is queued and finished on
 * EPOLLOUT. Receives are matched per (peer, tag) in posting order when the header arrives: if a
 * receive is posted, the payload is read straight into its iovec (readv, with a small staging
 * buffer appended so that one call also picks up the next headers and small payloads); if not, it
 * goes into an unexpected-message buffer from a size-class pool (allocated only while warming up)
 * and is copied out when the receive is posted.
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
 * only what involves that peer. Deadlines are enforced by the poller for its own xfer and by the I/O
 * thread (which sleeps until the earliest pending deadline) for everything else. */
#include "transport/tcp.h"
#include "transport/tcp_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#define POOL_CLASSES 48
#define POOL_KEEP_BYTES ((size_t)256 << 20)
#define SPIN_MAX_BYTES (64 * 1024)
#define CTRL_MAX TD_TCP_CTRL_MAX
#define UNEXP_STEP ((size_t)1 << 20)
#define CMA_MIN ((size_t)64 << 10) /* smaller collective messages go inline */
#define FRAME_BUFS 12

/* Flags in a send xfer's kind: the message goes as an RTS (the peer reads it from this process's
 * memory), or the xfer is the transport's own control frame (a FIN). */
enum { XK_RTS = 0x10, XK_CTRL = 0x20 };

enum { R_HDR = 0, R_PAYLOAD = 1 };

/* An unexpected message: arrived (or arriving) before its receive was posted. */
typedef struct unexp {
    struct unexp *next;
    uint64_t tag;
    uint64_t arrival;
    size_t len;
    size_t got;
    char *buf;
    size_t cap; /* grows with what arrived, never ahead of it by more than UNEXP_STEP */
    /* an RTS: the message waits in the sender's memory */
    bool rts;
    td_tcp_control rts_desc;
} unexp;

/* A control frame of the transport's own (a FIN), queued on a send stream like a message. */
typedef struct ctrl_msg {
    td_xfer x;
    uint8_t payload[TD_TCP_RTS_MAX];
    struct ctrl_msg *next_free;
    struct ctrl_msg *all_next;
} ctrl_msg;

typedef struct peer {
    int fd;
    int rank;
    bool bye;        /* the peer sent its goodbye: no more messages from it */
    bool closed;     /* no more I/O on this socket (removed from the poll set) */
    bool broken;     /* a send was abandoned mid-message: the stream cannot carry more frames */
    bool out_armed;  /* EPOLLOUT requested */
    /* same-host single-copy transfers (process_vm_readv), agreed in the handshake */
    pid_t pid;
    bool cma_send;   /* the peer can read this process's memory: large collective sends go as RTS */
    bool cma_recv;   /* this process can read the peer's */
    /* sending */
    td_xfer *sq_head, *sq_tail;
    td_xfer *await_head, *await_tail; /* RTS sent, waiting for the peer's FIN */
    /* receiving */
    int rstate;
    size_t remaining;
    uint64_t rtag;
    size_t rlen;
    td_xfer *rx;     /* payload target: a posted receive ... */
    unexp *ru;       /* ... or an unexpected buffer; neither: discard (or a control frame) */
    bool in_control; /* the payload being read is a control frame's, into ctrl */
    size_t ctrl_got;
    uint8_t ctrl[CTRL_MAX];
    char *stage;
    size_t stage_off, stage_len;
    td_xfer *posted_head, *posted_tail;
    unexp *uq_head, *uq_tail;
} peer;

typedef struct pool_buf {
    struct pool_buf *next;
} pool_buf;

typedef struct tcp_transport {
    td_transport base;
    pthread_mutex_t mu;
    peer *peers;
    int *global_ranks;
    int inner_ep, outer_ep, efd_io, efd_poll;
    bool armed;       /* the inner set is armed in the outer one */
    bool poller_busy; /* a waiting thread is polling */
    bool aborted;
    bool stop;
    td_status abort_status;
    char abort_msg[TD_XFER_ERROR_MAX];
    pthread_t io_thread;
    bool io_started;
    td_xfer *any_head, *any_tail;
    uint64_t order;
    uint64_t arrival;
    int64_t spin_ns;
    /* pools: unexpected nodes and payload buffers by power-of-two class */
    unexp *free_unexp;
    pool_buf *pool[POOL_CLASSES];
    size_t pool_bytes;
    ctrl_msg *free_ctrl, *all_ctrl;
    uint64_t next_cookie;
    /* Holds guard_value while the transport lives and is not aborted. Every RTS names it, and a
     * reader checks it after copying: an abort clears it before failing the sends, so a reader
     * never takes bytes that the sender's caller may already have reused. */
    _Atomic uint64_t guard;
    uint64_t guard_value;
    /* counters, logged at destroy (TDIST_LOG_LEVEL=DEBUG): where received payload bytes went */
    uint64_t n_direct, n_staged, n_unexpected, n_unexpected_msgs, n_copied_out, n_cma;
} tcp_transport;

/* Xfers with callbacks completed under the lock; their callbacks run after it is released. */
typedef struct done_list {
    td_xfer *head, *tail;
    int completed; /* every completion, with or without a callback */
} done_list;

static const td_transport_ops tcp_ops;

/* ---- small helpers ---------------------------------------------------------------------------- */

static int grank(const tcp_transport *t, int r) { return t->global_ranks ? t->global_ranks[r] : r; }

static void complete(td_xfer *x, td_status status, const char *msg, done_list *done)
{
    done->completed++;
    if (x->on_done) {
        x->status = status;
        if (status != TD_OK)
            snprintf(x->error, sizeof x->error, "%s", msg ? msg : td_status_str(status));
        atomic_store_explicit(&x->state, 1, memory_order_release);
        x->next = NULL;
        if (done->tail)
            done->tail->next = x;
        else
            done->head = x;
        done->tail = x;
    } else {
        td_xfer_finish(x, status, msg);
    }
}

static void completef(td_xfer *x, td_status status, done_list *done, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void completef(td_xfer *x, td_status status, done_list *done, const char *fmt, ...)
{
    char msg[TD_XFER_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    complete(x, status, msg, done);
}

static void run_callbacks(done_list *done)
{
    td_xfer *x = done->head;
    while (x) {
        td_xfer *next = x->next; /* the callback may recycle x */
        x->on_done(x, x->arg);
        x = next;
    }
    done->head = done->tail = NULL;
    done->completed = 0;
}

static void queue_push(td_xfer **head, td_xfer **tail, td_xfer *x)
{
    x->next = NULL;
    if (*tail)
        (*tail)->next = x;
    else
        *head = x;
    *tail = x;
}

/* Removes x (which must be in the list) given its predecessor. */
static void queue_unlink(td_xfer **head, td_xfer **tail, td_xfer *prev, td_xfer *x)
{
    if (prev)
        prev->next = x->next;
    else
        *head = x->next;
    if (*tail == x)
        *tail = prev;
    x->next = NULL;
}

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

/* ---- buffer pool ------------------------------------------------------------------------------ */

static int pool_class(size_t len)
{
    int c = 6; /* 64 bytes and up */
    while (c < POOL_CLASSES - 1 && ((size_t)1 << c) < len)
        c++;
    return c;
}

static char *pool_get(tcp_transport *t, size_t len)
{
    if (len == 0)
        return NULL;
    int c = pool_class(len);
    size_t size = (size_t)1 << c;
    if (size < len)
        size = len;
    if (t->pool[c] && size == ((size_t)1 << c)) {
        pool_buf *b = t->pool[c];
        t->pool[c] = b->next;
        t->pool_bytes -= size;
        return (char *)b;
    }
    void *p = NULL;
    if (td_try_malloc(size, "unexpected message buffer", &p) != TD_OK)
        return NULL;
    return p;
}

static void pool_put(tcp_transport *t, char *buf, size_t len)
{
    if (!buf)
        return;
    int c = pool_class(len);
    size_t size = (size_t)1 << c;
    if (size < len || t->pool_bytes + size > POOL_KEEP_BYTES) {
        free(buf);
        return;
    }
    pool_buf *b = (pool_buf *)buf;
    b->next = t->pool[c];
    t->pool[c] = b;
    t->pool_bytes += size;
}

static unexp *unexp_new(tcp_transport *t)
{
    unexp *u = t->free_unexp;
    if (u)
        t->free_unexp = u->next;
    else
        u = td_malloc(sizeof *u);
    memset(u, 0, sizeof *u);
    return u;
}

static void unexp_free(tcp_transport *t, unexp *u)
{
    pool_put(t, u->buf, u->cap);
    u->buf = NULL;
    u->cap = 0;
    u->next = t->free_unexp;
    t->free_unexp = u;
}

static void unexp_unlink(peer *p, unexp *prev, unexp *u)
{
    if (prev)
        prev->next = u->next;
    else
        p->uq_head = u->next;
    if (p->uq_tail == u)
        p->uq_tail = prev;
    u->next = NULL;
}

/* Room for the next bytes of an unexpected message. Its buffer follows the bytes that arrived,
 * doubling, so a header that claims a huge length costs nothing until the bytes come. */
static bool unexp_room(tcp_transport *t, unexp *u)
{
    if (u->got < u->cap)
        return true;
    size_t want = u->cap ? u->cap * 2 : UNEXP_STEP;
    if (want > u->len)
        want = u->len;
    char *nb = pool_get(t, want);
    if (!nb)
        return false;
    if (u->got)
        memcpy(nb, u->buf, u->got);
    pool_put(t, u->buf, u->cap);
    u->buf = nb;
    u->cap = want;
    return true;
}

/* ---- iovec copies ----------------------------------------------------------------------------- */

/* Copies n bytes into x's iovec at x->progress. */
static void xfer_copy_in(td_xfer *x, const char *src, size_t n)
{
    size_t off = x->progress;
    x->progress += n;
    for (int i = 0; i < x->iovcnt && n; i++) {
        size_t len = x->iov[i].iov_len;
        if (off >= len) {
            off -= len;
            continue;
        }
        size_t take = len - off < n ? len - off : n;
        memcpy((char *)x->iov[i].iov_base + off, src, take);
        src += take;
        n -= take;
        off = 0;
    }
}

/* The part of x's iovec from x->progress on, at most `limit` bytes, appended to iov. */
static int xfer_iov_from(const td_xfer *x, size_t skip, size_t limit, struct iovec *iov, int max)
{
    int cnt = 0;
    for (int i = 0; i < x->iovcnt && cnt < max && limit; i++) {
        size_t len = x->iov[i].iov_len;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        size_t take = len - skip < limit ? len - skip : limit;
        iov[cnt].iov_base = (char *)x->iov[i].iov_base + skip;
        iov[cnt].iov_len = take;
        cnt++;
        limit -= take;
        skip = 0;
    }
    return cnt;
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

/* Fails (or, for the transport's own frames, recycles) every xfer of a list. */
static void fail_list(tcp_transport *t, td_xfer **head, td_xfer **tail, td_status status, const char *msg,
                      done_list *done)
{
    td_xfer *x = *head;
    *head = *tail = NULL;
    while (x) {
        td_xfer *next = x->next;
        if (x->kind & XK_CTRL)
            ctrl_put(t, x);
        else
            complete(x, status, msg, done);
        x = next;
    }
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
    if (p->closed || p->broken || p->bye || p->sq_head)
        return;
    uint8_t f[TD_TCP_CTRL_FRAME_MAX];
    size_t len = td_tcp_control_encode(f, type, status, msg);
    ssize_t n = send(p->fd, f, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n != (ssize_t)len)
        p->broken = true;
}

static void abort_locked(tcp_transport *t, td_status status, const char *msg, done_list *done)
{
    if (t->aborted)
        return;
    t->aborted = true;
    atomic_store(&t->guard, 0);
    t->abort_status = status;
    snprintf(t->abort_msg, sizeof t->abort_msg, "%s", msg);
    TD_LOG_DEBUG("tcp transport of rank %d aborted: %s", grank(t, t->base.rank), msg);
    for (int r = 0; r < t->base.size; r++) {
        peer *p = &t->peers[r];
        if (r == t->base.rank)
            continue;
        if (p->sq_head && p->sq_head->progress > 0)
            p->broken = true;
        fail_list(t, &p->sq_head, &p->sq_tail, status, msg, done);
        fail_list(t, &p->await_head, &p->await_tail, status, msg, done);
        fail_list(t, &p->posted_head, &p->posted_tail, status, msg, done);
        if (p->rx) {
            complete(p->rx, status, msg, done);
            p->rx = NULL;
        }
        /* A failure (not an orderly close) is passed on: the peers learn of it at once instead of
         * at their timeouts, and with its cause, so that every survivor of a dead rank names that
         * rank and not the one that told it. A stream that cannot carry the frame is just cut. */
        if (status != TD_ERR_CLOSED && p->fd >= 0 && !p->closed) {
            send_control(p, TD_TCP_CTRL_ABORT, status, msg);
            shutdown(p->fd, p->broken ? SHUT_RDWR : SHUT_WR);
        }
    }
    fail_list(t, &t->any_head, &t->any_tail, status, msg, done);
    t->stop = true;
    wake_fd(t->efd_io);
    wake_fd(t->efd_poll);
}

static void abortf_locked(tcp_transport *t, td_status status, done_list *done, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void abortf_locked(tcp_transport *t, td_status status, done_list *done, const char *fmt, ...)
{
    char msg[TD_XFER_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    abort_locked(t, status, msg, done);
}

static void closed_msg(tcp_transport *t, peer *p, char *buf, size_t size)
{
    snprintf(buf, size, "Connection to rank %d lost: rank %d closed its end (it destroyed its process group)",
             grank(t, p->rank), grank(t, p->rank));
}

/* The peer said goodbye: fail what can only complete through it; the rest of the group goes on. */
static void peer_said_bye(tcp_transport *t, peer *p, done_list *done)
{
    char msg[TD_XFER_ERROR_MAX];
    closed_msg(t, p, msg, sizeof msg);
    p->bye = true;
    fail_list(t, &p->sq_head, &p->sq_tail, TD_ERR_PEER_LOST, msg, done);
    fail_list(t, &p->await_head, &p->await_tail, TD_ERR_PEER_LOST, msg, done);
    fail_list(t, &p->posted_head, &p->posted_tail, TD_ERR_PEER_LOST, msg, done);
}

static void peer_close(tcp_transport *t, peer *p)
{
    if (p->closed)
        return;
    p->closed = true;
    epoll_ctl(t->inner_ep, EPOLL_CTL_DEL, p->fd, NULL);
}

/* The stream broke (or carried garbage): abort, unless the peer had said goodbye before EOF. */
static void peer_lost(tcp_transport *t, peer *p, done_list *done, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void peer_lost(tcp_transport *t, peer *p, done_list *done, const char *fmt, ...)
{
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    peer_close(t, p);
    if (t->aborted)
        return;
    int g = grank(t, p->rank);
    if (g != p->rank)
        abortf_locked(t, TD_ERR_PEER_LOST, done, "Connection to rank %d (group rank %d) lost: %s", g, p->rank, why);
    else
        abortf_locked(t, TD_ERR_PEER_LOST, done, "Connection to rank %d lost: %s", g, why);
}

/* ---- sending ---------------------------------------------------------------------------------- */

static void set_out(tcp_transport *t, peer *p, bool on)
{
    if (p->out_armed == on || p->closed)
        return;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0), .data.u32 = (uint32_t)p->rank};
    epoll_ctl(t->inner_ep, EPOLL_CTL_MOD, p->fd, &ev);
    p->out_armed = on;
}

static bool is_rts(const td_xfer *x) { return (x->kind & XK_RTS) != 0; }

/* Bytes x occupies on the wire: header and payload, or header and RTS descriptor. */
static size_t wire_len(const td_xfer *x)
{
    return HDR_SIZE + (is_rts(x) ? TD_TCP_RTS_FIXED + 16 * (size_t)x->iovcnt : x->total);
}

/* The frame's first bytes (header; for an RTS also its descriptor) into f; returns their count. */
static size_t frame_prefix(const tcp_transport *t, const td_xfer *x, uint8_t *f)
{
    if (!is_rts(x)) {
        td_tcp_header_encode(f, x->tag, x->total);
        return HDR_SIZE;
    }
    uint64_t addr[TD_XFER_MAX_IOV], len[TD_XFER_MAX_IOV];
    for (int i = 0; i < x->iovcnt; i++) {
        addr[i] = (uint64_t)(uintptr_t)x->iov[i].iov_base;
        len[i] = x->iov[i].iov_len;
    }
    size_t n = td_tcp_rts_encode(f + HDR_SIZE, x->tag, x->order, (uint64_t)(uintptr_t)&t->guard, t->guard_value,
                                 addr, len, x->iovcnt);
    td_tcp_header_encode(f, TD_TAG_RESERVED, n);
    return HDR_SIZE + n;
}

/* Writes as much of p's send queue as the socket takes, several messages per call. A message that
 * went out whole completes, except an RTS, which waits for the peer's FIN. */
static void flush_sends(tcp_transport *t, peer *p, done_list *done)
{
    uint8_t frames[FRAME_BUFS][HDR_SIZE + TD_TCP_RTS_MAX];
    while (p->sq_head && !t->aborted) {
        struct iovec iov[SEND_IOV_MAX];
        int cnt = 0, nf = 0;
        size_t want = 0;
        for (td_xfer *x = p->sq_head; x && nf < FRAME_BUFS && cnt + 1 + TD_XFER_MAX_IOV <= SEND_IOV_MAX;
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
            peer_lost(t, p, done, "sending failed: %s", strerror(errno));
            return;
        }
        size_t left = (size_t)n;
        while (p->sq_head) {
            td_xfer *x = p->sq_head;
            size_t need = wire_len(x) - x->progress;
            if (left < need) {
                x->progress += left;
                break;
            }
            left -= need;
            x->progress = wire_len(x);
            p->sq_head = x->next;
            if (!p->sq_head)
                p->sq_tail = NULL;
            if (x->kind & XK_CTRL) {
                ctrl_put(t, x);
            } else if (is_rts(x)) {
                queue_push(&p->await_head, &p->await_tail, x);
            } else {
                x->nbytes = x->total;
                complete(x, TD_OK, NULL, done);
            }
        }
        if ((size_t)n < want) {
            set_out(t, p, true);
            return;
        }
    }
    set_out(t, p, false);
}

/* Queues one of the transport's own control frames (payload of len bytes) behind p's sends. */
static void queue_control(tcp_transport *t, peer *p, const uint8_t *payload, size_t len, done_list *done)
{
    if (p->closed || p->broken || p->bye)
        return;
    ctrl_msg *c = ctrl_get(t);
    memcpy(c->payload, payload, len);
    memset(&c->x, 0, sizeof c->x);
    c->x.kind = XK_CTRL;
    c->x.tag = TD_TAG_RESERVED;
    c->x.deadline_ns = TD_DEADLINE_NONE;
    c->x.iov[0].iov_base = c->payload;
    c->x.iov[0].iov_len = len;
    c->x.iovcnt = 1;
    c->x.total = len;
    bool idle = p->sq_head == NULL;
    queue_push(&p->sq_head, &p->sq_tail, &c->x);
    if (idle)
        flush_sends(t, p, done);
}

/* ---- receiving -------------------------------------------------------------------------------- */

/* The posted receive that a message (p, tag) goes to: the earliest-posted of p's matching receive
 * and the matching any-source receive. Unlinks it. */
static td_xfer *match_posted(tcp_transport *t, peer *p, uint64_t tag)
{
    td_xfer *prev = NULL, *x = p->posted_head;
    while (x && x->tag != tag) {
        prev = x;
        x = x->next;
    }
    td_xfer *aprev = NULL, *a = t->any_head;
    while (a && a->tag != tag) {
        aprev = a;
        a = a->next;
    }
    if (a && (!x || a->order < x->order)) {
        queue_unlink(&t->any_head, &t->any_tail, aprev, a);
        return a;
    }
    if (x)
        queue_unlink(&p->posted_head, &p->posted_tail, prev, x);
    return x;
}

static void fail_mismatch(tcp_transport *t, td_xfer *x, peer *p, uint64_t tag, size_t len, done_list *done)
{
    completef(x, TD_ERR_INVALID, done,
              "Message size mismatch: rank %d sent %zu bytes (tag %llu) to a receive of %zu bytes; the sizes "
              "must match",
              grank(t, p->rank), len, (unsigned long long)tag, x->total);
}

/* ---- single-copy transfers between processes of one host ---------------------------------------
 * A large collective message to a same-host peer goes as an RTS that names its pieces in the
 * sender's memory; the receiver copies them straight into its posted buffer with process_vm_readv
 * (one copy, no socket buffers) and answers with a FIN, which completes the send. Both sides agreed
 * in the handshake after checking that the copy works (tcp_connect.c). */

/* Copies the message described by (addr, len) in process pid into x's buffers. */
static int cma_copy(pid_t pid, td_xfer *x, const uint64_t *addr, const uint64_t *len, int n)
{
    size_t total = x->total, done_bytes = 0;
    while (done_bytes < total) {
        struct iovec l[TD_XFER_MAX_IOV], r[TD_TCP_RTS_MAX_IOV];
        int lc = xfer_iov_from(x, done_bytes, total - done_bytes, l, TD_XFER_MAX_IOV);
        int rc = 0;
        size_t skip = done_bytes;
        for (int i = 0; i < n; i++) {
            if (skip >= len[i]) {
                skip -= len[i];
                continue;
            }
            r[rc].iov_base = (void *)(uintptr_t)(addr[i] + skip);
            r[rc].iov_len = len[i] - skip;
            rc++;
            skip = 0;
        }
        ssize_t got = process_vm_readv(pid, l, (unsigned long)lc, r, (unsigned long)rc, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return got < 0 ? errno : EFAULT;
        done_bytes += (size_t)got;
    }
    return 0;
}

/* A matched RTS: copy, complete the receive, and tell the sender it may reuse its buffer. */
/* Whether the sender's guard word still holds its value (it had not aborted when we finished). */
static bool guard_holds(pid_t pid, uint64_t addr, uint64_t value)
{
    uint64_t got = 0;
    struct iovec l = {&got, sizeof got}, r = {(void *)(uintptr_t)addr, sizeof got};
    return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof got && got == value;
}

static void rts_deliver(tcp_transport *t, peer *p, td_xfer *x, const td_tcp_control *c, done_list *done)
{
    x->peer = p->rank;
    td_status fin = TD_OK;
    if (x->total != c->total) {
        fail_mismatch(t, x, p, c->tag, (size_t)c->total, done);
    } else {
        int err = cma_copy(p->pid, x, c->addr, c->len, c->iovcnt);
        if (!err && !guard_holds(p->pid, c->guard_addr, c->guard_value)) {
            /* The sender aborted meanwhile: what was read may not be the message. Its abort frame
             * is on the way; the receive fails now. */
            completef(x, TD_ERR_PEER_LOST, done, "Connection to rank %d lost: it failed while its message was read",
                      grank(t, p->rank));
            return;
        }
        if (err == ESRCH) {
            /* The sender is gone: the same loss its socket will show, reported at once. */
            peer_lost(t, p, done, "the process exited (reading its message failed: %s)", strerror(err));
            complete(x, t->abort_status, t->abort_msg, done); /* x left the posted list already */
            return;
        }
        if (err) {
            completef(x, TD_ERR_IO, done, "Reading a message of %zu bytes from rank %d's memory failed: %s", x->total,
                      grank(t, p->rank), strerror(err));
            fin = TD_ERR_IO;
        } else {
            x->nbytes = x->total;
            t->n_cma += x->total;
            complete(x, TD_OK, NULL, done);
        }
    }
    uint8_t f[TD_TCP_RTS_MAX];
    size_t flen = td_tcp_fin_encode(f, c->cookie, fin);
    queue_control(t, p, f, flen, done);
}

static void handle_rts(tcp_transport *t, peer *p, const td_tcp_control *c, done_list *done)
{
    if (!p->cma_recv) {
        peer_lost(t, p, done, "protocol error: an RTS on a connection that did not agree to them");
        return;
    }
    td_xfer *x = match_posted(t, p, c->tag);
    if (x) {
        rts_deliver(t, p, x, c, done);
        return;
    }
    unexp *u = unexp_new(t);
    u->tag = c->tag;
    u->arrival = ++t->arrival;
    u->len = (size_t)c->total;
    u->rts = true;
    u->rts_desc = *c;
    if (p->uq_tail)
        p->uq_tail->next = u;
    else
        p->uq_head = u;
    p->uq_tail = u;
    t->n_unexpected_msgs++;
}

static void handle_fin(tcp_transport *t, peer *p, const td_tcp_control *c, done_list *done)
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
    queue_unlink(&p->await_head, &p->await_tail, prev, x);
    if (c->status == TD_OK) {
        x->nbytes = x->total;
        complete(x, TD_OK, NULL, done);
    } else {
        completef(x, c->status, done, "Rank %d could not read a message of %zu bytes from this rank's memory",
                  grank(t, p->rank), x->total);
    }
}

/* A complete control frame: the peer's goodbye, or its abort (relayed with its cause). */
static void handle_control(tcp_transport *t, peer *p, done_list *done)
{
    td_tcp_control c;
    int g = grank(t, p->rank);
    if (!td_tcp_control_parse(p->ctrl, p->ctrl_got, TD_TCP_MAX_MESSAGE, &c)) {
        peer_lost(t, p, done, "protocol error: malformed control frame (type %u, %zu bytes)", p->ctrl[0], p->ctrl_got);
    } else if (c.type == TD_TCP_CTRL_BYE) {
        peer_said_bye(t, p, done);
    } else if (c.type == TD_TCP_CTRL_RTS) {
        handle_rts(t, p, &c, done);
    } else if (c.type == TD_TCP_CTRL_FIN) {
        handle_fin(t, p, &c, done);
    } else {
        p->bye = true; /* nothing more comes from it */
        if (c.status == TD_ERR_PEER_LOST)
            abortf_locked(t, TD_ERR_PEER_LOST, done, "%.*s (reported by rank %d)", (int)c.msg_len, c.msg, g);
        else
            abortf_locked(t, TD_ERR_PEER_LOST, done, "Connection to rank %d lost: rank %d failed: %.*s", g, g,
                          (int)c.msg_len, c.msg);
    }
}

static void finish_message(tcp_transport *t, peer *p, done_list *done)
{
    if (p->in_control) {
        p->in_control = false;
        p->rstate = R_HDR;
        handle_control(t, p, done);
        return;
    }
    if (p->rx) {
        p->rx->nbytes = p->rx->total;
        complete(p->rx, TD_OK, NULL, done);
        p->rx = NULL;
    }
    p->ru = NULL; /* an unexpected message stays queued, now complete */
    p->rstate = R_HDR;
}

/* A header arrived: pick where its payload goes. False when the stream must be dropped. */
static bool start_message(tcp_transport *t, peer *p, uint64_t tag, uint64_t len, done_list *done)
{
    if (tag == TD_TAG_RESERVED) {
        if (len == 0 || len > CTRL_MAX) {
            peer_lost(t, p, done, "protocol error: control frame with a length of %llu", (unsigned long long)len);
            return false;
        }
        p->in_control = true;
        p->ctrl_got = 0;
        p->rx = NULL;
        p->ru = NULL;
        p->remaining = (size_t)len;
        p->rstate = R_PAYLOAD;
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
    p->rtag = tag;
    p->rlen = (size_t)len;
    p->remaining = (size_t)len;
    p->rx = NULL;
    p->ru = NULL;
    td_xfer *x = match_posted(t, p, tag);
    if (x) {
        x->peer = p->rank;
        if (x->total != len)
            fail_mismatch(t, x, p, tag, (size_t)len, done); /* the payload is discarded */
        else
            p->rx = x;
    } else {
        unexp *u = unexp_new(t);
        u->tag = tag;
        u->arrival = ++t->arrival;
        u->len = (size_t)len;
        if (len && !unexp_room(t, u)) {
            unexp_free(t, u);
            peer_lost(t, p, done, "cannot buffer an unexpected message of %llu bytes: %s", (unsigned long long)len,
                      td_last_error());
            return false;
        }
        if (p->uq_tail)
            p->uq_tail->next = u;
        else
            p->uq_head = u;
        p->uq_tail = u;
        p->ru = u;
        t->n_unexpected_msgs++;
    }
    if (len == 0)
        finish_message(t, p, done);
    else
        p->rstate = R_PAYLOAD;
    return true;
}

/* Feeds the staged bytes through the framing. False when the stream was dropped. */
static bool consume_stage(tcp_transport *t, peer *p, done_list *done)
{
    while (p->stage_off < p->stage_len) {
        size_t avail = p->stage_len - p->stage_off;
        const char *s = p->stage + p->stage_off;
        if (p->rstate == R_HDR) {
            if (avail < HDR_SIZE)
                break;
            uint64_t tag, len;
            td_tcp_header_decode((const uint8_t *)s, &tag, &len);
            p->stage_off += HDR_SIZE;
            if (!start_message(t, p, tag, len, done))
                return false;
            continue;
        }
        size_t take = avail < p->remaining ? avail : p->remaining;
        if (p->in_control) {
            memcpy(p->ctrl + p->ctrl_got, s, take);
            p->ctrl_got += take;
        } else if (p->rx) {
            xfer_copy_in(p->rx, s, take);
            t->n_staged += take;
        } else if (p->ru) {
            if (!unexp_room(t, p->ru)) {
                peer_lost(t, p, done, "cannot buffer an unexpected message of %zu bytes: %s", p->ru->len,
                          td_last_error());
                return false;
            }
            size_t room = p->ru->cap - p->ru->got;
            if (take > room)
                take = room;
            memcpy(p->ru->buf + p->ru->got, s, take);
            p->ru->got += take;
            t->n_unexpected += take;
        }
        p->stage_off += take;
        p->remaining -= take;
        if (p->remaining == 0) {
            finish_message(t, p, done);
            if (t->aborted || p->closed)
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

static void read_peer(tcp_transport *t, peer *p, done_list *done)
{
    for (int round = 0; round < READ_ROUNDS && !p->closed && !t->aborted; round++) {
        if (!consume_stage(t, p, done))
            return;
        struct iovec iov[TD_XFER_MAX_IOV + 1];
        int cnt = 0;
        size_t direct = 0;
        if (p->rstate == R_PAYLOAD) {
            if (p->rx) {
                cnt = xfer_iov_from(p->rx, p->rx->progress, p->remaining, iov, TD_XFER_MAX_IOV);
                direct = p->remaining;
            } else if (p->ru) {
                if (!unexp_room(t, p->ru)) {
                    peer_lost(t, p, done, "cannot buffer an unexpected message of %zu bytes: %s", p->ru->len,
                              td_last_error());
                    return;
                }
                size_t room = p->ru->cap - p->ru->got;
                iov[0].iov_base = p->ru->buf + p->ru->got;
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
            if (p->rstate == R_PAYLOAD)
                peer_lost(t, p, done, "end of stream in the middle of a message (did the process exit or crash?)");
            else
                peer_lost(t, p, done, "end of stream (did the process exit or crash?)");
            return;
        }
        size_t d = (size_t)n < direct ? (size_t)n : direct;
        if (d) {
            if (p->rx) {
                p->rx->progress += d;
                t->n_direct += d;
            } else {
                p->ru->got += d;
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

/* A posted receive takes a queued unexpected message. */
static void take_unexpected(tcp_transport *t, peer *p, unexp *prev, unexp *u, td_xfer *x, done_list *done)
{
    unexp_unlink(p, prev, u);
    x->peer = p->rank;
    if (u->rts) {
        rts_deliver(t, p, x, &u->rts_desc, done);
        unexp_free(t, u);
        return;
    }
    bool in_progress = p->ru == u;
    if (u->len != x->total) {
        fail_mismatch(t, x, p, u->tag, u->len, done);
        if (in_progress)
            p->ru = NULL; /* the rest of the payload is discarded */
    } else {
        if (u->got)
            xfer_copy_in(x, u->buf, u->got);
        t->n_copied_out += u->got;
        if (in_progress) {
            p->ru = NULL;
            p->rx = x; /* the rest arrives straight into x */
        } else {
            x->nbytes = x->total;
            complete(x, TD_OK, NULL, done);
        }
    }
    unexp_free(t, u);
}

/* ---- event handling --------------------------------------------------------------------------- */

static void handle_events(tcp_transport *t, struct epoll_event *evs, int n, done_list *done)
{
    for (int i = 0; i < n && !t->aborted; i++) {
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
        if (!t->aborted && !p->closed && (e & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && p->sq_head)
            flush_sends(t, p, done);
    }
}

static int64_t earliest_deadline(tcp_transport *t, td_xfer **which)
{
    int64_t best = TD_DEADLINE_NONE;
    *which = NULL;
#define CONSIDER(x)                         \
    do {                                    \
        if ((x)->deadline_ns < best) {      \
            best = (x)->deadline_ns;        \
            *which = (x);                   \
        }                                   \
    } while (0)
    for (int r = 0; r < t->base.size; r++) {
        peer *p = &t->peers[r];
        for (td_xfer *x = p->sq_head; x; x = x->next)
            if (!(x->kind & XK_CTRL))
                CONSIDER(x);
        for (td_xfer *x = p->await_head; x; x = x->next)
            CONSIDER(x);
        for (td_xfer *x = p->posted_head; x; x = x->next)
            CONSIDER(x);
        if (p->rx)
            CONSIDER(p->rx);
    }
    for (td_xfer *x = t->any_head; x; x = x->next)
        CONSIDER(x);
#undef CONSIDER
    return best;
}

static void timeout_locked(tcp_transport *t, td_xfer *x, done_list *done)
{
    const char *what = x->kind == TD_XFER_SEND ? "send to" : "receive from";
    if (x->peer == TD_TRANSPORT_ANY)
        abortf_locked(t, TD_ERR_TIMEOUT, done,
                      "Timed out waiting for a receive from any rank (%zu bytes, tag %llu) to complete", x->total,
                      (unsigned long long)x->tag);
    else
        abortf_locked(t, TD_ERR_TIMEOUT, done, "Timed out waiting for a %s rank %d (%zu bytes, tag %llu) to complete",
                      what, grank(t, x->peer), x->total, (unsigned long long)x->tag);
}

static void *io_main(void *arg)
{
    tcp_transport *t = arg;
    struct epoll_event evs[MAX_EVENTS];
    for (;;) {
        pthread_mutex_lock(&t->mu);
        td_xfer *which;
        int64_t dl = t->stop ? TD_DEADLINE_NONE : earliest_deadline(t, &which);
        bool stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (stop)
            break;
        struct epoll_event oev[2];
        int n = epoll_wait(t->outer_ep, oev, 2, td_deadline_poll_ms(dl));
        bool inner = false;
        for (int i = 0; i < n; i++) {
            if (oev[i].data.u32 == 1)
                drain_fd(t->efd_io);
            else
                inner = true;
        }
        done_list done = {0};
        pthread_mutex_lock(&t->mu);
        if (inner) {
            t->armed = false; /* one-shot: the event disarmed it */
            if (!t->stop) {
                int m = epoll_wait(t->inner_ep, evs, MAX_EVENTS, 0);
                if (m > 0)
                    handle_events(t, evs, m, &done);
            }
        }
        if (!t->stop) {
            dl = earliest_deadline(t, &which);
            if (which && td_deadline_passed(dl))
                timeout_locked(t, which, &done);
        }
        if (t->poller_busy && done.completed)
            wake_fd(t->efd_poll); /* it may sleep on an xfer this thread just completed */
        if (!t->poller_busy && !t->armed && !t->stop)
            set_armed(t, true);
        pthread_mutex_unlock(&t->mu);
        run_callbacks(&done);
    }
    return NULL;
}

/* ---- ops -------------------------------------------------------------------------------------- */

static td_status post_refused(tcp_transport *t, peer *p)
{
    if (t->aborted)
        return td_error_set(t->abort_status, t->abort_msg);
    char msg[TD_XFER_ERROR_MAX];
    closed_msg(t, p, msg, sizeof msg);
    return td_error_set(TD_ERR_PEER_LOST, msg);
}

static td_status tcp_isend(td_transport *base, int peer_rank, td_xfer *x)
{
    tcp_transport *t = (tcp_transport *)base;
    done_list done = {0};
    pthread_mutex_lock(&t->mu);
    peer *p = &t->peers[peer_rank];
    if (t->aborted || p->bye || p->closed || p->broken) {
        td_status s = post_refused(t, p);
        pthread_mutex_unlock(&t->mu);
        return s;
    }
    /* Collective messages (top tag bit) only: their receives are always posted, while a user's
     * send must complete even if the receive comes much later. */
    if (p->cma_send && (x->tag >> 63) && x->total >= CMA_MIN) {
        x->kind |= XK_RTS;
        x->order = ++t->next_cookie;
    }
    bool idle = p->sq_head == NULL;
    queue_push(&p->sq_head, &p->sq_tail, x);
    if (idle)
        flush_sends(t, p, &done);
    if (t->poller_busy && done.completed)
        wake_fd(t->efd_poll); /* the poller may be asleep on what this thread just completed */
    pthread_mutex_unlock(&t->mu);
    run_callbacks(&done);
    return TD_OK;
}

static td_status tcp_irecv(td_transport *base, int peer_rank, td_xfer *x)
{
    tcp_transport *t = (tcp_transport *)base;
    done_list done = {0};
    pthread_mutex_lock(&t->mu);
    if (t->aborted) {
        td_status s = td_error_set(t->abort_status, t->abort_msg);
        pthread_mutex_unlock(&t->mu);
        return s;
    }
    x->order = ++t->order;
    if (peer_rank != TD_TRANSPORT_ANY) {
        peer *p = &t->peers[peer_rank];
        unexp *prev = NULL, *u = p->uq_head;
        while (u && u->tag != x->tag) {
            prev = u;
            u = u->next;
        }
        if (u) {
            take_unexpected(t, p, prev, u, x, &done);
        } else if (p->bye || p->closed) {
            td_status s = post_refused(t, p);
            pthread_mutex_unlock(&t->mu);
            return s;
        } else {
            queue_push(&p->posted_head, &p->posted_tail, x);
        }
    } else {
        peer *bp = NULL;
        unexp *bprev = NULL, *bu = NULL;
        for (int r = 0; r < t->base.size; r++) {
            if (r == t->base.rank)
                continue;
            peer *p = &t->peers[r];
            unexp *prev = NULL, *u = p->uq_head;
            while (u && u->tag != x->tag) {
                prev = u;
                u = u->next;
            }
            if (u && (!bu || u->arrival < bu->arrival)) {
                bp = p;
                bprev = prev;
                bu = u;
            }
        }
        if (bu)
            take_unexpected(t, bp, bprev, bu, x, &done);
        else
            queue_push(&t->any_head, &t->any_tail, x);
    }
    if (t->poller_busy && done.completed)
        wake_fd(t->efd_poll); /* the poller may be asleep on what this thread just completed */
    pthread_mutex_unlock(&t->mu);
    run_callbacks(&done);
    return TD_OK;
}

static td_status xfer_result(td_xfer *x)
{
    if (x->status != TD_OK)
        return td_error_set(x->status, x->error);
    return TD_OK;
}

static td_status tcp_wait(td_transport *base, td_xfer *x, int64_t deadline_ns)
{
    tcp_transport *t = (tcp_transport *)base;
    if (td_xfer_done(x))
        return xfer_result(x);
    int64_t dl = x->deadline_ns < deadline_ns ? x->deadline_ns : deadline_ns;
    done_list done = {0};
    pthread_mutex_lock(&t->mu);
    if (t->poller_busy) {
        /* Another thread drives progress (and completes x); when it leaves, the I/O thread does. */
        pthread_mutex_unlock(&t->mu);
        if (!td_xfer_sleep(x, dl)) {
            pthread_mutex_lock(&t->mu);
            if (!td_xfer_done(x))
                timeout_locked(t, x, &done);
            pthread_mutex_unlock(&t->mu);
            run_callbacks(&done);
        }
        return xfer_result(x);
    }
    t->poller_busy = true;
    if (t->armed)
        set_armed(t, false);
    pthread_mutex_unlock(&t->mu);

    struct epoll_event evs[MAX_EVENTS];
    /* Busy-poll only for small messages, whose answer comes within microseconds; a large one takes
     * longer to arrive than the spin would last, and spinning would only steal the core from the
     * rank that is sending it. */
    int64_t spin_end = x->total <= SPIN_MAX_BYTES ? td_now_ns() + t->spin_ns : 0;
    while (!td_xfer_done(x)) {
        int64_t now = td_now_ns();
        if (now >= dl) {
            pthread_mutex_lock(&t->mu);
            if (!td_xfer_done(x))
                timeout_locked(t, x, &done);
            pthread_mutex_unlock(&t->mu);
            run_callbacks(&done);
            break;
        }
        bool spinning = now < spin_end;
        int n = epoll_wait(t->inner_ep, evs, MAX_EVENTS, spinning ? 0 : td_deadline_poll_ms(dl));
        if (n == 0 && spinning)
            sched_yield(); /* with more ranks than cores, the sender may be waiting for this core */
        if (n > 0) {
            pthread_mutex_lock(&t->mu);
            handle_events(t, evs, n, &done);
            pthread_mutex_unlock(&t->mu);
            run_callbacks(&done);
        }
    }

    pthread_mutex_lock(&t->mu);
    t->poller_busy = false;
    if (!t->armed && !t->stop)
        set_armed(t, true);
    pthread_mutex_unlock(&t->mu);
    return xfer_result(x);
}

static void tcp_abort(td_transport *base, td_status status, const char *message)
{
    tcp_transport *t = (tcp_transport *)base;
    done_list done = {0};
    pthread_mutex_lock(&t->mu);
    abort_locked(t, status, message ? message : td_status_str(status), &done);
    pthread_mutex_unlock(&t->mu);
    run_callbacks(&done);
}

/* An orderly goodbye: tells the peer that this end closes on purpose, so it fails only what
 * involves this rank. */
static void send_bye(peer *p)
{
    if (p->closed)
        return;
    send_control(p, TD_TCP_CTRL_BYE, TD_OK, NULL);
    shutdown(p->fd, SHUT_WR);
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
        for (unexp *u = p->uq_head; u;) {
            unexp *next = u->next;
            free(u->buf);
            free(u);
            u = next;
        }
        free(p->stage);
    }
    for (ctrl_msg *c = t->all_ctrl; c;) {
        ctrl_msg *next = c->all_next;
        free(c);
        c = next;
    }
    for (unexp *u = t->free_unexp; u;) {
        unexp *next = u->next;
        free(u);
        u = next;
    }
    for (int c = 0; c < POOL_CLASSES; c++) {
        for (pool_buf *b = t->pool[c]; b;) {
            pool_buf *next = b->next;
            free(b);
            b = next;
        }
    }
    if (t->inner_ep >= 0)
        close(t->inner_ep);
    if (t->outer_ep >= 0)
        close(t->outer_ep);
    if (t->efd_io >= 0)
        close(t->efd_io);
    if (t->efd_poll >= 0)
        close(t->efd_poll);
    pthread_mutex_destroy(&t->mu);
    free(t->peers);
    free(t->global_ranks);
    free(t);
}

static void tcp_destroy(td_transport *base)
{
    tcp_transport *t = (tcp_transport *)base;
    tcp_abort(base, TD_ERR_CLOSED, "The process group was destroyed");
    TD_LOG_DEBUG("tcp transport of rank %d: received %llu bytes straight into posted buffers, %llu by "
                 "single copy from the sender's memory, %llu through the staging buffer, %llu into %llu "
                 "unexpected-message buffers (%llu copied out)",
                 grank(t, t->base.rank), (unsigned long long)t->n_direct, (unsigned long long)t->n_cma,
                 (unsigned long long)t->n_staged, (unsigned long long)t->n_unexpected,
                 (unsigned long long)t->n_unexpected_msgs, (unsigned long long)t->n_copied_out);
    if (t->io_started)
        td_thread_join(t->io_thread);
    if (t->abort_status == TD_ERR_CLOSED) {
        for (int r = 0; r < t->base.size; r++)
            if (r != t->base.rank)
                send_bye(&t->peers[r]);
    }
    free_transport(t);
}

bool td_tcp_transport_peer_is_local(td_transport *base, int r)
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

td_status td_tcp_transport_from_fds(int rank, int size, const int *fds, const int *global_ranks,
                                    td_transport **out)
{
    return td_tcp_transport_from_fds_ex(rank, size, fds, global_ranks, NULL, out);
}

td_status td_tcp_transport_from_fds_ex(int rank, int size, const int *fds, const int *global_ranks,
                                       const td_tcp_peer_info *info, td_transport **out)
{
    *out = NULL;
    if (size < 1 || rank < 0 || rank >= size) {
        for (int r = 0; r < size; r++)
            if (r != rank && fds[r] >= 0)
                close(fds[r]);
        return td_error(TD_ERR_INVALID, "invalid rank %d for a group of %d", rank, size);
    }
    tcp_transport *t = TD_NEW(tcp_transport);
    t->base.ops = &tcp_ops;
    t->base.rank = rank;
    t->base.size = size;
    td_mutex_init(&t->mu);
    t->inner_ep = t->outer_ep = t->efd_io = t->efd_poll = -1;
    t->peers = TD_NEW_ARRAY(peer, (size_t)size);
    for (int r = 0; r < size; r++) {
        t->peers[r].fd = r == rank ? -1 : fds[r];
        t->peers[r].rank = r;
        if (info && r != rank) {
            t->peers[r].pid = info[r].pid;
            t->peers[r].cma_send = info[r].cma_send;
            t->peers[r].cma_recv = info[r].cma_recv;
        }
    }
    if (global_ranks) {
        t->global_ranks = TD_NEW_ARRAY(int, (size_t)size);
        memcpy(t->global_ranks, global_ranks, sizeof(int) * (size_t)size);
    }
    if (getrandom(&t->guard_value, sizeof t->guard_value, 0) != sizeof t->guard_value || !t->guard_value)
        t->guard_value = (uint64_t)td_now_ns() | 1;
    atomic_store(&t->guard, t->guard_value);
    int64_t spin_us = 50;
    td_status s = td_env_int("TDIST_TCP_SPIN_US", 50, 0, 1000000, &spin_us);
    if (s != TD_OK)
        goto fail;
    t->spin_ns = spin_us * 1000;

    t->inner_ep = epoll_create1(EPOLL_CLOEXEC);
    t->outer_ep = epoll_create1(EPOLL_CLOEXEC);
    t->efd_io = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    t->efd_poll = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->inner_ep < 0 || t->outer_ep < 0 || t->efd_io < 0 || t->efd_poll < 0) {
        s = td_error_errno(TD_ERR_IO, "creating the tcp transport's poll set");
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
            s = td_error(TD_ERR_INVALID, "no socket for rank %d", r);
            goto fail;
        }
        int fl = fcntl(p->fd, F_GETFL);
        if (fl < 0 || fcntl(p->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
            s = td_error_errno(TD_ERR_IO, "making the socket to rank %d non-blocking", r);
            goto fail;
        }
        p->stage = td_malloc(STAGE_SIZE);
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
    s = td_thread_start(&t->io_thread, "td-tcp-io", io_main, t);
    if (s != TD_OK)
        goto fail;
    t->io_started = true;
    *out = &t->base;
    return TD_OK;
fail_ctl:
    s = td_error_errno(TD_ERR_IO, "setting up the tcp transport's poll set");
fail:
    t->aborted = true;
    free_transport(t);
    return s;
}
