/* The client side of tdist-shm-manager (shm_manager.h): one connection per process, opened when
 * the process first holds a named (file_system) segment and closed when it holds none, so a
 * process that shares nothing by name keeps no fd and the daemon can exit once nobody holds
 * anything. The first client starts the daemon: a double fork (the daemon is nobody's child and
 * in its own session) and an exec of the tdist-shm-manager program, found through
 * TDIST_SHM_MANAGER, the build tree, the install prefix, then PATH. A forked child drops the
 * connection it inherited (it holds no references of its own until it maps segments itself). */
#include "mp/shm_manager.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"

extern char **environ;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int conn_fd = -1;
static long users;
static bool connecting;
static pid_t daemon_pid;
static bool warned_lost;

static void child_after_fork(void)
{
    if (conn_fd >= 0)
        close(conn_fd);
    conn_fd = -1;
    users = 0;
    connecting = false;
    daemon_pid = 0;
    pthread_mutex_init(&mu, NULL);
    pthread_cond_init(&cv, NULL);
}

__attribute__((constructor)) static void register_atfork(void) { pthread_atfork(NULL, NULL, child_after_fork); }

void shmm_socket_name(char *out, size_t size)
{
    const char *env = getenv(TD_SHMM_SOCKET_ENV);
    if (env && *env)
        snprintf(out, size, "%s", env);
    else
        snprintf(out, size, "tdist-shm-manager.v%d.%u", TD_SHMM_VERSION, (unsigned)getuid());
}

static socklen_t abstract_addr(struct sockaddr_un *a, const char *name)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strnlen(name, sizeof a->sun_path - 1);
    memcpy(a->sun_path + 1, name, n);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static bool is_file(const char *p)
{
    struct stat st;
    return p && *p && stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

/* Where the daemon program is; false when nowhere. */
static bool find_program(char *out, size_t size)
{
    const char *env = getenv("TDIST_SHM_MANAGER");
    if (env && *env) {
        snprintf(out, size, "%s", env);
        return true;
    }
#ifdef TDIST_SHM_MANAGER_BUILD_PATH
    if (is_file(TDIST_SHM_MANAGER_BUILD_PATH)) {
        snprintf(out, size, "%s", TDIST_SHM_MANAGER_BUILD_PATH);
        return true;
    }
#endif
#ifdef TDIST_SHM_MANAGER_INSTALL_PATH
    if (is_file(TDIST_SHM_MANAGER_INSTALL_PATH)) {
        snprintf(out, size, "%s", TDIST_SHM_MANAGER_INSTALL_PATH);
        return true;
    }
#endif
    const char *path = getenv("PATH");
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        snprintf(out, size, "%.*s/tdist-shm-manager", (int)len, path);
        if (len && is_file(out))
            return true;
        path = end ? end + 1 : NULL;
    }
    return false;
}

/* Starts the daemon detached; returns once exec succeeded or failed. */
static td_status start_daemon(const char *sock_name)
{
    char prog[4096];
    if (!find_program(prog, sizeof prog))
        return error_fmt(TD_ERR_NOT_FOUND,
                        "the file_system sharing strategy needs the tdist-shm-manager program, which was found "
                        "neither in the build tree, the install prefix nor PATH: set TDIST_SHM_MANAGER to its path, "
                        "or use the file_descriptor strategy");
    const char *log_path = getenv("TDIST_SHM_MANAGER_LOG");
    char *argv[] = {prog, (char *)"--socket", (char *)sock_name, NULL};
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return error_errno(TD_ERR_IO, "starting tdist-shm-manager: pipe");
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return error_errno(TD_ERR_IO, "starting tdist-shm-manager: fork");
    }
    if (pid == 0) {
        /* Only async-signal-safe calls from here: the parent may have threads. */
        setsid();
        if (fork() != 0)
            _exit(0);
        int null = open("/dev/null", O_RDWR);
        int err_fd = log_path ? open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600) : -1;
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(err_fd >= 0 ? err_fd : null, 2);
        }
        execve(prog, argv, environ);
        int e = errno;
        ssize_t w = write(p[1], &e, sizeof e);
        (void)w;
        _exit(127);
    }
    close(p[1]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    int e = 0;
    ssize_t n;
    do
        n = read(p[0], &e, sizeof e);
    while (n < 0 && errno == EINTR);
    close(p[0]);
    if (n == (ssize_t)sizeof e)
        return error_fmt(TD_ERR_IO, "could not start tdist-shm-manager at \"%s\": %s", prog, strerror(e));
    return TD_OK;
}

static td_status send_msg(int fd, int op, const char *name)
{
    td_shmm_msg m;
    memset(&m, 0, sizeof m);
    m.op = (uint8_t)op;
    m.version = TD_SHMM_VERSION;
    m.pid = (uint32_t)getpid();
    size_t n = name ? strnlen(name, sizeof m.name) : 0;
    memcpy(m.name, name ? name : "", n);
    m.name_len = (uint16_t)n;
    ssize_t w;
    do
        w = send(fd, &m, offsetof(td_shmm_msg, name) + n, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    return w < 0 ? error_errno(TD_ERR_PEER_LOST, "writing to tdist-shm-manager") : TD_OK;
}

/* One attempt: connect and say hello; TD_ERR_NOT_FOUND when nobody listens. */
static td_status try_connect(const char *sock_name, int *out_fd, pid_t *out_pid)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return error_errno(TD_ERR_IO, "socket for tdist-shm-manager");
    struct sockaddr_un a;
    socklen_t len = abstract_addr(&a, sock_name);
    if (connect(fd, (struct sockaddr *)&a, len) != 0) {
        int e = errno;
        close(fd);
        if (e == ECONNREFUSED || e == ENOENT || e == EAGAIN)
            return error_fmt(TD_ERR_NOT_FOUND, "no tdist-shm-manager listens on @%s", sock_name);
        errno = e;
        return error_errno(TD_ERR_IO, "connecting to tdist-shm-manager at @%s", sock_name);
    }
    td_status st = send_msg(fd, TD_SHMM_HELLO, NULL);
    if (st == TD_OK) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        td_shmm_msg m;
        int pr;
        do
            pr = poll(&pfd, 1, 5000);
        while (pr < 0 && errno == EINTR);
        ssize_t n = pr > 0 ? recv(fd, &m, sizeof m, MSG_DONTWAIT) : -1;
        if (n >= (ssize_t)offsetof(td_shmm_msg, name) && m.op == TD_SHMM_WELCOME && m.version == TD_SHMM_VERSION) {
            *out_fd = fd;
            *out_pid = (pid_t)m.pid;
            return TD_OK;
        }
        /* A daemon that is shutting down closes its connections: start or find another one. */
        st = error_fmt(TD_ERR_NOT_FOUND, "no response from tdist-shm-manager at \"@%s\"", sock_name);
    }
    close(fd);
    return st == TD_ERR_PEER_LOST ? error_fmt(TD_ERR_NOT_FOUND, "tdist-shm-manager at @%s went away", sock_name) : st;
}

static td_status connect_daemon(int *out_fd, pid_t *out_pid)
{
    char name[108];
    shmm_socket_name(name, sizeof name);
    int64_t deadline = deadline_after_ms(20000);
    int64_t restart_at = 0; /* when to start another daemon if none answered yet */
    int64_t delay_ms = 1;
    for (;;) {
        td_status st = try_connect(name, out_fd, out_pid);
        if (st != TD_ERR_NOT_FOUND)
            return st;
        /* A daemon that lost the race to bind, or that was exiting when we came, is replaced; one
         * that is still starting (slow under sanitizers) gets two seconds first. */
        if (clock_now_ns() >= restart_at) {
            TD_TRY(start_daemon(name));
            restart_at = clock_now_ns() + 2000 * 1000000LL;
        }
        if (deadline_passed(deadline))
            return error_fmt(TD_ERR_TIMEOUT, "no response from tdist-shm-manager at \"@%s\" (started, but it did not "
                                            "answer within 20 seconds)",
                            name);
        clock_sleep_ms(delay_ms);
        if (delay_ms < 32)
            delay_ms *= 2;
    }
}

td_status shmm_acquire(void)
{
    pthread_mutex_lock(&mu);
    while (connecting)
        pthread_cond_wait(&cv, &mu);
    if (conn_fd >= 0) {
        users++;
        pthread_mutex_unlock(&mu);
        return TD_OK;
    }
    connecting = true;
    pthread_mutex_unlock(&mu);
    int fd = -1;
    pid_t pid = 0;
    td_status st = connect_daemon(&fd, &pid);
    pthread_mutex_lock(&mu);
    connecting = false;
    if (st == TD_OK) {
        conn_fd = fd;
        daemon_pid = pid;
        users++;
        warned_lost = false;
    }
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return st;
}

void shmm_release(void)
{
    int fd = -1;
    pthread_mutex_lock(&mu);
    if (users > 0 && --users == 0) {
        fd = conn_fd;
        conn_fd = -1;
        daemon_pid = 0;
    }
    pthread_mutex_unlock(&mu);
    if (fd >= 0)
        close(fd);
}

void shmm_notify(int op, const char *name)
{
    pthread_mutex_lock(&mu);
    int fd = conn_fd;
    pthread_mutex_unlock(&mu);
    if (fd < 0)
        return;
    if (send_msg(fd, op, name) != TD_OK) {
        pthread_mutex_lock(&mu);
        bool warn = !warned_lost;
        warned_lost = true;
        pthread_mutex_unlock(&mu);
        if (warn)
            TD_LOG_WARN("lost the connection to tdist-shm-manager (%s): named shared-memory segments of this "
                        "process will not be cleaned up if it crashes",
                        td_last_error());
    }
}

pid_t shmm_daemon_pid(void)
{
    pthread_mutex_lock(&mu);
    pid_t p = daemon_pid;
    pthread_mutex_unlock(&mu);
    return p;
}
