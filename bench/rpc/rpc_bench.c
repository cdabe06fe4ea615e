/* rpc_bench: RPC round trips and throughput between two worker processes, for docs/performance.md
 * ("RPC against TorchRPC").
 *
 *   rpc_bench [--tcp] [--seconds S] [--sizes B,B,...] [--pingpong-only | --no-pingpong] [--profile]
 *   rpc_bench --self [--seconds S]
 *   rpc_bench [--tcp] --floor B [--seconds S]
 *   rpc_bench [--seconds S] --flag-floor
 *
 * Forks itself into worker0 (the caller, which measures) and worker1 (which only serves), meeting
 * through a FileStore in a temporary directory; --tcp sets td_rpc_options.tcp_only, otherwise the
 * workers use tdist's default same-host path. Measured, each for about S seconds:
 *   empty   rpc_sync of a function with no arguments returning None: the median round trip (us);
 *           also as rpc_async and td_future_wait on its future ("empty_async_wait_us", tdist only)
 *   async   rpc_async of the same function with 64 calls in flight: calls per second
 *   tensor  rpc_sync of a function returning its argument, a float32 tensor of B bytes: the
 *           median round trip (us)
 * and, as the floor any RPC over a socket stands on, a raw ping-pong of one 88-byte message (the
 * size of an RPC header) between two processes over a TCP loopback connection with TCP_NODELAY
 * (and over a UNIX-domain socket pair, the same-host floor): the median round trip (us).
 * With --profile, worker0 measures the empty round trip a second time with an RPC profiler
 * running on its thread (tdist/profiler.h): "empty_profiled_us", for the profiler's cost per call.
 * --self measures only the empty round trip of a worker calling itself, in a world of one
 * ("empty_us self"): the call's own path (encoding, the pending map, the hand-over to a pool thread,
 * the reply, the future) with no socket and no second process, the floor under a same-host call.
 * --floor B measures only the raw ping-pong with a message of B bytes ("floor_us <path> B"): what
 * a tensor round trip of B bytes costs on that path with no RPC at all. --flag-floor measures a
 * flag passed back and forth through a shared page by two spinning processes (no system call): the
 * floor under any same-host message.
 * Prints one line per measurement: "<metric> <path> [<bytes>] <value>", path being samehost or tcp;
 * bench/rpc/run.sh runs torch_rpc_bench.py for the same lines and makes the table. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <tdist/future.h>
#include <tdist/profiler.h>
#include <tdist/rpc.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

#include "bench_util.h"

#define IN_FLIGHT 64
#define PING_BYTES 88


/* ---- the functions ----------------------------------------------------------------------------- */

static td_status fn_noop(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = NULL;
    return TD_OK;
}

static td_status fn_echo(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    *result = td_value_retain((td_value *)td_value_at(args, 0));
    return TD_OK;
}

/* ---- measurements (worker0) -------------------------------------------------------------------- */

typedef struct samples {
    double *v;
    size_t n, cap;
} samples;

static void add_sample(samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v)
            abort();
    }
    s->v[s->n++] = x;
}

/* Round trips of fn(args) for about secs seconds (at least min_calls), after a few to warm up. */
/* One call, rpc_sync or (async_wait) rpc_async and td_future_wait on its future. */
static void one_call(td_rpc_agent *a, const char *to, const char *fn, const td_value *args, bool async_wait)
{
    if (async_wait) {
        td_future *f = NULL;
        if (td_rpc_async(a, td_rpc_to_name(to), fn, args, NULL, 0, &f) != TD_OK || td_future_wait(f, 0) != TD_OK)
            bench_die("rpc_bench", fn);
        td_future_release(f);
        return;
    }
    td_value *r = NULL;
    if (td_rpc_sync(a, td_rpc_to_name(to), fn, args, NULL, 0, &r) != TD_OK)
        bench_die("rpc_bench", fn);
    td_value_release(r);
}

static double call_median_us(td_rpc_agent *a, const char *to, const char *fn, const td_value *args, double secs,
                             size_t min_calls, bool async_wait)
{
    for (int i = 0; i < 20; i++)
        one_call(a, to, fn, args, async_wait);
    samples s = {0};
    double end = bench_now_s() + secs;
    while (s.n < min_calls || bench_now_s() < end) {
        double t0 = bench_now_s();
        one_call(a, to, fn, args, async_wait);
        add_sample(&s, (bench_now_s() - t0) * 1e6);
    }
    double m = bench_median(s.v, s.n);
    free(s.v);
    return m;
}

/* Calls per second with IN_FLIGHT calls outstanding: each completed call is replaced at once. */
static double async_rate(td_rpc_agent *a, double secs)
{
    td_future *ring[IN_FLIGHT];
    for (int i = 0; i < IN_FLIGHT; i++)
        if (td_rpc_async(a, td_rpc_to_name("worker1"), "noop", NULL, NULL, 0, &ring[i]) != TD_OK)
            bench_die("rpc_bench", "async");
    uint64_t done = 0;
    double t0 = bench_now_s(), end = t0 + secs;
    for (int i = 0;; i = (i + 1) % IN_FLIGHT) {
        if (td_future_wait(ring[i], 0) != TD_OK)
            bench_die("rpc_bench", "async wait");
        td_future_release(ring[i]);
        ring[i] = NULL;
        done++;
        if (bench_now_s() >= end)
            break;
        if (td_rpc_async(a, td_rpc_to_name("worker1"), "noop", NULL, NULL, 0, &ring[i]) != TD_OK)
            bench_die("rpc_bench", "async");
    }
    double rate = (double)done / (bench_now_s() - t0);
    for (int i = 0; i < IN_FLIGHT; i++) {
        if (ring[i]) {
            td_future_wait(ring[i], 0);
            td_future_release(ring[i]);
        }
    }
    return rate;
}

static void run_worker(int rank, const char *url, bool tcp, double secs, const long *sizes, int nsizes, bool profile)
{
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.init_method = url;
    o.tcp_only = tcp;
    o.listen_host = "127.0.0.1";
    td_rpc_agent *a;
    char name[16];
    snprintf(name, sizeof name, "worker%d", rank);
    if (td_rpc_agent_create(name, rank, 2, &o, &a) != TD_OK)
        bench_die("rpc_bench", "agent");
    const char *path = tcp ? "tcp" : "samehost";
    if (rank == 0) {
        printf("empty_us %s %.2f\n", path, call_median_us(a, "worker1", "noop", NULL, secs, 100, false));
        printf("empty_async_wait_us %s %.2f\n", path, call_median_us(a, "worker1", "noop", NULL, secs, 100, true));
        fflush(stdout);
        if (profile) {
            td_profiler_options po;
            td_profiler_options_init(&po);
            td_profiler *p = NULL;
            if (td_profiler_start(&po, &p) != TD_OK)
                bench_die("rpc_bench", "profiler");
            printf("empty_profiled_us %s %.2f\n", path, call_median_us(a, "worker1", "noop", NULL, secs, 100, false));
            fflush(stdout);
            td_profiler_free(p);
        }
        printf("async_calls_per_s %s %.0f\n", path, async_rate(a, secs));
        fflush(stdout);
        for (int i = 0; i < nsizes; i++) {
            td_tensor *t;
            if (td_tensor_zeros(TD_FLOAT32, TD_SHAPE(sizes[i] / 4), &t) != TD_OK)
                bench_die("rpc_bench", "tensor");
            td_value *args = td_value_tuple_new(1);
            td_value_set(args, 0, td_value_tensor(t));
            td_tensor_release(t);
            printf("tensor_us %s %ld %.2f\n", path, sizes[i], call_median_us(a, "worker1", "echo", args, secs, 10, false));
            fflush(stdout);
            td_value_release(args);
        }
    }
    if (td_rpc_agent_shutdown(a, true, 0) != TD_OK)
        bench_die("rpc_bench", "shutdown");
}

/* A world of one: worker0 calls itself. */
static void run_self(const char *url, double secs)
{
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.init_method = url;
    td_rpc_agent *a;
    if (td_rpc_agent_create("worker0", 0, 1, &o, &a) != TD_OK)
        bench_die("rpc_bench", "agent");
    printf("empty_us self %.2f\n", call_median_us(a, "worker0", "noop", NULL, secs, 100, false));
    fflush(stdout);
    if (td_rpc_agent_shutdown(a, true, 0) != TD_OK)
        bench_die("rpc_bench", "shutdown");
}

/* ---- the raw ping-pong ------------------------------------------------------------------------- */

static void xfer(int fd, char *buf, size_t bytes, bool send_it)
{
    size_t at = 0;
    while (at < bytes) {
        ssize_t n = send_it ? send(fd, buf + at, bytes - at, MSG_NOSIGNAL) : recv(fd, buf + at, bytes - at, 0);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            fprintf(stderr, "rpc_bench: ping-pong: %s\n", n == 0 ? "closed" : strerror(errno));
            exit(1);
        }
        at += (size_t)n;
    }
}

/* The median round trip of a message of `bytes` between this process (the pinger) and a forked
 * child that reads it whole and sends it back. */
static double pingpong_us(bool tcp, size_t bytes, double secs)
{
    int fds[2];
    if (tcp) {
        int lfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof sa;
        if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 1) != 0 ||
            getsockname(lfd, (struct sockaddr *)&sa, &len) != 0) {
            perror("rpc_bench: listen");
            exit(1);
        }
        fds[0] = socket(AF_INET, SOCK_STREAM, 0);
        if (fds[0] < 0 || connect(fds[0], (struct sockaddr *)&sa, sizeof sa) != 0) {
            perror("rpc_bench: connect");
            exit(1);
        }
        fds[1] = accept(lfd, NULL, NULL);
        close(lfd);
        int one = 1;
        setsockopt(fds[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(fds[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    } else if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
        perror("rpc_bench: socketpair");
        exit(1);
    }
    char *buf = calloc(1, bytes);
    if (!buf)
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        for (;;) {
            ssize_t n = recv(fds[1], buf, 1, MSG_PEEK);
            if (n <= 0)
                _exit(0);
            xfer(fds[1], buf, bytes, false);
            xfer(fds[1], buf, bytes, true);
        }
    }
    close(fds[1]);
    samples s = {0};
    for (int i = 0; i < (bytes <= 65536 ? 1000 : 3); i++) {
        xfer(fds[0], buf, bytes, true);
        xfer(fds[0], buf, bytes, false);
    }
    double end = bench_now_s() + secs;
    while (bench_now_s() < end || s.n < 10) {
        double t0 = bench_now_s();
        xfer(fds[0], buf, bytes, true);
        xfer(fds[0], buf, bytes, false);
        add_sample(&s, (bench_now_s() - t0) * 1e6);
    }
    close(fds[0]);
    free(buf);
    waitpid(pid, NULL, 0);
    double m = bench_median(s.v, s.n);
    free(s.v);
    return m;
}

/* The median round trip of a flag between this process and a forked child, both spinning on a
 * shared page (no system call, no sleep): the floor under any same-host message. */
static double flag_pingpong_us(double secs)
{
    _Atomic uint64_t *words = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (words == MAP_FAILED) {
        perror("rpc_bench: mmap");
        exit(1);
    }
    _Atomic uint64_t *ping = &words[0], *pong = &words[64 / sizeof *words]; /* a cache line apart */
    atomic_init(ping, 0);
    atomic_init(pong, 0);
    pid_t pid = fork();
    if (pid == 0) {
        for (uint64_t i = 1;; i++) {
            uint64_t v;
            while ((v = atomic_load_explicit(ping, memory_order_acquire)) < i)
                ;
            if (v == UINT64_MAX)
                _exit(0);
            atomic_store_explicit(pong, i, memory_order_release);
        }
    }
    samples s = {0};
    double end = bench_now_s() + secs;
    for (uint64_t i = 1; bench_now_s() < end || s.n < 1000; i++) {
        double t0 = bench_now_s();
        atomic_store_explicit(ping, i, memory_order_release);
        while (atomic_load_explicit(pong, memory_order_acquire) < i)
            ;
        if (i > 1000)
            add_sample(&s, (bench_now_s() - t0) * 1e6);
    }
    atomic_store(ping, UINT64_MAX);
    waitpid(pid, NULL, 0);
    munmap((void *)words, 4096);
    double m = bench_median(s.v, s.n);
    free(s.v);
    return m;
}

/* ---- main -------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    bool tcp = false, pingpong = true, rpc = true, profile = false, self = false;
    long floor_bytes = 0;
    double secs = 1.0;
    long sizes[16] = {1024, 65536, 1048576, 16777216, 67108864};
    int nsizes = 5;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tcp") == 0) {
            tcp = true;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            secs = atof(argv[++i]);
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *p = argv[++i]; *p && nsizes < 16;) {
                char *end;
                sizes[nsizes++] = strtol(p, &end, 10);
                p = *end ? end + 1 : end;
            }
        } else if (strcmp(argv[i], "--pingpong-only") == 0) {
            rpc = false;
        } else if (strcmp(argv[i], "--no-pingpong") == 0) {
            pingpong = false;
        } else if (strcmp(argv[i], "--profile") == 0) {
            profile = true;
        } else if (strcmp(argv[i], "--self") == 0) {
            self = true;
        } else if (strcmp(argv[i], "--flag-floor") == 0) {
            printf("flag_pingpong_us samehost %.3f\n", flag_pingpong_us(secs));
            return 0;
        } else if (strcmp(argv[i], "--floor") == 0 && i + 1 < argc) {
            floor_bytes = strtol(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "usage: rpc_bench [--tcp] [--seconds S] [--sizes B,B,...] [--pingpong-only | --no-pingpong] "
                            "[--profile]\n       rpc_bench --self [--seconds S]\n       rpc_bench [--tcp] --floor B [--seconds S]\n       rpc_bench [--seconds S] --flag-floor\n");
            return 2;
        }
    }
    if (floor_bytes > 0) {
        printf("floor_us %s %ld %.2f\n", tcp ? "tcp" : "samehost", floor_bytes,
               pingpong_us(tcp, (size_t)floor_bytes, secs));
        return 0;
    }
    if (self) {
        if (td_rpc_register("noop", fn_noop, NULL) != TD_OK)
            bench_die("rpc_bench", "register");
        run_self(bench_store_url("rpc_bench"), secs);
        return 0;
    }
    if (pingpong) {
        printf("pingpong_us %s %.2f\n", tcp ? "tcp" : "samehost", pingpong_us(tcp, PING_BYTES, secs));
        fflush(stdout);
    }
    if (!rpc)
        return 0;
    if (td_rpc_register("noop", fn_noop, NULL) != TD_OK || td_rpc_register("echo", fn_echo, NULL) != TD_OK)
        bench_die("rpc_bench", "register");
    const char *url = bench_store_url("rpc_bench");
    /* Forked before either process starts a thread. */
    pid_t pid = fork();
    if (pid < 0) {
        perror("rpc_bench: fork");
        return 1;
    }
    if (pid == 0) {
        run_worker(1, url, tcp, secs, sizes, nsizes, profile);
        _exit(0);
    }
    run_worker(0, url, tcp, secs, sizes, nsizes, profile);
    int wst = 0;
    waitpid(pid, &wst, 0);
    return WIFEXITED(wst) && WEXITSTATUS(wst) == 0 ? 0 : 1;
}
