/* The "tcp" backend (tdist/backend.h): the collective algorithms of src/coll over the tcp
 * transport (src/transport/tcp.h), one TCP connection per pair of ranks.
 *
 * create connects the group (through its store, within its timeout) and reads the algorithm
 * configuration (TDIST_ALGO and friends, so a bad name fails at group creation). A collective runs
 * on the calling worker thread, which drives the sockets itself while it waits, and is completed
 * before submit returns. SEND and RECV are only posted: their xfers complete later on whichever
 * thread makes progress, and the completion callback calls td_work_done, so isend/irecv pairs
 * posted in any order on the two sides never deadlock. The p2p xfers come from a free list that
 * only grows while warming up. A failed collective aborts the transport (the group has failed, and
 * the other ranks learn it at once instead of at their timeout). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/backend.h>

#include "backends/builtin.h"
#include "base/alloc.h"
#include "base/error.h"
#include "base/thread.h"
#include "coll/coll.h"
#include "transport/tcp.h"

typedef struct tcp_state tcp_state;

typedef struct p2p_op {
    td_xfer x;
    td_work *work;
    tcp_state *s;
    struct p2p_op *next;      /* free list */
    struct p2p_op *all_next;  /* every op ever made, for destroy */
} p2p_op;

struct tcp_state {
    td_transport *t;
    td_coll_ctx coll;
    pthread_mutex_t mu; /* the free list */
    p2p_op *free;
    p2p_op *all;
};

static p2p_op *op_get(tcp_state *s)
{
    pthread_mutex_lock(&s->mu);
    p2p_op *op = s->free;
    if (op) {
        s->free = op->next;
    } else {
        op = TD_NEW(p2p_op);
        op->s = s;
        op->all_next = s->all;
        s->all = op;
    }
    pthread_mutex_unlock(&s->mu);
    return op;
}

static void op_put(tcp_state *s, p2p_op *op)
{
    pthread_mutex_lock(&s->mu);
    op->next = s->free;
    s->free = op;
    pthread_mutex_unlock(&s->mu);
}

static void p2p_done(td_xfer *x, void *arg)
{
    p2p_op *op = arg;
    td_work *w = op->work;
    tcp_state *s = op->s;
    if (x->status == TD_OK)
        td_work_done(w, TD_OK, x->peer, NULL);
    else
        td_work_done(w, x->status, x->peer, "%s", x->error);
    op_put(s, op);
}

static td_status tcp_create(const td_backend_args *a, void **state)
{
    td_coll_config cfg;
    TD_TRY(td_coll_config_from_env(&cfg));
    td_tcp_options o = {
        .store = a->store,
        .key_prefix = "tcp/",
        .rank = a->rank,
        .size = a->size,
        .global_ranks = a->global_ranks,
        .timeout_ms = a->timeout_ms,
        .group_name = a->group_name,
    };
    td_transport *t;
    TD_TRY(td_tcp_transport_create(&o, &t));
    tcp_state *s = TD_NEW(tcp_state);
    s->t = t;
    td_mutex_init(&s->mu);
    td_status st = td_coll_ctx_init(&s->coll, t, &cfg);
    if (st != TD_OK) {
        td_transport_destroy(t);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return st;
    }
    *state = s;
    return TD_OK;
}

static td_status tcp_submit(void *state, const td_coll *c, td_work *work)
{
    tcp_state *s = state;
    if (c->kind == TD_COLL_SEND || c->kind == TD_COLL_RECV) {
        p2p_op *op = op_get(s);
        op->work = work;
        op->x.on_done = p2p_done;
        op->x.arg = op;
        size_t bytes = c->count * td_dtype_size(c->dtype);
        td_status st = c->kind == TD_COLL_SEND
                           ? td_transport_isend1(s->t, c->peer, TD_TAG_P2P(c->tag), c->in, bytes, c->deadline_ns, &op->x)
                           : td_transport_irecv1(s->t, c->peer, TD_TAG_P2P(c->tag), c->out, bytes, c->deadline_ns,
                                                 &op->x);
        if (st != TD_OK)
            op_put(s, op);
        return st;
    }
    td_status st = td_coll_run(&s->coll, c, TD_ALGO_AUTO);
    if (st == TD_OK)
        td_work_done(work, TD_OK, -1, NULL);
    else
        td_work_done(work, st, -1, "%s", td_last_error());
    return TD_OK;
}

static void tcp_abort(void *state, td_status status, const char *message)
{
    tcp_state *s = state;
    td_transport_abort(s->t, status, message);
}

static void tcp_destroy(void *state)
{
    tcp_state *s = state;
    td_transport_destroy(s->t);
    td_coll_ctx_free(&s->coll);
    for (p2p_op *op = s->all; op;) {
        p2p_op *next = op->all_next;
        free(op);
        op = next;
    }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

const td_backend_ops td_backend_tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .submit = tcp_submit,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
    .supports = NULL,
    .inline_submit = true,
};
