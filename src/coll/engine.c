/* The step engine every algorithm runs on (coll_impl.h): the per-group context (scratch memory,
 * xfer and step arrays grown rarely, so that nothing is allocated per operation after warm-up),
 * tagged sends and receives of one collective over the transport, chunking, and the pipelined
 * exchange behind every bandwidth-bound algorithm: ring reduce-scatter and all-gather, the
 * halving/doubling exchanges of rhd and rd.
 *
 * Pipelined steps are cut into chunks (TDIST_COLL_CHUNK), numbered m = step * K + chunk. Receives
 * are posted a window ahead (so the data of chunk m+1 is already landing while chunk m is being
 * reduced, and a posted receive takes the payload straight from the socket); a send is posted as
 * soon as its chunk is ready, which for step s means that chunk j of step s-1 has arrived and been
 * reduced. Sends come straight from the caller's memory, receives for "direct" steps go straight
 * into it, and reducing steps go through a window of scratch slots. */
#include "coll/coll_impl.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/hugealloc.h"

/* ---- context ---------------------------------------------------------------------------------- */

td_status coll_ctx_init(td_coll_ctx *c, td_transport *t, const td_coll_config *cfg)
{
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    c->t = t;
    c->rank = t->rank;
    c->size = t->size;
    c->ptrs = alloc_zeroed((size_t)c->size * 4, sizeof(void *));
    return TD_OK;
}

void coll_ctx_free(td_coll_ctx *c)
{
    huge_free(c->scratch, c->scratch_cap);
    free(c->xfers);
    free(c->ptrs);
    free(c->steps);
    memset(c, 0, sizeof *c);
}

static size_t grow_to(size_t need)
{
    size_t cap = 4096;
    while (cap < need)
        cap *= 2;
    return cap;
}

td_status coll_scratch(coll_run *run, size_t bytes, char **out)
{
    td_coll_ctx *c = run->c;
    if (bytes > c->scratch_cap || !c->scratch) {
        size_t cap = grow_to(bytes);
        void *p = NULL;
        TD_TRY(huge_try_alloc(cap, "collective scratch buffer", &p));
        huge_free(c->scratch, c->scratch_cap);
        c->scratch = p;
        c->scratch_cap = cap;
    }
    *out = c->scratch;
    return TD_OK;
}

td_status coll_xfers(coll_run *run, size_t n, td_xfer **out)
{
    td_coll_ctx *c = run->c;
    if (n > c->xfers_cap) {
        size_t cap = 16;
        while (cap < n)
            cap *= 2;
        free(c->xfers);
        c->xfers = alloc_zeroed(cap, sizeof(td_xfer));
        c->xfers_cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        c->xfers[i].on_done = NULL;
    *out = c->xfers;
    return TD_OK;
}

ring_step *coll_steps(coll_run *run, size_t n)
{
    td_coll_ctx *c = run->c;
    if (n > c->steps_cap) {
        free(c->steps);
        c->steps_cap = n < 16 ? 16 : n;
        c->steps = alloc_zeroed(c->steps_cap, sizeof(ring_step));
    }
    memset(c->steps, 0, n * sizeof(ring_step));
    return c->steps;
}

td_status coll_isend(coll_run *run, int peer, uint32_t step, const void *buf, size_t bytes, td_xfer *x)
{
    return transport_isend1_posted(run->t, peer, coll_tag(run, step), buf, bytes, run->dl, x);
}

td_status coll_irecv(coll_run *run, int peer, uint32_t step, void *buf, size_t bytes, td_xfer *x)
{
    return transport_irecv1(run->t, peer, coll_tag(run, step), buf, bytes, run->dl, x);
}

td_status coll_wait(coll_run *run, td_xfer *x) { return transport_wait(run->t, x, run->dl); }

td_status coll_send(coll_run *run, int peer, uint32_t step, const void *buf, size_t bytes)
{
    td_xfer x = {.on_done = NULL};
    TD_TRY(coll_isend(run, peer, step, buf, bytes, &x));
    return coll_wait(run, &x);
}

td_status coll_sendrecv(coll_run *run, int to, const void *sbuf, size_t sbytes, int from, void *rbuf, size_t rbytes,
                        uint32_t step)
{
    return transport_sendrecv(run->t, to, sbuf, sbytes, from, rbuf, rbytes, coll_tag(run, step), run->dl, true);
}

size_t coll_nchunks(const coll_run *run, size_t count)
{
    size_t bytes = count * run->esize;
    size_t chunk = run->c->cfg.chunk_bytes;
    size_t k = (bytes + chunk - 1) / chunk;
    return k ? k : 1;
}

/* ---- the pipelined exchange ------------------------------------------------------------------ */

#define RECV_WINDOW 32
#define SEND_WINDOW 8
#define PACE_WINDOW 8 /* sends ahead of own receives; receivers post RECV_WINDOW ahead */

static size_t slot_bytes(const coll_run *run, size_t max_count, size_t K)
{
    size_t b = (max_count + K - 1) / K * run->esize;
    return (b + 63) & ~(size_t)63;
}

size_t coll_ring_scratch(const coll_run *run, size_t max_count)
{
    return RECV_WINDOW * slot_bytes(run, max_count, coll_nchunks(run, max_count));
}

typedef struct engine {
    coll_run *run;
    const ring_step *st;
    int to, from;
    char *slots;
    size_t K, M, slot;
    uint32_t phase;
    td_xfer *rx, *sx;
    size_t recvs_posted, recvs_done, sends_posted, sends_done;
} engine;


static td_status post_recv(engine *e)
{
    size_t m = e->recvs_posted, s = m / e->K, j = m % e->K, lo, hi;
    const ring_step *st = &e->st[s];
    if (st->no_recv) {
        xfer_set_empty(&e->rx[m % RECV_WINDOW]);
        e->recvs_posted++;
        return TD_OK;
    }
    coll_chunk(st->recv_count, j, e->K, &lo, &hi);
    char *dst = st->recv_direct ? COLL_AT(st->recv, lo * e->run->esize) : e->slots + (m % RECV_WINDOW) * e->slot;
    TD_TRY(coll_irecv(e->run, e->from, e->phase + (uint32_t)m, dst, (hi - lo) * e->run->esize, &e->rx[m % RECV_WINDOW]));
    e->recvs_posted++;
    return TD_OK;
}

static td_status post_send(engine *e)
{
    size_t m = e->sends_posted, s = m / e->K, j = m % e->K, lo, hi;
    const ring_step *st = &e->st[s];
    coll_chunk(st->send_count, j, e->K, &lo, &hi);
    if (e->sends_posted - e->sends_done == SEND_WINDOW) {
        TD_TRY(coll_wait(e->run, &e->sx[e->sends_done % SEND_WINDOW]));
        e->sends_done++;
    }
    if (st->no_send) {
        xfer_set_empty(&e->sx[m % SEND_WINDOW]);
        e->sends_posted++;
        return TD_OK;
    }
    TD_TRY(coll_isend(e->run, e->to, e->phase + (uint32_t)m, COLL_AT(st->send, lo * e->run->esize), (hi - lo) * e->run->esize,
                      &e->sx[m % SEND_WINDOW]));
    e->sends_posted++;
    return TD_OK;
}

/* Posts every send that is ready: step 0's at once, step s's chunk j once step s-1's has arrived.
 * Sends also stay within a window of this rank's own receive progress: the peers run the same
 * schedule, so the receiver has posted about as far as this rank has, and a chunk sent further
 * ahead would land in an unexpected-message buffer and cost a copy. */
static td_status pump_sends(engine *e)
{
    while (e->sends_posted < e->M && e->sends_posted < e->recvs_done + e->K && e->sends_posted < e->recvs_done + PACE_WINDOW)
        TD_TRY(post_send(e));
    return TD_OK;
}

td_status coll_ring_run(coll_run *run, const ring_step *steps, int nsteps, int to, int from, char *slots,
                        uint32_t phase)
{
    if (nsteps <= 0)
        return TD_OK;
    size_t maxc = 0;
    for (int s = 0; s < nsteps; s++) {
        if (steps[s].send_count > maxc)
            maxc = steps[s].send_count;
        if (steps[s].recv_count > maxc)
            maxc = steps[s].recv_count;
    }
    engine e = {.run = run, .st = steps, .to = to, .from = from, .slots = slots, .phase = phase};
    e.K = coll_nchunks(run, maxc);
    e.M = (size_t)nsteps * e.K;
    e.slot = slot_bytes(run, maxc, e.K);
    td_xfer *xf;
    TD_TRY(coll_xfers(run, RECV_WINDOW + SEND_WINDOW, &xf));
    e.rx = xf;
    e.sx = xf + RECV_WINDOW;

    while (e.recvs_posted < e.M && e.recvs_posted < RECV_WINDOW)
        TD_TRY(post_recv(&e));
    TD_TRY(pump_sends(&e));
    while (e.recvs_done < e.M) {
        size_t m = e.recvs_done, s = m / e.K, j = m % e.K;
        const ring_step *st = &steps[s];
        TD_TRY(coll_wait(run, &e.rx[m % RECV_WINDOW]));
        if (!st->recv_direct && !st->no_recv) {
            if (st->send_is_dst) {
                /* The chunk about to be overwritten must have left first. */
                while (e.sends_posted <= m)
                    TD_TRY(post_send(&e));
                while (e.sends_done <= m) {
                    TD_TRY(coll_wait(run, &e.sx[e.sends_done % SEND_WINDOW]));
                    e.sends_done++;
                }
            }
            size_t lo, hi;
            coll_chunk(st->recv_count, j, e.K, &lo, &hi);
            const char *slot = slots + (m % RECV_WINDOW) * e.slot;
            char *dst = COLL_AT(st->red_dst, lo * run->esize);
            const char *own = COLL_AT(st->red_in, lo * run->esize);
            if (st->own_first)
                run->fn(dst, own, slot, hi - lo);
            else
                run->fn(dst, slot, own, hi - lo);
        }
        e.recvs_done++;
        TD_TRY(pump_sends(&e));
        while (e.recvs_posted < e.M && e.recvs_posted < e.recvs_done + RECV_WINDOW)
            TD_TRY(post_recv(&e));
    }
    while (e.sends_done < e.sends_posted) {
        TD_TRY(coll_wait(run, &e.sx[e.sends_done % SEND_WINDOW]));
        e.sends_done++;
    }
    return TD_OK;
}
