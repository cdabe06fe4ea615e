/* The collective layer's entry point (coll.h): configuration (TDIST_ALGO and the size knobs), the
 * choice of algorithm by size and world size, and the run of one collective (the front end has
 * resolved PREMUL_SUM and AVG into SUM: backend.h). Dependencies point one way: this file calls
 * the algorithms (allreduce.c, rooted.c, exchange.c), which run on the step engine (engine.c: the
 * per-group context, scratch, sends and receives, the pipelined exchange), which uses the
 * transport. The group over one transport at the end of the file is what the tcp and shm
 * backends hand their operations to: a collective's algorithm runs from here, and a send or a
 * receive is posted through p2p.c. */
#include "coll/coll_impl.h"
#include "coll/p2p.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/env.h"
#include "base/error.h"
#include "base/hugealloc.h"

#define DEFAULT_CHUNK ((size_t)256 << 10)
#define DEFAULT_SMALL ((size_t)32 << 10)

static const char *const algo_names[TD_ALGO_COUNT] = {
    "auto", "rd", "ring", "rhd", "tree", "bruck", "direct", "pairwise", "dissemination", "shm", "shm_flat",
};

const char *coll_algo_name(td_algo algo)
{
    return (int)algo >= 0 && algo < TD_ALGO_COUNT ? algo_names[algo] : "unknown";
}

/* The algorithms each collective has; the first is what "auto" falls back to. */
#define MAX_KIND_ALGOS 7
static const td_algo kind_algos[TD_COLL_KIND_COUNT][MAX_KIND_ALGOS] = {
    [TD_COLL_BROADCAST] = {TD_ALGO_TREE, TD_ALGO_RING, TD_ALGO_SHM},
    [TD_COLL_ALL_REDUCE] = {TD_ALGO_RD, TD_ALGO_RING, TD_ALGO_RHD, TD_ALGO_TREE, TD_ALGO_SHM, TD_ALGO_SHM_FLAT},
    [TD_COLL_REDUCE] = {TD_ALGO_TREE, TD_ALGO_RING, TD_ALGO_SHM, TD_ALGO_SHM_FLAT},
    [TD_COLL_ALL_GATHER] = {TD_ALGO_RING, TD_ALGO_BRUCK, TD_ALGO_SHM},
    [TD_COLL_GATHER] = {TD_ALGO_DIRECT, TD_ALGO_TREE, TD_ALGO_SHM},
    [TD_COLL_SCATTER] = {TD_ALGO_DIRECT, TD_ALGO_TREE, TD_ALGO_SHM},
    [TD_COLL_REDUCE_SCATTER] = {TD_ALGO_RING, TD_ALGO_DIRECT, TD_ALGO_SHM},
    [TD_COLL_ALL_TO_ALL] = {TD_ALGO_PAIRWISE, TD_ALGO_DIRECT},
    [TD_COLL_BARRIER] = {TD_ALGO_DISSEMINATION, TD_ALGO_SHM},
};

bool coll_algo_supports(td_algo algo, td_coll_kind kind)
{
    if ((int)kind < 0 || kind >= TD_COLL_KIND_COUNT || kind == TD_COLL_SEND || kind == TD_COLL_RECV)
        return false;
    if (algo == TD_ALGO_AUTO)
        return true;
    for (int i = 0; i < MAX_KIND_ALGOS && kind_algos[kind][i]; i++)
        if (kind_algos[kind][i] == algo)
            return true;
    return false;
}

static const char *kind_name(int k)
{
    static const char *const names[TD_COLL_KIND_COUNT] = {
        "broadcast", "all_reduce", "reduce", "all_gather", "gather", "scatter",
        "reduce_scatter", "all_to_all", "barrier", "send", "recv",
    };
    return names[k];
}

static void list_algos(td_buf *b, int kind)
{
    for (int i = 0; i < MAX_KIND_ALGOS && kind_algos[kind][i]; i++)
        buf_printf(b, "%s%s", i ? ", " : "", algo_names[kind_algos[kind][i]]);
}

static td_status algo_by_name(const char *name, size_t len, td_algo *out)
{
    for (int a = 0; a < TD_ALGO_COUNT; a++) {
        if (strlen(algo_names[a]) == len && strncasecmp(algo_names[a], name, len) == 0) {
            *out = (td_algo)a;
            return TD_OK;
        }
    }
    td_buf b = TD_BUF_INIT;
    for (int a = 0; a < TD_ALGO_COUNT; a++)
        buf_printf(&b, "%s%s", a ? ", " : "", algo_names[a]);
    td_status s = error_fmt(TD_ERR_INVALID,
                           "TDIST_ALGO: unknown algorithm '%.*s'; choose from %s, or per collective as in "
                           "'all_reduce=ring,broadcast=tree'",
                           (int)len, name, b.data);
    buf_free(&b);
    return s;
}

td_status coll_config_parse_algo(td_coll_config *cfg, const char *spec)
{
    const char *p = spec;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len && (*p == ' ')) {
            p++;
            len--;
        }
        while (len && p[len - 1] == ' ')
            len--;
        const char *eq = memchr(p, '=', len);
        if (!eq)
            eq = memchr(p, ':', len);
        if (len == 0) {
        } else if (!eq) {
            td_algo a;
            TD_TRY(algo_by_name(p, len, &a));
            /* One name forces it wherever it exists; the other collectives keep choosing. */
            for (int k = 0; k < TD_COLL_KIND_COUNT; k++)
                if (coll_algo_supports(a, (td_coll_kind)k))
                    cfg->forced[k] = a;
        } else {
            size_t klen = (size_t)(eq - p);
            int kind = -1;
            for (int k = 0; k < TD_COLL_KIND_COUNT; k++)
                if (k != TD_COLL_SEND && k != TD_COLL_RECV && strlen(kind_name(k)) == klen &&
                    strncasecmp(kind_name(k), p, klen) == 0)
                    kind = k;
            if (kind < 0)
                return error_fmt(TD_ERR_INVALID,
                                "TDIST_ALGO: unknown collective '%.*s'; choose from broadcast, all_reduce, reduce, "
                                "all_gather, gather, scatter, reduce_scatter, all_to_all, barrier",
                                (int)klen, p);
            td_algo a;
            TD_TRY(algo_by_name(eq + 1, len - klen - 1, &a));
            if (!coll_algo_supports(a, (td_coll_kind)kind)) {
                td_buf b = TD_BUF_INIT;
                list_algos(&b, kind);
                td_status s = error_fmt(TD_ERR_INVALID, "TDIST_ALGO: %s has no algorithm '%s'; choose from auto, %s",
                                       kind_name(kind), algo_names[a], b.data);
                buf_free(&b);
                return s;
            }
            cfg->forced[kind] = a;
        }
        p = end ? end + 1 : p + len;
    }
    return TD_OK;
}

td_status coll_config_from_env(td_coll_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->chunk_bytes = DEFAULT_CHUNK;
    cfg->small_bytes = DEFAULT_SMALL;
    const char *v = env_get_str("TDIST_COLL_CHUNK", NULL);
    uint64_t n;
    if (v) {
        TD_TRY(env_parse_size("TDIST_COLL_CHUNK", v, &n));
        if (n < 4096)
            return error_fmt(TD_ERR_INVALID, "TDIST_COLL_CHUNK must be at least 4K, got '%s'", v);
        cfg->chunk_bytes = (size_t)n;
    }
    v = env_get_str("TDIST_COLL_SMALL", NULL);
    if (v) {
        TD_TRY(env_parse_size("TDIST_COLL_SMALL", v, &n));
        cfg->small_bytes = (size_t)n;
    }
    v = env_get_str("TDIST_ALGO", NULL);
    if (v)
        TD_TRY(coll_config_parse_algo(cfg, v));
    return TD_OK;
}

/* ---- choice and dispatch ---------------------------------------------------------------------- */

static size_t op_bytes(const td_coll_ctx *c, const td_coll *op)
{
    return op->count * td_dtype_size(op->dtype);
}

td_algo coll_choose(const td_coll_ctx *c, const td_coll *op)
{
    if (op->kind >= TD_COLL_KIND_COUNT)
        return TD_ALGO_AUTO;
    td_algo forced = c->cfg.forced[op->kind];
    if (forced != TD_ALGO_AUTO && forced != TD_ALGO_SHM && forced != TD_ALGO_SHM_FLAT)
        return forced;
    size_t bytes = op_bytes(c, op);
    bool small = bytes <= c->cfg.small_bytes;
    int n = c->size;
    switch (op->kind) {
    case TD_COLL_ALL_REDUCE:
        if (small || bytes < (size_t)n * 4096)
            return TD_ALGO_RD;
        return TD_ALGO_RING;
    case TD_COLL_BROADCAST:
    case TD_COLL_REDUCE:
        return TD_ALGO_TREE;
    case TD_COLL_ALL_GATHER:
        return small && n > 2 ? TD_ALGO_BRUCK : TD_ALGO_RING;
    case TD_COLL_GATHER:
    case TD_COLL_SCATTER:
        return small && n > 4 ? TD_ALGO_TREE : TD_ALGO_DIRECT;
    case TD_COLL_REDUCE_SCATTER:
        return small ? TD_ALGO_DIRECT : TD_ALGO_RING;
    case TD_COLL_ALL_TO_ALL:
        return small ? TD_ALGO_DIRECT : TD_ALGO_PAIRWISE;
    case TD_COLL_BARRIER:
        return TD_ALGO_DISSEMINATION;
    default:
        return TD_ALGO_AUTO;
    }
}

static td_status dispatch(coll_run *run, td_algo a)
{
    const td_coll *op = run->op;
    switch (op->kind) {
    case TD_COLL_ALL_REDUCE:
        switch (a) {
        case TD_ALGO_RD:
            return coll_all_reduce_rd(run);
        case TD_ALGO_RING:
            return coll_all_reduce_ring(run);
        case TD_ALGO_RHD:
            return coll_all_reduce_rhd(run);
        default:
            return coll_all_reduce_tree(run);
        }
    case TD_COLL_BROADCAST:
        return coll_broadcast(run, op->out, op->count, op->root, a == TD_ALGO_RING, 0);
    case TD_COLL_REDUCE:
        return coll_reduce(run, op->out, op->count, op->root, a == TD_ALGO_RING, 0);
    case TD_COLL_ALL_GATHER:
        return a == TD_ALGO_BRUCK ? coll_all_gather_bruck(run) : coll_all_gather_ring(run);
    case TD_COLL_GATHER:
        return a == TD_ALGO_TREE ? coll_gather_tree(run) : coll_gather_direct(run);
    case TD_COLL_SCATTER:
        return a == TD_ALGO_TREE ? coll_scatter_tree(run) : coll_scatter_direct(run);
    case TD_COLL_REDUCE_SCATTER:
        return a == TD_ALGO_DIRECT ? coll_reduce_scatter_direct(run) : coll_reduce_scatter_ring(run);
    case TD_COLL_ALL_TO_ALL:
        return a == TD_ALGO_DIRECT ? coll_all_to_all_direct(run) : coll_all_to_all_pairwise(run);
    case TD_COLL_BARRIER:
        return coll_barrier_dissemination(run);
    default:
        return error_fmt(TD_ERR_INTERNAL, "coll_execute: %d is not a collective", (int)op->kind);
    }
}

td_status coll_reduce_fn(const td_coll *op, td_reduce_fn *fn)
{
    *fn = NULL;
    if (!td_coll_kind_reduces(op->kind))
        return TD_OK;
    *fn = td_reduce_kernel(op->op.kind, op->dtype);
    return *fn ? TD_OK : TD_ERR_INVALID; /* message set by td_reduce_kernel */
}

td_status coll_execute(td_coll_ctx *c, const td_coll *op, td_algo algo)
{
    if (algo == TD_ALGO_AUTO || algo == TD_ALGO_SHM || algo == TD_ALGO_SHM_FLAT)
        algo = coll_choose(c, op); /* the shm algorithms need shared memory: backends/shm/direct.h */
    if (!coll_algo_supports(algo, op->kind))
        return error_fmt(TD_ERR_INVALID, "%s has no algorithm '%s'", kind_name(op->kind), coll_algo_name(algo));
    coll_run run = {
        .c = c,
        .t = c->t,
        .op = op,
        .rank = c->rank,
        .size = c->size,
        .esize = td_dtype_size(op->dtype),
        .dl = op->deadline_ns,
    };
    TD_TRY(coll_reduce_fn(op, &run.fn));
    c->t->coll_desc = &op->desc; /* what this collective's messages carry (transport.h) */
    td_status s = dispatch(&run, algo);
    c->t->coll_desc = NULL;
    if (s != TD_OK) {
        /* Whatever is still posted must complete before the caller reuses its memory, and the
         * other ranks must not wait for this one until their timeout. */
        char msg[TD_XFER_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        transport_abort(c->t, s, msg);
        error_set(s, msg);
    }
    return s;
}

/* ---- a group over one transport: what the tcp and shm backends submit to -------------------- */

typedef struct coll_group {
    td_transport *t;
    td_coll_ctx coll;
    td_p2p_pool p2p;
} coll_group;

td_transport_setup coll_transport_setup(const td_backend_args *a, const char *key_prefix)
{
    td_transport_setup g = {
        .store = a->store,
        .key_prefix = key_prefix,
        .rank = a->rank,
        .size = a->size,
        .global_ranks = a->global_ranks,
        .timeout_ms = a->timeout_ms,
        .group_name = a->group_name,
    };
    return g;
}

td_status coll_group_create(td_transport *t, const td_coll_config *cfg, void **state)
{
    coll_group *s = TD_NEW(coll_group);
    s->t = t;
    p2p_pool_init(&s->p2p);
    td_status st = coll_ctx_init(&s->coll, t, cfg);
    if (st != TD_OK) {
        transport_destroy(t);
        p2p_pool_free(&s->p2p);
        free(s);
        return st;
    }
    *state = s;
    return TD_OK;
}

td_status coll_finish(td_work *work, td_status st)
{
    if (st == TD_OK)
        td_work_done(work, TD_OK, -1, NULL);
    else
        td_work_done(work, st, -1, "%s", td_last_error());
    return TD_OK;
}

td_status coll_group_submit(void *state, const td_coll *c, td_work *work)
{
    coll_group *s = state;
    if (c->kind == TD_COLL_SEND || c->kind == TD_COLL_RECV)
        return p2p_submit(&s->p2p, s->t, c, work);
    return coll_finish(work, coll_execute(&s->coll, c, TD_ALGO_AUTO));
}

td_coll_ctx *coll_group_ctx(void *state) { return &((coll_group *)state)->coll; }

void coll_group_abort(void *state, td_status status, const char *message)
{
    coll_group *s = state;
    transport_abort(s->t, status, message);
}

void coll_group_destroy(void *state)
{
    coll_group *s = state;
    transport_destroy(s->t);
    coll_ctx_free(&s->coll);
    p2p_pool_free(&s->p2p);
    free(s);
}
