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
          "  --quiet                   no tdrun status lines\n"
          "  -h, --help                this text\n",
          f);
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

td_status tdrun_parse_options(int argc, char **argv, tdrun_options *o)
{
    memset(o, 0, sizeof *o);
    o->nproc_per_node = 1;
    o->nnodes = 1;
    o->master_port = -1;
    o->monitor_interval_ms = 100;
    o->term_timeout_ms = 5000;
    o->exit_barrier_timeout_ms = 300000; /* torchrun's default */
    snprintf(o->master_addr, sizeof o->master_addr, "127.0.0.1");

    /* torchrun accepts --nproc_per_node as well as --nproc-per-node. */
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0)
            break;
        for (char *p = argv[i] + 2; *p && *p != '='; p++)
            if (*p == '_')
                *p = '-';
    }

    enum { NPROC = 256, NNODES, NODE_RANK, MADDR, MPORT, RDZV, STANDALONE, RESTARTS, MONITOR, TERM, LOGDIR,
           REDIRECTS, TEE, QUIET, EXIT_BARRIER };
    static const struct option longopts[] = {
        {"nproc-per-node", required_argument, NULL, NPROC},
        {"nnodes", required_argument, NULL, NNODES},
        {"node-rank", required_argument, NULL, NODE_RANK},
        {"master-addr", required_argument, NULL, MADDR},
        {"master-port", required_argument, NULL, MPORT},
        {"rdzv-endpoint", required_argument, NULL, RDZV},
        {"standalone", no_argument, NULL, STANDALONE},
        {"max-restarts", required_argument, NULL, RESTARTS},
        {"monitor-interval", required_argument, NULL, MONITOR},
        {"term-timeout", required_argument, NULL, TERM},
        {"log-dir", required_argument, NULL, LOGDIR},
        {"redirects", required_argument, NULL, REDIRECTS},
        {"tee", required_argument, NULL, TEE},
        {"quiet", no_argument, NULL, QUIET},
        {"exit-barrier-timeout", required_argument, NULL, EXIT_BARRIER},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    bool have_redirects = false, have_tee = false;
    int64_t v;
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "+h", longopts, NULL)) != -1) {
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
            TD_TRY(env_parse_int("--nnodes", optarg, 1, 1 << 20, &v));
            o->nnodes = (int)v;
            break;
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
        case REDIRECTS:
            TD_TRY(parse_streams("--redirects", optarg, o->redirects));
            have_redirects = true;
            break;
        case TEE:
            TD_TRY(parse_streams("--tee", optarg, o->tee));
            have_tee = true;
            break;
        case QUIET:
            o->quiet = true;
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

    if (o->standalone) {
        o->nnodes = 1;
        o->node_rank = 0;
        snprintf(o->master_addr, sizeof o->master_addr, "127.0.0.1");
        o->master_port = 0;
    } else if (o->master_port < 0) {
        o->master_port = 29500;
    }
    if (o->node_rank >= o->nnodes)
        return error_fmt(TD_ERR_INVALID, "--node-rank %d must be less than --nnodes %d", o->node_rank, o->nnodes);
    /* Node 0 may take port 0 (it prints the port it got); the others must be told the port. */
    if (o->node_rank > 0 && o->master_port == 0)
        return error_fmt(TD_ERR_INVALID, "--node-rank %d needs the --master-port that node 0 listens on",
                        o->node_rank);
    if ((have_redirects || have_tee) && !o->log_dir)
        return error_fmt(TD_ERR_INVALID, "--redirects and --tee need --log-dir");
    if (o->log_dir && !have_redirects && !have_tee)
        for (int i = 0; i < TDRUN_MAX_LOCAL; i++)
            o->tee[i] = 3; /* --log-dir alone: every stream to its file and to the console */
    return TD_OK;
}
