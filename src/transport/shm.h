/* The shm transport: td_transport (transport/transport.h) between the ranks of one host over
 * shared memory, plus direct access to that memory for the shared-memory collectives
 * (backends/shm/direct.h).
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
 * peers read from directly. Waiting spins briefly (yielding the core), then sleeps on the
 * doorbell; a writer rings a doorbell only when someone sleeps on it, so the fast path makes no
 * system call. The engine (shm.c) follows the tcp transport's model: the waiting thread drives
 * progress, and the transport's own thread does when nobody waits.
 *
 * Tuning (environment; every rank must use the same values, which the hello checks):
 *   TDIST_SHM_RING     bytes of each ring (default 256K, less above 9 ranks: about 2M of rings
 *                      per rank; a power of two, at least 4K)
 *   TDIST_SHM_SLOT     bytes of each large slot: the chunk of the direct collectives (default 1M)
 *   TDIST_SHM_SMALL    bytes of each small slot (default 64K)
 *   TDIST_SHM_SPIN_US  how long a waiting thread spins before sleeping (default 20; adaptive)
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

/* Whether t is an shm transport (the direct collectives need one). */
bool transport_is_shm(const td_transport *t);

/* ---- direct access, for the shared-memory collectives ------------------------------------------
 * A direct collective is a sequence of epochs, numbered the same on every rank (shm_epoch).
 * In epoch e a rank (1) waits until every peer arrived at e-1, which means that they are done
 * reading what anyone wrote at e-2; (2) writes its contribution into its slots of parity e % 2;
 * (3) arrives at e; (4) waits for the peers it reads from to arrive at e and reads their slots of
 * parity e % 2. Each arrival carries a description of the operation, which the waiter compares
 * with its own, so ranks that disagree about a collective fail instead of mixing their data. */

typedef struct td_shm_desc {
    uint64_t what;  /* the caller's encoding of what runs (kind, dtype, reduce op, root) */
    uint64_t count; /* elements */
    /* Names an operation given by (what, count) for the mismatch message: "all_reduce of 8
     * float32 elements". Not compared, not shared. */
    void (*describe)(uint64_t what, uint64_t count, char *out, size_t size);
} td_shm_desc;

size_t shm_small_bytes(const td_transport *t);
size_t shm_slot_bytes(const td_transport *t);
/* Rank r's (r may be this rank) small or large slot of parity e % 2: 64-byte aligned. */
char *shm_small(td_transport *t, int r, uint64_t e);
char *shm_slot(td_transport *t, int r, uint64_t e);
/* The next epoch (the counter is the transport's: every direct collective on it shares it). */
uint64_t shm_epoch(td_transport *t);
/* Publishes this rank's arrival at epoch e (after its writes), waking peers that sleep. */
void shm_publish_arrival(td_transport *t, uint64_t e, const td_shm_desc *d);
/* Waits until peer r (or every peer, r = -1) arrived at e or later. d (may be NULL) is checked
 * against the peer's description of e. Fails, aborting the transport, on a mismatch
 * (TD_ERR_INVALID), at the deadline (TD_ERR_TIMEOUT), when the transport aborts (a peer died:
 * TD_ERR_PEER_LOST), or when r has closed its end. */
td_status shm_wait_arrival(td_transport *t, int r, uint64_t e, const td_shm_desc *d, int64_t deadline_ns);

#endif
