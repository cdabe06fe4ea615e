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
 * own. A client's pid is the kernel's (SO_PEERCRED), not the one its HELLO claims. A client may
 * hold (and so have dropped at its disconnect) only names it registered itself: HOLD is accepted
 * for a name that carries the client's own pid (it is the creator) or that the client's process
 * maps (/proc/<pid>/maps: it opened the segment); DROP only for a name the client holds; FORGET
 * only for a name that no longer exists. Anything else is refused with a log line and changes
 * nothing, so a stranger cannot make the daemon drop references it never held.
 *
 * Usage: tdist-shm-manager [--socket NAME]   (default: tdist-shm-manager.v1.<uid>) */
#include <errno.h>
#include <stdarg.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/map.h"
#include "base/vec.h"
#include "tensor/segment.h"
#include "mp/shm_manager.h"

typedef struct client {
    int fd;
    pid_t pid; /* from SO_PEERCRED at accept */
    td_map holds; /* name -> (uintptr_t) references held */
    unsigned refused; /* messages refused (logged one by one up to MAX_REFUSAL_LOGS) */
} client;

#define MAX_REFUSAL_LOGS 8

static TD_VEC(client *) clients;
static td_map known; /* every name some client held and that may still exist -> (void *)1 */

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(buf, sizeof buf, "[tdist-shm-manager %d] ", (int)getpid());
    vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", buf);
}

/* Drops one reference on behalf of a dead client; removes the name at 0. */
static void drop_reference(const char *name)
{
    td_segment seg;
    if (segment_open(name, TD_SHM_HEADER_SIZE, &seg) != TD_OK)
        return; /* already gone */
    td_shm_header *h = seg.base;
    if (h->magic == TD_SHM_HEADER_MAGIC && shm_header_decref(h)) {
        segment_unlink(name);
        map_remove(&known, name, strlen(name));
        logf_("removed %s", name);
    }
    segment_unmap(&seg);
}

static void client_close(size_t i)
{
    client *c = clients.items[i];
    td_map_entry *e;
    size_t n = 0;
    for (size_t it = 0; (e = map_next(&c->holds, &it));) {
        for (uintptr_t k = (uintptr_t)e->value; k > 0; k--)
            drop_reference(e->key);
        n += (uintptr_t)e->value;
    }
    if (n)
        logf_("client pid %d went away holding %zu references", (int)c->pid, n);
    if (c->refused > MAX_REFUSAL_LOGS)
        logf_("client pid %d: %u messages refused in all", (int)c->pid, c->refused);
    map_free(&c->holds, NULL);
    close(c->fd);
    free(c);
    TD_VEC_SWAP_REMOVE(&clients, i);
}

static void hold_add(client *c, const char *name, int delta)
{
    size_t len = strlen(name);
    intptr_t v = (intptr_t)(uintptr_t)map_get(&c->holds, name, len) + delta;
    if (v <= 0)
        map_remove(&c->holds, name, len);
    else
        map_put(&c->holds, name, len, (void *)(uintptr_t)v);
}

static void refuse(client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void refuse(client *c, const char *fmt, ...)
{
    if (++c->refused > MAX_REFUSAL_LOGS)
        return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    logf_("refused from client pid %d: %s", (int)c->pid, buf);
}

/* Whether process pid maps the segment `name` (/proc/<pid>/maps shows /dev/shm/<name>, possibly
 * "(deleted)"). */
static bool process_maps(pid_t pid, const char *name)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    char want[TD_SEGMENT_NAME_MAX + 16];
    int wlen = snprintf(want, sizeof want, "/dev/shm/%s", name);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, want);
        if (p && (p[wlen] == '\n' || p[wlen] == ' ' || p[wlen] == '\0'))
            found = true;
    }
    fclose(f);
    return found;
}

/* Whether the name exists in /dev/shm. */
static bool segment_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
        close(fd);
        return true;
    }
    return errno != ENOENT;
}

/* Handles one datagram; false when the client must be dropped. */
static bool client_message(client *c, const td_shmm_msg *m, ssize_t n)
{
    if (n < (ssize_t)offsetof(td_shmm_msg, name) || m->version != TD_SHMM_VERSION || m->name_len >= TD_SEGMENT_NAME_MAX ||
        (ssize_t)(offsetof(td_shmm_msg, name) + m->name_len) > n)
        return false;
    char name[TD_SEGMENT_NAME_MAX];
    memcpy(name, m->name, m->name_len);
    name[m->name_len] = '\0';
    if (m->op == TD_SHMM_HELLO) {
        /* The pid a HELLO claims is not trusted: c->pid came from the kernel. */
        td_shmm_msg w;
        memset(&w, 0, sizeof w);
        w.op = TD_SHMM_WELCOME;
        w.version = TD_SHMM_VERSION;
        w.pid = (uint32_t)getpid();
        return send(c->fd, &w, offsetof(td_shmm_msg, name), MSG_NOSIGNAL | MSG_DONTWAIT) >= 0;
    }
    if (!segment_name_valid(name))
        return false;
    switch (m->op) {
    case TD_SHMM_HOLD:
        /* The creator registers its name (which carries its pid) before creating it; any other
         * process sends HOLD after mapping the segment. */
        if (segment_name_pid(name) != c->pid && !process_maps(c->pid, name)) {
            refuse(c, "HOLD of %s, which it did not create and does not map", name);
            return true;
        }
        hold_add(c, name, 1);
        map_put(&known, name, strlen(name), (void *)1);
        return true;
    case TD_SHMM_DROP:
        if (!map_get(&c->holds, name, strlen(name))) {
            refuse(c, "DROP of %s, which it does not hold", name);
            return true;
        }
        hold_add(c, name, -1);
        return true;
    case TD_SHMM_FORGET:
        if (segment_exists(name)) {
            refuse(c, "FORGET of %s, which still exists", name);
            return true;
        }
        map_remove(&known, name, strlen(name));
        return true;
    default:
        return false;
    }
}

static void sweep(void)
{
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&known, &it));) {
        if (segment_unlink(e->key) == TD_OK)
            logf_("removed %s (left by messages never received)", e->key);
    }
    map_free(&known, NULL);
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
            client *c = clients.items[i];
            bool keep = true;
            for (;;) {
                td_shmm_msg m;
                ssize_t n = recv(c->fd, &m, sizeof m, MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                    break;
                if (n <= 0 || !client_message(c, &m, n)) {
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
                    client *c = calloc(1, sizeof *c);
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
    sweep();
    TD_VEC_FREE(&clients);
    TD_VEC_FREE(&pfds);
    logf_("no clients for %lld ms: exiting", (long long)idle_ms);
    return 0;
}
