/* The shared-memory collectives (backends/shm/direct.h) over the same-host segment set of the
 * group's transport (transport/samehost.h): each is a sequence of epochs in which ranks write their
 * slots, raise their arrival, and read the slots of the peers that arrived. Choice by size and world size here;
 * everything that has no direct algorithm goes to coll_execute. */
#include "backends/shm/direct.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/clock.h"
#include "base/error.h"
#include "coll/coll_impl.h"
#include "transport/samehost.h"

/* all_reduce and reduce up to this many bytes reduce every input on every rank (one step); above,
 * the slices (two steps per chunk) move and reduce less. The crossover falls with the world size
 * because every rank reads all n inputs in the one step (bench/shm measures it). */
static size_t flat_max(int n) { return n <= 2 ? (size_t)8 << 10 : n == 3 ? (size_t)2 << 10 : (size_t)1 << 10; }

/* One direct collective as it runs. */
typedef struct shm_run {
    samehost_set *set;
    const td_coll *op;
    int rank, size;
    size_t elem_size;
    td_reduce_fn reduce;
    int64_t deadline_ns;
    samehost_desc desc;
} shm_run;

/* An arrival's description of a collective is the front end's descriptor (tdist/backend.h). */
static void desc_describe(uint64_t what, uint64_t count, char *out, size_t size)
{
    td_coll_desc d = {what, count, 0};
    td_coll_desc_format(&d, out, size);
}

td_algo shm_coll_choose(const td_coll_ctx *c, const td_coll *op)
{
    td_algo forced = c->cfg.forced[op->kind];
    size_t bytes = op->count * td_dtype_size(op->dtype);
    bool flat_ok = bytes <= c->t->samehost->small_bytes;
    if (forced != TD_ALGO_AUTO) {
        if (forced == TD_ALGO_SHM_FLAT && !flat_ok)
            return TD_ALGO_SHM; /* does not fit in the small slots */
        return forced;
    }
    switch (op->kind) {
    case TD_COLL_ALL_REDUCE:
    case TD_COLL_REDUCE:
        return flat_ok && bytes <= flat_max(c->size) ? TD_ALGO_SHM_FLAT : TD_ALGO_SHM;
    case TD_COLL_BROADCAST:
    case TD_COLL_ALL_GATHER:
    case TD_COLL_GATHER:
    case TD_COLL_SCATTER:
    case TD_COLL_REDUCE_SCATTER:
    case TD_COLL_BARRIER:
        return TD_ALGO_SHM;
    default:
        return coll_choose(c, op);
    }
}

/* ---- steps ------------------------------------------------------------------------------------- */

/* Starts epoch *e: when this rank writes slots, waits until everyone is done with what was
 * written two epochs ago (they arrived at the last one). */
static td_status begin(shm_run *run, uint64_t *e, bool writes)
{
    *e = samehost_next_epoch(run->set);
    if (!writes)
        return TD_OK;
    return samehost_wait_arrival(run->set, -1, *e - 1, NULL, run->deadline_ns);
}

static td_status wait_peer(shm_run *run, int r, uint64_t e)
{
    return samehost_wait_arrival(run->set, r, e, &run->desc, run->deadline_ns);
}
static td_status wait_all(shm_run *run, uint64_t e)
{
    return samehost_wait_arrival(run->set, -1, e, &run->desc, run->deadline_ns);
}
static void arrive(shm_run *run, uint64_t e) { samehost_arrive(run->set, e, &run->desc); }

/* This rank's contribution into a slot. */
static td_status put_input(shm_run *run, char *dst, const void *src, size_t count)
{
    if (count)
        memcpy(dst, src, count * run->elem_size);
    return TD_OK;
}

/* dst = slot_0 op slot_1 op ... op slot_{n-1}, each at byte offset off, in rank order. */
static void reduce_all(shm_run *run, char *dst, uint64_t e, bool small, size_t off, size_t count)
{
    if (!count)
        return;
    char *(*slot)(const samehost_set *, int, uint64_t) = small ? samehost_small : samehost_slot;
    run->reduce(dst, slot(run->set, 0, e) + off, slot(run->set, 1, e) + off, count);
    for (int q = 2; q < run->size; q++)
        run->reduce(dst, dst, slot(run->set, q, e) + off, count);
}


/* Slice q of a chunk of cn elements: [lo, hi), on cache-line boundaries where elements allow. */
static void slice_of(const shm_run *run, size_t cn, int q, size_t *lo, size_t *hi)
{
    size_t unit = run->elem_size < 64 ? 64 / run->elem_size : 1;
    size_t units = (cn + unit - 1) / unit;
    *lo = (size_t)((unsigned __int128)units * (size_t)q / (size_t)run->size) * unit;
    *hi = (size_t)((unsigned __int128)units * (size_t)(q + 1) / (size_t)run->size) * unit;
    if (*lo > cn)
        *lo = cn;
    if (*hi > cn)
        *hi = cn;
}

/* The chunk in which large messages move: 1 MiB, at most the slot. The slices of a reduction take
 * 2 MiB chunks while the ranks' buffers together fit in 24 MiB, three quarters of the shared cache
 * of the machine this was measured on: larger chunks are faster while the data stays in that cache
 * and slower beyond it (docs/performance.md, "Chunks of the reductions"). */
#define CHUNK_BYTES ((size_t)1 << 20)
#define CHUNK_BYTES_FITTING ((size_t)2 << 20)
#define FITS_TOTAL ((size_t)24 << 20)

static size_t chunk_elems(const shm_run *run, size_t per, size_t bytes)
{
    size_t c = bytes < run->set->slot_bytes ? bytes : run->set->slot_bytes;
    c /= run->elem_size * per;
    return c ? c : 1;
}

/* ---- all_reduce and reduce --------------------------------------------------------------------- */

/* root < 0: all_reduce (everyone ends with the result); else reduce to root. */
static td_status reduce_flat(shm_run *run, int root)
{
    char *buf = run->op->out;
    size_t count = run->op->count;
    uint64_t e;
    TD_TRY(begin(run, &e, true));
    TD_TRY(put_input(run, samehost_small(run->set, run->rank, e), buf, count));
    arrive(run, e);
    if (root >= 0 && run->rank != root)
        return TD_OK;
    TD_TRY(wait_all(run, e));
    reduce_all(run, buf, e, true, 0, count);
    return TD_OK;
}

/* Rank 0's stopwatch over a tuned chunk's work, its waits left out: what it writes and what it
 * reads of the others' writes, all of them the way samehost_writes_begin chose for the chunk. */
typedef struct work_clock {
    bool on;
    int64_t start, total;
} work_clock;
static void work_start(work_clock *w)
{
    if (w->on)
        w->start = clock_now_ns();
}
static void work_stop(work_clock *w)
{
    if (w->on)
        w->total += clock_now_ns() - w->start;
}

/* Rank q's input of the slice at byte offset off of epoch e's chunk: the own one from the buffer. */
static const char *slice_src(shm_run *run, int q, uint64_t e, const char *own, size_t off)
{
    return q == run->rank ? own : samehost_slot(run->set, q, e) + off;
}

/* dst = slice of rank 0 op slice of rank 1 op ... (count elements at byte offset off of epoch e's
 * chunk, own: this rank's from its buffer), written into a slot through the caches or around them
 * (then in blocks reduced on the stack and streamed out). keep: the result also replaces own, block
 * by block while the block is in the first-level cache (each block's input is read before it is
 * overwritten), which spares reading the slice back from the slot later. */
static void reduce_into_slot(shm_run *run, char *dst, uint64_t e, char *own, size_t off, size_t count, bool stream,
                             bool keep)
{
    size_t es = run->elem_size;
    _Alignas(64) char block[8192];
    size_t per = stream || keep ? sizeof block / es : count;
    for (size_t i = 0; i < count; i += per) {
        size_t n = count - i < per ? count - i : per, at = i * es;
        char *out = stream ? block : dst + at;
        run->reduce(out, slice_src(run, 0, e, own, off) + at, slice_src(run, 1, e, own, off) + at, n);
        for (int q = 2; q < run->size; q++)
            run->reduce(out, out, slice_src(run, q, e, own, off) + at, n);
        if (stream)
            samehost_copy(dst + at, block, n * es, true);
        if (keep)
            memcpy(own + at, out, n * es);
    }
}

/* The slices of an all_reduce (root < 0) or reduce. Each rank puts in its slot the parts of its
 * input that the others reduce (its own slice it reads from its buffer), reduces its slice of
 * everyone's input in rank order into its other slot (and over its own slice of the buffer, when it
 * gathers), and copies the others' reduced slices out. Its slot writes go through the caches or
 * around them as the set's measurements say (samehost_writes). The copies out go through the
 * caches: the buffer they write is the input this rank read moments before in the same chunk, so
 * its lines are in this CPU's cache (writing around the caches would send them to memory and save
 * no read; docs/performance.md, "The copy out"). */
static td_status reduce_slices(shm_run *run, int root)
{
    char *buf = run->op->out;
    size_t count = run->op->count, es = run->elem_size;
    bool fits = count * es <= FITS_TOTAL / (size_t)run->size;
    size_t chunk = chunk_elems(run, 1, fits ? CHUNK_BYTES_FITTING : CHUNK_BYTES);
    bool gathers = root < 0 || run->rank == root;
    size_t off = 0;
    do {
        size_t cn = count - off < chunk ? count - off : chunk;
        char *in = COLL_AT(buf, off * es);
        uint64_t e;
        TD_TRY(begin(run, &e, true));
        size_t lo, hi;
        slice_of(run, cn, run->rank, &lo, &hi);
        char *slot = samehost_slot(run->set, run->rank, e);
        bool around = samehost_writes_begin(run->set, cn * es);
        work_clock work = {.on = run->set->writes.timed};
        work_start(&work);
        samehost_copy(slot, in, lo * es, around);
        samehost_copy(slot + hi * es, in + hi * es, (cn - hi) * es, around);
        samehost_copy_done(around);
        work_stop(&work);
        arrive(run, e);
        TD_TRY(wait_all(run, e));
        /* The reduced slice goes into the other slot (everyone is past the epoch that used it). */
        char *dst = samehost_slot(run->set, run->rank, e + 1) + lo * es;
        work_start(&work);
        if (hi > lo)
            reduce_into_slot(run, dst, e, in + lo * es, lo * es, hi - lo, around, gathers);
        samehost_copy_done(around);
        work_stop(&work);
        uint64_t e2;
        TD_TRY(begin(run, &e2, false));
        arrive(run, e2);
        if (gathers) {
            for (int k = 1; k < run->size; k++) { /* its own slice it kept while reducing */
                int q = (run->rank + k) % run->size;
                slice_of(run, cn, q, &lo, &hi);
                TD_TRY(wait_peer(run, q, e2));
                work_start(&work);
                if (hi > lo)
                    memcpy(in + lo * es, samehost_slot(run->set, q, e2) + lo * es, (hi - lo) * es);
                work_stop(&work);
            }
        }
        if (work.on)
            samehost_writes_end(run->set, cn * es, work.total);
        off += cn;
    } while (off < count);
    return TD_OK;
}

/* ---- copies ------------------------------------------------------------------------------------ */

static td_status broadcast(shm_run *run)
{
    char *buf = run->op->out;
    int root = run->op->root;
    size_t count = run->op->count, es = run->elem_size, chunk = chunk_elems(run, 1, CHUNK_BYTES), off = 0;
    do {
        size_t cn = count - off < chunk ? count - off : chunk;
        uint64_t e;
        TD_TRY(begin(run, &e, run->rank == root));
        if (run->rank == root) {
            if (cn)
                memcpy(samehost_slot(run->set, root, e), buf + off * es, cn * es);
            arrive(run, e);
        } else {
            arrive(run, e); /* done with the last chunk */
            TD_TRY(wait_peer(run, root, e));
            if (cn)
                memcpy(buf + off * es, samehost_slot(run->set, root, e), cn * es);
        }
        off += cn;
    } while (off < count);
    return TD_OK;
}

/* all_gather (root < 0) and gather (to root). */
static td_status gather(shm_run *run, int root)
{
    const char *in = run->op->in;
    void *const *out = run->op->out_blocks;
    size_t count = run->op->count, es = run->elem_size, chunk = chunk_elems(run, 1, CHUNK_BYTES), off = 0;
    bool reader = root < 0 || run->rank == root;
    if (reader)
        coll_copy(COLL_AT(out[run->rank], 0), in, count * es);
    do {
        size_t cn = count - off < chunk ? count - off : chunk;
        uint64_t e;
        TD_TRY(begin(run, &e, true));
        if (cn)
            memcpy(samehost_slot(run->set, run->rank, e), in + off * es, cn * es);
        arrive(run, e);
        if (reader) {
            for (int k = 1; k < run->size; k++) {
                int q = (run->rank + k) % run->size;
                TD_TRY(wait_peer(run, q, e));
                if (cn)
                    memcpy((char *)out[q] + off * es, samehost_slot(run->set, q, e), cn * es);
            }
        }
        off += cn;
    } while (off < count);
    return TD_OK;
}

static td_status scatter(shm_run *run)
{
    int root = run->op->root, n = run->size;
    const void *const *in = run->op->in_blocks;
    char *out = run->op->out;
    size_t count = run->op->count, es = run->elem_size, chunk = chunk_elems(run, (size_t)n, CHUNK_BYTES), off = 0;
    if (run->rank == root)
        coll_copy(out, in[root], count * es);
    do {
        size_t cn = count - off < chunk ? count - off : chunk;
        uint64_t e;
        TD_TRY(begin(run, &e, run->rank == root));
        if (run->rank == root) {
            char *slot = samehost_slot(run->set, root, e);
            for (int q = 0; q < n && cn; q++)
                if (q != root)
                    memcpy(slot + (size_t)q * cn * es, (const char *)in[q] + off * es, cn * es);
            arrive(run, e);
        } else {
            arrive(run, e);
            TD_TRY(wait_peer(run, root, e));
            if (cn)
                memcpy(out + off * es, samehost_slot(run->set, root, e) + (size_t)run->rank * cn * es, cn * es);
        }
        off += cn;
    } while (off < count);
    return TD_OK;
}

static td_status reduce_scatter(shm_run *run)
{
    int n = run->size;
    const void *const *in = run->op->in_blocks;
    char *out = run->op->out;
    size_t count = run->op->count, es = run->elem_size, chunk = chunk_elems(run, (size_t)n, CHUNK_BYTES), off = 0;
    do {
        size_t cn = count - off < chunk ? count - off : chunk;
        uint64_t e;
        TD_TRY(begin(run, &e, true));
        char *slot = samehost_slot(run->set, run->rank, e);
        for (int q = 0; q < n; q++)
            TD_TRY(put_input(run, slot + (size_t)q * cn * es, COLL_AT(in[q], off * es), cn));
        arrive(run, e);
        TD_TRY(wait_all(run, e));
        char *dst = COLL_AT(out, off * es);
        reduce_all(run, dst, e, false, (size_t)run->rank * cn * es, cn);
        off += cn;
    } while (off < count);
    return TD_OK;
}

static td_status barrier(shm_run *run)
{
    uint64_t e;
    TD_TRY(begin(run, &e, false));
    arrive(run, e);
    return wait_all(run, e);
}

/* ---- dispatch ---------------------------------------------------------------------------------- */

td_status shm_coll_run(td_coll_ctx *c, const td_coll *op)
{
    td_algo a = c->size > 1 && c->t->samehost ? shm_coll_choose(c, op) : TD_ALGO_AUTO;
    if (a != TD_ALGO_SHM && a != TD_ALGO_SHM_FLAT)
        return coll_execute(c, op, a);
    if (!coll_algo_supports(a, op->kind))
        return coll_execute(c, op, TD_ALGO_AUTO);
    shm_run run = {
        .set = c->t->samehost,
        .op = op,
        .rank = c->rank,
        .size = c->size,
        .elem_size = td_dtype_size(op->dtype),
        .deadline_ns = op->deadline_ns,
    };
    TD_TRY(coll_reduce_fn(op, &run.reduce));
    run.desc = (samehost_desc){
        .what = op->desc.what,
        .count = op->desc.count,
        .seq = op->desc.seq,
        .describe = desc_describe,
    };
    td_status s;
    switch (op->kind) {
    case TD_COLL_ALL_REDUCE:
        s = a == TD_ALGO_SHM_FLAT ? reduce_flat(&run, -1) : reduce_slices(&run, -1);
        break;
    case TD_COLL_REDUCE:
        s = a == TD_ALGO_SHM_FLAT ? reduce_flat(&run, op->root) : reduce_slices(&run, op->root);
        break;
    case TD_COLL_BROADCAST:
        s = broadcast(&run);
        break;
    case TD_COLL_ALL_GATHER:
        s = gather(&run, -1);
        break;
    case TD_COLL_GATHER:
        s = gather(&run, op->root);
        break;
    case TD_COLL_SCATTER:
        s = scatter(&run);
        break;
    case TD_COLL_REDUCE_SCATTER:
        s = reduce_scatter(&run);
        break;
    case TD_COLL_BARRIER:
        s = barrier(&run);
        break;
    default:
        return coll_execute(c, op, TD_ALGO_AUTO);
    }
    if (s != TD_OK) {
        /* Waits that fail have aborted the transport already; a failing kernel has not. */
        char msg[TD_XFER_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        transport_abort(c->t, s, msg);
        error_set(s, msg);
    }
    return s;
}
