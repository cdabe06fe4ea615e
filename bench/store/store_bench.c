/* store_bench: TCPStore round trips per second, for docs/performance.md ("Stores").
 *
 *   store_bench [--clients N] [--seconds S] [--ops set,get,add,wait] [--value-bytes B]
 *
 * Starts a TCPStore master (its server thread) in this process and N client threads, each with
 * its own connection, and runs each operation for S seconds on every client at once:
 *   set   set("k<i>", B bytes)          get   get("k<i>") of an existing key
 *   add   add("counter", 1)             wait  wait(["k<i>"]) on an existing key
 * Prints one line per operation: "<op> <clients> <ops per second>". bench/store/run.sh runs the
 * same operations on PyTorch's TCPStore (torch_store_bench.py) and prints the ratios. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/store.h>

typedef struct client {
    td_store *store;
    int index;
    const char *op;
    size_t value_bytes;
    uint64_t ops;
} client;

static pthread_barrier_t g_start;
static atomic_bool g_stop;

static void die(const char *what)
{
    fprintf(stderr, "store_bench: %s: %s\n", what, td_last_error());
    exit(1);
}

static void *run_client(void *p)
{
    client *c = p;
    char key[32];
    snprintf(key, sizeof key, "k%d", c->index);
    char *value = calloc(1, c->value_bytes + 1);
    memset(value, 'v', c->value_bytes);
    if (td_store_set(c->store, key, value, c->value_bytes) != TD_OK)
        die("set");
    const char *keys[] = {key};
    pthread_barrier_wait(&g_start);
    uint64_t n = 0;
    while (!atomic_load_explicit(&g_stop, memory_order_relaxed)) {
        td_status s = TD_OK;
        for (int i = 0; i < 64 && s == TD_OK; i++) {
            if (c->op[0] == 's') {
                s = td_store_set(c->store, key, value, c->value_bytes);
            } else if (c->op[0] == 'g') {
                void *v = NULL;
                size_t len;
                s = td_store_get(c->store, key, &v, &len);
                free(v);
            } else if (c->op[0] == 'a') {
                s = td_store_add(c->store, "counter", 1, NULL);
            } else {
                s = td_store_wait(c->store, keys, 1, TD_STORE_TIMEOUT_DEFAULT);
            }
        }
        if (s != TD_OK)
            die(c->op);
        n += 64;
    }
    c->ops = n;
    free(value);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    int clients = 1;
    double seconds = 2;
    size_t value_bytes = 16;
    char ops[64] = "set,get,add,wait";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--clients") == 0)
            clients = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--ops") == 0)
            snprintf(ops, sizeof ops, "%s", argv[i + 1]);
        else if (strcmp(argv[i], "--value-bytes") == 0)
            value_bytes = (size_t)atol(argv[i + 1]);
        else {
            fprintf(stderr, "usage: store_bench [--clients N] [--seconds S] [--ops set,get,add,wait] [--value-bytes B]\n");
            return 2;
        }
    }
    if (clients < 1 || clients > 1024 || seconds <= 0) {
        fprintf(stderr, "store_bench: bad --clients or --seconds\n");
        return 2;
    }
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.port = 0;
    o.is_master = true;
    o.wait_for_workers = false;
    td_store *master = NULL;
    if (td_tcp_store_create(&o, &master) != TD_OK)
        die("master");
    o.is_master = false;
    o.port = td_tcp_store_port(master);
    for (char *op = strtok(ops, ","); op; op = strtok(NULL, ",")) {
        if (strcmp(op, "set") && strcmp(op, "get") && strcmp(op, "add") && strcmp(op, "wait")) {
            fprintf(stderr, "store_bench: unknown op '%s'\n", op);
            return 2;
        }
        client *c = calloc((size_t)clients, sizeof *c);
        pthread_t *th = calloc((size_t)clients, sizeof *th);
        pthread_barrier_init(&g_start, NULL, (unsigned)clients + 1);
        atomic_store(&g_stop, false);
        for (int i = 0; i < clients; i++) {
            c[i] = (client){.index = i, .op = op, .value_bytes = value_bytes};
            if (td_tcp_store_create(&o, &c[i].store) != TD_OK)
                die("client");
            pthread_create(&th[i], NULL, run_client, &c[i]);
        }
        pthread_barrier_wait(&g_start);
        double t0 = now_s();
        struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
        nanosleep(&ts, NULL);
        atomic_store(&g_stop, true);
        uint64_t total = 0;
        for (int i = 0; i < clients; i++) {
            pthread_join(th[i], NULL);
            total += c[i].ops;
            td_store_release(c[i].store);
        }
        double dt = now_s() - t0;
        printf("%s %d %.0f\n", op, clients, (double)total / dt);
        fflush(stdout);
        pthread_barrier_destroy(&g_start);
        free(c);
        free(th);
    }
    td_store_release(master);
    return 0;
}
