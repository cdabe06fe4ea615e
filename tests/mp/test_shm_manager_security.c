/* tdist-shm-manager against local strangers (issue 23, item 4): a real daemon on a socket of this
 * test's own, spoken to over real sockets. A client that never registered a segment sends the
 * messages of the attack (HOLD five times, DROP, FORGET) for another client's segment and
 * disconnects: the segment survives, and goes only when its owner lets go; a process that opened
 * the segment still has its reference dropped when it dies; a client of another uid is refused at
 * accept (root only: the test connects as nobody). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/testing.h>

#include "base/clock.h"
#include "mp/shm_manager.h"
#include "tensor/segment.h"

typedef struct daemon_run {
    char sock[64];
    char log[128];
    pid_t pid;
} daemon_run;

static void daemon_start(daemon_run *d, const char *tag)
{
#ifndef SHMM_PATH
    (void)d;
    (void)tag;
    TD_SKIP(TD_SKIP_GENERIC, "tdist-shm-manager is not built (TDIST_BUILD_TOOLS=OFF)");
#else
    snprintf(d->sock, sizeof d->sock, "tdist-test-shmm-sec.%d.%s", (int)getpid(), tag);
    snprintf(d->log, sizeof d->log, "/tmp/tdist-test-shmm-sec.%d.%s.log", (int)getpid(), tag);
    unlink(d->log);
    d->pid = fork();
    TD_CHECK(d->pid >= 0);
    if (d->pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0)
            dup2(fd, 2);
        setenv("TDIST_SHM_MANAGER_IDLE_MS", "60000", 1);
        const char *prog = getenv("TDIST_SHM_MANAGER"); /* another build of the daemon */
        if (!prog || !*prog)
            prog = SHMM_PATH;
        execl(prog, prog, "--socket", d->sock, (char *)NULL);
        _exit(127);
    }
#endif
}

static void daemon_stop(daemon_run *d)
{
    kill(d->pid, SIGTERM);
    int st;
    waitpid(d->pid, &st, 0);
    unlink(d->log);
}

static bool log_contains(const daemon_run *d, const char *needle)
{
    char buf[65536];
    FILE *f = fopen(d->log, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

static bool wait_log(const daemon_run *d, const char *needle, int ms)
{
    int64_t deadline = deadline_after_ms(ms);
    while (!log_contains(d, needle) && !deadline_passed(deadline))
        clock_sleep_ms(10);
    return log_contains(d, needle);
}

static int send_op(int fd, int op, const char *name)
{
    td_shmm_msg m;
    memset(&m, 0, sizeof m);
    m.op = (uint8_t)op;
    m.version = TD_SHMM_VERSION;
    m.pid = (uint32_t)getpid();
    size_t n = name ? strlen(name) : 0;
    memcpy(m.name, name ? name : "", n);
    m.name_len = (uint16_t)n;
    return send(fd, &m, offsetof(td_shmm_msg, name) + n, MSG_NOSIGNAL) < 0 ? -1 : 0;
}

/* HELLO and its WELCOME: everything sent before on fd has been handled. 0, or -1 when the daemon
 * closed the connection or did not answer. */
static int hello(int fd)
{
    if (send_op(fd, TD_SHMM_HELLO, NULL) != 0)
        return -1;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 10000) <= 0)
        return -1;
    td_shmm_msg m;
    ssize_t n = recv(fd, &m, sizeof m, 0);
    return n >= (ssize_t)offsetof(td_shmm_msg, name) && m.op == TD_SHMM_WELCOME ? 0 : -1;
}

/* A connection that said hello; -1 when the daemon did not take it within 10 s. */
static int connect_daemon(const daemon_run *d)
{
    int64_t deadline = deadline_after_ms(10000);
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        struct sockaddr_un a;
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        size_t n = strlen(d->sock);
        memcpy(a.sun_path + 1, d->sock, n);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n)) == 0)
            return hello(fd) == 0 ? fd : (close(fd), -1);
        if (fd >= 0)
            close(fd);
        if (deadline_passed(deadline))
            return -1;
        clock_sleep_ms(10);
    }
}

/* The segment's refcount, -1 when the name does not exist. */
static int refcount_of(const char *name)
{
    td_segment seg;
    if (segment_open(name, TD_SHM_HEADER_SIZE, &seg) != TD_OK)
        return -1;
    int r = atomic_load(&((td_shm_header *)seg.base)->refcount);
    segment_unmap(&seg);
    return r;
}

static bool wait_refcount(const char *name, int want, int ms)
{
    int64_t deadline = deadline_after_ms(ms);
    while (refcount_of(name) != want && !deadline_passed(deadline))
        clock_sleep_ms(10);
    return refcount_of(name) == want;
}

static int wait_child(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A client that registers and creates a segment the way share.c does (HOLD before creating,
 * refcount 1), reports its name on `out`, then dies without releasing anything when `go` closes. */
static pid_t start_owner(const daemon_run *d, int out, const int go[2])
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    close(go[1]);
    int fd = connect_daemon(d);
    if (fd < 0)
        _exit(2);
    char name[TD_SEGMENT_NAME_MAX];
    segment_make_name(name, "fs");
    send_op(fd, TD_SHMM_HOLD, name);
    td_segment seg;
    if (segment_create_as(name, TD_SHM_HEADER_SIZE + 64, false, false, &seg) != TD_OK)
        _exit(3);
    td_shm_header *h = seg.base;
    h->magic = TD_SHM_HEADER_MAGIC;
    h->nbytes = 64;
    atomic_store(&h->refcount, 1);
    if (hello(fd) != 0 || write(out, name, sizeof name) != (ssize_t)sizeof name)
        _exit(4);
    char c;
    while (read(go[0], &c, 1) < 0 && errno == EINTR)
        ;
    _exit(0); /* like a crash: the daemon drops the reference */
}

/* A process that never registered `name` sends the attack's messages for it, then disconnects. */
static pid_t start_stranger(const daemon_run *d, const char *name, bool drops)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = connect_daemon(d);
    if (fd < 0)
        _exit(2);
    for (int i = 0; i < 5; i++)
        send_op(fd, drops ? TD_SHMM_DROP : TD_SHMM_HOLD, name);
    if (drops)
        send_op(fd, TD_SHMM_FORGET, name);
    _exit(hello(fd) == 0 ? 0 : 5);
}

/* A process that opens the segment (taking a reference) and tells the daemon, then dies. */
static pid_t start_reader(const daemon_run *d, const char *name)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    int fd = connect_daemon(d);
    td_segment seg;
    if (fd < 0 || segment_open(name, TD_SHM_HEADER_SIZE, &seg) != TD_OK)
        _exit(2);
    shm_header_incref(seg.base);
    send_op(fd, TD_SHMM_HOLD, name);
    _exit(hello(fd) == 0 ? 0 : 5); /* dies mapping it, holding one reference */
}

TD_TEST(stranger_cannot_release_anothers_segment, .timeout_s = 120)
{
    daemon_run d;
    daemon_start(&d, "stranger");
    int out[2], go[2];
    TD_CHECK(pipe(out) == 0 && pipe(go) == 0);
    pid_t owner = start_owner(&d, out[1], go);
    close(out[1]);
    close(go[0]);
    char name[TD_SEGMENT_NAME_MAX];
    TD_CHECK_EQ(read(out[0], name, sizeof name), (ssize_t)sizeof name);
    TD_CHECK_EQ(refcount_of(name), 1);

    /* The attack: five HOLDs, disconnect; then five DROPs and a FORGET, disconnect. */
    pid_t s1 = start_stranger(&d, name, false);
    TD_CHECK_EQ(wait_child(s1), 0);
    pid_t s2 = start_stranger(&d, name, true);
    TD_CHECK_EQ(wait_child(s2), 0);
    /* A new client's WELCOME: the daemon has handled both strangers' disconnects (it handles
     * hang-ups before accepting in each round). A normal client still gets in. */
    int me = connect_daemon(&d);
    TD_CHECK(me >= 0);
    TD_CHECK_EQ(refcount_of(name), 1);
    char line[256];
    snprintf(line, sizeof line, "refused from client pid %d: HOLD of %s", (int)s1, name);
    TD_CHECK_MSG(log_contains(&d, line), "no log line \"%s\"", line);
    snprintf(line, sizeof line, "refused from client pid %d: DROP of %s", (int)s2, name);
    TD_CHECK_MSG(log_contains(&d, line), "no log line \"%s\"", line);
    snprintf(line, sizeof line, "refused from client pid %d: FORGET of %s", (int)s2, name);
    TD_CHECK_MSG(log_contains(&d, line), "no log line \"%s\"", line);

    /* A process that did open it still has its reference dropped when it dies. */
    pid_t r = start_reader(&d, name);
    TD_CHECK_EQ(wait_child(r), 0);
    TD_CHECK_MSG(wait_refcount(name, 1, 10000), "refcount %d after the reader died, want 1", refcount_of(name));
    snprintf(line, sizeof line, "client pid %d went away holding 1 references", (int)r);
    TD_CHECK_MSG(wait_log(&d, line, 10000), "no log line \"%s\"", line);

    /* A normal client's own segment: registered, created, released in order, with no refusal. */
    char mine[TD_SEGMENT_NAME_MAX];
    segment_make_name(mine, "fs");
    TD_CHECK_EQ(send_op(me, TD_SHMM_HOLD, mine), 0);
    td_segment seg;
    TD_CHECK_OK(segment_create_as(mine, TD_SHM_HEADER_SIZE + 64, false, false, &seg));
    ((td_shm_header *)seg.base)->magic = TD_SHM_HEADER_MAGIC;
    atomic_store(&((td_shm_header *)seg.base)->refcount, 1);
    TD_CHECK_EQ(send_op(me, TD_SHMM_DROP, mine), 0);
    TD_CHECK(shm_header_decref(seg.base));
    segment_unlink(mine);
    segment_unmap(&seg);
    TD_CHECK_EQ(send_op(me, TD_SHMM_FORGET, mine), 0);
    TD_CHECK_EQ(hello(me), 0);
    snprintf(line, sizeof line, "refused from client pid %d", (int)getpid());
    TD_CHECK_MSG(!log_contains(&d, line), "the daemon refused a well-behaved client");

    /* Still there; gone once its owner lets go (here: dies holding it). */
    TD_CHECK_EQ(refcount_of(name), 1);
    close(go[1]);
    TD_CHECK_EQ(wait_child(owner), 0);
    TD_CHECK_MSG(wait_refcount(name, -1, 10000), "%s still exists after its owner died", name);
    snprintf(line, sizeof line, "removed %s", name);
    TD_CHECK_MSG(wait_log(&d, line, 10000), "no log line \"%s\"", line);
    close(me);
    close(out[0]);
    daemon_stop(&d);
}

TD_TEST(refuses_other_uid, .timeout_s = 60)
{
    if (geteuid() != 0)
        TD_SKIP(TD_SKIP_GENERIC, "the uid check needs a client of another uid: only root can switch to nobody "
                                 "(setresuid) for it, and this test does not run as root");
    daemon_run d;
    daemon_start(&d, "uid");
    int me = connect_daemon(&d); /* the daemon is up */
    TD_CHECK(me >= 0);
    pid_t c = fork();
    TD_CHECK(c >= 0);
    if (c == 0) {
        if (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 || setresuid(65534, 65534, 65534) != 0)
            _exit(3);
        int fd = connect_daemon(&d);
        _exit(fd < 0 ? 0 : 1); /* 0: refused */
    }
    TD_CHECK_EQ(wait_child(c), 0);
    char line[128];
    snprintf(line, sizeof line, "refused a client: pid %d runs as uid 65534", (int)c);
    TD_CHECK_MSG(wait_log(&d, line, 10000), "no log line \"%s\"", line);
    TD_CHECK_EQ(hello(me), 0); /* and this one is still served */
    close(me);
    daemon_stop(&d);
}

TD_TEST_MAIN()
