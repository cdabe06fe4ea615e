/* Internal socket I/O with deadlines: whole-buffer sends and receives over non-blocking sockets.
 *
 * Each call loops over partial transfers and EINTR, waits in poll(2) when the socket is not ready,
 * and gives up at the deadline (base/clock.h; TD_DEADLINE_NONE waits forever). Errors:
 *   TD_ERR_TIMEOUT    the deadline passed ("timed out ...")
 *   TD_ERR_PEER_LOST  the peer closed or reset the connection ("connection closed by peer")
 *   TD_ERR_IO         any other failure, with errno's text
 * Sends use MSG_NOSIGNAL, so a closed peer never raises SIGPIPE. Callers prefix the message with
 * what they were doing (td_error_prefix). The vectored forms advance the iovec array they are
 * given, so it must be writable. */
#ifndef TDIST_NET_IO_H
#define TDIST_NET_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <tdist/status.h>

td_status td_net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ns);
td_status td_net_sendv_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns);
td_status td_net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ns);
td_status td_net_recvv_all(int fd, struct iovec *iov, int iovcnt, int64_t deadline_ns);
/* Receives between 1 and cap bytes (whatever is there once the socket is readable). */
td_status td_net_recv_some(int fd, void *buf, size_t cap, size_t *got, int64_t deadline_ns);
/* Waits until fd is ready for `events` (POLLIN / POLLOUT); POLLHUP and POLLERR count as ready. */
td_status td_net_wait(int fd, short events, int64_t deadline_ns);

/* Before sleeping in poll, the receive helpers retry a non-blocking read for up to this many
 * microseconds (0 by default): on a request/response connection whose peer answers within a few
 * microseconds, this saves the sleep and wake-up. Process-wide; the store client sets it from
 * TDIST_STORE_SPIN_US. */
void td_net_set_spin_us(int us);

#endif
