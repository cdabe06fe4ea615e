/* The RPC agent's channels and its I/O thread (agent_impl.h).
 *
 * A channel is one byte stream between two workers carrying RPC messages (rpc/message.h: a fixed
 * header, then the payload). Workers on one host connect over the same-host layer's abstract
 * UNIX-domain sockets (transport/samehost.h), others over TCP with TCP_NODELAY (net/); tcp_only
 * forces TCP. Each agent listens on both, and the lower id of each pair connects to the higher and
 * sends a hello first: a CONTROL header carrying its id and the nonce the listener published in
 * the store, so a connection that did not come through this world's store is refused, and a
 * payload proving the job's secret (TDIST_AUTH_TOKEN, net/auth.h) without sending it: an HMAC over
 * both ids, the listener's nonce (its challenge, fresh for each agent) and a nonce the connector
 * draws for this connection. The store entry alone (readable to more processes than hold the
 * secret: an abstract socket's name shows in /proc/net/unix) is no longer enough to connect. The
 * listener reads no more than a hello's bytes until the hello checked, then answers it: admitted,
 * with its own proof over the connector's nonce (so the connector knows it reached a holder of the
 * secret too), or why not, and closes. The connector waits for that answer before it uses the
 * channel, so a worker whose secret differs fails its init with the reason instead of a timeout.
 * The answer is a few bytes on a fresh connection whose peer sent nothing else and waits for them,
 * which a non-blocking send always takes whole.
 *
 * The I/O thread waits in epoll on the listeners, a wake-up eventfd and every channel. It reads
 * what is there without blocking, through the channel's read-ahead stage (so that a header and a
 * small payload take one recv, and a short read tells the socket is empty without another),
 * checks the header (its payload length bounded by the agent's limit before anything is
 * allocated), moves the payload into a fresh storage (the rest of a large one read straight into
 * it) and hands the whole message to rpc_agent_deliver. A channel that reaches
 * EOF or fails is shut down and its peer's calls failed. Sends come from the calling threads, one
 * writev at a time per channel under its send lock; the I/O thread writes only the small messages
 * they handed it ("Handing sends over", below), and never blocks on a slow peer to do it.
 * Self-calls skip the socket but not the wire form (rpc_loopback_send).
 * Before it sleeps in epoll, the I/O thread polls for its spin budget (io_wait).
 *
 * Single copy (agent_impl.h, rpc_cma): on a same-host channel the connector passes a small shared
 * segment with its hello, and each side probes whether it can read the other's memory. A message
 * with payload parts of 256 KiB and up (TDIST_RPC_CMA=0: never) then travels as its header, a table
 * of those parts (offset, length, address in the sender), and the payload's other bytes; the I/O
 * thread reads the parts with process_vm_readv straight into the payload's storage, checks that
 * the sender has not given up meanwhile (a sender that gives up shuts the socket down before its
 * memory can go), acknowledges through the segment, and delivers. The sender waits for the
 * acknowledgement under its send lock, so the send returns once the bytes are the peer's.
 *
 * Lanes (agent_impl.h, rpc_cma; docs/protocols.md "Lanes on one host"): when both ends agree, a
 * same-host channel's messages go through the segment's two lanes instead of the socket, in the
 * same wire form, read by the same stream parser (stream_take), so order and checks are the
 * socket's. Any thread of the reader that polls takes a lane under its reader lock and delivers
 * what it completes: the I/O thread, the pool's spinning thread (a call then reaches the thread
 * that runs it with no wake-up) and a td_rpc_sync caller waiting for its reply (which then
 * completes its own future). The socket then carries bells, bytes that wake an I/O thread that
 * said on the lane that it sleeps while no thread polls, and the connection's end. An empty round
 * trip thus passes two threads and no system call when both ends poll. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/le.h"
#include "base/log.h"
#include "base/thread.h"
#include "net/addr.h"
#include "net/io.h"
#include "net/socket.h"
#include "rpc/agent_impl.h"
#include "tensor/storage.h"
#include "transport/samehost.h"

_Static_assert(RPC_AUTH_NONCE_BYTES == AUTH_NONCE_LEN && RPC_AUTH_PROOF_BYTES == AUTH_MAC_LEN,
              "the hello's nonce and proof are net/auth.h's");

#define HELLO_WIRE (RPC_HEADER_BYTES + RPC_HELLO_PAYLOAD)
#define ANSWER_WIRE (RPC_HEADER_BYTES + RPC_ANSWER_PAYLOAD)
_Static_assert(HELLO_WIRE <= RPC_STAGE_BYTES, "the hello is read into the stage");

#define HELLO_LABEL "tdist rpc hello"
#define ACCEPT_LABEL "tdist rpc accept"

/* What the proofs cover, in the order of docs/protocols.md ("Connections and the hello"): the
 * connector's over both ids, the listener's nonce and its own; the listener's over the
 * connector's nonce, its id and its nonce. Integers as little-endian bytes. */
typedef struct proof_ints {
    uint8_t connector[4], listener[4], listener_nonce[8];
} proof_ints;

static void proof_ints_set(proof_ints *b, int connector, int listener, uint64_t listener_nonce)
{
    le_put(b->connector, (uint32_t)connector, 4);
    le_put(b->listener, (uint32_t)listener, 4);
    le_put(b->listener_nonce, listener_nonce, 8);
}

static void hello_parts(const proof_ints *b, const uint8_t *nonce, auth_part parts[4])
{
    parts[0] = (auth_part){b->connector, 4};
    parts[1] = (auth_part){b->listener, 4};
    parts[2] = (auth_part){b->listener_nonce, 8};
    parts[3] = (auth_part){nonce, RPC_AUTH_NONCE_BYTES};
}

static void accept_parts(const proof_ints *b, const uint8_t *nonce, auth_part parts[3])
{
    parts[0] = (auth_part){nonce, RPC_AUTH_NONCE_BYTES};
    parts[1] = (auth_part){b->listener, 4};
    parts[2] = (auth_part){b->listener_nonce, 8};
}

/* epoll tags of what is not a channel. */
static char tag_tcp_listen, tag_unix_listen, tag_wake;

static rpc_channel *channel_new(int fd, int peer, bool is_unix)
{
    rpc_channel *ch = TD_NEW(rpc_channel);
    ch->fd = fd;
    ch->peer = peer;
    ch->is_unix = is_unix;
    ch->opened_ns = clock_now_ns();
    thread_mutex_init(&ch->send_mu);
    thread_mutex_init(&ch->lane_mu);
    atomic_init(&ch->dead, false);
    ch->hello_fd = -1;
    ch->peer_pidfd = -1;
    ch->cma_seg = (td_segment)TD_SEGMENT_INIT;
    return ch;
}

void rpc_channel_free(rpc_channel *ch)
{
    if (!ch)
        return;
    if (ch->fd >= 0)
        close(ch->fd);
    if (ch->hello_fd >= 0)
        close(ch->hello_fd);
    if (ch->peer_pidfd >= 0)
        close(ch->peer_pidfd);
    if (ch->cma_seg.base)
        segment_unmap(&ch->cma_seg);
    td_storage_release(ch->payload);
    free(ch->outbox);
    pthread_mutex_destroy(&ch->send_mu);
    pthread_mutex_destroy(&ch->lane_mu);
    free(ch);
}

void rpc_channel_wake_sender(rpc_channel *ch)
{
    if (ch->cma)
        samehost_bell_ring(&ch->cma->side[ch->cma_side].bell, SAMEHOST_BELL_WAITER);
}

/* ---- single copy: the shared segment and the probe ------------------------------------------- */

/* The word of this process's memory that peers read to learn whether they can (any readable word
 * with a known value would do). */
static const uint64_t cma_probe_word = UINT64_C(0x74646973742d636d);

#define CMA_SEGMENT_BYTES ((sizeof(rpc_cma) + 4095) & ~(size_t)4095)

/* Publishes side's probe word in the segment, and whether it reads its lane (a slot for the
 * channel in the agent's lane list promised), before the other side looks. A reader starts out
 * asleep: the peer's first messages ring until a thread of this side polls. */
static void cma_publish(td_rpc_agent *a, rpc_cma *cma, int side)
{
    atomic_store(&cma->side[side].probe_addr, (uint64_t)(uintptr_t)&cma_probe_word);
    atomic_store(&cma->side[side].probe_value, cma_probe_word);
    bool lanes = a->lanes_on && atomic_fetch_add(&a->lane_reserved, 1) < RPC_LANE_CHANNELS;
    atomic_store(&cma->lane[1 - side].asleep, 1u);
    atomic_store(&cma->side[side].lane_reads, lanes ? 1u : 0u);
}

/* Once the other side published too: lane mode when both read their lanes. */
static void lanes_agree(rpc_channel *ch)
{
    rpc_cma *c = ch->cma;
    ch->lanes = atomic_load(&c->side[0].lane_reads) == 1 && atomic_load(&c->side[1].lane_reads) == 1;
    if (ch->lanes) {
        ch->lane_w = (samehost_lane_writer){.lane = &c->lane[ch->cma_side]};
        ch->lane_r = (samehost_lane_reader){.lane = &c->lane[1 - ch->cma_side]};
    }
}

/* a->mu held, as ch is bound: counts it where its kind of transport is counted. */
static void channel_bound(td_rpc_agent *a, rpc_channel *ch)
{
    if (ch->lanes) {
        size_t i = atomic_load_explicit(&a->lane_count, memory_order_relaxed);
        a->lane_chans[i] = ch; /* reserved in cma_publish, so i < RPC_LANE_CHANNELS */
        atomic_store_explicit(&a->lane_count, i + 1, memory_order_release);
    } else {
        atomic_fetch_add(&a->socket_chans, 1);
    }
}

/* Reads the other side's probe word (published before this side looks): sets this side's
 * can_read when it reads right. */
static void cma_probe(td_rpc_agent *a, rpc_channel *ch)
{
    if (a->piece_min == 0)
        return; /* TDIST_RPC_CMA=0: can_read stays 0, so the peer sends no pieces */
    rpc_cma_side *other = &ch->cma->side[1 - ch->cma_side];
    uint64_t addr = atomic_load(&other->probe_addr), value = atomic_load(&other->probe_value);
    bool ok = addr != 0 && ch->peer_pid > 0 && samehost_word_is(ch->peer_pid, addr, value);
    if (!ok)
        TD_LOG_DEBUG("RPC agent %s: cannot read process %d's memory (%s): large payloads go through the socket",
                     a->self.name, (int)ch->peer_pid,
                     addr == 0 || ch->peer_pid <= 0 ? "the peer published no probe" : strerror(errno));
    atomic_store(&ch->cma->side[ch->cma_side].can_read, ok ? 1u : 0u);
    /* Sharing the copy of a message with its sender needs to see the sender's end: a sender that
     * ends while it writes a chunk ends the wait for that chunk. */
    if (ok && a->share_on)
        ch->peer_pidfd = samehost_pidfd_open(ch->peer_pid);
}

static pid_t socket_peer_pid(int fd)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? cred.pid : -1;
}

static __thread const td_rpc_agent *tl_io_agent; /* set on an agent's I/O thread */

bool rpc_io_is_current(const td_rpc_agent *a) { return tl_io_agent == a; }

void rpc_io_wake(td_rpc_agent *a)
{
    if (a->wake_fd >= 0) {
        uint64_t one = 1;
        ssize_t r = write(a->wake_fd, &one, sizeof one);
        (void)r; /* a full counter already wakes the thread */
    }
}

static bool epoll_add(td_rpc_agent *a, int fd, void *tag)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = tag};
    return epoll_ctl(a->epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0;
}

/* ---- listening -------------------------------------------------------------------------------- */

/* Where to listen and what to publish: the option, else this host's name when the job spans hosts
 * (MASTER_ADDR not a loopback address, or an interface named), else loopback. */
static void pick_host(const char *listen_host, char *bind, size_t bsize, char *publish, size_t psize)
{
    if (listen_host && *listen_host) {
        snprintf(bind, bsize, "%s", listen_host);
        snprintf(publish, psize, "%s", listen_host);
        return;
    }
    const char *master = env_get_str("MASTER_ADDR", NULL);
    char ifname[256];
    bool multi_host = env_socket_ifname(ifname, sizeof ifname, NULL) ||
                      (master && strcmp(master, "127.0.0.1") != 0 && strcmp(master, "localhost") != 0 &&
                       strcmp(master, "::1") != 0);
    char name[256];
    if (multi_host && gethostname(name, sizeof name) == 0) {
        name[sizeof name - 1] = 0;
        snprintf(bind, bsize, "%s", "");
        snprintf(publish, psize, "%s", name);
        return;
    }
    snprintf(bind, bsize, "127.0.0.1");
    snprintf(publish, psize, "127.0.0.1");
}

td_status rpc_io_open(td_rpc_agent *a, const char *listen_host, char *addr_out, size_t addr_size,
                      char *unix_name_out, size_t unix_size)
{
    char bind[256], publish[256];
    pick_host(listen_host, bind, sizeof bind, publish, sizeof publish);
    int port = 0;
    td_status st = net_listen(bind, 0, 0, &a->tcp_listen_fd, &port);
    if (st != TD_OK)
        return error_prefix(st, "RPC agent %s", a->self.name);
    net_format_hostport(publish, port, addr_out, addr_size);

    snprintf(unix_name_out, unix_size, "tdist-rpc/%d/%d/%016" PRIx64, (int)getpid(), a->generation, a->nonce);
    a->unix_listen_fd = samehost_unix_listen(unix_name_out, 128);
    if (a->unix_listen_fd < 0) {
        TD_LOG_INFO("RPC agent %s: no same-host socket (%s): peers on this host use TCP", a->self.name,
                    strerror(errno));
        snprintf(unix_name_out, unix_size, "-");
    }

    a->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (a->epoll_fd < 0)
        return error_errno(TD_ERR_IO, "epoll_create1");
    a->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (a->wake_fd < 0)
        return error_errno(TD_ERR_IO, "eventfd");
    if (!epoll_add(a, a->wake_fd, &tag_wake) || !epoll_add(a, a->tcp_listen_fd, &tag_tcp_listen) ||
        (a->unix_listen_fd >= 0 && !epoll_add(a, a->unix_listen_fd, &tag_unix_listen)))
        return error_errno(TD_ERR_IO, "epoll_ctl");
    return TD_OK;
}

/* ---- connecting ------------------------------------------------------------------------------- */

/* Registers a channel in the agent's list and in epoll (a->mu not held). */
static void channel_register(td_rpc_agent *a, rpc_channel *ch)
{
    pthread_mutex_lock(&a->mu);
    TD_VEC_PUSH(&a->channels, ch);
    pthread_mutex_unlock(&a->mu);
    /* Set first: once in epoll, the channel is the I/O thread's. */
    ch->in_epoll = true;
    if (!epoll_add(a, ch->fd, ch)) {
        ch->in_epoll = false;
        rpc_agent_channel_failed(a, ch, "epoll_ctl failed");
    }
}

/* Reads the listener's answer to the hello (exactly its bytes: what the listener sends after it
 * is the I/O thread's to read) and checks it: admitted, and when this worker has a secret, proven
 * by the listener's proof over this connection's nonce. */
static td_status hello_answered(td_rpc_agent *a, int fd, int peer, const proof_ints *ints, const rpc_hello *hello,
                                int64_t deadline_ns, bool *auth_refused)
{
    const char *name = a->peers[peer].info.name;
    uint8_t buf[ANSWER_WIRE];
    td_status st = net_recv_all(fd, buf, sizeof buf, deadline_ns);
    if (st == TD_ERR_PEER_LOST)
        return error_fmt(TD_ERR_PEER_LOST,
                         "worker %s (id %d) closed the connection without answering the hello (it refused it; its "
                         "log says why)",
                         name, peer);
    if (st != TD_OK)
        return error_prefix(st, "waiting for the answer to the hello");
    rpc_header h;
    rpc_answer ans;
    st = rpc_header_read(buf, RPC_ANSWER_PAYLOAD, &h);
    if (st == TD_OK && (h.type != RPC_MSG_CONTROL || h.sender != (uint32_t)peer ||
                        h.id != le_get(ints->listener_nonce, 8) || h.payload_len != RPC_ANSWER_PAYLOAD))
        st = error_fmt(TD_ERR_INVALID, "the answer does not come from worker id %d of this world", peer);
    if (st == TD_OK)
        st = rpc_answer_read(buf + RPC_HEADER_BYTES, &ans);
    if (st != TD_OK)
        return error_prefix(st, "a malformed answer to the hello");
    uint32_t status = ans.status;
    if (status == RPC_ANSWER_ADMITTED && a->auth.on) {
        /* A listener that admits a secret holder must prove the same secret: otherwise this
         * worker reached something that only read the store. */
        auth_part parts[3];
        accept_parts(ints, hello->nonce, parts);
        if (!(ans.auth_flags & RPC_AUTH_HAS_SECRET))
            status = RPC_ANSWER_HAS_NO_SECRET;
        else if (!auth_check(&a->auth, ACCEPT_LABEL, parts, 3, ans.proof))
            status = RPC_ANSWER_WRONG_SECRET;
    }
    if (status != RPC_ANSWER_ADMITTED && auth_refused)
        *auth_refused = true;
    switch (status) {
    case RPC_ANSWER_ADMITTED:
        return TD_OK;
    case RPC_ANSWER_NEEDS_SECRET:
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: worker %s (id %d) requires the job's secret (TDIST_AUTH_TOKEN) and "
                         "the connecting worker has none",
                         name, peer);
    case RPC_ANSWER_WRONG_SECRET:
        return error_fmt(TD_ERR_INVALID, "authentication failed: TDIST_AUTH_TOKEN does not match worker %s's (id %d)",
                         name, peer);
    default:
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: worker %s (id %d) does not authenticate (it has no "
                         "TDIST_AUTH_TOKEN) but this worker has one",
                         name, peer);
    }
}

td_status rpc_io_connect(td_rpc_agent *a, int peer, const char *addr, const char *host_id, const char *unix_name,
                         uint64_t nonce, int64_t deadline_ns, bool *auth_refused)
{
    if (auth_refused)
        *auth_refused = false;
    int fd = -1;
    bool is_unix = false;
    if (!a->tcp_only && a->host_id[0] && strcmp(host_id, a->host_id) == 0 && strcmp(unix_name, "-") != 0) {
        fd = samehost_unix_connect(unix_name);
        if (fd >= 0 && net_set_nonblocking(fd, true) != TD_OK) {
            close(fd);
            fd = -1;
        }
        is_unix = fd >= 0;
        if (fd < 0)
            TD_LOG_INFO("RPC agent %s: %s's same-host socket refused (%s): using TCP", a->self.name,
                        a->peers[peer].info.name, strerror(errno));
    }
    if (fd < 0) {
        char *host = NULL;
        int port = -1;
        td_status st = net_split_hostport(addr, &host, &port);
        if (st == TD_OK && port < 0)
            st = error_fmt(TD_ERR_INVALID, "no port in address '%s'", addr);
        if (st == TD_OK)
            st = net_connect(host, port, deadline_ns, &fd);
        free(host);
        if (st != TD_OK)
            return error_prefix(st, "RPC agent %s connecting to %s (id %d) at %s", a->self.name,
                                a->peers[peer].info.name, peer, addr);
    }
    rpc_hello hello = {.auth_flags = a->auth.on ? RPC_AUTH_HAS_SECRET : 0};
    auth_nonce(hello.nonce);
    proof_ints ints;
    proof_ints_set(&ints, (int)a->self.id, peer, nonce);
    auth_part parts[4];
    if (a->auth.on) {
        hello_parts(&ints, hello.nonce, parts);
        auth_prove(&a->auth, HELLO_LABEL, parts, 4, hello.proof);
    }
    /* Single copy: a segment for the two ends, passed with the hello. */
    td_segment seg = TD_SEGMENT_INIT;
    if (is_unix && (a->piece_min > 0 || a->lanes_on)) {
        if (segment_create("rpc", CMA_SEGMENT_BYTES, true, true, &seg) == TD_OK)
            hello.features |= RPC_HELLO_CMA;
        else
            TD_LOG_DEBUG("RPC agent %s: no single-copy segment (%s)", a->self.name, td_last_error());
    }
    rpc_header h = {.type = RPC_MSG_CONTROL, .sender = (uint32_t)a->self.id, .id = nonce,
                    .payload_len = RPC_HELLO_PAYLOAD};
    uint8_t buf[HELLO_WIRE];
    rpc_header_write(&h, buf);
    rpc_hello_write(&hello, buf + RPC_HEADER_BYTES);
    td_status st = TD_OK;
    if (seg.base) {
        /* A fresh socket takes the hello's bytes whole. */
        cma_publish(a, seg.base, 0);
        if (samehost_send_fd(fd, buf, sizeof buf, seg.fd) != (ssize_t)sizeof buf)
            st = error_errno(TD_ERR_PEER_LOST, "sending the hello");
        close(seg.fd); /* the mapping is all this end keeps */
        seg.fd = -1;
    } else {
        st = net_send_all(fd, buf, sizeof buf, deadline_ns);
    }
    if (st == TD_OK)
        st = hello_answered(a, fd, peer, &ints, &hello, deadline_ns, auth_refused);
    if (st != TD_OK) {
        close(fd);
        if (seg.base)
            segment_unmap(&seg);
        return error_prefix(st, "RPC agent %s greeting %s (id %d)", a->self.name, a->peers[peer].info.name, peer);
    }
    rpc_channel *ch = channel_new(fd, peer, is_unix);
    if (seg.base) {
        ch->cma_seg = seg;
        ch->cma = seg.base;
        ch->cma_side = 0;
        ch->peer_pid = socket_peer_pid(fd);
        cma_probe(a, ch);
        lanes_agree(ch);
    }
    pthread_mutex_lock(&a->mu);
    channel_bound(a, ch);
    a->peers[peer].chan = ch;
    a->connected++;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    channel_register(a, ch);
    return TD_OK;
}

/* ---- reading ---------------------------------------------------------------------------------- */

/* On the I/O thread, the only reader: fails the channel, then gives back what it holds at once, so
 * that a refused stranger or a lost peer keeps no fd and no buffer for the agent's lifetime. The
 * shutdown in rpc_agent_channel_failed has woken any sender blocked on the socket; the close
 * happens under the agent's lock and the channel's send lock, so no thread can still be using the
 * fd's number. A channel never bound to a peer is reachable from nowhere else and is freed. */
static void channel_fail(td_rpc_agent *a, rpc_channel *ch, const char *reason)
{
    if (ch->in_epoll) {
        epoll_ctl(a->epoll_fd, EPOLL_CTL_DEL, ch->fd, NULL);
        ch->in_epoll = false;
    }
    rpc_agent_channel_failed(a, ch, reason);
    /* In lane mode the parser's state and the fd (pieces_read polls it) are also the lane
     * reader's: its lock comes first (deliveries under it take a->mu). */
    if (ch->lanes)
        pthread_mutex_lock(&ch->lane_mu);
    td_storage_release(ch->payload);
    ch->payload = NULL;
    bool unbound = false;
    pthread_mutex_lock(&a->mu);
    pthread_mutex_lock(&ch->send_mu);
    if (ch->fd >= 0)
        close(ch->fd);
    ch->fd = -1;
    pthread_mutex_unlock(&ch->send_mu);
    if (ch->lanes)
        pthread_mutex_unlock(&ch->lane_mu);
    if (ch->peer < 0) {
        for (size_t i = 0; i < a->channels.len; i++)
            if (a->channels.items[i] == ch) {
                a->channels.items[i] = a->channels.items[--a->channels.len];
                unbound = true;
                break;
            }
    }
    pthread_mutex_unlock(&a->mu);
    if (unbound)
        rpc_channel_free(ch);
}

/* Refuses an accepted connection: the log names where it came from and why. */
static void refuse(td_rpc_agent *a, rpc_channel *ch, const char *why)
{
    TD_LOG_WARN("RPC agent %s: refused a connection from %s: %s", a->self.name, ch->where, why);
    channel_fail(a, ch, "refused");
}

/* Whether worker id `from` may bind a new channel (a->mu held). In a static world each id binds
 * once; a dynamic group's newcomer takes a slot that no member holds, also one a member left (its
 * old channel, if still open, no longer counts: its failure is ignored once it is not the slot's). */
static bool slot_open(const td_rpc_agent *a, int from)
{
    const rpc_peer *p = &a->peers[from];
    return (p->chan == NULL && !p->lost) || (a->dynamic && !p->member);
}

/* The I/O thread's only send (see the top of this file): fails rather than wait. */
static bool answer_send(td_rpc_agent *a, rpc_channel *ch, const rpc_answer *ans)
{
    rpc_header h = {.type = RPC_MSG_CONTROL, .sender = (uint32_t)a->self.id, .id = a->nonce,
                    .payload_len = RPC_ANSWER_PAYLOAD};
    uint8_t buf[ANSWER_WIRE];
    rpc_header_write(&h, buf);
    rpc_answer_write(ans, buf + RPC_HEADER_BYTES);
    ssize_t n;
    errno = 0;
    do
        n = send(ch->fd, buf, sizeof buf, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n == (ssize_t)sizeof buf;
}

/* A hello that did not prove the secret as this worker needs: answers why (so that a worker of the
 * job with another secret fails its init saying so), logs and closes. While this worker joins, the
 * refusal is kept for the claimed id: joining fails on it if no admitted channel from that id
 * follows (rpc_peer.auth_refused_ns). */
static void auth_refuse(td_rpc_agent *a, rpc_channel *ch, int from, rpc_answer *ans)
{
    char why[256];
    if (ans->status == RPC_ANSWER_NEEDS_SECRET)
        snprintf(why, sizeof why,
                 "authentication failed: worker id %d connected without the job's secret (TDIST_AUTH_TOKEN), which "
                 "this worker requires",
                 from);
    else if (ans->status == RPC_ANSWER_WRONG_SECRET)
        snprintf(why, sizeof why, "authentication failed: worker id %d's TDIST_AUTH_TOKEN does not match this worker's",
                 from);
    else
        snprintf(why, sizeof why, "authentication failed: worker id %d has a TDIST_AUTH_TOKEN but this worker has none",
                 from);
    pthread_mutex_lock(&a->mu);
    if (!a->ready && !a->dynamic && a->peers[from].chan == NULL) {
        a->peers[from].auth_refused_ns = clock_now_ns();
        snprintf(a->peers[from].auth_reason, sizeof a->peers[from].auth_reason, "%s", why);
        pthread_cond_broadcast(&a->cv);
    }
    pthread_mutex_unlock(&a->mu);
    answer_send(a, ch, ans); /* best effort: the connector learns why, or sees the close */
    refuse(a, ch, why);
}

static bool nonce_seen(const td_rpc_agent *a, const uint8_t *nonce)
{
    for (size_t i = 0; i < a->hello_nonces.len; i++)
        if (memcmp(a->hello_nonces.items[i].bytes, nonce, RPC_AUTH_NONCE_BYTES) == 0)
            return true;
    return false;
}

/* The hello's header is whole: refuses it at once unless it is a hello of this world for this
 * worker, before its payload is read. */
static bool hello_header(td_rpc_agent *a, rpc_channel *ch)
{
    char why[TD_ERROR_MAX];
    if (rpc_header_read(ch->stage, RPC_HELLO_PAYLOAD, &ch->header) != TD_OK) {
        snprintf(why, sizeof why, "malformed hello: %s", td_last_error());
        refuse(a, ch, why);
        return false;
    }
    const rpc_header *h = &ch->header;
    int from = (int)h->sender;
    /* In a static world the lower id connects; in a dynamic group the newcomer connects to every
     * member, whatever the ids. */
    if (h->type != RPC_MSG_CONTROL || h->id != a->nonce || h->payload_len != RPC_HELLO_PAYLOAD ||
        h->sender >= (uint32_t)a->world_size || (a->dynamic ? from == a->self.id : from >= a->self.id)) {
        refuse(a, ch, "its hello does not come from this world");
        return false;
    }
    return true;
}

/* The whole hello is in: checks its proof, answers it and binds the channel to its peer, or
 * refuses it. */
static bool channel_hello(td_rpc_agent *a, rpc_channel *ch)
{
    int from = (int)ch->header.sender;
    rpc_hello hello;
    if (rpc_hello_read(ch->stage + RPC_HEADER_BYTES, &hello) != TD_OK) {
        char why[TD_ERROR_MAX];
        snprintf(why, sizeof why, "malformed hello: %s", td_last_error());
        refuse(a, ch, why);
        return false;
    }
    rpc_answer ans = {.status = RPC_ANSWER_ADMITTED, .auth_flags = a->auth.on ? RPC_AUTH_HAS_SECRET : 0};
    bool claims = hello.auth_flags & RPC_AUTH_HAS_SECRET;
    proof_ints ints;
    proof_ints_set(&ints, from, (int)a->self.id, a->nonce);
    auth_part parts[4];
    hello_parts(&ints, hello.nonce, parts);
    if (a->auth.on && !claims)
        ans.status = RPC_ANSWER_NEEDS_SECRET;
    else if (!a->auth.on && claims)
        ans.status = RPC_ANSWER_HAS_NO_SECRET;
    else if (a->auth.on && !auth_check(&a->auth, HELLO_LABEL, parts, 4, hello.proof))
        ans.status = RPC_ANSWER_WRONG_SECRET;
    if (ans.status != RPC_ANSWER_ADMITTED) {
        auth_refuse(a, ch, from, &ans);
        return false;
    }
    if (a->auth.on) {
        if (nonce_seen(a, hello.nonce)) {
            refuse(a, ch, "it replays a hello this worker admitted before");
            return false;
        }
        struct rpc_seen_nonce seen;
        memcpy(seen.bytes, hello.nonce, sizeof seen.bytes);
        TD_VEC_PUSH(&a->hello_nonces, seen);
    }
    pthread_mutex_lock(&a->mu);
    bool ok = slot_open(a, from);
    pthread_mutex_unlock(&a->mu);
    char why[128];
    snprintf(why, sizeof why, "worker id %d is connected already", from);
    if (ok) {
        if (a->auth.on) {
            auth_part acc[3];
            accept_parts(&ints, hello.nonce, acc);
            auth_prove(&a->auth, ACCEPT_LABEL, acc, 3, ans.proof);
        }
        /* Single copy: the segment that came with the hello, with this side's probe word in it
         * before the answer lets the connector look; then the connector's word probed. */
        if ((hello.features & RPC_HELLO_CMA) && ch->hello_fd >= 0 && (a->piece_min > 0 || a->lanes_on) &&
            segment_map_fd(ch->hello_fd, CMA_SEGMENT_BYTES, &ch->cma_seg) == TD_OK) {
            close(ch->cma_seg.fd); /* the mapping is all this end keeps */
            ch->cma_seg.fd = -1;
            ch->hello_fd = -1;
            ch->cma = ch->cma_seg.base;
            ch->cma_side = 1;
            cma_publish(a, ch->cma, 1);
            cma_probe(a, ch);
            lanes_agree(ch);
        }
        /* Answered before it is bound: once bound, other threads may send on it, and the answer
         * must come first. Only this thread binds accepted channels, so the slot stays open. */
        if (!answer_send(a, ch, &ans)) {
            snprintf(why, sizeof why, "answering its hello failed: %s", errno ? strerror(errno) : "a short send");
            ok = false;
        }
    }
    if (ok) {
        pthread_mutex_lock(&a->mu);
        ok = slot_open(a, from);
        if (ok) {
            if (a->dynamic && !a->peers[from].member)
                a->peers[from].lost = false;
            a->peers[from].chan = ch;
            ch->peer = from;
            channel_bound(a, ch);
            a->connected++;
            pthread_cond_broadcast(&a->cv);
        }
        pthread_mutex_unlock(&a->mu);
    }
    if (ch->hello_fd >= 0) {
        close(ch->hello_fd);
        ch->hello_fd = -1;
    }
    if (!ok)
        refuse(a, ch, why);
    return ok;
}

/* An accepted connection not yet bound: reads its hello into the stage, never more than the
 * hello's bytes (a stranger gets no larger buffer and no payload storage), and checks its header
 * as soon as that is whole. True once the hello bound the channel (the caller reads on); false to
 * wait for more, or when the channel failed. */
static bool hello_read(td_rpc_agent *a, rpc_channel *ch)
{
    while (ch->hello_have < HELLO_WIRE) {
        size_t want = (ch->hello_have < RPC_HEADER_BYTES ? RPC_HEADER_BYTES : HELLO_WIRE) - ch->hello_have;
        ssize_t n;
        if (ch->is_unix) {
            /* A segment's fd may come with the hello (single copy); one at most is kept. */
            bool extra = ch->hello_fd >= 0;
            n = samehost_recv_fd(ch->fd, ch->stage + ch->hello_have, want, &ch->hello_fd, &extra);
        } else {
            n = recv(ch->fd, ch->stage + ch->hello_have, want, 0);
        }
        if (n == 0) {
            channel_fail(a, ch, "connection closed by peer");
            return false;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                channel_fail(a, ch, "reading the hello failed");
            return false;
        }
        ch->hello_have += (size_t)n;
        if (ch->hello_have == RPC_HEADER_BYTES && !hello_header(a, ch))
            return false;
    }
    return channel_hello(a, ch);
}

/* ---- handing sends over ------------------------------------------------------------------------ */

/* A small message on a socket channel (an rpc_async call, a reply) may be handed to the I/O thread
 * while it polls: the sender copies it into the channel's outbox under the send lock, puts the
 * channel on the agent's flush list, and returns; the I/O thread writes each listed outbox with
 * one non-blocking send, so the messages handed meanwhile (by one caller issuing many calls, by
 * the pool replying to a batch) share a write. On a loopback or local network a write costs the
 * sender the whole trip through the receiver's network stack, several times what the message
 * itself costs; one write per batch is what lets a stream of calls go faster than one call per
 * round of system calls. Order stays the channel's: any other send writes what the outbox holds
 * first, in the same writev. A sender hands over only while the I/O thread polls (io_polling):
 * before it sleeps in epoll, or starts a long read, the thread clears that and then looks at the
 * list, and a sender checks it again after it listed, so one of them writes (the sender itself,
 * as every send did before) and nothing waits on a sleeping thread. What the socket does not take
 * stays in the outbox and the thread writes it when epoll says the socket has room (EPOLLOUT);
 * an outbox of RPC_OUTBOX_MAX makes senders write themselves, blocking as before. */

static void flush_list_push(td_rpc_agent *a, rpc_channel *ch)
{
    if (atomic_exchange(&ch->outbox_listed, true))
        return;
    rpc_channel *head = atomic_load(&a->flush_list);
    do
        ch->flush_next = head;
    while (!atomic_compare_exchange_weak(&a->flush_list, &head, ch));
}

/* Copies the message's bytes to the outbox (send_mu held). */
static void outbox_append(rpc_channel *ch, const struct iovec *v, size_t n, size_t bytes)
{
    if (ch->outbox_off == ch->outbox_len)
        ch->outbox_off = ch->outbox_len = 0;
    if (ch->outbox_off > 0 && ch->outbox_len + bytes > ch->outbox_cap) {
        /* The part written goes first: an outbox the socket never quite empties must not grow. */
        memmove(ch->outbox, ch->outbox + ch->outbox_off, ch->outbox_len - ch->outbox_off);
        ch->outbox_len -= ch->outbox_off;
        ch->outbox_off = 0;
    }
    if (ch->outbox_len + bytes > ch->outbox_cap) {
        size_t cap = ch->outbox_cap ? ch->outbox_cap : 4096;
        while (cap < ch->outbox_len + bytes)
            cap *= 2;
        ch->outbox = alloc_resize(ch->outbox, cap);
        ch->outbox_cap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        memcpy(ch->outbox + ch->outbox_len, v[i].iov_base, v[i].iov_len);
        ch->outbox_len += v[i].iov_len;
    }
}

/* Asks epoll to report room on ch's socket (or stop reporting it). I/O thread. */
static void out_watch(td_rpc_agent *a, rpc_channel *ch, bool on)
{
    if (ch->out_watched == on || !ch->in_epoll)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0u), .data.ptr = ch};
    if (epoll_ctl(a->epoll_fd, EPOLL_CTL_MOD, ch->fd, &ev) == 0)
        ch->out_watched = on;
}

/* Writes what ch's outbox holds without blocking. I/O thread. A sender holding the send lock
 * writes the outbox itself or lists the channel again once it has appended, so a busy lock is
 * left to it. */
static void outbox_write(td_rpc_agent *a, rpc_channel *ch)
{
    if (pthread_mutex_trylock(&ch->send_mu) != 0)
        return;
    int err = 0;
    while (ch->outbox_off < ch->outbox_len && ch->fd >= 0 && !atomic_load(&ch->dead)) {
        ssize_t n = send(ch->fd, ch->outbox + ch->outbox_off, ch->outbox_len - ch->outbox_off,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                err = errno;
            break;
        }
        atomic_fetch_add_explicit(&a->io_writes, 1, memory_order_relaxed);
        ch->outbox_off += (size_t)n;
    }
    bool rest = ch->outbox_off < ch->outbox_len && !err;
    if (!rest && ch->outbox_cap > RPC_OUTBOX_KEEP) {
        /* A burst grew it: give the memory back rather than keep it for every peer. */
        free(ch->outbox);
        ch->outbox = NULL;
        ch->outbox_cap = ch->outbox_off = ch->outbox_len = 0;
    }
    pthread_mutex_unlock(&ch->send_mu);
    if (rest && !ch->out_watched)
        atomic_fetch_add_explicit(&a->io_write_full, 1, memory_order_relaxed);
    if (err) {
        /* As a sender's failure: epoll then reports the shut socket and channel_read closes it. */
        char why[TD_ERROR_MAX];
        snprintf(why, sizeof why, "sending failed: %s", strerror(err));
        rpc_agent_channel_failed(a, ch, why);
        return;
    }
    out_watch(a, ch, rest);
}

/* Writes every listed outbox. I/O thread. */
static bool flush_all(td_rpc_agent *a)
{
    /* Read first: the thread polls this in its spin, and a write would take the line from others. */
    if (!atomic_load_explicit(&a->flush_list, memory_order_relaxed))
        return false;
    rpc_channel *ch = atomic_exchange(&a->flush_list, NULL);
    bool any = ch != NULL;
    while (ch) {
        rpc_channel *next = ch->flush_next; /* read before the channel can be listed again */
        atomic_store(&ch->outbox_listed, false);
        outbox_write(a, ch);
        ch = next;
    }
    return any;
}

/* The I/O thread stops polling (to sleep, or for a long read): senders write themselves from now
 * on, and what they handed over before is written now. */
static void io_not_polling(td_rpc_agent *a)
{
    atomic_store(&a->io_polling, false);
    flush_all(a);
}

/* The I/O thread polls again. */
static void io_polling(td_rpc_agent *a)
{
    if (!atomic_load_explicit(&a->io_polling, memory_order_relaxed))
        atomic_store(&a->io_polling, true);
}

/* The stream parser's failure. On a socket, the parser runs on the I/O thread, which fails the
 * channel and gives it back at once (channel_fail). In lane mode it runs under lane_mu on whichever
 * thread took the lane: that fails the channel's calls and shuts its socket down, and the I/O
 * thread, woken by the shutdown, gives the channel back. */
static void stream_fail(td_rpc_agent *a, rpc_channel *ch, const char *reason)
{
    if (!ch->lanes) {
        channel_fail(a, ch, reason);
        return;
    }
    td_storage_release(ch->payload);
    ch->payload = NULL;
    rpc_agent_channel_failed(a, ch, reason);
}

/* The payload's storage, once the header (and a piece table) is in. */
static bool payload_alloc(td_rpc_agent *a, rpc_channel *ch)
{
    ch->payload_have = 0;
    if (ch->header.payload_len > 0 && storage_new_uninit((size_t)ch->header.payload_len, &ch->payload) != TD_OK) {
        char why[TD_ERROR_MAX];
        snprintf(why, sizeof why, "cannot hold a message: %s", td_last_error());
        stream_fail(a, ch, why);
        return false;
    }
    return true;
}

/* The header of the message being read is complete: checks it (a hello binds the channel) and
 * allocates its payload, or waits for its piece table. False when the channel failed. */
static bool header_done(td_rpc_agent *a, rpc_channel *ch)
{
    char why[TD_ERROR_MAX];
    if (rpc_header_read(ch->hdr, a->max_payload, &ch->header) != TD_OK) {
        snprintf(why, sizeof why, "malformed message: %s", td_last_error());
        TD_LOG_WARN("RPC agent %s: closing a connection (worker id %d): %s", a->self.name, ch->peer, why);
        stream_fail(a, ch, why);
        return false;
    }
    if (ch->header.sender != (uint32_t)ch->peer) {
        snprintf(why, sizeof why, "a message claims to come from worker id %u", (unsigned)ch->header.sender);
        stream_fail(a, ch, why);
        return false;
    }
    ch->pieces.count = 0;
    ch->pieces.bytes = 0;
    if (ch->header.flags & RPC_FLAG_PIECES) {
        if (!ch->cma || !atomic_load(&ch->cma->side[ch->cma_side].can_read)) {
            TD_LOG_WARN("RPC agent %s: closing the connection of worker id %d: it sent a piece table, which this "
                        "connection did not agree to",
                        a->self.name, ch->peer);
            stream_fail(a, ch, "a piece table on a connection without single copy");
            return false;
        }
        ch->table_have = 0;
        ch->table_need = RPC_PIECES_HEAD;
        ch->payload_have = 0;
        return true;
    }
    return payload_alloc(a, ch);
}

/* Bytes of the piece table of the message being read arrived: reads its count, then its entries,
 * then allocates the payload. False when the channel failed. */
static bool table_done(td_rpc_agent *a, rpc_channel *ch)
{
    char why[TD_ERROR_MAX];
    uint32_t count = 0;
    if (ch->table_need == RPC_PIECES_HEAD) {
        if (rpc_pieces_count(ch->table, &count) != TD_OK)
            goto malformed;
        ch->table_need = RPC_PIECES_HEAD + (size_t)count * RPC_PIECE_BYTES;
        return true;
    }
    count = (uint32_t)((ch->table_need - RPC_PIECES_HEAD) / RPC_PIECE_BYTES);
    if (rpc_pieces_read(ch->table + RPC_PIECES_HEAD, count, ch->header.payload_len, &ch->pieces) != TD_OK)
        goto malformed;
    return payload_alloc(a, ch);
malformed:
    snprintf(why, sizeof why, "malformed message: %s", td_last_error());
    TD_LOG_WARN("RPC agent %s: closing a connection (worker id %d): %s", a->self.name, ch->peer, why);
    stream_fail(a, ch, why);
    return false;
}

static bool reading_table(const rpc_channel *ch)
{
    return ch->hdr_have == RPC_HEADER_BYTES && (ch->header.flags & RPC_FLAG_PIECES) && ch->table_have < ch->table_need;
}

/* Bytes of the payload that travel in the stream: all of it, less the pieces. */
static uint64_t inline_len(const rpc_channel *ch) { return ch->header.payload_len - ch->pieces.bytes; }

/* The pieces as the same-host layer's spans (both ends of a shared copy cut them alike). */
static int pieces_spans(const rpc_pieces *p, samehost_span *out)
{
    for (uint32_t i = 0; i < p->count; i++)
        out[i] = (samehost_span){p->piece[i].offset, p->piece[i].addr, p->piece[i].len};
    return (int)p->count;
}

/* Reads the message's pieces from the sender's memory into its storage (sharing the copy with the
 * sender when it is large and the sender's end can be seen), makes sure the sender still waits
 * for them (one that gave up shut the socket down first, and may have let the memory go), and
 * acknowledges them. False when the channel failed. */
static bool pieces_read(td_rpc_agent *a, rpc_channel *ch)
{
    char why[TD_ERROR_MAX];
    char *base = td_storage_data(ch->payload);
    rpc_cma_side *sender = &ch->cma->side[1 - ch->cma_side];
    int err = 0;
    bool io = rpc_io_is_current(a); /* a long read: the I/O thread does not poll meanwhile */
    if (io)
        io_not_polling(a);
    if (ch->peer_pidfd >= 0 && ch->pieces.bytes >= RPC_SHARE_MIN && atomic_load(&sender->can_read)) {
        samehost_span spans[RPC_PIECES_MAX];
        int n = pieces_spans(&ch->pieces, spans);
        samehost_share_offer(&sender->share, atomic_load(&sender->acked) + 1, base);
        samehost_bell_notify(&sender->bell, SAMEHOST_BELL_WAITER);
        uint64_t by_peer = 0;
        err = samehost_share_read(&sender->share, ch->peer_pid, ch->peer_pidfd, base, spans, n,
                                  clock_now_ns() + (int64_t)RPC_SHARE_STALL_MS * 1000000, &by_peer);
        atomic_fetch_add(&a->share_chunks_in, by_peer);
        if (err == ETIMEDOUT) {
            /* The sender may still write into the payload, so it is never used nor freed. */
            ch->payload = NULL;
            snprintf(why, sizeof why, "worker id %d stopped for %d s while it wrote into this worker's memory",
                     ch->peer, RPC_SHARE_STALL_MS / 1000);
            TD_LOG_WARN("RPC agent %s: closing the connection of worker id %d and leaving a %llu-byte buffer to "
                        "it: %s", a->self.name, ch->peer, (unsigned long long)ch->header.payload_len, why);
            if (io)
                io_polling(a);
            stream_fail(a, ch, why);
            return false;
        }
    } else {
        for (uint32_t i = 0; i < ch->pieces.count && !err; i++) {
            const rpc_piece *q = &ch->pieces.piece[i];
            err = samehost_read_span(ch->peer_pid, base + q->offset, q->addr, (size_t)q->len);
        }
    }
    if (io)
        io_polling(a);
    if (err) {
        snprintf(why, sizeof why, "reading %llu bytes of worker id %d's memory failed: %s",
                 (unsigned long long)ch->pieces.bytes, ch->peer, strerror(err));
        TD_LOG_WARN("RPC agent %s: closing the connection of worker id %d: %s", a->self.name, ch->peer, why);
        stream_fail(a, ch, why);
        return false;
    }
    struct pollfd p = {.fd = ch->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        stream_fail(a, ch, "connection closed by peer");
        return false;
    }
    atomic_fetch_add(&a->pieces_received, 1);
    atomic_fetch_add(&sender->acked, 1);
    samehost_bell_notify(&sender->bell, SAMEHOST_BELL_WAITER);
    return true;
}

/* Hands the message being read over once it is whole. */
static bool message_done(td_rpc_agent *a, rpc_channel *ch)
{
    if (ch->hdr_have < RPC_HEADER_BYTES || ch->peer < 0 || reading_table(ch) || ch->payload_have < inline_len(ch))
        return false;
    if (ch->pieces.count > 0 && !pieces_read(a, ch))
        return false;
    rpc_header h = ch->header;
    td_storage *payload = ch->payload;
    ch->payload = NULL;
    ch->hdr_have = 0;
    ch->payload_have = 0;
    ch->pieces.count = 0;
    ch->pieces.bytes = 0;
    rpc_agent_deliver(a, ch->peer, &h, payload);
    return true;
}

/* Where the next stream byte of the payload goes, and how many may go there in a row (all of them
 * stream bytes still to come, so never more than are left). */
static char *payload_dst(rpc_channel *ch, uint64_t *room)
{
    uint64_t at = rpc_pieces_place(&ch->pieces, ch->header.payload_len, ch->payload_have, room);
    return (char *)td_storage_data(ch->payload) + at;
}

/* The stream parser: takes the next bytes of the stream (from the stage or a lane entry) into the
 * message being read, the header, piece table or payload, as far as the part being read goes,
 * and hands the message over when it is whole. *used: the bytes taken. False when the channel
 * failed. */
static bool stream_take(td_rpc_agent *a, rpc_channel *ch, const uint8_t *src, size_t avail, size_t *used)
{
    size_t n;
    if (ch->hdr_have < RPC_HEADER_BYTES) {
        n = RPC_HEADER_BYTES - ch->hdr_have < avail ? RPC_HEADER_BYTES - ch->hdr_have : avail;
        memcpy(ch->hdr + ch->hdr_have, src, n);
        ch->hdr_have += n;
        *used = n;
        if (ch->hdr_have == RPC_HEADER_BYTES && !header_done(a, ch))
            return false;
    } else if (reading_table(ch)) {
        n = ch->table_need - ch->table_have < avail ? ch->table_need - ch->table_have : avail;
        memcpy(ch->table + ch->table_have, src, n);
        ch->table_have += n;
        *used = n;
        if (ch->table_have == ch->table_need && !table_done(a, ch))
            return false;
    } else {
        uint64_t room;
        char *dst = payload_dst(ch, &room);
        n = room < avail ? (size_t)room : avail;
        memcpy(dst, src, n);
        ch->payload_have += n;
        *used = n;
    }
    message_done(a, ch);
    return !atomic_load(&ch->dead) || !ch->lanes;
}

/* ---- lanes (agent_impl.h, rpc_cma) ------------------------------------------------------------ */

#define LANE_BYTES_KIND 1u /* an entry of the stream's bytes: the one kind a lane carries */

/* Takes up to max entries of ch's lane through the stream parser, delivering the messages they
 * complete, under the lane's reader lock; a thread that finds the lock taken leaves the lane to its
 * holder, which looks once more after it lets go. Rings the writer's bell when it consumed anything
 * (the writer may wait for room). True when it took any. */
static bool lane_drain(td_rpc_agent *a, rpc_channel *ch, size_t max)
{
    bool took = false;
    size_t taken = 0;
    while (taken < max && !atomic_load_explicit(&ch->dead, memory_order_relaxed) &&
           samehost_lane_ready(&ch->lane_r)) {
        if (pthread_mutex_trylock(&ch->lane_mu) != 0)
            break;
        bool failed = false;
        size_t before = taken;
        while (taken < max && !failed && !atomic_load_explicit(&ch->dead, memory_order_relaxed)) {
            uint32_t kind = 0;
            const uint8_t *data = NULL;
            size_t n = 0;
            int r = samehost_lane_next(&ch->lane_r, &kind, &data, &n);
            if (r == 0)
                break;
            if (r < 0 || kind != LANE_BYTES_KIND) {
                TD_LOG_WARN("RPC agent %s: closing the connection of worker id %d: its lane holds %s", a->self.name,
                            ch->peer, r < 0 ? "words that make no sense" : "an entry of an unknown kind");
                stream_fail(a, ch, "a malformed lane");
                failed = true;
                break;
            }
            /* The parser copies the bytes out before it checks them: the peer may change the ring. */
            for (size_t at = 0; at < n && !failed;) {
                size_t used = 0;
                failed = !stream_take(a, ch, data + at, n - at, &used);
                at += used;
            }
            samehost_lane_consume(&ch->lane_r);
            taken++;
        }
        pthread_mutex_unlock(&ch->lane_mu);
        if (taken > before) {
            took = true;
            samehost_bell_notify(&ch->cma->side[1 - ch->cma_side].bell, SAMEHOST_BELL_WAITER);
        }
        if (failed) {
            rpc_io_wake(a);
            break;
        }
    }
    return took;
}

/* The lanes in the list now, and each one's channel. */
static size_t lanes_now(td_rpc_agent *a) { return atomic_load_explicit(&a->lane_count, memory_order_acquire); }

size_t rpc_lanes_enter(td_rpc_agent *a)
{
    size_t n = lanes_now(a);
    if (n == 0)
        return 0;
    atomic_fetch_add(&a->lane_pollers, 1);
    for (size_t i = 0; i < n; i++)
        atomic_fetch_add(&a->lane_chans[i]->lane_r.lane->pollers, 1);
    return n;
}

bool rpc_lanes_poll(td_rpc_agent *a)
{
    bool took = false;
    size_t n = lanes_now(a);
    for (size_t i = 0; i < n; i++)
        took |= lane_drain(a, a->lane_chans[i], 16);
    return took;
}

void rpc_lanes_leave(td_rpc_agent *a, size_t n)
{
    if (n == 0)
        return;
    /* Each decrement is a full barrier: a writer that published before it either saw this poller
     * (and did not ring) or rang; what it published is taken here, up to a bound (a peer that
     * keeps writing must not keep this thread), and what is left then is the I/O thread's. */
    for (size_t i = 0; i < n; i++)
        atomic_fetch_sub(&a->lane_chans[i]->lane_r.lane->pollers, 1);
    atomic_fetch_sub(&a->lane_pollers, 1);
    bool left = false;
    for (size_t i = 0; i < n; i++) {
        rpc_channel *ch = a->lane_chans[i];
        lane_drain(a, ch, 64);
        left |= !atomic_load_explicit(&ch->dead, memory_order_relaxed) && samehost_lane_ready(&ch->lane_r);
    }
    if (left)
        rpc_io_wake(a);
}

/* The I/O thread, about to sleep in epoll: says so on every lane (a writer then rings), then looks
 * once more. False when a lane had something: the thread takes it instead of sleeping. */
static bool lanes_sleep(td_rpc_agent *a)
{
    size_t n = lanes_now(a);
    /* Each exchange is a full barrier (as the writer's fence after it published): either the
     * writer sees asleep and rings, or this thread sees what it published. */
    for (size_t i = 0; i < n; i++)
        atomic_exchange(&a->lane_chans[i]->lane_r.lane->asleep, 1u);
    for (size_t i = 0; i < n; i++) {
        rpc_channel *ch = a->lane_chans[i];
        if (!atomic_load_explicit(&ch->dead, memory_order_relaxed) && samehost_lane_ready(&ch->lane_r))
            return false;
    }
    return true;
}

static void lanes_awake(td_rpc_agent *a)
{
    size_t n = lanes_now(a);
    for (size_t i = 0; i < n; i++)
        atomic_store_explicit(&a->lane_chans[i]->lane_r.lane->asleep, 0u, memory_order_relaxed);
}

/* A channel in lane mode whose socket is readable: its bytes are bells (or its end), read and
 * dropped; then its lane is taken. At the end, what the lane holds first. */
static void lane_bells(td_rpc_agent *a, rpc_channel *ch)
{
    uint8_t bells[256];
    for (int reads = 0; reads < 16; reads++) {
        ssize_t n = recv(ch->fd, bells, sizeof bells, 0);
        if (n > 0 && (size_t)n == sizeof bells)
            continue;
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            char why[TD_ERROR_MAX];
            if (n == 0)
                snprintf(why, sizeof why, "connection closed by peer");
            else
                snprintf(why, sizeof why, "reading from the connection failed: %s", strerror(errno));
            if (!atomic_load(&ch->dead))
                lane_drain(a, ch, SAMEHOST_LANE_BYTES / SAMEHOST_LANE_ENTRY); /* what a lane can hold */
            channel_fail(a, ch, why);
            return;
        }
        break;
    }
    lane_drain(a, ch, 64);
}

/* Rings the reader of ch's lane: a byte on the socket (a full socket has bells enough). */
static void lane_ring(td_rpc_agent *a, rpc_channel *ch)
{
    static const uint8_t bell = 1;
    atomic_fetch_add_explicit(&a->lane_rings, 1, memory_order_relaxed);
    if (ch->fd >= 0) {
        ssize_t r = send(ch->fd, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        (void)r;
    }
}

/* Reads what the socket has (up to a bound of recv calls, for fairness between channels; bytes
 * already staged are always consumed, as epoll would not report them again). Headers, piece
 * tables and small payloads go through the stage; the rest of a large payload is read straight
 * into its storage. */
static void channel_read(td_rpc_agent *a, rpc_channel *ch)
{
    char why[TD_ERROR_MAX];
    for (int reads = 0;;) {
        if (atomic_load(&ch->dead)) {
            /* Failed by a sender or by shutdown: stop watching it and give its fd back. */
            channel_fail(a, ch, "failed");
            return;
        }
        if (ch->peer < 0 && !hello_read(a, ch))
            return;
        if (ch->lanes) {
            lane_bells(a, ch);
            return;
        }
        bool reading_header = ch->hdr_have < RPC_HEADER_BYTES;
        bool in_table = reading_table(ch);
        if (ch->stage_off < ch->stage_len) {
            size_t used = 0;
            bool ok = stream_take(a, ch, ch->stage + ch->stage_off, ch->stage_len - ch->stage_off, &used);
            ch->stage_off += used;
            if (!ok)
                return;
            continue;
        }
        if (ch->drained || reads >= 64) {
            ch->drained = false;
            return;
        }
        /* A large payload's rest goes straight to its storage; anything else through the stage. */
        bool direct = !reading_header && !in_table && inline_len(ch) - ch->payload_have >= RPC_STAGE_BYTES;
        void *dst = ch->stage;
        size_t want = RPC_STAGE_BYTES;
        if (direct) {
            uint64_t room;
            dst = payload_dst(ch, &room);
            want = room > (1u << 30) ? (1u << 30) : (size_t)room;
        }
        bool long_read = direct && want >= RPC_LONG_READ;
        if (long_read)
            io_not_polling(a);
        ssize_t n = recv(ch->fd, dst, want, 0);
        if (long_read)
            io_polling(a);
        reads++;
        if (n == 0) {
            channel_fail(a, ch, "connection closed by peer");
            return;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            snprintf(why, sizeof why, "reading from the connection failed: %s", strerror(errno));
            channel_fail(a, ch, why);
            return;
        }
        if (direct) {
            ch->payload_have += (uint64_t)n;
            message_done(a, ch);
        } else {
            ch->stage_off = 0;
            ch->stage_len = (size_t)n;
            ch->drained = (size_t)n < want;
        }
    }
}

/* Where an accepted connection comes from, for the log: the TCP peer, or the process on a
 * same-host socket (whose address has no name). */
static void where_set(rpc_channel *ch, const td_addr *from)
{
    if (!ch->is_unix) {
        addr_str(from, ch->where, sizeof ch->where);
        return;
    }
    ch->peer_pid = socket_peer_pid(ch->fd);
    if (ch->peer_pid > 0)
        snprintf(ch->where, sizeof ch->where, "process %d on this host (same-host socket)", (int)ch->peer_pid);
    else
        snprintf(ch->where, sizeof ch->where, "a same-host socket");
}

static void accept_all(td_rpc_agent *a, int lfd, bool is_unix)
{
    for (;;) {
        td_addr from = {.len = sizeof from.ss};
        int fd = accept4(lfd, (struct sockaddr *)&from.ss, &from.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                TD_LOG_WARN("RPC agent %s: accept: %s", a->self.name, strerror(errno));
            return;
        }
        if (!is_unix)
            net_set_nodelay(fd);
        rpc_channel *ch = channel_new(fd, -1, is_unix);
        where_set(ch, &from);
        channel_register(a, ch);
    }
}

/* Closes the accepted connections that did not say hello in time (a stranger holds nothing long). */
static void close_silent(td_rpc_agent *a, int64_t now)
{
    TD_VEC(rpc_channel *) silent = {0};
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->channels.len; i++) {
        rpc_channel *ch = a->channels.items[i];
        if (ch->peer < 0 && !atomic_load(&ch->dead) && now - ch->opened_ns > (int64_t)RPC_HELLO_MS * 1000000)
            TD_VEC_PUSH(&silent, ch);
    }
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < silent.len; i++) {
        TD_LOG_WARN("RPC agent %s: closing a connection from %s that sent no hello within %d ms", a->self.name,
                    silent.items[i]->where, RPC_HELLO_MS);
        channel_fail(a, silent.items[i], "no hello");
    }
    free(silent.items);
}

/* epoll_wait that polls for the I/O thread's spin budget (agent_impl.h, "Waiting") before it
 * sleeps up to wait_ms: a message arriving within it costs no wake-up. The lanes are taken first
 * and polled beside epoll; the spin stops while another thread polls the lanes and every channel
 * is in lane mode (two threads polling the same lanes on two cores only take turns). Before it
 * sleeps, the thread says so on the lanes and looks once more (lanes_sleep). */
static int io_wait(td_rpc_agent *a, struct epoll_event *evs, int max, int wait_ms)
{
    io_polling(a);
    flush_all(a);
    bool took = rpc_lanes_poll(a);
    int n = epoll_wait(a->epoll_fd, evs, max, 0);
    if (n != 0 || took || wait_ms <= 0)
        return n;
    int64_t start = clock_now_ns();
    int64_t end = start + samehost_spin_budget(&a->spin_io);
    bool slept = false;
    for (;;) {
        int64_t now = clock_now_ns();
        bool others_poll = atomic_load_explicit(&a->lane_pollers, memory_order_relaxed) > 0 &&
                           atomic_load_explicit(&a->socket_chans, memory_order_relaxed) == 0;
        if (now >= end || others_poll) {
            io_not_polling(a);
            if (!lanes_sleep(a)) {
                lanes_awake(a);
                n = 0;
                took = true;
                break;
            }
            n = epoll_wait(a->epoll_fd, evs, max, wait_ms);
            lanes_awake(a);
            slept = true;
            break;
        }
        samehost_spin_pause(&a->spin_io, now - start);
        flush_all(a);
        if (rpc_lanes_poll(a)) {
            n = 0;
            took = true;
            break;
        }
        n = epoll_wait(a->epoll_fd, evs, max, 0);
        if (n != 0)
            break;
    }
    if (n > 0 || took)
        samehost_spin_result(&a->spin_io, slept, start);
    return n;
}

static void *io_main(void *arg)
{
    td_rpc_agent *a = arg;
    tl_io_agent = a;
    struct epoll_event evs[64];
    int64_t last_tick = clock_now_ns(), last_pool_tick = last_tick;
    while (!atomic_load(&a->io_stop)) {
        pthread_mutex_lock(&a->mu);
        int64_t next = a->next_deadline_ns;
        pthread_mutex_unlock(&a->mu);
        /* Queued work is the pool's to start within RPC_POOL_STALL_MS (pool.c). */
        bool work_waits = atomic_load_explicit(&a->pool.avail, memory_order_relaxed) > 0;
        int wait_ms = work_waits ? RPC_POOL_STALL_MS : RPC_TICK_MS;
        if (next != TD_DEADLINE_NONE) {
            int left = deadline_poll_ms(next);
            if (left < wait_ms)
                wait_ms = left;
        }
        int n = io_wait(a, evs, 64, wait_ms);
        if (n < 0 && errno != EINTR) {
            TD_LOG_ERROR("RPC agent %s: epoll_wait: %s", a->self.name, strerror(errno));
            clock_sleep_ms(10);
        }
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &tag_wake) {
                uint64_t v;
                ssize_t r = read(a->wake_fd, &v, sizeof v);
                (void)r;
            } else if (tag == &tag_tcp_listen) {
                accept_all(a, a->tcp_listen_fd, false);
            } else if (tag == &tag_unix_listen) {
                accept_all(a, a->unix_listen_fd, true);
            } else {
                if (evs[i].events & EPOLLOUT)
                    outbox_write(a, tag);
                if (evs[i].events & ~(uint32_t)EPOLLOUT)
                    channel_read(a, tag);
            }
        }
        int64_t now = clock_now_ns();
        if (now - last_tick >= (int64_t)RPC_TICK_MS * 1000000 || (next != TD_DEADLINE_NONE && now >= next)) {
            rpc_agent_expire(a);
            rpc_pool_tick(&a->pool);
            close_silent(a, now);
            last_tick = last_pool_tick = now;
        } else if (now - last_pool_tick >= (int64_t)RPC_POOL_STALL_MS * 1000000 &&
                   atomic_load_explicit(&a->pool.avail, memory_order_relaxed) > 0) {
            rpc_pool_tick(&a->pool);
            last_pool_tick = now;
        }
    }
    io_not_polling(a); /* senders write themselves from now on */
    return NULL;
}

td_status rpc_io_start(td_rpc_agent *a)
{
    TD_TRY(thread_start(&a->io_thread, "tdist-rpc-io", io_main, a));
    a->io_started = true;
    return TD_OK;
}

void rpc_io_stop(td_rpc_agent *a)
{
    if (a->io_started) {
        atomic_store(&a->io_stop, true);
        rpc_io_wake(a);
        thread_join(a->io_thread);
        a->io_started = false;
    }
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->channels.len; i++) {
        rpc_channel *ch = a->channels.items[i];
        atomic_store(&ch->dead, true);
        if (ch->fd >= 0)
            shutdown(ch->fd, SHUT_RDWR);
    }
    pthread_mutex_unlock(&a->mu);
}

void rpc_io_close(td_rpc_agent *a)
{
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->channels.len; i++) {
        rpc_channel *ch = a->channels.items[i];
        pthread_mutex_lock(&ch->send_mu);
        if (ch->fd >= 0)
            close(ch->fd);
        ch->fd = -1;
        pthread_mutex_unlock(&ch->send_mu);
    }
    pthread_mutex_unlock(&a->mu);
    /* The epoll and wake fds stay open until the last reference goes (rpc_io_free): a thread that
     * still holds one may wake the I/O thread after this, and must not write to a reused number. */
    int *fds[] = {&a->tcp_listen_fd, &a->unix_listen_fd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
}

void rpc_io_free(td_rpc_agent *a)
{
    int *fds[] = {&a->epoll_fd, &a->wake_fd};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
}

/* ---- sending ---------------------------------------------------------------------------------- */

typedef struct acked_wait {
    rpc_channel *ch;
    const rpc_cma_side *side;
    uint64_t want;
    bool help; /* the peer may offer to share the copy, and this side takes it */
} acked_wait;

static bool acked_ready(void *ctx)
{
    const acked_wait *w = ctx;
    return atomic_load(&w->side->acked) >= w->want || atomic_load(&w->ch->dead) ||
           (w->help && samehost_share_offered(&w->side->share, w->want));
}

/* A sender that stops waiting for the peer to read its pieces shuts the socket down first (send_mu
 * held, so the fd is still this channel's, or already closed): a peer still reading them sees that
 * before it delivers (pieces_read), and the caller may then let the memory go. */
static void gave_up(rpc_channel *ch)
{
    if (ch->fd >= 0)
        shutdown(ch->fd, SHUT_RDWR);
}

/* A sender's wait on its peer (send_mu held), for the peer to read its pieces or to make room in
 * its lane: polls ready(ctx) (which is also true once the channel failed) for the spin budget,
 * then sleeps on this side's bell, which the peer rings when it made progress and a failure of the
 * channel here rings too. False at the deadline. */
static bool sender_wait(td_rpc_agent *a, rpc_channel *ch, bool (*ready)(void *), void *ctx, int64_t deadline_ns)
{
    int64_t start = clock_now_ns(), spin_end = start + samehost_spin_budget(&a->spin_acked);
    bool slept = false;
    while (!ready(ctx)) {
        int64_t now = clock_now_ns();
        if (now >= deadline_ns)
            return false;
        if (now < spin_end) {
            samehost_spin_pause(&a->spin_acked, now - start);
            continue;
        }
        /* A bounded sleep: the ring of a failure that raced the registration is caught next turn. */
        int64_t until = now + (int64_t)RPC_TICK_MS * 1000000;
        slept |= samehost_bell_sleep(&ch->cma->side[ch->cma_side].bell, ready, ctx,
                                     until < deadline_ns ? until : deadline_ns);
    }
    samehost_spin_result(&a->spin_acked, slept, start);
    return true;
}

/* Waits until the peer has read this side's want-th message with pieces; when the peer offers to
 * share the copy, writes chunks of it into the peer meanwhile (transport/samehost.h). */
static td_status wait_acked(td_rpc_agent *a, rpc_channel *ch, const rpc_pieces *pieces, uint64_t want,
                            int64_t deadline_ns)
{
    rpc_cma_side *side = &ch->cma->side[ch->cma_side];
    acked_wait w = {ch, side, want, a->share_on && atomic_load(&side->can_read)};
    bool in_time = sender_wait(a, ch, acked_ready, &w, deadline_ns);
    if (in_time && w.help && samehost_share_offered(&side->share, want)) {
        samehost_span spans[RPC_PIECES_MAX];
        int n = pieces_spans(pieces, spans);
        atomic_fetch_add(&a->share_chunks_out, samehost_share_write(&side->share, want, ch->peer_pid, spans, n));
        w.help = false; /* one offer per message: now only the acknowledgement */
        in_time = sender_wait(a, ch, acked_ready, &w, deadline_ns);
    }
    if (in_time && atomic_load(&w.side->acked) >= want)
        return TD_OK;
    gave_up(ch);
    if (!in_time)
        return error_fmt(TD_ERR_TIMEOUT, "worker id %d did not read the message's large parts in time", ch->peer);
    return error_fmt(TD_ERR_PEER_LOST, "the connection closed while worker id %d read the message", ch->peer);
}

/* Room in ch's lane for any entry, wrap-around filler included (or the channel failed). */
static bool lane_room(void *ctx)
{
    rpc_channel *ch = ctx;
    uint64_t tail = atomic_load_explicit(&ch->lane_w.lane->tail, memory_order_acquire);
    if (tail > ch->lane_w.head)
        return true; /* nonsense: samehost_lane_reserve says so */
    return SAMEHOST_LANE_BYTES - (ch->lane_w.head - tail) >= 2 * (SAMEHOST_LANE_MAX + SAMEHOST_LANE_ENTRY) ||
           atomic_load(&ch->dead);
}

/* Waits until ch's lane has room. */
static td_status lane_wait_room(td_rpc_agent *a, rpc_channel *ch, int64_t deadline_ns)
{
    if (!sender_wait(a, ch, lane_room, ch, deadline_ns))
        return error_fmt(TD_ERR_TIMEOUT, "worker id %d took no messages in time", ch->peer);
    if (atomic_load(&ch->dead))
        return error_fmt(TD_ERR_PEER_LOST, "the connection is closed");
    return TD_OK;
}

/* Writes the message's bytes (v[0..n)) into ch's lane (send_mu held), in entries of at most
 * SAMEHOST_LANE_MAX, each published as it is written so the reader can start; rings the reader
 * when it sleeps and nobody polls, before any wait for room and at the end. */
static td_status lane_sendv(td_rpc_agent *a, rpc_channel *ch, const struct iovec *v, size_t n, int64_t deadline_ns)
{
    size_t left = 0;
    for (size_t i = 0; i < n; i++)
        left += v[i].iov_len;
    size_t vi = 0, voff = 0;
    bool ring = false;
    td_status st = TD_OK;
    while (left > 0) {
        size_t want = left < SAMEHOST_LANE_MAX ? left : SAMEHOST_LANE_MAX;
        bool corrupt = false;
        uint8_t *dst = samehost_lane_reserve(&ch->lane_w, LANE_BYTES_KIND, want, &corrupt);
        if (corrupt) {
            st = error_fmt(TD_ERR_PEER_LOST, "worker id %d's lane words make no sense", ch->peer);
            break;
        }
        if (!dst) {
            if (ring)
                lane_ring(a, ch);
            ring = false;
            st = lane_wait_room(a, ch, deadline_ns);
            if (st != TD_OK)
                break;
            continue;
        }
        for (size_t at = 0; at < want;) {
            while (voff == v[vi].iov_len) {
                vi++;
                voff = 0;
            }
            size_t k = v[vi].iov_len - voff < want - at ? v[vi].iov_len - voff : want - at;
            memcpy(dst + at, (const uint8_t *)v[vi].iov_base + voff, k);
            at += k;
            voff += k;
        }
        left -= want;
        ring |= samehost_lane_publish(&ch->lane_w);
    }
    if (ring)
        lane_ring(a, ch);
    return st;
}

/* Writes, on this thread (send_mu held, the channel live), what the outbox holds and then
 * v[1..n]; v[0] is filled here. Blocks until written or the deadline. */
static td_status outbox_then(rpc_channel *ch, struct iovec *v, size_t n, int64_t deadline_ns)
{
    v[0].iov_base = ch->outbox + ch->outbox_off;
    v[0].iov_len = ch->outbox_len - ch->outbox_off;
    ch->outbox_off = ch->outbox_len;
    return net_sendv_all(ch->fd, v, (int)n + 1, deadline_ns);
}

/* Hands a small message to the I/O thread (see "Handing sends over"). False when it does not
 * poll or the outbox is full: the caller writes. */
static bool hand_over(td_rpc_agent *a, rpc_channel *ch, const struct iovec *v, size_t n, size_t bytes,
                      int64_t deadline_ns, td_status *st)
{
    if (!atomic_load_explicit(&a->io_polling, memory_order_relaxed))
        return false;
    pthread_mutex_lock(&ch->send_mu);
    bool handed = ch->outbox_len - ch->outbox_off < RPC_OUTBOX_MAX && ch->fd >= 0 && !atomic_load(&ch->dead);
    if (handed)
        outbox_append(ch, v, n, bytes);
    pthread_mutex_unlock(&ch->send_mu);
    if (!handed)
        return false;
    atomic_fetch_add_explicit(&a->sends_handed, 1, memory_order_relaxed);
    flush_list_push(a, ch);
    *st = TD_OK;
    if (!atomic_load(&a->io_polling)) {
        /* The thread stopped polling meanwhile and may not have seen the list: write it here. */
        struct iovec outbox[1];
        pthread_mutex_lock(&ch->send_mu);
        if (ch->outbox_off < ch->outbox_len && ch->fd >= 0 && !atomic_load(&ch->dead))
            *st = outbox_then(ch, outbox, 0, deadline_ns);
        pthread_mutex_unlock(&ch->send_mu);
    }
    return true;
}

/* Writes the message on this thread, after what the outbox holds, and for pieces waits until the
 * peer has read them. */
static td_status send_written(td_rpc_agent *a, rpc_channel *ch, const rpc_outgoing *m, const struct iovec *iov,
                              size_t count, size_t bytes, int64_t deadline_ns)
{
    /* v[0] is for what the outbox holds. */
    struct iovec local[17];
    struct iovec *v = count + 2 <= 17 ? local : alloc_or_die((count + 2) * sizeof *v);
    /* Single copy when the peer reads this process's memory and the payload has large parts. */
    rpc_pieces pieces = {0};
    uint8_t hdr[RPC_HEADER_BYTES], table[RPC_PIECES_WIRE_MAX];
    size_t n = count;
    if (ch->cma && a->piece_min > 0 && bytes >= a->piece_min &&
        atomic_load(&ch->cma->side[1 - ch->cma_side].can_read))
        rpc_outgoing_pieces(m, a->piece_min, &pieces, hdr, table, v + 1, &n);
    if (pieces.count == 0)
        memcpy(v + 1, iov, count * sizeof *v);
    td_status st;
    pthread_mutex_lock(&ch->send_mu);
    if (atomic_load(&ch->dead) || ch->fd < 0)
        st = error_fmt(TD_ERR_PEER_LOST, "the connection is closed");
    else if (ch->lanes) /* never an outbox: lane messages are not handed over */
        st = lane_sendv(a, ch, v + 1, n, deadline_ns);
    else
        st = outbox_then(ch, v, n, deadline_ns);
    if (st == TD_OK && pieces.count > 0)
        st = wait_acked(a, ch, &pieces, ++ch->cma_sent, deadline_ns);
    pthread_mutex_unlock(&ch->send_mu);
    if (v != local)
        free(v);
    return st;
}

td_status rpc_channel_send(td_rpc_agent *a, rpc_channel *ch, const rpc_outgoing *m, bool hand, int64_t deadline_ns)
{
    size_t count = 0;
    const struct iovec *iov = rpc_outgoing_iov(m, &count);
    size_t bytes = rpc_outgoing_size(m);
    td_status st = TD_OK;
    if (!hand || !a->hand_on || ch->lanes || bytes > RPC_HAND_MAX ||
        !hand_over(a, ch, iov, count, bytes, deadline_ns, &st))
        st = send_written(a, ch, m, iov, count, bytes, deadline_ns);
    /* Failing the channel shuts its socket down before the caller lets the payload go: a peer
     * still reading the pieces sees that and drops them (pieces_read). */
    if (st != TD_OK && !atomic_load(&ch->dead)) {
        char why[TD_ERROR_MAX];
        snprintf(why, sizeof why, "sending failed: %s", td_last_error());
        rpc_agent_channel_failed(a, ch, why);
        error_fmt(st, "%s", why);
    }
    return st;
}

td_status rpc_loopback_send(td_rpc_agent *a, const rpc_outgoing *m)
{
    size_t count = 0;
    const struct iovec *iov = rpc_outgoing_iov(m, &count);
    size_t total = 0;
    for (size_t i = 0; i < count; i++)
        total += iov[i].iov_len;
    if (total < RPC_HEADER_BYTES)
        return error_fmt(TD_ERR_INTERNAL, "an RPC message of %zu bytes has no header", total);
    uint8_t hdr[RPC_HEADER_BYTES];
    td_storage *payload = NULL;
    if (total > RPC_HEADER_BYTES)
        TD_TRY(storage_new_uninit(total - RPC_HEADER_BYTES, &payload));
    char *body = payload ? td_storage_data(payload) : NULL;
    size_t at = 0;
    for (size_t i = 0; i < count; i++) {
        const char *src = iov[i].iov_base;
        size_t len = iov[i].iov_len;
        while (len > 0) {
            size_t n;
            if (at < RPC_HEADER_BYTES) {
                n = RPC_HEADER_BYTES - at < len ? RPC_HEADER_BYTES - at : len;
                memcpy(hdr + at, src, n);
            } else {
                n = len;
                memcpy(body + (at - RPC_HEADER_BYTES), src, n);
            }
            at += n;
            src += n;
            len -= n;
        }
    }
    rpc_header h;
    td_status st = rpc_header_read(hdr, UINT64_MAX, &h);
    if (st != TD_OK) {
        td_storage_release(payload);
        return st;
    }
    rpc_agent_deliver(a, (int)a->self.id, &h, payload);
    return TD_OK;
}
