/* The collective and point-to-point calls of tdist/pg.h: argument checks with PyTorch's messages,
 * and the normalization that backend.h promises backends.
 *
 * Each call checks everything on the caller's thread before anything is queued (a bad argument
 * fails only the caller, at once, and sends nothing), then turns its arguments into one td_coll:
 * contiguous buffers (a non-contiguous input is packed now; a non-contiguous output gets a
 * contiguous temporary that is copied back on success), list forms as per-rank block arrays, and
 * coalesced forms as one flattened buffer with views copied back into the caller's tensors. The
 * work then goes to the backend by the group's one path (pg_issue), blocking when work == NULL. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "pg/pg_impl.h"
#include "tensor/strided.h"

/* ---- checks -------------------------------------------------------------------------------- */

static td_status check_tensor(const char *arg, const td_tensor *t)
{
    if (!t)
        return error_fmt(TD_ERR_INVALID,
                        "Invalid function argument. Expected parameter `%s` of type td_tensor but got NULL instead.",
                        arg);
    return TD_OK;
}

static td_status check_list(const char *arg, td_tensor *const *ts, int n)
{
    if (!ts)
        return error_fmt(TD_ERR_INVALID,
                        "Invalid function argument. Expected parameter `%s` to be a list of %d td_tensor but got "
                        "NULL instead.",
                        arg, n);
    for (int i = 0; i < n; i++)
        if (!ts[i])
            return error_fmt(TD_ERR_INVALID,
                            "Invalid function argument. Expected parameter `%s` to be a list of td_tensor but entry "
                            "%d is NULL.",
                            arg, i);
    return TD_OK;
}

/* c10d's _ensure_all_tensors_same_type (with its double space). */
static td_status check_dtype(td_dtype want, const td_tensor *t)
{
    td_dtype got = td_tensor_dtype(t);
    if (got != want)
        return error_fmt(TD_ERR_INVALID, "Invalid usage of tensors with different dtypes Found %s and  %s",
                        td_dtype_name(want), td_dtype_name(got));
    return TD_OK;
}

static td_status check_list_dtype(td_dtype want, td_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        TD_TRY(check_dtype(want, ts[i]));
    return TD_OK;
}

static td_status check_numel(const char *opname, const char *arg, int index, const td_tensor *t, int64_t want)
{
    if (td_tensor_numel(t) != want)
        return error_fmt(TD_ERR_INVALID, "%s: invalid tensor size in `%s` at index %d (expected %lld elements, got %lld)",
                        opname, arg, index, (long long)want, (long long)td_tensor_numel(t));
    return TD_OK;
}

static td_status check_rank(const char *opname, const char *what, int r, const td_pg *g)
{
    if (r < 0 || r >= g->size)
        return error_fmt(TD_ERR_INVALID, "%s: invalid %s rank: %d (the group has %d ranks: 0 to %d)", opname, what, r,
                        g->size, g->size - 1);
    return TD_OK;
}

/* gather's and scatter's list: given on the root only (c10d's words), size tensors like the other
 * argument. side: "destination" or "source". */
static td_status check_root_list(const char *opname, const char *arg, const char *side, td_tensor *const *list,
                                 bool is_root, td_dtype dt, int64_t numel, int size)
{
    if (is_root && !list)
        return error_fmt(TD_ERR_INVALID, "Argument ``%s`` must be specified on %s rank.", arg, side);
    if (!is_root && list)
        return error_fmt(TD_ERR_INVALID, "Argument ``%s`` must NOT be specified on non-%s ranks.", arg, side);
    if (!is_root)
        return TD_OK;
    TD_TRY(check_list(arg, list, size));
    TD_TRY(check_list_dtype(dt, list, size));
    for (int r = 0; r < size; r++)
        TD_TRY(check_numel(opname, arg, r, list[r], numel));
    return TD_OK;
}

/* ---- building works ------------------------------------------------------------------------ */

/* The contiguous memory of an input: t's own, or a packed copy kept with the work. */
static td_status in_data(td_work *w, td_tensor *t, const void **out)
{
    if (td_tensor_is_contiguous(t)) {
        *out = td_tensor_data(t);
        return TD_OK;
    }
    td_tensor *c;
    TD_TRY(td_tensor_contiguous(t, &c));
    pg_work_keep(w, c);
    *out = td_tensor_data(c);
    return TD_OK;
}

/* The contiguous memory an output is written to: t's own, or a temporary copied back into t on
 * success (holding t's current values when keep is set: in-place operations read them). */
static td_status out_data(td_work *w, td_tensor *t, bool keep, void **out)
{
    if (td_tensor_is_contiguous(t)) {
        *out = td_tensor_data(t);
        return TD_OK;
    }
    td_tensor *c;
    TD_TRY(keep ? td_tensor_clone(t, &c) : td_tensor_empty(td_tensor_dtype(t), td_tensor_shape(t), &c));
    pg_work_copy_back(w, t, c);
    *out = td_tensor_data(c);
    return TD_OK;
}

/* A view of flat's elements [offset, offset + numel(like)) shaped like `like`. */
static td_status flat_view(td_tensor *flat, int64_t offset, const td_tensor *like, td_tensor **out)
{
    td_tensor *slice;
    TD_TRY(td_tensor_narrow(flat, 0, offset, td_tensor_numel(like), &slice));
    td_status st = td_tensor_view(slice, td_tensor_shape(like), out);
    td_tensor_release(slice);
    return st;
}

/* The value a collective's future completes with (only built when the caller takes the future:
 * a blocking call has no use for it). */
static td_value *result_list(td_tensor *const *ts, int n)
{
    td_value *v = td_value_list_new();
    for (int i = 0; i < n; i++)
        td_value_list_append(v, td_value_tensor(ts[i]));
    return v;
}

/* Frees w when building it failed, else queues it (blocking when work is NULL). */
static td_status issue(td_pg *g, td_work *w, td_status built, td_future **work)
{
    if (built != TD_OK) {
        pg_work_free(w);
        return built;
    }
    w->is_async = work != NULL;
    return pg_issue(g, &w, 1, work);
}

/* ---- collectives --------------------------------------------------------------------------- */

/* broadcast or all_reduce (op SUM and root -1 where they do not apply) on one tensor, in place;
 * a blocking call's work lives in this frame. */
__attribute__((always_inline)) static inline td_status in_place_work(td_pg *g, td_tensor *tensor, pg_op what,
                                                                      td_coll_kind kind, td_dtype dt, td_op op,
                                                                      int root, td_future **work)
{
    td_work local;
    td_work *w = work ? pg_work_new(g, what, kind, dt) : pg_work_init_local(&local, g, what, kind, dt);
    pg_work_set_op(w, op);
    w->coll.root = root;
    int64_t numel = strided_numel(tensor->ndim, tensor->sizes); /* the inline accessors: tensor/strided.h */
    w->coll.count = (size_t)numel;
    w->numel_in = w->numel_out = numel;
    td_status st = TD_OK;
    if (strided_is_contiguous(tensor->ndim, tensor->sizes, tensor->strides))
        w->coll.out = tensor_data_of(tensor);
    else /* a broadcast's non-roots do not read their tensor: a temporary for it needs no copy */
        st = out_data(w, tensor, kind != TD_COLL_BROADCAST || g->rank == root, &w->coll.out);
    w->coll.in = w->coll.out;
    w->result = work ? result_list(&tensor, 1) : NULL;
    pg_fingerprint_fill(w, &tensor, 1, root, kind == TD_COLL_ALL_REDUCE ? (int)op.kind : -1, true);
    return issue(g, w, st, work);
}

td_status td_pg_broadcast(td_pg *pg, td_tensor *tensor, int root, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "broadcast", &g));
    TD_TRY(check_tensor("tensor", tensor));
    TD_TRY(check_rank("broadcast", "root", root, g));
    td_dtype dt = tensor->dtype;
    TD_TRY(pg_check_supported(g, "broadcast", TD_COLL_BROADCAST, dt, TD_OP_SUM));
    return in_place_work(g, tensor, PG_OP_BROADCAST, TD_COLL_BROADCAST, dt, TD_OP_SUM, root, work);
}

td_status td_pg_all_reduce(td_pg *pg, td_tensor *tensor, td_op op, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_reduce", &g));
    TD_TRY(check_tensor("tensor", tensor));
    td_dtype dt = tensor->dtype;
    TD_TRY(pg_check_supported(g, "all_reduce", TD_COLL_ALL_REDUCE, dt, op));
    return in_place_work(g, tensor, PG_OP_ALLREDUCE, TD_COLL_ALL_REDUCE, dt, op, -1, work);
}

/* Copies n tensors into one new flat buffer (kept with w) and, when back is set, arranges for the
 * reduced values to be copied back into them. */
static td_status flatten(td_work *w, td_tensor *const *ts, int n, bool back, td_tensor **flat_out)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += td_tensor_numel(ts[i]);
    td_tensor *flat;
    TD_TRY(td_tensor_empty(w->coll.dtype, TD_SHAPE(total), &flat));
    pg_work_keep(w, flat);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        td_tensor *v;
        TD_TRY(flat_view(flat, off, ts[i], &v));
        td_status st = td_tensor_copy(v, ts[i]);
        if (st != TD_OK) {
            td_tensor_release(v);
            return st;
        }
        if (back)
            pg_work_copy_back(w, ts[i], v);
        else
            td_tensor_release(v);
        off += td_tensor_numel(ts[i]);
    }
    *flat_out = flat;
    return TD_OK;
}

td_status td_pg_all_reduce_coalesced(td_pg *pg, td_tensor *const *tensors, int n, td_op op, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_reduce_coalesced", &g));
    if (n < 1)
        return error_fmt(TD_ERR_INVALID, "all_reduce_coalesced: requires a non-empty tensor list (got %d tensors)", n);
    TD_TRY(check_list("tensors", tensors, n));
    td_dtype dt = td_tensor_dtype(tensors[0]);
    TD_TRY(check_list_dtype(dt, tensors, n));
    TD_TRY(pg_check_supported(g, "all_reduce", TD_COLL_ALL_REDUCE, dt, op));
    td_work *w = pg_work_new(g, PG_OP_ALLREDUCE_COALESCED, TD_COLL_ALL_REDUCE, dt);
    pg_work_set_op(w, op);
    td_tensor *flat = NULL;
    td_status st = flatten(w, tensors, n, true, &flat);
    if (st == TD_OK) {
        w->coll.count = (size_t)td_tensor_numel(flat);
        w->coll.out = td_tensor_data(flat);
        w->coll.in = w->coll.out;
        w->numel_in = w->numel_out = td_tensor_numel(flat);
    }
    w->result = work ? result_list(tensors, n) : NULL;
    pg_fingerprint_fill(w, tensors, n, -1, (int)op.kind, true);
    return issue(g, w, st, work);
}

td_status td_pg_reduce(td_pg *pg, td_tensor *tensor, int root, td_op op, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "reduce", &g));
    TD_TRY(check_tensor("tensor", tensor));
    TD_TRY(check_rank("reduce", "root", root, g));
    td_dtype dt = td_tensor_dtype(tensor);
    TD_TRY(pg_check_supported(g, "reduce", TD_COLL_REDUCE, dt, op));
    td_work *w = pg_work_new(g, PG_OP_REDUCE, TD_COLL_REDUCE, dt);
    pg_work_set_op(w, op);
    w->coll.root = root;
    w->coll.count = (size_t)td_tensor_numel(tensor);
    w->numel_in = w->numel_out = td_tensor_numel(tensor);
    td_status st;
    if (g->rank == root) {
        st = out_data(w, tensor, true, &w->coll.out);
    } else {
        /* The backend may use a non-root's buffer as scratch: give it a copy, so that the caller's
         * tensor keeps its values, as documented. */
        td_tensor *scratch = NULL;
        st = td_tensor_clone(tensor, &scratch);
        if (st == TD_OK) {
            pg_work_keep(w, scratch);
            w->coll.out = td_tensor_data(scratch);
        }
    }
    w->coll.in = w->coll.out;
    w->result = work ? result_list(&tensor, 1) : NULL;
    pg_fingerprint_fill(w, &tensor, 1, root, (int)op.kind, true);
    return issue(g, w, st, work);
}

/* Work for all_gather and reduce_scatter: one side is numel elements, the other world-size blocks
 * of numel (the input when split_in, as reduce_scatter; the output otherwise, as all_gather). */
static td_work *split_work(td_pg *g, pg_op kind, td_coll_kind coll, td_dtype dt, td_op op, int64_t numel,
                           bool split_in)
{
    td_work *w = pg_work_new(g, kind, coll, dt);
    pg_work_set_op(w, op);
    w->coll.count = (size_t)numel;
    w->numel_in = split_in ? numel * g->size : numel;
    w->numel_out = split_in ? numel : numel * g->size;
    pg_work_blocks(w, split_in, !split_in);
    return w;
}

td_status td_pg_all_gather(td_pg *pg, td_tensor *const *outputs, td_tensor *input, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_gather", &g));
    TD_TRY(check_tensor("tensor", input));
    TD_TRY(check_list("tensor_list", outputs, g->size));
    td_dtype dt = td_tensor_dtype(input);
    TD_TRY(check_list_dtype(dt, outputs, g->size));
    int64_t numel = td_tensor_numel(input);
    for (int r = 0; r < g->size; r++)
        TD_TRY(check_numel("all_gather", "tensor_list", r, outputs[r], numel));
    TD_TRY(pg_check_supported(g, "all_gather", TD_COLL_ALL_GATHER, dt, TD_OP_SUM));
    td_work *w = split_work(g, PG_OP_ALLGATHER, TD_COLL_ALL_GATHER, dt, TD_OP_SUM, numel, false);
    td_status st = in_data(w, input, &w->coll.in);
    for (int r = 0; r < g->size && st == TD_OK; r++) {
        st = out_data(w, outputs[r], false, &w->out_blocks[r]);
        w->out_counts[r] = (size_t)numel;
    }
    w->result = work ? result_list(outputs, g->size) : NULL;
    pg_fingerprint_fill(w, &input, 1, -1, -1, true);
    return issue(g, w, st, work);
}

td_status td_pg_all_gather_into_tensor(td_pg *pg, td_tensor *output, td_tensor *input, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_gather_into_tensor", &g));
    TD_TRY(check_tensor("output_tensor", output));
    TD_TRY(check_tensor("input_tensor", input));
    td_dtype dt = td_tensor_dtype(input);
    TD_TRY(check_dtype(dt, output));
    int64_t numel = td_tensor_numel(input);
    if (td_tensor_numel(output) != numel * g->size)
        return error_fmt(TD_ERR_INVALID, "output tensor size must be equal to world_size times input tensor size "
                                        "(world_size %d, input %lld elements, output %lld elements)",
                        g->size, (long long)numel, (long long)td_tensor_numel(output));
    TD_TRY(pg_check_supported(g, "all_gather_into_tensor", TD_COLL_ALL_GATHER, dt, TD_OP_SUM));
    td_work *w = split_work(g, PG_OP_ALLGATHER_BASE, TD_COLL_ALL_GATHER, dt, TD_OP_SUM, numel, false);
    void *base = NULL;
    td_status st = in_data(w, input, &w->coll.in);
    if (st == TD_OK)
        st = out_data(w, output, false, &base);
    size_t esize = td_dtype_size(dt);
    for (int r = 0; r < g->size && st == TD_OK; r++) {
        w->out_blocks[r] = (char *)base + (size_t)r * (size_t)numel * esize;
        w->out_counts[r] = (size_t)numel;
    }
    w->result = work ? result_list(&output, 1) : NULL;
    pg_fingerprint_fill(w, &input, 1, -1, -1, true);
    return issue(g, w, st, work);
}

td_status td_pg_all_gather_coalesced(td_pg *pg, td_tensor *const *outputs, td_tensor *const *inputs, int n,
                                     td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_gather_coalesced", &g));
    if (n < 1)
        return error_fmt(TD_ERR_INVALID, "all_gather_coalesced: requires a non-empty input tensor list (got %d)", n);
    TD_TRY(check_list("input_tensor_list", inputs, n));
    TD_TRY(check_list("output_tensor_lists", outputs, g->size * n));
    td_dtype dt = td_tensor_dtype(inputs[0]);
    TD_TRY(check_list_dtype(dt, inputs, n));
    TD_TRY(check_list_dtype(dt, outputs, g->size * n));
    for (int r = 0; r < g->size; r++)
        for (int i = 0; i < n; i++)
            TD_TRY(check_numel("all_gather_coalesced", "output_tensor_lists", r * n + i, outputs[r * n + i],
                               td_tensor_numel(inputs[i])));
    TD_TRY(pg_check_supported(g, "all_gather_coalesced", TD_COLL_ALL_GATHER, dt, TD_OP_SUM));
    td_work *w = pg_work_new(g, PG_OP_ALLGATHER_COALESCED, TD_COLL_ALL_GATHER, dt);
    pg_work_blocks(w, false, true);
    td_tensor *flat_in = NULL, *flat_out = NULL;
    td_status st = flatten(w, inputs, n, false, &flat_in);
    int64_t total = st == TD_OK ? td_tensor_numel(flat_in) : 0;
    if (st == TD_OK)
        st = td_tensor_empty(dt, TD_SHAPE(total * g->size), &flat_out);
    if (st == TD_OK) {
        pg_work_keep(w, flat_out);
        w->coll.in = td_tensor_data(flat_in);
        w->coll.count = (size_t)total;
        w->numel_in = total;
        w->numel_out = total * g->size;
        size_t esize = td_dtype_size(dt);
        for (int r = 0; r < g->size && st == TD_OK; r++) {
            w->out_blocks[r] = (char *)td_tensor_data(flat_out) + (size_t)r * (size_t)total * esize;
            w->out_counts[r] = (size_t)total;
            int64_t off = r * total;
            for (int i = 0; i < n && st == TD_OK; i++) {
                td_tensor *v;
                st = flat_view(flat_out, off, outputs[r * n + i], &v);
                if (st == TD_OK)
                    pg_work_copy_back(w, outputs[r * n + i], v);
                off += td_tensor_numel(inputs[i]);
            }
        }
    }
    w->result = work ? result_list(outputs, g->size * n) : NULL;
    pg_fingerprint_fill(w, inputs, n, -1, -1, true);
    return issue(g, w, st, work);
}

td_status td_pg_gather(td_pg *pg, td_tensor *const *outputs, td_tensor *input, int root, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "gather", &g));
    TD_TRY(check_tensor("tensor", input));
    TD_TRY(check_rank("gather", "root", root, g));
    td_dtype dt = td_tensor_dtype(input);
    int64_t numel = td_tensor_numel(input);
    bool is_root = g->rank == root;
    TD_TRY(check_root_list("gather", "gather_list", "destination", outputs, is_root, dt, numel, g->size));
    TD_TRY(pg_check_supported(g, "gather", TD_COLL_GATHER, dt, TD_OP_SUM));
    td_work *w = pg_work_new(g, PG_OP_GATHER, TD_COLL_GATHER, dt);
    w->coll.root = root;
    w->coll.count = (size_t)numel;
    w->numel_in = numel;
    w->numel_out = is_root ? numel * g->size : 0;
    td_status st = in_data(w, input, &w->coll.in);
    if (is_root) {
        pg_work_blocks(w, false, true);
        for (int r = 0; r < g->size && st == TD_OK; r++) {
            st = out_data(w, outputs[r], false, &w->out_blocks[r]);
            w->out_counts[r] = (size_t)numel;
        }
    }
    w->result = work ? result_list(outputs, is_root ? g->size : 0) : NULL;
    pg_fingerprint_fill(w, &input, 1, root, -1, true);
    return issue(g, w, st, work);
}

td_status td_pg_scatter(td_pg *pg, td_tensor *output, td_tensor *const *inputs, int root, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "scatter", &g));
    TD_TRY(check_tensor("tensor", output));
    TD_TRY(check_rank("scatter", "root", root, g));
    td_dtype dt = td_tensor_dtype(output);
    int64_t numel = td_tensor_numel(output);
    bool is_root = g->rank == root;
    TD_TRY(check_root_list("scatter", "scatter_list", "source", inputs, is_root, dt, numel, g->size));
    TD_TRY(pg_check_supported(g, "scatter", TD_COLL_SCATTER, dt, TD_OP_SUM));
    td_work *w = pg_work_new(g, PG_OP_SCATTER, TD_COLL_SCATTER, dt);
    w->coll.root = root;
    w->coll.count = (size_t)numel;
    w->numel_in = is_root ? numel * g->size : 0;
    w->numel_out = numel;
    td_status st = out_data(w, output, false, &w->coll.out);
    if (is_root) {
        pg_work_blocks(w, true, false);
        for (int r = 0; r < g->size && st == TD_OK; r++) {
            st = in_data(w, inputs[r], &w->in_blocks[r]);
            w->in_counts[r] = (size_t)numel;
        }
    }
    w->result = work ? result_list(&output, 1) : NULL;
    pg_fingerprint_fill(w, &output, 1, root, -1, true);
    return issue(g, w, st, work);
}

td_status td_pg_reduce_scatter(td_pg *pg, td_tensor *output, td_tensor *const *inputs, td_op op, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "reduce_scatter", &g));
    TD_TRY(check_tensor("output", output));
    TD_TRY(check_list("input_list", inputs, g->size));
    td_dtype dt = td_tensor_dtype(output);
    TD_TRY(check_list_dtype(dt, inputs, g->size));
    int64_t numel = td_tensor_numel(output);
    for (int r = 0; r < g->size; r++)
        TD_TRY(check_numel("reduce_scatter", "input_list", r, inputs[r], numel));
    TD_TRY(pg_check_supported(g, "reduce_scatter", TD_COLL_REDUCE_SCATTER, dt, op));
    td_work *w = split_work(g, PG_OP_REDUCE_SCATTER, TD_COLL_REDUCE_SCATTER, dt, op, numel, true);
    td_status st = out_data(w, output, false, &w->coll.out);
    for (int r = 0; r < g->size && st == TD_OK; r++) {
        st = in_data(w, inputs[r], &w->in_blocks[r]);
        w->in_counts[r] = (size_t)numel;
    }
    w->result = work ? result_list(&output, 1) : NULL;
    pg_fingerprint_fill(w, &output, 1, -1, (int)op.kind, true);
    return issue(g, w, st, work);
}

td_status td_pg_reduce_scatter_tensor(td_pg *pg, td_tensor *output, td_tensor *input, td_op op, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "reduce_scatter_tensor", &g));
    TD_TRY(check_tensor("output", output));
    TD_TRY(check_tensor("input", input));
    td_dtype dt = td_tensor_dtype(output);
    TD_TRY(check_dtype(dt, input));
    int64_t numel = td_tensor_numel(output);
    if (td_tensor_numel(input) != numel * g->size)
        return error_fmt(TD_ERR_INVALID, "input tensor must be the same size as output size times world size "
                                        "(world_size %d, output %lld elements, input %lld elements)",
                        g->size, (long long)numel, (long long)td_tensor_numel(input));
    TD_TRY(pg_check_supported(g, "reduce_scatter_tensor", TD_COLL_REDUCE_SCATTER, dt, op));
    td_work *w = split_work(g, PG_OP_REDUCE_SCATTER_BASE, TD_COLL_REDUCE_SCATTER, dt, op, numel, true);
    const void *base = NULL;
    td_status st = out_data(w, output, false, &w->coll.out);
    if (st == TD_OK)
        st = in_data(w, input, &base);
    size_t esize = td_dtype_size(dt);
    for (int r = 0; r < g->size && st == TD_OK; r++) {
        w->in_blocks[r] = (const char *)base + (size_t)r * (size_t)numel * esize;
        w->in_counts[r] = (size_t)numel;
    }
    w->result = work ? result_list(&output, 1) : NULL;
    pg_fingerprint_fill(w, &output, 1, -1, (int)op.kind, true);
    return issue(g, w, st, work);
}

td_status td_pg_all_to_all(td_pg *pg, td_tensor *const *outputs, td_tensor *const *inputs, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_to_all", &g));
    TD_TRY(check_list("output_tensor_list", outputs, g->size));
    TD_TRY(check_list("input_tensor_list", inputs, g->size));
    td_dtype dt = td_tensor_dtype(inputs[0]);
    TD_TRY(check_list_dtype(dt, inputs, g->size));
    TD_TRY(check_list_dtype(dt, outputs, g->size));
    TD_TRY(pg_check_supported(g, "all_to_all", TD_COLL_ALL_TO_ALL, dt, TD_OP_SUM));
    td_work *w = pg_work_new(g, PG_OP_ALLTOALL, TD_COLL_ALL_TO_ALL, dt);
    pg_work_blocks(w, true, true);
    td_status st = TD_OK;
    for (int r = 0; r < g->size && st == TD_OK; r++) {
        st = in_data(w, inputs[r], &w->in_blocks[r]);
        w->in_counts[r] = (size_t)td_tensor_numel(inputs[r]);
        w->numel_in += td_tensor_numel(inputs[r]);
        if (st == TD_OK)
            st = out_data(w, outputs[r], false, &w->out_blocks[r]);
        w->out_counts[r] = (size_t)td_tensor_numel(outputs[r]);
        w->numel_out += td_tensor_numel(outputs[r]);
    }
    w->result = work ? result_list(outputs, g->size) : NULL;
    pg_fingerprint_fill(w, inputs, g->size, -1, -1, false);
    return issue(g, w, st, work);
}

/* c10d's checkSplitSizes, then the element count of each rank's slice of dim 0. */
static td_status split_counts(const td_tensor *t, const int64_t *splits, int size, size_t *counts)
{
    if (td_tensor_ndim(t) < 1)
        return error_fmt(TD_ERR_INVALID, "all_to_all_single: tensors must have at least one dimension");
    int64_t dim0 = td_tensor_size(t, 0);
    int64_t row = 1;
    for (int d = 1; d < td_tensor_ndim(t); d++)
        row *= td_tensor_size(t, d);
    if (!splits) {
        if (dim0 % size != 0)
            return error_fmt(TD_ERR_INVALID, "Tensor's dim 0 does not divide equally across group size");
        for (int r = 0; r < size; r++)
            counts[r] = (size_t)(dim0 / size * row);
        return TD_OK;
    }
    int64_t sum = 0;
    for (int r = 0; r < size; r++) {
        if (splits[r] < 0)
            return error_fmt(TD_ERR_INVALID, "all_to_all_single: split sizes must be non-negative (entry %d is %lld)",
                            r, (long long)splits[r]);
        sum += splits[r];
        counts[r] = (size_t)(splits[r] * row);
    }
    if (sum != dim0)
        return error_fmt(TD_ERR_INVALID, "Split sizes doesn't match total dim 0 size");
    return TD_OK;
}

td_status td_pg_all_to_all_single(td_pg *pg, td_tensor *output, td_tensor *input, const int64_t *output_splits,
                                  const int64_t *input_splits, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_to_all_single", &g));
    TD_TRY(check_tensor("output", output));
    TD_TRY(check_tensor("input", input));
    td_dtype dt = td_tensor_dtype(input);
    TD_TRY(check_dtype(dt, output));
    TD_TRY(pg_check_supported(g, "all_to_all_single", TD_COLL_ALL_TO_ALL, dt, TD_OP_SUM));
    td_work *w = pg_work_new(g, PG_OP_ALLTOALL_BASE, TD_COLL_ALL_TO_ALL, dt);
    pg_work_blocks(w, true, true);
    const void *in = NULL;
    void *out = NULL;
    td_status st = split_counts(input, input_splits, g->size, w->in_counts);
    if (st == TD_OK)
        st = split_counts(output, output_splits, g->size, w->out_counts);
    if (st == TD_OK)
        st = in_data(w, input, &in);
    if (st == TD_OK)
        st = out_data(w, output, false, &out);
    size_t esize = td_dtype_size(dt), ioff = 0, ooff = 0;
    for (int r = 0; r < g->size && st == TD_OK; r++) {
        w->in_blocks[r] = (const char *)in + ioff * esize;
        w->out_blocks[r] = (char *)out + ooff * esize;
        ioff += w->in_counts[r];
        ooff += w->out_counts[r];
    }
    w->numel_in = td_tensor_numel(input);
    w->numel_out = td_tensor_numel(output);
    w->result = work ? result_list(&output, 1) : NULL;
    pg_fingerprint_fill(w, &input, 1, -1, -1, false);
    return issue(g, w, st, work);
}

td_status td_pg_barrier(td_pg *pg, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "barrier", &g));
    td_work *w = pg_work_new(g, PG_OP_BARRIER, TD_COLL_BARRIER, TD_UINT8);
    pg_fingerprint_fill(w, NULL, 0, -1, -1, false);
    return issue(g, w, TD_OK, work);
}

/* ---- point to point ------------------------------------------------------------------------ */

static td_status build_p2p(td_pg *g, bool is_send, td_tensor *t, int peer, int tag, td_work **out)
{
    const char *opname = is_send ? "send" : "recv";
    TD_TRY(check_tensor("tensor", t));
    if (is_send || peer != TD_ANY_SOURCE) {
        TD_TRY(check_rank(opname, is_send ? "destination" : "source", peer, g));
        if (peer == g->rank)
            return error_fmt(TD_ERR_INVALID,
                            is_send ? "Invalid destination rank: destination rank should not be the same as the rank "
                                      "of the current process."
                                    : "Invalid source rank: source rank should not be the same as the rank of the "
                                      "current process.");
    }
    if (tag < 0)
        return error_fmt(TD_ERR_INVALID, "%s: tag must be non-negative, got %d", opname, tag);
    td_dtype dt = td_tensor_dtype(t);
    TD_TRY(pg_check_supported(g, opname, is_send ? TD_COLL_SEND : TD_COLL_RECV, dt, TD_OP_SUM));
    pg_op op = is_send ? PG_OP_SEND : (peer == TD_ANY_SOURCE ? PG_OP_RECVANYSOURCE : PG_OP_RECV);
    td_work *w = pg_work_new(g, op, is_send ? TD_COLL_SEND : TD_COLL_RECV, dt);
    w->coll.peer = peer;
    w->coll.tag = tag;
    w->coll.count = (size_t)td_tensor_numel(t);
    w->fp.ndim = -1;
    if (pg_traced(g)) { /* the shape is for traces only: p2p has no DETAIL check */
        td_shape shape = td_tensor_shape(t);
        w->fp.ndim = shape.ndim;
        memcpy(w->fp.shape, shape.d, sizeof(int64_t) * (size_t)shape.ndim);
    }
    td_status st;
    if (is_send) {
        w->numel_in = td_tensor_numel(t);
        st = in_data(w, t, &w->coll.in);
        w->result = result_list(&t, 1);
    } else {
        w->numel_out = td_tensor_numel(t);
        st = out_data(w, t, false, &w->coll.out);
        w->value_sender = true;
    }
    if (st != TD_OK) {
        pg_work_free(w);
        return st;
    }
    *out = w;
    return TD_OK;
}

td_status td_pg_send(td_pg *pg, td_tensor *tensor, int dst, int tag, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "send", &g));
    td_work *w;
    TD_TRY(build_p2p(g, true, tensor, dst, tag, &w));
    w->is_async = work != NULL;
    return pg_issue(g, &w, 1, work);
}

td_status td_pg_recv(td_pg *pg, td_tensor *tensor, int src, int tag, int *sender, td_future **work)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "recv", &g));
    td_work *w;
    TD_TRY(build_p2p(g, false, tensor, src, tag, &w));
    w->is_async = work != NULL;
    if (work)
        return pg_issue(g, &w, 1, work);
    td_future *f;
    TD_TRY(pg_issue(g, &w, 1, &f));
    td_status st = td_future_wait(f, 0);
    if (st == TD_OK && sender)
        *sender = (int)td_value_get_int(td_future_value(f));
    td_future_release(f);
    return st;
}

td_status td_pg_batch_isend_irecv(td_pg *pg, const td_p2p_op *ops, int n, td_future **works)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "batch_isend_irecv", &g));
    if (n < 1 || !ops)
        return error_fmt(TD_ERR_INVALID, "Invalid ``p2p_op_list``: batch_isend_irecv needs at least one op");
    td_work **ws = alloc_zeroed((size_t)n, sizeof *ws);
    for (int i = 0; i < n; i++) {
        td_status st = build_p2p(g, ops[i].is_send, ops[i].tensor, ops[i].peer, ops[i].tag, &ws[i]);
        if (st != TD_OK) {
            for (int j = 0; j < i; j++)
                pg_work_free(ws[j]);
            free(ws);
            return error_prefix(st, "batch_isend_irecv: op %d", i);
        }
        ws[i]->is_async = works != NULL;
    }
    td_status st = pg_issue(g, ws, n, works);
    free(ws);
    return st;
}

/* ---- capability queries -------------------------------------------------------------------- */

/* The API names td_pg_supports accepts, with the backend kind each one runs as. */
static const struct {
    const char *name;
    td_coll_kind kind;
} api_kinds[] = {
    {"broadcast", TD_COLL_BROADCAST},
    {"all_reduce", TD_COLL_ALL_REDUCE},
    {"all_reduce_coalesced", TD_COLL_ALL_REDUCE},
    {"reduce", TD_COLL_REDUCE},
    {"all_gather", TD_COLL_ALL_GATHER},
    {"all_gather_into_tensor", TD_COLL_ALL_GATHER},
    {"all_gather_coalesced", TD_COLL_ALL_GATHER},
    {"all_gather_object", TD_COLL_ALL_GATHER},
    {"gather", TD_COLL_GATHER},
    {"gather_object", TD_COLL_GATHER},
    {"scatter", TD_COLL_SCATTER},
    {"scatter_object_list", TD_COLL_SCATTER},
    {"broadcast_object_list", TD_COLL_BROADCAST},
    {"reduce_scatter", TD_COLL_REDUCE_SCATTER},
    {"reduce_scatter_tensor", TD_COLL_REDUCE_SCATTER},
    {"all_to_all", TD_COLL_ALL_TO_ALL},
    {"all_to_all_single", TD_COLL_ALL_TO_ALL},
    {"barrier", TD_COLL_BARRIER},
    {"monitored_barrier", TD_COLL_BARRIER},
    {"send", TD_COLL_SEND},
    {"isend", TD_COLL_SEND},
    {"recv", TD_COLL_RECV},
    {"irecv", TD_COLL_RECV},
};

td_status td_pg_supports(const td_pg *cpg, const char *collective, td_dtype dtype, td_reduce_op op)
{
    td_pg *pg;
    TD_TRY(pg_resolve((td_pg *)cpg, "supports", &pg));
    if (!collective)
        return error_fmt(TD_ERR_INVALID, "td_pg_supports: collective name is NULL");
    for (size_t i = 0; i < sizeof api_kinds / sizeof api_kinds[0]; i++) {
        if (strcmp(api_kinds[i].name, collective) != 0)
            continue;
        td_status st = pg_check_supported(pg, collective, api_kinds[i].kind, dtype, td_op_of(op));
        return st == TD_ERR_INVALID ? TD_ERR_UNSUPPORTED : st;
    }
    return error_fmt(TD_ERR_INVALID, "td_pg_supports: unknown collective '%s'", collective);
}
