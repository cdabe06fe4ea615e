/* Processes: the entry-point registry, td_mp_spawn with the fork and spawn start methods, the
 * ProcessContext (td_mp_context: join with timeout, exit codes, termination), and the child side
 * of spawn (td_mp_child_main).
 *
 * Every child gets a SOCK_SEQPACKET channel to its parent. Under spawn the parent first sends the
 * child's bootstrap message on it, an mp message (message.h) holding (entry name, rank, nprocs,
 * args), so tensors, queues and events in the arguments arrive by handle; then it forks and execs
 * /proc/self/exe with "--td-mp-child <fd>", and the program's TD_MP_MAIN_PROLOGUE runs the entry.
 * Under fork the child calls the entry directly on its copy of the arguments. Either way a failing
 * entry sends "E" and its error message on the channel before exiting with code 1, which join
 * reports as torch.multiprocessing.spawn does. Children are reaped through pidfds (polled with the
 * deadline) or, where there are none, by polling waitpid. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/mp.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/fork.h"
#include "base/thread.h"
#include "mp/message.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define CHILD_FLAG "--td-mp-child"
#define ERROR_MAX (60 * 1024)

extern char **environ;

/* ---- registry ----------------------------------------------------------------------------- */

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static td_mp_entry *entries;

void td_mp_entry_register(td_mp_entry *e)
{
    pthread_mutex_lock(&reg_mu);
    e->next = entries;
    entries = e;
    pthread_mutex_unlock(&reg_mu);
}

td_mp_entry_fn td_mp_entry_find(const char *name)
{
    td_mp_entry_fn fn = NULL;
    pthread_mutex_lock(&reg_mu);
    for (td_mp_entry *e = entries; e && name; e = e->next)
        if (strcmp(e->name, name) == 0) {
            fn = e->fn;
            break;
        }
    pthread_mutex_unlock(&reg_mu);
    return fn;
}

const char *td_mp_start_method_name(td_mp_start_method m)
{
    return m == TD_MP_FORK ? "fork" : m == TD_MP_SPAWN ? "spawn" : "unknown";
}

/* ---- running an entry (child side) -------------------------------------------------------- */

/* Sends "E<message>" to the parent (best effort, bounded wait). */
static void report_error(int chan, const char *msg)
{
    size_t n = strnlen(msg, ERROR_MAX);
    char *buf = alloc_or_die(n + 1);
    buf[0] = 'E';
    memcpy(buf + 1, msg, n);
    struct pollfd p = {.fd = chan, .events = POLLOUT};
    if (poll(&p, 1, 5000) > 0) {
        ssize_t w = send(chan, buf, n + 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
    }
    free(buf);
}

static int run_entry(int chan, const char *name, int rank, const td_value *args)
{
    td_mp_entry_fn fn = td_mp_entry_find(name);
    if (!fn) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "entry point '%s' is not registered in this program (declare it with TD_MP_ENTRY in a file linked "
                 "into it)",
                 name);
        report_error(chan, msg);
        return 1;
    }
    td_value *result = NULL;
    td_status st = fn(rank, args, &result);
    td_value_release(result);
    if (st != TD_OK) {
        const char *m = td_last_error();
        char fallback[64];
        if (!*m) {
            snprintf(fallback, sizeof fallback, "the entry point returned %s", td_status_str(st));
            m = fallback;
        }
        report_error(chan, m);
        return 1;
    }
    return 0;
}

int td_mp_child_main(int argc, char **argv)
{
    if (argc < 3 || strcmp(argv[1], CHILD_FLAG) != 0)
        return -1;
    int chan = atoi(argv[2]);
    if (chan < 0 || fcntl(chan, F_SETFD, FD_CLOEXEC) != 0) {
        fprintf(stderr, "tdist: %s needs the fd of its bootstrap channel, got '%s'\n", CHILD_FLAG, argv[2]);
        return 1;
    }
    td_mp_rmsg r;
    td_value *boot = NULL;
    td_status st = mp_msg_recv(chan, deadline_after_ms(60000), &r);
    if (st == TD_OK)
        st = mp_msg_decode(&r, mp_object_classes, &boot);
    int code = 1;
    if (st != TD_OK) {
        error_prefix(st, "spawned process: reading its arguments from the parent");
        report_error(chan, td_last_error());
    } else if (td_value_kind_of(boot) != TD_VAL_TUPLE || td_value_len(boot) != 4 ||
               td_value_kind_of(td_value_at(boot, 0)) != TD_VAL_STRING ||
               td_value_kind_of(td_value_at(boot, 1)) != TD_VAL_INT) {
        report_error(chan, "spawned process: the bootstrap message is not (entry, rank, nprocs, args)");
    } else {
        code = run_entry(chan, td_value_get_string(td_value_at(boot, 0), NULL),
                         (int)td_value_get_int(td_value_at(boot, 1)), td_value_at(boot, 3));
    }
    td_value_release(boot);
    close(chan);
    return code;
}

/* ---- the parent side ---------------------------------------------------------------------- */

typedef struct mp_proc {
    pid_t pid;
    int pidfd; /* -1 when the kernel has no pidfd_open */
    int chan;  /* the parent's end */
    bool reaped;
    int code;  /* exit code, or -signal */
    char *error; /* what the child reported */
} mp_proc;

struct td_mp_context {
    td_fork_guard guard;
    int n;
    mp_proc *p;
    int failed;     /* the rank of the first failure reported, -1 */
    char *failure;  /* its message */
};

static void reap_one(td_mp_context *ctx, int i, bool block)
{
    mp_proc *p = &ctx->p[i];
    if (p->reaped || p->pid <= 0)
        return;
    int status;
    pid_t r;
    do
        r = waitpid(p->pid, &status, block ? 0 : WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r != p->pid)
        return;
    p->reaped = true;
    p->code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
    char *buf = alloc_or_die(ERROR_MAX + 2);
    ssize_t n = recv(p->chan, buf, ERROR_MAX + 1, MSG_DONTWAIT);
    if (n > 1 && buf[0] == 'E') {
        buf[n] = '\0';
        p->error = alloc_strdup(buf + 1);
    }
    free(buf);
    if (p->pidfd >= 0) {
        close(p->pidfd);
        p->pidfd = -1;
    }
}

static void reap_all(td_mp_context *ctx)
{
    for (int i = 0; i < ctx->n; i++)
        reap_one(ctx, i, false);
}

/* Waits until some child may have exited, or the deadline. */
static void wait_any(td_mp_context *ctx, int64_t deadline_ns)
{
    struct pollfd *pf = alloc_zeroed((size_t)ctx->n, sizeof *pf);
    int n = 0;
    bool polling = false;
    for (int i = 0; i < ctx->n; i++) {
        if (ctx->p[i].reaped)
            continue;
        if (ctx->p[i].pidfd >= 0)
            pf[n++] = (struct pollfd){.fd = ctx->p[i].pidfd, .events = POLLIN};
        else
            polling = true;
    }
    int ms = deadline_poll_ms(deadline_ns);
    if (polling && (ms < 0 || ms > 20))
        ms = 20;
    int r;
    do
        r = poll(pf, (nfds_t)n, ms);
    while (r < 0 && errno == EINTR);
    free(pf);
}

static void terminate_running(td_mp_context *ctx, int64_t grace_ms)
{
    bool any = false;
    for (int i = 0; i < ctx->n; i++) {
        if (!ctx->p[i].reaped && ctx->p[i].pid > 0) {
            kill(ctx->p[i].pid, SIGTERM);
            any = true;
        }
    }
    if (!any)
        return;
    int64_t deadline = deadline_after_ms(grace_ms > 0 ? grace_ms : 1);
    for (;;) {
        reap_all(ctx);
        bool left = false;
        for (int i = 0; i < ctx->n; i++)
            left |= !ctx->p[i].reaped && ctx->p[i].pid > 0;
        if (!left || deadline_passed(deadline))
            break;
        wait_any(ctx, deadline);
    }
    for (int i = 0; i < ctx->n; i++) {
        if (!ctx->p[i].reaped && ctx->p[i].pid > 0) {
            kill(ctx->p[i].pid, SIGKILL);
            reap_one(ctx, i, true);
        }
    }
}

static char *describe_failure(const mp_proc *p, int rank)
{
    if (p->error)
        return alloc_printf("\n\n-- Process %d terminated with the following error:\n%s", rank, p->error);
    if (p->code < 0) {
        const char *abbrev = sigabbrev_np(-p->code);
        return abbrev ? alloc_printf("process %d terminated with signal SIG%s", rank, abbrev)
                      : alloc_printf("process %d terminated with signal %d", rank, -p->code);
    }
    return alloc_printf("process %d terminated with exit code %d", rank, p->code);
}

static void close_all_chans_but(td_mp_context *ctx, int upto, int keep)
{
    for (int i = 0; i < upto; i++)
        if (i != keep && ctx->p[i].chan >= 0)
            close(ctx->p[i].chan);
}

static td_status start_one(td_mp_context *ctx, const td_mp_spawn_opts *o, int rank, const char *exe)
{
    mp_proc *p = &ctx->p[rank];
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return error_errno(TD_ERR_IO, "td_mp_spawn: socketpair");
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
    char *argv[] = {(char *)exe, (char *)CHILD_FLAG, fdarg, NULL};
    if (o->method == TD_MP_SPAWN) {
        td_value *boot = td_value_tuple_of(4, td_value_string(o->entry), td_value_int(rank), td_value_int(ctx->n),
                                           o->args ? td_value_retain((td_value *)o->args) : td_value_none());
        td_mp_msg m;
        td_status st = mp_msg_encode(boot, &m);
        td_value_release(boot);
        if (st == TD_OK)
            st = mp_msg_send(sv[0], &m, false, deadline_after_ms(30000));
        mp_msg_free(&m);
        if (st != TD_OK) {
            close(sv[0]);
            close(sv[1]);
            return error_prefix(st, "td_mp_spawn: sending process %d its arguments", rank);
        }
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return error_errno(TD_ERR_IO, "td_mp_spawn: fork of process %d", rank);
    }
    if (pid == 0) {
        if (o->daemon) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(1);
        }
        if (o->method == TD_MP_SPAWN) {
            /* Async-signal-safe calls only until exec: the parent may have threads. */
            fcntl(sv[1], F_SETFD, 0);
            execve("/proc/self/exe", argv, environ);
            static const char msg[] = "tdist: td_mp_spawn: execve(/proc/self/exe) failed\n";
            ssize_t w = write(2, msg, sizeof msg - 1);
            (void)w;
            _exit(127);
        }
        close(sv[0]);
        close_all_chans_but(ctx, rank, -1);
        int code = run_entry(sv[1], o->entry, rank, o->args);
        fflush(NULL);
        _exit(code);
    }
    close(sv[1]);
    p->pid = pid;
    p->chan = sv[0];
    p->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    return TD_OK;
}

td_status td_mp_spawn(const td_mp_spawn_opts *o, td_mp_context **out)
{
    if (!o || !out || !o->entry)
        return error_fmt(TD_ERR_INVALID, "td_mp_spawn: %s is NULL", !o ? "opts" : !out ? "out" : "opts->entry");
    if (o->method != TD_MP_FORK && o->method != TD_MP_SPAWN)
        return error_fmt(TD_ERR_INVALID, "td_mp_spawn: unknown start method %d (use TD_MP_FORK or TD_MP_SPAWN)",
                        (int)o->method);
    if (!td_mp_entry_find(o->entry))
        return error_fmt(TD_ERR_NOT_FOUND, "td_mp_spawn: no entry point named '%s' is registered (TD_MP_ENTRY)", o->entry);
    int n = o->nprocs > 0 ? o->nprocs : 1;
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = '\0';
    td_mp_context *ctx = TD_NEW(td_mp_context);
    fork_guard_init(&ctx->guard);
    ctx->n = n;
    ctx->failed = -1;
    ctx->p = TD_NEW_ARRAY(mp_proc, (size_t)n);
    for (int i = 0; i < n; i++)
        ctx->p[i] = (mp_proc){.pid = -1, .pidfd = -1, .chan = -1};
    for (int i = 0; i < n; i++) {
        td_status st = start_one(ctx, o, i, len > 0 ? exe : "tdist-mp-child");
        if (st != TD_OK) {
            ctx->n = i; /* only those started */
            td_mp_context_release(ctx);
            return st;
        }
    }
    *out = ctx;
    return TD_OK;
}

td_status td_mp_join(td_mp_context *ctx, int64_t timeout_ms)
{
    if (!ctx)
        return error_fmt(TD_ERR_INVALID, "td_mp_join: context is NULL");
    TD_TRY(fork_guard_check(&ctx->guard, "a td_mp_context"));
    if (ctx->failure)
        return error_set(TD_ERR_REMOTE, ctx->failure);
    int64_t deadline = timeout_ms == TD_MP_NO_WAIT ? clock_now_ns() : deadline_after_ms(timeout_ms);
    for (;;) {
        reap_all(ctx);
        int running = 0;
        for (int i = 0; i < ctx->n; i++) {
            if (!ctx->p[i].reaped)
                running++;
            else if (ctx->p[i].code != 0 && ctx->failed < 0)
                ctx->failed = i;
        }
        if (ctx->failed >= 0) {
            ctx->failure = describe_failure(&ctx->p[ctx->failed], ctx->failed);
            terminate_running(ctx, 3000);
            return error_set(TD_ERR_REMOTE, ctx->failure);
        }
        if (running == 0)
            return TD_OK;
        if (deadline_passed(deadline))
            return error_fmt(TD_ERR_TIMEOUT, "td_mp_join: %d of %d processes still running after %lld ms", running,
                            ctx->n, (long long)(timeout_ms < 0 ? 0 : timeout_ms));
        wait_any(ctx, deadline);
    }
}

int td_mp_context_size(const td_mp_context *ctx) { return ctx ? ctx->n : 0; }

pid_t td_mp_context_pid(const td_mp_context *ctx, int rank)
{
    return ctx && rank >= 0 && rank < ctx->n ? ctx->p[rank].pid : -1;
}

bool td_mp_is_alive(td_mp_context *ctx, int rank)
{
    if (!ctx || rank < 0 || rank >= ctx->n || fork_guard_check(&ctx->guard, "a td_mp_context") != TD_OK)
        return false;
    reap_one(ctx, rank, false);
    return !ctx->p[rank].reaped;
}

td_status td_mp_exitcode(td_mp_context *ctx, int rank, int *code)
{
    if (!ctx || !code || rank < 0 || rank >= ctx->n)
        return error_fmt(TD_ERR_INVALID, "td_mp_exitcode: bad context or rank %d", rank);
    TD_TRY(fork_guard_check(&ctx->guard, "a td_mp_context"));
    reap_one(ctx, rank, false);
    if (!ctx->p[rank].reaped)
        return error_fmt(TD_ERR_TIMEOUT, "process %d (pid %d) is still running", rank, (int)ctx->p[rank].pid);
    *code = ctx->p[rank].code;
    return TD_OK;
}

void td_mp_terminate(td_mp_context *ctx, int64_t grace_ms)
{
    if (ctx && fork_guard_check(&ctx->guard, "a td_mp_context") == TD_OK)
        terminate_running(ctx, grace_ms);
}

void td_mp_context_release(td_mp_context *ctx)
{
    if (!ctx)
        return;
    /* In a forked child these processes are its siblings: not its to kill or reap. */
    if (fork_guard_check(&ctx->guard, "a td_mp_context") == TD_OK)
        terminate_running(ctx, 1000);
    for (int i = 0; i < ctx->n; i++) {
        if (ctx->p[i].chan >= 0)
            close(ctx->p[i].chan);
        if (ctx->p[i].pidfd >= 0)
            close(ctx->p[i].pidfd);
        free(ctx->p[i].error);
    }
    free(ctx->p);
    free(ctx->failure);
    free(ctx);
}

/* ---- thread names ------------------------------------------------------------------------- */

td_status td_set_thread_name(const char *name)
{
    if (!name)
        return error_fmt(TD_ERR_INVALID, "td_set_thread_name: the name must be a string, got NULL");
    return thread_set_name(name);
}

td_status td_get_thread_name(char *out, size_t size)
{
    if (!out || size == 0)
        return error_fmt(TD_ERR_INVALID, "td_get_thread_name: out is NULL or empty");
    return thread_get_name(out, size);
}
