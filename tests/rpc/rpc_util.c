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

td_status rpc_test_add_ints(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    td_status st = td_rpc_bind("add_ints", "a,b", args, kwargs, p);
    if (st == TD_OK)
        *result = td_value_int(td_value_get_int(p[0]) + td_value_get_int(p[1]));
    return st;
}

td_status rpc_test_callee_id(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)args;
    (void)kwargs;
    td_worker_info me;
    td_status st = td_rpc_worker_info(td_rpc_call_agent(call), NULL, &me);
    if (st == TD_OK)
        *result = td_value_int(me.id);
    return st;
}

td_status rpc_test_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    (void)result;
    const char *type = td_value_len(args) > 0 ? td_value_get_string(td_value_at(args, 0), NULL) : "ValueError";
    const char *msg = td_value_len(args) > 1 ? td_value_get_string(td_value_at(args, 1), NULL) : "Expected error";
    return td_rpc_raise(type, "%s", msg);
}

td_future *rpc_test_async_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)call;
    (void)args;
    (void)kwargs;
    td_rpc_raise("RuntimeError", "Expected error");
    return NULL;
}
