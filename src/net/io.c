/* Deadline-bounded socket I/O (io.h): the loops every framed protocol in tdist (store, transport,
 * RPC) uses, so partial transfers, EINTR, SIGPIPE and "peer went away" are handled in one place. */
#include "net/io.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#include "base/clock.h"
#include "base/error.h"

#define SPIN_BACKOFF_MAX 4096u

void net_spin_init(td_net_spin *spin, int64_t budget_ns)
{
    spin->budget_ns = budget_ns > 0 ? budget_ns : 0;
    spin->skip = 0;
    spin->backoff = 1;
}

bool net_spin_now(td_net_spin *spin)
{
    if (!spin || spin->budget_ns <= 0)
        return false;
    if (spin->skip > 0) {
        spin->skip--;
        return false;
    }
    return true;
}

void net_spin_result(td_net_spin *spin, bool hit)
{
    if (hit) {
        spin->backoff = spin->backoff > 1 ? spin->backoff / 2 : 1;
    } else {
        spin->skip = spin->backoff;
        spin->backoff = spin->backoff < SPIN_BACKOFF_MAX ? spin->backoff * 2 : SPIN_BACKOFF_MAX;
    }
}

td_status net_wait(int fd, short events, int64_t deadline_ns)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, deadline_poll_ms(deadline_ns));
        if (rc > 0)
            return TD_OK;
        if (rc == 0) {
            /* poll rounds to whole milliseconds; only report a timeout once it really passed. */
            if (deadline_passed(deadline_ns))
                return error_fmt(TD_ERR_TIMEOUT, "timed out waiting for the socket to become %s",
                                events & POLLOUT ? "writable" : "readable");
            continue;
        }
        if (errno != EINTR)
            return error_errno(TD_ERR_IO, "poll");
    }
}

static td_status io_errno(const char *what)
{
    if (errno == ECONNRESET || errno == EPIPE || errno == ENOTCONN || errno == ESHUTDOWN)
        return error_errno(TD_ERR_PEER_LOST, "connection lost (%s)", what);
    return error_errno(TD_ERR_IO, "%s", what);
}

td_status net_sendv_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns)
{
    while (iovcnt > 0 && iov[0].iov_len == 0) {
        iov++;
        iovcnt--;
    }
    while (iovcnt > 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)(iovcnt > 1024 ? 1024 : iovcnt);
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                TD_TRY(net_wait(fd, POLLOUT, deadline_ns));
                continue;
            }
            return io_errno("send");
        }
        size_t left = (size_t)n;
        while (iovcnt > 0 && left >= iov[0].iov_len) {
            left -= iov[0].iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov[0].iov_base = (char *)iov[0].iov_base + left;
            iov[0].iov_len -= left;
        }
    }
    return TD_OK;
}

td_status net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ns)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return net_sendv_all(fd, &iov, 1, deadline_ns);
}

/* One readv that returns at least one byte (or an error), waiting as needed. */
static td_status readv_some(int fd, struct iovec *iov, int iovcnt, size_t *got, int64_t deadline_ns, td_net_spin *spin)
{
    bool spinning = net_spin_now(spin);
    int64_t spin_until = spinning ? clock_now_ns() + spin->budget_ns : 0;
    for (;;) {
        ssize_t n = readv(fd, iov, iovcnt > 1024 ? 1024 : iovcnt);
        if (n > 0) {
            if (spinning)
                net_spin_result(spin, true);
            *got = (size_t)n;
            return TD_OK;
        }
        if (n == 0)
            return error_fmt(TD_ERR_PEER_LOST, "connection closed by peer");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return io_errno("recv");
        if (spinning) {
            if (clock_now_ns() < spin_until)
                continue;
            net_spin_result(spin, false);
            spinning = false;
        }
        TD_TRY(net_wait(fd, POLLIN, deadline_ns));
    }
}

td_status net_recv_some(int fd, void *buf, size_t cap, size_t *got, int64_t deadline_ns)
{
    return net_recv_some_spin(fd, buf, cap, got, deadline_ns, NULL);
}

td_status net_recv_some_spin(int fd, void *buf, size_t cap, size_t *got, int64_t deadline_ns, td_net_spin *spin)
{
    struct iovec iov = {.iov_base = buf, .iov_len = cap};
    return readv_some(fd, &iov, 1, got, deadline_ns, spin);
}

td_status net_recvv_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns)
{
    for (;;) {
        while (iovcnt > 0 && iov[0].iov_len == 0) {
            iov++;
            iovcnt--;
        }
        if (iovcnt == 0)
            return TD_OK;
        size_t left = 0;
        TD_TRY(readv_some(fd, iov, iovcnt, &left, deadline_ns, NULL));
        while (iovcnt > 0 && left >= iov[0].iov_len) {
            left -= iov[0].iov_len;
            iov++;
            iovcnt--;
        }
        if (iovcnt > 0) {
            iov[0].iov_base = (char *)iov[0].iov_base + left;
            iov[0].iov_len -= left;
        }
    }
}

td_status net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ns)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    return net_recvv_all(fd, &iov, 1, deadline_ns);
}
