/* The per-rank leak check: open file descriptors and threads before and after a test body.
 *
 * DESIGN.md asks every test to leave no fd or thread behind. The harness snapshots /proc/self/fd
 * and /proc/self/task right before the body (after its own fds and listener thread exist) and
 * compares after it returns; anything new is a leak, named by its readlink target or thread name.
 * Threads and fds that are still being torn down get a short grace period. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/thread.h"
#include "testing/harness.h"

static void list_numbers(const char *dir, int **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    size_t cap = 0;
    DIR *d = opendir(dir);
    if (!d)
        return;
    int self = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        int v = atoi(e->d_name);
        if (v == self && strcmp(dir, "/proc/self/fd") == 0)
            continue;
        if (*count == cap) {
            cap = cap ? cap * 2 : 64;
            *out = alloc_resize(*out, cap * sizeof **out);
        }
        (*out)[(*count)++] = v;
    }
    closedir(d);
}

void leak_snapshot_take(td_leak_snapshot *s)
{
    list_numbers("/proc/self/fd", &s->fds, &s->nfds);
    int *tids;
    list_numbers("/proc/self/task", &tids, &s->ntids);
    s->tids = (pid_t *)tids;
}

int64_t leak_grace_ms(const td_test_case *c)
{
    int64_t ms = harness_timeout_ms(c) / 10;
    return ms < 200 ? 200 : ms > 2000 ? 2000 : ms;
}

void leak_snapshot_free(td_leak_snapshot *s)
{
    free(s->fds);
    free(s->tids);
    s->fds = NULL;
    s->tids = NULL;
    s->nfds = s->ntids = 0;
}

static bool contains(const int *v, size_t n, int x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

static char *describe(const td_leak_snapshot *before, const td_leak_snapshot *now)
{
    td_buf fds = TD_BUF_INIT, threads = TD_BUF_INIT;
    for (size_t i = 0; i < now->nfds; i++) {
        int fd = now->fds[i];
        if (contains(before->fds, before->nfds, fd))
            continue;
        char path[64], target[512];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof target - 1);
        target[n > 0 ? n : 0] = '\0';
        buf_printf(&fds, "%s%d -> %s", fds.len ? ", " : "", fd, n > 0 ? target : "?");
    }
    for (size_t i = 0; i < now->ntids; i++) {
        int tid = (int)now->tids[i];
        if (contains((const int *)before->tids, before->ntids, tid))
            continue;
        char name[64];
        thread_name_of(tid, name, sizeof name);
        buf_printf(&threads, "%s%d (%s)", threads.len ? ", " : "", tid, name);
    }
    if (!fds.len && !threads.len)
        return NULL;
    td_buf msg = TD_BUF_INIT;
    if (fds.len)
        buf_printf(&msg, "Test leaked file descriptors: %s (close them before the test returns, or set "
                            ".no_leak_check)", fds.data);
    if (threads.len)
        buf_printf(&msg, "%sTest leaked threads: %s (join them before the test returns, or set "
                            ".no_leak_check)", msg.len ? "\n" : "", threads.data);
    buf_free(&fds);
    buf_free(&threads);
    return buf_steal(&msg);
}

char *leak_check(const td_leak_snapshot *before, int64_t grace_ms)
{
    int64_t deadline = clock_now_ns() + grace_ms * 1000000;
    for (int64_t sleep_ms = 1;; sleep_ms = sleep_ms < 50 ? sleep_ms * 2 : 50) {
        td_leak_snapshot now;
        leak_snapshot_take(&now);
        char *msg = describe(before, &now);
        leak_snapshot_free(&now);
        if (!msg || clock_now_ns() >= deadline)
            return msg;
        free(msg);
        clock_sleep_ms(sleep_ms);
    }
}
