/* The shm transport: td_transport (transport/transport.h) between the ranks of one host over
 * shared memory. Its segments are also the same-host segment set (samehost.h) that the
 * shared-memory collectives (backends/shm/direct.h) use directly, through td_transport.samehost.
 *
 * Set-up (shm_connect.c) goes through a store: each rank creates one segment (tensor/segment.h),
 * unlinked from /dev/shm at once, listens on an abstract UNIX-domain socket and publishes its name;
 * every pair of ranks connects (lower rank to higher) and swaps a hello and its segment's fd over
 * SCM_RIGHTS. Nothing is ever left in /dev/shm, however a rank ends. The socket stays open: its
 * EOF (and a pidfd per peer) tells a rank at once that a peer died, and it carries the goodbye of
 * an orderly close and the cause of an abort.
 *
 * A rank's segment holds a ring per peer for the messages that peer sends it (single producer,
 * single consumer, a 16-byte header per message), its doorbell (a futex word the others ring),
 * its arrival counter for the direct collectives, and two small and two large slots that its
 * peers read from directly (the doorbell, the counter and the slots are the same-host layer's,
 * samehost.h). Waiting spins briefly (yielding the core), then sleeps on the doorbell; a writer
 * rings a doorbell only when someone sleeps on it, so the fast path makes no system call. The engine (shm.c) follows the tcp transport's model: the waiting thread drives
 * progress, and the transport's own thread does when nobody waits.
 *
 * Tuning (environment; every rank must use the same values, which the hello checks):
 *   TDIST_SHM_RING     bytes of each ring (default 256K, less above 9 ranks: about 2M of rings
 *                      per rank; a power of two, at least 4K)
 *   TDIST_SHM_SLOT     bytes of each large slot: the chunk of the direct collectives (default 1M)
 *   TDIST_SHM_SMALL    bytes of each small slot (default 64K)
 *   TDIST_SHM_SPIN_US  how long a waiting thread spins before sleeping (default 20; adaptive)
 *   TDIST_SHM_WRITES   how the direct collectives write their slots: auto (measured, the default),
 *                      cached or around (streaming stores); may differ between ranks
 */
#ifndef TDIST_TRANSPORT_SHM_H
#define TDIST_TRANSPORT_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/shm_proto.h"
#include "transport/transport.h"

typedef struct td_shm_options {
    td_transport_setup setup; /* key_prefix NULL: "shm/" */
} td_shm_options;

/* Creates the segment, connects to every peer (all must be on this host: a peer on another host
 * fails with TD_ERR_INVALID naming it) and starts the transport's threads. Every rank of the group
 * must call it with the same store, prefix, group name and size. */
td_status shm_transport_create(const td_shm_options *options, td_transport **out);

/* Whether t is an shm transport. */
bool transport_is_shm(const td_transport *t);

#endif
