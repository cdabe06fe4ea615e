/* tdrun under test: real tdrun processes running the worker program tdrun_worker.c.
 *
 * Each case starts tdrun as a child with its output on a pipe, then checks what the launcher
 * promises: the environment each worker sees, rank-prefixed whole lines, a failing worker taking
 * the others down with torchrun's summary and exit code 1, restarts counted, signals forwarded and
 * no worker left behind, and two nodes on one machine forming one world. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/buf.h"
#include "base/clock.h"

typedef struct proc {
    pid_t pid;
    int fd; /* stdout and stderr together */
    td_buf out;
    int code;
    bool exited;
} proc;

static void proc_start(proc *p, char *const argv[])
{
    int fds[2];
    TD_CHECK(pipe2(fds, O_CLOEXEC) == 0);
    memset(p, 0, sizeof *p);
    p->pid = fork();
    TD_CHECK(p->pid >= 0);
    if (p->pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    p->fd = fds[0];
}

/* Reads output until `needle` appears (true) or the process ends or the time is up (false). */
static bool proc_read_until(proc *p, const char *needle, int64_t timeout_ms)
{
    int64_t deadline = deadline_after_ms(timeout_ms);
    while (!(needle && p->out.data && strstr(p->out.data, needle))) {
        if (p->fd < 0 || deadline_passed(deadline))
            return false;
        struct pollfd pfd = {.fd = p->fd, .events = POLLIN};
        if (poll(&pfd, 1, deadline_poll_ms(deadline)) <= 0)
            continue;
        char chunk[8192];
        ssize_t n = read(p->fd, chunk, sizeof chunk);
        if (n <= 0) {
            close(p->fd);
            p->fd = -1;
        } else {
            buf_append(&p->out, chunk, (size_t)n);
        }
    }
    return true;
}

/* Reads to EOF and reaps; fails the test if that takes longer than timeout_ms. */
static void proc_finish(proc *p, int64_t timeout_ms)
{
    proc_read_until(p, NULL, timeout_ms);
    TD_CHECK_MSG(p->fd < 0, "process %d still running after %lld ms; output so far:\n%s", (int)p->pid,
                 (long long)timeout_ms, p->out.data ? p->out.data : "");
    int status;
    TD_CHECK(waitpid(p->pid, &status, 0) == p->pid);
    p->code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    p->exited = true;
    if (!p->out.data)
        buf_append(&p->out, "", 0);
}

static void proc_free(proc *p)
{
    if (!p->exited && p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
    }
    if (p->fd >= 0)
        close(p->fd);
    buf_free(&p->out);
}

/* Runs tdrun with the given arguments to the end. */
static void run_tdrun(proc *p, char *const argv[], int64_t timeout_ms)
{
    proc_start(p, argv);
    proc_finish(p, timeout_ms);
}

static int count_lines_with(const char *text, const char *prefix)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, prefix)); p++)
        n++;
    return n;
}

TD_TEST(worker_environment, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "3", WORKER_BIN, "env", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    char *port_line = strstr(p.out.data, "store listening on 127.0.0.1:");
    TD_CHECK_MSG(port_line != NULL, "no store line in:\n%s", p.out.data);
    int port = atoi(port_line + strlen("store listening on 127.0.0.1:"));
    TD_CHECK(port > 0 && port < 65536);
    for (int r = 0; r < 3; r++) {
        char want[512];
        snprintf(want, sizeof want,
                 "[rank%d]: ENV RANK=%d LOCAL_RANK=%d WORLD_SIZE=3 LOCAL_WORLD_SIZE=3 GROUP_RANK=0 "
                 "MASTER_ADDR=127.0.0.1 MASTER_PORT=%d TDIST_RESTART_COUNT=0 TDIST_USE_AGENT_STORE=1\n",
                 r, r, r, port);
        TD_CHECK_CONTAINS(p.out.data, want);
    }
    proc_free(&p);
}

TD_TEST(output_lines_prefixed_and_whole, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "4", WORKER_BIN, "spam", "2000", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d", p.code);
    /* Every line must be one whole worker line with its own rank's prefix. */
    int lines = 0;
    char *save = NULL;
    for (char *l = strtok_r(p.out.data, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int prefix_rank, rank, i;
        char kind[16];
        TD_CHECK_MSG(sscanf(l, "[rank%d]: %15s %d %d", &prefix_rank, kind, &rank, &i) == 4, "bad line: '%s'", l);
        TD_CHECK_MSG(prefix_rank == rank, "line of rank %d prefixed with rank %d: '%s'", rank, prefix_rank, l);
        size_t len = strlen(l);
        TD_CHECK_MSG(len > 4 && strcmp(l + len - 4, " END") == 0, "torn line: '%s'", l);
        if (strcmp(kind, "LINE") == 0) {
            char want[128];
            snprintf(want, sizeof want, " %064d END", i);
            TD_CHECK_MSG(strstr(l, want) != NULL, "torn line: '%s'", l);
        }
        lines++;
    }
    TD_CHECK_EQ(lines, 4 * (2000 + 1000));
    proc_free(&p);
}

TD_TEST(failing_worker_stops_the_others, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "4", WORKER_BIN, "fail", "2", "3", NULL};
    int64_t t0 = clock_now_ms();
    run_tdrun(&p, argv, 30000);
    int64_t took = clock_now_ms() - t0;
    TD_CHECK_MSG(p.code == 1, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_MSG(took < 20000, "tdrun took %lld ms to stop the group", (long long)took);
    TD_CHECK_CONTAINS(p.out.data, "Root Cause (first observed failure):");
    TD_CHECK_CONTAINS(p.out.data, "  rank      : 2 (local_rank: 2)\n");
    TD_CHECK_CONTAINS(p.out.data, "  exitcode  : 3 (pid: ");
    TD_CHECK_CONTAINS(p.out.data, "  host      : ");
    TD_CHECK_CONTAINS(p.out.data, "  time      : ");
    TD_CHECK_CONTAINS(p.out.data, "FAILED");
    for (int r = 0; r < 4; r++) {
        if (r == 2)
            continue;
        char want[64];
        snprintf(want, sizeof want, "[rank%d]: rank %d got SIGTERM", r, r);
        TD_CHECK_CONTAINS(p.out.data, want);
    }
    proc_free(&p);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

TD_TEST(failing_worker_with_signal_and_log_dir, .timeout_s = 60)
{
    char logdir[4096];
    snprintf(logdir, sizeof logdir, "%s/logs", ctx->tmpdir);
    proc p;
    /* A worker killed by a signal, from outside, while the others sleep. */
    char piddir[4096];
    snprintf(piddir, sizeof piddir, "%s", ctx->tmpdir);
    char *argv[] = {TDRUN_BIN, "--standalone", "--log-dir", logdir, "--nproc-per-node", "2", WORKER_BIN, "sleep",
                    piddir, NULL};
    proc_start(&p, argv);
    char pidfile[4200];
    snprintf(pidfile, sizeof pidfile, "%s/1.pid", piddir);
    int pid = 0;
    for (int i = 0; i < 300 && pid == 0; i++) {
        FILE *f = fopen(pidfile, "r");
        if (f) {
            if (fscanf(f, "%d", &pid) != 1)
                pid = 0;
            fclose(f);
        }
        if (!pid)
            usleep(20000);
    }
    TD_CHECK_MSG(pid > 0, "worker 1 never wrote its pid");
    TD_CHECK(kill(pid, SIGKILL) == 0);
    proc_finish(&p, 30000);
    TD_CHECK_MSG(p.code == 1, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "  rank      : 1 (local_rank: 1)\n");
    TD_CHECK_CONTAINS(p.out.data, "  exitcode  : -9 (pid: ");
    TD_CHECK_CONTAINS(p.out.data, "Signal 9 (SIGKILL) received by PID");
    char want[4300];
    snprintf(want, sizeof want, "  log file  : %s/attempt_0/1/stderr.log", logdir);
    TD_CHECK_CONTAINS(p.out.data, want);
    snprintf(want, sizeof want, "%s/attempt_0/0/stdout.log", logdir);
    TD_CHECK(access(want, F_OK) == 0);
    /* Clean up what the job wrote into the test's dir. */
    TD_CHECK(nftw(logdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0);
    for (int r = 0; r < 2; r++) {
        snprintf(pidfile, sizeof pidfile, "%s/%d.pid", piddir, r);
        unlink(pidfile);
    }
    proc_free(&p);
}

TD_TEST(restarts_are_counted, .timeout_s = 90)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--term-timeout", "2", "--max-restarts", "2", "--nproc-per-node", "2",
                    WORKER_BIN, "restart", "2", NULL};
    run_tdrun(&p, argv, 60000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "restarting the workers (restart 1 of 2)");
    TD_CHECK_CONTAINS(p.out.data, "restarting the workers (restart 2 of 2)");
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: attempt 0");
    TD_CHECK_CONTAINS(p.out.data, "[rank1]: attempt 1");
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: DONE restart=2");
    TD_CHECK_CONTAINS(p.out.data, "[rank1]: DONE restart=2");
    TD_CHECK_EQ(count_lines_with(p.out.data, "Root Cause"), 2);
    proc_free(&p);

    /* Out of restarts: the job fails. */
    char *argv2[] = {TDRUN_BIN, "--standalone", "--term-timeout", "2", "--max-restarts", "1", "--nproc-per-node", "2",
                     WORKER_BIN, "restart", "5", NULL};
    run_tdrun(&p, argv2, 60000);
    TD_CHECK_MSG(p.code == 1, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_EQ(count_lines_with(p.out.data, "Root Cause"), 2);
    proc_free(&p);
}

static void read_pids(const char *dir, int n, int *pids)
{
    for (int r = 0; r < n; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%d.pid", dir, r);
        pids[r] = 0;
        for (int i = 0; i < 500 && pids[r] == 0; i++) {
            FILE *f = fopen(path, "r");
            if (f) {
                if (fscanf(f, "%d", &pids[r]) != 1)
                    pids[r] = 0;
                fclose(f);
            }
            if (!pids[r])
                usleep(20000);
        }
        TD_CHECK_MSG(pids[r] > 0, "worker %d never wrote its pid", r);
        unlink(path);
    }
}

static void check_all_gone(const int *pids, int n)
{
    for (int r = 0; r < n; r++) {
        bool gone = false;
        for (int i = 0; i < 250 && !gone; i++) { /* reparented zombies are reaped by init */
            gone = kill(pids[r], 0) != 0 && errno == ESRCH;
            if (!gone)
                usleep(20000);
        }
        TD_CHECK_MSG(gone, "worker %d (pid %d) outlived tdrun", r, pids[r]);
    }
}

TD_TEST(sigterm_reaches_every_worker, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "3", WORKER_BIN, "sleep", (char *)ctx->tmpdir, NULL};
    proc_start(&p, argv);
    int pids[3];
    read_pids(ctx->tmpdir, 3, pids);
    TD_CHECK(kill(p.pid, SIGTERM) == 0);
    proc_finish(&p, 30000);
    TD_CHECK_MSG(p.code == 128 + SIGTERM, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "received SIGTERM");
    check_all_gone(pids, 3);
    proc_free(&p);
}

TD_TEST(sigkill_of_tdrun_leaves_no_worker, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "2", WORKER_BIN, "sleep", (char *)ctx->tmpdir, NULL};
    proc_start(&p, argv);
    int pids[2];
    read_pids(ctx->tmpdir, 2, pids);
    TD_CHECK(kill(p.pid, SIGKILL) == 0);
    proc_finish(&p, 30000);
    TD_CHECK_EQ(p.code, -SIGKILL);
    check_all_gone(pids, 2);
    proc_free(&p);
}

TD_TEST(two_nodes_on_one_machine, .timeout_s = 90)
{
    proc node0, node1;
    char *argv0[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                     "0", "--nproc-per-node", "2", WORKER_BIN, "store", NULL};
    proc_start(&node0, argv0);
    const char *marker = "store listening on 127.0.0.1:";
    TD_CHECK_MSG(proc_read_until(&node0, marker, 30000), "node 0 never reported its store:\n%s",
                 node0.out.data ? node0.out.data : "");
    char port[16];
    snprintf(port, sizeof port, "%d", atoi(strstr(node0.out.data, marker) + strlen(marker)));
    char *argv1[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                     port, "--nproc-per-node", "2", WORKER_BIN, "store", NULL};
    proc_start(&node1, argv1);
    proc_finish(&node1, 60000);
    proc_finish(&node0, 60000);
    TD_CHECK_MSG(node0.code == 0 && node1.code == 0, "node 0 exited %d, node 1 exited %d:\n%s\n---\n%s", node0.code,
                 node1.code, node0.out.data, node1.out.data);
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof want, "[rank%d]: STORE rank=%d world=4 joined=4", r, r);
        TD_CHECK_CONTAINS(r < 2 ? node0.out.data : node1.out.data, want);
    }
    proc_free(&node0);
    proc_free(&node1);
}

TD_TEST(bad_flags_are_reported, .timeout_s = 30)
{
    proc p;
    char *a1[] = {TDRUN_BIN, "--nproc-per-node", "zero", WORKER_BIN, "env", NULL};
    run_tdrun(&p, a1, 10000);
    TD_CHECK_EQ(p.code, 2);
    TD_CHECK_CONTAINS(p.out.data, "--nproc-per-node must be an integer, got 'zero'");
    proc_free(&p);
    char *a2[] = {TDRUN_BIN, "--standalone", "/nonexistent/program", NULL};
    run_tdrun(&p, a2, 10000);
    TD_CHECK_EQ(p.code, 2);
    TD_CHECK_CONTAINS(p.out.data, "cannot run '/nonexistent/program'");
    proc_free(&p);
    char *a3[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "2", WORKER_BIN, "env", NULL};
    run_tdrun(&p, a3, 10000);
    TD_CHECK_EQ(p.code, 2);
    TD_CHECK_CONTAINS(p.out.data, "--node-rank 2 must be less than --nnodes 2");
    proc_free(&p);
}

TD_TEST(example_allreduce_through_tdrun, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "4", ALLREDUCE_BIN, NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    for (int r = 0; r < 4; r++) {
        char want[64];
        snprintf(want, sizeof want, "[rank%d]: rank %d: sum = 6\n", r, r);
        TD_CHECK_CONTAINS(p.out.data, want);
    }
    proc_free(&p);
}

/* The RPC example: worker0 farms slices out to the other workers and adds up their answers. */
TD_TEST(example_rpc_work_queue_through_tdrun, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "3", RPC_WORK_QUEUE_BIN, NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: sum of squares of 0..9999 = 333283335000\n");
    proc_free(&p);
}

/* The demo job, smaller: it must converge and keep the ranks' parameters bit-identical. */
TD_TEST(example_ddp_train_through_tdrun, .timeout_s = 120)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "3", DDP_TRAIN_BIN, "--samples",
                    "12000", "--epochs", "4", "--target", "0.75", NULL};
    run_tdrun(&p, argv, 100000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: epoch  4/4 [####################] loss ");
    TD_CHECK_CONTAINS(p.out.data, "all 3 ranks hold identical parameters");
    for (int r = 0; r < 3; r++) {
        char want[80];
        snprintf(want, sizeof want, "[rank%d]: rank %d: parameters bit-identical to rank 0's", r, r);
        TD_CHECK_CONTAINS(p.out.data, want);
    }
    proc_free(&p);
}

TD_TEST_MAIN()
