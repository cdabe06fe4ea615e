/* The parent side of the harness: c10d's MultiProcessTestCase._join_processes and its verdict, in C.
 *
 * td_test_run (and the runner in entry.c) supervises one case instance:
 *  - a fresh temp dir per run (TMPDIR of the ranks, so their temp files land there);
 *  - world_size ranks started with fork + exec of /proc/self/exe, all in one new process group,
 *    each with a control socketpair (ctl.c) and stdout / stderr pipes;
 *  - a poll loop (100 ms) that always drains every fd (a rank's large error message can never
 *    block it: trap T3), echoes the ranks' output line by line as "[rank R] ...", reaps with
 *    waitpid(WNOHANG), aborts early when a rank fails, and enforces the per-test timeout after
 *    asking the hung ranks for their stacks;
 *  - SIGTERM, then SIGKILL after a grace period, and every child reaped, every fd closed;
 *  - the verdict from c10d's decision table with its exact messages (_check_return_codes and
 *    _check_no_test_errors; spec/c10d.md C12.5, C12.6);
 *  - then the leftover checks: files in the temp dir, /dev/shm segments named after a rank's pid,
 *    processes still alive in the ranks' process group.
 * A rank that the harness killed is recorded as TD_TEST_NOT_EXITED, never as a racy signal code
 * (trap T4). Besides exit code 10, a rank that dies by a signal or exits non-zero with a non-skip
 * code also stops the others, after a short settling delay so that ranks finishing on their own
 * keep their real exit codes (trap T5); the verdict texts stay those of the table.
 *
 * A suite's batch (testing.h, "Suites") is one spawn for several cases: each rank reports every
 * case it passed (TD_CTL_CASE_DONE) and starts the next only when the parent says all ranks passed
 * it (TD_CTL_CASE_ACK), so the ranks are always in the same case: each case's output, elapsed time
 * and timeout are its own, and when a rank fails, skips or hangs, the case they are in gets the
 * table's verdict and the cases after it run in a fresh spawn (supervise_spawn returns how many it
 * judged). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/le.h"
#include "base/error.h"
#include "testing/harness.h"

extern char **environ;

#define OUTPUT_CAP (4u << 20)
#define LINE_CAP (64u << 10)

typedef struct rank_proc {
    int rank;
    pid_t pid;
    int fds[3]; /* ctl, stdout, stderr; -1 once closed */
    td_buf ctl_in;
    td_buf line[2];
    char *error;     /* TD_CTL_ERROR payload */
    size_t error_len;
    char *traceback; /* TD_CTL_TRACEBACK payload */
    char *pending;   /* TD_CTL_PENDING payload */
    bool tb_asked;
    int code;
    bool exited, killed;
    int done; /* a suite's batch: how many of its cases this rank reported passed */
} rank_proc;

typedef struct sup {
    td_test_case *test_case; /* the case started, then the one being judged */
    const char *name;
    td_test_result *result;
    const harness_instance *const *cases; /* what the ranks run: one case, or a suite's batch */
    int ncases;
    char *case_list; /* a batch: the names for --td-cases; NULL for one case */
    rank_proc *ranks;
    int nranks;
    pid_t pgid;
    bool quiet;
    td_buf log;
    td_buf *outputs; /* per case: the ranks' lines while they ran it */
    int64_t start_ns;
    int64_t timeout_ms;
} sup;

/* The supervisor's own lines: slog for its log, snote for a note the final report shows. */
static void slog_to(sup *s, bool note, const char *fmt, va_list ap) __attribute__((format(printf, 3, 0)));
static void slog_to(sup *s, bool note, const char *fmt, va_list ap)
{
    char *line = NULL;
    if (vasprintf(&line, fmt, ap) < 0)
        line = NULL;
    if (note)
        harness_note(&s->log, "%s", line ? line : fmt);
    else
        harness_log(&s->log, "%s", line ? line : fmt);
    free(line);
}

static void slog(sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void slog(sup *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    slog_to(s, false, fmt, ap);
    va_end(ap);
}

static void snote(sup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void snote(sup *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    slog_to(s, true, fmt, ap);
    va_end(ap);
}

static int64_t clamp_ms(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- output ------------------------------------------------------------------------------- */

static void write_fully(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void emit_line(sup *s, rank_proc *p, int stream, const char *data, size_t len)
{
    char prefix[32];
    int pn = snprintf(prefix, sizeof prefix, "[rank %d] ", p->rank);
    td_buf line = TD_BUF_INIT;
    buf_append(&line, prefix, (size_t)pn);
    buf_append(&line, data, len);
    buf_putc(&line, '\n');
    if (!s->quiet) {
        if (stream == 0)
            fflush(stdout);
        write_fully(stream == 0 ? STDOUT_FILENO : STDERR_FILENO, line.data, line.len);
    }
    td_buf *out = &s->outputs[p->done < s->ncases ? p->done : s->ncases - 1];
    buf_append(out, line.data, line.len);
    if (out->len > OUTPUT_CAP + OUTPUT_CAP / 4) {
        size_t drop = out->len - OUTPUT_CAP;
        const char *nl = memchr(out->data + drop, '\n', out->len - drop);
        buf_consume(out, nl ? (size_t)(nl - out->data) + 1 : drop);
    }
    buf_free(&line);
}

static void on_output(sup *s, rank_proc *p, int stream, const char *data, size_t len)
{
    td_buf *lb = &p->line[stream];
    buf_append(lb, data, len);
    size_t start = 0;
    for (;;) {
        const char *nl = memchr(lb->data + start, '\n', lb->len - start);
        if (!nl)
            break;
        emit_line(s, p, stream, lb->data + start, (size_t)(nl - lb->data) - start);
        start = (size_t)(nl - lb->data) + 1;
    }
    buf_consume(lb, start);
    if (lb->len > LINE_CAP) {
        emit_line(s, p, stream, lb->data, lb->len);
        buf_clear(lb);
    }
}

/* ---- control frames ----------------------------------------------------------------------- */

typedef struct frame_ctx {
    sup *s;
    rank_proc *p;
} frame_ctx;

static char *copy_payload(const char *data, size_t len)
{
    char *m = alloc_or_die(len + 1);
    memcpy(m, data, len);
    m[len] = '\0';
    return m;
}

static void drain_fd(sup *s, rank_proc *p, int which);

static void on_frame(void *arg, uint8_t type, const char *data, size_t len)
{
    frame_ctx *f = arg;
    rank_proc *p = f->p;
    switch (type) {
    case TD_CTL_ERROR:
        if (!p->error) {
            p->error = copy_payload(data, len);
            p->error_len = len;
        }
        break;
    case TD_CTL_TRACEBACK:
        free(p->traceback);
        p->traceback = copy_payload(data, len);
        break;
    case TD_CTL_PENDING:
        free(p->pending);
        p->pending = copy_payload(data, len);
        break;
    case TD_CTL_CASE_DONE: {
        uint32_t index = len == 4 ? (uint32_t)le_get((const uint8_t *)data, 4) : UINT32_MAX;
        if (index == (uint32_t)p->done && p->done < f->s->ncases) {
            /* The rank flushed its output before reporting: it belongs to the case it finished. */
            drain_fd(f->s, p, 1);
            drain_fd(f->s, p, 2);
            p->done++;
        }
        else
            slog(f->s, "Ignoring a report of case %u from process %d, which had reported %d", index, p->rank, p->done);
        break;
    }
    default:
        slog(f->s, "Ignoring control message of unknown type %u from process %d", type, p->rank);
        break;
    }
}

static void close_fd(sup *s, rank_proc *p, int which)
{
    if (p->fds[which] < 0)
        return;
    close(p->fds[which]);
    p->fds[which] = -1;
    if (which > 0 && p->line[which - 1].len) {
        emit_line(s, p, which - 1, p->line[which - 1].data, p->line[which - 1].len);
        buf_clear(&p->line[which - 1]);
    }
}

static void drain_fd(sup *s, rank_proc *p, int which)
{
    char buf[65536];
    for (int rounds = 0; rounds < 32 && p->fds[which] >= 0; rounds++) {
        ssize_t n = read(p->fds[which], buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                close_fd(s, p, which);
            return;
        }
        if (n == 0) {
            close_fd(s, p, which);
            return;
        }
        if (which == 0) {
            buf_append(&p->ctl_in, buf, (size_t)n);
            frame_ctx f = {s, p};
            if (ctl_parse(&p->ctl_in, on_frame, &f) != TD_OK) {
                slog(s, "Process %d sent a malformed control message (%s); closing its channel", p->rank,
                     td_last_error());
                buf_clear(&p->ctl_in);
                close_fd(s, p, 0);
            }
        } else {
            on_output(s, p, which - 1, buf, (size_t)n);
        }
    }
}

/* Polls every open fd for up to timeout_ms and drains what is readable; false when none is open. */
static bool poll_once(sup *s, int timeout_ms)
{
    struct pollfd pfd[64 * 3];
    int who[64 * 3];
    int n = 0;
    for (int i = 0; i < s->nranks; i++)
        for (int k = 0; k < 3; k++)
            if (s->ranks[i].fds[k] >= 0) {
                pfd[n] = (struct pollfd){.fd = s->ranks[i].fds[k], .events = POLLIN};
                who[n++] = i * 3 + k;
            }
    if (n == 0) {
        /* Every pipe is at EOF but a rank is not reaped yet: it is exiting, so look again soon. */
        if (timeout_ms > 0)
            clock_sleep_ms(timeout_ms < 5 ? timeout_ms : 5);
        return false;
    }
    int rc = poll(pfd, (nfds_t)n, timeout_ms);
    if (rc <= 0)
        return true;
    for (int j = 0; j < n; j++)
        if (pfd[j].revents)
            drain_fd(s, &s->ranks[who[j] / 3], who[j] % 3);
    return true;
}

/* ---- processes ---------------------------------------------------------------------------- */

static void reap(sup *s, bool block)
{
    for (int i = 0; i < s->nranks; i++) {
        rank_proc *p = &s->ranks[i];
        if (p->exited || p->pid <= 0)
            continue;
        int st;
        pid_t w;
        do
            w = waitpid(p->pid, &st, block ? 0 : WNOHANG);
        while (w < 0 && errno == EINTR);
        if (w == p->pid) {
            p->exited = true;
            p->code = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1;
        } else if (w < 0) {
            p->exited = true; /* not our child any more: nothing to wait for */
            p->code = -1;
        }
    }
}

static bool all_exited(const sup *s)
{
    for (int i = 0; i < s->nranks; i++)
        if (!s->ranks[i].exited)
            return false;
    return true;
}

static void signal_remaining(sup *s, int sig, bool mark)
{
    for (int i = 0; i < s->nranks; i++) {
        rank_proc *p = &s->ranks[i];
        if (p->exited || p->pid <= 0)
            continue;
        if (mark)
            p->killed = true;
        kill(p->pid, sig);
    }
    if (s->pgid > 0)
        killpg(s->pgid, sig);
}

/* Waits up to grace_ms for the ranks to exit, then SIGKILLs them; reaps all; drains the pipes. */
static void finish(sup *s, int64_t grace_ms)
{
    int64_t deadline = clock_now_ns() + grace_ms * 1000000;
    while (!all_exited(s) && clock_now_ns() < deadline) {
        poll_once(s, 20);
        reap(s, false);
    }
    if (!all_exited(s)) {
        signal_remaining(s, SIGKILL, true);
        int64_t hard = clock_now_ns() + 10000 * 1000000LL;
        while (!all_exited(s) && clock_now_ns() < hard) {
            poll_once(s, 20);
            reap(s, false);
        }
        reap(s, true);
    }
    /* Output still buffered in the pipes; a grandchild may hold them open, so only briefly. */
    int64_t drain_deadline = clock_now_ns() + 1000 * 1000000LL;
    while (clock_now_ns() < drain_deadline && poll_once(s, 20)) {
    }
    for (int i = 0; i < s->nranks; i++)
        for (int k = 0; k < 3; k++)
            close_fd(s, &s->ranks[i], k);
}

static int high_fd(int fd)
{
    if (fd < 0 || fd > 2)
        return fd;
    int h = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd);
    return h;
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

static bool env_overridden(const char *entry)
{
    static const char *const names[] = {"RANK=", "WORLD_SIZE=", "TEMP_DIR=", "TMPDIR=", "MASTER_ADDR=", "LOCAL_RANK="};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strncmp(entry, names[i], strlen(names[i])) == 0)
            return true;
    return false;
}

static td_status spawn_rank(sup *s, rank_proc *p, const char *dir, char **envp_base, size_t nenv)
{
    int sv[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0 || pipe2(outp, O_CLOEXEC) != 0 ||
        pipe2(errp, O_CLOEXEC) != 0) {
        error_errno(TD_ERR_IO, "creating the pipes of rank %d", p->rank);
        goto fail;
    }
    sv[1] = high_fd(sv[1]);
    outp[1] = high_fd(outp[1]);
    errp[1] = high_fd(errp[1]);
    if (sv[1] < 0 || outp[1] < 0 || errp[1] < 0) {
        error_errno(TD_ERR_IO, "moving the pipes of rank %d", p->rank);
        goto fail;
    }

    char rank_s[16], world_s[16], ctl_s[16];
    snprintf(rank_s, sizeof rank_s, "%d", p->rank);
    snprintf(world_s, sizeof world_s, "%d", harness_world_size(s->test_case));
    snprintf(ctl_s, sizeof ctl_s, "%d", sv[1]);
    char exe[4096];
    ssize_t en = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[en > 0 ? en : 0] = '\0';
    char *argv[] = {en > 0 ? exe : (char *)"tdist-test", (char *)"--td-child", (char *)s->name,
                    (char *)"--td-rank", rank_s, (char *)"--td-world", world_s, (char *)"--td-dir", (char *)dir,
                    (char *)"--td-ctl", ctl_s, s->case_list ? (char *)"--td-cases" : NULL, s->case_list, NULL};
    /* The per-rank environment; built before fork, as only async-signal-safe calls may follow it. */
    char **envp = alloc_zeroed(nenv + 8, sizeof *envp);
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        envp[k++] = envp_base[i];
    char *own[6] = {NULL};
    int no = 0;
    if (!s->test_case->threads)
        own[no++] = alloc_printf("RANK=%d", p->rank);
    own[no++] = alloc_printf("WORLD_SIZE=%d", harness_world_size(s->test_case));
    own[no++] = alloc_printf("TEMP_DIR=%s", dir);
    own[no++] = alloc_printf("TMPDIR=%s", dir);
    own[no++] = alloc_printf("MASTER_ADDR=127.0.0.1");
    for (int i = 0; i < no; i++)
        envp[k++] = own[i];
    envp[k] = NULL;

    pid_t parent = getpid();
    pid_t pgid = s->pgid;
    int ctl = sv[1];
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, pgid);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        static const int reset[] = {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGCHLD};
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        for (size_t i = 0; i < sizeof reset / sizeof *reset; i++)
            sigaction(reset[i], &dfl, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (dup2(outp[1], STDOUT_FILENO) < 0 || dup2(errp[1], STDERR_FILENO) < 0)
            _exit(127);
        fcntl(ctl, F_SETFD, 0);
        if (ctl > 3)
            syscall(SYS_close_range, 3u, (unsigned)ctl - 1, 0u);
        syscall(SYS_close_range, (unsigned)ctl + 1, ~0u, 0u);
        execve("/proc/self/exe", argv, envp);
        static const char msg[] = "tdist test harness: execve(/proc/self/exe) failed\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        _exit(127);
    }
    int fork_errno = errno;
    for (int i = 0; i < no; i++)
        free(own[i]);
    free(envp);
    if (pid < 0) {
        errno = fork_errno;
        error_errno(TD_ERR_IO, "fork for rank %d", p->rank);
        goto fail;
    }
    if (s->pgid == 0)
        s->pgid = pid;
    setpgid(pid, s->pgid); /* also done by the child: whichever runs first wins the race */
    p->pid = pid;
    close(sv[1]);
    close(outp[1]);
    close(errp[1]);
    p->fds[0] = sv[0];
    p->fds[1] = outp[0];
    p->fds[2] = errp[0];
    for (int i = 0; i < 3; i++)
        set_nonblock(p->fds[i]);
    return TD_OK;
fail:
    for (int i = 0; i < 2; i++) {
        if (sv[i] >= 0)
            close(sv[i]);
        if (outp[i] >= 0)
            close(outp[i]);
        if (errp[i] >= 0)
            close(errp[i]);
    }
    return TD_ERR_IO;
}

/* A suite's batch: every rank finished the case before `next`; each waits for this to start it, so
 * that the ranks run one case at a time (a rank's failure belongs to the case all are in) and no
 * line of the next case is in the pipes before the report of the last one is read. */
static void start_case(sup *s, int next)
{
    unsigned char ack[TD_CTL_HEADER] = {0, 0, 0, 0, TD_CTL_CASE_ACK};
    for (int i = 0; i < s->nranks; i++) {
        rank_proc *p = &s->ranks[i];
        if (p->fds[0] >= 0 && send(p->fds[0], ack, sizeof ack, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof ack)
            slog(s, "Could not start case %d on process %d: %s", next, p->rank, strerror(errno));
    }
}

/* ---- timeouts ----------------------------------------------------------------------------- */

static void collect_tracebacks(sup *s)
{
    int64_t wait_ms = clamp_ms(s->timeout_ms / 2, 1000, 5000);
    for (int i = 0; i < s->nranks; i++) {
        rank_proc *p = &s->ranks[i];
        if (p->exited)
            continue;
        free(p->traceback);
        p->traceback = NULL;
        if (p->fds[0] < 0) {
            slog(s, "Encountered error while trying to get traceback for process %d: the pipe is closed", i);
            continue;
        }
        unsigned char frame[TD_CTL_HEADER] = {0, 0, 0, 0, TD_CTL_GET_TRACEBACK};
        ssize_t w = send(p->fds[0], frame, sizeof frame, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w != (ssize_t)sizeof frame) {
            slog(s, "Encountered error while trying to get traceback for process %d: %s", i,
                 w < 0 ? strerror(errno) : "short write");
            continue;
        }
        p->tb_asked = true;
    }
    int64_t deadline = clock_now_ns() + wait_ms * 1000000;
    for (;;) {
        bool waiting = false;
        for (int i = 0; i < s->nranks; i++) {
            rank_proc *p = &s->ranks[i];
            if (p->tb_asked && !p->traceback && p->fds[0] >= 0)
                waiting = true;
        }
        if (!waiting || clock_now_ns() >= deadline)
            break;
        poll_once(s, 50);
        reap(s, false);
    }
    for (int i = 0; i < s->nranks; i++) {
        rank_proc *p = &s->ranks[i];
        if (!p->tb_asked)
            continue;
        if (p->traceback)
            slog(s, "Process %d timed out with traceback: \n\n%s", i, p->traceback);
        else if (p->fds[0] < 0)
            slog(s, "Pipe closed for process %d, cannot retrieve traceback", i);
        else
            slog(s, "Could not retrieve traceback for timed out process: %d", i);
    }
}

/* ---- verdict ------------------------------------------------------------------------------ */

static void set_verdict(td_test_result *r, td_test_verdict v, char *message)
{
    r->verdict = v;
    free(r->message);
    r->message = message ? message : alloc_strdup("");
}

static void check_no_test_errors(sup *s, const char *elapsed)
{
    for (int i = 0; i < s->nranks; i++) {
        int code = s->result->exit_codes[i];
        if (code == TD_TEST_NOT_EXITED) {
            set_verdict(s->result, TD_TEST_FAIL, alloc_printf("Process %d timed out after %s seconds", i, elapsed));
            return;
        }
        if (code == TD_TEST_ERROR_EXIT_CODE) {
            rank_proc *p = &s->ranks[i];
            set_verdict(s->result, TD_TEST_FAIL,
                        alloc_printf("10 == 10 : Process %d exited with error code 10 and exception:\n%s\n", i,
                                    p->error ? p->error : ""));
            return;
        }
    }
    set_verdict(s->result, TD_TEST_PASS, NULL);
}

static int first_pending_thread(const rank_proc *p)
{
    if (!p->pending)
        return -1;
    char *end;
    long v = strtol(p->pending, &end, 10);
    return end != p->pending && v >= 0 ? (int)v : -1;
}

static void check_return_codes(sup *s, const char *elapsed)
{
    td_test_result *r = s->result;
    if (s->nranks == 0) {
        slog(s, "Note: no subprocesses were spawned, test was likely skipped.");
        set_verdict(r, TD_TEST_PASS, NULL);
        return;
    }
    td_buf err = TD_BUF_INIT;
    for (int i = 0; i < s->nranks; i++) {
        if (r->exit_codes[i] != TD_TEST_ERROR_EXIT_CODE)
            continue;
        const rank_proc *p = &s->ranks[i];
        if (s->test_case->threads && p->error)
            buf_append(&err, p->error, p->error_len); /* already "Thread R exited with ..." */
        else
            buf_printf(&err, "Process %d exited with error code 10 and exception:\n%s\n", i,
                          p->error ? p->error : "");
    }
    if (err.len) {
        set_verdict(r, TD_TEST_FAIL, buf_steal(&err));
        return;
    }
    buf_free(&err);
    int c0 = r->exit_codes[0];
    for (int i = 0; i < s->nranks; i++) {
        int ci = r->exit_codes[i];
        if (ci == TD_TEST_NOT_EXITED) {
            int t = s->test_case->threads ? first_pending_thread(&s->ranks[i]) : -1;
            if (t >= 0) {
                char tmo[64];
                pyfmt_seconds_ms(s->timeout_ms, tmo, sizeof tmo);
                set_verdict(r, TD_TEST_FAIL, alloc_printf("Thread %d terminated or timed out after %s seconds\n", t, tmo));
            } else {
                set_verdict(r, TD_TEST_FAIL,
                            alloc_printf("Process %d terminated or timed out after %s seconds", i, elapsed));
            }
            return;
        }
        if (ci != c0) {
            set_verdict(r, TD_TEST_FAIL,
                        alloc_printf("Expect process %d exit code to match Process 0 exit code of %d, but got %d", i,
                                    c0, ci));
            return;
        }
    }
    const char *skip = td_skip_message(c0);
    if (skip) {
        if (harness_sandcastle()) {
            slog(s, "Skipping %s on sandcastle for the following reason: %s", s->name, skip);
            set_verdict(r, TD_TEST_PASS, NULL);
        } else {
            set_verdict(r, TD_TEST_SKIP, alloc_strdup(skip));
        }
        return;
    }
    if (c0 != 0) {
        set_verdict(r, TD_TEST_FAIL,
                    alloc_printf("Expected zero exit code but got %d for pid: %d", c0, (int)s->ranks[0].pid));
        return;
    }
    set_verdict(r, TD_TEST_PASS, NULL);
}

/* ---- leftovers ---------------------------------------------------------------------------- */

static td_buf *g_walk_list;
static size_t g_walk_prefix;
static int g_walk_count;

/* ThreadSanitizer's runtime makes "tsan.rodata.<pid>" in TMPDIR as a process starts and unlinks it
 * at once; a process killed in between (a worker a test or tdrun kills as it starts) leaves it.
 * It is the runtime's, not the test's: not counted, but removed with the directory. */
static bool sanitizer_runtime_file(const char *path, int level)
{
#if defined(__SANITIZE_THREAD__)
    const char *base = strrchr(path, '/');
    return level == 1 && strncmp(base ? base + 1 : path, "tsan.rodata.", 12) == 0;
#else
    (void)path;
    (void)level;
    return false;
#endif
}

static int walk_collect(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    if (ftw->level == 0 || sanitizer_runtime_file(path, ftw->level))
        return 0;
    if (g_walk_count < 20)
        buf_printf(g_walk_list, "%s%s", g_walk_count ? ", " : "", path + g_walk_prefix);
    g_walk_count++;
    return 0;
}

static int walk_remove(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* nftw has no context argument; the harness runs one supervision per thread at a time. */
static pthread_mutex_t g_walk_lock = PTHREAD_MUTEX_INITIALIZER;

static char *leftover_files(const char *dir)
{
    td_buf list = TD_BUF_INIT;
    pthread_mutex_lock(&g_walk_lock);
    g_walk_list = &list;
    g_walk_prefix = strlen(dir) + 1;
    g_walk_count = 0;
    nftw(dir, walk_collect, 16, FTW_PHYS);
    int count = g_walk_count;
    pthread_mutex_unlock(&g_walk_lock);
    if (count == 0) {
        buf_free(&list);
        return NULL;
    }
    if (count > 20)
        buf_printf(&list, " and %d more", count - 20);
    char *msg = alloc_printf("Test left files in its temp dir %s: %s (remove them before the test returns, or set "
                            ".allow_leftovers for a crash test)",
                            dir, list.data);
    buf_free(&list);
    return msg;
}

static void remove_tree(const char *dir)
{
    nftw(dir, walk_remove, 16, FTW_DEPTH | FTW_PHYS);
}

static char *leftover_shm(sup *s)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return NULL;
    td_buf list = TD_BUF_INIT;
    struct dirent *e;
    while ((e = readdir(d))) {
        for (int i = 0; i < s->nranks; i++) {
            char prefix[48];
            int n = snprintf(prefix, sizeof prefix, "tdist.%d.", (int)s->ranks[i].pid);
            if (s->ranks[i].pid > 0 && strncmp(e->d_name, prefix, (size_t)n) == 0) {
                buf_printf(&list, "%s/dev/shm/%s", list.len ? ", " : "", e->d_name);
                char path[512];
                snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
                unlink(path);
                break;
            }
        }
    }
    closedir(d);
    if (!list.len) {
        buf_free(&list);
        return NULL;
    }
    char *msg = alloc_printf("Test left shared-memory segments behind (now removed): %s", list.data);
    buf_free(&list);
    return msg;
}

/* Processes still in the ranks' process group once every rank was reaped (a rank's own children). */
static char *leftover_processes(sup *s)
{
    if (s->pgid <= 0)
        return NULL;
    td_buf list = TD_BUF_INIT;
    for (int attempt = 0; attempt < 10; attempt++) {
        buf_clear(&list);
        DIR *d = opendir("/proc");
        if (!d)
            break;
        struct dirent *e;
        while ((e = readdir(d))) {
            int pid = atoi(e->d_name);
            if (pid <= 0)
                continue;
            char path[64], stat[512];
            snprintf(path, sizeof path, "/proc/%d/stat", pid);
            FILE *f = fopen(path, "re");
            if (!f)
                continue;
            size_t n = fread(stat, 1, sizeof stat - 1, f);
            fclose(f);
            stat[n] = '\0';
            char *rp = strrchr(stat, ')');
            char state;
            int ppid, pgrp;
            if (!rp || sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) != 3)
                continue;
            if (pgrp == s->pgid && state != 'Z') {
                char *lp = strchr(stat, '(');
                buf_printf(&list, "%s%d %.*s", list.len ? ", " : "", pid, lp ? (int)(rp - lp + 1) : 0, lp ? lp : "");
            }
        }
        closedir(d);
        if (!list.len)
            break;
        clock_sleep_ms(30);
    }
    if (!list.len) {
        buf_free(&list);
        return NULL;
    }
    killpg(s->pgid, SIGKILL);
    char *msg = alloc_printf("Test left processes running (now killed): %s", list.data);
    buf_free(&list);
    return msg;
}

/* ---- td_test_run -------------------------------------------------------------------------- */

static char *make_test_dir(const char *instance)
{
    const char *base = env_get_str("TMPDIR", "/tmp");
    char clean[48];
    size_t k = 0;
    for (const char *p = instance; *p && k < sizeof clean - 1; p++)
        clean[k++] = ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')) ? *p : '_';
    clean[k] = '\0';
    char *dir = alloc_printf("%s/tdist-%s-XXXXXX", base, clean);
    if (!mkdtemp(dir)) {
        error_errno(TD_ERR_IO, "creating the test's temp dir %s", dir);
        free(dir);
        return NULL;
    }
    return dir;
}

static void result_init(td_test_result *r, const harness_instance *in)
{
    memset(r, 0, sizeof *r);
    r->message = alloc_strdup("");
    r->world_size = harness_world_size(in->c);
    for (int i = 0; i < 64; i++)
        r->exit_codes[i] = TD_TEST_NOT_EXITED;
}

/* Leftover files of a case that passed fail it (suites: also the suite's own dir, charged to the
 * last case judged in the spawn). */
static void judge_files(sup *s, td_test_result *r, const td_test_case *c, const char *dir)
{
    char *files = r->verdict == TD_TEST_PASS && !c->allow_leftovers ? leftover_files(dir) : NULL;
    if (files) {
        slog(s, "%s", files);
        set_verdict(r, TD_TEST_FAIL, files);
    }
}

/* One spawn: the ranks run cases[0..n) (one case, or a suite's batch) and each case gets its
 * verdict in results[]. The cases the ranks finished before the last one judged passed; the case a
 * rank failed, skipped or hung in gets the decision table's verdict from the exit codes, and so does
 * the batch's last case when all passed (its teardown and leak check count there). Returns how many
 * cases were judged: the rest run in a fresh spawn. */
static int supervise_spawn(const harness_instance *const *cases, int n, td_test_result *const *results)
{
    int64_t t0 = clock_now_ns();
    td_test_case *c = cases[0]->c;
    sup s = {.test_case = c, .name = cases[0]->name, .result = results[0], .cases = cases, .ncases = n,
             .log = TD_BUF_INIT};
    bool quiet = false;
    env_get_bool("TDIST_TEST_QUIET", false, &quiet);
    s.quiet = quiet;
    s.timeout_ms = harness_timeout_ms(c);
    s.outputs = alloc_zeroed((size_t)n, sizeof *s.outputs);
    int64_t *case_end = alloc_zeroed((size_t)n, sizeof *case_end);
    int judged = 0;
    int ws = harness_world_size(c);

    char *dir = make_test_dir(c->suite ? c->suite : cases[0]->name);
    if (!dir) {
        set_verdict(results[0], TD_TEST_FAIL, alloc_strdup(td_last_error()));
        goto out;
    }
    if (c->suite) {
        td_buf list = TD_BUF_INIT;
        for (int j = 0; j < n; j++) {
            buf_printf(&list, "%s%s", j ? "," : "", cases[j]->name);
            char *sub = alloc_printf("%s/%d", dir, j);
            if (mkdir(sub, 0700) != 0)
                slog(&s, "Could not create %s: %s", sub, strerror(errno));
            free(sub);
        }
        s.case_list = buf_steal(&list);
    }
    s.nranks = c->threads ? 1 : ws;
    s.ranks = alloc_zeroed((size_t)s.nranks, sizeof *s.ranks);
    for (int i = 0; i < s.nranks; i++) {
        s.ranks[i].rank = i;
        s.ranks[i].fds[0] = s.ranks[i].fds[1] = s.ranks[i].fds[2] = -1;
    }
    size_t nenv = 0;
    for (char **e = environ; *e; e++)
        nenv++;
    char **envp = alloc_zeroed(nenv + 1, sizeof *envp);
    size_t k = 0;
    for (char **e = environ; *e; e++)
        if (!env_overridden(*e))
            envp[k++] = *e;

    fflush(stdout);
    fflush(stderr);
    s.start_ns = clock_now_ns();
    char *spawn_error = NULL;
    int spawned = 0;
    for (int i = 0; i < s.nranks; i++) {
        if (spawn_rank(&s, &s.ranks[i], dir, envp, k) != TD_OK) {
            spawn_error = alloc_printf("Could not start process %d: %s", i, td_last_error());
            break;
        }
        spawned++;
        snote(&s, "Started process %d with pid %d", i, (int)s.ranks[i].pid);
    }
    free(envp);

    int64_t case_start = s.start_ns; /* of the case the slowest rank is in */
    int64_t deadline = s.start_ns + s.timeout_ms * 1000000;
    int64_t grace_ms = clamp_ms(s.timeout_ms / 4, 500, 3000);
    int64_t settle_ms = clamp_ms(s.timeout_ms / 10, 200, 1000);
    int64_t abort_at = 0;
    int trigger = -1, current = 0;
    if (spawn_error) {
        signal_remaining(&s, SIGKILL, true);
    } else {
        for (;;) {
            poll_once(&s, 100);
            reap(&s, false);
            int slowest = n;
            for (int i = 0; i < s.nranks; i++)
                slowest = s.ranks[i].done < slowest ? s.ranks[i].done : slowest;
            if (slowest > current) { /* every rank passed the cases before slowest: the next one's timeout */
                int64_t now = clock_now_ns();
                while (current < slowest)
                    case_end[current++] = now;
                start_case(&s, current);
                case_start = now;
                s.timeout_ms = harness_timeout_ms(cases[current < n ? current : n - 1]->c);
                deadline = now + s.timeout_ms * 1000000;
            }
            int err_rank = -1;
            for (int i = 0; i < s.nranks && err_rank < 0; i++)
                if (s.ranks[i].exited && s.ranks[i].code == TD_TEST_ERROR_EXIT_CODE)
                    err_rank = i;
            if (err_rank >= 0 && !all_exited(&s)) {
                slog(&s, "Process %d terminated with exit code %d, terminating remaining processes.", err_rank,
                     TD_TEST_ERROR_EXIT_CODE);
                signal_remaining(&s, SIGTERM, true);
                break;
            }
            if (all_exited(&s))
                break;
            if (!cases[current < n ? current : n - 1]->c->skip_return_code_check && trigger < 0) {
                for (int i = 0; i < s.nranks && trigger < 0; i++) {
                    const rank_proc *p = &s.ranks[i];
                    if (p->exited && p->code != 0 && !td_skip_message(p->code)) {
                        trigger = i;
                        abort_at = clock_now_ns() + settle_ms * 1000000;
                    }
                }
            }
            if (trigger >= 0 && clock_now_ns() >= abort_at) {
                slog(&s, "Process %d terminated with exit code %d, terminating remaining processes.", trigger,
                     s.ranks[trigger].code);
                signal_remaining(&s, SIGTERM, true);
                break;
            }
            if (clock_now_ns() >= deadline) {
                collect_tracebacks(&s);
                char tmo[64];
                pyfmt_seconds_ms(s.timeout_ms, tmo, sizeof tmo);
                slog(&s, "Timing out after %s seconds and killing subprocesses.", tmo);
                signal_remaining(&s, SIGTERM, true);
                break;
            }
        }
    }
    char elapsed[64];
    pyfmt_float((double)(clock_now_ns() - case_start) / 1e9, elapsed, sizeof elapsed);
    finish(&s, grace_ms);

    /* The first case some rank did not pass gets the exit codes' verdict (the last one when all did). */
    int open = n;
    for (int i = 0; i < s.nranks; i++)
        open = s.ranks[i].done < open ? s.ranks[i].done : open;
    judged = open < n ? open : n - 1;
    for (int j = 0; j < judged; j++) {
        td_test_result *rj = results[j];
        for (int i = 0; i < s.nranks; i++)
            rj->exit_codes[i] = 0;
        rj->elapsed_s = (double)(case_end[j] - (j ? case_end[j - 1] : s.start_ns)) / 1e9;
    }
    td_test_result *r = results[judged];
    s.test_case = cases[judged]->c;
    s.name = cases[judged]->name;
    s.result = r;
    for (int i = 0; i < s.nranks; i++) {
        const rank_proc *p = &s.ranks[i];
        bool by_us = p->killed && (p->code == -SIGTERM || p->code == -SIGKILL);
        r->exit_codes[i] = by_us ? TD_TEST_NOT_EXITED : p->code;
    }
    if (spawn_error)
        set_verdict(r, TD_TEST_FAIL, spawn_error);
    else if (s.test_case->skip_return_code_check)
        check_no_test_errors(&s, elapsed);
    else
        check_return_codes(&s, elapsed);
    results[0]->spawned = spawned;

    /* Leftovers fail a case that passed; after a failure (a crash, a timeout) they are expected. */
    char *procs = leftover_processes(&s); /* always killed */
    char *shm = leftover_shm(&s);         /* always removed */
    bool judge = r->verdict == TD_TEST_PASS && !s.test_case->allow_leftovers;
    char *extra[2] = {procs, judge ? shm : NULL};
    if (!judge)
        free(shm);
    for (int i = 0; i < 2; i++) {
        if (!extra[i])
            continue;
        slog(&s, "%s", extra[i]);
        if (r->verdict == TD_TEST_PASS)
            set_verdict(r, TD_TEST_FAIL, extra[i]);
        else
            free(extra[i]);
    }
    if (c->suite) {
        for (int j = 0; j < n; j++) {
            char *sub = alloc_printf("%s/%d", dir, j);
            if (j <= judged)
                judge_files(&s, results[j], cases[j]->c, sub);
            remove_tree(sub);
            free(sub);
        }
    }
    judge_files(&s, r, s.test_case, dir);
    remove_tree(dir);
    free(dir);
    for (int i = 0; i < s.nranks; i++) {
        rank_proc *p = &s.ranks[i];
        buf_free(&p->ctl_in);
        buf_free(&p->line[0]);
        buf_free(&p->line[1]);
        free(p->error);
        free(p->traceback);
        free(p->pending);
    }
    free(s.ranks);
out:
    r = results[judged];
    r->elapsed_s = (double)(clock_now_ns() - (judged ? case_end[judged - 1] : t0)) / 1e9;
    for (int j = 0; j <= judged; j++) {
        results[j]->log = alloc_strndup(s.log.data ? s.log.data : "", s.log.len);
        results[j]->output = buf_steal(&s.outputs[j]);
    }
    for (int j = 0; j < n; j++)
        buf_free(&s.outputs[j]);
    buf_free(&s.log);
    free(s.outputs);
    free(s.case_list);
    free(case_end);
    return judged + 1;
}

int harness_batch_len(const harness_instance *list, int n)
{
    int len = 1;
    const td_test_case *c = list[0].c;
    while (c->suite && !c->threads && len < n && list[len].c->suite && strcmp(list[len].c->suite, c->suite) == 0 &&
           harness_world_size(list[len].c) == harness_world_size(c))
        len++;
    return len;
}

void harness_supervise(const harness_instance *list, int n, td_test_result *results)
{
    /* Static skips first: no spawn for them, and the others share one. */
    const harness_instance **run = alloc_zeroed((size_t)n, sizeof *run);
    td_test_result **out = alloc_zeroed((size_t)n, sizeof *out);
    int m = 0;
    for (int i = 0; i < n; i++) {
        const harness_instance *in = &list[i];
        td_test_result *r = &results[i];
        result_init(r, in);
        const char *reason = in->c->static_skip ? in->c->static_skip(in->param) : NULL;
        if (!reason) {
            run[m] = in;
            out[m++] = r;
            continue;
        }
        td_buf log = TD_BUF_INIT;
        if (harness_sandcastle()) {
            harness_log(&log, "Skipping %s on sandcastle for following reason: %s", in->name, reason);
            set_verdict(r, TD_TEST_PASS, NULL);
        } else {
            set_verdict(r, TD_TEST_SKIP, alloc_strdup(reason));
        }
        r->log = buf_steal(&log);
        r->output = alloc_strdup("");
    }
    for (int k = 0; k < m;)
        k += supervise_spawn(run + k, m - k, out + k);
    free(run);
    free(out);
}

td_status td_test_run_list(const char *const *names, int n, td_test_result *results)
{
    harness_instance *list = alloc_zeroed((size_t)n + 1, sizeof *list);
    char **params = alloc_zeroed((size_t)n + 1, sizeof *params);
    td_status st = TD_OK;
    for (int i = 0; i < n && st == TD_OK; i++) {
        const char *param;
        size_t plen;
        if (!names[i] || !harness_find(names[i], &list[i].c, &param, &plen))
            st = error_fmt(TD_ERR_NOT_FOUND, "no test case named '%s'", names[i] ? names[i] : "(null)");
        else
            list[i] = (harness_instance){list[i].c, names[i], params[i] = alloc_strndup(param, plen)};
    }
    if (st != TD_OK)
        memset(results, 0, (size_t)n * sizeof *results);
    for (int k = 0; k < n && st == TD_OK;) {
        int len = harness_batch_len(list + k, n - k);
        harness_supervise(list + k, len, results + k);
        k += len;
    }
    for (int i = 0; i < n; i++)
        free(params[i]);
    free(params);
    free(list);
    return st;
}

td_status td_test_run(const char *name, td_test_result *result) { return td_test_run_list(&name, 1, result); }

void td_test_result_free(td_test_result *result)
{
    if (!result)
        return;
    free(result->message);
    free(result->log);
    free(result->output);
    result->message = result->log = result->output = NULL;
}
