/* The "tcp" backend (tdist/backend.h): the collective algorithms of src/coll over the tcp
 * transport (src/transport/tcp.h), one TCP connection per pair of ranks.
 *
 * create connects the group (through its store, within its timeout) and reads the algorithm
 * configuration (TDIST_ALGO and friends, so a bad name fails at group creation). A collective runs
 * on the calling worker thread, which drives the sockets itself while it waits, and is completed
 * before submit returns. SEND and RECV are only posted: their xfers complete later on whichever
 * thread makes progress, and the completion callback calls td_work_done, so isend/irecv pairs
 * posted in any order on the two sides never deadlock. A failed collective aborts the transport
 * (the group has failed, and the other ranks learn it at once instead of at their timeout). All of
 * that is the collective layer's group over a transport (coll.h, coll/dispatch.c), which the shm
 * backend shares: this file only says how to make the transport. */
#include <tdist/backend.h>

#include "backends/builtin.h"
#include "base/error.h"
#include "coll/coll.h"
#include "transport/tcp.h"

static td_status tcp_create(const td_backend_args *a, void **state)
{
    td_coll_config cfg;
    TD_TRY(coll_config_from_env(&cfg));
    td_tcp_options o = {.setup = coll_transport_setup(a, "tcp/")};
    td_transport *t;
    TD_TRY(tcp_transport_create(&o, &t));
    return coll_group_create(t, &cfg, state);
}

const td_backend_ops backend_tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .submit = coll_group_submit,
    .abort = coll_group_abort,
    .destroy = coll_group_destroy,
    .supports = NULL,
    .caps = TD_BACKEND_CAP_CALLER_THREAD,
};
