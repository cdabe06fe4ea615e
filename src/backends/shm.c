/* The "shm" backend (tdist/backend.h): every rank of the group on one host, talking through
 * shared memory (transport/shm.h). Collectives use the direct shared-memory algorithms where they
 * exist (coll/shm_coll.h: all_reduce, reduce, broadcast, all_gather, gather, scatter,
 * reduce_scatter, barrier) and the transport algorithms of src/coll otherwise (all_to_all, or
 * whatever TDIST_ALGO forces); they run on the worker thread and complete before submit returns.
 * SEND and RECV are posted and complete through the transport's callback. A failed collective has
 * aborted the transport, which tells the other ranks at once. */
#include <stdlib.h>

#include <tdist/backend.h>

#include "backends/builtin.h"
#include "backends/shm_p2p.h"
#include "base/alloc.h"
#include "base/error.h"
#include "coll/shm_coll.h"
#include "transport/shm.h"

typedef struct shm_state {
    td_transport *t;
    td_coll_ctx coll;
    td_shm_p2p_pool p2p;
} shm_state;

static td_status shm_create(const td_backend_args *a, void **state)
{
    td_coll_config cfg;
    TD_TRY(td_coll_config_from_env(&cfg));
    td_shm_options o = {
        .store = a->store,
        .key_prefix = "shm/",
        .rank = a->rank,
        .size = a->size,
        .global_ranks = a->global_ranks,
        .timeout_ms = a->timeout_ms,
        .group_name = a->group_name,
    };
    td_transport *t;
    TD_TRY(td_shm_transport_create(&o, &t));
    shm_state *s = TD_NEW(shm_state);
    s->t = t;
    td_shm_p2p_pool_init(&s->p2p);
    td_status st = td_coll_ctx_init(&s->coll, t, &cfg);
    if (st != TD_OK) {
        td_transport_destroy(t);
        td_shm_p2p_pool_free(&s->p2p);
        free(s);
        return st;
    }
    *state = s;
    return TD_OK;
}

static td_status shm_submit(void *state, const td_coll *c, td_work *work)
{
    shm_state *s = state;
    if (c->kind == TD_COLL_SEND || c->kind == TD_COLL_RECV)
        return td_shm_p2p_submit(&s->p2p, s->t, c, work);
    td_status st = td_shm_coll_run(&s->coll, c);
    if (st == TD_OK)
        td_work_done(work, TD_OK, -1, NULL);
    else
        td_work_done(work, st, -1, "%s", td_last_error());
    return TD_OK;
}

static void shm_abort(void *state, td_status status, const char *message)
{
    shm_state *s = state;
    td_transport_abort(s->t, status, message);
}

static void shm_destroy(void *state)
{
    shm_state *s = state;
    td_transport_destroy(s->t);
    td_coll_ctx_free(&s->coll);
    td_shm_p2p_pool_free(&s->p2p);
    free(s);
}

const td_backend_ops td_backend_shm_ops = {
    .name = "shm",
    .create = shm_create,
    .submit = shm_submit,
    .abort = shm_abort,
    .destroy = shm_destroy,
    .supports = NULL,
    .inline_submit = true,
};
