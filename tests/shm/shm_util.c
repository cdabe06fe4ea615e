/* Helpers of the shm tests (shm_util.h). */
#include "shm_util.h"

tu_world shm_test_open(td_test_ctx *ctx, int64_t timeout_ms)
{
    tu_world w = {0};
    w.ctx = ctx;
    w.store = tu_store_open(ctx->store_path);
    td_shm_options o = {.setup = tu_setup(ctx, w.store, timeout_ms, "test")};
    TD_CHECK_OK(shm_transport_create(&o, &w.t));
    TD_CHECK(transport_is_shm(w.t));
    TD_CHECK_EQ(w.t->rank, ctx->rank);
    TD_CHECK_EQ(w.t->size, ctx->world_size);
    tu_no_segments();
    return w;
}
