/* The tdist-shm-manager daemon's bookkeeping (shm_manager.h, "daemon"): one client datagram
 * checked and applied to the per-client and global tables, a departed client's references
 * dropped, and the final sweep. The daemon (tools/tdist-shm-manager) owns the sockets and the
 * poll loop and calls these; fuzz/fuzz_shm_manager.c calls the same functions with datagrams of
 * its own, so what a stranger can send on the abstract socket is fuzzed without one.
 *
 * Trust: a client's pid is the kernel's (SO_PEERCRED), not the one its HELLO claims. A client may
 * hold (and so have dropped at its disconnect) only names it registered itself: HOLD is accepted
 * for a name that carries the client's own pid (it is the creator) or that the client's process
 * maps (/proc/<pid>/maps: it opened the segment); DROP only for a name the client holds; FORGET
 * only for a name that no longer exists. Anything else is refused with a log line and changes
 * nothing, so a stranger cannot make the daemon drop references it never held. */
#include "mp/shm_manager.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_REFUSAL_LOGS 8

static void slog(const shmm_server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void slog(const shmm_server *s, const char *fmt, ...)
{
    if (!s->log)
        return;
    char buf[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    s->log(buf);
}

/* Drops one reference on behalf of a departed client; removes the name at 0. */
static void drop_reference(shmm_server *s, const char *name)
{
    td_segment seg;
    if (segment_open(name, TD_SHM_HEADER_SIZE, &seg) != TD_OK)
        return; /* already gone */
    td_shm_header *h = seg.base;
    if (h->magic == TD_SHM_HEADER_MAGIC && shm_header_decref(h)) {
        segment_unlink(name);
        map_remove(&s->known, name, strlen(name));
        slog(s, "removed %s", name);
    }
    segment_unmap(&seg);
}

static void hold_add(shmm_client *c, const char *name, int delta)
{
    size_t len = strlen(name);
    intptr_t v = (intptr_t)(uintptr_t)map_get(&c->holds, name, len) + delta;
    if (v <= 0)
        map_remove(&c->holds, name, len);
    else
        map_put(&c->holds, name, len, (void *)(uintptr_t)v);
}

static void refuse(const shmm_server *s, shmm_client *c, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void refuse(const shmm_server *s, shmm_client *c, const char *fmt, ...)
{
    if (++c->refused > MAX_REFUSAL_LOGS)
        return;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    slog(s, "refused from client pid %d: %s", (int)c->pid, buf);
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

shmm_verdict shmm_server_message(shmm_server *s, shmm_client *c, const void *data, size_t n)
{
    /* A copy: the datagram's bytes need not be aligned, and only n of them are defined. */
    td_shmm_msg m;
    memset(&m, 0, sizeof m);
    memcpy(&m, data, n < sizeof m ? n : sizeof m);
    if (n < offsetof(td_shmm_msg, name) || n > sizeof m || m.version != TD_SHMM_VERSION ||
        m.name_len >= TD_SEGMENT_NAME_MAX || offsetof(td_shmm_msg, name) + m.name_len > n)
        return SHMM_CLOSE;
    char name[TD_SEGMENT_NAME_MAX];
    memcpy(name, m.name, m.name_len);
    name[m.name_len] = '\0';
    if (m.op == TD_SHMM_HELLO)
        return SHMM_WELCOME; /* the pid a HELLO claims is not trusted: c->pid came from the kernel */
    if (!segment_name_valid(name))
        return SHMM_CLOSE;
    switch (m.op) {
    case TD_SHMM_HOLD:
        /* The creator registers its name (which carries its pid) before creating it; any other
         * process sends HOLD after mapping the segment. */
        if (segment_name_pid(name) != c->pid && !process_maps(c->pid, name)) {
            refuse(s, c, "HOLD of %s, which it did not create and does not map", name);
            return SHMM_KEEP;
        }
        hold_add(c, name, 1);
        map_put(&s->known, name, strlen(name), (void *)1);
        return SHMM_KEEP;
    case TD_SHMM_DROP:
        if (!map_get(&c->holds, name, strlen(name))) {
            refuse(s, c, "DROP of %s, which it does not hold", name);
            return SHMM_KEEP;
        }
        hold_add(c, name, -1);
        return SHMM_KEEP;
    case TD_SHMM_FORGET:
        if (segment_exists(name)) {
            refuse(s, c, "FORGET of %s, which still exists", name);
            return SHMM_KEEP;
        }
        map_remove(&s->known, name, strlen(name));
        return SHMM_KEEP;
    default:
        return SHMM_CLOSE;
    }
}

void shmm_server_client_gone(shmm_server *s, shmm_client *c)
{
    td_map_entry *e;
    size_t n = 0;
    for (size_t it = 0; (e = map_next(&c->holds, &it));) {
        for (uintptr_t k = (uintptr_t)e->value; k > 0; k--)
            drop_reference(s, e->key);
        n += (uintptr_t)e->value;
    }
    if (n)
        slog(s, "client pid %d went away holding %zu references", (int)c->pid, n);
    if (c->refused > MAX_REFUSAL_LOGS)
        slog(s, "client pid %d: %u messages refused in all", (int)c->pid, c->refused);
    map_free(&c->holds, NULL);
    c->holds = (td_map)TD_MAP_INIT;
    c->refused = 0;
}

void shmm_server_sweep(shmm_server *s)
{
    td_map_entry *e;
    for (size_t it = 0; (e = map_next(&s->known, &it));) {
        if (segment_unlink(e->key) == TD_OK)
            slog(s, "removed %s (left by messages never received)", e->key);
    }
    map_free(&s->known, NULL);
    s->known = (td_map)TD_MAP_INIT;
}
