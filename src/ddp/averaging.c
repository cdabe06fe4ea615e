/* Post-local SGD and periodic model averaging (tdist/ddp.h; torch.distributed.algorithms'
 * post_localSGD_hook and model_averaging.averagers.PeriodicModelAverager), the other users of DDP's
 * comm hooks: the hook averages gradients over the whole group for the first iterations and over a
 * subgroup afterwards; the averager replaces the parameters by their group average every period
 * steps, which keeps the replicas of a local-SGD run from drifting apart. */
#include <stdlib.h>

#include <tdist/autograd.h>
#include <tdist/ddp.h>

#include "base/error.h"
#include "ddp/ddp_impl.h"
#include "pg/pg_impl.h"

td_status td_ddp_post_local_sgd_hook(void *state, td_ddp_bucket *bucket, td_future **out)
{
    td_post_local_sgd_state *s = state;
    if (!s || !bucket || !out)
        return error_fmt(TD_ERR_INVALID, "td_ddp_post_local_sgd_hook: state, bucket and out must not be NULL");
    td_pg *global = s->process_group ? s->process_group : td_ddp_bucket_group(bucket);
    td_tensor *buf = td_ddp_bucket_buffer(bucket);
    if (s->iter < s->start_local_sgd_iter) {
        if (td_ddp_bucket_is_last(bucket))
            s->iter++;
        return ddp_average_async(global, buf, out);
    }
    if (!s->post_local_gradient_allreduce) { /* the local gradients as they are */
        *out = td_future_completed(td_value_tensor(buf));
        return TD_OK;
    }
    return ddp_average_async(s->subgroup ? s->subgroup : global, buf, out);
}

td_status td_model_average_parameters(td_model_averager *a, td_tensor *const *params, int n, bool *averaged)
{
    if (averaged)
        *averaged = false;
    if (!a || (n > 0 && !params) || n < 0)
        return error_fmt(TD_ERR_INVALID, "td_model_average_parameters: averager and params must not be NULL");
    if (a->period < 1)
        return error_fmt(TD_ERR_INVALID, "Arg ``period`` must be a positive value.");
    int64_t step = a->step++;
    if (step < a->warmup_steps || (step - a->warmup_steps) % a->period != 0)
        return TD_OK;
    td_pg *pg = pg_or_default(a->process_group);
    if (!pg)
        return error_fmt(TD_ERR_INVALID, "td_model_average_parameters: no process group given and no default group");
    for (int i = 0; i < n; i++) /* before any collective starts: none is left half-issued */
        if (!params[i])
            return error_fmt(TD_ERR_INVALID, "td_model_average_parameters: parameter %d is NULL", i);
    td_future **fs = calloc((size_t)(n ? n : 1), sizeof *fs);
    if (!fs)
        return error_fmt(TD_ERR_NOMEM, "td_model_average_parameters: out of memory");
    td_status st = TD_OK;
    bool prev = td_autograd_set_grad_enabled(false);
    for (int i = 0; i < n && st == TD_OK; i++) /* all in flight at once */
        st = ddp_average_async(pg, params[i], &fs[i]);
    for (int i = 0; i < n; i++)
        st = ddp_settle(fs[i], st);
    td_autograd_set_grad_enabled(prev);
    free(fs);
    if (st == TD_OK && averaged)
        *averaged = true;
    return st;
}
