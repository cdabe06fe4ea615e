/* mp_bench: how fast tensors go from one process to another through td_mp_queue, for 4 KiB,
 * 1 MiB and 64 MiB tensors, beside a plain pipe that copies the same bytes.
 *
 * A forked producer puts N tensors; the parent gets each, reads its first and last element (so the
 * mapping is really there) and releases it. Two producer modes: "shared" cycles over 4 tensors
 * already in shared memory (the handle is all that travels: the cost should not depend on the
 * size), and "fresh" puts a new, unshared tensor each time (the put moves it into shared memory:
 * one copy of the bytes, as torch's share_memory_). The clock runs from the producer's start
 * signal to the last get. Output: markdown table rows (run.sh adds the header and torch's rows).
 *
 * Usage: mp_bench [--quick] [--strategy file_descriptor|file_system] [--only shared|fresh|pipe] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/mp.h>

#include "base/clock.h"
#include "base/error.h"

typedef struct size_case {
    const char *label;
    int64_t bytes;
    int shared_n, fresh_n, pipe_n;
} size_case;

TD_MP_ENTRY(bench_producer)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *go = td_mp_value_event(td_value_at(args, 1));
    td_mp_event *ready = td_mp_value_event(td_value_at(args, 2));
    td_mp_event *done = td_mp_value_event(td_value_at(args, 6));
    int64_t bytes = td_value_get_int(td_value_at(args, 3)), n = td_value_get_int(td_value_at(args, 4));
    bool fresh = td_value_get_bool(td_value_at(args, 5));
    td_value *ring[4] = {0};
    for (int i = 0; i < 4 && !fresh; i++) {
        td_tensor *t;
        TD_TRY(td_tensor_zeros(TD_UINT8, TD_SHAPE(bytes), &t));
        TD_TRY(td_tensor_share_memory(t));
        ring[i] = td_value_tensor(t);
        td_tensor_release(t);
    }
    td_mp_event_set(ready);
    TD_TRY(td_mp_event_wait(go, 0));
    for (int64_t i = 0; i < n; i++) {
        td_value *v = NULL;
        if (fresh) {
            td_tensor *t;
            TD_TRY(td_tensor_full(TD_UINT8, TD_SHAPE(bytes), (double)(i & 0x7f), &t));
            v = td_value_tensor(t);
            td_tensor_release(t);
        } else {
            v = td_value_retain(ring[i % 4]);
        }
        td_status st = td_mp_queue_put(q, v, 0);
        td_value_release(v);
        TD_TRY(st);
    }
    TD_TRY(td_mp_queue_close(q));
    /* Keep the ring until the consumer is done: otherwise its last releases would free the
     * segments (whoever lets go last pays for freeing the pages), which is not the transfer. */
    TD_TRY(td_mp_event_wait(done, 0));
    for (int i = 0; i < 4; i++)
        td_value_release(ring[i]);
    return TD_OK;
}

static double run_queue(int64_t bytes, int n, bool fresh)
{
    td_mp_queue *q;
    td_mp_event *go, *ready, *done;
    if (td_mp_queue_new(0, &q) || td_mp_event_new(&go) || td_mp_event_new(&ready) || td_mp_event_new(&done))
        goto fail;
    td_value *args = td_value_tuple_of(7, td_mp_queue_value(q), td_mp_event_value(go), td_mp_event_value(ready),
                                       td_value_int(bytes), td_value_int(n), td_value_bool(fresh),
                                       td_mp_event_value(done));
    td_mp_context *ctx;
    td_mp_spawn_opts o = {.entry = "bench_producer", .args = args, .nprocs = 1, .method = TD_MP_FORK, .daemon = true};
    if (td_mp_spawn(&o, &ctx))
        goto fail;
    td_mp_event_wait(ready, 0);
    int64_t t0 = clock_now_ns();
    td_mp_event_set(go);
    volatile uint8_t sink = 0;
    for (int i = 0; i < n; i++) {
        td_value *v;
        if (td_mp_queue_get(q, 120000, &v))
            goto fail;
        td_tensor *t = td_value_get_tensor(v);
        const uint8_t *p = td_tensor_data(t);
        sink ^= p[0] ^ p[bytes - 1];
        td_value_release(v);
    }
    double secs = (double)(clock_now_ns() - t0) / 1e9;
    (void)sink;
    td_mp_event_set(done);
    if (td_mp_join(ctx, 60000))
        goto fail;
    td_mp_context_release(ctx);
    td_value_release(args);
    td_mp_event_release(go);
    td_mp_event_release(ready);
    td_mp_event_release(done);
    td_mp_queue_release(q);
    return secs;
fail:
    fprintf(stderr, "mp_bench: %s\n", td_last_error());
    exit(1);
}

/* The same bytes through a pipe: write() of each tensor, read() into one buffer. */
static double run_pipe(int64_t bytes, int n)
{
    int p[2];
    if (pipe(p) != 0)
        exit(1);
    uint8_t *buf = calloc(1, (size_t)bytes);
    int64_t t0 = clock_now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        for (int i = 0; i < n; i++) {
            buf[0] = (uint8_t)i;
            for (int64_t off = 0; off < bytes;) {
                ssize_t w = write(p[1], buf + off, (size_t)(bytes - off));
                if (w <= 0)
                    _exit(1);
                off += w;
            }
        }
        _exit(0);
    }
    close(p[1]);
    volatile uint8_t sink = 0;
    for (int i = 0; i < n; i++) {
        for (int64_t off = 0; off < bytes;) {
            ssize_t r = read(p[0], buf + off, (size_t)(bytes - off));
            if (r <= 0)
                exit(1);
            off += r;
        }
        sink ^= buf[0];
    }
    double secs = (double)(clock_now_ns() - t0) / 1e9;
    (void)sink;
    close(p[0]);
    waitpid(pid, NULL, 0);
    free(buf);
    return secs;
}

static void row(const char *size, const char *what, int64_t bytes, int n, double secs)
{
    double per_s = n / secs;
    printf("| %s | %s | %d | %.0f | %.1f | %.2f |\n", size, what, n, per_s, per_s * (double)bytes / 1e9,
           secs / n * 1e6);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    TD_MP_MAIN_PROLOGUE(argc, argv);
    bool quick = false;
    const char *only = "";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) {
            only = argv[++i];
        } else if (strcmp(argv[i], "--strategy") == 0 && i + 1 < argc) {
            td_mp_strategy s;
            if (td_mp_strategy_from_name(argv[++i], &s) || td_mp_set_sharing_strategy(s)) {
                fprintf(stderr, "mp_bench: %s\n", td_last_error());
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--quick] [--strategy file_descriptor|file_system] [--only shared|fresh|pipe]\n",
                    argv[0]);
            return 2;
        }
    }
    size_case cases[] = {
        {"4 KiB", 4096, 20000, 5000, 20000},
        {"1 MiB", 1 << 20, 20000, 1000, 2000},
        {"64 MiB", 64 << 20, 5000, 40, 40},
    };
    const char *strategy = td_mp_strategy_name(td_mp_get_sharing_strategy());
    char shared[96], fresh[96];
    snprintf(shared, sizeof shared, "tdist td_mp_queue (%s), tensor already shared", strategy);
    snprintf(fresh, sizeof fresh, "tdist td_mp_queue (%s), new tensor per put", strategy);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_case c = cases[i];
        int div = quick ? 10 : 1;
        int ns = c.shared_n / div, nf = c.fresh_n / div > 4 ? c.fresh_n / div : 4, np = c.pipe_n / div > 4 ? c.pipe_n / div : 4;
        if (!*only || strcmp(only, "shared") == 0)
            row(c.label, shared, c.bytes, ns, run_queue(c.bytes, ns, false));
        if (!*only || strcmp(only, "fresh") == 0)
            row(c.label, fresh, c.bytes, nf, run_queue(c.bytes, nf, true));
        if (!*only || strcmp(only, "pipe") == 0)
            row(c.label, "pipe copy of the bytes", c.bytes, np, run_pipe(c.bytes, np));
    }
    return 0;
}
