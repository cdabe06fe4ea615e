/* Internal TCP sockets: listening where told, connecting with retry until a deadline.
 *
 * Every socket made here is close-on-exec and non-blocking (the I/O helpers in net/io.h wait in
 * poll with deadlines), so no thread ever blocks in the kernel past its deadline. */
#ifndef TDIST_NET_SOCKET_H
#define TDIST_NET_SOCKET_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/status.h>

#include "net/addr.h"

/* Binds host:port (host NULL or "" means every interface, IPv6 and IPv4) and listens. Port 0 picks
 * a free port; *bound_port (may be NULL) is the port actually bound, so callers never probe for
 * free ports. backlog <= 0 means SOMAXCONN. Fails with TD_ERR_IO naming the address and errno
 * ("cannot listen on 0.0.0.0:29500: Address already in use"). */
td_status net_listen(const char *host, int port, int backlog, int *fd, int *bound_port);

/* Connects to host:port, retrying refused, unreachable and reset connections (and temporary
 * resolver failures) with exponential backoff and jitter until the deadline (base/clock.h;
 * TD_DEADLINE_NONE retries forever). On timeout: TD_ERR_TIMEOUT, "timed out after N ms connecting
 * to HOST:PORT: <last error>". A name that does not resolve or a non-transient error fails at
 * once. The socket is non-blocking with TCP_NODELAY set. */
td_status net_connect(const char *host, int port, int64_t deadline_ns, int *fd);

/* As net_connect; when local_service is not NULL, each attempt first tries the same-host fast
 * path below, so that a client started before its server still gets it. */
td_status net_connect_ex(const char *host, int port, int64_t deadline_ns, const char *local_service, int *fd);

/* Same-host fast path. A server listening on TCP address A also listens on an abstract AF_UNIX
 * socket named "<service>/<A>" (e.g. "tdist-store/127.0.0.1:29500"); a client whose destination
 * is an address of this host connects there instead of through the TCP stack. Abstract sockets
 * live in the network namespace, like ports, and vanish with their descriptor, so a name can
 * neither collide with another live server nor go stale. */
td_status net_listen_local(int tcp_fd, const char *service, int *fd);
/* Tries the local sockets of a server on host:port; *fd = -1 when there is none (not an error). */
void net_connect_local(const char *service, const td_addr *dest, int *fd);

td_status net_set_nodelay(int fd);
td_status net_set_nonblocking(int fd, bool on);
/* The address a socket is bound to (local) or connected to (peer). */
td_status net_local_addr(int fd, td_addr *addr);
td_status net_peer_addr(int fd, td_addr *addr);

#endif
