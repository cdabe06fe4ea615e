/* What the transport fuzz targets (fuzz_tcp_frames, fuzz_shm_ring) post on the transport under
 * test and how they end it: FUZZ_NRECV receives from rank 1 (tags 0 to 3, the sizes the input
 * chose, the last one any-source when asked), optionally a send of ours to rank 1, all bounded by
 * one deadline; then each is waited for, and a failure must carry a message. A header of static
 * functions, not a target: the targets are the fuzz_*.c files. */
#ifndef TDIST_FUZZ_FUZZ_XFERS_H
#define TDIST_FUZZ_FUZZ_XFERS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"
#include "transport/transport.h"

#define FUZZ_NRECV 4

typedef struct fuzz_xfers {
    uint8_t *bufs[FUZZ_NRECV];
    td_xfer xs[FUZZ_NRECV + 1]; /* the receives, then the send */
    bool posted[FUZZ_NRECV + 1];
    int64_t deadline_ns;
} fuzz_xfers;

/* Posts the receives (sizes[i] bytes, tag i; the last from any source when any_last) and, when
 * send_len > 0, a send of send_len bytes of send with tag 7; all end within 30 ms. */
static void fuzz_xfers_post(fuzz_xfers *f, td_transport *t, const size_t *sizes, bool any_last, const void *send,
                            size_t send_len)
{
    f->deadline_ns = clock_now_ns() + 30 * 1000000LL;
    for (int i = 0; i < FUZZ_NRECV; i++) {
        f->bufs[i] = malloc(sizes[i] + 1);
        f->xs[i].on_done = NULL;
        int peer = any_last && i == FUZZ_NRECV - 1 ? TD_TRANSPORT_ANY : 1;
        f->posted[i] = transport_irecv1(t, peer, (uint64_t)i, f->bufs[i], sizes[i], f->deadline_ns, &f->xs[i]) == TD_OK;
    }
    f->xs[FUZZ_NRECV].on_done = NULL;
    f->posted[FUZZ_NRECV] =
        send_len > 0 && transport_isend1(t, 1, 7, send, send_len, f->deadline_ns, &f->xs[FUZZ_NRECV]) == TD_OK;
}

/* Waits for each posted xfer; one that failed without a message is a bug (target names the
 * fuzzer in the report). */
static void fuzz_xfers_wait(fuzz_xfers *f, td_transport *t, const char *target)
{
    for (int i = 0; i <= FUZZ_NRECV; i++) {
        if (!f->posted[i])
            continue;
        td_status s = transport_wait(t, &f->xs[i], f->deadline_ns);
        if (s != TD_OK && !f->xs[i].error[0]) {
            fprintf(stderr, "%s: a failure without a message\n", target);
            abort();
        }
    }
}

/* After the transport is destroyed (nothing refers to the buffers any more). */
static void fuzz_xfers_free(fuzz_xfers *f)
{
    for (int i = 0; i < FUZZ_NRECV; i++)
        free(f->bufs[i]);
}

#endif
