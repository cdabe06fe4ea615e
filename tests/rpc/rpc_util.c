/* Set-up shared by the RPC tests (rpc_util.h). */
#include "rpc_util.h"

#include <stdio.h>

void rpc_test_register(const rpc_test_function *fns, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        td_status st = fns[i].async_fn ? td_rpc_register_async(fns[i].name, fns[i].async_fn, fns[i].arg)
                                       : td_rpc_register(fns[i].name, fns[i].fn, fns[i].arg);
        TD_CHECK_MSG(st == TD_OK || st == TD_ERR_ALREADY, "registering %s: %s", fns[i].name, td_last_error());
    }
}

td_rpc_options rpc_test_options(const td_test_ctx *ctx)
{
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.init_method = ctx->init_url;
    return o;
}

void rpc_test_init(const td_test_ctx *ctx, const td_rpc_options *o)
{
    td_rpc_options defaults = rpc_test_options(ctx);
    char name[32];
    snprintf(name, sizeof name, "worker%d", ctx->rank);
    TD_CHECK_OK(td_rpc_init(name, ctx->rank, ctx->world_size, o ? o : &defaults));
}
