/* Meta-tests of the multi-process harness (spec/c10d.md C12.11, C14): each visible case runs a
 * hidden inner case under the supervisor with td_test_run, from inside its own rank (so nested
 * supervision is exercised too), and checks the verdict and its exact text, the exit codes, the
 * harness log and the captured output. Inner cases use short timeouts to keep the suite fast. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/error.h"
#include "base/thread.h"

extern char **environ;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Waits until every rank in ranks[] has created "<tmpdir>/<tag>.<rank>". */
static void file_barrier(const td_test_ctx *ctx, const char *tag, const int *ranks, int n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.%d", ctx->tmpdir, tag, ctx->rank);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    TD_CHECK(fd >= 0);
    close(fd);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s.%d", ctx->tmpdir, tag, ranks[i]);
        while (access(path, F_OK) != 0)
            sleep_s(0.002);
    }
}

#define RUN(name, r) TD_CHECK_OK(td_test_run((name), (r)))

/* ---- all ranks pass -------------------------------------------------------------------------- */

TD_TEST(inner_pass, .world_size = 4, .timeout_s = 20, .hidden = true)
{
    char store[512], url[600];
    snprintf(store, sizeof store, "%s/store", ctx->tmpdir);
    snprintf(url, sizeof url, "file://%s", store);
    TD_CHECK_STR_EQ(ctx->store_path, store);
    TD_CHECK_STR_EQ(ctx->init_url, url);
    TD_CHECK(access(ctx->store_path, F_OK) != 0);
    TD_CHECK_STR_EQ(ctx->name, "inner_pass");
    TD_CHECK_STR_EQ(ctx->param, "");
    TD_CHECK(!ctx->threaded);
    TD_CHECK_EQ(ctx->world_size, 4);
    TD_CHECK_EQ(atoi(getenv("RANK")), ctx->rank);
    TD_CHECK_EQ(atoi(getenv("WORLD_SIZE")), 4);
    TD_CHECK_STR_EQ(getenv("TEMP_DIR"), ctx->tmpdir);
    TD_CHECK_STR_EQ(getenv("TMPDIR"), ctx->tmpdir);
    TD_CHECK_STR_EQ(getenv("MASTER_ADDR"), "127.0.0.1");
    TD_CHECK(!td_test_aborted(ctx));
    printf("hello from rank %d\n", ctx->rank);
    fprintf(stderr, "a line on stderr from rank %d", ctx->rank); /* no newline: flushed at exit */
}

TD_TEST(all_ranks_pass, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_pass", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    TD_CHECK_STR_EQ(r.message, "");
    TD_CHECK_EQ(r.spawned, 4);
    TD_CHECK_EQ(r.world_size, 4);
    for (int i = 0; i < 4; i++)
        TD_CHECK_EQ(r.exit_codes[i], 0);
    TD_CHECK_CONTAINS(r.output, "[rank 0] hello from rank 0\n");
    TD_CHECK_CONTAINS(r.output, "[rank 3] hello from rank 3\n");
    TD_CHECK_CONTAINS(r.output, "[rank 2] a line on stderr from rank 2\n");
    TD_CHECK_CONTAINS(r.log, "Started process 3 with pid ");
    TD_CHECK(r.elapsed_s > 0);
    td_test_result_free(&r);
}

TD_TEST(four_ranks_directly, .world_size = 4, .timeout_s = 30)
{
    TD_CHECK(ctx->rank >= 0 && ctx->rank < 4);
    TD_CHECK_EQ(atoi(getenv("RANK")), ctx->rank);
}

TD_TEST(unknown_case_is_not_found, .timeout_s = 30)
{
    td_test_result r;
    TD_CHECK_EQ(td_test_run("no_such_case", &r), TD_ERR_NOT_FOUND);
    TD_CHECK_CONTAINS(td_last_error(), "no_such_case");
    TD_CHECK_EQ(td_test_run("inner_pass/param", &r), TD_ERR_NOT_FOUND);
}

/* ---- failures ------------------------------------------------------------------------------- */

TD_TEST(inner_rank2_fails, .world_size = 4, .timeout_s = 20, .hidden = true) { TD_CHECK(ctx->rank != 2); } static const int k_rank2_line = __LINE__;

TD_TEST(rank2_fails, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_rank2_fails", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    char want[1024];
    snprintf(want, sizeof want, "Process 2 exited with error code 10 and exception:\n%s:%d: Check failed: ctx->rank != 2\n",
             __FILE__, k_rank2_line);
    TD_CHECK_STR_EQ(r.message, want);
    TD_CHECK_EQ(r.exit_codes[2], 10);
    TD_CHECK_CONTAINS(r.output, "[rank 2] [tdist-test] Caught exception: \n");
    TD_CHECK_CONTAINS(r.output, "exiting process 2 with exit code: 10");
    td_test_result_free(&r);
}

TD_TEST(inner_ranks_1_3_fail, .world_size = 4, .timeout_s = 10, .hidden = true)
{
    if (ctx->rank != 1 && ctx->rank != 3)
        return;
    /* Survive the harness's SIGTERM after the other one fails, so that both messages arrive. */
    sigset_t term;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, NULL);
    static const int both[] = {1, 3};
    file_barrier(ctx, "failing", both, 2);
    TD_FAIL("rank %d fails on purpose", ctx->rank);
}

TD_TEST(ranks_1_and_3_fail, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_ranks_1_3_fail", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    const char *one = strstr(r.message, "Process 1 exited with error code 10 and exception:\n");
    const char *three = strstr(r.message, "Process 3 exited with error code 10 and exception:\n");
    TD_CHECK(one == r.message);
    TD_CHECK(three != NULL && three > one);
    TD_CHECK_CONTAINS(r.message, ": rank 1 fails on purpose\nProcess 3 exited");
    TD_CHECK(ends_with(r.message, ": rank 3 fails on purpose\n"));
    TD_CHECK_EQ(r.exit_codes[1], 10);
    TD_CHECK_EQ(r.exit_codes[3], 10);
    td_test_result_free(&r);
}

__attribute__((noinline)) static void crash_in_rank1(void)
{
    void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TD_CHECK(page != MAP_FAILED);
    *(volatile int *)page = 1;
}

TD_TEST(inner_segfault, .world_size = 3, .timeout_s = 10, .hidden = true, .allow_leftovers = true)
{
    /* Crash only once the others are running, so that they finish on their own (with 0) well
     * within the delay before the harness stops the remaining ranks. */
    static const int all[] = {0, 1, 2};
    file_barrier(ctx, "started", all, 3);
    if (ctx->rank == 1)
        crash_in_rank1();
}

TD_TEST(rank_segfaults, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_segfault", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK_STR_EQ(r.message, "Expect process 1 exit code to match Process 0 exit code of 0, but got -11");
    TD_CHECK_EQ(r.exit_codes[0], 0);
    TD_CHECK_EQ(r.exit_codes[1], -11);
    TD_CHECK_EQ(r.exit_codes[2], 0);
    TD_CHECK_CONTAINS(r.output, "[rank 1] Fatal signal 11 (SIGSEGV) in rank 1");
    TD_CHECK_CONTAINS(r.output, "crash_in_rank1");
    td_test_result_free(&r);
}

TD_TEST(inner_segfault_others_hang, .world_size = 3, .timeout_s = 60, .hidden = true, .allow_leftovers = true)
{
    if (ctx->rank == 1)
        crash_in_rank1();
    sleep_s(60);
}

TD_TEST(segfault_stops_other_ranks, .timeout_s = 60)
{
    double t0 = now_s();
    td_test_result r;
    RUN("inner_segfault_others_hang", &r);
    TD_CHECK(now_s() - t0 < 20);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Process 0 terminated or timed out after "));
    TD_CHECK(ends_with(r.message, " seconds"));
    TD_CHECK_EQ(r.exit_codes[0], TD_TEST_NOT_EXITED);
    TD_CHECK_EQ(r.exit_codes[1], -11);
    TD_CHECK_EQ(r.exit_codes[2], TD_TEST_NOT_EXITED);
    TD_CHECK_CONTAINS(r.log, "Process 1 terminated with exit code -11, terminating remaining processes.");
    td_test_result_free(&r);
}

/* ---- hang and timeout ----------------------------------------------------------------------- */

__attribute__((noinline)) static void hang_forever_in_rank0(void)
{
    for (;;)
        sleep_s(1);
}

__attribute__((noinline)) static void helper_waits_here(void)
{
    for (;;)
        sleep_s(2); /* not the same code as hang_forever_in_rank0, or the compiler merges them */
}

static void *helper_main(void *arg)
{
    (void)arg;
    td_test_breadcrumb("helper step %d", 7);
    helper_waits_here();
    return NULL;
}

TD_TEST(inner_hang, .world_size = 2, .timeout_s = 2, .hidden = true)
{
    if (ctx->rank == 0) {
        pthread_t helper; /* a library-style thread: thread_start blocks most signals */
        TD_CHECK_OK(thread_start(&helper, "td-helper", helper_main, NULL));
        td_test_breadcrumb("all_reduce #%d of %d", 3, 8);
        hang_forever_in_rank0();
    }
}

TD_TEST(hang_times_out_with_stacks, .timeout_s = 60)
{
    double t0 = now_s();
    td_test_result r;
    RUN("inner_hang", &r);
    double took = now_s() - t0;
    TD_CHECK(took >= 2 && took < 20);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Process 0 terminated or timed out after "));
    TD_CHECK(ends_with(r.message, " seconds"));
    TD_CHECK_EQ(r.exit_codes[0], TD_TEST_NOT_EXITED);
    TD_CHECK_EQ(r.exit_codes[1], 0);
    TD_CHECK_CONTAINS(r.log, "Process 0 timed out with traceback: \n\n");
    TD_CHECK_CONTAINS(r.log, "hang_forever_in_rank0");
    TD_CHECK_CONTAINS(r.log, "last step: all_reduce #3 of 8");
    TD_CHECK_CONTAINS(r.log, "[main thread] [rank 0] (most recent call first):\n");
    TD_CHECK_CONTAINS(r.log, "(td-helper) (most recent call first):\n    last step: helper step 7\n");
    TD_CHECK_CONTAINS(r.log, "helper_waits_here");
    TD_CHECK_CONTAINS(r.log, "Timing out after 2 seconds and killing subprocesses.");
    TD_CHECK(strstr(r.log, "Timing out after") > strstr(r.log, "timed out with traceback"));
    td_test_result_free(&r);
}

TD_TEST(inner_stopped, .world_size = 1, .timeout_s = 2, .hidden = true)
{
    raise(SIGSTOP); /* cannot answer the traceback request, nor die of SIGTERM */
}

TD_TEST(unanswered_traceback_request, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_stopped", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Process 0 terminated or timed out after "));
    TD_CHECK_CONTAINS(r.log, "Could not retrieve traceback for timed out process: 0\n"
                             "Timing out after 2 seconds and killing subprocesses.\n");
    TD_CHECK_EQ(r.exit_codes[0], TD_TEST_NOT_EXITED); /* SIGKILLed after the grace period */
    td_test_result_free(&r);
}

/* ---- skips ---------------------------------------------------------------------------------- */

TD_TEST(inner_all_skip, .world_size = 3, .timeout_s = 10, .hidden = true)
{
    TD_SKIP_IF(ctx->world_size < 8, TD_SKIP_SMALL_WORLDSIZE);
}

TD_TEST(all_ranks_skip, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_all_skip", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_SKIP);
    TD_CHECK_STR_EQ(r.message, "Skipped due to small world size.");
    for (int i = 0; i < 3; i++)
        TD_CHECK_EQ(r.exit_codes[i], 73);
    TD_CHECK_CONTAINS(r.output, "Process 1 skipping test inner_all_skip for following reason: condition: "
                                "ctx->world_size < 8");
    td_test_result_free(&r);
}

TD_TEST(inner_rank0_skips, .world_size = 2, .timeout_s = 10, .hidden = true)
{
    if (ctx->rank == 0)
        TD_SKIP(TD_SKIP_SMALL_WORLDSIZE, "only rank 0 thinks so");
}

TD_TEST(skip_on_one_rank_is_a_mismatch, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_rank0_skips", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK_STR_EQ(r.message, "Expect process 1 exit code to match Process 0 exit code of 73, but got 0");
    td_test_result_free(&r);
}

TD_TEST(sandcastle_turns_skips_into_passes, .timeout_s = 60)
{
    setenv("TDIST_TEST_SANDCASTLE", "1", 1);
    td_test_result r;
    RUN("inner_all_skip", &r);
    unsetenv("TDIST_TEST_SANDCASTLE");
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    TD_CHECK_CONTAINS(r.log, "Skipping inner_all_skip on sandcastle for the following reason: Skipped due to small "
                             "world size.");
    td_test_result_free(&r);
}

static int g_static_skip_calls;

static const char *skip_unless_b(const char *param)
{
    g_static_skip_calls++;
    return strcmp(param, "b") == 0 ? NULL : "Test requires backend a to be available";
}

TD_TEST(inner_param, .world_size = 2, .timeout_s = 10, .hidden = true, .params = "a,b", .static_skip = skip_unless_b)
{
    TD_CHECK_STR_EQ(ctx->param, "b");
    TD_CHECK_STR_EQ(ctx->name, "inner_param/b");
}

TD_TEST(static_skip_spawns_nothing, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_param/a", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_SKIP);
    TD_CHECK_STR_EQ(r.message, "Test requires backend a to be available");
    TD_CHECK_EQ(r.spawned, 0);
    TD_CHECK_EQ(g_static_skip_calls, 1);
    td_test_result_free(&r);

    setenv("TDIST_TEST_SANDCASTLE", "1", 1);
    RUN("inner_param/a", &r);
    unsetenv("TDIST_TEST_SANDCASTLE");
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    TD_CHECK_EQ(r.spawned, 0);
    TD_CHECK_CONTAINS(r.log, "Skipping inner_param/a on sandcastle for following reason: Test requires backend a to be "
                             "available");
    td_test_result_free(&r);

    RUN("inner_param/b", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    TD_CHECK_EQ(r.spawned, 2);
    td_test_result_free(&r);
}

/* ---- other exit codes ----------------------------------------------------------------------- */

TD_TEST(inner_all_exit_1, .world_size = 3, .timeout_s = 10, .hidden = true)
{
    static const int all[] = {0, 1, 2};
    file_barrier(ctx, "started", all, 3); /* all exit at about the same time */
    exit(1);
}

TD_TEST(nonzero_exit_fails, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_all_exit_1", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Expected zero exit code but got 1 for pid: "));
    TD_CHECK(atoi(r.message + strlen("Expected zero exit code but got 1 for pid: ")) > 0);
    td_test_result_free(&r);
}

TD_TEST(inner_abort_unchecked, .world_size = 2, .timeout_s = 10, .hidden = true, .skip_return_code_check = true,
        .allow_leftovers = true)
{
    if (ctx->rank == 1)
        abort();
}

TD_TEST(inner_fail_unchecked, .world_size = 2, .timeout_s = 10, .hidden = true, .skip_return_code_check = true)
{
    if (ctx->rank == 0) {
        /* Finish on its own rather than be killed when rank 1 fails: a killed rank would read
         * "Process 0 timed out after ...", which the table checks first. */
        sigset_t term;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        sigprocmask(SIG_BLOCK, &term, NULL);
        static const int zero[] = {0};
        file_barrier(ctx, "ready", zero, 1);
        sleep_s(0.2);
        return;
    }
    static const int zero[] = {0};
    file_barrier(ctx, "ready", zero, 1); /* rank 0 has blocked SIGTERM */
    TD_CHECK_MSG(ctx->rank == 0, "rank %d is not rank 0", ctx->rank);
}

TD_TEST(skip_return_code_check, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_abort_unchecked", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    TD_CHECK_EQ(r.exit_codes[1], -6);
    TD_CHECK_CONTAINS(r.output, "Fatal signal 6 (SIGABRT) in rank 1");
    td_test_result_free(&r);

    RUN("inner_fail_unchecked", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "10 == 10 : Process 1 exited with error code 10 and exception:\n"));
    TD_CHECK(ends_with(r.message, ": rank 1 is not rank 0\n"));
    td_test_result_free(&r);
}

/* ---- big messages and early abort ---------------------------------------------------------- */

#define BIG_LEN (1u << 20)

static char *big_text(void)
{
    char *s = malloc(BIG_LEN + 1);
    for (size_t i = 0; i < BIG_LEN; i++)
        s[i] = (char)('a' + (i * 7 + i / 977) % 26);
    s[BIG_LEN] = '\0';
    return s;
}

TD_TEST(inner_big_message, .world_size = 2, .timeout_s = 20, .hidden = true)
{
    if (ctx->rank == 1) {
        char *s = big_text();
        TD_FAIL("%s", s);
    }
}

TD_TEST(one_mib_message_arrives_intact, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_big_message", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    const char *head = "Process 1 exited with error code 10 and exception:\n";
    TD_CHECK(starts_with(r.message, head));
    const char *body = strstr(r.message, ": ");
    TD_CHECK(body != NULL);
    body += 2;
    char *want = big_text();
    TD_CHECK_EQ(strlen(body), BIG_LEN + 1);
    TD_CHECK(memcmp(body, want, BIG_LEN) == 0);
    TD_CHECK_EQ(body[BIG_LEN], '\n');
    free(want);
    td_test_result_free(&r);
}

TD_TEST(inner_early_abort, .world_size = 3, .timeout_s = 60, .hidden = true)
{
    if (ctx->rank == 0) {
        sleep_s(0.5);
        TD_FAIL("rank 0 gives up");
    }
    sleep_s(60);
}

TD_TEST(early_abort, .timeout_s = 60)
{
    double t0 = now_s();
    td_test_result r;
    RUN("inner_early_abort", &r);
    TD_CHECK(now_s() - t0 < 15);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Process 0 exited with error code 10 and exception:\n"));
    TD_CHECK(ends_with(r.message, ": rank 0 gives up\n"));
    TD_CHECK_CONTAINS(r.log, "Process 0 terminated with exit code 10, terminating remaining processes.");
    TD_CHECK_EQ(r.exit_codes[1], TD_TEST_NOT_EXITED);
    TD_CHECK_EQ(r.exit_codes[2], TD_TEST_NOT_EXITED);
    td_test_result_free(&r);
}

/* ---- cleanup and leak checks ---------------------------------------------------------------- */

TD_TEST(inner_exit_without_cleanup, .world_size = 2, .timeout_s = 10, .hidden = true, .allow_leftovers = true)
{
    char path[512];
    snprintf(path, sizeof path, "%s/partial.%d", ctx->tmpdir, ctx->rank);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    TD_CHECK(fd >= 0);
    printf("TESTDIR=%s\n", ctx->tmpdir);
    fflush(stdout);
    _exit(0);
}

TD_TEST(exit_without_cleanup_is_reaped, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_exit_without_cleanup", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    const char *p = strstr(r.output, "TESTDIR=");
    TD_CHECK(p != NULL);
    char dir[512];
    snprintf(dir, sizeof dir, "%.*s", (int)strcspn(p + 8, "\n"), p + 8);
    TD_CHECK(strlen(dir) > 0);
    TD_CHECK(access(dir, F_OK) != 0 && errno == ENOENT);
    td_test_result_free(&r);
}

TD_TEST(inner_fd_leak, .world_size = 1, .timeout_s = 5, .hidden = true)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    TD_CHECK(fd >= 0);
}

static void *leaky_thread(void *arg)
{
    (void)arg;
    sleep_s(30);
    return NULL;
}

TD_TEST(inner_thread_leak, .world_size = 1, .timeout_s = 5, .hidden = true)
{
    pthread_t t;
    TD_CHECK_EQ(pthread_create(&t, NULL, leaky_thread, NULL), 0);
    pthread_setname_np(t, "td-leaky");
}

TD_TEST(inner_no_leak_check, .world_size = 1, .timeout_s = 5, .hidden = true, .no_leak_check = true)
{
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    TD_CHECK(fd >= 0);
}

TD_TEST(leaked_fds_and_threads_fail, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_fd_leak", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Process 0 exited with error code 10 and exception:\nTest leaked file descriptors: "));
    TD_CHECK_CONTAINS(r.message, " -> /dev/null (close them before the test returns, or set .no_leak_check)\n");
    td_test_result_free(&r);

    RUN("inner_thread_leak", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Process 0 exited with error code 10 and exception:\nTest leaked threads: "));
    TD_CHECK_CONTAINS(r.message, " (td-leaky) (join them before the test returns, or set .no_leak_check)\n");
    td_test_result_free(&r);

    RUN("inner_no_leak_check", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    td_test_result_free(&r);
}

TD_TEST(inner_leftover_file, .world_size = 2, .timeout_s = 10, .hidden = true)
{
    if (ctx->rank != 1)
        return;
    char path[512];
    snprintf(path, sizeof path, "%s/tmpXXXXXX", getenv("TMPDIR"));
    int fd = mkstemp(path);
    TD_CHECK(fd >= 0);
    close(fd);
}

/* A file named as ThreadSanitizer's runtime names the one it leaves when killed as it starts. */
TD_TEST(inner_leftover_tsan_rodata, .world_size = 1, .timeout_s = 10, .hidden = true)
{
    char path[512];
    snprintf(path, sizeof path, "%s/tsan.rodata.%d", getenv("TMPDIR"), (int)getpid());
    FILE *f = fopen(path, "w");
    TD_CHECK(f != NULL);
    fclose(f);
}

TD_TEST(inner_leftover_shm, .world_size = 1, .timeout_s = 10, .hidden = true)
{
    char name[64];
    snprintf(name, sizeof name, "/tdist.%d.harness-test", (int)getpid());
    int fd = shm_open(name, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    TD_CHECK(fd >= 0);
    close(fd);
    printf("SHM=/dev/shm%s\n", name);
}

TD_TEST(inner_leftover_process, .world_size = 1, .timeout_s = 10, .hidden = true)
{
    pid_t pid;
    char *argv[] = {(char *)"sleep", (char *)"30", NULL};
    TD_CHECK_EQ(posix_spawnp(&pid, "sleep", NULL, NULL, argv, environ), 0);
    printf("CHILD=%d\n", (int)pid);
}

TD_TEST(leftovers_fail, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_leftover_file", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK(starts_with(r.message, "Test left files in its temp dir "));
    TD_CHECK_CONTAINS(r.message, ": tmp");
    TD_CHECK(ends_with(r.message, " (remove them before the test returns, or set .allow_leftovers for a crash test)"));
    td_test_result_free(&r);

    /* The ThreadSanitizer runtime's own file (supervisor.c) is not the test's in a TSan build. */
    RUN("inner_leftover_tsan_rodata", &r);
#if defined(__SANITIZE_THREAD__)
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
#else
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK_CONTAINS(r.message, ": tsan.rodata.");
#endif
    td_test_result_free(&r);

    RUN("inner_leftover_shm", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    const char *p = strstr(r.output, "SHM=");
    TD_CHECK(p != NULL);
    char path[256];
    snprintf(path, sizeof path, "%.*s", (int)strcspn(p + 4, "\n"), p + 4);
    char want[512];
    snprintf(want, sizeof want, "Test left shared-memory segments behind (now removed): %s", path);
    TD_CHECK_STR_EQ(r.message, want);
    TD_CHECK(access(path, F_OK) != 0);
    td_test_result_free(&r);

    RUN("inner_leftover_process", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    p = strstr(r.output, "CHILD=");
    TD_CHECK(p != NULL);
    snprintf(want, sizeof want, "Test left processes running (now killed): %d (sleep)", atoi(p + 6));
    TD_CHECK_STR_EQ(r.message, want);
    td_test_result_free(&r);
}

/* ---- output capture, default timeout, sanitizer exit codes --------------------------------- */

TD_TEST(inner_much_output, .world_size = 2, .timeout_s = 30, .hidden = true)
{
    if (ctx->rank != 1)
        return;
    char *long_line = malloc(200000);
    memset(long_line, 'z', 199999);
    long_line[199999] = '\0';
    fputs(long_line, stdout); /* longer than a line may get: cut into pieces, not lost */
    free(long_line);
    for (int i = 0; i < 80000; i++) /* about 6 MiB */
        printf("output line %07d of rank 1, padded to be about eighty characters long........\n", i);
}

TD_TEST(output_is_drained_and_capped, .timeout_s = 120)
{
    setenv("TDIST_TEST_QUIET", "1", 1);
    td_test_result r;
    RUN("inner_much_output", &r);
    unsetenv("TDIST_TEST_QUIET");
    TD_CHECK_EQ(r.verdict, TD_TEST_PASS);
    size_t len = strlen(r.output);
    TD_CHECK(len >= (4u << 20) && len <= (5u << 20) + 4096);
    TD_CHECK_CONTAINS(r.output, "[rank 1] output line 0079999 of rank 1");
    TD_CHECK(strstr(r.output, "output line 0000000 ") == NULL);
    TD_CHECK(starts_with(r.output, "[rank ")); /* cut at a line boundary */
    td_test_result_free(&r);
}

TD_TEST(inner_default_timeout, .world_size = 1, .hidden = true)
{
    hang_forever_in_rank0();
}

TD_TEST(timeout_from_env, .timeout_s = 60)
{
    setenv("TDIST_TEST_TIMEOUT", "1500ms", 1);
    td_test_result r;
    RUN("inner_default_timeout", &r);
    unsetenv("TDIST_TEST_TIMEOUT");
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    TD_CHECK_CONTAINS(r.log, "Timing out after 1.5 seconds and killing subprocesses.");
    TD_CHECK(starts_with(r.message, "Process 0 terminated or timed out after "));
    td_test_result_free(&r);
}

#ifdef TDIST_LEAK_CHECKED
static void *volatile g_leaked;

TD_TEST(inner_heap_leak, .world_size = 2, .timeout_s = 30, .hidden = true)
{
    g_leaked = malloc(1000);
    g_leaked = NULL; /* unreachable: LeakSanitizer reports it at exit */
}

/* A body that returns normally lets LeakSanitizer run at exit; its exit code shows as a failure. */
TD_TEST(leak_sanitizer_exit_code_fails, .timeout_s = 60)
{
    td_test_result r;
    RUN("inner_heap_leak", &r);
    TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
    /* ASan's exit code for a leak is 1 (standalone LeakSanitizer's is 23) */
    TD_CHECK(r.exit_codes[0] == 1 || r.exit_codes[0] == 23);
    TD_CHECK_EQ(r.exit_codes[1], r.exit_codes[0]);
    char want[128];
    snprintf(want, sizeof want, "Expected zero exit code but got %d for pid: ", r.exit_codes[0]);
    TD_CHECK(starts_with(r.message, want));
    TD_CHECK_CONTAINS(r.output, "ERROR: LeakSanitizer: detected memory leaks");
    td_test_result_free(&r);
}
#endif

/* ---- check macros: each failure text exactly ------------------------------------------------ */

static td_status fails_with_timeout(void) { return error_fmt(TD_ERR_TIMEOUT, "Wait timeout"); }

TD_TEST(inner_checks, .world_size = 1, .timeout_s = 10, .hidden = true,
        .params = "eq,str_eq,contains,ok,err_code,err_msg,err_ok,near,msg,null_str")
{
    const char *p = ctx->param;
    int two = 2;
    if (strcmp(p, "eq") == 0)
        TD_CHECK_EQ(two + 1, 4);
    if (strcmp(p, "str_eq") == 0)
        TD_CHECK_STR_EQ("abc", "abd");
    if (strcmp(p, "contains") == 0)
        TD_CHECK_CONTAINS("haystack", "needle");
    if (strcmp(p, "ok") == 0)
        TD_CHECK_OK(fails_with_timeout());
    if (strcmp(p, "err_code") == 0)
        TD_CHECK_ERR(fails_with_timeout(), TD_ERR_INVALID, NULL);
    if (strcmp(p, "err_msg") == 0)
        TD_CHECK_ERR(fails_with_timeout(), TD_ERR_TIMEOUT, "Socket Timeout");
    if (strcmp(p, "err_ok") == 0)
        TD_CHECK_ERR(TD_OK, TD_ERR_TIMEOUT, NULL);
    if (strcmp(p, "near") == 0)
        TD_CHECK_NEAR(1.0, 1.5, 0.25);
    if (strcmp(p, "msg") == 0)
        TD_CHECK_MSG(two == 3, "two is %d", two);
    if (strcmp(p, "null_str") == 0)
        TD_CHECK_STR_EQ((const char *)NULL, "x");
}

TD_TEST(check_macro_messages, .timeout_s = 120)
{
    static const struct {
        const char *param, *text;
    } cases[] = {
        {"eq", "Check failed: two + 1 == 4 (3 vs 4)"},
        {"str_eq", "Check failed: \"abc\" == \"abd\" (\"abc\" vs \"abd\")"},
        {"contains", "Check failed: \"haystack\" contains \"needle\" (\"haystack\" does not contain \"needle\")"},
        {"ok", "fails_with_timeout() returned TD_ERR_TIMEOUT: Wait timeout"},
        {"err_code", "fails_with_timeout() returned TD_ERR_TIMEOUT, expected TD_ERR_INVALID: Wait timeout"},
        {"err_msg", "fails_with_timeout() failed with TD_ERR_TIMEOUT as expected, but its message \"Wait timeout\" "
                    "does not contain \"Socket Timeout\""},
        {"err_ok", "TD_OK succeeded, expected it to fail with TD_ERR_TIMEOUT"},
        {"near", "Check failed: 1.0 ~= 1.5 (1 vs 1.5, tol 0.25)"},
        {"msg", "two is 2"},
        {"null_str", "Check failed: (const char *)NULL == \"x\" (\"(null)\" vs \"x\")"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[64];
        snprintf(name, sizeof name, "inner_checks/%s", cases[i].param);
        td_test_result r;
        RUN(name, &r);
        TD_CHECK_EQ(r.verdict, TD_TEST_FAIL);
        char want[1024];
        snprintf(want, sizeof want, ": %s\n", cases[i].text);
        TD_CHECK(starts_with(r.message, "Process 0 exited with error code 10 and exception:\n" __FILE__ ":"));
        TD_CHECK(ends_with(r.message, want));
        td_test_result_free(&r);
    }
}

/* ---- the command line ----------------------------------------------------------------------- */

static int run_self(const char *const *args, const char *out_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    char *argv[16];
    int n = 0;
    argv[n++] = (char *)"test_harness";
    for (; args[n - 1] && n < 15; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    pid_t pid;
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

TD_TEST(command_line, .timeout_s = 120)
{
    char out[512], file[512];
    snprintf(out, sizeof out, "%s/stdout", ctx->tmpdir);
    snprintf(file, sizeof file, "%s/cases.cmake", ctx->tmpdir);

    const char *ctest[] = {"--ctest", file, NULL};
    TD_CHECK_EQ(run_self(ctest, out), 0);
    char *text = slurp(file);
    TD_CHECK(text != NULL);
    TD_CHECK_CONTAINS(text, "add_test([==[test_harness.rank2_fails]==] [==[");
    TD_CHECK_CONTAINS(text, "]==] [==[rank2_fails]==])\n");
    TD_CHECK_CONTAINS(text, "set_tests_properties([==[test_harness.rank2_fails]==] PROPERTIES TIMEOUT 90 "
                            "PROCESSORS 1 SKIP_RETURN_CODE 77");
    TD_CHECK_CONTAINS(text, "set_tests_properties([==[test_harness.four_ranks_directly]==] PROPERTIES TIMEOUT 60 "
                            "PROCESSORS 2 SKIP_RETURN_CODE 77");
    TD_CHECK(strstr(text, "inner_") == NULL); /* hidden cases are not listed */
    free(text);
    unlink(file);

    const char *list[] = {"--list", "four_ranks", "inner_param", NULL};
    TD_CHECK_EQ(run_self(list, out), 0);
    text = slurp(out);
    TD_CHECK_STR_EQ(text, "four_ranks_directly\ninner_param/a\ninner_param/b\n");
    free(text);

    const char *run_skip[] = {"inner_all_skip", NULL};
    TD_CHECK_EQ(run_self(run_skip, out), 77);
    text = slurp(out);
    TD_CHECK_CONTAINS(text, "[ RUN      ] inner_all_skip\n");
    TD_CHECK_CONTAINS(text, "[  SKIPPED ] inner_all_skip (");
    TD_CHECK_CONTAINS(text, "): Skipped due to small world size.\n");
    free(text);

    const char *run_fail[] = {"inner_rank0_skips", "inner_all_exit_1", NULL};
    TD_CHECK_EQ(run_self(run_fail, out), 1);
    text = slurp(out);
    TD_CHECK_CONTAINS(text, "[  FAILED  ] inner_rank0_skips (");
    TD_CHECK_CONTAINS(text, "Expect process 1 exit code to match Process 0 exit code of 73, but got 0\n");
    TD_CHECK(strstr(text, "[ RUN      ] inner_all_exit_1") == NULL); /* stops at the first failure */
    TD_CHECK_CONTAINS(text, "[  STOPPED ] after the first failure (--keep-going runs the rest)\n");
    free(text);

    const char *keep_going[] = {"--keep-going", "inner_rank0_skips", "inner_pass", NULL};
    TD_CHECK_EQ(run_self(keep_going, out), 1);
    text = slurp(out);
    TD_CHECK_CONTAINS(text, "[       OK ] inner_pass (");
    TD_CHECK_CONTAINS(text, "[==========] 1 passed, 0 skipped, 1 failed\n");
    free(text);

    const char *bad[] = {"no_such_case", NULL};
    TD_CHECK_EQ(run_self(bad, out), 2);
    unlink(out);
}

TD_TEST(skip_table, .timeout_s = 30)
{
    TD_CHECK_STR_EQ(td_skip_message(72), "Skipped because distributed backend is not available.");
    TD_CHECK_STR_EQ(td_skip_message(86), "Test skipped at subprocess level, look at subprocess log for skip reason");
    TD_CHECK_STR_EQ(td_skip_message(87), "Skipped due to odd world size.");
    TD_CHECK_STR_EQ(td_skip_message(88), "Test skipped due to missing import");
    TD_CHECK(td_skip_message(71) == NULL);
    TD_CHECK(td_skip_message(89) == NULL);
    TD_CHECK(td_skip_message(0) == NULL);
    TD_CHECK_EQ(td_skip_multi_gpu(1), 75);
    TD_CHECK_EQ(td_skip_multi_gpu(2), 77);
    TD_CHECK_EQ(td_skip_multi_gpu(3), 80);
    TD_CHECK_EQ(td_skip_multi_gpu(8), 85);
    TD_CHECK_EQ(td_skip_multi_gpu(9), -1);
    TD_CHECK_EQ(td_skip_multi_gpu(0), -1);
    for (int n = 3; n <= 8; n++) {
        char want[64];
        snprintf(want, sizeof want, "Need at least %d CUDA devices", n);
        TD_CHECK_STR_EQ(td_skip_message(td_skip_multi_gpu(n)), want);
    }
}

TD_TEST_MAIN()
