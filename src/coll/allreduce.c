/* all_reduce algorithms (coll.h): recursive doubling for small messages, ring and recursive
 * halving-doubling (Rabenseifner) for large ones, and reduce + broadcast over a binomial tree.
 *
 * Non-power-of-two worlds (rd, rhd) fold first: of the first 2*rem ranks (rem = size - largest
 * power of two), each even rank hands its data to the odd rank above it and sits out; the others
 * run the power-of-two algorithm; the odd ranks hand the result back at the end.
 *
 * Determinism: floating-point results must be bit-identical on every rank. rd has both partners of
 * each exchange compute (lower rank's data) op (higher rank's data), so both hold the same bits;
 * ring and rhd reduce each element on exactly one rank and distribute that rank's result; tree
 * broadcasts the root's. All run on the pipelined engine (engine.c), so large exchanges overlap
 * reduction with transfer. */
#include "coll/coll_impl.h"

typedef struct fold {
    int p2, rem;
    int newrank; /* -1: sits out */
} fold;

static fold fold_plan(int rank, int size)
{
    fold f;
    f.p2 = 1;
    while (f.p2 * 2 <= size)
        f.p2 *= 2;
    f.rem = size - f.p2;
    if (rank < 2 * f.rem)
        f.newrank = rank % 2 ? rank / 2 : -1;
    else
        f.newrank = rank - f.rem;
    return f;
}

static int real_rank(const fold *f, int newrank) { return newrank < f->rem ? newrank * 2 + 1 : newrank + f->rem; }

/* Fold in: even ranks below 2*rem send everything to rank+1, which reduces it in. */
static td_status fold_in(coll_run *run, const fold *f, char *buf, size_t count, char *slots)
{
    if (run->rank >= 2 * f->rem)
        return TD_OK;
    ring_step *st = coll_steps(run, 1);
    if (run->rank % 2 == 0) {
        st->send = buf;
        st->send_count = count;
        st->no_recv = true;
        return coll_ring_run(run, st, 1, run->rank + 1, run->rank + 1, slots, COLL_PHASE(0));
    }
    st->no_send = true;
    st->recv_count = count;
    st->red_in = buf;
    st->red_dst = buf;
    st->own_first = false; /* the lower rank's data first */
    return coll_ring_run(run, st, 1, run->rank - 1, run->rank - 1, slots, COLL_PHASE(0));
}

/* Fold out: the odd ranks send the result back. */
static td_status fold_out(coll_run *run, const fold *f, char *buf, size_t count, char *slots)
{
    if (run->rank >= 2 * f->rem)
        return TD_OK;
    ring_step *st = coll_steps(run, 1);
    if (run->rank % 2) {
        st->send = buf;
        st->send_count = count;
        st->no_recv = true;
        return coll_ring_run(run, st, 1, run->rank - 1, run->rank - 1, slots, COLL_PHASE(1));
    }
    st->no_send = true;
    st->recv_direct = true;
    st->recv = buf;
    st->recv_count = count;
    return coll_ring_run(run, st, 1, run->rank + 1, run->rank + 1, slots, COLL_PHASE(1));
}

td_status coll_all_reduce_rd(coll_run *run)
{
    if (run->size == 1)
        return TD_OK;
    char *buf = run->op->out;
    size_t count = run->op->count;
    fold f = fold_plan(run->rank, run->size);
    char *slots;
    TD_TRY(coll_scratch(run, coll_ring_scratch(run, count), &slots));
    TD_TRY(fold_in(run, &f, buf, count, slots));
    if (f.newrank >= 0) {
        uint32_t phase = 2;
        for (int mask = 1; mask < f.p2; mask <<= 1) {
            int peer = real_rank(&f, f.newrank ^ mask);
            ring_step *st = coll_steps(run, 1);
            st->send = buf;
            st->send_count = count;
            st->recv_count = count;
            st->red_in = buf;
            st->red_dst = buf;
            st->own_first = run->rank < peer;
            st->send_is_dst = true;
            TD_TRY(coll_ring_run(run, st, 1, peer, peer, slots, COLL_PHASE(phase++)));
        }
    }
    return fold_out(run, &f, buf, count, slots);
}

td_status coll_all_reduce_ring(coll_run *run)
{
    int n = run->size, r = run->rank;
    if (n == 1)
        return TD_OK;
    char *buf = run->op->out;
    size_t count = run->op->count, es = run->esize;
    size_t base = count / (size_t)n, extra = count % (size_t)n;
#define BCOUNT(b) (base + ((size_t)(b) < extra))
#define BOFF(b) ((size_t)(b) * base + ((size_t)(b) < extra ? (size_t)(b) : extra))
    char *slots;
    TD_TRY(coll_scratch(run, coll_ring_scratch(run, BCOUNT(0)), &slots));
    ring_step *st = coll_steps(run, 2 * (size_t)(n - 1));
    for (int s = 0; s < n - 1; s++) {
        int sb = ((r - s) % n + n) % n, rb = ((r - s - 1) % n + n) % n;
        ring_step *x = &st[s];
        x->send = COLL_AT(buf, BOFF(sb) * es);
        x->send_count = BCOUNT(sb);
        x->recv_count = BCOUNT(rb);
        x->red_in = COLL_AT(buf, BOFF(rb) * es);
        x->red_dst = COLL_AT(buf, BOFF(rb) * es);
    }
    for (int s = 0; s < n - 1; s++) {
        int sb = ((r + 1 - s) % n + n) % n, rb = ((r - s) % n + n) % n;
        ring_step *x = &st[n - 1 + s];
        x->send = COLL_AT(buf, BOFF(sb) * es);
        x->send_count = BCOUNT(sb);
        x->recv_direct = true;
        x->recv = COLL_AT(buf, BOFF(rb) * es);
        x->recv_count = BCOUNT(rb);
    }
#undef BCOUNT
#undef BOFF
    return coll_ring_run(run, st, 2 * (n - 1), (r + 1) % n, (r - 1 + n) % n, slots, COLL_PHASE(0));
}

td_status coll_all_reduce_rhd(coll_run *run)
{
    if (run->size == 1)
        return TD_OK;
    char *buf = run->op->out;
    size_t count = run->op->count, es = run->esize;
    fold f = fold_plan(run->rank, run->size);
    char *slots;
    TD_TRY(coll_scratch(run, coll_ring_scratch(run, count), &slots));
    TD_TRY(fold_in(run, &f, buf, count, slots));
    if (f.newrank >= 0) {
        size_t klo[32], khi[32], slo[32], shi[32];
        int peers[32];
        int levels = 0;
        size_t lo = 0, hi = count;
        uint32_t phase = 2;
        /* Reduce-scatter by recursive halving: keep one half, send the other, reduce the kept one. */
        for (int mask = f.p2 / 2; mask >= 1; mask >>= 1) {
            int np = f.newrank ^ mask;
            int peer = real_rank(&f, np);
            size_t mid = lo + (hi - lo) / 2;
            bool low = f.newrank < np;
            klo[levels] = low ? lo : mid;
            khi[levels] = low ? mid : hi;
            slo[levels] = low ? mid : lo;
            shi[levels] = low ? hi : mid;
            peers[levels] = peer;
            ring_step *st = coll_steps(run, 1);
            st->send = COLL_AT(buf, slo[levels] * es);
            st->send_count = shi[levels] - slo[levels];
            st->recv_count = khi[levels] - klo[levels];
            st->red_in = COLL_AT(buf, klo[levels] * es);
            st->red_dst = COLL_AT(buf, klo[levels] * es);
            st->own_first = run->rank < peer;
            TD_TRY(coll_ring_run(run, st, 1, peer, peer, slots, COLL_PHASE(phase++)));
            lo = klo[levels];
            hi = khi[levels];
            levels++;
        }
        /* All-gather by recursive doubling, retracing the levels: send what is ours, receive the
         * half the partner kept. */
        for (int l = levels - 1; l >= 0; l--) {
            ring_step *st = coll_steps(run, 1);
            st->send = COLL_AT(buf, klo[l] * es);
            st->send_count = khi[l] - klo[l];
            st->recv_direct = true;
            st->recv = COLL_AT(buf, slo[l] * es);
            st->recv_count = shi[l] - slo[l];
            TD_TRY(coll_ring_run(run, st, 1, peers[l], peers[l], slots, COLL_PHASE(phase++)));
        }
    }
    return fold_out(run, &f, buf, count, slots);
}

td_status coll_all_reduce_tree(coll_run *run)
{
    TD_TRY(coll_reduce(run, run->op->out, run->op->count, 0, false, COLL_PHASE(0)));
    return coll_broadcast(run, run->op->out, run->op->count, 0, false, COLL_PHASE(1));
}
