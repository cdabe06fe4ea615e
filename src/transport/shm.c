/* The shm transport's engine (shm.h): tagged messages through single-producer rings in shared
 * memory, doorbells on futexes (samehost.h), and peer-death detection. It owns the segments of
 * its ranks and hands them to the shared-memory collectives as a samehost_set (td_transport.samehost).
 *
 * Messages: the sender writes a 16-byte header (tag, length) and the payload, padded to 16 bytes,
 * into its ring in the receiver's segment, straight from the caller's memory and as far as the
 * ring has room; a send completes once all of it is in the ring. The receiver matches a header
 * when it reaches the front of the ring, against its posted receives (the shared matching engine,
 * match.h), and copies the payload straight into the receive's buffers. A message nobody has
 * asked for stays in the ring, to be copied once when its receive comes, unless the ring must
 * move on (the sender waits for room, or a receive waits for a later message of that peer): then
 * it goes into an unexpected-message buffer that grows with the bytes that arrive.
 *
 * Progress: all state is guarded by one mutex, never held across a wait. A thread that waits on
 * an xfer becomes the poller: it polls the rings, spinning briefly (yielding the core: four ranks
 * on two cores must not starve each other), then sleeps on its doorbell. When nobody polls and
 * operations are pending, the transport's thread (td-shm-io) registers on the doorbell and does
 * the same. Writers ring a peer's doorbell only when someone is registered there, so a blocking
 * collective's messages need no system call; a sender that finds a ring full always kicks the
 * receiver's thread, which drains the ring even when nothing is pending there.
 *
 * Failure: the watcher thread (td-shm-watch) polls each peer's socket and pidfd. A goodbye (an
 * orderly destroy) fails what involves that peer once its ring is drained; an EOF without one, or
 * the pidfd firing, aborts the transport with TD_ERR_PEER_LOST naming the rank, within
 * milliseconds; an abort frame carries another rank's failure with its cause. An abort (any status
 * but TD_ERR_CLOSED) is relayed to every peer the same way, so a failure on one rank fails the
 * others at once, and it wakes every thread asleep on this rank's doorbell, direct collectives
 * included (the set's waits end when the transport has failed). */
#include "transport/shm_impl.h"
#include "transport/match.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tdist/tensor.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"

#define HDR TD_SHM_MSG_HDR
#define POOL_MIN_CLASS 12 /* unexpected-message buffers of 4 KiB and up */
#define IO_SLICE_NS (100 * 1000000LL) /* the io thread re-checks deadlines this often */

enum { RX_IDLE = 0, RX_IN_MESSAGE = 1 };

typedef struct peer {
    td_match_peer *queues; /* its queues, and where the arriving payload goes */
    int sock;
    int pidfd;
    pid_t pid;
    td_segment seg;
    /* in the peer's segment */
    samehost_bell *bell;
    shm_ring_ctl *out_ctl; /* my ring to it */
    char *out_data;
    /* in my segment */
    shm_ring_ctl *in_ctl; /* its ring to me */
    char *in_data;
    _Atomic bool gone;     /* said goodbye: nothing more comes from it */
    bool sock_closed;
    /* sending */
    uint64_t tx_head;        /* my copy of out_ctl->head (only I write it) */
    /* receiving */
    uint64_t rx_tail;        /* my copy of in_ctl->tail (only I write it) */
    int rx_state;
    uint64_t rx_tag;
    size_t rx_len, rx_consumed, rx_wire_len; /* payload length, wire bytes consumed, wire bytes in all */
    /* the watcher's input */
    uint8_t ctrl_buf[TD_SHM_CTRL_MAX];
    size_t ctrl_got;
} peer;

typedef struct shm_transport {
    td_transport base;
    td_match match; /* its mutex guards everything */
    peer *peers;
    td_segment seg;
    td_shm_layout layout;
    shm_offsets off;
    samehost_bell *bell;
    _Atomic int aborted_flag; /* read without the lock by the set's waits */
    samehost_spin spin;
    samehost_set set; /* the segments, for the direct collectives */
    pthread_t io_thread, watch_thread;
    bool io_started, watch_started;
    int watch_efd;
    uint64_t n_direct;
} shm_transport;

static const td_transport_ops shm_ops;

/* ---- layout ------------------------------------------------------------------------------------ */

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void shm_layout_offsets(int world, const td_shm_layout *l, shm_offsets *o)
{
    o->bell = SHM_LINE;
    o->arrive = 2 * SHM_LINE;
    o->rings = 4 * SHM_LINE;
    o->ring_stride = SHM_RING_CTL_SIZE + (size_t)l->ring_bytes;
    size_t end = o->rings + (size_t)(world > 1 ? world - 1 : 0) * o->ring_stride;
    o->small = align_up(end, SHM_LINE);
    o->large = align_up(o->small + 2 * (size_t)l->small_bytes, 4096);
    o->total = align_up(o->large + 2 * (size_t)l->slot_bytes, 4096);
}

td_status shm_layout_from_env(int world, td_shm_layout *l)
{
    uint64_t v;
    const char *s;
    /* 256 KiB per ring, but about 2 MiB of rings per rank at most: large worlds get smaller rings. */
    l->ring_bytes = (uint64_t)256 << 10;
    while (world > 9 && l->ring_bytes > ((uint64_t)16 << 10) && l->ring_bytes * (uint64_t)(world - 1) > ((uint64_t)2 << 20))
        l->ring_bytes /= 2;
    l->small_bytes = (uint64_t)64 << 10;
    l->slot_bytes = (uint64_t)2 << 20; /* the largest chunk of backends/shm/direct.c */
    if ((s = env_get_str("TDIST_SHM_RING", NULL))) {
        TD_TRY(env_parse_size("TDIST_SHM_RING", s, &v));
        if (v < 4096 || v > ((uint64_t)1 << 30) || (v & (v - 1)))
            return error_fmt(TD_ERR_INVALID, "TDIST_SHM_RING must be a power of two from 4K to 1G, got '%s'", s);
        l->ring_bytes = v;
    }
    if ((s = env_get_str("TDIST_SHM_SMALL", NULL))) {
        TD_TRY(env_parse_size("TDIST_SHM_SMALL", s, &v));
        if (v < 256 || v > ((uint64_t)64 << 20))
            return error_fmt(TD_ERR_INVALID, "TDIST_SHM_SMALL must be from 256 to 64M, got '%s'", s);
        l->small_bytes = align_up(v, SHM_LINE);
    }
    if ((s = env_get_str("TDIST_SHM_SLOT", NULL))) {
        TD_TRY(env_parse_size("TDIST_SHM_SLOT", s, &v));
        if (v < 4096 || v > ((uint64_t)1 << 30))
            return error_fmt(TD_ERR_INVALID, "TDIST_SHM_SLOT must be from 4K to 1G, got '%s'", s);
        l->slot_bytes = align_up(v, 4096);
    }
    return TD_OK;
}

/* ---- helpers ----------------------------------------------------------------------------------- */

static shm_transport *of_match(td_match *m)
{
    return (shm_transport *)((char *)m - offsetof(shm_transport, match));
}

static int grank(const shm_transport *t, int r) { return match_grank(&t->match, r); }

/* Ring copies at byte position pos (mod size, a power of two), wrapping. */
static void ring_read(const char *data, uint64_t size, uint64_t pos, char *dst, size_t n,
                      td_xfer *x, size_t xoff)
{
    size_t at = (size_t)(pos & (size - 1));
    size_t first = size - at < n ? size - at : n;
    if (x) {
        xfer_copy_in(x, xoff, data + at, first);
        if (n > first)
            xfer_copy_in(x, xoff + first, data, n - first);
    } else if (dst) {
        memcpy(dst, data + at, first);
        if (n > first)
            memcpy(dst + first, data, n - first);
    }
}

static void ring_write(char *data, uint64_t size, uint64_t pos, const td_xfer *x, size_t xoff, size_t n)
{
    size_t at = (size_t)(pos & (size - 1));
    size_t first = size - at < n ? size - at : n;
    xfer_copy_out(x, xoff, data + at, first);
    if (n > first)
        xfer_copy_out(x, xoff + first, data, n - first);
}

static size_t wire_len(size_t payload) { return HDR + align_up(payload, 16); }

/* ---- failure ----------------------------------------------------------------------------------- */

static void send_control(peer *p, int type, td_status status, const char *msg)
{
    if (p->sock < 0 || p->sock_closed)
        return;
    uint8_t f[TD_SHM_CTRL_MAX];
    size_t len = shm_control_encode(f, type, status, msg);
    ssize_t n = send(p->sock, f, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n; /* best effort: the peer also sees the EOF */
}

static void abort_locked(td_match *m, td_status status, const char *msg, td_done *done)
{
    shm_transport *t = of_match(m);
    if (m->aborted)
        return;
    atomic_store_explicit(&t->aborted_flag, 1, memory_order_release); /* its readers take the lock */
    match_fail_all(m, status, msg, done);
    /* Every failure but an orderly close is passed on with its cause, so that the peers fail at
     * once, and a rank whose failure came from elsewhere (a dead rank on another host) names the
     * same culprit. */
    for (int r = 0; r < m->size && status != TD_ERR_CLOSED; r++)
        if (r != m->rank)
            send_control(&t->peers[r], TD_SHM_CTRL_ABORT, status, msg);
    samehost_bell_ring(t->bell, SAMEHOST_BELL_ALL);
}

/* ---- sending ----------------------------------------------------------------------------------- */

/* Writes as much of p's send queue into its ring as there is room for. Returns whether anything
 * moved. */
static bool flush_sends(shm_transport *t, peer *p, td_done *done)
{
    td_match_peer *q = p->queues;
    if (!q->sq_head)
        return false;
    uint64_t size = t->layout.ring_bytes;
    uint64_t tail = atomic_load_explicit(&p->out_ctl->tail, memory_order_acquire);
    uint64_t head = p->tx_head;
    bool moved = false;
    while (q->sq_head) {
        td_xfer *x = q->sq_head;
        uint64_t room = size - (head - tail);
        if (x->progress == 0) {
            if (room < HDR)
                break;
            uint8_t h[HDR];
            shm_msg_encode(h, x->tag, x->total);
            memcpy(p->out_data + (head & (size - 1)), h, HDR); /* never wraps: 16 | size */
            head += HDR;
            room -= HDR;
            x->progress = HDR;
            moved = true;
        }
        size_t wl = wire_len(x->total);
        size_t want = wl - x->progress;
        size_t n = room < want ? (size_t)room : want;
        if (n) {
            size_t done_payload = x->progress - HDR;
            size_t pay = x->total - done_payload < n ? x->total - done_payload : n;
            if (pay)
                ring_write(p->out_data, size, head, x, done_payload, pay);
            head += n; /* the padding is not written: nobody reads it */
            x->progress += n;
            moved = true;
        }
        if (x->progress < wl)
            break;
        q->sq_head = x->next;
        if (!q->sq_head)
            q->sq_tail = NULL;
        match_finish(&t->match, x, done);
    }
    if (moved) {
        p->tx_head = head;
        atomic_store_explicit(&p->out_ctl->head, head, memory_order_release);
        samehost_bell_notify(p->bell, SAMEHOST_BELL_ALL);
    }
    if (q->sq_head && atomic_exchange(&p->out_ctl->sender_blocked, 1) == 0)
        samehost_bell_ring(p->bell, SAMEHOST_BELL_IO); /* its thread drains the ring even when idle */
    return moved;
}

/* ---- receiving --------------------------------------------------------------------------------- */

/* Reads what p's ring holds: matched messages straight into their receives, and, when the ring
 * must move on (drain_all, or the sender waits for room, or a receive waits behind the front),
 * unmatched ones into unexpected buffers. Returns whether anything moved. */
static bool drain(shm_transport *t, peer *p, bool drain_all, td_done *done)
{
    td_match *m = &t->match;
    td_match_peer *q = p->queues;
    uint64_t size = t->layout.ring_bytes;
    uint64_t head = atomic_load_explicit(&p->in_ctl->head, memory_order_acquire);
    uint64_t tail = p->rx_tail;
    if (head == tail)
        return false;
    if (head - tail > size) {
        match_lost(m, q, done, "protocol error: its ring claims more bytes than it holds");
        return false;
    }
    bool moved = false;
    while (!m->aborted) {
        uint64_t avail = head - tail;
        if (avail == 0 && !(p->rx_state == RX_IN_MESSAGE && p->rx_consumed == p->rx_wire_len))
            break;
        if (p->rx_state == RX_IDLE) {
            if (avail < HDR)
                break;
            uint8_t h[HDR];
            memcpy(h, p->in_data + (tail & (size - 1)), HDR);
            uint64_t tag, len;
            if (!shm_msg_parse(h, &tag, &len)) {
                match_lost(m, q, done, "protocol error: a message longer than the largest allowed");
                return moved;
            }
            if (!match_arrived(m, q, tag, len, NULL, done)) {
                bool must = drain_all || atomic_load_explicit(&p->in_ctl->sender_blocked, memory_order_relaxed) ||
                            q->posted_head || m->any_head;
                if (!must)
                    break; /* leave it in the ring for its receive to copy once */
                if (!match_unexp_admit(m, q, len)) {
                    char why[TD_XFER_ERROR_MAX];
                    snprintf(why, sizeof why, "%s", td_last_error());
                    match_lost(m, q, done, why);
                    return moved;
                }
                q->ru = match_unexp_new(m, tag, (size_t)len, NULL);
                match_unexp_queue(m, q, q->ru);
            }
            tail += HDR;
            p->rx_state = RX_IN_MESSAGE;
            p->rx_tag = tag;
            p->rx_len = (size_t)len;
            p->rx_consumed = 0;
            p->rx_wire_len = wire_len((size_t)len) - HDR;
            moved = true;
            continue;
        }
        size_t want = p->rx_wire_len - p->rx_consumed;
        size_t n = avail < want ? (size_t)avail : want;
        size_t pay = p->rx_consumed < p->rx_len ? (p->rx_len - p->rx_consumed < n ? p->rx_len - p->rx_consumed : n) : 0;
        if (pay) {
            if (q->rx) {
                ring_read(p->in_data, size, tail, NULL, pay, q->rx, p->rx_consumed);
                t->n_direct += pay;
            } else if (q->ru) {
                if (!match_unexp_room(m, q->ru, pay)) {
                    match_abortf(m, TD_ERR_NOMEM, done, "out of memory buffering a message of %zu bytes from rank %d",
                                    q->ru->len, grank(t, q->rank));
                    return moved;
                }
                ring_read(p->in_data, size, tail, q->ru->buf + q->ru->got, pay, NULL, 0);
                q->ru->got += pay;
            }
        }
        tail += n;
        p->rx_consumed += n;
        moved = true;
        if (p->rx_consumed < p->rx_wire_len)
            break;
        p->rx_state = RX_IDLE;
        match_message_done(m, q, done);
    }
    if (tail != p->rx_tail) {
        p->rx_tail = tail;
        atomic_store_explicit(&p->in_ctl->tail, tail, memory_order_release);
        atomic_store_explicit(&p->in_ctl->sender_blocked, 0, memory_order_relaxed);
        samehost_bell_notify(p->bell, SAMEHOST_BELL_ALL); /* its sender may wait for room */
    }
    return moved;
}

/* One pass over every peer. Returns whether anything moved. */
static bool progress_locked(shm_transport *t, td_done *done)
{
    bool moved = false;
    for (int r = 0; r < t->base.size && !t->match.aborted; r++) {
        if (r == t->base.rank)
            continue;
        peer *p = &t->peers[r];
        moved |= drain(t, p, false, done);
        moved |= flush_sends(t, p, done);
    }
    return moved;
}

/* ---- goodbye and death (the watcher) ----------------------------------------------------------- */

static void peer_bye_locked(shm_transport *t, peer *p, td_done *done)
{
    if (atomic_load(&p->gone))
        return;
    /* Everything it sent before the goodbye is in its ring: take it all first. */
    drain(t, p, true, done);
    atomic_store(&p->gone, true);
    match_peer_closed(&t->match, p->queues, done);
    samehost_bell_ring(t->bell, SAMEHOST_BELL_ALL); /* direct collectives waiting for it fail */
}

/* Reads what p's socket holds. Returns false once the socket is done (EOF or error). */
static bool read_control(shm_transport *t, peer *p, td_done *done)
{
    for (;;) {
        ssize_t n = recv(p->sock, p->ctrl_buf + p->ctrl_got, sizeof p->ctrl_buf - p->ctrl_got, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return true;
        if (n <= 0) {
            if (!atomic_load(&p->gone))
                match_lost(&t->match, p->queues, done,
                              n == 0 ? "its connection closed without a goodbye (the process exited or was killed)"
                                     : "its connection failed (the process exited or was killed)");
            return false;
        }
        p->ctrl_got += (size_t)n;
        for (;;) {
            td_shm_control c;
            size_t used = 0;
            td_shm_parse pr = shm_control_parse(p->ctrl_buf, p->ctrl_got, &c, &used);
            if (pr == TD_SHM_PARSE_MORE)
                break;
            if (pr == TD_SHM_PARSE_BAD) {
                match_lost(&t->match, p->queues, done, "protocol error: a malformed control frame");
                return false;
            }
            if (c.type == TD_SHM_CTRL_BYE) {
                peer_bye_locked(t, p, done);
            } else {
                char msg[TD_SHM_CTRL_MSG_MAX + 1];
                memcpy(msg, c.msg ? c.msg : "", c.msg_len);
                msg[c.msg_len] = '\0';
                abort_locked(&t->match, c.status, msg, done);
            }
            memmove(p->ctrl_buf, p->ctrl_buf + used, p->ctrl_got - used);
            p->ctrl_got -= used;
        }
    }
}

static void *watch_main(void *arg)
{
    shm_transport *t = arg;
    int n = t->base.size;
    struct pollfd *pf = alloc_zeroed((size_t)(1 + 2 * n), sizeof *pf);
    int *who = alloc_zeroed((size_t)(1 + 2 * n), sizeof *who);
    bool *pid_done = alloc_zeroed((size_t)n, sizeof *pid_done);
    for (;;) {
        int k = 0;
        pf[k] = (struct pollfd){.fd = t->watch_efd, .events = POLLIN};
        who[k++] = -1;
        for (int r = 0; r < n; r++) {
            peer *p = &t->peers[r];
            if (r == t->base.rank)
                continue;
            if (p->sock >= 0 && !p->sock_closed) {
                pf[k] = (struct pollfd){.fd = p->sock, .events = POLLIN | POLLRDHUP};
                who[k++] = r;
            }
            if (p->pidfd >= 0 && !pid_done[r]) {
                pf[k] = (struct pollfd){.fd = p->pidfd, .events = POLLIN};
                who[k++] = n + r;
            }
        }
        int rc = poll(pf, (nfds_t)k, -1);
        if (rc < 0 && errno != EINTR)
            break;
        if (rc <= 0)
            continue;
        if (pf[0].revents)
            break; /* destroy */
        td_done done = TD_DONE_INIT;
        pthread_mutex_lock(&t->match.mu);
        /* Sockets first: a goodbye written before the process exited must be seen before its
         * pidfd says it is gone. */
        for (int i = 1; i < k; i++) {
            if (!pf[i].revents || who[i] >= n)
                continue;
            peer *p = &t->peers[who[i]];
            if (!read_control(t, p, &done))
                p->sock_closed = true;
        }
        for (int i = 1; i < k; i++) {
            if (!pf[i].revents || who[i] < n)
                continue;
            int r = who[i] - n;
            peer *p = &t->peers[r];
            pid_done[r] = true;
            if (p->sock >= 0 && !p->sock_closed && !read_control(t, p, &done))
                p->sock_closed = true;
            if (!atomic_load(&p->gone)) {
                char why[96];
                snprintf(why, sizeof why, "its process (pid %d) exited or was killed", (int)p->pid);
                match_lost(&t->match, p->queues, &done, why);
            }
        }
        pthread_mutex_unlock(&t->match.mu);
        match_run_callbacks(&done);
    }
    free(pf);
    free(who);
    free(pid_done);
    return NULL;
}

/* ---- the io thread ----------------------------------------------------------------------------- */

static bool drain_wanted(shm_transport *t)
{
    for (int r = 0; r < t->base.size; r++)
        if (r != t->base.rank && atomic_load_explicit(&t->peers[r].in_ctl->sender_blocked, memory_order_relaxed))
            return true;
    return false;
}

static bool sends_blocked(shm_transport *t)
{
    for (int r = 0; r < t->base.size; r++)
        if (t->match.peers[r].sq_head)
            return true;
    return false;
}

/* Whether pending operations need the io thread when nobody polls: those with callbacks, those
 * another thread sleeps on, and sends stuck on a full ring (their thread may be waiting on
 * another transport, and the receiver may need their bytes first). Receives make progress when
 * their sender fills the ring (it kicks this thread) or when someone waits on them. */
static bool io_wanted(shm_transport *t)
{
    return t->match.pending_cb || t->match.xfer_sleepers || sends_blocked(t);
}

static void *io_main(void *arg)
{
    shm_transport *t = arg;
    td_match *m = &t->match;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        td_done done = TD_DONE_INIT;
        uint32_t seq = atomic_load(&t->bell->seq);
        int64_t dl = clock_now_ns() + 10 * IO_SLICE_NS;
        bool moved = false;
        bool wanted = m->pending && io_wanted(t);
        if (!m->poller_busy && !m->aborted && (wanted || drain_wanted(t) || m->pending)) {
            /* Register first, then look: what a peer publishes after this is rung. */
            if (wanted && !atomic_load(&t->bell->io_registered)) {
                atomic_store(&t->bell->io_registered, 1);
                seq = atomic_load(&t->bell->seq);
            }
            moved = progress_locked(t, &done);
            td_xfer *which;
            int64_t xdl = match_earliest(m, &which);
            if (which && deadline_passed(xdl))
                match_timeout(m, which, &done);
            dl = clock_now_ns() + IO_SLICE_NS;
            if (xdl < dl)
                dl = xdl;
        }
        if (m->poller_busy || !m->pending || !io_wanted(t) || m->aborted)
            atomic_store(&t->bell->io_registered, 0);
        pthread_mutex_unlock(&m->mu);
        match_run_callbacks(&done);
        if (!moved) /* data flowing: look again at once (the lock was let go in between) */
            samehost_futex_wait(&t->bell->seq, seq, dl, SAMEHOST_BELL_IO);
        pthread_mutex_lock(&m->mu);
    }
    atomic_store(&t->bell->io_registered, 0);
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* With the lock held, after posting x: if it may need progress while nobody polls, the io thread
 * must know. */
static void need_io_locked(shm_transport *t, td_xfer *x)
{
    if (!xfer_done(x) && (x->on_done || x->kind == TD_XFER_SEND) && !t->match.poller_busy &&
        !atomic_load(&t->bell->io_registered))
        samehost_bell_ring(t->bell, SAMEHOST_BELL_IO);
}

/* ---- ops --------------------------------------------------------------------------------------- */

static td_status shm_isend(td_transport *base, int peer_rank, td_xfer *x)
{
    shm_transport *t = (shm_transport *)base;
    td_done done = TD_DONE_INIT;
    pthread_mutex_lock(&t->match.mu);
    peer *p = &t->peers[peer_rank];
    if (t->match.aborted || atomic_load(&p->gone)) {
        td_status s = match_refused(&t->match, p->queues);
        pthread_mutex_unlock(&t->match.mu);
        return s;
    }
    if (match_post_send(&t->match, p->queues, x))
        flush_sends(t, p, &done);
    need_io_locked(t, x);
    pthread_mutex_unlock(&t->match.mu);
    match_run_callbacks(&done);
    return TD_OK;
}

static td_status shm_irecv(td_transport *base, int peer_rank, td_xfer *x)
{
    shm_transport *t = (shm_transport *)base;
    td_done done = TD_DONE_INIT;
    pthread_mutex_lock(&t->match.mu);
    bool gone = peer_rank != TD_TRANSPORT_ANY && atomic_load(&t->peers[peer_rank].gone);
    bool queued;
    td_status s = match_post_recv(&t->match, peer_rank, x, gone, &done, &queued);
    /* Waiting in its queue: the message may be at the front of a ring already. */
    if (queued && peer_rank != TD_TRANSPORT_ANY) {
        drain(t, &t->peers[peer_rank], false, &done);
    } else if (queued) {
        for (int r = 0; r < t->base.size && !xfer_done(x); r++)
            if (r != t->base.rank)
                drain(t, &t->peers[r], false, &done);
    }
    if (s == TD_OK)
        need_io_locked(t, x);
    pthread_mutex_unlock(&t->match.mu);
    match_run_callbacks(&done);
    return s;
}

/* shm_wait's last look before it sleeps: progress once more, under the lock. */
typedef struct xfer_wait {
    shm_transport *t;
    td_xfer *x;
} xfer_wait;

static bool xfer_ready(void *p)
{
    xfer_wait *w = p;
    td_done done = TD_DONE_INIT;
    pthread_mutex_lock(&w->t->match.mu);
    bool moved = progress_locked(w->t, &done);
    bool finished = xfer_done(w->x);
    pthread_mutex_unlock(&w->t->match.mu);
    match_run_callbacks(&done);
    return finished || moved;
}

static td_status shm_wait(td_transport *base, td_xfer *x, int64_t deadline_ns)
{
    shm_transport *t = (shm_transport *)base;
    td_match *m = &t->match;
    int64_t dl;
    td_status result;
    if (!match_wait_begin(m, x, deadline_ns, &dl, &result))
        return result;
    td_done done = TD_DONE_INIT;
    int64_t spin_start = clock_now_ns(), wait_start = spin_start;
    int64_t spin_end = spin_start + samehost_spin_budget(&t->spin);
    bool slept = false;
    for (;;) {
        bool moved = progress_locked(t, &done);
        if (xfer_done(x))
            break;
        int64_t now = clock_now_ns();
        if (now >= dl) {
            match_timeout(m, x, &done);
            break;
        }
        pthread_mutex_unlock(&m->mu);
        match_run_callbacks(&done);
        if (moved) {
            spin_end = now + t->spin.spin_ns; /* data is flowing: keep polling */
            spin_start = now;
        } else if (now < spin_end) {
            samehost_spin_pause(&t->spin, now - spin_start);
        } else {
            xfer_wait w = {t, x};
            slept |= samehost_bell_sleep(t->bell, xfer_ready, &w, dl);
        }
        pthread_mutex_lock(&m->mu);
    }
    m->poller_busy = false;
    samehost_spin_result(&t->spin, slept, wait_start);
    /* Pending operations that someone else waits for (or with callbacks) go to the io thread. */
    if (m->pending && io_wanted(t) && !atomic_load(&t->bell->io_registered))
        samehost_bell_ring(t->bell, SAMEHOST_BELL_IO);
    pthread_mutex_unlock(&m->mu);
    match_run_callbacks(&done);
    return xfer_result(x);
}

static void shm_abort(td_transport *base, td_status status, const char *message)
{
    match_abort(&((shm_transport *)base)->match, status, message);
}

static void free_transport(shm_transport *t)
{
    for (int r = 0; t->peers && r < t->base.size; r++) {
        peer *p = &t->peers[r];
        if (p->sock >= 0)
            close(p->sock);
        if (p->pidfd >= 0)
            close(p->pidfd);
        segment_unmap(&p->seg);
    }
    segment_unmap(&t->seg);
    if (t->watch_efd >= 0)
        close(t->watch_efd);
    match_free(&t->match);
    free(t->set.members);
    free(t->peers);
    free(t);
}

static void shm_destroy(td_transport *base)
{
    shm_transport *t = (shm_transport *)base;
    shm_abort(base, TD_ERR_CLOSED, "The process group was destroyed");
    TD_LOG_DEBUG("shm transport of rank %d: %llu bytes received straight into posted buffers, %llu messages "
                 "through unexpected-message buffers",
                 grank(t, t->base.rank), (unsigned long long)t->n_direct,
                 (unsigned long long)t->match.n_unexpected_msgs);
    pthread_mutex_lock(&t->match.mu);
    t->match.stop = true;
    pthread_mutex_unlock(&t->match.mu);
    samehost_bell_ring(t->bell, SAMEHOST_BELL_ALL);
    if (t->io_started)
        thread_join(t->io_thread);
    if (t->watch_started) {
        uint64_t one = 1;
        ssize_t n = write(t->watch_efd, &one, sizeof one);
        (void)n;
        thread_join(t->watch_thread);
    }
    if (t->match.abort_status == TD_ERR_CLOSED)
        for (int r = 0; r < t->base.size; r++)
            if (r != t->base.rank && !atomic_load(&t->peers[r].gone))
                send_control(&t->peers[r], TD_SHM_CTRL_BYE, TD_OK, NULL);
    free_transport(t);
}

static const td_transport_ops shm_ops = {
    .name = "shm",
    .isend = shm_isend,
    .irecv = shm_irecv,
    .wait = shm_wait,
    .abort = shm_abort,
    .destroy = shm_destroy,
};

bool transport_is_shm(const td_transport *t) { return t && t->ops == &shm_ops; }

/* ---- the owner of the segment set ------------------------------------------------------------ */

static td_status set_failure(void *arg)
{
    shm_transport *t = arg;
    pthread_mutex_lock(&t->match.mu);
    td_status s = error_set(t->match.abort_status, t->match.abort_msg);
    pthread_mutex_unlock(&t->match.mu);
    return s;
}

static void set_abort(void *arg, td_status status, const char *message)
{
    shm_abort(&((shm_transport *)arg)->base, status, message);
}

static td_status set_wait_failed(void *arg, int missing, uint64_t e, int64_t deadline_ns, int64_t start_ns)
{
    shm_transport *t = arg;
    td_match *m = &t->match;
    pthread_mutex_lock(&m->mu);
    if (!m->aborted) {
        td_done done = TD_DONE_INIT;
        if (atomic_load(&t->peers[missing].gone)) {
            char msg[TD_XFER_ERROR_MAX];
            match_closed_msg(m, &m->peers[missing], msg, sizeof msg);
            abort_locked(m, TD_ERR_PEER_LOST, msg, &done);
        } else if (deadline_passed(deadline_ns)) {
            match_abortf(m, TD_ERR_TIMEOUT, &done,
                            "Timed out after %lld ms waiting for rank %d in a shared-memory collective (step %llu)",
                            (long long)((clock_now_ns() - start_ns) / 1000000), grank(t, missing),
                            (unsigned long long)e);
        }
        pthread_mutex_unlock(&m->mu);
        match_run_callbacks(&done);
        pthread_mutex_lock(&m->mu);
    }
    td_status s = m->aborted ? error_set(m->abort_status, m->abort_msg)
                             : error_fmt(TD_ERR_INTERNAL, "shm transport: a wait for rank %d ended without cause",
                                        grank(t, missing));
    pthread_mutex_unlock(&m->mu);
    return s;
}

/* ---- creation ---------------------------------------------------------------------------------- */

/* The set's view of rank r's segment, mapped at base. */
static samehost_member member_at(const shm_transport *t, char *base)
{
    return (samehost_member){
        .bell = (samehost_bell *)(base + t->off.bell),
        .arrival = (samehost_arrival *)(base + t->off.arrive),
        .small = base + t->off.small,
        .large = base + t->off.large,
    };
}

td_status shm_transport_start(int rank, int size, const int *global_ranks, td_segment *own,
                              const td_shm_layout *layout, shm_peer_setup *setup, td_transport **out)
{
    *out = NULL;
    shm_transport *t = TD_NEW(shm_transport);
    t->base.ops = &shm_ops;
    t->base.rank = rank;
    t->base.size = size;
    match_init(&t->match, "shm", rank, size, global_ranks, POOL_MIN_CLASS, 0);
    t->match.abort_locked = abort_locked;
    t->watch_efd = -1;
    t->seg = *own;
    *own = (td_segment)TD_SEGMENT_INIT;
    t->layout = *layout;
    shm_layout_offsets(size, layout, &t->off);
    char *mine = t->seg.base;
    t->bell = (samehost_bell *)(mine + t->off.bell);
    t->peers = TD_NEW_ARRAY(peer, (size_t)size);
    t->set = (samehost_set){
        .rank = rank,
        .size = size,
        .global_ranks = t->match.global_ranks,
        .small_bytes = (size_t)layout->small_bytes,
        .slot_bytes = (size_t)layout->slot_bytes,
        .members = TD_NEW_ARRAY(samehost_member, (size_t)size),
        .spin = &t->spin,
        .owner = {.arg = t, .failed = &t->aborted_flag, .failure = set_failure, .abort = set_abort,
                  .wait_failed = set_wait_failed},
    };
    t->set.members[rank] = member_at(t, mine);
    t->base.samehost = &t->set;
    for (int r = 0; r < size; r++) {
        peer *p = &t->peers[r];
        p->queues = &t->match.peers[r];
        p->sock = p->pidfd = -1;
        p->seg = (td_segment)TD_SEGMENT_INIT;
        if (r == rank)
            continue;
        p->sock = setup[r].sock;
        p->pid = setup[r].pid;
        p->seg = setup[r].seg;
        setup[r].sock = -1;
        setup[r].seg = (td_segment)TD_SEGMENT_INIT;
        char *theirs = p->seg.base;
        t->set.members[r] = member_at(t, theirs);
        t->set.members[r].gone = &p->gone;
        p->bell = t->set.members[r].bell;
        int out_idx = rank < r ? rank : rank - 1; /* my ring in its segment */
        int in_idx = r < rank ? r : r - 1;        /* its ring in mine */
        p->out_ctl = (shm_ring_ctl *)(theirs + t->off.rings + (size_t)out_idx * t->off.ring_stride);
        p->out_data = (char *)p->out_ctl + SHM_RING_CTL_SIZE;
        p->in_ctl = (shm_ring_ctl *)(mine + t->off.rings + (size_t)in_idx * t->off.ring_stride);
        p->in_data = (char *)p->in_ctl + SHM_RING_CTL_SIZE;
        p->tx_head = atomic_load(&p->out_ctl->head);
        p->rx_tail = atomic_load(&p->in_ctl->tail);
        if (p->pid > 0) {
            p->pidfd = samehost_pidfd_open(p->pid);
            if (p->pidfd < 0)
                TD_LOG_DEBUG("shm transport: pidfd_open(%d) failed (%s); rank %d's death is seen through its socket "
                             "only",
                             (int)p->pid, strerror(errno), global_ranks ? global_ranks[r] : r);
        }
    }
    td_status s = samehost_spin_init(&t->spin, size);
    if (s == TD_OK)
        s = samehost_writes_init(&t->set.writes);
    if (s != TD_OK)
        goto fail;
    t->watch_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (t->watch_efd < 0) {
        s = error_errno(TD_ERR_IO, "creating the shm transport's eventfd");
        goto fail;
    }
    s = thread_start(&t->io_thread, "td-shm-io", io_main, t);
    if (s != TD_OK)
        goto fail;
    t->io_started = true;
    s = thread_start(&t->watch_thread, "td-shm-watch", watch_main, t);
    if (s != TD_OK)
        goto fail;
    t->watch_started = true;
    *out = &t->base;
    return TD_OK;
fail:
    if (t->io_started) {
        pthread_mutex_lock(&t->match.mu);
        t->match.stop = true;
        pthread_mutex_unlock(&t->match.mu);
        samehost_bell_ring(t->bell, SAMEHOST_BELL_ALL);
        thread_join(t->io_thread);
    }
    free_transport(t);
    return s;
}
