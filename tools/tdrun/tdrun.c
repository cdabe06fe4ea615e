/* tdrun: the launcher, tdist's torchrun.
 *
 *   tdrun --nproc-per-node 4 ./train --epochs 3
 *
 * The agent on each node starts the local workers (workers.c) with the job's environment, relays
 * their output, and watches them. Node 0 also hosts the job's TCPStore, so workers initialize with
 * a plain env:// rendezvous (TDIST_USE_AGENT_STORE=1 tells them to join it as clients, under a
 * prefix of their attempt so that a restarted group never reads the keys of the one before).
 *
 * When a worker fails, the others are stopped (SIGTERM, SIGKILL after a grace period), a summary in
 * torchrun's layout names the first failure, and tdrun exits 1 - unless --max-restarts allows
 * another attempt, in which case the whole local group starts again with TDIST_RESTART_COUNT
 * raised. With several nodes, the nodes agree on the job's shape and restart together (job.c): a
 * failure on one node ends the round on every node. SIGINT, SIGTERM and SIGHUP sent to tdrun
 * reach every worker (and, with several nodes, stop the other nodes' too); tdrun then exits with
 * 128 + the signal number.
 *
 * A job is authenticated by default: a single-node tdrun without TDIST_AUTH_TOKEN makes a random
 * secret for the job and puts it in its own environment before it hosts the store, so the store,
 * the workers' stores, transports and RPC agents all admit only the job's processes
 * (docs/protocols.md, "Authentication"). Several nodes cannot share a secret one of them made up:
 * they use the TDIST_AUTH_TOKEN they were given, and run unauthenticated, with a warning, without
 * one. TDIST_AUTH_TOKEN set to the empty string turns authentication off. */
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <tdist/store.h>

#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "net/auth.h"
#include "tdrun.h"

static const tdrun_options *g_opts;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    if (g_opts && g_opts->quiet)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    fputs("tdrun: ", stderr);
    fwrite(line, 1, (size_t)n, stderr);
    fflush(stderr);
}

/* The program must exist before anything starts: a typo should not cost a store and N forks. */
static td_status check_program(const char *prog)
{
    if (strchr(prog, '/')) {
        if (access(prog, X_OK) != 0)
            return error_errno(TD_ERR_INVALID, "cannot run '%s'", prog);
        return TD_OK;
    }
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    char *copy = strdup(path), *save = NULL;
    bool found = false;
    for (char *dir = strtok_r(copy, ":", &save); dir && !found; dir = strtok_r(NULL, ":", &save)) {
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", *dir ? dir : ".", prog);
        struct stat st;
        found = stat(full, &st) == 0 && S_ISREG(st.st_mode) && access(full, X_OK) == 0;
    }
    free(copy);
    return found ? TD_OK : error_fmt(TD_ERR_INVALID, "cannot run '%s': not found in PATH", prog);
}

static void format_time(int64_t wall_ns, char *out, size_t size)
{
    time_t t = (time_t)(wall_ns / 1000000000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(out, size, "%Y-%m-%d_%H:%M:%S", &tm);
}

/* Decodes the JSON string value of the first `"key": "..."` in text (a key whose value is an object
 * is passed over); false if there is none. */
static bool json_string(const char *text, const char *key, td_buf *out)
{
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    for (const char *p = text; (p = strstr(p, quoted)); p++) {
        const char *q = p + strlen(quoted);
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
            q++;
        if (*q++ != ':')
            continue;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r')
            q++;
        if (*q++ != '"')
            continue;
        buf_clear(out);
        for (; *q && *q != '"'; q++) {
            if (*q != '\\') {
                buf_putc(out, *q);
                continue;
            }
            q++;
            switch (*q) {
            case 'n': buf_putc(out, '\n'); break;
            case 't': buf_putc(out, '\t'); break;
            case 'r': break;
            case 'b': case 'f': break;
            case 'u': /* \uXXXX: ASCII as itself, anything else as '?' */
                if (q[1] && q[2] && q[3] && q[4]) {
                    unsigned cp = (unsigned)strtoul((char[]){q[1], q[2], q[3], q[4], 0}, NULL, 16);
                    buf_putc(out, cp < 0x80 ? (char)cp : '?');
                    q += 4;
                }
                break;
            case '\0': q--; break;
            default: buf_putc(out, *q); break;
            }
        }
        buf_putc(out, '\0');
        return true;
    }
    return false;
}

/* What a failed worker wrote to its TORCHELASTIC_ERROR_FILE: torchrun's JSON
 * ({"message": {"message": ..., "extraInfo": {"py_callstack": ...}}} or {"message": "..."}) or plain
 * text. False when the worker wrote nothing. */
static bool read_error_file(const char *path, td_buf *out)
{
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return false;
    td_buf raw = TD_BUF_INIT;
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && raw.len < 65536)
        buf_append(&raw, chunk, n);
    fclose(f);
    buf_putc(&raw, '\0');
    bool ok = raw.len > 1;
    if (ok && !json_string(raw.data, "py_callstack", out) && !json_string(raw.data, "message", out)) {
        buf_clear(out);
        buf_append(out, raw.data, raw.len);
    }
    buf_free(&raw);
    if (!ok)
        return false;
    while (out->len > 1 && (out->data[out->len - 2] == '\n' || out->data[out->len - 2] == ' ')) {
        out->data[out->len - 2] = '\0';
        out->len--;
    }
    return out->len > 1;
}

static void print_failure(const tdrun_options *o, tdrun_group *g, const tdrun_exit *f)
{
    char when[64], host[256] = "localhost", code[128];
    format_time(f->when_ns, when, sizeof when);
    gethostname(host, sizeof host);
    snprintf(code, sizeof code, "%d (pid: %d)", f->code, (int)f->pid);
    td_buf trace = TD_BUF_INIT;
    const char *error_file = tdrun_group_error_file(g, f->local_rank);
    bool have_error_file = read_error_file(error_file, &trace);
    if (!have_error_file) {
        buf_clear(&trace);
        if (f->code < 0)
            buf_printf(&trace, "Signal %d (SIG%s) received by PID %d", -f->code,
                       sigabbrev_np(-f->code) ? sigabbrev_np(-f->code) : "?", (int)f->pid);
        else
            buf_printf(&trace, "the worker wrote no error file (a program may write one to TORCHELASTIC_ERROR_FILE)");
        buf_putc(&trace, '\0');
    }
    /* Continuation lines of a traceback line up under its first line. */
    td_buf indented = TD_BUF_INIT;
    for (const char *p = trace.data; *p; p++) {
        buf_putc(&indented, *p);
        if (*p == '\n')
            buf_append(&indented, "              ", 14);
    }
    buf_putc(&indented, '\0');
    const char *log = tdrun_group_log_file(g, f->local_rank);
    fprintf(stderr,
            "============================================================\n"
            "%s FAILED\n"
            "------------------------------------------------------------\n"
            "Root Cause (first observed failure):\n"
            "[0]:\n"
            "  time      : %s\n"
            "  host      : %s\n"
            "  rank      : %d (local_rank: %d)\n"
            "  exitcode  : %s\n"
            "  error_file: %s\n"
            "  traceback : %s\n"
            "  log file  : %s\n"
            "============================================================\n",
            o->argv[0], when, host, f->rank, f->local_rank, code, have_error_file ? error_file : "<N/A>",
            indented.data, log ? log : "<N/A> (use --log-dir)");
    fflush(stderr);
    buf_free(&trace);
    buf_free(&indented);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* The run's own directory: DIR/<run_id>_XXXXXX under --log-dir (a second run never overwrites the
 * first, as torchrun's), else a temporary one for the error files, removed at the end. */
static td_status make_run_dir(tdrun_options *o)
{
    if (o->log_dir) {
        TD_TRY(tdrun_make_dirs(o->log_dir));
        snprintf(o->run_dir, sizeof o->run_dir, "%s/%s_XXXXXX", o->log_dir, o->run_id);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(o->run_dir, sizeof o->run_dir, "%s/tdrun_%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", o->run_id);
    }
    if (!mkdtemp(o->run_dir))
        return error_errno(TD_ERR_IO, "creating the run's directory %s", o->run_dir);
    return TD_OK;
}

/* The job's secret (see the top of this file). */
static void job_secret(const tdrun_options *o)
{
    if (getenv("TDIST_AUTH_TOKEN"))
        return; /* given (the empty string: authentication off) */
    if (o->nnodes > 1) {
        fprintf(stderr, "tdrun: warning: this %d-node job is not authenticated: any process that reaches its store "
                        "or workers can join. Give every node the same secret, e.g. "
                        "TDIST_AUTH_TOKEN=$(openssl rand -hex 32)\n",
                o->nnodes);
        return;
    }
    uint8_t bytes[AUTH_NONCE_LEN];
    auth_nonce(bytes);
    char hex[2 * AUTH_NONCE_LEN + 1];
    for (int i = 0; i < AUTH_NONCE_LEN; i++)
        snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
    setenv("TDIST_AUTH_TOKEN", hex, 1);
}

int main(int argc, char **argv)
{
    /* Before any thread exists, so every thread inherits the blocked mask and the signals reach
     * the monitor's signalfd. */
    tdrun_signals_open();

    static tdrun_options o;
    if (tdrun_parse_options(argc, argv, &o) != TD_OK) {
        fprintf(stderr, "tdrun: %s\n", td_last_error());
        return 2;
    }
    g_opts = &o;
    if (check_program(o.argv[0]) != TD_OK) {
        fprintf(stderr, "tdrun: %s\n", td_last_error());
        return 2;
    }

    job_secret(&o);
    td_store *store = NULL;
    int port = o.master_port;
    if (o.is_host) {
        td_tcp_store_options so = TD_TCP_STORE_OPTIONS_INIT;
        so.host = o.nnodes > 1 ? NULL : o.master_addr; /* other nodes reach us on any interface */
        so.port = o.master_port;
        so.is_master = true;
        so.wait_for_workers = false;
        so.timeout_ms = 0;
        if (td_tcp_store_create(&so, &store) != TD_OK) {
            fprintf(stderr, "tdrun: cannot host the job's store on %s:%d: %s\n", o.master_addr, o.master_port,
                    td_last_error());
            return 1;
        }
        port = td_tcp_store_port(store);
        say("store listening on %s:%d; starting %d worker%s (world size %d)", o.master_addr, port,
            o.nproc_per_node, o.nproc_per_node == 1 ? "" : "s", o.nnodes * o.nproc_per_node);
    } else {
        /* Wait, up to join_timeout, for the host's store before starting the workers. */
        td_tcp_store_options so = TD_TCP_STORE_OPTIONS_INIT;
        so.host = o.master_addr;
        so.port = port;
        so.wait_for_workers = false;
        so.timeout_ms = o.join_timeout_ms;
        if (td_tcp_store_create(&so, &store) != TD_OK) {
            fprintf(stderr, "tdrun: node %d: the job's store at %s:%d did not answer within join_timeout (%lld s): %s\n",
                    o.node_rank, o.master_addr, port, (long long)(o.join_timeout_ms / 1000), td_last_error());
            return 1;
        }
        say("node %d of %d: starting %d workers, store at %s:%d", o.node_rank, o.nnodes, o.nproc_per_node,
            o.master_addr, port);
    }
    td_store_set_timeout(store, o.read_timeout_ms);
    tdrun_job job;
    if (tdrun_job_join(&job, &o, store, port) != TD_OK) {
        fprintf(stderr, "tdrun: %s\n", td_last_error());
        job.aborted = true;
        tdrun_job_linger(&job);
        tdrun_job_leave(&job);
        td_store_release(store);
        return 1;
    }
    if (make_run_dir(&o) != TD_OK) {
        fprintf(stderr, "tdrun: %s\n", td_last_error());
        tdrun_job_end(&job, true, "node %d: %s", o.node_rank, td_last_error());
        tdrun_job_linger(&job);
        tdrun_job_leave(&job);
        td_store_release(store);
        return 1;
    }
    if (o.log_dir)
        say("run %s: logs under %s", o.run_id, o.run_dir);

    int rc = 0;
    for (int attempt = 0;; attempt++) {
        job.round = attempt;
        tdrun_group *g = NULL;
        if (tdrun_group_start(&o, o.master_addr, port, attempt, &g) != TD_OK) {
            fprintf(stderr, "tdrun: %s\n", td_last_error());
            tdrun_job_end(&job, true, "node %d could not start its workers: %s", o.node_rank, td_last_error());
            rc = 1;
            break;
        }
        bool failed = false, ended = false;
        int signo = 0;
        tdrun_exit first;
        tdrun_group_monitor(g, &job, &failed, &first, &signo, &ended);
        if (signo) {
            say("received SIG%s: stopped the workers", sigabbrev_np(signo) ? sigabbrev_np(signo) : "?");
            tdrun_group_free(g);
            tdrun_job_end(&job, true, "node %d's tdrun received SIG%s", o.node_rank,
                            sigabbrev_np(signo) ? sigabbrev_np(signo) : "?");
            rc = 128 + signo;
            break;
        }
        if (!failed && !ended) {
            tdrun_group_free(g);
            int b = tdrun_job_exit_barrier(&job, say);
            if (b != 2) {
                rc = b;
                break;
            }
            ended = true;
        } else if (failed) {
            print_failure(&o, g, &first);
            tdrun_group_free(g);
            tdrun_job_end(&job, false, "node %d: rank %d (local rank %d) exited with %d", o.node_rank, first.rank,
                                first.local_rank, first.code);
        } else {
            tdrun_group_free(g);
        }
        if (ended && job.aborted) {
            fprintf(stderr, "tdrun: node %d: stopped the workers: %s\n", o.node_rank, job.why);
            rc = 1;
            break;
        }
        if (ended)
            fprintf(stderr, "tdrun: node %d: stopped the workers: another node's worker failed (%s)\n", o.node_rank,
                    job.why);
        if (attempt >= o.max_restarts) {
            if (ended)
                fprintf(stderr, "tdrun: node %d: no restarts left (--max-restarts %d)\n", o.node_rank, o.max_restarts);
            rc = 1;
            break;
        }
        say("restarting the workers (restart %d of %d)", attempt + 1, o.max_restarts);
    }
    if (rc != 0)
        tdrun_job_linger(&job); /* let the other nodes read why the job ends */
    tdrun_job_leave(&job);
    td_store_release(store);
    if (!o.log_dir)
        nftw(o.run_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}
