/* Helpers shared by the shm tests (shm_util.h). */
#include "shm_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"

/* FileStore is opened as "never removed"; rank 0 removes it once every rank let go (markers). */
td_store *shm_test_open_store(const char *path)
{
    td_store *s = NULL;
    TD_CHECK_OK(td_file_store_create(path, -1, &s));
    return s;
}

void shm_test_close_store(const td_test_ctx *ctx, td_store *s, const char *path)
{
    td_store_release(s);
    char mark[1100];
    if (ctx->rank != 0) {
        snprintf(mark, sizeof mark, "%s.released.%d", path, ctx->rank);
        int fd = open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        if (fd >= 0)
            close(fd);
        return;
    }
    for (int r = 1; r < ctx->world_size; r++) {
        snprintf(mark, sizeof mark, "%s.released.%d", path, r);
        for (int i = 0; i < 60000 && access(mark, F_OK) != 0; i++)
            td_sleep_ms(1);
        unlink(mark);
    }
    unlink(path);
}

void shm_test_barrier(const td_test_ctx *ctx, td_store *store, const char *name)
{
    char key[64], keys[8][64];
    const char *kp[8];
    snprintf(key, sizeof key, "%s/%d", name, ctx->rank);
    TD_CHECK_OK(td_store_set_str(store, key, "1"));
    for (int r = 0; r < ctx->world_size; r++) {
        snprintf(keys[r], sizeof keys[r], "%s/%d", name, r);
        kp[r] = keys[r];
    }
    TD_CHECK_OK(td_store_wait(store, kp, (size_t)ctx->world_size, 60000));
}

int64_t shm_test_after_ms(int64_t ms) { return td_now_ns() + ms * 1000000; }
double shm_test_since_s(int64_t t0) { return (double)(td_now_ns() - t0) / 1e9; }

shm_world shm_test_open(td_test_ctx *ctx, int64_t timeout_ms)
{
    shm_world w = {0};
    w.ctx = ctx;
    w.store = shm_test_open_store(ctx->store_path);
    td_shm_options o = {
        .setup.store = w.store,
        .setup.rank = ctx->rank,
        .setup.size = ctx->world_size,
        .setup.timeout_ms = timeout_ms ? timeout_ms : 30000,
        .setup.group_name = "test",
    };
    TD_CHECK_OK(td_shm_transport_create(&o, &w.t));
    TD_CHECK(td_transport_is_shm(w.t));
    TD_CHECK_EQ(w.t->rank, ctx->rank);
    TD_CHECK_EQ(w.t->size, ctx->world_size);
    shm_test_no_segments();
    return w;
}

void shm_test_close(shm_world *w)
{
    td_transport_destroy(w->t);
    if (w->keep_store)
        td_store_release(w->store);
    else
        shm_test_close_store(w->ctx, w->store, w->ctx->store_path);
}

unsigned char shm_test_pattern(int from, int to, size_t i)
{
    return (unsigned char)(from * 31 + to * 7 + i * 13 + (i >> 9));
}

void shm_test_all_pairs(const td_test_ctx *ctx, td_transport *t, size_t len)
{
    int n = ctx->world_size, me = ctx->rank;
    unsigned char *out = malloc(len + 1), *in = malloc((len + 1) * (size_t)n);
    td_xfer xs[16];
    int k = 0;
    for (size_t i = 0; i < len; i++)
        out[i] = shm_test_pattern(me, 0, i);
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        xs[k].on_done = NULL;
        TD_CHECK_OK(td_transport_irecv1(t, p, 42, in + (size_t)p * (len + 1), len, shm_test_after_ms(30000), &xs[k++]));
        xs[k].on_done = NULL;
        TD_CHECK_OK(td_transport_isend1(t, p, 42, out, len, shm_test_after_ms(30000), &xs[k++]));
    }
    TD_CHECK_OK(td_transport_wait_all(t, xs, k, shm_test_after_ms(30000)));
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        for (size_t i = 0; i < len; i++)
            TD_CHECK_MSG(in[(size_t)p * (len + 1) + i] == shm_test_pattern(p, 0, i), "byte %zu from rank %d is wrong",
                         i, p);
    }
    for (int i = 0; i < k; i += 2)
        TD_CHECK_EQ(xs[i].peer, i / 2 + (i / 2 >= me));
    free(out);
    free(in);
}

void shm_test_no_segments(void)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "tdist.%d.", (int)getpid());
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
            char name[256];
            snprintf(name, sizeof name, "%s", e->d_name);
            closedir(d);
            TD_FAIL("/dev/shm/%s is left behind", name);
        }
    }
    closedir(d);
}

void shm_test_one_core(void)
{
    cpu_set_t set;
    TD_CHECK(sched_getaffinity(0, sizeof set, &set) == 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
        if (CPU_ISSET(c, &set))
            first = c;
    CPU_ZERO(&set);
    CPU_SET(first, &set);
    TD_CHECK(sched_setaffinity(0, sizeof set, &set) == 0);
}
