/* Join for DDP (tdist/ddp.h; torch.distributed.algorithms.Join with DDP's join hook): training
 * with uneven inputs.
 *
 * Under Join every iteration of an active rank makes, in DDP.forward's order: an all_reduce of 1
 * (the notice that it is still active: its sum is the number of active ranks), with
 * throw_on_early_termination an all_reduce of 0 whose nonzero sum means some rank ran out, the
 * bucket rebuild (once), the buffers' source rank (an all_reduce MAX of the candidates) and their
 * broadcast, and an all_reduce of the backward-sync flag; then the backward's bucket reductions
 * and, with find_unused_parameters, the used map's. A joined rank (td_ddp_join_end) loops: it
 * shadows the notice with 0 (a sum of 0 means every rank has joined), then each of the others in
 * the same order, the reductions with zero buckets through the same comm hook, until all have
 * joined; then every rank takes the parameters and buffers of the last rank to join (an all_reduce
 * MAX of the candidates, then broadcasts). */
#include <stdlib.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/ddp.h>

#include "base/alloc.h"
#include "base/error.h"
#include "ddp/ddp_impl.h"

struct ddp_join {
    bool enabled;
    bool div_initial;
    bool throw_early;
    bool thrown;             /* this rank already failed with the early-termination error */
    td_tensor *notice;       /* the active rank's all_reduce of 1, in flight during the iteration */
    td_future *notice_work;
    td_tensor *flag;         /* the backward-sync flag's all_reduce */
    td_future *flag_work;
};

static bool ddp_join_on(const td_ddp *d) { return d->join && d->join->enabled; }

/* Drops the finished collectives of the last iteration (waited for: their tensors must outlive them). */
static void ddp_join_settle(ddp_join *j)
{
    if (j->notice_work)
        td_future_wait(j->notice_work, -1);
    if (j->flag_work)
        td_future_wait(j->flag_work, -1);
    td_future_release(j->notice_work);
    td_future_release(j->flag_work);
    td_tensor_release(j->notice);
    td_tensor_release(j->flag);
    j->notice_work = j->flag_work = NULL;
    j->notice = j->flag = NULL;
}

/* A blocking all_reduce of one value (SUM or MAX) in float32, as PyTorch's ones(1)/zeros(1). */
static td_status ddp_join_all_reduce_one(td_ddp *d, double value, td_op op, double *out)
{
    td_tensor *t = NULL;
    TD_TRY(td_tensor_full(TD_FLOAT32, TD_SHAPE(1), value, &t));
    td_status st = td_pg_all_reduce(d->pg, t, op, NULL);
    if (st == TD_OK)
        *out = ((const float *)td_tensor_data(t))[0];
    td_tensor_release(t);
    return st;
}

td_status td_ddp_join_begin(td_ddp *d, bool divide_by_initial_world_size, bool throw_on_early_termination)
{
    if (!d)
        return error_fmt(TD_ERR_INVALID, "td_ddp_join_begin: ddp is NULL");
    if (!d->join)
        d->join = TD_NEW(ddp_join);
    ddp_join *j = d->join;
    if (j->enabled)
        return error_fmt(TD_ERR_INVALID, "td_ddp_join_begin: this DDP model is already in a join context");
    ddp_join_settle(j);
    *j = (ddp_join){.enabled = true, .div_initial = divide_by_initial_world_size,
                    .throw_early = throw_on_early_termination};
    return TD_OK;
}

td_status ddp_join_notify(td_ddp *d)
{
    if (!ddp_join_on(d))
        return TD_OK;
    ddp_join *j = d->join;
    ddp_join_settle(j);
    TD_TRY(td_tensor_full(TD_FLOAT32, TD_SHAPE(1), 1, &j->notice));
    TD_TRY(td_pg_all_reduce(d->pg, j->notice, TD_OP_SUM, &j->notice_work));
    if (j->throw_early) {
        double any = 0;
        TD_TRY(ddp_join_all_reduce_one(d, 0, TD_OP_SUM, &any));
        if (any != 0) {
            j->thrown = true;
            return error_fmt(TD_ERR_INVALID, "Detected at least one rank that exhausted inputs. Throwing across all "
                                             "ranks.");
        }
    }
    return TD_OK;
}

td_status ddp_join_buffer_source(td_ddp *d, bool candidate, int *src)
{
    *src = 0;
    if (!ddp_join_on(d))
        return TD_OK;
    double r = 0;
    TD_TRY(ddp_join_all_reduce_one(d, candidate ? d->rank : -1, TD_OP_MAX, &r));
    *src = (int)r;
    return TD_OK;
}

td_status ddp_join_sync_flag(td_ddp *d)
{
    if (!ddp_join_on(d))
        return TD_OK;
    ddp_join *j = d->join;
    TD_TRY(td_tensor_full(TD_FLOAT32, TD_SHAPE(1), d->require_sync ? 1 : 0, &j->flag));
    return td_pg_all_reduce(d->pg, j->flag, TD_OP_SUM, &j->flag_work);
}

td_status ddp_join_div_factor(td_ddp *d, int *div)
{
    *div = d->world_size;
    if (!ddp_join_on(d) || d->join->div_initial || !d->join->notice_work)
        return TD_OK;
    ddp_join *j = d->join;
    td_status st = td_future_wait(j->notice_work, -1);
    if (st != TD_OK)
        return error_set(st, td_future_error(j->notice_work));
    int active = (int)((const float *)td_tensor_data(j->notice))[0];
    *div = active > 0 ? active : 1;
    return TD_OK;
}

/* The joined rank's shadow of one backward: each bucket's reduction with zeros, in bucket order,
 * through the same comm hook, then the used map's with find_unused_parameters. */
static td_status ddp_join_shadow_backward(td_ddp *d)
{
    td_status st = TD_OK;
    int nb = d->num_buckets;
    ddp_bucket *shadow = TD_NEW_ARRAY(ddp_bucket, nb ? nb : 1);
    int started = 0;
    for (; started < nb && st == TD_OK; started++) {
        ddp_bucket *b = &shadow[started], *real = &d->buckets[started];
        *b = *real;
        b->work = NULL;
        b->buffer = NULL;
        st = td_tensor_zeros(real->dtype, TD_SHAPE(real->numel), &b->buffer);
        if (st == TD_OK)
            st = ddp_launch(d, b);
    }
    td_tensor *used = NULL;
    td_future *used_work = NULL;
    if (st == TD_OK && d->find_unused) {
        st = td_tensor_zeros(TD_INT32, TD_SHAPE(d->n_reduced), &used);
        if (st == TD_OK)
            st = td_pg_all_reduce(d->pg, used, TD_OP_SUM, &used_work);
    }
    for (int b = 0; b < started && b < nb; b++) {
        st = ddp_settle(shadow[b].work, st);
        td_tensor_release(shadow[b].buffer);
    }
    st = ddp_settle(used_work, st);
    td_tensor_release(used);
    free(shadow);
    /* Shadowed iterations start no timing of their own. */
    d->first_launch_ns = 0;
    return st;
}

td_status td_ddp_join_end(td_ddp *d)
{
    if (!d)
        return error_fmt(TD_ERR_INVALID, "td_ddp_join_end: ddp is NULL");
    if (!ddp_join_on(d))
        return error_fmt(TD_ERR_INVALID, "td_ddp_join_end: not in a join context (td_ddp_join_begin)");
    ddp_join *j = d->join;
    ddp_join_settle(j);
    td_status st = TD_OK;
    if (j->thrown) { /* the exception already left the context */
        j->enabled = false;
        return TD_OK;
    }
    bool is_last_joiner = true;
    for (;;) {
        double active = 0;
        st = ddp_join_all_reduce_one(d, 0, TD_OP_SUM, &active); /* shadows the notice */
        if (st != TD_OK || active == 0)
            break;
        if (j->throw_early) {
            double ignored;
            st = ddp_join_all_reduce_one(d, 1, TD_OP_SUM, &ignored); /* answers the early-termination check */
            if (st == TD_OK)
                st = error_fmt(TD_ERR_INVALID, "Rank %d exhausted all inputs.", d->rank);
            break;
        }
        st = ddp_maybe_rebuild(d);
        int src = 0;
        if (st == TD_OK && d->broadcast_buffers && d->n_buffers > 0 && d->world_size > 1) {
            st = ddp_join_buffer_source(d, false, &src);
            if (st == TD_OK)
                st = ddp_sync_buffers(d, src);
        }
        double sync = 0;
        if (st == TD_OK)
            st = ddp_join_all_reduce_one(d, 0, TD_OP_SUM, &sync); /* shadows the backward-sync flag */
        if (st == TD_OK && sync != 0)
            st = ddp_join_shadow_backward(d);
        if (st != TD_OK)
            break;
        is_last_joiner = false;
    }
    if (st == TD_OK) { /* _sync_final_model: the last joiner's copy (ties: the highest rank) */
        double src = 0;
        st = ddp_join_all_reduce_one(d, is_last_joiner ? d->rank : -1, TD_OP_MAX, &src);
        if (st == TD_OK) {
            int n = d->n_params + d->n_buffers;
            td_tensor **all = TD_NEW_ARRAY(td_tensor *, n);
            for (int i = 0; i < d->n_params; i++)
                all[i] = d->params[i].tensor;
            for (int i = 0; i < d->n_buffers; i++)
                all[d->n_params + i] = d->buffers[i];
            bool prev = td_autograd_set_grad_enabled(false);
            st = ddp_broadcast_all(d->pg, all, n, (int)src);
            td_autograd_set_grad_enabled(prev);
            free(all);
        }
    }
    j->enabled = false;
    return st;
}

void ddp_join_free(td_ddp *d)
{
    if (!d->join)
        return;
    ddp_join_settle(d->join);
    free(d->join);
    d->join = NULL;
}
