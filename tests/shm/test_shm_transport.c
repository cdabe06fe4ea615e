/* The shm transport (src/transport/shm.h) between real rank processes over real shared memory:
 * set-up through a FileStore for worlds 1 to 4, messages of every size (larger than the ring too)
 * with iovecs, tag matching out of order, any-source receives, unexpected messages (large ones
 * drained by the transport's thread), length mismatches, callbacks with nobody waiting, a peer
 * killed with SIGKILL (survivors fail within 2 s naming it, nothing is left in /dev/shm), timeouts,
 * aborts relayed to the peers, orderly closes, refused hellos (different settings, another host),
 * four ranks sharing one core, and no fd, thread or segment left after destroy (the harness checks
 * fds, threads and /dev/shm after every case). The cases every transport passes are written once
 * in tests/support/transport_util.c; the tcp transport runs them too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/transport_util.h"
#include "base/clock.h"
#include "shm_util.h"

static td_status create(const td_test_ctx *ctx, const td_transport_setup *setup, td_transport **out)
{
    (void)ctx;
    td_shm_options o = {.setup = *setup};
    return shm_transport_create(&o, out);
}

static void connect_body(td_test_ctx *ctx)
{
    tu_world w = shm_test_open(ctx, 0);
    tu_all_pairs(ctx, w.t, 1000);
    tu_all_pairs(ctx, w.t, 1 << 20); /* four times the ring */
    tu_world_close(&w);
}

TD_TEST(connect_world_2, .world_size = 2) { connect_body(ctx); }
TD_TEST(connect_world_3, .world_size = 3) { connect_body(ctx); }
TD_TEST(connect_world_4, .world_size = 4) { connect_body(ctx); }
TD_TEST(connect_world_8, .world_size = 8, .timeout_s = 120) { connect_body(ctx); }

TD_TEST(connect_world_1, .world_size = 1)
{
    tu_world w = shm_test_open(ctx, 0);
    tu_case_world_1(&w);
    tu_world_close(&w);
}

/* The cases every transport passes (transport_util.h); the abort of "timeout" is relayed, so the
 * stalled peer fails at once with the same cause. */
static tu_world open_default(td_test_ctx *ctx) { return shm_test_open(ctx, 0); }

/* Sizes around the 16-byte padding, and larger than the ring. */
static const size_t message_sizes[] = {0,     1,     2,      7,      15,     16,
                                       17,    4095,  65537,  262144, 262145, 3 * 1024 * 1024 + 3};

TU_TRANSPORT_CASES(open_default, message_sizes, TD_ERR_TIMEOUT, "Timed out waiting for a receive from rank 0")

/* A rank that destroys its transport says goodbye: what it sent before still arrives, the others
 * fail only what involves it and keep talking among themselves. */
TD_TEST(orderly_close, .world_size = 3)
{
    tu_world w = shm_test_open(ctx, 0);
    tu_all_pairs(ctx, w.t, 64);
    if (ctx->rank == 2) {
        int v = 2222;
        TD_CHECK_OK(transport_send(w.t, 0, 9, &v, sizeof v, tu_after_ms(30000)));
        tu_barrier(ctx, w.store, "sent");
        transport_destroy(w.t);
        tu_barrier(ctx, w.store, "synced");
        tu_store_close(ctx, w.store, ctx->store_path);
        return;
    }
    tu_barrier(ctx, w.store, "sent");
    tu_barrier(ctx, w.store, "synced");
    if (ctx->rank == 0) {
        int v = 0;
        TD_CHECK_OK(transport_recv(w.t, 2, 9, &v, sizeof v, tu_after_ms(30000)));
        TD_CHECK_EQ(v, 2222);
    }
    tu_check_after_close(&w);
    tu_world_close(&w);
}

/* Ranks with different ring sizes refuse each other with a message that names the variables. */
TD_TEST(layout_mismatch, .world_size = 2)
{
    setenv("TDIST_SHM_RING", ctx->rank == 0 ? "64K" : "128K", 1);
    td_store *store = tu_store_open(ctx->store_path);
    td_transport_setup g = tu_setup(ctx, store, 3000, "g");
    td_transport *t = NULL;
    if (ctx->rank == 0)
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID, "TDIST_SHM_RING");
    else
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_TIMEOUT, "no connection yet with rank 0; last refused");
    unsetenv("TDIST_SHM_RING");
    tu_no_segments();
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}

/* Ranks that count as different hosts (TDIST_HOST_ID) cannot share memory: a clear error that
 * names the other rank and points to the auto backend. */
TD_TEST(other_host_refused, .world_size = 2)
{
    setenv("TDIST_HOST_ID", ctx->rank == 0 ? "hostA" : "hostB", 1);
    td_store *store = tu_store_open(ctx->store_path);
    td_transport_setup g = tu_setup(ctx, store, 10000, "g");
    td_transport *t = NULL;
    char want[64];
    snprintf(want, sizeof want, "but rank %d is on another host", 1 - ctx->rank);
    TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID, want);
    TD_CHECK_CONTAINS(td_last_error(), "auto backend");
    unsetenv("TDIST_HOST_ID");
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}

TD_TEST(setup_timeout, .world_size = 2) { tu_case_setup_timeout(ctx, create); }

/* Four ranks on one core: every exchange still completes (the waits yield and then sleep). */
TD_TEST(four_ranks_one_core, .world_size = 4, .timeout_s = 120)
{
    tu_one_core();
    tu_world w = shm_test_open(ctx, 0);
    int64_t t0 = clock_now_ns();
    for (int i = 0; i < 300; i++)
        tu_all_pairs(ctx, w.t, (size_t)(i % 7) * 1000);
    tu_all_pairs(ctx, w.t, 3 << 20);
    double dt = tu_since_s(t0);
    TD_CHECK_MSG(dt < 60, "300 exchanges among 4 ranks on one core took %.1f s", dt);
    tu_barrier(ctx, w.store, "done");
    tu_world_close(&w);
}

TD_TEST(create_destroy_repeatedly, .world_size = 3) { tu_case_create_destroy_repeatedly(ctx, create); }

TD_TEST_MAIN()
