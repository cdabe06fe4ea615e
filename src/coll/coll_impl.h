/* Internal to src/coll: the state of one running collective and the helpers the algorithm files
 * share (tags, scratch, xfer arrays, the pipelined exchange engine). */
#ifndef TDIST_COLL_COLL_IMPL_H
#define TDIST_COLL_COLL_IMPL_H

#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

typedef struct coll_run {
    td_coll_ctx *c;
    td_transport *t;
    const td_coll *op;
    int rank;
    int size;
    size_t esize;
    td_reduce_fn fn; /* fetched once per operation; NULL for kinds that do not reduce */
    int64_t dl;
} coll_run;

static inline uint64_t coll_tag(const coll_run *run, uint32_t step) { return TD_TAG_COLL(run->op->seq, step); }
/* Phases of one collective get disjoint step ranges (steps wrap harmlessly: messages between a
 * pair with one tag match in posting order, and phases run one after the other). */
#define COLL_PHASE(p) ((uint32_t)(p) << 16)

/* Scratch of at least bytes (64-byte aligned), valid until the next call. Grows rarely. */
td_status coll_scratch(coll_run *run, size_t bytes, char **out);
/* n xfers, valid until the next call; get them before posting anything. */
td_status coll_xfers(coll_run *run, size_t n, td_xfer **out);

td_status coll_isend(coll_run *run, int peer, uint32_t step, const void *buf, size_t bytes, td_xfer *x);
td_status coll_irecv(coll_run *run, int peer, uint32_t step, void *buf, size_t bytes, td_xfer *x);
td_status coll_wait(coll_run *run, td_xfer *x);
/* A blocking send (coll_isend, then coll_wait). */
td_status coll_send(coll_run *run, int peer, uint32_t step, const void *buf, size_t bytes);
td_status coll_sendrecv(coll_run *run, int to, const void *sbuf, size_t sbytes, int from, void *rbuf, size_t rbytes,
                        uint32_t step);

/* Chunk j of K of a block of count elements: [*lo, *hi). */
static inline void coll_chunk(size_t count, size_t j, size_t K, size_t *lo, size_t *hi)
{
    *lo = (size_t)((unsigned __int128)count * j / K);
    *hi = (size_t)((unsigned __int128)count * (j + 1) / K);
}
/* How many chunks a block of count elements is cut into. */
size_t coll_nchunks(const coll_run *run, size_t count);

/* p + off for a pointer that may be NULL when off is 0 (an empty tensor's data). */
static inline char *coll_at(const void *p, size_t off) { return off ? (char *)p + off : (char *)p; }
#define COLL_AT(p, off) coll_at((p), (off))

static inline void coll_copy(void *dst, const void *src, size_t bytes)
{
    if (dst != src && bytes)
        memmove(dst, src, bytes);
}

/* ---- the pipelined exchange engine (engine.c) ---------------------------------------------------
 * A sequence of steps; at each, this rank sends a block to `to` and receives one from `from`.
 * Every block is cut into the same number of chunks, and chunks flow as soon as they are ready:
 * step s's chunk j is sent once step s-1's chunk j has arrived (and been reduced), so reduction
 * of one chunk overlaps the transfer of the next ones. A received chunk goes straight to `recv`
 * (recv_direct) or into a scratch slot and then red_dst = slot op red_in (own op slot when
 * own_first). Pointers may be NULL when their counts are 0. */
typedef struct ring_step {
    const char *send;
    size_t send_count;
    char *recv;          /* direct destination (recv_direct) */
    size_t recv_count;
    const char *red_in;  /* this rank's contribution (may equal red_dst) */
    char *red_dst;
    bool own_first;      /* reduce as red_in op received (the lower rank's data first) */
    bool send_is_dst;    /* the send reads red_dst: finish sending a chunk before reducing into it */
    bool no_send;        /* nothing to send at this step */
    bool no_recv;        /* nothing to receive at this step */
    bool recv_direct;    /* receive into recv; else into a slot, then reduce into red_dst */
} ring_step;

/* The step array for the engine, n entries (per context, grown rarely). */
ring_step *coll_steps(coll_run *run, size_t n);
/* Scratch the engine needs for steps with at most max_count elements per block. */
size_t coll_ring_scratch(const coll_run *run, size_t max_count);
/* slots: coll_ring_scratch bytes (from the caller's scratch). phase: COLL_PHASE value for tags. */
td_status coll_ring_run(coll_run *run, const ring_step *steps, int nsteps, int to, int from, char *slots,
                        uint32_t phase);

/* ---- algorithms ----------------------------------------------------------------------------- */

td_status coll_all_reduce_rd(coll_run *run);
td_status coll_all_reduce_ring(coll_run *run);
td_status coll_all_reduce_rhd(coll_run *run);
td_status coll_all_reduce_tree(coll_run *run);

/* buf/count explicit so that all_reduce_tree can reuse them; chain = pipelined chain ("ring"). */
td_status coll_broadcast(coll_run *run, void *buf, size_t count, int root, bool chain, uint32_t phase);
td_status coll_reduce(coll_run *run, void *buf, size_t count, int root, bool chain, uint32_t phase);

td_status coll_gather_direct(coll_run *run);
td_status coll_gather_tree(coll_run *run);
td_status coll_scatter_direct(coll_run *run);
td_status coll_scatter_tree(coll_run *run);

td_status coll_all_gather_ring(coll_run *run);
td_status coll_all_gather_bruck(coll_run *run);
td_status coll_reduce_scatter_ring(coll_run *run);
td_status coll_reduce_scatter_direct(coll_run *run);
td_status coll_all_to_all_pairwise(coll_run *run);
td_status coll_all_to_all_direct(coll_run *run);
td_status coll_barrier_dissemination(coll_run *run);

#endif
