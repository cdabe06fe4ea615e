/* DistributedDataParallel's reducer (tdist/ddp.h): gradient buckets filled by autograd hooks and
 * reduced by asynchronous collectives while the backward goes on.
 *
 * Construction checks the model across ranks (an all_gather of the parameter count, then of the
 * shapes), broadcasts the parameters and buffers from rank 0, lays the parameters that require
 * grad out in buckets (reverse order, per dtype, size caps) and puts a post-accumulate hook on each.
 * td_ddp_post_forward arms the reducer for one backward (and, with find_unused_parameters, walks
 * the outputs' graph for the parameters it does not reach). In the backward, each hook copies its
 * parameter's .grad into the bucket (divided by the world size, unless a comm hook does the
 * reduction) and counts the bucket down; ready buckets start in index order (the same collective
 * sequence on every rank), and the hook that starts the last one finalizes: waits for every bucket,
 * and with find_unused_parameters for the all_reduce of the used-parameter map, then writes the
 * averaged gradients back into .grad (or points .grad at its bucket slice). A backward that leaves
 * a parameter unmarked leaves the reducer armed, and the next step fails with PyTorch's error.
 * The order gradients arrived in during the first iteration (rank 0's, broadcast) rebuilds the
 * buckets once, at the next td_ddp_pre_forward. The built-in comm hooks live in comm_hooks.c. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/ddp.h>

#include "autograd/autograd_impl.h"
#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/map.h"
#include "base/thread.h"
#include "base/vec.h"
#include "ddp/ddp_impl.h"
#include "pg/pg_impl.h"

#define DDP_DEFAULT_CAP (25LL << 20)
#define DDP_DEFAULT_FIRST (1LL << 20)

/* ---- buckets ---------------------------------------------------------------------------------- */

static void ddp_buckets_free(td_ddp *d)
{
    for (int b = 0; b < d->num_buckets; b++) {
        ddp_bucket *bk = &d->buckets[b];
        td_future_release(bk->work);
        td_tensor_release(bk->buffer);
        free(bk->params);
    }
    free(d->buckets);
    d->buckets = NULL;
    d->num_buckets = 0;
    for (int i = 0; i < d->n_params; i++) {
        td_tensor_release(d->params[i].view);
        d->params[i].view = NULL;
    }
}

/* Lays the reduced parameters out in buckets, walking them in `order` (indices of reduced
 * parameters): one open bucket per dtype, closed when it reaches its cap (the first bucket's cap
 * for the first one closed). */
static td_status ddp_buckets_build(td_ddp *d, const int *order, int n)
{
    ddp_buckets_free(d);
    ddp_bucket *bks = TD_NEW_ARRAY(ddp_bucket, n ? n : 1);
    int nb = 0;
    int open[TD_DTYPE_COUNT];
    bool closed_one[TD_DTYPE_COUNT]; /* the dtype's first bucket has its own, smaller cap */
    for (int t = 0; t < TD_DTYPE_COUNT; t++) {
        open[t] = -1;
        closed_one[t] = false;
    }
    int64_t *bytes = TD_NEW_ARRAY(int64_t, n ? n : 1);
    for (int k = 0; k < n; k++) {
        int i = order[k];
        ddp_param *p = &d->params[i];
        td_dtype dt = td_tensor_dtype(p->tensor);
        int b = open[dt];
        if (b < 0) {
            b = open[dt] = nb++;
            bks[b].dtype = dt;
            bks[b].params = TD_NEW_ARRAY(int, n);
        }
        ddp_bucket *bk = &bks[b];
        p->bucket = b;
        p->offset = bk->numel;
        p->numel = td_tensor_numel(p->tensor);
        bk->params[bk->n_params++] = i;
        bk->numel += p->numel;
        bytes[b] += p->numel * (int64_t)td_dtype_size(dt);
        if (bytes[b] >= (closed_one[dt] ? d->cap : d->first_cap)) {
            open[dt] = -1;
            closed_one[dt] = true;
        }
    }
    free(bytes);
    d->buckets = bks;
    d->num_buckets = nb;
    td_status st = TD_OK;
    for (int b = 0; b < nb && st == TD_OK; b++) {
        ddp_bucket *bk = &bks[b];
        bk->index = b;
        bk->ddp = d;
        st = td_tensor_zeros(bk->dtype, TD_SHAPE(bk->numel), &bk->buffer);
        for (int k = 0; k < bk->n_params && st == TD_OK; k++) {
            ddp_param *p = &d->params[bk->params[k]];
            td_tensor *flat = NULL;
            st = td_tensor_narrow(bk->buffer, 0, p->offset, p->numel, &flat);
            if (st == TD_OK)
                st = td_tensor_view(flat, td_tensor_shape(p->tensor), &p->view);
            td_tensor_release(flat);
        }
    }
    return st;
}

/* ---- model checks and state sync ------------------------------------------------------------- */

static void ddp_format_sizes(const int64_t *sizes, int ndim, char *out, size_t len)
{
    size_t used = (size_t)snprintf(out, len, "[");
    for (int k = 0; k < ndim && used < len; k++)
        used += (size_t)snprintf(out + used, len - used, "%s%" PRId64, k ? ", " : "", sizes[k]);
    if (used < len)
        snprintf(out + used, len - used, "]");
}

/* verify_params_across_processes: the count, then each shape against rank 0's. */
static td_status ddp_verify_model(td_ddp *d)
{
    int ws = d->world_size, rank = d->rank, n = d->n_reduced;
    td_tensor *mine = NULL, *all = NULL;
    TD_TRY(td_tensor_full(TD_INT64, TD_SHAPE(1), (double)n, &mine));
    td_status st = td_tensor_empty(TD_INT64, TD_SHAPE(ws), &all);
    if (st == TD_OK)
        st = td_pg_all_gather_into_tensor(d->pg, all, mine, NULL);
    for (int r = 0; r < ws && st == TD_OK; r++) {
        int64_t m = ((const int64_t *)td_tensor_data(all))[r];
        if (m != n)
            st = error_fmt(TD_ERR_INVALID,
                           "DDP expects same model across all ranks, but Rank %d has %d params, while rank %d has "
                           "inconsistent %" PRId64 " params.",
                           rank, n, r, m);
    }
    td_tensor_release(mine);
    td_tensor_release(all);
    mine = all = NULL;
    if (st != TD_OK || n == 0)
        return st;
    /* Each parameter as ndim then TD_MAX_DIMS sizes (-1 past ndim). */
    const int row = 1 + TD_MAX_DIMS;
    st = td_tensor_full(TD_INT64, TD_SHAPE((int64_t)n * row), -1, &mine);
    if (st == TD_OK)
        st = td_tensor_empty(TD_INT64, TD_SHAPE((int64_t)ws * n * row), &all);
    if (st == TD_OK) {
        int64_t *m = td_tensor_data(mine);
        for (int k = 0; k < n; k++) {
            const td_tensor *t = d->params[d->reduced[k]].tensor;
            m[k * row] = td_tensor_ndim(t);
            memcpy(m + k * row + 1, td_tensor_sizes(t), sizeof(int64_t) * (size_t)td_tensor_ndim(t));
        }
        st = td_pg_all_gather_into_tensor(d->pg, all, mine, NULL);
    }
    /* Every rank checks every rank against rank 0, so that all of them fail together (PyTorch fails
     * only the rank that differs, and the others then wait in the broadcast). */
    const int64_t *r0 = st == TD_OK ? td_tensor_data(all) : NULL;
    for (int r = 0; r < ws && st == TD_OK; r++) {
        const int64_t *m = r0 + (size_t)r * (size_t)n * row;
        for (int k = 0; k < n && st == TD_OK; k++) {
            if (memcmp(m + k * row, r0 + k * row, sizeof(int64_t) * (size_t)row) != 0) {
                char sizes[256];
                ddp_format_sizes(m + k * row + 1, (int)m[k * row], sizes, sizeof sizes);
                if (r == rank)
                    st = error_fmt(TD_ERR_INVALID,
                                   "[%d]: params[%d] in this process with sizes %s appears not to match sizes of the "
                                   "same param in process 0.",
                                   rank, k, sizes);
                else
                    st = error_fmt(TD_ERR_INVALID,
                                   "[%d]: params[%d] in process %d with sizes %s appears not to match sizes of the "
                                   "same param in process 0.",
                                   rank, k, r, sizes);
            }
        }
    }
    td_tensor_release(mine);
    td_tensor_release(all);
    return st;
}

td_status ddp_settle(td_future *work, td_status first)
{
    if (!work)
        return first;
    td_status st = td_future_wait(work, -1);
    if (st != TD_OK && first == TD_OK)
        first = error_set(st, td_future_error(work));
    td_future_release(work);
    return first;
}

/* Broadcasts ts from src, all in flight at once. */
td_status ddp_broadcast_all(td_pg *pg, td_tensor *const *ts, int n, int src)
{
    td_future **fs = TD_NEW_ARRAY(td_future *, n ? n : 1); /* zeroed: one not started stays NULL */
    td_status st = TD_OK;
    for (int i = 0; i < n && st == TD_OK; i++)
        st = td_pg_broadcast(pg, ts[i], src, &fs[i]);
    for (int i = 0; i < n; i++)
        st = ddp_settle(fs[i], st);
    free(fs);
    return st;
}

/* ---- the backward ---------------------------------------------------------------------------- */

/* Records the thread's last error in the logging record. */
static void ddp_set_error(td_ddp *d)
{
    d->has_error = true;
    snprintf(d->error, sizeof d->error, "%s", td_last_error());
}

/* Adds the bucket's reduced values (the comm hook's result when it gave one) into place. */
static td_status ddp_bucket_result(ddp_bucket *bk)
{
    td_status st = td_future_wait(bk->work, -1);
    if (st != TD_OK)
        return error_set(st, td_future_error(bk->work));
    td_value *v = td_future_value(bk->work); /* borrowed */
    if (v && td_value_kind_of(v) == TD_VAL_TENSOR) {
        td_tensor *r = td_value_get_tensor(v);
        if (r != bk->buffer && td_tensor_data(r) != td_tensor_data(bk->buffer)) {
            if (td_tensor_numel(r) != bk->numel)
                st = error_fmt(TD_ERR_INVALID,
                               "DDP comm hook: the future of bucket %d holds %" PRId64 " elements, expected %" PRId64,
                               bk->index, td_tensor_numel(r), bk->numel);
            else
                st = td_tensor_copy(bk->buffer, r);
        }
    }
    return st;
}

td_status ddp_launch(td_ddp *d, ddp_bucket *bk)
{
    int64_t now = clock_now_ns();
    if (d->first_launch_ns == 0)
        d->first_launch_ns = now;
    bk->is_last = bk->index == d->num_buckets - 1;
    td_status st;
    if (d->hook)
        st = d->hook(d->hook_state, bk, &bk->work);
    else
        st = td_pg_all_reduce(d->pg, bk->buffer, TD_OP_SUM, &bk->work);
    if (st == TD_OK && !bk->work)
        st = error_fmt(TD_ERR_INVALID, "DDP comm hook returned no future for bucket %d", bk->index);
    return st;
}

/* t /= n in place (the bucket's view of a gradient, or a comm hook's buffer). */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3"))) /* gcc vectorizes the division loops only at -O3 */
#endif
td_status ddp_divide(td_tensor *t, int n)
{
    if (n == 1)
        return TD_OK;
    td_dtype dt = td_tensor_dtype(t);
    int64_t len = td_tensor_numel(t);
    if (dt == TD_FLOAT32 && td_tensor_is_contiguous(t)) {
        float *p = td_tensor_data(t), f = (float)n;
        for (int64_t i = 0; i < len; i++)
            p[i] /= f;
        return TD_OK;
    }
    if (dt == TD_FLOAT64 && td_tensor_is_contiguous(t)) {
        double *p = td_tensor_data(t);
        for (int64_t i = 0; i < len; i++)
            p[i] /= n;
        return TD_OK;
    }
    td_tensor *q = NULL;
    TD_TRY(td_tensor_div_scalar(t, td_scalar_int(n), &q));
    td_status st = td_tensor_copy(t, q);
    td_tensor_release(q);
    return st;
}

/* Copies parameter i's gradient (none: zeros) into its bucket slice. */
static td_status ddp_copy_grad(td_ddp *d, int i)
{
    ddp_param *p = &d->params[i];
    td_tensor *g = td_autograd_get_grad(p->tensor);
    td_status st = TD_OK;
    if (!g)
        st = td_tensor_fill(p->view, 0);
    else if (td_tensor_data(g) != td_tensor_data(p->view))
        st = td_tensor_copy(p->view, g);
    td_tensor_release(g);
    if (st == TD_OK && !d->hook) {
        if (d->div_factor == 0)
            st = ddp_join_div_factor(d, &d->div_factor);
        if (st == TD_OK)
            st = ddp_divide(p->view, d->div_factor);
    }
    return st;
}

/* Writes the reduced gradients back (finalize_backward). */
static td_status ddp_write_back(td_ddp *d, const int32_t *global_used)
{
    td_status st = TD_OK;
    for (int k = 0; k < d->n_reduced && st == TD_OK; k++) {
        int i = d->reduced[k];
        ddp_param *p = &d->params[i];
        if (global_used && global_used[k] == 0)
            continue; /* unused on every rank: .grad is left as it was */
        td_tensor *g = td_autograd_get_grad(p->tensor);
        if (d->as_view) {
            if (!g || td_tensor_data(g) != td_tensor_data(p->view))
                st = td_autograd_set_grad(p->tensor, p->view);
        } else if (g) {
            st = td_tensor_copy(g, p->view);
        } else {
            td_tensor *c = NULL;
            st = td_tensor_clone(p->view, &c);
            if (st == TD_OK)
                st = td_autograd_set_grad(p->tensor, c);
            td_tensor_release(c);
        }
        td_tensor_release(g);
    }
    return st;
}

static td_status ddp_finalize(td_ddp *d)
{
    td_status st = TD_OK;
    td_future *used_work = NULL;
    td_tensor *used = NULL;
    if (d->find_unused) {
        /* The map of parameters used on this rank, summed over the ranks, in the same place of the
         * collective sequence on every rank (right after the last bucket). */
        st = td_tensor_zeros(TD_INT32, TD_SHAPE(d->n_reduced), &used);
        if (st == TD_OK) {
            int32_t *u = td_tensor_data(used);
            for (int k = 0; k < d->n_reduced; k++)
                u[k] = d->params[d->reduced[k]].used ? 1 : 0;
            st = td_pg_all_reduce(d->pg, used, TD_OP_SUM, &used_work);
        }
    }
    for (int b = 0; b < d->num_buckets; b++) {
        td_status s = ddp_bucket_result(&d->buckets[b]);
        if (s != TD_OK && st == TD_OK)
            st = s;
    }
    st = ddp_settle(used_work, st);
    int64_t done = clock_now_ns();
    if (st == TD_OK)
        st = ddp_write_back(d, used ? td_tensor_data(used) : NULL);
    td_tensor_release(used);
    for (int b = 0; b < d->num_buckets; b++) {
        td_future_release(d->buckets[b].work);
        d->buckets[b].work = NULL;
    }
    /* The logging record. */
    d->log_backward_ns = d->last_launch_ns - d->first_hook_ns;
    d->log_comm_ns = done - d->first_launch_ns;
    int64_t hidden = d->last_launch_ns - d->first_launch_ns;
    d->log_hidden_ns = hidden < 0 ? 0 : hidden > d->log_comm_ns ? d->log_comm_ns : hidden;
    d->iteration++;
    if (st != TD_OK)
        ddp_set_error(d);
    if (d->iteration % 100 == 0)
        TD_LOG_INFO("DDP: iteration %" PRId64 ", %d buckets, backward %.3f ms, communication %.3f ms, %.0f%% "
                    "hidden behind the backward",
                    d->iteration, d->num_buckets, d->log_backward_ns / 1e6, d->log_comm_ns / 1e6,
                    d->log_comm_ns ? 100.0 * d->log_hidden_ns / d->log_comm_ns : 0.0);
    /* Ready for the next iteration. */
    d->expect_hooks = false;
    d->require_finalize = false;
    for (int i = 0; i < d->n_params; i++) {
        d->params[i].ready = false;
        d->params[i].used = false;
    }
    for (int b = 0; b < d->num_buckets; b++)
        d->buckets[b].pending = d->buckets[b].n_params;
    d->next_bucket = 0;
    d->div_factor = 0;
    d->marked_unused = false;
    d->first_hook_ns = d->first_launch_ns = d->last_launch_ns = 0;
    if (d->iteration == 1 && !d->rebuilt && d->arrival_len == d->n_reduced)
        d->rebuild_pending = true;
    return st;
}

/* mark_variable_ready: parameter i's gradient is final for this backward. */
static td_status ddp_mark_ready(td_ddp *d, int i)
{
    ddp_param *p = &d->params[i];
    if (p->ready)
        return error_fmt(TD_ERR_INVALID,
                         "Expected to mark a variable ready only once. This error is caused by one of the following "
                         "reasons: 1) Use of a module parameter outside the `forward` function. 2) Reused parameters "
                         "in multiple reentrant backward passes. Parameter index %d was marked ready twice.",
                         p->index);
    p->ready = true;
    if (d->iteration == 0 && !d->rebuilt && d->arrival_len < d->n_reduced)
        d->arrival[d->arrival_len++] = i;
    TD_TRY(ddp_copy_grad(d, i));
    ddp_bucket *bk = &d->buckets[p->bucket];
    bk->pending--;
    while (d->next_bucket < d->num_buckets && d->buckets[d->next_bucket].pending == 0) {
        /* The backward ends when the last bucket is ready, before its launch: a launch that lets
         * the group's worker run the collective before this thread gets the core back must not
         * count as communication hidden behind the backward (one bucket would show some). */
        if (d->next_bucket == d->num_buckets - 1)
            d->last_launch_ns = clock_now_ns();
        TD_TRY(ddp_launch(d, &d->buckets[d->next_bucket]));
        d->next_bucket++;
    }
    if (d->next_bucket == d->num_buckets)
        return ddp_finalize(d);
    return TD_OK;
}

/* The post-accumulate hook of every reduced parameter. */
static td_status ddp_autograd_hook(td_tensor *leaf, void *ctx)
{
    ddp_hook_ctx *h = ctx;
    td_ddp *d = h->ddp;
    (void)leaf;
    pthread_mutex_lock(&d->mu);
    td_status st = TD_OK;
    if (d->freed) {
        pthread_mutex_unlock(&d->mu);
        return TD_OK;
    }
    ddp_param *p = &d->params[h->param];
    p->used = true;
    if (!d->expect_hooks) { /* no_sync, or a backward outside a step: .grad accumulates */
        pthread_mutex_unlock(&d->mu);
        return TD_OK;
    }
    if (d->first_hook_ns == 0)
        d->first_hook_ns = clock_now_ns();
    if (!d->marked_unused) {
        d->marked_unused = true;
        for (int k = 0; k < d->n_reduced && st == TD_OK; k++) {
            int i = d->reduced[k];
            if (d->params[i].unused && i != h->param)
                st = ddp_mark_ready(d, i);
        }
    }
    if (st == TD_OK)
        st = ddp_mark_ready(d, h->param);
    if (st != TD_OK)
        ddp_set_error(d);
    pthread_mutex_unlock(&d->mu);
    return st;
}

/* ---- find_unused_parameters: the outputs' graph ---------------------------------------------- */

static td_autograd_node *ddp_accumulator_of(const td_tensor *t)
{
    ag_meta *m = ag_meta_of(t);
    if (!m)
        return NULL;
    pthread_mutex_lock(&m->lock);
    td_autograd_node *n = m->accumulator;
    pthread_mutex_unlock(&m->lock);
    return n;
}

/* Marks unused every reduced parameter whose AccumulateGrad the outputs' graph does not reach. */
static void ddp_find_unused(td_ddp *d, td_tensor *const *outputs, int n)
{
    td_map seen = TD_MAP_INIT;
    TD_VEC(td_autograd_node *) stack = {0};
    static int mark;
    for (int k = 0; k < n; k++) {
        if (!outputs[k])
            continue;
        td_autograd_node *g = td_autograd_grad_fn(outputs[k]);
        if (!g)
            g = ddp_accumulator_of(outputs[k]); /* a parameter returned as an output */
        if (g && !map_get(&seen, &g, sizeof g)) {
            map_put(&seen, &g, sizeof g, &mark);
            TD_VEC_PUSH(&stack, g);
        }
    }
    while (stack.len) {
        td_autograd_node *g = stack.items[--stack.len];
        for (int e = 0; e < td_autograd_node_num_next(g); e++) {
            td_autograd_node *x = td_autograd_node_next(g, e);
            if (x && !map_get(&seen, &x, sizeof x)) {
                map_put(&seen, &x, sizeof x, &mark);
                TD_VEC_PUSH(&stack, x);
            }
        }
    }
    for (int k = 0; k < d->n_reduced; k++) {
        ddp_param *p = &d->params[d->reduced[k]];
        td_autograd_node *acc = ddp_accumulator_of(p->tensor);
        p->unused = !acc || !map_get(&seen, &acc, sizeof acc);
    }
    TD_VEC_FREE(&stack);
    map_free(&seen, NULL);
}

/* ---- the public API --------------------------------------------------------------------------- */

td_status td_ddp_create(td_pg *pg, td_tensor *const *params, int n_params, td_tensor *const *buffers,
                        int n_buffers, const td_ddp_options *options, td_ddp **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_ddp_create: out is NULL");
    *out = NULL;
    if (n_params <= 0 || !params)
        return error_fmt(TD_ERR_INVALID,
                         "DistributedDataParallel is not needed when a module doesn't have any parameter that "
                         "requires a gradient.");
    if (n_buffers < 0 || (n_buffers > 0 && !buffers))
        return error_fmt(TD_ERR_INVALID, "td_ddp_create: %d buffers but buffers is NULL", n_buffers);
    pg = pg_or_default(pg);
    if (!pg)
        return error_fmt(TD_ERR_INVALID, "td_ddp_create: no process group given and no default group");
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    if (options)
        o = *options;
    if (o.bucket_cap_bytes < 0 || o.first_bucket_bytes < 0)
        return error_fmt(TD_ERR_INVALID, "td_ddp_create: bucket sizes must not be negative");
    int reduced = 0;
    for (int i = 0; i < n_params; i++) {
        if (!params[i])
            return error_fmt(TD_ERR_INVALID, "td_ddp_create: parameter %d is NULL", i);
        if (!td_autograd_is_leaf(params[i]))
            return error_fmt(TD_ERR_INVALID, "td_ddp_create: parameter %d is not a leaf tensor", i);
        if (td_autograd_requires_grad(params[i]))
            reduced++;
    }
    for (int i = 0; i < n_buffers; i++)
        if (!buffers[i])
            return error_fmt(TD_ERR_INVALID, "td_ddp_create: buffer %d is NULL", i);
    if (reduced == 0)
        return error_fmt(TD_ERR_INVALID,
                         "DistributedDataParallel is not needed when a module doesn't have any parameter that "
                         "requires a gradient.");

    td_ddp *d = TD_NEW(td_ddp);
    thread_mutex_init(&d->mu);
    d->pg = pg;
    d->rank = td_pg_rank(pg);
    d->world_size = td_pg_size(pg);
    d->cap = o.bucket_cap_bytes ? o.bucket_cap_bytes : DDP_DEFAULT_CAP;
    d->first_cap = o.first_bucket_bytes ? o.first_bucket_bytes : DDP_DEFAULT_FIRST;
    d->find_unused = o.find_unused_parameters;
    d->broadcast_buffers = o.broadcast_buffers;
    d->as_view = o.gradient_as_bucket_view;
    d->static_graph = o.static_graph;
    d->debug = pg->debug;
    d->require_sync = true;
    d->n_params = n_params;
    d->params = TD_NEW_ARRAY(ddp_param, n_params);
    d->reduced = TD_NEW_ARRAY(int, reduced);
    d->arrival = TD_NEW_ARRAY(int, reduced);
    for (int i = 0; i < n_params; i++) {
        d->params[i].tensor = td_tensor_retain(params[i]);
        d->params[i].bucket = -1;
        if (td_autograd_requires_grad(params[i])) {
            d->params[i].index = d->n_reduced;
            d->reduced[d->n_reduced++] = i;
        }
        if (o.param_names && o.param_names[i])
            d->params[i].name = strdup(o.param_names[i]);
    }
    d->n_buffers = n_buffers;
    d->buffers = TD_NEW_ARRAY(td_tensor *, n_buffers ? n_buffers : 1);
    for (int i = 0; i < n_buffers; i++)
        d->buffers[i] = td_tensor_retain(buffers[i]);

    td_status st = ddp_verify_model(d);
    if (st == TD_OK) { /* _sync_module_states: parameters, then buffers, from rank 0 */
        td_tensor **all = TD_NEW_ARRAY(td_tensor *, n_params + n_buffers);
        for (int i = 0; i < n_params; i++)
            all[i] = d->params[i].tensor;
        for (int i = 0; i < n_buffers; i++)
            all[n_params + i] = d->buffers[i];
        TD_NO_GRAD st = ddp_broadcast_all(pg, all, n_params + n_buffers, 0);
        free(all);
    }
    if (st == TD_OK) {
        int *order = TD_NEW_ARRAY(int, reduced);
        for (int k = 0; k < reduced; k++)
            order[k] = d->reduced[reduced - 1 - k];
        st = ddp_buckets_build(d, order, reduced);
        free(order);
    }
    for (int b = 0; b < d->num_buckets && st == TD_OK; b++)
        d->buckets[b].pending = d->buckets[b].n_params;
    for (int k = 0; k < reduced && st == TD_OK; k++) {
        ddp_param *p = &d->params[d->reduced[k]];
        ddp_hook_ctx *h = TD_NEW(ddp_hook_ctx);
        *h = (ddp_hook_ctx){d, d->reduced[k]};
        st = td_autograd_register_post_accumulate_hook(p->tensor, ddp_autograd_hook, h, free, &p->hook);
        if (st != TD_OK)
            free(h);
        else
            p->hooked = true;
    }
    if (st != TD_OK) {
        td_ddp_free(d);
        return st;
    }
    *out = d;
    return TD_OK;
}

void td_ddp_free(td_ddp *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->freed = true;
    for (int b = 0; b < d->num_buckets; b++)
        if (d->buckets[b].work)
            td_future_wait(d->buckets[b].work, -1);
    pthread_mutex_unlock(&d->mu);
    for (int i = 0; i < d->n_params; i++) {
        if (d->params[i].hooked)
            td_autograd_remove_hook(d->params[i].tensor, d->params[i].hook);
        free(d->params[i].name);
    }
    ddp_buckets_free(d);
    for (int i = 0; i < d->n_params; i++)
        td_tensor_release(d->params[i].tensor);
    for (int i = 0; i < d->n_buffers; i++)
        td_tensor_release(d->buffers[i]);
    free(d->buffers);
    free(d->params);
    free(d->reduced);
    free(d->arrival);
    ddp_join_free(d);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

/* ensure_prior_reduction_finished's message. */
static td_status ddp_unfinished_error(td_ddp *d)
{
    char msg[4096];
    size_t used = 0;
#define DDP_APPEND(...)                                                                            \
    do {                                                                                           \
        if (used < sizeof msg)                                                                     \
            used += (size_t)snprintf(msg + used, sizeof msg - used, __VA_ARGS__);                  \
    } while (0)
    if (d->static_graph) {
        DDP_APPEND("Expected to have finished reduction in the prior iteration before starting a new one. This error "
                   "indicates that your training graph has changed in this iteration, e.g., one parameter is used "
                   "in first iteration, but then got unused in the second iteration. this is not compatible with "
                   "static_graph set to True.");
    } else {
        DDP_APPEND("Expected to have finished reduction in the prior iteration before starting a new one. This error "
                   "indicates that your module has parameters that were not used in producing loss. ");
        if (!d->find_unused)
            DDP_APPEND("You can enable unused parameter detection by passing the keyword argument "
                       "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by \n");
        else
            DDP_APPEND("Since `find_unused_parameters=True` is enabled, this likely  means that not all `forward` "
                       "outputs participate in computing loss. You can fix this by ");
        DDP_APPEND("making sure all `forward` function outputs participate in calculating loss. \nIf you already have "
                   "done the above, then the distributed data parallel module wasn't able to locate the output "
                   "tensors in the return value of your module's `forward` function. Please include the loss "
                   "function and the structure of the return value of `forward` of your module when reporting "
                   "this issue (e.g. list, dict, iterable).");
    }
    if (d->debug == PG_DEBUG_OFF) {
        DDP_APPEND(" In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG to either INFO or "
                   "DETAIL to print out information about which particular parameters did not receive gradient on "
                   "this rank as part of this error");
    } else {
        if (d->debug == PG_DEBUG_DETAIL) {
            DDP_APPEND("\nParameters which did not receive grad for rank %d: ", d->rank);
            bool first = true;
            for (int k = 0; k < d->n_reduced; k++) {
                ddp_param *p = &d->params[d->reduced[k]];
                if (!p->ready) {
                    DDP_APPEND("%s%s", first ? "" : ", ", p->name ? p->name : "?");
                    first = false;
                }
            }
        }
        DDP_APPEND("\nParameter indices which did not receive grad for rank %d: ", d->rank);
        bool first = true;
        for (int k = 0; k < d->n_reduced; k++) {
            if (!d->params[d->reduced[k]].ready) {
                DDP_APPEND("%s%d", first ? "" : " ", k);
                first = false;
            }
        }
    }
#undef DDP_APPEND
    td_status st = error_set(TD_ERR_INVALID, msg);
    ddp_set_error(d);
    return st;
}

/* Rebuilds the buckets in the order gradients arrived in the first iteration, rank 0's. */
static td_status ddp_rebuild(td_ddp *d)
{
    d->rebuild_pending = false;
    td_tensor *order = NULL;
    TD_TRY(td_tensor_empty(TD_INT64, TD_SHAPE(d->n_reduced), &order));
    int64_t *o = td_tensor_data(order);
    for (int k = 0; k < d->n_reduced; k++)
        o[k] = d->arrival[k];
    td_status st = td_pg_broadcast(d->pg, order, 0, NULL);
    int *idx = TD_NEW_ARRAY(int, d->n_reduced);
    for (int k = 0; k < d->n_reduced && st == TD_OK; k++) {
        idx[k] = (int)o[k];
        if (o[k] < 0 || o[k] >= d->n_params || d->params[o[k]].bucket < 0)
            st = error_fmt(TD_ERR_INVALID, "DDP: rank 0's rebuilt bucket order names parameter %" PRId64, o[k]);
    }
    td_tensor_release(order);
    /* With gradient_as_bucket_view, .grad points into the old buckets: keep its values. */
    td_tensor **keep = TD_NEW_ARRAY(td_tensor *, d->n_params);
    for (int i = 0; i < d->n_params && st == TD_OK; i++)
        if (d->as_view && d->params[i].view)
            keep[i] = td_autograd_get_grad(d->params[i].tensor);
    if (st == TD_OK)
        st = ddp_buckets_build(d, idx, d->n_reduced);
    for (int i = 0; i < d->n_params; i++) {
        if (keep[i] && st == TD_OK && td_tensor_data(keep[i]) != td_tensor_data(d->params[i].view)) {
            st = td_tensor_copy(d->params[i].view, keep[i]);
            if (st == TD_OK)
                st = td_autograd_set_grad(d->params[i].tensor, d->params[i].view);
        }
        td_tensor_release(keep[i]);
    }
    free(keep);
    free(idx);
    for (int b = 0; b < d->num_buckets; b++)
        d->buckets[b].pending = d->buckets[b].n_params;
    d->rebuilt = st == TD_OK;
    return st;
}

td_status ddp_maybe_rebuild(td_ddp *d)
{
    pthread_mutex_lock(&d->mu);
    td_status st = TD_OK;
    if (d->rebuild_pending && !d->static_graph && !d->find_unused)
        st = ddp_rebuild(d);
    d->rebuild_pending = false;
    pthread_mutex_unlock(&d->mu);
    return st;
}

td_status ddp_sync_buffers(td_ddp *d, int src)
{
    if (!d->broadcast_buffers || d->n_buffers == 0 || d->world_size == 1)
        return TD_OK;
    td_status st = TD_OK;
    TD_NO_GRAD st = ddp_broadcast_all(d->pg, d->buffers, d->n_buffers, src);
    return st;
}

/* DDP.forward's collectives, in its order: Join's notice, the bucket rebuild, the buffers, Join's
 * backward-sync flag. */
td_status td_ddp_pre_forward(td_ddp *d)
{
    if (!d)
        return error_fmt(TD_ERR_INVALID, "td_ddp_pre_forward: ddp is NULL");
    pthread_mutex_lock(&d->mu);
    td_status st = TD_OK;
    if (d->require_finalize)
        st = ddp_unfinished_error(d);
    pthread_mutex_unlock(&d->mu);
    if (st == TD_OK)
        st = ddp_join_notify(d);
    if (st == TD_OK)
        st = ddp_maybe_rebuild(d);
    if (st == TD_OK) {
        int src = 0;
        if (d->broadcast_buffers && d->n_buffers > 0 && d->world_size > 1)
            st = ddp_join_buffer_source(d, true, &src);
        if (st == TD_OK)
            st = ddp_sync_buffers(d, src);
    }
    if (st == TD_OK)
        st = ddp_join_sync_flag(d);
    if (st != TD_OK) {
        pthread_mutex_lock(&d->mu);
        ddp_set_error(d);
        pthread_mutex_unlock(&d->mu);
    }
    return st;
}

td_status td_ddp_post_forward(td_ddp *d, td_tensor *const *outputs, int n)
{
    if (!d)
        return error_fmt(TD_ERR_INVALID, "td_ddp_post_forward: ddp is NULL");
    if (n < 0 || (n > 0 && !outputs))
        return error_fmt(TD_ERR_INVALID, "td_ddp_post_forward: %d outputs but outputs is NULL", n);
    pthread_mutex_lock(&d->mu);
    td_status st = TD_OK;
    if (d->require_finalize)
        st = ddp_unfinished_error(d);
    if (st == TD_OK && d->require_sync && td_autograd_is_grad_enabled()) {
        d->expect_hooks = true;
        d->require_finalize = true;
        for (int k = 0; k < d->n_reduced; k++)
            d->params[d->reduced[k]].unused = false;
        if (d->find_unused)
            ddp_find_unused(d, outputs, n);
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

td_status td_ddp_set_require_sync(td_ddp *d, bool sync)
{
    if (!d)
        return error_fmt(TD_ERR_INVALID, "td_ddp_set_require_sync: ddp is NULL");
    pthread_mutex_lock(&d->mu);
    d->require_sync = sync;
    pthread_mutex_unlock(&d->mu);
    return TD_OK;
}

td_status td_ddp_register_comm_hook(td_ddp *d, void *state, td_ddp_comm_hook_fn hook)
{
    if (!d || !hook)
        return error_fmt(TD_ERR_INVALID, "td_ddp_register_comm_hook: ddp and hook must not be NULL");
    pthread_mutex_lock(&d->mu);
    td_status st = TD_OK;
    if (d->hook)
        st = error_fmt(TD_ERR_INVALID, "register_comm_hook or register_builtin_comm_hook can only be called once.");
    else if (d->iteration > 0 || d->expect_hooks)
        st = error_fmt(TD_ERR_INVALID, "register_comm_hook must be called before the first backward");
    else {
        d->hook = hook;
        d->hook_state = state;
    }
    pthread_mutex_unlock(&d->mu);
    return st;
}

td_status td_ddp_logging(const td_ddp *d, td_ddp_logging_data *out)
{
    if (!d || !out)
        return error_fmt(TD_ERR_INVALID, "td_ddp_logging: ddp and out must not be NULL");
    memset(out, 0, sizeof *out);
    td_ddp *m = (td_ddp *)d;
    pthread_mutex_lock(&m->mu);
    out->iteration = d->iteration;
    out->has_error = d->has_error;
    snprintf(out->error, sizeof out->error, "%s", d->error);
    out->num_buckets = d->num_buckets;
    for (int b = 0; b < d->num_buckets && b < 8; b++)
        out->bucket_bytes[b] = d->buckets[b].numel * (int64_t)td_dtype_size(d->buckets[b].dtype);
    out->backward_ns = d->log_backward_ns;
    out->comm_ns = d->log_comm_ns;
    out->comm_hidden_ns = d->log_hidden_ns;
    out->rebuilt = d->rebuilt;
    pthread_mutex_unlock(&m->mu);
    return TD_OK;
}

/* ---- buckets as hooks see them ---------------------------------------------------------------- */

td_tensor *td_ddp_bucket_buffer(td_ddp_bucket *b) { return b ? b->buffer : NULL; }
int td_ddp_bucket_index(const td_ddp_bucket *b) { return b ? b->index : -1; }
bool td_ddp_bucket_is_last(const td_ddp_bucket *b) { return b && b->is_last; }
int td_ddp_bucket_num_params(const td_ddp_bucket *b) { return b ? b->n_params : 0; }
td_tensor *td_ddp_bucket_param(const td_ddp_bucket *b, int i)
{
    return b && i >= 0 && i < b->n_params ? b->ddp->params[b->params[i]].tensor : NULL;
}
td_pg *td_ddp_bucket_group(const td_ddp_bucket *b) { return b ? b->ddp->pg : NULL; }
