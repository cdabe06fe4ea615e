/* Rooted collectives (coll.h): broadcast and reduce over a binomial tree or a chain, both cut into
 * chunks and pipelined (a rank forwards chunk j while chunk j+1 is still arriving), and gather and
 * scatter, direct (the root talks to every rank) or over a binomial tree (subtrees travel as one
 * message, fewer messages at the root for small blocks).
 *
 * Trees use ranks relative to the root (vr = rank - root mod size); in the binomial tree node vr's
 * parent is vr with its lowest set bit cleared and its children are vr + m for the powers of two m
 * below that bit, largest subtree first. */
#include "coll/coll_impl.h"

#define WINDOW 8
#define MAX_CHILDREN 32

typedef struct tree {
    int vr;
    int parent;           /* real rank, -1 at the root */
    int nchildren;
    int children[MAX_CHILDREN]; /* real ranks, largest subtree first */
    int child_mask[MAX_CHILDREN];
} tree;

static int real_of(int vr, int root, int n) { return (vr + root) % n; }

static void tree_plan(tree *t, int rank, int root, int n, bool chain)
{
    t->vr = (rank - root + n) % n;
    t->parent = -1;
    t->nchildren = 0;
    if (chain) {
        if (t->vr > 0)
            t->parent = real_of(t->vr - 1, root, n);
        if (t->vr + 1 < n) {
            t->children[0] = real_of(t->vr + 1, root, n);
            t->child_mask[0] = 1;
            t->nchildren = 1;
        }
        return;
    }
    int mask = 1;
    while (mask < n) {
        if (t->vr & mask) {
            t->parent = real_of(t->vr - mask, root, n);
            break;
        }
        mask <<= 1;
    }
    for (int m = mask >> 1; m >= 1; m >>= 1) {
        if (t->vr + m < n) {
            t->children[t->nchildren] = real_of(t->vr + m, root, n);
            t->child_mask[t->nchildren] = m;
            t->nchildren++;
        }
    }
}

/* Blocks in the binomial subtree of vr. */
static int subtree_size(int vr, int n)
{
    if (vr == 0)
        return n;
    int low = vr & -vr;
    return low < n - vr ? low : n - vr;
}

td_status coll_broadcast(coll_run *run, void *vbuf, size_t count, int root, bool chain, uint32_t phase)
{
    int n = run->size;
    if (n == 1)
        return TD_OK;
    char *buf = vbuf;
    tree t;
    tree_plan(&t, run->rank, root, n, chain);
    size_t K = coll_nchunks(run, count), es = run->esize;
    int nc = t.nchildren;
    td_xfer *xf;
    TD_TRY(coll_xfers(run, WINDOW * (size_t)(1 + nc), &xf));
    td_xfer *rx = xf, *sx = xf + WINDOW;
    size_t posted = 0;
    if (t.parent >= 0) {
        for (; posted < K && posted < WINDOW; posted++) {
            size_t lo, hi;
            coll_chunk(count, posted, K, &lo, &hi);
            TD_TRY(coll_irecv(run, t.parent, phase + (uint32_t)posted, COLL_AT(buf, lo * es), (hi - lo) * es, &rx[posted % WINDOW]));
        }
    }
    for (size_t j = 0; j < K; j++) {
        size_t lo, hi;
        coll_chunk(count, j, K, &lo, &hi);
        if (t.parent >= 0) {
            TD_TRY(coll_wait(run, &rx[j % WINDOW]));
            if (posted < K) {
                size_t plo, phi;
                coll_chunk(count, posted, K, &plo, &phi);
                TD_TRY(coll_irecv(run, t.parent, phase + (uint32_t)posted, COLL_AT(buf, plo * es), (phi - plo) * es,
                                  &rx[posted % WINDOW]));
                posted++;
            }
        }
        for (int c = 0; c < nc; c++) {
            td_xfer *x = &sx[(j % WINDOW) * (size_t)nc + (size_t)c];
            if (j >= WINDOW)
                TD_TRY(coll_wait(run, x));
            TD_TRY(coll_isend(run, t.children[c], phase + (uint32_t)j, COLL_AT(buf, lo * es), (hi - lo) * es, x));
        }
    }
    for (size_t j = K > WINDOW ? K - WINDOW : 0; j < K; j++)
        for (int c = 0; c < nc; c++)
            TD_TRY(coll_wait(run, &sx[(j % WINDOW) * (size_t)nc + (size_t)c]));
    return TD_OK;
}

td_status coll_reduce(coll_run *run, void *vbuf, size_t count, int root, bool chain, uint32_t phase)
{
    int n = run->size;
    if (n == 1)
        return TD_OK;
    char *buf = vbuf;
    tree t;
    tree_plan(&t, run->rank, root, n, chain);
    size_t K = coll_nchunks(run, count), es = run->esize;
    size_t slot = ((count + K - 1) / K * es + 63) & ~(size_t)63;
    int nc = t.nchildren;
    char *slots = NULL;
    TD_TRY(coll_scratch(run, slot * WINDOW * (size_t)(nc ? nc : 1), &slots));
    td_xfer *xf;
    TD_TRY(coll_xfers(run, WINDOW * (size_t)(1 + nc), &xf));
    td_xfer *sx = xf, *rx = xf + WINDOW;
#define RSLOT(j, c) ((((j) % WINDOW) * (size_t)nc + (size_t)(c)))
    size_t posted = 0;
    for (; posted < K && posted < WINDOW && nc; posted++) {
        size_t lo, hi;
        coll_chunk(count, posted, K, &lo, &hi);
        for (int c = 0; c < nc; c++)
            TD_TRY(coll_irecv(run, t.children[c], phase + (uint32_t)posted, slots + RSLOT(posted, c) * slot, (hi - lo) * es,
                              &rx[RSLOT(posted, c)]));
    }
    for (size_t j = 0; j < K; j++) {
        size_t lo, hi;
        coll_chunk(count, j, K, &lo, &hi);
        for (int c = 0; c < nc; c++) {
            TD_TRY(coll_wait(run, &rx[RSLOT(j, c)]));
            run->fn(COLL_AT(buf, lo * es), COLL_AT(buf, lo * es), slots + RSLOT(j, c) * slot, hi - lo);
        }
        if (nc && posted < K) {
            size_t plo, phi;
            coll_chunk(count, posted, K, &plo, &phi);
            for (int c = 0; c < nc; c++)
                TD_TRY(coll_irecv(run, t.children[c], phase + (uint32_t)posted, slots + RSLOT(posted, c) * slot,
                                  (phi - plo) * es, &rx[RSLOT(posted, c)]));
            posted++;
        }
        if (t.parent >= 0) {
            if (j >= WINDOW)
                TD_TRY(coll_wait(run, &sx[j % WINDOW]));
            TD_TRY(coll_isend(run, t.parent, phase + (uint32_t)j, COLL_AT(buf, lo * es), (hi - lo) * es, &sx[j % WINDOW]));
        }
    }
#undef RSLOT
    if (t.parent >= 0)
        for (size_t j = K > WINDOW ? K - WINDOW : 0; j < K; j++)
            TD_TRY(coll_wait(run, &sx[j % WINDOW]));
    return TD_OK;
}

/* ---- gather and scatter ----------------------------------------------------------------------- */

td_status coll_gather_direct(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    size_t bytes = op->count * run->esize;
    if (r != op->root)
        return coll_send(run, op->root, 0, op->in, bytes);
    coll_copy(op->out_blocks[r], op->in, bytes);
    td_xfer *xf;
    TD_TRY(coll_xfers(run, (size_t)n, &xf));
    int k = 0;
    for (int p = 0; p < n; p++)
        if (p != r)
            TD_TRY(coll_irecv(run, p, 0, op->out_blocks[p], bytes, &xf[k++]));
    return transport_wait_all(run->t, xf, k, run->dl);
}

td_status coll_gather_tree(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size;
    size_t bytes = op->count * run->esize;
    tree t;
    tree_plan(&t, run->rank, op->root, n, false);
    int sz = subtree_size(t.vr, n);
    char *tmp;
    TD_TRY(coll_scratch(run, (size_t)sz * bytes, &tmp));
    coll_copy(tmp, op->in, bytes);
    td_xfer *xf;
    TD_TRY(coll_xfers(run, (size_t)t.nchildren + 1, &xf));
    for (int c = 0; c < t.nchildren; c++) {
        int m = t.child_mask[c];
        size_t blocks = (size_t)subtree_size(t.vr + m, n);
        TD_TRY(coll_irecv(run, t.children[c], 0, tmp + (size_t)m * bytes, blocks * bytes, &xf[c]));
    }
    TD_TRY(transport_wait_all(run->t, xf, t.nchildren, run->dl));
    if (t.parent >= 0)
        return coll_send(run, t.parent, 0, tmp, (size_t)sz * bytes);
    for (int i = 0; i < n; i++)
        coll_copy(op->out_blocks[real_of(i, op->root, n)], tmp + (size_t)i * bytes, bytes);
    return TD_OK;
}

td_status coll_scatter_direct(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size, r = run->rank;
    size_t bytes = op->count * run->esize;
    if (r != op->root)
        return transport_recv(run->t, op->root, coll_tag(run, 0), op->out, bytes, run->dl);
    td_xfer *xf;
    TD_TRY(coll_xfers(run, (size_t)n, &xf));
    int k = 0;
    for (int p = 0; p < n; p++)
        if (p != r)
            TD_TRY(coll_isend(run, p, 0, op->in_blocks[p], bytes, &xf[k++]));
    /* out may overlap another rank's block: copy only once everything has left. */
    TD_TRY(transport_wait_all(run->t, xf, k, run->dl));
    coll_copy(op->out, op->in_blocks[r], bytes);
    return TD_OK;
}

td_status coll_scatter_tree(coll_run *run)
{
    const td_coll *op = run->op;
    int n = run->size;
    size_t bytes = op->count * run->esize;
    tree t;
    tree_plan(&t, run->rank, op->root, n, false);
    int sz = subtree_size(t.vr, n);
    char *tmp;
    TD_TRY(coll_scratch(run, (size_t)sz * bytes, &tmp));
    if (t.parent < 0) {
        for (int i = 0; i < n; i++)
            coll_copy(tmp + (size_t)i * bytes, op->in_blocks[real_of(i, op->root, n)], bytes);
    } else {
        TD_TRY(transport_recv(run->t, t.parent, coll_tag(run, 0), tmp, (size_t)sz * bytes, run->dl));
    }
    td_xfer *xf;
    TD_TRY(coll_xfers(run, (size_t)t.nchildren + 1, &xf));
    for (int c = 0; c < t.nchildren; c++) {
        int m = t.child_mask[c];
        size_t blocks = (size_t)subtree_size(t.vr + m, n);
        TD_TRY(coll_isend(run, t.children[c], 0, tmp + (size_t)m * bytes, blocks * bytes, &xf[c]));
    }
    coll_copy(op->out, tmp, bytes);
    return transport_wait_all(run->t, xf, t.nchildren, run->dl);
}
