/* DDP's built-in communication hooks (tdist/ddp.h; torch.distributed.algorithms.ddp_comm_hooks'
 * default_hooks): allreduce_hook (divide by the group size, then an asynchronous all_reduce SUM of
 * the bucket in place, the reducer's own default) and the compress hooks (the same on a float16 or
 * bfloat16 copy, cast back into the bucket when the all_reduce completes, through td_future_then).
 * The state is the group to reduce over, NULL for the DDP model's own. */
#include <stdlib.h>

#include <tdist/ddp.h>

#include "base/error.h"
#include "ddp/ddp_impl.h"

static td_pg *ddp_hook_group(void *state, td_ddp_bucket *bucket)
{
    return state ? (td_pg *)state : td_ddp_bucket_group(bucket);
}

td_status ddp_average_async(td_pg *pg, td_tensor *buf, td_future **out)
{
    TD_TRY(ddp_divide(buf, td_pg_size(pg)));
    return td_pg_all_reduce(pg, buf, TD_OP_SUM, out);
}

td_status td_ddp_allreduce_hook(void *state, td_ddp_bucket *bucket, td_future **out)
{
    if (!bucket || !out)
        return error_fmt(TD_ERR_INVALID, "td_ddp_allreduce_hook: bucket and out must not be NULL");
    return ddp_average_async(ddp_hook_group(state, bucket), td_ddp_bucket_buffer(bucket), out);
}

typedef struct ddp_compressed {
    td_tensor *bucket;     /* retained */
    td_tensor *compressed; /* the all_reduce's tensor */
} ddp_compressed;

static td_status ddp_decompress(td_future *parent, void *arg, td_value **result)
{
    ddp_compressed *c = arg;
    td_status st = td_future_status(parent);
    if (st != TD_OK)
        st = td_future_propagate_error(parent);
    else
        st = td_tensor_copy(c->bucket, c->compressed); /* casts back */
    if (st == TD_OK)
        *result = td_value_tensor(c->bucket);
    td_tensor_release(c->bucket);
    td_tensor_release(c->compressed);
    free(c);
    return st;
}

static td_status ddp_compress_hook(td_dtype dtype, void *state, td_ddp_bucket *bucket, td_future **out)
{
    if (!bucket || !out)
        return error_fmt(TD_ERR_INVALID, "DDP compress hook: bucket and out must not be NULL");
    td_pg *pg = ddp_hook_group(state, bucket);
    td_tensor *buf = td_ddp_bucket_buffer(bucket), *low = NULL;
    TD_TRY(td_tensor_to(buf, dtype, &low));
    td_status st = ddp_divide(low, td_pg_size(pg));
    td_future *work = NULL;
    if (st == TD_OK)
        st = td_pg_all_reduce(pg, low, TD_OP_SUM, &work);
    if (st != TD_OK) {
        td_tensor_release(low);
        return st;
    }
    ddp_compressed *c = malloc(sizeof *c);
    if (!c) {
        td_future_wait(work, -1);
        td_future_release(work);
        td_tensor_release(low);
        return error_fmt(TD_ERR_NOMEM, "DDP compress hook: out of memory");
    }
    *c = (ddp_compressed){td_tensor_retain(buf), low};
    *out = td_future_then(work, ddp_decompress, c);
    td_future_release(work);
    return TD_OK;
}

td_status td_ddp_fp16_compress_hook(void *state, td_ddp_bucket *bucket, td_future **out)
{
    return ddp_compress_hook(TD_FLOAT16, state, bucket, out);
}

td_status td_ddp_bf16_compress_hook(void *state, td_ddp_bucket *bucket, td_future **out)
{
    return ddp_compress_hook(TD_BFLOAT16, state, bucket, out);
}
