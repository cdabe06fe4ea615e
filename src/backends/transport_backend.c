/* A backend made of one transport (transport_backend.h): the glue that the tcp and shm backends
 * share. The state holds the transport, the collective context over it and the pool of
 * point-to-point operations; the backend itself (tcp.c, shm.c) only says how to make its transport
 * and which algorithms run the collectives. */
#include "backends/transport_backend.h"

#include <stdlib.h>

#include "backends/p2p.h"
#include "base/alloc.h"
#include "base/error.h"

typedef struct transport_backend {
    td_transport *t;
    td_coll_ctx coll;
    td_p2p_pool p2p;
    td_transport_backend_run run;
} transport_backend;

td_transport_setup td_transport_backend_setup(const td_backend_args *a, const char *key_prefix)
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

td_status td_transport_backend_create(td_transport *t, const td_coll_config *cfg, td_transport_backend_run run,
                                      void **state)
{
    transport_backend *s = TD_NEW(transport_backend);
    s->t = t;
    s->run = run;
    td_p2p_pool_init(&s->p2p);
    td_status st = td_coll_ctx_init(&s->coll, t, cfg);
    if (st != TD_OK) {
        td_transport_destroy(t);
        td_p2p_pool_free(&s->p2p);
        free(s);
        return st;
    }
    *state = s;
    return TD_OK;
}

td_status td_backend_finish(td_work *work, td_status st)
{
    if (st == TD_OK)
        td_work_done(work, TD_OK, -1, NULL);
    else
        td_work_done(work, st, -1, "%s", td_last_error());
    return TD_OK;
}

td_status td_transport_backend_submit(void *state, const td_coll *c, td_work *work)
{
    transport_backend *s = state;
    if (c->kind == TD_COLL_SEND || c->kind == TD_COLL_RECV)
        return td_p2p_submit(&s->p2p, s->t, c, work);
    return td_backend_finish(work, s->run(&s->coll, c));
}

void td_transport_backend_abort(void *state, td_status status, const char *message)
{
    transport_backend *s = state;
    td_transport_abort(s->t, status, message);
}

void td_transport_backend_destroy(void *state)
{
    transport_backend *s = state;
    td_transport_destroy(s->t);
    td_coll_ctx_free(&s->coll);
    td_p2p_pool_free(&s->p2p);
    free(s);
}
