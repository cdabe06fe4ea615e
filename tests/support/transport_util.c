/* Test support shared by the transport, collective and shm tests (transport_util.h). The cases
 * are the tcp and shm transport tests' common bodies, moved here unchanged in what they assert;
 * the test files keep what only their transport does. */
#include "transport_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "transport/match.h"

/* ---- stores, time, bytes ------------------------------------------------------------------------ */

td_store *tu_store_open(const char *path)
{
    td_store *s = NULL;
    TD_CHECK_OK(td_file_store_create(path, -1, &s));
    return s;
}

void tu_store_close(const td_test_ctx *ctx, td_store *s, const char *path)
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
            clock_sleep_ms(1);
        unlink(mark);
    }
    unlink(path);
}

void tu_barrier(const td_test_ctx *ctx, td_store *store, const char *name)
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

int64_t tu_after_ms(int64_t ms) { return clock_now_ns() + ms * 1000000; }
double tu_since_s(int64_t t0) { return (double)(clock_now_ns() - t0) / 1e9; }

unsigned char tu_pattern(int from, int to, size_t i)
{
    return (unsigned char)(from * 31 + to * 7 + i * 13 + (i >> 9));
}

void tu_all_pairs(const td_test_ctx *ctx, td_transport *t, size_t len)
{
    int n = ctx->world_size, me = ctx->rank;
    unsigned char *out = malloc(len + 1), *in = malloc((len + 1) * (size_t)n);
    td_xfer xs[16];
    int k = 0;
    for (size_t i = 0; i < len; i++)
        out[i] = tu_pattern(me, 0, i);
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        xs[k].on_done = NULL;
        TD_CHECK_OK(transport_irecv1(t, p, 42, in + (size_t)p * (len + 1), len, tu_after_ms(30000), &xs[k++]));
        xs[k].on_done = NULL;
        TD_CHECK_OK(transport_isend1(t, p, 42, out, len, tu_after_ms(30000), &xs[k++]));
    }
    TD_CHECK_OK(transport_wait_all(t, xs, k, tu_after_ms(30000)));
    for (int p = 0; p < n; p++) {
        if (p == me)
            continue;
        for (size_t i = 0; i < len; i++)
            TD_CHECK_MSG(in[(size_t)p * (len + 1) + i] == tu_pattern(p, 0, i), "byte %zu from rank %d is wrong", i,
                         p);
    }
    for (int i = 0; i < k; i += 2)
        TD_CHECK_EQ(xs[i].peer, i / 2 + (i / 2 >= me));
    free(out);
    free(in);
}

void tu_no_segments(void)
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

void tu_one_core(void)
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

/* ---- worlds ------------------------------------------------------------------------------------- */

td_transport_setup tu_setup(const td_test_ctx *ctx, td_store *store, int64_t timeout_ms, const char *group)
{
    td_transport_setup g = {
        .store = store,
        .rank = ctx->rank,
        .size = ctx->world_size,
        .timeout_ms = timeout_ms ? timeout_ms : 30000,
        .group_name = group,
    };
    return g;
}

void tu_world_close(tu_world *w)
{
    transport_destroy(w->t);
    if (w->keep_store)
        td_store_release(w->store);
    else
        tu_store_close(w->ctx, w->store, w->ctx->store_path);
}

/* ---- cases -------------------------------------------------------------------------------------- */

void tu_case_world_1(tu_world *w)
{
    td_xfer x = {0};
    TD_CHECK_ERR(transport_isend1(w->t, 0, 1, "x", 1, tu_after_ms(1000), &x), TD_ERR_INVALID,
                 "invalid peer rank 0");
}

void tu_case_sizes_and_iovecs(tu_world *w, const size_t *sizes, size_t nsizes)
{
    const td_test_ctx *ctx = w->ctx;
    int peer = 1 - ctx->rank;
    for (size_t si = 0; si < nsizes; si++) {
        size_t len = sizes[si];
        unsigned char *out = malloc(len + 3), *in = malloc(len + 3);
        for (size_t i = 0; i < len; i++)
            out[i] = tu_pattern(ctx->rank, peer, i);
        memset(in, 0xEE, len + 3);
        /* Three pieces of uneven sizes on both sides, cut at different places. */
        size_t a = len / 3, b = len / 2;
        struct iovec siov[3] = {{out, a}, {out + a, len - a - len / 5}, {out + len - len / 5, len / 5}};
        struct iovec riov[3] = {{in, b}, {in + b, 0}, {in + b, len - b}};
        td_xfer xs[2];
        xs[0].on_done = xs[1].on_done = NULL;
        TD_CHECK_OK(transport_irecv(w->t, peer, si, riov, 3, tu_after_ms(30000), &xs[0]));
        TD_CHECK_OK(transport_isend(w->t, peer, si, siov, 3, tu_after_ms(30000), &xs[1]));
        TD_CHECK_OK(transport_wait_all(w->t, xs, 2, tu_after_ms(30000)));
        TD_CHECK_EQ(xs[0].nbytes, len);
        TD_CHECK_EQ(xs[1].nbytes, len);
        TD_CHECK_EQ(xs[0].peer, peer);
        for (size_t i = 0; i < len; i++)
            TD_CHECK_MSG(in[i] == tu_pattern(peer, ctx->rank, i), "size %zu: byte %zu differs", len, i);
        TD_CHECK(in[len] == 0xEE);
        free(out);
        free(in);
    }
}

void tu_case_tag_matching(tu_world *w)
{
    if (w->ctx->rank == 0) {
        for (int tag = 1; tag <= 6; tag++) {
            int v[2] = {tag, tag * 100};
            TD_CHECK_OK(transport_send(w->t, 1, (uint64_t)tag, v, sizeof v, tu_after_ms(30000)));
        }
        for (int i = 0; i < 5; i++)
            TD_CHECK_OK(transport_send(w->t, 1, 77, &i, sizeof i, tu_after_ms(30000)));
        TD_CHECK_OK(transport_send(w->t, 1, 1000, "go", 2, tu_after_ms(30000)));
    } else {
        /* Tag 6 first: it comes last, so tags 1..5 arrive unexpected meanwhile. */
        int v[2];
        TD_CHECK_OK(transport_recv(w->t, 0, 6, v, sizeof v, tu_after_ms(30000)));
        TD_CHECK(v[0] == 6 && v[1] == 600);
        const int order[] = {3, 1, 5, 2, 4};
        for (int i = 0; i < 5; i++) {
            TD_CHECK_OK(transport_recv(w->t, 0, (uint64_t)order[i], v, sizeof v, tu_after_ms(30000)));
            TD_CHECK(v[0] == order[i] && v[1] == order[i] * 100);
        }
        for (int i = 0; i < 5; i++) {
            int x = -1;
            TD_CHECK_OK(transport_recv(w->t, 0, 77, &x, sizeof x, tu_after_ms(30000)));
            TD_CHECK_EQ(x, i);
        }
        char go[2];
        TD_CHECK_OK(transport_recv(w->t, 0, 1000, go, 2, tu_after_ms(30000)));
    }
    /* Posted before anything is sent: receives wait in their queue. */
    if (w->ctx->rank == 1) {
        td_xfer xs[3];
        int vals[3] = {-1, -1, -1};
        for (int i = 0; i < 3; i++) {
            xs[i].on_done = NULL;
            TD_CHECK_OK(transport_irecv1(w->t, 0, (uint64_t)(20 + (2 - i)), &vals[i], sizeof(int),
                                            tu_after_ms(30000), &xs[i]));
        }
        TD_CHECK_OK(transport_send(w->t, 0, 1001, "ready", 5, tu_after_ms(30000)));
        TD_CHECK_OK(transport_wait_all(w->t, xs, 3, tu_after_ms(30000)));
        TD_CHECK(vals[0] == 22 && vals[1] == 21 && vals[2] == 20);
    } else {
        char r[5];
        TD_CHECK_OK(transport_recv(w->t, 1, 1001, r, 5, tu_after_ms(30000)));
        for (int tag = 20; tag <= 22; tag++)
            TD_CHECK_OK(transport_send(w->t, 1, (uint64_t)tag, &tag, sizeof tag, tu_after_ms(30000)));
    }
}

void tu_case_any_source(tu_world *w)
{
    const td_test_ctx *ctx = w->ctx;
    if (ctx->rank == 0) {
        int got[4] = {0};
        for (int i = 0; i < 3; i++) {
            td_xfer x = {0};
            int v[2] = {-1, -1};
            TD_CHECK_OK(transport_irecv1(w->t, TD_TRANSPORT_ANY, 9, v, sizeof v, tu_after_ms(30000), &x));
            TD_CHECK_OK(transport_wait(w->t, &x, tu_after_ms(30000)));
            TD_CHECK(x.peer >= 1 && x.peer <= 3);
            TD_CHECK_EQ(v[0], x.peer);
            TD_CHECK_EQ(v[1], x.peer * 11);
            got[x.peer]++;
        }
        TD_CHECK(got[1] == 1 && got[2] == 1 && got[3] == 1);
        /* A specific receive from 2 and an any-source one, both posted before the data. */
        td_xfer xs[2];
        int a = -1, b = -1;
        xs[0].on_done = xs[1].on_done = NULL;
        TD_CHECK_OK(transport_irecv1(w->t, 2, 10, &a, sizeof a, tu_after_ms(30000), &xs[0]));
        TD_CHECK_OK(transport_irecv1(w->t, TD_TRANSPORT_ANY, 10, &b, sizeof b, tu_after_ms(30000), &xs[1]));
        TD_CHECK_OK(transport_send(w->t, 2, 11, "go", 2, tu_after_ms(30000)));
        TD_CHECK_OK(transport_wait_all(w->t, xs, 2, tu_after_ms(30000)));
        TD_CHECK_EQ(a, 2);
        TD_CHECK_EQ(xs[0].peer, 2);
        TD_CHECK_EQ(b, 102);
        TD_CHECK_EQ(xs[1].peer, 2);
    } else {
        int v[2] = {ctx->rank, ctx->rank * 11};
        TD_CHECK_OK(transport_send(w->t, 0, 9, v, sizeof v, tu_after_ms(30000)));
        if (ctx->rank == 2) {
            char go[2];
            TD_CHECK_OK(transport_recv(w->t, 0, 11, go, 2, tu_after_ms(30000)));
            int x = 2, y = 102;
            TD_CHECK_OK(transport_send(w->t, 0, 10, &x, sizeof x, tu_after_ms(30000)));
            TD_CHECK_OK(transport_send(w->t, 0, 10, &y, sizeof y, tu_after_ms(30000)));
        }
    }
    tu_barrier(ctx, w->store, "done");
}

void tu_case_unexpected(tu_world *w)
{
    const td_test_ctx *ctx = w->ctx;
    const size_t sizes[] = {0, 5, 1000, 70000, 8 * 1024 * 1024};
    enum { N = sizeof sizes / sizeof sizes[0] };
    unsigned char *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = malloc(sizes[i] + 1);
        for (size_t j = 0; j < sizes[i]; j++)
            bufs[i][j] = ctx->rank == 0 ? tu_pattern(0, i, j) : 0;
    }
    if (ctx->rank == 0) {
        td_xfer xs[N];
        for (int i = 0; i < N; i++) {
            xs[i].on_done = NULL;
            TD_CHECK_OK(
                transport_isend1(w->t, 1, (uint64_t)(N - i), bufs[i], sizes[i], tu_after_ms(30000), &xs[i]));
        }
        TD_CHECK_OK(transport_wait_all(w->t, xs, N, tu_after_ms(30000)));
        TD_CHECK_OK(td_store_set_str(w->store, "sent", "1"));
    } else {
        const char *k = "sent";
        TD_CHECK_OK(td_store_wait(w->store, &k, 1, 30000));
        for (int i = N - 1; i >= 0; i--) {
            TD_CHECK_OK(transport_recv(w->t, 0, (uint64_t)(N - i), bufs[i], sizes[i], tu_after_ms(30000)));
            for (size_t j = 0; j < sizes[i]; j++)
                TD_CHECK_MSG(bufs[i][j] == tu_pattern(0, i, j), "message %d byte %zu differs", i, j);
        }
    }
    for (int i = 0; i < N; i++)
        free(bufs[i]);
    tu_barrier(ctx, w->store, "done");
}

void tu_case_unexpected_pool_bound(tu_world *w)
{
    const td_test_ctx *ctx = w->ctx;
    /* Four messages of each size class from 1 KiB to 8 MiB: 64 MiB arrive before any receive. */
    enum { LOW = 10, HIGH = 23, COPIES = 4 };
    const size_t largest = (size_t)1 << HIGH;
    unsigned char *buf = malloc(largest);
    TD_CHECK(buf != NULL);
    if (ctx->rank == 0) {
        for (size_t j = 0; j < largest; j++)
            buf[j] = tu_pattern(0, 1, j);
        for (int k = LOW; k <= HIGH; k++)
            for (int c = 0; c < COPIES; c++)
                TD_CHECK_OK(transport_send(w->t, 1, (uint64_t)(k * COPIES + c), buf, (size_t)1 << k,
                                           tu_after_ms(60000)));
        TD_CHECK_OK(td_store_set_str(w->store, "sent", "1"));
    } else {
        const char *k = "sent";
        TD_CHECK_OK(td_store_wait(w->store, &k, 1, 60000));
        for (int e = HIGH; e >= LOW; e--)
            for (int c = 0; c < COPIES; c++) {
                size_t len = (size_t)1 << e;
                memset(buf, 0, len);
                TD_CHECK_OK(transport_recv(w->t, 0, (uint64_t)(e * COPIES + c), buf, len, tu_after_ms(60000)));
                for (size_t j = 0; j < len; j += 4093)
                    TD_CHECK_MSG(buf[j] == tu_pattern(0, 1, j), "message of %zu bytes: byte %zu differs", len, j);
            }
        /* Every buffer came back to the pools; they keep the budget's worth, not all 64 MiB. */
        size_t kept = match_pool_bytes();
        TD_CHECK_MSG(kept > 0 && kept <= MATCH_POOL_BUDGET, "the pools keep %zu bytes (budget %zu)", kept,
                     MATCH_POOL_BUDGET);
    }
    free(buf);
    tu_barrier(ctx, w->store, "done");
}

void tu_case_length_mismatch(tu_world *w)
{
    if (w->ctx->rank == 0) {
        char b[12] = "abcdefghijk";
        TD_CHECK_OK(transport_send(w->t, 1, 5, b, 12, tu_after_ms(30000)));
        TD_CHECK_OK(transport_send(w->t, 1, 6, b, 3, tu_after_ms(30000)));
        TD_CHECK_OK(transport_send(w->t, 1, 7, b, 12, tu_after_ms(30000)));
        TD_CHECK_OK(transport_send(w->t, 1, 8, b, 4, tu_after_ms(30000)));
        TD_CHECK_OK(td_store_set_str(w->store, "sent", "1"));
    } else {
        char b[64];
        /* Posted first: the payload is discarded as it arrives. */
        TD_CHECK_ERR(transport_recv(w->t, 0, 5, b, 8, tu_after_ms(30000)), TD_ERR_INVALID,
                     "rank 0 sent 12 bytes (tag 5) to a receive of 8 bytes");
        TD_CHECK_OK(transport_recv(w->t, 0, 6, b, 3, tu_after_ms(30000)));
        TD_CHECK(memcmp(b, "abc", 3) == 0);
        /* Posted after the message came (unexpected): same error. */
        const char *k = "sent";
        TD_CHECK_OK(td_store_wait(w->store, &k, 1, 30000));
        TD_CHECK_OK(transport_recv(w->t, 0, 8, b, 4, tu_after_ms(30000))); /* tag 7 is pulled out of the way */
        TD_CHECK_ERR(transport_recv(w->t, 0, 7, b, 20, tu_after_ms(30000)), TD_ERR_INVALID,
                     "sent 12 bytes (tag 7) to a receive of 20 bytes");
    }
    tu_barrier(w->ctx, w->store, "done");
}

void tu_case_peer_killed(tu_world *w)
{
    const td_test_ctx *ctx = w->ctx;
    tu_all_pairs(ctx, w->t, 100);
    tu_barrier(ctx, w->store, "ready");
    if (ctx->rank == 2) {
        clock_sleep_ms(300);
        raise(SIGKILL);
    }
    /* Rank 0 waits on rank 1, which never sends; rank 1 waits on rank 2. */
    int peer = ctx->rank == 0 ? 1 : 2;
    char b[4];
    int64_t t0 = clock_now_ns();
    TD_CHECK_ERR(transport_recv(w->t, peer, 3, b, 4, tu_after_ms(60000)), TD_ERR_PEER_LOST,
                 "Connection to rank 2 lost");
    double dt = tu_since_s(t0);
    TD_CHECK_MSG(dt < 2.3, "the loss of rank 2 took %.2f s to notice (the kill came at 0.3 s)", dt);
    TD_CHECK_ERR(transport_send(w->t, 1 - ctx->rank, 3, b, 4, tu_after_ms(60000)), TD_ERR_PEER_LOST,
                 "Connection to rank 2 lost");
    TD_CHECK_ERR(transport_recv(w->t, TD_TRANSPORT_ANY, 3, b, 4, tu_after_ms(60000)), TD_ERR_PEER_LOST,
                 "Connection to rank 2 lost");
    tu_no_segments();
    w->keep_store = true;
}

void tu_case_timeout(tu_world *w, td_status stalled_status, const char *stalled_msg)
{
    char b[4];
    int64_t t0 = clock_now_ns();
    if (w->ctx->rank == 1) {
        TD_CHECK_ERR(transport_recv(w->t, 0, 1, b, 4, tu_after_ms(300)), TD_ERR_TIMEOUT,
                     "Timed out waiting for a receive from rank 0 (4 bytes, tag 1)");
        double dt = tu_since_s(t0);
        TD_CHECK_MSG(dt >= 0.29 && dt < 10, "timed out after %.2f s", dt);
        TD_CHECK_ERR(transport_send(w->t, 0, 1, b, 4, tu_after_ms(300)), TD_ERR_TIMEOUT, "Timed out");
    } else {
        TD_CHECK_ERR(transport_recv(w->t, 1, 2, b, 4, tu_after_ms(60000)), stalled_status, stalled_msg);
        TD_CHECK(tu_since_s(t0) < 10);
    }
}

static void *abort_later(void *arg)
{
    clock_sleep_ms(100);
    transport_abort(arg, TD_ERR_CLOSED, "aborted by the test");
    return NULL;
}

void tu_case_abort_wakes_waiters(tu_world *w)
{
    int peer = 1 - w->ctx->rank;
    char b[4];
    td_xfer x = {0};
    TD_CHECK_OK(transport_irecv1(w->t, peer, 1, b, 4, tu_after_ms(60000), &x));
    pthread_t th;
    TD_CHECK(pthread_create(&th, NULL, abort_later, w->t) == 0);
    int64_t t0 = clock_now_ns();
    TD_CHECK_ERR(transport_wait(w->t, &x, tu_after_ms(60000)), TD_ERR_CLOSED, "aborted by the test");
    TD_CHECK(tu_since_s(t0) < 10);
    pthread_join(th, NULL);
    TD_CHECK_ERR(transport_send(w->t, peer, 1, b, 4, tu_after_ms(1000)), TD_ERR_CLOSED, "aborted by the test");
    TD_CHECK_ERR(transport_recv(w->t, peer, 1, b, 4, tu_after_ms(1000)), TD_ERR_CLOSED, "aborted by the test");
    tu_barrier(w->ctx, w->store, "done");
}

void tu_check_after_close(tu_world *w)
{
    int me = w->ctx->rank;
    char b[4];
    TD_CHECK_ERR(transport_recv(w->t, 2, 1, b, 4, tu_after_ms(30000)), TD_ERR_PEER_LOST, "rank 2 closed its end");
    for (int i = 0; i < 3; i++) {
        int v = me * 10 + i, got = -1;
        TD_CHECK_OK(transport_sendrecv(w->t, 1 - me, &v, sizeof v, 1 - me, &got, sizeof got, 5, tu_after_ms(30000), false));
        TD_CHECK_EQ(got, (1 - me) * 10 + i);
    }
    TD_CHECK_ERR(transport_send(w->t, 2, 1, b, 4, tu_after_ms(30000)), TD_ERR_PEER_LOST, "rank 2 closed its end");
}

typedef struct cb_state {
    pthread_mutex_t mu;
    int done;
    td_status status[4];
} cb_state;

static void on_done(td_xfer *x, void *arg)
{
    cb_state *s = arg;
    pthread_mutex_lock(&s->mu);
    s->status[s->done++] = x->status;
    pthread_mutex_unlock(&s->mu);
}

void tu_case_callbacks_any_order(tu_world *w)
{
    const td_test_ctx *ctx = w->ctx;
    size_t len = 6 * 1024 * 1024;
    unsigned char *out = malloc(len), *in = malloc(len);
    for (size_t i = 0; i < len; i++)
        out[i] = tu_pattern(ctx->rank, 0, i);
    cb_state s = {.mu = PTHREAD_MUTEX_INITIALIZER};
    td_xfer xs[2];
    for (int i = 0; i < 2; i++) {
        xs[i].on_done = on_done;
        xs[i].arg = &s;
    }
    int peer = 1 - ctx->rank;
    if (ctx->rank == 0) {
        TD_CHECK_OK(transport_isend1(w->t, peer, 1, out, len, tu_after_ms(30000), &xs[0]));
        TD_CHECK_OK(transport_irecv1(w->t, peer, 2, in, len, tu_after_ms(30000), &xs[1]));
    } else {
        TD_CHECK_OK(transport_isend1(w->t, peer, 2, out, len, tu_after_ms(30000), &xs[0]));
        TD_CHECK_OK(transport_irecv1(w->t, peer, 1, in, len, tu_after_ms(30000), &xs[1]));
    }
    int64_t t0 = clock_now_ns();
    for (;;) {
        pthread_mutex_lock(&s.mu);
        int d = s.done;
        pthread_mutex_unlock(&s.mu);
        if (d == 2)
            break;
        TD_CHECK_MSG(tu_since_s(t0) < 30, "the callbacks did not come");
        clock_sleep_ms(1);
    }
    TD_CHECK(s.status[0] == TD_OK && s.status[1] == TD_OK);
    for (size_t i = 0; i < len; i++)
        TD_CHECK_MSG(in[i] == tu_pattern(peer, 0, i), "byte %zu differs", i);
    free(out);
    free(in);
    tu_barrier(ctx, w->store, "done");
}

void tu_case_setup_timeout(td_test_ctx *ctx, tu_create_fn create)
{
    td_store *store = tu_store_open(ctx->store_path);
    if (ctx->rank == 0) {
        td_transport_setup g = {.store = store, .rank = 0, .size = 3, .timeout_ms = 500, .group_name = "g"};
        td_transport *t = NULL;
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_TIMEOUT, "rank 1");
        tu_no_segments();
    }
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}

void tu_case_create_destroy_repeatedly(td_test_ctx *ctx, tu_create_fn create)
{
    td_store *store = tu_store_open(ctx->store_path);
    for (int i = 0; i < 8; i++) {
        td_transport_setup g = tu_setup(ctx, store, 30000, "again");
        td_transport *t = NULL;
        TD_CHECK_OK(create(ctx, &g, &t));
        tu_all_pairs(ctx, t, (size_t)i * 1000);
        transport_destroy(t);
        tu_no_segments();
    }
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}

void tu_case_auth_refused(td_test_ctx *ctx, tu_create_fn create, const char *secret0, const char *secret1,
                          const char *want0, const char *want1)
{
    const char *mine = ctx->rank == 0 ? secret0 : secret1;
    if (mine)
        setenv("TDIST_AUTH_TOKEN", mine, 1);
    else
        unsetenv("TDIST_AUTH_TOKEN");
    td_store *store = tu_store_open(ctx->store_path);
    td_transport_setup g = tu_setup(ctx, store, 3000, "g");
    td_transport *t = NULL;
    int64_t t0 = clock_now_ns();
    if (ctx->rank == 0) {
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_INVALID, want0);
        TD_CHECK_MSG(tu_since_s(t0) < 2.5, "rank 0 took %.1f s to fail", tu_since_s(t0));
    } else {
        TD_CHECK_ERR(create(ctx, &g, &t), TD_ERR_TIMEOUT, "no connection yet with rank 0; last refused connection: ");
        TD_CHECK_CONTAINS(td_last_error(), want1);
    }
    unsetenv("TDIST_AUTH_TOKEN");
    tu_barrier(ctx, store, "done");
    tu_store_close(ctx, store, ctx->store_path);
}
