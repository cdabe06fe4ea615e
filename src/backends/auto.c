/* The "auto" backend (tdist/backend.h), the default: shared memory within a host, tcp between
 * hosts.
 *
 * At creation the ranks publish their host identity (base/host.h: boot id and network namespace,
 * refined by TDIST_HOST_ID) in the group's store and read everyone's. One host: the group runs
 * the shm backend. One rank per host: the tcp backend. Otherwise it is hierarchical: an shm
 * transport among the ranks of each host, a tcp transport among all ranks, and on top of them
 *  - all_reduce: reduce within the host (shared memory) to its leader (its lowest rank),
 *    all_reduce among the leaders (tcp), broadcast within the host (shared memory);
 *  - reduce and broadcast: the same shape, with the root standing in for its host's leader;
 *  - barrier: within the host, among the leaders, within the host again;
 *  - the other collectives (all_gather, gather, scatter, reduce_scatter, all_to_all): the flat
 *    algorithms over a composite transport that reaches peers on this host through shared memory
 *    and the others through tcp (auto_route.h);
 *  - send and recv: the tcp transport (which uses UNIX-domain sockets and single-copy reads
 *    between ranks of one host), so that any-source receives match across all peers.
 * Every all_reduce result is bit-identical on all ranks (each phase's is). A phase that fails
 * aborts both transports with its cause, so that the ranks waiting on this one in the other
 * phase fail at once and name the same culprit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/backend.h>
#include <tdist/store.h>

#include "backends/auto.h"
#include "backends/auto_route.h"
#include "backends/builtin.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "coll/coll.h"
#include "coll/p2p.h"
#include "backends/shm/direct.h"
#include "transport/shm.h"
#include "transport/tcp.h"

typedef struct auto_state {
    /* a group on one host, or with one rank per host, is just that backend */
    const td_backend_ops *inner;
    void *inner_state;
    /* hierarchical */
    int rank, size;
    int nhosts, host;
    int *host_of;     /* per group rank: its host's index (hosts in order of their lowest rank) */
    int *leader;      /* per host: its lowest group rank */
    int *local_index; /* per group rank: its index among its host's ranks */
    int local_rank, local_size;
    int *map;         /* per host: who stands for it in the current inter-host phase */
    td_transport *shm; /* NULL when this rank is alone on its host */
    td_transport *tcp;
    td_transport *view, *comp;
    td_coll_ctx local_ctx, view_ctx, comp_ctx;
    bool local_ctx_ok, view_ctx_ok, comp_ctx_ok, p2p_ok;
    td_p2p_pool p2p;
} auto_state;

/* ---- hosts ------------------------------------------------------------------------------------- */

static td_status discover_hosts(const td_backend_args *a, auto_state *s)
{
    int n = a->size;
    char id[TD_HOST_ID_MAX], key[128];
    host_identity(id, sizeof id);
    if (!id[0])
        snprintf(id, sizeof id, "unknown-host-of-rank-%d", a->global_ranks ? a->global_ranks[a->rank] : a->rank);
    int64_t gen = 0;
    snprintf(key, sizeof key, "auto/gen/%d", a->rank);
    TD_TRY(td_store_add(a->store, key, 1, &gen));
    snprintf(key, sizeof key, "auto/%lld/host/%d", (long long)gen, a->rank);
    TD_TRY(td_store_set_str(a->store, key, id));
    char **keys = TD_NEW_ARRAY(char *, (size_t)n);
    for (int r = 0; r < n; r++)
        keys[r] = alloc_printf("auto/%lld/host/%d", (long long)gen, r);
    void **vals = TD_NEW_ARRAY(void *, (size_t)n);
    size_t *lens = TD_NEW_ARRAY(size_t, (size_t)n);
    int64_t left = a->timeout_ms > 0 ? a->timeout_ms : 0;
    td_status st = td_store_wait(a->store, (const char *const *)keys, (size_t)n, left);
    if (st != TD_OK)
        error_prefix(st, "auto backend: waiting for every rank to publish its host in the store");
    else
        st = td_store_multi_get(a->store, (const char *const *)keys, (size_t)n, vals, lens);
    if (st == TD_OK) {
        s->host_of = TD_NEW_ARRAY(int, (size_t)n);
        s->local_index = TD_NEW_ARRAY(int, (size_t)n);
        s->leader = TD_NEW_ARRAY(int, (size_t)n);
        int *count = TD_NEW_ARRAY(int, (size_t)n);
        for (int r = 0; r < n; r++) {
            int h = 0;
            while (h < r && !(lens[h] == lens[r] && memcmp(vals[h], vals[r], lens[r]) == 0))
                h++;
            /* the first rank with this id defines the host */
            if (h == r) {
                s->host_of[r] = s->nhosts;
                s->leader[s->nhosts++] = r;
            } else {
                s->host_of[r] = s->host_of[h];
            }
            s->local_index[r] = count[s->host_of[r]]++;
        }
        s->host = s->host_of[a->rank];
        s->local_rank = s->local_index[a->rank];
        s->local_size = count[s->host];
        free(count);
    }
    for (int r = 0; r < n; r++) {
        free(keys[r]);
        if (st == TD_OK)
            free(vals[r]);
    }
    free(keys);
    free(vals);
    free(lens);
    return st;
}

/* ---- creation ---------------------------------------------------------------------------------- */

static void free_state(auto_state *s)
{
    if (s->comp_ctx_ok)
        coll_ctx_free(&s->comp_ctx);
    if (s->view_ctx_ok)
        coll_ctx_free(&s->view_ctx);
    if (s->local_ctx_ok)
        coll_ctx_free(&s->local_ctx);
    transport_destroy(s->comp);
    transport_destroy(s->view);
    transport_destroy(s->shm);
    transport_destroy(s->tcp);
    if (s->p2p_ok)
        p2p_pool_free(&s->p2p);
    free(s->host_of);
    free(s->leader);
    free(s->local_index);
    free(s->map);
    free(s);
}

static td_status auto_create(const td_backend_args *a, void **state)
{
    td_coll_config cfg;
    TD_TRY(coll_config_from_env(&cfg));
    auto_state *s = TD_NEW(auto_state);
    s->rank = a->rank;
    s->size = a->size;
    td_status st = discover_hosts(a, s);
    if (st != TD_OK) {
        free_state(s);
        return st;
    }
    if (s->nhosts == 1 || s->nhosts == a->size) {
        s->inner = s->nhosts == 1 ? &backend_shm_ops : &backend_tcp_ops;
        st = s->inner->create(a, &s->inner_state);
        if (st != TD_OK) {
            free_state(s);
            return st;
        }
        *state = s;
        return TD_OK;
    }
    TD_LOG_DEBUG("auto backend: group %s has %d hosts; this rank is %d of %d on host %d", a->group_name, s->nhosts,
                 s->local_rank, s->local_size, s->host);
    p2p_pool_init(&s->p2p);
    s->p2p_ok = true;
    int n = a->size;
    if (s->local_size > 1) {
        int *members = TD_NEW_ARRAY(int, (size_t)s->local_size);
        for (int r = 0; r < n; r++)
            if (s->host_of[r] == s->host)
                members[s->local_index[r]] = a->global_ranks ? a->global_ranks[r] : r;
        char prefix[64];
        snprintf(prefix, sizeof prefix, "auto/shm/%d/", s->host);
        td_shm_options so = {.setup = coll_transport_setup(a, prefix)};
        so.setup.rank = s->local_rank;
        so.setup.size = s->local_size;
        so.setup.global_ranks = members;
        st = shm_transport_create(&so, &s->shm);
        free(members);
    }
    if (st == TD_OK) {
        td_tcp_options to = {.setup = coll_transport_setup(a, "auto/tcp/")};
        st = tcp_transport_create(&to, &s->tcp);
    }
    if (st != TD_OK) {
        free_state(s);
        return st;
    }
    s->map = TD_NEW_ARRAY(int, (size_t)s->nhosts);
    memcpy(s->map, s->leader, sizeof(int) * (size_t)s->nhosts);
    s->view = auto_view_transport_new(s->tcp, s->host, s->nhosts, s->map);
    int *li = TD_NEW_ARRAY(int, (size_t)n);
    for (int r = 0; r < n; r++)
        li[r] = s->shm && s->host_of[r] == s->host && r != a->rank ? s->local_index[r] : -1;
    s->comp = auto_composite_transport_new(s->shm, s->tcp, a->rank, n, li);
    free(li);
    if (s->shm) {
        coll_ctx_init(&s->local_ctx, s->shm, &cfg);
        s->local_ctx_ok = true;
    }
    coll_ctx_init(&s->view_ctx, s->view, &cfg);
    s->view_ctx_ok = true;
    coll_ctx_init(&s->comp_ctx, s->comp, &cfg);
    s->comp_ctx_ok = true;
    *state = s;
    return TD_OK;
}

/* ---- the hierarchical collectives -------------------------------------------------------------- */

static void abort_all(auto_state *s, td_status status, const char *message)
{
    if (s->shm)
        transport_abort(s->shm, status, message);
    transport_abort(s->tcp, status, message);
}

/* A phase's result: on failure, both transports go down with its cause. */
static td_status phase(auto_state *s, td_status st)
{
    if (st != TD_OK) {
        char msg[TD_XFER_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        abort_all(s, st, msg);
        error_set(st, msg);
    }
    return st;
}

/* Who stands for each host in an inter-host phase rooted at group rank root (-1: the leaders);
 * returns the local index of this host's stand-in. */
static int stand_ins(auto_state *s, int root)
{
    memcpy(s->map, s->leader, sizeof(int) * (size_t)s->nhosts);
    if (root < 0 || s->host_of[root] != s->host) {
        if (root >= 0)
            s->map[s->host_of[root]] = root;
        return 0;
    }
    s->map[s->host] = root;
    return s->local_index[root];
}

static td_status local_run(auto_state *s, td_coll *sub, td_coll_kind kind, int root, uint64_t seq)
{
    if (!s->shm)
        return TD_OK;
    sub->kind = kind;
    sub->root = root;
    sub->seq = seq;
    return phase(s, shm_coll_run(&s->local_ctx, sub));
}

static td_status hosts_run(auto_state *s, td_coll *sub, td_coll_kind kind, int root_host, uint64_t seq)
{
    auto_view_transport_remap(s->view, s->map);
    sub->kind = kind;
    sub->root = root_host;
    sub->seq = seq;
    return phase(s, coll_execute(&s->view_ctx, sub, TD_ALGO_AUTO));
}

/* all_reduce (root < 0) and reduce: reduce within the host to its stand-in, across hosts among the
 * stand-ins, and for all_reduce broadcast within the host. */
static td_status hier_reduce(auto_state *s, const td_coll *op, int root)
{
    td_coll sub = *op;
    sub.in = sub.out = op->out;
    uint64_t base = op->seq * 4;
    int here = stand_ins(s, root);
    TD_TRY(local_run(s, &sub, TD_COLL_REDUCE, here, base + 1));
    if (s->local_rank == here)
        TD_TRY(hosts_run(s, &sub, root < 0 ? TD_COLL_ALL_REDUCE : TD_COLL_REDUCE, root < 0 ? 0 : s->host_of[root],
                         base + 2));
    if (root < 0)
        TD_TRY(local_run(s, &sub, TD_COLL_BROADCAST, 0, base + 3));
    return TD_OK;
}

static td_status hier_broadcast(auto_state *s, const td_coll *op)
{
    td_coll sub = *op;
    uint64_t base = op->seq * 4;
    int here = stand_ins(s, op->root);
    if (s->local_rank == here)
        TD_TRY(hosts_run(s, &sub, TD_COLL_BROADCAST, s->host_of[op->root], base + 1));
    return local_run(s, &sub, TD_COLL_BROADCAST, here, base + 2);
}

static td_status hier_barrier(auto_state *s, const td_coll *op)
{
    td_coll sub = *op;
    uint64_t base = op->seq * 4;
    TD_TRY(local_run(s, &sub, TD_COLL_BARRIER, 0, base + 1));
    stand_ins(s, -1);
    if (s->local_rank == 0)
        TD_TRY(hosts_run(s, &sub, TD_COLL_BARRIER, 0, base + 2));
    return local_run(s, &sub, TD_COLL_BARRIER, 0, base + 3);
}

static td_status hier_run(auto_state *s, const td_coll *op)
{
    switch (op->kind) {
    case TD_COLL_ALL_REDUCE:
        return hier_reduce(s, op, -1);
    case TD_COLL_REDUCE:
        return hier_reduce(s, op, op->root);
    case TD_COLL_BROADCAST:
        return hier_broadcast(s, op);
    case TD_COLL_BARRIER:
        return hier_barrier(s, op);
    default: {
        td_coll flat = *op;
        flat.seq = op->seq * 4;
        return phase(s, coll_execute(&s->comp_ctx, &flat, TD_ALGO_AUTO));
    }
    }
}

/* ---- ops --------------------------------------------------------------------------------------- */

static td_status auto_submit(void *state, const td_coll *c, td_work *work)
{
    auto_state *s = state;
    if (s->inner)
        return s->inner->submit(s->inner_state, c, work);
    if (c->kind == TD_COLL_SEND || c->kind == TD_COLL_RECV)
        return p2p_submit(&s->p2p, s->tcp, c, work);
    return coll_finish(work, hier_run(s, c));
}

static void auto_abort(void *state, td_status status, const char *message)
{
    auto_state *s = state;
    if (s->inner) {
        if (s->inner->abort)
            s->inner->abort(s->inner_state, status, message);
        return;
    }
    abort_all(s, status, message);
}

static void auto_destroy(void *state)
{
    auto_state *s = state;
    if (s->inner)
        s->inner->destroy(s->inner_state);
    free_state(s);
}

static td_status auto_supports(void *state, td_coll_kind kind, td_dtype dtype, td_reduce_op op)
{
    auto_state *s = state;
    if (s->inner && s->inner->supports)
        return s->inner->supports(s->inner_state, kind, dtype, op);
    return TD_OK;
}

void auto_backend_topology(void *state, td_auto_topology *out)
{
    auto_state *s = state;
    out->runs_as = s->inner ? s->inner->name : "hierarchical";
    out->nhosts = s->nhosts;
    out->host = s->host;
    out->local_rank = s->local_rank;
    out->local_size = s->local_size;
    out->tcp = s->inner ? NULL : s->tcp;
    out->shm = s->inner ? NULL : s->shm;
}

const td_backend_ops backend_auto_ops = {
    .name = "auto",
    .create = auto_create,
    .submit = auto_submit,
    .abort = auto_abort,
    .destroy = auto_destroy,
    .supports = auto_supports,
    .caps = TD_BACKEND_CAP_CALLER_THREAD,
};
