/* tdist-shm-manager: removes the named shared-memory segments (file_system sharing strategy) that
 * crashed processes leave behind, then exits when its last client has gone.
 *
 * Started on demand by the first process that creates a named segment (src/mp/shm_manager_client.c),
 * in its own session with stdio on /dev/null. It listens on an abstract Unix socket
 * (SOCK_SEQPACKET; shm_manager.h and docs/protocols.md, "shm manager") and keeps, per client
 * connection, how many references the client holds on each name. A connection that closes while
 * it still holds references belonged to a process that died (a live one closes only when it holds
 * nothing): the daemon drops those references in the segments' refcount headers, removing the
 * names that reach 0. Names whose references all went to messages that were never received are
 * remembered; once no client is connected for TDIST_SHM_MANAGER_IDLE_MS (default 2000) the daemon
 * removes every name it still knows and exits. One daemon per socket name: a second one finds the
 * name taken and exits at once.
 *
 * Trust: the socket is abstract (no file permissions), so the daemon checks each client's
 * credentials (SO_PEERCRED) at accept and closes, with one log line, a client whose uid is not its
 * own. What a client may then hold, drop and forget is checked by the bookkeeping in
 * src/mp/shm_manager_server.c (shm_manager.h, "daemon"), which this loop calls with each datagram.
 *
 * Usage: tdist-shm-manager [--socket NAME]   (default: tdist-shm-manager.v1.<uid>) */
#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/map.h"
#include "base/vec.h"
#include "tensor/segment.h"
#include "mp/shm_manager.h"

static TD_VEC(shmm_client *) clients;

static void log_line(const char *line) { fprintf(stderr, "[tdist-shm-manager %d] %s\n", (int)getpid(), line); }

static shmm_server server = {.known = TD_MAP_INIT, .log = log_line};

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_line(buf);
}

static void client_close(size_t i)
{
    shmm_client *c = clients.items[i];
    shmm_server_client_gone(&server, c);
    close(c->fd);
    free(c);
    TD_VEC_SWAP_REMOVE(&clients, i);
}

/* Handles one datagram; false when the client must be dropped. */
static bool client_message(shmm_client *c, const td_shmm_msg *m, size_t n)
{
    shmm_verdict v = shmm_server_message(&server, c, m, n);
    if (v == SHMM_WELCOME) {
        td_shmm_msg w;
        memset(&w, 0, sizeof w);
        w.op = TD_SHMM_WELCOME;
        w.version = TD_SHMM_VERSION;
        w.pid = (uint32_t)getpid();
        return send(c->fd, &w, offsetof(td_shmm_msg, name), MSG_NOSIGNAL | MSG_DONTWAIT) >= 0;
    }
    return v == SHMM_KEEP;
}

int main(int argc, char **argv)
{
    char name[108];
    shmm_socket_name(name, sizeof name);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--socket") == 0 && i + 1 < argc) {
            snprintf(name, sizeof name, "%s", argv[++i]);
        } else {
            fprintf(stderr, "usage: %s [--socket NAME]\n", argv[0]);
            return 2;
        }
    }
    int64_t idle_ms = 2000;
    if (env_get_duration_ms("TDIST_SHM_MANAGER_IDLE_MS", 2000, 1, &idle_ms) != TD_OK)
        idle_ms = 2000;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, SIG_IGN); /* a Ctrl-C meant for the job must not take cleanup down with it */

    int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    size_t nlen = strnlen(name, sizeof a.sun_path - 1);
    memcpy(a.sun_path + 1, name, nlen);
    socklen_t alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nlen);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, alen) != 0) {
        if (errno == EADDRINUSE)
            return 0; /* another daemon serves this name */
        logf_("cannot bind @%s: %s", name, strerror(errno));
        return 1;
    }
    if (listen(lfd, 128) != 0) {
        logf_("cannot listen on @%s: %s", name, strerror(errno));
        return 1;
    }
    logf_("listening on @%s", name);
    int64_t idle_since = clock_now_ns();
    TD_VEC(struct pollfd) pfds = {0};
    for (;;) {
        pfds.len = 0;
        TD_VEC_PUSH(&pfds, ((struct pollfd){.fd = lfd, .events = POLLIN}));
        for (size_t i = 0; i < clients.len; i++)
            TD_VEC_PUSH(&pfds, ((struct pollfd){.fd = clients.items[i]->fd, .events = POLLIN}));
        int timeout = -1;
        if (clients.len == 0) {
            int64_t left = idle_ms - (clock_now_ns() - idle_since) / 1000000;
            if (left <= 0)
                break;
            timeout = (int)left;
        }
        int r = poll(pfds.items, pfds.len, timeout);
        if (r < 0 && errno != EINTR) {
            logf_("poll: %s", strerror(errno));
            break;
        }
        if (r <= 0)
            continue;
        /* Clients first (indices match pfds[1..]), backwards so removal keeps the rest in place. */
        for (size_t i = clients.len; i-- > 0;) {
            short re = pfds.items[i + 1].revents;
            if (!re)
                continue;
            shmm_client *c = clients.items[i];
            bool keep = true;
            for (;;) {
                td_shmm_msg m;
                ssize_t n = recv(c->fd, &m, sizeof m, MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                    break;
                if (n <= 0 || !client_message(c, &m, (size_t)n)) {
                    keep = false;
                    break;
                }
            }
            if (!keep) {
                client_close(i);
                if (clients.len == 0)
                    idle_since = clock_now_ns();
            }
        }
        if (pfds.items[0].revents & POLLIN) {
            int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
            if (cfd >= 0) {
                struct ucred cred;
                socklen_t clen = sizeof cred;
                if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || clen != sizeof cred) {
                    logf_("refused a client: no peer credentials (%s)", strerror(errno));
                    close(cfd);
                } else if (cred.uid != geteuid()) {
                    logf_("refused a client: pid %d runs as uid %u, not this daemon's uid %u", (int)cred.pid,
                          (unsigned)cred.uid, (unsigned)geteuid());
                    close(cfd);
                } else {
                    shmm_client *c = calloc(1, sizeof *c);
                    c->fd = cfd;
                    c->pid = cred.pid;
                    TD_VEC_PUSH(&clients, c);
                }
            }
        }
    }
    /* Stop taking clients first: one that comes now finds no listener and starts a new daemon. */
    close(lfd);
    while (clients.len)
        client_close(clients.len - 1);
    shmm_server_sweep(&server);
    TD_VEC_FREE(&clients);
    TD_VEC_FREE(&pfds);
    logf_("no clients for %lld ms: exiting", (long long)idle_ms);
    return 0;
}
