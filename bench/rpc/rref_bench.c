/* rref_bench: remote references between three worker processes, for docs/performance.md ("RRefs
 * against TorchRPC").
 *
 *   rref_bench [--tcp] [--seconds S]
 *
 * Forks itself into worker0 (which measures), worker1 (the owner) and worker2, meeting through a
 * FileStore in a temporary directory; --tcp sets td_rpc_options.tcp_only. Measured, each for about
 * S seconds, as the median of single operations:
 *   remote_to_here  td_rpc_remote(worker1, one) (a function returning 1), td_rref_to_here, then
 *                   td_rref_release (its delete travels in the background): the whole life of an
 *                   RRef (us)
 *   three_workers   td_rpc_sync(worker2, fetch, (rref,)) with rref a user RRef owned by worker1:
 *                   worker2 receives a fork (a user-to-user share: its fork request to the owner,
 *                   its acceptance back to worker0), fetches the value with to_here and returns it
 *                   (us)
 * Prints "<metric> <path> <value>" lines, path samehost or tcp; bench/rpc/rref_run.sh runs
 * torch_rref_bench.py for the same lines and makes the table. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tdist/rpc.h>
#include <tdist/rref.h>

static char g_dir[64], g_store_path[96];

static void remove_store(void)
{
    if (g_store_path[0])
        unlink(g_store_path);
    if (g_dir[0])
        rmdir(g_dir);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
    fprintf(stderr, "rref_bench: %s: %s\n", what, td_last_error());
    exit(1);
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static td_status fn_one(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)args;
    (void)kwargs;
    *result = td_value_int(1);
    return TD_OK;
}

/* fetch(rref): its value, fetched from the owner. */
static td_status fn_fetch(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    if (td_rpc_bind("fetch", "rref", args, kwargs, p) != TD_OK)
        return TD_ERR_REMOTE;
    td_rref *r = td_value_get_rref(p[0]);
    if (!r)
        return td_rpc_raise("TypeError", "fetch expects an RRef");
    return td_rref_to_here(r, TD_RPC_DEFAULT_TIMEOUT, result);
}

typedef enum { OP_REMOTE_TO_HERE, OP_THREE_WORKERS } op;

static void run_op(td_rpc_agent *a, op o, td_rref *held)
{
    if (o == OP_REMOTE_TO_HERE) {
        td_rref *r = NULL;
        td_value *v = NULL;
        if (td_rpc_remote(a, td_rpc_to_name("worker1"), "one", NULL, NULL, 0, &r) != TD_OK ||
            td_rref_to_here(r, 0, &v) != TD_OK || td_value_get_int(v) != 1)
            die("remote + to_here");
        td_value_release(v);
        td_rref_release(r);
    } else {
        td_value *args = td_value_tuple_of(1, td_rref_value(held)), *v = NULL;
        if (td_rpc_sync(a, td_rpc_to_name("worker2"), "fetch", args, NULL, 0, &v) != TD_OK || td_value_get_int(v) != 1)
            die("three workers");
        td_value_release(v);
        td_value_release(args);
    }
}

static double median_us(td_rpc_agent *a, op o, td_rref *held, double secs)
{
    for (int i = 0; i < 50; i++)
        run_op(a, o, held);
    size_t n = 0, cap = 1 << 16;
    double *v = malloc(cap * sizeof *v);
    double end = now_s() + secs;
    while (n < 100 || now_s() < end) {
        double t0 = now_s();
        run_op(a, o, held);
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
        }
        v[n++] = (now_s() - t0) * 1e6;
    }
    qsort(v, n, sizeof *v, cmp_double);
    double m = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    free(v);
    return m;
}

static void run_worker(int rank, const char *url, bool tcp, double secs)
{
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.init_method = url;
    o.tcp_only = tcp;
    o.listen_host = "127.0.0.1";
    o.ignore_rref_leak = false;
    td_rpc_agent *a;
    char name[16];
    snprintf(name, sizeof name, "worker%d", rank);
    if (td_rpc_agent_create(name, rank, 3, &o, &a) != TD_OK)
        die("agent");
    const char *path = tcp ? "tcp" : "samehost";
    if (rank == 0) {
        printf("remote_to_here_us %s %.2f\n", path, median_us(a, OP_REMOTE_TO_HERE, NULL, secs));
        fflush(stdout);
        td_rref *held = NULL;
        if (td_rpc_remote(a, td_rpc_to_name("worker1"), "one", NULL, NULL, 0, &held) != TD_OK)
            die("remote");
        printf("three_workers_us %s %.2f\n", path, median_us(a, OP_THREE_WORKERS, held, secs));
        fflush(stdout);
        td_rref_release(held);
    }
    if (td_rpc_agent_shutdown(a, true, 0) != TD_OK)
        die("shutdown");
}

int main(int argc, char **argv)
{
    bool tcp = false;
    double secs = 1.0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tcp") == 0) {
            tcp = true;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            secs = atof(argv[++i]);
        } else {
            fprintf(stderr, "usage: rref_bench [--tcp] [--seconds S]\n");
            return 2;
        }
    }
    if (td_rpc_register("one", fn_one, NULL) != TD_OK || td_rpc_register("fetch", fn_fetch, NULL) != TD_OK)
        die("register");
    snprintf(g_dir, sizeof g_dir, "/tmp/rref_bench.XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("rref_bench: mkdtemp");
        return 1;
    }
    atexit(remove_store);
    char url[128];
    snprintf(g_store_path, sizeof g_store_path, "%s/store", g_dir);
    snprintf(url, sizeof url, "file://%s", g_store_path);
    pid_t pids[2];
    for (int r = 1; r <= 2; r++) { /* forked before any process starts a thread */
        pids[r - 1] = fork();
        if (pids[r - 1] < 0) {
            perror("rref_bench: fork");
            return 1;
        }
        if (pids[r - 1] == 0) {
            run_worker(r, url, tcp, secs);
            _exit(0);
        }
    }
    run_worker(0, url, tcp, secs);
    int ok = 1;
    for (int i = 0; i < 2; i++) {
        int wst = 0;
        waitpid(pids[i], &wst, 0);
        ok &= WIFEXITED(wst) && WEXITSTATUS(wst) == 0;
    }
    return ok ? 0 : 1;
}
