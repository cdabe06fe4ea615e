/* The job across nodes: what the agents of a multi-node job agree on through the job's store.
 *
 * With one node none of this runs. With several, every agent (tdrun on each node) checks at start
 * that the others were given the same shape (--nnodes, --nproc-per-node, --max-restarts) and that
 * no other node took its --node-rank, and then the nodes move through the job's rounds together,
 * as torchrun's c10d rendezvous makes them: round K runs every node's workers with restart count
 * K. The first node whose worker fails in round K writes /tdrun/round/K/restart (a compare_set, so
 * the first reason stays); every agent's monitor polls that key (and /tdrun/abort) every
 * --monitor-interval, stops its workers when it appears and starts round K+1 - or, when K was the
 * last round --max-restarts allows, ends with exit code 1. So a worker failing before rendezvous
 * on one node no longer leaves the other node's workers waiting for a round that will never come.
 * A node that stops for good (a signal, a disagreeing shape) writes /tdrun/abort and the others
 * stop too. The host node serves the store, so before it leaves at the end of a round (or on an
 * abort) it waits, briefly, until every other node counted itself out of that round, so that
 * every node reads the reason instead of a closed connection. The exit barrier (every node's
 * workers finished) is per round as well, and a restart requested while a node waits in it takes
 * that node back into the next round. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/store.h>

#include "base/clock.h"
#include "base/error.h"
#include "tdrun.h"

#define ABORT_KEY "/tdrun/abort"
/* How long the host waits for the other nodes to count themselves out before it leaves. */
#define LINGER_MS 5000

static void key_of(char *out, size_t size, int round, const char *what)
{
    snprintf(out, size, "/tdrun/round/%d/%s", round, what);
}

/* The shape every node must share, and who this node is, as one store value. */
static void shape_of(const tdrun_options *o, char *out, size_t size)
{
    snprintf(out, size, "node=%d nnodes=%d nproc_per_node=%d max_restarts=%d", o->node_rank, o->nnodes,
             o->nproc_per_node, o->max_restarts);
}

/* Writes why at key unless a reason is there already (the first stays), then counts this node out
 * at out_key. */
static void publish(tdrun_job *j, const char *key, const char *out_key, const char *why)
{
    void *v = NULL;
    size_t n = 0;
    if (td_store_compare_set(j->store, key, "", 0, why, strlen(why), &v, &n) == TD_OK)
        td_store_add(j->store, out_key, 1, NULL);
    free(v);
}

/* Asks every node to stop and counts this node out of the job. */
static void publish_abort(tdrun_job *j, const char *why) { publish(j, ABORT_KEY, ABORT_KEY "/out", why); }

td_status tdrun_job_join(tdrun_job *j, const tdrun_options *o, td_store *store, int port)
{
    memset(j, 0, sizeof *j);
    j->o = o;
    j->port = port;
    if (o->nnodes == 1)
        return TD_OK;
    j->store = td_store_retain(store);
    char mine[256];
    shape_of(o, mine, sizeof mine);

    /* A second node with this node's rank would make two ranks of each of its workers. */
    char node_key[64], who[512];
    char host[256] = "?";
    gethostname(host, sizeof host);
    snprintf(node_key, sizeof node_key, "/tdrun/node/%d", o->node_rank);
    snprintf(who, sizeof who, "tdrun pid %d on %s", (int)getpid(), host);
    void *v = NULL;
    size_t n = 0;
    TD_TRY(td_store_compare_set(store, node_key, "", 0, who, strlen(who), &v, &n));
    bool taken = n != strlen(who) || memcmp(v, who, n) != 0;
    if (taken) {
        td_status st = error_fmt(TD_ERR_INVALID,
                                 "node %d: --node-rank %d is already taken by another node (%.*s); every node needs its own "
                                 "--node-rank, 0 to %d",
                                 o->node_rank, o->node_rank, (int)n, (char *)v, o->nnodes - 1);
        free(v);
        publish_abort(j, td_last_error());
        return st;
    }
    free(v);

    /* The first node to get here writes the job's shape; every other compares its own with it. */
    TD_TRY(td_store_compare_set(store, "/tdrun/shape", "", 0, mine, strlen(mine), &v, &n));
    char theirs[256];
    snprintf(theirs, sizeof theirs, "%.*s", (int)n, (char *)v);
    free(v);
    int node = -1, nnodes = 0, nproc = 0, restarts = 0;
    if (sscanf(theirs, "node=%d nnodes=%d nproc_per_node=%d max_restarts=%d", &node, &nnodes, &nproc, &restarts) != 4)
        return error_fmt(TD_ERR_INVALID, "node %d: the job's store holds a malformed shape '%s'", o->node_rank, theirs);
    if (nnodes == o->nnodes && nproc == o->nproc_per_node && restarts == o->max_restarts)
        return TD_OK;
    /* The two shapes in one order whichever node came first (the later node reports, and the
     * first may or may not be node 0): the higher node rank first. */
    int a[4] = {o->node_rank, o->nnodes, o->nproc_per_node, o->max_restarts}, b[4] = {node, nnodes, nproc, restarts};
    const int *hi = o->node_rank > node ? a : b, *lo = hi == a ? b : a;
    td_status st = error_fmt(TD_ERR_INVALID,
                             "the nodes disagree about the job: node %d was started with --nnodes %d --nproc-per-node %d "
                             "--max-restarts %d (world size %d), node %d with --nnodes %d --nproc-per-node %d "
                             "--max-restarts %d (world size %d); start every node with the same three",
                             hi[0], hi[1], hi[2], hi[3], hi[1] * hi[2], lo[0], lo[1], lo[2], lo[3], lo[1] * lo[2]);
    publish_abort(j, td_last_error());
    return st;
}

void tdrun_job_leave(tdrun_job *j)
{
    if (j->store)
        td_store_release(j->store);
    j->store = NULL;
}

/* Reads a key's value into out (truncated); false when it is absent. Store failures are reported
 * as an abort: the host that serves the store is gone. */
static bool read_if_set(tdrun_job *j, const char *key, char *out, size_t size)
{
    const char *keys[] = {key};
    bool ready = false;
    void *v = NULL;
    size_t n = 0;
    td_status st = td_store_check(j->store, keys, 1, &ready);
    if (st == TD_OK && ready)
        st = td_store_get(j->store, key, &v, &n);
    if (st != TD_OK) {
        snprintf(j->why, sizeof j->why, "lost the job's store at %s:%d (%s)", j->o->master_addr, j->port,
                 td_last_error());
        j->aborted = true;
        j->store_lost = true;
        return true;
    }
    if (ready)
        snprintf(out, size, "%.*s", (int)n, (char *)v);
    free(v);
    return ready;
}

/* Counts this node out of the round that just ended (or the job, on an abort). */
static void count_out(tdrun_job *j, const char *key)
{
    if (!j->store_lost)
        td_store_add(j->store, key, 1, NULL);
}

bool tdrun_job_poll(tdrun_job *j)
{
    if (!j->store)
        return false;
    int64_t now = clock_now_ns();
    if (now < j->next_poll_ns)
        return false;
    j->next_poll_ns = now + j->o->monitor_interval_ms * 1000000;
    char key[96], why[sizeof j->why];
    if (read_if_set(j, ABORT_KEY, why, sizeof why)) {
        if (!j->store_lost) {
            snprintf(j->why, sizeof j->why, "%s", why);
            j->aborted = true;
            count_out(j, ABORT_KEY "/out");
        }
        return true;
    }
    key_of(key, sizeof key, j->round, "restart");
    if (read_if_set(j, key, why, sizeof why)) {
        if (!j->store_lost) {
            snprintf(j->why, sizeof j->why, "%s", why);
            key_of(key, sizeof key, j->round, "out");
            count_out(j, key);
        }
        return true;
    }
    return false;
}

void tdrun_job_end(tdrun_job *j, bool whole_job, const char *fmt, ...)
{
    if (!j->store || j->store_lost)
        return;
    char why[sizeof j->why];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (whole_job) {
        publish_abort(j, why);
        return;
    }
    char key[96], out[96];
    key_of(key, sizeof key, j->round, "restart");
    key_of(out, sizeof out, j->round, "out");
    publish(j, key, out, why);
}

/* Waits until `key` counts every node, or LINGER_MS passed. */
static void wait_count(tdrun_job *j, const char *key)
{
    int64_t deadline = deadline_after_ms(LINGER_MS);
    for (;;) {
        int64_t n = 0;
        if (td_store_add(j->store, key, 0, &n) != TD_OK || n >= j->o->nnodes || deadline_passed(deadline))
            return;
        clock_sleep_ms(20);
    }
}

void tdrun_job_linger(tdrun_job *j)
{
    if (!j->store || !j->o->is_host || j->store_lost)
        return;
    char key[96];
    if (j->aborted) {
        wait_count(j, ABORT_KEY "/out");
        return;
    }
    key_of(key, sizeof key, j->round, "out");
    wait_count(j, key);
}

int tdrun_job_exit_barrier(tdrun_job *j, void (*say)(const char *fmt, ...))
{
    const tdrun_options *o = j->o;
    if (!j->store)
        return 0;
    char arrived[96], done[96], left[96], all_left[96];
    key_of(arrived, sizeof arrived, j->round, "exit/arrived");
    key_of(done, sizeof done, j->round, "exit/done");
    key_of(left, sizeof left, j->round, "exit/left");
    key_of(all_left, sizeof all_left, j->round, "exit/all_left");
    int64_t n = 0;
    td_status st = td_store_add(j->store, arrived, 1, &n);
    if (st == TD_OK && n == o->nnodes)
        st = td_store_set_str(j->store, done, "1");
    if (st == TD_OK)
        say("workers done; waiting for the other nodes (%lld of %d finished)", (long long)n, o->nnodes);
    /* Wait for every node's workers to finish, unless another node's failure restarts the round. */
    char value[8];
    int64_t deadline = deadline_after_ms(o->exit_barrier_timeout_ms);
    j->next_poll_ns = 0;
    while (st == TD_OK && !read_if_set(j, done, value, sizeof value)) {
        if (tdrun_job_poll(j))
            return j->store_lost ? 1 : 2;
        if (deadline_passed(deadline)) {
            st = error_fmt(TD_ERR_TIMEOUT, "the other nodes' workers did not finish within --exit-barrier-timeout (%lld s)",
                           (long long)(o->exit_barrier_timeout_ms / 1000));
            break;
        }
        clock_sleep_ms((int)(o->monitor_interval_ms < 100 ? o->monitor_interval_ms : 100));
    }
    if (st == TD_OK && j->store_lost)
        st = error_fmt(TD_ERR_IO, "%s", j->why);
    /* The host serves the store: it leaves last. */
    if (st == TD_OK && !o->is_host) {
        st = td_store_add(j->store, left, 1, &n);
        if (st == TD_OK && n == o->nnodes - 1)
            st = td_store_set_str(j->store, all_left, "1");
    } else if (st == TD_OK) {
        const char *keys[] = {all_left};
        st = td_store_wait(j->store, keys, 1, o->exit_barrier_timeout_ms);
    }
    if (st != TD_OK) {
        fprintf(stderr, "tdrun: exit barrier: %s\n", td_last_error());
        return 1;
    }
    return 0;
}
