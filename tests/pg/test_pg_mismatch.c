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

/* One disagreement about collective #2: the last rank all_reduces last_n elements of last_dtype
 * where the others all_reduce n of dtype, or (ops) rank 0 all_reduces where the others broadcast
 * from rank 0 (so every rank receives something of #2 and none completes on sends alone). */
typedef struct disagreement {
    td_dtype dtype, last_dtype;
    int64_t n, last_n;
    bool ops;
} disagreement;

static td_status run_disagreement(td_test_ctx *ctx, td_pg *pg, const disagreement *d)
{
    bool last = ctx->rank == ctx->world_size - 1;
    td_tensor *t = last && !d->ops ? ones(d->last_dtype, d->last_n) : ones(d->dtype, d->n);
    td_status st =
        d->ops && ctx->rank > 0 ? td_pg_broadcast(pg, t, 0, NULL) : td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    td_tensor_release(t);
    return st;
}

/* Every rank fails with a message that names both sides (which first depends on the rank that saw
 * the difference) and no tag; the group stays failed, and a fresh group works. */
static void check_disagreement(td_test_ctx *ctx, const disagreement *d)
{
    pg_test_opts o = {.timeout_ms = 15000};
    td_pg *pg = pg_test_init(ctx, &o);
    td_tensor *t = ones(TD_FLOAT32, 4);
    /* A rank still finishing collective #1 when the others find #2 mismatched (its last message
     * unread when their abort comes) sees #1 fail with #2's message: the group has failed. */
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    if (st == TD_OK)
        st = run_disagreement(ctx, pg, d);
    TD_CHECK_ERR(st, TD_ERR_INVALID, "Ranks disagree about collective #2: rank ");
    char msg[1024], one[128], other[128];
    snprintf(msg, sizeof msg, "%s", td_last_error());
    if (d->ops) {
        snprintf(one, sizeof one, "rank 0 runs all_reduce(%s, %lld elements, sum)", td_dtype_name(d->dtype),
                 (long long)d->n);
        snprintf(other, sizeof other, "runs broadcast(%s, %lld elements, root 0)", td_dtype_name(d->dtype),
                 (long long)d->n);
    } else {
        snprintf(one, sizeof one, "rank %d runs all_reduce(%s, %lld elements, sum)", ctx->world_size - 1,
                 td_dtype_name(d->last_dtype), (long long)d->last_n);
        snprintf(other, sizeof other, "runs all_reduce(%s, %lld elements, sum)", td_dtype_name(d->dtype),
                 (long long)d->n);
    }
    TD_CHECK_CONTAINS(msg, one);
    TD_CHECK_CONTAINS(msg, other);
    TD_CHECK_MSG(strstr(msg, "tag") == NULL, "the message names a tag: %s", msg);
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

/* (a) sizes; (a) again with 1 MiB against 2 MiB, messages that tcp sends as RTS frames
 * (single-copy) between processes of one host and shm through its large slots; (b) operations;
 * (c) dtypes of the same byte count. */
static const disagreement sizes = {TD_FLOAT32, TD_FLOAT32, 100, 200, false};
static const disagreement large = {TD_FLOAT32, TD_FLOAT32, 256 << 10, 512 << 10, false};
static const disagreement ops = {TD_FLOAT32, TD_FLOAT32, 100, 100, true};
static const disagreement dtypes = {TD_FLOAT32, TD_FLOAT64, 100, 50, false};

/* A rank that only sends in the collective (a broadcast's root) may return before it hears of the
 * disagreement (no round trip is added to learn it): then its next call fails with it. */
static void check_root_that_only_sends(td_test_ctx *ctx)
{
    pg_test_opts o = {.timeout_ms = 15000};
    td_pg *pg = pg_test_init(ctx, &o);
    td_tensor *t = ones(TD_FLOAT32, 100);
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    if (st == TD_OK)
        st = ctx->rank == 0 ? td_pg_broadcast(pg, t, 0, NULL) : td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    if (st == TD_OK && ctx->rank == 0)
        st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    TD_CHECK_ERR(st, TD_ERR_INVALID, "Ranks disagree about collective #2: rank ");
    TD_CHECK_CONTAINS(td_last_error(), "rank 0 runs broadcast(float32, 100 elements, root 0)");
    TD_CHECK_CONTAINS(td_last_error(), "runs all_reduce(float32, 100 elements, sum)");
    td_tensor_release(t);
    pg_test_done(ctx, pg);
}

#define MISMATCH_TEST(name, ws, what)                                                                        \
    TD_TEST(name, .world_size = (ws), .params = MISMATCH_BACKENDS, .static_skip = pg_test_skip_unavailable,  \
            .setup = pg_test_setup, .timeout_s = 90)                                                          \
    {                                                                                                        \
        check_disagreement(ctx, &what);                                                                      \
    }

MISMATCH_TEST(mismatch_sizes_2, 2, sizes)
MISMATCH_TEST(mismatch_sizes_3, 3, sizes)
MISMATCH_TEST(mismatch_large_2, 2, large)
MISMATCH_TEST(mismatch_large_3, 3, large)
MISMATCH_TEST(mismatch_ops_2, 2, ops)
MISMATCH_TEST(mismatch_ops_3, 3, ops)
MISMATCH_TEST(mismatch_dtypes_2, 2, dtypes)
MISMATCH_TEST(mismatch_dtypes_3, 3, dtypes)

TD_TEST(mismatch_root_only_sends_2, .world_size = 2, .params = MISMATCH_BACKENDS,
        .static_skip = pg_test_skip_unavailable, .setup = pg_test_setup, .timeout_s = 90)
{
    check_root_that_only_sends(ctx);
}

TD_TEST_MAIN()
