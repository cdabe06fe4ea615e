/* The "tcp" backend (tdist/backend.h): the collective algorithms of src/coll over the tcp
 * transport (src/transport/tcp.h), one TCP connection per pair of ranks.
 *
 * create connects the group (through its store, within its timeout) and reads the algorithm
 * configuration (TDIST_ALGO and friends, so a bad name fails at group creation). A collective runs
 * on the calling worker thread, which drives the sockets itself while it waits, and is completed
 * before submit returns. SEND and RECV are only posted: their xfers complete later on whichever
 * thread makes progress, and the completion callback calls td_work_done, so isend/irecv pairs
 * posted in any order on the two sides never deadlock. A failed collective aborts the transport
 * (the group has failed, and the other ranks learn it at once instead of at their timeout). The
 * glue it shares with the shm backend is in transport_backend.c. */
#include <tdist/backend.h>

#include "backends/builtin.h"
#include "backends/transport_backend.h"
#include "base/error.h"
#include "coll/coll.h"
#include "transport/tcp.h"

static td_status run_flat(td_coll_ctx *ctx, const td_coll *op) { return td_coll_run(ctx, op, TD_ALGO_AUTO); }

static td_status tcp_create(const td_backend_args *a, void **state)
{
    td_coll_config cfg;
    TD_TRY(td_coll_config_from_env(&cfg));
    td_tcp_options o = {.setup = td_transport_backend_setup(a, "tcp/")};
    td_transport *t;
    TD_TRY(td_tcp_transport_create(&o, &t));
    return td_transport_backend_create(t, &cfg, run_flat, state);
}

const td_backend_ops td_backend_tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .submit = td_transport_backend_submit,
    .abort = td_transport_backend_abort,
    .destroy = td_transport_backend_destroy,
    .supports = NULL,
    .caps = TD_BACKEND_CAP_CALLER_THREAD,
};
