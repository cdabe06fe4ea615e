/* Internal socket I/O with deadlines: whole-buffer sends and receives over non-blocking sockets.
 *
 * Each call loops over partial transfers and EINTR, waits in poll(2) when the socket is not ready,
 * and gives up at the deadline (base/clock.h; TD_DEADLINE_NONE waits forever). Errors:
 *   TD_ERR_TIMEOUT    the deadline passed ("timed out ...")
 *   TD_ERR_PEER_LOST  the peer closed or reset the connection ("connection closed by peer")
 *   TD_ERR_IO         any other failure, with errno's text
 * Sends use MSG_NOSIGNAL, so a closed peer never raises SIGPIPE. Callers prefix the message with
 * what they were doing (error_prefix). The vectored forms advance the iovec array they are
 * given, so it must be writable. */
#ifndef TDIST_NET_IO_H
#define TDIST_NET_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <tdist/status.h>

td_status net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ns);
td_status net_sendv_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns);
td_status net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ns);
td_status net_recvv_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns);
/* Receives between 1 and cap bytes (whatever is there once the socket is readable). */
td_status net_recv_some(int fd, void *buf, size_t cap, size_t *got, int64_t deadline_ns);
/* Waits until fd is ready for `events` (POLLIN / POLLOUT); POLLHUP and POLLERR count as ready. */
td_status net_wait(int fd, short events, int64_t deadline_ns);

/* Adaptive busy-waiting for request/response connections (DESIGN.md: "spin briefly, then sleep").
 * Before sleeping in poll, net_recv_some_spin retries a non-blocking read for up to the spin's
 * budget: when the peer answers within microseconds this saves two scheduler wake-ups. A spin
 * that does not pay off (the data came only after the budget) makes the next ones skip spinning,
 * for exponentially more calls, so a busy machine quickly stops paying for it. Not thread-safe:
 * one per connection, used under the connection's lock. */
typedef struct td_net_spin {
    int64_t budget_ns; /* 0: never spin */
    uint32_t skip;     /* calls left that do not spin */
    uint32_t backoff;  /* calls to skip after the next miss */
} td_net_spin;

void net_spin_init(td_net_spin *spin, int64_t budget_ns);
/* Whether the next wait should spin (and accounts for a skipped one). */
bool net_spin_now(td_net_spin *spin);
/* Records how a spin ended: hit (the data came while spinning) or miss. */
void net_spin_result(td_net_spin *spin, bool hit);

/* net_recv_some, spinning first per spin (may be NULL). */
td_status net_recv_some_spin(int fd, void *buf, size_t cap, size_t *got, int64_t deadline_ns, td_net_spin *spin);

#endif
