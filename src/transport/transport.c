/* Transport-independent helpers over td_transport_ops (transport.h): setting up xfers from iovecs,
 * the blocking conveniences the algorithms use, and the futex sleep/wake pair that lets a thread
 * that is not driving progress wait on one xfer without a shared condition variable. */
#include "transport/transport.h"

#include <errno.h>
#include <stdio.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"

static td_status prepare(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                         int64_t deadline_ns, td_xfer *x, int kind)
{
    if (iovcnt < 0 || iovcnt > TD_XFER_MAX_IOV)
        return td_error(TD_ERR_INVALID, "a transfer takes at most %d buffers, got %d", TD_XFER_MAX_IOV, iovcnt);
    if (tag == TD_TAG_RESERVED)
        return td_error(TD_ERR_INVALID, "tag %llu is reserved for the transport", (unsigned long long)tag);
    bool any_ok = kind == TD_XFER_RECV && peer == TD_TRANSPORT_ANY;
    if (!any_ok && (peer < 0 || peer >= t->size || peer == t->rank))
        return td_error(TD_ERR_INVALID, "invalid peer rank %d for rank %d in a group of %d", peer, t->rank, t->size);
    x->status = TD_OK;
    x->peer = peer;
    x->nbytes = 0;
    x->error[0] = '\0';
    atomic_store_explicit(&x->state, 0, memory_order_relaxed);
    x->kind = kind;
    x->tag = tag;
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

td_status td_transport_isend(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                             int64_t deadline_ns, td_xfer *x)
{
    TD_TRY(prepare(t, peer, tag, iov, iovcnt, deadline_ns, x, TD_XFER_SEND));
    return t->ops->isend(t, peer, x);
}

td_status td_transport_irecv(td_transport *t, int peer, uint64_t tag, const struct iovec *iov, int iovcnt,
                             int64_t deadline_ns, td_xfer *x)
{
    TD_TRY(prepare(t, peer, tag, iov, iovcnt, deadline_ns, x, TD_XFER_RECV));
    return t->ops->irecv(t, peer, x);
}

td_status td_transport_isend1(td_transport *t, int peer, uint64_t tag, const void *buf, size_t len,
                              int64_t deadline_ns, td_xfer *x)
{
    struct iovec iov = {(void *)buf, len};
    return td_transport_isend(t, peer, tag, &iov, 1, deadline_ns, x);
}

td_status td_transport_irecv1(td_transport *t, int peer, uint64_t tag, void *buf, size_t len,
                              int64_t deadline_ns, td_xfer *x)
{
    struct iovec iov = {buf, len};
    return td_transport_irecv(t, peer, tag, &iov, 1, deadline_ns, x);
}

td_status td_transport_wait(td_transport *t, td_xfer *x, int64_t deadline_ns)
{
    return t->ops->wait(t, x, deadline_ns);
}

td_status td_transport_wait_all(td_transport *t, td_xfer *xs, int n, int64_t deadline_ns)
{
    td_status first = TD_OK;
    int first_i = -1;
    for (int i = 0; i < n; i++) {
        td_status s = t->ops->wait(t, &xs[i], deadline_ns);
        if (s != TD_OK && first == TD_OK) {
            first = s;
            first_i = i;
        }
    }
    if (first != TD_OK)
        td_error_set(first, xs[first_i].error);
    return first;
}

td_status td_transport_send(td_transport *t, int peer, uint64_t tag, const void *buf, size_t len,
                            int64_t deadline_ns)
{
    td_xfer x;
    x.on_done = NULL;
    TD_TRY(td_transport_isend1(t, peer, tag, buf, len, deadline_ns, &x));
    return td_transport_wait(t, &x, deadline_ns);
}

td_status td_transport_recv(td_transport *t, int peer, uint64_t tag, void *buf, size_t len, int64_t deadline_ns)
{
    td_xfer x;
    x.on_done = NULL;
    TD_TRY(td_transport_irecv1(t, peer, tag, buf, len, deadline_ns, &x));
    return td_transport_wait(t, &x, deadline_ns);
}

td_status td_transport_sendrecv(td_transport *t, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                                size_t rlen, uint64_t tag, int64_t deadline_ns)
{
    td_xfer x[2];
    x[0].on_done = x[1].on_done = NULL;
    TD_TRY(td_transport_irecv1(t, from, tag, rbuf, rlen, deadline_ns, &x[1]));
    td_status s = td_transport_isend1(t, to, tag, sbuf, slen, deadline_ns, &x[0]);
    if (s != TD_OK) {
        /* The receive is posted and must complete before its memory goes: the transport has
         * failed (the only way a valid post fails), so waiting ends at once. */
        char msg[TD_XFER_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        t->ops->wait(t, &x[1], deadline_ns);
        return td_error_set(s, msg);
    }
    return td_transport_wait_all(t, x, 2, deadline_ns);
}

/* ---- completion and sleeping ---------------------------------------------------------------- */

static long futex(atomic_int *addr, int op, int val, const struct timespec *ts)
{
    return syscall(SYS_futex, (int *)addr, op, val, ts, NULL, 0);
}

void td_xfer_finish(td_xfer *x, td_status status, const char *message)
{
    x->status = status;
    if (status != TD_OK)
        snprintf(x->error, sizeof x->error, "%s", message ? message : td_status_str(status));
    if (atomic_exchange_explicit(&x->state, 1, memory_order_acq_rel) == 2)
        futex(&x->state, FUTEX_WAKE_PRIVATE, 1, NULL);
}

td_status td_xfer_result(const td_xfer *x)
{
    if (x->status != TD_OK)
        return td_error_set(x->status, x->error);
    return TD_OK;
}

bool td_xfer_sleep(td_xfer *x, int64_t deadline_ns)
{
    for (;;) {
        int s = atomic_load_explicit(&x->state, memory_order_acquire);
        if (s == 1)
            return true;
        if (s == 0 && !atomic_compare_exchange_strong_explicit(&x->state, &s, 2, memory_order_acq_rel,
                                                               memory_order_acquire))
            continue;
        const struct timespec *tsp = NULL;
        struct timespec ts;
        if (deadline_ns != TD_DEADLINE_NONE) {
            int64_t left = deadline_ns - td_now_ns();
            if (left <= 0)
                return false;
            ts.tv_sec = left / 1000000000;
            ts.tv_nsec = left % 1000000000;
            tsp = &ts;
        }
        futex(&x->state, FUTEX_WAIT_PRIVATE, 2, tsp);
    }
}
