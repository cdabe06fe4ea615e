/* The local worker group: starting the workers, relaying their output, noticing failures, stopping.
 *
 * Each worker is forked and exec'd in its own process group (so stopping it also stops whatever it
 * started) with PR_SET_PDEATHSIG, so no worker outlives tdrun even if tdrun is killed. Its stdout
 * and stderr are pipes that tdrun reads continuously; every complete line is written with one
 * write(2) as "[rankR]: line", so lines of different workers never interleave mid-line. With
 * --log-dir, the streams also (--tee) or only (--redirects) go to
 * DIR/RUN_ID_XXXXXX/attempt_K/LOCAL_RANK/{stdout,stderr}.log. Each worker's TORCHELASTIC_ERROR_FILE
 * is error.json in that same directory (under a temporary run directory without --log-dir).
 *
 * The monitor polls the pipes and a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP), reaps exits, and
 * on the first failure stops the rest: SIGTERM, then SIGKILL after --term-timeout. In a multi-node
 * job it also asks the job (job.c) whether another node ended the round, and then stops them too. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "tdrun.h"

extern char **environ;

enum { OUT = 0, ERR = 1 };

typedef struct stream {
    int fd;          /* read end of the pipe, -1 once closed */
    int log_fd;      /* log file, -1 if none */
    bool console;    /* echo to tdrun's own stdout / stderr */
    td_buf line;     /* the incomplete last line */
} stream;

typedef struct worker {
    int local_rank;
    int rank;
    pid_t pid;
    bool running;
    int code;        /* exit code or -signal, once !running */
    bool stopped;    /* we signalled it: its exit is not a failure of its own */
    stream s[2];
    char log_path[2][4400];
    char error_file[4400]; /* TORCHELASTIC_ERROR_FILE */
} worker;

struct tdrun_group {
    const tdrun_options *o;
    int n;
    worker *w;
};

static int g_sigfd = -1;

int tdrun_signals_open(void)
{
    if (g_sigfd >= 0)
        return g_sigfd;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    g_sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    return g_sigfd;
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        p += k;
        n -= (size_t)k;
    }
}

/* Whether a line already names the worker's rank at its start, so that tdrun's "[rankR]: " would
 * double it: tdist's log prefix "[tdist LEVEL] [rank R] ", or PyTorch's "[Rank R]" that tdist's
 * error texts keep (after the log prefix or alone). A line naming another rank gets the prefix. */
static bool carries_rank(const char *p, size_t n, int rank)
{
    if (n >= 7 && memcmp(p, "[tdist ", 7) == 0) {
        const char *e = memchr(p, ']', n);
        if (!e || (size_t)(e - p) + 2 > n || e[1] != ' ')
            return false;
        n -= (size_t)(e + 2 - p);
        p = e + 2;
    }
    char want[32];
    for (int k = 0; k < 2; k++) {
        int m = snprintf(want, sizeof want, k ? "[Rank %d]" : "[rank %d]", rank);
        if (m > 0 && (size_t)m <= n && memcmp(p, want, (size_t)m) == 0)
            return true;
    }
    return false;
}

/* Emits one complete line (without its newline) of a worker's stream. */
static void emit_line(const worker *w, int which, const char *p, size_t n)
{
    const stream *s = &w->s[which];
    if (s->log_fd >= 0) {
        write_all(s->log_fd, p, n);
        write_all(s->log_fd, "\n", 1);
    }
    if (s->console) {
        td_buf out = TD_BUF_INIT;
        if (!carries_rank(p, n, w->rank))
            buf_printf(&out, "[rank%d]: ", w->rank);
        buf_append(&out, p, n);
        buf_putc(&out, '\n');
        write_all(which == OUT ? STDOUT_FILENO : STDERR_FILENO, out.data, out.len);
        buf_free(&out);
    }
}

/* Reads what is available; returns false at EOF (the stream is then closed). */
static bool pump(worker *w, int which)
{
    stream *s = &w->s[which];
    char chunk[65536];
    ssize_t k = read(s->fd, chunk, sizeof chunk);
    if (k < 0 && (errno == EINTR || errno == EAGAIN))
        return true;
    if (k <= 0) {
        if (s->line.len)
            emit_line(w, which, s->line.data, s->line.len);
        buf_clear(&s->line);
        close(s->fd);
        s->fd = -1;
        return false;
    }
    const char *p = chunk, *end = chunk + k;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) {
            buf_append(&s->line, p, (size_t)(end - p));
            if (s->line.len >= 65536) { /* a very long line is cut rather than held forever */
                emit_line(w, which, s->line.data, s->line.len);
                buf_clear(&s->line);
            }
            break;
        }
        if (s->line.len) {
            buf_append(&s->line, p, (size_t)(nl - p));
            emit_line(w, which, s->line.data, s->line.len);
            buf_clear(&s->line);
        } else {
            emit_line(w, which, p, (size_t)(nl - p));
        }
        p = nl + 1;
    }
    return true;
}

td_status tdrun_make_dirs(const char *path)
{
    char tmp[4400];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return error_errno(TD_ERR_IO, "creating log directory %s", tmp);
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return error_errno(TD_ERR_IO, "creating log directory %s", tmp);
    return TD_OK;
}

static char **build_env(const tdrun_options *o, const worker *w, const char *addr, int port, int restart)
{
    int world = o->nnodes * o->nproc_per_node;
    char *vars[] = {
        alloc_printf("RANK=%d", w->rank),
        alloc_printf("LOCAL_RANK=%d", w->local_rank),
        alloc_printf("WORLD_SIZE=%d", world),
        alloc_printf("LOCAL_WORLD_SIZE=%d", o->nproc_per_node),
        alloc_printf("GROUP_RANK=%d", o->node_rank),
        alloc_printf("GROUP_WORLD_SIZE=%d", o->nnodes),
        alloc_printf("ROLE_NAME=%s", o->role),
        alloc_printf("ROLE_RANK=%d", w->rank), /* one role per job: the role's ranks are the job's */
        alloc_printf("ROLE_WORLD_SIZE=%d", world),
        alloc_printf("MASTER_ADDR=%s", addr),
        alloc_printf("MASTER_PORT=%d", port),
        alloc_printf("TDIST_RESTART_COUNT=%d", restart),
        alloc_printf("TDIST_MAX_RESTARTS=%d", o->max_restarts),
        alloc_printf("TDIST_USE_AGENT_STORE=1"),
        alloc_printf("TORCHELASTIC_RESTART_COUNT=%d", restart),
        alloc_printf("TORCHELASTIC_MAX_RESTARTS=%d", o->max_restarts),
        alloc_printf("TORCHELASTIC_RUN_ID=%s", o->run_id),
        alloc_printf("TORCHELASTIC_ERROR_FILE=%s", w->error_file),
        alloc_printf("TORCHELASTIC_USE_AGENT_STORE=True"), /* torchrun's spelling of TDIST_USE_AGENT_STORE */
    };
    size_t nvars = sizeof vars / sizeof *vars;
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    char **env = alloc_zeroed(nenv + nvars + 2, sizeof *env);
    size_t k = 0;
    bool have_omp = false;
    for (size_t i = 0; i < nenv; i++) {
        bool replaced = false;
        for (size_t j = 0; j < nvars && !replaced; j++) {
            size_t len = (size_t)(strchr(vars[j], '=') - vars[j]) + 1;
            replaced = strncmp(environ[i], vars[j], len) == 0;
        }
        if (strncmp(environ[i], "OMP_NUM_THREADS=", 16) == 0)
            have_omp = true;
        if (!replaced)
            env[k++] = alloc_strdup(environ[i]);
    }
    for (size_t j = 0; j < nvars; j++)
        env[k++] = vars[j];
    /* As torchrun: several workers per node should not each start one thread per core. */
    if (!have_omp && o->nproc_per_node > 1)
        env[k++] = alloc_strdup("OMP_NUM_THREADS=1");
    env[k] = NULL;
    return env;
}

static void free_env(char **env)
{
    for (char **p = env; *p; p++)
        free(*p);
    free(env);
}

/* --bind-to core: the local rank's CPU, the (local_rank mod n)-th of the n CPUs tdrun may run on. */
static bool worker_cpu(int local_rank, cpu_set_t *out)
{
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0 || CPU_COUNT(&mine) == 0)
        return false;
    int want = local_rank % CPU_COUNT(&mine);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (CPU_ISSET(cpu, &mine) && want-- == 0) {
            CPU_ZERO(out);
            CPU_SET(cpu, out);
            return true;
        }
    }
    return false;
}

static td_status start_worker(tdrun_group *g, worker *w, const char *addr, int port, int restart)
{
    const tdrun_options *o = g->o;
    /* The run's directory for this worker: its error file, and its logs with --log-dir. */
    char dir[4300];
    snprintf(dir, sizeof dir, "%s/attempt_%d/%d", o->run_dir, restart, w->local_rank);
    td_status made = tdrun_make_dirs(dir);
    if (made != TD_OK)
        return made;
    snprintf(w->error_file, sizeof w->error_file, "%s/error.json", dir);
    unlink(w->error_file); /* as torchrun: an error file left from before is not this worker's */
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    for (int i = 0; i < 2; i++)
        if (pipe2(pipes[i], O_CLOEXEC) != 0)
            return error_errno(TD_ERR_IO, "pipe for worker %d", w->rank);
    for (int i = 0; i < 2; i++) {
        int bits = (i == OUT) ? 1 : 2;
        int redirect = o->redirects[w->local_rank] & bits;
        int tee = o->tee[w->local_rank] & bits;
        w->s[i] = (stream){.fd = pipes[i][0], .log_fd = -1, .console = !redirect && !o->console_hidden[w->local_rank]};
        if (o->log_dir && (redirect || tee)) {
            snprintf(w->log_path[i], sizeof w->log_path[i], "%s/%s.log", dir, i == OUT ? "stdout" : "stderr");
            w->s[i].log_fd = open(w->log_path[i], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (w->s[i].log_fd < 0)
                return error_errno(TD_ERR_IO, "opening log file %s", w->log_path[i]);
        }
    }
    cpu_set_t cpus;
    bool bind = o->bind_core && worker_cpu(w->local_rank, &cpus);
    char **env = build_env(o, w, addr, port, restart);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        free_env(env);
        return error_errno(TD_ERR_IO, "fork for worker %d", w->rank);
    }
    if (pid == 0) {
        /* Only async-signal-safe calls from here to exec: tdrun may have other threads. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(pipes[OUT][1], STDOUT_FILENO);
        dup2(pipes[ERR][1], STDERR_FILENO);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (bind)
            sched_setaffinity(0, sizeof cpus, &cpus);
        execvpe(o->argv[0], o->argv, env);
        static const char msg[] = "tdrun: cannot execute the worker program\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        _exit(127);
    }
    setpgid(pid, pid); /* also from the parent, so the group exists before we may signal it */
    free_env(env);
    close(pipes[OUT][1]);
    close(pipes[ERR][1]);
    fcntl(w->s[OUT].fd, F_SETFL, O_NONBLOCK);
    fcntl(w->s[ERR].fd, F_SETFL, O_NONBLOCK);
    w->pid = pid;
    w->running = true;
    return TD_OK;
}

td_status tdrun_group_start(const tdrun_options *o, const char *master_addr, int master_port, int restart_count,
                            tdrun_group **out)
{
    tdrun_group *g = TD_NEW(tdrun_group);
    g->o = o;
    g->n = o->nproc_per_node;
    g->w = TD_NEW_ARRAY(worker, (size_t)g->n);
    for (int i = 0; i < g->n; i++) {
        worker *w = &g->w[i];
        w->local_rank = i;
        w->rank = o->node_rank * o->nproc_per_node + i;
        w->s[OUT].fd = w->s[ERR].fd = -1;
        w->s[OUT].log_fd = w->s[ERR].log_fd = -1;
    }
    for (int i = 0; i < g->n; i++) {
        td_status st = start_worker(g, &g->w[i], master_addr, master_port, restart_count);
        if (st != TD_OK) {
            tdrun_group_stop(g, SIGKILL);
            tdrun_group_free(g);
            return st;
        }
    }
    *out = g;
    return TD_OK;
}

static int decode_status(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

/* Reaps exited workers; returns the first newly seen failure, or NULL. */
static worker *reap(tdrun_group *g)
{
    worker *failed = NULL;
    for (int i = 0; i < g->n; i++) {
        worker *w = &g->w[i];
        if (!w->running)
            continue;
        int status;
        pid_t r = waitpid(w->pid, &status, WNOHANG);
        if (r != w->pid)
            continue;
        w->running = false;
        w->code = decode_status(status);
        if (w->code != 0 && !w->stopped && !failed)
            failed = w;
    }
    return failed;
}

static int live_count(const tdrun_group *g)
{
    int n = 0;
    for (int i = 0; i < g->n; i++)
        n += g->w[i].running;
    return n;
}

/* One round of waiting: relays output, and returns a caught signal number (0 for none). */
static int poll_once(tdrun_group *g, int sigfd, int timeout_ms)
{
    struct pollfd pfd[2 * TDRUN_MAX_LOCAL + 1];
    worker *who[2 * TDRUN_MAX_LOCAL];
    int which[2 * TDRUN_MAX_LOCAL];
    int n = 0;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < 2; k++)
            if (g->w[i].s[k].fd >= 0) {
                who[n] = &g->w[i];
                which[n] = k;
                pfd[n++] = (struct pollfd){.fd = g->w[i].s[k].fd, .events = POLLIN};
            }
    int nsig = n;
    pfd[n++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    if (poll(pfd, (nfds_t)n, timeout_ms) <= 0)
        return 0;
    for (int i = 0; i < nsig; i++)
        if (pfd[i].revents)
            pump(who[i], which[i]);
    int caught = 0;
    if (pfd[nsig].revents) {
        struct signalfd_siginfo si;
        while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si)
            if (si.ssi_signo != SIGCHLD && !caught)
                caught = (int)si.ssi_signo;
    }
    return caught;
}

td_status tdrun_group_monitor(tdrun_group *g, tdrun_job *job, bool *failed, tdrun_exit *first, int *signo, bool *ended)
{
    tdrun_signals_open();
    *failed = false;
    *signo = 0;
    *ended = false;
    for (;;) {
        int sig = poll_once(g, g_sigfd, (int)g->o->monitor_interval_ms);
        worker *f = reap(g);
        if (!f && !sig && job && tdrun_job_poll(job)) {
            *ended = true;
            tdrun_group_stop(g, SIGTERM);
            return TD_OK;
        }
        if (f) {
            *failed = true;
            *first = (tdrun_exit){f->local_rank, f->rank, f->pid, f->code, clock_wall_ns()};
            tdrun_group_stop(g, SIGTERM);
            return TD_OK;
        }
        if (sig) {
            *signo = sig;
            tdrun_group_stop(g, sig == SIGHUP ? SIGTERM : sig);
            return TD_OK;
        }
        if (live_count(g) == 0) {
            /* Drain what the workers wrote last (bounded: a grandchild may hold a pipe open). */
            int64_t deadline = deadline_after_ms(1000);
            while (!deadline_passed(deadline)) {
                bool open = false;
                for (int i = 0; i < g->n; i++)
                    open |= g->w[i].s[OUT].fd >= 0 || g->w[i].s[ERR].fd >= 0;
                if (!open)
                    break;
                poll_once(g, g_sigfd, 50);
            }
            return TD_OK;
        }
    }
}

void tdrun_group_stop(tdrun_group *g, int sig)
{
    tdrun_signals_open();
    for (int i = 0; i < g->n; i++)
        if (g->w[i].running) {
            g->w[i].stopped = true;
            kill(-g->w[i].pid, sig);
        }
    int64_t deadline = deadline_after_ms(g->o->term_timeout_ms);
    while (live_count(g) > 0 && !deadline_passed(deadline)) {
        poll_once(g, g_sigfd, 20);
        reap(g);
    }
    for (int i = 0; i < g->n; i++)
        if (g->w[i].running)
            kill(-g->w[i].pid, SIGKILL);
    while (live_count(g) > 0) {
        poll_once(g, g_sigfd, 20);
        reap(g);
    }
    /* Output written before the end. */
    for (int round = 0; round < 10; round++)
        poll_once(g, g_sigfd, 10);
}

const char *tdrun_group_log_file(const tdrun_group *g, int local_rank)
{
    const worker *w = &g->w[local_rank];
    if (w->log_path[ERR][0])
        return w->log_path[ERR];
    return w->log_path[OUT][0] ? w->log_path[OUT] : NULL;
}

const char *tdrun_group_error_file(const tdrun_group *g, int local_rank)
{
    return g->w[local_rank].error_file;
}

void tdrun_group_free(tdrun_group *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < 2; k++) {
            stream *s = &g->w[i].s[k];
            if (s->fd >= 0)
                close(s->fd);
            if (s->log_fd >= 0)
                close(s->log_fd);
            buf_free(&s->line);
        }
    free(g->w);
    free(g);
}
