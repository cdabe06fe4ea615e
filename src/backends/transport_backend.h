/* Internal: a backend made of one transport (the tcp and shm backends). A collective runs on the
 * calling worker thread through the backend's `run` (which drives the transport itself while it
 * waits) and is completed before submit returns; SEND and RECV are only posted (p2p.h) and
 * complete through the transport's callback. abort aborts the transport, so that the other ranks
 * learn of the failure at once instead of at their timeout. */
#ifndef TDIST_BACKENDS_TRANSPORT_BACKEND_H
#define TDIST_BACKENDS_TRANSPORT_BACKEND_H

#include <tdist/backend.h>

#include "coll/coll.h"
#include "transport/transport.h"

/* Runs one collective (not SEND or RECV) on ctx. */
typedef td_status (*td_transport_backend_run)(td_coll_ctx *ctx, const td_coll *op);

/* The set-up of the group's transport (its store, ranks, timeout, name) under key_prefix. */
td_transport_setup td_transport_backend_setup(const td_backend_args *a, const char *key_prefix);

/* The state of a backend over t, which it takes (and destroys on failure too). */
td_status td_transport_backend_create(td_transport *t, const td_coll_config *cfg, td_transport_backend_run run,
                                      void **state);
/* The td_backend_ops entries of such a backend. */
td_status td_transport_backend_submit(void *state, const td_coll *c, td_work *work);
void td_transport_backend_abort(void *state, td_status status, const char *message);
void td_transport_backend_destroy(void *state);

/* Completes work with the result st of a collective that ran on this thread (with its message on
 * failure); returns TD_OK, what submit returns then. */
td_status td_backend_finish(td_work *work, td_status st);

#endif
