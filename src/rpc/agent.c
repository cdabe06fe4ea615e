/* The RPC agent (tdist/rpc.h): lifecycle and membership, calls, replies, timeouts, failures,
 * graceful shutdown, the default agent, and the helpers among workers.
 *
 * Creation: the agent opens its listeners and I/O thread (channel.c) and its pool (pool.c), then
 * meets the other workers in the store, under a namespace of its own ("rpc_prefix_<n>", n counting
 * this worker's agents over that store, so a re-init never reads a previous world's keys). Each
 * worker publishes its name, addresses, host identity and hello nonce under "worker/<id>", reads
 * everyone's, and fails on a name taken twice (every worker sees the whole table, so every worker
 * fails). Each connects to the workers with a higher id; create returns once every channel is up.
 * Channels admit only holders of the job's secret (channel.c): a worker whose secret differs fails
 * its init with the reason when it connects, and one that it should have connected to fails too,
 * RPC_AUTH_GRACE_MS after refusing it, unless an admitted connection from that id came meanwhile
 * (a refused hello may be an impostor's, which must not stop the world from starting).
 *
 * A call (td_rpc_async) is encoded at once, so argument errors return at the call site; it is
 * registered as pending (id -> future, peer, deadline) before it is sent, then written on the
 * peer's channel from the calling thread (or delivered through the loopback for a self-call).
 * Replies complete the future on the I/O thread; the future's callbacks run on the executor
 * (pg/executor.h), which the agent holds for its lifetime. Graceful shutdown flushes the executor
 * before each count it takes, so termination detection never sees a call as done before the
 * callbacks it triggered have issued their own calls. Calls run on the pool, once the agent is
 * created (a call from a worker that finished joining waits for this one to finish too): the
 * function is looked up in the registry; a failure comes back as an error message with its Python
 * type name, is logged on the callee, and fails the caller's future with TD_ERR_REMOTE. Async
 * functions reply from a callback on their future. The I/O thread's tick fails expired calls; a
 * channel that fails fails its peer's calls with TD_ERR_PEER_LOST, and later calls to that peer
 * fail at once.
 *
 * Graceful shutdown: rounds through the store in which every live worker publishes how many calls
 * it started and finished (after waiting for its own to end); the first round is the barrier, and
 * the workers stop once two consecutive rounds show the same totals with nothing in flight (a dead
 * worker is left out). Worker 0 leaves last, as it often hosts the store. Then the local teardown,
 * which always runs: stop the I/O thread, fail what is pending, stop the pool, close the sockets,
 * release the executor and the store.
 *
 * Dynamic groups (world_size < 0): the peer table has room for ids below RPC_DYNAMIC_MAX_ID and
 * only its `member` slots count. A newcomer joins under the store's token: it reads the members,
 * publishes itself, connects to each (the member binds the channel on its hello) and calls each
 * with tdist::rpc_join, whose handler makes it a member there; a graceful shutdown is a leave
 * (tdist::rpc_leave to each, then out of the store). "rpcIsStaticGroup" in the base store keeps
 * static and dynamic workers apart.
 *
 * _all_gather and _barrier go through the store too: each worker of the set writes its value under
 * "gather/<sorted names>/<n>/<name>" (n counts this worker's gathers over that set) and reads the
 * others'. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <tdist/rpc.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "base/thread.h"
#include "net/addr.h"
#include "pg/executor.h"
#include "pg/future.h"
#include "rpc/agent_impl.h"
#include "rpc/profiler.h"
#include "rpc/registry.h"
#include "rpc/rref.h"
#include "store/store_impl.h"

const char rpc_not_initialized[] = "RPC has not been initialized. Call torch.distributed.rpc.init_rpc first.";


static _Atomic int agent_generation;

const rpc_autograd_hooks *_Atomic rpc_autograd; /* agent_impl.h */

/* ---- references and the default agent ------------------------------------------------------- */

void rpc_agent_retain(td_rpc_agent *a) { ref_inc(&a->ref); }

void rpc_agent_release(td_rpc_agent *a)
{
    if (!a || !ref_dec(&a->ref))
        return;
    for (size_t i = 0; i < a->channels.len; i++)
        rpc_channel_free(a->channels.items[i]);
    free(a->channels.items);
    rpc_io_free(a);
    map_free(&a->pending, free);
    map_free(&a->gather_seqs, NULL);
    rpc_pool_destroy(&a->pool);
    rpc_rref_ctx_free(a->rrefs);
    const rpc_autograd_hooks *ag = atomic_load(&rpc_autograd);
    if (ag && atomic_load(&a->dist_autograd))
        ag->agent_free(a);
    free(a->peers);
    free(a->hello_nonces.items);
    explicit_bzero(&a->auth, sizeof a->auth); /* the key stands for the secret: leave no copy */
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
    free(a);
}

static pthread_mutex_t default_mu = PTHREAD_MUTEX_INITIALIZER;
static td_rpc_agent *default_agent;
static bool default_starting;
static bool default_stopping; /* td_rpc_shutdown is under way: the agent stays the default meanwhile */
/* The agents whose calls' futures have a driver (call_drive), from creation to shutdown, under
 * default_mu; an agent that finds no free slot leaves its waiters to the I/O thread. */
#define DRIVEN_AGENTS 8
static td_rpc_agent *driven_agents[DRIVEN_AGENTS];

td_status rpc_agent_get(td_rpc_agent *agent, td_rpc_agent **out)
{
    if (agent) {
        rpc_agent_retain(agent);
        *out = agent;
        return TD_OK;
    }
    pthread_mutex_lock(&default_mu);
    td_rpc_agent *a = default_agent;
    if (a)
        rpc_agent_retain(a);
    pthread_mutex_unlock(&default_mu);
    if (!a)
        return error_set(TD_ERR_NOT_INIT, rpc_not_initialized);
    *out = a;
    return TD_OK;
}

/* ---- options -------------------------------------------------------------------------------- */

void td_rpc_options_init(td_rpc_options *o)
{
    memset(o, 0, sizeof *o);
    o->rpc_timeout_ms = 60000;
    o->num_worker_threads = 16;
    o->ignore_rref_leak = true;
}

/* ---- completing calls ----------------------------------------------------------------------- */

/* After a pending call's future was completed (any thread, no lock held): counts it as done. Its
 * callbacks may still wait on the executor, and may make calls of their own; graceful shutdown
 * flushes the executor before it reads the counts (executor_flush), so it never takes a call
 * whose callbacks have yet to run for the end of the work. */
static void pending_finish(td_rpc_agent *a, rpc_pending *p)
{
    td_future_release(p->future);
    free(p);
    pthread_mutex_lock(&a->mu);
    a->client_active--;
    a->calls_done++;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

/* Fails a pending call (out of the pending map) with (status, message) and finishes it. Its
 * profiling event ends first, so that a caller the failure wakes finds it recorded. */
static void pending_fail(td_rpc_agent *a, rpc_pending *p, td_status status, const char *message)
{
    rpc_prof_call_end(p->prof);
    p->prof = NULL;
    td_future_set_error(p->future, status, "%s", message);
    pending_finish(a, p);
}

static void flush_mark(void *arg) { td_future_set_result(arg, NULL); }

/* Returns once the callbacks queued on the executor before the call have run. */
static void executor_flush(void)
{
    if (executor_is_current())
        return; /* the callbacks before this one already ran */
    td_future *f = td_future_new();
    executor_item *it = TD_NEW(executor_item);
    it->fn = flush_mark;
    it->arg = f;
    executor_dispatch(it);
    td_future_wait(f, 0);
    td_future_release(f);
}

/* The type a caller sees: ValueError and TypeError kept, every other one a RuntimeError. */
static const char *caller_type(const char *type)
{
    if (type && (strcmp(type, "ValueError") == 0 || strcmp(type, "TypeError") == 0))
        return type;
    return "RuntimeError";
}

static void complete_reply(td_rpc_agent *a, int peer, const rpc_header *h, td_storage *payload)
{
    uint64_t id = h->id;
    pthread_mutex_lock(&a->mu);
    rpc_pending *p = map_get(&a->pending, &id, sizeof id);
    if (p && p->peer == peer)
        map_remove(&a->pending, &id, sizeof id);
    else
        p = NULL;
    pthread_mutex_unlock(&a->mu);
    if (!p) {
        /* Timed out (or failed) already: the late reply is dropped. */
        TD_LOG_DEBUG("RPC agent %s: dropped a late reply to call %" PRIu64, a->self.name, id);
        td_storage_release(payload);
        return;
    }
    td_value *v = NULL;
    td_status st = payload ? rpc_payload_decode(h, payload, &v) : TD_OK;
    td_storage_release(payload);
    /* A profiled reply is (value, events): the events merge, and the call's event ends, before
     * the future completes (profiler.c). */
    if (st == TD_OK && (h->flags & RPC_FLAG_PROFILING))
        st = rpc_prof_reply_unwrap(p->prof, &v);
    /* Inside profiling's wrapping: distributed autograd's (value, tensors that require grad). */
    if (st == TD_OK && h->type == RPC_MSG_REPLY && (h->flags & RPC_FLAG_AUTOGRAD)) {
        const rpc_autograd_hooks *ag = atomic_load(&rpc_autograd);
        st = ag ? ag->reply_in(a, peer, h, &v) : error_fmt(TD_ERR_UNSUPPORTED, "distributed autograd is not built in");
    }
    rpc_prof_call_end(p->prof);
    p->prof = NULL;
    const td_worker_info *callee = &a->peers[peer].info;
    if (st != TD_OK) {
        td_future_set_error(p->future, st, "the reply of %s could not be decoded: %s", callee->name, td_last_error());
    } else if (h->type == RPC_MSG_REPLY) {
        if (v && td_value_kind_of(v) == TD_VAL_NONE) {
            td_value_release(v);
            v = NULL;
        }
        td_value *live = NULL;
        if (v && rpc_rref_receive(a, peer, v, &live, NULL) != TD_OK) {
            td_future_set_error(p->future, TD_ERR_REMOTE, "the reply of %s holds a bad RRef: %s", callee->name,
                                td_last_error());
        } else {
            td_future_set_result(p->future, live);
        }
        td_value_release(v);
    } else {
        const char *type = NULL, *msg = NULL;
        if (!v || rpc_error_parts(v, &type, &msg) != TD_OK) {
            td_future_set_error(p->future, TD_ERR_REMOTE, "On WorkerInfo(id=%lld, name=%s):\nmalformed error reply",
                                (long long)callee->id, callee->name);
        } else {
            td_future_set_typed_error(p->future, TD_ERR_REMOTE, caller_type(type),
                                      "On WorkerInfo(id=%lld, name=%s):\n%s('%s')", (long long)callee->id, callee->name,
                                      type, msg);
        }
        td_value_release(v);
    }
    pending_finish(a, p);
}

void rpc_agent_expire(td_rpc_agent *a)
{
    TD_VEC(rpc_pending *) expired = {0};
    int64_t now = clock_now_ns();
    pthread_mutex_lock(&a->mu);
    if (a->next_deadline_ns <= now) {
        int64_t next = TD_DEADLINE_NONE;
        td_map_entry *e;
        for (size_t it = 0; (e = map_next(&a->pending, &it));) {
            rpc_pending *p = e->value;
            if (p->deadline_ns <= now)
                TD_VEC_PUSH(&expired, p);
            else if (p->deadline_ns < next)
                next = p->deadline_ns;
        }
        for (size_t i = 0; i < expired.len; i++)
            map_remove(&a->pending, &expired.items[i]->id, sizeof expired.items[i]->id);
        a->next_deadline_ns = next;
    }
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < expired.len; i++) {
        char msg[128];
        snprintf(msg, sizeof msg, "RPC ran for more than set timeout (%lld ms) and will now be marked with an error",
                 (long long)expired.items[i]->timeout_ms);
        pending_fail(a, expired.items[i], TD_ERR_TIMEOUT, msg);
    }
    free(expired.items);
}

/* Fails the pending calls whose peer is `peer` (-1: all) with (status, message). */
static void fail_pending(td_rpc_agent *a, int peer, td_status status, const char *message)
{
    TD_VEC(rpc_pending *) failed = {0};
    pthread_mutex_lock(&a->mu);
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&a->pending, &it));) {
        rpc_pending *p = e->value;
        if (peer < 0 || p->peer == peer)
            TD_VEC_PUSH(&failed, p);
    }
    for (size_t i = 0; i < failed.len; i++)
        map_remove(&a->pending, &failed.items[i]->id, sizeof failed.items[i]->id);
    pthread_mutex_unlock(&a->mu);
    for (size_t i = 0; i < failed.len; i++)
        pending_fail(a, failed.items[i], status, message);
    free(failed.items);
}

void rpc_agent_channel_failed(td_rpc_agent *a, rpc_channel *ch, const char *reason)
{
    if (atomic_exchange(&ch->dead, true) && ch->peer < 0)
        return;
    rpc_channel_wake_sender(ch);
    pthread_mutex_lock(&a->mu);
    if (ch->fd >= 0)
        shutdown(ch->fd, SHUT_RDWR);
    int peer = ch->peer;
    bool newly = false, member = false;
    td_worker_info w;
    if (peer >= 0 && !a->peers[peer].lost && a->peers[peer].chan == ch) {
        a->peers[peer].lost = true;
        member = a->peers[peer].member; /* a member that left closes its connections as it goes */
        snprintf(a->peers[peer].lost_reason, sizeof a->peers[peer].lost_reason, "%s", reason);
        w = a->peers[peer].info;
        newly = true;
    }
    pthread_mutex_unlock(&a->mu);
    if (!newly)
        return;
    if (!atomic_load(&a->closing) && member)
        TD_LOG_INFO("RPC agent %s: lost worker %s (id %d): %s", a->self.name, w.name, peer, reason);
    char msg[512];
    snprintf(msg, sizeof msg, "RPC to worker %s (id %d) failed: the connection to it was lost (%s)", w.name, peer,
             reason);
    fail_pending(a, peer, TD_ERR_PEER_LOST, msg);
    rpc_rref_peer_lost(a, peer);
    const rpc_autograd_hooks *ag = atomic_load(&rpc_autograd);
    if (ag && ag->peer_lost && !atomic_load(&a->closing)) /* a closing agent frees its contexts itself */
        ag->peer_lost(a, peer);
}

/* ---- serving calls -------------------------------------------------------------------------- */

typedef struct incoming {
    td_rpc_agent *agent; /* a reference */
    int peer;
    rpc_header header;
    td_storage *payload;
    td_rref *rref;         /* a remote call's owner RRef (rpc_rref_remote_arrived) */
    struct incoming *next; /* in a->early */
} incoming;

/* Sends a message to peer (any thread, no lock held); drops it when the peer is gone. */
static void send_to(td_rpc_agent *a, int peer, const rpc_outgoing *m, int64_t deadline_ns)
{
    if (peer == (int)a->self.id) {
        if (rpc_loopback_send(a, m) != TD_OK)
            TD_LOG_WARN("RPC agent %s: a message to itself was lost: %s", a->self.name, td_last_error());
        return;
    }
    pthread_mutex_lock(&a->mu);
    rpc_channel *ch = a->peers[peer].lost ? NULL : a->peers[peer].chan;
    pthread_mutex_unlock(&a->mu);
    if (ch)
        rpc_channel_send(a, ch, m, true, deadline_ns);
}

static void reply_error(td_rpc_agent *a, int peer, const rpc_header *call, const char *type, const char *message)
{
    if (!(call->flags & RPC_FLAG_REPLY_WANTED))
        return;
    td_value *payload = rpc_error_payload(type, message);
    rpc_header h = {.type = RPC_MSG_ERROR, .sender = (uint32_t)a->self.id, .id = call->id};
    rpc_outgoing *m = NULL;
    if (rpc_outgoing_make(&h, payload, &m) == TD_OK) {
        send_to(a, peer, m, deadline_after_ms(call->timeout_ms));
        rpc_outgoing_free(m);
    } else {
        TD_LOG_ERROR("RPC agent %s: cannot encode an error reply: %s", a->self.name, td_last_error());
    }
    td_value_release(payload);
}

/* A function failed: log it on this worker, as PyTorch does, and tell the caller. */
static void call_failed(td_rpc_agent *a, int peer, const rpc_header *call, const char *type, const char *message)
{
    TD_LOG_ERROR("On WorkerInfo(id=%lld, name=%s):\n%s('%s')", (long long)a->self.id, a->self.name, type, message);
    reply_error(a, peer, call, type, message);
}

/* prof: a profiled call's collector, whose events go with the value (NULL: not profiled). */
static void reply_value(td_rpc_agent *a, int peer, const rpc_header *call, const td_value *value, td_profiler *prof)
{
    if (!(call->flags & RPC_FLAG_REPLY_WANTED))
        return;
    rpc_header h = {.type = RPC_MSG_REPLY, .sender = (uint32_t)a->self.id, .id = call->id};
    rpc_outgoing *m = NULL;
    td_value *wire = NULL, *wrapped = NULL, *ag_wrapped = NULL;
    const rpc_autograd_hooks *ag = atomic_load(&rpc_autograd);
    if ((call->flags & RPC_FLAG_AUTOGRAD) && ag) {
        /* The result's tensors that require grad get a send function (dist_autograd.c). */
        ag_wrapped = value ? td_value_retain((td_value *)value) : NULL;
        if (ag->reply_out(a, peer, call, &ag_wrapped, &h) != TD_OK) {
            char msg[TD_ERROR_MAX];
            snprintf(msg, sizeof msg, "distributed autograd: %s", td_last_error());
            td_value_release(ag_wrapped);
            call_failed(a, peer, call, "RuntimeError", msg);
            return;
        }
        value = ag_wrapped;
    }
    if (prof) {
        value = wrapped = rpc_prof_reply_wrap(prof, value);
        h.flags |= RPC_FLAG_PROFILING;
    }
    if ((value && rpc_rref_send(a, peer, value, &wire) != TD_OK) || rpc_outgoing_make(&h, wire, &m) != TD_OK) {
        char msg[TD_ERROR_MAX];
        snprintf(msg, sizeof msg, "cannot encode the result: %s", td_last_error());
        td_value_release(wire);
        td_value_release(wrapped);
        td_value_release(ag_wrapped);
        call_failed(a, peer, call, "RuntimeError", msg);
        return;
    }
    td_value_release(wire);
    td_value_release(wrapped);
    td_value_release(ag_wrapped);
    send_to(a, peer, m, deadline_after_ms(call->timeout_ms));
    rpc_outgoing_free(m);
}

typedef struct async_reply {
    td_rpc_agent *agent;
    int peer;
    rpc_header call;
    td_profiler *prof; /* a reference, for a profiled call */
} async_reply;

/* An async function's future completed: its value or error is the reply. */
static void async_done(td_future *f, void *arg)
{
    async_reply *r = arg;
    td_rpc_agent *a = r->agent;
    if (td_future_status(f) == TD_OK) {
        reply_value(a, r->peer, &r->call, td_future_value(f), r->prof);
    } else {
        const char *type = td_future_error_type(f);
        call_failed(a, r->peer, &r->call, type ? type : "RuntimeError", td_future_error(f));
    }
    rpc_prof_release(r->prof);
    atomic_fetch_sub(&a->server_active_async, 1);
    td_future_release(f);
    rpc_agent_release(a);
    free(r);
}

/* Replies with the failure a function just returned: its message and type (td_rpc_raise,
 * td_future_propagate_error; else RuntimeError), copied first, as sending may fail and set others. */
static void call_failed_now(td_rpc_agent *a, int peer, const rpc_header *call)
{
    char type[128], msg[TD_ERROR_MAX];
    snprintf(type, sizeof type, "%s", error_type() ? error_type() : "RuntimeError");
    snprintf(msg, sizeof msg, "%s", td_last_error());
    call_failed(a, peer, call, type, msg);
}

/* A call that will not run (shutdown). */
static void drop_call(void *arg)
{
    incoming *in = arg;
    td_rref_release(in->rref);
    td_storage_release(in->payload);
    rpc_agent_release(in->agent);
    free(in);
}

/* Replies from f (taken) when it completes, as an async function's reply (with prof's events). */
static void reply_when_done(td_rpc_agent *a, int peer, const rpc_header *call, td_future *f, td_profiler *prof)
{
    async_reply *r = TD_NEW(async_reply);
    rpc_agent_retain(a);
    r->agent = a;
    r->peer = peer;
    r->call = *call;
    r->prof = prof ? rpc_prof_retain(prof) : NULL;
    atomic_fetch_add(&a->server_active_async, 1);
    td_future_add_callback(f, async_done, r); /* r keeps the reference to f */
}

/* The failure a function just returned, as a failed future. */
static td_future *failed_now(void)
{
    td_future *f = td_future_new();
    td_future_set_typed_error(f, TD_ERR_REMOTE, error_type() ? error_type() : "RuntimeError", "%s", td_last_error());
    return f;
}

static void run_call(void *arg)
{
    incoming *in = arg;
    td_rpc_agent *a = in->agent;
    atomic_fetch_add(&a->server_active, 1);
    td_value *payload = NULL, *live = NULL;
    td_future *confirmed = NULL;
    const char *fn_name = NULL;
    const td_value *args = NULL, *kwargs = NULL;
    bool remote = in->header.flags & RPC_FLAG_RREF;
    td_profiler *prof = NULL, *prof_previous = NULL; /* a profiled call's collector (profiler.c) */
    const rpc_autograd_hooks *ag = NULL;
    void *ag_scope = NULL; /* the distributed autograd context the function runs in */
    td_status st = in->payload ? rpc_payload_decode(&in->header, in->payload, &payload)
                               : error_fmt(TD_ERR_INVALID, "a call without a payload");
    td_storage_release(in->payload);
    in->payload = NULL;
    if (st == TD_OK)
        st = rpc_rref_receive(a, in->peer, payload, &live, &confirmed);
    /* The user RRefs among the arguments are confirmed by their owners before the function runs. */
    if (st == TD_OK && confirmed && td_future_wait(confirmed, 0) != TD_OK)
        st = error_fmt(TD_ERR_REMOTE, "an RRef argument was not confirmed by its owner: %s", td_future_error(confirmed));
    const td_value *call_payload = live;
    /* Distributed autograd's wrapping is the outer one (the caller wraps after profiling). */
    if (st == TD_OK && (in->header.flags & RPC_FLAG_AUTOGRAD)) {
        ag = atomic_load(&rpc_autograd);
        st = ag ? ag->serve_in(a, in->peer, &in->header, live, &call_payload, &ag_scope)
                : error_fmt(TD_ERR_UNSUPPORTED, "distributed autograd is not built in");
    }
    if (st == TD_OK && (in->header.flags & RPC_FLAG_PROFILING))
        st = rpc_prof_serve_parts(call_payload, a->self.id, &call_payload, &prof);
    if (st == TD_OK)
        st = rpc_call_parts(call_payload, &fn_name, &args, &kwargs);
    td_future *result_f = NULL; /* a remote call's result, for its owner RRef */
    if (st != TD_OK) {
        char msg[TD_ERROR_MAX];
        snprintf(msg, sizeof msg, "malformed call: %s", td_last_error());
        if (!remote) {
            call_failed(a, in->peer, &in->header, "RuntimeError", msg);
            goto out;
        }
        result_f = td_future_failed(st, msg);
        goto reply;
    }
    rpc_function rf;
    if (!rpc_registry_lookup(fn_name, &rf)) {
        char msg[TD_ERROR_MAX];
        snprintf(msg, sizeof msg,
                 "function '%s' is not registered on worker %s. Default RPC pickler does not serialize function "
                 "code. Ensure that UDFs are defined on both caller and callee modules.",
                 fn_name, a->self.name);
        if (!remote) {
            call_failed(a, in->peer, &in->header, "AttributeError", msg);
            goto out;
        }
        TD_LOG_ERROR("On WorkerInfo(id=%lld, name=%s):\nAttributeError('%s')", (long long)a->self.id, a->self.name, msg);
        result_f = td_future_new();
        td_future_set_typed_error(result_f, TD_ERR_REMOTE, "AttributeError", "%s", msg);
        goto reply;
    }
    td_rpc_call call = {.agent = a, .caller = a->peers[in->peer].info, .arg = rf.arg};
    if (prof)
        prof_previous = rpc_prof_serve_enter(prof);
    if (rf.async_fn) {
        result_f = rf.async_fn(&call, args, kwargs);
        if (prof)
            rpc_prof_serve_exit(prof_previous);
        if (ag_scope) {
            ag->serve_exit(ag_scope);
            ag_scope = NULL;
        }
        if (!result_f) {
            if (!remote) {
                call_failed_now(a, in->peer, &in->header);
                goto out;
            }
            result_f = failed_now();
        }
    } else {
        td_value *result = NULL;
        st = rf.fn(&call, args, kwargs, &result);
        if (prof)
            rpc_prof_serve_exit(prof_previous);
        if (ag_scope) {
            ag->serve_exit(ag_scope);
            ag_scope = NULL;
        }
        if (!remote) {
            if (st == TD_OK)
                reply_value(a, in->peer, &in->header, result, prof);
            else
                call_failed_now(a, in->peer, &in->header);
            td_value_release(result);
            goto out;
        }
        result_f = st == TD_OK ? td_future_completed(result) : failed_now();
    }
reply:
    if (remote) {
        result_f = rpc_rref_remote_result(in->rref, result_f); /* the owner RRef takes the result */
        in->rref = NULL;
    }
    reply_when_done(a, in->peer, &in->header, result_f, prof);
out:
    if (ag_scope)
        ag->serve_exit(ag_scope);
    rpc_prof_release(prof);
    td_rref_release(in->rref);
    td_future_release(confirmed);
    td_value_release(live);
    td_value_release(payload);
    atomic_fetch_sub(&a->server_active, 1);
    rpc_agent_release(a);
    free(in);
}

void rpc_agent_deliver(td_rpc_agent *a, int peer, const rpc_header *h, td_storage *payload)
{
    switch (h->type) {
    case RPC_MSG_CALL: {
        incoming *in = TD_NEW(incoming);
        if (h->flags & RPC_FLAG_RREF)
            in->rref = rpc_rref_remote_arrived(a, peer, h); /* before any later message of that peer runs */
        rpc_agent_retain(a);
        in->agent = a;
        in->peer = peer;
        in->header = *h;
        in->payload = payload;
        /* A worker that finished joining may call one still joining, whose table of workers
         * (names, channels) is not complete yet: such calls wait, without a thread, until it is. */
        pthread_mutex_lock(&a->mu);
        bool park = !a->ready;
        if (park) {
            in->next = a->early;
            a->early = in;
        }
        pthread_mutex_unlock(&a->mu);
        if (!park && rpc_pool_submit(&a->pool, run_call, drop_call, in) != TD_OK)
            drop_call(in);
        return;
    }
    case RPC_MSG_REPLY:
    case RPC_MSG_ERROR:
        complete_reply(a, peer, h, payload);
        return;
    default:
        td_storage_release(payload); /* control messages: none is expected after the hello */
        return;
    }
}

/* ---- membership ----------------------------------------------------------------------------- */

static void agent_teardown(td_rpc_agent *a)
{
    if (a->torn_down)
        return;
    a->torn_down = true;
    pthread_mutex_lock(&a->mu);
    atomic_store(&a->closing, true);
    incoming *early = a->early; /* calls that came while a failed create was joining */
    a->early = NULL;
    pthread_mutex_unlock(&a->mu);
    while (early) {
        incoming *next = early->next;
        drop_call(early);
        early = next;
    }
    rpc_io_stop(a);
    char msg[256];
    snprintf(msg, sizeof msg, "RPC agent %s shut down before the call completed", a->self.name);
    fail_pending(a, -1, TD_ERR_CLOSED, msg);
    rpc_pool_stop(&a->pool);
    rpc_rref_ctx_clear(a); /* the RRefs it holds hold the agent */
    rpc_io_close(a);
    if (a->executor_held) {
        a->executor_held = false;
        executor_release();
    }
    td_store_release(a->store);
    a->store = NULL;
}

static uint64_t random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v)
        v = (uint64_t)clock_now_ns() ^ ((uint64_t)getpid() << 32);
    return v ? v : 1;
}

static td_status check_static_flag(td_store *base, bool is_static);

static td_status open_store(const char *name, int rank, int world_size, const td_rpc_options *o,
                            int64_t join_timeout_ms, td_store **out)
{
    td_store *base = NULL;
    td_status st = TD_OK;
    if (o->store) {
        base = td_store_retain(o->store);
    } else {
        /* A dynamic group meets as PyTorch's world_size=None: a store with no fixed size. */
        int want = world_size < 0 ? 0 : world_size, r = rank, ws = want;
        TD_TRY(td_rendezvous(o->init_method ? o->init_method : "env://", rank, want, join_timeout_ms, &base, &r, &ws));
        if (r != rank || ws != want) {
            td_store_release(base);
            return error_fmt(TD_ERR_INVALID, "RPC worker %s: the rendezvous gave rank %d of %d, not %d of %d", name, r,
                             ws, rank, world_size);
        }
    }
    /* The world's namespace: this worker's n-th agent over this store. Every worker of a world has
     * made as many before over the same store, so they agree without talking, also when the workers
     * are threads of one process sharing a store. */
    st = check_static_flag(base, world_size >= 0);
    if (st == TD_OK && world_size < 0) {
        /* One namespace for the group's life: members come and go, and leave their keys behind
         * only when they die. */
        st = td_prefix_store_create("rpc_dynamic", base, out);
        td_store_release(base);
        return st;
    }
    if (st != TD_OK) {
        td_store_release(base);
        return st;
    }
    char key[64], prefix[64];
    snprintf(key, sizeof key, "rpc_generation/%d", rank);
    int64_t n = 0;
    st = td_store_add(base, key, 1, &n);
    if (st != TD_OK) {
        td_store_release(base);
        return error_prefix(st, "RPC worker %s", name);
    }
    snprintf(prefix, sizeof prefix, "rpc_prefix_%lld", (long long)n);
    st = td_prefix_store_create(prefix, base, out);
    td_store_release(base);
    return st;
}

/* A worker's entry in the store, "worker/<id>": "name addr host unix_name nonce" (docs/rpc.md). */
typedef struct worker_entry {
    td_worker_info info;
    char addr[300], host[192], uname[96];
    uint64_t nonce;
} worker_entry;

static td_status entry_publish(td_rpc_agent *a, const char *addr, const char *unix_name)
{
    char key[64], entry[1024];
    snprintf(key, sizeof key, "worker/%lld", (long long)a->self.id);
    snprintf(entry, sizeof entry, "%s %s %s %s %016" PRIx64, a->self.name, addr, a->host_id[0] ? a->host_id : "-",
             unix_name, a->nonce);
    return td_store_set_str(a->store, key, entry);
}

/* Parses worker id's entry v (a NUL-terminated store value). */
static td_status entry_parse(const char *v, int id, worker_entry *out)
{
    char name[TD_RPC_MAX_NAME + 1];
    unsigned long long nonce = 0;
    if (sscanf(v, "%128s %299s %191s %95s %llx", name, out->addr, out->host, out->uname, &nonce) != 5)
        return error_fmt(TD_ERR_INVALID, "RPC worker id %d's entry in the store is malformed", id);
    out->nonce = nonce;
    return td_worker_info_make(name, id, &out->info);
}

/* Publishes this worker and reads everyone's entry; fills peers and connects to the higher ids. */
static td_status meet(td_rpc_agent *a, const char *addr, const char *unix_name, int64_t join_timeout_ms)
{
    int n = a->world_size;
    TD_TRY(entry_publish(a, addr, unix_name));

    char **keys = TD_NEW_ARRAY(char *, n);
    void **values = TD_NEW_ARRAY(void *, n);
    size_t *lens = TD_NEW_ARRAY(size_t, n);
    worker_entry *ents = TD_NEW_ARRAY(worker_entry, n);
    for (int i = 0; i < n; i++)
        keys[i] = alloc_printf("worker/%d", i);
    td_status st = td_store_wait(a->store, (const char *const *)keys, (size_t)n,
                                 join_timeout_ms == 0 ? TD_STORE_NO_TIMEOUT : join_timeout_ms);
    if (st != TD_OK)
        st = error_prefix(st, "RPC worker %s waiting for the other workers to join", a->self.name);
    if (st == TD_OK)
        st = td_store_multi_get(a->store, (const char *const *)keys, (size_t)n, values, lens);
    for (int i = 0; st == TD_OK && i < n; i++)
        st = entry_parse(values[i], i, &ents[i]);
    /* The I/O thread reads the table (naming peers that fail) from now on. */
    pthread_mutex_lock(&a->mu);
    for (int i = 0; st == TD_OK && i < n; i++) {
        a->peers[i].info = ents[i].info;
        a->peers[i].member = true;
    }
    pthread_mutex_unlock(&a->mu);
    for (int i = 0; st == TD_OK && i < n; i++)
        for (int j = i + 1; st == TD_OK && j < n; j++)
            if (strcmp(a->peers[i].info.name, a->peers[j].info.name) == 0)
                st = error_fmt(TD_ERR_INVALID,
                               "RPC worker name %s is not unique. Workers %d and %d share the same name.",
                               a->peers[i].info.name, i, j);
    int64_t deadline = deadline_after_ms(join_timeout_ms);
    for (int j = (int)a->self.id + 1; st == TD_OK && j < n; j++)
        st = rpc_io_connect(a, j, ents[j].addr, ents[j].host, ents[j].uname, ents[j].nonce, deadline, NULL);
    if (st == TD_OK) {
        int64_t wait_start = clock_now_ns();
        char refused[sizeof a->peers[0].auth_reason] = "";
        pthread_mutex_lock(&a->mu);
        while (a->connected < n - 1 && !refused[0]) {
            bool lost = false;
            int64_t wake = deadline;
            for (int i = 0; i < n; i++) {
                lost |= a->peers[i].lost;
                if (a->peers[i].chan || !a->peers[i].auth_refused_ns)
                    continue;
                int64_t since = a->peers[i].auth_refused_ns > wait_start ? a->peers[i].auth_refused_ns : wait_start;
                int64_t end = since + (int64_t)RPC_AUTH_GRACE_MS * 1000000;
                if (clock_now_ns() >= end)
                    snprintf(refused, sizeof refused, "%s", a->peers[i].auth_reason);
                else if (end < wake)
                    wake = end;
            }
            if (lost || refused[0])
                break;
            if (!thread_cond_wait_until(&a->cv, &a->mu, wake) && wake == deadline)
                break;
        }
        int connected = a->connected;
        pthread_mutex_unlock(&a->mu);
        if (connected < n - 1 && refused[0])
            st = error_fmt(TD_ERR_INVALID, "RPC worker %s: %s", a->self.name, refused);
        else if (connected < n - 1)
            st = error_fmt(TD_ERR_TIMEOUT, "RPC worker %s: only %d of the %d other workers connected within %lld ms",
                           a->self.name, connected, n - 1, (long long)join_timeout_ms);
    }
    for (int i = 0; i < n; i++) {
        free(keys[i]);
        if (st == TD_OK || values[i])
            free(values[i]);
    }
    free(keys);
    free(values);
    free(lens);
    free(ents);
    return st;
}

/* A spin of the same-host layer's policy (agent_impl.h, "Waiting") with RPC's budget: ranks are
 * counted as that layer counts them, one per worker process (every worker may be on this host),
 * since the spinning threads of one worker mostly take turns along a round trip. */
static td_status spin_init(samehost_spin *s, int ranks)
{
    TD_TRY(samehost_spin_init(s, ranks));
    int64_t us = RPC_SPIN_US_DEFAULT;
    TD_TRY(env_get_int("TDIST_RPC_SPIN_US", RPC_SPIN_US_DEFAULT, 0, 1000000, &us));
    s->spin_ns = us * 1000;
    return TD_OK;
}

static bool drain_local(td_rpc_agent *a, int64_t deadline);

/* ---- dynamic groups ------------------------------------------------------------------------- */

#define RPC_TOKEN_KEY "RpcGroupManagementToken"
#define RPC_JOIN_FN "tdist::rpc_join"
#define RPC_LEAVE_FN "tdist::rpc_leave"

/* A group is static or dynamic for good: the first worker sets "rpcIsStaticGroup" by
 * compare-and-set, so that a worker of the other kind fails however the two race. */
static td_status check_static_flag(td_store *base, bool is_static)
{
    const char *want = is_static ? "true" : "false";
    void *v = NULL;
    size_t len = 0;
    TD_TRY(td_store_compare_set(base, "rpcIsStaticGroup", "", 0, want, strlen(want), &v, &len));
    bool same = len == strlen(want) && memcmp(v, want, len) == 0;
    char got[16];
    snprintf(got, sizeof got, "%.*s", (int)(len < 15 ? len : 15), (const char *)v);
    free(v);
    if (same)
        return TD_OK;
    /* Upstream's argument order: this worker's property first, then the group's. */
    return error_fmt(TD_ERR_INVALID,
                     "RPC group mixes statically and dynamically initialized members which is not supported. Static "
                     "group property is initialized as %s and is trying to be set as %s ",
                     want, got);
}

/* Takes the group's token ("Token_for_<name>_<what>"), waiting while another worker holds it. */
static td_status token_take(td_rpc_agent *a, const char *what, int64_t timeout_ms)
{
    char mine[TD_RPC_MAX_NAME + 32];
    snprintf(mine, sizeof mine, "Token_for_%s_%s", a->self.name, what);
    int64_t deadline = deadline_after_ms(timeout_ms);
    for (;;) {
        void *v = NULL;
        size_t len = 0;
        TD_TRY(td_store_compare_set(a->store, RPC_TOKEN_KEY, "", 0, mine, strlen(mine), &v, &len));
        bool got = len == strlen(mine) && memcmp(v, mine, len) == 0;
        free(v);
        if (got)
            return TD_OK;
        if (deadline_passed(deadline))
            return error_fmt(TD_ERR_TIMEOUT, "RPC worker %s timed out after %lld ms waiting for the group's token to %s",
                             a->self.name, (long long)timeout_ms, what);
        clock_sleep_ms(5);
    }
}

static void token_release(td_rpc_agent *a)
{
    if (td_store_delete_key(a->store, RPC_TOKEN_KEY, NULL) != TD_OK)
        TD_LOG_ERROR("RPC agent %s: cannot release the group's token: %s", a->self.name, td_last_error());
}

/* The ids in the store's member list (under the token). */
static td_status members_read(td_rpc_agent *a, int *ids, int *n)
{
    *n = 0;
    const char *key = "members";
    bool ready = false;
    TD_TRY(td_store_check(a->store, &key, 1, &ready));
    if (!ready)
        return TD_OK;
    void *v = NULL;
    size_t len = 0;
    TD_TRY(td_store_get(a->store, key, &v, &len));
    const char *p = v;
    char *end;
    for (;;) {
        long id = strtol(p, &end, 10);
        if (end == p)
            break;
        if (id >= 0 && id < RPC_DYNAMIC_MAX_ID && *n < RPC_DYNAMIC_MAX_ID)
            ids[(*n)++] = (int)id;
        p = end;
    }
    free(v);
    return TD_OK;
}

static td_status members_write(td_rpc_agent *a, const int *ids, int n)
{
    td_buf b = TD_BUF_INIT;
    for (int i = 0; i < n; i++)
        buf_printf(&b, "%s%d", i ? " " : "", ids[i]);
    td_status st = td_store_set(a->store, "members", b.data ? b.data : "", b.len);
    buf_free(&b);
    return st;
}

/* A member's join call: the newcomer (whose hello bound its channel) enters this worker's table. */
static td_status fn_member_join(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)kwargs;
    (void)result;
    td_rpc_agent *a = call->agent;
    const td_value *p[2];
    TD_TRY(td_rpc_bind(RPC_JOIN_FN, "name,id", args, kwargs, p));
    int64_t id = td_value_get_int(p[1]);
    td_worker_info info;
    TD_TRY(td_worker_info_make(td_value_get_string(p[0], NULL), id, &info));
    if (!a->dynamic || id < 0 || id >= a->world_size || id == a->self.id)
        return error_fmt(TD_ERR_INVALID, "worker %s cannot join with id %lld", info.name, (long long)id);
    pthread_mutex_lock(&a->mu);
    a->peers[id].info = info;
    a->peers[id].member = true;
    pthread_mutex_unlock(&a->mu);
    TD_LOG_INFO("RPC agent %s: worker %s (id %lld) joined", a->self.name, info.name, (long long)id);
    return TD_OK;
}

/* A member's leave call: it has no call in flight; later calls to it fail as to an unknown worker. */
static td_status fn_member_leave(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)args;
    (void)kwargs;
    (void)result;
    td_rpc_agent *a = call->agent;
    int64_t id = call->caller.id;
    if (!a->dynamic || id < 0 || id >= a->world_size || id == a->self.id)
        return error_fmt(TD_ERR_INVALID, "worker %s cannot leave a static group", call->caller.name);
    pthread_mutex_lock(&a->mu);
    a->peers[id].member = false;
    pthread_mutex_unlock(&a->mu);
    TD_LOG_INFO("RPC agent %s: worker %s (id %lld) left", a->self.name, call->caller.name, (long long)id);
    return TD_OK;
}

static void register_group_functions(void)
{
    td_rpc_register(RPC_JOIN_FN, fn_member_join, NULL);
    td_rpc_register(RPC_LEAVE_FN, fn_member_leave, NULL);
}

/* Joins a dynamic group under its token: reads the members, checks this worker's name and id
 * against theirs, publishes itself, connects to every member and tells each (a call that returns
 * once the member knows this worker), then releases the token. A member that cannot be reached
 * (it died without leaving) stays in the table as lost. */
static td_status dynamic_join(td_rpc_agent *a, const char *addr, const char *unix_name, int64_t timeout_ms)
{
    TD_TRY(token_take(a, "join", timeout_ms));
    int *ids = TD_NEW_ARRAY(int, RPC_DYNAMIC_MAX_ID + 1);
    int n = 0;
    char key[64];
    worker_entry *ents = TD_NEW_ARRAY(worker_entry, RPC_DYNAMIC_MAX_ID);
    td_status st = members_read(a, ids, &n);
    for (int k = 0; st == TD_OK && k < n; k++) {
        int id = ids[k];
        snprintf(key, sizeof key, "worker/%d", id);
        void *v = NULL;
        size_t len = 0;
        st = td_store_get(a->store, key, &v, &len);
        if (st != TD_OK)
            break;
        st = entry_parse(v, id, &ents[id]);
        free(v);
        const char *name = ents[id].info.name;
        if (st == TD_OK && id == a->self.id)
            st = error_fmt(TD_ERR_INVALID, "RPC worker id %d is already taken by worker %s", id, name);
        if (st == TD_OK && strcmp(name, a->self.name) == 0)
            st = error_fmt(TD_ERR_INVALID, "RPC worker name %s is not unique. Workers %d and %lld share the same name.",
                           name, id, (long long)a->self.id);
        if (st == TD_OK) {
            pthread_mutex_lock(&a->mu);
            a->peers[id].info = ents[id].info;
            a->peers[id].member = true;
            pthread_mutex_unlock(&a->mu);
        }
    }
    if (st == TD_OK)
        st = entry_publish(a, addr, unix_name);
    if (st == TD_OK) {
        ids[n] = (int)a->self.id;
        st = members_write(a, ids, n + 1);
    }
    if (st == TD_OK) {
        pthread_mutex_lock(&a->mu);
        a->peers[a->self.id].member = true;
        pthread_mutex_unlock(&a->mu);
        /* Members listen before they publish: a connection that does not come at once is to one
         * that died without leaving, and must not hold the token long. */
        int64_t deadline = deadline_after_ms(timeout_ms == 0 || timeout_ms > RPC_DYNAMIC_CONNECT_MS
                                                 ? RPC_DYNAMIC_CONNECT_MS
                                                 : timeout_ms);
        td_value *args = td_value_tuple_of(2, td_value_string(a->self.name), td_value_int(a->self.id));
        for (int k = 0; k < n; k++) {
            int id = ids[k];
            bool auth_refused = false;
            td_status cs = rpc_io_connect(a, id, ents[id].addr, ents[id].host, ents[id].uname, ents[id].nonce, deadline,
                                          &auth_refused);
            if (auth_refused) {
                /* Not a member that died: this worker's secret is not the group's. */
                st = cs;
                break;
            }
            if (cs == TD_OK)
                cs = td_rpc_sync(a, td_rpc_to_id(id), RPC_JOIN_FN, args, NULL, timeout_ms, NULL);
            if (cs != TD_OK) {
                TD_LOG_WARN("RPC agent %s: member %s (id %d) is unreachable: %s", a->self.name,
                            a->peers[id].info.name, id, td_last_error());
                pthread_mutex_lock(&a->mu);
                if (!a->peers[id].lost) {
                    a->peers[id].lost = true;
                    snprintf(a->peers[id].lost_reason, sizeof a->peers[id].lost_reason, "unreachable when %s joined",
                             a->self.name);
                }
                pthread_mutex_unlock(&a->mu);
            }
        }
        td_value_release(args);
        if (st != TD_OK) {
            /* Refused for its secret: out of the group again, so that later newcomers do not
             * count it as a member that died (the error stays the refusal's). */
            char msg[TD_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", td_last_error());
            snprintf(key, sizeof key, "worker/%lld", (long long)a->self.id);
            if (members_write(a, ids, n) != TD_OK || td_store_delete_key(a->store, key, NULL) != TD_OK)
                TD_LOG_WARN("RPC agent %s: cannot take itself out of the group: %s", a->self.name, td_last_error());
            st = error_set(st, msg);
        }
    }
    token_release(a);
    free(ids);
    free(ents);
    return st;
}

/* A dynamic member's graceful leave: under the token, once this worker has no call in flight, tells
 * every member (each drops it from its table before replying), removes itself from the store. */
static td_status dynamic_leave(td_rpc_agent *a, int64_t timeout_ms)
{
    int64_t deadline = deadline_after_ms(timeout_ms);
    rpc_rref_shutdown_users(a, deadline);
    TD_TRY(token_take(a, "leave", timeout_ms));
    pthread_mutex_lock(&a->mu);
    bool idle = drain_local(a, deadline);
    int *others = TD_NEW_ARRAY(int, a->world_size);
    int nothers = 0;
    for (int i = 0; i < a->world_size; i++)
        if (i != a->self.id && a->peers[i].member && !a->peers[i].lost)
            others[nothers++] = i;
    pthread_mutex_unlock(&a->mu);
    td_status st = TD_OK;
    if (!idle)
        st = error_fmt(TD_ERR_TIMEOUT,
                       "RPC worker %s timed out after %lld ms waiting for its calls in flight to end before leaving",
                       a->self.name, (long long)timeout_ms);
    for (int k = 0; st == TD_OK && k < nothers; k++)
        if (td_rpc_sync(a, td_rpc_to_id(others[k]), RPC_LEAVE_FN, NULL, NULL, timeout_ms, NULL) != TD_OK)
            TD_LOG_WARN("RPC agent %s: telling worker id %d that it leaves failed: %s", a->self.name, others[k],
                        td_last_error());
    free(others);
    if (st == TD_OK) {
        int *ids = TD_NEW_ARRAY(int, RPC_DYNAMIC_MAX_ID);
        int n = 0, kept = 0;
        st = members_read(a, ids, &n);
        for (int k = 0; k < n; k++)
            if (ids[k] != a->self.id)
                ids[kept++] = ids[k];
        if (st == TD_OK)
            st = members_write(a, ids, kept);
        free(ids);
        char key[64];
        snprintf(key, sizeof key, "worker/%lld", (long long)a->self.id);
        if (st == TD_OK)
            st = td_store_delete_key(a->store, key, NULL);
    }
    char msg[TD_ERROR_MAX];
    snprintf(msg, sizeof msg, "%s", st == TD_OK ? "" : td_last_error());
    token_release(a);
    return st == TD_OK ? TD_OK : error_set(st, msg);
}

/* Makes a the default agent (td_rpc_init's), before it runs the calls that came while joining:
 * a function one of them runs may itself call through the default agent, as PyTorch's agent is
 * current before it starts serving. */
static void default_publish(td_rpc_agent *a)
{
    pthread_mutex_lock(&default_mu);
    default_starting = false;
    default_agent = a;
    pthread_mutex_unlock(&default_mu);
}

/* td_rpc_agent_create; as_default: td_rpc_init's agent, published before it serves (above). */
static td_status agent_create(const char *name, int rank, int world_size, const td_rpc_options *options,
                              bool as_default, td_rpc_agent **agent)
{
    *agent = NULL;
    td_rpc_options o;
    if (options)
        o = *options;
    else
        td_rpc_options_init(&o);
    td_worker_info self;
    TD_TRY(td_worker_info_make(name, rank, &self));
    bool dynamic = world_size < 0;
    if (dynamic && rank < 0) {
        /* As PyTorch: the rank comes from the init URL or the environment, else the rendezvous's
         * own message ("... rank parameter missing"); no store is opened to learn it. */
        if (o.store)
            return error_fmt(TD_ERR_INVALID, "RPC worker %s: a dynamic group needs the worker's rank", name);
        TD_TRY(store_rendezvous_rank(o.init_method ? o.init_method : "env://", &rank));
        TD_TRY(td_worker_info_make(name, rank, &self));
    }
    if (dynamic && rank >= RPC_DYNAMIC_MAX_ID)
        return error_fmt(TD_ERR_INVALID, "RPC worker %s: the id of a dynamic group's member must be below %d, got %d",
                         name, RPC_DYNAMIC_MAX_ID, rank);
    if (dynamic)
        world_size = RPC_DYNAMIC_MAX_ID;
    if (world_size == 0)
        return error_fmt(TD_ERR_INVALID, "world_size must be positive, got 0");
    if (rank > INT16_MAX)
        return error_fmt(TD_ERR_INVALID, "RPC worker id %d out of bound of int16_t.", rank);
    if (rank < 0 || rank >= world_size)
        return error_fmt(TD_ERR_INVALID, "RPC worker %s: rank %d is out of range for a world of %d workers", name, rank,
                         world_size);
    if (o.rpc_timeout_ms < 0)
        return error_fmt(TD_ERR_INVALID, "rpc_timeout_ms must be >= 0 (0: no timeout), got %lld",
                         (long long)o.rpc_timeout_ms);
    if (o.num_worker_threads < 1)
        return error_fmt(TD_ERR_INVALID, "num_worker_threads must be >= 1, got %d", o.num_worker_threads);
    if (o.store && o.init_method)
        return error_fmt(TD_ERR_INVALID, "Cannot specify both init_method and store.");
    uint64_t max_payload = RPC_MAX_PAYLOAD_DEFAULT;
    const char *max_env = env_get_str("TDIST_RPC_MAX_PAYLOAD", NULL);
    if (max_env) {
        TD_TRY(env_parse_size("TDIST_RPC_MAX_PAYLOAD", max_env, &max_payload));
        if (max_payload < 1024)
            return error_fmt(TD_ERR_INVALID, "TDIST_RPC_MAX_PAYLOAD must be at least 1K, got %s", max_env);
    }

    /* TDIST_RPC_CMA: single copy between workers of one host, for payload parts of 256 KiB and up. */
    int64_t cma = 1;
    TD_TRY(env_get_int("TDIST_RPC_CMA", 1, 0, 1, &cma));

    /* TDIST_RPC_CMA_SHARE: a sender of pieces helps its reader copy them (channel.c). */
    int64_t share_on = 1;
    TD_TRY(env_get_int("TDIST_RPC_CMA_SHARE", 1, 0, 1, &share_on));

    /* TDIST_RPC_LANES: same-host messages through lanes in the shared segment (channel.c). */
    int64_t lanes_on = 1;
    TD_TRY(env_get_int("TDIST_RPC_LANES", 1, 0, 1, &lanes_on));
    int64_t hand_on = 1;
    TD_TRY(env_get_int("TDIST_RPC_HAND_SENDS", 1, 0, 1, &hand_on));

    auth_key auth;
    TD_TRY(auth_key_init(NULL, &auth));

    td_rpc_agent *a = TD_NEW(td_rpc_agent);
    a->auth = auth;
    explicit_bzero(&auth, sizeof auth);
    ref_init(&a->ref);
    thread_mutex_init(&a->mu);
    thread_cond_init(&a->cv);
    a->self = self;
    a->world_size = world_size;
    a->dynamic = dynamic;
    a->peers = TD_NEW_ARRAY(rpc_peer, world_size);
    atomic_init(&a->default_timeout_ms, o.rpc_timeout_ms);
    a->tcp_only = o.tcp_only;
    a->piece_min = cma ? RPC_PIECE_MIN_DEFAULT : 0;
    a->lanes_on = lanes_on != 0;
    a->share_on = share_on != 0;
    a->hand_on = hand_on != 0;
    a->ignore_rref_leak = o.ignore_rref_leak;
    a->rrefs = rpc_rref_ctx_new();
    a->max_payload = max_payload;
    a->nonce = random_u64();
    host_identity(a->host_id, sizeof a->host_id);
    a->tcp_listen_fd = a->unix_listen_fd = a->epoll_fd = a->wake_fd = -1;
    a->pending = (td_map)TD_MAP_INIT;
    a->gather_seqs = (td_map)TD_MAP_INIT;
    a->next_deadline_ns = TD_DEADLINE_NONE;
    atomic_init(&a->next_call_id, 1);
    rpc_pool_init(&a->pool, o.num_worker_threads);
    a->pool.lanes = a;
    /* A dynamic group's size is unknown: its table's size counts, so its waiters yield while they
     * spin, as when the workers outnumber the cores. */
    td_status spin_st = spin_init(&a->pool.spin, world_size);
    if (spin_st == TD_OK)
        spin_st = spin_init(&a->spin_io, world_size);
    if (spin_st == TD_OK)
        spin_st = spin_init(&a->spin_call, world_size);
    if (spin_st == TD_OK)
        spin_st = spin_init(&a->spin_acked, world_size);
    a->generation = atomic_fetch_add(&agent_generation, 1);
    a->peers[rank].info = self;

    /* Joining waits for the slowest worker to start: never less than a minute unless unbounded. */
    int64_t join_timeout_ms = o.rpc_timeout_ms == 0 ? 0 : (o.rpc_timeout_ms > 60000 ? o.rpc_timeout_ms : 60000);
    rpc_builtins_register();
    dist_ag_install();
    char addr[300], unix_name[96];
    td_status st = spin_st;
    if (st == TD_OK)
        st = executor_hold();
    a->executor_held = st == TD_OK;
    if (st == TD_OK)
        st = open_store(name, rank, dynamic ? -1 : world_size, &o, join_timeout_ms, &a->store);
    if (st == TD_OK)
        st = rpc_io_open(a, o.listen_host, addr, sizeof addr, unix_name, sizeof unix_name);
    if (st == TD_OK)
        st = rpc_io_start(a);
    if (st == TD_OK && dynamic) {
        register_group_functions();
        st = dynamic_join(a, addr, unix_name, join_timeout_ms);
    } else if (st == TD_OK) {
        st = meet(a, addr, unix_name, join_timeout_ms);
    }
    if (st != TD_OK) {
        char msg[TD_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", td_last_error());
        agent_teardown(a);
        rpc_agent_release(a);
        return error_set(st, msg);
    }
    /* Before any other thread can reach the agent (default_publish, the calls below). */
    pthread_mutex_lock(&default_mu);
    for (int i = 0; i < DRIVEN_AGENTS && a->lanes_on && !a->driven; i++)
        if (!driven_agents[i]) {
            driven_agents[i] = a;
            a->driven = true;
        }
    pthread_mutex_unlock(&default_mu);
    if (as_default)
        default_publish(a);
    /* The calls that came while joining go to the pool in their order, and before any that comes
     * after: the agent is ready once none is left (those that come meanwhile join the list). */
    for (;;) {
        pthread_mutex_lock(&a->mu);
        incoming *early = a->early;
        a->early = NULL;
        a->ready = early == NULL;
        pthread_mutex_unlock(&a->mu);
        if (!early)
            break;
        incoming *ordered = NULL;
        while (early) {
            incoming *next = early->next;
            early->next = ordered;
            ordered = early;
            early = next;
        }
        while (ordered) {
            incoming *next = ordered->next;
            if (rpc_pool_submit(&a->pool, run_call, drop_call, ordered) != TD_OK)
                drop_call(ordered);
            ordered = next;
        }
    }
    if (dynamic)
        TD_LOG_INFO("RPC agent %s (id %d, dynamic group) is up", name, rank);
    else
        TD_LOG_INFO("RPC agent %s (id %d of %d) is up", name, rank, world_size);
    *agent = a;
    return TD_OK;
}

td_status td_rpc_agent_create(const char *name, int rank, int world_size, const td_rpc_options *options,
                              td_rpc_agent **agent)
{
    if (!agent)
        return error_fmt(TD_ERR_INVALID, "td_rpc_agent_create: agent is NULL");
    return agent_create(name, rank, world_size, options, false, agent);
}

/* ---- graceful shutdown ---------------------------------------------------------------------- */

/* Waits until this worker has no call in flight (a->mu held). */
static bool wait_local_idle(td_rpc_agent *a, int64_t deadline)
{
    while (a->client_active > 0)
        if (!thread_cond_wait_until(&a->cv, &a->mu, deadline))
            return a->client_active == 0;
    return true;
}

/* As wait_local_idle, then flushes the executor (a callback queued there may still make a call;
 * a->mu is released meanwhile) and waits again: whether this worker is idle. a->mu held. */
static bool drain_local(td_rpc_agent *a, int64_t deadline)
{
    wait_local_idle(a, deadline);
    pthread_mutex_unlock(&a->mu);
    executor_flush();
    pthread_mutex_lock(&a->mu);
    return wait_local_idle(a, deadline);
}

/* Waits until key (worker i's) exists; *ready stays false when worker i was lost meanwhile, or,
 * when stopped is not NULL, when another worker already ended the rounds (*stopped set). */
static td_status await_key(td_rpc_agent *a, int i, const char *key, int64_t deadline, int64_t timeout_ms, bool *ready,
                           bool *stopped)
{
    static const char stop_key[] = "join/stop";
    for (;;) {
        TD_TRY(td_store_check(a->store, &key, 1, ready));
        if (*ready)
            return TD_OK;
        if (stopped) {
            const char *k = stop_key;
            TD_TRY(td_store_check(a->store, &k, 1, stopped));
            if (*stopped)
                return TD_OK;
        }
        pthread_mutex_lock(&a->mu);
        bool lost = a->peers[i].lost;
        pthread_mutex_unlock(&a->mu);
        if (lost)
            return TD_OK; /* a dead worker has nothing in flight */
        if (deadline_passed(deadline))
            return error_fmt(TD_ERR_TIMEOUT,
                             "Failed to respond to 'Shutdown Proceed' in time, got error: worker %s timed out after "
                             "%lld ms waiting for worker %s to shut down",
                             a->self.name, (long long)timeout_ms, a->peers[i].info.name);
        clock_sleep_ms(2);
    }
}

static td_status graceful_join(td_rpc_agent *a, int64_t timeout_ms)
{
    int n = a->world_size;
    int64_t deadline = deadline_after_ms(timeout_ms);
    int64_t prev_started = -1, prev_done = -1;
    char key[64], val[64];
    bool stopped = false;
    for (int round = 0;; round++) {
        if (round > 0 && deadline_passed(deadline))
            return error_fmt(TD_ERR_TIMEOUT,
                             "Failed to respond to 'Shutdown Proceed' in time, got error: worker %s timed out after "
                             "%lld ms waiting for the calls in flight to end",
                             a->self.name, (long long)timeout_ms);
        pthread_mutex_lock(&a->mu);
        drain_local(a, deadline);
        int64_t started = a->calls_started, done = a->calls_done;
        pthread_mutex_unlock(&a->mu);
        snprintf(key, sizeof key, "join/%d/%lld", round, (long long)a->self.id);
        snprintf(val, sizeof val, "%lld %lld", (long long)started, (long long)done);
        TD_TRY(td_store_set_str(a->store, key, val));
        int64_t sum_started = 0, sum_done = 0;
        for (int i = 0; i < n; i++) {
            snprintf(key, sizeof key, "join/%d/%d", round, i);
            const char *k = key;
            bool ready = false;
            TD_TRY(await_key(a, i, k, deadline, timeout_ms, &ready, &stopped));
            if (stopped)
                break;
            if (!ready)
                continue;
            void *v = NULL;
            size_t len = 0;
            TD_TRY(td_store_get(a->store, k, &v, &len));
            long long s = 0, d = 0;
            if (sscanf(v, "%lld %lld", &s, &d) == 2) {
                sum_started += s;
                sum_done += d;
            }
            free(v);
        }
        /* After the first round (the barrier: every worker's work is done), the user RRefs still
         * held are deleted; later rounds wait for those deletes like any call. */
        if (stopped)
            break;
        if (round == 0)
            rpc_rref_shutdown_users(a, deadline);
        if (sum_started == sum_done && sum_started == prev_started && sum_done == prev_done) {
            /* Every worker that reads this stops at its round too: a worker that saw a lost peer's
             * key in one round and not in another would otherwise wait for a round nobody posts. */
            TD_TRY(td_store_set_str(a->store, "join/stop", "1"));
            break;
        }
        prev_started = sum_started;
        prev_done = sum_done;
    }
    /* Worker 0 often hosts the store (tcp://, env://): it leaves last, so that no worker still
     * reading the last round finds the store gone. */
    snprintf(key, sizeof key, "left/%lld", (long long)a->self.id);
    TD_TRY(td_store_set_str(a->store, key, "1"));
    for (int i = 1; a->self.id == 0 && i < n; i++) {
        snprintf(key, sizeof key, "left/%d", i);
        bool ready = false;
        TD_TRY(await_key(a, i, key, deadline, timeout_ms, &ready, NULL));
    }
    return TD_OK;
}

/* Shutdown waits for the pool's threads and the executor's callbacks to finish, so it cannot run
 * on one of them. */
static td_status check_shutdown_thread(const td_rpc_agent *agent)
{
    if (rpc_pool_is_current(&agent->pool) || executor_is_current())
        return error_fmt(TD_ERR_INVALID, "RPC shutdown called from %s; shut the agent down from a thread of the "
                                         "application",
                         executor_is_current() ? "a future callback" : "a function the agent is running");
    return TD_OK;
}

/* td_rpc_agent_shutdown; is_default: td_rpc_shutdown's agent, which stays the default agent until
 * the graceful part is over (as PyTorch resets its current agent only then): a function still
 * running for another worker may call through it. */
static td_status agent_shutdown(td_rpc_agent *agent, bool graceful, int64_t timeout_ms, bool is_default)
{
    td_status st = TD_OK;
    char msg[TD_ERROR_MAX] = "";
    if (graceful) {
        st = agent->dynamic ? dynamic_leave(agent, timeout_ms < 0 ? 0 : timeout_ms)
                            : graceful_join(agent, timeout_ms < 0 ? 0 : timeout_ms);
        if (st == TD_OK)
            st = rpc_rref_leak_check(agent, agent->ignore_rref_leak);
        if (st != TD_OK)
            snprintf(msg, sizeof msg, "%s", td_last_error());
    }
    pthread_mutex_lock(&default_mu);
    if (is_default) {
        default_agent = NULL;
        default_stopping = false;
    }
    for (int i = 0; i < DRIVEN_AGENTS; i++)
        if (driven_agents[i] == agent)
            driven_agents[i] = NULL;
    pthread_mutex_unlock(&default_mu);
    agent_teardown(agent);
    rpc_agent_release(agent);
    return st == TD_OK ? TD_OK : error_set(st, msg);
}

td_status td_rpc_agent_shutdown(td_rpc_agent *agent, bool graceful, int64_t timeout_ms)
{
    if (!agent)
        return td_rpc_shutdown(graceful, timeout_ms); /* NULL: the default agent, as everywhere */
    TD_TRY(check_shutdown_thread(agent));
    return agent_shutdown(agent, graceful, timeout_ms, false);
}

/* ---- the default agent ---------------------------------------------------------------------- */

td_status td_rpc_init(const char *name, int rank, int world_size, const td_rpc_options *o)
{
    pthread_mutex_lock(&default_mu);
    if (default_agent || default_starting) {
        pthread_mutex_unlock(&default_mu);
        return error_fmt(TD_ERR_ALREADY, "RPC is already initialized");
    }
    default_starting = true;
    pthread_mutex_unlock(&default_mu);
    td_rpc_agent *a = NULL;
    td_status st = agent_create(name, rank, world_size, o, true, &a); /* published there on success */
    if (st != TD_OK) {
        pthread_mutex_lock(&default_mu);
        default_starting = false;
        pthread_mutex_unlock(&default_mu);
    }
    return st;
}

td_status td_rpc_shutdown(bool graceful, int64_t timeout_ms)
{
    pthread_mutex_lock(&default_mu);
    td_rpc_agent *a = default_stopping ? NULL : default_agent; /* a second shutdown finds none */
    td_status refused = a ? check_shutdown_thread(a) : TD_OK;
    if (a && refused == TD_OK)
        default_stopping = true;
    pthread_mutex_unlock(&default_mu);
    if (!a)
        return error_set(TD_ERR_NOT_INIT, rpc_not_initialized);
    if (refused != TD_OK)
        return refused;
    return agent_shutdown(a, graceful, timeout_ms, true);
}

td_status td_rpc_set_timeout(td_rpc_agent *agent, int64_t timeout_ms)
{
    if (timeout_ms < 0)
        return error_fmt(TD_ERR_INVALID, "the RPC timeout must be >= 0 ms (0: none), got %lld", (long long)timeout_ms);
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    atomic_store(&a->default_timeout_ms, timeout_ms);
    rpc_agent_release(a);
    return TD_OK;
}

int64_t td_rpc_get_timeout(td_rpc_agent *agent)
{
    td_rpc_agent *a;
    if (rpc_agent_get(agent, &a) != TD_OK)
        return -1;
    int64_t t = atomic_load(&a->default_timeout_ms);
    rpc_agent_release(a);
    return t;
}

/* ---- workers -------------------------------------------------------------------------------- */

static int find_name(const td_rpc_agent *a, const char *name)
{
    for (int i = 0; i < a->world_size; i++)
        if (a->peers[i].member && strcmp(a->peers[i].info.name, name) == 0)
            return i;
    return -1;
}

td_status td_rpc_worker_info(td_rpc_agent *agent, const char *name, td_worker_info *info)
{
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    td_status st = TD_OK;
    pthread_mutex_lock(&a->mu);
    int i = name ? find_name(a, name) : (int)a->self.id;
    if (i >= 0)
        *info = a->peers[i].info;
    pthread_mutex_unlock(&a->mu);
    if (i < 0)
        st = error_fmt(TD_ERR_NOT_FOUND, "name:%s,rank:%lld could not find destination name %s", a->self.name,
                       (long long)a->self.id, name);
    rpc_agent_release(a);
    return st;
}

td_status td_rpc_worker_info_by_id(td_rpc_agent *agent, int64_t id, td_worker_info *info)
{
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    td_status st = TD_OK;
    pthread_mutex_lock(&a->mu);
    bool found = id >= 0 && id < a->world_size && a->peers[id].member;
    if (found)
        *info = a->peers[id].info;
    pthread_mutex_unlock(&a->mu);
    if (!found)
        st = error_fmt(TD_ERR_NOT_FOUND, "name:%s,rank:%lld could not find destination id %lld", a->self.name,
                       (long long)a->self.id, (long long)id);
    rpc_agent_release(a);
    return st;
}

td_status td_rpc_worker_infos(td_rpc_agent *agent, td_worker_info *infos, size_t cap, size_t *n)
{
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    size_t count = 0;
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < a->world_size; i++) {
        if (!a->peers[i].member)
            continue;
        if (count < cap)
            infos[count] = a->peers[i].info;
        count++;
    }
    pthread_mutex_unlock(&a->mu);
    if (n)
        *n = count;
    rpc_agent_release(a);
    return TD_OK;
}

/* The peer a destination names. */
td_status rpc_agent_resolve(td_rpc_agent *a, const td_rpc_dest *to, int *peer)
{
    int i = -1;
    switch (to->kind) {
    case TD_RPC_DEST_NAME:
        pthread_mutex_lock(&a->mu);
        i = to->name ? find_name(a, to->name) : -1;
        pthread_mutex_unlock(&a->mu);
        if (i < 0)
            return error_fmt(TD_ERR_NOT_FOUND, "name:%s,rank:%lld could not find destination name %s", a->self.name,
                             (long long)a->self.id, to->name ? to->name : "(null)");
        break;
    case TD_RPC_DEST_ID:
        pthread_mutex_lock(&a->mu);
        i = to->id >= 0 && to->id < a->world_size && a->peers[to->id].member ? (int)to->id : -1;
        pthread_mutex_unlock(&a->mu);
        if (i < 0)
            return error_fmt(TD_ERR_NOT_FOUND, "name:%s,rank:%lld could not find destination id %lld", a->self.name,
                             (long long)a->self.id, (long long)to->id);
        break;
    case TD_RPC_DEST_INFO:
        pthread_mutex_lock(&a->mu);
        i = find_name(a, to->info.name);
        pthread_mutex_unlock(&a->mu);
        if (i < 0 || i != to->info.id)
            return error_fmt(TD_ERR_NOT_FOUND, "name:%s,rank:%lld could not find destination name %s", a->self.name,
                             (long long)a->self.id, to->info.name);
        break;
    case TD_RPC_DEST_VALUE: {
        const td_value *v = to->value;
        td_value_kind k = v ? td_value_kind_of(v) : TD_VAL_NONE;
        td_rpc_dest d = {0};
        if (k == TD_VAL_STRING) {
            d.kind = TD_RPC_DEST_NAME;
            d.name = td_value_get_string(v, NULL);
        } else if (k == TD_VAL_INT) {
            d.kind = TD_RPC_DEST_ID;
            d.id = td_value_get_int(v);
        } else if (k == TD_VAL_RECORD && td_value_record_tag(v) == TD_REC_WORKER_INFO &&
                   td_worker_info_from_value(v, &d.info) == TD_OK) {
            d.kind = TD_RPC_DEST_INFO;
        } else {
            char *text = v ? td_value_format(v) : NULL;
            td_status st = error_fmt(TD_ERR_INVALID, "Cannot get WorkerInfo from name %s", text ? text : "None");
            free(text);
            return st;
        }
        return rpc_agent_resolve(a, &d, peer);
    }
    default:
        return error_fmt(TD_ERR_INVALID, "unknown destination kind %d", (int)to->kind);
    }
    *peer = i;
    return TD_OK;
}

/* ---- calls ---------------------------------------------------------------------------------- */

static td_status agent_call(td_rpc_agent *a, int peer, const char *fn, const td_value *args, const td_value *kwargs,
                            int64_t timeout_ms, const rpc_header *extra, rpc_prof_mode mode, td_future **future);

/* td_rpc_async, and td_rpc_sync's call: mode names the call in a profile. */
static td_status call_dest(td_rpc_agent *agent, td_rpc_dest to, const char *fn, const td_value *args,
                           const td_value *kwargs, int64_t timeout_ms, rpc_prof_mode mode, td_future **future)
{
    if (!future)
        return error_fmt(TD_ERR_INVALID, "td_rpc_async: future is NULL");
    *future = NULL;
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    int peer = -1;
    td_status st = rpc_agent_resolve(a, &to, &peer);
    if (st == TD_OK)
        st = agent_call(a, peer, fn, args, kwargs, timeout_ms, NULL, mode, future);
    rpc_agent_release(a);
    return st;
}

td_status td_rpc_async(td_rpc_agent *agent, td_rpc_dest to, const char *fn, const td_value *args,
                       const td_value *kwargs, int64_t timeout_ms, td_future **future)
{
    return call_dest(agent, to, fn, args, kwargs, timeout_ms, RPC_PROF_ASYNC, future);
}

td_status rpc_agent_call(td_rpc_agent *a, int peer, const char *fn, const td_value *args, const td_value *kwargs,
                         int64_t timeout_ms, const rpc_header *extra, td_future **future)
{
    /* td_rpc_remote's calls carry the RRef's ids; every other call here is made as by rpc_async. */
    rpc_prof_mode mode = extra && (extra->flags & RPC_FLAG_RREF) ? RPC_PROF_REMOTE : RPC_PROF_ASYNC;
    return agent_call(a, peer, fn, args, kwargs, timeout_ms, extra, mode, future);
}

/* The driver of an asynchronous call's future over a lane (pg/future.h): a thread that waits on
 * it polls the lanes of the process's driven agents itself, as a td_rpc_sync caller does
 * (wait_reply), taking its reply and others with no wake-up, and the I/O thread, seeing a poller,
 * need not spin for them. It keeps polling while polls find messages and for the spin budget
 * after the last one did (a wait that began after a longer pause starts its budget afresh); then
 * the wait blocks until the I/O thread completes the future. */
static _Thread_local int64_t drive_found_ns, drive_last_ns;

static bool call_drive(void)
{
    td_rpc_agent *agents[DRIVEN_AGENTS];
    int n = 0;
    pthread_mutex_lock(&default_mu);
    int64_t budget = 0;
    for (int i = 0; i < DRIVEN_AGENTS; i++)
        if (driven_agents[i]) {
            rpc_agent_retain(driven_agents[i]);
            agents[n++] = driven_agents[i];
            if (driven_agents[i]->spin_call.spin_ns > budget)
                budget = driven_agents[i]->spin_call.spin_ns;
        }
    pthread_mutex_unlock(&default_mu);
    int64_t now = clock_now_ns();
    bool polled = false;
    if (now - drive_last_ns > budget)
        drive_found_ns = now;
    drive_last_ns = now;
    for (int i = 0; i < n; i++) {
        td_rpc_agent *a = agents[i];
        size_t lanes = rpc_lanes_enter(a);
        polled |= lanes > 0;
        if (lanes > 0 && rpc_lanes_poll(a)) {
            drive_found_ns = now;
            atomic_fetch_add_explicit(&a->caller_takes, 1, memory_order_relaxed);
        }
        rpc_lanes_leave(a, lanes);
        rpc_agent_release(a);
    }
    return polled && now - drive_found_ns < budget;
}

static td_status agent_call(td_rpc_agent *a, int peer, const char *fn, const td_value *args, const td_value *kwargs,
                            int64_t timeout_ms, const rpc_header *extra, rpc_prof_mode mode, td_future **future)
{
    *future = NULL;
    if (!fn)
        return error_fmt(TD_ERR_INVALID, "td_rpc_async: fn is NULL");
    if (timeout_ms < TD_RPC_DEFAULT_TIMEOUT)
        return error_fmt(TD_ERR_INVALID, "timeout_ms must be -1 (the default), 0 (none) or positive, got %lld",
                         (long long)timeout_ms);
    td_status st = TD_OK;
    td_value *payload = NULL, *wire = NULL;
    rpc_outgoing *m = NULL;
    rpc_prof_call *prof = NULL; /* the call's event when this thread profiles (profiler.h) */
    if (atomic_load(&a->closing)) {
        st = error_set(TD_ERR_NOT_INIT, rpc_not_initialized);
        goto out;
    }
    st = rpc_call_payload(fn, args, kwargs, &payload); /* checks args and kwargs */
    if (st != TD_OK)
        goto out;
    td_profiler *profiler = rpc_prof_current();
    if (profiler && (prof = rpc_prof_call_begin(profiler, mode, fn, &a->self, &a->peers[peer].info))) {
        td_value *wrapped = rpc_prof_call_wrap(prof, payload);
        td_value_release(payload);
        payload = wrapped;
    }
    rpc_header ag_ids = {0}; /* distributed autograd's flag and ids, when this thread is in a context */
    const rpc_autograd_hooks *ag = atomic_load(&rpc_autograd);
    bool protocol = extra && (extra->flags & RPC_CALL_PROTOCOL);
    if (ag && !protocol && (st = ag->call_out(a, peer, &payload, &ag_ids)) != TD_OK)
        goto out;
    st = rpc_rref_send(a, peer, payload, &wire); /* forks the RRefs it holds for peer */
    if (st != TD_OK)
        goto out;
    int64_t timeout = timeout_ms == TD_RPC_DEFAULT_TIMEOUT ? atomic_load(&a->default_timeout_ms) : timeout_ms;
    uint64_t id = atomic_fetch_add(&a->next_call_id, 1);
    rpc_header h = {.type = RPC_MSG_CALL,
                    .flags = RPC_FLAG_REPLY_WANTED,
                    .sender = (uint32_t)a->self.id,
                    .id = id,
                    .timeout_ms = timeout};
    if (extra) {
        h.flags |= extra->flags & ~RPC_CALL_PROTOCOL;
        h.rref_owner = extra->rref_owner;
        h.rref_local = extra->rref_local;
        h.fork_owner = extra->fork_owner;
        h.fork_local = extra->fork_local;
    }
    if (prof)
        h.flags |= RPC_FLAG_PROFILING;
    if (ag_ids.flags & RPC_FLAG_AUTOGRAD) {
        h.flags |= RPC_FLAG_AUTOGRAD;
        h.autograd_context = ag_ids.autograd_context;
        h.autograd_message = ag_ids.autograd_message;
    }
    st = rpc_outgoing_make(&h, wire, &m);
    if (st != TD_OK)
        goto out;

    td_future *f = td_future_new();
    pthread_mutex_lock(&a->mu);
    if (atomic_load(&a->closing)) {
        /* Shutdown began after the check above: nothing would complete this call any more. */
        pthread_mutex_unlock(&a->mu);
        td_future_release(f);
        st = error_set(TD_ERR_NOT_INIT, rpc_not_initialized);
        goto out;
    }
    if (a->peers[peer].lost) {
        char msg[512];
        snprintf(msg, sizeof msg, "RPC to worker %s (id %d) failed: the connection to it was lost (%s)",
                 a->peers[peer].info.name, peer, a->peers[peer].lost_reason);
        pthread_mutex_unlock(&a->mu);
        rpc_prof_call_end(prof);
        prof = NULL;
        td_future_set_error(f, TD_ERR_PEER_LOST, "%s", msg);
        *future = f;
        rpc_rref_peer_lost(a, peer); /* forks this message made for the lost peer will never be accepted */
        goto out;
    }
    rpc_pending *p = TD_NEW(rpc_pending);
    p->id = id;
    p->peer = peer;
    p->future = td_future_retain(f);
    p->prof = prof;
    prof = NULL;
    p->timeout_ms = timeout;
    p->deadline_ns = timeout == 0 ? TD_DEADLINE_NONE : deadline_after_ms(timeout);
    map_put(&a->pending, &p->id, sizeof p->id, p);
    bool earlier = p->deadline_ns < a->next_deadline_ns;
    if (earlier)
        a->next_deadline_ns = p->deadline_ns;
    a->client_active++;
    a->calls_started++;
    rpc_channel *ch = a->peers[peer].chan;
    int64_t send_deadline = p->deadline_ns; /* p is the I/O thread's once the lock is dropped */
    bool drive = mode != RPC_PROF_SYNC && ch && ch->lanes && a->driven;
    pthread_mutex_unlock(&a->mu);
    if (drive)
        pg_future_set_driver(f, call_drive); /* td_rpc_sync's caller polls in wait_reply */
    if (earlier)
        rpc_io_wake(a);
    if (peer == (int)a->self.id) {
        if (rpc_loopback_send(a, m) != TD_OK) {
            char msg[TD_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s", td_last_error());
            pthread_mutex_lock(&a->mu);
            rpc_pending *q = map_remove(&a->pending, &id, sizeof id);
            pthread_mutex_unlock(&a->mu);
            if (q)
                pending_fail(a, q, TD_ERR_INTERNAL, msg);
        }
    } else if (ch) {
        /* rpc_sync writes its call itself: its caller waits for nothing else. */
        rpc_channel_send(a, ch, m, mode != RPC_PROF_SYNC, send_deadline); /* a failure fails this call */
    } else {
        pthread_mutex_lock(&a->mu);
        rpc_pending *q = map_remove(&a->pending, &id, sizeof id);
        pthread_mutex_unlock(&a->mu);
        if (q) {
            char msg[512];
            snprintf(msg, sizeof msg, "RPC to worker %s (id %d) failed: not connected to it", a->peers[peer].info.name,
                     peer);
            pending_fail(a, q, TD_ERR_PEER_LOST, msg);
        }
        rpc_rref_peer_lost(a, peer);
    }
    *future = f;
out:
    rpc_prof_call_discard(prof);
    rpc_outgoing_free(m);
    td_value_release(wire);
    td_value_release(payload);
    return st;
}

/* Polls f for the caller's spin budget (agent_impl.h, "Waiting") before td_future_wait sleeps:
 * a reply that comes within it costs no wake-up. */
static td_status wait_reply(td_rpc_agent *a, td_future *f)
{
    int64_t start = clock_now_ns();
    int64_t end = start + samehost_spin_budget(&a->spin_call);
    bool slept = false;
    /* The caller polls the lanes itself (channel.c): its reply, when it comes through one, is
     * delivered by this thread, with no wake-up and no other thread on the way. */
    size_t lanes = end > start ? rpc_lanes_enter(a) : 0;
    for (;;) {
        if (td_future_is_completed(f))
            break;
        int64_t now = clock_now_ns();
        if (now >= end) {
            slept = true;
            break;
        }
        if (lanes > 0 && rpc_lanes_poll(a)) {
            atomic_fetch_add_explicit(&a->caller_takes, 1, memory_order_relaxed);
            continue;
        }
        samehost_spin_pause(&a->spin_call, now - start);
    }
    rpc_lanes_leave(a, lanes);
    td_status st = td_future_wait(f, 0);
    samehost_spin_result(&a->spin_call, slept, start);
    return st;
}

td_status td_rpc_sync(td_rpc_agent *agent, td_rpc_dest to, const char *fn, const td_value *args,
                      const td_value *kwargs, int64_t timeout_ms, td_value **result)
{
    if (result)
        *result = NULL;
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    td_future *f = NULL;
    td_status st = call_dest(a, to, fn, args, kwargs, timeout_ms, RPC_PROF_SYNC, &f);
    if (st == TD_OK)
        st = wait_reply(a, f);
    if (st == TD_OK && result) {
        td_value *v = td_future_value(f);
        *result = v ? td_value_retain(v) : NULL;
    }
    td_future_release(f);
    rpc_agent_release(a);
    return st;
}

td_rpc_agent *td_rpc_call_agent(const td_rpc_call *call) { return call ? call->agent : NULL; }
const td_worker_info *td_rpc_call_caller(const td_rpc_call *call) { return call ? &call->caller : NULL; }
void *td_rpc_call_arg(const td_rpc_call *call) { return call ? call->arg : NULL; }

/* ---- among workers -------------------------------------------------------------------------- */

static int cmp_str(const void *x, const void *y) { return strcmp(*(const char *const *)x, *(const char *const *)y); }

td_status td_rpc_all_gather(td_rpc_agent *agent, const td_value *value, const char *const *names, size_t n,
                            int64_t timeout_ms, td_value **gathered)
{
    if (gathered)
        *gathered = NULL;
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    td_status st = TD_OK;
    /* names NULL: the members now (a dynamic group's change as workers join and leave). */
    int *members = TD_NEW_ARRAY(int, a->world_size);
    size_t nmembers = 0;
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < a->world_size; i++)
        if (a->peers[i].member)
            members[nmembers++] = i;
    pthread_mutex_unlock(&a->mu);
    size_t count = names ? n : nmembers;
    const char **sorted = TD_NEW_ARRAY(const char *, count ? count : 1);
    char **keys = TD_NEW_ARRAY(char *, count ? count : 1);
    void **values = TD_NEW_ARRAY(void *, count ? count : 1);
    size_t *lens = TD_NEW_ARRAY(size_t, count ? count : 1);
    void *mine = NULL;
    size_t mine_len = 0;
    char *set = NULL;
    td_value *out = NULL;
    bool got = false;
    bool member = false;
    for (size_t i = 0; i < count; i++) {
        sorted[i] = names ? names[i] : a->peers[members[i]].info.name;
        pthread_mutex_lock(&a->mu);
        int found = sorted[i] ? find_name(a, sorted[i]) : -1;
        pthread_mutex_unlock(&a->mu);
        if (found < 0) {
            st = error_fmt(TD_ERR_NOT_FOUND, "name:%s,rank:%lld could not find destination name %s", a->self.name,
                           (long long)a->self.id, sorted[i] ? sorted[i] : "(null)");
            goto out;
        }
        member |= strcmp(sorted[i], a->self.name) == 0;
    }
    if (!member) {
        st = error_fmt(TD_ERR_INVALID, "worker %s is not among the workers of this _all_gather", a->self.name);
        goto out;
    }
    qsort(sorted, count, sizeof *sorted, cmp_str);
    size_t set_len = 1;
    for (size_t i = 0; i < count; i++)
        set_len += strlen(sorted[i]) + 1;
    set = alloc_zeroed(1, set_len);
    for (size_t i = 0; i < count; i++) {
        strcat(set, sorted[i]);
        if (i + 1 < count)
            strcat(set, ",");
    }
    /* Calls over one set pair up in order: the n-th call of each worker meets the n-th of the others. */
    pthread_mutex_lock(&a->mu);
    uintptr_t seq = (uintptr_t)map_get(&a->gather_seqs, set, strlen(set));
    map_put(&a->gather_seqs, set, strlen(set), (void *)(seq + 1));
    pthread_mutex_unlock(&a->mu);
    st = value ? td_value_encode_bytes(value, &mine, &mine_len) : TD_OK;
    if (st != TD_OK)
        goto out;
    if (!value) {
        td_value *none = td_value_none();
        st = td_value_encode_bytes(none, &mine, &mine_len);
        td_value_release(none);
        if (st != TD_OK)
            goto out;
    }
    for (size_t i = 0; i < count; i++)
        keys[i] = alloc_printf("gather/%s/%zu/%s", set, (size_t)seq, sorted[i]);
    {
        char *my_key = alloc_printf("gather/%s/%zu/%s", set, (size_t)seq, a->self.name);
        st = td_store_set(a->store, my_key, mine, mine_len);
        free(my_key);
    }
    if (st != TD_OK)
        goto out;
    int64_t t = timeout_ms == TD_RPC_DEFAULT_TIMEOUT ? atomic_load(&a->default_timeout_ms) : timeout_ms;
    st = td_store_wait(a->store, (const char *const *)keys, count, t == 0 ? TD_STORE_NO_TIMEOUT : t);
    if (st == TD_ERR_TIMEOUT) {
        st = error_fmt(TD_ERR_TIMEOUT, "Workers of {%s} timed out in _all_gather after %.2f seconds", set,
                       (double)t / 1000.0);
        goto out;
    }
    if (st == TD_OK)
        st = td_store_multi_get(a->store, (const char *const *)keys, count, values, lens);
    if (st != TD_OK)
        goto out;
    got = true;
    out = td_value_dict_new();
    for (size_t i = 0; i < count && st == TD_OK; i++) {
        td_value *v = NULL;
        st = td_value_decode(values[i], lens[i], &v);
        if (st == TD_OK)
            st = td_value_dict_set_str(out, sorted[i], v);
    }
out:
    if (st == TD_OK && gathered)
        *gathered = out;
    else
        td_value_release(out);
    for (size_t i = 0; i < count; i++) {
        free(keys[i]);
        if (got)
            free(values[i]);
    }
    free(keys);
    free(values);
    free(lens);
    free(sorted);
    free(members);
    free(mine);
    free(set);
    rpc_agent_release(a);
    return st;
}

td_status td_rpc_barrier(td_rpc_agent *agent, const char *const *names, size_t n, int64_t timeout_ms)
{
    td_value *g = NULL;
    td_status st = td_rpc_all_gather(agent, NULL, names, n, timeout_ms, &g);
    td_value_release(g);
    return st;
}

/* ---- debug info ----------------------------------------------------------------------------- */

static void put_int(td_value *d, const char *key, long long v)
{
    char text[32];
    snprintf(text, sizeof text, "%lld", v);
    td_value_dict_set_str(d, key, td_value_string(text));
}

td_status td_rpc_debug_info(td_rpc_agent *agent, td_value **info)
{
    if (!info)
        return error_fmt(TD_ERR_INVALID, "td_rpc_debug_info: info is NULL");
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    int nthreads = 0, idle = 0;
    size_t queued = 0;
    rpc_pool_counts(&a->pool, &nthreads, &idle, &queued);
    pthread_mutex_lock(&a->mu);
    long long pending = (long long)a->pending.len, client = a->client_active;
    long long unix_channels = 0, tcp_channels = 0, single_copy = 0, lane_channels = 0, nmembers = 0;
    for (int i = 0; i < a->world_size; i++) {
        nmembers += a->peers[i].member;
        const rpc_channel *ch = a->peers[i].chan;
        if (ch && !a->peers[i].lost) {
            unix_channels += ch->is_unix;
            tcp_channels += !ch->is_unix;
            single_copy += ch->cma && atomic_load(&ch->cma->side[1 - ch->cma_side].can_read);
            lane_channels += ch->lanes;
        }
    }
    pthread_mutex_unlock(&a->mu);
    td_value *d = td_value_dict_new();
    put_int(d, "agent.num_pending_requests", pending);
    put_int(d, "agent.thread_pool_size", a->pool.base > nthreads ? a->pool.base : nthreads);
    put_int(d, "agent.num_idle_threads", idle + (a->pool.base > nthreads ? a->pool.base - nthreads : 0));
    put_int(d, "agent.num_queued_calls", (long long)queued);
    put_int(d, "agent.client_active_calls", client);
    put_int(d, "agent.server_active_calls", (long long)atomic_load(&a->server_active));
    put_int(d, "agent.server_active_async_calls", (long long)atomic_load(&a->server_active_async));
    put_int(d, "agent.world_size", nmembers);
    put_int(d, "agent.num_unix_channels", unix_channels); /* peers reached over the same-host layer */
    put_int(d, "agent.num_tcp_channels", tcp_channels);
    /* peers that read this worker's large payload parts from its memory (single copy) */
    put_int(d, "agent.num_single_copy_channels", single_copy);
    put_int(d, "agent.single_copy_messages_received", (long long)atomic_load(&a->pieces_received));
    /* chunks of those that their senders wrote into this worker's memory (shared copies) */
    put_int(d, "agent.single_copy_chunks_written_by_peers", (long long)atomic_load(&a->share_chunks_in));
    put_int(d, "agent.single_copy_chunks_written_to_peers", (long long)atomic_load(&a->share_chunks_out));
    put_int(d, "agent.num_lane_channels", lane_channels); /* same-host peers whose messages go through lanes */
    put_int(d, "agent.lane_bells_rung", (long long)atomic_load(&a->lane_rings));
    /* polls by threads waiting for a call's reply that took messages from a lane themselves */
    put_int(d, "agent.lane_takes_by_callers", (long long)atomic_load(&a->caller_takes));
    /* small messages handed to the I/O thread, the writes that sent them, and those of the writes
     * that found the socket full (channel.c, "Handing sends over") */
    put_int(d, "agent.sends_handed_to_io_thread", (long long)atomic_load(&a->sends_handed));
    put_int(d, "agent.io_thread_writes", (long long)atomic_load(&a->io_writes));
    put_int(d, "agent.io_thread_writes_found_full", (long long)atomic_load(&a->io_write_full));
    rpc_rref_debug_info(a, d);
    const rpc_autograd_hooks *ag = atomic_load(&rpc_autograd);
    if (ag) {
        ag->debug_info(a, d);
    } else {
        put_int(d, "num_current_backward_passes", 0);
        put_int(d, "num_autograd_contexts", 0);
    }
    rpc_agent_release(a);
    *info = d;
    return TD_OK;
}
