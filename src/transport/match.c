/* The transports' shared engine half (match.h): queues of sends and posted receives, tag matching
 * of arriving messages and of receives posted after their message came, unexpected-message
 * buffers from a size-class pool, completion of xfers, and their failure (length mismatches,
 * peers that close, aborts, timeouts), with the messages every transport gives. The tcp engine
 * (tcp.c) and the shm engine (shm.c) embed one and call in with their mutex held; they keep only
 * how bytes move. Nothing here blocks except match_wait_begin, which sleeps on one xfer without
 * the lock while another thread drives progress. */
#include "transport/match.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"

#define UNEXP_STEP ((size_t)1 << 20)
#define MATCH_UNEXP_LIMIT_DEFAULT ((int64_t)1 << 30) /* TDIST_MAX_UNEXPECTED_BYTES */

typedef struct pool_buf {
    struct pool_buf *next;
} pool_buf;

/* Bytes kept in every transport's pool of this process together (at most MATCH_POOL_BUDGET): a
 * process with many groups, each with its own transports, keeps one budget's worth, not one per
 * group. */
static _Atomic size_t g_pool_bytes;

size_t match_pool_bytes(void) { return atomic_load_explicit(&g_pool_bytes, memory_order_relaxed); }

void match_init(td_match *m, const char *name, int rank, int size, const int *global_ranks, int pool_min_class,
                   size_t extra_bytes)
{
    memset(m, 0, sizeof *m);
    m->name = name;
    m->rank = rank;
    m->size = size;
    thread_mutex_init(&m->mu);
    m->peers = TD_NEW_ARRAY(td_match_peer, (size_t)size);
    for (int r = 0; r < size; r++)
        m->peers[r].rank = r;
    if (global_ranks) {
        m->global_ranks = TD_NEW_ARRAY(int, (size_t)size);
        memcpy(m->global_ranks, global_ranks, sizeof(int) * (size_t)size);
    }
    m->pool_min_class = pool_min_class;
    m->unexp_size = sizeof(td_unexp) + extra_bytes;
    int64_t limit = MATCH_UNEXP_LIMIT_DEFAULT;
    if (env_get_int("TDIST_MAX_UNEXPECTED_BYTES", MATCH_UNEXP_LIMIT_DEFAULT, 0, INT64_MAX, &limit) != TD_OK)
        TD_LOG_WARN("%s; using %lld", td_last_error(), (long long)limit);
    m->unexp_limit = (uint64_t)limit;
}

bool match_unexp_admit(td_match *m, const td_match_peer *p, uint64_t len)
{
    if (len <= m->unexp_limit && p->unexp_bytes <= m->unexp_limit - len)
        return true;
    error_fmt(TD_ERR_NOMEM,
              "rank %d sent %llu bytes no receive was posted for, with %llu such bytes waiting: over "
              "TDIST_MAX_UNEXPECTED_BYTES (%llu per peer)",
              match_grank(m, p->rank), (unsigned long long)len, (unsigned long long)p->unexp_bytes,
              (unsigned long long)m->unexp_limit);
    return false;
}

void match_free(td_match *m)
{
    for (int r = 0; m->peers && r < m->size; r++) {
        for (td_unexp *u = m->peers[r].uq_head; u;) {
            td_unexp *next = u->next;
            free(u->buf);
            free(u);
            u = next;
        }
    }
    for (td_unexp *u = m->free_unexp; u;) {
        td_unexp *next = u->next;
        free(u);
        u = next;
    }
    for (int c = 0; c < TD_MATCH_POOL_CLASSES; c++) {
        for (pool_buf *b = m->pool[c]; b;) {
            pool_buf *next = b->next;
            free(b);
            atomic_fetch_sub_explicit(&g_pool_bytes, (size_t)1 << c, memory_order_relaxed);
            b = next;
        }
    }
    pthread_mutex_destroy(&m->mu);
    free(m->peers);
    free(m->global_ranks);
    m->peers = NULL;
    m->global_ranks = NULL;
}

/* ---- completion --------------------------------------------------------------------------------- */

void match_complete(td_match *m, td_xfer *x, td_status status, const char *msg, td_done *done)
{
    m->pending--;
    done->completed++;
    if (x->on_done) {
        m->pending_cb--;
        x->status = status;
        if (status != TD_OK)
            snprintf(x->error, sizeof x->error, "%s", msg ? msg : td_status_str(status));
        atomic_store_explicit(&x->state, 1, memory_order_release);
        match_push(&done->head, &done->tail, x);
    } else {
        xfer_finish(x, status, msg);
    }
}

void match_completef(td_match *m, td_xfer *x, td_status status, td_done *done, const char *fmt, ...)
{
    char msg[TD_XFER_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    match_complete(m, x, status, msg, done);
}

void match_run_callbacks(td_done *done)
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

/* ---- buffer pool (unexpected messages) ---------------------------------------------------------- */

static int pool_class(const td_match *m, size_t len)
{
    int c = m->pool_min_class;
    while (c < TD_MATCH_POOL_CLASSES - 1 && ((size_t)1 << c) < len)
        c++;
    return c;
}

/* A buffer of at least len bytes; *cap gets its real size (a class size when len fits one). */
static char *pool_get(td_match *m, size_t len, size_t *cap)
{
    int c = pool_class(m, len);
    size_t size = (size_t)1 << c;
    if (size < len)
        size = len;
    *cap = size;
    if (m->pool[c] && size == ((size_t)1 << c)) {
        pool_buf *b = m->pool[c];
        m->pool[c] = b->next;
        atomic_fetch_sub_explicit(&g_pool_bytes, size, memory_order_relaxed);
        return (char *)b;
    }
    void *p = NULL;
    if (alloc_try(size, "unexpected message buffer", &p) != TD_OK)
        return NULL;
    return p;
}

/* Keeps buf for the next unexpected message of its class while the process's pools hold less than
 * MATCH_POOL_BUDGET; frees it otherwise, and always when it is larger than MATCH_POOL_LARGEST. */
static void pool_put(td_match *m, char *buf, size_t len)
{
    if (!buf)
        return;
    int c = pool_class(m, len);
    size_t size = (size_t)1 << c;
    if (size != len || size > MATCH_POOL_LARGEST) {
        free(buf);
        return;
    }
    size_t held = atomic_load_explicit(&g_pool_bytes, memory_order_relaxed);
    do {
        if (held + size > MATCH_POOL_BUDGET) {
            free(buf);
            return;
        }
    } while (!atomic_compare_exchange_weak_explicit(&g_pool_bytes, &held, held + size, memory_order_relaxed,
                                                    memory_order_relaxed));
    pool_buf *b = (pool_buf *)buf;
    b->next = m->pool[c];
    m->pool[c] = b;
}

td_unexp *match_unexp_new(td_match *m, uint64_t tag, size_t len, const td_coll_desc *desc)
{
    td_unexp *u = m->free_unexp;
    if (u)
        m->free_unexp = u->next;
    else
        u = alloc_or_die(m->unexp_size);
    memset(u, 0, m->unexp_size);
    u->tag = tag;
    u->len = len;
    if (desc) {
        u->has_desc = true;
        u->desc = *desc;
    }
    u->arrival = ++m->arrival;
    return u;
}

void match_unexp_queue(td_match *m, td_match_peer *p, td_unexp *u)
{
    u->next = NULL;
    if (p->uq_tail)
        p->uq_tail->next = u;
    else
        p->uq_head = u;
    p->uq_tail = u;
    if (!u->own)
        p->unexp_bytes += u->len;
    m->n_unexpected_msgs++;
}

void match_unexp_free(td_match *m, td_unexp *u)
{
    pool_put(m, u->buf, u->cap);
    u->buf = NULL;
    u->cap = 0;
    u->next = m->free_unexp;
    m->free_unexp = u;
}

bool match_unexp_room(td_match *m, td_unexp *u, size_t n)
{
    size_t need = u->got + n;
    if (need <= u->cap)
        return true;
    size_t want = u->cap ? u->cap * 2 : UNEXP_STEP;
    while (want < need)
        want *= 2;
    if (want > u->len)
        want = u->len;
    size_t cap = 0;
    char *nb = pool_get(m, want, &cap);
    if (!nb)
        return false;
    if (u->got)
        memcpy(nb, u->buf, u->got);
    pool_put(m, u->buf, u->cap);
    u->buf = nb;
    u->cap = cap;
    return true;
}

/* ---- matching ----------------------------------------------------------------------------------- */

/* A specific receive keeps the peer it was posted to (auto_route.c finds a composite transport's
 * xfers again by it); an any-source one learns its sender. */
static void set_sender(td_xfer *x, const td_match_peer *p)
{
    if (x->peer == TD_TRANSPORT_ANY)
        x->peer = p->rank;
}

td_xfer *match_posted(td_match *m, td_match_peer *p, uint64_t tag)
{
    td_xfer *prev = NULL, *x = p->posted_head;
    while (x && x->tag != tag) {
        prev = x;
        x = x->next;
    }
    td_xfer *aprev = NULL, *a = m->any_head;
    while (a && a->tag != tag) {
        aprev = a;
        a = a->next;
    }
    if (a && (!x || a->order < x->order)) {
        match_unlink(&m->any_head, &m->any_tail, aprev, a);
        set_sender(a, p);
        return a;
    }
    if (x)
        match_unlink(&p->posted_head, &p->posted_tail, prev, x);
    return x;
}

void match_mismatch(td_match *m, td_xfer *x, const td_match_peer *p, uint64_t tag, size_t len, td_done *done)
{
    int from = match_grank(m, p->rank);
    if (transport_tag_is_coll(tag)) /* its tag is an internal number: the collective's is named */
        match_completef(m, x, TD_ERR_INVALID, done,
                        "Message size mismatch in collective #%llu: rank %d sent %zu bytes to a receive of %zu bytes; "
                        "the sizes must match",
                        (unsigned long long)(x->desc ? x->desc->seq : (tag & ~TD_TAG_COLL_BIT) >> TD_TAG_STEP_BITS),
                        from, len, x->total);
    else
        match_completef(m, x, TD_ERR_INVALID, done,
                        "Message size mismatch: rank %d sent %zu bytes (tag %llu) to a receive of %zu bytes; the "
                        "sizes must match",
                        from, len, (unsigned long long)tag, x->total);
}

/* What a message or receive without a descriptor counts as. */
static const td_coll_desc no_desc;

static bool desc_equal(const td_coll_desc *a, const td_coll_desc *b)
{
    return memcmp(a ? a : &no_desc, b ? b : &no_desc, sizeof *a) == 0;
}

bool match_desc_check(td_match *m, td_xfer *x, const td_match_peer *p, const td_coll_desc *desc, td_done *done)
{
    if (__builtin_expect(!desc || desc_equal(x->desc, desc), 1))
        return true;
    const td_coll_desc *mine = x->desc ? x->desc : &no_desc, *theirs = desc ? desc : &no_desc;
    char a[96], b[96], msg[TD_XFER_ERROR_MAX];
    td_coll_desc_format(mine, a, sizeof a);
    td_coll_desc_format(theirs, b, sizeof b);
    td_coll_mismatch_format(msg, sizeof msg, mine->seq ? mine->seq : theirs->seq, match_grank(m, m->rank), a,
                            match_grank(m, p->rank), b);
    match_complete(m, x, TD_ERR_INVALID, msg, done);
    return false;
}

void match_desc_unposted(td_match *m, td_match_peer *p, uint64_t tag, const td_coll_desc *desc, td_done *done)
{
    if (!desc || !transport_tag_is_coll(tag))
        return;
    uint64_t id = transport_tag_coll_id(tag);
    td_xfer *prev = NULL, *x = p->posted_head;
    while (x && transport_tag_coll_id(x->tag) != id) {
        prev = x;
        x = x->next;
    }
    if (!x || desc_equal(x->desc, desc))
        return;
    match_unlink(&p->posted_head, &p->posted_tail, prev, x);
    set_sender(x, p);
    match_desc_check(m, x, p, desc, done);
}

bool match_arrived(td_match *m, td_match_peer *p, uint64_t tag, uint64_t len, const td_coll_desc *desc,
                   td_done *done)
{
    p->rx = NULL;
    p->ru = NULL;
    td_xfer *x = match_posted(m, p, tag);
    if (!x) {
        match_desc_unposted(m, p, tag, desc, done);
        return false;
    }
    if (!match_desc_check(m, x, p, desc, done))
        return true; /* the payload is dropped */
    if (x->total != len)
        match_mismatch(m, x, p, tag, (size_t)len, done); /* the payload is dropped */
    else
        p->rx = x;
    return true;
}

void match_message_done(td_match *m, td_match_peer *p, td_done *done)
{
    if (p->rx) {
        match_finish(m, p->rx, done);
        p->rx = NULL;
    }
    p->ru = NULL; /* an unexpected message stays queued, now complete */
}

/* A posted receive takes a queued unexpected message: what arrived is copied, and if more is
 * coming, the rest goes straight into x. */
static void take_unexpected(td_match *m, td_match_peer *p, td_unexp *prev, td_unexp *u, td_xfer *x, td_done *done)
{
    if (prev)
        prev->next = u->next;
    else
        p->uq_head = u->next;
    if (p->uq_tail == u)
        p->uq_tail = prev;
    u->next = NULL;
    if (!u->own)
        p->unexp_bytes -= u->len;
    set_sender(x, p);
    bool arriving = p->ru == u;
    if (u->has_desc && !match_desc_check(m, x, p, &u->desc, done)) {
        if (arriving)
            p->ru = NULL; /* the rest of the payload is dropped */
        match_unexp_free(m, u);
        return;
    }
    if (u->own) {
        m->take_own(m, p, u, x, done);
        return;
    }
    if (u->len != x->total) {
        match_mismatch(m, x, p, u->tag, u->len, done);
        if (arriving)
            p->ru = NULL; /* the rest of the payload is dropped */
    } else {
        if (u->got)
            xfer_copy_in(x, 0, u->buf, u->got);
        x->progress = u->got;
        m->n_copied_out += u->got;
        if (arriving) {
            p->ru = NULL;
            p->rx = x; /* the rest arrives straight into x */
        } else {
            match_finish(m, x, done);
        }
    }
    match_unexp_free(m, u);
}

/* p's first unexpected message with tag, and its predecessor. */
static td_unexp *find_unexpected(td_match_peer *p, uint64_t tag, td_unexp **prev)
{
    td_unexp *pr = NULL, *u = p->uq_head;
    while (u && u->tag != tag) {
        pr = u;
        u = u->next;
    }
    *prev = pr;
    return u;
}

/* p's first unexpected message of x's collective (another step) that describes it otherwise. */
static const td_unexp *disagreeing_unexpected(const td_match_peer *p, const td_xfer *x)
{
    uint64_t id = transport_tag_coll_id(x->tag);
    for (const td_unexp *u = p->uq_head; u; u = u->next)
        if (u->has_desc && transport_tag_coll_id(u->tag) == id && !desc_equal(&u->desc, x->desc))
            return u;
    return NULL;
}

bool match_post_send(td_match *m, td_match_peer *p, td_xfer *x)
{
    m->pending++;
    if (x->on_done)
        m->pending_cb++;
    bool idle = p->sq_head == NULL;
    match_push(&p->sq_head, &p->sq_tail, x);
    return idle;
}

td_status match_post_recv(td_match *m, int peer, td_xfer *x, bool peer_gone, td_done *done, bool *queued)
{
    *queued = false;
    if (m->aborted)
        return error_set(m->abort_status, m->abort_msg);
    x->order = ++m->order;
    td_match_peer *bp = NULL;
    td_unexp *bprev = NULL, *bu = NULL;
    const td_unexp *other = NULL;
    if (peer != TD_TRANSPORT_ANY) {
        bp = &m->peers[peer];
        bu = find_unexpected(bp, x->tag, &bprev);
        if (!bu && peer_gone)
            return match_refused(m, bp);
    } else {
        for (int r = 0; r < m->size; r++) {
            if (r == m->rank)
                continue;
            td_unexp *prev, *u = find_unexpected(&m->peers[r], x->tag, &prev);
            if (u && (!bu || u->arrival < bu->arrival)) {
                bp = &m->peers[r];
                bprev = prev;
                bu = u;
            }
        }
    }
    m->pending++;
    if (x->on_done)
        m->pending_cb++;
    if (bu) {
        take_unexpected(m, bp, bprev, bu, x, done);
    } else if (bp && transport_tag_is_coll(x->tag) && (other = disagreeing_unexpected(bp, x)) != NULL) {
        set_sender(x, bp);
        match_desc_check(m, x, bp, &other->desc, done);
    } else if (peer != TD_TRANSPORT_ANY) {
        match_push(&bp->posted_head, &bp->posted_tail, x);
        *queued = true;
    } else {
        match_push(&m->any_head, &m->any_tail, x);
        *queued = true;
    }
    return TD_OK;
}

td_status match_refused(td_match *m, const td_match_peer *p)
{
    if (m->aborted)
        return error_set(m->abort_status, m->abort_msg);
    char msg[TD_XFER_ERROR_MAX];
    match_closed_msg(m, p, msg, sizeof msg);
    return error_set(TD_ERR_PEER_LOST, msg);
}

/* ---- failure ------------------------------------------------------------------------------------ */

void match_fail_list(td_match *m, td_xfer **head, td_xfer **tail, td_status status, const char *msg,
                        td_done *done)
{
    td_xfer *x = *head;
    *head = *tail = NULL;
    while (x) {
        td_xfer *next = x->next;
        if (!(x->kind & TD_XFER_OWN))
            match_complete(m, x, status, msg, done);
        x = next;
    }
}

static void fail_peer(td_match *m, td_match_peer *p, td_status status, const char *msg, td_done *done)
{
    match_fail_list(m, &p->sq_head, &p->sq_tail, status, msg, done);
    match_fail_list(m, &p->posted_head, &p->posted_tail, status, msg, done);
    if (p->rx) { /* cut off mid-message */
        match_complete(m, p->rx, status, msg, done);
        p->rx = NULL;
    }
}

void match_fail_all(td_match *m, td_status status, const char *msg, td_done *done)
{
    m->aborted = true;
    m->abort_status = status;
    snprintf(m->abort_msg, sizeof m->abort_msg, "%s", msg);
    TD_LOG_DEBUG("%s transport of rank %d aborted: %s", m->name, match_grank(m, m->rank), msg);
    for (int r = 0; r < m->size; r++)
        if (r != m->rank)
            fail_peer(m, &m->peers[r], status, msg, done);
    match_fail_list(m, &m->any_head, &m->any_tail, status, msg, done);
}

void match_closed_msg(const td_match *m, const td_match_peer *p, char *buf, size_t size)
{
    int g = match_grank(m, p->rank);
    snprintf(buf, size, "Connection to rank %d lost: rank %d closed its end (it destroyed its process group)", g, g);
}

void match_peer_closed(td_match *m, td_match_peer *p, td_done *done)
{
    char msg[TD_XFER_ERROR_MAX];
    match_closed_msg(m, p, msg, sizeof msg);
    fail_peer(m, p, TD_ERR_PEER_LOST, msg, done);
}

void match_abort(td_match *m, td_status status, const char *message)
{
    td_done done = TD_DONE_INIT;
    pthread_mutex_lock(&m->mu);
    m->abort_locked(m, status, message ? message : td_status_str(status), &done);
    pthread_mutex_unlock(&m->mu);
    match_run_callbacks(&done);
}

void match_abortf(td_match *m, td_status status, td_done *done, const char *fmt, ...)
{
    char msg[TD_XFER_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    m->abort_locked(m, status, msg, done);
}

void match_lost(td_match *m, const td_match_peer *p, td_done *done, const char *why)
{
    int g = match_grank(m, p->rank);
    if (g != p->rank)
        match_abortf(m, TD_ERR_PEER_LOST, done, "Connection to rank %d (group rank %d) lost: %s", g, p->rank, why);
    else
        match_abortf(m, TD_ERR_PEER_LOST, done, "Connection to rank %d lost: %s", g, why);
}

void match_timeout(td_match *m, const td_xfer *x, td_done *done)
{
    if (x->peer == TD_TRANSPORT_ANY)
        match_abortf(m, TD_ERR_TIMEOUT, done,
                        "Timed out waiting for a receive from any rank (%zu bytes, tag %llu) to complete", x->total,
                        (unsigned long long)x->tag);
    else
        match_abortf(m, TD_ERR_TIMEOUT, done, "Timed out waiting for a %s rank %d (%zu bytes, tag %llu) to complete",
                        (x->kind & TD_XFER_SEND) ? "send to" : "receive from", match_grank(m, x->peer), x->total,
                        (unsigned long long)x->tag);
}

int64_t match_earliest(td_match *m, td_xfer **which)
{
    int64_t best = TD_DEADLINE_NONE;
    *which = NULL;
#define CONSIDER(x)                     \
    do {                                \
        if ((x)->deadline_ns < best) {  \
            best = (x)->deadline_ns;    \
            *which = (x);               \
        }                               \
    } while (0)
    for (int r = 0; r < m->size; r++) {
        td_match_peer *p = &m->peers[r];
        for (td_xfer *x = p->sq_head; x; x = x->next)
            CONSIDER(x);
        for (td_xfer *x = p->posted_head; x; x = x->next)
            CONSIDER(x);
        if (p->rx)
            CONSIDER(p->rx);
    }
    for (td_xfer *x = m->any_head; x; x = x->next)
        CONSIDER(x);
#undef CONSIDER
    return best;
}

/* ---- waiting ------------------------------------------------------------------------------------ */

bool match_wait_begin(td_match *m, td_xfer *x, int64_t deadline_ns, int64_t *dl, td_status *result)
{
    if (xfer_done(x)) {
        *result = xfer_result(x);
        return false;
    }
    *dl = x->deadline_ns < deadline_ns ? x->deadline_ns : deadline_ns;
    pthread_mutex_lock(&m->mu);
    if (!m->poller_busy) {
        m->poller_busy = true;
        return true;
    }
    /* Another thread drives progress and completes x; when it leaves, the transport's thread does. */
    m->xfer_sleepers++;
    pthread_mutex_unlock(&m->mu);
    bool ok = xfer_sleep(x, *dl);
    td_done done = TD_DONE_INIT;
    pthread_mutex_lock(&m->mu);
    m->xfer_sleepers--;
    if (!ok && !xfer_done(x))
        match_timeout(m, x, &done);
    pthread_mutex_unlock(&m->mu);
    match_run_callbacks(&done);
    *result = xfer_result(x);
    return false;
}

/* ---- iovec copies ------------------------------------------------------------------------------- */

/* Copies n bytes between buf and x's iovecs, starting at byte off of the iovecs: into them when
 * in, out of them otherwise. */
static void xfer_copy(const td_xfer *x, size_t off, char *buf, size_t n, bool in)
{
    for (int i = 0; i < x->iovcnt && n; i++) {
        size_t len = x->iov[i].iov_len;
        if (off >= len) {
            off -= len;
            continue;
        }
        size_t take = len - off < n ? len - off : n;
        char *at = (char *)x->iov[i].iov_base + off;
        if (in)
            memcpy(at, buf, take);
        else
            memcpy(buf, at, take);
        buf += take;
        n -= take;
        off = 0;
    }
}

void xfer_copy_in(td_xfer *x, size_t off, const char *src, size_t n) { xfer_copy(x, off, (char *)src, n, true); }

void xfer_copy_out(const td_xfer *x, size_t off, char *dst, size_t n) { xfer_copy(x, off, dst, n, false); }

int xfer_iov_from(const td_xfer *x, size_t skip, size_t limit, struct iovec *iov, int max)
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
