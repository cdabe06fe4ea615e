/* libFuzzer target for the shm transport's engine reading a peer's ring (src/transport/shm.c,
 * drain): the input is what a peer (a bug, or a stranger that got the segment) wrote into the ring
 * it owns in this rank's segment, and the head it published.
 *
 * Each input builds a real transport of two ranks, as shm_connect.c hands one to the engine: this
 * rank's segment and the peer's (both real tmpfs segments, unlinked), a socketpair as the pair's
 * control socket, no pid (so the peer's death shows through the socket). The first bytes choose
 * the receives posted (tags 0 to 3, sizes below 4 KiB, one of them any-source), whether a send of
 * ours goes out too, whether the peer claims to be blocked on a full ring, and how far the
 * published head lies beyond the bytes written; the rest are the ring's bytes (at most the ring,
 * 64 KiB here). Then the doorbell rings, the receives wait a little, the peer's socket closes
 * (unless the plan keeps it open), and the transport is destroyed. The engine must take each
 * message to its receive, an unexpected buffer or the bin, fail what cannot complete with a
 * message (a head beyond the ring, a length over the largest message, a length mismatch, a peer
 * gone mid-message), and never read or write outside its buffers, leak, or hang. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_xfers.h"
#include "tensor/segment.h"
#include "transport/shm_impl.h"
#include "transport/shm_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NRECV FUZZ_NRECV
#define PLAN_BYTES (1 + 2 * NRECV + 2)
#define RING_BYTES 65536

static bool g_ready;
static td_shm_layout g_layout;
static shm_offsets g_off;

static bool setup_once(void)
{
    if (g_ready)
        return true;
    setenv("TDIST_SHM_RING", "65536", 1);
    setenv("TDIST_SHM_SLOT", "65536", 1);
    if (shm_layout_from_env(2, &g_layout) != TD_OK)
        return false;
    shm_layout_offsets(2, &g_layout, &g_off);
    g_ready = true;
    return true;
}

/* A rank's segment as shm_connect.c's init_segment leaves it: the header, zeros after it. */
static bool make_segment(int rank, td_segment *seg)
{
    *seg = (td_segment)TD_SEGMENT_INIT;
    if (segment_create("fz", g_off.total, true, false, seg) != TD_OK)
        return false;
    td_shm_seg_header *h = seg->base;
    h->magic = TD_SHM_MAGIC;
    h->version = TD_SHM_VERSION;
    h->rank = (uint32_t)rank;
    h->world = 2;
    h->pid = (uint32_t)getpid();
    h->size = g_off.total;
    h->layout = g_layout;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < PLAN_BYTES || !setup_once())
        return 0;
    uint8_t plan = data[0];
    size_t sizes[NRECV];
    for (int i = 0; i < NRECV; i++)
        sizes[i] = (size_t)(data[1 + 2 * i] | (data[2 + 2 * i] << 8)) % 4096;
    uint64_t lie = (uint64_t)(data[1 + 2 * NRECV] | (data[2 + 2 * NRECV] << 8));
    if (plan & 0x20)
        lie <<= 8; /* far beyond the ring */
    const uint8_t *ring = data + PLAN_BYTES;
    size_t rlen = size - PLAN_BYTES;
    if (rlen > RING_BYTES)
        rlen = RING_BYTES;

    td_segment own, theirs;
    if (!make_segment(0, &own))
        return 0;
    if (!make_segment(1, &theirs)) {
        segment_unmap(&own);
        return 0;
    }
    /* The peer's ring to us lives in our segment (sender 1 is ring 0 for owner 0). */
    char *mine = own.base;
    shm_ring_ctl *in = (shm_ring_ctl *)(mine + g_off.rings);
    char *in_data = (char *)in + SHM_RING_CTL_SIZE;
    samehost_bell *bell = (samehost_bell *)(mine + g_off.bell);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        segment_unmap(&own);
        segment_unmap(&theirs);
        return 0;
    }
    shm_peer_setup peers[2] = {{.sock = -1, .seg = TD_SEGMENT_INIT}, {.sock = sv[0], .pid = 0, .seg = theirs}};
    td_transport *t = NULL;
    if (shm_transport_start(0, 2, NULL, &own, &g_layout, peers, &t) != TD_OK) {
        close(sv[1]);
        return 0;
    }

    /* With plan bit 8, a send of ours goes into the peer's ring while we read ours. */
    fuzz_xfers f;
    fuzz_xfers_post(&f, t, sizes, plan & 1, data, (plan & 8) ? (size < 100 ? size : 100) : 0);
    /* The peer writes its ring and publishes the head, as a sender does, then rings our bell. */
    memcpy(in_data, ring, rlen);
    if (plan & 4)
        atomic_store_explicit(&in->sender_blocked, 1, memory_order_relaxed);
    uint64_t head = (plan & 0x10) ? rlen + lie : rlen;
    atomic_store_explicit(&in->head, head, memory_order_release);
    samehost_bell_ring(bell, SAMEHOST_BELL_IO);
    if (!(plan & 2))
        shutdown(sv[1], SHUT_WR); /* the peer is gone; else the deadline ends the waits */
    fuzz_xfers_wait(&f, t, "fuzz_shm_ring");
    transport_destroy(t);
    close(sv[1]);
    fuzz_xfers_free(&f);
    return 0;
}
