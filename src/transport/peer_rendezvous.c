/* The transports' common set-up steps through a store (peer_rendezvous.h): generation counting,
 * publishing and reading the ranks' entries, and the handshake's poll loop with its bookkeeping of
 * connections awaiting an answer and accepted ones not yet identified, and the proofs of the job
 * secret in hellos and answers with their refusal messages, so that both transports word an
 * authentication failure alike (net/auth.h does the cryptography). The tcp and shm set-ups
 * (tcp_connect.c, shm_connect.c) plug their hellos in; they listen and connect on the same-host
 * layer's abstract UNIX-domain sockets (samehost.h). */
#include "transport/peer_rendezvous.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <tdist/store.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"

static void conn_reset(td_rdv_conn *c)
{
    c->fd = c->passed_fd = -1;
    c->buf = NULL;
    c->got = 0;
}

static void conn_open(td_rdv_conn *c, int fd, size_t bytes)
{
    c->fd = fd;
    c->passed_fd = -1;
    c->buf = alloc_or_die(bytes);
    c->got = 0;
}

static void conn_close(td_rdv_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    if (c->passed_fd >= 0)
        close(c->passed_fd);
    free(c->buf);
    conn_reset(c);
}

void rdv_init(td_rdv *v, const td_transport_setup *o, const char *what, const char *default_prefix,
                 size_t out_bytes, size_t pend_bytes, const auth_key *auth)
{
    memset(v, 0, sizeof *v);
    v->auth = *auth;
    v->o = o;
    v->what = what;
    v->prefix = o->key_prefix ? o->key_prefix : default_prefix;
    v->rank = o->rank;
    v->size = o->size;
    v->deadline = deadline_after_ms(o->timeout_ms);
    v->out_bytes = out_bytes;
    v->pend_bytes = pend_bytes;
    if (getrandom(&v->nonce, sizeof v->nonce, 0) != sizeof v->nonce)
        v->nonce = (uint64_t)clock_now_ns() ^ ((uint64_t)getpid() << 32);
    v->fds = TD_NEW_ARRAY(int, (size_t)o->size);
    v->out = TD_NEW_ARRAY(td_rdv_conn, (size_t)o->size);
    for (int r = 0; r < o->size; r++) {
        v->fds[r] = -1;
        conn_reset(&v->out[r]);
    }
}

void rdv_free(td_rdv *v, bool keep_fds)
{
    for (int i = v->npend - 1; i >= 0; i--)
        rdv_drop(v, i);
    for (int r = 0; r < v->size; r++) {
        conn_close(&v->out[r]);
        if (!keep_fds && v->fds[r] >= 0)
            close(v->fds[r]);
    }
    free(v->out);
    free(v->fds);
    v->out = NULL;
    v->fds = NULL;
    explicit_bzero(&v->auth, sizeof v->auth); /* no copy of the key outlives the set-up */
}

/* ---- the store entries -------------------------------------------------------------------------- */

void rdv_entry_key(const td_rdv *v, int r, char *out, size_t size)
{
    snprintf(out, size, "%s%lld/addr/%d", v->prefix, (long long)v->generation, r);
}

td_status rdv_generation(td_rdv *v)
{
    char key[256];
    snprintf(key, sizeof key, "%sgen/%d", v->prefix, v->rank);
    td_status st = td_store_add(v->o->store, key, 1, &v->generation);
    if (st != TD_OK)
        error_prefix(st, "%s of rank %d: counting its generation in the store", v->what, rdv_grank(v, v->rank));
    return st;
}

td_status rdv_publish(td_rdv *v, const char *value, const char *addr_name)
{
    char key[256];
    rdv_entry_key(v, v->rank, key, sizeof key);
    td_status st = td_store_set_str(v->o->store, key, value);
    if (st != TD_OK)
        error_prefix(st, "publishing rank %d's %s in the store", rdv_grank(v, v->rank), addr_name);
    return st;
}

/* A warning naming the ranks whose entries are not in the store yet, while this rank waits. */
static void rdv_progress(td_rdv *v, const char *addr_name, int64_t waited_ms)
{
    char list[256] = "";
    size_t used = 0;
    int missing = 0;
    for (int r = 0; r < v->size; r++) {
        char key[256];
        rdv_entry_key(v, r, key, sizeof key);
        const char *keys[1] = {key};
        bool ready = true;
        if (td_store_check(v->o->store, keys, 1, &ready) != TD_OK || ready)
            continue;
        if (missing++ < 16 && used < sizeof list)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%d", used ? ", " : "", rdv_grank(v, r));
    }
    if (missing)
        TD_LOG_WARN("rank %d: waiting for %d of %d ranks to publish their %s (%s%s), %lld s so far",
                    rdv_grank(v, v->rank), missing, v->size, addr_name, list, missing > 16 ? ", ..." : "",
                    (long long)(waited_ms / 1000));
}

td_status rdv_read(td_rdv *v, int r, const char *addr_name, char *text, size_t size)
{
    char key[256];
    rdv_entry_key(v, r, key, sizeof key);
    const char *keys[1] = {key};
    /* Waits in slices of TDIST_RDZV_PROGRESS (5 s; 0: one wait), warning after each which ranks are
     * still missing: a rank that never starts otherwise shows only as the timeout, minutes later. */
    int64_t every = 0, waited = 0;
    if (env_get_duration_ms("TDIST_RDZV_PROGRESS", 5000, 1000, &every) != TD_OK)
        every = 5000;
    td_status st;
    for (;;) {
        int64_t left = deadline_left_ms(v->deadline);
        bool sliced = every > 0 && left > every;
        int64_t ms = sliced ? every : left == INT64_MAX ? 0 : (left > 0 ? left : 1);
        st = td_store_wait(v->o->store, keys, 1, ms);
        if (st != TD_ERR_TIMEOUT || !sliced)
            break;
        waited += every;
        rdv_progress(v, addr_name, waited);
    }
    if (st != TD_OK)
        return error_prefix(st, "waiting for rank %d to publish its %s in the store", rdv_grank(v, r), addr_name);
    void *val = NULL;
    size_t n = 0;
    st = td_store_get(v->o->store, key, &val, &n);
    if (st != TD_OK)
        return error_prefix(st, "reading rank %d's %s from the store", rdv_grank(v, r), addr_name);
    bool ok = n < size;
    if (ok) {
        memcpy(text, val, n);
        text[n] = '\0';
    }
    free(val);
    if (!ok)
        return error_fmt(TD_ERR_INVALID, "rank %d's %s in the store is malformed", rdv_grank(v, r), addr_name);
    return TD_OK;
}

/* ---- connections in the handshake --------------------------------------------------------------- */

void rdv_await(td_rdv *v, int r, int fd) { conn_open(&v->out[r], fd, v->out_bytes); }

void rdv_drop(td_rdv *v, int i)
{
    conn_close(&v->pend[i]);
    v->pend[i] = v->pend[--v->npend];
}

int rdv_take(td_rdv *v, int i, int r)
{
    td_rdv_conn *c = &v->pend[i];
    v->fds[r] = c->fd;
    int passed = c->passed_fd;
    c->fd = c->passed_fd = -1;
    conn_close(c);
    v->pend[i] = v->pend[--v->npend];
    return passed;
}

int rdv_answered(td_rdv *v, int r)
{
    td_rdv_conn *c = &v->out[r];
    v->fds[r] = c->fd;
    int passed = c->passed_fd;
    c->fd = c->passed_fd = -1;
    conn_close(c);
    return passed;
}

/* ---- proofs of the job secret ------------------------------------------------------------------- */

void rdv_auth_prove(const td_rdv *v, const char *label, const auth_part *parts, int n, uint8_t mac[AUTH_MAC_LEN])
{
    if (v->auth.on)
        auth_prove(&v->auth, label, parts, n, mac);
    else
        memset(mac, 0, AUTH_MAC_LEN);
}

bool rdv_auth_check_hello(const td_rdv *v, bool claims, const char *label, const auth_part *parts, int n,
                          const uint8_t mac[AUTH_MAC_LEN], char *msg, size_t msg_size)
{
    int me = rdv_grank(v, v->rank);
    if (v->auth.on && !claims)
        snprintf(msg, msg_size,
                 "authentication failed: rank %d requires the job's secret (TDIST_AUTH_TOKEN) and the connecting rank "
                 "has none",
                 me);
    else if (v->auth.on && !auth_check(&v->auth, label, parts, n, mac))
        snprintf(msg, msg_size, "authentication failed: the connecting rank's TDIST_AUTH_TOKEN does not match rank %d's",
                 me);
    else if (!v->auth.on && claims)
        /* Refused too, though nothing is at stake here: the connector would refuse this rank's
         * unproven answer, and the group is better off failing on both sides at once. */
        snprintf(msg, msg_size,
                 "authentication failed: rank %d does not authenticate (it has no TDIST_AUTH_TOKEN) but the connecting "
                 "rank has one",
                 me);
    else
        return true;
    return false;
}

td_status rdv_auth_check_answer(const td_rdv *v, int r, bool claims, const char *label, const auth_part *parts, int n,
                                const uint8_t *mac)
{
    int peer = rdv_grank(v, r);
    if (v->auth.on && !claims)
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: rank %d does not authenticate (it has no TDIST_AUTH_TOKEN) but this "
                         "rank has one",
                         peer);
    if (!mac)
        return TD_OK;
    if (!v->auth.on && claims)
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: rank %d requires the job's secret (TDIST_AUTH_TOKEN) and this rank "
                         "has none",
                         peer);
    if (v->auth.on && !auth_check(&v->auth, label, parts, n, mac))
        return error_fmt(TD_ERR_INVALID,
                         "authentication failed: rank %d could not prove it holds this job's TDIST_AUTH_TOKEN", peer);
    return TD_OK;
}

static td_status missing_msg(td_rdv *v)
{
    td_buf b = TD_BUF_INIT;
    int n = 0;
    for (int r = 0; r < v->size; r++) {
        if (r != v->rank && v->fds[r] < 0)
            buf_printf(&b, "%s%d", n++ ? ", " : "", rdv_grank(v, r));
    }
    td_status st = error_fmt(TD_ERR_TIMEOUT,
                            "Timed out after %lld ms setting up the %s of rank %d: no connection yet with rank%s %s%s%s",
                            (long long)v->o->timeout_ms, v->what, rdv_grank(v, v->rank), n > 1 ? "s" : "",
                            b.data ? b.data : "", v->last_refusal[0] ? "; last refused connection: " : "",
                            v->last_refusal);
    buf_free(&b);
    return st;
}

td_status rdv_handshake(td_rdv *v, const int *listen_fds, int nlisten)
{
    struct pollfd *pfds = TD_NEW_ARRAY(struct pollfd, (size_t)(nlisten + v->size + TD_RDV_MAX_PENDING));
    int *who = TD_NEW_ARRAY(int, (size_t)(nlisten + v->size + TD_RDV_MAX_PENDING));
    td_status st = TD_OK;
    for (;;) {
        int missing = 0, lower_missing = 0;
        for (int r = 0; r < v->size; r++) {
            if (r != v->rank && v->fds[r] < 0) {
                missing++;
                lower_missing += r < v->rank;
            }
        }
        if (!missing)
            break;
        if (deadline_passed(v->deadline)) {
            st = missing_msg(v);
            break;
        }
        int n = 0, nl = 0;
        if (lower_missing) {
            for (int l = 0; l < nlisten; l++) {
                if (listen_fds[l] >= 0) {
                    pfds[n] = (struct pollfd){.fd = listen_fds[l], .events = POLLIN};
                    who[n++] = -1;
                }
            }
            nl = n;
        }
        for (int r = v->rank + 1; r < v->size; r++) {
            if (v->fds[r] < 0 && v->out[r].fd >= 0) {
                pfds[n] = (struct pollfd){.fd = v->out[r].fd, .events = POLLIN};
                who[n++] = r;
            }
        }
        for (int i = 0; i < v->npend; i++) {
            pfds[n] = (struct pollfd){.fd = v->pend[i].fd, .events = POLLIN};
            who[n++] = -2 - i;
        }
        int rc = poll(pfds, (nfds_t)n, deadline_poll_ms(v->deadline));
        if (rc < 0 && errno != EINTR) {
            st = error_errno(TD_ERR_IO, "poll during the %s set-up", v->what);
            break;
        }
        if (rc <= 0)
            continue;
        /* Pending entries move when one is consumed, so handle them from the highest index down. */
        for (int k = n - 1; k >= 0 && st == TD_OK; k--) {
            if (!pfds[k].revents)
                continue;
            if (who[k] >= 0)
                st = v->on_answer(v, who[k]);
            else if (who[k] <= -2)
                v->on_pending(v, -2 - who[k]);
        }
        if (st != TD_OK)
            break;
        for (int l = 0; l < nl; l++) {
            if (!(pfds[l].revents & POLLIN))
                continue;
            for (;;) {
                int fd = accept4(pfds[l].fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0)
                    break;
                if (v->npend == TD_RDV_MAX_PENDING)
                    rdv_drop(v, 0);
                conn_open(&v->pend[v->npend++], fd, v->pend_bytes);
                v->on_pending(v, v->npend - 1);
            }
        }
    }
    free(pfds);
    free(who);
    return st;
}
