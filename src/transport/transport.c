/* Transport-independent helpers over td_transport_ops (transport.h, where the posting calls
 * themselves are inline): the blocking conveniences, and the futex sleep/wake pair that lets a
 * thread that is not driving progress wait on one xfer without a shared condition variable. */
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

td_status transport_wait_all(td_transport *t, td_xfer *xs, int n, int64_t deadline_ns)
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
        error_set(first, xs[first_i].error);
    return first;
}

td_status transport_send(td_transport *t, int peer, uint64_t tag, const void *buf, size_t len,
                            int64_t deadline_ns)
{
    td_xfer x;
    x.on_done = NULL;
    TD_TRY(transport_isend1(t, peer, tag, buf, len, deadline_ns, &x));
    return transport_wait(t, &x, deadline_ns);
}

td_status transport_recv(td_transport *t, int peer, uint64_t tag, void *buf, size_t len, int64_t deadline_ns)
{
    td_xfer x;
    x.on_done = NULL;
    TD_TRY(transport_irecv1(t, peer, tag, buf, len, deadline_ns, &x));
    return transport_wait(t, &x, deadline_ns);
}

td_status transport_sendrecv(td_transport *t, int to, const void *sbuf, size_t slen, int from, void *rbuf,
                                size_t rlen, uint64_t tag, int64_t deadline_ns, bool recv_posted)
{
    td_xfer x[2];
    x[0].on_done = x[1].on_done = NULL;
    TD_TRY(transport_irecv1(t, from, tag, rbuf, rlen, deadline_ns, &x[1]));
    td_status s = recv_posted ? transport_isend1_posted(t, to, tag, sbuf, slen, deadline_ns, &x[0])
                              : transport_isend1(t, to, tag, sbuf, slen, deadline_ns, &x[0]);
    if (s != TD_OK) {
        /* The receive is posted and must complete before its memory goes: the transport has
         * failed (the only way a valid post fails), so waiting ends at once. */
        char msg[TD_XFER_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        t->ops->wait(t, &x[1], deadline_ns);
        return error_set(s, msg);
    }
    return transport_wait_all(t, x, 2, deadline_ns);
}

/* ---- completion and sleeping ---------------------------------------------------------------- */

static long futex(atomic_int *addr, int op, int val, const struct timespec *ts)
{
    return syscall(SYS_futex, (int *)addr, op, val, ts, NULL, 0);
}

void xfer_finish(td_xfer *x, td_status status, const char *message)
{
    x->status = status;
    if (status != TD_OK)
        snprintf(x->error, sizeof x->error, "%s", message ? message : td_status_str(status));
    if (atomic_exchange_explicit(&x->state, 1, memory_order_acq_rel) == 2)
        futex(&x->state, FUTEX_WAKE_PRIVATE, 1, NULL);
}

td_status xfer_result(const td_xfer *x)
{
    if (x->status != TD_OK)
        return error_set(x->status, x->error);
    return TD_OK;
}

bool xfer_sleep(td_xfer *x, int64_t deadline_ns)
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
            int64_t left = deadline_ns - clock_now_ns();
            if (left <= 0)
                return false;
            ts.tv_sec = left / 1000000000;
            ts.tv_nsec = left % 1000000000;
            tsp = &ts;
        }
        futex(&x->state, FUTEX_WAIT_PRIVATE, 2, tsp);
    }
}
