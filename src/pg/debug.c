/* The names of the front end's operations, debug levels (TDIST_DEBUG=OFF|INFO|DETAIL) and
 * DETAIL's collective consistency check. A leaf of src/pg: pg.c runs the check's exchange and asks
 * this file to fill and compare the fingerprints.
 *
 * Under DETAIL every collective is preceded, on the worker and through the same backend, by an
 * all_gather of a fixed-size fingerprint (sequence number, op type, dtype, shape, root, reduce op)
 * as c10d's ProcessGroupWrapper does. When any rank's fingerprint differs from rank 0's, every rank
 * fails the call with the same message naming both sides, instead of running mismatched
 * collectives into a hang or corrupt data; the group stays usable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/env.h"
#include "base/error.h"
#include "base/map.h"
#include "pg/pg_impl.h"

static const char *const op_type_names[PG_OP_COUNT] = {
    "BROADCAST", "ALLREDUCE", "ALLREDUCE_COALESCED", "REDUCE", "ALLGATHER", "_ALLGATHER_BASE",
    "ALLGATHER_COALESCED", "GATHER", "SCATTER", "REDUCE_SCATTER", "_REDUCE_SCATTER_BASE", "ALLTOALL",
    "ALLTOALL_BASE", "BARRIER", "SEND", "RECV", "RECVANYSOURCE", "FINGERPRINT",
};
static const char *const op_api_names[PG_OP_COUNT] = {
    "broadcast", "all_reduce", "all_reduce_coalesced", "reduce", "all_gather", "all_gather_into_tensor",
    "all_gather_coalesced", "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
    "all_to_all_single", "barrier", "send", "recv", "recvAnySource", "collective_fingerprint",
};

const char *pg_op_type_name(pg_op op) { return (int)op >= 0 && op < PG_OP_COUNT ? op_type_names[op] : "UNKNOWN"; }
const char *pg_op_api_name(pg_op op) { return (int)op >= 0 && op < PG_OP_COUNT ? op_api_names[op] : "unknown"; }

static const char *const level_names[] = {"OFF", "INFO", "DETAIL", NULL};

td_status pg_parse_debug_level(const char *value, pg_debug_level *out)
{
    int level = PG_DEBUG_OFF;
    if (!value) {
        /* TDIST_DEBUG, else PyTorch's TORCH_DISTRIBUTED_DEBUG; a bad value's message names the
         * variable that was set. */
        static const char *const names[] = ENV_DEBUG_NAMES;
        const char *which = NULL;
        env_get_first(names, &which);
        TD_TRY(env_get_enum(which, level_names, PG_DEBUG_OFF, &level));
        *out = (pg_debug_level)level;
        return TD_OK;
    }
    for (int i = 0; level_names[i]; i++) {
        if (strcasecmp(value, level_names[i]) == 0) {
            *out = (pg_debug_level)i;
            return TD_OK;
        }
    }
    return error_fmt(TD_ERR_INVALID, "The value of TDIST_DEBUG must be OFF, INFO, or DETAIL. Got '%s'.", value);
}

void pg_fingerprint_fill_now(td_work *w, td_tensor *const *tensors, int n, int root, int reduce_op, bool shapes)
{
    pg_fingerprint *fp = &w->fp;
    memset(fp, 0, sizeof *fp);
    w->has_fp = true;
    fp->op = w->op;
    fp->dtype = w->coll.dtype;
    fp->root = root;
    fp->reduce_op = reduce_op;
    fp->ntensors = n;
    fp->ndim = -1;
    if (!shapes || n <= 0 || !tensors[0])
        return;
    td_shape s = td_tensor_shape(tensors[0]);
    fp->ndim = s.ndim;
    memcpy(fp->shape, s.d, sizeof(int64_t) * (size_t)s.ndim);
    uint64_t h = 0;
    for (int i = 0; i < n; i++) {
        if (!tensors[i])
            continue;
        td_shape si = td_tensor_shape(tensors[i]);
        h = map_hash_bytes(si.d, sizeof(int64_t) * (size_t)si.ndim, h ^ (uint64_t)si.ndim);
    }
    fp->shapes_hash = (int64_t)h;
}

static void format_shape(td_buf *b, const pg_fingerprint *fp)
{
    buf_putc(b, '[');
    for (int64_t i = 0; i < fp->ndim && i < TD_MAX_DIMS; i++)
        buf_printf(b, "%s%lld", i ? ", " : "", (long long)fp->shape[i]);
    buf_putc(b, ']');
}

static const char *dtype_name(int64_t d) { return td_dtype_is_valid((int)d) ? td_dtype_name((td_dtype)d) : "?"; }
static const char *reduce_name(int64_t op)
{
    return op >= 0 && op < TD_REDUCE_OP_COUNT ? td_reduce_op_name((td_reduce_op)op) : "?";
}
static const char *op_name(int64_t op) { return op >= 0 && op < PG_OP_COUNT ? pg_op_type_name((pg_op)op) : "?"; }

static void format_fp(td_buf *b, const pg_fingerprint *fp)
{
    buf_printf(b, "CollectiveFingerPrint(SequenceNumber=%lld, OpType=%s", (long long)fp->seq, op_name(fp->op));
    if (fp->ndim >= 0) {
        buf_append_str(b, ", TensorShape=");
        format_shape(b, fp);
    }
    buf_printf(b, ", TensorDtypes=%s, TensorDeviceTypes=cpu", dtype_name(fp->dtype));
    if (fp->ntensors > 1)
        buf_printf(b, ", NumTensors=%lld", (long long)fp->ntensors);
    if (fp->root >= 0)
        buf_printf(b, ", Root=%lld", (long long)fp->root);
    if (fp->reduce_op >= 0 && fp->reduce_op < TD_REDUCE_OP_COUNT)
        buf_printf(b, ", ReduceOp=%s", td_reduce_op_name((td_reduce_op)fp->reduce_op));
    buf_putc(b, ')');
}

/* c10d's "Collectives differ in the following aspects" summary. */
static void format_diff(td_buf *b, const pg_fingerprint *a, const pg_fingerprint *o)
{
    buf_append_str(b, " Collectives differ in the following aspects:");
    if (a->seq != o->seq)
        buf_printf(b, " Sequence number: %lld vs %lld;", (long long)a->seq, (long long)o->seq);
    if (a->op != o->op)
        buf_printf(b, " Op type: %s vs %s;", op_name(a->op), op_name(o->op));
    if (a->dtype != o->dtype)
        buf_printf(b, " Tensor dtypes: %s vs %s;", dtype_name(a->dtype), dtype_name(o->dtype));
    if (a->ndim != o->ndim || memcmp(a->shape, o->shape, sizeof a->shape) != 0 || a->shapes_hash != o->shapes_hash ||
        a->ntensors != o->ntensors) {
        buf_append_str(b, " Tensor shapes: ");
        format_shape(b, a);
        buf_append_str(b, " vs ");
        format_shape(b, o);
        buf_putc(b, ';');
    }
    if (a->root != o->root && a->root >= 0 && o->root >= 0)
        buf_printf(b, " Root: %lld vs %lld;", (long long)a->root, (long long)o->root);
    if (a->reduce_op != o->reduce_op && a->reduce_op >= 0 && o->reduce_op >= 0)
        buf_printf(b, " Reduce op: %s vs %s;", reduce_name(a->reduce_op), reduce_name(o->reduce_op));
    if (b->len && b->data[b->len - 1] == ';')
        b->data[--b->len] = '\0';
}

td_status pg_fingerprints_compare(const pg_fingerprint *fps, int n)
{
    for (int r = 1; r < n; r++) {
        if (memcmp(&fps[0], &fps[r], sizeof(pg_fingerprint)) == 0)
            continue;
        td_buf b = TD_BUF_INIT;
        buf_append_str(&b, "Detected mismatch between collectives on ranks. Rank 0 is running collective: ");
        format_fp(&b, &fps[0]);
        buf_printf(&b, ", but Rank %d is running collective: ", r);
        format_fp(&b, &fps[r]);
        buf_putc(&b, '.');
        format_diff(&b, &fps[0], &fps[r]);
        td_status st = error_set(TD_ERR_INVALID, b.data);
        buf_free(&b);
        return st;
    }
    return TD_OK;
}
