/* tdist-bench: collective benchmarks in the manner of nccl-tests, with its flags.
 *
 *   tdist-bench --nproc 4 --op all_reduce --dtype float -b 8 -e 64M -f 2 [-n 100 -w 5] [--csv]
 *
 * prints, for each size from -b to -e (times -f, or plus -i), the size, element count and, in two
 * column sets as nccl-tests prints them, out of place and in place: the time per call, algorithm
 * bandwidth, bus bandwidth (nccl-tests' factors), number of wrong elements and timed calls; "N/A"
 * fills the set of a form that tdist's API does not have for the op (collective.c says which;
 * measure.c how time is measured). --csv prints the same rows for machines. The flags mean what
 * nccl-tests' do (-n timed iterations, -w warm-up iterations, -c check, -o reduction, -d datatype,
 * -r root); the number of ranks is --nproc. This file parses the command line and starts the ranks.
 *
 * Where the ranks come from:
 *  - under a launcher (RANK and WORLD_SIZE set by tdrun or torchrun, OMPI_COMM_WORLD_RANK/SIZE by
 *    mpirun) or with --no-spawn, this process is one rank and meets the others through env://;
 *  - otherwise tdist-bench is its own launcher: it starts a TCPStore on a free port and runs
 *    /proc/self/exe --nproc times (fork + execve, building every environment before the fork since
 *    the store's thread exists by then), with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
 *    TDIST_USE_AGENT_STORE=1, so every rank is a client of that store. It waits for them; when one
 *    fails it stops the others and says which failed and how;
 *  - with --backend threaded the ranks are --nproc threads of this process, over one HashStore.
 * Rank 0 prints. Exit code: 0; 1 a rank failed; 2 a bad command line; 3 wrong elements found. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/backend.h>
#include <tdist/pg.h>
#include <tdist/store.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "base/thread.h"
#include "bench.h"

extern char **environ;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tdist-bench [--nproc N] [--op OP] [--backend NAME] [-d T] [-o OP] [-r R] [-b SIZE] [-e SIZE]\n"
            "                   [-f F | -i SIZE] [-n N] [-w N] [--time S] [--min-iters N] [--batches N] [-c 0|1]\n"
            "                   [--csv] [--no-header] [--algo SPEC] [--no-spawn] [--timeout T] [--impl NAME]\n"
            "The one-letter flags mean what nccl-tests' do; every long flag also takes --flag=value.\n"
            "  --nproc, --nranks N    ranks to start (default 2); under a launcher, the world it gives\n"
            "  --op OP                the collective: all_reduce (default), broadcast, reduce, all_gather, gather,\n"
            "                         scatter, reduce_scatter, all_to_all, barrier, send_recv (ping-pong of ranks\n"
            "                         0 and 1); a reduction (sum, prod, ...) sets -o instead, as nccl-tests' --op\n"
            "  --backend NAME         auto (default: shm within a host), tcp, shm, threaded, or any registered backend\n"
            "  -d, --datatype, --dtype T\n"
            "                         float32/float (default), float16/half, bfloat16, float64/double, int8, int16,\n"
            "                         int32, int64, uint8, bool (or f32, f16, bf16, f64, i8..i64, u8)\n"
            "  -o, --reduce-op OP     sum (default), prod, min, max, avg, band, bor, bxor, premul_sum (x0.5), or all\n"
            "                         (a row for each of sum, prod, min, max, avg the dtype and backend take)\n"
            "  -r, --root R           root of broadcast, reduce, gather, scatter (default 0)\n"
            "  -b, --minbytes, --min SIZE   smallest size in bytes, K/M/G suffixes (default 8)\n"
            "  -e, --maxbytes, --max SIZE   largest size (default 64M)\n"
            "  -f, --stepfactor, --factor F size multiplier from one row to the next (default 2)\n"
            "  -i, --stepbytes, --step SIZE sizes grow by SIZE bytes instead, K/M/G suffixes\n"
            "  -n, --iters N          timed calls per size and form (default: as many as --time allows)\n"
            "  -w, --warmup_iters, --warmup N   warm-up calls per size and form (default: about 50 ms worth)\n"
            "  --time S               seconds of timed calls per size when -n is not given (default 0.3)\n"
            "  --min-iters N          fewest timed calls per size (default 5)\n"
            "  --batches N            timed batches per size; the time is their median (default 10)\n"
            "  -c, --check 0|1        check every result and count wrong elements (default 1)\n"
            "  --csv                  comma-separated rows with a header line\n"
            "  --no-header            no header or summary lines\n"
            "  --algo SPEC            TDIST_ALGO for the ranks (ring, rd, rhd, tree, ... or all_reduce=ring,...)\n"
            "  --no-spawn             run as one rank even without RANK/WORLD_SIZE in the environment\n"
            "  --timeout T            the group's timeout: seconds, or 500ms, 5m (default 300)\n"
            "  --impl NAME            the first CSV column (default tdist-<backend>)\n"
            "Forms: each size runs out of place and in place where tdist's API has the form, and prints a column\n"
            "set for each (time, algbw, busbw, #wrong, iters), N/A where it has not: all_reduce, broadcast and\n"
            "reduce are in place only (one tensor); all_gather (in place: the input is this rank's chunk of the\n"
            "output), reduce_scatter (the output is this rank's chunk of the input) and all_to_all (one buffer)\n"
            "have both; gather, scatter, send_recv and barrier are out of place only.\n"
            "CSV: impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters hold the\n"
            "out-of-place form, or the in-place one for an op without the other, as `placement` (the next column)\n"
            "says; inplace_time_us,inplace_algbw_gbs,inplace_busbw_gbs,inplace_wrong,inplace_iters the in-place\n"
            "form of an op that has both (N/A otherwise).\n"
            "Exit code: 0 ok, 1 a rank failed, 2 bad usage, 3 wrong elements.\n");
}

static void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tdist-bench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fprintf(stderr, "Run tdist-bench --help for the options.\n");
    exit(2);
}

/* The value of a flag given as --name value, --name=value (long spellings) or -x value, where
 * names lists the flag's spellings (NULL-terminated); NULL when argv[*i] is none of them. *typed
 * gets the spelling used, for messages. */
static const char *flag_value(int argc, char **argv, int *i, const char *const *names, const char **typed)
{
    const char *a = argv[*i];
    for (; *names; names++) {
        size_t n = strlen(*names);
        if (strncmp(a, *names, n) != 0)
            continue;
        if (a[n] == '=' && (*names)[1] == '-') {
            *typed = *names;
            return a + n + 1;
        }
        if (a[n] == '\0') {
            if (*i + 1 >= argc)
                bad_usage("%s needs a value", a);
            *typed = *names;
            return argv[++*i];
        }
    }
    return NULL;
}

/* A reduce op by name, or nccl-tests' "all"; false when v is neither. */
static bool redop_arg(const char *v, bench_options *o)
{
    if (strcmp(v, "all") == 0) {
        o->all_redops = true;
        return true;
    }
    if (td_reduce_op_from_name(v, &o->redop) != TD_OK)
        return false;
    o->all_redops = false;
    return true;
}

static int64_t int_arg(const char *what, const char *v, int64_t min, int64_t max)
{
    int64_t x;
    if (env_parse_int(what, v, min, max, &x) != TD_OK)
        bad_usage("%s", td_last_error());
    return x;
}

static double double_arg(const char *what, const char *v, double min)
{
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !(x >= min))
        bad_usage("bad value for %s", what);
    return x;
}

static void parse(int argc, char **argv, bench_options *o)
{
#define FLAG(...) flag_value(argc, argv, &i, (const char *const[]){__VA_ARGS__, NULL}, &flag)
    for (int i = 1; i < argc; i++) {
        const char *v, *flag = NULL;
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--csv") == 0) {
            o->csv = true;
        } else if (strcmp(a, "--no-header") == 0) {
            o->header = false;
        } else if (strcmp(a, "--no-spawn") == 0) {
            o->no_spawn = true;
        } else if ((v = FLAG("--nproc", "--nranks"))) {
            o->nranks = (int)int_arg(flag, v, 1, 4096);
        } else if ((v = FLAG("--op"))) {
            if (!bench_op_from_name(v, &o->op) && !redop_arg(v, o))
                bad_usage("unknown --op '%s': expected a collective (all_reduce, broadcast, reduce, all_gather, gather, "
                          "scatter, reduce_scatter, all_to_all, barrier, send_recv) or, as nccl-tests' --op, a "
                          "reduction (sum, prod, min, max, avg, all)",
                          v);
        } else if ((v = FLAG("--backend"))) {
            if (!td_backend_available(v))
                bad_usage("unknown --backend '%s': no backend of that name is registered (auto, tcp, shm, threaded, "
                          "and mpi or nccl where built)",
                          v);
            o->backend = v;
        } else if ((v = FLAG("--dtype", "--datatype", "-d"))) {
            if (td_dtype_from_name(v, &o->dtype) != TD_OK || td_dtype_is_complex(o->dtype))
                bad_usage("unsupported %s '%s' (real dtypes only: float, half, bfloat16, double, int8, int16, int32, "
                          "int64, uint8, bool)",
                          flag, v);
        } else if ((v = FLAG("--reduce-op", "-o"))) {
            if (!redop_arg(v, o))
                bad_usage("unknown %s '%s': expected sum, prod, min, max, avg, band, bor, bxor, premul_sum or all", flag,
                          v);
        } else if ((v = FLAG("--root", "-r"))) {
            o->root = (int)int_arg(flag, v, 0, 4095);
        } else if ((v = FLAG("--min", "--minbytes", "-b"))) {
            if (env_parse_size(flag, v, &o->min_bytes) != TD_OK)
                bad_usage("%s", td_last_error());
        } else if ((v = FLAG("--max", "--maxbytes", "-e"))) {
            if (env_parse_size(flag, v, &o->max_bytes) != TD_OK)
                bad_usage("%s", td_last_error());
        } else if ((v = FLAG("--factor", "--stepfactor", "-f"))) {
            o->factor = double_arg(flag, v, 1.0000001);
        } else if ((v = FLAG("--step", "--stepbytes", "-i"))) {
            if (env_parse_size(flag, v, &o->step_bytes) != TD_OK || o->step_bytes == 0)
                bad_usage("%s wants a size of at least one byte, got '%s'", flag, v);
        } else if ((v = FLAG("--iters", "-n"))) {
            o->iters = int_arg(flag, v, 1, INT32_MAX);
        } else if ((v = FLAG("--warmup", "--warmup_iters", "-w"))) {
            o->warmup = int_arg(flag, v, 0, INT32_MAX);
        } else if ((v = FLAG("--time"))) {
            o->time_s = double_arg(flag, v, 0);
        } else if ((v = FLAG("--min-iters"))) {
            o->min_iters = int_arg(flag, v, 1, INT32_MAX);
        } else if ((v = FLAG("--batches"))) {
            o->batches = (int)int_arg(flag, v, 1, 1000);
        } else if ((v = FLAG("--check", "-c"))) {
            bool b;
            if (env_parse_bool(flag, v, &b) != TD_OK)
                bad_usage("%s", td_last_error());
            o->check = b;
        } else if ((v = FLAG("--algo"))) {
            o->algo = v;
        } else if ((v = FLAG("--timeout"))) {
            if (env_parse_duration_ms(flag, v, 1000, &o->timeout_ms) != TD_OK)
                bad_usage("%s", td_last_error());
        } else if ((v = FLAG("--impl"))) {
            o->impl = v;
        } else {
            bad_usage("unknown argument '%s'", a);
        }
    }
#undef FLAG
    if (o->min_bytes > o->max_bytes)
        bad_usage("%s", "--min is larger than --max");
    if (bench_op_reduces(o->op) && !o->all_redops && td_reduce_check(o->redop, o->dtype) != TD_OK)
        bad_usage("%s", td_last_error());
}

static td_pg_options pg_options(const bench_options *o)
{
    td_pg_options po = TD_PG_OPTIONS_INIT;
    po.backend = o->backend;
    po.timeout_ms = o->timeout_ms;
    return po;
}

static int check_world(const bench_options *o, int world)
{
    if (o->nranks && o->nranks != world) {
        fprintf(stderr, "tdist-bench: --nproc %d, but the launcher started %d ranks\n", o->nranks, world);
        return 2;
    }
    if (o->op == BENCH_SEND_RECV && world < 2) {
        fprintf(stderr, "tdist-bench: send_recv needs at least 2 ranks\n");
        return 2;
    }
    if (o->root >= world) {
        fprintf(stderr, "tdist-bench: --root %d is not a rank of a world of %d\n", o->root, world);
        return 2;
    }
    return 0;
}

/* ---- one rank of a launched job ------------------------------------------------------------- */

static int run_as_rank(const bench_options *o)
{
    td_pg_options po = pg_options(o);
    po.init_method = "env://";
    const char *ompi_rank = getenv("OMPI_COMM_WORLD_RANK"), *ompi_size = getenv("OMPI_COMM_WORLD_SIZE");
    if (!getenv("RANK") && ompi_rank && ompi_size) {
        po.rank = (int)int_arg("OMPI_COMM_WORLD_RANK", ompi_rank, 0, INT32_MAX);
        po.world_size = (int)int_arg("OMPI_COMM_WORLD_SIZE", ompi_size, 1, INT32_MAX);
    } else if (o->no_spawn && !getenv("WORLD_SIZE") && o->nranks) {
        po.world_size = o->nranks;
    }
    if (o->algo)
        setenv("TDIST_ALGO", o->algo, 1); /* still single-threaded here */
    td_pg *pg = NULL;
    if (td_pg_create(&po, &pg) != TD_OK) {
        fprintf(stderr, "tdist-bench: creating the %s process group: %s\n", o->backend, td_last_error());
        return 1;
    }
    int rc = check_world(o, td_pg_size(pg));
    if (!rc)
        rc = bench_run_rank(o, pg);
    td_pg_destroy(pg);
    return rc;
}

/* ---- ranks as threads (threaded backend) ------------------------------------------------------ */

typedef struct rank_thread {
    const bench_options *o;
    td_store *store;
    int rank;
    int rc;
    pthread_t th;
} rank_thread;

static void *rank_thread_main(void *p)
{
    rank_thread *t = p;
    td_pg_options po = pg_options(t->o);
    po.store = t->store;
    po.rank = t->rank;
    po.world_size = t->o->nranks;
    td_pg *pg = NULL;
    if (td_pg_create(&po, &pg) != TD_OK) {
        fprintf(stderr, "tdist-bench: [rank %d] creating the %s process group: %s\n", t->rank, t->o->backend,
                td_last_error());
        t->rc = 1;
        td_threaded_abort_all("tdist-bench: another rank failed to create its group");
        return NULL;
    }
    t->rc = bench_run_rank(t->o, pg);
    if (t->rc == 1)
        td_threaded_abort_all("tdist-bench: another rank failed");
    td_pg_destroy(pg);
    return NULL;
}

static int run_threads(const bench_options *o)
{
    int rc = check_world(o, o->nranks);
    if (rc)
        return rc;
    td_store *store = NULL;
    if (td_hash_store_create(&store) != TD_OK) {
        fprintf(stderr, "tdist-bench: %s\n", td_last_error());
        return 1;
    }
    rank_thread *ts = TD_NEW_ARRAY(rank_thread, o->nranks);
    int started = 0;
    for (; started < o->nranks; started++) {
        ts[started] = (rank_thread){.o = o, .store = store, .rank = started};
        char name[24];
        snprintf(name, sizeof name, "bench-rank%d", started);
        if (thread_start(&ts[started].th, name, rank_thread_main, &ts[started]) != TD_OK) {
            fprintf(stderr, "tdist-bench: starting rank thread %d: %s\n", started, td_last_error());
            td_threaded_abort_all("tdist-bench: could not start every rank");
            rc = 1;
            break;
        }
    }
    for (int r = 0; r < started; r++) {
        thread_join(ts[r].th);
        if (ts[r].rc > rc)
            rc = ts[r].rc;
    }
    free(ts);
    td_store_release(store);
    return rc;
}

/* ---- tdist-bench as its own launcher ---------------------------------------------------------- */

/* The variables every rank gets its own value of (and TDIST_ALGO when --algo sets it). */
static bool replaced_var(const bench_options *o, const char *entry)
{
    static const char *const names[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
                                        "MASTER_PORT=", "TDIST_USE_AGENT_STORE=", "TDIST_RESTART_COUNT=",
                                        "TORCHELASTIC_USE_AGENT_STORE="};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strncmp(entry, names[i], strlen(names[i])) == 0)
            return true;
    return o->algo && strncmp(entry, "TDIST_ALGO=", 11) == 0;
}

static char **rank_env(const bench_options *o, int rank, int port)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = alloc_zeroed(n + 12, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (replaced_var(o, environ[i]))
            continue;
        env[k++] = alloc_strdup(environ[i]);
    }
    env[k++] = alloc_printf("RANK=%d", rank);
    env[k++] = alloc_printf("WORLD_SIZE=%d", o->nranks);
    env[k++] = alloc_printf("LOCAL_RANK=%d", rank);
    env[k++] = alloc_printf("LOCAL_WORLD_SIZE=%d", o->nranks);
    env[k++] = alloc_strdup("MASTER_ADDR=127.0.0.1");
    env[k++] = alloc_printf("MASTER_PORT=%d", port);
    env[k++] = alloc_strdup("TDIST_USE_AGENT_STORE=1");
    env[k++] = alloc_strdup("TDIST_RESTART_COUNT=0");
    if (o->algo)
        env[k++] = alloc_printf("TDIST_ALGO=%s", o->algo);
    env[k] = NULL;
    return env;
}

static void free_env(char **env)
{
    for (char **p = env; *p; p++)
        free(*p);
    free(env);
}

static void describe_exit(int rank, int status, char *buf, size_t size)
{
    if (WIFEXITED(status))
        snprintf(buf, size, "rank %d exited with code %d", rank, WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, size, "rank %d was killed by signal %d (%s)", rank, WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, size, "rank %d ended with status %d", rank, status);
}

static int spawn_ranks(const bench_options *o, char **argv)
{
    td_tcp_store_options so = TD_TCP_STORE_OPTIONS_INIT;
    so.host = "127.0.0.1";
    so.port = 0;
    so.is_master = true;
    so.wait_for_workers = false;
    so.timeout_ms = o->timeout_ms;
    td_store *store = NULL;
    if (td_tcp_store_create(&so, &store) != TD_OK) {
        fprintf(stderr, "tdist-bench: starting the TCPStore: %s\n", td_last_error());
        return 1;
    }
    int port = td_tcp_store_port(store);
    pid_t *pids = TD_NEW_ARRAY(pid_t, o->nranks);
    int started = 0, rc = 0, running = 0;
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    for (; started < o->nranks; started++) {
        char **env = rank_env(o, started, port);
        pid_t pid = fork();
        if (pid == 0) {
            /* Only async-signal-safe calls until execve: the store's server thread exists. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(127);
            execve("/proc/self/exe", argv, env);
            static const char msg[] = "tdist-bench: execve(/proc/self/exe) failed\n";
            (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
            _exit(127);
        }
        int err = errno;
        free_env(env);
        if (pid < 0) {
            fprintf(stderr, "tdist-bench: fork for rank %d: %s\n", started, strerror(err));
            rc = 1;
            break;
        }
        pids[started] = pid;
        running++;
    }
    /* Wait for every rank. The first failure (anything but 0 or 3, wrong elements, which every
     * rank reports alike) stops the others: SIGTERM, then SIGKILL after 5 s. */
    char first[160] = "";
    int64_t kill_at = 0;
    bool stopping = rc != 0;
    if (stopping)
        for (int r = 0; r < started; r++)
            kill(pids[r], SIGTERM);
    if (stopping)
        kill_at = clock_now_ms() + 5000;
    while (running > 0) {
        int st;
        pid_t pid = waitpid(-1, &st, stopping ? WNOHANG : 0);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == 0) {
            if (clock_now_ms() >= kill_at) {
                for (int r = 0; r < started; r++)
                    if (pids[r] > 0)
                        kill(pids[r], SIGKILL);
                kill_at = INT64_MAX;
            }
            clock_sleep_ms(10);
            continue;
        }
        int r = 0;
        while (r < started && pids[r] != pid)
            r++;
        if (r == started)
            continue;
        pids[r] = -1;
        running--;
        bool ok = WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 3);
        if (ok) {
            if (WEXITSTATUS(st) == 3 && rc == 0)
                rc = 3;
            continue;
        }
        if (!stopping) {
            describe_exit(r, st, first, sizeof first);
            stopping = true;
            rc = 1;
            kill_at = clock_now_ms() + 5000;
            for (int q = 0; q < started; q++)
                if (pids[q] > 0)
                    kill(pids[q], SIGTERM);
        }
    }
    if (first[0])
        fprintf(stderr, "tdist-bench: %s; the other ranks were stopped\n", first);
    free(pids);
    td_store_release(store);
    return rc;
}

int main(int argc, char **argv)
{
    bench_options o = {
        .nranks = 0,
        .op = BENCH_ALL_REDUCE,
        .backend = "auto",
        .dtype = TD_FLOAT32,
        .redop = TD_SUM,
        .all_redops = false,
        .root = 0,
        .min_bytes = 8,
        .max_bytes = 64u << 20,
        .factor = 2,
        .iters = 0,
        .warmup = -1,
        .time_s = 0.3,
        .min_iters = 5,
        .batches = 10,
        .check = true,
        .csv = false,
        .header = true,
        .algo = NULL,
        .no_spawn = false,
        .timeout_ms = 300000,
        .impl = NULL,
    };
    parse(argc, argv, &o);
    char impl[64];
    if (!o.impl) {
        snprintf(impl, sizeof impl, "tdist-%s", o.backend);
        o.impl = impl;
    }
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(o.backend, "threaded") == 0) {
        if (!o.nranks)
            o.nranks = 2;
        return run_threads(&o);
    }
    bool launched = (getenv("RANK") && getenv("WORLD_SIZE")) ||
                    (getenv("OMPI_COMM_WORLD_RANK") && getenv("OMPI_COMM_WORLD_SIZE"));
    if (launched || o.no_spawn)
        return run_as_rank(&o);
    if (!o.nranks)
        o.nranks = 2;
    int rc = check_world(&o, o.nranks);
    return rc ? rc : spawn_ranks(&o, argv);
}
