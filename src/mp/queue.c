/* td_mp_queue: multiprocessing.Queue in C. Values travel as mp messages (message.h) over one
 * AF_UNIX SOCK_SEQPACKET socket pair that every process using the queue holds both ends of: each
 * datagram is one whole message, delivered to exactly one reader, so any number of processes may
 * put and get without a cross-process lock, and fds travel inside the message. A small shared
 * control block (an unlinked segment) holds the message count and, for a bounded queue, the
 * process-shared semaphore of free slots that put waits on.
 *
 * put encodes synchronously in the caller, so its errors return to the caller and every tensor is
 * in shared memory when it returns. It then sends without blocking; only when the socket is full
 * does the message wait in this process's backlog, sent in order by a feeder thread (named
 * "td-mp-feeder", joined by close), so an unbounded put never blocks on readers. A forked child
 * drops the backlog and feeder it inherited (they are the parent's) and uses the queue afresh. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tdist/mp.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/fork.h"
#include "base/log.h"
#include "base/ref.h"
#include "base/thread.h"
#include "base/vec.h"
#include "mp/message.h"
#include "tensor/segment.h"

#define QUEUE_MAGIC 0x51454454u /* "TDEQ" */
/* Unsent messages a process may hold before put waits for its feeder: each may pin an fd (a
 * storage under the file_descriptor strategy), and fds are a bounded resource. */
#define BACKLOG_MAX 256

typedef struct qctl {
    uint32_t magic;
    uint32_t reserved;
    int64_t maxsize;
    _Atomic int64_t count; /* messages sent and not yet received (advisory) */
    sem_t slots;           /* bounded queues: free slots */
} qctl;

struct td_mp_queue {
    td_ref ref;
    int rfd, wfd;
    td_segment ctl;
    qctl *c;
    int64_t maxsize;
    /* Process-local state, rebuilt in a forked child. */
    uint64_t fork_gen;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    TD_VEC(td_mp_msg *) backlog;
    size_t head; /* first unsent backlog entry */
    bool feeder_on, stop, closed, cancel;
    pthread_t feeder;
};

static pthread_mutex_t reset_mu = PTHREAD_MUTEX_INITIALIZER;
static void reset_after_fork(void) { pthread_mutex_init(&reset_mu, NULL); }
__attribute__((constructor)) static void queue_register_atfork(void) { pthread_atfork(NULL, NULL, reset_after_fork); }

static void init_local(td_mp_queue *q)
{
    q->fork_gen = fork_generation();
    thread_mutex_init(&q->mu);
    thread_cond_init(&q->cv);
    q->backlog.items = NULL;
    q->backlog.len = q->backlog.cap = 0;
    q->head = 0;
    q->feeder_on = q->stop = q->closed = q->cancel = false;
}

static void free_msg(td_mp_msg *m)
{
    mp_msg_free(m);
    free(m);
}

/* In a forked child: the inherited backlog and feeder are the parent's business. */
static void local_check(td_mp_queue *q)
{
    if (q->fork_gen == fork_generation())
        return;
    pthread_mutex_lock(&reset_mu);
    if (q->fork_gen != fork_generation()) {
        for (size_t i = q->head; i < q->backlog.len; i++) {
            q->backlog.items[i]->sent = true; /* the parent sends it: give back nothing here */
            free_msg(q->backlog.items[i]);
        }
        free(q->backlog.items);
        init_local(q);
    }
    pthread_mutex_unlock(&reset_mu);
}

static td_status queue_on(int rfd, int wfd, td_segment ctl, td_mp_queue **out)
{
    td_mp_queue *q = TD_NEW(td_mp_queue);
    ref_init(&q->ref);
    q->rfd = rfd;
    q->wfd = wfd;
    q->ctl = ctl;
    q->c = ctl.base;
    q->maxsize = q->c->maxsize;
    init_local(q);
    *out = q;
    return TD_OK;
}

td_status td_mp_queue_new(int64_t maxsize, td_mp_queue **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_mp_queue_new: out is NULL");
    if (maxsize < 0 || maxsize > 0x7fffffff)
        return error_fmt(TD_ERR_INVALID, "td_mp_queue_new: maxsize must be 0 (unbounded) to 2^31-1, got %lld",
                        (long long)maxsize);
    td_segment ctl;
    TD_TRY(segment_create("q", sizeof(qctl), true, true, &ctl));
    qctl *c = ctl.base;
    c->magic = QUEUE_MAGIC;
    c->maxsize = maxsize;
    atomic_store(&c->count, 0);
    if (maxsize > 0 && sem_init(&c->slots, 1, (unsigned)maxsize) != 0) {
        segment_unmap(&ctl);
        return error_errno(TD_ERR_IO, "td_mp_queue_new: sem_init");
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        segment_unmap(&ctl);
        return error_errno(TD_ERR_IO, "td_mp_queue_new: socketpair");
    }
    /* Room for many small messages before put has to queue them locally (best effort: capped by
     * net.core.wmem_max). */
    int sndbuf = 4 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    return queue_on(sv[0], sv[1], ctl, out);
}

static int64_t queue_wire(void *obj, int *fds)
{
    td_mp_queue *q = obj;
    fds[0] = q->rfd;
    fds[1] = q->wfd;
    fds[2] = q->ctl.fd;
    return q->maxsize;
}

static td_status queue_from_fds(int64_t maxsize, const int *fds, td_mp_queue **out)
{
    td_segment ctl;
    td_status st = segment_map_fd(fds[2], sizeof(qctl), &ctl);
    if (st == TD_OK && (((qctl *)ctl.base)->magic != QUEUE_MAGIC || ((qctl *)ctl.base)->maxsize != maxsize)) {
        segment_unmap(&ctl);
        st = error_fmt(TD_ERR_INVALID, "invalid mp message: a queue's control fd does not match it");
    } else if (st != TD_OK) {
        close(fds[2]);
    }
    if (st != TD_OK) {
        close(fds[0]);
        close(fds[1]);
        return st;
    }
    return queue_on(fds[0], fds[1], ctl, out);
}

td_mp_queue *td_mp_queue_retain(td_mp_queue *q)
{
    if (q)
        ref_inc(&q->ref);
    return q;
}

static td_status queue_from_wire(int64_t maxsize, const int *fds, void **obj)
{
    td_mp_queue *q = NULL;
    td_status st = queue_from_fds(maxsize, fds, &q);
    *obj = q;
    return st;
}

static void *queue_retain(void *obj) { return td_mp_queue_retain(obj); }
static void queue_release(void *obj) { td_mp_queue_release(obj); }

static const mp_object_class queue_class = {
    .kind = TD_MP_OBJ_QUEUE,
    .nfds = 3,
    .has_param = true,
    .entry_form = "a queue entry is not (1, maxsize, fd, fd, fd)",
    .retain = queue_retain,
    .release = queue_release,
    .wire = queue_wire,
    .from_wire = queue_from_wire,
};

/* Queues carry events and queues: the classes a received message may rebuild. */
const mp_object_class *const mp_object_classes[] = {&queue_class, &mp_event_class, NULL};

td_value *td_mp_queue_value(td_mp_queue *q) { return mp_object_value(&queue_class, q); }
td_mp_queue *td_mp_value_queue(const td_value *v) { return mp_object_of(v, TD_MP_OBJ_QUEUE); }

static void *feeder_main(void *arg)
{
    td_mp_queue *q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->head == q->backlog.len && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->head == q->backlog.len)
            break;
        td_mp_msg *m = q->backlog.items[q->head];
        bool cancel = q->cancel;
        pthread_mutex_unlock(&q->mu);
        td_status st;
        if (cancel) {
            st = error_fmt(TD_ERR_CLOSED, "the queue's backlog was cancelled");
        } else {
            /* In slices, so that mp_queue_cancel_join can stop a send nobody will ever take. */
            st = mp_msg_send(q->wfd, m, false, deadline_after_ms(200));
            if (st == TD_ERR_TIMEOUT) {
                pthread_mutex_lock(&q->mu);
                continue;
            }
        }
        if (st == TD_OK)
            atomic_fetch_add(&q->c->count, 1);
        else if (!cancel)
            TD_LOG_ERROR("td_mp_queue: dropping a message that could not be sent: %s", td_last_error());
        if (st != TD_OK && q->maxsize > 0)
            sem_post(&q->c->slots);
        free_msg(m);
        pthread_mutex_lock(&q->mu);
        q->head++;
        if (q->head == q->backlog.len)
            q->head = q->backlog.len = 0;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static td_status wait_slot(td_mp_queue *q, int64_t timeout_ms)
{
    if (q->maxsize == 0)
        return TD_OK;
    int64_t deadline = timeout_ms == TD_MP_NO_WAIT ? clock_now_ns() : deadline_after_ms(timeout_ms);
    for (;;) {
        int rc;
        if (deadline == TD_DEADLINE_NONE) {
            rc = sem_wait(&q->c->slots);
        } else {
            struct timespec ts = deadline_timespec(deadline);
            rc = sem_clockwait(&q->c->slots, CLOCK_MONOTONIC, &ts);
        }
        if (rc == 0)
            return TD_OK;
        if (errno == EINTR)
            continue;
        if (errno == ETIMEDOUT)
            return error_fmt(TD_ERR_TIMEOUT, "td_mp_queue_put: the queue is full (maxsize %lld) and stayed full for %lld ms",
                            (long long)q->maxsize, (long long)(timeout_ms < 0 ? 0 : timeout_ms));
        return error_errno(TD_ERR_IO, "td_mp_queue_put: waiting for a free slot");
    }
}

td_status td_mp_queue_put(td_mp_queue *q, const td_value *v, int64_t timeout_ms)
{
    if (!q || !v)
        return error_fmt(TD_ERR_INVALID, "td_mp_queue_put: %s is NULL", q ? "value" : "queue");
    local_check(q);
    pthread_mutex_lock(&q->mu);
    bool closed = q->closed;
    pthread_mutex_unlock(&q->mu);
    if (closed)
        return error_fmt(TD_ERR_CLOSED, "td_mp_queue_put: the queue was closed in this process");
    td_mp_msg *m = alloc_or_die(sizeof *m);
    td_status st = mp_msg_encode(v, m);
    if (st != TD_OK) {
        free_msg(m);
        return error_prefix(st, "td_mp_queue_put");
    }
    st = wait_slot(q, timeout_ms);
    if (st != TD_OK) {
        free_msg(m);
        return st;
    }
    pthread_mutex_lock(&q->mu);
    if (q->closed) {
        pthread_mutex_unlock(&q->mu);
        free_msg(m);
        if (q->maxsize > 0)
            sem_post(&q->c->slots);
        return error_fmt(TD_ERR_CLOSED, "td_mp_queue_put: the queue was closed in this process");
    }
    if (q->head == q->backlog.len) {
        /* Non-blocking, so holding the lock here only orders this process's messages. */
        st = mp_msg_send(q->wfd, m, true, 0);
        if (st == TD_OK) {
            atomic_fetch_add(&q->c->count, 1);
            pthread_mutex_unlock(&q->mu);
            free_msg(m);
            return TD_OK;
        }
        if (st != TD_ERR_TIMEOUT) {
            pthread_mutex_unlock(&q->mu);
            free_msg(m);
            if (q->maxsize > 0)
                sem_post(&q->c->slots);
            return error_prefix(st, "td_mp_queue_put");
        }
    }
    while (q->backlog.len - q->head >= BACKLOG_MAX && !q->closed)
        pthread_cond_wait(&q->cv, &q->mu);
    TD_VEC_PUSH(&q->backlog, m);
    if (!q->feeder_on) {
        q->stop = false;
        st = thread_start(&q->feeder, "td-mp-feeder", feeder_main, q);
        if (st != TD_OK) {
            q->backlog.len--;
            pthread_mutex_unlock(&q->mu);
            free_msg(m);
            if (q->maxsize > 0)
                sem_post(&q->c->slots);
            return error_prefix(st, "td_mp_queue_put");
        }
        q->feeder_on = true;
    }
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return TD_OK;
}

td_status td_mp_queue_get(td_mp_queue *q, int64_t timeout_ms, td_value **out)
{
    if (!q || !out)
        return error_fmt(TD_ERR_INVALID, "td_mp_queue_get: %s is NULL", q ? "out" : "queue");
    *out = NULL;
    local_check(q);
    int64_t deadline = timeout_ms == TD_MP_NO_WAIT ? clock_now_ns() : deadline_after_ms(timeout_ms);
    td_mp_rmsg r;
    td_status st = mp_msg_recv(q->rfd, deadline, &r);
    if (st == TD_ERR_TIMEOUT)
        return error_fmt(TD_ERR_TIMEOUT, "td_mp_queue_get: the queue stayed empty for %lld ms",
                        (long long)(timeout_ms < 0 ? 0 : timeout_ms));
    if (st != TD_OK)
        return error_prefix(st, "td_mp_queue_get");
    atomic_fetch_sub(&q->c->count, 1);
    if (q->maxsize > 0)
        sem_post(&q->c->slots);
    st = mp_msg_decode(&r, mp_object_classes, out);
    return st == TD_OK ? TD_OK : error_prefix(st, "td_mp_queue_get");
}

void mp_queue_cancel_join(td_mp_queue *q)
{
    local_check(q);
    pthread_mutex_lock(&q->mu);
    q->cancel = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

td_status td_mp_queue_close(td_mp_queue *q)
{
    if (!q)
        return error_fmt(TD_ERR_INVALID, "td_mp_queue_close: queue is NULL");
    local_check(q);
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    q->stop = true;
    bool join = q->feeder_on;
    q->feeder_on = false;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    if (join)
        thread_join(q->feeder); /* it sends the whole backlog first */
    return TD_OK;
}

void td_mp_queue_release(td_mp_queue *q)
{
    if (!q || !ref_dec(&q->ref))
        return;
    td_mp_queue_close(q);
    for (size_t i = q->head; i < q->backlog.len; i++)
        free_msg(q->backlog.items[i]);
    free(q->backlog.items);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    close(q->rfd);
    close(q->wfd);
    segment_unmap(&q->ctl);
    free(q);
}

int64_t td_mp_queue_size(td_mp_queue *q)
{
    int64_t n = atomic_load(&q->c->count);
    return n < 0 ? 0 : n;
}

bool td_mp_queue_empty(td_mp_queue *q)
{
    struct pollfd p = {.fd = q->rfd, .events = POLLIN};
    return poll(&p, 1, 0) <= 0;
}

bool td_mp_queue_full(td_mp_queue *q)
{
    if (q->maxsize == 0)
        return false;
    int v = 0;
    sem_getvalue(&q->c->slots, &v);
    return v <= 0;
}
