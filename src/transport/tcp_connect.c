/* Setting up the tcp transport's connections through a store (tcp_transport_create, tcp.h).
 *
 * Each rank listens on port 0 at its bind address (explicit, or TDIST_SOCKET_IFNAME's address, or
 * the local address that reaches MASTER_ADDR, or loopback), and on an abstract UNIX-domain socket
 * for peers on the same host, and publishes "host:port nonce hostid unixname" as its entry in the
 * store (peer_rendezvous.h: the steps every transport's set-up shares). Then it connects to every
 * higher rank (the deterministic rule: lower connects to higher, so each pair has exactly one
 * connection; over the UNIX socket when the host ids match, else TCP) and sends a hello;
 * meanwhile it accepts the lower ranks' connections, checks their hellos and answers each with an
 * accept or a refusal, and reads the answers to its own hellos, all in the rendezvous' poll loop,
 * bounded by the group's timeout. With a job secret (TDIST_AUTH_TOKEN) each hello and each accept
 * proves it holds the secret without sending it (peer_rendezvous.h), so both ends of every
 * connection know the other belongs to the job. The handshake is in docs/protocols.md, "tcp
 * transport".
 * Sockets then go to the progress engine (tcp_transport_from_fds in tcp.c). */
#include "transport/tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "net/addr.h"
#include "net/io.h"
#include "net/socket.h"
#include "transport/peer_rendezvous.h"
#include "transport/samehost.h"
#include "transport/tcp_proto.h"
#include "transport/wire.h"

/* ---- the bind address ------------------------------------------------------------------------- */

/* The first address of interface `name`: IPv4 first, else IPv6 (link-local ones with their scope). */
static td_status iface_addr(const char *var, const char *name, char *out, size_t size)
{
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0)
        return error_errno(TD_ERR_IO, "getifaddrs");
    bool found6 = false, exists = false;
    char v6[TD_ADDR_STRLEN] = "";
    bool found4 = false;
    for (struct ifaddrs *i = ifs; i && !found4; i = i->ifa_next) {
        if (strcmp(i->ifa_name, name) != 0)
            continue;
        exists = true;
        if (!i->ifa_addr)
            continue;
        if (i->ifa_addr->sa_family == AF_INET) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)size);
            found4 = true;
        } else if (i->ifa_addr->sa_family == AF_INET6 && !found6) {
            struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)i->ifa_addr;
            char txt[INET6_ADDRSTRLEN];
            inet_ntop(AF_INET6, &a6->sin6_addr, txt, sizeof txt);
            if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr))
                snprintf(v6, sizeof v6, "%s%%%.15s", txt, name); /* interface names fit IFNAMSIZ (16) */
            else
                snprintf(v6, sizeof v6, "%s", txt);
            found6 = true;
        }
    }
    freeifaddrs(ifs);
    if (found4)
        return TD_OK;
    if (found6) {
        snprintf(out, size, "%s", v6);
        return TD_OK;
    }
    if (!exists)
        return error_fmt(TD_ERR_INVALID, "%s names interface '%s', which does not exist", var, name);
    return error_fmt(TD_ERR_INVALID, "%s names interface '%s', which has no IP address", var, name);
}

/* The local address the kernel would use to reach host (a UDP connect sends nothing). */
static bool route_to(const char *host, char *out, size_t size)
{
    td_addr *addrs = NULL;
    size_t n = 0;
    if (net_resolve(host, 9, false, &addrs, &n) != TD_OK || n == 0) {
        free(addrs);
        return false;
    }
    bool ok = false;
    for (size_t i = 0; i < n && !ok; i++) {
        if (addr_is_loopback(&addrs[i])) {
            snprintf(out, size, "%s", addrs[i].ss.ss_family == AF_INET6 ? "::1" : "127.0.0.1");
            ok = true;
            break;
        }
        int fd = socket(addrs[i].ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        td_addr local;
        local.len = sizeof local.ss;
        if (connect(fd, (struct sockaddr *)&addrs[i].ss, addrs[i].len) == 0 &&
            getsockname(fd, (struct sockaddr *)&local.ss, &local.len) == 0) {
            const void *a = local.ss.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&local.ss)->sin6_addr
                                                           : (const void *)&((struct sockaddr_in *)&local.ss)->sin_addr;
            ok = inet_ntop(local.ss.ss_family, a, out, (socklen_t)size) != NULL;
        }
        close(fd);
    }
    free(addrs);
    return ok;
}

static td_status bind_host(const td_tcp_options *o, char *out, size_t size)
{
    if (o->bind_host && *o->bind_host) {
        snprintf(out, size, "%s", o->bind_host);
        return TD_OK;
    }
    /* TDIST_SOCKET_IFNAME, else PyTorch's GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME. */
    char ifname[256];
    const char *var = NULL;
    if (env_socket_ifname(ifname, sizeof ifname, &var))
        return iface_addr(var, ifname, out, size);
    const char *master = env_get_str("MASTER_ADDR", NULL);
    if (master && route_to(master, out, size))
        return TD_OK;
    snprintf(out, size, "127.0.0.1");
    return TD_OK;
}

/* ---- the set-up state ------------------------------------------------------------------------- */

typedef struct setup {
    td_rdv v;
    const td_tcp_options *o;
    const char *group;
    uint8_t *hello_nonce;     /* per higher rank: the fresh nonce of our hello (AUTH_NONCE_LEN bytes) */
    uint64_t *peer_nonce;     /* per higher rank: the nonce it published, which our hello answered */
    bool use_unix;            /* UNIX-domain sockets to peers on this host */
    bool use_cma;             /* and single-copy transfers over them (process_vm_readv) */
    bool *asked_cma;          /* per higher rank: our hello offered them */
    bool *agreed_cma;         /* per rank: both sides offered them on a UNIX socket */
    td_tcp_peer_info *info;
    char host_id[160];        /* boot id and network namespace: equal means "same host" */
    char unix_name[64];       /* this rank's abstract UNIX socket name, "-" when none */
} setup;

static int grank_of(const setup *s, int r) { return rdv_grank(&s->v, r); }

#define HELLO_LABEL "tdist tcp hello"
#define ACCEPT_LABEL "tdist tcp accept"

/* Our hello to rank `to`, whose published nonce is `nonce`, with a fresh nonce of ours and the
 * proof over all of it (zeros without a secret). */
static size_t hello_encode(setup *s, int to, uint64_t nonce, bool cma, uint8_t *b)
{
    uint8_t *mine = s->hello_nonce + (size_t)to * AUTH_NONCE_LEN;
    auth_nonce(mine);
    td_tcp_hello h = {
        .version = TD_TCP_VERSION,
        .flags = (uint16_t)((cma ? TD_TCP_FLAG_CMA : 0) | (s->v.auth.on ? TD_TCP_FLAG_AUTH : 0)),
        .from = (uint32_t)s->v.rank,
        .to = (uint32_t)to,
        .world = (uint32_t)s->v.size,
        .nonce = nonce,
        .group = s->group,
        .group_len = (uint32_t)strlen(s->group),
    };
    memcpy(h.conn_nonce, mine, AUTH_NONCE_LEN);
    size_t len = tcp_hello_encode(b, &h);
    auth_part part = {b, len - AUTH_MAC_LEN};
    rdv_auth_prove(&s->v, HELLO_LABEL, &part, 1, b + len - AUTH_MAC_LEN);
    return len;
}

/* The accept's proof: the connector's fresh nonce (its challenge), and who answers it in which
 * group (the listener's rank and published nonce). */
static void accept_parts(const uint8_t *conn_nonce, int rank, uint64_t nonce, uint8_t rank_bytes[4],
                         uint8_t nonce_bytes[8], auth_part parts[3])
{
    wire_put32(rank_bytes, (uint32_t)rank);
    wire_put64(nonce_bytes, nonce);
    parts[0] = (auth_part){conn_nonce, AUTH_NONCE_LEN};
    parts[1] = (auth_part){rank_bytes, 4};
    parts[2] = (auth_part){nonce_bytes, 8};
}

/* Whether fd is a UNIX-domain socket (a peer on this host). */
static bool fd_is_unix(int fd)
{
    int domain = 0;
    socklen_t len = sizeof domain;
    return getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && domain == AF_UNIX;
}

/* ---- connecting to the higher ranks ----------------------------------------------------------- */

static td_status read_address(setup *s, int r, char **host, int *port, uint64_t *nonce, char *unix_name,
                              size_t unix_size)
{
    char text[513];
    TD_TRY(rdv_read(&s->v, r, "tcp address", text, sizeof text));
    td_tcp_entry e;
    TD_TRY(tcp_entry_parse(text, grank_of(s, r), &e));
    *nonce = e.nonce;
    /* Same host: offer its UNIX socket (the caller falls back to TCP if it does not answer). */
    bool local = s->use_unix && s->host_id[0] && strcmp(e.host_id, s->host_id) == 0 && strcmp(e.unix_name, "-") != 0;
    snprintf(unix_name, unix_size, "%s", local ? e.unix_name : "");
    *host = e.host; /* the caller frees it */
    *port = e.port;
    return TD_OK;
}

/* A connection to a peer's UNIX socket, non-blocking, or -1. */
static int unix_connect(const char *name)
{
    int fd = samehost_unix_connect(name);
    if (fd >= 0 && net_set_nonblocking(fd, true) != TD_OK) {
        close(fd);
        return -1;
    }
    return fd;
}

static td_status connect_up(setup *s, int r)
{
    uint8_t *hello = alloc_or_die(TD_TCP_HELLO_FIXED + strlen(s->group) + TD_TCP_HELLO_TAIL);
    td_status st;
    for (;;) {
        char *host = NULL;
        int port = 0;
        uint64_t nonce = 0;
        char uname[64];
        st = read_address(s, r, &host, &port, &nonce, uname, sizeof uname);
        if (st != TD_OK)
            break;
        int fd = uname[0] ? unix_connect(uname) : -1;
        if (fd >= 0) {
            free(host);
        } else {
            /* A short connect deadline, then the address is read again: a key left by an earlier
             * group of the same name may point at a port nobody listens on any more. */
            int64_t dl = clock_now_ns() + 2000000000LL;
            if (dl > s->v.deadline)
                dl = s->v.deadline;
            st = net_connect(host, port, dl, &fd);
            free(host);
        }
        if (st == TD_ERR_TIMEOUT && !deadline_passed(s->v.deadline))
            continue;
        if (st != TD_OK) {
            error_prefix(st, "connecting to rank %d", grank_of(s, r));
            break;
        }
        bool unix_sock = uname[0] && fd_is_unix(fd);
        s->asked_cma[r] = s->use_cma && unix_sock;
        s->peer_nonce[r] = nonce;
        size_t len = hello_encode(s, r, nonce, s->asked_cma[r], hello);
        st = net_send_all(fd, hello, len, s->v.deadline);
        if (st != TD_OK) {
            close(fd);
            error_prefix(st, "sending the hello to rank %d", grank_of(s, r));
            break;
        }
        rdv_await(&s->v, r, fd);
        break;
    }
    free(hello);
    return st;
}

/* ---- answering the lower ranks ---------------------------------------------------------------- */

static void send_reply(int fd, int rank, int status, unsigned flags, const char *msg, const uint8_t *proof,
                       int64_t deadline)
{
    uint8_t b[TD_TCP_REPLY_MAX];
    size_t len = tcp_reply_encode(b, rank, status, flags, msg, proof);
    /* Short: the peer is waiting for it, and a stuck stray must not stall the set-up. */
    int64_t dl = clock_now_ns() + 1000000000LL;
    net_send_all(fd, b, len, dl < deadline ? dl : deadline);
}

/* A complete hello (or a malformed one): refuse, accept, or wait for more bytes. */
static void check_hello(setup *s, int i)
{
    td_rdv_conn *p = &s->v.pend[i];
    td_tcp_hello h;
    size_t need = 0;
    const char *why = NULL;
    td_tcp_parse pr = tcp_hello_parse(p->buf, p->got, &h, &need, &why);
    if (pr == TD_TCP_PARSE_MORE)
        return;
    if (pr == TD_TCP_PARSE_BAD) {
        TD_LOG_WARN("tcp transport of rank %d dropped a connection: %s", grank_of(s, s->v.rank), why);
        rdv_drop(&s->v, i);
        return;
    }
    char msg[TD_TCP_MAX_REPLY_MSG];
    msg[0] = '\0';
    int rank = s->v.rank, size = s->v.size;
    /* The proof covers every byte of the hello before it, the nonce this rank published included:
     * it counts only together with the check of that nonce below (stale address). Nothing about
     * this rank but its version reaches a connector before the proof passed. */
    auth_part signed_part = {p->buf, need - AUTH_MAC_LEN};
    if (h.version != TD_TCP_VERSION)
        snprintf(msg, sizeof msg, "rank %d speaks tcp transport protocol version %d, the connecting side %u",
                 grank_of(s, rank), TD_TCP_VERSION, h.version);
    else if (!rdv_auth_check_hello(&s->v, h.flags & TD_TCP_FLAG_AUTH, HELLO_LABEL, &signed_part, 1, h.proof, msg,
                                   sizeof msg))
        ; /* msg says why */
    else if (h.world != (uint32_t)size || h.group_len != strlen(s->group) ||
             memcmp(h.group, s->group, h.group_len) != 0)
        snprintf(msg, sizeof msg,
                 "group mismatch: the connecting rank is in group '%.*s' of %u ranks, rank %d in group '%s' of %d",
                 (int)(h.group_len < 200 ? h.group_len : 200), h.group, h.world, grank_of(s, rank), s->group, size);
    else if (h.to != (uint32_t)rank || h.nonce != s->v.nonce)
        snprintf(msg, sizeof msg, "the connection reached a different rank or an earlier group (stale address)");
    else if (h.from >= (uint32_t)rank)
        snprintf(msg, sizeof msg, "rank %u must not connect to rank %d (lower ranks connect to higher ones)", h.from,
                 rank);
    else if (s->v.fds[h.from] >= 0)
        snprintf(msg, sizeof msg, "rank %u is already connected", h.from);
    int fd = p->fd;
    unsigned auth_flag = s->v.auth.on ? TD_TCP_FLAG_AUTH : 0;
    if (msg[0]) {
        TD_LOG_WARN("tcp transport of rank %d refused a connection: %s", grank_of(s, rank), msg);
        snprintf(s->v.last_refusal, sizeof s->v.last_refusal, "%s", msg);
        send_reply(fd, rank, TD_TCP_REPLY_REFUSED, auth_flag, msg, NULL, s->v.deadline);
        rdv_drop(&s->v, i);
        return;
    }
    bool cma = (h.flags & TD_TCP_FLAG_CMA) && s->use_cma && fd_is_unix(fd);
    uint8_t proof[AUTH_MAC_LEN], rank_bytes[4], nonce_bytes[8];
    auth_part parts[3];
    accept_parts(h.conn_nonce, rank, s->v.nonce, rank_bytes, nonce_bytes, parts);
    rdv_auth_prove(&s->v, ACCEPT_LABEL, parts, 3, proof);
    send_reply(fd, rank, TD_TCP_REPLY_OK, (cma ? TD_TCP_FLAG_CMA : 0) | auth_flag, NULL, proof, s->v.deadline);
    s->agreed_cma[h.from] = cma;
    rdv_take(&s->v, i, (int)h.from);
}

/* Reads an accepted connection's hello bytes (no more than the hello needs: what follows belongs
 * to the progress engine). */
static void read_pending(td_rdv *v, int i)
{
    setup *s = v->arg;
    td_rdv_conn *p = &v->pend[i];
    td_tcp_hello h;
    size_t want = TD_TCP_HELLO_FIXED;
    const char *why;
    if (tcp_hello_parse(p->buf, p->got, &h, &want, &why) != TD_TCP_PARSE_MORE) {
        check_hello(s, i);
        return;
    }
    ssize_t n = recv(p->fd, p->buf + p->got, want - p->got, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        rdv_drop(v, i);
        return;
    }
    if (n > 0)
        p->got += (size_t)n;
    check_hello(s, i);
}

/* Reads the answer to our hello from rank r (again no more than it). */
static td_status read_reply(td_rdv *v, int r)
{
    setup *s = v->arg;
    td_rdv_conn *c = &v->out[r];
    for (;;) {
        td_tcp_reply rep;
        size_t want = TD_TCP_REPLY_FIXED;
        const char *why = NULL;
        td_tcp_parse pr = tcp_reply_parse(c->buf, c->got, &rep, &want, &why);
        if (pr == TD_TCP_PARSE_BAD)
            return error_fmt(TD_ERR_INVALID, "rank %d answered the tcp transport hello: %s", grank_of(s, r), why);
        if (pr == TD_TCP_PARSE_OK) {
            bool claims = rep.flags & TD_TCP_FLAG_AUTH;
            /* A refusal of this version from a rank without a secret, to a hello with a proof, was
             * for that (the listener checks the proof first): say it from this side. */
            if (rep.status != TD_TCP_REPLY_OK && rep.version == TD_TCP_VERSION)
                TD_TRY(rdv_auth_check_answer(v, r, claims, ACCEPT_LABEL, NULL, 0, NULL));
            if (rep.status != TD_TCP_REPLY_OK)
                return error_fmt(TD_ERR_INVALID, "rank %d refused the connection from rank %d: %.*s", grank_of(s, r),
                                grank_of(s, v->rank), (int)rep.msg_len, rep.msg);
            if (rep.version != TD_TCP_VERSION)
                return error_fmt(TD_ERR_INVALID, "rank %d speaks tcp transport protocol version %u, rank %d %d",
                                 grank_of(s, r), rep.version, grank_of(s, v->rank), TD_TCP_VERSION);
            uint8_t rank_bytes[4], nonce_bytes[8];
            auth_part parts[3];
            accept_parts(s->hello_nonce + (size_t)r * AUTH_NONCE_LEN, r, s->peer_nonce[r], rank_bytes, nonce_bytes,
                         parts);
            TD_TRY(rdv_auth_check_answer(v, r, claims, ACCEPT_LABEL, parts, 3, rep.proof));
            s->agreed_cma[r] = s->asked_cma[r] && (rep.flags & TD_TCP_FLAG_CMA);
            rdv_answered(v, r);
            return TD_OK;
        }
        ssize_t n = recv(c->fd, c->buf + c->got, want - c->got, MSG_DONTWAIT);
        if (n == 0)
            return error_fmt(TD_ERR_PEER_LOST, "rank %d closed the connection during the tcp transport handshake",
                            grank_of(s, r));
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return TD_OK;
            return error_errno(TD_ERR_PEER_LOST, "reading rank %d's handshake answer", grank_of(s, r));
        }
        c->got += (size_t)n;
    }
}

/* ---- single-copy probe ------------------------------------------------------------------------
 * On each connection that agreed to single-copy transfers, both sides check that they can really
 * read each other's memory (same user, no ptrace restriction, no seccomp filter in the way): each
 * sends the address and value of a word of its own, reads the peer's word with process_vm_readv,
 * and answers whether it got the value. A direction that fails falls back to the stream. */

static td_status cma_probe(setup *s)
{
    uint64_t word = s->v.nonce ^ UINT64_C(0x9e3779b97f4a7c15);
    for (int r = 0; r < s->v.size; r++) {
        if (!s->agreed_cma[r])
            continue;
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(s->v.fds[r], SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
            s->info[r].pid = cred.pid;
        uint8_t m[TD_TCP_CMA_PROBE_SIZE];
        wire_put64(m, TD_TCP_CMA_PROBE_MAGIC);
        wire_put64(m + 8, (uint64_t)(uintptr_t)&word);
        wire_put64(m + 16, word);
        TD_TRY(net_send_all(s->v.fds[r], m, sizeof m, s->v.deadline));
    }
    for (int r = 0; r < s->v.size; r++) {
        if (!s->agreed_cma[r])
            continue;
        uint8_t m[TD_TCP_CMA_PROBE_SIZE];
        td_status st = net_recv_all(s->v.fds[r], m, sizeof m, s->v.deadline);
        if (st != TD_OK)
            return error_prefix(st, "reading rank %d's single-copy probe", rdv_grank(&s->v, r));
        uint64_t addr, value;
        bool ok = tcp_probe_parse(m, &addr, &value) && s->info[r].pid > 0 && samehost_word_is(s->info[r].pid, addr, value);
        if (!ok)
            TD_LOG_DEBUG("tcp transport of rank %d cannot read rank %d's memory (%s): messages go by the socket",
                         rdv_grank(&s->v, s->v.rank), rdv_grank(&s->v, r), strerror(errno));
        s->info[r].cma_recv = ok;
        uint8_t answer = ok;
        TD_TRY(net_send_all(s->v.fds[r], &answer, 1, s->v.deadline));
    }
    for (int r = 0; r < s->v.size; r++) {
        if (!s->agreed_cma[r])
            continue;
        uint8_t answer = 0;
        td_status st = net_recv_all(s->v.fds[r], &answer, 1, s->v.deadline);
        if (st != TD_OK)
            return error_prefix(st, "reading rank %d's single-copy probe answer", rdv_grank(&s->v, r));
        s->info[r].cma_send = answer == 1;
    }
    return TD_OK;
}

/* ---- tuning ----------------------------------------------------------------------------------- */

static td_status tune_socket(int fd, int64_t bufsize)
{
    TD_TRY(net_set_nonblocking(fd, true));
    int domain = 0;
    socklen_t dlen = sizeof domain;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &dlen) == 0 && domain != AF_UNIX)
        TD_TRY(net_set_nodelay(fd));
    if (bufsize > 0) {
        int v = (int)bufsize;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
    }
    return TD_OK;
}

/* ---- create ----------------------------------------------------------------------------------- */

/* Listens (TCP at the bind address, and UNIX-domain when peers on this host may use it) and
 * publishes this rank's entry. */
static td_status listen_and_publish(setup *s, int *lfd, int *ufd)
{
    const td_tcp_options *o = s->o;
    int rank = o->setup.rank;
    if (s->use_unix) {
        host_identity(s->host_id, sizeof s->host_id);
        char name[64];
        snprintf(name, sizeof name, "tdist-tcp-%d-%llx", (int)getpid(), (unsigned long long)s->v.nonce);
        if (s->host_id[0] && (*ufd = samehost_unix_listen(name, o->setup.size + 16)) >= 0)
            snprintf(s->unix_name, sizeof s->unix_name, "%s", name);
    }
    if (!s->host_id[0])
        snprintf(s->host_id, sizeof s->host_id, "-");
    TD_TRY(rdv_generation(&s->v));
    char host[TD_ADDR_STRLEN];
    TD_TRY(bind_host(o, host, sizeof host));
    int port = 0;
    td_status st = net_listen(host, 0, o->setup.size + 16, lfd, &port);
    if (st != TD_OK)
        return error_prefix(st, "tcp transport of rank %d", grank_of(s, rank));
    char hp[TD_ADDR_STRLEN + 32];
    net_format_hostport(host, port, hp, sizeof hp);
    char val[TD_ADDR_STRLEN + 320];
    snprintf(val, sizeof val, "%s %llx %s %s", hp, (unsigned long long)s->v.nonce, s->host_id, s->unix_name);
    TD_TRY(rdv_publish(&s->v, val, "tcp address"));
    TD_LOG_DEBUG("tcp transport of rank %d listening on %s", grank_of(s, rank), hp);
    return TD_OK;
}

td_status tcp_transport_create(const td_tcp_options *o, td_transport **out)
{
    *out = NULL;
    const td_transport_setup *g = &o->setup;
    if (g->size < 1 || g->rank < 0 || g->rank >= g->size)
        return error_fmt(TD_ERR_INVALID, "invalid rank %d for a group of %d", g->rank, g->size);
    int64_t bufsize = 0;
    TD_TRY(env_get_int("TDIST_TCP_BUFFER", 0, 0, INT32_MAX, &bufsize));
    setup s = {0};
    s.o = o;
    s.group = g->group_name ? g->group_name : "";
    if (strlen(s.group) > TD_TCP_MAX_GROUP_NAME)
        return error_fmt(TD_ERR_INVALID, "group name is longer than %d bytes", TD_TCP_MAX_GROUP_NAME);
    auth_key key;
    TD_TRY(auth_key_init(NULL, &key)); /* also in a world of one: a bad secret fails every rank alike */
    if (g->size == 1) {
        explicit_bzero(&key, sizeof key);
        int none = -1;
        return tcp_transport_from_fds(g->rank, 1, &none, g->global_ranks, out);
    }
    bool unix_env = true, cma_env = true;
    TD_TRY(env_get_bool("TDIST_TCP_UNIX", true, &unix_env));
    TD_TRY(env_get_bool("TDIST_TCP_CMA", true, &cma_env));
    s.use_unix = o->same_host == TD_TCP_SAME_HOST_UNIX || (o->same_host == TD_TCP_SAME_HOST_DEFAULT && unix_env);
    s.use_cma = s.use_unix && (o->cma == TD_TCP_CMA_ON || (o->cma == TD_TCP_CMA_DEFAULT && cma_env));
    rdv_init(&s.v, g, "tcp transport", "tcp/", TD_TCP_REPLY_MAX, TD_TCP_HELLO_MAX, &key);
    explicit_bzero(&key, sizeof key);
    s.v.arg = &s;
    s.v.on_answer = read_reply;
    s.v.on_pending = read_pending;
    s.asked_cma = TD_NEW_ARRAY(bool, (size_t)g->size);
    s.agreed_cma = TD_NEW_ARRAY(bool, (size_t)g->size);
    s.info = TD_NEW_ARRAY(td_tcp_peer_info, (size_t)g->size);
    s.hello_nonce = alloc_zeroed((size_t)g->size, AUTH_NONCE_LEN);
    s.peer_nonce = TD_NEW_ARRAY(uint64_t, (size_t)g->size);
    snprintf(s.unix_name, sizeof s.unix_name, "-");

    int listen_fds[2] = {-1, -1}; /* TCP, UNIX-domain */
    td_status st = listen_and_publish(&s, &listen_fds[0], &listen_fds[1]);
    for (int r = g->rank + 1; r < g->size && st == TD_OK; r++)
        st = connect_up(&s, r);
    if (st == TD_OK)
        st = rdv_handshake(&s.v, listen_fds, 2);
    if (st == TD_OK)
        st = cma_probe(&s);
    if (st == TD_ERR_TIMEOUT && !strstr(td_last_error(), "setting up the tcp transport"))
        error_prefix(st, "Timed out after %lld ms setting up the tcp transport of rank %d",
                        (long long)g->timeout_ms, grank_of(&s, g->rank));
    for (int r = 0; r < g->size && st == TD_OK; r++)
        if (r != g->rank)
            st = tune_socket(s.v.fds[r], bufsize);

    for (int l = 0; l < 2; l++)
        if (listen_fds[l] >= 0)
            close(listen_fds[l]);
    free(s.asked_cma);
    free(s.agreed_cma);
    free(s.hello_nonce);
    free(s.peer_nonce);
    bool handed = st == TD_OK; /* the engine takes the sockets, also when it fails */
    if (handed)
        st = tcp_transport_from_fds_ex(g->rank, g->size, s.v.fds, g->global_ranks, s.info, out);
    rdv_free(&s.v, handed);
    free(s.info);
    return st;
}
