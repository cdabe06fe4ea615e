/* td_test_run_subtests (c10d's run_subtests): every combination of the dimensions runs once, in
 * itertools.product's order, inside the same ranks and the same default group, with a barrier
 * after each; a failing combination is named in the verdict; and the same in threaded mode, where
 * each rank thread has its own default group and its own running combination. */
#include <stdio.h>
#include <string.h>

#include <tdist/pg.h>
#include <tdist/testing.h>

static const char *const k_letters[] = {"x", "y"};
static const char *const k_sizes[] = {"1", "2", "3"};
static const int k_size_values[] = {1, 2, 3};
static const td_subtest_dim k_dims[] = {{"a", k_letters, 2}, {"n", k_sizes, 3}};

static void init_default_group(td_test_ctx *ctx, const char *backend)
{
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = backend;
    o.init_method = ctx->init_url;
    o.rank = ctx->rank;
    o.world_size = ctx->world_size;
    o.timeout_ms = 30000;
    TD_CHECK_OK(td_init_process_group(&o));
}

typedef struct seen {
    char labels[8][32];
    int numbers[8];
    int calls;
} seen;

/* Records the combination and runs an all_reduce of its size on the default group. */
static void record(td_test_ctx *ctx, const td_subtest *sub, void *arg)
{
    seen *s = arg;
    TD_CHECK(s->calls < 8);
    TD_CHECK_EQ(sub->count, 6);
    TD_CHECK_EQ(sub->ndims, 2);
    snprintf(s->labels[s->calls], sizeof s->labels[0], "%s", sub->label);
    s->numbers[s->calls++] = sub->number;
    int n = k_size_values[sub->index[1]];
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_INT64, TD_SHAPE(n), 1.0, &t));
    TD_CHECK_OK(td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL));
    int64_t at = n - 1, v = 0;
    TD_CHECK_OK(td_tensor_get_i64(t, &at, &v));
    TD_CHECK_EQ(v, ctx->world_size);
    td_tensor_release(t);
}

static void count_calls(td_test_ctx *ctx, const td_subtest *sub, void *arg)
{
    (void)ctx;
    ((seen *)arg)->labels[((seen *)arg)->calls][0] = sub->label[0];
    ((seen *)arg)->calls++;
}

static void check_product(td_test_ctx *ctx)
{
    seen s = {0};
    td_test_run_subtests(ctx, NULL, k_dims, 2, record, &s);
    static const char *const want[] = {"a=x, n=1", "a=x, n=2", "a=x, n=3", "a=y, n=1", "a=y, n=2", "a=y, n=3"};
    TD_CHECK_EQ(s.calls, 6);
    for (int i = 0; i < 6; i++) {
        TD_CHECK_STR_EQ(s.labels[i], want[i]);
        TD_CHECK_EQ(s.numbers[i], i);
    }
    /* No dimension: one combination with an empty label (itertools.product() of nothing). */
    seen none = {0};
    td_test_run_subtests(ctx, td_default_pg(), NULL, 0, count_calls, &none);
    TD_CHECK_EQ(none.calls, 1);
    TD_CHECK_EQ(none.labels[0][0], '\0');
    /* A dimension without values: no combination. */
    static const td_subtest_dim empty[] = {{"a", k_letters, 2}, {"nothing", NULL, 0}};
    seen zero = {0};
    td_test_run_subtests(ctx, NULL, empty, 2, count_calls, &zero);
    TD_CHECK_EQ(zero.calls, 0);
}

TD_TEST(subtests_run_every_combination, .world_size = 2, .timeout_s = 60)
{
    init_default_group(ctx, "tcp");
    check_product(ctx);
    td_destroy_process_group();
}

TD_TEST(subtests_on_rank_threads, .world_size = 3, .threads = true, .timeout_s = 60)
{
    init_default_group(ctx, "threaded");
    check_product(ctx);
    td_destroy_process_group();
}

/* Without any group there is no barrier: ranks run their combinations on their own. */
TD_TEST(subtests_without_a_group, .world_size = 2, .timeout_s = 60)
{
    seen s = {0};
    td_test_run_subtests(ctx, NULL, k_dims, 2, count_calls, &s);
    TD_CHECK_EQ(s.calls, 6);
}

static void fail_on_y2(td_test_ctx *ctx, const td_subtest *sub, void *arg)
{
    (void)arg;
    if (ctx->rank == 1 && sub->index[0] == 1 && sub->index[1] == 1)
        TD_FAIL("rank %d does not like %s", ctx->rank, sub->label);
    printf("ran %s\n", sub->label);
} static const int k_fail_line = __LINE__ - 2;

TD_TEST(inner_subtest_fails, .world_size = 2, .timeout_s = 30, .hidden = true)
{
    init_default_group(ctx, "tcp");
    td_test_run_subtests(ctx, NULL, k_dims, 2, fail_on_y2, NULL);
    td_destroy_process_group();
}

TD_TEST(subtest_failure_names_its_combination, .timeout_s = 60)
{
    td_test_result r;
    TD_CHECK_OK(td_test_run("inner_subtest_fails", &r));
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    char want[512];
    snprintf(want, sizeof want,
             "Process 1 exited with error code 10 and exception:\nsubtest (a=y, n=2): %s:%d: rank 1 does not like "
             "a=y, n=2\n",
             __FILE__, k_fail_line);
    TD_CHECK_CONTAINS(r.message, want); /* rank 0 may also fail, in the barrier rank 1 left */
    TD_CHECK_CONTAINS(r.output, "[rank 1] ran a=y, n=1\n");
    TD_CHECK(strstr(r.output, "[rank 1] ran a=y, n=3") == NULL); /* the rest are not run */
    td_test_result_free(&r);
}

TD_TEST_MAIN()
