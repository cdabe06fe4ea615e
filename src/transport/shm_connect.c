/* Setting up the shm transport through a store (td_shm_transport_create, shm.h).
 *
 * Each rank creates its segment (unlinked from /dev/shm at once: only fds and mappings keep it),
 * writes its header, listens on an abstract UNIX-domain socket, and publishes "hostid sockname
 * nonce pid" under "<prefix><generation>/addr/<rank>" (the generation counts this rank's shm
 * transports on the store, so a group re-created under the same name never reads stale keys).
 * Having read every peer's entry (and checked that all are on this host), it connects to each
 * higher rank and sends a hello with its segment's fd attached (SCM_RIGHTS); the higher rank checks
 * it (the nonce it published proves the sender read the store) and answers with its own hello and
 * fd, or a refusal that says why. Everything after the connects runs in one poll loop bounded by
 * the group's timeout, so a stray or silent connection cannot stall the set-up. Then each rank
 * maps its peers' segments, checks their headers, and hands all of it to the engine (shm.c). */
#include "transport/shm_impl.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <tdist/store.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"

#define MAX_PENDING 64

typedef struct conn {
    int fd;
    int seg_fd; /* the fd that came with its hello */
    uint8_t buf[TD_SHM_HELLO_SIZE];
    size_t got;
} conn;

typedef struct setup {
    const td_shm_options *o;
    int rank, size;
    const char *prefix;
    int64_t generation;
    int64_t deadline;
    uint64_t nonce;
    uint64_t group_hash;
    td_shm_layout layout;
    size_t seg_size;
    td_segment seg;
    char host_id[TD_HOST_ID_MAX];
    uint64_t *peer_nonce;
    conn *out;        /* to higher ranks, awaiting the answer */
    conn pend[MAX_PENDING];
    int npend;
    shm_peer_setup *peers;
    bool *ready;
    char last_refusal[TD_SHM_HELLO_MSG_MAX + 64];
} setup;

static int grank_of(const setup *s, int r) { return s->o->global_ranks ? s->o->global_ranks[r] : r; }

static void conn_reset(conn *c)
{
    c->fd = c->seg_fd = -1;
    c->got = 0;
}

static void conn_close(conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->seg_fd >= 0)
        close(c->seg_fd);
    conn_reset(c);
}

/* ---- sockets ----------------------------------------------------------------------------------- */

static socklen_t unix_addr(const char *name, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t len = strlen(name);
    if (len > sizeof a->sun_path - 2)
        len = sizeof a->sun_path - 2;
    memcpy(a->sun_path + 1, name, len); /* abstract: nothing in the file system */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

/* Sends a hello (with fd attached when fd >= 0) in one message; the socket is blocking for it,
 * and a hello always fits in an empty socket buffer. */
static td_status send_hello(int sock, const td_shm_hello *h, int fd)
{
    uint8_t b[TD_SHM_HELLO_SIZE];
    td_shm_hello_encode(b, h);
    struct iovec iov = {b, sizeof b};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&cm, 0, sizeof cm);
        mh.msg_control = cm.buf;
        mh.msg_controllen = sizeof cm.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    for (;;) {
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == (ssize_t)sizeof b)
            return TD_OK;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return td_error_errno(TD_ERR_IO, "sending the shm transport hello");
        return td_error(TD_ERR_IO, "sending the shm transport hello: the socket took only %zd of %zu bytes", n,
                        sizeof b);
    }
}

/* Reads what is there of a hello, keeping an fd that comes with it. 1: complete, 0: more to come,
 * -1: EOF or error (or a second fd). */
static int read_hello(conn *c)
{
    while (c->got < TD_SHM_HELLO_SIZE) {
        struct iovec iov = {c->buf + c->got, TD_SHM_HELLO_SIZE - c->got};
        union {
            char buf[CMSG_SPACE(sizeof(int) * 4)];
            struct cmsghdr align;
        } cm;
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf, .msg_controllen = sizeof cm.buf};
        ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0)
            return -1;
        bool extra = false;
        for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
            if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
                continue;
            size_t nfd = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < nfd; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
                if (c->seg_fd < 0 && !extra)
                    c->seg_fd = fd;
                else {
                    close(fd);
                    extra = true;
                }
            }
        }
        if (extra || (mh.msg_flags & MSG_CTRUNC))
            return -1;
        c->got += (size_t)n;
    }
    return 1;
}

/* ---- the store entries ------------------------------------------------------------------------- */

static void addr_key(const setup *s, int r, char *out, size_t size)
{
    snprintf(out, size, "%s%lld/addr/%d", s->prefix, (long long)s->generation, r);
}

static td_status read_entry(setup *s, int r, char *sock_name, size_t name_size)
{
    char key[256];
    addr_key(s, r, key, sizeof key);
    const char *keys[1] = {key};
    int64_t left = td_deadline_left_ms(s->deadline);
    td_status st = td_store_wait(s->o->store, keys, 1, left == INT64_MAX ? 0 : (left > 0 ? left : 1));
    if (st != TD_OK)
        return td_error_prefix(st, "waiting for rank %d to publish its shm transport address in the store",
                               grank_of(s, r));
    void *v = NULL;
    size_t n = 0;
    TD_TRY(td_store_get(s->o->store, key, &v, &n));
    char text[512], hid[TD_HOST_ID_MAX], name[96];
    unsigned long long nonce = 0;
    int pid = 0;
    bool ok = n < sizeof text;
    if (ok) {
        memcpy(text, v, n);
        text[n] = '\0';
        ok = sscanf(text, "%191s %95s %llx %d", hid, name, &nonce, &pid) == 4;
    }
    free(v);
    if (!ok)
        return td_error(TD_ERR_INVALID, "rank %d's shm transport address in the store is malformed", grank_of(s, r));
    if (strcmp(hid, s->host_id) != 0 || strcmp(hid, "-") == 0)
        return td_error(TD_ERR_INVALID,
                        "The shm backend needs every rank of the group on one host, but rank %d is on another host "
                        "(host id %s; rank %d's is %s). Use the auto backend, which uses shared memory within each "
                        "host and tcp between hosts",
                        grank_of(s, r), hid, grank_of(s, s->rank), s->host_id);
    s->peer_nonce[r] = nonce;
    snprintf(sock_name, name_size, "%s", name);
    return TD_OK;
}

/* ---- hellos ------------------------------------------------------------------------------------ */

static td_shm_hello my_hello(const setup *s, int to, int type, const char *msg)
{
    td_shm_hello h = {
        .type = type,
        .from = (uint32_t)s->rank,
        .to = (uint32_t)to,
        .world = (uint32_t)s->size,
        .pid = (uint32_t)getpid(),
        .nonce = to >= 0 && to < s->size ? s->peer_nonce[to] : 0,
        .seg_size = s->seg_size,
        .layout = s->layout,
        .group_hash = s->group_hash,
        .msg = msg,
        .msg_len = msg ? strlen(msg) : 0,
    };
    return h;
}

/* What is wrong with a peer's hello, or NULL. */
static const char *hello_problem(const setup *s, const td_shm_hello *h, int expect_from)
{
    if (h->to != (uint32_t)s->rank || h->world != (uint32_t)s->size)
        return "it is for another rank or world size";
    if (expect_from >= 0 ? h->from != (uint32_t)expect_from : h->from >= (uint32_t)s->rank)
        return "it comes from an unexpected rank";
    if (h->group_hash != s->group_hash)
        return "it is for another process group";
    if (h->layout.ring_bytes != s->layout.ring_bytes || h->layout.small_bytes != s->layout.small_bytes ||
        h->layout.slot_bytes != s->layout.slot_bytes)
        return "its TDIST_SHM_RING, TDIST_SHM_SMALL or TDIST_SHM_SLOT differs from this rank's (every rank must use "
               "the same values)";
    if (h->seg_size != s->seg_size)
        return "its segment size differs";
    return NULL;
}

static void drop_pending(setup *s, int i)
{
    conn_close(&s->pend[i]);
    s->pend[i] = s->pend[--s->npend];
}

/* A lower rank's hello on an accepted connection: answer it, or drop it. True when consumed. */
static bool handle_pending(setup *s, int i)
{
    conn *c = &s->pend[i];
    int rc = read_hello(c);
    if (rc == 0)
        return false;
    td_shm_hello h;
    const char *why = NULL;
    if (rc < 0 || !td_shm_hello_parse(c->buf, c->got, &h, &why) || h.type != TD_SHM_HELLO ||
        h.nonce != s->nonce) {
        /* Not a peer of this group that read our entry: a stray. */
        drop_pending(s, i);
        return true;
    }
    const char *problem = hello_problem(s, &h, -1);
    if (!problem && c->seg_fd < 0)
        problem = "its segment's fd did not come with it";
    if (!problem && s->ready[h.from])
        problem = "that rank is already connected";
    if (problem) {
        char msg[TD_SHM_HELLO_MSG_MAX];
        snprintf(msg, sizeof msg, "rank %d refused the connection: %s", grank_of(s, s->rank), problem);
        snprintf(s->last_refusal, sizeof s->last_refusal, "from rank %u: %s", h.from, problem);
        td_shm_hello no = my_hello(s, (int)h.from, TD_SHM_REFUSE, msg);
        no.nonce = 0;
        send_hello(c->fd, &no, -1);
        drop_pending(s, i);
        return true;
    }
    td_shm_hello yes = my_hello(s, (int)h.from, TD_SHM_HELLO, NULL);
    if (send_hello(c->fd, &yes, s->seg.fd) != TD_OK) {
        drop_pending(s, i);
        return true;
    }
    int r = (int)h.from;
    s->peers[r].sock = c->fd;
    s->peers[r].pid = 0;
    s->ready[r] = true;
    int seg_fd = c->seg_fd;
    c->fd = c->seg_fd = -1;
    s->pend[i] = s->pend[--s->npend];
    /* Map it now, so that its fd is not held twice. */
    if (td_segment_map_fd(seg_fd, s->seg_size, &s->peers[r].seg) != TD_OK) {
        /* The lower rank sees the connection close and fails with its own message. */
        TD_LOG_WARN("shm transport of rank %d: %s", grank_of(s, s->rank), td_last_error());
        close(seg_fd);
        close(s->peers[r].sock);
        s->peers[r].sock = -1;
        s->ready[r] = false;
    }
    return true;
}

/* The answer of higher rank r to our hello. */
static td_status handle_answer(setup *s, int r)
{
    conn *c = &s->out[r];
    int rc = read_hello(c);
    if (rc == 0)
        return TD_OK;
    if (rc < 0)
        return td_error(TD_ERR_PEER_LOST, "rank %d closed the connection during the shm transport handshake",
                        grank_of(s, r));
    td_shm_hello h;
    const char *why = NULL;
    if (!td_shm_hello_parse(c->buf, c->got, &h, &why))
        return td_error(TD_ERR_INVALID, "rank %d answered the shm transport hello with %s", grank_of(s, r), why);
    if (h.type == TD_SHM_REFUSE)
        return td_error(TD_ERR_INVALID, "%.*s", (int)h.msg_len, h.msg ? h.msg : "");
    const char *problem = h.nonce != s->nonce ? "it did not read this rank's store entry" : hello_problem(s, &h, r);
    if (!problem && c->seg_fd < 0)
        problem = "its segment's fd did not come with it";
    if (problem)
        return td_error(TD_ERR_INVALID, "rank %d's answer to the shm transport hello is unusable: %s", grank_of(s, r),
                        problem);
    td_status st = td_segment_map_fd(c->seg_fd, s->seg_size, &s->peers[r].seg);
    if (st != TD_OK)
        return td_error_prefix(st, "mapping rank %d's shared-memory segment", grank_of(s, r));
    c->seg_fd = -1;
    s->peers[r].sock = c->fd;
    c->fd = -1;
    s->ready[r] = true;
    return TD_OK;
}

static td_status missing_msg(setup *s)
{
    char list[512] = "";
    size_t len = 0;
    int n = 0;
    for (int r = 0; r < s->size && len < sizeof list - 16; r++)
        if (r != s->rank && !s->ready[r])
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", n++ ? ", " : "", grank_of(s, r));
    return td_error(TD_ERR_TIMEOUT,
                    "Timed out after %lld ms setting up the shm transport of rank %d: no connection yet with rank%s "
                    "%s%s%s",
                    (long long)s->o->timeout_ms, grank_of(s, s->rank), n > 1 ? "s" : "", list,
                    s->last_refusal[0] ? "; last refused connection: " : "", s->last_refusal);
}

static td_status handshake(setup *s, int lfd)
{
    struct pollfd *pf = TD_NEW_ARRAY(struct pollfd, (size_t)(1 + s->size + MAX_PENDING));
    int *who = TD_NEW_ARRAY(int, (size_t)(1 + s->size + MAX_PENDING));
    td_status st = TD_OK;
    for (;;) {
        int missing = 0, lower_missing = 0;
        for (int r = 0; r < s->size; r++)
            if (r != s->rank && !s->ready[r]) {
                missing++;
                lower_missing += r < s->rank;
            }
        if (!missing)
            break;
        if (td_deadline_passed(s->deadline)) {
            st = missing_msg(s);
            break;
        }
        int n = 0;
        if (lower_missing) {
            pf[n] = (struct pollfd){.fd = lfd, .events = POLLIN};
            who[n++] = -1;
        }
        for (int r = s->rank + 1; r < s->size; r++)
            if (!s->ready[r] && s->out[r].fd >= 0) {
                pf[n] = (struct pollfd){.fd = s->out[r].fd, .events = POLLIN};
                who[n++] = r;
            }
        for (int i = 0; i < s->npend; i++) {
            pf[n] = (struct pollfd){.fd = s->pend[i].fd, .events = POLLIN};
            who[n++] = -2 - i;
        }
        int rc = poll(pf, (nfds_t)n, td_deadline_poll_ms(s->deadline));
        if (rc < 0 && errno != EINTR) {
            st = td_error_errno(TD_ERR_IO, "poll during the shm transport set-up");
            break;
        }
        if (rc <= 0)
            continue;
        /* Pending entries move when one is consumed: highest index first. */
        for (int k = n - 1; k >= 0 && st == TD_OK; k--) {
            if (!pf[k].revents)
                continue;
            if (who[k] >= 0)
                st = handle_answer(s, who[k]);
            else if (who[k] <= -2)
                handle_pending(s, -2 - who[k]);
        }
        if (st != TD_OK)
            break;
        if (lower_missing && (pf[0].revents & POLLIN)) {
            for (;;) {
                int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    break;
                if (s->npend == MAX_PENDING)
                    drop_pending(s, 0);
                conn *c = &s->pend[s->npend++];
                conn_reset(c);
                c->fd = fd;
                handle_pending(s, s->npend - 1);
            }
        }
    }
    free(pf);
    free(who);
    return st;
}

/* ---- create ------------------------------------------------------------------------------------ */

static void init_segment(setup *s)
{
    td_shm_seg_header *h = s->seg.base;
    h->magic = TD_SHM_MAGIC;
    h->version = TD_SHM_VERSION;
    h->rank = (uint32_t)s->rank;
    h->world = (uint32_t)s->size;
    h->pid = (uint32_t)getpid();
    h->size = s->seg_size;
    h->layout = s->layout;
    /* The rest (doorbell, counters, rings) starts as zeros, as a fresh tmpfs object reads. */
}

static td_status check_peers(setup *s)
{
    for (int r = 0; r < s->size; r++) {
        if (r == s->rank)
            continue;
        shm_peer_setup *p = &s->peers[r];
        if (!p->seg.base)
            return td_error(TD_ERR_IO, "mapping rank %d's shared-memory segment failed", grank_of(s, r));
        const char *why = NULL;
        if (!td_shm_seg_header_check(p->seg.base, (uint32_t)r, (uint32_t)s->size, s->seg_size, &s->layout, &why))
            return td_error(TD_ERR_INVALID, "rank %d's shared-memory segment is unusable: %s", grank_of(s, r), why);
        /* The segment stays mapped; its fd is not needed any more. */
        if (p->seg.fd >= 0) {
            close(p->seg.fd);
            p->seg.fd = -1;
        }
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(p->sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
            p->pid = cred.pid;
    }
    return TD_OK;
}

td_status td_shm_transport_create(const td_shm_options *o, td_transport **out)
{
    *out = NULL;
    if (o->size < 1 || o->rank < 0 || o->rank >= o->size)
        return td_error(TD_ERR_INVALID, "invalid rank %d for a group of %d", o->rank, o->size);
    setup s;
    memset(&s, 0, sizeof s);
    s.o = o;
    s.rank = o->rank;
    s.size = o->size;
    s.prefix = o->key_prefix ? o->key_prefix : "shm/";
    s.deadline = td_deadline_after_ms(o->timeout_ms);
    s.group_hash = td_shm_name_hash(o->group_name);
    s.seg = (td_segment)TD_SEGMENT_INIT;
    TD_TRY(shm_layout_from_env(o->size, &s.layout));
    shm_offsets off;
    shm_layout_offsets(o->size, &s.layout, &off);
    s.seg_size = off.total;
    TD_TRY(td_segment_create("shm", s.seg_size, true, true, &s.seg));
    init_segment(&s);
    s.peers = TD_NEW_ARRAY(shm_peer_setup, (size_t)o->size);
    for (int r = 0; r < o->size; r++) {
        s.peers[r].sock = -1;
        s.peers[r].seg = (td_segment)TD_SEGMENT_INIT;
    }
    td_status st = TD_OK;
    int lfd = -1;
    if (o->size == 1)
        goto start;
    s.peer_nonce = TD_NEW_ARRAY(uint64_t, (size_t)o->size);
    s.ready = TD_NEW_ARRAY(bool, (size_t)o->size);
    s.out = TD_NEW_ARRAY(conn, (size_t)o->size);
    for (int r = 0; r < o->size; r++)
        conn_reset(&s.out[r]);
    if (getrandom(&s.nonce, sizeof s.nonce, 0) != sizeof s.nonce)
        s.nonce = (uint64_t)td_now_ns() ^ ((uint64_t)getpid() << 32);
    td_host_id(s.host_id, sizeof s.host_id);
    if (!s.host_id[0])
        snprintf(s.host_id, sizeof s.host_id, "-");

    char gen_key[256], name[96], key[256], val[512];
    snprintf(gen_key, sizeof gen_key, "%sgen/%d", s.prefix, o->rank);
    st = td_store_add(o->store, gen_key, 1, &s.generation);
    if (st != TD_OK) {
        td_error_prefix(st, "shm transport of rank %d: counting its generation in the store", grank_of(&s, o->rank));
        goto done;
    }
    snprintf(name, sizeof name, "tdist-shm-%d-%016llx", (int)getpid(), (unsigned long long)s.nonce);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    socklen_t alen = unix_addr(name, &a);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, alen) != 0 || listen(lfd, o->size + 16) != 0) {
        st = td_error_errno(TD_ERR_IO, "shm transport of rank %d: listening on a UNIX-domain socket",
                            grank_of(&s, o->rank));
        goto done;
    }
    snprintf(val, sizeof val, "%s %s %016llx %d", s.host_id, name, (unsigned long long)s.nonce, (int)getpid());
    addr_key(&s, o->rank, key, sizeof key);
    st = td_store_set_str(o->store, key, val);
    if (st != TD_OK) {
        td_error_prefix(st, "publishing rank %d's shm transport address in the store", grank_of(&s, o->rank));
        goto done;
    }
    char *names = td_calloc((size_t)o->size, 96);
    for (int r = 0; r < o->size && st == TD_OK; r++)
        if (r != o->rank)
            st = read_entry(&s, r, names + (size_t)r * 96, 96);
    for (int r = o->rank + 1; r < o->size && st == TD_OK; r++) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        socklen_t l = unix_addr(names + (size_t)r * 96, &a);
        /* A listening UNIX socket takes the connection at once (or refuses): no network wait. */
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, l) != 0) {
            st = td_error_errno(TD_ERR_PEER_LOST, "connecting to rank %d's shm transport socket", grank_of(&s, r));
            if (fd >= 0)
                close(fd);
            break;
        }
        s.out[r].fd = fd;
        td_shm_hello h = my_hello(&s, r, TD_SHM_HELLO, NULL);
        st = send_hello(fd, &h, s.seg.fd);
        if (st != TD_OK)
            td_error_prefix(st, "rank %d", grank_of(&s, r));
    }
    free(names);
    if (st == TD_OK)
        st = handshake(&s, lfd);
    if (st == TD_OK)
        st = check_peers(&s);
done:
    if (lfd >= 0)
        close(lfd);
    for (int i = s.npend - 1; i >= 0; i--)
        drop_pending(&s, i);
    for (int r = 0; s.out && r < o->size; r++)
        conn_close(&s.out[r]);
    free(s.out);
    free(s.peer_nonce);
    free(s.ready);
    if (st != TD_OK) {
        for (int r = 0; r < o->size; r++) {
            if (s.peers[r].sock >= 0)
                close(s.peers[r].sock);
            td_segment_unmap(&s.peers[r].seg);
        }
        free(s.peers);
        td_segment_unmap(&s.seg);
        return st;
    }
start:
    /* The own fd went to every peer; the mapping is all this rank needs. */
    if (s.seg.fd >= 0) {
        close(s.seg.fd);
        s.seg.fd = -1;
    }
    st = shm_transport_start(o->rank, o->size, o->global_ranks, &s.seg, &s.layout, s.peers, out);
    free(s.peers);
    return st;
}
