/* The "shm" backend (tdist/backend.h): every rank of the group on one host, talking through
 * shared memory (transport/shm.h). Collectives use the direct shared-memory algorithms where they
 * exist (backends/shm/direct.h: all_reduce, reduce, broadcast, all_gather, gather, scatter,
 * reduce_scatter, barrier) and the transport algorithms of src/coll otherwise (all_to_all, or
 * whatever TDIST_ALGO forces); they run on the worker thread and complete before submit returns.
 * SEND and RECV are posted and complete through the transport's callback. A failed collective has
 * aborted the transport, which tells the other ranks at once. The rest it shares with the tcp
 * backend: the collective layer's group over a transport (coll.h). */
#include <tdist/backend.h>

#include "backends/builtin.h"
#include "backends/shm/direct.h"
#include "base/error.h"
#include "coll/coll.h"
#include "transport/shm.h"

static td_status shm_create(const td_backend_args *a, void **state)
{
    td_coll_config cfg;
    TD_TRY(coll_config_from_env(&cfg));
    td_shm_options o = {.setup = coll_transport_setup(a, "shm/")};
    td_transport *t;
    TD_TRY(shm_transport_create(&o, &t));
    return coll_group_create(t, &cfg, state);
}

/* Collectives go to the direct algorithms (which hand what they have no algorithm for to
 * coll_execute); sends and receives to the group over the transport. */
static td_status shm_submit(void *state, const td_coll *c, td_work *work)
{
    if (c->kind == TD_COLL_SEND || c->kind == TD_COLL_RECV)
        return coll_group_submit(state, c, work);
    return coll_finish(work, shm_coll_run(coll_group_ctx(state), c));
}

const td_backend_ops backend_shm_ops = {
    .name = "shm",
    .create = shm_create,
    .submit = shm_submit,
    .abort = coll_group_abort,
    .destroy = coll_group_destroy,
    .supports = NULL,
    .caps = TD_BACKEND_CAP_CALLER_THREAD,
};
