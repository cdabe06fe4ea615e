/* tdrun's command line: torchrun's flags with torchrun's meaning.
 *
 * Flags are accepted with dashes or underscores (--nproc-per-node, --nproc_per_node) and as
 * "--flag value" or "--flag=value". Everything after the first non-flag word is the program to run
 * and its own arguments. Values are checked with the base layer's parsers so a bad value gets the
 * same kind of message as a bad environment variable. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "tdrun.h"

void tdrun_usage(FILE *f)
{
    fputs("usage: tdrun [options] program [args...]\n"
          "\n"
          "Starts a tdist job: nproc-per-node worker processes on this node, with RANK, LOCAL_RANK,\n"
          "WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT set for each, and the\n"
          "job's store hosted by node 0 so that workers initialize with env:// rendezvous.\n"
          "\n"
          "  --nproc-per-node N|auto   workers on this node (auto: one per CPU) [1]\n"
          "  --nnodes N                nodes in the job [1]\n"
          "  --node-rank R             this node's rank, 0..nnodes-1 [0]\n"
          "  --master-addr HOST        address of node 0, where the store runs [127.0.0.1]\n"
          "  --master-port PORT        port of the store [29500]\n"
          "  --rdzv-endpoint HOST:PORT the same two in one flag\n"
          "  --standalone              single node on a free port (ignores the four above)\n"
          "  --max-restarts N          restart the local group up to N times after a failure [0]\n"
          "  --monitor-interval SECS   how often workers are checked [0.1]\n"
          "  --term-timeout SECS       SIGTERM to SIGKILL grace when stopping workers [5]\n"
          "  --exit-barrier-timeout SECS  how long a node whose workers finished waits for the\n"
          "                            other nodes' before it exits (node 0 hosts the store) [300]\n"
          "  --log-dir DIR             also write each worker's output under DIR/attempt_K/LOCAL_RANK/\n"
          "  --redirects N|R:N,...     with --log-dir: send stdout (1), stderr (2) or both (3) to the\n"
          "                            files only, for all ranks or per local rank\n"
          "  --tee N|R:N,...           the same, but to the files and the console\n"
          "  --local-ranks-filter R,...  only these local ranks' output on the console (their\n"
          "                            files under --log-dir are written as usual)\n"
          "  --no-python, --run-path   accepted, no effect (the program runs itself)\n"
          "  --bind-to none|core       core: pin local rank i to the i-th of tdrun's CPUs (modulo\n"
          "                            their count), as mpirun's --bind-to core [none]\n"
          "  --quiet                   no tdrun status lines\n"
          "  -h, --help                this text\n",
          f);
}

/* --local-ranks-filter "0,2": every other local rank's output is kept off the console. */
static td_status parse_ranks_filter(const char *s, bool *hidden)
{
    bool shown[TDRUN_MAX_LOCAL] = {false};
    char *copy = strdup(s), *save = NULL;
    td_status st = TD_OK;
    int n = 0;
    for (char *item = strtok_r(copy, ",", &save); item && st == TD_OK; item = strtok_r(NULL, ",", &save), n++) {
        int64_t rank;
        st = env_parse_int("--local-ranks-filter", item, 0, TDRUN_MAX_LOCAL - 1, &rank);
        if (st == TD_OK)
            shown[rank] = true;
    }
    free(copy);
    if (st == TD_OK && n == 0)
        st = error_fmt(TD_ERR_INVALID, "--local-ranks-filter must list local ranks (\"0,2\"), got '%s'", s);
    for (int i = 0; st == TD_OK && i < TDRUN_MAX_LOCAL; i++)
        hidden[i] = !shown[i];
    return st;
}

/* "3" applies to every local rank; "0:1,2:3" per local rank. */
static td_status parse_streams(const char *flag, const char *s, int *out)
{
    if (!strchr(s, ':')) {
        int64_t v;
        TD_TRY(env_parse_int(flag, s, 0, 3, &v));
        for (int i = 0; i < TDRUN_MAX_LOCAL; i++)
            out[i] = (int)v;
        return TD_OK;
    }
    char *copy = strdup(s), *save = NULL;
    td_status st = TD_OK;
    for (char *item = strtok_r(copy, ",", &save); item && st == TD_OK; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        int64_t rank, v;
        if (!colon) {
            st = error_fmt(TD_ERR_INVALID, "%s must be N or LOCAL_RANK:N,..., got '%s'", flag, s);
            break;
        }
        *colon = '\0';
        st = env_parse_int(flag, item, 0, TDRUN_MAX_LOCAL - 1, &rank);
        if (st == TD_OK)
            st = env_parse_int(flag, colon + 1, 0, 3, &v);
        if (st == TD_OK)
            out[rank] = (int)v;
    }
    free(copy);
    return st;
}

static td_status parse_endpoint(const char *s, tdrun_options *o)
{
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return error_fmt(TD_ERR_INVALID, "--rdzv-endpoint must be HOST:PORT, got '%s'", s);
    const char *host = s;
    size_t hlen = (size_t)(colon - s);
    if (host[0] == '[' && hlen >= 2 && host[hlen - 1] == ']') { /* [v6]:port */
        host++;
        hlen -= 2;
    }
    if (hlen >= sizeof o->master_addr)
        return error_fmt(TD_ERR_INVALID, "--rdzv-endpoint host is too long");
    memcpy(o->master_addr, host, hlen);
    o->master_addr[hlen] = '\0';
    int64_t port;
    TD_TRY(env_parse_int("--rdzv-endpoint port", colon + 1, 0, 65535, &port));
    o->master_port = (int)port;
    return TD_OK;
}

static int cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* "N" or torchrun's elastic "MIN:MAX"; tdist's groups have a fixed size, so MIN must equal MAX. */
static td_status parse_nnodes(const char *s, int *out)
{
    int64_t v, hi;
    const char *colon = strchr(s, ':');
    if (!colon) {
        TD_TRY(env_parse_int("--nnodes", s, 1, 1 << 20, &v));
        *out = (int)v;
        return TD_OK;
    }
    char lo[64];
    size_t n = (size_t)(colon - s);
    if (n >= sizeof lo)
        return error_fmt(TD_ERR_INVALID, "--nnodes must be N or MIN:MAX, got '%s'", s);
    memcpy(lo, s, n);
    lo[n] = '\0';
    TD_TRY(env_parse_int("--nnodes MIN", lo, 1, 1 << 20, &v));
    TD_TRY(env_parse_int("--nnodes MAX", colon + 1, 1, 1 << 20, &hi));
    if (v != hi)
        return error_fmt(TD_ERR_INVALID,
                         "--nnodes %s: elastic node ranges are not supported (tdist's groups have a fixed size); "
                         "give one number, or MIN:MAX with MIN == MAX",
                         s);
    *out = (int)v;
    return TD_OK;
}

static td_status parse_rdzv_backend(const char *s)
{
    if (strcmp(s, "c10d") == 0 || strcmp(s, "static") == 0)
        return TD_OK;
    if (strcmp(s, "etcd") == 0 || strcmp(s, "etcd-v2") == 0)
        return error_fmt(TD_ERR_INVALID,
                         "--rdzv-backend %s is not supported: tdist has no etcd client. Use c10d (the default: "
                         "node 0, or the node with --rdzv-conf is_host=true, hosts the job's store at "
                         "--rdzv-endpoint) or static",
                         s);
    return error_fmt(TD_ERR_INVALID, "--rdzv-backend must be c10d or static, got '%s'", s);
}

/* torchrun's --rdzv-conf: "key=value,key=value". */
static td_status parse_rdzv_conf(const char *s, tdrun_options *o)
{
    char *copy = strdup(s), *save = NULL;
    td_status st = TD_OK;
    for (char *item = strtok_r(copy, ",", &save); item && st == TD_OK; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq) {
            st = error_fmt(TD_ERR_INVALID, "--rdzv-conf must be KEY=VALUE,..., got '%s'", item);
            break;
        }
        *eq = '\0';
        const char *key = item, *value = eq + 1;
        char what[96];
        snprintf(what, sizeof what, "--rdzv-conf %s", key);
        int64_t ms;
        bool b;
        if (strcmp(key, "join_timeout") == 0 || strcmp(key, "timeout") == 0) {
            st = env_parse_duration_ms(what, value, 1000, &ms);
            if (st == TD_OK)
                o->join_timeout_ms = ms;
        } else if (strcmp(key, "read_timeout") == 0) {
            st = env_parse_duration_ms(what, value, 1000, &ms);
            if (st == TD_OK)
                o->read_timeout_ms = ms;
        } else if (strcmp(key, "last_call_timeout") == 0 || strcmp(key, "close_timeout") == 0) {
            st = env_parse_duration_ms(what, value, 1000, &ms); /* checked; no effect with a fixed node count */
        } else if (strcmp(key, "is_host") == 0) {
            st = env_parse_bool(what, value, &b);
            if (st == TD_OK)
                o->is_host = b;
        } else {
            st = error_fmt(TD_ERR_INVALID,
                           "--rdzv-conf: unknown key '%s' (tdrun knows join_timeout, timeout, read_timeout, "
                           "last_call_timeout, close_timeout and is_host)",
                           key);
        }
    }
    free(copy);
    return st;
}

static td_status set_name(const char *flag, const char *value, char *out, size_t size)
{
    if (!*value || strlen(value) >= size || strchr(value, '/'))
        return error_fmt(TD_ERR_INVALID, "%s must be a non-empty name without '/' of at most %zu characters, got '%s'",
                         flag, size - 1, value);
    snprintf(out, size, "%s", value);
    return TD_OK;
}

/* A run id for --standalone, as torchrun makes one with uuid4. */
static void random_run_id(char *out, size_t size)
{
    unsigned char bytes[16] = {0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(bytes, 1, sizeof bytes, f) != sizeof bytes) {
        uint64_t x = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
        memcpy(bytes, &x, sizeof x);
    }
    if (f)
        fclose(f);
    bytes[6] = (unsigned char)((bytes[6] & 0x0f) | 0x40);
    bytes[8] = (unsigned char)((bytes[8] & 0x3f) | 0x80);
    snprintf(out, size, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", bytes[0], bytes[1],
             bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9], bytes[10], bytes[11],
             bytes[12], bytes[13], bytes[14], bytes[15]);
}

enum { NPROC = 256, NNODES, NODE_RANK, MADDR, MPORT, RDZV, STANDALONE, RESTARTS, MONITOR, TERM, LOGDIR, REDIRECTS,
       TEE, QUIET, RANKS_FILTER, EXIT_BARRIER, RDZV_BACKEND, RDZV_ID, RDZV_CONF, ROLE, NO_PYTHON, RUN_PATH, MODULE, VERSION,
       BIND_TO };
static const struct option longopts[] = {
    {"nproc-per-node", required_argument, NULL, NPROC},
    {"nnodes", required_argument, NULL, NNODES},
    {"node-rank", required_argument, NULL, NODE_RANK},
    {"master-addr", required_argument, NULL, MADDR},
    {"master-port", required_argument, NULL, MPORT},
    {"rdzv-endpoint", required_argument, NULL, RDZV},
    {"rdzv-backend", required_argument, NULL, RDZV_BACKEND},
    {"rdzv-id", required_argument, NULL, RDZV_ID},
    {"run-id", required_argument, NULL, RDZV_ID},
    {"rdzv-conf", required_argument, NULL, RDZV_CONF},
    {"role", required_argument, NULL, ROLE},
    {"no-python", no_argument, NULL, NO_PYTHON},
    {"run-path", no_argument, NULL, RUN_PATH},
    {"module", no_argument, NULL, MODULE},
    {"standalone", no_argument, NULL, STANDALONE},
    {"max-restarts", required_argument, NULL, RESTARTS},
    {"monitor-interval", required_argument, NULL, MONITOR},
    {"term-timeout", required_argument, NULL, TERM},
    {"log-dir", required_argument, NULL, LOGDIR},
    {"redirects", required_argument, NULL, REDIRECTS},
    {"tee", required_argument, NULL, TEE},
    {"quiet", no_argument, NULL, QUIET},
    {"bind-to", required_argument, NULL, BIND_TO},
    {"local-ranks-filter", required_argument, NULL, RANKS_FILTER},
    {"exit-barrier-timeout", required_argument, NULL, EXIT_BARRIER},
    {"version", no_argument, NULL, VERSION},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};
static const char shortopts[] = "+hmr:t:";

/* torchrun accepts --nproc_per_node as well as --nproc-per-node. Every flag before the program is
 * rewritten to dashes; a flag's value given as the next word ("--nproc_per_node 2") is skipped, so
 * the flags after it are rewritten too. */
static void dashes_for_underscores(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        if (strcmp(a, "--") == 0 || a[0] != '-' || a[1] == '\0')
            return; /* the program starts here */
        if (a[1] != '-') { /* short options: -r 3, -t3, -h */
            const char *opt = strchr(shortopts, a[1]);
            if (opt && opt[1] == ':' && a[2] == '\0')
                i++;
            continue;
        }
        char *p = a + 2;
        for (; *p && *p != '='; p++)
            if (*p == '_')
                *p = '-';
        if (*p == '=')
            continue;
        for (const struct option *lo = longopts; lo->name; lo++)
            if (strcmp(lo->name, a + 2) == 0 && lo->has_arg == required_argument) {
                i++;
                break;
            }
    }
}

td_status tdrun_parse_options(int argc, char **argv, tdrun_options *o)
{
    memset(o, 0, sizeof *o);
    o->nproc_per_node = 1;
    o->nnodes = 1;
    o->master_port = -1;
    o->monitor_interval_ms = 100;
    o->term_timeout_ms = 5000;
    o->exit_barrier_timeout_ms = 300000; /* torchrun's default */
    o->is_host = -1;
    o->join_timeout_ms = 600000;         /* torchrun's join_timeout */
    o->read_timeout_ms = 60000;          /* torchrun's read_timeout */
    snprintf(o->master_addr, sizeof o->master_addr, "127.0.0.1");
    snprintf(o->role, sizeof o->role, "default");
    bool have_run_id = false;

    dashes_for_underscores(argc, argv);

    bool have_redirects = false, have_tee = false;
    int64_t v;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        switch (c) {
        case NPROC:
            if (strcmp(optarg, "auto") == 0 || strcmp(optarg, "cpu") == 0) {
                o->nproc_per_node = cpu_count();
            } else {
                TD_TRY(env_parse_int("--nproc-per-node", optarg, 1, TDRUN_MAX_LOCAL, &v));
                o->nproc_per_node = (int)v;
            }
            break;
        case NNODES:
            TD_TRY(parse_nnodes(optarg, &o->nnodes));
            break;
        case RDZV_BACKEND:
            TD_TRY(parse_rdzv_backend(optarg));
            break;
        case RDZV_ID:
            TD_TRY(set_name("--rdzv-id", optarg, o->run_id, sizeof o->run_id));
            have_run_id = true;
            break;
        case RDZV_CONF:
            TD_TRY(parse_rdzv_conf(optarg, o));
            break;
        case ROLE:
            TD_TRY(set_name("--role", optarg, o->role, sizeof o->role));
            break;
        case NO_PYTHON:
        case RUN_PATH:
            break; /* tdrun always runs the program itself, as a path or found in PATH */
        case 'm':
        case MODULE:
            return error_fmt(TD_ERR_INVALID, "-m/--module runs a Python module, and tdrun runs programs: give the "
                                             "interpreter as the program (tdrun ... python3 -m MODULE ARGS)");
        case VERSION:
            printf("tdrun (tdist) %s\n", TDRUN_VERSION);
            exit(0);
        case NODE_RANK:
            TD_TRY(env_parse_int("--node-rank", optarg, 0, 1 << 20, &v));
            o->node_rank = (int)v;
            break;
        case MADDR:
            if (strlen(optarg) >= sizeof o->master_addr || !*optarg)
                return error_fmt(TD_ERR_INVALID, "--master-addr must be a host name or address, got '%s'", optarg);
            snprintf(o->master_addr, sizeof o->master_addr, "%s", optarg);
            break;
        case MPORT:
            TD_TRY(env_parse_int("--master-port", optarg, 0, 65535, &v));
            o->master_port = (int)v;
            break;
        case RDZV:
            TD_TRY(parse_endpoint(optarg, o));
            break;
        case STANDALONE:
            o->standalone = true;
            break;
        case RESTARTS:
            TD_TRY(env_parse_int("--max-restarts", optarg, 0, 1 << 20, &v));
            o->max_restarts = (int)v;
            break;
        case MONITOR:
            TD_TRY(env_parse_duration_ms("--monitor-interval", optarg, 1000, &o->monitor_interval_ms));
            if (o->monitor_interval_ms < 1)
                o->monitor_interval_ms = 1;
            break;
        case TERM:
            TD_TRY(env_parse_duration_ms("--term-timeout", optarg, 1000, &o->term_timeout_ms));
            break;
        case LOGDIR:
            o->log_dir = optarg;
            break;
        case 'r':
        case REDIRECTS:
            TD_TRY(parse_streams("--redirects", optarg, o->redirects));
            have_redirects = true;
            break;
        case 't':
        case TEE:
            TD_TRY(parse_streams("--tee", optarg, o->tee));
            have_tee = true;
            break;
        case QUIET:
            o->quiet = true;
            break;
        case BIND_TO:
            if (strcmp(optarg, "core") != 0 && strcmp(optarg, "none") != 0)
                return error_fmt(TD_ERR_INVALID, "--bind-to must be none or core, got '%s'", optarg);
            o->bind_core = strcmp(optarg, "core") == 0;
            break;
        case RANKS_FILTER:
            TD_TRY(parse_ranks_filter(optarg, o->console_hidden));
            break;
        case EXIT_BARRIER:
            TD_TRY(env_parse_duration_ms("--exit-barrier-timeout", optarg, 1000, &o->exit_barrier_timeout_ms));
            break;
        case 'h':
            tdrun_usage(stdout);
            exit(0);
        default:
            return error_fmt(TD_ERR_INVALID, "unknown or incomplete option '%s' (see tdrun --help)", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return error_fmt(TD_ERR_INVALID, "no program to run (usage: tdrun [options] program [args...])");
    o->argv = argv + optind;

    if (!have_run_id) {
        if (o->standalone)
            random_run_id(o->run_id, sizeof o->run_id);
        else
            snprintf(o->run_id, sizeof o->run_id, "none"); /* torchrun's default --rdzv-id */
    }
    if (o->standalone) {
        o->is_host = 1;
        o->nnodes = 1;
        o->node_rank = 0;
        snprintf(o->master_addr, sizeof o->master_addr, "127.0.0.1");
        o->master_port = 0;
    } else if (o->master_port < 0) {
        o->master_port = 29500;
    }
    if (o->node_rank >= o->nnodes)
        return error_fmt(TD_ERR_INVALID, "--node-rank %d must be less than --nnodes %d", o->node_rank, o->nnodes);
    if (o->is_host < 0)
        o->is_host = o->node_rank == 0;
    /* The host may take port 0 (it prints the port it got); the others must be told the port. */
    if (!o->is_host && o->master_port == 0)
        return error_fmt(TD_ERR_INVALID, "--node-rank %d needs the --master-port that the store's host listens on",
                        o->node_rank);
    if ((have_redirects || have_tee) && !o->log_dir)
        return error_fmt(TD_ERR_INVALID,
                         "--redirects and --tee need --log-dir (tdrun writes the workers' log files only there)");
    if (o->log_dir && !have_redirects && !have_tee)
        for (int i = 0; i < TDRUN_MAX_LOCAL; i++)
            o->tee[i] = 3; /* --log-dir alone: every stream to its file and to the console */
    return TD_OK;
}
