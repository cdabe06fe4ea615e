/* Sends handed to the I/O thread (rpc/channel.c, "Handing sends over"): on a socket channel (param
 * "socket": same-host UNIX socket with lanes off; "tcp": forced TCP), a small rpc_async call or
 * reply is copied into the channel's outbox while the I/O thread polls, and the thread writes the
 * outbox with one send, so that messages handed meanwhile share it. Checked here: many callers on
 * both sides at once, with small and larger messages and rpc_sync mixed in, get every reply right
 * and share writes (param "off": TCP with TDIST_RPC_HAND_SENDS=0, nothing handed); one caller's
 * messages arrive in the order it sent them whichever way each went (handed, written by itself,
 * the outbox written first); and a peer that stops reading (SIGSTOP)
 * fills the socket: the I/O thread keeps the rest until epoll reports room, the caller's own
 * writes block as before, and everything arrives once the peer goes on. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/rpc.h>
#include <tdist/testing.h>

#include "rpc_util.h"

/* ---- the functions ---------------------------------------------------------------------------- */

/* note(i, [padding]): counts call i. The pool takes calls in the order they arrived, one thread at
 * a time (one base thread here; a thread held up long enough makes it start another), so each pool
 * thread must see its calls' i increase; a thread that sees one go back counts an inversion.
 * log(): (distinct calls noted, inversions, the first inversion's earlier and later i). */
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static bool noted[1024];
static int64_t noted_count, inversions, inversion[2];
static __thread int64_t last_noted = -1; /* on this pool thread */

static td_status fn_note(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    int64_t i = td_value_get_int(td_value_at(args, 0));
    pthread_mutex_lock(&log_mu);
    if (i >= 0 && i < (int64_t)(sizeof noted / sizeof noted[0]) && !noted[i]) {
        noted[i] = true;
        noted_count++;
    }
    if (i <= last_noted && inversions++ == 0) {
        inversion[0] = last_noted;
        inversion[1] = i;
    }
    last_noted = i;
    pthread_mutex_unlock(&log_mu);
    *result = NULL;
    return TD_OK;
}

static td_status fn_log(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    pthread_mutex_lock(&log_mu);
    *result = td_value_tuple_of(4, td_value_int(noted_count), td_value_int(inversions), td_value_int(inversion[0]),
                                td_value_int(inversion[1]));
    pthread_mutex_unlock(&log_mu);
    return TD_OK;
}

static td_status fn_pid(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = td_value_int(getpid());
    return TD_OK;
}

/* "off": TCP with TDIST_RPC_HAND_SENDS=0. */
static bool tcp_param(const td_test_ctx *ctx) { return strcmp(ctx->param, "socket") != 0; }
static bool off_param(const td_test_ctx *ctx) { return strcmp(ctx->param, "off") == 0; }

static void rpc_up(td_test_ctx *ctx, int pool_threads)
{
    setenv("TDIST_RPC_LANES", "0", 1);
    if (off_param(ctx))
        setenv("TDIST_RPC_HAND_SENDS", "0", 1);
    const rpc_test_function fns[] = {
        {"echo", rpc_test_echo, NULL, NULL},
        {"note", fn_note, NULL, NULL},
        {"log", fn_log, NULL, NULL},
        {"pid", fn_pid, NULL, NULL},
    };
    rpc_test_register(fns, sizeof fns / sizeof fns[0]);
    td_rpc_options o = rpc_test_options(ctx);
    o.tcp_only = tcp_param(ctx);
    if (pool_threads > 0)
        o.num_worker_threads = pool_threads;
    rpc_test_init(ctx, &o);
    TD_CHECK_EQ(rpc_test_debug_int("agent.num_lane_channels"), 0);
    TD_CHECK_EQ(rpc_test_debug_int(tcp_param(ctx) ? "agent.num_tcp_channels" : "agent.num_unix_channels"),
                ctx->world_size - 1);
}

static td_future *echo_async(int to, td_tensor *t)
{
    td_value *args = td_value_tuple_of(1, td_value_tensor(t));
    td_future *f = NULL;
    TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(to), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &f));
    td_value_release(args);
    return f;
}

static void echo_check(td_future *f, td_tensor *sent, int call)
{
    TD_CHECK_OK(td_future_wait(f, 0));
    TD_CHECK_MSG(td_tensor_equal(td_value_get_tensor(td_future_value(f)), sent), "call %d's reply differs", call);
    td_future_release(f);
    td_tensor_release(sent);
}

/* ---- many callers ------------------------------------------------------------------------------ */

typedef struct caller {
    int to, seed;
} caller;

/* 400 echo calls with 32 in flight, sizes from nothing to above what is handed over (RPC_HAND_MAX,
 * 8 KiB), and every 40th an rpc_sync; each reply checked byte for byte. */
static void *calls_main(void *arg)
{
    const caller *c = arg;
    enum { CALLS = 400, DEPTH = 32 };
    static const int64_t sizes[] = {0, 5, 100, 4000, 8000, 12000, 30000, 1};
    td_future *fs[DEPTH] = {0};
    td_tensor *sent[DEPTH] = {0};
    for (int i = 0; i < CALLS; i++) {
        int slot = i % DEPTH;
        if (fs[slot])
            echo_check(fs[slot], sent[slot], i - DEPTH);
        sent[slot] = rpc_test_pattern(sizes[i % 8], c->seed + i);
        fs[slot] = echo_async(c->to, sent[slot]);
        if (i % 40 == 39) {
            td_tensor *t = rpc_test_pattern(64, c->seed - i);
            td_value *args = td_value_tuple_of(1, td_value_tensor(t)), *r = NULL;
            TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(c->to), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
            TD_CHECK(r && td_tensor_equal(td_value_get_tensor(r), t));
            td_value_release(r);
            td_value_release(args);
            td_tensor_release(t);
        }
    }
    for (int slot = 0; slot < DEPTH; slot++)
        if (fs[slot])
            echo_check(fs[slot], sent[slot], -1);
    return NULL;
}

TD_TEST(many_callers_share_writes, .world_size = 2, .timeout_s = 120, .params = "socket,tcp,off")
{
    rpc_up(ctx, 0);
    /* Four threads on each worker call the other at once: both sides hand calls and replies over. */
    enum { THREADS = 4 };
    pthread_t th[THREADS];
    caller cs[THREADS];
    for (int k = 0; k < THREADS; k++) {
        cs[k] = (caller){1 - ctx->rank, 1000 * (ctx->rank * THREADS + k)};
        TD_CHECK_EQ(pthread_create(&th[k], NULL, calls_main, &cs[k]), 0);
    }
    for (int k = 0; k < THREADS; k++)
        pthread_join(th[k], NULL);
    int64_t handed = rpc_test_debug_int("agent.sends_handed_to_io_thread");
    int64_t writes = rpc_test_debug_int("agent.io_thread_writes");
    fprintf(stderr, "worker%d: %lld messages handed over, %lld writes\n", ctx->rank, (long long)handed, (long long)writes);
    if (off_param(ctx)) {
        TD_CHECK_MSG(handed == 0 && writes == 0, "with TDIST_RPC_HAND_SENDS=0, %lld messages were handed over",
                     (long long)handed);
    } else {
        TD_CHECK_MSG(handed > 0, "no message was handed to the I/O thread");
        TD_CHECK_MSG(writes > 0 && writes < handed, "%lld handed messages took %lld writes: none shared one",
                     (long long)handed, (long long)writes);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- order ------------------------------------------------------------------------------------- */

TD_TEST(one_callers_messages_keep_their_order, .world_size = 2, .timeout_s = 120, .params = "socket,tcp")
{
    /* One pool thread on the callee, so that its calls run in the order they arrived (fn_note). */
    rpc_up(ctx, 1);
    if (ctx->rank == 0) {
        enum { N = 600 };
        td_tensor *pad = rpc_test_pattern(16 << 10, 3); /* above RPC_HAND_MAX: written by the caller */
        td_future *fs[N];
        int nf = 0;
        for (int i = 0; i < N; i++) {
            td_value *args = (i % 7 == 0) ? td_value_tuple_of(2, td_value_int(i), td_value_tensor(pad))
                                          : td_value_tuple_of(1, td_value_int(i));
            if (i % 50 == 49) {
                td_value *r = NULL;
                TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(1), "note", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
                td_value_release(r);
            } else {
                TD_CHECK_OK(td_rpc_async(NULL, td_rpc_to_id(1), "note", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &fs[nf++]));
            }
            td_value_release(args);
        }
        TD_CHECK_OK(td_future_wait_all(fs, (size_t)nf, 0));
        for (int k = 0; k < nf; k++)
            td_future_release(fs[k]);
        td_value *log = NULL;
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(1), "log", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &log));
        TD_CHECK_EQ(td_value_get_int(td_value_at(log, 0)), N);
        TD_CHECK_MSG(td_value_get_int(td_value_at(log, 1)) == 0, "%lld calls ran after a later one on their thread "
                     "(the first: call %lld after call %lld)", (long long)td_value_get_int(td_value_at(log, 1)),
                     (long long)td_value_get_int(td_value_at(log, 3)), (long long)td_value_get_int(td_value_at(log, 2)));
        td_value_release(log);
        td_tensor_release(pad);
        TD_CHECK_MSG(rpc_test_debug_int("agent.sends_handed_to_io_thread") > 0, "no call was handed over");
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

/* ---- a peer that stops reading ---------------------------------------------------------------- */

/* Continues the stopped worker once this worker's I/O thread found its socket full, or after 2 s
 * (this worker's caller then wrote into the full socket itself, and the round is tried again). */
static void *cont_main(void *arg)
{
    pid_t pid = *(const pid_t *)arg;
    double give_up = rpc_test_now_s() + 2;
    while (rpc_test_debug_int("agent.io_thread_writes_found_full") == 0 && rpc_test_now_s() < give_up)
        rpc_test_sleep_ms(10);
    rpc_test_sleep_ms(100);
    kill(pid, SIGCONT);
    return NULL;
}

/* Calls worker 2 one at a time until *stop: replies keep this worker's I/O thread polling. */
typedef struct pinger {
    atomic_bool stop;
    atomic_int calls;
} pinger;

static void *ping_main(void *arg)
{
    pinger *p = arg;
    while (!atomic_load(&p->stop)) {
        td_value *args = td_value_tuple_of(1, td_value_int(atomic_load(&p->calls))), *r = NULL;
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(2), "echo", args, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
        td_value_release(r);
        td_value_release(args);
        atomic_fetch_add(&p->calls, 1);
    }
    return NULL;
}

TD_TEST(a_peer_that_stops_reading_fills_the_socket, .world_size = 3, .timeout_s = 120, .params = "socket,tcp")
{
    /* Worker 0's threads poll for up to 200 ms before they sleep: its I/O thread then polls all
     * along, however slow a sanitizer makes the calls that keep it busy. */
    if (ctx->rank == 0)
        setenv("TDIST_RPC_SPIN_US", "200000", 1);
    rpc_up(ctx, 0);
    if (ctx->rank == 0) {
        td_value *r = NULL;
        TD_CHECK_OK(td_rpc_sync(NULL, td_rpc_to_id(1), "pid", NULL, NULL, TD_RPC_DEFAULT_TIMEOUT, &r));
        pid_t pid = (pid_t)td_value_get_int(r);
        td_value_release(r);
        /* Worker 1 stops, and this worker calls it with 7 KiB messages until its I/O thread found
         * the socket full (a TCP socket may buffer 32 MiB and more here): another thread's calls
         * to worker 2 keep that thread busy, so it is polling and takes the calls handed to it.
         * Once it found the socket full, worker 1 goes on, and every reply is checked. When the
         * I/O thread did not get the core in time, the caller writes into the full socket itself
         * (as every sender did before the hand-off), blocks until worker 1 goes on, and the round
         * is tried again. */
        enum { ROUNDS = 8, MAX_CALLS = 4096, BYTES = 7 << 10 };
        td_future **fs = calloc(MAX_CALLS, sizeof *fs);
        TD_CHECK(fs != NULL);
        pinger png = {.stop = false, .calls = 0};
        pthread_t pinging, waking;
        TD_CHECK_EQ(pthread_create(&pinging, NULL, ping_main, &png), 0);
        /* Its polls shorten for a while after the sleeps of the set-up (samehost_spin_budget):
         * the calls start once those to worker 2 have run that out. */
        while (atomic_load(&png.calls) < 200)
            rpc_test_sleep_ms(1);
        int round = 0, n = 0;
        for (; round < ROUNDS && rpc_test_debug_int("agent.io_thread_writes_found_full") == 0; round++) {
            TD_CHECK_EQ(kill(pid, SIGSTOP), 0);
            TD_CHECK_EQ(pthread_create(&waking, NULL, cont_main, &pid), 0);
            n = 0;
            while (n < MAX_CALLS && (n % 64 != 0 || rpc_test_debug_int("agent.io_thread_writes_found_full") == 0)) {
                td_tensor *t = rpc_test_pattern(BYTES, n);
                fs[n++] = echo_async(1, t);
                td_tensor_release(t);
            }
            pthread_join(waking, NULL);
            for (int i = 0; i < n; i++)
                echo_check(fs[i], rpc_test_pattern(BYTES, i), i);
        }
        atomic_store(&png.stop, true);
        pthread_join(pinging, NULL);
        free(fs);
        int64_t full = rpc_test_debug_int("agent.io_thread_writes_found_full");
        fprintf(stderr, "worker0: %d rounds, %d calls to worker 1 in the last, %d to worker 2 meanwhile; the I/O "
                "thread found the socket full %lld times\n", round, n, atomic_load(&png.calls), (long long)full);
        TD_CHECK_MSG(full > 0, "in %d rounds the I/O thread never found worker 1's socket full", round);
    }
    TD_CHECK_OK(td_rpc_shutdown(true, 0));
}

TD_TEST_MAIN()
