/* Listening and connecting for the net layer (socket.h). The store's TCP server and client use it
 * now, the tcp transport and the RPC agent later; connect's retry loop is the one place that decides
 * which connection errors are worth waiting out (a master that is not listening yet) and which are
 * final. */
#include "net/socket.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/thread.h"

td_status net_set_nodelay(int fd)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
        return error_errno(TD_ERR_IO, "setsockopt(TCP_NODELAY)");
    return TD_OK;
}

td_status net_set_nonblocking(int fd, bool on)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0)
        return error_errno(TD_ERR_IO, "fcntl(F_GETFL)");
    int want = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
    if (want != flags && fcntl(fd, F_SETFL, want) != 0)
        return error_errno(TD_ERR_IO, "fcntl(F_SETFL)");
    return TD_OK;
}

td_status net_local_addr(int fd, td_addr *addr)
{
    addr->len = sizeof addr->ss;
    if (getsockname(fd, (struct sockaddr *)&addr->ss, &addr->len) != 0)
        return error_errno(TD_ERR_IO, "getsockname");
    return TD_OK;
}

td_status net_peer_addr(int fd, td_addr *addr)
{
    addr->len = sizeof addr->ss;
    if (getpeername(fd, (struct sockaddr *)&addr->ss, &addr->len) != 0)
        return error_errno(TD_ERR_IO, "getpeername");
    return TD_OK;
}

static int listen_one(const td_addr *a, bool dual_stack, int backlog, int *err)
{
    int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (a->ss.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, dual_stack ? &zero : &one, sizeof one);
    if (bind(fd, (const struct sockaddr *)&a->ss, a->len) != 0 || listen(fd, backlog) != 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    return fd;
}

static bool is_wildcard6(const td_addr *a)
{
    return a->ss.ss_family == AF_INET6 &&
           IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr);
}

td_status net_listen(const char *host, int port, int backlog, int *fd, int *bound_port)
{
    *fd = -1;
    if (port < 0 || port > 65535)
        return error_fmt(TD_ERR_INVALID, "port must have value from 0 to 65535 but was %d.", port);
    if (backlog <= 0)
        backlog = SOMAXCONN;
    char where[TD_ADDR_STRLEN + 64];
    net_format_hostport(host && *host ? host : "*", port, where, sizeof where);
    td_addr *addrs = NULL;
    size_t n = 0;
    td_status s = net_resolve(host, port, true, &addrs, &n);
    if (s != TD_OK)
        return error_prefix(s, "cannot listen on %s", where);
    /* With no host, prefer one dual-stack IPv6 socket; fall back to IPv4 where IPv6 is off. */
    bool any = !host || !*host;
    int err = 0, lfd = -1;
    for (int pass = 0; pass < 2 && lfd < 0; pass++) {
        for (size_t i = 0; i < n && lfd < 0; i++) {
            bool v6 = addrs[i].ss.ss_family == AF_INET6;
            if (any && pass == 0 && !v6)
                continue;
            if (any && pass == 1 && v6)
                continue;
            lfd = listen_one(&addrs[i], any && is_wildcard6(&addrs[i]), backlog, &err);
        }
        if (!any)
            break;
    }
    free(addrs);
    if (lfd < 0) {
        errno = err;
        return error_errno(TD_ERR_IO, "cannot listen on %s", where);
    }
    if (bound_port) {
        td_addr local;
        if (net_local_addr(lfd, &local) != TD_OK) {
            close(lfd);
            return error_prefix(TD_ERR_IO, "cannot listen on %s", where);
        }
        *bound_port = addr_port(&local);
    }
    *fd = lfd;
    return TD_OK;
}

/* Errors that mean "not there yet" (or a transient network fault), worth retrying. */
static bool transient_connect_error(int err)
{
    switch (err) {
    case ECONNREFUSED: case ETIMEDOUT: case ENETUNREACH: case EHOSTUNREACH: case ECONNRESET:
    case ECONNABORTED: case EAGAIN: case EADDRNOTAVAIL: case EINTR: case ENETDOWN: case EHOSTDOWN:
        return true;
    default:
        return false;
    }
}

/* One attempt at one address; returns the fd or -1 with *err set. */
static int connect_one(const td_addr *a, int64_t deadline_ns, int *err)
{
    int fd = socket(a->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    if (connect(fd, (const struct sockaddr *)&a->ss, a->len) != 0) {
        if (errno != EINPROGRESS) {
            *err = errno;
            close(fd);
            return -1;
        }
        for (;;) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int rc = poll(&p, 1, deadline_poll_ms(deadline_ns));
            if (rc < 0 && errno == EINTR)
                continue;
            if (rc <= 0) {
                *err = rc == 0 ? ETIMEDOUT : errno;
                close(fd);
                return -1;
            }
            break;
        }
        int soerr = 0;
        socklen_t len = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
            soerr = errno;
        if (soerr != 0) {
            *err = soerr;
            close(fd);
            return -1;
        }
    }
    int one = 1;
    if (a->ss.ss_family == AF_INET || a->ss.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static uint64_t jitter_state(void)
{
    static __thread uint64_t x;
    if (!x)
        x = (uint64_t)clock_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&x;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
}

/* ---- same-host fast path ----------------------------------------------------------------------- */

static socklen_t local_name(const char *service, const td_addr *a, struct sockaddr_un *un)
{
    char text[TD_ADDR_STRLEN];
    addr_str(a, text, sizeof text);
    memset(un, 0, sizeof *un);
    un->sun_family = AF_UNIX;
    int n = snprintf(un->sun_path + 1, sizeof un->sun_path - 1, "%s/%s", service, text);
    if (n < 0 || (size_t)n >= sizeof un->sun_path - 1)
        n = (int)sizeof un->sun_path - 2;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

td_status net_listen_local(int tcp_fd, const char *service, int *fd)
{
    *fd = -1;
    td_addr bound;
    TD_TRY(net_local_addr(tcp_fd, &bound));
    struct sockaddr_un un;
    socklen_t len = local_name(service, &bound, &un);
    int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (u < 0)
        return error_errno(TD_ERR_IO, "socket(AF_UNIX)");
    if (bind(u, (struct sockaddr *)&un, len) != 0 || listen(u, SOMAXCONN) != 0) {
        td_status s = error_errno(TD_ERR_IO, "cannot listen on the local socket @%s", un.sun_path + 1);
        close(u);
        return s;
    }
    *fd = u;
    return TD_OK;
}

static bool is_wildcard(const td_addr *a)
{
    if (a->ss.ss_family == AF_INET)
        return ((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr == htonl(INADDR_ANY);
    return is_wildcard6(a);
}

static bool same_ip(const td_addr *a, const struct sockaddr *b)
{
    if (!b || a->ss.ss_family != b->sa_family)
        return false;
    if (b->sa_family == AF_INET)
        return ((const struct sockaddr_in *)&a->ss)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (b->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)&a->ss)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

/* Whether dest is an address of this host (loopback, wildcard, or one of its interfaces'). */
static bool is_this_host(const td_addr *dest)
{
    if (addr_is_loopback(dest) || is_wildcard(dest))
        return true;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0)
        return false;
    bool found = false;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next)
        found = same_ip(dest, i->ifa_addr);
    freeifaddrs(ifs);
    return found;
}

static int connect_unix(const struct sockaddr_un *un, socklen_t len)
{
    int u = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (u < 0)
        return -1;
    if (connect(u, (const struct sockaddr *)un, len) != 0) {
        close(u);
        return -1;
    }
    return u;
}

void net_connect_local(const char *service, const td_addr *dest, int *fd)
{
    *fd = -1;
    if (!is_this_host(dest))
        return;
    struct sockaddr_un un;
    socklen_t len = local_name(service, dest, &un);
    if ((*fd = connect_unix(&un, len)) >= 0)
        return;
    /* A server bound to the wildcard serves every local address. */
    int port = addr_port(dest);
    td_addr any;
    memset(&any, 0, sizeof any);
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&any.ss;
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons((uint16_t)port);
    any.len = sizeof *in6;
    len = local_name(service, &any, &un);
    if ((*fd = connect_unix(&un, len)) >= 0)
        return;
    memset(&any, 0, sizeof any);
    struct sockaddr_in *in = (struct sockaddr_in *)&any.ss;
    in->sin_family = AF_INET;
    in->sin_port = htons((uint16_t)port);
    any.len = sizeof *in;
    len = local_name(service, &any, &un);
    *fd = connect_unix(&un, len);
}

td_status net_connect(const char *host, int port, int64_t deadline_ns, int *fd)
{
    return net_connect_ex(host, port, deadline_ns, NULL, fd);
}

td_status net_connect_ex(const char *host, int port, int64_t deadline_ns, const char *local_service, int *fd)
{
    *fd = -1;
    char where[TD_ADDR_STRLEN + 64];
    net_format_hostport(host, port, where, sizeof where);
    if (port < 0 || port > 65535)
        return error_fmt(TD_ERR_INVALID, "port must have value from 0 to 65535 but was %d.", port);
    int64_t start = clock_now_ns();
    int64_t backoff_ns = 10 * 1000000;
    char last[512] = "no attempt finished before the deadline";
    for (;;) {
        td_addr *addrs = NULL;
        size_t n = 0;
        td_status s = net_resolve(host, port, false, &addrs, &n);
        if (s == TD_ERR_NOT_FOUND)
            return error_prefix(TD_ERR_NOT_FOUND, "cannot connect to %s", where);
        bool retry = s != TD_OK;
        if (s != TD_OK)
            snprintf(last, sizeof last, "%s", td_last_error());
        for (size_t i = 0; local_service && i < n; i++) {
            int c = -1;
            net_connect_local(local_service, &addrs[i], &c);
            if (c >= 0) {
                free(addrs);
                *fd = c;
                return TD_OK;
            }
        }
        for (size_t i = 0; i < n; i++) {
            int err = 0;
            int c = connect_one(&addrs[i], deadline_ns, &err);
            if (c >= 0) {
                free(addrs);
                *fd = c;
                return TD_OK;
            }
            char tmp[256];
            snprintf(last, sizeof last, "%s", strerror_r(err, tmp, sizeof tmp));
            if (transient_connect_error(err))
                retry = true;
        }
        free(addrs);
        if (!retry)
            return error_fmt(TD_ERR_IO, "cannot connect to %s: %s", where, last);
        if (deadline_passed(deadline_ns))
            return error_fmt(TD_ERR_TIMEOUT, "timed out after %lld ms connecting to %s: %s",
                            (long long)((clock_now_ns() - start) / 1000000), where, last);
        /* Sleep backoff * [0.5, 1.5), capped by the deadline; the jitter spreads a thousand
         * clients that all found the master not listening yet. */
        int64_t sleep_ns = backoff_ns / 2 + (int64_t)(jitter_state() % (uint64_t)backoff_ns);
        if (deadline_ns != TD_DEADLINE_NONE) {
            int64_t left = deadline_ns - clock_now_ns();
            if (sleep_ns > left)
                sleep_ns = left > 0 ? left : 0;
        }
        clock_sleep_ns(sleep_ns);
        if (backoff_ns < 1000 * 1000000)
            backoff_ns *= 2;
    }
}
