/* The mp leak checker (tdist/mp.h, td_mp_leak_checker_*): PyTorch's leak_checker for C tests.
 * It snapshots this process's open fds and its shared-memory mappings (/proc/self/maps lines of
 * /dev/shm files, deleted or not) and, at the end, compares them again and looks in /dev/shm for
 * "tdist.<pid>." entries of this process and of every tracked child (matching the trailing dot,
 * so pid 12 does not match 123). The file_system strategy frees asynchronously in the worst case
 * (the daemon), so the end polls every 0.5 s up to the caller's wait. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/mp.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/vec.h"

typedef TD_VEC(int) fd_list;

struct td_mp_leak_checker {
    fd_list fds;
    int maps;
    TD_VEC(pid_t) pids;
};

static void list_fds(fd_list *out)
{
    out->len = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return;
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        int fd = atoi(e->d_name);
        if (fd != self)
            TD_VEC_PUSH(out, fd);
    }
    closedir(d);
}

static int count_maps(td_buf *lines)
{
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f)
        return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "/dev/shm/")) {
            n++;
            if (lines)
                buf_append_str(lines, line);
        }
    }
    fclose(f);
    return n;
}

td_status td_mp_leak_checker_begin(td_mp_leak_checker **out)
{
    td_mp_leak_checker *lc = TD_NEW(td_mp_leak_checker);
    list_fds(&lc->fds);
    lc->maps = count_maps(NULL);
    TD_VEC_PUSH(&lc->pids, getpid());
    *out = lc;
    return TD_OK;
}

void td_mp_leak_checker_track(td_mp_leak_checker *lc, pid_t pid)
{
    if (lc && pid > 0)
        TD_VEC_PUSH(&lc->pids, pid);
}

static bool has_fd(const int *fds, size_t n, int fd)
{
    for (size_t i = 0; i < n; i++)
        if (fds[i] == fd)
            return true;
    return false;
}

/* Appends what leaked to out; true when nothing did. */
static bool check(td_mp_leak_checker *lc, td_buf *out)
{
    bool clean = true;
    fd_list now = {0};
    list_fds(&now);
    for (size_t i = 0; i < now.len; i++) {
        if (has_fd(lc->fds.items, lc->fds.len, now.items[i]))
            continue;
        char path[64], target[512];
        snprintf(path, sizeof path, "/proc/self/fd/%d", now.items[i]);
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        buf_printf(out, "  fd %d -> %s was opened and not closed\n", now.items[i], target);
        clean = false;
    }
    for (size_t i = 0; i < lc->fds.len; i++) {
        if (!has_fd(now.items, now.len, lc->fds.items[i])) {
            buf_printf(out, "  fd %d was open before and is closed now (closed twice?)\n", lc->fds.items[i]);
            clean = false;
        }
    }
    TD_VEC_FREE(&now);
    td_buf maps = TD_BUF_INIT;
    int m = count_maps(&maps);
    if (m != lc->maps) {
        buf_printf(out, "  %d shared-memory mappings instead of %d:\n%s", m, lc->maps, maps.data ? maps.data : "");
        clean = false;
    }
    buf_free(&maps);
    DIR *d = opendir("/dev/shm");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            for (size_t i = 0; i < lc->pids.len; i++) {
                char prefix[32];
                int n = snprintf(prefix, sizeof prefix, "tdist.%d.", (int)lc->pids.items[i]);
                if (strncmp(e->d_name, prefix, (size_t)n) == 0) {
                    buf_printf(out, "  /dev/shm/%s (made by pid %d) is still there\n", e->d_name,
                                  (int)lc->pids.items[i]);
                    clean = false;
                }
            }
        }
        closedir(d);
    }
    return clean;
}

td_status td_mp_leak_checker_end(td_mp_leak_checker *lc, int64_t wait_ms)
{
    if (!lc)
        return error_fmt(TD_ERR_INVALID, "td_mp_leak_checker_end: checker is NULL");
    int64_t deadline = clock_now_ns() + (wait_ms > 0 ? wait_ms : 0) * 1000000;
    td_buf report = TD_BUF_INIT;
    bool clean;
    for (;;) {
        buf_clear(&report);
        clean = check(lc, &report);
        if (clean || clock_now_ns() >= deadline)
            break;
        clock_sleep_ms(500);
    }
    td_status st = clean ? TD_OK
                         : error_fmt(TD_ERR_INTERNAL, "leak check failed after waiting %lld ms:\n%s", (long long)wait_ms,
                                    report.data);
    buf_free(&report);
    TD_VEC_FREE(&lc->fds);
    TD_VEC_FREE(&lc->pids);
    free(lc);
    return st;
}
