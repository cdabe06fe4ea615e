/* Fork safety of process groups (spec/multiprocessing.md K): a child forked from a rank that holds
 * a live group inherits a copy whose worker thread stayed in the parent. Using it must fail with a
 * clear error instead of deadlocking, destroying it must return, and the parent's group must keep
 * working. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pg_util.h"

TD_PG_TEST_ON(inherited_group_fails_clearly_in_a_forked_child, 2, "tcp", .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    td_tensor *t = pg_test_tensor(TD_FLOAT32, ctx->rank, 8);
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));

    int fds[2];
    TD_CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    TD_CHECK(pid >= 0);
    if (pid == 0) {
        /* The child reports what it saw through the pipe and leaves without running the test's
         * teardown (it owns none of the parent's resources). */
        char line[1024];
        td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
        int n = snprintf(line, sizeof line, "%s|%s\n", td_status_str(st), td_last_error());
        td_pg_destroy(pg); /* must return, not join a thread that is not there */
        (void)!write(fds[1], line, (size_t)n);
        _exit(0);
    }
    close(fds[1]);
    char buf[1024] = {0};
    size_t got = 0;
    ssize_t k;
    while (got < sizeof buf - 1 && (k = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)k;
    close(fds[0]);
    int status = 0;
    TD_CHECK(waitpid(pid, &status, 0) == pid);
    TD_CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child ended with status %d", status);
    TD_CHECK_CONTAINS(buf, "TD_ERR_UNSUPPORTED|Unable to use a process group in a forked child process");

    /* The parent's group is unaffected. */
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
    td_tensor_release(t);
    pg_test_done(ctx, pg);
}

TD_TEST_MAIN()
