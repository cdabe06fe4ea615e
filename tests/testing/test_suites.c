/* Suites (c10d's MultiProcContinousTest): consecutive cases of one suite run in one set of rank
 * processes that share the suite's setup (here one default group: one rendezvous), each with its
 * own verdict, temp dir and leak check; a failing case fails only itself and the cases after it
 * run in a fresh spawn. The hidden cases print their rank's pid; the meta-tests run them with
 * td_test_run_list and compare the pids across cases. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/pg.h>
#include <tdist/testing.h>

static void suite_up(td_test_ctx *ctx)
{
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "tcp";
    o.init_method = ctx->init_url;
    o.rank = ctx->rank;
    o.world_size = ctx->world_size;
    o.timeout_ms = 30000;
    TD_CHECK_OK(td_init_process_group(&o));
    printf("suite %s setup pid=%d\n", ctx->name, (int)getpid());
}

static void suite_down(td_test_ctx *ctx)
{
    td_destroy_process_group();
    printf("suite %s teardown pid=%d\n", ctx->name, (int)getpid());
}

TD_TEST_SUITE(small, .setup = suite_up, .teardown = suite_down)
TD_TEST_SUITE(mixed, .setup = suite_up, .teardown = suite_down)

/* A small case: an all_reduce on the suite's default group, a file in its own temp dir. */
static void small_case(td_test_ctx *ctx, int number)
{
    TD_CHECK(td_is_initialized());
    TD_CHECK(strstr(ctx->tmpdir, "/tdist-") != NULL);
    char path[1024];
    snprintf(path, sizeof path, "%s/mine%d", ctx->tmpdir, ctx->rank);
    FILE *f = fopen(path, "w");
    TD_CHECK(f != NULL);
    fclose(f);
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_INT64, TD_SHAPE(2), (double)number, &t));
    TD_CHECK_OK(td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL));
    int64_t at = 1, v = 0;
    TD_CHECK_OK(td_tensor_get_i64(t, &at, &v));
    TD_CHECK_EQ(v, number * ctx->world_size);
    td_tensor_release(t);
    TD_CHECK(unlink(path) == 0);
    printf("case %d pid=%d\n", number, (int)getpid());
}

#define SMALL(n)                                                                        \
    TD_TEST(inner_small_##n, .world_size = 2, .timeout_s = 30, .suite = "small", .hidden = true) \
    {                                                                                   \
        small_case(ctx, n);                                                             \
    }
SMALL(1)
SMALL(2)
SMALL(3)
SMALL(4)
SMALL(5)

TD_TEST(inner_mixed_1, .world_size = 2, .timeout_s = 30, .suite = "mixed", .hidden = true) { small_case(ctx, 1); }
TD_TEST(inner_mixed_2, .world_size = 2, .timeout_s = 30, .suite = "mixed", .hidden = true) { small_case(ctx, 2); }
/* Rank 1 fails while rank 0 waits for it in an all_reduce. */
TD_TEST(inner_mixed_3, .world_size = 2, .timeout_s = 30, .suite = "mixed", .hidden = true)
{
    if (ctx->rank == 1)
        TD_FAIL("case 3 fails on rank %d", ctx->rank);
    small_case(ctx, 3);
}
TD_TEST(inner_mixed_4, .world_size = 2, .timeout_s = 30, .suite = "mixed", .hidden = true) { small_case(ctx, 4); }
/* Leaves a file in its own temp dir: only this case fails, after the others passed. */
TD_TEST(inner_mixed_5, .world_size = 2, .timeout_s = 30, .suite = "mixed", .hidden = true)
{
    small_case(ctx, 5);
    char path[1024];
    snprintf(path, sizeof path, "%s/left%d", ctx->tmpdir, ctx->rank);
    FILE *f = fopen(path, "w");
    TD_CHECK(f != NULL);
    fclose(f);
}
TD_TEST(inner_mixed_6, .world_size = 2, .timeout_s = 30, .suite = "mixed", .hidden = true) { small_case(ctx, 6); }

/* The pid that rank `rank` printed for case `number` in out, or -1. */
static int pid_in(const char *out, int rank, int number)
{
    char key[64];
    int n = snprintf(key, sizeof key, "[rank %d] case %d pid=", rank, number);
    const char *at = out ? strstr(out, key) : NULL;
    return at ? atoi(at + n) : -1;
}

static int count_of(const char *out, const char *needle)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

TD_TEST(suite_cases_share_one_spawn, .timeout_s = 120)
{
    const char *names[] = {"inner_small_1", "inner_small_2", "inner_small_3", "inner_small_4", "inner_small_5"};
    td_test_result rs[5];
    TD_CHECK_OK(td_test_run_list(names, 5, rs));
    int pid0 = pid_in(rs[0].output, 0, 1), pid1 = pid_in(rs[0].output, 1, 1);
    TD_CHECK(pid0 > 0 && pid1 > 0 && pid0 != pid1);
    for (int j = 0; j < 5; j++) {
        TD_CHECK_MSG(rs[j].verdict == TD_TEST_PASS, "case %d: %s", j + 1, rs[j].message);
        TD_CHECK_EQ(rs[j].spawned, j == 0 ? 2 : 0);
        TD_CHECK_EQ(rs[j].exit_codes[0], 0);
        TD_CHECK_EQ(rs[j].exit_codes[1], 0);
        TD_CHECK_EQ(pid_in(rs[j].output, 0, j + 1), pid0); /* the same two processes ran every case */
        TD_CHECK_MSG(pid_in(rs[j].output, 1, j + 1) == pid1, "case %d output:\n%s", j + 1, rs[j].output);
    }
    /* One setup (one rendezvous) per rank, in the first case's output; the teardown in the last's. */
    TD_CHECK_EQ(count_of(rs[0].output, "suite small setup"), 2);
    for (int j = 1; j < 5; j++)
        TD_CHECK_EQ(count_of(rs[j].output, "suite small setup"), 0);
    TD_CHECK_EQ(count_of(rs[4].output, "suite small teardown"), 2);
    for (int j = 0; j < 5; j++)
        td_test_result_free(&rs[j]);
}

TD_TEST(suite_failure_fails_only_its_case, .timeout_s = 120)
{
    const char *names[] = {"inner_mixed_1", "inner_mixed_2", "inner_mixed_3",
                           "inner_mixed_4", "inner_mixed_5", "inner_mixed_6"};
    td_test_result rs[6];
    TD_CHECK_OK(td_test_run_list(names, 6, rs));
    for (int j = 0; j < 6; j++)
        if (j != 2 && j != 4)
            TD_CHECK_MSG(rs[j].verdict == TD_TEST_PASS, "case %d: %s", j + 1, rs[j].message);
    TD_CHECK_EQ(rs[2].verdict, TD_TEST_FAIL);
    TD_CHECK_CONTAINS(rs[2].message, "Process 1 exited with error code 10 and exception:\n");
    TD_CHECK_CONTAINS(rs[2].message, "case 3 fails on rank 1");
    TD_CHECK_EQ(rs[2].exit_codes[1], 10);
    TD_CHECK_EQ(rs[4].verdict, TD_TEST_FAIL);
    TD_CHECK_CONTAINS(rs[4].message, "Test left files in its temp dir");
    TD_CHECK_CONTAINS(rs[4].message, "left0");
    /* Cases 1-3 ran in the first spawn, 4-6 in a second one that the failure started. */
    TD_CHECK_EQ(rs[0].spawned, 2);
    TD_CHECK_EQ(rs[1].spawned, 0);
    TD_CHECK_EQ(rs[3].spawned, 2);
    int first = pid_in(rs[0].output, 0, 1), second = pid_in(rs[3].output, 0, 4);
    TD_CHECK(first > 0 && second > 0 && first != second);
    TD_CHECK_EQ(pid_in(rs[1].output, 0, 2), first);
    TD_CHECK_EQ(pid_in(rs[5].output, 0, 6), second);
    TD_CHECK_EQ(count_of(rs[3].output, "suite mixed setup"), 2);
    for (int j = 0; j < 6; j++)
        td_test_result_free(&rs[j]);
}

/* A suite case run on its own still runs inside its suite's setup and teardown. */
TD_TEST(suite_case_alone, .timeout_s = 60)
{
    td_test_result r;
    TD_CHECK_OK(td_test_run("inner_small_2", &r));
    TD_CHECK_MSG(r.verdict == TD_TEST_PASS, "%s", r.message);
    TD_CHECK_EQ(r.spawned, 2);
    TD_CHECK_EQ(count_of(r.output, "suite small setup"), 2);
    TD_CHECK_EQ(count_of(r.output, "suite small teardown"), 2);
    TD_CHECK(pid_in(r.output, 1, 2) > 0);
    td_test_result_free(&r);
}

/* Visible cases of one suite: the command line runs them in one spawn too (each CTest entry runs
 * one of them alone). */
TD_TEST(suite_visible_a, .world_size = 2, .timeout_s = 30, .suite = "small") { small_case(ctx, 7); }
TD_TEST(suite_visible_b, .world_size = 2, .timeout_s = 30, .suite = "small") { small_case(ctx, 8); }

TD_TEST_MAIN()
