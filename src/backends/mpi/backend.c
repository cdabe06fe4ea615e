/* The "mpi" backend (tdist/backend.h): every collective and point-to-point kind of the front end
 * as MPI calls, for jobs started by mpirun / srun that run on the site's MPI and its fabric.
 *
 * Ranks come from MPI, not from a store (TD_BACKEND_CAP_RUNTIME_WORLD): create gives td_pg_create
 * the rank and size in MPI_COMM_WORLD (the front end warns, as PyTorch does, when the options said
 * otherwise) and the group needs no rendezvous. A root group runs on a duplicate of
 * MPI_COMM_WORLD; a subgroup on a communicator made with MPI_Comm_create_group from its parent's
 * (only its members call it, as only members create the backend), so groups never share MPI
 * traffic. Every communicator returns errors (MPI_ERRORS_RETURN) and each becomes the work's
 * td_status with MPI's error string.
 *
 * Data: the front end hands contiguous buffers; list forms whose blocks lie back to back in rank
 * order (all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single, scatter from one
 * tensor) go to MPI directly, other block lists through an op's scratch buffer (packed at submit,
 * unpacked at completion). Aliasing MPI forbids (an input inside the output) uses MPI_IN_PLACE
 * where MPI defines it and a scratch copy elsewhere. Counts above INT_MAX elements per call are
 * TD_ERR_UNSUPPORTED.
 *
 * Threads: submit runs on the group's worker, or on the caller of a blocking operation when the
 * group is idle (TD_BACKEND_CAP_CALLER_THREAD), so that a small blocking collective is one MPI call
 * on the caller's thread, as in a plain MPI program. Below MPI_THREAD_MULTIPLE every operation is
 * handed over on the issuing thread (TD_BACKEND_CAP_ASYNC_ON_CALLER, which create sets). Below
 * MPI_THREAD_SERIALIZED (funneled mode, runtime.c) that thread must be the one that initialized MPI
 * (others get TD_ERR_INVALID), and waiters complete requests by driving mpi_rt_progress
 * (td_work_set_driver) instead of the progress thread.
 *
 * Completion. Sends and receives are always MPI_Isend / MPI_Irecv: submit never blocks on a peer,
 * so isend/irecv pairs posted in any order never deadlock, and the progress thread (runtime.c)
 * completes them; a receive from TD_ANY_SOURCE reports MPI's source. Collectives run in one of two
 * modes (TDIST_MPI_COLLECTIVES):
 *   - "nonblocking": the MPI_I* call is posted from submit, which returns; the worker first
 *     tests it for TDIST_MPI_SPIN_US (completing a short collective without any thread hand-off),
 *     then hands it to the progress thread. Collectives overlap each other and the caller, and an
 *     abort (the group's timeout, destroy) fails them at once.
 *   - "blocking" (the default): the blocking MPI call runs on the group's worker thread, as
 *     PyTorch's ProcessGroupMPI does (below MPI_THREAD_MULTIPLE on the issuing thread, in program
 *     order). The work still completes asynchronously to the caller, but
 *     collectives of one group run one after another, and a collective waiting for a peer cannot be
 *     abandoned: the group's timeout does not fire and destroy waits for it. It is the default
 *     because Open MPI's nonblocking collectives (libnbc) are up to twice as slow as its blocking
 *     ones (docs/performance.md, "mpi backend overhead").
 *
 * Abort fails every operation in flight with the group's error at once and cancels its receives;
 * the requests stay with the progress thread until MPI lets go of them. MPI cannot take back a
 * send or collective already posted, so after a failure the job should end (MPI jobs usually do:
 * mpirun stops all ranks when one fails). */
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/backend.h>

#include "backends/builtin.h"
#include "backends/mpi/mpi_impl.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/log.h"
#include "base/error.h"
#include "base/thread.h"
#include "tensor/dtype.h"

#define DEFAULT_SPIN_US 50
#define DEFAULT_CHECK_EVERY 1024
#define CHECK_FIRST 16 /* collectives of a group that are always checked */
#define DESC_WORDS 3   /* td_coll_desc as MPI_UINT64_T words */

struct mpi_group {
    MPI_Comm comm;
    int rank, size;
    int *global_ranks; /* this group's members, for subgroups made from it */
    bool blocking;     /* collectives run as blocking MPI calls */
    int64_t spin_ns;
    int64_t check_every; /* the agreement check: every collective past the first CHECK_FIRST whose
                            number is a multiple (0: none) */
    uint64_t *descs;     /* DESC_WORDS per rank: the check's all_gather */
    int tag_ub;
    mpi_op *spare;      /* the record of blocking collectives: one at a time, on the submitting thread */
    _Atomic bool abort_seen; /* aborted, for submit's lock-free check */
    pthread_mutex_t mu; /* the fields below */
    mpi_op *inflight;
    bool aborted;
    td_status abort_status;
    char *abort_msg;
};

/* ---- the world and capability queries ------------------------------------------------------- */

/* This process's rank and the world's size, for a root group (TD_BACKEND_CAP_RUNTIME_WORLD). */
static td_status mpi_world(int *rank, int *size)
{
    TD_TRY(mpi_rt_init());
    TD_TRY(mpi_check_thread("td_pg_create"));
    mpi_enter();
    int rc = MPI_Comm_rank(MPI_COMM_WORLD, rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(MPI_COMM_WORLD, size);
    mpi_leave();
    return rc == MPI_SUCCESS ? TD_OK : mpi_error(rc, "mpi backend: MPI_Comm_rank/size(MPI_COMM_WORLD)");
}

static inline td_status check_types(td_coll_kind kind, td_dtype dtype, td_reduce_op op, MPI_Datatype *dt,
                                    MPI_Op *mop)
{
    if ((*dt = mpi_datatype(dtype)) == MPI_DATATYPE_NULL)
        return error_fmt(TD_ERR_UNSUPPORTED, "the mpi backend has no MPI datatype for %s in this MPI",
                        td_dtype_name(dtype));
    if (td_coll_kind_reduces(kind) && (*mop = mpi_reduce_op(op, dtype)) == MPI_OP_NULL)
        return error_fmt(TD_ERR_UNSUPPORTED, "the mpi backend cannot reduce %s with %s", td_dtype_name(dtype),
                        td_reduce_op_name(op));
    return TD_OK;
}

static td_status mpi_supports(void *state, td_coll_kind kind, td_dtype dtype, td_reduce_op op)
{
    (void)state;
    MPI_Datatype dt = MPI_DATATYPE_NULL;
    MPI_Op mop = MPI_OP_NULL;
    return check_types(kind, dtype, op, &dt, &mop);
}

/* ---- create / destroy ---------------------------------------------------------------------- */

/* The same on every member: the tag that keeps MPI_Comm_create_group calls apart. */
static int name_tag(const char *name)
{
    uint32_t h = 2166136261u;
    for (const char *p = name ? name : ""; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return (int)(h % 32767u);
}

/* Makes g->comm: a dup of MPI_COMM_WORLD for a root group, else a communicator of the members made
 * from the parent's (or, when the parent runs another backend, from MPI_COMM_WORLD, whose ranks
 * must then be the global ranks). */
static td_status make_comm(mpi_group *g, const td_backend_args *a)
{
    const mpi_group *parent = a->parent_state;
    int wsize = 0, wrank = -1;
    mpi_enter();
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    mpi_leave();
    MPI_Comm from = parent ? parent->comm : MPI_COMM_WORLD;
    int *ranks = alloc_or_die((size_t)a->size * sizeof(int));
    bool identity = !parent && a->size == wsize;
    for (int i = 0; i < a->size; i++) {
        int r = -1;
        if (parent) {
            for (int j = 0; j < parent->size; j++)
                if (parent->global_ranks[j] == a->global_ranks[i])
                    r = j;
        } else {
            r = a->global_ranks[i] < wsize ? a->global_ranks[i] : -1;
        }
        if (r < 0) {
            free(ranks);
            return error_fmt(TD_ERR_INVALID, "mpi backend: global rank %d of group %s is not a rank of %s",
                            a->global_ranks[i], a->group_name, parent ? "its parent group" : "MPI_COMM_WORLD");
        }
        ranks[i] = r;
        identity = identity && r == i;
    }
    if (!parent && ranks[a->rank] != wrank) {
        int want = ranks[a->rank];
        free(ranks);
        return error_fmt(TD_ERR_INVALID,
                        "mpi backend: group %s puts this process at global rank %d, but it is rank %d of "
                        "MPI_COMM_WORLD; an mpi group made from a group of another backend needs that group's "
                        "ranks to be the MPI ranks",
                        a->group_name, want, wrank);
    }
    int rc;
    const char *what;
    mpi_enter();
    if (identity) {
        what = "MPI_Comm_dup(MPI_COMM_WORLD)";
        rc = MPI_Comm_dup(MPI_COMM_WORLD, &g->comm);
    } else {
        what = "MPI_Comm_create_group";
        MPI_Group all = MPI_GROUP_NULL, mine = MPI_GROUP_NULL;
        rc = MPI_Comm_group(from, &all);
        if (rc == MPI_SUCCESS)
            rc = MPI_Group_incl(all, a->size, ranks, &mine);
        if (rc == MPI_SUCCESS)
            rc = MPI_Comm_create_group(from, mine, name_tag(a->group_name), &g->comm);
        if (mine != MPI_GROUP_NULL)
            MPI_Group_free(&mine);
        if (all != MPI_GROUP_NULL)
            MPI_Group_free(&all);
    }
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_set_errhandler(g->comm, MPI_ERRORS_RETURN);
    int crank = -1, csize = -1;
    if (rc == MPI_SUCCESS) {
        MPI_Comm_rank(g->comm, &crank);
        MPI_Comm_size(g->comm, &csize);
    }
    mpi_leave();
    free(ranks);
    if (rc != MPI_SUCCESS) {
        char *ctx = alloc_printf("mpi backend: making the communicator of group %s: %s", a->group_name, what);
        td_status st = mpi_error(rc, ctx);
        free(ctx);
        return st;
    }
    if (crank != a->rank || csize != a->size)
        return error_fmt(TD_ERR_INTERNAL, "mpi backend: the communicator of group %s has rank %d of %d, expected %d of %d",
                        a->group_name, crank, csize, a->rank, a->size);
    return TD_OK;
}

static td_status read_config(mpi_group *g)
{
    static const char *const modes[] = {"blocking", "nonblocking", NULL};
    int mode = 0;
    TD_TRY(env_get_enum("TDIST_MPI_COLLECTIVES", modes, 0, &mode));
    /* Below MPI_THREAD_MULTIPLE too: a blocking call then holds the serializing lock until the
     * peers arrive (the progress thread waits meanwhile; MPI progresses the posted sends and
     * receives inside the call), and TD_BACKEND_CAP_ASYNC_ON_CALLER keeps the collectives of all
     * groups in program order. Every rank must choose alike: MPI never matches a blocking collective with a
     * nonblocking one. */
    g->blocking = mode == 0;
    int64_t us = DEFAULT_SPIN_US;
    TD_TRY(env_get_int("TDIST_MPI_SPIN_US", DEFAULT_SPIN_US, 0, 1000000, &us));
    g->spin_ns = us * 1000;
    TD_TRY(env_get_int("TDIST_MPI_CHECK_EVERY", DEFAULT_CHECK_EVERY, 0, INT64_MAX, &g->check_every));
    return TD_OK;
}

static void group_free(mpi_group *g)
{
    mpi_op_free(g->spare);
    free(g->descs);
    free(g->global_ranks);
    free(g->abort_msg);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

static td_status create_group(const td_backend_args *a, void **state)
{
    TD_TRY(mpi_rt_acquire());
    td_status ts = mpi_check_thread("creating a group");
    if (ts != TD_OK) {
        mpi_rt_release();
        return ts;
    }
    mpi_group *g = TD_NEW(mpi_group);
    g->comm = MPI_COMM_NULL;
    g->rank = a->rank;
    g->size = a->size;
    g->global_ranks = alloc_or_die((size_t)a->size * sizeof(int));
    g->descs = alloc_or_die((size_t)a->size * DESC_WORDS * sizeof(uint64_t));
    memcpy(g->global_ranks, a->global_ranks, (size_t)a->size * sizeof(int));
    thread_mutex_init(&g->mu);
    g->tag_ub = 32767; /* the least MPI promises */
    td_status st = read_config(g);
    if (st == TD_OK)
        st = make_comm(g, a);
    if (st != TD_OK) {
        group_free(g);
        mpi_rt_release();
        return st;
    }
    int *ub = NULL, flag = 0;
    mpi_enter();
    if (MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && ub)
        g->tag_ub = *ub;
    mpi_leave();
    *state = g;
    return TD_OK;
}

static td_status mpi_create(const td_backend_args *args, void **state)
{
    td_backend_args world_args = *args;
    const td_backend_args *a = args;
    int *identity = NULL;
    if (args->rank < 0) { /* a root group: MPI assigns rank and size */
        TD_TRY(mpi_world(args->world_rank, args->world_size));
        world_args.rank = *args->world_rank;
        world_args.size = *args->world_size;
        identity = alloc_or_die((size_t)world_args.size * sizeof(int));
        for (int i = 0; i < world_args.size; i++)
            identity[i] = i;
        world_args.global_ranks = identity;
        a = &world_args;
    }
    td_status created = create_group(a, state);
    free(identity);
    /* Below MPI_THREAD_MULTIPLE, blocking MPI calls exclude each other: each runs where the
     * program issued it, in program order (a single thread issuing never deadlocks; see
     * read_config). Below MPI_THREAD_SERIALIZED, the issuing thread is the only one that may call
     * MPI. */
    if (created == TD_OK && !mpi_thread_multiple())
        *args->caps |= TD_BACKEND_CAP_ASYNC_ON_CALLER;
    return created;
}

static void mpi_destroy(void *state)
{
    mpi_group *g = state;
    /* Requests still out belong to aborted ops; MPI frees the communicator once they are done. */
    if (mpi_on_mpi_thread()) {
        mpi_enter();
        MPI_Comm_free(&g->comm);
        mpi_leave();
    } else {
        TD_LOG_WARN("mpi backend: group destroyed on a thread that may not call MPI (funneled mode); its "
                    "communicator is left to MPI_Finalize");
    }
    group_free(g);
    mpi_rt_release();
}

/* ---- completion ---------------------------------------------------------------------------- */

static void unlink_locked(mpi_group *g, mpi_op *op)
{
    if (!op->linked)
        return;
    if (op->gprev)
        op->gprev->gnext = op->gnext;
    else
        g->inflight = op->gnext;
    if (op->gnext)
        op->gnext->gprev = op->gprev;
    op->gprev = op->gnext = NULL;
    op->linked = false;
}

/* After c's MPI call ended well: unpacks blocks received into op's scratch, checks a
 * receive's size (and gives its sender in *sender; NULL for a call that is no receive). */
static td_status finish(const td_coll *c, const mpi_op *op, int *sender)
{
    switch (c->kind) {
    case TD_COLL_RECV: {
        int n = 0;
        MPI_Datatype dt = mpi_datatype(c->dtype);
        mpi_enter();
        MPI_Get_count(&op->status, dt, &n);
        mpi_leave();
        if (sender)
            *sender = op->status.MPI_SOURCE;
        if ((size_t)n != c->count)
            return error_fmt(TD_ERR_INVALID,
                            "mpi backend: rank %d sent %d %s elements (tag %d), but the receive expects %zu",
                            op->status.MPI_SOURCE, n, td_dtype_name(c->dtype), c->tag, c->count);
        return TD_OK;
    }
    case TD_COLL_ALL_GATHER:
    case TD_COLL_GATHER: {
        size_t es = td_dtype_size(c->dtype);
        if (op->unpack)
            for (int r = 0; r < op->size; r++)
                memcpy(c->out_blocks[r], (char *)op->unpack + (size_t)r * c->count * es, c->count * es);
        return TD_OK;
    }
    case TD_COLL_ALL_TO_ALL:
        if (op->unpack) {
            size_t es = td_dtype_size(c->dtype), off = 0;
            for (int r = 0; r < op->size; r++) {
                if (c->out_counts[r])
                    memcpy(c->out_blocks[r], (char *)op->unpack + off * es, c->out_counts[r] * es);
                off += c->out_counts[r];
            }
        }
        return TD_OK;
    default: return TD_OK;
    }
}

void mpi_op_complete(mpi_op *op)
{
    int expect = MPI_OP_PENDING;
    if (!atomic_compare_exchange_strong(&op->state, &expect, MPI_OP_COMPLETING)) {
        mpi_op_put(op); /* aborted: its work failed already */
        return;
    }
    mpi_group *g = op->g;
    pthread_mutex_lock(&g->mu);
    unlink_locked(g, op);
    pthread_mutex_unlock(&g->mu);
    int sender = -1;
    td_status st;
    if (op->status.MPI_ERROR != MPI_SUCCESS) {
        const td_coll *c = &op->coll;
        char *ctx = alloc_printf("mpi backend: %s #%llu", td_coll_kind_name(c->kind), (unsigned long long)c->seq);
        st = mpi_error(op->status.MPI_ERROR, ctx);
        free(ctx);
    } else {
        st = finish(&op->coll, op, &sender);
    }
    td_work *w = op->work;
    mpi_op_put(op);
    /* Last: once the work is done the front end may destroy the group. (An error's message is in
     * td_last_error(), set by finish.) */
    td_work_done(w, st, sender, NULL);
}

/* ---- posting ------------------------------------------------------------------------------- */

static bool fits_int(size_t n) { return n <= (size_t)INT_MAX; }

/* The blocks lie back to back from blocks[0], in rank order (empty blocks may point anywhere). */
static bool back_to_back(const void *const *blocks, const size_t *counts, size_t count, int n, size_t es)
{
    const char *base = blocks[0];
    size_t off = 0;
    for (int r = 0; r < n; r++) {
        size_t c = counts ? counts[r] : count;
        if (c && (const char *)blocks[r] != base + off * es)
            return false;
        off += c;
    }
    return base != NULL;
}

static bool overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return alen && blen && x < y + blen && y < x + alen;
}

static td_status too_many(const td_coll *c, size_t n)
{
    return error_fmt(TD_ERR_UNSUPPORTED,
                    "mpi backend: %s of %zu elements: MPI counts are ints, so one call moves at most %d elements",
                    td_coll_kind_name(c->kind), n, INT_MAX);
}

static td_status check_tag(const mpi_group *g, int tag)
{
    if (tag > g->tag_ub)
        return error_fmt(TD_ERR_INVALID, "mpi backend: tag %d is above this MPI's MPI_TAG_UB (%d)", tag, g->tag_ub);
    return TD_OK;
}

#define MPI_CALL(blocking_call, nonblocking_call) (blocking ? (blocking_call) : (nonblocking_call))

/* Starts c's MPI call, with op's request and scratch buffers (or, when blocking, runs it):
 * op->req is MPI_REQUEST_NULL when nothing is left to wait for. On failure the thread's error is
 * set. Inlined into its two callers, each with `blocking` fixed. */
__attribute__((always_inline)) static inline td_status post(mpi_group *g, const td_coll *c, mpi_op *op,
                                                             MPI_Datatype dt, MPI_Op mop, bool blocking)
{
    MPI_Comm comm = g->comm;
    MPI_Request *req = &op->req;
    size_t es = dtype_size_of(c->dtype), bytes = c->count * es;
    int n = g->size, me = g->rank;
    int cnt = (int)c->count;
    if (!fits_int(c->count))
        return too_many(c, c->count);
    int rc = MPI_SUCCESS;
    const char *what = "";
    td_status st = TD_OK;
    switch (c->kind) {
    case TD_COLL_SEND:
        TD_TRY(check_tag(g, c->tag));
        what = "MPI_Isend";
        mpi_enter();
        rc = MPI_Isend(c->in, cnt, dt, c->peer, c->tag, comm, req);
        mpi_leave();
        break;
    case TD_COLL_RECV:
        TD_TRY(check_tag(g, c->tag));
        what = "MPI_Irecv";
        mpi_enter();
        rc = MPI_Irecv(c->out, cnt, dt, c->peer == TD_ANY_SOURCE ? MPI_ANY_SOURCE : c->peer, c->tag, comm, req);
        mpi_leave();
        break;
    case TD_COLL_BARRIER:
        what = blocking ? "MPI_Barrier" : "MPI_Ibarrier";
        mpi_enter();
        rc = MPI_CALL(MPI_Barrier(comm), MPI_Ibarrier(comm, req));
        mpi_leave();
        break;
    case TD_COLL_BROADCAST:
        what = blocking ? "MPI_Bcast" : "MPI_Ibcast";
        mpi_enter();
        rc = MPI_CALL(MPI_Bcast(c->out, cnt, dt, c->root, comm), MPI_Ibcast(c->out, cnt, dt, c->root, comm, req));
        mpi_leave();
        break;
    case TD_COLL_ALL_REDUCE:
        if (c->in != c->out && bytes)
            memcpy(c->out, c->in, bytes);
        what = blocking ? "MPI_Allreduce" : "MPI_Iallreduce";
        mpi_enter();
        rc = MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, c->out, cnt, dt, mop, comm),
                      MPI_Iallreduce(MPI_IN_PLACE, c->out, cnt, dt, mop, comm, req));
        mpi_leave();
        break;
    case TD_COLL_REDUCE: {
        if (c->in != c->out && bytes)
            memcpy(c->out, c->in, bytes);
        const void *sbuf = me == c->root ? MPI_IN_PLACE : c->out;
        void *rbuf = me == c->root ? c->out : NULL;
        what = blocking ? "MPI_Reduce" : "MPI_Ireduce";
        mpi_enter();
        rc = MPI_CALL(MPI_Reduce(sbuf, rbuf, cnt, dt, mop, c->root, comm),
                      MPI_Ireduce(sbuf, rbuf, cnt, dt, mop, c->root, comm, req));
        mpi_leave();
        break;
    }
    case TD_COLL_ALL_GATHER:
    case TD_COLL_GATHER: {
        bool receiving = c->kind == TD_COLL_ALL_GATHER || me == c->root;
        size_t total = bytes * (size_t)n;
        void *rbuf = NULL;
        const void *sbuf = c->in;
        if (receiving) {
            if (back_to_back((const void *const *)c->out_blocks, NULL, c->count, n, es)) {
                rbuf = c->out_blocks[0];
                if (c->in == c->out_blocks[me])
                    sbuf = MPI_IN_PLACE;
            } else {
                rbuf = op->unpack = mpi_op_scratch(op, 0, total);
                if (!rbuf)
                    return TD_ERR_NOMEM;
            }
            if (sbuf != MPI_IN_PLACE && overlaps(sbuf, bytes, rbuf, total)) {
                void *copy = mpi_op_scratch(op, 1, bytes);
                if (!copy)
                    return TD_ERR_NOMEM;
                memcpy(copy, c->in, bytes);
                sbuf = copy;
            }
        }
        mpi_enter();
        if (c->kind == TD_COLL_ALL_GATHER) {
            what = blocking ? "MPI_Allgather" : "MPI_Iallgather";
            rc = MPI_CALL(MPI_Allgather(sbuf, cnt, dt, rbuf, cnt, dt, comm),
                          MPI_Iallgather(sbuf, cnt, dt, rbuf, cnt, dt, comm, req));
        } else {
            what = blocking ? "MPI_Gather" : "MPI_Igather";
            rc = MPI_CALL(MPI_Gather(sbuf, cnt, dt, rbuf, cnt, dt, c->root, comm),
                          MPI_Igather(sbuf, cnt, dt, rbuf, cnt, dt, c->root, comm, req));
        }
        mpi_leave();
        break;
    }
    case TD_COLL_SCATTER: {
        const void *sbuf = NULL;
        void *rbuf = c->out;
        if (me == c->root) {
            size_t total = bytes * (size_t)n;
            bool direct = back_to_back(c->in_blocks, NULL, c->count, n, es);
            if (direct && c->out == c->in_blocks[me])
                rbuf = MPI_IN_PLACE;
            else if (direct && overlaps(c->out, bytes, c->in_blocks[0], total))
                direct = false;
            if (direct) {
                sbuf = c->in_blocks[0];
            } else {
                char *pack = mpi_op_scratch(op, 0, total);
                if (!pack)
                    return TD_ERR_NOMEM;
                for (int r = 0; r < n && bytes; r++)
                    memcpy(pack + (size_t)r * bytes, c->in_blocks[r], bytes);
                sbuf = pack;
            }
        }
        what = blocking ? "MPI_Scatter" : "MPI_Iscatter";
        mpi_enter();
        rc = MPI_CALL(MPI_Scatter(sbuf, cnt, dt, rbuf, cnt, dt, c->root, comm),
                      MPI_Iscatter(sbuf, cnt, dt, rbuf, cnt, dt, c->root, comm, req));
        mpi_leave();
        break;
    }
    case TD_COLL_REDUCE_SCATTER: {
        size_t total = bytes * (size_t)n;
        const void *sbuf = c->in_blocks[0];
        bool pack = !back_to_back(c->in_blocks, NULL, c->count, n, es) || overlaps(c->out, bytes, c->in_blocks[0], total);
        if (pack && bytes) {
            char *p = mpi_op_scratch(op, 0, total);
            if (!p)
                return TD_ERR_NOMEM;
            for (int r = 0; r < n; r++)
                memcpy(p + (size_t)r * bytes, c->in_blocks[r], bytes);
            sbuf = p;
        }
        what = blocking ? "MPI_Reduce_scatter_block" : "MPI_Ireduce_scatter_block";
        mpi_enter();
        rc = MPI_CALL(MPI_Reduce_scatter_block(sbuf, c->out, cnt, dt, mop, comm),
                      MPI_Ireduce_scatter_block(sbuf, c->out, cnt, dt, mop, comm, req));
        mpi_leave();
        break;
    }
    case TD_COLL_ALL_TO_ALL: {
        size_t need = 4 * (size_t)n;
        if (op->ints_cap < need) {
            op->ints = alloc_resize(op->ints, need * sizeof(int));
            op->ints_cap = need;
        }
        int *scounts = op->ints, *sdispls = scounts + n, *rcounts = sdispls + n, *rdispls = rcounts + n;
        size_t sin = 0, sout = 0;
        for (int r = 0; r < n; r++) {
            if (!fits_int(c->in_counts[r]) || !fits_int(c->out_counts[r]) || !fits_int(sin) || !fits_int(sout))
                return too_many(c, sin > sout ? sin : sout);
            scounts[r] = (int)c->in_counts[r];
            sdispls[r] = (int)sin;
            rcounts[r] = (int)c->out_counts[r];
            rdispls[r] = (int)sout;
            sin += c->in_counts[r];
            sout += c->out_counts[r];
        }
        if (!fits_int(sin) || !fits_int(sout))
            return too_many(c, sin > sout ? sin : sout);
        void *rbuf;
        if (back_to_back((const void *const *)c->out_blocks, c->out_counts, 0, n, es)) {
            rbuf = c->out_blocks[0];
        } else {
            rbuf = op->unpack = mpi_op_scratch(op, 1, sout * es);
            if (!rbuf)
                return TD_ERR_NOMEM;
        }
        const void *sbuf = c->in_blocks[0];
        if (!back_to_back(c->in_blocks, c->in_counts, 0, n, es) || overlaps(sbuf, sin * es, rbuf, sout * es)) {
            char *p = mpi_op_scratch(op, 0, sin * es);
            if (!p)
                return TD_ERR_NOMEM;
            for (int r = 0; r < n; r++)
                if (c->in_counts[r])
                    memcpy(p + (size_t)sdispls[r] * es, c->in_blocks[r], c->in_counts[r] * es);
            sbuf = p;
        }
        what = blocking ? "MPI_Alltoallv" : "MPI_Ialltoallv";
        mpi_enter();
        rc = MPI_CALL(MPI_Alltoallv(sbuf, scounts, sdispls, dt, rbuf, rcounts, rdispls, dt, comm),
                      MPI_Ialltoallv(sbuf, scounts, sdispls, dt, rbuf, rcounts, rdispls, dt, comm, req));
        mpi_leave();
        break;
    }
    default: return error_fmt(TD_ERR_INTERNAL, "mpi backend: unknown collective kind %d", (int)c->kind);
    }
    if (rc != MPI_SUCCESS) {
        char *ctx = alloc_printf("mpi backend: %s #%llu: %s", td_coll_kind_name(c->kind), (unsigned long long)c->seq, what);
        st = mpi_error(rc, ctx);
        free(ctx);
        return st;
    }
    return TD_OK;
}

/* ---- submit and abort ---------------------------------------------------------------------- */

/* TD_OK when coll may go to MPI now; else why not (the thread's error set): the group was
 * aborted, the call came from a thread that may not call MPI (funneled mode), or MPI has no
 * datatype or op for it. *dt and *mop get what MPI calls it. */
__attribute__((always_inline)) static inline td_status ready(mpi_group *g, const td_coll *coll, MPI_Datatype *dt,
                                                              MPI_Op *mop)
{
    if (atomic_load_explicit(&g->abort_seen, memory_order_acquire)) {
        pthread_mutex_lock(&g->mu);
        td_status st = g->aborted ? error_fmt(g->abort_status, "%s", g->abort_msg) : TD_OK;
        pthread_mutex_unlock(&g->mu);
        TD_TRY(st);
    }
    if (!mpi_on_mpi_thread()) {
        char *what = alloc_printf("the %s", td_coll_kind_name(coll->kind));
        td_status st = mpi_check_thread(what);
        free(what);
        return st;
    }
    *mop = MPI_OP_NULL;
    return check_types(coll->kind, coll->dtype, coll->op.kind, dt, mop);
}

/* Collectives that ranks disagree about: MPI sends no header a receiver could compare, and a
 * mismatch hangs, or lets some ranks succeed (an all_reduce of 100 elements meeting one of 200 ends
 * on one side and truncates on the other). Before collective #n, when n <= CHECK_FIRST or n is a
 * multiple of TDIST_MPI_CHECK_EVERY, the ranks all_gather the front end's descriptors (tdist/
 * backend.h) and every rank fails, naming itself and the first rank that describes the collective
 * otherwise, before any data moves. The choice depends only on n, the same on every rank, so the
 * check's own call never meets another collective. It costs one more small MPI call per checked
 * collective (docs/collectives.md has the figures and the default). Blocking mode only: in
 * nonblocking mode a blocking check in submit could wait for a rank that is itself waiting for
 * this one elsewhere, where the mismatched collective would instead fail at the group's timeout. */
static td_status agree(mpi_group *g, const td_coll *c)
{
    if (c->seq > CHECK_FIRST && (g->check_every == 0 || c->seq % (uint64_t)g->check_every != 0))
        return TD_OK;
    uint64_t mine[DESC_WORDS] = {c->desc.what, c->desc.count, c->desc.seq};
    mpi_enter();
    int rc = MPI_Allgather(mine, DESC_WORDS, MPI_UINT64_T, g->descs, DESC_WORDS, MPI_UINT64_T, g->comm);
    mpi_leave();
    if (rc != MPI_SUCCESS) {
        char *ctx = alloc_printf("mpi backend: %s #%llu: MPI_Allgather (the agreement check)",
                                 td_coll_kind_name(c->kind), (unsigned long long)c->seq);
        td_status st = mpi_error(rc, ctx);
        free(ctx);
        return st;
    }
    for (int r = 0; r < g->size; r++) {
        const uint64_t *o = g->descs + (size_t)r * DESC_WORDS;
        if (memcmp(o, mine, sizeof mine) == 0)
            continue;
        td_coll_desc theirs = {o[0], o[1], o[2]};
        char a[96], b[96], msg[512];
        td_coll_desc_format(&c->desc, a, sizeof a);
        td_coll_desc_format(&theirs, b, sizeof b);
        td_coll_mismatch_format(msg, sizeof msg, c->desc.seq, g->global_ranks[g->rank], a, g->global_ranks[r], b);
        return error_set(TD_ERR_INVALID, msg);
    }
    return TD_OK;
}

/* A blocking collective, run to its end on this thread in the group's own op record (blocking
 * calls of a group come one at a time): the MPI call is made in this frame (post is inlined). */
static td_status run_blocking(mpi_group *g, const td_coll *coll)
{
    MPI_Datatype dt = MPI_DATATYPE_NULL;
    MPI_Op mop = MPI_OP_NULL;
    TD_TRY(ready(g, coll, &dt, &mop));
    TD_TRY(agree(g, coll));
    if (!g->spare)
        g->spare = TD_NEW(mpi_op);
    mpi_op *op = g->spare; /* only its scratch buffers serve: coll stays the caller's */
    op->unpack = NULL;
    op->size = g->size;
    op->me = g->rank;
    td_status st = post(g, coll, op, dt, mop, true);
    if (st == TD_OK && op->unpack)
        st = finish(coll, op, NULL); /* else nothing to unpack (never a receive) */
    return st;
}

static td_status mpi_submit(void *state, const td_coll *coll, td_work *work)
{
    mpi_group *g = state;
    bool p2p = coll->kind == TD_COLL_SEND || coll->kind == TD_COLL_RECV;
    if (g->blocking && !p2p) {
        td_work_done(work, run_blocking(g, coll), -1, NULL);
        return TD_OK;
    }
    MPI_Datatype dt = MPI_DATATYPE_NULL;
    MPI_Op mop = MPI_OP_NULL;
    td_status st = ready(g, coll, &dt, &mop);
    if (st != TD_OK) {
        td_work_done(work, st, -1, NULL);
        return TD_OK;
    }
    mpi_op *op = mpi_op_get();
    op->req = MPI_REQUEST_NULL;
    op->coll = *coll;
    op->work = work;
    op->g = g;
    op->size = g->size;
    op->me = g->rank;
    st = post(g, &op->coll, op, dt, mop, false);
    if (st != TD_OK) {
        mpi_op_put(op);
        td_work_done(work, st, -1, NULL);
        return TD_OK;
    }
    if (op->req == MPI_REQUEST_NULL) { /* ran to the end already */
        op->status.MPI_ERROR = MPI_SUCCESS;
        mpi_op_complete(op);
        return TD_OK;
    }
    /* In funneled mode only the MPI thread's waiters can complete it. */
    if (mpi_funneled())
        td_work_set_driver(work, mpi_rt_progress);
    /* In flight: where abort finds it. A group aborted meanwhile fails it now. */
    pthread_mutex_lock(&g->mu);
    if (g->aborted) {
        atomic_store(&op->state, MPI_OP_ABORTED);
        td_status ast = g->abort_status;
        char *msg = alloc_strdup(g->abort_msg);
        pthread_mutex_unlock(&g->mu);
        td_work_done(work, ast, -1, "%s", msg);
        free(msg);
        mpi_rt_track(op);
        return TD_OK;
    }
    op->linked = true;
    op->gnext = g->inflight;
    if (g->inflight)
        g->inflight->gprev = op;
    g->inflight = op;
    pthread_mutex_unlock(&g->mu);

    /* A short operation finishes here, without handing it to another thread. */
    int64_t until = clock_now_ns() + g->spin_ns;
    do {
        int flag = 0;
        mpi_enter();
        int rc = MPI_Test(&op->req, &flag, &op->status);
        mpi_leave();
        if (rc != MPI_SUCCESS) {
            op->status.MPI_ERROR = rc;
            flag = 1;
        } else if (flag) {
            op->status.MPI_ERROR = MPI_SUCCESS;
        }
        if (flag) {
            mpi_op_complete(op);
            return TD_OK;
        }
    } while (atomic_load(&op->state) == MPI_OP_PENDING && clock_now_ns() < until);
    mpi_rt_track(op);
    return TD_OK;
}

static void mpi_abort(void *state, td_status status, const char *message)
{
    mpi_group *g = state;
    td_work **works = NULL;
    size_t n = 0, cap = 0;
    pthread_mutex_lock(&g->mu);
    if (!g->aborted) {
        g->aborted = true;
        atomic_store_explicit(&g->abort_seen, true, memory_order_release);
        g->abort_status = status == TD_OK ? TD_ERR_INTERNAL : status;
        g->abort_msg = alloc_strdup(message ? message : "the mpi group was aborted");
    }
    for (mpi_op *op = g->inflight; op;) {
        mpi_op *next = op->gnext;
        td_work *w = op->work;
        /* Off the list first: once ABORTED, the op's owner may recycle it at any moment. */
        unlink_locked(g, op);
        int expect = MPI_OP_PENDING;
        if (atomic_compare_exchange_strong(&op->state, &expect, MPI_OP_ABORTED)) {
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                works = alloc_resize(works, cap * sizeof *works);
            }
            works[n++] = w;
        }
        op = next;
    }
    td_status st = g->abort_status;
    char *msg = alloc_strdup(g->abort_msg);
    pthread_mutex_unlock(&g->mu);
    for (size_t i = 0; i < n; i++)
        td_work_done(works[i], st, -1, "%s", msg);
    free(works);
    free(msg);
}

const td_backend_ops backend_mpi_ops = {
    .name = "mpi",
    .create = mpi_create,
    .submit = mpi_submit,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
    .supports = mpi_supports,
    /* Any thread may call MPI (MPI_THREAD_MULTIPLE, or one at a time through mpi_enter); create
     * adds TD_BACKEND_CAP_ASYNC_ON_CALLER below MPI_THREAD_MULTIPLE. */
    .caps = TD_BACKEND_CAP_CALLER_THREAD | TD_BACKEND_CAP_RUNTIME_WORLD | TD_BACKEND_CAP_NO_DEADLINE,
};
