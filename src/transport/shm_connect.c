/* Setting up the shm transport through a store (shm_transport_create, shm.h).
 *
 * Each rank creates its segment (unlinked from /dev/shm at once: only fds and mappings keep it),
 * writes its header, listens on an abstract UNIX-domain socket, and publishes "hostid sockname
 * nonce pid" as its entry in the store (peer_rendezvous.h: the steps every transport's set-up shares).
 * Having read every peer's entry (and checked that all are on this host), it connects to each
 * higher rank and sends a hello with its segment's fd attached (SCM_RIGHTS); the higher rank checks
 * it (the nonce it published proves the sender read the store) and answers with its own hello and
 * fd, or a refusal that says why, all in the rendezvous' poll loop bounded by the group's timeout.
 * A segment's fd hands over all of a rank's memory traffic, so it goes only to a process of this
 * user (SO_PEERCRED, checked on both ends: an abstract socket admits anyone) and, with a job secret
 * (TDIST_AUTH_TOKEN), only to one whose hello proved it holds the secret; the answer proves it
 * back (peer_rendezvous.h).
 * Then each rank maps its peers' segments, checks their headers, and hands all of it to the engine
 * (shm.c). */
#include "transport/shm_impl.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "transport/peer_rendezvous.h"
#include "transport/samehost.h"

#define NAME_MAX_LEN TD_SHM_ENTRY_NAME_MAX

typedef struct setup {
    td_rdv v;
    uint64_t group_hash;
    td_shm_layout layout;
    size_t seg_size;
    td_segment seg;
    char host_id[TD_HOST_ID_MAX];
    uint64_t *peer_nonce;
    uint8_t *hello_nonce; /* per higher rank: the fresh nonce of our hello (AUTH_NONCE_LEN bytes) */
    shm_peer_setup *peers;
} setup;

static int grank_of(const setup *s, int r) { return rdv_grank(&s->v, r); }

/* ---- hellos on the socket ---------------------------------------------------------------------- */

#define HELLO_LABEL "tdist shm hello"
#define ACCEPT_LABEL "tdist shm accept"

/* Sends a hello (with fd attached when fd >= 0) in one message; the socket is blocking for it,
 * and a hello always fits in an empty socket buffer. A hello or an answer (challenge: the
 * connector's nonce, which the answer's proof also covers) gets its proof here; a refusal none. */
static td_status send_hello(const setup *s, int sock, const td_shm_hello *h, int fd, const uint8_t *challenge)
{
    uint8_t b[TD_SHM_HELLO_SIZE];
    shm_hello_encode(b, h);
    if (h->type == TD_SHM_HELLO) {
        auth_part parts[2] = {{b, TD_SHM_HELLO_PROOF_AT}, {challenge, AUTH_NONCE_LEN}};
        rdv_auth_prove(&s->v, challenge ? ACCEPT_LABEL : HELLO_LABEL, parts, challenge ? 2 : 1,
                       b + TD_SHM_HELLO_PROOF_AT);
    }
    for (;;) {
        ssize_t n = samehost_send_fd(sock, b, sizeof b, fd);
        if (n == (ssize_t)sizeof b)
            return TD_OK;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return error_errno(TD_ERR_IO, "sending the shm transport hello");
        return error_fmt(TD_ERR_IO, "sending the shm transport hello: the socket took only %zd of %zu bytes", n,
                        sizeof b);
    }
}

/* Reads what is there of a hello, keeping an fd that comes with it. 1: complete, 0: more to come,
 * -1: EOF or error (or a second fd). */
static int read_hello(td_rdv_conn *c)
{
    while (c->got < TD_SHM_HELLO_SIZE) {
        bool extra = false;
        ssize_t n = samehost_recv_fd(c->fd, c->buf + c->got, TD_SHM_HELLO_SIZE - c->got, &c->passed_fd, &extra);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n <= 0 || extra)
            return -1;
        c->got += (size_t)n;
    }
    return 1;
}

/* ---- the store entries ------------------------------------------------------------------------- */

static td_status read_entry(setup *s, int r, char *sock_name, size_t name_size)
{
    char text[512];
    TD_TRY(rdv_read(&s->v, r, "shm transport address", text, sizeof text));
    td_shm_entry e;
    TD_TRY(shm_entry_parse(text, grank_of(s, r), &e));
    const char *hid = e.host_id;
    if (strcmp(hid, s->host_id) != 0 || strcmp(hid, "-") == 0)
        return error_fmt(TD_ERR_INVALID,
                        "The shm backend needs every rank of the group on one host, but rank %d is on another host "
                        "(host id %s; rank %d's is %s). Use the auto backend, which uses shared memory within each "
                        "host and tcp between hosts",
                        grank_of(s, r), hid, grank_of(s, s->v.rank), s->host_id);
    s->peer_nonce[r] = e.nonce;
    snprintf(sock_name, name_size, "%s", e.sock_name);
    return TD_OK;
}

/* ---- hellos ------------------------------------------------------------------------------------ */

/* A hello from this rank; one of type TD_SHM_HELLO gets a fresh nonce (into *nonce_out, when not
 * NULL). */
static td_shm_hello my_hello(const setup *s, int to, int type, const char *msg, uint8_t *nonce_out)
{
    td_shm_hello h = {
        .type = type,
        .flags = s->v.auth.on ? TD_SHM_FLAG_AUTH : 0,
        .from = (uint32_t)s->v.rank,
        .to = (uint32_t)to,
        .world = (uint32_t)s->v.size,
        .pid = (uint32_t)getpid(),
        .nonce = to >= 0 && to < s->v.size ? s->peer_nonce[to] : 0,
        .seg_size = s->seg_size,
        .layout = s->layout,
        .group_hash = s->group_hash,
        .msg = msg,
        .msg_len = msg ? strlen(msg) : 0,
    };
    if (type == TD_SHM_HELLO) {
        auth_nonce(h.auth_nonce);
        if (nonce_out)
            memcpy(nonce_out, h.auth_nonce, AUTH_NONCE_LEN);
    }
    return h;
}

/* What is wrong with a peer's hello, or NULL. */
static const char *hello_problem(const setup *s, const td_shm_hello *h, int expect_from)
{
    if (h->to != (uint32_t)s->v.rank || h->world != (uint32_t)s->v.size)
        return "it is for another rank or world size";
    if (expect_from >= 0 ? h->from != (uint32_t)expect_from : h->from >= (uint32_t)s->v.rank)
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

/* Refuses pending connection i with msg, which the connector reports; why goes to the log and the
 * set-up's timeout message. */
static void refuse(setup *s, int i, uint32_t from, const char *why)
{
    td_rdv *v = &s->v;
    char msg[TD_SHM_HELLO_MSG_MAX];
    snprintf(msg, sizeof msg, "rank %d refused the connection: %s", grank_of(s, v->rank), why);
    TD_LOG_WARN("shm transport of rank %d refused a connection: %s", grank_of(s, v->rank), why);
    snprintf(v->last_refusal, sizeof v->last_refusal, "from rank %u: %s", from, why);
    td_shm_hello no = my_hello(s, (int)from, TD_SHM_REFUSE, msg, NULL);
    no.nonce = 0;
    send_hello(s, v->pend[i].fd, &no, -1, NULL);
    rdv_drop(v, i);
}

/* A lower rank's hello on an accepted connection: answer it, or drop it. */
static void handle_pending(td_rdv *v, int i)
{
    setup *s = v->arg;
    td_rdv_conn *c = &v->pend[i];
    int rc = read_hello(c);
    const char *why = NULL;
    if (rc == 0 && !shm_hello_prefix_ok(c->buf, c->got, &why)) {
        /* A peer of another version waits for an answer of its own size: close at once. */
        TD_LOG_WARN("shm transport of rank %d dropped a connection: %s", grank_of(s, v->rank), why);
        rdv_drop(v, i);
        return;
    }
    if (rc == 0)
        return;
    td_shm_hello h;
    if (rc < 0 || !shm_hello_parse(c->buf, c->got, &h, &why) || h.type != TD_SHM_HELLO) {
        if (why)
            TD_LOG_WARN("shm transport of rank %d dropped a connection: %s", grank_of(s, v->rank), why);
        rdv_drop(v, i);
        return;
    }
    /* First of all, before the nonce says whether it read our entry: a process of another user
     * gets nothing of ours, and is told why. */
    uid_t uid;
    pid_t pid;
    if (!samehost_peer_same_user(c->fd, &uid, &pid)) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "the connecting process (pid %d) runs as uid %ld and rank %d as uid %ld; the shm transport shares "
                 "memory only between processes of one user",
                 (int)pid, uid == (uid_t)-1 ? -1L : (long)uid, grank_of(s, v->rank), (long)geteuid());
        refuse(s, i, h.from, msg);
        return;
    }
    if (h.nonce != v->nonce) {
        /* Not a peer of this group that read our entry: a stray. */
        rdv_drop(v, i);
        return;
    }
    char auth_msg[TD_SHM_HELLO_MSG_MAX];
    auth_part signed_part = {c->buf, TD_SHM_HELLO_PROOF_AT};
    const char *problem = NULL;
    if (!rdv_auth_check_hello(v, h.flags & TD_SHM_FLAG_AUTH, HELLO_LABEL, &signed_part, 1, h.proof, auth_msg,
                              sizeof auth_msg))
        problem = auth_msg;
    if (!problem)
        problem = hello_problem(s, &h, -1);
    if (!problem && c->passed_fd < 0)
        problem = "its segment's fd did not come with it";
    if (!problem && v->fds[h.from] >= 0)
        problem = "that rank is already connected";
    if (problem) {
        refuse(s, i, h.from, problem);
        return;
    }
    td_shm_hello yes = my_hello(s, (int)h.from, TD_SHM_HELLO, NULL, NULL);
    if (send_hello(s, c->fd, &yes, s->seg.fd, h.auth_nonce) != TD_OK) {
        rdv_drop(v, i);
        return;
    }
    int r = (int)h.from;
    int seg_fd = rdv_take(v, i, r);
    s->peers[r].pid = 0;
    /* Map it now, so that its fd is not held twice. */
    if (segment_map_fd(seg_fd, s->seg_size, &s->peers[r].seg) != TD_OK) {
        /* The lower rank sees the connection close and fails with its own message. */
        TD_LOG_WARN("shm transport of rank %d: %s", grank_of(s, v->rank), td_last_error());
        close(seg_fd);
        close(v->fds[r]);
        v->fds[r] = -1;
    }
}

/* The answer of higher rank r to our hello. */
static td_status handle_answer(td_rdv *v, int r)
{
    setup *s = v->arg;
    td_rdv_conn *c = &v->out[r];
    int rc = read_hello(c);
    if (rc == 0)
        return TD_OK;
    if (rc < 0)
        return error_fmt(TD_ERR_PEER_LOST, "rank %d closed the connection during the shm transport handshake",
                        grank_of(s, r));
    td_shm_hello h;
    const char *why = NULL;
    if (!shm_hello_parse(c->buf, c->got, &h, &why))
        return error_fmt(TD_ERR_INVALID, "rank %d answered the shm transport hello with %s", grank_of(s, r), why);
    bool claims = h.flags & TD_SHM_FLAG_AUTH;
    if (h.type == TD_SHM_REFUSE) {
        /* A rank without a secret refuses a hello with a proof for that first: say it from here. */
        TD_TRY(rdv_auth_check_answer(v, r, claims, ACCEPT_LABEL, NULL, 0, NULL));
        return error_fmt(TD_ERR_INVALID, "%.*s", (int)h.msg_len, h.msg ? h.msg : "");
    }
    auth_part parts[2] = {{c->buf, TD_SHM_HELLO_PROOF_AT},
                          {s->hello_nonce + (size_t)r * AUTH_NONCE_LEN, AUTH_NONCE_LEN}};
    TD_TRY(rdv_auth_check_answer(v, r, claims, ACCEPT_LABEL, parts, 2, h.proof));
    const char *problem = h.nonce != v->nonce ? "it did not read this rank's store entry" : hello_problem(s, &h, r);
    if (!problem && c->passed_fd < 0)
        problem = "its segment's fd did not come with it";
    if (problem)
        return error_fmt(TD_ERR_INVALID, "rank %d's answer to the shm transport hello is unusable: %s", grank_of(s, r),
                        problem);
    td_status st = segment_map_fd(c->passed_fd, s->seg_size, &s->peers[r].seg);
    if (st != TD_OK)
        return error_prefix(st, "mapping rank %d's shared-memory segment", grank_of(s, r));
    c->passed_fd = -1; /* the mapping took it */
    rdv_answered(v, r);
    return TD_OK;
}

/* ---- create ------------------------------------------------------------------------------------ */

static void init_segment(setup *s, int rank, int size)
{
    td_shm_seg_header *h = s->seg.base;
    h->magic = TD_SHM_MAGIC;
    h->version = TD_SHM_VERSION;
    h->rank = (uint32_t)rank;
    h->world = (uint32_t)size;
    h->pid = (uint32_t)getpid();
    h->size = s->seg_size;
    h->layout = s->layout;
    /* The rest (doorbell, counters, rings) starts as zeros, as a fresh tmpfs object reads. */
}

static td_status check_peers(setup *s)
{
    for (int r = 0; r < s->v.size; r++) {
        if (r == s->v.rank)
            continue;
        shm_peer_setup *p = &s->peers[r];
        p->sock = s->v.fds[r];
        s->v.fds[r] = -1;
        if (!p->seg.base)
            return error_fmt(TD_ERR_IO, "mapping rank %d's shared-memory segment failed", grank_of(s, r));
        const char *why = NULL;
        if (!shm_seg_header_check(p->seg.base, (uint32_t)r, (uint32_t)s->v.size, s->seg_size, &s->layout, &why))
            return error_fmt(TD_ERR_INVALID, "rank %d's shared-memory segment is unusable: %s", grank_of(s, r), why);
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

/* Publishes this rank's entry, reads everyone's, and connects to the higher ranks with a hello. */
static td_status rendezvous(setup *s, int *lfd)
{
    td_rdv *v = &s->v;
    TD_TRY(rdv_generation(v));
    char name[NAME_MAX_LEN], val[512];
    snprintf(name, sizeof name, "tdist-shm-%d-%016llx", (int)getpid(), (unsigned long long)v->nonce);
    *lfd = samehost_unix_listen(name, v->size + 16);
    if (*lfd < 0)
        return error_errno(TD_ERR_IO, "shm transport of rank %d: listening on a UNIX-domain socket",
                              grank_of(s, v->rank));
    snprintf(val, sizeof val, "%s %s %016llx %d", s->host_id, name, (unsigned long long)v->nonce, (int)getpid());
    TD_TRY(rdv_publish(v, val, "shm transport address"));
    char *names = alloc_zeroed((size_t)v->size, NAME_MAX_LEN);
    td_status st = TD_OK;
    for (int r = 0; r < v->size && st == TD_OK; r++)
        if (r != v->rank)
            st = read_entry(s, r, names + (size_t)r * NAME_MAX_LEN, NAME_MAX_LEN);
    for (int r = v->rank + 1; r < v->size && st == TD_OK; r++) {
        int fd = samehost_unix_connect(names + (size_t)r * NAME_MAX_LEN);
        if (fd < 0) {
            st = error_errno(TD_ERR_PEER_LOST, "connecting to rank %d's shm transport socket", grank_of(s, r));
            break;
        }
        rdv_await(v, r, fd);
        /* Our fd goes with the hello: only to a listener of this user (whoever holds the name). */
        uid_t uid;
        pid_t pid;
        if (!samehost_peer_same_user(fd, &uid, &pid)) {
            st = error_fmt(TD_ERR_INVALID,
                           "rank %d's shm transport socket is held by a process (pid %d) of uid %ld, and rank %d runs "
                           "as uid %ld; the shm transport shares memory only between processes of one user",
                           grank_of(s, r), (int)pid, uid == (uid_t)-1 ? -1L : (long)uid, grank_of(s, v->rank),
                           (long)geteuid());
            break;
        }
        td_shm_hello h = my_hello(s, r, TD_SHM_HELLO, NULL, s->hello_nonce + (size_t)r * AUTH_NONCE_LEN);
        st = send_hello(s, fd, &h, s->seg.fd, NULL);
        if (st != TD_OK)
            error_prefix(st, "rank %d", grank_of(s, r));
    }
    free(names);
    return st;
}

td_status shm_transport_create(const td_shm_options *o, td_transport **out)
{
    *out = NULL;
    const td_transport_setup *g = &o->setup;
    if (g->size < 1 || g->rank < 0 || g->rank >= g->size)
        return error_fmt(TD_ERR_INVALID, "invalid rank %d for a group of %d", g->rank, g->size);
    auth_key key;
    TD_TRY(auth_key_init(NULL, &key)); /* before anything is made: a bad secret fails at once */
    setup s;
    memset(&s, 0, sizeof s);
    s.group_hash = shm_name_hash(g->group_name);
    s.seg = (td_segment)TD_SEGMENT_INIT;
    td_status st = shm_layout_from_env(g->size, &s.layout);
    if (st == TD_OK) {
        shm_offsets off;
        shm_layout_offsets(g->size, &s.layout, &off);
        s.seg_size = off.total;
        st = segment_create("shm", s.seg_size, true, true, &s.seg);
    }
    if (st != TD_OK) {
        explicit_bzero(&key, sizeof key);
        return st;
    }
    init_segment(&s, g->rank, g->size);
    s.peers = TD_NEW_ARRAY(shm_peer_setup, (size_t)g->size);
    for (int r = 0; r < g->size; r++) {
        s.peers[r].sock = -1;
        s.peers[r].seg = (td_segment)TD_SEGMENT_INIT;
    }
    if (g->size > 1) {
        rdv_init(&s.v, g, "shm transport", "shm/", TD_SHM_HELLO_SIZE, TD_SHM_HELLO_SIZE, &key);
        s.v.arg = &s;
        s.v.on_answer = handle_answer;
        s.v.on_pending = handle_pending;
        s.peer_nonce = TD_NEW_ARRAY(uint64_t, (size_t)g->size);
        s.hello_nonce = alloc_zeroed((size_t)g->size, AUTH_NONCE_LEN);
        host_identity(s.host_id, sizeof s.host_id);
        if (!s.host_id[0])
            snprintf(s.host_id, sizeof s.host_id, "-");
        int lfd = -1;
        st = rendezvous(&s, &lfd);
        if (st == TD_OK)
            st = rdv_handshake(&s.v, &lfd, 1);
        if (st == TD_OK)
            st = check_peers(&s);
        if (lfd >= 0)
            close(lfd);
        rdv_free(&s.v, false);
        free(s.peer_nonce);
        free(s.hello_nonce);
    }
    explicit_bzero(&key, sizeof key);
    if (st != TD_OK) {
        for (int r = 0; r < g->size; r++) {
            if (s.peers[r].sock >= 0)
                close(s.peers[r].sock);
            segment_unmap(&s.peers[r].seg);
        }
        free(s.peers);
        segment_unmap(&s.seg);
        return st;
    }
    /* The own fd went to every peer; the mapping is all this rank needs. */
    if (s.seg.fd >= 0) {
        close(s.seg.fd);
        s.seg.fd = -1;
    }
    st = shm_transport_start(g->rank, g->size, g->global_ranks, &s.seg, &s.layout, s.peers, out);
    free(s.peers);
    return st;
}
