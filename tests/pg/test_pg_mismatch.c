/* Collectives that differ between ranks without TDIST_DEBUG=DETAIL (issue 22): a size, an operation
 * or a dtype that one rank disagrees about. Each case runs on the process backends, mpi included,
 * for 2 and 3 ranks, under a short group timeout; every rank must fail (not hang, not succeed),
 * with a message that names the collective as this rank and as the other side called it, in the
 * front end's words ("all_reduce(float32, 100 elements, sum)"), and no transport tag. The group
 * stays failed, and a new group in the same process works. */
#include <stdio.h>
#include <string.h>

#include "pg_util.h"

#define MISMATCH_BACKENDS TD_PG_SPAWNED_BACKENDS TD_PG_MPI_BACKEND

static td_tensor *ones(td_dtype dt, int64_t n)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_ones(dt, TD_SHAPE(n), &t));
    return t;
}

/* The message names both descriptions (the order depends on which rank saw the difference first)
 * and leaks no tag. */
static void check_failed(td_status st, const char *one, const char *other)
{
    TD_CHECK_ERR(st, TD_ERR_INVALID, "Ranks disagree about collective #2: rank ");
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", td_last_error());
    TD_CHECK_CONTAINS(msg, one);
    TD_CHECK_CONTAINS(msg, other);
    TD_CHECK_MSG(strstr(msg, "tag") == NULL, "the message names a tag: %s", msg);
}

/* Runs body's collective as collective #2 (after one that agrees), checks the failure, that the
 * group stays failed, and that a fresh group works. */
static void run_case(td_test_ctx *ctx, td_status (*body)(td_test_ctx *ctx, td_pg *pg), const char *one,
                     const char *other)
{
    pg_test_opts o = {.timeout_ms = 15000};
    td_pg *pg = pg_test_init(ctx, &o);
    td_tensor *t = ones(TD_FLOAT32, 4);
    /* A rank still finishing collective #1 when the others find #2 mismatched (its last message
     * unread when their abort comes) sees #1 fail with #2's message: the group has failed. */
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    if (st == TD_OK)
        st = body(ctx, pg);
    check_failed(st, one, other);
    TD_CHECK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL) != TD_OK);
    td_tensor_release(t);
    pg_test_done(ctx, pg);
    pg = pg_test_init(ctx, NULL);
    t = ones(TD_INT32, 5);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    TD_CHECK_EQ(pg_test_get(t, 4), ctx->world_size);
    td_tensor_release(t);
    pg_test_done(ctx, pg);
}

/* (a) Sizes: the last rank reduces 200 elements, the others 100. */
static td_status sizes_body(td_test_ctx *ctx, td_pg *pg)
{
    td_tensor *t = ones(TD_FLOAT32, ctx->rank == ctx->world_size - 1 ? 200 : 100);
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    td_tensor_release(t);
    return st;
}

static void sizes_case(td_test_ctx *ctx)
{
    char last[128];
    snprintf(last, sizeof last, "rank %d runs all_reduce(float32, 200 elements, sum)", ctx->world_size - 1);
    run_case(ctx, sizes_body, last, "runs all_reduce(float32, 100 elements, sum)");
}

/* (a) again with 1 MiB against 2 MiB: messages that tcp sends as RTS frames (single-copy) between
 * processes of one host, and shm through its large slots. */
static td_status large_body(td_test_ctx *ctx, td_pg *pg)
{
    td_tensor *t = ones(TD_FLOAT32, ctx->rank == ctx->world_size - 1 ? 512 << 10 : 256 << 10);
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    td_tensor_release(t);
    return st;
}

static void large_case(td_test_ctx *ctx)
{
    char last[128];
    snprintf(last, sizeof last, "rank %d runs all_reduce(float32, 524288 elements, sum)", ctx->world_size - 1);
    run_case(ctx, large_body, last, "runs all_reduce(float32, 262144 elements, sum)");
}

/* (b) Operations: rank 0 all_reduces, the others broadcast from rank 0 (so every rank receives
 * something of collective #2 and none completes on sends alone). */
static td_status ops_body(td_test_ctx *ctx, td_pg *pg)
{
    td_tensor *t = ones(TD_FLOAT32, 100);
    td_status st = ctx->rank == 0 ? td_pg_all_reduce(pg, t, TD_OP_SUM, NULL) : td_pg_broadcast(pg, t, 0, NULL);
    td_tensor_release(t);
    return st;
}

static void ops_case(td_test_ctx *ctx)
{
    run_case(ctx, ops_body, "rank 0 runs all_reduce(float32, 100 elements, sum)",
             "runs broadcast(float32, 100 elements, root 0)");
}

/* (c) Dtypes of the same byte count: the last rank reduces 50 float64, the others 100 float32. */
static td_status dtypes_body(td_test_ctx *ctx, td_pg *pg)
{
    bool last = ctx->rank == ctx->world_size - 1;
    td_tensor *t = last ? ones(TD_FLOAT64, 50) : ones(TD_FLOAT32, 100);
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    td_tensor_release(t);
    return st;
}

static void dtypes_case(td_test_ctx *ctx)
{
    char last[128];
    snprintf(last, sizeof last, "rank %d runs all_reduce(float64, 50 elements, sum)", ctx->world_size - 1);
    run_case(ctx, dtypes_body, last, "runs all_reduce(float32, 100 elements, sum)");
}

#define MISMATCH_TEST(name, ws, fn)                                                                          \
    TD_TEST(name, .world_size = (ws), .params = MISMATCH_BACKENDS, .static_skip = pg_test_skip_unavailable,  \
            .setup = pg_test_setup, .timeout_s = 90)                                                          \
    {                                                                                                        \
        fn(ctx);                                                                                             \
    }

MISMATCH_TEST(mismatch_sizes_2, 2, sizes_case)
MISMATCH_TEST(mismatch_sizes_3, 3, sizes_case)
MISMATCH_TEST(mismatch_large_2, 2, large_case)
MISMATCH_TEST(mismatch_large_3, 3, large_case)
MISMATCH_TEST(mismatch_ops_2, 2, ops_case)
MISMATCH_TEST(mismatch_ops_3, 3, ops_case)
MISMATCH_TEST(mismatch_dtypes_2, 2, dtypes_case)
MISMATCH_TEST(mismatch_dtypes_3, 3, dtypes_case)

TD_TEST_MAIN()
