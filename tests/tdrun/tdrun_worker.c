/* A worker program for tdrun's tests: each mode exercises one thing the launcher promises.
 *
 *   env                 print the launcher's variables on one line
 *   spam N              N stdout and N/2 stderr lines, each written in two pieces
 *   fail RANK CODE      RANK exits CODE after 300 ms; the others wait to be stopped and say so
 *   restart N           rank 0 fails until TDIST_RESTART_COUNT reaches N, then everyone succeeds
 *   sleep DIR           write DIR/<rank>.pid, then sleep until killed
 *   store [RANK N]      join the job's store through env:// and count the ranks that joined; with
 *                       RANK and N, rank RANK first exits 1 before joining while TDIST_RESTART_COUNT < N
 *   torchenv            print torchrun's other variables (TORCHELASTIC_*, ROLE_*, GROUP_*) on one line
 *   errfile RANK KIND   RANK writes TORCHELASTIC_ERROR_FILE (KIND json: torchrun's layout with a
 *                       two-line py_callstack; text: plain text) and exits 1; the others wait
 *   out                 one stdout and one stderr line
 *   pgtimeout           a process group with a 1 s timeout whose rank 1 never joins rank 0's
 *                       all_reduce: rank 0 fails, leaving the library's record in its error file
 *   record              td_record_error("bad batch 7 of rank R") on rank 1, which exits 1
 *   log                 log through tdist's log (with and without its rank, one message in PyTorch's
 *                       "[Rank R]" form) beside a plain line */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/pg.h>
#include <tdist/store.h>
#include <tdist/tensor.h>

#include "base/log.h"

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static const char *env_str(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "<unset>";
}

static volatile sig_atomic_t g_term;
static void on_term(int sig) { g_term = sig; }

static void say(const char *text)
{
    (void)!write(STDOUT_FILENO, text, strlen(text));
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 64;
    const char *mode = argv[1];
    int rank = env_int("RANK");
    char line[512];

    if (strcmp(mode, "env") == 0) {
        printf("ENV RANK=%s LOCAL_RANK=%s WORLD_SIZE=%s LOCAL_WORLD_SIZE=%s GROUP_RANK=%s MASTER_ADDR=%s "
               "MASTER_PORT=%s TDIST_RESTART_COUNT=%s TDIST_USE_AGENT_STORE=%s\n",
               env_str("RANK"), env_str("LOCAL_RANK"), env_str("WORLD_SIZE"), env_str("LOCAL_WORLD_SIZE"),
               env_str("GROUP_RANK"), env_str("MASTER_ADDR"), env_str("MASTER_PORT"), env_str("TDIST_RESTART_COUNT"),
               env_str("TDIST_USE_AGENT_STORE"));
        return 0;
    }
    if (strcmp(mode, "secret") == 0) {
        /* The job's secret: its length and a prefix (the test compares ranks and runs), and a
         * client without it refused by the job's store. */
        const char *sec = getenv("TDIST_AUTH_TOKEN");
        printf("SECRET len=%zu id=%.8s\n", sec ? strlen(sec) : (size_t)0, sec ? sec : "");
        td_tcp_store_options so = TD_TCP_STORE_OPTIONS_INIT;
        so.host = getenv("MASTER_ADDR");
        so.port = env_int("MASTER_PORT");
        so.timeout_ms = 10000;
        so.auth_token = "";
        td_store *stranger = NULL;
        if (td_tcp_store_create(&so, &stranger) == TD_OK) {
            printf("STRANGER admitted\n");
            td_store_release(stranger);
        } else {
            printf("STRANGER refused: %s\n", td_last_error());
        }
        return 0;
    }
    if (strcmp(mode, "cpus") == 0) { /* the CPUs this worker may run on, "CPUS 0,1" */
        cpu_set_t set;
        if (sched_getaffinity(0, sizeof set, &set) != 0)
            return 3;
        char list[256] = "";
        size_t len = 0;
        for (int c = 0; c < CPU_SETSIZE && len < sizeof list - 8; c++)
            if (CPU_ISSET(c, &set))
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? "," : "", c);
        printf("CPUS LOCAL_RANK=%s %s\n", env_str("LOCAL_RANK"), list);
        return 0;
    }
    if (strcmp(mode, "torchenv") == 0) {
        /* The error file must be a path of its own in a directory that exists. */
        const char *ef = getenv("TORCHELASTIC_ERROR_FILE");
        char want_tail[64];
        snprintf(want_tail, sizeof want_tail, "/attempt_%s/%s/error.json", env_str("TORCHELASTIC_RESTART_COUNT"),
                 env_str("LOCAL_RANK"));
        bool ef_ok = false;
        if (ef && strlen(ef) > strlen(want_tail) && strcmp(ef + strlen(ef) - strlen(want_tail), want_tail) == 0) {
            FILE *f = fopen(ef, "w");
            ef_ok = f != NULL;
            if (f)
                fclose(f);
            unlink(ef);
        }
        printf("TORCHENV RANK=%s TORCHELASTIC_RESTART_COUNT=%s TORCHELASTIC_MAX_RESTARTS=%s TORCHELASTIC_RUN_ID=%s "
               "ROLE_NAME=%s ROLE_RANK=%s ROLE_WORLD_SIZE=%s GROUP_RANK=%s GROUP_WORLD_SIZE=%s ERROR_FILE=%s "
               "TORCHELASTIC_USE_AGENT_STORE=%s\n",
               env_str("RANK"), env_str("TORCHELASTIC_RESTART_COUNT"), env_str("TORCHELASTIC_MAX_RESTARTS"),
               env_str("TORCHELASTIC_RUN_ID"), env_str("ROLE_NAME"), env_str("ROLE_RANK"), env_str("ROLE_WORLD_SIZE"),
               env_str("GROUP_RANK"), env_str("GROUP_WORLD_SIZE"), ef_ok ? "ok" : env_str("TORCHELASTIC_ERROR_FILE"),
               env_str("TORCHELASTIC_USE_AGENT_STORE"));
        return 0;
    }
    if (strcmp(mode, "errfile") == 0 && argc > 3) {
        signal(SIGTERM, on_term);
        if (rank == atoi(argv[2])) {
            usleep(300 * 1000);
            FILE *f = fopen(env_str("TORCHELASTIC_ERROR_FILE"), "w");
            if (!f)
                return 3;
            if (strcmp(argv[3], "json") == 0)
                fprintf(f, "{\"message\": {\"message\": \"ValueError: bad batch\", \"extraInfo\": "
                           "{\"py_callstack\": \"Traceback (most recent call last):\\n  File \\\"train.c\\\", "
                           "line 7\\nValueError: bad batch \\u0041\", \"timestamp\": \"1700000000\"}}}\n");
            else
                fprintf(f, "worker %d: the data file is missing\n", rank);
            fclose(f);
            return 1;
        }
        for (int i = 0; i < 600 && !g_term; i++)
            usleep(100 * 1000);
        return g_term ? 0 : 1;
    }
    if (strcmp(mode, "log") == 0) {
        printf("PLAIN of rank %d\n", rank);
        fflush(stdout);
        TD_LOG_WARN("LOG before the rank is known");
        log_set_rank(rank);
        TD_LOG_WARN("LOG of rank %d", rank);
        TD_LOG_ERROR("[Rank %d] LOG Watchdog caught collective operation timeout", rank);
        return 0;
    }
    if (strcmp(mode, "out") == 0) {
        printf("OUT of rank %d\n", rank);
        fflush(stdout);
        fprintf(stderr, "ERR of rank %d\n", rank);
        return 0;
    }
    if (strcmp(mode, "spam") == 0 && argc > 2) {
        int n = atoi(argv[2]);
        for (int i = 0; i < n; i++) {
            /* Two writes per line: the launcher must join the pieces, never mix them with other
             * workers' lines. */
            snprintf(line, sizeof line, "LINE %d %d ", rank, i);
            (void)!write(STDOUT_FILENO, line, strlen(line));
            snprintf(line, sizeof line, "%064d END\n", i);
            (void)!write(STDOUT_FILENO, line, strlen(line));
            if (i % 2 == 0) {
                snprintf(line, sizeof line, "ERRLINE %d %d END\n", rank, i);
                (void)!write(STDERR_FILENO, line, strlen(line));
            }
        }
        return 0;
    }
    if (strcmp(mode, "fail") == 0 && argc > 3) {
        signal(SIGTERM, on_term);
        if (rank == atoi(argv[2])) {
            usleep(300 * 1000);
            say("failing now\n");
            return atoi(argv[3]);
        }
        for (int i = 0; i < 600 && !g_term; i++)
            usleep(100 * 1000);
        snprintf(line, sizeof line, "rank %d got %s\n", rank, g_term ? "SIGTERM" : "no signal");
        say(line);
        return g_term ? 0 : 1;
    }
    if (strcmp(mode, "restart") == 0 && argc > 2) {
        int want = atoi(argv[2]);
        int count = env_int("TDIST_RESTART_COUNT");
        snprintf(line, sizeof line, "attempt %d\n", count);
        say(line);
        if (count < want) {
            if (rank == 0) {
                usleep(300 * 1000); /* let the others print their attempt line first */
                return 1;
            }
            for (int i = 0; i < 600; i++)
                usleep(100 * 1000);
            return 1;
        }
        snprintf(line, sizeof line, "DONE restart=%d\n", count);
        say(line);
        return 0;
    }
    if (strcmp(mode, "pgtimeout") == 0) {
        td_pg_options o = TD_PG_OPTIONS_INIT;
        o.backend = "tcp";
        o.timeout_ms = 1000;
        if (td_init_process_group(&o) != TD_OK) {
            fprintf(stderr, "init failed: %s\n", td_last_error());
            return 2;
        }
        if (rank != 0) {
            for (;;)
                pause();
        }
        td_tensor *t = NULL;
        td_tensor_full(TD_FLOAT32, TD_SHAPE(4), 1.0, &t);
        td_status st = td_pg_all_reduce(td_default_pg(), t, TD_OP_SUM, NULL);
        td_tensor_release(t);
        fprintf(stderr, "all_reduce: %s\n", td_status_str(st));
        return st == TD_OK ? 0 : 1; /* no td_record_error: the library recorded the failure */
    }
    if (strcmp(mode, "record") == 0) {
        if (rank != 1) {
            for (int i = 0; i < 600; i++)
                usleep(100 * 1000);
            return 1;
        }
        if (td_record_error("bad batch %d of rank %d", 7, rank) != TD_OK) {
            fprintf(stderr, "td_record_error: %s\n", td_last_error());
            return 2;
        }
        return 1;
    }
    if (strcmp(mode, "sleep") == 0 && argc > 2) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%d.pid", argv[2], rank);
        FILE *f = fopen(path, "w");
        if (!f)
            return 3;
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
        for (;;)
            pause();
    }
    if (strcmp(mode, "store") == 0) {
        int count = env_int("TDIST_RESTART_COUNT");
        if (argc > 3 && rank == atoi(argv[2]) && count < atoi(argv[3])) {
            snprintf(line, sizeof line, "failing before rendezvous in attempt %d\n", count);
            say(line);
            return 1;
        }
        td_store *store = NULL;
        int r = -1, world = -1;
        if (td_rendezvous("env://", -1, -1, 30000, &store, &r, &world) != TD_OK) {
            fprintf(stderr, "rendezvous failed: %s\n", td_last_error());
            return 2;
        }
        int64_t joined = 0;
        if (td_store_add(store, "joined", 1, &joined) != TD_OK) {
            fprintf(stderr, "add failed: %s\n", td_last_error());
            return 2;
        }
        if (joined == world)
            td_store_set_str(store, "all_joined", "1");
        const char *keys[] = {"all_joined"};
        if (td_store_wait(store, keys, 1, TD_STORE_TIMEOUT_DEFAULT) != TD_OK) {
            fprintf(stderr, "wait failed: %s\n", td_last_error());
            return 2;
        }
        td_store_add(store, "joined", 0, &joined);
        printf("STORE rank=%d world=%d joined=%lld attempt=%d\n", r, world, (long long)joined, count);
        fflush(stdout);
        /* Leave only after everyone has read the count (rank 0's store may be hosted elsewhere,
         * but the key must stay readable until all have seen it). */
        td_store_add(store, "done", 1, NULL);
        td_store_release(store);
        return 0;
    }
    return 64;
}
