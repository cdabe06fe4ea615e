/* Distributed autograd (tdist/dist_autograd.h): PyTorch's FAST mode over the RPC call path.
 *
 * Each agent holds its contexts (dist_ag_state, hung on td_rpc_agent's dist_autograd slot): a
 * context keeps the send functions recorded in it (by message id), the workers it exchanged
 * messages with, and the gradients its leaves received. The RPC layer calls this file through
 * rpc_autograd (agent_impl.h), set by dist_ag_install when an agent is created, at four points of
 * a call's path:
 *   call_out   a call made while the thread is in a context: a send function over the argument
 *              tensors that require grad, and the payload wrapped as (payload, [indices]);
 *   serve_in   the callee: the same context (made if missing), a recv function whose outputs are
 *              the argument tensors named by the indices, and the context current while the
 *              function runs (so nested calls carry it);
 *   reply_out  the result's tensors that require grad get a send function, (value, [indices]);
 *   reply_in   the caller records the matching recv function.
 * The indices count the distinct tensors of the payload in walk order (the value codec sends one
 * tensor once however often it appears), so both sides name the same tensors.
 *
 * Backward: the local engine (ag_engine_execute) runs from the roots without accumulating into
 * .grad, capturing the gradients at every AccumulateGrad node reachable instead; they add into the
 * context. A recv function's backward sends its gradients with tdist::dist_autograd_backward to
 * the worker that sent the tensor, whose handler runs the engine from the send function recorded
 * under that message id, and replies when its own part, and the calls that part made, are done.
 * Each pass (the root's or a handler's) keeps its outstanding calls on the thread running the
 * engine (dist_ag_pass) and waits for them after the engine returns; the first error wins and
 * travels back as the reply's value (status, message), so a lost worker stays TD_ERR_PEER_LOST.
 * Leaving a context sends tdist::dist_autograd_release to its workers, which pass it on. A worker
 * that loses another drops the contexts the lost one made (it can no longer leave them) and passes
 * the release on in the same way, from a pool thread (peer_lost). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/dist_autograd.h>

#include "autograd/autograd_impl.h"
#include "autograd/dist_autograd_impl.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "base/ref.h"
#include "base/vec.h"
#include "rpc/agent_impl.h"
#include "rpc/rref.h"

#define DIST_AG_BACKWARD_FN "tdist::dist_autograd_backward"
#define DIST_AG_RELEASE_FN "tdist::dist_autograd_release"
#define DIST_AG_RREF_BACKWARD_FN "tdist::rref_backward"
#define DIST_AG_RELEASED_KEPT 1024

typedef struct dist_ag_grad {
    td_autograd_node *accumulator; /* retained: the leaf's AccumulateGrad */
    td_tensor *grad;
} dist_ag_grad;

typedef struct dist_ag_context {
    td_ref ref;
    int64_t id;
    pthread_mutex_t mu;
    td_map sends;                /* message id (8 bytes) -> send node (retained) */
    TD_VEC(dist_ag_grad) grads;  /* this worker's leaves and their gradients */
    TD_VEC(int) workers;         /* the workers it sent to or heard from */
} dist_ag_context;

typedef struct dist_ag_state {
    td_rpc_agent *agent; /* not retained: the state lives in the agent */
    pthread_mutex_t mu;
    td_map contexts;     /* id (8 bytes) -> dist_ag_context (the map's reference) */
    _Atomic int64_t next_context, next_message;
    _Atomic int64_t backward_passes;
    /* The last contexts released here (mu), which a late message must not make again. */
    int64_t released[DIST_AG_RELEASED_KEPT];
    size_t released_next;
} dist_ag_state;

/* Every state, so that the functions taking only a context id find its agent. */
static pthread_mutex_t dist_ag_states_mu = PTHREAD_MUTEX_INITIALIZER;
static TD_VEC(dist_ag_state *) dist_ag_states;

/* This thread's current context: entered by the user or served. The agent is only compared, never
 * followed (it may be gone). */
typedef struct dist_ag_current {
    td_rpc_agent *agent;
    int64_t id;
} dist_ag_current;
static _Thread_local dist_ag_current dist_ag_tls = {NULL, -1};

/* A backward pass on this thread: the calls its recv functions made. */
typedef struct dist_ag_pass {
    td_rpc_agent *agent;
    int64_t context_id;
    bool retain_graph;
    TD_VEC(td_future *) outstanding;
} dist_ag_pass;
static _Thread_local dist_ag_pass *dist_ag_tls_pass;

static const char dist_ag_not_found[] = "Could not find autograd context with id: %lld";

/* ---- contexts ----------------------------------------------------------------------------------- */

static void dist_ag_context_release(void *arg)
{
    dist_ag_context *c = arg;
    if (!c || !ref_dec(&c->ref))
        return;
    size_t it = 0;
    for (td_map_entry *e; (e = map_next(&c->sends, &it));)
        ag_node_release(e->value);
    map_free(&c->sends, NULL);
    for (size_t i = 0; i < c->grads.len; i++) {
        ag_node_release(c->grads.items[i].accumulator);
        td_tensor_release(c->grads.items[i].grad);
    }
    TD_VEC_FREE(&c->grads);
    TD_VEC_FREE(&c->workers);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static td_status dist_ag_fn_backward(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                     td_value **result);
static td_status dist_ag_fn_release(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                    td_value **result);

static td_status dist_ag_fn_rref_backward(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                          td_value **result);

static void dist_ag_register_functions(void)
{
    td_rpc_register(DIST_AG_BACKWARD_FN, dist_ag_fn_backward, NULL);
    td_rpc_register(DIST_AG_RELEASE_FN, dist_ag_fn_release, NULL);
    td_rpc_register(DIST_AG_RREF_BACKWARD_FN, dist_ag_fn_rref_backward, NULL);
    dist_optim_register_functions();
}
static pthread_once_t dist_ag_functions_once = PTHREAD_ONCE_INIT;

/* a's state, made on first use when create. */
static dist_ag_state *dist_ag_state_of(td_rpc_agent *a, bool create)
{
    dist_ag_state *s = atomic_load(&a->dist_autograd);
    if (s || !create)
        return s;
    pthread_once(&dist_ag_functions_once, dist_ag_register_functions);
    dist_ag_state *fresh = TD_NEW(dist_ag_state);
    fresh->agent = a;
    pthread_mutex_init(&fresh->mu, NULL);
    fresh->contexts = (td_map)TD_MAP_INIT;
    for (size_t i = 0; i < DIST_AG_RELEASED_KEPT; i++)
        fresh->released[i] = -1;
    if (!atomic_compare_exchange_strong(&a->dist_autograd, &s, fresh)) {
        pthread_mutex_destroy(&fresh->mu);
        free(fresh);
        return s;
    }
    pthread_mutex_lock(&dist_ag_states_mu);
    TD_VEC_PUSH(&dist_ag_states, fresh);
    pthread_mutex_unlock(&dist_ag_states_mu);
    return fresh;
}

/* The context id on a (a new reference), made when create unless it was released here lately;
 * NULL when absent. */
static dist_ag_context *dist_ag_lookup(td_rpc_agent *a, int64_t id, bool create)
{
    dist_ag_state *s = dist_ag_state_of(a, create);
    if (!s)
        return NULL;
    pthread_mutex_lock(&s->mu);
    dist_ag_context *c = map_get(&s->contexts, &id, sizeof id);
    for (size_t i = 0; !c && create && i < DIST_AG_RELEASED_KEPT; i++)
        create = s->released[i] != id;
    if (!c && create) {
        c = TD_NEW(dist_ag_context);
        ref_init(&c->ref);
        c->id = id;
        pthread_mutex_init(&c->mu, NULL);
        c->sends = (td_map)TD_MAP_INIT;
        map_put(&s->contexts, &c->id, sizeof c->id, c);
    }
    if (c)
        ref_inc(&c->ref);
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* Removes context id from a's table: the table's reference, or NULL when absent. */
static dist_ag_context *dist_ag_remove(td_rpc_agent *a, int64_t id)
{
    dist_ag_state *s = dist_ag_state_of(a, false);
    if (!s)
        return NULL;
    pthread_mutex_lock(&s->mu);
    dist_ag_context *c = map_remove(&s->contexts, &id, sizeof id);
    if (c) {
        s->released[s->released_next] = id;
        s->released_next = (s->released_next + 1) % DIST_AG_RELEASED_KEPT;
    }
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* The agent holding context id (retained) and the context (a new reference): the thread's
 * current agent's first, then any agent of the process. Only agents in dist_ag_states are touched
 * (a thread's current agent may be gone). Fails with PyTorch's message. */
static td_status dist_ag_find(int64_t id, td_rpc_agent **agent, dist_ag_context **ctx)
{
    *agent = NULL;
    *ctx = NULL;
    pthread_mutex_lock(&dist_ag_states_mu);
    for (int pass = 0; pass < 2 && !*ctx; pass++) {
        for (size_t i = 0; i < dist_ag_states.len && !*ctx; i++) {
            dist_ag_state *s = dist_ag_states.items[i];
            if (pass == 0 && s->agent != dist_ag_tls.agent)
                continue;
            if ((*ctx = dist_ag_lookup(s->agent, id, false))) {
                rpc_agent_retain(s->agent);
                *agent = s->agent;
            }
        }
    }
    pthread_mutex_unlock(&dist_ag_states_mu);
    if (!*ctx)
        return error_fmt(TD_ERR_INVALID, dist_ag_not_found, (long long)id);
    return TD_OK;
}

static void dist_ag_add_worker(dist_ag_context *c, int peer)
{
    pthread_mutex_lock(&c->mu);
    bool known = false;
    for (size_t i = 0; i < c->workers.len && !known; i++)
        known = c->workers.items[i] == peer;
    if (!known)
        TD_VEC_PUSH(&c->workers, peer);
    pthread_mutex_unlock(&c->mu);
}

/* ---- send and recv functions ---------------------------------------------------------------------- */

/* The distinct tensors of v in walk order (the codec's order of first appearance). */
typedef TD_VEC(td_tensor *) dist_ag_tensors;

static void dist_ag_collect(const td_value *v, dist_ag_tensors *out)
{
    if (!v)
        return;
    switch (td_value_kind_of(v)) {
    case TD_VAL_TENSOR: {
        td_tensor *t = td_value_get_tensor(v);
        for (size_t i = 0; i < out->len; i++)
            if (out->items[i] == t)
                return;
        TD_VEC_PUSH(out, t);
        return;
    }
    case TD_VAL_LIST:
    case TD_VAL_TUPLE:
    case TD_VAL_RECORD:
        for (size_t i = 0; i < td_value_len(v); i++)
            dist_ag_collect(td_value_at(v, i), out);
        return;
    case TD_VAL_DICT:
        for (size_t i = 0; i < td_value_len(v); i++) {
            dist_ag_collect(td_value_dict_key_at(v, i), out);
            dist_ag_collect(td_value_dict_value_at(v, i), out);
        }
        return;
    default:
        return;
    }
}

/* The send function passes its incoming gradients on to the tensors that were sent. */
static td_status dist_ag_send_backward(void *ctx, td_tensor *const *grad_outputs, int num_outputs,
                                       td_tensor **grad_inputs, int num_inputs)
{
    (void)ctx;
    for (int i = 0; i < num_inputs && i < num_outputs; i++)
        grad_inputs[i] = grad_outputs[i] ? td_tensor_retain(grad_outputs[i]) : NULL;
    return TD_OK;
}

static const td_autograd_function dist_ag_send_fn = {.name = "SendRpcBackward", .backward = dist_ag_send_backward};

typedef struct dist_ag_recv {
    int64_t context_id;
    int peer;           /* the worker that sent the tensors */
    int64_t message_id; /* its send function's */
} dist_ag_recv;

/* The recv function sends its gradients to the sender's send function (FAST mode). */
static td_status dist_ag_recv_backward(void *ctx, td_tensor *const *grad_outputs, int num_outputs,
                                       td_tensor **grad_inputs, int num_inputs)
{
    (void)grad_inputs;
    (void)num_inputs;
    dist_ag_recv *r = ctx;
    dist_ag_pass *pass = dist_ag_tls_pass;
    if (!pass)
        return error_fmt(TD_ERR_INVALID, "RecvRpcBackward: a tensor received over RPC in a distributed autograd "
                                         "context needs td_dist_autograd_backward, not the local backward");
    if (pass->context_id != r->context_id)
        return error_fmt(TD_ERR_INVALID, "RecvRpcBackward: the graph of context %lld reaches a tensor received in "
                                         "context %lld", (long long)pass->context_id, (long long)r->context_id);
    td_value *grads = td_value_list_new();
    for (int i = 0; i < num_outputs; i++)
        td_value_list_append(grads, grad_outputs[i] ? td_value_tensor(grad_outputs[i]) : td_value_none());
    td_value *args = td_value_tuple_of(4, td_value_int(r->context_id), td_value_int(r->message_id), grads,
                                       td_value_bool(pass->retain_graph));
    td_future *f = NULL;
    td_status st = dist_ag_call_plain(pass->agent, r->peer, DIST_AG_BACKWARD_FN, args, &f);
    td_value_release(args);
    if (st != TD_OK)
        return st;
    TD_VEC_PUSH(&pass->outstanding, f);
    return TD_OK;
}

static const td_autograd_function dist_ag_recv_fn = {
    .name = "RecvRpcBackward", .backward = dist_ag_recv_backward, .destroy = free};

/* Records a send function over tensors[idx[k]] (k < n) in c under a new message id. */
static td_status dist_ag_record_send(dist_ag_state *s, dist_ag_context *c, td_tensor *const *inputs, int n,
                                     int64_t *message_id)
{
    *message_id = ((int64_t)s->agent->self.id << 48) | atomic_fetch_add(&s->next_message, 1);
    if (n == 0)
        return TD_OK;
    td_tensor **outs = TD_NEW_ARRAY(td_tensor *, (size_t)n);
    td_status st = TD_OK;
    for (int i = 0; i < n && st == TD_OK; i++)
        st = td_tensor_empty(TD_FLOAT32, TD_SHAPE(0), &outs[i]);
    td_autograd_node *node = NULL;
    if (st == TD_OK)
        st = td_autograd_function_record(&dist_ag_send_fn, NULL, inputs, n, outs, n, &node);
    if (st == TD_OK && node) {
        ag_node_retain(node);
        pthread_mutex_lock(&c->mu);
        map_put(&c->sends, message_id, sizeof *message_id, node);
        pthread_mutex_unlock(&c->mu);
    }
    for (int i = 0; i < n; i++)
        td_tensor_release(outs[i]);
    free(outs);
    return st;
}

/* The tensors of v that require grad: their indices among v's distinct tensors (as a list value)
 * and the tensors themselves. */
static td_value *dist_ag_grad_tensors(const td_value *v, dist_ag_tensors *need)
{
    dist_ag_tensors all = {0};
    dist_ag_collect(v, &all);
    td_value *idx = td_value_list_new();
    bool enabled = td_autograd_is_grad_enabled();
    for (size_t i = 0; enabled && i < all.len; i++) {
        if (ag_requires_grad(all.items[i])) {
            td_value_list_append(idx, td_value_int((int64_t)i));
            TD_VEC_PUSH(need, all.items[i]);
        }
    }
    TD_VEC_FREE(&all);
    return idx;
}

/* Records a recv function whose outputs are the tensors of v named by idx (a list of increasing
 * indices among v's distinct tensors). */
static td_status dist_ag_record_recv(const td_value *v, const td_value *idx, int64_t context_id, int peer,
                                     int64_t message_id)
{
    if (!idx || td_value_kind_of(idx) != TD_VAL_LIST)
        return error_fmt(TD_ERR_INVALID, "a distributed autograd message lacks its list of tensor indices");
    size_t n = td_value_len(idx);
    if (n == 0)
        return TD_OK;
    dist_ag_tensors all = {0};
    dist_ag_collect(v, &all);
    td_tensor **outs = TD_NEW_ARRAY(td_tensor *, n);
    td_status st = TD_OK;
    int64_t prev = -1;
    for (size_t k = 0; k < n && st == TD_OK; k++) {
        const td_value *e = td_value_at(idx, k);
        int64_t i = e && td_value_kind_of(e) == TD_VAL_INT ? td_value_get_int(e) : -1;
        if (i <= prev || i >= (int64_t)all.len)
            st = error_fmt(TD_ERR_INVALID, "a distributed autograd message names tensor %lld of %zu", (long long)i,
                           all.len);
        else
            outs[k] = all.items[i];
        prev = i;
    }
    if (st == TD_OK) {
        dist_ag_recv *r = TD_NEW(dist_ag_recv);
        *r = (dist_ag_recv){context_id, peer, message_id};
        bool was = td_autograd_set_grad_enabled(true);
        st = td_autograd_function_record(&dist_ag_recv_fn, r, NULL, 0, outs, (int)n, NULL);
        td_autograd_set_grad_enabled(was);
    }
    free(outs);
    TD_VEC_FREE(&all);
    return st;
}

/* ---- the hooks on RPC's call path ---------------------------------------------------------------- */

static td_status dist_ag_call_out(td_rpc_agent *a, int peer, td_value **payload, rpc_header *h)
{
    if (dist_ag_tls.id < 0 || dist_ag_tls.agent != a)
        return TD_OK;
    dist_ag_context *c = dist_ag_lookup(a, dist_ag_tls.id, false);
    if (!c)
        return TD_OK; /* released meanwhile: the call carries no context */
    dist_ag_tensors need = {0};
    td_value *idx = dist_ag_grad_tensors(*payload, &need);
    int64_t message_id = 0;
    td_status st = dist_ag_record_send(dist_ag_state_of(a, false), c, need.items, (int)need.len, &message_id);
    if (st == TD_OK) {
        dist_ag_add_worker(c, peer);
        *payload = td_value_tuple_of(2, *payload, idx);
        idx = NULL;
        h->flags |= RPC_FLAG_AUTOGRAD;
        h->autograd_context = c->id;
        h->autograd_message = message_id;
    }
    td_value_release(idx);
    TD_VEC_FREE(&need);
    dist_ag_context_release(c);
    return st;
}

static bool dist_ag_wrapped(const td_value *v)
{
    return v && td_value_kind_of(v) == TD_VAL_TUPLE && td_value_len(v) == 2;
}

static td_status dist_ag_serve_in(td_rpc_agent *a, int peer, const rpc_header *h, const td_value *payload,
                                  const td_value **inner, void **scope)
{
    *inner = NULL;
    *scope = NULL;
    if (!dist_ag_wrapped(payload))
        return error_fmt(TD_ERR_INVALID, "a distributed autograd call is not a tuple (call, tensor indices)");
    /* NULL when the context was released here already: a late message of it (the RRef layer's
     * delete of a user RRef released in the context, say) must not bring it back. */
    const td_value *idx = td_value_at(payload, 1);
    dist_ag_context *c = dist_ag_lookup(a, h->autograd_context, true);
    td_status st = TD_OK;
    if (c) {
        dist_ag_add_worker(c, peer);
        st = dist_ag_record_recv(td_value_at(payload, 0), idx, c->id, peer, h->autograd_message);
        dist_ag_context_release(c);
    }
    if (st != TD_OK)
        return st;
    dist_ag_current *prev = TD_NEW(dist_ag_current);
    *prev = dist_ag_tls;
    dist_ag_tls = (dist_ag_current){a, h->autograd_context};
    *scope = prev;
    *inner = td_value_at(payload, 0);
    return TD_OK;
}

static void dist_ag_serve_exit(void *scope)
{
    dist_ag_current *prev = scope;
    dist_ag_tls = *prev;
    free(prev);
}

static td_status dist_ag_reply_out(td_rpc_agent *a, int peer, const rpc_header *call, td_value **value,
                                   rpc_header *reply)
{
    int64_t message_id = 0;
    td_value *idx;
    dist_ag_context *c = dist_ag_lookup(a, call->autograd_context, false);
    if (c) {
        dist_ag_tensors need = {0};
        idx = dist_ag_grad_tensors(*value, &need);
        td_status st = dist_ag_record_send(dist_ag_state_of(a, false), c, need.items, (int)need.len, &message_id);
        dist_ag_add_worker(c, peer);
        TD_VEC_FREE(&need);
        dist_ag_context_release(c);
        if (st != TD_OK) {
            td_value_release(idx);
            return st;
        }
    } else {
        idx = td_value_list_new(); /* the context is gone: nothing to differentiate */
    }
    *value = td_value_tuple_of(2, *value ? *value : td_value_none(), idx);
    reply->flags |= RPC_FLAG_AUTOGRAD;
    reply->autograd_context = call->autograd_context;
    reply->autograd_message = message_id;
    return TD_OK;
}

static td_status dist_ag_reply_in(td_rpc_agent *a, int peer, const rpc_header *h, td_value **value)
{
    td_value *w = *value;
    *value = NULL;
    if (!dist_ag_wrapped(w)) {
        td_value_release(w);
        return error_fmt(TD_ERR_INVALID, "a distributed autograd reply is not a tuple (value, tensor indices)");
    }
    td_value *inner = td_value_retain(td_value_at(w, 0));
    td_status st = TD_OK;
    dist_ag_context *c = dist_ag_lookup(a, h->autograd_context, false);
    if (c) {
        st = dist_ag_record_recv(inner, td_value_at(w, 1), c->id, peer, h->autograd_message);
        dist_ag_context_release(c);
    }
    td_value_release(w);
    if (st != TD_OK) {
        td_value_release(inner);
        return st;
    }
    *value = inner;
    return TD_OK;
}

static void dist_ag_debug_info(td_rpc_agent *a, td_value *info)
{
    dist_ag_state *s = dist_ag_state_of(a, false);
    long long contexts = 0, passes = 0;
    if (s) {
        pthread_mutex_lock(&s->mu);
        contexts = (long long)s->contexts.len;
        pthread_mutex_unlock(&s->mu);
        passes = (long long)atomic_load(&s->backward_passes);
    }
    char text[32];
    snprintf(text, sizeof text, "%lld", passes);
    td_value_dict_set_str(info, "num_current_backward_passes", td_value_string(text));
    snprintf(text, sizeof text, "%lld", contexts);
    td_value_dict_set_str(info, "num_autograd_contexts", td_value_string(text));
}

static void dist_ag_agent_free(td_rpc_agent *a)
{
    dist_optim_agent_free(a);
    dist_ag_state *s = atomic_exchange(&a->dist_autograd, NULL);
    if (!s)
        return;
    pthread_mutex_lock(&dist_ag_states_mu);
    for (size_t i = 0; i < dist_ag_states.len; i++) {
        if (dist_ag_states.items[i] == s) {
            TD_VEC_SWAP_REMOVE(&dist_ag_states, i);
            break;
        }
    }
    if (dist_ag_states.len == 0)
        TD_VEC_FREE(&dist_ag_states);
    pthread_mutex_unlock(&dist_ag_states_mu);
    map_free(&s->contexts, dist_ag_context_release);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void dist_ag_peer_lost(td_rpc_agent *a, int peer);

static const rpc_autograd_hooks dist_ag_hooks = {
    .call_out = dist_ag_call_out,
    .serve_in = dist_ag_serve_in,
    .serve_exit = dist_ag_serve_exit,
    .reply_out = dist_ag_reply_out,
    .reply_in = dist_ag_reply_in,
    .debug_info = dist_ag_debug_info,
    .agent_free = dist_ag_agent_free,
    .peer_lost = dist_ag_peer_lost,
};

void dist_ag_install(void)
{
    /* Registered with the first agent: an owner asked for an RRef's backward may have no context yet. */
    pthread_once(&dist_ag_functions_once, dist_ag_register_functions);
    atomic_store(&rpc_autograd, &dist_ag_hooks);
}

/* ---- backward ------------------------------------------------------------------------------------- */

/* The AccumulateGrad nodes reachable from the roots, as capture edges (retained by the graph). */
typedef TD_VEC(ag_edge) dist_ag_edges;

static void dist_ag_accumulators(const ag_edge *roots, int n, dist_ag_edges *out)
{
    td_map seen = TD_MAP_INIT;
    TD_VEC(td_autograd_node *) stack = {0};
    for (int i = 0; i < n; i++)
        if (roots[i].node)
            TD_VEC_PUSH(&stack, roots[i].node);
    while (stack.len) {
        td_autograd_node *node = stack.items[--stack.len];
        if (map_get(&seen, &node, sizeof node))
            continue;
        map_put(&seen, &node, sizeof node, node);
        if (ag_node_is_accumulator(node)) {
            TD_VEC_PUSH(out, ((ag_edge){node, 0}));
            continue;
        }
        for (int i = 0; i < node->num_next; i++)
            if (node->next[i].node)
                TD_VEC_PUSH(&stack, node->next[i].node);
    }
    TD_VEC_FREE(&stack);
    map_free(&seen, NULL);
}

/* Adds a captured gradient (taken) of accumulator into c. */
static td_status dist_ag_accumulate(dist_ag_context *c, td_autograd_node *accumulator, td_tensor *grad)
{
    td_status st = TD_OK;
    pthread_mutex_lock(&c->mu);
    size_t i = 0;
    while (i < c->grads.len && c->grads.items[i].accumulator != accumulator)
        i++;
    if (i == c->grads.len) {
        TD_VEC_PUSH(&c->grads, ((dist_ag_grad){ag_node_retain(accumulator), grad}));
    } else {
        st = ag_buffer_add(&c->grads.items[i].grad, grad);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* Waits for a backward call f (taken) whose reply is None or (status, message); st is the outcome
 * so far, and the first failure wins (its message in msg). */
static td_status dist_ag_wait_reply(td_future *f, td_status st, char *msg, size_t size)
{
    td_status fs = td_future_wait(f, 0);
    if (st == TD_OK && fs != TD_OK) {
        st = fs;
        snprintf(msg, size, "%s", td_future_error(f));
    } else if (st == TD_OK) {
        const td_value *v = td_future_value(f);
        if (v && td_value_kind_of(v) == TD_VAL_TUPLE && td_value_len(v) == 2 &&
            td_value_kind_of(td_value_at(v, 0)) == TD_VAL_INT && td_value_kind_of(td_value_at(v, 1)) == TD_VAL_STRING) {
            int64_t code = td_value_get_int(td_value_at(v, 0));
            /* A peer's status is one of ours (negative, small) or reads as a remote failure. */
            st = code < 0 && code > -1000 ? (td_status)code : TD_ERR_REMOTE;
            snprintf(msg, size, "%s", td_value_get_string(td_value_at(v, 1), NULL));
        } else if (v && td_value_kind_of(v) != TD_VAL_NONE) {
            st = TD_ERR_REMOTE;
            snprintf(msg, size, "%s replied with a malformed result", DIST_AG_BACKWARD_FN);
        }
    }
    td_future_release(f);
    return st;
}

/* Runs one pass of context c from the root edges with grads (the engine takes them and leaves
 * NULL), then waits for the calls it made. */
static td_status dist_ag_run(td_rpc_agent *a, dist_ag_context *c, const ag_edge *roots, td_tensor **grads, int n,
                             bool retain_graph)
{
    dist_ag_state *s = dist_ag_state_of(a, true);
    atomic_fetch_add(&s->backward_passes, 1);
    dist_ag_edges wanted = {0};
    dist_ag_accumulators(roots, n, &wanted);
    td_tensor **captures = wanted.len ? TD_NEW_ARRAY(td_tensor *, wanted.len) : NULL;
    ag_task_spec spec = {.roots = roots,
                         .grads = grads,
                         .num_roots = n,
                         .retain_graph = retain_graph,
                         .accumulate = false,
                         .capture_edges = wanted.items,
                         .captures = captures,
                         .num_captures = (int)wanted.len};
    dist_ag_pass pass = {.agent = a, .context_id = c->id, .retain_graph = retain_graph};
    dist_ag_pass *prev = dist_ag_tls_pass;
    dist_ag_tls_pass = &pass;
    td_status st = ag_engine_execute(&spec);
    dist_ag_tls_pass = prev;
    char msg[TD_ERROR_MAX] = "";
    if (st != TD_OK)
        snprintf(msg, sizeof msg, "%s", td_last_error());
    for (size_t k = 0; k < wanted.len; k++) {
        if (!captures[k])
            continue;
        td_status as = st == TD_OK ? dist_ag_accumulate(c, wanted.items[k].node, captures[k]) : TD_OK;
        if (st != TD_OK)
            td_tensor_release(captures[k]);
        if (as != TD_OK && st == TD_OK) {
            st = as;
            snprintf(msg, sizeof msg, "%s", td_last_error());
        }
    }
    free(captures);
    TD_VEC_FREE(&wanted);
    for (size_t i = 0; i < pass.outstanding.len; i++)
        st = dist_ag_wait_reply(pass.outstanding.items[i], st, msg, sizeof msg);
    TD_VEC_FREE(&pass.outstanding);
    atomic_fetch_sub(&s->backward_passes, 1);
    if (st != TD_OK)
        return error_set(st, msg);
    return TD_OK;
}

/* tdist::dist_autograd_backward(context id, message id, grads, retain_graph): runs the graph from
 * the send function of that message; replies None, or (status, message) on failure. */
static td_status dist_ag_fn_backward(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                     td_value **result)
{
    const td_value *p[4];
    TD_TRY(td_rpc_bind(DIST_AG_BACKWARD_FN, "context_id,message_id,grads,retain_graph", args, kwargs, p));
    if (td_value_kind_of(p[0]) != TD_VAL_INT || td_value_kind_of(p[1]) != TD_VAL_INT ||
        td_value_kind_of(p[2]) != TD_VAL_LIST || td_value_kind_of(p[3]) != TD_VAL_BOOL)
        return td_rpc_raise("TypeError", "%s(int, int, list, bool) got other types", DIST_AG_BACKWARD_FN);
    td_rpc_agent *a = td_rpc_call_agent(call);
    int64_t id = td_value_get_int(p[0]), message_id = td_value_get_int(p[1]);
    const td_value *grads = p[2];
    bool retain_graph = td_value_get_bool(p[3]);
    td_status st = TD_OK;
    dist_ag_context *c = dist_ag_lookup(a, id, false);
    td_autograd_node *node = NULL;
    if (!c) {
        st = error_fmt(TD_ERR_INVALID, dist_ag_not_found, (long long)id);
    } else {
        pthread_mutex_lock(&c->mu);
        node = map_get(&c->sends, &message_id, sizeof message_id);
        if (node)
            ag_node_retain(node);
        pthread_mutex_unlock(&c->mu);
        if (!node)
            st = error_fmt(TD_ERR_INVALID, "Could not find send function for message id %lld in autograd context %lld",
                           (long long)message_id, (long long)id);
    }
    size_t n = td_value_len(grads);
    if (st == TD_OK && (int)n != node->num_outputs)
        st = error_fmt(TD_ERR_INVALID, "%s: %zu gradients for a send function of %d tensors", DIST_AG_BACKWARD_FN, n,
                       node->num_outputs);
    if (st == TD_OK) {
        ag_edge *roots = TD_NEW_ARRAY(ag_edge, n ? n : 1);
        td_tensor **root_grads = TD_NEW_ARRAY(td_tensor *, n ? n : 1);
        int k = 0;
        for (size_t i = 0; i < n; i++) {
            const td_value *g = td_value_at(grads, i);
            if (td_value_kind_of(g) != TD_VAL_TENSOR)
                continue;
            roots[k] = (ag_edge){node, (int)i};
            root_grads[k++] = td_tensor_retain(td_value_get_tensor(g));
        }
        if (k)
            st = dist_ag_run(a, c, roots, root_grads, k, retain_graph);
        for (int i = 0; i < k; i++)
            td_tensor_release(root_grads[i]); /* the engine took those it used */
        free(roots);
        free(root_grads);
    }
    if (node)
        ag_node_release(node);
    dist_ag_context_release(c);
    *result = st == TD_OK ? NULL : td_value_tuple_of(2, td_value_int(st), td_value_string(td_last_error()));
    return TD_OK;
}

/* Releases context c's copies on its workers (but `except`), waiting for them. */
static void dist_ag_release_workers(td_rpc_agent *a, dist_ag_context *c, int except)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->workers.len;
    int *workers = n ? TD_NEW_ARRAY(int, n) : NULL;
    if (n)
        memcpy(workers, c->workers.items, n * sizeof *workers);
    pthread_mutex_unlock(&c->mu);
    td_future **fs = n ? TD_NEW_ARRAY(td_future *, n) : NULL;
    td_value *args = td_value_tuple_of(1, td_value_int(c->id));
    for (size_t i = 0; i < n; i++) /* a call that fails to start leaves fs[i] NULL */
        if (workers[i] != except && workers[i] != (int)a->self.id)
            dist_ag_call_plain(a, workers[i], DIST_AG_RELEASE_FN, args, &fs[i]);
    for (size_t i = 0; i < n; i++) {
        if (fs[i] && td_future_wait(fs[i], 0) != TD_OK)
            TD_LOG_DEBUG("distributed autograd: releasing context %lld on worker %d: %s", (long long)c->id,
                         workers[i], td_future_error(fs[i]));
        td_future_release(fs[i]);
    }
    td_value_release(args);
    free(fs);
    free(workers);
}

/* tdist::dist_autograd_release(context id): drops this worker's copy and passes the release on. */
static td_status dist_ag_fn_release(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                    td_value **result)
{
    (void)result;
    const td_value *p[1];
    TD_TRY(td_rpc_bind(DIST_AG_RELEASE_FN, "context_id", args, kwargs, p));
    if (td_value_kind_of(p[0]) != TD_VAL_INT)
        return td_rpc_raise("TypeError", "%s(int) got another type", DIST_AG_RELEASE_FN);
    td_rpc_agent *a = td_rpc_call_agent(call);
    dist_ag_context *c = dist_ag_remove(a, td_value_get_int(p[0]));
    if (c) {
        dist_ag_release_workers(a, c, (int)td_rpc_call_caller(call)->id);
        dist_ag_context_release(c);
    }
    return TD_OK;
}

/* ---- a lost worker's contexts --------------------------------------------------------------------- */

typedef struct dist_ag_orphan {
    td_rpc_agent *agent; /* a reference */
    dist_ag_context *ctx; /* the table's former reference */
    int lost;
} dist_ag_orphan;

static void dist_ag_orphan_release(void *arg)
{
    dist_ag_orphan *o = arg;
    dist_ag_release_workers(o->agent, o->ctx, o->lost);
    dist_ag_context_release(o->ctx);
    rpc_agent_release(o->agent);
    free(o);
}

static void dist_ag_orphan_drop(void *arg)
{
    dist_ag_orphan *o = arg;
    dist_ag_context_release(o->ctx);
    rpc_agent_release(o->agent);
    free(o);
}

/* The peer_lost hook (the I/O thread, or a caller that found the peer gone): the contexts that peer
 * made (id >> 48) leave this worker's table, and their release goes on to the workers they reached
 * from a pool thread, since the I/O thread must not wait on calls. A backward still running in
 * one keeps its own reference and fails on the lost peer. */
static void dist_ag_peer_lost(td_rpc_agent *a, int peer)
{
    dist_ag_state *s = dist_ag_state_of(a, false);
    if (!s)
        return;
    TD_VEC(int64_t) ids = {0};
    pthread_mutex_lock(&s->mu);
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&s->contexts, &it));) {
        int64_t id;
        memcpy(&id, e->key, sizeof id);
        if ((id >> 48) == peer)
            TD_VEC_PUSH(&ids, id);
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < ids.len; i++) {
        dist_ag_context *c = dist_ag_remove(a, ids.items[i]);
        if (!c)
            continue;
        TD_LOG_DEBUG("distributed autograd: worker %d is lost; dropping context %lld it made", peer,
                     (long long)ids.items[i]);
        dist_ag_orphan *o = TD_NEW(dist_ag_orphan);
        rpc_agent_retain(a);
        *o = (dist_ag_orphan){a, c, peer};
        if (rpc_pool_submit(&a->pool, dist_ag_orphan_release, dist_ag_orphan_drop, o) != TD_OK)
            dist_ag_orphan_drop(o);
    }
    TD_VEC_FREE(&ids);
}

/* ---- the public API ------------------------------------------------------------------------------ */

td_status td_dist_autograd_context_enter(td_rpc_agent *agent, int64_t *context_id)
{
    if (!context_id)
        return error_fmt(TD_ERR_INVALID, "td_dist_autograd_context_enter: context_id is NULL");
    *context_id = -1;
    if (dist_ag_tls.id >= 0)
        return error_fmt(TD_ERR_INVALID, "Already have an autograd context id for this thread.");
    td_rpc_agent *a;
    TD_TRY(rpc_agent_get(agent, &a));
    dist_ag_state *s = dist_ag_state_of(a, true);
    int64_t id = ((int64_t)a->self.id << 48) | atomic_fetch_add(&s->next_context, 1);
    dist_ag_context *c = dist_ag_lookup(a, id, true);
    dist_ag_context_release(c);
    dist_ag_tls = (dist_ag_current){a, id};
    rpc_agent_release(a);
    *context_id = id;
    return TD_OK;
}

td_status td_dist_autograd_context_exit(int64_t context_id)
{
    td_rpc_agent *a;
    dist_ag_context *found;
    TD_TRY(dist_ag_find(context_id, &a, &found));
    dist_ag_context_release(found);
    if (dist_ag_tls.id == context_id && dist_ag_tls.agent == a)
        dist_ag_tls = (dist_ag_current){NULL, -1};
    dist_ag_context *c = dist_ag_remove(a, context_id);
    if (c) {
        dist_ag_release_workers(a, c, -1);
        dist_ag_context_release(c);
    }
    rpc_agent_release(a);
    return TD_OK;
}

int64_t td_dist_autograd_current_context(void) { return dist_ag_tls.id; }

td_status td_dist_autograd_backward(int64_t context_id, td_tensor *const *roots, int n, bool retain_graph)
{
    if (n <= 0 || !roots)
        return error_fmt(TD_ERR_INVALID, "td_dist_autograd_backward: needs at least one root");
    td_rpc_agent *a;
    dist_ag_context *c;
    TD_TRY(dist_ag_find(context_id, &a, &c));
    ag_edge *edges = TD_NEW_ARRAY(ag_edge, (size_t)n);
    td_tensor **grads = TD_NEW_ARRAY(td_tensor *, (size_t)n);
    td_status st = TD_OK;
    for (int i = 0; i < n && st == TD_OK; i++) {
        if (!roots[i] || !ag_requires_grad(roots[i]))
            st = error_fmt(TD_ERR_INVALID, "element %d of tensors does not require grad and does not have a grad_fn",
                           i);
        else if (td_tensor_numel(roots[i]) != 1)
            st = error_fmt(TD_ERR_INVALID, "grad can be implicitly created only for scalar outputs");
        else
            st = td_tensor_ones(td_tensor_dtype(roots[i]), td_tensor_shape(roots[i]), &grads[i]);
        if (st == TD_OK)
            edges[i] = ag_gradient_edge(roots[i]);
    }
    if (st == TD_OK)
        st = dist_ag_run(a, c, edges, grads, n, retain_graph);
    for (int i = 0; i < n; i++) {
        td_tensor_release(grads[i]);
        if (edges[i].node)
            ag_node_release(edges[i].node);
    }
    free(edges);
    free(grads);
    dist_ag_context_release(c);
    rpc_agent_release(a);
    return st;
}

/* The gradient of leaf t in context c (a new reference or NULL). */
static td_tensor *dist_ag_context_gradient(dist_ag_context *c, const td_tensor *t)
{
    ag_meta *m = ag_meta_of(t);
    td_autograd_node *acc = NULL;
    if (m) {
        pthread_mutex_lock(&m->lock);
        acc = m->accumulator;
        pthread_mutex_unlock(&m->lock);
    }
    td_tensor *grad = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; acc && !grad && i < c->grads.len; i++)
        if (c->grads.items[i].accumulator == acc)
            grad = td_tensor_retain(c->grads.items[i].grad);
    pthread_mutex_unlock(&c->mu);
    return grad;
}

td_status dist_ag_gradient_on(td_rpc_agent *a, int64_t context_id, const td_tensor *t, td_tensor **grad)
{
    *grad = NULL;
    dist_ag_context *c = dist_ag_lookup(a, context_id, false);
    if (!c)
        return error_fmt(TD_ERR_INVALID, dist_ag_not_found, (long long)context_id);
    *grad = dist_ag_context_gradient(c, t);
    dist_ag_context_release(c);
    return TD_OK;
}

td_status dist_ag_call_plain(td_rpc_agent *a, int peer, const char *fn, const td_value *args, td_future **future)
{
    /* The RPC layer's own kind of message: call_out leaves it alone, whatever this thread is in. */
    const rpc_header protocol = {.flags = RPC_CALL_PROTOCOL};
    return rpc_agent_call(a, peer, fn, args, NULL, TD_RPC_DEFAULT_TIMEOUT, &protocol, future);
}

td_status td_dist_autograd_get_gradient(int64_t context_id, const td_tensor *t, td_tensor **grad)
{
    if (!grad || !t)
        return error_fmt(TD_ERR_INVALID, "td_dist_autograd_get_gradient: t and grad must not be NULL");
    *grad = NULL;
    td_rpc_agent *a;
    dist_ag_context *c;
    TD_TRY(dist_ag_find(context_id, &a, &c));
    *grad = dist_ag_context_gradient(c, t);
    dist_ag_context_release(c);
    rpc_agent_release(a);
    return TD_OK;
}

td_status td_dist_autograd_get_gradients(int64_t context_id, td_tensor **tensors, td_tensor **grads, size_t cap,
                                         size_t *n)
{
    if (!n)
        return error_fmt(TD_ERR_INVALID, "td_dist_autograd_get_gradients: n is NULL");
    *n = 0;
    td_rpc_agent *a;
    dist_ag_context *c;
    TD_TRY(dist_ag_find(context_id, &a, &c));
    pthread_mutex_lock(&c->mu);
    size_t k = 0;
    for (size_t i = 0; i < c->grads.len; i++) {
        td_tensor *leaf = ag_weak_lock(c->grads.items[i].accumulator->leaf);
        if (!leaf)
            continue; /* the leaf is gone: nobody can ask for it */
        if (k < cap) {
            if (tensors)
                tensors[k] = td_tensor_retain(leaf);
            if (grads)
                grads[k] = td_tensor_retain(c->grads.items[i].grad);
        }
        td_tensor_release(leaf);
        k++;
    }
    pthread_mutex_unlock(&c->mu);
    *n = k;
    dist_ag_context_release(c);
    rpc_agent_release(a);
    return TD_OK;
}

/* ---- RRef backward ------------------------------------------------------------------------------- */

static const char dist_ag_rref_not_tensor[] = "RRef should contain a tensor for .backward()";

/* The owner's part of RRef.backward: the value's tensor, then the local backward (context_id -1)
 * or the distributed one in context_id. */
static td_status dist_ag_owner_rref_backward(td_rref *rref, int64_t context_id, bool retain_graph)
{
    td_value *v = NULL;
    TD_TRY(td_rref_local_value(rref, &v));
    td_status st;
    if (!v || td_value_kind_of(v) != TD_VAL_TENSOR) {
        st = error_fmt(TD_ERR_INVALID, dist_ag_rref_not_tensor);
    } else {
        td_tensor *t = td_value_get_tensor(v);
        st = context_id == -1 ? td_autograd_backward(t, NULL, retain_graph)
                              : td_dist_autograd_backward(context_id, &t, 1, retain_graph);
    }
    td_value_release(v);
    return st;
}

/* tdist::rref_backward(rref, context id, retain_graph), PyTorch's RRefBackwardReq: runs on the
 * owner; replies None, or (status, message) on failure, as tdist::dist_autograd_backward does. */
static td_status dist_ag_fn_rref_backward(td_rpc_call *call, const td_value *args, const td_value *kwargs,
                                          td_value **result)
{
    const td_value *p[3];
    TD_TRY(td_rpc_bind(DIST_AG_RREF_BACKWARD_FN, "rref,context_id,retain_graph", args, kwargs, p));
    td_rref *rref = td_value_get_rref(p[0]);
    if (!rref || td_value_kind_of(p[1]) != TD_VAL_INT || td_value_kind_of(p[2]) != TD_VAL_BOOL)
        return td_rpc_raise("TypeError", "%s(RRef, int, bool) got other types", DIST_AG_RREF_BACKWARD_FN);
    if (!td_rref_is_owner(rref))
        return td_rpc_raise("RuntimeError", "%s: this worker does not own the RRef", DIST_AG_RREF_BACKWARD_FN);
    /* The context is looked up on this agent first (a process may host several: threaded harness). */
    dist_ag_current saved = dist_ag_tls;
    dist_ag_tls = (dist_ag_current){td_rpc_call_agent(call), td_value_get_int(p[1])};
    td_status st = dist_ag_owner_rref_backward(rref, td_value_get_int(p[1]), td_value_get_bool(p[2]));
    dist_ag_tls = saved;
    *result = st == TD_OK ? NULL : td_value_tuple_of(2, td_value_int(st), td_value_string(td_last_error()));
    return TD_OK;
}

td_status td_rref_backward(td_rref *rref, int64_t context_id, bool retain_graph)
{
    if (!rref)
        return error_fmt(TD_ERR_INVALID, "td_rref_backward: rref is NULL");
    if (td_rref_is_owner(rref))
        return dist_ag_owner_rref_backward(rref, context_id, retain_graph);
    if (context_id == -1)
        return error_fmt(TD_ERR_INVALID, "User RRefs require 'dist_autograd_ctx_id' to be specified");
    td_worker_info owner;
    TD_TRY(td_rref_owner(rref, &owner));
    td_rpc_agent *a = rpc_rref_agent(rref);
    td_value *args = td_value_tuple_of(3, td_rref_value(rref), td_value_int(context_id), td_value_bool(retain_graph));
    td_future *f = NULL;
    /* The request carries no context: the owner looks it up by id. */
    td_status st = dist_ag_call_plain(a, (int)owner.id, DIST_AG_RREF_BACKWARD_FN, args, &f);
    td_value_release(args);
    TD_TRY(st);
    char msg[TD_ERROR_MAX] = "";
    st = dist_ag_wait_reply(f, TD_OK, msg, sizeof msg);
    return st == TD_OK ? TD_OK : error_set(st, msg);
}
