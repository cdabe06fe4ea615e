/* Internal to the shm transport (shm.c, shm_connect.c): the layout of a rank's segment and the
 * engine's state. docs/protocols.md, "shm transport", describes the same layout for readers. */
#ifndef TDIST_TRANSPORT_SHM_IMPL_H
#define TDIST_TRANSPORT_SHM_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "tensor/segment.h"
#include "transport/samehost.h"
#include "transport/shm.h"

#define SHM_LINE SAMEHOST_LINE

/* The control of one ring (single producer: the peer; single consumer: the segment's owner).
 * head and tail count bytes since creation; the data area follows. */
typedef struct shm_ring_ctl {
    _Alignas(SHM_LINE) _Atomic uint64_t head;   /* written by the sender */
    _Alignas(SHM_LINE) _Atomic uint64_t tail;   /* written by the receiver */
    _Atomic uint32_t sender_blocked;            /* the sender found the ring full: drain it */
} shm_ring_ctl;

#define SHM_RING_CTL_SIZE ((size_t)2 * SHM_LINE)

/* Offsets in a segment of a world of `world` ranks. Peer rings are indexed by sender, skipping the
 * owner: sender p's ring is number p < owner ? p : p - 1. */
typedef struct shm_offsets {
    size_t bell, arrive, rings, ring_stride, small, large, total;
} shm_offsets;

void shm_layout_offsets(int world, const td_shm_layout *layout, shm_offsets *o);
/* The layout for a world of that size, or from the environment (TDIST_SHM_RING, TDIST_SHM_SMALL,
 * TDIST_SHM_SLOT). */
td_status shm_layout_from_env(int world, td_shm_layout *layout);

/* What set-up hands the engine for each peer. */
typedef struct shm_peer_setup {
    int sock;       /* the pair's connected UNIX-domain socket */
    pid_t pid;      /* the peer's pid in this process's namespace (SO_PEERCRED), 0 if unknown */
    td_segment seg; /* the peer's segment, mapped */
} shm_peer_setup;

/* Builds the transport from this rank's segment (initialized: header, doorbell, rings) and the
 * peers' (peers[rank] is ignored); takes ownership of all of it, also on failure. */
td_status shm_transport_start(int rank, int size, const int *global_ranks, td_segment *own,
                              const td_shm_layout *layout, shm_peer_setup *peers, td_transport **out);

#endif
