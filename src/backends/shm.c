/* The "shm" backend (tdist/backend.h): every rank of the group on one host, talking through
 * shared memory (transport/shm.h). Collectives use the direct shared-memory algorithms where they
 * exist (coll/shm_coll.h: all_reduce, reduce, broadcast, all_gather, gather, scatter,
 * reduce_scatter, barrier) and the transport algorithms of src/coll otherwise (all_to_all, or
 * whatever TDIST_ALGO forces); they run on the worker thread and complete before submit returns.
 * SEND and RECV are posted and complete through the transport's callback. A failed collective has
 * aborted the transport, which tells the other ranks at once. The glue it shares with the tcp
 * backend is in transport_backend.c. */
#include <tdist/backend.h>

#include "backends/builtin.h"
#include "backends/transport_backend.h"
#include "base/error.h"
#include "coll/shm_coll.h"
#include "transport/shm.h"

static td_status shm_create(const td_backend_args *a, void **state)
{
    td_coll_config cfg;
    TD_TRY(td_coll_config_from_env(&cfg));
    td_shm_options o = {.setup = td_transport_backend_setup(a, "shm/")};
    td_transport *t;
    TD_TRY(td_shm_transport_create(&o, &t));
    return td_transport_backend_create(t, &cfg, td_shm_coll_run, state);
}

const td_backend_ops td_backend_shm_ops = {
    .name = "shm",
    .create = shm_create,
    .submit = td_transport_backend_submit,
    .abort = td_transport_backend_abort,
    .destroy = td_transport_backend_destroy,
    .supports = NULL,
    .caps = TD_BACKEND_CAP_CALLER_THREAD,
};
