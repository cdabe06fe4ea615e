/* The "threaded" backend: the ranks of a group are threads of one process (c10d's
 * ProcessLocalGroup, used by the threaded test harness and by programs that run a world in one
 * process), moving data with memory copies and the reduce kernels, without any transport.
 *
 * Ranks meet in a world: an in-process exchange found through a process-global registry. Rank 0
 * creates it and publishes its id in the group's store (under a key numbered by how many times
 * the group was created on that store, so a re-created group never finds a stale world); the
 * others look the id up and join, and creation waits until all have joined.
 *
 * Collectives use one slot: each rank deposits its td_coll and waits; the last to arrive checks
 * that every rank runs the same operation, does the data movement for everyone (through scratch
 * buffers, so in-place and aliased arguments are safe) and wakes the others. Each rank completes
 * its own work on its own worker thread. Point-to-point operations are matched through a list of
 * posted sends and receives (FIFO per sender, receiver and tag); whichever side comes second
 * copies the data and completes both, so submit never blocks for p2p.
 *
 * Failure: a rank that waits past its deadline, or an abort with any status but TD_ERR_CLOSED,
 * aborts the whole world (every rank fails with that message). Destroying a group (abort with
 * TD_ERR_CLOSED) makes only that rank leave: what it posted fails, and every operation that
 * needs it fails with TD_ERR_PEER_LOST naming it. td_threaded_abort_all aborts every world in the
 * process, for harnesses whose failed rank thread must wake the others. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/backend.h>
#include <tdist/store.h>

#include "backends/builtin.h"
#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/thread.h"

typedef struct p2p_post {
    const td_coll *coll;
    td_work *work;
    int rank; /* the poster */
    struct p2p_post *next;
} p2p_post;

typedef struct world {
    char id[96];
    int size;
    int refs; /* members that have not left */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int joined;
    /* the collective slot */
    uint64_t gen;
    int arrived;
    const td_coll **colls;
    td_status *results;
    char *result_msg;
    bool *left;
    bool aborted;
    td_status abort_status;
    char *abort_msg;
    p2p_post *posts; /* sends and receives not yet matched, in posting order */
    struct world *next;
} world;

typedef struct member {
    world *w;
    int rank;
} member;

static pthread_mutex_t g_registry_mu = PTHREAD_MUTEX_INITIALIZER;
static world *g_worlds;
static uint64_t g_world_counter;

/* ---- worlds ------------------------------------------------------------------------------ */

static world *world_new(int size)
{
    world *w = TD_NEW(world);
    /* The serial is taken under the registry lock: groups created at once on several threads
     * must get distinct ids, or a rank could join another group's world. */
    pthread_mutex_lock(&g_registry_mu);
    unsigned long long serial = ++g_world_counter;
    pthread_mutex_unlock(&g_registry_mu);
    snprintf(w->id, sizeof w->id, "threaded-%d-%llu", (int)getpid(), serial);
    w->size = size;
    w->refs = 1;
    thread_mutex_init(&w->mu);
    thread_cond_init(&w->cv);
    w->colls = alloc_zeroed((size_t)size, sizeof *w->colls);
    w->results = alloc_zeroed((size_t)size, sizeof *w->results);
    w->left = alloc_zeroed((size_t)size, sizeof *w->left);
    return w;
}

static void world_free(world *w)
{
    free(w->colls);
    free(w->results);
    free(w->left);
    free(w->result_msg);
    free(w->abort_msg);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* Completes the posts of a list (outside the world's lock) with one error. */
static void fail_posts(p2p_post *list, td_status status, const char *msg)
{
    while (list) {
        p2p_post *next = list->next;
        td_work_done(list->work, status, -1, "%s", msg);
        free(list);
        list = next;
    }
}

/* Fails the whole world: every waiter and every post, now and later. */
static void world_abort(world *w, td_status status, const char *msg)
{
    pthread_mutex_lock(&w->mu);
    p2p_post *posts = NULL;
    if (!w->aborted) {
        w->aborted = true;
        w->abort_status = status == TD_OK ? TD_ERR_INTERNAL : status;
        w->abort_msg = alloc_strdup(msg ? msg : "the threaded group was aborted");
        posts = w->posts;
        w->posts = NULL;
        pthread_cond_broadcast(&w->cv);
    }
    char *m = alloc_strdup(w->abort_msg);
    td_status st = w->abort_status;
    pthread_mutex_unlock(&w->mu);
    fail_posts(posts, st, m);
    free(m);
}

void td_threaded_abort_all(const char *message)
{
    pthread_mutex_lock(&g_registry_mu);
    for (world *w = g_worlds; w; w = w->next)
        world_abort(w, TD_ERR_CLOSED, message ? message : "The threaded groups of this process were aborted");
    pthread_mutex_unlock(&g_registry_mu);
}

/* With w->mu held: the first rank that left, or -1. */
static int first_left(const world *w)
{
    for (int r = 0; r < w->size; r++)
        if (w->left[r])
            return r;
    return -1;
}

static char *left_message(int rank)
{
    return alloc_printf("Rank %d left the threaded group (its process group was destroyed)", rank);
}

/* With w->mu held: the failure that an operation of rank `me` meets when the world was aborted or
 * rank `gone` (>= 0) left it, in *status and *msg (malloc'd); false when there is none. */
static bool world_failure(const world *w, int me, int gone, td_status *status, char **msg)
{
    if (w->aborted) {
        *status = w->abort_status;
        *msg = alloc_strdup(w->abort_msg);
        return true;
    }
    if (gone >= 0) {
        *status = gone == me ? TD_ERR_CLOSED : TD_ERR_PEER_LOST;
        *msg = left_message(gone);
        return true;
    }
    return false;
}

/* ---- create / destroy ---------------------------------------------------------------------- */

static void threaded_destroy(void *state);

static td_status threaded_create(const td_backend_args *args, void **state)
{
    int64_t deadline = deadline_after_ms(args->timeout_ms);
    int64_t n;
    TD_TRY(td_store_add(args->store, "threaded/created", 1, &n));
    char key[64];
    snprintf(key, sizeof key, "threaded/world/%lld", (long long)((n - 1) / args->size));
    world *w = NULL;
    if (args->rank == 0) {
        w = world_new(args->size);
        pthread_mutex_lock(&g_registry_mu);
        w->next = g_worlds;
        g_worlds = w;
        pthread_mutex_unlock(&g_registry_mu);
        td_status st = td_store_set_str(args->store, key, w->id);
        if (st != TD_OK) {
            pthread_mutex_lock(&g_registry_mu);
            for (world **p = &g_worlds; *p; p = &(*p)->next)
                if (*p == w) {
                    *p = w->next;
                    break;
                }
            pthread_mutex_unlock(&g_registry_mu);
            world_free(w);
            return st;
        }
    } else {
        void *id;
        size_t len;
        TD_TRY(td_store_get(args->store, key, &id, &len));
        pthread_mutex_lock(&g_registry_mu);
        for (world *x = g_worlds; x; x = x->next) {
            if (strcmp(x->id, id) == 0) {
                pthread_mutex_lock(&x->mu);
                if (x->size == args->size && x->refs > 0) {
                    x->refs++;
                    w = x;
                }
                pthread_mutex_unlock(&x->mu);
                break;
            }
        }
        pthread_mutex_unlock(&g_registry_mu);
        td_status st = w ? TD_OK
                         : error_fmt(TD_ERR_INVALID,
                                    "The threaded backend runs all ranks as threads of one process, but rank %d "
                                    "(pid %d) found no world '%s' of %d ranks here: its rank 0 lives in another "
                                    "process. Use the tcp backend for ranks in separate processes.",
                                    args->rank, (int)getpid(), (char *)id, args->size);
        free(id);
        if (st != TD_OK)
            return st;
    }
    member *m = TD_NEW(member);
    m->w = w;
    m->rank = args->rank;
    *state = m;

    /* Everyone must have joined before anyone may leave (else a quick destroy could free the world
     * under a rank still looking it up). */
    pthread_mutex_lock(&w->mu);
    w->joined++;
    pthread_cond_broadcast(&w->cv);
    while (w->joined < w->size && !w->aborted)
        if (!thread_cond_wait_until(&w->cv, &w->mu, deadline) && w->joined < w->size)
            break;
    int joined = w->joined;
    bool aborted = w->aborted;
    pthread_mutex_unlock(&w->mu);
    if (joined < w->size) {
        td_status st = aborted ? error_fmt(TD_ERR_CLOSED, "threaded backend: the world was aborted while ranks joined")
                               : error_fmt(TD_ERR_TIMEOUT,
                                          "threaded backend: timed out after %lld ms waiting for all %d ranks to "
                                          "join (%d joined)",
                                          (long long)args->timeout_ms, w->size, joined);
        char *msg = alloc_strdup(td_last_error());
        world_abort(w, st, msg);
        threaded_destroy(m); /* a failed create is not destroyed by the front end */
        *state = NULL;
        error_set(st, msg);
        free(msg);
        return st;
    }
    return TD_OK;
}

static void threaded_destroy(void *state)
{
    member *m = state;
    world *w = m->w;
    pthread_mutex_lock(&g_registry_mu);
    pthread_mutex_lock(&w->mu);
    bool last = --w->refs == 0;
    pthread_mutex_unlock(&w->mu);
    if (last)
        for (world **p = &g_worlds; *p; p = &(*p)->next)
            if (*p == w) {
                *p = w->next;
                break;
            }
    pthread_mutex_unlock(&g_registry_mu);
    if (last)
        world_free(w);
    free(m);
}

/* Rank m leaves (its group is destroyed): what it posted fails with CLOSED, what waits for it
 * fails with PEER_LOST, and collectives notice through w->left. */
static void member_leave(member *m, const char *msg)
{
    world *w = m->w;
    p2p_post *mine = NULL, *theirs = NULL;
    pthread_mutex_lock(&w->mu);
    if (!w->left[m->rank]) {
        w->left[m->rank] = true;
        for (p2p_post **p = &w->posts; *p;) {
            p2p_post *x = *p;
            bool own = x->rank == m->rank, needs_me = x->coll->peer == m->rank;
            if (own || needs_me) {
                *p = x->next;
                x->next = own ? mine : theirs;
                if (own)
                    mine = x;
                else
                    theirs = x;
            } else {
                p = &x->next;
            }
        }
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    fail_posts(mine, TD_ERR_CLOSED, msg);
    char *lost = left_message(m->rank);
    fail_posts(theirs, TD_ERR_PEER_LOST, lost);
    free(lost);
}

static void threaded_abort(void *state, td_status status, const char *message)
{
    member *m = state;
    if (status == TD_ERR_CLOSED)
        member_leave(m, message);
    else
        world_abort(m->w, status, message);
}

/* ---- collectives ----------------------------------------------------------------------------- */

static void describe(td_buf *b, int r, const td_coll *c)
{
    buf_printf(b, "rank %d runs %s #%llu of %zu %s elements", r, td_coll_kind_name(c->kind),
                  (unsigned long long)c->seq, c->count, td_dtype_name(c->dtype));
    if (td_coll_kind_rooted(c->kind))
        buf_printf(b, " with root %d", c->root);
    if (td_coll_kind_reduces(c->kind))
        buf_printf(b, " with op %s", td_reduce_op_name(c->op.kind));
}

/* With w->mu held, every rank arrived: checks that they agree; NULL or a malloc'd message. */
static char *check_agree(world *w)
{
    const td_coll *a = w->colls[0];
    for (int r = 1; r < w->size; r++) {
        const td_coll *c = w->colls[r];
        bool same = c->kind == a->kind && c->seq == a->seq && c->dtype == a->dtype;
        if (same && c->kind != TD_COLL_ALL_TO_ALL && c->kind != TD_COLL_BARRIER)
            same = c->count == a->count;
        if (same && td_coll_kind_rooted(c->kind))
            same = c->root == a->root;
        if (same && td_coll_kind_reduces(c->kind))
            same = c->op.kind == a->op.kind && c->op.factor == a->op.factor;
        if (!same) {
            td_buf b = TD_BUF_INIT;
            buf_append_str(&b, "threaded backend: the ranks run different collectives: ");
            describe(&b, 0, a);
            buf_append_str(&b, ", but ");
            describe(&b, r, c);
            return buf_steal(&b);
        }
    }
    if (a->kind == TD_COLL_ALL_TO_ALL)
        for (int r = 0; r < w->size; r++)
            for (int q = 0; q < w->size; q++)
                if (w->colls[r]->in_counts[q] != w->colls[q]->out_counts[r])
                    return alloc_printf("threaded backend: all_to_all: rank %d sends %zu elements to rank %d, which "
                                       "expects %zu",
                                       r, w->colls[r]->in_counts[q], q, w->colls[q]->out_counts[r]);
    return NULL;
}

/* dst := reduction over n inputs (dst must not alias them). */
static td_status reduce_into(void *dst, const void *const *srcs, int n, td_op op, td_dtype dt, size_t count)
{
    if (count == 0)
        return TD_OK;
    td_reduce_fn fn = td_reduce_kernel(op.kind, dt);
    if (!fn)
        return TD_ERR_INVALID;
    memcpy(dst, srcs[0], count * td_dtype_size(dt));
    for (int i = 1; i < n; i++)
        fn(dst, dst, srcs[i], count);
    return TD_OK;
}

static td_status alloc_scratch(size_t bytes, void **out)
{
    return alloc_try(bytes ? bytes : 1, "threaded backend scratch buffer", out);
}

/* With w->mu held, every rank arrived and agrees: moves the data of everyone. */
static td_status perform(world *w)
{
    const td_coll *const *c = w->colls;
    const td_coll *a = c[0];
    int n = w->size;
    size_t es = td_dtype_size(a->dtype), bytes = a->count * es;
    const void **srcs = alloc_zeroed((size_t)n, sizeof *srcs);
    void *acc = NULL;
    td_status st = TD_OK;
    switch (a->kind) {
    case TD_COLL_BARRIER:
        break;
    case TD_COLL_BROADCAST:
        for (int r = 0; r < n; r++)
            if (r != a->root && bytes)
                memcpy(c[r]->out, c[a->root]->in, bytes);
        break;
    case TD_COLL_ALL_REDUCE:
    case TD_COLL_REDUCE:
        st = alloc_scratch(bytes, &acc);
        for (int r = 0; r < n; r++)
            srcs[r] = c[r]->in;
        if (st == TD_OK)
            st = reduce_into(acc, srcs, n, a->op, a->dtype, a->count);
        for (int r = 0; r < n && st == TD_OK && bytes; r++)
            if (a->kind == TD_COLL_ALL_REDUCE || r == a->root)
                memcpy(c[r]->out, acc, bytes);
        break;
    case TD_COLL_ALL_GATHER:
    case TD_COLL_GATHER:
        for (int r = 0; r < n; r++)
            for (int q = 0; q < n && bytes; q++)
                if ((a->kind == TD_COLL_ALL_GATHER || q == a->root) && c[q]->out_blocks[r] != c[r]->in)
                    memmove(c[q]->out_blocks[r], c[r]->in, bytes);
        break;
    case TD_COLL_SCATTER:
        for (int r = 0; r < n && bytes; r++)
            if (c[r]->out != c[a->root]->in_blocks[r])
                memmove(c[r]->out, c[a->root]->in_blocks[r], bytes);
        break;
    case TD_COLL_REDUCE_SCATTER:
        /* Reduce every block before writing any output: an output may alias an input block. */
        st = alloc_scratch(bytes * (size_t)n, &acc);
        for (int r = 0; r < n && st == TD_OK; r++) {
            for (int q = 0; q < n; q++)
                srcs[q] = c[q]->in_blocks[r];
            st = reduce_into((char *)acc + (size_t)r * bytes, srcs, n, a->op, a->dtype, a->count);
        }
        for (int r = 0; r < n && st == TD_OK && bytes; r++)
            memcpy(c[r]->out, (char *)acc + (size_t)r * bytes, bytes);
        break;
    case TD_COLL_ALL_TO_ALL: {
        /* Stage every input first: all_to_all_single may run in place. */
        size_t total = 0;
        for (int r = 0; r < n; r++)
            for (int q = 0; q < n; q++)
                total += c[r]->in_counts[q] * es;
        st = alloc_scratch(total, &acc);
        size_t off = 0;
        for (int r = 0; r < n && st == TD_OK; r++)
            for (int q = 0; q < n; q++) {
                size_t nb = c[r]->in_counts[q] * es;
                if (nb)
                    memcpy((char *)acc + off, c[r]->in_blocks[q], nb);
                off += nb;
            }
        off = 0;
        for (int r = 0; r < n && st == TD_OK; r++)
            for (int q = 0; q < n; q++) {
                size_t nb = c[r]->in_counts[q] * es;
                if (nb)
                    memcpy(c[q]->out_blocks[r], (char *)acc + off, nb);
                off += nb;
            }
        break;
    }
    default:
        st = error_fmt(TD_ERR_INTERNAL, "threaded backend: unexpected collective kind %d", (int)a->kind);
    }
    free(srcs);
    free(acc);
    return st;
}

static void run_collective(member *m, const td_coll *coll, td_work *work)
{
    world *w = m->w;
    td_status status = TD_OK;
    char *msg = NULL;
    pthread_mutex_lock(&w->mu);
    int gone = first_left(w);
    if (!world_failure(w, m->rank, gone, &status, &msg)) {
        w->colls[m->rank] = coll;
        uint64_t gen = w->gen;
        if (++w->arrived == w->size) {
            char *disagree = check_agree(w);
            td_status st = disagree ? TD_ERR_INVALID : perform(w);
            free(w->result_msg);
            w->result_msg = disagree ? disagree : (st != TD_OK ? alloc_strdup(td_last_error()) : NULL);
            for (int r = 0; r < w->size; r++) {
                w->results[r] = st;
                w->colls[r] = NULL;
            }
            w->arrived = 0;
            w->gen++;
            pthread_cond_broadcast(&w->cv);
        } else {
            bool timed_out = false;
            while (w->gen == gen && !w->aborted && (gone = first_left(w)) < 0 && !timed_out)
                timed_out = !thread_cond_wait_until(&w->cv, &w->mu, coll->deadline_ns) && w->gen == gen;
            if (w->gen == gen) {
                /* It will not complete: withdraw, and say why. */
                w->colls[m->rank] = NULL;
                w->arrived--;
                if (!world_failure(w, m->rank, gone, &status, &msg)) {
                    td_buf b = TD_BUF_INIT;
                    buf_printf(&b, "threaded backend: rank %d timed out in %s #%llu waiting for rank(s) ", m->rank,
                                  td_coll_kind_name(coll->kind), (unsigned long long)coll->seq);
                    int k = 0;
                    for (int r = 0; r < w->size; r++)
                        if (!w->colls[r] && r != m->rank)
                            buf_printf(&b, "%s%d", k++ ? ", " : "", r);
                    status = TD_ERR_TIMEOUT;
                    msg = buf_steal(&b);
                }
            }
        }
        if (!msg && w->gen != gen) {
            status = w->results[m->rank];
            msg = status != TD_OK ? alloc_strdup(w->result_msg ? w->result_msg : "threaded backend: collective failed")
                                  : NULL;
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (status == TD_ERR_TIMEOUT)
        world_abort(w, status, msg); /* the others cannot complete it either */
    if (status == TD_OK)
        td_work_done(work, TD_OK, -1, NULL);
    else
        td_work_done(work, status, -1, "%s", msg);
    free(msg);
}

/* ---- point to point ------------------------------------------------------------------------ */

static bool matches(const p2p_post *p, int rank, const td_coll *coll)
{
    if (p->coll->tag != coll->tag || p->coll->kind == coll->kind)
        return false;
    if (coll->kind == TD_COLL_SEND) /* p is a receive posted by coll->peer */
        return p->rank == coll->peer && (p->coll->peer == rank || p->coll->peer == TD_ANY_SOURCE);
    return p->coll->peer == rank && (coll->peer == TD_ANY_SOURCE || coll->peer == p->rank);
}

static void run_p2p(member *m, const td_coll *coll, td_work *work)
{
    world *w = m->w;
    td_status status = TD_OK;
    char *msg = NULL;
    p2p_post *match = NULL;
    pthread_mutex_lock(&w->mu);
    int gone = w->left[m->rank] ? m->rank : (coll->peer >= 0 && w->left[coll->peer] ? coll->peer : -1);
    if (!world_failure(w, m->rank, gone, &status, &msg)) {
        for (p2p_post **p = &w->posts; *p; p = &(*p)->next) {
            if (matches(*p, m->rank, coll)) {
                match = *p;
                *p = match->next;
                break;
            }
        }
        if (!match) {
            p2p_post *post = TD_NEW(p2p_post);
            post->coll = coll;
            post->work = work;
            post->rank = m->rank;
            p2p_post **tail = &w->posts;
            while (*tail)
                tail = &(*tail)->next;
            *tail = post;
        }
    }
    pthread_mutex_unlock(&w->mu);
    if (msg) {
        td_work_done(work, status, -1, "%s", msg);
        free(msg);
        return;
    }
    if (!match)
        return;
    /* Both sides are off the list: copy and complete them, outside the lock. */
    bool sending = coll->kind == TD_COLL_SEND;
    const td_coll *send = sending ? coll : match->coll, *recv = sending ? match->coll : coll;
    td_work *send_work = sending ? work : match->work, *recv_work = sending ? match->work : work;
    int src = sending ? m->rank : match->rank;
    if (send->count != recv->count || send->dtype != recv->dtype) {
        char *err = alloc_printf("threaded backend: rank %d sent %zu %s elements (tag %d), but the receive expects "
                                "%zu %s elements",
                                src, send->count, td_dtype_name(send->dtype), send->tag, recv->count,
                                td_dtype_name(recv->dtype));
        td_work_done(send_work, TD_ERR_INVALID, -1, "%s", err);
        td_work_done(recv_work, TD_ERR_INVALID, -1, "%s", err);
        free(err);
    } else {
        if (send->count)
            memcpy(recv->out, send->in, send->count * td_dtype_size(send->dtype));
        td_work_done(send_work, TD_OK, -1, NULL);
        td_work_done(recv_work, TD_OK, src, NULL);
    }
    free(match);
}

static td_status threaded_submit(void *state, const td_coll *coll, td_work *work)
{
    member *m = state;
    if (coll->kind == TD_COLL_SEND || coll->kind == TD_COLL_RECV)
        run_p2p(m, coll, work);
    else
        run_collective(m, coll, work);
    return TD_OK;
}

const td_backend_ops backend_threaded_ops = {
    .name = "threaded",
    .create = threaded_create,
    .submit = threaded_submit,
    .abort = threaded_abort,
    .destroy = threaded_destroy,
    .supports = NULL,
};
