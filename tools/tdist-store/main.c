/* tdist-store: runs a TCPStore server as its own program, for jobs whose store should not live
 * inside rank 0 (it then survives any rank, and every rank is a plain client).
 *
 *   tdist-store --host 0.0.0.0 --port 29500 --world-size 4 --timeout 300 --wait-for-workers
 *
 * prints "tdist-store listening on HOST:PORT" (the bound port when --port 0) on stdout, optionally
 * waits for --world-size clients to count themselves in (as a TCPStore master with
 * wait_for_workers does), then serves until SIGTERM or SIGINT and exits 0. Signals are taken with
 * sigtimedwait in the main thread, so shutdown stops and joins the server thread cleanly. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <tdist/store.h>

#include "base/clock.h"
#include "base/env.h"
#include "base/error.h"
#include "store/tcp_server.h"
#include "store/tcp_store.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tdist-store [--host ADDR] [--port N] [--world-size N] [--timeout SECONDS]\n"
            "                   [--wait-for-workers] [--max-key SIZE] [--max-value SIZE]\n"
            "  --host ADDR         address to bind (default: every interface, IPv6 and IPv4)\n"
            "  --port N            port to bind; 0 picks a free one (default 29500)\n"
            "  --world-size N      number of clients that will count themselves in (for --wait-for-workers)\n"
            "  --timeout T         how long to wait for workers: seconds, or 500ms, 5m (default 300)\n"
            "  --wait-for-workers  wait until --world-size clients joined; exit 1 if they do not in time\n"
            "  --max-key SIZE      longest key accepted (default 64K, or TDIST_STORE_MAX_KEY)\n"
            "  --max-value SIZE    largest value accepted (default 512M, or TDIST_STORE_MAX_VALUE)\n"
            "When TDIST_AUTH_TOKEN is set in this program's environment, clients must prove they hold the\n"
            "same secret (it never travels; see docs/protocols.md, \"Authentication\").\n"
            "Prints 'tdist-store listening on HOST:PORT'; exits 0 on SIGTERM or SIGINT.\n");
}

/* --name value or --name=value; returns the value or NULL when argv[*i] is not this flag. */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tdist-store: %s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

static void die(const char *what)
{
    fprintf(stderr, "tdist-store: %s: %s\n", what, td_last_error());
    exit(1);
}

/* Sleeps up to ms, returning the signal that arrived (0 if none). */
static int wait_signal(const sigset_t *set, int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    for (;;) {
        int sig = ms < 0 ? sigwaitinfo(set, NULL) : sigtimedwait(set, NULL, &ts);
        if (sig > 0)
            return sig;
        if (errno == EAGAIN)
            return 0;
        if (errno != EINTR)
            return 0;
    }
}

int main(int argc, char **argv)
{
    const char *host = NULL;
    int64_t port = 29500, world = -1, timeout_ms = 300000;
    uint64_t max_key = 0, max_value = 0;
    bool wait_workers = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--wait-for-workers") == 0) {
            wait_workers = true;
        } else if ((v = flag_value(argc, argv, &i, "--host"))) {
            host = v;
        } else if ((v = flag_value(argc, argv, &i, "--port"))) {
            if (env_parse_int("--port", v, 0, 65535, &port) != TD_OK)
                die("bad flag");
        } else if ((v = flag_value(argc, argv, &i, "--world-size"))) {
            if (env_parse_int("--world-size", v, 1, INT32_MAX, &world) != TD_OK)
                die("bad flag");
        } else if ((v = flag_value(argc, argv, &i, "--timeout"))) {
            if (env_parse_duration_ms("--timeout", v, 1000, &timeout_ms) != TD_OK)
                die("bad flag");
        } else if ((v = flag_value(argc, argv, &i, "--max-key"))) {
            if (env_parse_size("--max-key", v, &max_key) != TD_OK)
                die("bad flag");
        } else if ((v = flag_value(argc, argv, &i, "--max-value"))) {
            if (env_parse_size("--max-value", v, &max_value) != TD_OK)
                die("bad flag");
        } else {
            fprintf(stderr, "tdist-store: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (wait_workers && world < 1) {
        fprintf(stderr, "tdist-store: --wait-for-workers needs --world-size\n");
        return 2;
    }

    /* A store serves every rank of a job: allow as many connections as the hard limit does. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    /* Block the stop signals before any thread exists, so every thread inherits the mask and only
     * sigtimedwait below takes them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    td_store_server_options so = {.host = host, .port = (int)port, .auth_token = NULL,
                                  .max_key_len = (size_t)max_key, .max_value_len = (size_t)max_value};
    td_store_server *server = NULL;
    if (store_server_start(&so, &server) != TD_OK)
        die("cannot start");
    printf("tdist-store listening on %s\n", store_server_address(server));
    fflush(stdout);

    int rc = 0, sig = 0;
    if (wait_workers) {
        td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
        o.host = host && *host ? host : "127.0.0.1";
        if (strcmp(o.host, "0.0.0.0") == 0 || strcmp(o.host, "::") == 0)
            o.host = "127.0.0.1";
        o.port = store_server_port(server);
        o.timeout_ms = timeout_ms;
        o.wait_for_workers = false;
        td_store *client = NULL;
        if (td_tcp_store_create(&o, &client) != TD_OK) {
            fprintf(stderr, "tdist-store: %s\n", td_last_error());
            rc = 1;
        }
        int64_t start = clock_now_ns(), joined = 0;
        bool done = false;
        while (client && !done && !sig) {
            if (tcp_store_workers_step(client, (int)world, start, timeout_ms, &joined, &done) != TD_OK) {
                fprintf(stderr, "tdist-store: %s\n", td_last_error());
                rc = 1;
                break;
            }
            if (!done)
                sig = wait_signal(&stop, 10);
        }
        td_store_release(client);
        if (done) {
            printf("tdist-store: all %lld workers joined\n", (long long)world);
            fflush(stdout);
        }
    }
    if (rc == 0 && !sig)
        sig = wait_signal(&stop, -1);
    if (sig)
        fprintf(stderr, "tdist-store: stopping on %s\n", strsignal(sig));
    store_server_stop(server);
    return rc;
}
