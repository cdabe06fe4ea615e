/* The TCPStore server's event loop (tcp_server.h): one thread, one epoll set, level-triggered.
 *
 * Each readable connection gets one receive per wake-up (at least 64 KiB, or the rest of a large
 * request at once), so a thousand clients are served fairly; the core (tcp_core.c) turns the bytes
 * into answers, which are sent at once and, if the socket is full, when it drains (EPOLLOUT). A
 * connection that is not reading its answers stops being read (backpressure). A malformed,
 * oversize or unknown request closes that one connection with a logged reason; every other client
 * keeps being served. Closes are deferred to the end of each batch of events, since answering one
 * connection can fail another that appears later in the same batch. */
#include "store/tcp_server.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"
#include "base/vec.h"
#include "net/addr.h"
#include "net/io.h"
#include "net/socket.h"
#include "store/tcp_core.h"

#define READ_CHUNK ((size_t)64 << 10)
#define MAX_EVENTS 256

static char listen_tag, local_tag, wake_tag;

#define DEFAULT_HANDSHAKE_MS 5000
#define DEFAULT_MAX_PENDING 1024
/* Log lines for timed-out or evicted handshakes per second, beyond which they are counted only. */
#define HANDSHAKE_LOGS_PER_S 20

typedef struct srv_conn {
    int fd;
    uint32_t events;
    bool dead;
    bool pending;  /* on the pending list: handshake not done yet */
    bool spoke;    /* a byte has been read from it */
    int64_t deadline_ms; /* for the handshake */
    struct srv_conn *prev, *next; /* the pending list, oldest first */
    td_store_conn *core;
    char peer[TD_ADDR_STRLEN];
} srv_conn;

struct td_store_server {
    int listen_fd, local_fd, epoll_fd, wake_fd, reserve_fd;
    int port;
    char address[TD_ADDR_STRLEN];
    td_store_core *core;
    pthread_t thread;
    td_net_spin spin;
    TD_VEC(srv_conn *) to_close;
    int64_t last_emfile_log;
    /* Connections that have not finished the handshake, in accept order (so deadlines ascend). */
    srv_conn *pending_head, *pending_tail;
    size_t n_pending, max_pending;
    int64_t handshake_ms;
    int64_t hs_log_window;
    unsigned hs_logs, hs_unlogged;
    _Atomic uint64_t st_pending;
    _Atomic uint64_t st_connections, st_accepted, st_accepted_local, st_dropped, st_keys, st_parked;
};

static void set_events(td_store_server *s, srv_conn *c, uint32_t events)
{
    if (c->dead || c->events == events)
        return;
    struct epoll_event ev = {.events = events, .data.ptr = c};
    if (epoll_ctl(s->epoll_fd, EPOLL_CTL_MOD, c->fd, &ev) == 0)
        c->events = events;
}

static void pending_unlink(td_store_server *s, srv_conn *c)
{
    if (!c->pending)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->pending_head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        s->pending_tail = c->prev;
    c->prev = c->next = NULL;
    c->pending = false;
    s->n_pending--;
}

static void kill_conn(td_store_server *s, srv_conn *c, bool bad, const char *why)
{
    if (c->dead)
        return;
    pending_unlink(s, c);
    if (bad) {
        TD_LOG_WARN("TCPStore server %s: closing the connection from %s: %s", s->address, c->peer, why);
        atomic_fetch_add(&s->st_dropped, 1);
    } else {
        TD_LOG_DEBUG("TCPStore server %s: connection from %s closed: %s", s->address, c->peer, why);
    }
    c->dead = true;
    epoll_ctl(s->epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
    /* The descriptor goes now (an accept may need it); the state at the end of the batch. */
    close(c->fd);
    c->fd = -1;
    TD_VEC_PUSH(&s->to_close, c);
}

/* Closes a connection that did not finish the handshake, logging at most HANDSHAKE_LOGS_PER_S such
 * lines a second (a flood of idle connections must not flood the log too). */
static void kill_handshake(td_store_server *s, srv_conn *c, const char *why)
{
    int64_t now = clock_now_ms();
    if (now - s->hs_log_window >= 1000) {
        if (s->hs_unlogged)
            TD_LOG_WARN("TCPStore server %s: %u more connections closed without a handshake in the last second",
                        s->address, s->hs_unlogged);
        s->hs_log_window = now;
        s->hs_logs = s->hs_unlogged = 0;
    }
    if (s->hs_logs < HANDSHAKE_LOGS_PER_S) {
        s->hs_logs++;
        kill_conn(s, c, true, why);
        return;
    }
    s->hs_unlogged++;
    atomic_fetch_add(&s->st_dropped, 1);
    kill_conn(s, c, false, why);
}

#define EVICT_SCAN 256 /* pending connections looked at for a silent one */

/* Whether c has sent anything: bytes read already, or bytes waiting in its socket. */
static bool conn_spoke(const srv_conn *c)
{
    int unread = 0;
    return c->spoke || (ioctl(c->fd, FIONREAD, &unread) == 0 && unread > 0);
}

/* Makes room by closing a connection without a handshake: the oldest that has sent nothing (a
 * flood's idle connections), else the oldest. A client in the middle of its handshake - accepted
 * from the local listener ahead of a TCP flood, say - goes last. */
static void evict_oldest_pending(td_store_server *s, const char *why)
{
    srv_conn *victim = s->pending_head;
    int looked = 0;
    for (srv_conn *c = s->pending_head; c && looked < EVICT_SCAN; c = c->next, looked++)
        if (!conn_spoke(c)) {
            victim = c;
            break;
        }
    if (victim)
        kill_handshake(s, victim, why);
}

/* Closes the connections whose handshake deadline passed; returns the ms until the next one
 * (-1: none pending). */
static int expire_handshakes(td_store_server *s)
{
    if (!s->pending_head)
        return -1; /* no clock read per batch when every connection is past the handshake */
    int64_t now = clock_now_ms();
    while (s->pending_head && s->pending_head->deadline_ms <= now) {
        char why[160];
        snprintf(why, sizeof why, "no handshake within %lld ms of connecting (TDIST_STORE_HANDSHAKE_TIMEOUT)",
                 (long long)s->handshake_ms);
        kill_handshake(s, s->pending_head, why);
    }
    if (!s->pending_head)
        return -1;
    int64_t left = s->pending_head->deadline_ms - now;
    return left > 60000 ? 60000 : (int)left + 1;
}

static void reap_closed(td_store_server *s)
{
    for (size_t i = 0; i < s->to_close.len; i++) {
        srv_conn *c = s->to_close.items[i];
        store_core_detach(s->core, c->core);
        free(c);
        atomic_fetch_sub(&s->st_connections, 1);
    }
    s->to_close.len = 0;
}

static void process_input(td_store_server *s, srv_conn *c);

/* Sends what the connection has pending, then sets its interest: EPOLLOUT while output is left,
 * EPOLLIN unless it is backlogged. */
static void flush(td_store_server *s, srv_conn *c)
{
    if (c->dead)
        return;
    size_t len;
    const uint8_t *p = store_conn_output(c->core, &len);
    while (len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            kill_conn(s, c, false, strerror(errno));
            return;
        }
        store_conn_output_done(c->core, (size_t)n);
        p = store_conn_output(c->core, &len);
    }
    if (len == 0 && store_conn_closing(c->core)) {
        kill_conn(s, c, true, "refused in the handshake (a wrong protocol version, or no proof of the job's secret)");
        return;
    }
    bool was_paused = !(c->events & EPOLLIN);
    bool backlogged = store_conn_backlogged(c->core);
    set_events(s, c, (backlogged ? 0 : EPOLLIN) | (len ? EPOLLOUT : 0));
    /* Input that arrived while paused may hold whole requests already. */
    if (was_paused && !backlogged && store_conn_input(c->core)->len > 0)
        process_input(s, c);
}

static void flush_dirty(td_store_server *s)
{
    td_store_conn *d;
    while ((d = store_core_pop_dirty(s->core)))
        flush(s, store_conn_user(d));
}

static void process_input(td_store_server *s, srv_conn *c)
{
    if (store_core_process(s->core, c->core) != TD_OK)
        kill_conn(s, c, true, td_last_error());
    else if (c->pending && store_conn_authenticated(c->core))
        pending_unlink(s, c);
    flush_dirty(s);
}

static void on_readable(td_store_server *s, srv_conn *c)
{
    td_buf *in = store_conn_input(c->core);
    size_t want = store_conn_input_want(c->core);
    size_t chunk = want > READ_CHUNK ? want : READ_CHUNK;
    /* Before the handshake, no more than a HELLO's or AUTH's worth is ever received (the core judges
     * the header). */
    size_t room = store_conn_preauth_room(c->core);
    if (room == 0) {
        kill_conn(s, c, true, "more than a HELLO's worth of bytes before the handshake");
        return;
    }
    if (chunk > room)
        chunk = room;
    if (buf_try_reserve(in, chunk) != TD_OK) {
        kill_conn(s, c, true, td_last_error());
        return;
    }
    ssize_t n;
    do
        n = recv(c->fd, in->data + in->len, chunk, 0);
    while (n < 0 && errno == EINTR);
    if (n == 0) {
        kill_conn(s, c, false, "closed by the client");
        return;
    }
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            kill_conn(s, c, false, strerror(errno));
        return;
    }
    in->len += (size_t)n;
    c->spoke = true;
    process_input(s, c);
}

static void accept_all(td_store_server *s, int lfd)
{
    for (int i = 0; i < 128; i++) {
        td_addr peer;
        peer.len = sizeof peer.ss;
        int fd = accept4(lfd, (struct sockaddr *)&peer.ss, &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if ((errno == EMFILE || errno == ENFILE) && s->pending_head) {
                /* Out of descriptors: the oldest connection without a handshake makes room. */
                evict_oldest_pending(s, "closed to free a file descriptor (the server is out of them; raise "
                                        "ulimit -n)");
                continue;
            }
            if ((errno == EMFILE || errno == ENFILE) && s->reserve_fd >= 0) {
                /* Out of descriptors: accept and drop one pending client with the spare descriptor,
                 * so that the listener does not stay readable and spin. */
                int64_t now = clock_now_ms();
                if (now - s->last_emfile_log > 1000) {
                    TD_LOG_ERROR("TCPStore server %s: out of file descriptors; refusing clients (raise the "
                                 "open-files limit, ulimit -n)", s->address);
                    s->last_emfile_log = now;
                }
                close(s->reserve_fd);
                int drop = accept(lfd, NULL, NULL);
                if (drop >= 0)
                    close(drop);
                s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                continue;
            }
            return; /* EAGAIN, or an error the next wake-up will retry */
        }
        srv_conn *c = TD_NEW(srv_conn);
        c->fd = fd;
        addr_str(&peer, c->peer, sizeof c->peer);
        if (peer.ss.ss_family == AF_INET || peer.ss.ss_family == AF_INET6) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        c->events = EPOLLIN;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            TD_LOG_WARN("TCPStore server %s: epoll_ctl: %s", s->address, strerror(errno));
            close(fd);
            free(c);
            continue;
        }
        c->core = store_core_attach(s->core, c);
        /* Until the handshake is done: on the pending list, with a deadline; over the cap, the oldest goes. */
        c->pending = true;
        c->deadline_ms = clock_now_ms() + s->handshake_ms;
        c->prev = s->pending_tail;
        if (s->pending_tail)
            s->pending_tail->next = c;
        else
            s->pending_head = c;
        s->pending_tail = c;
        s->n_pending++;
        if (s->n_pending > s->max_pending) {
            char why[200];
            snprintf(why, sizeof why, "closed to make room: over %zu connections without a handshake "
                     "(TDIST_STORE_MAX_PENDING)", s->max_pending);
            evict_oldest_pending(s, why);
        }
        atomic_fetch_add(&s->st_connections, 1);
        atomic_fetch_add(&s->st_accepted, 1);
        if (lfd == s->local_fd)
            atomic_fetch_add(&s->st_accepted_local, 1);
    }
}

static void *server_main(void *arg)
{
    td_store_server *s = arg;
    struct epoll_event events[MAX_EVENTS];
    bool spinning = false; /* the last batch was followed by a spin that has not ended */
    int64_t spin_until = 0;
    for (bool stop = false; !stop;) {
        int until_expiry = expire_handshakes(s);
        reap_closed(s);
        atomic_store(&s->st_pending, s->n_pending);
        int timeout = spinning ? 0 : until_expiry;
        int n = epoll_wait(s->epoll_fd, events, MAX_EVENTS, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            TD_LOG_ERROR("TCPStore server %s: epoll_wait: %s; stopping", s->address, strerror(errno));
            break;
        }
        if (spinning) {
            if (n == 0 && clock_now_ns() < spin_until)
                continue;
            net_spin_result(&s->spin, n > 0);
            spinning = false;
            if (n == 0)
                continue;
        }
        for (int i = 0; i < n; i++) {
            void *tag = events[i].data.ptr;
            if (tag == &wake_tag) {
                stop = true;
                continue;
            }
            if (tag == &listen_tag || tag == &local_tag) {
                accept_all(s, tag == &listen_tag ? s->listen_fd : s->local_fd);
                continue;
            }
            srv_conn *c = tag;
            if (c->dead)
                continue;
            uint32_t ev = events[i].events;
            if (ev & EPOLLOUT)
                flush(s, c);
            if (!c->dead && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                on_readable(s, c);
        }
        reap_closed(s);
        /* After a batch, a client usually sends its next request within microseconds. */
        if (n > 0 && net_spin_now(&s->spin)) {
            spinning = true;
            spin_until = clock_now_ns() + s->spin.budget_ns;
        }
        atomic_store(&s->st_keys, store_core_num_keys(s->core));
        atomic_store(&s->st_parked, store_core_num_parked(s->core));
        atomic_store(&s->st_pending, s->n_pending);
    }
    return NULL;
}

static void close_all(td_store_server *s)
{
    reap_closed(s);
    while (store_core_num_conns(s->core) > 0) {
        td_store_conn *cc = store_core_conn(s->core, 0);
        srv_conn *c = store_conn_user(cc);
        store_core_detach(s->core, cc);
        if (c->fd >= 0)
            close(c->fd);
        free(c);
    }
}

static void free_server(td_store_server *s)
{
    close_all(s);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->local_fd >= 0)
        close(s->local_fd);
    if (s->epoll_fd >= 0)
        close(s->epoll_fd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    if (s->reserve_fd >= 0)
        close(s->reserve_fd);
    store_core_free(s->core);
    TD_VEC_FREE(&s->to_close);
    free(s);
}

td_status store_server_start(const td_store_server_options *o, td_store_server **out)
{
    *out = NULL;
    td_store_limits lim;
    TD_TRY(store_limits_resolve(o->max_key_len, o->max_value_len, &lim));
    int64_t spin = 0;
    TD_TRY(env_get_int("TDIST_STORE_SPIN_US", TD_STORE_DEFAULT_SPIN_US, 0, 1000000, &spin));
    bool same_host = true;
    TD_TRY(env_get_bool("TDIST_STORE_UNIX", true, &same_host));
    uint64_t max_reply = o->max_reply_len;
    if (max_reply == 0) {
        const char *e = env_get_str("TDIST_STORE_MAX_REPLY", NULL);
        if (e)
            TD_TRY(env_parse_size("TDIST_STORE_MAX_REPLY", e, &max_reply));
    }
    int64_t handshake_ms = o->handshake_timeout_ms;
    if (handshake_ms <= 0)
        TD_TRY(env_get_duration_ms("TDIST_STORE_HANDSHAKE_TIMEOUT", DEFAULT_HANDSHAKE_MS, 1000, &handshake_ms));
    if (handshake_ms <= 0)
        handshake_ms = DEFAULT_HANDSHAKE_MS;
    int64_t max_pending = o->max_pending;
    if (max_pending <= 0)
        TD_TRY(env_get_int("TDIST_STORE_MAX_PENDING", DEFAULT_MAX_PENDING, 1, INT32_MAX, &max_pending));
    /* A reserve: connections without a handshake never hold more than half the descriptors. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (int64_t)(rl.rlim_cur / 2) < max_pending)
        max_pending = rl.rlim_cur / 2 > 8 ? (int64_t)(rl.rlim_cur / 2) : 8;
    auth_key key;
    TD_TRY(auth_key_init(o->auth_token, &key));
    td_store_server *s = TD_NEW(td_store_server);
    s->handshake_ms = handshake_ms;
    s->max_pending = (size_t)max_pending;
    s->listen_fd = s->local_fd = s->epoll_fd = s->wake_fd = s->reserve_fd = -1;
    net_spin_init(&s->spin, spin * 1000);
    s->core = store_core_new(&lim, &key);
    if (max_reply)
        store_core_set_max_reply(s->core, max_reply);
    td_status st = net_listen(o->host, o->port, 0, &s->listen_fd, &s->port);
    if (st != TD_OK) {
        free_server(s);
        return error_prefix(st, "TCPStore server");
    }
    td_addr local;
    if (net_local_addr(s->listen_fd, &local) == TD_OK)
        addr_str(&local, s->address, sizeof s->address);
    s->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (s->epoll_fd < 0 || s->wake_fd < 0) {
        st = error_errno(TD_ERR_IO, "TCPStore server: epoll_create1/eventfd");
        free_server(s);
        return st;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_tag};
    struct epoll_event wev = {.events = EPOLLIN, .data.ptr = &wake_tag};
    if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->listen_fd, &ev) != 0 ||
        epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->wake_fd, &wev) != 0) {
        st = error_errno(TD_ERR_IO, "TCPStore server: epoll_ctl");
        free_server(s);
        return st;
    }
    if (same_host) {
        /* Same-host clients skip the TCP stack (net/socket.h); without it they still use TCP. */
        if (net_listen_local(s->listen_fd, "tdist-store", &s->local_fd) == TD_OK) {
            struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &local_tag};
            if (epoll_ctl(s->epoll_fd, EPOLL_CTL_ADD, s->local_fd, &lev) != 0) {
                close(s->local_fd);
                s->local_fd = -1;
            }
        } else {
            TD_LOG_DEBUG("TCPStore server %s: no same-host socket: %s", s->address, td_last_error());
        }
    }
    st = thread_start(&s->thread, "td-store-srv", server_main, s);
    if (st != TD_OK) {
        free_server(s);
        return st;
    }
    TD_LOG_INFO("TCPStore server listening on %s", s->address);
    *out = s;
    return TD_OK;
}

void store_server_stop(td_store_server *s)
{
    if (!s)
        return;
    uint64_t one = 1;
    ssize_t rc;
    do
        rc = write(s->wake_fd, &one, sizeof one);
    while (rc < 0 && errno == EINTR);
    thread_join(s->thread);
    /* The thread is gone: free_server closes every client socket it still had. */
    free_server(s);
}

int store_server_port(const td_store_server *s) { return s->port; }
const char *store_server_address(const td_store_server *s) { return s->address; }

void store_server_get_stats(const td_store_server *s, td_store_server_stats *st)
{
    st->connections = atomic_load(&s->st_connections);
    st->accepted = atomic_load(&s->st_accepted);
    st->accepted_local = atomic_load(&s->st_accepted_local);
    st->dropped = atomic_load(&s->st_dropped);
    st->keys = atomic_load(&s->st_keys);
    st->parked = atomic_load(&s->st_parked);
    st->pending = atomic_load(&s->st_pending);
}
