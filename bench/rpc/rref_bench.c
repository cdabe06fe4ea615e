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

#include "bench_util.h"


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
            bench_die("rref_bench", "remote + to_here");
        td_value_release(v);
        td_rref_release(r);
    } else {
        td_value *args = td_value_tuple_of(1, td_rref_value(held)), *v = NULL;
        if (td_rpc_sync(a, td_rpc_to_name("worker2"), "fetch", args, NULL, 0, &v) != TD_OK || td_value_get_int(v) != 1)
            bench_die("rref_bench", "three workers");
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
    double end = bench_now_s() + secs;
    while (n < 100 || bench_now_s() < end) {
        double t0 = bench_now_s();
        run_op(a, o, held);
        if (n == cap) {
            cap *= 2;
            v = realloc(v, cap * sizeof *v);
        }
        v[n++] = (bench_now_s() - t0) * 1e6;
    }
    double m = bench_median(v, n);
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
        bench_die("rref_bench", "agent");
    const char *path = tcp ? "tcp" : "samehost";
    if (rank == 0) {
        printf("remote_to_here_us %s %.2f\n", path, median_us(a, OP_REMOTE_TO_HERE, NULL, secs));
        fflush(stdout);
        td_rref *held = NULL;
        if (td_rpc_remote(a, td_rpc_to_name("worker1"), "one", NULL, NULL, 0, &held) != TD_OK)
            bench_die("rref_bench", "remote");
        printf("three_workers_us %s %.2f\n", path, median_us(a, OP_THREE_WORKERS, held, secs));
        fflush(stdout);
        td_rref_release(held);
    }
    if (td_rpc_agent_shutdown(a, true, 0) != TD_OK)
        bench_die("rref_bench", "shutdown");
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
        bench_die("rref_bench", "register");
    const char *url = bench_store_url("rref_bench");
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
