/* Remote references (tdist/rref.h): the RRef context of an agent and the protocol that counts
 * references across workers, as PyTorch's RRefContext does.
 *
 * An RRef is a td_rref: on its owner the value's future and the set of forks (user references
 * elsewhere) that keep it in the owners table; on a user the owner's id, the RRef id and its own
 * fork id. RRefs travel inside td_values as TD_REC_RREF records: live records hold the td_rref in
 * a handle (tensor/handle.h); rpc_rref_send replaces each by a wire record with a new fork id for
 * the receiver before encoding, and rpc_rref_receive turns wire records back into live RRefs.
 *
 * The protocol, by who sends what to whom (every message is a call of an internal function on
 * the agent's one call path, so its reply is the acknowledgement):
 *   - owner -> user: the owner registers the fork when it sends (early registration); the user
 *     is confirmed on arrival. Owner -> itself: the fork registered on sending is removed on
 *     arrival.
 *   - user -> owner: the sender keeps its RRef as a pending child until the owner answers with
 *     tdist::rref_accept (the fork id is a phantom: no user holds it).
 *   - user -> user: the sender keeps a pending child; the receiver is a pending user until the
 *     owner acknowledges its tdist::rref_fork, then sends tdist::rref_accept to the sender. A call
 *     whose arguments hold pending users runs once they are confirmed.
 *   - td_rpc_remote: the caller makes a pending user (or, to itself, an owner) and sends the call
 *     with RPC_FLAG_RREF and the ids; the owner registers the fork on arrival (in channel order,
 *     so a later delete finds it), runs the function into the owner RRef and replies once the
 *     value is set: that reply confirms the user and completes the creation future.
 *   - The last local reference of a user sends tdist::rref_delete; the owner drops the fork
 *     (idempotently) and the RRef when no fork is left.
 * Pending users and children hold references, so a user is never deleted before its owner knows
 * it and its children are known too: a delete never overtakes a fork.
 *
 * Locks: ctx->mu guards the tables and the forks of owner RRefs; an RRef's own mu guards its
 * cached type query. Nothing is sent, completed or released under ctx->mu (an RRef's last release
 * may send its delete); r->mu may be held while sending (it nests outside ctx->mu). Messages that
 * would be sent from the I/O thread (a reply being decoded) go through the pool instead. */
#include "rpc/rref.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/rpc.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "base/ref.h"
#include "base/thread.h"
#include "base/vec.h"
#include "rpc/agent_impl.h"
#include "rpc/registry.h"
#include "tensor/handle.h"

typedef struct gid {
    int64_t created_on, local_id;
} gid;

struct td_rref {
    td_ref ref;
    td_rpc_agent *agent; /* a reference */
    bool is_owner;
    int64_t owner;       /* the owner's worker id */
    gid id, fork;        /* fork: a user's own fork id */
    td_future *created;  /* the creation future (NULL on an owner: derived from value) */
    /* Owner. */
    td_future *value;    /* the value, or the function's failure, once created */
    TD_VEC(gid) forks;   /* ctx->mu */
    bool in_owners;      /* ctx->mu: in the owners table, which holds a reference */
    bool creating;       /* ctx->mu: a remote to itself runs: stays in the table meanwhile */
    /* User. */
    _Atomic bool confirmed;
    _Atomic bool timed_out; /* its td_rpc_remote timed out */
    bool deleted;           /* ctx->mu: its delete was sent (or must not be) */
    /* The type query (mu). */
    pthread_mutex_t mu;
    td_future *type_future;
};

struct rpc_rref_ctx {
    pthread_mutex_t mu;
    pthread_cond_t cv;       /* pending users and children settling */
    _Atomic int64_t next_id; /* RRef and fork ids of this agent */
    td_map owners;           /* rref id -> owner td_rref (a reference) */
    td_map pending_users;    /* fork id -> user td_rref (a reference) waiting for its owner */
    td_map pending_children; /* fork id -> pending_child: an RRef forked to a worker not yet confirmed */
    td_map users;            /* fork id -> every live user td_rref (no reference), for shutdown */
    bool cleared;            /* the agent was torn down: nothing is sent any more */
    bool skip_user_deletes;
    _Atomic uint64_t type_queries;
};

static const char rref_kind = 0; /* the handles' kind (tensor/handle.h) */
static const char creation_timed_out[] =
    "RRef creation via rpc.remote() timed out, and it is possible that the RRef on the owner node does not exist.";

#define FN_FORK "tdist::rref_fork"
#define FN_ACCEPT "tdist::rref_accept"
#define FN_DELETE "tdist::rref_delete"
#define FN_FETCH "tdist::rref_fetch"
#define FN_INVOKE "tdist::rref_invoke"
#define FN_TYPEOF "_rref_typeof_on_owner"

static void register_functions(void);

/* ---- the context ----------------------------------------------------------------------------- */

rpc_rref_ctx *rpc_rref_ctx_new(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_functions);
    rpc_rref_ctx *c = TD_NEW(rpc_rref_ctx);
    thread_mutex_init(&c->mu);
    thread_cond_init(&c->cv);
    return c;
}

void rpc_rref_ctx_free(rpc_rref_ctx *c)
{
    if (!c)
        return;
    map_free(&c->owners, NULL);
    map_free(&c->pending_users, NULL);
    map_free(&c->pending_children, NULL);
    map_free(&c->users, NULL);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

typedef TD_VEC(td_rref *) rref_vec;

typedef struct pending_child {
    td_rref *r; /* a reference */
    int peer;   /* the receiver */
} pending_child;

static void release_all(rref_vec *v)
{
    for (size_t i = 0; i < v->len; i++)
        td_rref_release(v->items[i]);
    TD_VEC_FREE(v);
}

/* Moves every value of m into out and empties m (ctx->mu held). */
static void take_all(td_map *m, rref_vec *out)
{
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(m, &it));)
        TD_VEC_PUSH(out, e->value);
    map_free(m, NULL); /* and empties it */
}

void rpc_rref_ctx_clear(td_rpc_agent *a)
{
    rpc_rref_ctx *c = a->rrefs;
    rref_vec drop = {0};
    pthread_mutex_lock(&c->mu);
    c->cleared = true;
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&c->owners, &it));)
        ((td_rref *)e->value)->in_owners = false;
    take_all(&c->owners, &drop);
    take_all(&c->pending_users, &drop);
    for (size_t it = 0; (e = map_next(&c->pending_children, &it));) {
        pending_child *pc = e->value;
        TD_VEC_PUSH(&drop, pc->r);
        free(pc);
    }
    map_free(&c->pending_children, NULL);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    release_all(&drop);
}

static gid new_id(td_rpc_agent *a) { return (gid){a->self.id, atomic_fetch_add(&a->rrefs->next_id, 1)}; }

static td_status check_open(td_rpc_agent *a)
{
    if (atomic_load(&a->closing))
        return error_set(TD_ERR_NOT_INIT, rpc_not_initialized);
    return TD_OK;
}

/* ---- RRef objects ---------------------------------------------------------------------------- */

static td_rref *rref_new(td_rpc_agent *a, bool is_owner, int64_t owner, gid id)
{
    td_rref *r = TD_NEW(td_rref);
    ref_init(&r->ref);
    rpc_agent_retain(a);
    r->agent = a;
    r->is_owner = is_owner;
    r->owner = owner;
    r->id = id;
    thread_mutex_init(&r->mu);
    if (is_owner)
        atomic_store(&r->confirmed, true);
    return r;
}

td_rref *td_rref_retain(td_rref *r)
{
    if (r)
        ref_inc(&r->ref);
    return r;
}

static void notify(td_rpc_agent *a, int64_t peer, const char *fn, td_value *args,
                   void (*done)(td_future *f, void *arg), void *arg);
static td_value *gid_value(gid g);

static void rref_free(td_rref *r)
{
    td_rpc_agent *a = r->agent;
    rpc_rref_ctx *c = a->rrefs;
    if (!r->is_owner) {
        pthread_mutex_lock(&c->mu);
        if (map_get(&c->users, &r->fork, sizeof r->fork) == r)
            map_remove(&c->users, &r->fork, sizeof r->fork);
        bool send = !r->deleted && !c->cleared;
        r->deleted = true;
        pthread_mutex_unlock(&c->mu);
        if (send)
            notify(a, r->owner, FN_DELETE, td_value_tuple_of(2, gid_value(r->id), gid_value(r->fork)), NULL, NULL);
    }
    td_future_release(r->created);
    td_future_release(r->value);
    td_future_release(r->type_future);
    TD_VEC_FREE(&r->forks);
    pthread_mutex_destroy(&r->mu);
    rpc_agent_release(a);
    free(r);
}

void td_rref_release(td_rref *r)
{
    if (r && ref_dec(&r->ref))
        rref_free(r);
}

/* ---- the tables (ctx->mu held) ---------------------------------------------------------------- */

static td_rref *owner_get_or_create(td_rpc_agent *a, gid id)
{
    rpc_rref_ctx *c = a->rrefs;
    td_rref *r = map_get(&c->owners, &id, sizeof id);
    if (!r) {
        r = rref_new(a, true, a->self.id, id);
        r->value = td_future_new();
        r->in_owners = true;
        map_put(&c->owners, &id, sizeof id, r);
    }
    return r;
}

static void owner_add_fork(rpc_rref_ctx *c, td_rref *r, gid fork)
{
    TD_VEC_PUSH(&r->forks, fork);
    if (!r->in_owners && !c->cleared) {
        r->in_owners = true;
        map_put(&c->owners, &r->id, sizeof r->id, td_rref_retain(r));
    }
}

/* Removes fork from r's forks (if there: deletes are idempotent); an RRef left without forks
 * leaves the owners table, its reference moved to *drop. */
static void owner_del_fork(rpc_rref_ctx *c, td_rref *r, gid fork, rref_vec *drop)
{
    for (size_t i = 0; i < r->forks.len; i++)
        if (memcmp(&r->forks.items[i], &fork, sizeof fork) == 0) {
            TD_VEC_SWAP_REMOVE(&r->forks, i);
            break;
        }
    if (r->forks.len == 0 && r->in_owners && !r->creating) {
        r->in_owners = false;
        map_remove(&c->owners, &r->id, sizeof r->id);
        TD_VEC_PUSH(drop, r);
    }
}

/* ---- sending protocol messages ---------------------------------------------------------------- */

typedef struct notice {
    td_rpc_agent *agent; /* a reference */
    int64_t peer;
    const char *fn;
    td_value *args;
    void (*done)(td_future *f, void *arg);
    void *arg;
} notice;

static void notice_send(void *p)
{
    notice *n = p;
    td_future *f = NULL;
    const rpc_header protocol = {.flags = RPC_CALL_PROTOCOL}; /* no autograd context rides along */
    td_status st =
        rpc_agent_call(n->agent, (int)n->peer, n->fn, n->args, NULL, TD_RPC_DEFAULT_TIMEOUT, &protocol, &f);
    if (st != TD_OK)
        f = td_future_failed(st, td_last_error());
    if (n->done)
        td_future_add_callback(f, n->done, n->arg);
    td_future_release(f);
    td_value_release(n->args);
    rpc_agent_release(n->agent);
    free(n);
}

static void notice_drop(void *p)
{
    notice *n = p;
    td_future *f = td_future_failed(TD_ERR_CLOSED, "the RPC agent shut down");
    if (n->done)
        td_future_add_callback(f, n->done, n->arg);
    td_future_release(f);
    td_value_release(n->args);
    rpc_agent_release(n->agent);
    free(n);
}

/* Calls fn(args) (taken) on peer, then done(future, arg) with its outcome. From the I/O thread the
 * call is made on the pool, as the I/O thread must not wait on a send. */
static void notify(td_rpc_agent *a, int64_t peer, const char *fn, td_value *args,
                   void (*done)(td_future *f, void *arg), void *arg)
{
    notice *n = TD_NEW(notice);
    rpc_agent_retain(a);
    *n = (notice){a, peer, fn, args, done, arg};
    if (!rpc_io_is_current(a))
        notice_send(n);
    else if (rpc_pool_submit(&a->pool, notice_send, notice_drop, n) != TD_OK)
        notice_drop(n);
}

/* ---- RRefs in values ------------------------------------------------------------------------- */

static td_value *gid_value(gid g) { return td_value_tuple_of(2, td_value_int(g.created_on), td_value_int(g.local_id)); }

static void release_handle(void *obj) { td_rref_release(obj); }

td_value *td_rref_value(td_rref *r)
{
    if (!r)
        return td_value_none();
    return td_value_record_of(TD_REC_RREF, 5, td_value_int(r->owner), gid_value(r->id),
                              gid_value(r->is_owner ? r->id : r->fork), td_value_string(""),
                              value_handle_new(&rref_kind, td_rref_retain(r), release_handle));
}

td_rref *td_value_get_rref(const td_value *v)
{
    if (!v || td_value_kind_of(v) != TD_VAL_RECORD || td_value_record_tag(v) != TD_REC_RREF || td_value_len(v) != 5)
        return NULL;
    return value_handle_get(td_value_at(v, 4), &rref_kind);
}

typedef td_status (*record_fn)(td_rpc_agent *a, int peer, const td_value *rec, td_value **out, void *ctx);

/* Puts item (taken) at i of c, a new container of v's kind (a dict's key is v's). */
static void map_put_item(td_value *c, const td_value *v, size_t i, td_value *item)
{
    switch (td_value_kind_of(c)) {
    case TD_VAL_LIST: td_value_list_append(c, item); break;
    case TD_VAL_DICT: td_value_dict_set(c, td_value_retain(td_value_dict_key_at(v, i)), item); break;
    default: td_value_set(c, i, item); break;
    }
}

/* v with each TD_REC_RREF record replaced by fn's result, in one walk: a container is copied only
 * from its first changed element on, and v itself comes back (retained) when it holds no RRef, so
 * a call without RRefs pays one walk and no allocation. */
static td_status map_rrefs(td_rpc_agent *a, int peer, const td_value *v, int depth, record_fn fn, void *ctx,
                           td_value **out)
{
    if (depth > TD_VALUE_MAX_DEPTH)
        return error_fmt(TD_ERR_INVALID, "value nested deeper than %d levels", TD_VALUE_MAX_DEPTH);
    td_value_kind kind = td_value_kind_of(v);
    if (kind == TD_VAL_RECORD && td_value_record_tag(v) == TD_REC_RREF)
        return fn(a, peer, v, out, ctx);
    if (kind != TD_VAL_LIST && kind != TD_VAL_TUPLE && kind != TD_VAL_DICT && kind != TD_VAL_RECORD) {
        *out = td_value_retain((td_value *)v);
        return TD_OK;
    }
    size_t n = td_value_len(v);
    td_value *c = NULL; /* the copy, once an element changed */
    for (size_t i = 0; i < n; i++) {
        const td_value *child = kind == TD_VAL_DICT ? td_value_dict_value_at(v, i) : td_value_at(v, i);
        td_value *item = NULL;
        td_status st = map_rrefs(a, peer, child, depth + 1, fn, ctx, &item);
        if (st != TD_OK) {
            td_value_release(c);
            return st;
        }
        if (!c && item == child) {
            td_value_release(item);
            continue;
        }
        if (!c) {
            c = kind == TD_VAL_LIST    ? td_value_list_new()
                : kind == TD_VAL_TUPLE ? td_value_tuple_new(n)
                : kind == TD_VAL_DICT  ? td_value_dict_new()
                                       : td_value_record_new(td_value_record_tag(v), n);
            for (size_t j = 0; j < i; j++)
                map_put_item(c, v, j,
                             td_value_retain(kind == TD_VAL_DICT ? td_value_dict_value_at(v, j) : td_value_at(v, j)));
        }
        map_put_item(c, v, i, item);
    }
    *out = c ? c : td_value_retain((td_value *)v);
    return TD_OK;
}

/* Sending one RRef to peer: a new fork, registered by an owner at once, kept as a pending child by a
 * user until the receiver is confirmed. */
static td_status fork_for(td_rpc_agent *a, int peer, const td_value *rec, td_value **out, void *ctx)
{
    (void)ctx;
    td_rref *r = td_value_get_rref(rec);
    if (!r)
        return error_fmt(TD_ERR_INVALID, "a TD_REC_RREF record that holds no RRef (make RRef values with "
                                         "td_rref_value)");
    if (r->agent != a)
        return error_fmt(TD_ERR_INVALID, "an RRef of another RPC agent cannot be sent by agent %s", a->self.name);
    if (atomic_load(&r->timed_out))
        return error_set(TD_ERR_TIMEOUT, creation_timed_out);
    rpc_rref_ctx *c = a->rrefs;
    gid fork = new_id(a);
    pthread_mutex_lock(&c->mu);
    if (r->is_owner)
        owner_add_fork(c, r, fork);
    else {
        pending_child *pc = TD_NEW(pending_child);
        pc->r = td_rref_retain(r);
        pc->peer = peer;
        map_put(&c->pending_children, &fork, sizeof fork, pc);
    }
    pthread_mutex_unlock(&c->mu);
    *out = td_value_record_of(TD_REC_RREF, 4, td_value_int(r->owner), gid_value(r->id), gid_value(fork),
                              td_value_string(""));
    return TD_OK;
}

td_status rpc_rref_send(td_rpc_agent *a, int to, const td_value *v, td_value **out)
{
    *out = NULL;
    return v ? map_rrefs(a, to, v, 1, fork_for, NULL, out) : TD_OK;
}

static bool read_gid(const td_value *v, gid *g)
{
    if (td_value_kind_of(v) != TD_VAL_TUPLE || td_value_len(v) != 2 || td_value_kind_of(td_value_at(v, 0)) != TD_VAL_INT ||
        td_value_kind_of(td_value_at(v, 1)) != TD_VAL_INT)
        return false;
    *g = (gid){td_value_get_int(td_value_at(v, 0)), td_value_get_int(td_value_at(v, 1))};
    return true;
}

typedef TD_VEC(td_future *) future_vec;

typedef struct fork_wait {
    td_rref *r;       /* a reference */
    int64_t parent;   /* the worker that sent it */
    td_future *done;  /* a reference: the call's wait */
} fork_wait;

/* The owner acknowledged a pending user's fork: it is confirmed, and its parent may drop its
 * pending child. */
static void fork_confirmed(td_future *f, void *arg)
{
    fork_wait *w = arg;
    td_rref *r = w->r;
    td_rpc_agent *a = r->agent;
    rpc_rref_ctx *c = a->rrefs;
    atomic_store(&r->confirmed, true);
    pthread_mutex_lock(&c->mu);
    td_rref *pending = map_get(&c->pending_users, &r->fork, sizeof r->fork) == r
                           ? map_remove(&c->pending_users, &r->fork, sizeof r->fork)
                           : NULL;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    notify(a, w->parent, FN_ACCEPT, td_value_tuple_of(1, gid_value(r->fork)), NULL, NULL);
    if (td_future_status(f) == TD_OK)
        td_future_set_result(w->done, NULL);
    else
        td_future_set_error(w->done, td_future_status(f), "%s", td_future_error(f));
    td_future_release(w->done);
    td_rref_release(pending);
    td_rref_release(r);
    free(w);
}

/* Receiving one RRef from worker `from`. */
static td_status adopt(td_rpc_agent *a, int from, const td_value *rec, td_value **out, void *ctx)
{
    future_vec *waits = ctx;
    gid id, fork;
    if (td_value_len(rec) != 4 || td_value_kind_of(td_value_at(rec, 0)) != TD_VAL_INT ||
        !read_gid(td_value_at(rec, 1), &id) || !read_gid(td_value_at(rec, 2), &fork))
        return error_fmt(TD_ERR_INVALID, "a malformed RRef record from worker %d", from);
    int64_t owner = td_value_get_int(td_value_at(rec, 0));
    if (owner < 0 || owner >= a->world_size)
        return error_fmt(TD_ERR_INVALID, "an RRef from worker %d names owner %" PRId64 ", not a worker", from, owner);
    rpc_rref_ctx *c = a->rrefs;
    td_rref *r;
    if (owner == a->self.id) {
        rref_vec drop = {0};
        pthread_mutex_lock(&c->mu);
        r = td_rref_retain(map_get(&c->owners, &id, sizeof id));
        if (r && from == a->self.id)
            owner_del_fork(c, r, fork, &drop); /* registered when this worker sent it to itself */
        pthread_mutex_unlock(&c->mu);
        release_all(&drop);
        if (!r)
            return error_fmt(TD_ERR_INVALID,
                             "RRef GloballyUniqueId(created_on=%" PRId64 ", local_id=%" PRId64
                             ") from worker %d is not known on its owner %s",
                             id.created_on, id.local_id, from, a->self.name);
        if (from != a->self.id) /* a user sent it back: its phantom fork is accepted at once */
            notify(a, from, FN_ACCEPT, td_value_tuple_of(1, gid_value(fork)), NULL, NULL);
    } else {
        r = rref_new(a, false, owner, id);
        r->fork = fork;
        r->created = td_future_completed(NULL);
        bool confirmed = from == owner; /* the owner registered the fork when it sent it */
        atomic_store(&r->confirmed, confirmed);
        pthread_mutex_lock(&c->mu);
        map_put(&c->users, &fork, sizeof fork, r);
        if (!confirmed)
            map_put(&c->pending_users, &fork, sizeof fork, td_rref_retain(r));
        pthread_mutex_unlock(&c->mu);
        if (!confirmed) {
            fork_wait *w = TD_NEW(fork_wait);
            w->r = td_rref_retain(r);
            w->parent = from;
            w->done = td_future_new();
            if (waits)
                TD_VEC_PUSH(waits, td_future_retain(w->done));
            notify(a, owner, FN_FORK, td_value_tuple_of(2, gid_value(id), gid_value(fork)), fork_confirmed, w);
        }
    }
    *out = td_rref_value(r);
    td_rref_release(r);
    return TD_OK;
}

td_status rpc_rref_receive(td_rpc_agent *a, int from, const td_value *v, td_value **out, td_future **confirm)
{
    *out = NULL;
    if (confirm)
        *confirm = NULL;
    if (!v)
        return TD_OK;
    future_vec waits = {0};
    td_status st = map_rrefs(a, from, v, 1, adopt, &waits, out);
    if (st == TD_OK && confirm && waits.len == 1)
        *confirm = td_future_retain(waits.items[0]);
    else if (st == TD_OK && confirm && waits.len > 1)
        *confirm = td_future_collect_all(waits.items, (int)waits.len);
    for (size_t i = 0; i < waits.len; i++)
        td_future_release(waits.items[i]);
    TD_VEC_FREE(&waits);
    return st;
}

/* ---- remote() ------------------------------------------------------------------------------- */

static bool is_self(td_rpc_agent *a, int peer) { return peer == (int)a->self.id; }

/* The remote call completed (its reply, an error, a timeout): the creation is settled. */
static void remote_done(td_future *f, void *arg)
{
    td_rref *r = arg;
    td_rpc_agent *a = r->agent;
    rpc_rref_ctx *c = a->rrefs;
    td_status st = td_future_status(f);
    if (st == TD_OK) {
        td_future_set_result(r->created, NULL);
    } else {
        /* After a timeout, to_here and forks fail with creation_timed_out; the owner may still
         * create the value, and the delete this RRef sends when released cleans it up. */
        if (st == TD_ERR_TIMEOUT)
            atomic_store(&r->timed_out, true);
        td_future_set_typed_error(r->created, st, td_future_error_type(f), "%s", td_future_error(f));
    }
    rref_vec drop = {0};
    if (r->is_owner) {
        /* To itself: the handler set the value unless the call failed before it could. */
        if (st != TD_OK)
            td_future_set_typed_error(r->value, st, td_future_error_type(f), "%s", td_future_error(f));
        pthread_mutex_lock(&c->mu);
        r->creating = false;
        if (r->in_owners && r->forks.len == 0) { /* found by the handler; no one else needs it there */
            r->in_owners = false;
            map_remove(&c->owners, &r->id, sizeof r->id);
            TD_VEC_PUSH(&drop, r);
        }
        pthread_mutex_unlock(&c->mu);
    } else {
        /* The owner registered the fork on arrival, whatever the function did: settled. */
        atomic_store(&r->confirmed, true);
        pthread_mutex_lock(&c->mu);
        if (map_get(&c->pending_users, &r->fork, sizeof r->fork) == r)
            TD_VEC_PUSH(&drop, map_remove(&c->pending_users, &r->fork, sizeof r->fork));
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    release_all(&drop);
    td_rref_release(r);
}

td_status td_rpc_remote(td_rpc_agent *agent, td_rpc_dest to, const char *fn, const td_value *args,
                        const td_value *kwargs, int64_t timeout_ms, td_rref **rref)
{
    if (!rref)
        return error_fmt(TD_ERR_INVALID, "td_rpc_remote: rref is NULL");
    *rref = NULL;
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    int peer = -1;
    td_status st = check_open(a);
    if (st == TD_OK)
        st = rpc_agent_resolve(a, &to, &peer);
    if (st != TD_OK) {
        rpc_agent_release(a);
        return st;
    }
    rpc_rref_ctx *c = a->rrefs;
    gid id = new_id(a); /* the RRef id before the fork id, as PyTorch numbers them */
    td_rref *r;
    if (is_self(a, peer)) {
        r = rref_new(a, true, a->self.id, id);
        r->value = td_future_new();
        pthread_mutex_lock(&c->mu);
        r->in_owners = true; /* for the handler to find */
        r->creating = true;
        map_put(&c->owners, &id, sizeof id, td_rref_retain(r));
        pthread_mutex_unlock(&c->mu);
    } else {
        r = rref_new(a, false, peer, id);
        r->fork = new_id(a);
        pthread_mutex_lock(&c->mu);
        map_put(&c->users, &r->fork, sizeof r->fork, r);
        map_put(&c->pending_users, &r->fork, sizeof r->fork, td_rref_retain(r));
        pthread_mutex_unlock(&c->mu);
    }
    r->created = td_future_new();
    gid fork = r->is_owner ? id : r->fork; /* to itself the fork id is the RRef id: no fork */
    rpc_header extra = {.flags = RPC_FLAG_RREF,
                        .rref_owner = id.created_on,
                        .rref_local = id.local_id,
                        .fork_owner = fork.created_on,
                        .fork_local = fork.local_id};
    td_future *f = NULL;
    st = rpc_agent_call(a, peer, fn, args, kwargs, timeout_ms, &extra, &f);
    if (st != TD_OK) {
        /* Nothing reached the owner: undo the tables, send no delete. */
        char msg[TD_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        rref_vec drop = {0};
        pthread_mutex_lock(&c->mu);
        r->deleted = true;
        td_map *table = r->is_owner ? &c->owners : &c->pending_users;
        gid key = r->is_owner ? id : r->fork;
        if (map_get(table, &key, sizeof key) == r)
            TD_VEC_PUSH(&drop, map_remove(table, &key, sizeof key));
        r->in_owners = false;
        pthread_mutex_unlock(&c->mu);
        release_all(&drop);
        td_rref_release(r);
        rpc_agent_release(a);
        return error_set(st, msg);
    }
    td_future_add_callback(f, remote_done, td_rref_retain(r));
    td_future_release(f);
    rpc_agent_release(a);
    *rref = r;
    return TD_OK;
}

td_rref *rpc_rref_remote_arrived(td_rpc_agent *a, int caller, const rpc_header *h)
{
    (void)caller;
    gid id = {h->rref_owner, h->rref_local}, fork = {h->fork_owner, h->fork_local};
    rpc_rref_ctx *c = a->rrefs;
    td_rref *r = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->cleared) {
        /* torn down: the call fails */
    } else if (memcmp(&id, &fork, sizeof id) == 0) {
        r = td_rref_retain(map_get(&c->owners, &id, sizeof id)); /* to itself: the caller put it there */
    } else {
        r = td_rref_retain(owner_get_or_create(a, id));
        owner_add_fork(c, r, fork);
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

typedef struct remote_set {
    td_rref *r;         /* a reference */
    td_future *reply;   /* a reference */
} remote_set;

static void remote_value_done(td_future *f, void *arg)
{
    remote_set *s = arg;
    if (td_future_status(f) == TD_OK) {
        td_value *v = td_future_value(f);
        td_future_set_result(s->r->value, v ? td_value_retain(v) : NULL);
        td_future_set_result(s->reply, NULL);
    } else {
        const char *type = td_future_error_type(f);
        td_future_set_typed_error(s->r->value, td_future_status(f), type, "%s", td_future_error(f));
        td_future_set_typed_error(s->reply, td_future_status(f), type, "%s", td_future_error(f));
    }
    td_future_release(f);
    td_rref_release(s->r);
    td_future_release(s->reply);
    free(s);
}

td_future *rpc_rref_remote_result(td_rref *owner, td_future *value)
{
    if (!owner) {
        td_future_release(value);
        return td_future_failed(TD_ERR_CLOSED, "the RPC agent shut down");
    }
    remote_set *s = TD_NEW(remote_set);
    s->r = owner;
    s->reply = td_future_new();
    td_future *reply = td_future_retain(s->reply);
    td_future_add_callback(value, remote_value_done, s); /* s keeps the reference to value */
    return reply;
}

td_status td_rref_create(td_rpc_agent *agent, td_value *value, td_rref **rref)
{
    if (!rref)
        return error_fmt(TD_ERR_INVALID, "td_rref_create: rref is NULL");
    *rref = NULL;
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    td_status st = check_open(a);
    if (st == TD_OK) {
        td_rref *r = rref_new(a, true, a->self.id, new_id(a));
        r->value = td_future_completed(value ? td_value_retain(value) : NULL);
        *rref = r;
    }
    rpc_agent_release(a);
    return st;
}

/* ---- queries --------------------------------------------------------------------------------- */

bool td_rref_is_owner(const td_rref *r) { return r && r->is_owner; }

bool td_rref_confirmed_by_owner(const td_rref *r) { return r && atomic_load(&r->confirmed); }

static td_worker_info worker_of(td_rpc_agent *a, int64_t id)
{
    pthread_mutex_lock(&a->mu);
    td_worker_info w = a->peers[id].info;
    pthread_mutex_unlock(&a->mu);
    return w;
}

td_status td_rref_owner(const td_rref *r, td_worker_info *owner)
{
    if (!r || !owner)
        return error_fmt(TD_ERR_INVALID, "td_rref_owner: %s is NULL", r ? "owner" : "rref");
    *owner = worker_of(r->agent, r->owner);
    return TD_OK;
}

#define GID_FMT "GloballyUniqueId(created_on=%" PRId64 ", local_id=%" PRId64 ")"

size_t td_rref_to_string(const td_rref *r, char *buf, size_t size)
{
    int n;
    if (!r)
        n = snprintf(buf, size, "None");
    else if (r->is_owner)
        n = snprintf(buf, size, "OwnerRRef(" GID_FMT ")", r->id.created_on, r->id.local_id);
    else
        n = snprintf(buf, size, "UserRRef(RRefId = " GID_FMT ", ForkId = " GID_FMT ")", r->id.created_on,
                     r->id.local_id, r->fork.created_on, r->fork.local_id);
    return n < 0 ? 0 : (size_t)n;
}

static td_status to_none(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    *result = NULL;
    return td_future_propagate_error(parent);
}

td_future *td_rref_get_future(td_rref *r)
{
    if (!r)
        return td_future_failed(TD_ERR_INVALID, "td_rref_get_future: rref is NULL");
    if (r->created)
        return td_future_retain(r->created);
    return td_future_then(r->value, to_none, NULL);
}

/* ---- the value ------------------------------------------------------------------------------- */

static int64_t timeout_of(td_rpc_agent *a, int64_t timeout_ms)
{
    return timeout_ms == TD_RPC_DEFAULT_TIMEOUT ? atomic_load(&a->default_timeout_ms) : timeout_ms;
}

/* Waits for the owner's value: a new reference to it. */
static td_status owner_value(td_rref *r, int64_t timeout_ms, td_value **value)
{
    td_status st = td_future_wait(r->value, timeout_of(r->agent, timeout_ms));
    if (st == TD_ERR_TIMEOUT && !td_future_is_completed(r->value))
        return error_fmt(TD_ERR_TIMEOUT, "the value of OwnerRRef(" GID_FMT ") was not created within %lld ms",
                         r->id.created_on, r->id.local_id, (long long)timeout_of(r->agent, timeout_ms));
    if (st != TD_OK)
        return td_future_propagate_error(r->value);
    td_value *v = td_future_value(r->value);
    *value = v ? td_value_retain(v) : NULL;
    return TD_OK;
}

static void release_rref_cb(td_future *f, void *arg)
{
    (void)f;
    td_rref_release(arg);
}

/* A call about r to its owner; r stays alive until the call completes, so its delete cannot
 * overtake the call. */
static td_status call_owner(td_rref *r, const char *fn, td_value *args, int64_t timeout_ms, td_future **f)
{
    td_status st = rpc_agent_call(r->agent, (int)r->owner, fn, args, NULL, timeout_ms, NULL, f);
    td_value_release(args);
    if (st == TD_OK)
        td_future_add_callback(*f, release_rref_cb, td_rref_retain(r));
    return st;
}

td_status td_rref_to_here(td_rref *r, int64_t timeout_ms, td_value **value)
{
    if (!r || !value)
        return error_fmt(TD_ERR_INVALID, "td_rref_to_here: %s is NULL", r ? "value" : "rref");
    *value = NULL;
    TD_TRY(check_open(r->agent));
    if (r->is_owner)
        return owner_value(r, timeout_ms, value);
    if (atomic_load(&r->timed_out))
        return error_set(TD_ERR_TIMEOUT, creation_timed_out);
    td_future *f = NULL;
    TD_TRY(call_owner(r, FN_FETCH, td_value_tuple_of(1, gid_value(r->id)), timeout_ms, &f));
    td_status st = td_future_wait(f, 0);
    if (st == TD_OK) {
        td_value *v = td_future_value(f);
        *value = v ? td_value_retain(v) : NULL;
    }
    td_future_release(f);
    return st;
}

td_rpc_agent *rpc_rref_agent(const td_rref *r) { return r ? r->agent : NULL; }

td_status td_rref_local_value(td_rref *r, td_value **value)
{
    if (!r || !value)
        return error_fmt(TD_ERR_INVALID, "td_rref_local_value: %s is NULL", r ? "value" : "rref");
    *value = NULL;
    if (!r->is_owner) {
        td_rpc_agent *a = r->agent;
        td_worker_info owner = worker_of(a, r->owner);
        return error_fmt(TD_ERR_INVALID,
                         "For UserRRef(rref_id=" GID_FMT ", fork_id=" GID_FMT "), can't call localValue() on user "
                         "WorkerInfo(id=%lld, name=%s). Call it on owner WorkerInfo(id=%lld, name=%s)",
                         r->id.created_on, r->id.local_id, r->fork.created_on, r->fork.local_id,
                         (long long)a->self.id, a->self.name, (long long)owner.id, owner.name);
    }
    TD_TRY(check_open(r->agent));
    return owner_value(r, TD_RPC_NO_TIMEOUT, value);
}

/* ---- types ----------------------------------------------------------------------------------- */

static td_status type_of_value(td_future *parent, void *arg, td_value **result)
{
    (void)arg;
    TD_TRY(td_future_propagate_error(parent));
    *result = td_value_string(td_rpc_type_name(td_future_value(parent)));
    return TD_OK;
}

td_future *td_rref_get_type_async(td_rref *r, int64_t timeout_ms)
{
    if (!r)
        return td_future_failed(TD_ERR_INVALID, "td_rref_get_type_async: rref is NULL");
    pthread_mutex_lock(&r->mu);
    td_future *f = r->type_future;
    if (f && td_future_is_completed(f) && td_future_status(f) != TD_OK) {
        td_future_release(f); /* only a success is cached */
        f = r->type_future = NULL;
    }
    if (!f) {
        td_status st = TD_OK;
        if (r->is_owner)
            f = td_future_then(r->value, type_of_value, NULL);
        else if ((st = check_open(r->agent)) == TD_OK &&
                 (st = call_owner(r, FN_TYPEOF, td_value_tuple_of(1, td_rref_value(r)), timeout_ms, &f)) == TD_OK)
            atomic_fetch_add(&r->agent->rrefs->type_queries, 1);
        if (st != TD_OK)
            f = td_future_failed(st, td_last_error());
        r->type_future = f;
    }
    td_future_retain(f);
    pthread_mutex_unlock(&r->mu);
    return f;
}

td_status td_rref_get_type(td_rref *r, int64_t timeout_ms, const char **type_name)
{
    if (!r || !type_name)
        return error_fmt(TD_ERR_INVALID, "td_rref_get_type: %s is NULL", r ? "type_name" : "rref");
    *type_name = NULL;
    td_future *f = td_rref_get_type_async(r, timeout_ms);
    td_status st = td_future_wait(f, 0);
    if (st == TD_OK)
        *type_name = td_value_get_string(td_future_value(f), NULL); /* lives in r's cached future */
    td_future_release(f);
    return st;
}

/* ---- proxies --------------------------------------------------------------------------------- */

static td_status method_name(const char *type, const char *method, char *out, size_t size)
{
    int n = snprintf(out, size, "%s.%s", type, method);
    if (n < 0 || (size_t)n >= size)
        return error_fmt(TD_ERR_INVALID, "method name %s.%s is too long", type, method);
    rpc_function rf;
    if (!rpc_registry_lookup(out, &rf))
        return td_rpc_raise("AttributeError", "type object '%s' has no attribute '%s'", type, method);
    return TD_OK;
}

static td_value *invoke_args(td_rref *r, const char *method, const td_value *args, const td_value *kwargs)
{
    return td_value_tuple_of(4, td_rref_value(r), td_value_string(method),
                             args ? td_value_retain((td_value *)args) : td_value_tuple_new(0),
                             kwargs ? td_value_retain((td_value *)kwargs) : td_value_dict_new());
}

static td_status proxy_check(td_rref *r, const char *method, int64_t timeout_ms)
{
    if (!r || !method)
        return error_fmt(TD_ERR_INVALID, "an RRef proxy call needs an rref and a method name");
    const char *type = NULL;
    TD_TRY(td_rref_get_type(r, timeout_ms, &type));
    char name[256];
    return method_name(type, method, name, sizeof name);
}

td_status td_rref_rpc_sync(td_rref *r, const char *method, const td_value *args, const td_value *kwargs,
                           int64_t timeout_ms, td_value **result)
{
    if (result)
        *result = NULL;
    TD_TRY(proxy_check(r, method, timeout_ms));
    td_future *f = NULL;
    TD_TRY(call_owner(r, FN_INVOKE, invoke_args(r, method, args, kwargs), timeout_ms, &f));
    td_status st = td_future_wait(f, 0);
    if (st == TD_OK && result) {
        td_value *v = td_future_value(f);
        *result = v ? td_value_retain(v) : NULL;
    }
    td_future_release(f);
    return st;
}

typedef struct proxy_async {
    td_rref *r;        /* a reference */
    char *method;
    td_value *args;    /* the invoke call's arguments */
    int64_t timeout_ms;
    td_future *out;    /* a reference */
} proxy_async;

static void proxy_forward(td_future *f, void *arg)
{
    td_future *out = arg;
    if (td_future_status(f) == TD_OK) {
        td_value *v = td_future_value(f);
        td_future_set_result(out, v ? td_value_retain(v) : NULL);
    } else {
        td_future_set_typed_error(out, td_future_status(f), td_future_error_type(f), "%s", td_future_error(f));
    }
    td_future_release(out);
}

static void proxy_typed(td_future *type_f, void *arg)
{
    proxy_async *p = arg;
    char name[256];
    td_future *call = NULL;
    td_status st = td_future_propagate_error(type_f);
    if (st == TD_OK)
        st = method_name(td_value_get_string(td_future_value(type_f), NULL), p->method, name, sizeof name);
    if (st == TD_OK) {
        st = call_owner(p->r, FN_INVOKE, p->args, p->timeout_ms, &call);
        p->args = NULL;
    }
    if (st == TD_OK) {
        td_future_add_callback(call, proxy_forward, p->out); /* takes p's reference to out */
        td_future_release(call);
    } else {
        td_future_set_typed_error(p->out, st, error_type(), "%s", td_last_error());
        td_future_release(p->out);
    }
    td_value_release(p->args);
    td_rref_release(p->r);
    free(p->method);
    free(p);
}

td_status td_rref_rpc_async(td_rref *r, const char *method, const td_value *args, const td_value *kwargs,
                            int64_t timeout_ms, td_future **future)
{
    if (!future)
        return error_fmt(TD_ERR_INVALID, "td_rref_rpc_async: future is NULL");
    *future = NULL;
    if (!r || !method)
        return error_fmt(TD_ERR_INVALID, "an RRef proxy call needs an rref and a method name");
    proxy_async *p = TD_NEW(proxy_async);
    p->r = td_rref_retain(r);
    p->method = alloc_strdup(method);
    p->args = invoke_args(r, method, args, kwargs);
    p->timeout_ms = timeout_ms;
    p->out = td_future_new();
    *future = td_future_retain(p->out);
    td_future *type_f = td_rref_get_type_async(r, timeout_ms);
    td_future_add_callback(type_f, proxy_typed, p);
    td_future_release(type_f);
    return TD_OK;
}

td_status td_rref_remote(td_rref *r, const char *method, const td_value *args, const td_value *kwargs,
                         int64_t timeout_ms, td_rref **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_rref_remote: out is NULL");
    *out = NULL;
    TD_TRY(proxy_check(r, method, timeout_ms));
    td_value *a = invoke_args(r, method, args, kwargs);
    td_status st = td_rpc_remote(r->agent, td_rpc_to_id(r->owner), FN_INVOKE, a, NULL, timeout_ms, out);
    td_value_release(a);
    return st;
}

/* ---- the owner's handlers -------------------------------------------------------------------- */

static td_status arg_gid(const char *fn, const td_value *v, gid *g)
{
    if (!v || !read_gid(v, g))
        return error_fmt(TD_ERR_INVALID, "%s: an RRef id must be a (created_on, local_id) tuple", fn);
    return TD_OK;
}

/* tdist::rref_fork(rref id, fork id): a user announces a fork it received from another user. */
static td_status fn_fork(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)result;
    const td_value *p[2];
    gid id, fork;
    TD_TRY(td_rpc_bind(FN_FORK, "rref_id,fork_id", args, kwargs, p));
    TD_TRY(arg_gid(FN_FORK, p[0], &id));
    TD_TRY(arg_gid(FN_FORK, p[1], &fork));
    td_rpc_agent *a = td_rpc_call_agent(call);
    rpc_rref_ctx *c = a->rrefs;
    pthread_mutex_lock(&c->mu);
    if (!c->cleared)
        owner_add_fork(c, owner_get_or_create(a, id), fork);
    pthread_mutex_unlock(&c->mu);
    return TD_OK;
}

/* tdist::rref_accept(fork id): the receiver of a fork this worker sent is confirmed. */
static td_status fn_accept(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)result;
    const td_value *p[1];
    gid fork;
    TD_TRY(td_rpc_bind(FN_ACCEPT, "fork_id", args, kwargs, p));
    TD_TRY(arg_gid(FN_ACCEPT, p[0], &fork));
    rpc_rref_ctx *c = td_rpc_call_agent(call)->rrefs;
    pthread_mutex_lock(&c->mu);
    pending_child *pc = map_remove(&c->pending_children, &fork, sizeof fork);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (pc) {
        td_rref_release(pc->r);
        free(pc);
    }
    return TD_OK;
}

/* tdist::rref_delete(rref id, fork id): a user dropped its reference (idempotent). */
static td_status fn_delete(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)result;
    const td_value *p[2];
    gid id, fork;
    TD_TRY(td_rpc_bind(FN_DELETE, "rref_id,fork_id", args, kwargs, p));
    TD_TRY(arg_gid(FN_DELETE, p[0], &id));
    TD_TRY(arg_gid(FN_DELETE, p[1], &fork));
    rpc_rref_ctx *c = td_rpc_call_agent(call)->rrefs;
    rref_vec drop = {0};
    pthread_mutex_lock(&c->mu);
    td_rref *r = map_get(&c->owners, &id, sizeof id);
    if (r)
        owner_del_fork(c, r, fork, &drop);
    pthread_mutex_unlock(&c->mu);
    release_all(&drop);
    return TD_OK;
}

/* tdist::rref_fetch(rref id): the value, once created (to_here). */
static td_future *fn_fetch(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    const td_value *p[1];
    gid id;
    if (td_rpc_bind(FN_FETCH, "rref_id", args, kwargs, p) != TD_OK || arg_gid(FN_FETCH, p[0], &id) != TD_OK)
        return NULL;
    td_rpc_agent *a = td_rpc_call_agent(call);
    rpc_rref_ctx *c = a->rrefs;
    pthread_mutex_lock(&c->mu);
    td_future *f = c->cleared ? NULL : td_future_retain(owner_get_or_create(a, id)->value);
    pthread_mutex_unlock(&c->mu);
    if (!f)
        error_set(TD_ERR_CLOSED, "the RPC agent shut down");
    return f;
}

static td_status owned_arg(const char *fn, const td_value *v, td_rref **r)
{
    *r = td_value_get_rref(v);
    if (!*r || !(*r)->is_owner)
        return error_fmt(TD_ERR_INVALID, "%s: expects an RRef owned by this worker", fn);
    return TD_OK;
}

/* _rref_typeof_on_owner(rref): the value's type name, once created. */
static td_future *fn_typeof(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)call;
    const td_value *p[1];
    td_rref *r;
    if (td_rpc_bind(FN_TYPEOF, "rref", args, kwargs, p) != TD_OK || owned_arg(FN_TYPEOF, p[0], &r) != TD_OK)
        return NULL;
    return td_future_then(r->value, type_of_value, NULL);
}

/* tdist::rref_invoke(rref, method, args, kwargs): the method of the value's type, called with the
 * value first. */
static td_future *fn_invoke(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    const td_value *p[4];
    td_rref *r;
    if (td_rpc_bind(FN_INVOKE, "rref,method,args,kwargs", args, kwargs, p) != TD_OK ||
        owned_arg(FN_INVOKE, p[0], &r) != TD_OK)
        return NULL;
    td_value *value = NULL;
    if (owner_value(r, TD_RPC_NO_TIMEOUT, &value) != TD_OK)
        return NULL;
    char name[256];
    rpc_function rf;
    const char *method = td_value_get_string(p[1], NULL);
    td_future *f = NULL;
    if (td_value_kind_of(p[1]) != TD_VAL_STRING ||
        td_value_kind_of(p[2]) != TD_VAL_TUPLE || td_value_kind_of(p[3]) != TD_VAL_DICT) {
        error_fmt(TD_ERR_INVALID, "%s: malformed arguments", FN_INVOKE);
    } else if (method_name(td_rpc_type_name(value), method, name, sizeof name) == TD_OK &&
               rpc_registry_lookup(name, &rf)) {
        size_t n = td_value_len(p[2]);
        td_value *full = td_value_tuple_new(n + 1);
        td_value_set(full, 0, value ? td_value_retain(value) : td_value_none());
        for (size_t i = 0; i < n; i++)
            td_value_set(full, i + 1, td_value_retain(td_value_at(p[2], i)));
        td_rpc_call method_call = *call;
        method_call.arg = rf.arg;
        if (rf.async_fn) {
            f = rf.async_fn(&method_call, full, p[3]);
        } else {
            td_value *result = NULL;
            if (rf.fn(&method_call, full, p[3], &result) == TD_OK)
                f = td_future_completed(result);
        }
        td_value_release(full);
    }
    td_value_release(value);
    return f;
}

static void register_functions(void)
{
    td_rpc_register(FN_FORK, fn_fork, NULL);
    td_rpc_register(FN_ACCEPT, fn_accept, NULL);
    td_rpc_register(FN_DELETE, fn_delete, NULL);
    td_rpc_register_async(FN_FETCH, fn_fetch, NULL);
    td_rpc_register_async(FN_TYPEOF, fn_typeof, NULL);
    td_rpc_register_async(FN_INVOKE, fn_invoke, NULL);
}

/* ---- shutdown and introspection -------------------------------------------------------------- */

typedef struct user_ids {
    int64_t owner;
    gid id, fork;
} user_ids;

void rpc_rref_shutdown_users(td_rpc_agent *a, int64_t deadline_ns)
{
    rpc_rref_ctx *c = a->rrefs;
    TD_VEC(user_ids) deletes = {0};
    rref_vec drop = {0};
    pthread_mutex_lock(&c->mu);
    while ((c->pending_users.len || c->pending_children.len) && !c->cleared)
        if (!thread_cond_wait_until(&c->cv, &c->mu, deadline_ns))
            break;
    td_map_entry *e;
    if (!c->skip_user_deletes)
        for (size_t it = 0; (e = map_next(&c->users, &it));) {
            td_rref *r = e->value;
            if (!r->deleted) {
                r->deleted = true;
                TD_VEC_PUSH(&deletes, ((user_ids){r->owner, r->id, r->fork}));
            }
        }
    for (size_t it = 0; (e = map_next(&c->owners, &it));) {
        td_rref *r = e->value;
        if (r->forks.len == 0)
            TD_VEC_PUSH(&drop, r);
    }
    for (size_t i = 0; i < drop.len; i++) {
        drop.items[i]->in_owners = false;
        map_remove(&c->owners, &drop.items[i]->id, sizeof drop.items[i]->id);
    }
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < deletes.len; i++) {
        user_ids u = deletes.items[i];
        notify(a, u.owner, FN_DELETE, td_value_tuple_of(2, gid_value(u.id), gid_value(u.fork)), NULL, NULL);
    }
    TD_VEC_FREE(&deletes);
    release_all(&drop);
}

void rpc_rref_peer_lost(td_rpc_agent *a, int peer)
{
    rpc_rref_ctx *c = a->rrefs;
    rref_vec drop = {0};
    TD_VEC(gid) gone = {0};
    pthread_mutex_lock(&c->mu);
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&c->pending_children, &it));) {
        pending_child *pc = e->value;
        if (pc->peer == peer) {
            gid fork;
            memcpy(&fork, e->key, sizeof fork);
            TD_VEC_PUSH(&gone, fork);
        }
    }
    for (size_t i = 0; i < gone.len; i++) {
        pending_child *pc = map_remove(&c->pending_children, &gone.items[i], sizeof gone.items[i]);
        TD_VEC_PUSH(&drop, pc->r);
        free(pc);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    TD_VEC_FREE(&gone);
    release_all(&drop);
}

td_status rpc_rref_leak_check(td_rpc_agent *a, bool ignore)
{
    rpc_rref_ctx *c = a->rrefs;
    char *lines = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&lines, &len);
    if (!m)
        return error_fmt(TD_ERR_NOMEM, "leak check: out of memory");
    size_t leaks = 0;
    pthread_mutex_lock(&c->mu);
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&c->owners, &it));) {
        td_rref *r = e->value;
        for (size_t i = 0; i < r->forks.len; i++, leaks++)
            fprintf(m, "Leaking RRef " GID_FMT " with fork Id " GID_FMT "\n", r->id.created_on, r->id.local_id,
                    r->forks.items[i].created_on, r->forks.items[i].local_id);
    }
    pthread_mutex_unlock(&c->mu);
    fclose(m);
    td_status st = TD_OK;
    if (leaks) {
        static const char intro[] =
            "Detected RRef Leaks during shutdown. This usually occurs when the application code still holds "
            "references to RRef instances when calling shutdown(). If the program has completed correctly and the "
            "process is exiting, it is OK to ignore these leaks. However, if you program will keep running after "
            "this, these leaks could result in memory leaks on RRef owners. Please make sure all RRefs are out of "
            "scope and released (td_rref_release) before calling shutdown(): \n";
        if (ignore)
            TD_LOG_WARN("RPC agent %s: %s%s", a->self.name, intro, lines);
        else
            st = error_fmt(TD_ERR_INVALID, "%s%s", intro, lines);
    }
    free(lines);
    return st;
}

void rpc_rref_debug_info(td_rpc_agent *a, td_value *dict)
{
    rpc_rref_ctx *c = a->rrefs;
    long long owners, pending_futures = 0, pending_users, forks = 0;
    pthread_mutex_lock(&c->mu);
    owners = (long long)c->owners.len;
    pending_users = (long long)c->pending_users.len;
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&c->owners, &it));) {
        td_rref *r = e->value;
        forks += (long long)r->forks.len;
        pending_futures += !td_future_is_completed(r->value);
    }
    pthread_mutex_unlock(&c->mu);
    const struct {
        const char *key;
        long long v;
    } keys[] = {{"num_owner_rrefs", owners},
                {"num_pending_futures", pending_futures},
                {"num_pending_users", pending_users},
                {"num_forks", forks}};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char text[32];
        snprintf(text, sizeof text, "%lld", keys[i].v);
        td_value_dict_set_str(dict, keys[i].key, td_value_string(text));
    }
}

void rpc_rref_testing_skip_user_deletes(td_rpc_agent *a, bool skip)
{
    td_rpc_agent *agent;
    if (rpc_agent_get(a, &agent) != TD_OK)
        return;
    pthread_mutex_lock(&agent->rrefs->mu);
    agent->rrefs->skip_user_deletes = skip;
    pthread_mutex_unlock(&agent->rrefs->mu);
    rpc_agent_release(agent);
}

uint64_t rpc_rref_testing_type_queries(td_rpc_agent *a)
{
    td_rpc_agent *agent;
    if (rpc_agent_get(a, &agent) != TD_OK)
        return 0;
    uint64_t n = atomic_load(&agent->rrefs->type_queries);
    rpc_agent_release(agent);
    return n;
}
