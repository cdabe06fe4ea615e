/* libFuzzer target for a lane's two ends (src/transport/samehost.c, "lanes"), as RPC's channels use
 * them in their shared segment (docs/protocols.md, "Lanes on one host"): the input is what a peer
 * (a bug, or a stranger that got the segment) left in the words and the ring it can write.
 *
 * The first 24 bytes are the reader's private tail, the published head and the published tail;
 * the rest fill the ring from its start (at most the ring). The reader then takes entries until
 * the lane is empty or refused: every entry it returns must lie inside the ring and within the
 * largest entry's bytes, and is copied out whole (so that AddressSanitizer sees any read past it);
 * consumption must keep the published tail equal to the reader's. A writer whose head is the
 * input's head then reserves and publishes entries of the input's sizes: each must be refused
 * (corrupt or full) or lie inside the ring. Nothing may crash, read or write outside the lane, or
 * loop without end. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/samehost.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t word_at(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 24)
        return 0;
    static samehost_lane lane; /* 64 KiB of ring: static, as the segment's is mapped once */
    static uint8_t copy[SAMEHOST_LANE_MAX];
    memset(&lane, 0, sizeof lane);
    uint64_t own_tail = word_at(data), head = word_at(data + 8), tail = word_at(data + 16);
    size_t ring = size - 24 < SAMEHOST_LANE_BYTES ? size - 24 : SAMEHOST_LANE_BYTES;
    memcpy(lane.ring, data + 24, ring);
    atomic_store(&lane.head, head);
    atomic_store(&lane.tail, tail);

    samehost_lane_reader r = {.lane = &lane, .tail = own_tail};
    /* Each entry advances the tail by at least 8 bytes, and a head at most a ring ahead is taken. */
    for (int i = 0; i < (int)(SAMEHOST_LANE_BYTES / 8) + 2; i++) {
        uint32_t kind = 0;
        const uint8_t *at = NULL;
        size_t n = 0;
        int got = samehost_lane_next(&r, &kind, &at, &n);
        if (got == 0) {
            if (atomic_load(&lane.tail) != r.tail)
                abort(); /* an empty lane's published tail is the reader's */
            if (samehost_lane_ready(&r))
                abort(); /* and says so */
            break;
        }
        if (got == SAMEHOST_LANE_CORRUPT)
            break;
        if (got != 1 || n > SAMEHOST_LANE_MAX || at < lane.ring || at + n > lane.ring + SAMEHOST_LANE_BYTES)
            abort();
        memcpy(copy, at, n);
        samehost_lane_consume(&r);
        if (atomic_load(&lane.tail) != r.tail)
            abort();
        if (i == (int)(SAMEHOST_LANE_BYTES / 8) + 1)
            abort(); /* more entries than the ring can hold */
    }

    /* The writer's side, against the reader's tail as it now stands and the input's head. */
    samehost_lane_writer w = {.lane = &lane, .head = head};
    for (size_t k = 0; k + 2 <= ring && k < 64; k += 2) {
        size_t n = ((size_t)lane.ring[k] | (size_t)lane.ring[k + 1] << 8) % (SAMEHOST_LANE_MAX + 64);
        bool corrupt = false;
        uint8_t *dst = samehost_lane_reserve(&w, 1, n, &corrupt);
        if (!dst)
            break;
        if (corrupt || n > SAMEHOST_LANE_MAX || dst < lane.ring || dst + n > lane.ring + SAMEHOST_LANE_BYTES)
            abort();
        memset(dst, 0xab, n);
        samehost_lane_publish(&w);
    }
    return 0;
}
