/* Shared helpers of the store tests (util.h). */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

void publish_int(const td_test_ctx *ctx, const char *name, int value)
{
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/%s", ctx->tmpdir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    TD_CHECK(f != NULL);
    fprintf(f, "%d\n", value);
    TD_CHECK(fclose(f) == 0);
    TD_CHECK(rename(tmp, path) == 0);
}

int read_published_int(const td_test_ctx *ctx, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", ctx->tmpdir, name);
    double end = now_s() + 60;
    for (;;) {
        FILE *f = fopen(path, "r");
        if (f) {
            int v = -1;
            int n = fscanf(f, "%d", &v);
            fclose(f);
            TD_CHECK_EQ(n, 1);
            return v;
        }
        TD_CHECK_MSG(now_s() < end, "%s was not published within 60 s", path);
        sleep_s(0.005);
    }
}

void unpublish(const td_test_ctx *ctx, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", ctx->tmpdir, name);
    unlink(path);
}

void publish_port_hook(int port, void *arg) { publish_int(arg, "port", port); }

td_store *tcp_master(const td_test_ctx *ctx, int world_size, int64_t timeout_ms)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_master = true;
    o.world_size = world_size;
    o.wait_for_workers = world_size >= 1;
    o.timeout_ms = timeout_ms;
    o.on_listening = publish_port_hook;
    o.on_listening_arg = (void *)ctx;
    td_store *s = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &s));
    return s;
}

td_store *tcp_client(const td_test_ctx *ctx, int world_size, int64_t timeout_ms)
{
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = read_published_int(ctx, "port");
    o.world_size = world_size;
    o.wait_for_workers = world_size >= 1;
    o.timeout_ms = timeout_ms;
    td_store *s = NULL;
    TD_CHECK_OK(td_tcp_store_create(&o, &s));
    return s;
}

static bool is(const td_test_ctx *ctx, const char *p) { return strcmp(ctx->param, p) == 0; }

/* "tcp" and "tcp_inet" (the same TCPStore with the same-host socket off, so TCP is used). */
static bool is_tcp(const td_test_ctx *ctx)
{
    if (is(ctx, "tcp_inet"))
        setenv("TDIST_STORE_UNIX", "0", 1);
    return is(ctx, "tcp") || is(ctx, "tcp_inet");
}

td_store *open_param_store(const td_test_ctx *ctx)
{
    td_store *s = NULL;
    if (is(ctx, "hash")) {
        TD_CHECK_OK(td_hash_store_create(&s));
    } else if (is(ctx, "file")) {
        TD_CHECK_OK(td_file_store_create(ctx->store_path, 1, &s));
    } else if (is_tcp(ctx) || is(ctx, "prefix")) {
        s = tcp_master(ctx, 1, TD_STORE_DEFAULT_TIMEOUT_MS);
        unpublish(ctx, "port");
        if (is(ctx, "prefix")) {
            td_store *p = NULL;
            TD_CHECK_OK(td_prefix_store_create("test_prefix", s, &p));
            td_store_release(s);
            s = p;
        }
    } else {
        TD_FAIL("unknown store parameter '%s'", ctx->param);
    }
    return s;
}

int64_t param_internal_keys(const td_test_ctx *ctx)
{
    if (is_tcp(ctx) || is(ctx, "prefix"))
        return 1; /* "init/" */
    if (is(ctx, "file"))
        return 1; /* "refcount/" */
    return 0;
}

const char *param_get_timeout_msg(const td_test_ctx *ctx, const char *key, int64_t timeout_ms, char *buf, size_t size)
{
    if (is(ctx, "hash"))
        return "Wait timeout";
    if (is(ctx, "file")) {
        snprintf(buf, size, "Timeout waiting for key: %s after %lld ms", key, (long long)timeout_ms);
        return buf;
    }
    return "Socket Timeout";
}

const char *param_wait_timeout_msg(const td_test_ctx *ctx)
{
    return is_tcp(ctx) || is(ctx, "prefix") ? "Socket Timeout" : "Wait timeout";
}

void store_barrier(td_store *store, const char *key, int world)
{
    char done[256];
    snprintf(done, sizeof done, "%s/done", key);
    int64_t n = 0;
    TD_CHECK_OK(td_store_add(store, key, 1, &n));
    if (n == world)
        TD_CHECK_OK(td_store_set_str(store, done, "1"));
    const char *keys[] = {done};
    TD_CHECK_OK(td_store_wait(store, keys, 1, TD_STORE_TIMEOUT_DEFAULT));
}

void counter_barrier(td_store *store, const char *key, int64_t target)
{
    int64_t n = 0;
    TD_CHECK_OK(td_store_add(store, key, 1, &n));
    double end = now_s() + 60;
    while (n < target) {
        TD_CHECK_MSG(now_s() < end, "counter barrier %s stuck at %lld of %lld", key, (long long)n, (long long)target);
        sleep_s(0.002);
        TD_CHECK_OK(td_store_add(store, key, 0, &n));
    }
}

char *get_str(td_store *store, const char *key)
{
    void *v = NULL;
    size_t n = 0;
    TD_CHECK_OK(td_store_get(store, key, &v, &n));
    TD_CHECK_EQ(strlen(v), n);
    return v;
}

typedef struct worker_arg {
    td_test_ctx *ctx;
    td_store *store;
    worker_fn fn;
    int rank, world;
} worker_arg;

static void *worker_main(void *p)
{
    worker_arg *a = p;
    a->fn(a->ctx, a->store, a->rank, a->world);
    store_barrier(a->store, "__workers_done", a->world);
    return NULL;
}

void run_workers(td_test_ctx *ctx, worker_fn fn)
{
    int world = ctx->world_size;
    if (is(ctx, "hash")) {
        if (ctx->rank != 0)
            return;
        td_store *s = NULL;
        TD_CHECK_OK(td_hash_store_create(&s));
        pthread_t th[64];
        worker_arg args[64];
        TD_CHECK(world <= 64);
        for (int i = 0; i < world; i++) {
            args[i] = (worker_arg){ctx, s, fn, i, world};
            TD_CHECK(pthread_create(&th[i], NULL, worker_main, &args[i]) == 0);
        }
        for (int i = 0; i < world; i++)
            pthread_join(th[i], NULL);
        td_store_release(s);
        return;
    }
    td_store *s = NULL;
    if (is(ctx, "file")) {
        TD_CHECK_OK(td_file_store_create(ctx->store_path, world, &s));
    } else {
        is_tcp(ctx);
        s = ctx->rank == 0 ? tcp_master(ctx, world, 60000) : tcp_client(ctx, world, 60000);
        if (is(ctx, "prefix")) {
            td_store *p = NULL;
            TD_CHECK_OK(td_prefix_store_create("test_prefix", s, &p));
            td_store_release(s);
            s = p;
        }
    }
    worker_arg a = {ctx, s, fn, ctx->rank, world};
    worker_main(&a);
    if (!is(ctx, "file")) {
        /* The master serves the others: it leaves only after every client said it is done. */
        if (ctx->rank == 0) {
            int64_t n = 0;
            TD_CHECK_OK(td_store_add(s, "__clients_released", 0, &n));
            while (n < world - 1) {
                sleep_s(0.005);
                TD_CHECK_OK(td_store_add(s, "__clients_released", 0, &n));
            }
            unpublish(ctx, "port");
        } else {
            TD_CHECK_OK(td_store_add(s, "__clients_released", 1, NULL));
        }
    }
    td_store_release(s);
}

/* store_tool_spawn (util.h). */
pid_t store_tool_spawn(const char *bin, const char *const *args, int *port, int *out_fd, int *err_fd)
{
    int out[2], err[2];
    TD_CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)bin;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    pid_t pid;
    TD_CHECK(posix_spawn(&pid, bin, &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    close(err[1]);
    char line[256];
    size_t len = 0;
    while (len < sizeof line - 1) {
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        TD_CHECK_MSG(poll(&p, 1, 30000) == 1, "tdist-store printed no address within 30 s");
        ssize_t r = read(out[0], line + len, 1);
        TD_CHECK_MSG(r == 1, "tdist-store exited before printing its address");
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
    TD_CHECK_MSG(strncmp(line, "tdist-store listening on ", 25) == 0, "unexpected first line '%s'", line);
    const char *colon = strrchr(line, ':');
    TD_CHECK(colon != NULL);
    *port = atoi(colon + 1);
    TD_CHECK(*port > 0);
    *out_fd = out[0];
    *err_fd = err[0];
    return pid;
}
