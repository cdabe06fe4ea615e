/* Meta-tests of the threaded harness (spec/c10d.md C13): ranks as threads of one child process.
 * Each visible case runs a hidden threaded case with td_test_run and checks the verdict text of
 * c10d's threaded decision table, the abort hooks that wake blocked ranks, and the timeout of a
 * hung thread through the process supervisor. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <tdist/testing.h>

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* A stand-in for a collective of the threaded backend: waits for all ranks, or for the abort
 * hook to wake it. Returns false when the test was aborted. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER;
static int g_arrived;
static int g_woken[8];

static void wake(void *arg)
{
    int rank = (int)(intptr_t)arg;
    pthread_mutex_lock(&g_lock);
    g_woken[rank]++;
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

static bool fake_collective(td_test_ctx *ctx)
{
    td_test_add_abort_hook(ctx, wake, (void *)(intptr_t)ctx->rank);
    pthread_mutex_lock(&g_lock);
    g_arrived++;
    pthread_cond_broadcast(&g_cond);
    while (g_arrived < ctx->world_size && !g_woken[ctx->rank])
        pthread_cond_wait(&g_cond, &g_lock);
    bool ok = !g_woken[ctx->rank];
    pthread_mutex_unlock(&g_lock);
    td_test_remove_abort_hook(ctx, wake, (void *)(intptr_t)ctx->rank);
    return ok;
}

#define RUN(name, r) TD_CHECK_OK(td_test_run((name), (r)))

TD_TEST(inner_th_pass, .world_size = 4, .threads = true, .timeout_s = 20, .hidden = true)
{
    TD_CHECK(ctx->threaded);
    TD_CHECK_EQ(ctx->world_size, 4);
    TD_CHECK(ctx->rank >= 0 && ctx->rank < 4);
    /* The rank's thread bears its name from its first instruction (threads it starts inherit it). */
    char name[16], want[16];
    TD_CHECK_EQ(pthread_getname_np(pthread_self(), name, sizeof name), 0);
    snprintf(want, sizeof want, "td-rank-%d", ctx->rank);
    TD_CHECK_STR_EQ(name, want);
    TD_CHECK_STR_EQ(getenv("TMPDIR"), ctx->tmpdir);
    TD_CHECK(getenv("RANK") == NULL);
    TD_CHECK(fake_collective(ctx));
    TD_CHECK(!td_test_aborted(ctx));
    printf("thread rank %d done\n", ctx->rank);
}

TD_TEST(threads_pass, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_th_pass", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    TD_CHECK_STR_EQ(r.message, "");
    TD_CHECK_EQ(r.spawned, 1);
    TD_CHECK_EQ(r.exit_codes[0], 0);
    TD_CHECK_CONTAINS(r.output, "[rank 0] thread rank 3 done\n");
    td_test_result_free(&r);
}

TD_TEST(inner_th_one_fails, .world_size = 4, .threads = true, .timeout_s = 20, .hidden = true)
{
    if (ctx->rank == 1) {
        sleep_s(0.1);
        TD_FAIL("rank %d fails", ctx->rank);
    }
    TD_CHECK(!fake_collective(ctx)); /* woken by the abort, not completed */
    TD_CHECK(td_test_aborted(ctx));
    sleep_s(0.05);
    pthread_mutex_lock(&g_lock);
    int woken = g_woken[ctx->rank];
    pthread_mutex_unlock(&g_lock);
    TD_CHECK_EQ(woken, 1); /* each hook ran exactly once */
} static const int k_one_fails_line = __LINE__ - 9;

TD_TEST(one_thread_fails, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_th_one_fails", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    char want[1024];
    snprintf(want, sizeof want, "Thread 1 exited with exception:\n%s:%d: rank 1 fails\n", __FILE__, k_one_fails_line);
    TD_CHECK_STR_EQ(r.message, want);
    TD_CHECK_EQ(r.exit_codes[0], 10);
    TD_CHECK_CONTAINS(r.output, "Caught exception: \n");
    TD_CHECK_CONTAINS(r.output, "rank 1 fails exiting thread 1\n");
    td_test_result_free(&r);
}

TD_TEST(inner_th_two_fail, .world_size = 3, .threads = true, .timeout_s = 20, .hidden = true)
{
    if (ctx->rank == 2)
        TD_FAIL("first failure");
    if (ctx->rank == 1) {
        while (!td_test_aborted(ctx))
            sleep_s(0.005);
        TD_FAIL("second failure");
    }
}

TD_TEST(failures_in_order, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_th_two_fail", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Thread 2 exited with exception:\n"));
    TD_CHECK_CONTAINS(r.message, ": first failure\nThread 1 exited with exception:\n");
    TD_CHECK_CONTAINS(r.message, ": second failure\n");
    td_test_result_free(&r);
}

TD_TEST(inner_th_all_skip, .world_size = 3, .threads = true, .timeout_s = 20, .hidden = true)
{
    TD_SKIP(TD_SKIP_SMALL_WORLDSIZE, "needs 8");
}

TD_TEST(inner_th_one_skips, .world_size = 3, .threads = true, .timeout_s = 20, .hidden = true)
{
    if (ctx->rank == 2)
        TD_SKIP(TD_SKIP_ODD_WORLDSIZE, "odd");
    TD_CHECK(!fake_collective(ctx));
}

TD_TEST(inner_th_other_code, .world_size = 2, .threads = true, .timeout_s = 20, .hidden = true)
{
    if (ctx->rank == 0)
        td_test_skip(1, "not a TEST_SKIPS code");
}

TD_TEST(thread_skips, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_th_all_skip", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_SKIP);
    TD_CHECK_STR_EQ(r.message, "Skipped due to small world size.");
    TD_CHECK_CONTAINS(r.output, "Thread 0 skipping test inner_th_all_skip for following reason: needs 8");
    td_test_result_free(&r);

    RUN("inner_th_one_skips", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_SKIP);
    TD_CHECK_STR_EQ(r.message, "Skipped due to odd world size.");
    td_test_result_free(&r);

    RUN("inner_th_other_code", &r); /* c10d ignores an exit code that is not a skip (trap T16) */
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    td_test_result_free(&r);
}

__attribute__((noinline)) static void thread_hangs_here(void)
{
    for (;;)
        sleep_s(1);
}

TD_TEST(inner_th_hang, .world_size = 3, .threads = true, .timeout_s = 2, .hidden = true)
{
    if (ctx->rank == 2)
        thread_hangs_here();
}

TD_TEST(hung_thread_times_out, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_th_hang", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK_STR_EQ(r.message, "Thread 2 terminated or timed out after 2 seconds\n");
    TD_CHECK_EQ(r.exit_codes[0], TD_TEST_NOT_EXITED);
    TD_CHECK_CONTAINS(r.log, "Timing out after 2 seconds and killing subprocesses.");
    TD_CHECK_CONTAINS(r.log, "(td-rank-2) [rank 2] (most recent call first):\n");
    TD_CHECK_CONTAINS(r.log, "thread_hangs_here");
    td_test_result_free(&r);
}

TD_TEST(inner_th_leak, .world_size = 2, .threads = true, .timeout_s = 5, .hidden = true)
{
    if (ctx->rank == 1)
        TD_CHECK(open("/dev/null", O_RDONLY | O_CLOEXEC) >= 0);
}

TD_TEST(thread_leak_check, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_th_leak", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Test leaked file descriptors: "));
    TD_CHECK_CONTAINS(r.message, " -> /dev/null (");
    td_test_result_free(&r);
}

TD_TEST(inner_th_params, .world_size = 2, .threads = true, .timeout_s = 10, .hidden = true, .params = "x,y")
{
    TD_CHECK_STR_EQ(ctx->param, "y");
    TD_CHECK_STR_EQ(ctx->name, "inner_th_params/y");
}

TD_TEST(thread_params, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_th_params/y", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    td_test_result_free(&r);
    RUN("inner_th_params/x", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    /* both ranks fail, in whichever order they got there */
    TD_CHECK(starts_with(r.message, "Thread 0 exited with exception:\n") ||
             starts_with(r.message, "Thread 1 exited with exception:\n"));
    TD_CHECK_CONTAINS(r.message, "Thread 0 exited with exception:\n");
    TD_CHECK_CONTAINS(r.message, "Thread 1 exited with exception:\n");
    td_test_result_free(&r);
}

/* Outside a threaded test, the abort API is inert. */
TD_TEST(abort_api_in_process_mode, .world_size = 2, .timeout_s = 30)
{
    TD_CHECK(!ctx->threaded);
    td_test_add_abort_hook(ctx, wake, (void *)(intptr_t)ctx->rank);
    TD_CHECK(!td_test_aborted(ctx));
    td_test_remove_abort_hook(ctx, wake, (void *)(intptr_t)ctx->rank);
    TD_CHECK_EQ(g_woken[ctx->rank], 0);
}

TD_TEST_MAIN()
