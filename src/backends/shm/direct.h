/* The shared-memory collectives: algorithms that use the memory the ranks of one host share (the
 * same-host segment set of the group's transport, transport/samehost.h) directly instead of
 * sending messages.
 *
 *   all_reduce  shm_flat (small): every rank puts its input in its small slot, raises its arrival,
 *               and reduces all the slots itself, in rank order. One step, no message.
 *               shm (large): reduce-scatter straight from the peers' slots, then all-gather by
 *               copying: each rank copies its input into its large slot once, reduces its slice of
 *               every rank's slot (in rank order) into its other slot, and copies every rank's
 *               reduced slice out. Messages larger than a slot go in slot-sized chunks.
 *   reduce      the same, with only the root gathering (shm) or reducing (shm_flat)
 *   broadcast, all_gather, gather, scatter
 *               shm: the writer copies into its slot, the readers copy out (chunked)
 *   reduce_scatter  shm: every rank copies its blocks into its slot; each reduces its own block
 *   barrier     shm: every rank raises its arrival and waits for everyone's
 * all_to_all and point-to-point messages go through the transport (coll_execute).
 *
 * Every element is reduced once, in an order that does not depend on which rank does it, so all
 * ranks get the same bits; the hot path allocates nothing. PREMUL_SUM's scaling is folded into the
 * copy into the slot, AVG's division into the reduced slice. A failure aborts the transport
 * (every rank fails, naming the cause). */
#ifndef TDIST_BACKENDS_SHM_DIRECT_H
#define TDIST_BACKENDS_SHM_DIRECT_H

#include "coll/coll.h"

/* The algorithm shm_coll_run uses for op: TD_ALGO_SHM, TD_ALGO_SHM_FLAT, or a transport
 * algorithm (forced through TDIST_ALGO, or for collectives that have no direct one). c's transport
 * must have a same-host segment set. */
td_algo shm_coll_choose(const td_coll_ctx *c, const td_coll *op);
/* Runs op (not SEND / RECV) on c: directly when c's transport has a same-host segment set
 * (td_transport.samehost), through coll_execute otherwise. */
td_status shm_coll_run(td_coll_ctx *c, const td_coll *op);

#endif
