/* Point-to-point operations of the backends over transports (p2p.h): each posted as one xfer
 * whose callback completes the work, so isend/irecv pairs posted in any order on two ranks never
 * deadlock and the worker thread never blocks on them. */
#include "coll/p2p.h"

#include <stdlib.h>

#include "base/alloc.h"
#include "base/thread.h"
#include "coll/coll.h"

struct td_p2p_entry {
    td_xfer x;
    td_work *work;
    td_p2p_pool *pool;
    td_p2p_entry *next;     /* free list */
    td_p2p_entry *all_next; /* every op ever made */
};

void p2p_pool_init(td_p2p_pool *p)
{
    thread_mutex_init(&p->mu);
    p->free = p->all = NULL;
}

void p2p_pool_free(td_p2p_pool *p)
{
    for (td_p2p_entry *op = p->all; op;) {
        td_p2p_entry *next = op->all_next;
        free(op);
        op = next;
    }
    p->free = p->all = NULL;
    pthread_mutex_destroy(&p->mu);
}

static td_p2p_entry *op_get(td_p2p_pool *p)
{
    pthread_mutex_lock(&p->mu);
    td_p2p_entry *op = p->free;
    if (op) {
        p->free = op->next;
    } else {
        op = TD_NEW(td_p2p_entry);
        op->pool = p;
        op->all_next = p->all;
        p->all = op;
    }
    pthread_mutex_unlock(&p->mu);
    return op;
}

static void op_put(td_p2p_entry *op)
{
    td_p2p_pool *p = op->pool;
    pthread_mutex_lock(&p->mu);
    op->next = p->free;
    p->free = op;
    pthread_mutex_unlock(&p->mu);
}

static void p2p_done(td_xfer *x, void *arg)
{
    td_p2p_entry *op = arg;
    td_work *w = op->work;
    if (x->status == TD_OK)
        td_work_done(w, TD_OK, x->peer, NULL);
    else
        td_work_done(w, x->status, x->peer, "%s", x->error);
    op_put(op);
}

td_status p2p_submit(td_p2p_pool *p, td_transport *t, const td_coll *c, td_work *work)
{
    td_p2p_entry *op = op_get(p);
    op->work = work;
    op->x.on_done = p2p_done;
    op->x.arg = op;
    size_t bytes = c->count * td_dtype_size(c->dtype);
    td_status st = c->kind == TD_COLL_SEND
                       ? transport_isend1(t, c->peer, TD_TAG_P2P(c->tag), c->in, bytes, c->deadline_ns, &op->x)
                       : transport_irecv1(t, c->peer, TD_TAG_P2P(c->tag), c->out, bytes, c->deadline_ns, &op->x);
    if (st != TD_OK)
        op_put(op);
    return st;
}
