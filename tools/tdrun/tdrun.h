/* tdrun's pieces: the command line (options.c), the local worker group (workers.c) and the agent
 * that hosts the job's store and restarts the group (tdrun.c). */
#ifndef TDIST_TOOLS_TDRUN_H
#define TDIST_TOOLS_TDRUN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/status.h>
#include <tdist/store.h>

#define TDRUN_MAX_LOCAL 256

typedef struct tdrun_options {
    int nproc_per_node;
    int nnodes;
    int node_rank;
    char master_addr[256];
    int master_port;        /* -1: unset (29500, or a free port with --standalone) */
    bool standalone;
    int max_restarts;
    int64_t monitor_interval_ms;
    int64_t term_timeout_ms; /* SIGTERM -> SIGKILL grace */
    int64_t exit_barrier_timeout_ms; /* how long a finished node waits for the others */
    const char *log_dir;    /* --log-dir as given; each run writes under its own subdirectory */
    char run_id[128];       /* --rdzv-id / --run-id: TORCHELASTIC_RUN_ID ["none"; random with --standalone] */
    char role[128];         /* --role: ROLE_NAME ["default"] */
    int is_host;            /* --rdzv-conf is_host: -1 unset (node 0 hosts the store), 0 or 1 */
    int64_t join_timeout_ms; /* --rdzv-conf join_timeout / timeout: a non-host node waits this long
                              * for the store before starting its workers [600 s] */
    int64_t read_timeout_ms; /* --rdzv-conf read_timeout: tdrun's own store operations [60 s] */
    char run_dir[4096];     /* where this run's logs and error files go: DIR/<run_id>_XXXXXX with
                             * --log-dir, else a temporary directory removed at the end; set by main */
    int redirects[TDRUN_MAX_LOCAL]; /* per local rank: bit 1 stdout, bit 2 stderr go to files only */
    int tee[TDRUN_MAX_LOCAL];       /* per local rank: same bits, to files and the console */
    bool console_hidden[TDRUN_MAX_LOCAL]; /* --local-ranks-filter: local ranks kept off the console */
    bool quiet;             /* no tdrun status lines (the workers' output still shows) */
    bool bind_core;         /* --bind-to core: local rank i runs on CPU i mod n of tdrun's own CPUs */
    char **argv;            /* program and its arguments */
} tdrun_options;

/* Parses argv; on a bad flag returns TD_ERR_INVALID with the message set. --help prints usage and
 * exits 0. */
td_status tdrun_parse_options(int argc, char **argv, tdrun_options *o);
void tdrun_usage(FILE *f);

/* The job across nodes (job.c): with --nnodes > 1 the agents agree through the job's store on the
 * job's shape, on each restart round and on the exit barrier. With one node every call is a no-op. */
typedef struct tdrun_job {
    const tdrun_options *o;
    td_store *store;        /* the job's store; NULL with one node */
    int port;               /* the store's port */
    int round;              /* the restart count the current workers run with */
    bool aborted;           /* another node stopped the job (or its store was lost) */
    bool store_lost;        /* the host's store no longer answers */
    int64_t next_poll_ns;
    char why[1024];         /* what ended the round or the job, as another node said it */
} tdrun_job;

/* Checks that no other node has this --node-rank and that every node has the same --nnodes,
 * --nproc-per-node and --max-restarts; a disagreement fails here (and stops the other nodes). */
td_status tdrun_job_join(tdrun_job *j, const tdrun_options *o, td_store *store, int port);
void tdrun_job_leave(tdrun_job *j);
/* For the monitor, at most once per --monitor-interval: true when another node ended this round
 * (restart requested) or the job (j->aborted); j->why says why. */
bool tdrun_job_poll(tdrun_job *j);
/* Ends round j->round on every node (this node's worker failed), or with whole_job the job (this
 * node stops for good, so the others stop too); the first reason given stays. */
void tdrun_job_end(tdrun_job *j, bool whole_job, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* On the host, before leaving: waits (a few seconds at most) until the other nodes have read why
 * the round or the job ended. */
void tdrun_job_linger(tdrun_job *j);
/* After this node's workers succeeded, waits for every node's: 0 all done, 1 an error (printed),
 * 2 another node's failure restarts this round (j->why says which). */
int tdrun_job_exit_barrier(tdrun_job *j, void (*say)(const char *fmt, ...));

/* How one worker ended. */
typedef struct tdrun_exit {
    int local_rank;
    int rank;
    pid_t pid;
    int code;      /* exit code, or -signal */
    int64_t when_ns;  /* wall clock */
} tdrun_exit;

/* The local worker group of one attempt. */
typedef struct tdrun_group tdrun_group;

/* Starts nproc workers with the job's environment for attempt `restart_count`. */
td_status tdrun_group_start(const tdrun_options *o, const char *master_addr, int master_port, int restart_count,
                            tdrun_group **out);
/* Runs until every worker exited (TD_OK with *failed = false), one failed (*failed = true, *first
 * describes it; the others are then stopped), a signal arrived (*signo set; the workers are
 * stopped), or the job (job may be NULL) says another node ended the round (*ended = true; the
 * workers are stopped). */
td_status tdrun_group_monitor(tdrun_group *g, tdrun_job *job, bool *failed, tdrun_exit *first, int *signo, bool *ended);
/* SIGTERM every live worker, SIGKILL after the grace period, reap them all. */
void tdrun_group_stop(tdrun_group *g, int sig);
/* The log file of a local rank's stderr (or stdout), or NULL without --log-dir. */
const char *tdrun_group_log_file(const tdrun_group *g, int local_rank);
/* The TORCHELASTIC_ERROR_FILE path a local rank was given. */
const char *tdrun_group_error_file(const tdrun_group *g, int local_rank);
/* Creates a directory and its parents. */
td_status tdrun_make_dirs(const char *path);
void tdrun_group_free(tdrun_group *g);

/* The signals tdrun handles (blocked in tdrun, unblocked in workers), read through a signalfd. */
int tdrun_signals_open(void);

#endif
