/* tdrun under test: real tdrun processes running the worker program tdrun_worker.c.
 *
 * Each case starts tdrun as a child with its output on a pipe, then checks what the launcher
 * promises: the environment each worker sees, rank-prefixed whole lines, a failing worker taking
 * the others down with torchrun's summary and exit code 1, restarts counted, signals forwarded and
 * no worker left behind, and two nodes on one machine forming one world. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <sched.h>
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

/* Runs tdrun --standalone with 2 "secret" workers; returns the job secret's id both printed. */
static void run_secret_job(char id[9], size_t *len)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "2", WORKER_BIN, "secret", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    char *l0 = strstr(p.out.data, "[rank0]: SECRET len=");
    char *l1 = strstr(p.out.data, "[rank1]: SECRET len=");
    TD_CHECK_MSG(l0 && l1, "no SECRET lines in:\n%s", p.out.data);
    char id1[9] = "";
    TD_CHECK(sscanf(l0, "[rank0]: SECRET len=%zu id=%8s", len, id) == 2);
    TD_CHECK(sscanf(l1, "[rank1]: SECRET len=%*u id=%8s", id1) == 1);
    TD_CHECK_STR_EQ(id, id1);
    TD_CHECK_EQ(count_lines_with(p.out.data, "STRANGER refused: "), 2);
    TD_CHECK_CONTAINS(p.out.data, "requires the job's secret");
    proc_free(&p);
}

/* A single-node job gets a random secret of its own, the same on every worker and new for each
 * job; a client without it is refused by the job's store. A given TDIST_AUTH_TOKEN is kept. */
TD_TEST(each_job_gets_its_own_secret, .timeout_s = 90)
{
    char a[9], b[9];
    size_t la = 0, lb = 0;
    unsetenv("TDIST_AUTH_TOKEN");
    run_secret_job(a, &la);
    run_secret_job(b, &lb);
    TD_CHECK_EQ(la, (size_t)64);
    TD_CHECK_EQ(lb, (size_t)64);
    TD_CHECK_MSG(strcmp(a, b) != 0, "two jobs got the same secret (%s)", a);
    setenv("TDIST_AUTH_TOKEN", "given-secret", 1);
    run_secret_job(a, &la);
    unsetenv("TDIST_AUTH_TOKEN");
    TD_CHECK_EQ(la, strlen("given-secret"));
    TD_CHECK_STR_EQ(a, "given-se");
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

/* A worker logging through tdist: each of its lines carries exactly one rank prefix, its own
 * (tdrun's "[rankR]: " or the library's "[rank R]" / PyTorch's "[Rank R]"), never two (issue 22). */
TD_TEST(log_lines_carry_one_rank_prefix, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "2", WORKER_BIN, "log", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    for (int r = 0; r < 2; r++) {
        char want[160];
        snprintf(want, sizeof want, "[rank%d]: PLAIN of rank %d\n", r, r);
        TD_CHECK_CONTAINS(p.out.data, want);
        snprintf(want, sizeof want, "[rank%d]: [tdist WARN] LOG before the rank is known\n", r);
        TD_CHECK_CONTAINS(p.out.data, want);
        snprintf(want, sizeof want, "\n[tdist WARN] [rank %d] LOG of rank %d\n", r, r);
        TD_CHECK_CONTAINS(p.out.data, want);
        snprintf(want, sizeof want, "\n[tdist ERROR] [Rank %d] LOG Watchdog caught", r);
        TD_CHECK_CONTAINS(p.out.data, want);
    }
    int lines = 0;
    char *save = NULL;
    for (char *l = strtok_r(p.out.data, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (!strstr(l, "PLAIN") && !strstr(l, "LOG"))
            continue;
        int prefixes = 0;
        for (const char *q = l; *q; q++)
            if (strncmp(q, "[rank", 5) == 0 || strncmp(q, "[Rank", 5) == 0)
                prefixes++;
        TD_CHECK_MSG(prefixes == 1, "line with %d rank prefixes: '%s'", prefixes, l);
        lines++;
    }
    TD_CHECK_EQ(lines, 2 * 4);
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
    TD_CHECK_CONTAINS(p.out.data, "  error_file: <N/A>\n");
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

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw);

/* Removes the tdrun_* run directories in dir. */
static void remove_run_dirs(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "tdrun_", 6) == 0) {
            char path[4400];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        }
    closedir(d);
}

/* A copy of the rest of the line after the first `prefix` in text, or NULL. */
static char *line_after(const char *text, const char *prefix)
{
    const char *p = text ? strstr(text, prefix) : NULL;
    if (!p)
        return NULL;
    p += strlen(prefix);
    return strndup(p, strcspn(p, "\n"));
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
    /* The run writes under a directory of its own: LOGDIR/<run id>_XXXXXX. */
    char want[4400];
    char *run_dir = line_after(p.out.data, "logs under ");
    TD_CHECK_MSG(run_dir && strncmp(run_dir, logdir, strlen(logdir)) == 0, "no run directory in:\n%s", p.out.data);
    snprintf(want, sizeof want, "  log file  : %s/attempt_0/1/stderr.log", run_dir);
    TD_CHECK_CONTAINS(p.out.data, want);
    snprintf(want, sizeof want, "%s/attempt_0/0/stdout.log", run_dir);
    TD_CHECK(access(want, F_OK) == 0);
    free(run_dir);
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
    /* A SIGKILLed tdrun cannot remove its temporary run directory (TMPDIR is the test's dir). */
    remove_run_dirs(ctx->tmpdir);
    proc_free(&p);
}

/* Waits for a host node's "store listening" line and writes its port into port. */
static void host_port(proc *host, char port[16])
{
    const char *marker = "store listening on 127.0.0.1:";
    TD_CHECK_MSG(proc_read_until(host, marker, 30000), "the host node never reported its store:\n%s",
                 host->out.data ? host->out.data : "");
    snprintf(port, 16, "%d", atoi(strstr(host->out.data, marker) + strlen(marker)));
}

/* Two tdrun nodes on this machine: starts the host node, puts its store's port in place of the
 * word "PORT" in other_argv, starts the other node and waits for both (the other first, each up to
 * timeout_ms); fails the test unless they exit with want_host and want_other. */
static void run_two_nodes(proc *host, char *const host_argv[], proc *other, char *other_argv[], int64_t timeout_ms,
                          int want_host, int want_other)
{
    static char port[16];
    proc_start(host, host_argv);
    host_port(host, port);
    for (char **a = other_argv; *a; a++)
        if (strcmp(*a, "PORT") == 0)
            *a = port;
    proc_start(other, other_argv);
    proc_finish(other, timeout_ms);
    proc_finish(host, timeout_ms);
    TD_CHECK_MSG(host->code == want_host && other->code == want_other,
                 "the host node exited %d, the other %d:\n%s\n---\n%s", host->code, other->code, host->out.data,
                 other->out.data);
}

TD_TEST(two_nodes_on_one_machine, .timeout_s = 90)
{
    proc node0, node1;
    char *argv0[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
                     "0", "--nproc-per-node", "2", WORKER_BIN, "store", NULL};
    char *argv1[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                     "PORT", "--nproc-per-node", "2", WORKER_BIN, "store", NULL};
    /* Without a secret given to both nodes, the job runs unauthenticated and says so; with one,
     * every node and worker proves it. */
    for (int with_secret = 0; with_secret < 2; with_secret++) {
        if (with_secret)
            setenv("TDIST_AUTH_TOKEN", "shared-by-both-nodes", 1);
        else
            unsetenv("TDIST_AUTH_TOKEN");
        argv1[8] = "PORT";
        run_two_nodes(&node0, argv0, &node1, argv1, 60000, 0, 0);
        unsetenv("TDIST_AUTH_TOKEN");
        for (int r = 0; r < 4; r++) {
            char want[64];
            snprintf(want, sizeof want, "[rank%d]: STORE rank=%d world=4 joined=4", r, r);
            TD_CHECK_CONTAINS(r < 2 ? node0.out.data : node1.out.data, want);
        }
        TD_CHECK_EQ(strstr(node0.out.data, "2-node job is not authenticated") != NULL, !with_secret);
        TD_CHECK_EQ(strstr(node1.out.data, "2-node job is not authenticated") != NULL, !with_secret);
        proc_free(&node0);
        proc_free(&node1);
    }
}

/* Two nodes restart together: a worker of node 1 fails before rendezvous in the first round, while
 * node 0's workers wait for it at the store. Node 1 ends the round through the job's store, node 0
 * stops its waiting workers at once, and both nodes run round 1, where all four ranks meet. */
TD_TEST(two_nodes_restart_together, .timeout_s = 120)
{
    proc node0, node1;
    char *argv0[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "0", "--master-port", "0", "--max-restarts", "2",
                     "--nproc-per-node", "2", WORKER_BIN, "store", "3", "1", NULL};
    char *argv1[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-port", "PORT", "--max-restarts", "2",
                     "--nproc-per-node", "2", WORKER_BIN, "store", "3", "1", NULL};
    run_two_nodes(&node0, argv0, &node1, argv1, 60000, 0, 0);
    TD_CHECK_CONTAINS(node1.out.data, "[rank3]: failing before rendezvous in attempt 0");
    TD_CHECK_EQ(count_lines_with(node1.out.data, "Root Cause"), 1);
    TD_CHECK_CONTAINS(node0.out.data, "node 0: stopped the workers: another node's worker failed (node 1: rank 3 "
                                      "(local rank 1) exited with 1)");
    TD_CHECK_CONTAINS(node0.out.data, "restarting the workers (restart 1 of 2)");
    TD_CHECK_CONTAINS(node1.out.data, "restarting the workers (restart 1 of 2)");
    for (int r = 0; r < 4; r++) {
        char want[96];
        snprintf(want, sizeof want, "[rank%d]: STORE rank=%d world=4 joined=4 attempt=1", r, r);
        TD_CHECK_CONTAINS(r < 2 ? node0.out.data : node1.out.data, want);
    }
    /* Node 0's first-round workers were stopped, not left to time out at the store. */
    TD_CHECK_MSG(!strstr(node0.out.data, "failed:"), "a worker of node 0 failed:\n%s", node0.out.data);
    proc_free(&node0);
    proc_free(&node1);

    /* Without restarts left the job ends on both nodes, and node 0 says why. */
    char *argv2[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "0", "--master-port", "0", "--nproc-per-node", "2",
                     WORKER_BIN, "store", "3", "1", NULL};
    char *argv3[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-port", "PORT", "--nproc-per-node", "2",
                     WORKER_BIN, "store", "3", "1", NULL};
    run_two_nodes(&node0, argv2, &node1, argv3, 30000, 1, 1);
    TD_CHECK_CONTAINS(node0.out.data, "another node's worker failed (node 1: rank 3 (local rank 1) exited with 1)");
    TD_CHECK_CONTAINS(node0.out.data, "node 0: no restarts left (--max-restarts 0)");
    TD_CHECK_MSG(!strstr(node0.out.data, "failed:"), "a worker of node 0 failed:\n%s", node0.out.data);
    proc_free(&node0);
    proc_free(&node1);
}

/* Nodes started with different --nproc-per-node (or the same --node-rank) fail at once, all of
 * them, naming both sides, instead of waiting at the rendezvous for ranks that will never come. */
TD_TEST(disagreeing_nodes_fail_fast, .timeout_s = 60)
{
    proc node0, node1;
    char *argv0[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "0", "--master-port", "0", "--nproc-per-node", "2",
                     WORKER_BIN, "store", NULL};
    char *argv1[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-port", "PORT", "--nproc-per-node", "3",
                     WORKER_BIN, "store", NULL};
    /* The bound: both fail within 5 s. */
    run_two_nodes(&node0, argv0, &node1, argv1, 5000, 1, 1);
    const char *want = "the nodes disagree about the job: node 1 was started with --nnodes 2 --nproc-per-node 3 "
                       "--max-restarts 0 (world size 6), node 0 with --nnodes 2 --nproc-per-node 2 --max-restarts 0 "
                       "(world size 4); start every node with the same three";
    TD_CHECK_CONTAINS(node1.out.data, want);
    TD_CHECK_CONTAINS(node0.out.data, want);
    TD_CHECK_CONTAINS(node0.out.data, "node 0: stopped the workers");
    proc_free(&node0);
    proc_free(&node1);

    /* Two nodes given the same --node-rank. */
    proc node1b;
    char port[16];
    char *argv2[] = {TDRUN_BIN, "--nnodes", "3", "--node-rank", "0", "--master-port", "0", WORKER_BIN, "store", NULL};
    proc_start(&node0, argv2);
    host_port(&node0, port);
    char *argv3[] = {TDRUN_BIN, "--nnodes", "3", "--node-rank", "1", "--master-port", port, WORKER_BIN, "store", NULL};
    proc_start(&node1, argv3);
    TD_CHECK_MSG(proc_read_until(&node1, "node 1 of 3: starting", 10000), "node 1 never started:\n%s",
                 node1.out.data ? node1.out.data : "");
    proc_start(&node1b, argv3);
    proc_finish(&node1b, 5000);
    proc_finish(&node1, 5000);
    proc_finish(&node0, 5000);
    TD_CHECK_MSG(node0.code == 1 && node1.code == 1 && node1b.code == 1, "exit codes %d %d %d:\n%s\n---\n%s\n---\n%s",
                 node0.code, node1.code, node1b.code, node0.out.data, node1.out.data, node1b.out.data);
    TD_CHECK_CONTAINS(node1b.out.data, "node 1: --node-rank 1 is already taken by another node (tdrun pid ");
    TD_CHECK_CONTAINS(node0.out.data, "--node-rank 1 is already taken");
    TD_CHECK_CONTAINS(node1.out.data, "--node-rank 1 is already taken");
    proc_free(&node0);
    proc_free(&node1);
    proc_free(&node1b);
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

/* The demo job, smaller: it must converge and keep the ranks' parameters bit-identical, through
 * DDP on autograd (one bucket per layer) and through the hand-written backward (--manual). */
TD_TEST(example_ddp_train_through_tdrun, .timeout_s = 120)
{
#ifdef TDIST_TSAN
    TD_SKIP(TD_SKIP_GENERIC, "under ThreadSanitizer the training takes minutes; test_ddp's cases run its DDP and all_reduce paths there");
#endif
    for (int manual = 0; manual < 2; manual++) {
        proc p;
        char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "3", DDP_TRAIN_BIN, "--samples",
                        "12000", "--epochs", "4", "--target", "0.75", manual ? "--manual" : NULL, NULL};
        run_tdrun(&p, argv, 100000);
        TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
        TD_CHECK_CONTAINS(p.out.data, manual ? "steps/epoch of 96, hand-written backward + all_reduce\n"
                                             : "steps/epoch of 96, autograd + DDP\n");
        TD_CHECK_CONTAINS(p.out.data, "[rank0]: epoch  4/4 [####################] loss ");
        TD_CHECK_CONTAINS(p.out.data, "all 3 ranks hold identical parameters");
        if (!manual)
            TD_CHECK_CONTAINS(p.out.data, "[rank0]: DDP: 3 buckets (1.5, 36.4, 6.4 KiB), rebuilt in gradient order, "
                                          "500 steps on 3 ranks: communication ");
        for (int r = 0; r < 3; r++) {
            char want[80];
            snprintf(want, sizeof want, "[rank%d]: rank %d: parameters bit-identical to rank 0's", r, r);
            TD_CHECK_CONTAINS(p.out.data, want);
        }
        proc_free(&p);
    }
}

/* The parameter server (issue 19), smaller: the server owns the model through an RRef, two
 * trainers push gradients to its batching async function; it must converge as ddp_train does. */
TD_TEST(example_param_server_through_tdrun, .timeout_s = 120)
{
#ifdef TDIST_TSAN
    TD_SKIP(TD_SKIP_GENERIC, "under ThreadSanitizer the training takes minutes; the rpc and RRef cases run its paths there");
#endif
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "3", PARAM_SERVER_BIN, "--samples",
                    "12000", "--epochs", "4", "--target", "0.75", NULL};
    run_tdrun(&p, argv, 100000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: param_server: 1 server, 2 trainers, 12000 samples");
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: epoch  4/4 [####################] loss ");
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: param_server: 748 steps in ");
    TD_CHECK_CONTAINS(p.out.data, "test accuracy through the server's RRef");
    proc_free(&p);
}

/* Model parallelism (issue 20), smaller: the model split across two workers, trained by a third
 * through RPC, distributed autograd and the DistributedOptimizer; its first epochs' losses are
 * those of the parameter server's synchronous SGD on the same data, learning-rate decay included. */
TD_TEST(example_model_parallel_through_tdrun, .timeout_s = 180)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--quiet", "--nproc-per-node", "3", MODEL_PARALLEL_BIN, "--samples",
                    "12000", "--epochs", "3", "--target", "0.75", NULL};
    run_tdrun(&p, argv, 160000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: epoch  1/3 loss 0.9043 ");
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: epoch  3/3 loss 0.4893 "); /* after the last-quarter decay */
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: model_parallel: 561 steps in ");
    TD_CHECK_CONTAINS(p.out.data, "test accuracy across 2 workers");
    proc_free(&p);
}

/* ---- torchrun's variables and flags (issue 22) ---- */

/* Runs tdrun with argv; expects exit code `code` and `want` in the output. */
static void expect_run(char *const argv[], int code, const char *want)
{
    proc p;
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == code, "tdrun exited %d, not %d:\n%s", p.code, code, p.out.data);
    if (want)
        TD_CHECK_CONTAINS(p.out.data, want);
    proc_free(&p);
}

TD_TEST(torchelastic_environment, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--master-port", "0", "--rdzv-id", "job42", "--role", "trainer", "--max-restarts", "3",
                    "--nproc-per-node", "2", WORKER_BIN, "torchenv", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    for (int r = 0; r < 2; r++) {
        char want[512];
        snprintf(want, sizeof want,
                 "[rank%d]: TORCHENV RANK=%d TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=3 "
                 "TORCHELASTIC_RUN_ID=job42 ROLE_NAME=trainer ROLE_RANK=%d ROLE_WORLD_SIZE=2 GROUP_RANK=0 "
                 "GROUP_WORLD_SIZE=1 ERROR_FILE=ok TORCHELASTIC_USE_AGENT_STORE=True\n",
                 r, r, r);
        TD_CHECK_CONTAINS(p.out.data, want);
    }
    proc_free(&p);

    /* Defaults: role "default"; --standalone makes a random run id, as torchrun's uuid4. */
    char *argv2[] = {TDRUN_BIN, "--standalone", WORKER_BIN, "torchenv", NULL};
    run_tdrun(&p, argv2, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "ROLE_NAME=default ROLE_RANK=0 ROLE_WORLD_SIZE=1 GROUP_RANK=0");
    char *id = line_after(p.out.data, "TORCHELASTIC_RUN_ID=");
    TD_CHECK(id != NULL);
    TD_CHECK_MSG(strcspn(id, " ") == 36 && id[8] == '-' && id[14] == '4', "run id '%s'", id);
    free(id);
    proc_free(&p);

    /* Without --standalone or --rdzv-id: torchrun's "none". */
    char *argv3[] = {TDRUN_BIN, "--master-port", "0", WORKER_BIN, "torchenv", NULL};
    expect_run(argv3, 0, "TORCHELASTIC_RUN_ID=none ");
}

/* A failing worker's TORCHELASTIC_ERROR_FILE is read back into the summary: torchrun's JSON, and
 * plain text; the temporary run directory is gone afterwards. */
TD_TEST(error_file_round_trip, .timeout_s = 60)
{
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "3", WORKER_BIN, "errfile", "1", "json", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 1, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "  rank      : 1 (local_rank: 1)\n");
    TD_CHECK_CONTAINS(p.out.data, "  traceback : Traceback (most recent call last):\n"
                                  "                File \"train.c\", line 7\n"
                                  "              ValueError: bad batch A\n");
    char *ef = line_after(p.out.data, "  error_file: ");
    TD_CHECK(ef != NULL);
    TD_CHECK_MSG(strstr(ef, "/attempt_0/1/error.json") != NULL, "error file '%s'", ef);
    TD_CHECK_MSG(access(ef, F_OK) != 0, "the temporary run directory was left behind: %s", ef);
    free(ef);
    proc_free(&p);

    char *argv2[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "2", WORKER_BIN, "errfile", "0", "text", NULL};
    expect_run(argv2, 1, "  traceback : worker 0: the data file is missing\n");

    /* With --log-dir the error file stays beside the logs. */
    char logdir[4096];
    snprintf(logdir, sizeof logdir, "%s/elogs", ctx->tmpdir);
    char *argv3[] = {TDRUN_BIN, "--standalone", "--log-dir", logdir, "--nproc-per-node", "2", WORKER_BIN, "errfile",
                     "0", "text", NULL};
    run_tdrun(&p, argv3, 30000);
    TD_CHECK_EQ(p.code, 1);
    ef = line_after(p.out.data, "  error_file: ");
    TD_CHECK(ef != NULL && strncmp(ef, logdir, strlen(logdir)) == 0);
    TD_CHECK_MSG(access(ef, F_OK) == 0, "no error file %s", ef);
    free(ef);
    proc_free(&p);
    TD_CHECK(nftw(logdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

/* The library writes the error file: a C program's td_record_error, and on its own a process
 * group's failure (here the watchdog's timeout), which the summary then shows as the traceback. */
TD_TEST(library_writes_the_error_file, .timeout_s = 60)
{
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "2", WORKER_BIN, "record", NULL};
    expect_run(argv, 1, "  traceback : bad batch 7 of rank 1\n");

    proc p;
    char *argv2[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "2", WORKER_BIN, "pgtimeout", NULL};
    run_tdrun(&p, argv2, 30000);
    TD_CHECK_MSG(p.code == 1, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "  rank      : 0 (local_rank: 0)\n");
    TD_CHECK_CONTAINS(p.out.data, "  traceback : [Rank 0] Watchdog caught collective operation timeout");
    TD_CHECK_CONTAINS(p.out.data, "/attempt_0/0/error.json\n");
    proc_free(&p);
}

TD_TEST(flag_rdzv_backend, .timeout_s = 60)
{
    char *a1[] = {TDRUN_BIN, "--standalone", "--rdzv-backend", "c10d", WORKER_BIN, "torchenv", NULL};
    expect_run(a1, 0, "[rank0]: TORCHENV");
    char *a2[] = {TDRUN_BIN, "--standalone", "--rdzv_backend", "static", WORKER_BIN, "torchenv", NULL};
    expect_run(a2, 0, "[rank0]: TORCHENV");
    char *a3[] = {TDRUN_BIN, "--rdzv-backend", "etcd", WORKER_BIN, "torchenv", NULL};
    expect_run(a3, 2, "--rdzv-backend etcd is not supported: tdist has no etcd client");
    char *a4[] = {TDRUN_BIN, "--rdzv_backend=etcd-v2", WORKER_BIN, "torchenv", NULL};
    expect_run(a4, 2, "--rdzv-backend etcd-v2 is not supported");
    char *a5[] = {TDRUN_BIN, "--rdzv-backend", "zookeeper", WORKER_BIN, "torchenv", NULL};
    expect_run(a5, 2, "--rdzv-backend must be c10d or static, got 'zookeeper'");
}

TD_TEST(flag_rdzv_id, .timeout_s = 60)
{
    char *a1[] = {TDRUN_BIN, "--standalone", "--rdzv_id", "abc", WORKER_BIN, "torchenv", NULL};
    expect_run(a1, 0, "TORCHELASTIC_RUN_ID=abc ");
    char *a2[] = {TDRUN_BIN, "--standalone", "--run-id=xyz", WORKER_BIN, "torchenv", NULL};
    expect_run(a2, 0, "TORCHELASTIC_RUN_ID=xyz ");
    char *a3[] = {TDRUN_BIN, "--rdzv-id", "a/b", WORKER_BIN, "torchenv", NULL};
    expect_run(a3, 2, "--rdzv-id must be a non-empty name without '/'");
}

TD_TEST(flag_rdzv_conf, .timeout_s = 60)
{
    char *a1[] = {TDRUN_BIN, "--standalone", "--rdzv_conf",
                  "join_timeout=900,read_timeout=60,last_call_timeout=30,close_timeout=10,timeout=900", WORKER_BIN,
                  "torchenv", NULL};
    expect_run(a1, 0, "[rank0]: TORCHENV");
    char *a2[] = {TDRUN_BIN, "--rdzv-conf", "keep_alive_interval=5", WORKER_BIN, "torchenv", NULL};
    expect_run(a2, 2, "--rdzv-conf: unknown key 'keep_alive_interval'");
    char *a3[] = {TDRUN_BIN, "--rdzv-conf", "read_timeout=soon", WORKER_BIN, "torchenv", NULL};
    expect_run(a3, 2, "--rdzv-conf read_timeout must be a duration");
    char *a4[] = {TDRUN_BIN, "--rdzv-conf", "is_host", WORKER_BIN, "torchenv", NULL};
    expect_run(a4, 2, "--rdzv-conf must be KEY=VALUE,..., got 'is_host'");

    /* join_timeout: a node whose store never answers gives up in about that long. */
    int64_t t0 = clock_now_ms();
    char *a5[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-port", "1", "--rdzv-conf",
                  "join_timeout=1", WORKER_BIN, "torchenv", NULL};
    expect_run(a5, 1, "did not answer within join_timeout (1 s)");
    TD_CHECK_MSG(clock_now_ms() - t0 < 15000, "join_timeout=1 took %lld ms", (long long)(clock_now_ms() - t0));

    /* is_host: node 1 hosts the store and node 0 joins it. */
    proc node0, node1;
    char *argv1[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "1", "--master-port", "0", "--rdzv-conf",
                     "is_host=true", "--nproc-per-node", "1", WORKER_BIN, "store", NULL};
    char *argv0[] = {TDRUN_BIN, "--nnodes", "2", "--node-rank", "0", "--master-port", "PORT", "--rdzv_conf",
                     "is_host=false", "--nproc-per-node", "1", WORKER_BIN, "store", NULL};
    run_two_nodes(&node1, argv1, &node0, argv0, 60000, 0, 0);
    TD_CHECK_CONTAINS(node0.out.data, "[rank0]: STORE rank=0 world=2 joined=2");
    TD_CHECK_CONTAINS(node1.out.data, "[rank1]: STORE rank=1 world=2 joined=2");
    proc_free(&node0);
    proc_free(&node1);
}

TD_TEST(flag_role, .timeout_s = 30)
{
    char *a1[] = {TDRUN_BIN, "--standalone", "--role", "worker", WORKER_BIN, "torchenv", NULL};
    expect_run(a1, 0, "ROLE_NAME=worker ROLE_RANK=0 ");
}

/* --bind-to core: local rank i on the i-th of tdrun's CPUs, wrapping around; none (the default)
 * leaves every worker tdrun's whole set. */
TD_TEST(flag_bind_to, .timeout_s = 60)
{
    cpu_set_t mine;
    TD_CHECK(sched_getaffinity(0, sizeof mine, &mine) == 0);
    int cpus[CPU_SETSIZE], n = 0;
    char all[512] = "";
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine)) {
            snprintf(all + strlen(all), sizeof all - strlen(all), "%s%d", n ? "," : "", c);
            cpus[n++] = c;
        }
    int workers = n + 1; /* one more than the CPUs: the last wraps around to the first CPU */
    char nproc[16];
    snprintf(nproc, sizeof nproc, "%d", workers);
    for (int bind = 0; bind < 2; bind++) {
        proc p;
        char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", nproc, "--bind-to", bind ? "core" : "none",
                        WORKER_BIN, "cpus", NULL};
        run_tdrun(&p, argv, 30000);
        TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
        for (int r = 0; r < workers; r++) {
            char want[600];
            if (bind)
                snprintf(want, sizeof want, "[rank%d]: CPUS LOCAL_RANK=%d %d\n", r, r, cpus[r % n]);
            else
                snprintf(want, sizeof want, "[rank%d]: CPUS LOCAL_RANK=%d %s\n", r, r, all);
            TD_CHECK_CONTAINS(p.out.data, want);
        }
        proc_free(&p);
    }
    char *bad[] = {TDRUN_BIN, "--standalone", "--bind-to", "socket", WORKER_BIN, "cpus", NULL};
    expect_run(bad, 2, "--bind-to must be none or core, got 'socket'");
}

TD_TEST(flag_version, .timeout_s = 30)
{
    char *a1[] = {TDRUN_BIN, "--version", NULL};
    expect_run(a1, 0, "tdrun (tdist) ");
}

TD_TEST(flag_no_python, .timeout_s = 30)
{
    char *a1[] = {TDRUN_BIN, "--standalone", "--no_python", WORKER_BIN, "torchenv", NULL};
    expect_run(a1, 0, "[rank0]: TORCHENV");
    char *a2[] = {TDRUN_BIN, "--standalone", "--run_path", WORKER_BIN, "torchenv", NULL};
    expect_run(a2, 0, "[rank0]: TORCHENV");
    char *a3[] = {TDRUN_BIN, "--standalone", "-m", "trainer", NULL};
    expect_run(a3, 2, "-m/--module runs a Python module");
    char *a4[] = {TDRUN_BIN, "--standalone", "--module", WORKER_BIN, NULL};
    expect_run(a4, 2, "tdrun ... python3 -m MODULE ARGS");
}

TD_TEST(flag_nnodes_range, .timeout_s = 30)
{
    char *a1[] = {TDRUN_BIN, "--nnodes", "1:1", "--master-port", "0", WORKER_BIN, "torchenv", NULL};
    expect_run(a1, 0, "[rank0]: TORCHENV");
    char *a2[] = {TDRUN_BIN, "--nnodes", "1:4", WORKER_BIN, "torchenv", NULL};
    expect_run(a2, 2, "--nnodes 1:4: elastic node ranges are not supported");
}

/* -r / -t with torchrun's per-rank maps: rank 0's streams go to its files only, rank 1's to the
 * console only. */
TD_TEST(flag_redirects_and_tee, .timeout_s = 60)
{
    char logdir[4096];
    snprintf(logdir, sizeof logdir, "%s/rlogs", ctx->tmpdir);
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--log_dir", logdir, "-r", "0:3,1:0", "--nproc-per-node", "2",
                    WORKER_BIN, "out", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "[rank1]: OUT of rank 1");
    TD_CHECK_CONTAINS(p.out.data, "[rank1]: ERR of rank 1");
    TD_CHECK_MSG(strstr(p.out.data, "OUT of rank 0") == NULL, "rank 0 reached the console:\n%s", p.out.data);
    char *run_dir = line_after(p.out.data, "logs under ");
    TD_CHECK(run_dir != NULL);
    char path[4400];
    snprintf(path, sizeof path, "%s/attempt_0/0/stdout.log", run_dir);
    FILE *f = fopen(path, "r");
    TD_CHECK_MSG(f != NULL, "no %s", path);
    char line[128] = "";
    TD_CHECK(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    TD_CHECK_MSG(strcmp(line, "OUT of rank 0\n") == 0, "rank 0's stdout.log holds '%s'", line);
    snprintf(path, sizeof path, "%s/attempt_0/1/stdout.log", run_dir);
    TD_CHECK(access(path, F_OK) != 0);
    free(run_dir);
    proc_free(&p);

    /* -t 2: stderr to the files and the console; stdout to the console only. */
    char *argv2[] = {TDRUN_BIN, "--standalone", "--log-dir", logdir, "-t", "2", WORKER_BIN, "out", NULL};
    run_tdrun(&p, argv2, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: OUT of rank 0");
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: ERR of rank 0");
    run_dir = line_after(p.out.data, "logs under ");
    snprintf(path, sizeof path, "%s/attempt_0/0/stderr.log", run_dir);
    TD_CHECK(access(path, F_OK) == 0);
    snprintf(path, sizeof path, "%s/attempt_0/0/stdout.log", run_dir);
    TD_CHECK(access(path, F_OK) != 0);
    free(run_dir);
    proc_free(&p);
    TD_CHECK(nftw(logdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0);

    char *a3[] = {TDRUN_BIN, "--standalone", "--log-dir", logdir, "--tee", "4", WORKER_BIN, "out", NULL};
    expect_run(a3, 2, "--tee must be");
    char *a4[] = {TDRUN_BIN, "--standalone", "-r", "3", WORKER_BIN, "out", NULL};
    expect_run(a4, 2, "--redirects and --tee need --log-dir");
}

/* --local-ranks-filter 0,2: ranks 0 and 2 on the console, rank 1 not, though its log file under
 * --log-dir is still written (-t 3: files and console). */
TD_TEST(flag_local_ranks_filter, .timeout_s = 60)
{
    char logdir[4096];
    snprintf(logdir, sizeof logdir, "%s/flogs", ctx->tmpdir);
    proc p;
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "3", "--local_ranks_filter", "0,2", "--log-dir",
                    logdir, "-t", "3", WORKER_BIN, "out", NULL};
    run_tdrun(&p, argv, 30000);
    TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
    TD_CHECK_CONTAINS(p.out.data, "[rank0]: OUT of rank 0");
    TD_CHECK_CONTAINS(p.out.data, "[rank2]: ERR of rank 2");
    TD_CHECK_MSG(strstr(p.out.data, "of rank 1") == NULL, "rank 1 reached the console:\n%s", p.out.data);
    char *run_dir = line_after(p.out.data, "logs under ");
    TD_CHECK(run_dir != NULL);
    char path[4400];
    snprintf(path, sizeof path, "%s/attempt_0/1/stdout.log", run_dir);
    FILE *f = fopen(path, "r");
    TD_CHECK_MSG(f != NULL, "no %s", path);
    char line[128] = "";
    TD_CHECK(f && fgets(line, sizeof line, f) != NULL);
    if (f)
        fclose(f);
    TD_CHECK_MSG(strcmp(line, "OUT of rank 1\n") == 0, "rank 1's stdout.log holds '%s'", line);
    free(run_dir);
    proc_free(&p);
    TD_CHECK(nftw(logdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0);
    char *a2[] = {TDRUN_BIN, "--standalone", "--local-ranks-filter", "0,x", WORKER_BIN, "out", NULL};
    expect_run(a2, 2, "--local-ranks-filter");
    char *a3[] = {TDRUN_BIN, "--standalone", "--local-ranks-filter", ",", WORKER_BIN, "out", NULL};
    expect_run(a3, 2, "--local-ranks-filter must list local ranks");
}

/* Two runs into one --log-dir keep both runs' logs, each under <run id>_XXXXXX. */
TD_TEST(flag_log_dir_per_run, .timeout_s = 60)
{
    char logdir[4096];
    snprintf(logdir, sizeof logdir, "%s/plogs", ctx->tmpdir);
    char *dirs[2] = {NULL, NULL};
    for (int run = 0; run < 2; run++) {
        proc p;
        char *argv[] = {TDRUN_BIN, "--standalone", "--rdzv-id", "same", "--log-dir", logdir, WORKER_BIN, "out", NULL};
        run_tdrun(&p, argv, 30000);
        TD_CHECK_MSG(p.code == 0, "tdrun exited %d:\n%s", p.code, p.out.data);
        dirs[run] = line_after(p.out.data, "logs under ");
        TD_CHECK(dirs[run] != NULL);
        char want[4200];
        snprintf(want, sizeof want, "%s/same_", logdir);
        TD_CHECK_MSG(strncmp(dirs[run], want, strlen(want)) == 0, "run directory %s", dirs[run]);
        proc_free(&p);
    }
    TD_CHECK_MSG(strcmp(dirs[0], dirs[1]) != 0, "both runs wrote to %s", dirs[0]);
    for (int run = 0; run < 2; run++) {
        char path[4400];
        snprintf(path, sizeof path, "%s/attempt_0/0/stdout.log", dirs[run]);
        TD_CHECK_MSG(access(path, F_OK) == 0, "no %s", path);
        free(dirs[run]);
    }
    TD_CHECK(nftw(logdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

/* Underscore spellings after a flag whose value came as the next word. */
TD_TEST(flag_underscores_after_spaced_values, .timeout_s = 30)
{
    char *a1[] = {TDRUN_BIN, "--standalone", "--nproc_per_node", "2", "--max_restarts", "0", "--monitor_interval",
                  "0.05", "--rdzv_id", "u1", "--exit_barrier_timeout", "10", WORKER_BIN, "torchenv", NULL};
    expect_run(a1, 0, "[rank1]: TORCHENV RANK=1 TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 "
                      "TORCHELASTIC_RUN_ID=u1 ");
    char *a2[] = {TDRUN_BIN, "--standalone", "-r", "0", "--log_dir", (char *)ctx->tmpdir, "--role", "r", "--rdzv_conf",
                  "bogus=1", WORKER_BIN, "torchenv", NULL};
    expect_run(a2, 2, "--rdzv-conf: unknown key 'bogus'");
}

TD_TEST_MAIN()
