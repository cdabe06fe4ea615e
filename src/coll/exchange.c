/* Collectives where every rank both contributes and receives a block (coll.h): all_gather (ring,
 * Bruck), reduce_scatter (ring, direct), all_to_all (pairwise, direct) and the dissemination
 * barrier.
 *
 * Blocks are the caller's own per-rank pointers (td_coll's in_blocks / out_blocks), so ring steps
 * receive straight into the destination block and send straight from the source; only Bruck
 * (small blocks, log steps) and the reduce-scatter accumulators go through scratch. */
#include "coll/coll_impl.h"

#include <stdint.h>

#include "base/error.h"

static int mod(int a, int n) { return ((a % n) + n) % n; }

td_status coll_all_gather_ring(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    size_t bytes = op->count * run->esize;
    coll_copy(op->out_blocks[r], op->in, bytes);
    if (n == 1)
        return TD_OK;
    ring_step *st = coll_steps(run, (size_t)n - 1);
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(r - s, n), rb = mod(r - s - 1, n);
        st[s].send = op->out_blocks[sb];
        st[s].send_count = op->count;
        st[s].recv_direct = true;
        st[s].recv = op->out_blocks[rb];
        st[s].recv_count = op->count;
    }
    return coll_ring_run(run, st, n - 1, (r + 1) % n, mod(r - 1, n), NULL, COLL_PHASE(0));
}

td_status coll_all_gather_bruck(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    size_t bytes = op->count * run->esize;
    char *tmp;
    TD_TRY(coll_scratch(run, (size_t)n * bytes, &tmp));
    /* tmp holds the blocks of ranks r, r+1, ... in that order. */
    coll_copy(tmp, op->in, bytes);
    uint32_t step = 0;
    for (int k = 1; k < n; k <<= 1) {
        int cnt = k < n - k ? k : n - k;
        TD_TRY(coll_sendrecv(run, mod(r - k, n), tmp, (size_t)cnt * bytes, (r + k) % n, tmp + (size_t)k * bytes,
                             (size_t)cnt * bytes, step++));
    }
    for (int i = 0; i < n; i++)
        coll_copy(op->out_blocks[(r + i) % n], tmp + (size_t)i * bytes, bytes);
    return TD_OK;
}

td_status coll_reduce_scatter_ring(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    size_t bytes = op->count * run->esize;
    if (n == 1) {
        coll_copy(op->out, op->in_blocks[0], bytes);
        return TD_OK;
    }
    /* acc: the partial sums this rank forwards (one block each; block r's goes to out). */
    size_t acc_bytes = ((size_t)n * bytes + 63) & ~(size_t)63;
    char *scratch;
    TD_TRY(coll_scratch(run, acc_bytes + coll_ring_scratch(run, op->count), &scratch));
    char *acc = scratch, *slots = scratch + acc_bytes;
    ring_step *st = coll_steps(run, (size_t)n - 1);
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(r - s - 1, n), rb = mod(r - s - 2, n);
        st[s].send = s == 0 ? (const char *)op->in_blocks[sb] : acc + (size_t)sb * bytes;
        st[s].send_count = op->count;
        st[s].recv_count = op->count;
        st[s].red_in = op->in_blocks[rb];
        st[s].red_dst = s == n - 2 ? (char *)op->out : acc + (size_t)rb * bytes;
    }
    return coll_ring_run(run, st, n - 1, (r + 1) % n, mod(r - 1, n), slots, COLL_PHASE(0));
}

static bool overlaps(const void *a, const void *b, size_t bytes)
{
    const char *x = a, *y = b;
    return bytes && x < y + bytes && y < x + bytes;
}

td_status coll_reduce_scatter_direct(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    size_t bytes = op->count * run->esize;
    if (n == 1) {
        coll_copy(op->out, op->in_blocks[0], bytes);
        return TD_OK;
    }
    size_t slot = (bytes + 63) & ~(size_t)63;
    char *slots;
    TD_TRY(coll_scratch(run, slot * (size_t)n, &slots));
    td_xfer *xf;
    TD_TRY(coll_xfers(run, 2 * (size_t)n, &xf));
    int k = 0;
    for (int p = 0; p < n; p++)
        if (p != r)
            TD_TRY(coll_irecv(run, p, 0, slots + (size_t)p * slot, bytes, &xf[k++]));
    for (int i = 1; i < n; i++) {
        int p = (r + i) % n;
        TD_TRY(coll_isend(run, p, 0, op->in_blocks[p], bytes, &xf[k++]));
    }
    TD_TRY(transport_wait_all(run->t, xf, k, run->dl));
    /* Reduce in rank order; out may be the caller's own input block, so keep a copy of that. */
    const char **src = (const char **)run->c->ptrs;
    for (int p = 0; p < n; p++)
        src[p] = p == r ? (const char *)op->in_blocks[r] : slots + (size_t)p * slot;
    if (overlaps(op->out, op->in_blocks[r], bytes)) {
        memcpy(slots + (size_t)r * slot, op->in_blocks[r], bytes);
        src[r] = slots + (size_t)r * slot;
    }
    run->fn(op->out, src[0], src[1], op->count);
    for (int p = 2; p < n; p++)
        run->fn(op->out, op->out, src[p], op->count);
    return TD_OK;
}

/* The [lowest, highest) address range of n blocks. */
static void span(const void *const *b, const size_t *counts, int n, size_t es, uintptr_t *lo, uintptr_t *hi)
{
    *lo = UINTPTR_MAX;
    *hi = 0;
    for (int p = 0; p < n; p++) {
        if (!counts[p])
            continue;
        uintptr_t a = (uintptr_t)b[p], e = a + counts[p] * es;
        if (a < *lo)
            *lo = a;
        if (e > *hi)
            *hi = e;
    }
}

/* In-place all_to_all (the same tensor as input and output): received blocks would overwrite
 * blocks not sent yet, so the inputs go to scratch first. Returns the blocks to send from. */
static td_status a2a_inputs(coll_run *run, const void *const **in)
{
    const td_coll *op = run->op;
    int n = run->size;
    size_t es = run->esize;
    uintptr_t ilo, ihi, olo, ohi;
    span(op->in_blocks, op->in_counts, n, es, &ilo, &ihi);
    span((const void *const *)op->out_blocks, op->out_counts, n, es, &olo, &ohi);
    *in = op->in_blocks;
    if (ilo >= ihi || olo >= ohi || ihi <= olo || ohi <= ilo)
        return TD_OK;
    size_t total = 0;
    for (int p = 0; p < n; p++)
        total += (op->in_counts[p] * es + 63) & ~(size_t)63;
    char *tmp;
    TD_TRY(coll_scratch(run, total, &tmp));
    const void **copy = (const void **)run->c->ptrs;
    for (int p = 0; p < n; p++) {
        size_t bytes = op->in_counts[p] * es;
        if (bytes)
            memcpy(tmp, op->in_blocks[p], bytes);
        copy[p] = tmp;
        tmp += (bytes + 63) & ~(size_t)63;
    }
    *in = (const void *const *)copy;
    return TD_OK;
}

static td_status a2a_self(coll_run *run, const void *const *in)
{
    const td_coll *op = run->op;
    int r = run->rank;
    if (op->in_counts[r] != op->out_counts[r])
        return error_fmt(TD_ERR_INVALID, "all_to_all: rank %d sends itself %zu elements but expects %zu", r,
                        op->in_counts[r], op->out_counts[r]);
    coll_copy(op->out_blocks[r], in[r], op->in_counts[r] * run->esize);
    return TD_OK;
}

td_status coll_all_to_all_pairwise(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    const void *const *in;
    TD_TRY(a2a_inputs(run, &in));
    TD_TRY(a2a_self(run, in));
    for (int s = 1; s < n; s++) {
        int to = (r + s) % n, from = mod(r - s, n);
        TD_TRY(coll_sendrecv(run, to, in[to], op->in_counts[to] * run->esize, from, op->out_blocks[from],
                             op->out_counts[from] * run->esize, (uint32_t)s));
    }
    return TD_OK;
}

td_status coll_all_to_all_direct(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    const void *const *in;
    TD_TRY(a2a_inputs(run, &in));
    td_xfer *xf;
    TD_TRY(coll_xfers(run, 2 * (size_t)n, &xf));
    int k = 0;
    for (int s = 1; s < n; s++) {
        int from = mod(r - s, n);
        TD_TRY(coll_irecv(run, from, 0, op->out_blocks[from], op->out_counts[from] * run->esize, &xf[k++]));
    }
    for (int s = 1; s < n; s++) {
        int to = (r + s) % n;
        TD_TRY(coll_isend(run, to, 0, in[to], op->in_counts[to] * run->esize, &xf[k++]));
    }
    td_status st = a2a_self(run, in);
    td_status w = transport_wait_all(run->t, xf, k, run->dl);
    return st != TD_OK ? st : w;
}

td_status coll_barrier_dissemination(coll_run *run)
{
    int n = run->size, r = run->rank;
    uint32_t step = 0;
    for (int k = 1; k < n; k <<= 1)
        TD_TRY(coll_sendrecv(run, (r + k) % n, NULL, 0, mod(r - k, n), NULL, 0, step++));
    return TD_OK;
}
